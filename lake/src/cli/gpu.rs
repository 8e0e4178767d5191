//! `lake gpu`: what this machine's GPU side has (driver, devices, NVRTC, NCCL, NVDEC), and a
//! check of lake's colour kernel on a device against its CPU twin.

use std::process::ExitCode;

/// Arguments of `lake gpu`.
#[derive(Debug, clap::Args)]
pub struct GpuArgs {
    /// The CUDA device to check.
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// Frames of the checked batch.
    #[arg(long, default_value_t = 64)]
    frames: usize,
    /// Width of its frames.
    #[arg(long, default_value_t = 640)]
    width: u32,
    /// Height of its frames.
    #[arg(long, default_value_t = 480)]
    height: u32,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Exits 0 when the device converts as its twin does, 1 when there is no usable GPU or it
/// does not.
pub async fn gpu(args: GpuArgs) -> anyhow::Result<ExitCode> {
    tokio::task::spawn_blocking(move || check(&args)).await?
}

fn check(args: &GpuArgs) -> anyhow::Result<ExitCode> {
    let probe = lake_gpu::check::probe();
    let version = |v: Option<(i32, i32)>| v.map_or_else(|| "not found".to_owned(), |(a, b)| format!("{a}.{b}"));
    let nccl = probe.nccl.map_or_else(|| "not found (libnccl.so)".to_owned(), |v| format!("{}.{}.{}", v / 10000, v / 100 % 100, v % 100));
    let devices = match &probe.devices {
        Ok(n) => format!("{n}"),
        Err(why) => format!("none: {why}"),
    };
    let matrix = lake_codec::YuvToRgb::for_colorspace(5, false);
    let checked = match &probe.devices {
        Ok(n) if *n > args.device => Some(lake_gpu::Gpu::open(args.device).and_then(|gpu| {
            let name = gpu.name()?;
            lake_gpu::check::colour_check(&gpu, args.frames, args.width, args.height, &matrix, 20).map(|c| (name, c))
        })),
        _ => None,
    };
    let passed = matches!(&checked, Some(Ok((_, c))) if c.rgb24_equal && c.float32_equal);
    if args.json {
        let colour = match &checked {
            Some(Ok((name, c))) => serde_json::json!({
                "device": args.device, "name": name, "frames": c.frames, "width": c.width, "height": c.height,
                "rgb24_equal": c.rgb24_equal, "float32_equal": c.float32_equal, "ms_per_batch": c.ms_per_batch,
            }),
            Some(Err(e)) => serde_json::json!({"device": args.device, "error": e.to_string()}),
            None => serde_json::Value::Null,
        };
        let out = serde_json::json!({
            "devices": probe.devices.as_ref().ok(), "devices_error": probe.devices.as_ref().err(),
            "nvrtc": probe.nvrtc.map(|(a, b)| format!("{a}.{b}")), "nccl": probe.nccl, "nvdec": probe.nvdec,
            "colour_check": colour, "passed": passed,
        });
        outln!("{}", serde_json::to_string_pretty(&out)?)?;
    } else {
        outln!("CUDA devices: {devices}")?;
        outln!("NVRTC: {}", version(probe.nvrtc))?;
        outln!("NCCL: {nccl}")?;
        outln!("NVDEC (libnvcuvid.so.1): {}", if probe.nvdec { "found" } else { "not found" })?;
        match &checked {
            Some(Ok((name, c))) => outln!(
                "device {} ({name}): {} frames of {}x{} YUV 4:2:0 to RGB24 {} and to normalised float32 {} the CPU's; {:.3} ms a batch ({:.0} frames/s)",
                args.device,
                c.frames,
                c.width,
                c.height,
                if c.rgb24_equal { "equal" } else { "DIFFERENT from" },
                if c.float32_equal { "equal" } else { "DIFFERENT from" },
                c.ms_per_batch,
                c.frames as f64 / (c.ms_per_batch / 1e3),
            )?,
            Some(Err(e)) => outln!("device {}: {e}", args.device)?,
            None => outln!("no device {} to check: the CPU path is taken", args.device)?,
        }
    }
    Ok(if passed { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
