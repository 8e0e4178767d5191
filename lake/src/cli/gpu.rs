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

/// Frame sizes NVDEC is asked about: the bundled samples' wrist and main cameras, and full HD.
const SIZES: [(u32, u32); 3] = [(128, 96), (640, 480), (1920, 1080)];

fn check(args: &GpuArgs) -> anyhow::Result<ExitCode> {
    let probe = lake_gpu::check::probe();
    let version = |v: Option<(i32, i32)>| v.map_or_else(|| "not found".to_owned(), |(a, b)| format!("{a}.{b}"));
    let nccl = probe.nccl.map_or_else(|| "not found (libnccl.so)".to_owned(), |v| format!("{}.{}.{}", v / 10000, v / 100 % 100, v % 100));
    let devices = match &probe.devices {
        Ok(n) => format!("{n}"),
        Err(why) => format!("none: {why}"),
    };
    let matrix = lake_codec::YuvToRgb::for_colorspace(5, false);
    let opened = match &probe.devices {
        Ok(n) if *n > args.device => Some(lake_gpu::Gpu::open(args.device)),
        _ => None,
    };
    let checked = opened.as_ref().map(|gpu| {
        let gpu = gpu.as_ref().map_err(|e| lake_gpu::Error::Unavailable(e.to_string()))?;
        let name = gpu.name()?;
        lake_gpu::check::colour_check(gpu, args.frames, args.width, args.height, &matrix, 20).map(|c| (name, c))
    });
    // NVDEC's answers for each codec and bit depth, and whether the sizes lake's samples
    // record decode there.
    let caps: Vec<(lake_gpu::nvdec::Codec, u32, Result<lake_gpu::nvdec::DecoderCaps, String>)> = match (&opened, probe.nvdec) {
        (Some(Ok(gpu)), true) => lake_gpu::nvdec::Codec::ALL
            .into_iter()
            .flat_map(|codec| [8, 10].map(|bits| (codec, bits, gpu.decoder_caps(codec, bits).map_err(|e| e.to_string()))))
            .collect(),
        _ => Vec::new(),
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
            "nvdec_caps": caps.iter().map(|(codec, bits, c)| match c {
                Ok(c) => serde_json::json!({
                    "codec": codec.ffmpeg_name(), "bit_depth": bits, "supported": c.supported, "engines": c.engines,
                    "max_width": c.max_width, "max_height": c.max_height, "max_macroblocks": c.max_macroblocks,
                    "min_width": c.min_width, "min_height": c.min_height, "output_formats": c.output_formats,
                    "sizes": SIZES.iter().map(|&(w, h)| serde_json::json!({"width": w, "height": h, "decodes": c.fits(w, h).is_ok()})).collect::<Vec<_>>(),
                }),
                Err(e) => serde_json::json!({"codec": codec.ffmpeg_name(), "bit_depth": bits, "error": e}),
            }).collect::<Vec<_>>(),
        });
        outln!("{}", serde_json::to_string_pretty(&out)?)?;
    } else {
        outln!("CUDA devices: {devices}")?;
        outln!("NVRTC: {}", version(probe.nvrtc))?;
        outln!("NCCL: {nccl}")?;
        outln!("NVDEC (libnvcuvid.so.1): {}", if probe.nvdec { "found" } else { "not found" })?;
        for (codec, bits, c) in &caps {
            let line = match c {
                Ok(c) if !c.supported => "not decoded".to_owned(),
                Ok(c) => {
                    let sizes: Vec<String> = SIZES
                        .iter()
                        .map(|&(w, h)| format!("{w}x{h} {}", if c.fits(w, h).is_ok() { "yes" } else { "no" }))
                        .collect();
                    format!(
                        "{} engine{}, {}x{} to {}x{}; {}",
                        c.engines,
                        if c.engines == 1 { "" } else { "s" },
                        c.min_width,
                        c.min_height,
                        c.max_width,
                        c.max_height,
                        sizes.join(", ")
                    )
                }
                Err(e) => e.clone(),
            };
            outln!("  NVDEC {} {bits}-bit: {line}", codec.ffmpeg_name())?;
        }
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
