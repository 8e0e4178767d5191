//! `lake verify`: every file of a dataset version, and every view's record, read and checked
//! against what was recorded when it was written.

use std::{process::ExitCode, time::Instant};

use arrow::array::{Array, AsArray};
use arrow::datatypes::Int64Type;
use lake_schemas::{CommitRecord, ViewRecord};
use lake_store::Lake;

use crate::text::{count, decimal_bytes};

/// Damaged frames named one by one; the rest are counted.
const FRAMES_NAMED: usize = 10;

/// Arguments of `lake verify`.
#[derive(Debug, clap::Args)]
pub struct VerifyArgs {
    /// Datasets and views to check: `NAME` (its latest version) or `NAME@VERSION`; a view's
    /// record is checked, and the dataset versions it reads [default: the latest version of
    /// every dataset, every view, and the dataset versions the views read].
    names: Vec<String>,
    /// Check every version of those datasets and views, not only the latest.
    #[arg(long)]
    every_version: bool,
    /// Files read at once, 1 to 256 [default: number of cores].
    #[arg(long, value_parser = crate::args::threads_in_range)]
    threads: Option<usize>,
    /// Print JSON: one object per dataset version and per view version checked.
    #[arg(long)]
    json: bool,
}

/// What was found in one dataset version.
#[derive(Debug, Default, serde::Serialize)]
struct Checked {
    name: String,
    version: u64,
    /// Files of the ingest's tables read, and their bytes.
    files: u64,
    bytes: u64,
    /// Only the data files' sizes could be checked (no digests recorded).
    sizes_only: bool,
    /// Frames of frame tables read, and their bytes.
    frames: u64,
    frame_bytes: u64,
    /// Packets of the training proxy read, and their bytes.
    proxy_packets: u64,
    proxy_bytes: u64,
    /// Rows of `image_stats` checked against their digest.
    image_stats_rows: u64,
    /// What is damaged, one line each.
    damage: Vec<String>,
    /// The commands that mend it.
    mend: Vec<String>,
    /// Frame tables without checksums: read, not checked.
    unchecked_frame_tables: Vec<String>,
    /// Tables beside the version written before lake kept their rows' digest: read, not checked.
    unchecked_tables: Vec<(String, String)>,
    /// The ingest's tables or commit record are damaged: only a new version mends them (frame
    /// tables and proxies are made again in place).
    #[serde(skip)]
    tables_damaged: bool,
}

/// What was found in one view version.
#[derive(Debug, Default, serde::Serialize)]
struct ViewChecked {
    name: String,
    version: u64,
    /// The dataset versions it reads, as `NAME@VERSION`.
    reads: Vec<String>,
    /// The record is a drop (`lake view drop`): the view has no current version after it.
    dropped: bool,
    /// Its record was written before view records had digests: not checked.
    unchecked_record: bool,
    /// What is damaged, one line each.
    damage: Vec<String>,
    /// What its user should know that is not damage (a dataset version `lake rm` removed).
    notes: Vec<String>,
    /// The commands that mend it.
    mend: Vec<String>,
}

