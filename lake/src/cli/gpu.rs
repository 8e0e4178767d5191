//! `lake gpu`: what this machine's GPU side has (driver, devices, NVRTC, NCCL, NVDEC and what it
//! decodes), checks of lake's colour and resize kernels on a device against their CPU twins, and with
//! `--dataset` the dataset's frames decoded on NVDEC against the loader's.

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
    /// The size the resize check resizes the batch's RGB frames to, as a frame table of that
    /// size resizes them.
    #[arg(long, default_value = "224x224", value_name = "WxH")]
    resize: lake_loader::FrameSize,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// Also decode this dataset's video frames on NVDEC (turned into RGB by lake's kernel) and
    /// compare them with the loader's, with frames/s of NVDEC and of the CPU decoder.
    #[arg(long, value_name = "NAME")]
    dataset: Option<String>,
    /// Steps of --dataset whose frames are compared (spread over its episodes).
    #[arg(long, default_value_t = 64, value_name = "N")]
    steps: usize,
}

/// Exits 0 when the device converts and resizes as the twins do, 1 when there is no usable GPU
/// or it does not.
pub async fn gpu(root: &str, args: GpuArgs) -> anyhow::Result<ExitCode> {
    let dataset = args.dataset.clone();
    let (device, steps) = (args.device, args.steps);
    let code = tokio::task::spawn_blocking(move || check(&args)).await??;
    match dataset {
        Some(name) if code == ExitCode::SUCCESS => nvdec_frames(root, &name, device, steps).await,
        Some(_) => {
            outln!("NVDEC frames: not compared (no device passed the colour check)")?;
            Ok(code)
        }
        None => Ok(code),
    }
}

/// A GOP to decode: the stream, its packet rows from the keyframe on, and the rows wanted.
struct Gop {
    stream: u32,
    rows: Vec<u64>,
    wanted: Vec<u64>,
}

