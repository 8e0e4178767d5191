//! `lake export`: a dataset (or a view over one) back out of the lake.
//!
//! - `lerobot-v3`: a LeRobot v3.0 dataset that LeRobot's own `LeRobotDataset` loads. Steps go to
//!   one data parquet; every camera stream the selected episodes use becomes one mp4, written by
//!   stream copy (the stored packets, never re-encoded): each episode's packets from the keyframe
//!   its first frame needs to its last frame, re-timed to follow the previous episode; episodes
//!   that share a GOP (one file, an episode beginning mid-GOP) continue one another, so a whole
//!   dataset's files come out packet for packet as they went in. The
//!   episodes' `from_timestamp`s are computed from the integer timestamps the written file
//!   reports when read back, so LeRobot's rule (`from_timestamp + timestamp`) finds exactly the
//!   frames the lake resolved. Episodes and `index` are renumbered from 0 (a no-op for a whole
//!   dataset that started at 0).
//! - `parquet`: the dataset's tables as plain parquet files, with LeRobot's keys as columns.
//!
//! Both write into a temporary directory beside the output and rename it into place at the end:
//! an export that fails leaves nothing behind.
//!
//! ```
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! # let dir = tempfile::tempdir().unwrap();
//! # let lake = lake_store::Lake::create(dir.path().join("lake").to_str().unwrap()).unwrap();
//! # let source = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/lerobot/v30-images-tiny");
//! # lake_ingest::ingest(&lake, source, &Default::default(), &lake_ingest::Progress::default()).await.unwrap();
//! let out = dir.path().join("out");
//! let report = lake_export::export(&lake, "v30-images-tiny", lake_export::ExportFormat::LerobotV3, &out).await.unwrap();
//! assert_eq!(report.dataset, "v30-images-tiny@1");
//! assert!(out.join("meta/info.json").is_file());
//! # });
//! ```

/// Why an export failed. The output directory is never left half written.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The lake's catalog or tables could not be read.
    #[error(transparent)]
    Store(#[from] lake_store::Error),
    /// A dataset or view could not be opened, or its frames read.
    #[error(transparent)]
    Loader(#[from] lake_loader::Error),
    /// Its statistics could not be made.
    #[error(transparent)]
    Stats(#[from] lake_stats::Error),
    /// What was asked cannot be exported (an output that exists, a view across datasets, …),
    /// or writing it failed (the message names the file).
    #[error("{0}")]
    Invalid(String),
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    sync::Arc,
};

use arrow::{
    array::{
        Array, ArrayRef, AsArray, BinaryBuilder, Float64Array, Int64Array, ListBuilder, RecordBatch, StringBuilder, StructArray,
        UInt64Array,
    },
    compute::{cast, concat_batches, filter_record_batch, take},
    datatypes::{DataType, Field, Int64Type, Schema, SchemaRef},
};
use lake_codec::Mp4Writer;
use lake_loader::LoaderDataset;
use lake_schemas::tables::{self, PACKET_ROW, TASK};
use lake_store::Lake;
use serde_json::{Value, json};

/// Output formats of `lake export`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportFormat {
    /// A LeRobot v3.0 dataset.
    LerobotV3,
    /// Plain parquet tables.
    Parquet,
}

/// What an export wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct ExportReport {
    /// `NAME@VERSION` exported.
    pub dataset: String,
    /// Episodes written.
    pub episodes: usize,
    /// Steps written.
    pub steps: usize,
    /// Files written.
    pub files: usize,
    /// Bytes written.
    pub bytes: u64,
}

const CHUNK_SIZE: usize = 1000;

fn invalid(message: impl Into<String>) -> Error {
    Error::Invalid(message.into())
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |e| invalid(format!("{}: {e}", path.display()))
}

fn arrow_err(what: &'static str) -> impl FnOnce(arrow::error::ArrowError) -> Error {
    move |e| invalid(format!("{what}: {e}"))
}

fn codec(what: String) -> impl FnOnce(lake_codec::Error) -> Error {
    move |e| invalid(format!("{what}: {e}"))
}

/// Whether `out` lies in the lake's own directory (symbolic links followed as far as `out`
/// exists), where files lake did not write would break it.
fn inside_lake(lake: &Lake, out: &Path) -> bool {
    let root = std::path::PathBuf::from(lake.uri(""));
    let root = root.canonicalize().unwrap_or(root);
    let Ok(mut out) = std::path::absolute(out) else { return false };
    // The nearest part of `out` that exists, resolved; the rest appended.
    let mut rest = Vec::new();
    while !out.exists() {
        match (out.file_name().map(ToOwned::to_owned), out.parent().map(Path::to_path_buf)) {
            (Some(name), Some(parent)) => {
                rest.push(name);
                out = parent;
            }
            _ => break,
        }
    }
    let mut resolved = out.canonicalize().unwrap_or(out);
    resolved.extend(rest.into_iter().rev());
    resolved.starts_with(&root)
}

