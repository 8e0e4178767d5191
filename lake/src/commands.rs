//! The subcommands.

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
    /// The LeRobot dataset root (a directory with `meta/info.json`), path or file:// URL.
    source: String,
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
    /// Camera files demuxed in parallel [default: number of cores].
    #[arg(long)]
    threads: Option<usize>,
    /// Print the commit record and report as JSON instead of the summary.
    #[arg(long)]
    json: bool,
}

/// Arguments of `lake ls`.
#[derive(Debug, clap::Args)]
pub struct LsArgs {
    /// Print JSON (one commit record per dataset).
    #[arg(long)]
    json: bool,
}

/// Arguments of `lake inspect`.
#[derive(Debug, clap::Args)]
pub struct InspectArgs {
    /// Dataset name, optionally `NAME@VERSION`.
    dataset: String,
    /// Episodes to list (the rest are summarised).
    #[arg(long, default_value_t = 10)]
    episodes: usize,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

pub async fn ingest(root: &str, args: IngestArgs) -> anyhow::Result<ExitCode> {
    if !(args.tolerance_s > 0.0 && args.tolerance_s.is_finite()) {
        anyhow::bail!("--tolerance-s must be a positive number of seconds, got {}", args.tolerance_s);
    }
    let lake = Lake::create(root)?;
    let mut options = IngestOptions {
        name: args.name,
        tolerance_s: args.tolerance_s,
        skip_bad_episodes: args.skip_bad_episodes,
        drop_missing_cameras: args.drop_missing_cameras,
        ..Default::default()
    };
    if let Some(t) = args.threads {
        options.threads = t.max(1);
    }
    let progress = Arc::new(Progress::default());
    let cancel = progress.cancel.clone();
    let ctrl_c = tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            cancel.store(true, Ordering::Relaxed);
        }
    });
    let ticker = std::io::stderr().is_terminal().then(|| spawn_progress(progress.clone()));
    let started = Instant::now();
    let result = lake_ingest::ingest(&lake, &args.source, &options, &progress).await;
    ctrl_c.abort();
    if let Some((bar, task)) = ticker {
        task.abort();
        bar.finish_and_clear();
    }
    let mut out = std::io::stdout().lock();
    match result {
        Ok(Outcome::Committed { record, report }) => {
            if args.json {
                serde_json::to_writer_pretty(&mut out, &serde_json::json!({"outcome": "committed", "record": record, "report": report}))?;
                writeln!(out)?;
            } else {
                render::ingest_summary(&mut out, &record, &report, root)?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Ok(Outcome::Unchanged { record, reason }) => {
            if args.json {
                serde_json::to_writer_pretty(&mut out, &serde_json::json!({"outcome": "unchanged", "reason": reason, "record": record}))?;
                writeln!(out)?;
            } else {
                writeln!(
                    out,
                    "{}@{} is up to date: {reason} (checked in {:.2} s); nothing written",
                    record.name,
                    record.version,
                    started.elapsed().as_secs_f64()
                )?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(lake_ingest::Error::Refused(report)) => {
            if args.json {
                serde_json::to_writer_pretty(&mut out, &serde_json::json!({"outcome": "refused", "report": report}))?;
                writeln!(out)?;
            }
            eprintln!("error: {}", report.refusal());
            Ok(ExitCode::from(1))
        }
        Err(lake_ingest::Error::Cancelled) => {
            eprintln!("cancelled; the lake is unchanged");
            Ok(ExitCode::from(130))
        }
        Err(e) => Err(e).with_context(|| format!("ingest of {} failed; the lake is unchanged", args.source)),
    }
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
                t => format!(", {}/{t} frames", progress.frames_done.load(Ordering::Relaxed)),
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

pub async fn ls(root: &str, args: LsArgs) -> anyhow::Result<ExitCode> {
    let lake = Lake::open(root)?;
    let datasets = lake.datasets().await?;
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &datasets)?;
        writeln!(out)?;
    } else {
        render::dataset_list(&mut out, &datasets, root)?;
        let views = lake.views().await?;
        if !views.is_empty() {
            writeln!(out, "\nviews (lake view show NAME):")?;
            for v in views {
                let on: Vec<String> = v.datasets.iter().map(|d| format!("{}@{}", d.name, d.version)).collect();
                writeln!(out, "  {:<28} {:>6} episodes  from {}", v.name, v.episode_count(), on.join(", "))?;
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn inspect(root: &str, args: InspectArgs) -> anyhow::Result<ExitCode> {
    let lake = Lake::open(root)?;
    let record = lake.resolve(&args.dataset).await?;
    let versions = lake.versions(&record.name).await?.len();
    let tables = render::InspectTables::load(&lake, &record).await?;
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &tables.to_json(&record))?;
        writeln!(out)?;
    } else {
        render::inspect(&mut out, &record, versions, &tables, args.episodes)?;
    }
    Ok(ExitCode::SUCCESS)
}
