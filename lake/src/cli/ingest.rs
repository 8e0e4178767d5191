//! `lake ingest`: a LeRobot dataset validated and added to the lake as a new version.

use std::{
    io::{IsTerminal, Write},
    process::ExitCode,
    sync::{Arc, atomic::Ordering},
    time::{Duration, Instant},
};

use anyhow::Context;
use lake_ingest::{IngestOptions, Outcome, Progress};
use lake_store::Lake;

use crate::render;

/// Arguments of `lake ingest`.
#[derive(Debug, clap::Args)]
pub struct IngestArgs {
    /// The LeRobot dataset root (a directory with `meta/info.json`): a path or file:// URL, an
    /// object store prefix (s3://BUCKET/PREFIX/DATASET, gs://…, az://…), or the URL a web server
    /// serves it at (http(s)://…; hf://datasets/OWNER/NAME, or NAME@REVISION, on the Hugging Face
    /// Hub).
    source: std::path::PathBuf,
    /// Dataset name in the lake [default: the source directory's name].
    #[arg(long)]
    name: Option<String>,
    /// Largest distance, in seconds, between a step's time and its video frame's time
    /// (LeRobot's `tolerance_s`).
    #[arg(long, default_value_t = lake_schemas::DEFAULT_TOLERANCE_S)]
    tolerance_s: f64,
    /// Ingest the sound episodes and record every bad one with its reason, instead of refusing
    /// the dataset.
    #[arg(long)]
    skip_bad_episodes: bool,
    /// Leave out cameras that have no video file at all (e.g. videos not downloaded), keeping
    /// the tabular data of every episode.
    #[arg(long)]
    drop_missing_cameras: bool,
    /// What an episode whose video file of a camera is missing gets: `refuse` counts the file as
    /// the episode's error (with --skip-bad-episodes the episode is left out); `keep-rows` keeps
    /// its rows for SQL, statistics and state-only training, and a sample that shows a frame of
    /// that camera in it is refused, naming dataset, camera, episode and frame.
    #[arg(long, value_enum, default_value_t = MissingVideo::Refuse)]
    missing_video: MissingVideo,
    /// Decode every video frame once and report those that do not decode whole (a damaged
    /// file), by episode and frame, as errors of their episodes; `--frame-cache` does this too.
    /// Ingest then takes about as long as decoding the dataset. An unchanged source is up to date
    /// only if the latest version's tables pass `lake verify`; if not, it is ingested again.
    #[arg(long)]
    verify: bool,
    /// Camera files demuxed in parallel, 1 to 256 [default: number of cores].
    #[arg(long, value_parser = crate::args::threads_in_range)]
    threads: Option<usize>,
    /// Then store the version's decoded frames for the loader, as `lake cache` does: `native`
    /// at their recorded size, `WxH` resized (read with `--frame-size WxH`); repeat for
    /// several. A table already there with the same storage is kept.
    #[arg(long, value_name = "native|WxH")]
    frame_cache: Vec<FrameCacheSize>,
    /// How `--frame-cache` stores frames (see `lake cache --storage`).
    #[arg(long, value_enum, default_value_t = crate::cli::cache::Storage::Plain, requires = "frame_cache")]
    frame_storage: crate::cli::cache::Storage,
    /// Print the commit record and report as JSON instead of the summary.
    #[arg(long)]
    json: bool,
}

/// `--missing-video`: what an episode whose video file is missing gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum MissingVideo {
    /// The missing file is the episode's error.
    Refuse,
    /// The episode's rows are kept, without that camera's frames.
    KeepRows,
}

/// A `--frame-cache` value: `native` (the recorded size) or `WxH`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameCacheSize(Option<lake_loader::FrameSize>);

impl std::str::FromStr for FrameCacheSize {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s.eq_ignore_ascii_case("native") {
            return Ok(Self(None));
        }
        s.parse().map(|size| Self(Some(size))).map_err(|e| format!("{e}, or `native`"))
    }
}