/// Exports `spec` (a dataset, `NAME@VERSION`, or a view over one dataset) to `out`, which must
/// not exist yet or be an empty directory, outside the lake.
///
/// # Errors
/// When the spec names nothing or a view over several datasets, `out` holds files or lies in
/// the lake, or a table, packet or file cannot be read or written (nothing is left at `out`
/// then).
pub async fn export(lake: &Lake, spec: &str, format: ExportFormat, out: &Path) -> Result<ExportReport> {
    let selection = match lake_loader::views::resolve(lake, spec).await?.as_slice() {
        [one] => one.clone(),
        many => return Err(invalid(format!("view `{spec}` spans {} datasets; export one dataset at a time", many.len()))),
    };
    if !selection.features.is_empty() {
        return Err(invalid(format!(
            "view `{spec}` maps its features (renamed, cut or left out), which applies to samples; an export writes the dataset's \
             own features: export {} or a view without a mapping",
            selection.dataset
        )));
    }
    // A symbolic link stands for the directory it names, which must be new or empty too.
    let linked;
    let out = match std::fs::symlink_metadata(out) {
        Ok(m) if m.file_type().is_symlink() => match out.canonicalize() {
            Ok(target) => {
                linked = target;
                linked.as_path()
            }
            Err(_) => {
                let target = std::fs::read_link(out).map_err(io(out))?;
                return Err(invalid(format!(
                    "{} is a symbolic link to {}, which does not exist; give a new or empty directory",
                    out.display(),
                    target.display()
                )));
            }
        },
        _ => out,
    };
    let host = lake_store::hostname();
    if out.exists() {
        if !out.is_dir() {
            return Err(invalid(format!("{} exists and is not a directory; give a new or empty directory", out.display())));
        }
        remove_dead_partials(out, ".partial-", &host);
        if std::fs::read_dir(out).map_err(io(out))?.next().is_some() {
            return Err(invalid(format!("{} exists and is not empty; choose a new directory", out.display())));
        }
        if std::fs::metadata(out).map_err(io(out))?.permissions().readonly() {
            return Err(invalid(format!("{} is read-only; give a directory lake may write", out.display())));
        }
    }
    if inside_lake(lake, out) {
        return Err(invalid(format!("{} is inside the lake at {}; export to a directory outside it", out.display(), lake.display_root())));
    }
    let ds = LoaderDataset::open(lake, &selection.dataset).await?;
    let episodes: Vec<&lake_loader::EpisodeSpan> =
        ds.episodes.iter().filter(|e| selection.episodes.as_ref().is_none_or(|v| v.binary_search(&e.episode_index).is_ok())).collect();
    if format == ExportFormat::LerobotV3 {
        refuse_episodes_without_video(&ds, &episodes)?;
    }
    // Written into a partial directory, then moved into place: `.OUT.partial-PID@HOST-…` beside
    // a new OUT (renamed to it), `OUT/.partial-PID@HOST-…` in an existing empty one (its
    // contents moved up, so that OUT keeps its owner and mode, also as a mount point). One an
    // export killed outright left is removed by the next export to the same place on the same
    // machine once its process is gone.
    let existing = out.exists();
    let parent = out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new(".")).to_path_buf();
    if let Some(file) = parent.ancestors().find(|a| a.exists()).filter(|a| !a.is_dir()) {
        return Err(invalid(format!("{} is not a directory; {} cannot be made under it", file.display(), out.display())));
    }
    std::fs::create_dir_all(&parent).map_err(io(&parent))?;
    let beside = format!(".{}.partial-", out.file_name().and_then(|n| n.to_str()).unwrap_or("export"));
    remove_dead_partials(&parent, &beside, &host);
    let (place, prefix) = if existing { (out.to_path_buf(), ".partial-".to_string()) } else { (parent, beside) };
    let tmp = tempfile::Builder::new()
        .prefix(&format!("{prefix}{}@{host}-", std::process::id()))
        .tempdir_in(&place)
        .map_err(|e| invalid(lake_store::in_directory(&place, &e).to_string()))?;
    let whole = selection.episodes.is_none();
    match format {
        ExportFormat::LerobotV3 => write_lerobot(lake, &ds, &episodes, whole, tmp.path()).await?,
        ExportFormat::Parquet => write_parquet_tables(lake, &ds, &episodes, whole, tmp.path()).await?,
    }
    let (files, bytes) = dir_size(tmp.path());
    // Until it is in place, the partial directory is removed on every way out.
    if existing {
        let entries: Vec<std::path::PathBuf> = std::fs::read_dir(tmp.path())
            .map_err(io(tmp.path()))?
            .map(|e| e.map(|e| e.path()))
            .collect::<std::io::Result<_>>()
            .map_err(io(tmp.path()))?;
        for entry in &entries {
            let name = entry.file_name().expect("a directory entry has a name");
            std::fs::rename(entry, out.join(name)).map_err(io(&out.join(name)))?;
        }
    } else {
        std::fs::rename(tmp.path(), out).map_err(|e| {
            let e = if e.kind() == std::io::ErrorKind::DirectoryNotEmpty || out.exists() {
                std::io::Error::other("another export wrote this directory meanwhile")
            } else {
                e
            };
            io(out)(e)
        })?;
        let _ = tmp.keep();
    }
    Ok(ExportReport {
        dataset: ds.label.clone(),
        episodes: episodes.len(),
        steps: episodes.iter().map(|e| e.len as usize).sum(),
        files,
        bytes,
    })
}

/// Removes the partial exports (`PREFIX<pid>@<host>-…`) in `dir` of processes of this machine
/// (`host`) that are gone.
fn remove_dead_partials(dir: &Path, prefix: &str, host: &str) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = entry.file_name();
        let Some((pid, rest)) = name.to_str().and_then(|n| n.strip_prefix(prefix)).and_then(|rest| rest.split_once('@')) else {
            continue;
        };
        let ours = rest.rsplit_once('-').is_some_and(|(h, _)| h == host);
        if ours && pid.parse().is_ok_and(|pid| !lake_store::process_alive(pid)) && entry.path().is_dir() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

fn dir_size(dir: &Path) -> (usize, u64) {
    let mut out = (0, 0);
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            let (f, b) = dir_size(&path);
            out = (out.0 + f, out.1 + b);
        } else {
            out = (out.0 + 1, out.1 + entry.metadata().map_or(0, |m| m.len()));
        }
    }
    out
}

fn write_parquet(path: &Path, batch: &RecordBatch) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
    }
    let file = std::fs::File::create(path).map_err(io(path))?;
    let props = parquet::file::properties::WriterProperties::builder()
        .set_compression(parquet::basic::Compression::ZSTD(Default::default()))
        .build();
    let mut writer =
        parquet::arrow::ArrowWriter::try_new(file, batch.schema(), Some(props)).map_err(|e| invalid(format!("{}: {e}", path.display())))?;
    writer.write(batch).map_err(|e| invalid(format!("{}: {e}", path.display())))?;
    writer.close().map_err(|e| invalid(format!("{}: {e}", path.display())))?;
    Ok(())
}

/// The steps rows of `episodes`, in order.
fn step_rows(episodes: &[&lake_loader::EpisodeSpan]) -> UInt64Array {
    UInt64Array::from_iter_values(episodes.iter().flat_map(|e| e.first_row..e.first_row + e.len))
}

/// Renames stored columns to their LeRobot keys (and drops the field metadata lake keeps).
fn with_lerobot_names(batch: &RecordBatch, skip: &[&str]) -> Result<RecordBatch> {
    let mut fields = Vec::new();
    let mut columns = Vec::new();
    for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
        if skip.contains(&field.name().as_str()) {
            continue;
        }
        fields.push(Field::new(tables::lerobot_name(field), field.data_type().clone(), field.is_nullable()));
        columns.push(column.clone());
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).map_err(arrow_err("renaming columns"))
}

