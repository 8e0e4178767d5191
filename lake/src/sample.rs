//! `lake sample` and `lake bench`: the loader from the command line.

use std::{
    collections::HashMap,
    io::IsTerminal,
    process::ExitCode,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::Context;
use arrow::ipc::writer::FileWriter;
use futures::StreamExt;
use lake_loader::{Cursor, Draw, FrameStorage, Loader, LoaderDataset, LoaderOptions, Order, Sharding, StreamRequest, Windows};
use lake_store::Lake;

/// How samples are windowed, shared by `sample` and `bench`.
#[derive(Debug, clap::Args)]
pub struct WindowArgs {
    /// Window preset: act (50 future actions), diffusion (2 observation steps, 16 actions) or
    /// none.
    #[arg(long, default_value = "none", conflicts_with = "delta_timestamps")]
    preset: String,
    /// LeRobot `delta_timestamps` as JSON, e.g. '{"action": [0.0, 0.0333]}', or `@FILE` for
    /// JSON read from FILE.
    #[arg(long, value_parser = json_or_file)]
    delta_timestamps: Option<String>,
}

/// JSON given on the command line, or read from the file of `@FILE` (for JSON too long for one).
fn json_or_file(text: &str) -> Result<String, String> {
    match text.strip_prefix('@') {
        Some(path) => std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}")),
        None => Ok(text.to_string()),
    }
}

impl WindowArgs {
    fn windows(&self) -> anyhow::Result<Windows> {
        Ok(match &self.delta_timestamps {
            Some(json) => Windows::parse_delta_timestamps(json)?,
            None => Windows::Preset(self.preset.parse()?),
        })
    }
}

/// Loader settings, shared by `sample` and `bench`.
#[derive(Debug, clap::Args)]
pub struct LoaderArgs {
    /// Decode threads, 1 to 256 [default: number of cores].
    #[arg(long, value_parser = threads_in_range)]
    threads: Option<usize>,
    /// Decoded-frame cache: on or off.
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    cache: String,
    /// Decoded-frame cache budget in MiB.
    #[arg(long, default_value_t = lake_loader::DEFAULT_CACHE_MIB, value_parser = mebibytes)]
    cache_mb: u64,
    /// Read frames from the dataset's stored frame table (`lake cache`) when it has one: on or
    /// off (decode from packets). Frame tables hold RGB: yuv420p frames come from the packets.
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    frame_table: String,
    /// Every camera's frames at WIDTHxHEIGHT, read from the dataset's frame table of that size
    /// (`lake cache NAME --size WxH`) instead of at their recorded size.
    #[arg(long, value_name = "WxH")]
    frame_size: Option<lake_loader::FrameSize>,
    /// How camera frames travel: rgb24 (LeRobot's frames), or yuv420p (the decoder's planes,
    /// half the bytes, for the trainer to convert to the same RGB on its GPU) for the video
    /// cameras whose frames are 8-bit 4:2:0; the others stay RGB.
    #[arg(long, default_value = "rgb24", value_name = "FORMAT")]
    frame_format: lake_loader::FrameFormat,
}

/// A count that must be 1 or more (`--batch-size`, `--batches`, `--memory-mb`).
pub fn at_least_one(text: &str) -> Result<u64, String> {
    match text.parse::<u64>() {
        Ok(n @ 1..) => Ok(n),
        Ok(_) => Err("must be at least 1".into()),
        Err(_) => Err(format!("`{text}` is not a whole number")),
    }
}

/// The most MiB a memory setting takes: 16 TiB (far beyond any machine's, and clear of
/// overflowing as bytes).
const MAX_MIB: u64 = 1 << 24;

/// A whole number from `least` to `most` of `unit`s, refused with one message for any other
/// text (`0`, `0.5` and `ten` alike).
fn whole_in(text: &str, least: u64, most: u64, unit: &str, most_is: &str) -> Result<u64, String> {
    match text.trim().parse::<u64>() {
        Ok(n) if (least..=most).contains(&n) => Ok(n),
        _ => Err(format!("`{text}` is not a whole number of {unit} from {least} to {most} ({most_is})")),
    }
}

/// A size in MiB, 0 to 16 TiB.
pub fn mebibytes(text: &str) -> Result<u64, String> {
    whole_in(text, 0, MAX_MIB, "MiB", "16 TiB")
}

/// A size in MiB, 1 to 16 TiB.
pub fn mebibytes_at_least_one(text: &str) -> Result<u64, String> {
    whole_in(text, 1, MAX_MIB, "MiB", "16 TiB")
}