/// The local snapshot of the Hugging Face dataset `OWNER/NAME` and the name to ingest it as,
/// when `source` is such a repo id and no directory of that path exists: the snapshot the
/// cache's `refs/main` names (else its newest) under `$HF_HUB_CACHE`, `$HF_HOME/hub` or
/// `~/.cache/huggingface/hub`.
///
/// # Errors
/// When it looks like a repo id that the cache does not hold: how to download it first.
fn hugging_face_snapshot(source: &str) -> anyhow::Result<Option<(String, String)>> {
    let parts: Vec<&str> = source.split('/').collect();
    let [owner, name] = parts.as_slice() else { return Ok(None) };
    let plain = |p: &str| !p.is_empty() && p != "." && p != ".." && p.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    if std::path::Path::new(source).exists() || source.contains("://") || !plain(owner) || !plain(name) {
        return Ok(None);
    }
    let env = |v: &str| std::env::var_os(v).filter(|v| !v.is_empty()).map(std::path::PathBuf::from);
    let hub = env("HF_HUB_CACHE")
        .or_else(|| env("HF_HOME").map(|h| h.join("hub")))
        .or_else(|| env("HOME").map(|h| h.join(".cache/huggingface/hub")));
    let repo = hub.as_ref().map(|hub| hub.join(format!("datasets--{owner}--{name}")));
    let snapshots = repo.as_ref().map(|r| r.join("snapshots"));
    let main = repo.as_ref().and_then(|r| std::fs::read_to_string(r.join("refs/main")).ok()).map(|s| s.trim().to_string());
    let mut found: Vec<(std::time::SystemTime, std::path::PathBuf)> = snapshots
        .iter()
        .flat_map(|s| std::fs::read_dir(s).into_iter().flatten().flatten())
        .filter(|e| e.path().join("meta/info.json").is_file())
        .map(|e| (e.metadata().and_then(|m| m.modified()).unwrap_or(std::time::UNIX_EPOCH), e.path()))
        .collect();
    found.sort();
    let chosen = found.iter().find(|(_, p)| main.as_deref().is_some_and(|m| p.file_name().is_some_and(|f| f == m))).or(found.last());
    match chosen {
        Some((_, path)) => {
            let path = path.to_str().ok_or_else(|| anyhow::anyhow!("the cached snapshot's path {} is not UTF-8", path.display()))?;
            Ok(Some((path.to_string(), name.to_string())))
        }
        None => anyhow::bail!(
            "`{source}` is not a directory here, and no snapshot of the Hugging Face dataset `{source}` is in the local hub cache \
             ({}); download it first (`huggingface-cli download --repo-type dataset {source}`), then run this again, or give \
             the dataset's directory",
            snapshots.map_or_else(|| "no HOME to find it".into(), |s| s.display().to_string())
        ),
    }
}