/// `parquet`: every table of the version, limited to the selected episodes.
async fn write_parquet_tables(
    lake: &Lake,
    ds: &LoaderDataset,
    episodes: &[&lake_loader::EpisodeSpan],
    whole: bool,
    dir: &Path,
) -> Result<()> {
    let rows = step_rows(episodes);
    let columns: Vec<ArrayRef> =
        ds.steps.columns().iter().map(|c| take(c, &rows, None)).collect::<Result<_, _>>().map_err(arrow_err("selecting steps"))?;
    let steps = RecordBatch::try_new(ds.steps.schema(), columns).map_err(arrow_err("selecting steps"))?;
    // Packets: those the selected steps' frames need, from each one's keyframe (a GOP may begin
    // in another episode's part of a file), in table order; the steps' packet rows are
    // renumbered to point into them.
    let renumber = PacketRenumbering::new(ds, &rows);
    let steps = renumber.steps(&steps)?;
    write_parquet(&dir.join("steps.parquet"), &with_lerobot_names(&steps, &[])?)?;
    let kept = write_packets(lake, ds, &renumber, &dir.join("packets.parquet")).await?;
    let keep: Vec<i64> = episodes.iter().map(|e| e.episode_index).collect();
    // The version's tables, and `image_stats` where `lake stats --images` made it; an empty
    // table (no findings, say) is written with its columns.
    let recorded = [tables::EPISODES, tables::TASKS, tables::STATS, tables::FEATURE_STATS, tables::FINDINGS, tables::STREAMS]
        .into_iter()
        .filter(|table| ds.record.tables.tables.iter().any(|t| t == table));
    let derived = [tables::IMAGE_STATS].into_iter().filter(|table| Path::new(&lake.uri(&ds.record.tables.path(table))).is_dir());
    for table in recorded.chain(derived) {
        let mut batch = lake_store::read_whole_at(&lake.uri(&ds.record.tables.path(table))).await?;
        if let Some(col) = batch.column_by_name("episode_index").cloned() {
            let col = col.as_primitive::<Int64Type>();
            // Dataset-level rows (no episode) describe the whole dataset: kept only for it.
            let mask: arrow::array::BooleanArray =
                (0..col.len()).map(|i| Some(if col.is_null(i) { whole } else { keep.binary_search(&col.value(i)).is_ok() })).collect();
            batch = filter_record_batch(&batch, &mask).map_err(arrow_err("selecting rows"))?;
        }
        // Packet rows point into the exported packets, and a stream's row counts describe them.
        if table == tables::EPISODES {
            batch = renumber.episode_cameras(&batch)?;
        } else if table == tables::STREAMS {
            batch = kept.streams(&batch)?;
        }
        write_parquet(&dir.join(format!("{table}.parquet")), &with_lerobot_names(&batch, &[])?)?;
    }
    Ok(())
}

/// Where the packets an export keeps land in its `packets` table.
struct PacketRenumbering {
    /// Kept row ranges of the lake's table, ascending and disjoint, each with its first row in
    /// the export's.
    ranges: Vec<(std::ops::Range<u64>, u64)>,
}

impl PacketRenumbering {
    /// The packets decoding the frames `rows` of the steps show needs: each frame's, back to
    /// its keyframe.
    fn new(ds: &LoaderDataset, rows: &UInt64Array) -> Self {
        let back = |p: u64| ds.packets.keyframe_offset.get(p as usize).map_or(0, |&k| u64::from(k));
        let mut needed: Vec<std::ops::Range<u64>> = Vec::new();
        for camera in &ds.cameras {
            for row in rows.values() {
                if let Some(p) = camera.packet_row(*row as usize) {
                    needed.push(p - back(p)..p + 1);
                }
            }
        }
        let mut next = 0;
        let ranges = decodable(needed, back)
            .into_iter()
            .map(|r| {
                let to = next;
                next += r.end - r.start;
                (r, to)
            })
            .collect();
        Self { ranges }
    }

    /// The kept rows of the lake's table, ascending.
    fn rows(&self) -> impl Iterator<Item = u64> + '_ {
        self.ranges.iter().flat_map(|(r, _)| r.clone())
    }

    /// `steps` with every `packet_row` pointing into the export's packets.
    fn steps(&self, steps: &RecordBatch) -> Result<RecordBatch> {
        let Some(index) = steps.schema().index_of(PACKET_ROW).ok() else { return Ok(steps.clone()) };
        let rows = steps.column(index).as_struct();
        let moved: Vec<ArrayRef> = rows
            .columns()
            .iter()
            .map(|column| {
                let column = column.as_primitive::<arrow::datatypes::UInt64Type>();
                Arc::new(column.unary::<_, arrow::datatypes::UInt64Type>(|row| self.row(row))) as ArrayRef
            })
            .collect();
        let moved =
            StructArray::try_new(rows.fields().clone(), moved, rows.nulls().cloned()).map_err(arrow_err("renumbering packet rows"))?;
        let mut columns = steps.columns().to_vec();
        columns[index] = Arc::new(moved);
        RecordBatch::try_new(steps.schema(), columns).map_err(arrow_err("renumbering packet rows"))
    }

    /// A kept lake packet row's row in the export (every row a step shows is kept).
    fn row(&self, row: u64) -> u64 {
        let i = self.ranges.partition_point(|(r, _)| r.start <= row).saturating_sub(1);
        self.ranges.get(i).filter(|(r, _)| r.contains(&row)).map_or(row, |(r, to)| row - r.start + to)
    }

    /// `episodes` with each camera's `first_row` and `last_row` (the packets of the episode's
    /// first and last frames, kept since steps show them) pointing into the export's packets.
    fn episode_cameras(&self, episodes: &RecordBatch) -> Result<RecordBatch> {
        let Ok(index) = episodes.schema().index_of("cameras") else { return Ok(episodes.clone()) };
        let lists = episodes.column(index).as_list::<i32>();
        let entries = lists.values().as_struct();
        let mut columns = entries.columns().to_vec();
        for name in ["first_row", "last_row"] {
            let Some(at) = entries.column_names().iter().position(|c| *c == name) else { continue };
            let rows = columns[at].as_primitive::<arrow::datatypes::UInt64Type>();
            columns[at] = Arc::new(rows.unary::<_, arrow::datatypes::UInt64Type>(|row| self.row(row)));
        }
        let entries = StructArray::try_new(entries.fields().clone(), columns, entries.nulls().cloned())
            .map_err(arrow_err("renumbering episode packet rows"))?;
        let DataType::List(field) = lists.data_type() else { return Err(invalid("episodes.cameras is not a list")) };
        let lists = arrow::array::ListArray::try_new(field.clone(), lists.offsets().clone(), Arc::new(entries), lists.nulls().cloned())
            .map_err(arrow_err("renumbering episode packet rows"))?;
        let mut columns = episodes.columns().to_vec();
        columns[index] = Arc::new(lists);
        RecordBatch::try_new(episodes.schema(), columns).map_err(arrow_err("renumbering episode packet rows"))
    }
}