/// Most seconds a wait may be set to: a year (a deadline further off is none, and would
/// overflow a clock).
const YEAR_S: u64 = 365 * 24 * 3600;

/// A number of seconds, 0 to a year.
pub fn seconds(text: &str) -> Result<u64, String> {
    whole_in(text, 0, YEAR_S, "seconds", "a year")
}

/// [`seconds`], at least 1.
pub fn seconds_at_least_one(text: &str) -> Result<u64, String> {
    whole_in(text, 1, YEAR_S, "seconds", "a year")
}

/// `--threads`: 1 to 256 (more threads than that only contend).
pub fn threads_in_range(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n @ 1..=256) => Ok(n),
        _ => Err(format!("`{text}` is not a number of threads from 1 to 256")),
    }
}

/// Bytes in a MiB.
const MIB: f64 = 1_048_576.0;

/// `--prefetch`: 1 to 64 batches made ahead (each is held in memory until it is taken).
pub fn prefetch_in_range(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n @ 1..=64) => Ok(n),
        _ => Err(format!("`{text}` is not a number of batches from 1 to 64 (each made ahead is held in memory until it is taken)")),
    }
}

/// A whole number of a comma-separated list (spaces around it allowed).
fn whole_number(text: &str) -> Result<i64, String> {
    text.trim().parse().map_err(|_| format!("`{}` is not a whole number", text.trim()))
}

/// Comma-separated indices, each a number or `@FILE` (every index of the file, separated by
/// commas or whitespace); an argument that starts with `@` is one file, commas in its path
/// and all.
fn index_or_file(text: &str) -> Result<Vec<i64>, String> {
    let from_file = |path: &str| -> Result<Vec<i64>, String> {
        let contents = std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))?;
        contents
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|t| !t.is_empty())
            .map(|t| whole_number(t).map_err(|e| format!("{path}: {e}")))
            .collect()
    };
    if let Some(path) = text.trim().strip_prefix('@') {
        return from_file(path);
    }
    let mut indices = Vec::new();
    for piece in text.split(',') {
        match piece.trim().strip_prefix('@') {
            Some(path) => indices.extend(from_file(path)?),
            None => indices.push(whole_number(piece)?),
        }
    }
    Ok(indices)
}

/// A lookahead horizon: 0 (off) to [`lake_loader::MAX_HORIZON`] draws.
pub fn horizon_in_range(text: &str) -> Result<u64, String> {
    match text.parse::<u64>() {
        Ok(n) if n <= lake_loader::MAX_HORIZON => Ok(n),
        _ => Err(format!(
            "`{text}` is not a number of draws from 0 (off) to {} (a plan holds memory for each draw, and the frames it keeps must \
             fit the frame cache)",
            lake_loader::MAX_HORIZON
        )),
    }
}

impl LoaderArgs {
    fn options(&self) -> LoaderOptions {
        LoaderOptions {
            threads: self.threads.unwrap_or(0),
            cache_bytes: if self.cache == "on" { self.cache_mb << 20 } else { 0 },
            frame_table: self.frame_table == "on",
        }
    }
}

/// Arguments of `lake cache`.
#[derive(Debug, clap::Args)]
pub struct CacheArgs {
    /// Dataset name, optionally `NAME@VERSION`.
    dataset: String,
    /// Streams decoded in parallel, 1 to 256 [default: number of cores].
    #[arg(long, value_parser = threads_in_range)]
    threads: Option<usize>,
    /// How frames are stored: `plain` RGB (3 bytes per pixel on disk; a read is all a frame
    /// costs) or `zstd`-compressed RGB (less disk, by how much depends on the footage: a third
    /// on smooth camera images, little on noisy ones; costs a decompression per frame read).
    #[arg(long, value_enum, default_value_t = Storage::Plain)]
    storage: Storage,
    /// Store every camera's frames resized to WIDTHxHEIGHT (swscale, area averaging) in a table
    /// of their own, which `--frame-size WxH` reads, instead of at their recorded size.
    #[arg(long, value_name = "WxH")]
    size: Option<lake_loader::FrameSize>,
}

/// `lake cache --storage`, `lake ingest --frame-storage`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Storage {
    Plain,
    Zstd,
}

impl From<Storage> for FrameStorage {
    fn from(s: Storage) -> Self {
        match s {
            Storage::Plain => FrameStorage::Plain,
            Storage::Zstd => FrameStorage::Zstd,
        }
    }
}

