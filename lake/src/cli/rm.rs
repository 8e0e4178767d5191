//! `lake rm`: a dataset removed, every version.

use std::process::ExitCode;

use lake_store::Lake;

/// Arguments of `lake rm`.
#[derive(Debug, clap::Args)]
pub struct RmArgs {
    /// The dataset to remove, with every version.
    name: String,
    /// Remove it also when views select from it (loading them then fails, saying it was
    /// removed).
    #[arg(long)]
    force: bool,
}

/// `lake rm`: removes a dataset, every version of it, and frees its files.
pub async fn rm(root: &str, args: RmArgs) -> anyhow::Result<ExitCode> {
    let lake = Lake::open(root)?;
    let name = args.name.as_str();
    if let Some((dataset, version)) = name.split_once('@') {
        anyhow::bail!(
            "`{name}`: lake rm takes a dataset's name alone (`lake rm {dataset}`) and removes every version; a single version \
             ({version}) cannot be removed"
        );
    }
    lake_store::validate_name(name)?;
    if lake.view(name).await.ok().flatten().is_some() {
        anyhow::bail!("`{name}` is a view; drop it with `lake view drop {name}`");
    }
    // Views over versions still there (those over versions removed before fail already).
    let gone = lake.removal(name).await?.map_or(0, |r| r.through_version);
    let users_of = |views: Vec<lake_schemas::ViewRecord>, through: u64| -> Vec<String> {
        views
            .into_iter()
            .filter(|v| v.datasets.iter().any(|d| d.name == name && d.version > gone && d.version <= through))
            .map(|v| format!("{}@{}", v.name, v.version))
            .collect()
    };
    let users = users_of(lake.views().await?, u64::MAX);
    if !users.is_empty() && !args.force {
        anyhow::bail!("{}", lake_store::selected_message(name, &users));
    }
    let report = lake.remove(name, args.force).await?;
    let versions = match report.versions.as_slice() {
        [v] => format!("version {v}"),
        [first, .., last] => format!("versions {first} to {last}"),
        [] => "no files were left to delete".into(),
    };
    let freed = crate::text::decimal_bytes(report.bytes);
    // An ingest of the name is not stopped: it commits after the removed versions.
    let under_way = |report: &lake_store::RemovalReport| -> anyhow::Result<()> {
        for ingest in &report.under_way {
            outln!(
                "  an ingest of {name} (pid {} on {}, started {}) goes on and commits as {name}@{} or later",
                ingest.pid,
                ingest.host,
                ingest.started_at.format("%Y-%m-%d %H:%M:%S UTC"),
                report.removal.through_version + 1
            )?;
        }
        Ok(())
    };
    if report.finished_earlier {
        outln!(
            "finished removing dataset {name}, removed at {} ({versions}; {freed} freed)",
            report.removal.removed_at.format("%Y-%m-%d %H:%M:%S UTC")
        )?;
        under_way(&report)?;
        return Ok(ExitCode::SUCCESS);
    }
    outln!("removed dataset {name} ({versions}; {freed} freed)")?;
    under_way(&report)?;
    // Also the views made while it was removed.
    let users = users_of(lake.views().await?, report.removal.through_version);
    if !users.is_empty() {
        outln!("  views that select from it and now fail to load: {}", users.join(", "))?;
    }
    if !report.kept.is_empty() {
        let kept: Vec<String> = report.kept.iter().map(|v| format!("{name}@{v}")).collect();
        outln!("  an ingest committed {} meanwhile; it stays", kept.join(", "))?;
    }
    Ok(ExitCode::SUCCESS)
}