/// The packet rows `needed` (sorted, merged), widened until every row in them decodes from
/// them alone (`back(row)` is its `keyframe_offset`, which stays true in the export): a lead-in
/// row may need a keyframe before its range (a reordered frame after an open-GOP keyframe
/// decodes from the keyframe before).
fn decodable(needed: Vec<std::ops::Range<u64>>, back: impl Fn(u64) -> u64) -> Vec<std::ops::Range<u64>> {
    let mut ranges = merge_ranges(needed);
    loop {
        let mut widened = false;
        for r in &mut ranges {
            let start = r.clone().map(|q| q - back(q)).min().unwrap_or(r.start);
            if start < r.start {
                r.start = start;
                widened = true;
            }
        }
        if !widened {
            return ranges;
        }
        ranges = merge_ranges(ranges);
    }
}

/// `ranges` sorted and with overlapping or touching ones merged.
fn merge_ranges(mut ranges: Vec<std::ops::Range<u64>>) -> Vec<std::ops::Range<u64>> {
    ranges.sort_unstable_by_key(|r| (r.start, r.end));
    let mut merged: Vec<std::ops::Range<u64>> = Vec::new();
    for r in ranges {
        match merged.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => merged.push(r),
        }
    }
    merged
}

/// What an export's packets hold of each stream: `(first row, packets, keyframes, bytes)`.
struct KeptStreams(BTreeMap<u32, [u64; 4]>);

impl KeptStreams {
    /// `streams` limited to those with kept packets, their `first_row`, `packets`, `keyframes`
    /// and `bytes` counting the export's packets (the codec facts, GOP and B-frame columns
    /// still describe the source's streams).
    fn streams(&self, streams: &RecordBatch) -> Result<RecordBatch> {
        let ids = streams.column_by_name("stream").ok_or_else(|| invalid("the streams table has no stream column"))?;
        let ids = ids.as_primitive::<arrow::datatypes::UInt32Type>();
        let mask: arrow::array::BooleanArray = ids.iter().map(|id| Some(id.is_some_and(|id| self.0.contains_key(&id)))).collect();
        let streams = filter_record_batch(streams, &mask).map_err(arrow_err("selecting streams"))?;
        let ids = streams.column_by_name("stream").expect("kept above").as_primitive::<arrow::datatypes::UInt32Type>().clone();
        let mut columns = streams.columns().to_vec();
        for (i, name) in ["first_row", "packets", "keyframes", "bytes"].into_iter().enumerate() {
            let Ok(at) = streams.schema().index_of(name) else { continue };
            columns[at] = Arc::new(UInt64Array::from_iter_values(ids.values().iter().map(|id| self.0[id][i])));
        }
        RecordBatch::try_new(streams.schema(), columns).map_err(arrow_err("counting kept packets"))
    }
}

/// The kept packets, taken and written a slice at a time (they hold every frame's bytes); what
/// they hold of each stream.
async fn write_packets(lake: &Lake, ds: &LoaderDataset, renumber: &PacketRenumbering, path: &Path) -> Result<KeptStreams> {
    /// Packets per take: a few MB of compressed video.
    const SLICE: usize = 256;
    let table = lake_store::open_table(lake, &ds.record, tables::PACKETS).await?;
    let lance = |e: lance::Error| invalid(format!("reading the packets of {}: {}", ds.label, lake_store::lance_message(&e)));
    let file = std::fs::File::create(path).map_err(io(path))?;
    let props = parquet::file::properties::WriterProperties::builder().build();
    // (The table's own columns: lakes ingested before packets had checksums lack that one.)
    let schema = plain_schema(&arrow::datatypes::Schema::from(table.schema()));
    let mut writer =
        parquet::arrow::ArrowWriter::try_new(file, schema.clone(), Some(props)).map_err(|e| invalid(format!("{}: {e}", path.display())))?;
    let rows: Vec<u64> = renumber.rows().collect();
    let mut kept = BTreeMap::new();
    let mut written = 0;
    for slice in rows.chunks(SLICE) {
        let batch = table.take(slice, table.schema().clone()).await.map_err(lance)?;
        let batch = RecordBatch::try_new(schema.clone(), batch.columns().to_vec()).map_err(arrow_err("reading packets"))?;
        let column = |name: &str| batch.column_by_name(name).ok_or_else(|| invalid(format!("{}: packets without {name}", ds.label)));
        let (stream, keyframe, data) = (column("stream")?, column("keyframe")?, column("data")?);
        let (stream, keyframe, data) =
            (stream.as_primitive::<arrow::datatypes::UInt32Type>(), keyframe.as_boolean(), data.as_binary::<i64>());
        for i in 0..batch.num_rows() {
            let counts: &mut [u64; 4] = kept.entry(stream.value(i)).or_insert([written + i as u64, 0, 0, 0]);
            counts[1] += 1;
            counts[2] += u64::from(keyframe.value(i));
            counts[3] += data.value_length(i) as u64;
        }
        written += batch.num_rows() as u64;
        writer.write(&batch).map_err(|e| invalid(format!("{}: {e}", path.display())))?;
    }
    writer.close().map_err(|e| invalid(format!("{}: {e}", path.display())))?;
    Ok(KeptStreams(kept))
}

/// `schema` without metadata.
fn plain_schema(schema: &Schema) -> SchemaRef {
    Arc::new(Schema::new(schema.fields().iter().map(|f| f.as_ref().clone().with_metadata(Default::default())).collect::<Vec<_>>()))
}

/// LeRobot's format gives every episode every camera's video: an episode ingested without one
/// (`--missing-video keep-rows`) cannot be written in it.
fn refuse_episodes_without_video(ds: &LoaderDataset, episodes: &[&lake_loader::EpisodeSpan]) -> Result<()> {
    for camera in ds.cameras.iter().filter(|c| !c.every_step_has_a_frame()) {
        let lacking: Vec<i64> =
            episodes.iter().filter(|e| camera.packet_row(e.first_row as usize).is_none()).map(|e| e.episode_index).collect();
        if let Some(first) = lacking.first() {
            return Err(invalid(format!(
                "{}: {} episode(s) (the first is episode {first}) have no video for camera {} (ingested with --missing-video \
                 keep-rows), and LeRobot's format needs every camera's video; export a view that selects the episodes that have it, \
                 or --format parquet",
                ds.label,
                lacking.len(),
                camera.key
            )));
        }
    }
    Ok(())
}

/// The output file of each camera stream the episodes use: `(camera, stream) → k`, numbered per
/// camera in stream order.
fn video_files(ds: &LoaderDataset, episodes: &[&lake_loader::EpisodeSpan]) -> BTreeMap<(String, u32), usize> {
    let mut out = BTreeMap::new();
    for camera in ds.cameras.iter().filter(|c| ds.streams.values().any(|s| s.camera == c.key && s.kind == "video")) {
        let mut streams: Vec<u32> =
            episodes.iter().map(|e| ds.packets.stream[camera.packet_rows.value(e.first_row as usize) as usize]).collect();
        streams.sort_unstable();
        streams.dedup();
        for (k, s) in streams.into_iter().enumerate() {
            out.insert((camera.key.clone(), s), k);
        }
    }
    out
}