/// Decodes the frames of `steps` steps of `name` on NVDEC and on the CPU, and compares the
/// NVDEC frames (made RGB by lake's kernel) with the loader's RGB, camera by camera.
async fn nvdec_frames(root: &str, name: &str, device: usize, steps: usize) -> anyhow::Result<ExitCode> {
    use arrow::array::AsArray as _;
    use lake_loader::{Draw, Loader, LoaderDataset, LoaderOptions, Preset, Windows};
    use std::collections::{BTreeMap, BTreeSet};

    let lake = lake_store::Lake::open(root)?;
    let ds = LoaderDataset::open(&lake, name).await?;
    let options = LoaderOptions { threads: 1, cache_bytes: 0, frame_table: false };
    let loader = Loader::new(vec![ds.clone()], &Windows::Preset(Preset::None), options)?;
    let total = ds.steps.num_rows();
    let rows: Vec<u64> = (0..steps.min(total)).map(|i| (i * total / steps.min(total).max(1)) as u64).collect();
    let draws: Vec<Draw> = rows.iter().map(|&row| Draw { source: 0, row }).collect();
    let batch = loader.batch(&draws).await?;
    let gpu = lake_gpu::Gpu::open(device)?;
    let mut all_equal = true;
    for camera in ds.cameras.iter().filter(|c| c.video) {
        let Some(column) = batch.column_by_name(&camera.key) else { continue };
        let reference = column.as_fixed_size_list().values().as_primitive::<arrow::datatypes::UInt8Type>().values().to_vec();
        let frame_bytes = camera.height as usize * camera.width as usize * 3;
        let wanted: Vec<u64> = rows.iter().filter_map(|&r| camera.packet_row(r as usize)).collect();
        let mut gops: BTreeMap<(u32, u64), BTreeSet<u64>> = BTreeMap::new();
        for &row in &wanted {
            let start = row - u64::from(ds.packets.keyframe_offset[row as usize]);
            gops.entry((ds.packets.stream[row as usize], start)).or_default().insert(row);
        }
        let gops: Vec<Gop> = gops
            .into_iter()
            .map(|((stream, start), w)| Gop {
                stream,
                rows: (start..=*w.last().expect("a row")).collect(),
                wanted: w.into_iter().collect(),
            })
            .collect();
        let needed: BTreeSet<u64> = gops.iter().flat_map(|g| g.rows.iter().copied()).collect();
        let needed: Vec<u64> = needed.into_iter().collect();
        let bytes: std::collections::HashMap<u64, _> = needed.iter().copied().zip(ds.packet_bytes(&needed).await?).collect();
        let index = &ds.packets;
        let packets = |g: &Gop| -> Vec<(i64, i64, bool, &[u8])> {
            g.rows
                .iter()
                .map(|&r| (index.pts[r as usize], index.dts[r as usize], index.container_keyframe[r as usize], bytes[&r].as_ref()))
                .collect()
        };
        let pts = |g: &Gop| -> Vec<i64> { g.wanted.iter().map(|&r| index.pts[r as usize]).collect() };
        let config = |stream: u32| ds.streams.get(&stream).cloned().ok_or_else(|| anyhow::anyhow!("no stream {stream}"));
        let first = config(gops.first().map_or(0, |g| g.stream))?;
        let what = format!("{} ({} {}x{}, {} frames)", camera.key, first.params.codec, camera.width, camera.height, wanted.len());
        // The CPU decoder alone, on this thread: frames a second of one core.
        let began = std::time::Instant::now();
        let mut cpu: BTreeMap<u32, lake_codec::StreamDecoder> = BTreeMap::new();
        for g in &gops {
            let decoder = match cpu.entry(g.stream) {
                std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::btree_map::Entry::Vacant(e) => e.insert(lake_codec::StreamDecoder::open(&config(g.stream)?)?),
            };
            std::hint::black_box(decoder.decode(&packets(g), &pts(g))?);
        }
        let cpu_fps = wanted.len() as f64 / began.elapsed().as_secs_f64();
        // NVDEC, the surfaces held until the kernel has read them.
        let began = std::time::Instant::now();
        let mut decoders: BTreeMap<u32, lake_codec::nvdec::NvdecDecoder> = BTreeMap::new();
        let mut surfaces = Vec::with_capacity(wanted.len());
        let mut order = Vec::with_capacity(wanted.len());
        let mut refused = None;
        for g in &gops {
            let decoder = match decoders.entry(g.stream) {
                std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::btree_map::Entry::Vacant(e) => match lake_codec::nvdec::NvdecDecoder::open(&config(g.stream)?, device) {
                    Ok(d) => e.insert(d),
                    Err(e) => {
                        refused = Some(e.to_string());
                        break;
                    }
                },
            };
            match decoder.decode(&packets(g), &pts(g)) {
                Ok(frames) => surfaces.extend(frames),
                Err(e) => {
                    refused = Some(e.to_string());
                    break;
                }
            }
            order.extend(g.wanted.iter().copied());
        }
        gpu.synchronize()?;
        let nvdec_fps = wanted.len() as f64 / began.elapsed().as_secs_f64();
        if let Some(why) = refused {
            outln!("NVDEC {what}: not decoded there ({why}); the CPU decodes it at {cpu_fps:.0} frames/s per core")?;
            continue;
        }
        let matrix = lake_codec::YuvToRgb::for_stream(
            first.params.pix_fmt.as_deref(),
            first.params.color_space.as_deref(),
            camera.width,
            camera.height,
        )
        .ok_or_else(|| anyhow::anyhow!("{}: its frames do not convert with lake's kernel", camera.key))?;
        let rgb = lake_gpu::check::surfaces_to_rgb(&gpu, &surfaces, &matrix)?;
        let by_row: std::collections::HashMap<u64, &Vec<u8>> = order.iter().copied().zip(&rgb).collect();
        let (mut equal, mut largest) = (0usize, 0u8);
        for (slot, row) in wanted.iter().enumerate() {
            let want = &reference[slot * frame_bytes..(slot + 1) * frame_bytes];
            let got = by_row[row];
            if got.as_slice() == want {
                equal += 1;
            } else {
                largest = largest.max(got.iter().zip(want).map(|(a, b)| a.abs_diff(*b)).max().unwrap_or(0));
            }
        }
        all_equal &= equal == wanted.len();
        outln!(
            "NVDEC {what}: {equal} equal to the loader's RGB byte for byte{}; NVDEC {nvdec_fps:.0} frames/s, the CPU {cpu_fps:.0} frames/s per core",
            if equal == wanted.len() { String::new() } else { format!(", {} differ (largest difference {largest})", wanted.len() - equal) }
        )?;
    }
    Ok(if all_equal { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// Frame sizes NVDEC is asked about: the bundled samples' wrist and main cameras, and full HD.
const SIZES: [(u32, u32); 3] = [(128, 96), (640, 480), (1920, 1080)];

fn check(args: &GpuArgs) -> anyhow::Result<ExitCode> {
    let probe = lake_gpu::check::probe();
    let version = |v: Option<(i32, i32)>| v.map_or_else(|| "not found".to_owned(), |(a, b)| format!("{a}.{b}"));
    let nccl = match &probe.nccl {
        Ok(v) => lake_gpu::nccl::version_string(*v),
        Err(why) => format!("not found: {why}"),
    };
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
        let colour = lake_gpu::check::colour_check(gpu, args.frames, args.width, args.height, &matrix, 20)?;
        let to = (args.resize.width, args.resize.height);
        let resize = lake_gpu::check::resize_check(gpu, args.frames, (args.width, args.height), to, 20)?;
        Ok::<_, lake_gpu::Error>((name, colour, resize))
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
    let passed = matches!(&checked, Some(Ok((_, c, r)))
        if c.rgb24_equal && c.float32_equal && c.bf16_equal && c.p010_equal && r.rgb24_equal && r.float32_equal);
    if args.json {
        let (colour, resize) = match &checked {
            Some(Ok((name, c, r))) => (
                serde_json::json!({
                    "device": args.device, "name": name, "frames": c.frames, "width": c.width, "height": c.height,
                    "rgb24_equal": c.rgb24_equal, "float32_equal": c.float32_equal, "bf16_equal": c.bf16_equal,
                    "p010_equal": c.p010_equal, "ms_per_batch": c.ms_per_batch,
                }),
                serde_json::json!({
                    "frames": r.frames, "from": format!("{}x{}", r.from.0, r.from.1), "to": format!("{}x{}", r.to.0, r.to.1),
                    "rgb24_equal": r.rgb24_equal, "float32_equal": r.float32_equal, "ms_per_batch": r.ms_per_batch,
                }),
            ),
            Some(Err(e)) => (serde_json::json!({"device": args.device, "error": e.to_string()}), serde_json::Value::Null),
            None => (serde_json::Value::Null, serde_json::Value::Null),
        };
        let out = serde_json::json!({
            "devices": probe.devices.as_ref().ok(), "devices_error": probe.devices.as_ref().err(),
            "nvrtc": probe.nvrtc.map(|(a, b)| format!("{a}.{b}")), "nccl": probe.nccl.as_ref().ok().map(|v| lake_gpu::nccl::version_string(*v)),
            "nccl_error": probe.nccl.as_ref().err(), "nvdec": probe.nvdec,
            "colour_check": colour, "resize_check": resize, "passed": passed,
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
                    let sizes: Vec<String> =
                        SIZES.iter().map(|&(w, h)| format!("{w}x{h} {}", if c.fits(w, h).is_ok() { "yes" } else { "no" })).collect();
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
            Some(Ok((name, c, r))) => {
                let equal = |e: bool| if e { "equal" } else { "DIFFERENT from" };
                outln!(
                    "device {} ({name}): {} frames of {}x{} YUV 4:2:0 to RGB24 {}, to normalised float32 {}, to bfloat16 {}, and 10-bit \
                     P010 to RGB24 {} the CPU's; {:.3} ms a batch ({:.0} frames/s)",
                    args.device,
                    c.frames,
                    c.width,
                    c.height,
                    equal(c.rgb24_equal),
                    equal(c.float32_equal),
                    equal(c.bf16_equal),
                    equal(c.p010_equal),
                    c.ms_per_batch,
                    c.frames as f64 / (c.ms_per_batch / 1e3),
                )?;
                outln!(
                    "device {}: the same frames' RGB resized to {}x{} as a frame table resizes them: RGB24 {}, normalised float32 {} \
                     the CPU's; {:.3} ms a batch ({:.0} frames/s)",
                    args.device,
                    r.to.0,
                    r.to.1,
                    equal(r.rgb24_equal),
                    equal(r.float32_equal),
                    r.ms_per_batch,
                    r.frames as f64 / (r.ms_per_batch / 1e3),
                )?;
            }
            Some(Err(e)) => outln!("device {}: {e}", args.device)?,
            None => outln!("no device {} to check: the CPU path is taken", args.device)?,
        }
    }
    Ok(if passed { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