pub async fn verify(root: &str, args: VerifyArgs) -> anyhow::Result<ExitCode> {
    let lake = Lake::open(root)?;
    let threads = args.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()));
    let started = Instant::now();
    let (mut records, mut views, mut unreadable) = (Vec::new(), Vec::new(), Vec::new());
    if args.names.is_empty() {
        let (latest, bad) = lake.datasets_listed().await?;
        unreadable.extend(bad.into_iter().map(|u| {
            format!(
                "{}@{}: its catalog record {} cannot be read ({}); ingesting its source again makes the next version",
                u.name, u.version, u.path, u.why
            )
        }));
        for record in latest {
            records.extend(if args.every_version { lake.versions(&record.name).await? } else { vec![record] });
        }
        let unreadable_view = |label: &str, name: &str, path: &str, why: &str| {
            format!(
                "view {label}: its record {path} cannot be read ({why}); `lake view create {name} --replace QUERY` makes its next version"
            )
        };
        if args.every_version {
            // Every record, of dropped views and the drops too: a changed one may have been a drop.
            for name in lake.view_names().await? {
                match lake.view_records(&name).await {
                    Ok(records) => views.extend(records),
                    Err(lake_store::Error::Record { path, source }) => {
                        unreadable.push(unreadable_view(&name, &name, &path, &source.to_string()))
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        } else {
            let (current, bad) = lake.views_listed().await?;
            unreadable.extend(bad.into_iter().map(|u| unreadable_view(&format!("{}@{}", u.name, u.version), &u.name, &u.path, &u.why)));
            views.extend(current);
        }
    } else {
        for spec in &args.names {
            let (name, version) = spec.rsplit_once('@').map_or((spec.as_str(), None), |(n, v)| (n, Some(v)));
            if let Some(view) = lake_loader::views::view(&lake, name, version).await? {
                views.extend(if args.every_version && version.is_none() { lake.view_records(name).await? } else { vec![view] });
                continue;
            }
            // A dropped view: its drop, or with --every-version every record.
            let mut dropped = match version.is_none() && lake_store::validate_name(name).is_ok() {
                true => lake.view_records(name).await?,
                false => Vec::new(),
            };
            if !dropped.is_empty() {
                views.extend(if args.every_version { dropped } else { dropped.split_off(dropped.len() - 1) });
                continue;
            }
            let record = lake.resolve(spec).await?;
            records.extend(if args.every_version && version.is_none() { lake.versions(&record.name).await? } else { vec![record] });
        }
    }
    let mut checked_views = Vec::with_capacity(views.len());
    for view in &views {
        checked_views.push(check_view(&lake, view, &mut records).await?);
    }
    // Each version is reported as soon as it is checked: a large lake takes a while.
    let mut checked = Vec::with_capacity(records.len());
    for record in &records {
        let c = check_version(&lake, record, threads).await?;
        if !args.json {
            report(&c)?;
        }
        checked.push(c);
    }
    // A view is as sound as the dataset versions it reads; one whose tables are damaged is
    // mended by a new version, which the view selects only when made again.
    for (view, c) in views.iter().zip(&mut checked_views) {
        let mut after_ingest = false;
        for d in &view.datasets {
            if checked.iter().any(|v| v.name == d.name && v.version == d.version && v.tables_damaged) {
                c.damage.push(format!("it reads {}@{}, whose tables are damaged (above)", d.name, d.version));
                after_ingest = true;
            }
        }
        if !c.damage.is_empty() {
            c.mend = mend_view(&lake, view, after_ingest).await?;
        }
    }
    let damaged = checked.iter().filter(|c| !c.damage.is_empty()).count()
        + checked_views.iter().filter(|c| !c.damage.is_empty()).count()
        + unreadable.len();
    if args.json {
        let json = serde_json::json!({
            "versions": checked,
            "views": checked_views,
            "unreadable_records": unreadable,
            "seconds": started.elapsed().as_secs_f64(),
        });
        outln!("{}", serde_json::to_string_pretty(&json)?)?;
    } else {
        for c in &checked_views {
            report_view(c)?;
        }
        for u in &unreadable {
            outln!("{u}")?;
        }
        let read: u64 = checked.iter().map(|c| c.bytes + c.frame_bytes + c.proxy_bytes).sum();
        let views = match checked_views.len() {
            0 => String::new(),
            n => format!(" and {}", count(n as u64, "view")),
        };
        outln!(
            "{}{views} checked, {damaged} damaged: {} read in {:.2} s",
            count(checked.len() as u64, "version"),
            decimal_bytes(read),
            started.elapsed().as_secs_f64()
        )?;
    }
    Ok(if damaged == 0 { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// Prints what was found in one dataset version.
fn report(c: &Checked) -> std::io::Result<()> {
    let state = if c.damage.is_empty() { "intact" } else { "DAMAGED" };
    let tables = match c.sizes_only {
        true => "tables: data file sizes only (committed before lake recorded digests)".to_string(),
        false => format!("tables: {}, {}", count(c.files, "file"), decimal_bytes(c.bytes)),
    };
    let frames = match c.frames {
        0 => String::new(),
        n => format!("; frame tables: {}, {}", count(n, "frame"), decimal_bytes(c.frame_bytes)),
    };
    let proxy = match c.proxy_packets {
        0 => String::new(),
        n => format!("; proxy: {}, {}", count(n, "packet"), decimal_bytes(c.proxy_bytes)),
    };
    let image_stats = match c.image_stats_rows {
        0 => String::new(),
        n => format!("; image_stats: {}", count(n, "row")),
    };
    outln!("{}@{}: {state} ({tables}{frames}{proxy}{image_stats})", c.name, c.version)?;
    for line in &c.damage {
        outln!("  {line}")?;
    }
    for table in &c.unchecked_frame_tables {
        outln!("  note: frame table {table} has no checksums: its frames were read, not checked (`lake cache` again adds them)")?;
    }
    for (table, again) in &c.unchecked_tables {
        outln!("  note: {table} has no digest of its rows: they were read, not checked (`{again}` adds it)")?;
    }
    for command in &c.mend {
        outln!("  to mend: {command}")?;
    }
    Ok(())
}

/// Prints what was found in one view version.
fn report_view(c: &ViewChecked) -> std::io::Result<()> {
    let state = if c.damage.is_empty() { "intact" } else { "DAMAGED" };
    let record = if c.unchecked_record { "; its record predates digests and was not checked" } else { "" };
    let reads = match c.dropped {
        true => "a drop: `lake view drop`".to_string(),
        false if c.reads.is_empty() => "reads nothing".to_string(),
        false => format!("reads {}", c.reads.join(", ")),
    };
    outln!("view {}@{}: {state} ({reads}{record})", c.name, c.version)?;
    for line in c.damage.iter().chain(&c.notes) {
        outln!("  {line}")?;
    }
    for command in &c.mend {
        outln!("  to mend: {command}")?;
    }
    Ok(())
}

/// Checks a view version's record, and adds the dataset versions it reads to `records` (each
/// once) so that they are checked too.
async fn check_view(lake: &Lake, view: &ViewRecord, records: &mut Vec<CommitRecord>) -> anyhow::Result<ViewChecked> {
    let mut c = ViewChecked {
        name: view.name.clone(),
        version: view.version,
        reads: view.datasets.iter().map(|d| format!("{}@{}", d.name, d.version)).collect(),
        dropped: view.dropped,
        unchecked_record: view.digest.is_none(),
        ..ViewChecked::default()
    };
    if let Some((path, why)) = lake.view_record_damage(view).await? {
        c.damage.push(format!("{path}: {why}"));
    }
    let removed = lake_loader::views::removals(lake, view).await;
    for (d, removal) in view.datasets.iter().zip(removed) {
        let spec = format!("{}@{}", d.name, d.version);
        if let Some(removal) = removal {
            c.notes.push(format!("note: it reads {spec}, and {removal}: streams of this view fail until it selects again"));
            continue;
        }
        if records.iter().any(|r| r.name == d.name && r.version == d.version) {
            continue;
        }
        match lake.resolve(&spec).await {
            Ok(record) => records.push(record),
            Err(e) => c.damage.push(format!("it reads {spec}, which cannot be read: {e}")),
        }
    }
    Ok(c)
}

/// The commands that mend a view version that is damaged or reads damaged tables: its query
/// again, with its features mapped as they are (`after_ingest`: once the datasets it reads are
/// ingested again). An older version stays as it is.
async fn mend_view(lake: &Lake, view: &ViewRecord, after_ingest: bool) -> anyhow::Result<Vec<String>> {
    let newest = lake.view_records(&view.name).await?.last().map_or(view.version, |v| v.version);
    if newest > view.version {
        return Ok(vec![format!("nothing: view {}@{} is kept as it is; {}@{newest} is newer", view.name, view.version, view.name)]);
    }
    // A drop: what it holds besides the drop is read by nothing. A record that has no query
    // left (a drop, changed to look like a view) is dropped again.
    if view.dropped {
        return Ok(vec![format!("nothing: the drop of view {} stands, and nothing reads what else it holds", view.name)]);
    }
    if view.sql.is_empty() {
        return Ok(vec![format!("lake view drop {}", view.name)]);
    }
    let mut command = format!("lake view create {} --replace {}", view.name, quoted(&view.sql));
    for d in &view.datasets {
        let map = &d.features;
        for (from, to) in &map.rename {
            command += &format!(" --rename {}", quoted(&format!("{}:{from}={to}", d.name)));
        }
        for key in &map.drop {
            command += &format!(" --drop {}", quoted(&format!("{}:{key}", d.name)));
        }
        for (key, dims) in &map.dims {
            let dims: Vec<String> = dims.iter().map(usize::to_string).collect();
            command += &format!(" --dims {}", quoted(&format!("{}:{key}={}", d.name, dims.join(","))));
        }
    }
    let when = match after_ingest {
        true => "after the datasets it reads are ingested again; it selects from their new versions",
        false => "it selects again from the datasets' current versions",
    };
    Ok(vec![format!("{command}  ({when})")])
}

/// `word` as a shell reads it back.
fn quoted(word: &str) -> String {
    shlex::try_quote(word).map_or_else(|_| word.to_string(), |q| q.into_owned())
}

/// Checks the tables, frame tables and training proxy of one version.
async fn check_version(lake: &Lake, record: &CommitRecord, threads: usize) -> anyhow::Result<Checked> {
    let spec = format!("{}@{}", record.name, record.version);
    let mut c = Checked { name: record.name.clone(), version: record.version, ..Checked::default() };
    let tables = lake.verify_tables(record, threads).await?;
    c.files = tables.files;
    c.bytes = tables.bytes;
    c.sizes_only = tables.sizes_only;
    if let Some(why) = &tables.record {
        c.damage.push(format!("{}: {why}", Lake::record_path(&record.name, record.version)));
    }
    for d in &tables.damage {
        c.damage.push(format!("{}/{}: {}", record.tables.dir, d.path, d.why));
    }
    c.tables_damaged = tables.is_damaged();
    if tables.is_damaged() {
        // A new version replaces the latest one; an older version stays as it is.
        match lake.newest_version(&record.name).await? {
            Some(latest) if latest > record.version => {
                c.mend.push(format!("nothing: {spec} is kept as it is; {}@{latest} is the latest version", record.name));
            }
            _ => c.mend.push(ingest_command(record)),
        }
    }
    for table in lake_loader::frame_tables(lake, record).await {
        let name = lake_loader::frame_table_name(table.size);
        let mut cache = format!("lake cache {spec}");
        if let Some(size) = table.size {
            cache += &format!(" --size {size}");
        }
        if table.storage == Some(lake_loader::FrameStorage::Zstd.name()) {
            cache += " --storage zstd";
        }
        let path = record.tables.path(&name);
        let found = match table.damage {
            Some(why) => Err(why),
            None => lake_loader::verify_frame_table(&lake.uri(&path)).await.map_err(|e| lake_store::lance_message(&e)),
        };
        match found {
            Err(why) => {
                c.damage.push(format!("{path}: {why}"));
                c.mend.push(cache);
            }
            Ok(found) => {
                c.frames += found.frames as u64;
                c.frame_bytes += found.bytes;
                if !found.checksums {
                    c.unchecked_frame_tables.push(name.clone());
                }
                if !found.damaged.is_empty() {
                    c.damage
                        .extend(damaged_rows(lake, record, &path, "the frame is not the one `lake cache` stored", &found.damaged).await);
                    c.mend.push(cache);
                }
            }
        }
    }
    check_proxy(lake, record, &mut c).await;
    let table = lake_schemas::tables::IMAGE_STATS;
    let again = format!("lake stats {spec} --images");
    match lake.verify_content(record, table).await? {
        None => {}
        Some(lake_store::ContentCheck::Intact { rows }) => c.image_stats_rows = rows,
        Some(lake_store::ContentCheck::Unchecked { .. }) => c.unchecked_tables.push((table.to_string(), again)),
        Some(lake_store::ContentCheck::Damaged(why)) => {
            c.damage.push(format!("{}: {why}", record.tables.path(table)));
            c.mend.push(again);
        }
    }
    Ok(c)
}

/// Checks every packet of the version's training proxy, if it has one.
async fn check_proxy(lake: &Lake, record: &CommitRecord, c: &mut Checked) {
    let path = record.tables.path(lake_schemas::tables::PROXY);
    let mend = |settings: lake_loader::proxy::Settings| {
        format!("lake cache {}@{} --proxy {} --gop {} --crf {}", record.name, record.version, settings.codec, settings.gop, settings.crf)
    };
    match lake_loader::verify_proxy(lake, record).await {
        Ok(None) => {}
        Ok(Some(found)) => {
            c.proxy_packets = found.packets;
            c.proxy_bytes = found.bytes;
            if !found.damaged.is_empty() {
                let what = "the proxy's packet of this frame is not the one `lake cache --proxy` stored";
                c.damage.extend(damaged_rows(lake, record, &path, what, &found.damaged).await);
                c.mend.push(mend(found.settings));
            }
        }
        Err(e) => {
            c.damage.push(format!("{path}: {e}"));
            // Its settings are in the table's metadata, which may be what cannot be read.
            let settings = lake_loader::ProxyInfo::read(lake, record).await.ok().flatten().map(|info| info.settings);
            c.mend.push(settings.map_or_else(|| format!("lake cache {}@{} --proxy CODEC", record.name, record.version), mend));
        }
    }
}

/// One line per damaged row of the table at `path` (the first [`FRAMES_NAMED`], the rest
/// counted), each named by camera, episode and frame from its `packets` row when that table can
/// be read.
async fn damaged_rows(lake: &Lake, record: &CommitRecord, path: &str, what: &str, rows: &[(u64, lake_loader::Mismatch)]) -> Vec<String> {
    let columns = lake_store::read_columns(lake, record, lake_schemas::tables::PACKETS, &["camera", "episode_index", "frame_index"]).await;
    let batch = columns.ok().and_then(|batches| arrow::compute::concat_batches(&batches.first()?.schema(), &batches).ok());
    let mut lines: Vec<String> = rows[..rows.len().min(FRAMES_NAMED)]
        .iter()
        .map(|&(row, m)| {
            let what = format!("{what} (CRC-32 {:08x}, stored {:08x})", m.read, m.stored);
            let place = batch.as_ref().filter(|b| (row as usize) < b.num_rows()).and_then(|b| {
                let (i, camera) = (row as usize, b.column(0).as_string_opt::<i32>()?);
                let int = |c: usize| b.column(c).as_primitive_opt::<Int64Type>().filter(|a| a.is_valid(i)).map(|a| a.value(i));
                Some(format!("camera {}, episode {}, frame {}", camera.value(i), int(1)?, int(2)?))
            });
            match place {
                Some(place) => format!("{path}: {place} (packet row {row}): {what}"),
                None => format!("{path}: packet row {row}: {what}"),
            }
        })
        .collect();
    if rows.len() > FRAMES_NAMED {
        lines.push(format!("{path}: and {} more damaged frames", rows.len() - FRAMES_NAMED));
    }
    lines
}

/// The ingest that replaces a version whose tables are damaged: its source again, with its
/// options, checked (`--verify`) so that the damaged version is not taken as up to date.
fn ingest_command(record: &CommitRecord) -> String {
    let source = lake_store::local_path(&record.source.url).map_or_else(|| record.source.url.clone(), |p| p.display().to_string());
    let mut command = format!("lake ingest {} --name {} --verify", quoted(&source), record.name);
    let options = &record.options;
    if options.tolerance_s != lake_schemas::DEFAULT_TOLERANCE_S {
        command += &format!(" --tolerance-s {}", options.tolerance_s);
    }
    if options.skip_bad_episodes {
        command += " --skip-bad-episodes";
    }
    if options.drop_missing_cameras {
        command += " --drop-missing-cameras";
    }
    if options.keep_rows_without_video {
        command += " --missing-video keep-rows";
    }
    command
}