/// `lerobot-v3`.
async fn write_lerobot(lake: &Lake, ds: &LoaderDataset, episodes: &[&lake_loader::EpisodeSpan], whole: bool, dir: &Path) -> Result<()> {
    let fps = ds.fps();
    let rows = step_rows(episodes);
    let files = video_files(ds, episodes);
    let time_bases = stream_time_bases(lake, ds).await?;

    // Videos first: the episodes' from_timestamps come from the written files.
    // (episode position, camera) → (file k, from_timestamp)
    let mut placement: BTreeMap<(usize, String), (usize, f64)> = BTreeMap::new();
    for ((camera, stream), k) in &files {
        let path = dir.join(format!("videos/{camera}/chunk-{:03}/file-{:03}.mp4", k / CHUNK_SIZE, k % CHUNK_SIZE));
        let cam = ds.cameras.iter().find(|c| &c.key == camera).expect("camera of a listed file");
        let mine: Vec<(usize, &lake_loader::EpisodeSpan)> = episodes
            .iter()
            .enumerate()
            .filter(|(_, e)| ds.packets.stream[cam.packet_rows.value(e.first_row as usize) as usize] == *stream)
            .map(|(i, e)| (i, *e))
            .collect();
        let tb = time_bases.get(stream).copied().ok_or_else(|| invalid(format!("stream {stream} has no time base")))?;
        let froms = write_video(ds, cam, *stream, tb, &mine, &path).await?;
        for ((i, _), from) in mine.iter().zip(froms) {
            placement.insert((*i, camera.clone()), (*k, from));
        }
    }

    // Data: steps renumbered, LeRobot keys, image cameras as {bytes, path} structs.
    let mut fields = Vec::new();
    let mut columns: Vec<ArrayRef> = Vec::new();
    let new_episode: Vec<i64> = episodes.iter().enumerate().flat_map(|(i, e)| std::iter::repeat_n(i as i64, e.len as usize)).collect();
    // A view keeps only the tasks its steps use, numbered from 0 in their order (LeRobot looks a
    // task up by its position in `tasks.parquet`); a whole dataset keeps its own numbering where
    // that is those positions (a v2.x source's `task_index` need not be).
    let positional = {
        let tasks = lake_store::read_columns(lake, &ds.record, tables::TASKS, &["task_index"]).await?;
        let mut numbers: Vec<i64> = Vec::new();
        for b in &tasks {
            let c = cast(b.column(0), &DataType::Int64).map_err(arrow_err("task_index"))?;
            numbers.extend(c.as_primitive::<Int64Type>().values().iter());
        }
        numbers.sort_unstable();
        numbers.iter().enumerate().all(|(i, n)| *n == i as i64)
    };
    let old_tasks =
        ds.steps.column_by_name("task_index").map(|c| cast(c, &DataType::Int64)).transpose().map_err(arrow_err("task_index"))?;
    let step_tasks: Option<Vec<i64>> =
        old_tasks.map(|tasks| rows.values().iter().map(|&r| tasks.as_primitive::<Int64Type>().value(r as usize)).collect());
    let numbering = lake_stats::Numbering::new(
        episodes.iter().map(|e| (e.episode_index, e.len as usize)).collect(),
        step_tasks.as_deref(),
        !whole || !positional,
    );
    let new_task = numbering.tasks.as_ref().map(|(_, map)| map);
    let renumbered_tasks = numbering.tasks.as_ref().map(|(tasks, _)| tasks);
    for field in ds.steps.schema().fields() {
        let name = field.name().as_str();
        if name == PACKET_ROW || name == TASK {
            continue;
        }
        let column = ds.steps.column_by_name(name).expect("field of the batch");
        let column: ArrayRef = match name {
            "episode_index" => Arc::new(Int64Array::from(new_episode.clone())),
            "index" => Arc::new(Int64Array::from_iter_values(0..rows.len() as i64)),
            "task_index" if renumbered_tasks.is_some() => {
                let values = Arc::new(Int64Array::from(renumbered_tasks.cloned().unwrap_or_default()));
                cast(&(values as ArrayRef), column.data_type()).map_err(arrow_err("task_index"))?
            }
            _ => take(column, &rows, None).map_err(arrow_err("selecting steps"))?,
        };
        fields.push(Field::new(tables::lerobot_name(field), column.data_type().clone(), field.is_nullable()));
        columns.push(column);
    }
    for camera in ds.cameras.iter().filter(|c| ds.streams.values().any(|s| s.camera == c.key && s.kind == "image")) {
        let packet_rows: Vec<u64> = rows.values().iter().map(|&r| camera.packet_rows.value(r as usize)).collect();
        let mut bytes = BinaryBuilder::new();
        for chunk in packet_rows.chunks(1024) {
            for b in ds.packet_bytes(chunk).await? {
                bytes.append_value(&b);
            }
        }
        let paths: ArrayRef = Arc::new(arrow::array::StringArray::new_null(packet_rows.len()));
        let image = StructArray::from(vec![
            (Arc::new(Field::new("bytes", DataType::Binary, true)), Arc::new(bytes.finish()) as ArrayRef),
            (Arc::new(Field::new("path", DataType::Utf8, true)), paths),
        ]);
        fields.push(Field::new(&camera.key, image.data_type().clone(), true));
        columns.push(Arc::new(image));
    }
    let data = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).map_err(arrow_err("building the data table"))?;
    write_parquet(&dir.join("data/chunk-000/file-000.parquet"), &data)?;

    // Episodes.
    let episode_table = lake_store::read_table(lake, &ds.record, tables::EPISODES).await?;
    let mut tasks_of: BTreeMap<i64, Vec<String>> = BTreeMap::new();
    for b in &episode_table {
        let idx = b.column_by_name("episode_index").expect("episodes schema").as_primitive::<Int64Type>();
        let tasks = b.column_by_name("tasks").expect("episodes schema").as_list::<i32>();
        for r in 0..b.num_rows() {
            let list = tasks.value(r);
            let list = list.as_string::<i32>();
            tasks_of.insert(idx.value(r), (0..list.len()).map(|i| list.value(i).to_string()).collect());
        }
    }
    let video_cameras: Vec<String> = {
        let mut v: Vec<String> = files.keys().map(|(c, _)| c.clone()).collect();
        v.dedup();
        v
    };
    let mut fields = vec![Field::new("episode_index", DataType::Int64, false)];
    let mut columns: Vec<ArrayRef> = vec![Arc::new(Int64Array::from_iter_values(0..episodes.len() as i64))];
    let mut tasks = ListBuilder::new(StringBuilder::new());
    for e in episodes {
        for t in tasks_of.get(&e.episode_index).into_iter().flatten() {
            tasks.values().append_value(t);
        }
        tasks.append(true);
    }
    let tasks = tasks.finish();
    fields.push(Field::new("tasks", tasks.data_type().clone(), true));
    columns.push(Arc::new(tasks));
    let mut from = 0i64;
    let (mut starts, mut ends) = (Vec::new(), Vec::new());
    for e in episodes {
        starts.push(from);
        from += e.len as i64;
        ends.push(from);
    }
    let zeros = || Arc::new(Int64Array::from(vec![0i64; episodes.len()])) as ArrayRef;
    for (name, column) in [
        ("length", Arc::new(Int64Array::from_iter_values(episodes.iter().map(|e| e.len as i64))) as ArrayRef),
        ("data/chunk_index", zeros()),
        ("data/file_index", zeros()),
        ("dataset_from_index", Arc::new(Int64Array::from(starts))),
        ("dataset_to_index", Arc::new(Int64Array::from(ends))),
    ] {
        fields.push(Field::new(name, DataType::Int64, false));
        columns.push(column);
    }
    for camera in &video_cameras {
        let at = |i: usize| placement.get(&(i, camera.clone())).copied().unwrap_or((0, 0.0));
        let n = episodes.len();
        let k: Vec<usize> = (0..n).map(|i| at(i).0).collect();
        let from: Vec<f64> = (0..n).map(|i| at(i).1).collect();
        let to: Vec<f64> = (0..n).map(|i| from[i] + episodes[i].len as f64 / f64::from(fps)).collect();
        for (suffix, column) in [
            ("chunk_index", Arc::new(Int64Array::from_iter_values(k.iter().map(|k| (k / CHUNK_SIZE) as i64))) as ArrayRef),
            ("file_index", Arc::new(Int64Array::from_iter_values(k.iter().map(|k| (k % CHUNK_SIZE) as i64)))),
            ("from_timestamp", Arc::new(Float64Array::from(from))),
            ("to_timestamp", Arc::new(Float64Array::from(to))),
        ] {
            fields.push(Field::new(format!("videos/{camera}/{suffix}"), column.data_type().clone(), false));
            columns.push(column);
        }
    }
    for name in ["meta/episodes/chunk_index", "meta/episodes/file_index"] {
        fields.push(Field::new(name, DataType::Int64, false));
        columns.push(zeros());
    }
    let (stat_fields, stat_columns) =
        episode_stats_columns(&lake_stats::episode_stats(lake, &ds.record, &numbering).await?, &written_features(ds, &video_cameras))?;
    fields.extend(stat_fields);
    columns.extend(stat_columns);
    let episodes_batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).map_err(arrow_err("building episodes"))?;
    write_parquet(&dir.join("meta/episodes/chunk-000/file-000.parquet"), &episodes_batch)?;

    // Tasks (task strings as the pandas index, as LeRobot writes them), info, stats.
    let tasks_batch = tasks_table(lake, ds, new_task).await?;
    write_parquet(&dir.join("meta/tasks.parquet"), &tasks_batch)?;
    let info = info_json(ds, episodes.len(), rows.len(), tasks_batch.num_rows(), &video_cameras);
    let info_path = dir.join("meta/info.json");
    std::fs::write(&info_path, serde_json::to_vec_pretty(&info).expect("json")).map_err(io(&info_path))?;
    {
        // A view's: over its episodes (numeric features exact, cameras aggregated).
        // The export numbers its episodes and steps from 0 (a version with episodes skipped at
        // ingest too).
        let selected: Option<BTreeSet<i64>> = (!whole).then(|| episodes.iter().map(|e| e.episode_index).collect());
        let mut stats = lake_stats::written_stats_json(lake, &ds.record, selected.as_ref(), &numbering).await?;
        // Only the features the export has (cameras lake holds no frames of are left out).
        if let (Some(stats), Some(kept)) = (stats.as_object_mut(), info["features"].as_object()) {
            stats.retain(|feature, _| kept.contains_key(feature));
        }
        let stats_path = dir.join("meta/stats.json");
        std::fs::write(&stats_path, lake_schemas::pyjson::to_string_pretty(&stats)).map_err(io(&stats_path))?;
    }
    Ok(())
}

