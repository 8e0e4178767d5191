//! `lake ls`: the datasets of the lake.

use std::{io::Write, process::ExitCode};

use lake_store::Lake;

use crate::render;

/// Arguments of `lake ls`.
#[derive(Debug, clap::Args)]
pub struct LsArgs {
    /// Print JSON (one commit record per dataset).
    #[arg(long)]
    json: bool,
}

pub async fn ls(root: &str, args: LsArgs) -> anyhow::Result<ExitCode> {
    let lake = Lake::open(root)?;
    let (datasets, unreadable) = lake.datasets_listed().await?;
    let (views, unreadable_views) = lake.views_listed().await?;
    // What is damaged (outside lake) is named, beside the list: as text, and as objects for
    // JSON readers (`kind`, `name`, `version`, what cannot be read and why, the same `message`).
    let mut problems: Vec<(serde_json::Value, String)> = Vec::new();
    for d in &datasets {
        let damaged = lake.damaged_tables(d).await?;
        if !damaged.is_empty() {
            let tables: Vec<String> = damaged.iter().map(|(table, why)| format!("{table} ({why})")).collect();
            let message = format!(
                "dataset {}@{} cannot be read whole: {}; ingesting its source again makes a whole version",
                d.name,
                d.version,
                tables.join(", ")
            );
            let tables: Vec<serde_json::Value> =
                damaged.iter().map(|(table, why)| serde_json::json!({"table": table, "why": why})).collect();
            let entry = serde_json::json!({"kind": "dataset", "name": d.name, "version": d.version, "tables": tables, "message": message});
            problems.push((entry, message));
        }
    }
    for u in &unreadable {
        let message = format!(
            "dataset {}@{} is left out: its catalog record {} cannot be read ({}); ingesting its source again makes the next \
             version",
            u.name, u.version, u.path, u.why
        );
        let entry = serde_json::json!({"kind": "dataset", "name": u.name, "version": u.version, "record": u.path, "why": u.why, "message": message});
        problems.push((entry, message));
    }
    for u in &unreadable_views {
        let message = format!("view {}@{} is left out: its record {} cannot be read ({})", u.name, u.version, u.path, u.why);
        let entry =
            serde_json::json!({"kind": "view", "name": u.name, "version": u.version, "record": u.path, "why": u.why, "message": message});
        problems.push((entry, message));
    }
    let mut out = std::io::stdout().lock();
    if args.json {
        // As the text: the datasets' records, the views' and what cannot be read whole.
        let entries: Vec<&serde_json::Value> = problems.iter().map(|(entry, _)| entry).collect();
        let removed: Vec<lake_store::Removal> = lake.removed_datasets().await?.into_values().collect();
        let removed_from = lake_loader::views::removals_of_all(&lake, &views).await;
        let listed_views: Vec<serde_json::Value> =
            views.iter().zip(removed_from).map(|(v, removed)| lake_loader::views::view_json(v, removed)).collect();
        let listing = serde_json::json!({"datasets": datasets, "views": listed_views, "unreadable": entries, "removed": removed});
        serde_json::to_writer_pretty(&mut out, &listing)?;
        writeln!(out)?;
        for (_, message) in &problems {
            errln!("warning: {message}");
        }
    } else {
        render::dataset_list(&mut out, &datasets, root)?;
        if !views.is_empty() {
            writeln!(out, "\nviews (lake view show NAME):")?;
            for v in views {
                let on = lake_loader::views::sources(&lake, &v).await;
                let episodes = crate::text::count(v.episode_count() as u64, "episode");
                writeln!(out, "  {:<28} {episodes:>14}  from {}", format!("{}@{}", v.name, v.version), on.join(", "))?;
            }
        }
        if !problems.is_empty() {
            writeln!(out, "\ndamaged outside lake:")?;
            for (_, message) in &problems {
                writeln!(out, "  {message}")?;
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