/// `lake cache`: decode every frame once and store it losslessly beside the dataset version.
pub async fn cache(root: &str, args: CacheArgs) -> anyhow::Result<ExitCode> {
    let lake = Lake::open(root)?;
    let ds = LoaderDataset::open(&lake, &args.dataset).await?;
    // Ctrl-C drops the work: the unpublished table is removed, an existing one kept.
    let stored = tokio::select! {
        stored = store_frames(&lake, ds, args.threads, args.storage.into(), args.size) => stored?,
        code = crate::signals::stop_requested() => {
            errln!("cancelled; no frame table was stored (the lake is unchanged)");
            return Ok(ExitCode::from(code));
        }
    };
    outln!("{}", stored.summary())?;
    Ok(ExitCode::SUCCESS)
}

/// What [`store_frames`] did.
#[derive(Debug, serde::Serialize)]
pub struct StoredFrames {
    /// The dataset version.
    pub dataset: String,
    /// The size frames were stored at (`None`: as recorded).
    pub size: Option<lake_loader::FrameSize>,
    /// `plain` or `zstd`.
    pub storage: &'static str,
    /// Frames stored.
    pub frames: u64,
    /// Bytes of RGB.
    pub raw_bytes: u64,
    /// Bytes written.
    pub stored_bytes: u64,
    /// Wall-clock seconds.
    pub seconds: f64,
}

impl StoredFrames {
    /// The line `lake cache` prints.
    pub fn summary(&self) -> String {
        if self.frames == 0 {
            return format!("{} has no camera frames; nothing stored", self.dataset);
        }
        let at = self.size.map(|s| format!(" at {s}")).unwrap_or_default();
        format!(
            "stored {} decoded frames of {}{at} ({:.1} MB of RGB as {:.1} MB, {}) in {:.1} s ({:.0} frames/s)",
            self.frames,
            self.dataset,
            self.raw_bytes as f64 / 1e6,
            self.stored_bytes as f64 / 1e6,
            self.storage,
            self.seconds,
            self.frames as f64 / self.seconds.max(1e-9)
        )
    }
}

/// Decodes every frame of `ds` and stores it (resized to `size`) in the version's frame table,
/// replacing the one there, with a progress bar on stderr when it is a terminal.
///
/// # Errors
/// When a frame cannot be decoded or the table cannot be written (nothing is replaced then).
pub async fn store_frames(
    lake: &Lake,
    ds: Arc<LoaderDataset>,
    threads: Option<usize>,
    storage: FrameStorage,
    size: Option<lake_loader::FrameSize>,
) -> anyhow::Result<StoredFrames> {
    let began = Instant::now();
    if ds.packets.stream.is_empty() {
        // No camera (or every one left out at ingest): no table, which readers would open for nothing.
        let seconds = began.elapsed().as_secs_f64();
        return Ok(StoredFrames {
            dataset: ds.label.clone(),
            size,
            storage: storage.name(),
            frames: 0,
            raw_bytes: 0,
            stored_bytes: 0,
            seconds,
        });
    }
    check_room(lake, &ds, storage, size)?;
    let threads = threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(2, usize::from));
    let stored = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let ticker = std::io::stderr().is_terminal().then(|| {
        let bar = indicatif::ProgressBar::with_draw_target(
            Some(ds.packets.stream.len() as u64),
            indicatif::ProgressDrawTarget::stderr_with_hz(4),
        );
        bar.set_style(
            indicatif::ProgressStyle::with_template("{spinner} storing frames {bar:20} {pos}/{len} {msg}").expect("valid template"),
        );
        let (shown, stored, total) = (bar.clone(), stored.clone(), ds.packets.stream.len() as u64);
        let task = tokio::spawn(async move {
            let began = Instant::now();
            loop {
                let done = stored.load(std::sync::atomic::Ordering::Relaxed);
                let rate = done as f64 / began.elapsed().as_secs_f64().max(1e-3);
                let eta = if rate > 0.0 { format!(", ETA {:.0} s", total.saturating_sub(done) as f64 / rate) } else { String::new() };
                shown.set_position(done);
                shown.set_message(format!("({rate:.0} frames/s{eta})"));
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        });
        (bar, task)
    });
    let report = lake_loader::write_frame_table(lake, ds.clone(), threads, storage, size, &stored).await;
    if let Some((bar, task)) = ticker {
        task.abort();
        bar.finish_and_clear();
    }
    let report = report?;
    Ok(StoredFrames {
        dataset: ds.label.clone(),
        size,
        storage: storage.name(),
        frames: report.frames,
        raw_bytes: report.raw_bytes,
        stored_bytes: report.stored_bytes,
        seconds: began.elapsed().as_secs_f64(),
    })
}

