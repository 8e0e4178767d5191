//! `lake bench`: the loader's throughput, CPU per sample, first-batch latency and memory.

use std::{
    process::ExitCode,
    sync::Arc,
    time::{Duration, Instant},
};

use crate::args::{LoaderArgs, MIB, WindowArgs, at_least_one, horizon_in_range, prefetch_in_range, whole_number};
use anyhow::Context;
use futures::StreamExt;
use lake_loader::{Cursor, Loader, Order, Sharding, StreamRequest};
use lake_store::Lake;

/// Arguments of `lake bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Dataset (`NAME`, `NAME@VERSION`) or view name; repeat with `=WEIGHT` suffixes for a
    /// mixture.
    #[arg(long, required = true)]
    dataset: Vec<String>,
    #[command(flatten)]
    windows: WindowArgs,
    #[command(flatten)]
    loader: LoaderArgs,
    /// Samples per batch, at least 1.
    #[arg(long, default_value_t = 32, value_parser = at_least_one)]
    batch_size: u64,
    /// Batches to time, at least 1: after the first (reported on its own as the latency) and
    /// the `--prefetch` batches made ahead while it was awaited.
    #[arg(long, default_value_t = 50, value_parser = at_least_one)]
    batches: u64,
    /// Batches prepared ahead of the consumer, 1 to 64.
    #[arg(long, default_value_t = 2, value_parser = prefetch_in_range)]
    prefetch: usize,
    /// Draws planned ahead: frames later batches show are kept when they are decoded anyway
    /// (the rest of a GOP), in the frame cache's budget (0: off, at most 131072; needs `--cache
    /// on`) [default: 8192 with the cache on].
    #[arg(long, value_parser = horizon_in_range)]
    lookahead: Option<u64>,
    /// Sampler seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Epoch to start in (the order is a function of seed and epoch), 0 to 2^32 - 1 as a
    /// sampling request takes.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(..=u64::from(u32::MAX)))]
    epoch: u64,
    /// Global step to start at within the epoch (below the epoch's steps); the stream goes on
    /// into the next epochs.
    #[arg(long, default_value_t = 0)]
    start_step: u64,
    /// Sample only these episodes (comma-separated episode indices) [default: all].
    #[arg(long, value_delimiter = ',', allow_negative_numbers = true, value_parser = whole_number)]
    episodes: Vec<i64>,
    /// Never sample the first N steps of an episode (LeRobot's `drop_n_first_frames`).
    #[arg(long, default_value_t = 0)]
    drop_n_first_frames: u64,
    /// Never sample the last N steps of an episode (LeRobot's `drop_n_last_frames`).
    #[arg(long, default_value_t = 0)]
    drop_n_last_frames: u64,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// `lake bench`: loader throughput on a dataset.
