//! `lake stats`: a dataset's statistics in LeRobot's `meta/stats.json` layout.

use std::{io::Write, path::PathBuf, process::ExitCode};

use anyhow::Context;
use lake_store::Lake;

use crate::output::Output;

/// Arguments of `lake stats`.
#[derive(Debug, clap::Args)]
pub struct StatsArgs {
    /// Dataset name, optionally `NAME@VERSION`.
    dataset: String,
    /// Write LeRobot's `meta/stats.json` layout to this file (else print it).
    #[arg(long, short)]
    output: Option<PathBuf>,
    /// First compute per-channel camera statistics over LeRobot's frame subsample of each
    /// episode (decoding those frames) and store them beside the version (`image_stats`).
    #[arg(long)]
    images: bool,
}

/// `lake stats`: a dataset's statistics in LeRobot's `stats.json` layout: lake's exact ones for
/// numeric features, the source's stored ones for cameras.
pub async fn stats(root: &str, args: StatsArgs) -> anyhow::Result<ExitCode> {
    let lake = Lake::open(root)?;
    // A view over one dataset: the statistics of its episodes.
    let selection = match lake_loader::views::resolve(&lake, &args.dataset).await?.as_slice() {
        [one] => one.clone(),
        many => anyhow::bail!("view `{}` spans {} datasets; ask for the statistics of one dataset at a time", args.dataset, many.len()),
    };
    let record = lake.resolve(&selection.dataset).await?;
    let episodes: Option<std::collections::BTreeSet<i64>> = selection.episodes.as_ref().map(|e| e.iter().copied().collect());
    if args.images && episodes.is_some() {
        anyhow::bail!("--images computes the statistics of a whole dataset; give {}@{}", record.name, record.version);
    }
    if args.images {
        let spec = format!("{}@{}", record.name, record.version);
        let began = std::time::Instant::now();
        let report = lake_stats::write_image_stats(&lake, &spec).await?;
        if report.cameras == 0 {
            errln!("{spec} has no cameras: there are no image statistics to compute");
        } else {
            errln!(
                "image statistics of {spec}: {}, {} decoded, {:.1} s",
                crate::text::count(report.cameras as u64, "camera"),
                crate::text::count(report.frames as u64, "frame"),
                began.elapsed().as_secs_f64()
            );
            if report.episodes_without_video > 0 {
                errln!(
                    "{} left out: ingested without some camera's video (--missing-video keep-rows)",
                    crate::text::count(report.episodes_without_video as u64, "episode")
                );
            }
        }
    }
    let json = selection.features.stats(&lake_stats::stats_json(&lake, &record, episodes.as_ref()).await?);
    let text = lake_schemas::pyjson::to_string_pretty(&json);
    match &args.output {
        Some(path) => {
            let mut out = Output::create(path).with_context(|| format!("cannot write {}", path.display()))?;
            out.write_all((text + "\n").as_bytes()).and_then(|()| out.commit()).with_context(|| format!("writing {}", path.display()))?;
            errln!("wrote the stats of {} to {}", args.dataset, path.display());
        }
        None => outln!("{text}")?,
    }
    Ok(ExitCode::SUCCESS)
}