/// Arguments of `lake sample`.
#[derive(Debug, clap::Args)]
pub struct SampleArgs {
    /// Dataset name (optionally `NAME@VERSION`), or a view over one dataset.
    #[arg(long)]
    dataset: String,
    /// LeRobot `index` values (absolute step indices), comma-separated; `@FILE` reads them from
    /// FILE (separated by commas, spaces or lines), for more than a command line holds.
    #[arg(long, required = true, allow_negative_numbers = true, value_parser = index_or_file)]
    indices: Vec<Vec<i64>>,
    #[command(flatten)]
    windows: WindowArgs,
    #[command(flatten)]
    loader: LoaderArgs,
    /// Arrow IPC file to write (one row per index, LeRobot's keys as column names).
    #[arg(long)]
    out: std::path::PathBuf,
}

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

/// `lake sample`: the samples of given indices, as an Arrow IPC file.
pub async fn sample(root: &str, args: SampleArgs) -> anyhow::Result<ExitCode> {
    let lake = Lake::open(root)?;
    let selection = match lake_loader::views::resolve(&lake, &args.dataset).await?.as_slice() {
        [one] => one.clone(),
        many => anyhow::bail!(
            "view `{}` spans {} datasets; sample one of them by name ({})",
            args.dataset,
            many.len(),
            many.iter().map(|s| s.dataset.as_str()).collect::<Vec<_>>().join(", ")
        ),
    };
    if args.out.is_dir() {
        anyhow::bail!("--out {} is a directory; give a file name (e.g. samples.arrow)", args.out.display());
    }
    let frames = lake_loader::FrameSpec { size: args.loader.frame_size, format: args.loader.frame_format };
    let ds = LoaderDataset::open_as(&lake, &selection.dataset, frames).await?;
    let loader = Loader::new(vec![ds.clone()], &args.windows.windows()?, args.loader.options())?;
    let indices: Vec<i64> = args.indices.concat();
    if indices.is_empty() {
        anyhow::bail!("--indices names no step (an empty file?)");
    }
    let draws = indices.iter().map(|&i| Ok(Draw { source: 0, row: ds.row_of_index(i)? })).collect::<anyhow::Result<Vec<_>>>()?;
    if let Some(episodes) = &selection.episodes {
        for (draw, index) in draws.iter().zip(&indices) {
            let episode = ds.episodes.iter().find(|e| (e.first_row..e.first_row + e.len).contains(&draw.row)).map(|e| e.episode_index);
            if episode.is_none_or(|e| episodes.binary_search(&e).is_err()) {
                anyhow::bail!("index {index} is in episode {}, which view `{}` does not select", episode.unwrap_or(-1), args.dataset);
            }
        }
    }
    let batch = loader.batch(&draws).await?;
    // Whole or not at all (see `Output`).
    let written = (|| -> anyhow::Result<()> {
        let mut writer = FileWriter::try_new(crate::output::Output::create(&args.out)?, &batch.schema())?;
        writer.write(&batch)?;
        writer.finish()?;
        writer.into_inner()?.commit()?;
        Ok(())
    })();
    written.with_context(|| format!("writing {}", args.out.display()))?;
    errln!(
        "wrote {} sample{} of {} ({} columns, {:.1} MB) to {}",
        batch.num_rows(),
        if batch.num_rows() == 1 { "" } else { "s" },
        ds.label,
        batch.num_columns(),
        batch.get_array_memory_size() as f64 / 1e6,
        args.out.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// Refuses a plain frame table that cannot fit in the space free where the lake is (a size
/// typed with a digit too many would fill the disk before failing), and warns when even a
/// compressed one may not.
fn check_room(lake: &Lake, ds: &LoaderDataset, storage: FrameStorage, size: Option<lake_loader::FrameSize>) -> anyhow::Result<()> {
    let mut pixels_of: HashMap<u32, u64> = HashMap::new();
    let raw: u64 = ds
        .packets
        .stream
        .iter()
        .map(|s| {
            3 * *pixels_of.entry(*s).or_insert_with(|| match size {
                Some(size) => u64::from(size.width) * u64::from(size.height),
                None => ds.streams.get(s).map_or(0, |c| u64::from(c.params.width) * u64::from(c.params.height)),
            })
        })
        .sum();
    let Some(free) = free_bytes(&lake.uri(".")) else { return Ok(()) };
    let what = format!("{}: {} frames{}", ds.label, ds.packets.stream.len(), size.map(|s| format!(" at {s}")).unwrap_or_default());
    if let Some(warning) = room_for(raw, free, storage, &what)? {
        errln!("warning: {warning}");
    }
    Ok(())
}

/// Whether `raw` bytes of RGB (`what`) fit in `free` bytes with 5 % to spare: an error for a
/// plain table that does not, a warning for a compressed one that may not.
fn room_for(raw: u64, free: u64, storage: FrameStorage, what: &str) -> anyhow::Result<Option<String>> {
    // A margin for what a table holds besides the frames (and what else may write meanwhile).
    if raw.saturating_add(raw / 20) <= free {
        return Ok(None);
    }
    let (raw, free) = (crate::text::decimal_bytes(raw), crate::text::decimal_bytes(free));
    match storage {
        FrameStorage::Plain => anyhow::bail!("{what} are {raw} of RGB, more than the {free} free where the lake is; nothing was written"),
        _ => Ok(Some(format!("{what} are {raw} of RGB before compression, and {free} are free where the lake is"))),
    }
}

/// Bytes free to this user on the filesystem holding `path`, when the system says.
fn free_bytes(path: &str) -> Option<u64> {
    let c_path = std::ffi::CString::new(path).ok()?;
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: a NUL-terminated path and a struct for statvfs to fill; read only when it succeeds.
    let stat = unsafe {
        if libc::statvfs(c_path.as_ptr(), stat.as_mut_ptr()) != 0 {
            return None;
        }
        stat.assume_init()
    };
    // u64 here, narrower on 32-bit targets.
    #[allow(clippy::useless_conversion)]
    let (blocks, block_size) = (u64::from(stat.f_bavail), u64::from(stat.f_frsize));
    Some(blocks.saturating_mul(block_size))
}

/// CPU seconds and peak RSS of this process.
fn usage() -> (f64, f64) {
    // SAFETY: getrusage fills the struct we pass.
    let usage = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        u
    };
    let cpu = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (cpu(usage.ru_utime) + cpu(usage.ru_stime), usage.ru_maxrss as f64 / 1024.0)
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
    let (cpu0, _) = usage();
    let began = Instant::now();
    let mut stream = lake_loader::stream(loader.clone(), request);
    let first = stream.next().await.context("the loader produced no batch")??;
    let first_latency = began.elapsed();
    for _ in 1..warm {
        stream.next().await.context("the loader's stream ended")??;
    }
    let (cpu1, _) = usage();
    let decode_before = loader.decode_stats();
    let timed = Instant::now();
    let (mut samples, mut bytes) = (0u64, 0u64);
    for _ in 0..args.batches {
        let batch = stream.next().await.context("the loader's stream ended")??.batch;
        samples += batch.num_rows() as u64;
        bytes += batch.get_array_memory_size() as u64;
    }
    let wall = timed.elapsed();
    let (cpu2, peak_rss_mb) = usage();
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
    // The floor: copying the output bytes once.
    let sample_bytes = first.batch.get_array_memory_size() / first.batch.num_rows().max(1);
    let copy_ms_per_sample = memcpy_seconds(sample_bytes, 64) * 1e3 / 64.0;
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
        outln!(
            "  decode-bound limit {:.3} CPU ms/sample ({} frames from {} packets, decoders alone): lake runs at {:.0} % of it",
            self.bound_cpu_ms_per_sample,
            self.bound_frames,
            self.bound_packets,
            self.bound_fraction * 100.0
        )?;
        outln!("  copy floor         {:.4} ms/sample ({:.2} MB per sample)", self.copy_ms_per_sample, self.sample_bytes as f64 / 1e6)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_table_larger_than_the_free_space_is_refused_plain_and_warned_compressed() {
        assert!(room_for(100, 105, FrameStorage::Plain, "x").unwrap().is_none());
        assert!(room_for(100, 104, FrameStorage::Plain, "x").is_err(), "5 % to spare");
        let refused = room_for(241_000_000_000, 45_000_000_000, FrameStorage::Plain, "ds@1: 1200 frames at 8192x8192").unwrap_err();
        assert_eq!(
            refused.to_string(),
            "ds@1: 1200 frames at 8192x8192 are 241.0 GB of RGB, more than the 45.0 GB free where the lake is; nothing was written"
        );
        let small = room_for(32_000_000, 19_400_000, FrameStorage::Plain, "ds@1: 900 frames").unwrap_err();
        assert!(small.to_string().contains("are 32.0 MB of RGB, more than the 19.4 MB free"), "{small}");
        let warned = room_for(241_000_000_000, 45_000_000_000, FrameStorage::Zstd, "ds@1").unwrap().expect("a warning");
        assert!(warned.contains("before compression"), "{warned}");
        assert!(free_bytes("/").is_some(), "statvfs reads the root filesystem");
    }
}