pub async fn ingest(root: &str, args: IngestArgs) -> anyhow::Result<ExitCode> {
    if !(args.tolerance_s > 0.0 && args.tolerance_s.is_finite()) {
        anyhow::bail!("--tolerance-s must be a positive number of seconds, got {}", args.tolerance_s);
    }
    let Some(source) = args.source.to_str().map(str::to_string) else {
        anyhow::bail!(
            "the source's path {} is not UTF-8 text; lake reads and records sources by text paths: rename the directory",
            args.source.to_string_lossy()
        );
    };
    // `OWNER/NAME` that is no directory here: a Hugging Face dataset, from the local hub cache.
    let (source, repo_name) = match hugging_face_snapshot(&source)? {
        Some((snapshot, name)) => (snapshot, Some(name)),
        None => (source, None),
    };
    let lake = NewLake::create(root)?;
    let mut options = IngestOptions {
        name: args.name.or(repo_name),
        tolerance_s: args.tolerance_s,
        skip_bad_episodes: args.skip_bad_episodes,
        drop_missing_cameras: args.drop_missing_cameras,
        keep_rows_without_video: args.missing_video == MissingVideo::KeepRows,
        // Frame tables decode every frame anyway: a frame that does not decode whole is
        // found before the version is committed.
        verify: args.verify || !args.frame_cache.is_empty(),
        ..Default::default()
    };
    if let Some(t) = args.threads {
        options.threads = t.max(1);
    }
    let name = options.name.clone().unwrap_or_else(|| lake_store::default_name(&source));
    let previous = lake.latest(&name).await;
    let progress = Arc::new(Progress::default());
    let cancel = progress.cancel.clone();
    // Ctrl-C cancels the ingest, and then the frame tables stored after it (`interrupted`).
    let interrupted = Arc::new(tokio::sync::Notify::new());
    let stop_code = Arc::new(std::sync::atomic::AtomicU8::new(130));
    let ctrl_c = tokio::spawn({
        let (interrupted, stop_code) = (interrupted.clone(), stop_code.clone());
        async move {
            stop_code.store(crate::signals::stop_requested().await, Ordering::Relaxed);
            cancel.store(true, Ordering::Relaxed);
            interrupted.notify_one();
        }
    });
    let ticker = std::io::stderr().is_terminal().then(|| spawn_progress(progress.clone()));
    let started = Instant::now();
    let result = lake_ingest::ingest(&lake, &source, &options, &progress).await;
    if let Some((bar, task)) = ticker {
        task.abort();
        bar.finish_and_clear();
    }
    if result.is_err() {
        lake.forget_if_new();
    }
    let (record, mut json) = match result {
        Ok(Outcome::Committed { record, report }) => {
            if !args.json {
                render::ingest_summary(&mut std::io::stdout().lock(), &record, &report, root)?;
                if let Some(directory) = renamed_directory(&source, options.name.is_none()) {
                    outln!(
                        "  note: named `{}` after its directory `{directory}` (a name holds ASCII letters and digits, `.`, `_` and \
                         `-`; --name sets one)",
                        record.name
                    )?;
                }
                if let Err(e @ lake_store::Error::Record { .. }) = &previous {
                    outln!("  note: the version before cannot be read ({e}); this one replaces it")?;
                }
                if let Ok(Some(previous)) = &previous {
                    let damaged = lake.damaged_tables(previous).await.unwrap_or_default();
                    if !damaged.is_empty() {
                        let tables: Vec<String> = damaged.iter().map(|(table, why)| format!("{table} ({why})")).collect();
                        outln!(
                            "  note: replaces {}@{}, whose tables cannot be read whole: {}",
                            previous.name,
                            previous.version,
                            tables.join(", ")
                        )?;
                    } else if options.verify
                        && let Ok(checked) = lake.verify_tables(previous, options.threads).await
                        && checked.is_damaged()
                    {
                        let mut files: Vec<String> = checked.damage.iter().map(|d| format!("{} ({})", d.path, d.why)).collect();
                        files.extend(checked.record.iter().map(|why| format!("its commit record ({why})")));
                        outln!("  note: replaces {}@{}, which is damaged: {}", previous.name, previous.version, files.join(", "))?;
                    }
                    if previous.source.url != record.source.url {
                        if previous.source.content_hash == record.source.content_hash && previous.options != record.options {
                            // The same content under another path, made a new version by other options.
                            outln!(
                                "  note: {}@{} came from {}, which holds the same content; this version differs in its ingest options",
                                previous.name,
                                previous.version,
                                previous.source.url
                            )?;
                        } else {
                            outln!(
                                "  note: {}@{} came from another source, {}; name this one with --name to keep them apart",
                                previous.name,
                                previous.version,
                                previous.source.url
                            )?;
                        }
                    }
                }
            }
            let json = serde_json::json!({"outcome": "committed", "record": record, "report": report});
            (record, json)
        }
        Ok(Outcome::Unchanged { record, reason }) => {
            if !args.json {
                outln!(
                    "{}@{} is up to date: {reason} (checked in {:.2} s); nothing written",
                    record.name,
                    record.version,
                    started.elapsed().as_secs_f64()
                )?;
                if record.source.url != lake_store::absolute_location(&source) {
                    outln!(
                        "  note: {}@{} was ingested from {}, which holds the same content; the catalog keeps that source",
                        record.name,
                        record.version,
                        record.source.url
                    )?;
                }
            }
            let json = serde_json::json!({"outcome": "unchanged", "reason": reason, "record": record});
            (record, json)
        }
        Err(lake_ingest::Error::Refused(report)) => {
            if args.json {
                let mut out = std::io::stdout().lock();
                serde_json::to_writer_pretty(&mut out, &serde_json::json!({"outcome": "refused", "report": report}))?;
                writeln!(out)?;
            }
            errln!("error: {}", report.refusal());
            return Ok(ExitCode::from(1));
        }
        Err(lake_ingest::Error::Cancelled) => {
            errln!("cancelled; the lake is unchanged");
            return Ok(ExitCode::from(stop_code.load(Ordering::Relaxed)));
        }
        Err(e) => {
            if args.json {
                let mut out = std::io::stdout().lock();
                serde_json::to_writer_pretty(&mut out, &serde_json::json!({"outcome": "failed", "error": format!("{e}")}))?;
                writeln!(out)?;
            }
            return Err(e).with_context(|| format!("ingest of {} failed; the lake is unchanged", source));
        }
    };
    // Ctrl-C drops the frame table being stored (it is removed; the dataset stays committed).
    let cached = tokio::select! {
        biased;
        cached = frame_caches(&lake, &record, &args.frame_cache, args.frame_storage.into(), args.threads, args.json) => cached,
        () = interrupted.notified() => {
            errln!(
                "cancelled; {}@{} is in the lake, its frames are not stored (`lake cache {}@{}` stores them)",
                record.name, record.version, record.name, record.version
            );
            return Ok(ExitCode::from(stop_code.load(Ordering::Relaxed)));
        }
    };
    ctrl_c.abort();
    if args.json {
        cached.add_to(&mut json);
        let mut out = std::io::stdout().lock();
        serde_json::to_writer_pretty(&mut out, &json)?;
        writeln!(out)?;
    }
    cached.exit_code(&record)
}

