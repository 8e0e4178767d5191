//! `lake cache`: a dataset's frames decoded once and stored beside it.

use std::{
    collections::HashMap,
    io::IsTerminal,
    process::ExitCode,
    sync::Arc,
    time::{Duration, Instant},
};

use crate::args::threads_in_range;
use lake_loader::{FrameStorage, LoaderDataset};
use lake_store::Lake;

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
    #[arg(long, value_name = "WxH", conflicts_with = "proxy")]
    size: Option<lake_loader::FrameSize>,
    /// Instead of a frame table, make the dataset's training proxy: every camera re-encoded
    /// once with this codec (h264 or hevc) into short closed GOPs without B-frames, for GPUs
    /// that cannot decode the recorded codec and for cheap random access. Its frames are not
    /// the recorded ones (lossy): they are served only to requests that ask (`--proxy`), and
    /// their PSNR against the recorded frames is reported and carried with them.
    #[arg(long, value_name = "CODEC", conflicts_with = "storage")]
    proxy: Option<lake_loader::proxy::ProxyCodec>,
    /// With --proxy: frames per GOP (a keyframe every N frames). A sample's frame costs on
    /// average (N + 1) / 2 decoded frames (docs/decisions/0024-training-proxy-gop-2-crf-18.md).
    #[arg(long, value_name = "N", default_value_t = 2, requires = "proxy", value_parser = clap::value_parser!(u32).range(1..=300))]
    gop: u32,
    /// With --proxy: the encoder's constant rate factor, 0 to 51 (lower: closer to the recorded
    /// frames and larger).
    #[arg(long, value_name = "Q", default_value_t = 18, requires = "proxy", value_parser = clap::value_parser!(u8).range(0..=51))]
    crf: u8,
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
    if let Some(codec) = args.proxy {
        let settings = lake_loader::proxy::Settings { codec, gop: args.gop, crf: args.crf };
        let made = tokio::select! {
            made = store_proxy(&lake, ds, args.threads, settings) => made?,
            code = crate::signals::stop_requested() => {
                errln!("cancelled; no proxy was stored (the lake is unchanged)");
                return Ok(ExitCode::from(code));
            }
        };
        outln!("{made}")?;
        return Ok(ExitCode::SUCCESS);
    }
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
    let ticker = progress_bar("storing frames", ds.packets.stream.len() as u64, stored.clone());
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

/// Re-encodes `ds` into its training proxy, with a progress bar on stderr when it is a
/// terminal; returns what `lake cache --proxy` prints: the proxy and each camera's PSNR.
///
/// # Errors
/// When a frame cannot be decoded or encoded, or the table cannot be written (nothing is
/// replaced then).
pub async fn store_proxy(
    lake: &Lake,
    ds: Arc<LoaderDataset>,
    threads: Option<usize>,
    settings: lake_loader::proxy::Settings,
) -> anyhow::Result<String> {
    let began = Instant::now();
    let threads = threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(2, usize::from));
    let done = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let total: u64 = ds.cameras.iter().map(|c| c.packet_rows.iter().flatten().collect::<std::collections::HashSet<_>>().len() as u64).sum();
    let ticker = progress_bar("re-encoding frames", total, done.clone());
    let report = lake_loader::write_proxy(lake, ds.clone(), threads, settings, &done).await;
    if let Some((bar, task)) = ticker {
        task.abort();
        bar.finish_and_clear();
    }
    let report = report?;
    let seconds = began.elapsed().as_secs_f64();
    let mut out = format!(
        "stored the {} of {}: {} frames in {seconds:.1} s ({:.0} frames/s); lossy, served only to requests for the proxy (--proxy)",
        report.info.label(),
        ds.label,
        report.frames,
        report.frames as f64 / seconds.max(1e-9)
    );
    for c in &report.info.cameras {
        out.push_str(&format!(
            "\n  {}: PSNR {} against the recorded frames; {} as {}",
            c.camera,
            lake_loader::ProxyInfo::psnr_words(c),
            crate::text::decimal_bytes(c.recorded_bytes),
            crate::text::decimal_bytes(c.bytes)
        ));
    }
    Ok(out)
}

/// A progress bar of `total` steps on stderr, following `done`, when stderr is a terminal.
fn progress_bar(
    what: &str,
    total: u64,
    done: Arc<std::sync::atomic::AtomicU64>,
) -> Option<(indicatif::ProgressBar, tokio::task::JoinHandle<()>)> {
    std::io::stderr().is_terminal().then(|| {
        let bar = indicatif::ProgressBar::with_draw_target(Some(total), indicatif::ProgressDrawTarget::stderr_with_hz(4));
        bar.set_style(
            indicatif::ProgressStyle::with_template(&format!("{{spinner}} {what} {{bar:20}} {{pos}}/{{len}} {{msg}}"))
                .expect("valid template"),
        );
        let shown = bar.clone();
        let task = tokio::spawn(async move {
            let began = Instant::now();
            loop {
                let now = done.load(std::sync::atomic::Ordering::Relaxed);
                let rate = now as f64 / began.elapsed().as_secs_f64().max(1e-3);
                let eta = if rate > 0.0 { format!(", ETA {:.0} s", total.saturating_sub(now) as f64 / rate) } else { String::new() };
                shown.set_position(now);
                shown.set_message(format!("({rate:.0} frames/s{eta})"));
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        });
        (bar, task)
    })
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