pub async fn bench(root: &str, args: BenchArgs) -> anyhow::Result<ExitCode> {
    let lake = Lake::open(root)?;
    let spec = lake_loader::views::SamplingSpec {
        datasets: args.dataset.clone(),
        episodes: args.episodes.clone(),
        drop_n_first_frames: args.drop_n_first_frames,
        drop_n_last_frames: args.drop_n_last_frames,
        frame_size: args.loader.frame_size,
        frame_format: args.loader.frame_format,
        proxy: args.loader.proxy,
    };
    let lake_loader::views::Sampling { datasets, sources } = lake_loader::views::open_sampling(&lake, &spec).await?;
    let labels: Vec<String> = datasets.iter().map(|d| d.label.clone()).collect();
    let loader = Arc::new(Loader::new(datasets, &args.windows.windows()?, args.loader.options())?);
    let order = Arc::new(Order::new(args.seed, sources)?);
    let sharding = Sharding::new(args.batch_size, 0, 1, true)?;
    let steps = sharding.steps_per_epoch(order.epoch_len());
    if steps == 0 {
        anyhow::bail!("the batch size {} is larger than the {} eligible", args.batch_size, crate::text::count(order.epoch_len(), "step"));
    }
    if args.start_step >= steps {
        anyhow::bail!(
            "--start-step {} is past the epoch's last step ({steps} steps of {} samples per epoch: steps 0 to {})",
            args.start_step,
            args.batch_size,
            steps - 1
        );
    }
    // An endless stream: the first batch (its latency reported on its own), then the
    // `prefetch` batches made ahead while the first was awaited (untimed), then the timed ones.
    // The window so opens and closes with `prefetch` batches in the making (a stream limited
    // to the batches timed, or timing from the first batch on, would count batches made
    // before the window as free).
    let lookahead = match (args.loader.cache.as_str(), args.lookahead) {
        ("on", lookahead) => lookahead.unwrap_or(lake_loader::DEFAULT_HORIZON),
        (_, Some(1..)) => anyhow::bail!("--lookahead keeps frames in the frame cache: it needs --cache on"),
        _ => 0,
    };
    let request = StreamRequest {
        order: order.clone(),
        sharding,
        start: Cursor { epoch: args.epoch, step: args.start_step },
        limit: None,
        stride: 1,
        prefetch: args.prefetch,
        lookahead,
    };
    let warm = 1 + args.prefetch;
    let timed_cursors: Vec<Cursor> = lake_loader::cursors(&request).skip(warm).take(args.batches as usize).collect();
    let cpu0 = lake_loader::process_usage().cpu_s;
    let began = Instant::now();
    let mut stream = lake_loader::stream(loader.clone(), request);
    let first = stream.next().await.context("the loader produced no batch")??;
    let first_latency = began.elapsed();
    for _ in 1..warm {
        stream.next().await.context("the loader's stream ended")??;
    }
    let cpu1 = lake_loader::process_usage().cpu_s;
    let decode_before = loader.decode_stats();
    let timed = Instant::now();
    let (mut samples, mut bytes) = (0u64, 0u64);
    let packets = args.loader.frame_format == lake_loader::FrameFormat::Packets;
    let mut shipped = Vec::new();
    for _ in 0..args.batches {
        let batch = stream.next().await.context("the loader's stream ended")??.batch;
        samples += batch.num_rows() as u64;
        bytes += batch.get_array_memory_size() as u64;
        if packets {
            shipped.push(batch);
        }
    }
    let wall = timed.elapsed();
    let lake_loader::ProcessUsage { cpu_s: cpu2, peak_rss_mb } = lake_loader::process_usage();
    // What the decoders did in the timed window (which opens and closes with batches in the
    // making, as the CPU time does).
    let decode = loader.decode_stats();
    drop(stream);
    let cache = loader.cache_stats();

    // The decode-bound limit: the decoders alone (FFmpeg; libjpeg-turbo for JPEG pictures)
    // decoding exactly the GOPs these batches need (per
    // batch, as the loader plans them without a cache) and converting the wanted frames.
    let mut jobs = Vec::new();
    for c in &timed_cursors {
        let draws: Vec<_> = sharding.positions(order.epoch_len(), c.step).map(|p| order.draw(c.epoch, p)).collect();
        jobs.extend(loader.plan(&draws));
    }
    let bound = loader.decode_bound(&jobs).await?;
    // Packets: the consumer's side, decoding the timed batches on one thread into RGB.
    let consumer_decode_ms_per_sample = match packets {
        false => None,
        true => {
            let decoder = lake_loader::PacketBatchDecoder::new(lake_loader::FrameFormat::Rgb24, 1)?;
            let before = lake_loader::process_usage().cpu_s;
            for batch in &shipped {
                std::hint::black_box(decoder.decode(batch)?);
            }
            Some((lake_loader::process_usage().cpu_s - before) * 1e3 / samples.max(1) as f64)
        }
    };
    drop(shipped);
    // The floor: copying the output bytes once.
    let sample_bytes = first.batch.get_array_memory_size() / first.batch.num_rows().max(1);
    let copy_ms_per_sample = memcpy_seconds(sample_bytes, 64) * 1e3 / 64.0;
    let wire_bytes_per_sample = ipc_bytes(&first.batch)? / first.batch.num_rows().max(1);
    let report = BenchReport {
        datasets: labels,
        preset: args.windows.delta_timestamps.clone().unwrap_or(args.windows.preset.clone()),
        seed: args.seed,
        epoch: args.epoch,
        start_step: args.start_step,
        batch_size: args.batch_size,
        batches: args.batches,
        threads: loader_threads(&args.loader),
        cache: args.loader.cache == "on",
        lookahead,
        frame_table: args.loader.frame_table == "on" && loader.datasets().iter().all(|d| d.has_frame_table()),
        frame_format: args.loader.frame_format,
        frame_size: args.loader.frame_size.map(|s| s.to_string()),
        yuv_cameras: cameras_in(&loader.schema(), "yuv420p"),
        rgb_cameras: cameras_in(&loader.schema(), "rgb24"),
        cameras: loader.datasets().iter().any(|d| !d.cameras.is_empty()),
        samples,
        seconds: wall.as_secs_f64(),
        samples_per_s: samples as f64 / wall.as_secs_f64().max(1e-9),
        cpu_ms_per_sample: (cpu2 - cpu1) * 1e3 / samples.max(1) as f64,
        samples_per_cpu_s: samples as f64 / (cpu2 - cpu1).max(1e-9),
        mb_per_s: bytes as f64 / 1e6 / wall.as_secs_f64().max(1e-9),
        first_batch_ms: first_latency.as_secs_f64() * 1e3,
        first_batch_cpu_ms: (cpu1 - cpu0) * 1e3,
        first_batch_rows: first.batch.num_rows() as u64,
        peak_rss_mb,
        cache_hit_rate: cache.hit_rate(),
        ahead_hit_rate: cache.ahead_hits as f64 / (cache.hits + cache.misses).max(1) as f64,
        cache_budget_mb: cache.budget as f64 / MIB,
        cache_held_mb: cache.bytes as f64 / MIB,
        frames_decoded: decode.frames - decode_before.frames,
        packets_decoded: decode.packets - decode_before.packets,
        decode_ms_per_sample: (decode.decode_ns - decode_before.decode_ns) as f64 / 1e6 / samples.max(1) as f64,
        fetch_ms_per_sample: (decode.fetch_ns - decode_before.fetch_ns) as f64 / 1e6 / samples.max(1) as f64,
        bound_cpu_ms_per_sample: bound.cpu_seconds * 1e3 / samples.max(1) as f64,
        bound_fraction: bound.cpu_seconds / (cpu2 - cpu1).max(1e-9),
        bound_frames: bound.frames,
        bound_packets: bound.packets,
        copy_ms_per_sample,
        sample_bytes: sample_bytes as u64,
        wire_bytes_per_sample: wire_bytes_per_sample as u64,
        consumer_decode_ms_per_sample,
    };
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&report)?)?;
    } else {
        report.print()?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The camera columns of `schema` whose frames travel in `pixel_format`.
fn cameras_in(schema: &arrow::datatypes::Schema, pixel_format: &str) -> Vec<String> {
    schema
        .fields()
        .iter()
        .filter(|f| f.metadata().get(lake_loader::PIXEL_FORMAT).is_some_and(|p| p == pixel_format))
        .map(|f| f.name().clone())
        .collect()
}

fn loader_threads(args: &LoaderArgs) -> usize {
    args.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(2, usize::from))
}