/// The lake an ingest writes into, and whether this ingest made it: a failed first ingest
/// takes back the lake directory (or, in a directory that was empty, the files) it created.
/// The source directory's name, when the dataset was named after it (`derived`) and the name
/// had to differ from it.
fn renamed_directory(source: &str, derived: bool) -> Option<String> {
    let location = lake_store::absolute_location(source);
    let directory = location.trim_end_matches('/').rsplit('/').next()?;
    let directory = lake_store::local_path(&format!("file:///{directory}"))
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| directory.to_string());
    (derived && lake_store::validate_name(&directory).is_err()).then_some(directory)
}

struct NewLake {
    lake: Lake,
    /// Whether the directory existed before, when this ingest made the lake.
    made: Option<bool>,
}

impl NewLake {
    fn create(root: &str) -> anyhow::Result<Self> {
        // A lake on an object store is one marker object when empty: it stays.
        let made = match lake_store::local_path(root).filter(|_| !lake_store::remote::is_remote(root)) {
            Some(path) => {
                let path = std::path::absolute(path)?;
                (!path.join("lake.json").exists()).then(|| path.exists())
            }
            None => None,
        };
        Ok(Self { lake: Lake::create(root)?, made })
    }

    fn forget_if_new(&self) {
        if let Some(existed) = self.made {
            self.lake.take_back(existed);
        } else if let Some(existed) = self.lake.left_to_take_back() {
            // A failed ingest beside this one created the lake and left it to this one.
            self.lake.take_back(existed);
        }
    }
}

impl std::ops::Deref for NewLake {
    type Target = Lake;

    fn deref(&self) -> &Lake {
        &self.lake
    }
}

/// What `lake ingest --frame-cache` did after the ingest: the tables written or kept, and the
/// error that stopped it.
#[derive(Debug, Default)]
struct FrameCaches {
    tables: Vec<serde_json::Value>,
    /// Why storing stopped, and the `lake cache` commands that store what is still missing.
    error: Option<(String, Vec<String>)>,
}

impl FrameCaches {
    fn add_to(&self, json: &mut serde_json::Value) {
        if !self.tables.is_empty() || self.error.is_some() {
            json["frame_tables"] = serde_json::Value::Array(self.tables.clone());
        }
        if let Some((e, commands)) = &self.error {
            json["frame_cache_error"] = serde_json::json!({"message": e, "commands": commands});
        }
    }

    /// Success, or (the version stays ingested) the error and the commands that finish the job.
    fn exit_code(&self, record: &lake_schemas::CommitRecord) -> anyhow::Result<ExitCode> {
        let Some((e, commands)) = &self.error else { return Ok(ExitCode::SUCCESS) };
        let commands: Vec<String> = commands.iter().map(|c| format!("`{c}`")).collect();
        anyhow::bail!(
            "{}@{} is in the lake, but storing its frames failed: {e}; run {} to store them",
            record.name,
            record.version,
            commands.join(" and ")
        )
    }

    /// Storing stopped at `sizes[0]` because of `e`: the commands for it and the rest.
    fn fail(&mut self, e: String, spec: &str, sizes: &[Option<lake_loader::FrameSize>], storage: lake_loader::FrameStorage) {
        let storage = if storage == lake_loader::FrameStorage::Plain { String::new() } else { format!(" --storage {}", storage.name()) };
        let commands = sizes
            .iter()
            .map(|size| format!("lake cache {spec}{}{storage}", size.map(|s| format!(" --size {s}")).unwrap_or_default()))
            .collect();
        self.error = Some((e, commands));
    }
}