/// The `stats/{feature}/{stat}` columns of `meta/episodes/` from per-episode statistics, as
/// LeRobot writes them: features in `features` order (those the export writes), statistics in
/// LeRobot's order, each a list nested as the statistic's shape (`[3, 1, 1]` for a camera);
/// `count` and an integer feature's `min` and `max` as int64, the rest float64.
fn episode_stats_columns(
    episodes: &[serde_json::Map<String, Value>],
    features: &serde_json::Map<String, Value>,
) -> Result<(Vec<Field>, Vec<ArrayRef>)> {
    let Some(first) = episodes.first() else { return Ok((Vec::new(), Vec::new())) };
    let order = ["min", "max", "mean", "std", "count"].into_iter().chain(lake_schemas::tables::QUANTILES.iter().map(|(q, _)| *q));
    let order: Vec<&str> = order.collect();
    let mut fields = Vec::new();
    let mut names: Vec<(String, String, String)> = Vec::new();
    for (feature, declared) in features {
        let Some(entry) = first.get(feature).and_then(Value::as_object) else { continue };
        let int = declared["dtype"].as_str().is_some_and(|d| d.starts_with("int") || d.starts_with("uint"));
        for stat in order.iter().filter(|s| entry.contains_key(**s)) {
            let mut depth = 0;
            let mut v = &entry[*stat];
            while let Value::Array(items) = v {
                depth += 1;
                let Some(inner) = items.first() else { break };
                v = inner;
            }
            let mut item = if *stat == "count" || (int && matches!(*stat, "min" | "max")) { DataType::Int64 } else { DataType::Float64 };
            for _ in 0..depth.max(1) {
                item = DataType::List(Arc::new(Field::new("element", item, true)));
            }
            let column = format!("stats/{feature}/{stat}");
            fields.push(Field::new(&column, item, true));
            names.push((column, feature.clone(), (*stat).to_string()));
        }
    }
    if fields.is_empty() {
        return Ok((fields, Vec::new()));
    }
    // Integer columns take whole numbers (JSON has one number type).
    let whole = |v: &Value| -> Value {
        fn walk(v: &Value) -> Value {
            match v {
                Value::Array(items) => Value::Array(items.iter().map(walk).collect()),
                Value::Number(n) => n.as_f64().map_or(Value::Null, |f| Value::from(f as i64)),
                other => other.clone(),
            }
        }
        walk(v)
    };
    let rows: Vec<serde_json::Map<String, Value>> = episodes
        .iter()
        .map(|episode| {
            names
                .iter()
                .zip(&fields)
                .map(|((column, feature, stat), field)| {
                    let v = episode.get(feature).and_then(|e| e.get(stat)).cloned().unwrap_or(Value::Null);
                    let mut item = field.data_type();
                    while let DataType::List(inner) = item {
                        item = inner.data_type();
                    }
                    (column.clone(), if *item == DataType::Int64 { whole(&v) } else { v })
                })
                .collect()
        })
        .collect();
    let schema = Arc::new(Schema::new(fields.clone()));
    let mut decoder = arrow::json::ReaderBuilder::new(schema).build_decoder().map_err(arrow_err("episode statistics"))?;
    decoder.serialize(&rows).map_err(arrow_err("episode statistics"))?;
    let batch = decoder.flush().map_err(arrow_err("episode statistics"))?.ok_or_else(|| invalid("no episode statistics decoded"))?;
    Ok((fields, batch.columns().to_vec()))
}