#[derive(Debug, serde::Serialize)]
struct BenchReport {
    datasets: Vec<String>,
    preset: String,
    seed: u64,
    epoch: u64,
    start_step: u64,
    batch_size: u64,
    batches: u64,
    threads: usize,
    cache: bool,
    lookahead: u64,
    frame_table: bool,
    /// The frame format asked for, and the cameras it gives as YUV planes (the others stay RGB).
    frame_format: lake_loader::FrameFormat,
    yuv_cameras: Vec<String>,
    rgb_cameras: Vec<String>,
    /// The frame size asked for (`WIDTHxHEIGHT`), if not the recorded one.
    frame_size: Option<String>,
    /// Whether the samples show camera frames at all.
    cameras: bool,
    samples: u64,
    seconds: f64,
    samples_per_s: f64,
    cpu_ms_per_sample: f64,
    samples_per_cpu_s: f64,
    mb_per_s: f64,
    first_batch_ms: f64,
    first_batch_cpu_ms: f64,
    first_batch_rows: u64,
    peak_rss_mb: f64,
    cache_hit_rate: f64,
    ahead_hit_rate: f64,
    /// The frame cache's budget and the bytes it held at the end, in MiB (as `--cache-mb` and
    /// `peak_rss_mb` count).
    cache_budget_mb: f64,
    cache_held_mb: f64,
    frames_decoded: u64,
    packets_decoded: u64,
    decode_ms_per_sample: f64,
    fetch_ms_per_sample: f64,
    bound_cpu_ms_per_sample: f64,
    bound_fraction: f64,
    bound_frames: u64,
    bound_packets: u64,
    copy_ms_per_sample: f64,
    sample_bytes: u64,
    /// Bytes of a sample as an Arrow IPC stream sends it (Flight, HTTP), uncompressed.
    wire_bytes_per_sample: u64,
    /// With packets: the CPU a consumer spends per sample decoding them into RGB, one thread.
    consumer_decode_ms_per_sample: Option<f64>,
}

/// The bytes of `batch` as an Arrow IPC stream.
fn ipc_bytes(batch: &arrow::array::RecordBatch) -> anyhow::Result<usize> {
    let mut writer = arrow::ipc::writer::StreamWriter::try_new(Vec::new(), &batch.schema())?;
    writer.write(batch)?;
    Ok(writer.into_inner()?.len())
}

/// Seconds to copy `bytes` into a fresh buffer, `times` times.
fn memcpy_seconds(bytes: usize, times: usize) -> f64 {
    let src = vec![7u8; bytes];
    let began = Instant::now();
    for _ in 0..times {
        let dst = src.clone();
        std::hint::black_box(&dst);
    }
    began.elapsed().as_secs_f64()
}