/// Stores the frame tables `sizes` asks for of the version `record` (those already there with
/// the same storage are kept), printing a line per table unless `json`.
async fn frame_caches(
    lake: &Lake,
    record: &lake_schemas::CommitRecord,
    sizes: &[FrameCacheSize],
    storage: lake_loader::FrameStorage,
    threads: Option<usize>,
    json: bool,
) -> FrameCaches {
    let mut done = FrameCaches::default();
    let mut seen = std::collections::BTreeSet::new();
    let sizes: Vec<Option<lake_loader::FrameSize>> =
        sizes.iter().map(|s| s.0).filter(|s| seen.insert(s.map(|s| (s.width, s.height)))).collect();
    if sizes.is_empty() {
        return done;
    }
    let spec = format!("{}@{}", record.name, record.version);
    let ds = match lake_loader::LoaderDataset::open(lake, &spec).await {
        Ok(ds) => ds,
        Err(e) => {
            done.fail(e.to_string(), &spec, &sizes, storage);
            return done;
        }
    };
    let existing = lake_loader::frame_tables(lake, record).await;
    for (i, &size) in sizes.iter().enumerate() {
        let at = size.map(|s| format!(" at {s}")).unwrap_or_default();
        let kept = existing.iter().find(|t| {
            t.size == size
                && t.storage == Some(storage.name())
                && t.frames == Some(ds.packets.stream.len())
                && t.checksums == Some(true)
                && t.damage.is_none()
        });
        if let Some(t) = kept {
            if !json {
                // The dataset is committed; a line stdout cannot take does not undo it.
                let _ = outln!("{spec}: frames{at} already stored ({}, {:.1} MB); kept", storage.name(), t.bytes as f64 / 1e6);
            }
            done.tables.push(
                serde_json::json!({"dataset": spec, "size": size, "storage": storage.name(), "frames": t.frames, "stored_bytes": t.bytes, "written": false}),
            );
            continue;
        }
        match crate::cli::cache::store_frames(lake, ds.clone(), threads, storage, size).await {
            Ok(stored) => {
                if !json {
                    let _ = outln!("{}", stored.summary());
                }
                let mut entry = serde_json::to_value(&stored).expect("serializable");
                entry["written"] = serde_json::Value::Bool(stored.frames > 0);
                done.tables.push(entry);
            }
            Err(e) => {
                done.fail(format!("{e:#}"), &spec, &sizes[i..], storage);
                break;
            }
        }
    }
    done
}

fn spawn_progress(progress: Arc<Progress>) -> (indicatif::ProgressBar, tokio::task::JoinHandle<()>) {
    let bar = indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::stderr_with_hz(10));
    bar.set_style(indicatif::ProgressStyle::with_template("{spinner} {msg}").expect("valid template"));
    let shown = bar.clone();
    let task = tokio::spawn(async move {
        let started = Instant::now();
        let mut phase_start = (String::new(), Instant::now(), 0u64);
        loop {
            let phase = progress.phase();
            let read = progress.bytes_read();
            if phase != phase_start.0 {
                phase_start = (phase.clone(), Instant::now(), read);
            }
            let total = progress.bytes_total.load(Ordering::Relaxed);
            let done = read.saturating_sub(phase_start.2);
            let secs = phase_start.1.elapsed().as_secs_f64().max(1e-3);
            let rate = done as f64 / secs;
            let eta = if total > done && rate > 0.0 { format!(", ETA {:.0} s", (total - done) as f64 / rate) } else { String::new() };
            let pct = if total > 0 { format!(" {:>3.0}%", 100.0 * done.min(total) as f64 / total as f64) } else { String::new() };
            let frames_total = progress.frames_total.load(Ordering::Relaxed);
            let frames = match frames_total {
                0 => String::new(),
                t => {
                    // Frames are demuxed in one phase: their rate is that phase's.
                    let done = progress.frames_done.load(Ordering::Relaxed);
                    let rate = if done < t && secs >= 1.0 { format!(" at {:.0}/s", done as f64 / secs) } else { String::new() };
                    format!(", {done}/{t} frames{rate}")
                }
            };
            shown.set_message(format!(
                "{phase}{pct}: {} episodes{frames}, {} read at {}/s{eta} ({:.0} s)",
                progress.episodes_total.load(Ordering::Relaxed),
                render::bytes(done),
                render::bytes(rate as u64),
                started.elapsed().as_secs_f64(),
            ));
            shown.tick();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    (bar, task)
}
