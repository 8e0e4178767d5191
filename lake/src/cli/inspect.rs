//! `lake inspect`: one dataset version shown.

use std::{io::Write, process::ExitCode};

use lake_store::Lake;

use crate::render;

/// Arguments of `lake inspect`.
#[derive(Debug, clap::Args)]
pub struct InspectArgs {
    /// Dataset name, optionally `NAME@VERSION`.
    dataset: String,
    /// Episodes to list (the rest are summarised) [default: 10; with --json, every episode].
    #[arg(long)]
    episodes: Option<usize>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

pub async fn inspect(root: &str, args: InspectArgs) -> anyhow::Result<ExitCode> {
    let lake = Lake::open(root)?;
    let record = lake.resolve(&args.dataset).await?;
    // Version numbers run on across removals (`lake rm`): the newest number, not a count.
    let versions = lake.newest_version(&record.name).await?.map_or(record.version, |v| v.max(record.version));
    let damaged = lake.damaged_tables(&record).await?;
    // Tables that went with a `lake rm` that ran meanwhile: the removal says so.
    if !damaged.is_empty()
        && let Some(removal) = lake.removal(&record.name).await?.filter(|r| r.through_version >= record.version)
    {
        anyhow::bail!("{removal}, while this command read it");
    }
    for (table, why) in damaged {
        errln!(
            "warning: table {table} of {}@{} cannot be read whole ({why}); ingesting its source again makes a whole version",
            record.name,
            record.version
        );
    }
    let tables = render::InspectTables::load(&lake, &record).await?;
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &tables.to_json(&record, args.episodes))?;
        writeln!(out)?;
    } else {
        render::inspect(&mut out, &record, versions, &tables, args.episodes.unwrap_or(10))?;
    }
    Ok(ExitCode::SUCCESS)
}