impl BenchReport {
    fn print(&self) -> std::io::Result<()> {
        let d = Duration::from_secs_f64(self.seconds);
        // A long `delta_timestamps` is summed up (`--json` has it whole).
        let windows = match serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(&self.preset) {
            Ok(keys) if self.preset.len() > 60 => {
                let offsets: usize = keys.values().filter_map(serde_json::Value::as_array).map(Vec::len).sum();
                format!(
                    "delta_timestamps of {} ({})",
                    crate::text::count(keys.len() as u64, "key"),
                    crate::text::count(offsets as u64, "offset")
                )
            }
            Ok(_) => format!("delta_timestamps {}", self.preset),
            Err(_) => format!("preset {}", self.preset),
        };
        let frames = match (self.cameras, self.frame_table) {
            (false, _) => " · no cameras".to_string(),
            (true, table) => {
                // Frames read from a table, or a cache with no room, are not decoded ahead.
                let lookahead = match self.lookahead {
                    0 => "off".to_string(),
                    _ if table => "off (frames come from the frame table)".to_string(),
                    _ if self.cache_budget_mb == 0.0 => "off (the frame cache has no room)".to_string(),
                    n => format!("{n} draws"),
                };
                let size = self.frame_size.as_ref().map_or(String::new(), |s| format!(" at {s}"));
                let planes = match (self.frame_format, self.yuv_cameras.len(), self.rgb_cameras.len()) {
                    (lake_loader::FrameFormat::Rgb24, ..) => String::new(),
                    (lake_loader::FrameFormat::Packets, ..) => " as packets, for the consumer to decode".to_string(),
                    (_, 0, _) => " as RGB (no camera gives yuv420p planes)".to_string(),
                    (_, _, 0) => " as yuv420p planes".to_string(),
                    (_, yuv, rgb) => format!(" as yuv420p planes ({yuv} of {} cameras; the others RGB)", yuv + rgb),
                };
                format!(" · lookahead {lookahead} · frames{size} from {}{planes}", if table { "the frame table" } else { "packets" })
            }
        };
        let start = match (self.seed, self.epoch, self.start_step) {
            (0, 0, 0) => String::new(),
            (seed, epoch, step) => format!(" · seed {seed}, epoch {epoch} from step {step}"),
        };
        outln!(
            "lake bench: {} · {windows}{start} · batch {} · {} · cache {}{frames}",
            self.datasets.join(" + "),
            self.batch_size,
            crate::text::count(self.threads as u64, "thread"),
            if self.cache { "on" } else { "off" },
        )?;
        outln!(
            "  samples            {} in {:.2?} ({} batches after the first and those made ahead with it)",
            self.samples,
            d,
            self.batches
        )?;
        outln!("  samples/s          {:.1}", self.samples_per_s)?;
        outln!("  CPU ms/sample      {:.3}   ({:.1} samples per CPU-second)", self.cpu_ms_per_sample, self.samples_per_cpu_s)?;
        if self.cameras {
            outln!(
                "  decode ms/sample   {:.3}   ({} frames from {} packets; decode threads' time in the timed window)",
                self.decode_ms_per_sample,
                self.frames_decoded,
                self.packets_decoded
            )?;
            outln!("  packet read ms/s.  {:.3}   (wall time of Lance reads, overlapping decode)", self.fetch_ms_per_sample)?;
        }
        outln!("  output MB/s        {:.1}", self.mb_per_s)?;
        outln!(
            "  first batch        {:.1} ms ({:.1} CPU ms, {} samples)",
            self.first_batch_ms,
            self.first_batch_cpu_ms,
            self.first_batch_rows
        )?;
        if self.cameras {
            outln!(
                "  cache hit rate     {:.1} % ({:.1} % from frames decoded ahead; {:.1} of {:.1} MiB held)",
                self.cache_hit_rate * 100.0,
                self.ahead_hit_rate * 100.0,
                self.cache_held_mb,
                self.cache_budget_mb
            )?;
        }
        outln!("  peak RSS           {:.0} MiB", self.peak_rss_mb)?;
        if !self.cameras {
            outln!("  copy floor         {:.4} ms/sample ({:.2} MB per sample)", self.copy_ms_per_sample, self.sample_bytes as f64 / 1e6)?;
            return Ok(());
        }
        match self.consumer_decode_ms_per_sample {
            Some(ms) => outln!("  consumer decode    {ms:.3} CPU ms/sample (the timed batches' packets decoded into RGB on one thread)")?,
            None => outln!(
                "  decode-bound limit {:.3} CPU ms/sample ({} frames from {} packets, decoders alone): lake runs at {:.0} % of it",
                self.bound_cpu_ms_per_sample,
                self.bound_frames,
                self.bound_packets,
                self.bound_fraction * 100.0
            )?,
        }
        outln!("  copy floor         {:.4} ms/sample ({:.2} MB per sample)", self.copy_ms_per_sample, self.sample_bytes as f64 / 1e6)?;
        outln!("  on the wire        {:.3} MB per sample (Arrow IPC, uncompressed)", self.wire_bytes_per_sample as f64 / 1e6)?;
        Ok(())
    }
}