async fn stream_time_bases(lake: &Lake, ds: &LoaderDataset) -> Result<BTreeMap<u32, (i32, i32)>> {
    let mut out = BTreeMap::new();
    for b in lake_store::read_columns(lake, &ds.record, tables::STREAMS, &["stream", "time_base_num", "time_base_den"]).await? {
        let s = b.column(0).as_primitive::<arrow::datatypes::UInt32Type>();
        let num = b.column(1).as_primitive::<arrow::datatypes::Int32Type>();
        let den = b.column(2).as_primitive::<arrow::datatypes::Int32Type>();
        for r in 0..b.num_rows() {
            out.insert(s.value(r), (num.value(r), den.value(r)));
        }
    }
    Ok(out)
}

/// `meta/tasks.parquet`: `task_index` plus the task strings as an unnamed pandas index; only
/// the tasks `renumber` maps (old index → new), under their new index, when given.
async fn tasks_table(lake: &Lake, ds: &LoaderDataset, renumber: Option<&BTreeMap<i64, i64>>) -> Result<RecordBatch> {
    let batches = lake_store::read_table(lake, &ds.record, tables::TASKS).await?;
    let source: SchemaRef = tables::tasks_schema();
    let mut all = concat_batches(&source, &batches).map_err(arrow_err("reading tasks"))?;
    // In task_index order: LeRobot looks a task up by its row.
    let order = arrow::compute::sort_to_indices(all.column(0), None, None).map_err(arrow_err("sorting tasks"))?;
    all = arrow::compute::take_record_batch(&all, &order).map_err(arrow_err("sorting tasks"))?;
    if let Some(map) = renumber {
        let index = cast(all.column(0), &DataType::Int64).map_err(arrow_err("task_index"))?;
        let index = index.as_primitive::<Int64Type>();
        let mut kept: Vec<(i64, u64)> = (0..all.num_rows()).filter_map(|r| map.get(&index.value(r)).map(|&new| (new, r as u64))).collect();
        kept.sort_unstable();
        let rows = UInt64Array::from_iter_values(kept.iter().map(|&(_, r)| r));
        let strings = take(all.column(1), &rows, None).map_err(arrow_err("selecting tasks"))?;
        let numbers = Arc::new(Int64Array::from_iter_values(kept.iter().map(|&(new, _)| new))) as ArrayRef;
        all =
            RecordBatch::try_new(all.schema(), vec![cast(&numbers, all.column(0).data_type()).map_err(arrow_err("task_index"))?, strings])
                .map_err(arrow_err("building tasks"))?;
    }
    let pandas = json!({
        "index_columns": ["__index_level_0__"],
        "column_indexes": [{"name": null, "field_name": null, "pandas_type": "unicode", "numpy_type": "object", "metadata": {"encoding": "UTF-8"}}],
        "columns": [
            {"name": "task_index", "field_name": "task_index", "pandas_type": "int64", "numpy_type": "int64", "metadata": null},
            {"name": null, "field_name": "__index_level_0__", "pandas_type": "unicode", "numpy_type": "object", "metadata": null}
        ],
        "attributes": {},
        "creator": {"library": "lake", "version": env!("CARGO_PKG_VERSION")},
        "pandas_version": "2.2.3"
    });
    let schema =
        Schema::new(vec![Field::new("task_index", DataType::Int64, false), Field::new("__index_level_0__", DataType::Utf8, false)])
            .with_metadata([("pandas".to_string(), pandas.to_string())].into());
    RecordBatch::try_new(Arc::new(schema), vec![all.column(0).clone(), all.column(1).clone()]).map_err(arrow_err("building tasks"))
}

/// `meta/info.json` of the export: the source's features (cameras lake holds no frames of left
/// out, video facts as the container says), v3.0 paths and the new totals.
fn info_json(ds: &LoaderDataset, episodes: usize, steps: usize, tasks: usize, video_cameras: &[String]) -> Value {
    json!({
        "codebase_version": "v3.0",
        "robot_type": ds.record.robot_type,
        "total_episodes": episodes,
        "total_frames": steps,
        "total_tasks": tasks,
        "chunks_size": CHUNK_SIZE,
        "data_files_size_in_mb": 100,
        "video_files_size_in_mb": 200,
        "fps": ds.fps(),
        "splits": {"train": format!("0:{episodes}")},
        "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
        // As LeRobot writes it: no template without a video feature.
        "video_path": if video_cameras.is_empty() { Value::Null } else { json!("videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4") },
        "features": written_features(ds, video_cameras),
    })
}

/// The features an export writes (`info.json`'s): the version's, less cameras it has no frames
/// of, video ones with the codec facts of their stream.
fn written_features(ds: &LoaderDataset, video_cameras: &[String]) -> serde_json::Map<String, Value> {
    let mut features = serde_json::Map::new();
    let source = ds.record.info.get("features").and_then(Value::as_object).cloned().unwrap_or_default();
    for (name, feature) in source {
        let dtype = feature.get("dtype").and_then(Value::as_str).unwrap_or_default();
        if dtype == "video" && !video_cameras.contains(&name) {
            continue;
        }
        if dtype == "image" && !ds.cameras.iter().any(|c| c.key == name) {
            continue;
        }
        let mut feature = feature.clone();
        if dtype == "video"
            && let Some(stream) = ds.streams.values().find(|s| s.camera == name)
        {
            let info = feature.as_object_mut().expect("feature object").entry("info").or_insert_with(|| json!({}));
            if let Some(info) = info.as_object_mut() {
                info.insert("video.codec".into(), json!(stream.params.codec));
                info.insert("video.height".into(), json!(stream.params.height));
                info.insert("video.width".into(), json!(stream.params.width));
                if let Some(p) = &stream.params.pix_fmt {
                    info.insert("video.pix_fmt".into(), json!(p));
                }
            }
        }
        features.insert(name, feature);
    }
    features
}

