//! `lake verify`: every file of a dataset version read and checked against what was recorded
//! when it was written.

use std::{process::ExitCode, time::Instant};

use arrow::array::{Array, AsArray};
use arrow::datatypes::Int64Type;
use lake_schemas::CommitRecord;
use lake_store::Lake;

use crate::text::{count, decimal_bytes};

/// Damaged frames named one by one; the rest are counted.
const FRAMES_NAMED: usize = 10;

/// Arguments of `lake verify`.
#[derive(Debug, clap::Args)]
pub struct VerifyArgs {
    /// Datasets to check: `NAME` (its latest version) or `NAME@VERSION` [default: the latest
    /// version of every dataset].
    datasets: Vec<String>,
    /// Check every version of those datasets, not only the latest.
    #[arg(long)]
    every_version: bool,
    /// Files read at once, 1 to 256 [default: number of cores].
    #[arg(long, value_parser = crate::args::threads_in_range)]
    threads: Option<usize>,
    /// Print JSON: one object per version checked.
    #[arg(long)]
    json: bool,
}

/// What was found in one version.
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
    /// What is damaged, one line each.
    damage: Vec<String>,
    /// The commands that mend it.
    mend: Vec<String>,
    /// Frame tables without checksums: read, not checked.
    unchecked_frame_tables: Vec<String>,
}

pub async fn verify(root: &str, args: VerifyArgs) -> anyhow::Result<ExitCode> {
    let lake = Lake::open(root)?;
    let threads = args.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()));
    let started = Instant::now();
    let mut checked = Vec::new();
    let mut unreadable = Vec::new();
    if args.datasets.is_empty() {
        let (latest, records) = lake.datasets_listed().await?;
        unreadable.extend(
            records.into_iter().map(|u| format!("{}@{}: its catalog record {} cannot be read ({})", u.name, u.version, u.path, u.why)),
        );
        for record in latest {
            let versions = if args.every_version { lake.versions(&record.name).await? } else { vec![record] };
            for record in versions {
                checked.push(check_version(&lake, &record, threads).await?);
            }
        }
    } else {
        for spec in &args.datasets {
            let record = lake.resolve(spec).await?;
            let versions = if args.every_version && !spec.contains('@') { lake.versions(&record.name).await? } else { vec![record] };
            for record in versions {
                checked.push(check_version(&lake, &record, threads).await?);
            }
        }
    }
    let damaged = checked.iter().filter(|c| !c.damage.is_empty()).count() + unreadable.len();
    if args.json {
        let json = serde_json::json!({"versions": checked, "unreadable_records": unreadable, "seconds": started.elapsed().as_secs_f64()});
        outln!("{}", serde_json::to_string_pretty(&json)?)?;
    } else {
        for c in &checked {
            report(c)?;
        }
        for u in &unreadable {
            outln!("{u}; ingesting its source again makes the next version")?;
        }
        let read: u64 = checked.iter().map(|c| c.bytes + c.frame_bytes).sum();
        outln!(
            "{} checked, {damaged} damaged: {} read in {:.2} s",
            count(checked.len() as u64, "version"),
            decimal_bytes(read),
            started.elapsed().as_secs_f64()
        )?;
    }
    Ok(if damaged == 0 { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// Prints what was found in one version.
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
    outln!("{}@{}: {state} ({tables}{frames})", c.name, c.version)?;
    for line in &c.damage {
        outln!("  {line}")?;
    }
    for table in &c.unchecked_frame_tables {
        outln!("  note: frame table {table} has no checksums: its frames were read, not checked (`lake cache` again adds them)")?;
    }
    for command in &c.mend {
        outln!("  to mend: {command}")?;
    }
    Ok(())
}

/// Checks the tables and frame tables of one version.
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
                    let named = name_frames(lake, record, &found.damaged[..found.damaged.len().min(FRAMES_NAMED)]).await;
                    c.damage.extend(named.into_iter().map(|frame| format!("{path}: {frame}")));
                    if found.damaged.len() > FRAMES_NAMED {
                        c.damage.push(format!("{path}: and {} more damaged frames", found.damaged.len() - FRAMES_NAMED));
                    }
                    c.mend.push(cache);
                }
            }
        }
    }
    Ok(c)
}

/// The damaged frames `rows` named by camera, episode and frame (from the packets table, when
/// it can be read).
async fn name_frames(lake: &Lake, record: &CommitRecord, rows: &[(u64, lake_loader::Mismatch)]) -> Vec<String> {
    let columns = lake_store::read_columns(lake, record, lake_schemas::tables::PACKETS, &["camera", "episode_index", "frame_index"]).await;
    let batch = columns.ok().and_then(|batches| arrow::compute::concat_batches(&batches.first()?.schema(), &batches).ok());
    rows.iter()
        .map(|&(row, m)| {
            let what = format!("the frame is not the one `lake cache` stored (CRC-32 {:08x}, stored {:08x})", m.read, m.stored);
            let place = batch.as_ref().filter(|b| (row as usize) < b.num_rows()).and_then(|b| {
                let (i, camera) = (row as usize, b.column(0).as_string_opt::<i32>()?);
                let int = |c: usize| b.column(c).as_primitive_opt::<Int64Type>().filter(|a| a.is_valid(i)).map(|a| a.value(i));
                Some(format!("camera {}, episode {}, frame {}", camera.value(i), int(1)?, int(2)?))
            });
            match place {
                Some(place) => format!("{place} (packet row {row}): {what}"),
                None => format!("packet row {row}: {what}"),
            }
        })
        .collect()
}

/// The ingest that replaces a version whose tables are damaged: its source again, with its
/// options, checked (`--verify`) so that the damaged version is not taken as up to date.
fn ingest_command(record: &CommitRecord) -> String {
    let source = lake_store::local_path(&record.source.url).map_or_else(|| record.source.url.clone(), |p| p.display().to_string());
    let mut command = format!("lake ingest {source} --name {} --verify", record.name);
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