/// Writes the packets `episodes` need from `stream` to `path` (stream copy) and returns each
/// episode's `from_timestamp` in the written file.
async fn write_video(
    ds: &LoaderDataset,
    camera: &lake_loader::Camera,
    stream: u32,
    tb: (i32, i32),
    episodes: &[(usize, &lake_loader::EpisodeSpan)],
    path: &Path,
) -> Result<Vec<f64>> {
    let config = ds.streams.get(&stream).ok_or_else(|| invalid(format!("{}: no stream {stream}", ds.label)))?;
    let what = || format!("{} (stream {stream} of {})", path.display(), ds.label);
    std::fs::create_dir_all(path.parent().expect("a file in a directory")).map_err(io(path))?;
    let mut writer = Mp4Writer::create(path, &config.params, tb).map_err(codec(what()))?;
    let frame = (i64::from(tb.1) / (i64::from(tb.0) * i64::from(ds.fps()))).max(1);

    // Per episode: packet rows [first, last] and the row of its first step's frame. Episodes
    // whose ranges touch or overlap (episodes sharing a file, one beginning inside the GOP the
    // previous one ends in) continue one block: the packets not written yet, on the same
    // timeline, so no packet is written twice. Another range starts a block re-timed to follow
    // the previous one, in presentation and in decode order.
    let mut first_frame_packet = Vec::new();
    let mut written = 0usize;
    let mut end_pts = i64::MIN;
    let mut last_dts = i64::MIN;
    // The block being written: its first packet row, the output packet it starts at, its
    // shift, and its last row written.
    let mut block: Option<(u64, usize, i64, u64)> = None;
    for (_, e) in episodes {
        let rows: Vec<u64> = (e.first_row..e.first_row + e.len).map(|r| camera.packet_rows.value(r as usize)).collect();
        let first = rows.iter().map(|&r| r - u64::from(ds.packets.keyframe_offset[r as usize])).min().expect("episodes have steps");
        let last = *rows.iter().max().expect("episodes have steps");
        let (start, block_first, block_at, shift) = match block {
            Some((block_first, block_at, shift, block_last)) if first >= block_first && first <= block_last + 1 => {
                (block_last + 1, block_first, block_at, shift)
            }
            _ => {
                let range = first..=last;
                let min_pts = range.clone().map(|r| ds.packets.pts[r as usize]).min().expect("a packet");
                let min_dts = range.map(|r| ds.packets.dts[r as usize]).min().expect("a packet");
                let shift = if written == 0 { -min_pts } else { (end_pts - min_pts).max(last_dts + 1 - min_dts) };
                (first, first, written, shift)
            }
        };
        first_frame_packet.push(block_at + (rows[0] - block_first) as usize);
        let range: Vec<u64> = (start..=last).collect();
        for chunk in range.chunks(256) {
            let data = ds.packet_bytes(chunk).await?;
            for (&r, bytes) in chunk.iter().zip(data) {
                let (pts, dts) = (ds.packets.pts[r as usize] + shift, ds.packets.dts[r as usize] + shift);
                let keyframe = ds.packets.container_keyframe[r as usize];
                writer.write(&bytes, (pts, dts, frame), keyframe).map_err(codec(format!("{}: packet row {r}", what())))?;
                end_pts = end_pts.max(pts + frame);
                last_dts = dts;
                written += 1;
            }
        }
        let block_last = block.filter(|b| b.0 == block_first).map_or(last, |b| b.3.max(last));
        block = Some((block_first, block_at, shift, block_last));
    }
    writer.finish().map_err(codec(what()))?;

    // Read the file back: the timestamps its readers (LeRobot's included) will see.
    let times = lake_codec::packet_times(path).map_err(codec(what()))?;
    if times.len() != written {
        return Err(invalid(format!("{}: wrote {written} packets, read back {}", what(), times.len())));
    }
    let timestamps = ds.steps.column_by_name("timestamp").ok_or_else(|| invalid("steps have no timestamp column"))?;
    let timestamps = arrow::compute::cast(timestamps, &DataType::Float64).map_err(arrow_err("timestamps"))?;
    let timestamps = timestamps.as_primitive::<arrow::datatypes::Float64Type>();
    Ok(episodes.iter().zip(first_frame_packet).map(|((_, e), k)| times[k] - timestamps.value(e.first_row as usize)).collect())
}

#[cfg(test)]
mod tests {
    use super::{decodable, episode_stats_columns};
    use arrow::array::{Array, AsArray};
    use lake_schemas::pyjson::number;
    use serde_json::json;

    #[test]
    fn non_finite_statistics_are_written_as_numbers() {
        let episode = json!({"action": {"min": [number(f64::NEG_INFINITY), 1.0], "max": [number(f64::INFINITY), 2.0],
            "mean": [number(f64::NAN), 1.5], "count": [3]}});
        let features = json!({"action": {"dtype": "float32", "shape": [2]}});
        let (fields, columns) =
            episode_stats_columns(&[episode.as_object().expect("object").clone()], features.as_object().expect("object")).expect("columns");
        let column = |name: &str| {
            let at = fields.iter().position(|f| f.name() == name).expect(name);
            let list = columns[at].as_list::<i32>().value(0);
            assert_eq!(list.null_count(), 0, "{name}: numbers, not nulls");
            list.as_primitive::<arrow::datatypes::Float64Type>().values().to_vec()
        };
        assert_eq!(column("stats/action/min"), [f64::NEG_INFINITY, 1.0]);
        assert_eq!(column("stats/action/max"), [f64::INFINITY, 2.0]);
        let mean = column("stats/action/mean");
        assert!(mean[0].is_nan() && mean[1] == 1.5, "{mean:?}");
    }

    #[test]
    #[allow(clippy::single_range_in_vec_init, reason = "lists of row ranges, one range long")]
    fn kept_packets_hold_every_keyframe_their_rows_decode_from() {
        // Keyframes at rows 0, 5 and 10; row 6 is a reordered frame shown before the keyframe at
        // 5, so it decodes from 0 (an open GOP); row 7 decodes from 5.
        let back = |row: u64| match row {
            6 => 6,
            r if r >= 10 => r - 10,
            r if r >= 5 => r - 5,
            r => r,
        };
        assert_eq!(decodable(vec![5..8], back), vec![0..8], "row 6 needs row 0");
        assert_eq!(decodable(vec![12..13, 3..4, 0..1], back), vec![0..4, 10..13], "merged, sorted, each back to its keyframe");
        assert_eq!(decodable(vec![8..9, 5..6], back), vec![0..9]);
        assert_eq!(decodable(vec![], back), vec![]);
    }
}
