//! What the web app reads beside the sampling API: dataset summaries, pages of a dataset's
//! episodes, one episode's steps as columns, ingest findings, and one camera's frame at a step
//! as PNG (the loader's own bytes).

use std::collections::HashMap;

use arrow::{
    array::{Array, ArrayRef, AsArray, RecordBatch},
    datatypes::{Field, Int64Type, Schema},
};
use futures::TryStreamExt;
use lake_schemas::{CommitRecord, tables};
use lake_store::Lake;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::{Error, Result, Service};

/// The most episodes one page holds.
pub const MAX_PAGE: usize = 1000;

/// Rows as JSON objects, every column in each (nulls as `null`).
///
/// # Errors
/// When a value cannot be written as JSON.
pub fn batches_json(batches: &[RecordBatch]) -> Result<Value> {
    let internal = |e: &dyn std::fmt::Display| Error::Internal(format!("writing the answer as JSON: {e}"));
    let mut writer = arrow::json::WriterBuilder::new().with_explicit_nulls(true).build::<_, arrow::json::writer::JsonArray>(Vec::new());
    for b in batches {
        writer.write(b).map_err(|e| internal(&e))?;
    }
    writer.finish().map_err(|e| internal(&e))?;
    let bytes = writer.into_inner();
    if bytes.is_empty() {
        return Ok(json!([]));
    }
    serde_json::from_slice(&bytes).map_err(|e| internal(&e))
}

/// One array's values as a JSON array (vectors as arrays).
fn array_json(array: &ArrayRef) -> Result<Value> {
    let field = Field::new("v", array.data_type().clone(), true);
    let batch = RecordBatch::try_new(std::sync::Arc::new(Schema::new(vec![field])), vec![array.clone()])
        .map_err(|e| Error::Internal(format!("a steps column as JSON: {e}")))?;
    let Value::Array(rows) = batches_json(&[batch])? else { unreachable!("the JSON writer writes an array") };
    Ok(Value::Array(rows.into_iter().map(|mut r| r.get_mut("v").map(Value::take).unwrap_or(Value::Null)).collect()))
}

/// The bytes stored under a version's directory (its tables, and the frame tables and proxies
/// made beside it).
///
/// # Errors
/// When the store cannot be listed.
pub async fn version_bytes(lake: &Lake, record: &CommitRecord) -> Result<u64> {
    let prefix = object_store::path::Path::from(record.tables.dir.as_str());
    lake.store().list(Some(&prefix)).try_fold(0, |n, meta| async move { Ok(n + meta.size) }).await.map_err(|e| {
        let message = format!("listing {}: {e}", lake.uri(&record.tables.dir));
        if lake_store::store_unreachable(&e) { Error::StoreUnavailable(message) } else { Error::Storage(message) }
    })
}

/// A dataset version as the datasets page lists it: the catalog's facts, its duration, each
/// camera's codec and size, its frame tables, the ingest findings by severity, and its bytes.
///
/// # Errors
/// When its streams table cannot be read.
pub async fn dataset_summary(lake: &Lake, record: &CommitRecord) -> Result<Value> {
    let streams = lake_store::read_columns(lake, record, tables::STREAMS, &["camera", "codec", "width", "height"]).await?;
    let mut cameras: Vec<Value> = Vec::new();
    for row in batches_json(&streams)?.as_array().into_iter().flatten() {
        if !cameras.iter().any(|c| c.get("camera") == row.get("camera")) {
            cameras.push(row.clone());
        }
    }
    let bytes = version_bytes(lake, record).await.inspect_err(|e| tracing::warn!("{e}")).ok();
    let duration = if record.fps > 0 { record.counts.steps as f64 / f64::from(record.fps) } else { 0.0 };
    Ok(json!({
        "name": record.name, "version": record.version, "episodes": record.counts.episodes, "steps": record.counts.steps,
        "cameras": record.counts.cameras, "fps": record.fps, "codebase_version": record.source.codebase_version,
        "robot_type": record.robot_type, "duration_s": duration, "bytes": bytes, "camera_list": cameras,
        "frame_tables": lake_loader::frame_tables(lake, record).await, "findings": record.counts.findings,
        "tasks": record.counts.tasks, "committed_at": record.committed_at,
    }))
}

/// The tasks of a version, in the source's order.
///
/// # Errors
/// When its tasks table cannot be read.
pub async fn tasks(lake: &Lake, record: &CommitRecord) -> Result<Value> {
    batches_json(&lake_store::read_columns(lake, record, tables::TASKS, &["task_index", "task"]).await?)
}

/// The ingest findings of a version.
///
/// # Errors
/// When its findings table cannot be read.
pub async fn findings(lake: &Lake, record: &CommitRecord) -> Result<Value> {
    Ok(json!({ "findings": batches_json(&lake_store::read_table(lake, record, tables::FINDINGS).await?)? }))
}

/// What a page of episodes asks for: which (filters), in which order, and which part.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EpisodeQuery {
    /// Episodes to skip (after filtering and sorting).
    pub offset: Option<usize>,
    /// Episodes to give, at most [`MAX_PAGE`] (default 50).
    pub limit: Option<usize>,
    /// `episode_index` (default), `length` or `findings`.
    pub sort: Option<String>,
    /// `asc` (default) or `desc`.
    pub order: Option<String>,
    /// Only episodes with a task holding this text (any case).
    pub task: Option<String>,
    /// Only episodes at least this long.
    pub min_length: Option<i64>,
    /// Only episodes at most this long.
    pub max_length: Option<i64>,
    /// Only episodes with (`true`) or without (`false`) ingest findings.
    pub with_findings: Option<bool>,
}

/// One episode as the episodes table shows it.
struct EpisodeRow {
    episode_index: i64,
    length: i64,
    tasks: Vec<String>,
    from_index: i64,
    findings: u64,
}

/// A page of a version's episodes: filtered, sorted and cut on the server, so that a dataset
/// of many thousands of episodes sends only the rows shown.
///
/// # Errors
/// When the query's fields are not valid, or the tables cannot be read.
pub async fn episodes_page(lake: &Lake, record: &CommitRecord, query: &EpisodeQuery) -> Result<Value> {
    let limit = query.limit.unwrap_or(50);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(Error::Invalid(format!("limit must be from 1 to {MAX_PAGE}, not {limit}")));
    }
    let sort = query.sort.as_deref().unwrap_or("episode_index");
    if !["episode_index", "length", "findings"].contains(&sort) {
        return Err(Error::Invalid(format!("sort must be episode_index, length or findings, not `{sort}`")));
    }
    let descending = match query.order.as_deref().unwrap_or("asc") {
        "asc" => false,
        "desc" => true,
        other => return Err(Error::Invalid(format!("order must be asc or desc, not `{other}`"))),
    };
    let mut per_episode: HashMap<i64, u64> = HashMap::new();
    for b in lake_store::read_columns(lake, record, tables::FINDINGS, &["episode_index"]).await? {
        let episodes = b.column(0).as_primitive::<Int64Type>();
        for e in episodes.iter().flatten() {
            *per_episode.entry(e).or_default() += 1;
        }
    }
    let columns = ["episode_index", "length", "tasks", "dataset_from_index"];
    let mut rows = Vec::new();
    for b in lake_store::read_columns(lake, record, tables::EPISODES, &columns).await? {
        let (index, length) = (b.column(0).as_primitive::<Int64Type>(), b.column(1).as_primitive::<Int64Type>());
        let (tasks, from) = (b.column(2).as_list::<i32>(), b.column(3).as_primitive::<Int64Type>());
        for r in 0..b.num_rows() {
            let tasks = tasks.value(r);
            let tasks = tasks.as_string::<i32>().iter().flatten().map(str::to_string).collect();
            let episode_index = index.value(r);
            let findings = per_episode.get(&episode_index).copied().unwrap_or(0);
            rows.push(EpisodeRow { episode_index, length: length.value(r), tasks, from_index: from.value(r), findings });
        }
    }
    let task = query.task.as_deref().map(str::to_lowercase).filter(|t| !t.is_empty());
    rows.retain(|e| {
        task.as_ref().is_none_or(|t| e.tasks.iter().any(|x| x.to_lowercase().contains(t.as_str())))
            && query.min_length.is_none_or(|n| e.length >= n)
            && query.max_length.is_none_or(|n| e.length <= n)
            && query.with_findings.is_none_or(|w| w == (e.findings > 0))
    });
    rows.sort_by_key(|e| {
        let key = match sort {
            "length" => e.length,
            "findings" => e.findings as i64,
            _ => e.episode_index,
        };
        (if descending { -key } else { key }, e.episode_index)
    });
    let offset = query.offset.unwrap_or(0);
    let page: Vec<Value> = rows
        .iter()
        .skip(offset)
        .take(limit)
        .map(|e| {
            json!({"episode_index": e.episode_index, "length": e.length, "tasks": e.tasks, "from_index": e.from_index,
                   "findings": e.findings})
        })
        .collect();
    Ok(json!({ "total": rows.len(), "offset": offset, "limit": limit, "rows": page }))
}

/// A feature's dimension names from `info.json` (`names`: a list, nested lists, or a map of
/// lists such as `{"motors": [...]}`), flattened in order; `None` where it gives none.
fn dimension_names(info: &Value, key: &str) -> Option<Vec<String>> {
    fn flatten(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::String(s) => out.push(s.clone()),
            Value::Array(items) => items.iter().for_each(|i| flatten(i, out)),
            Value::Object(map) => map.values().for_each(|i| flatten(i, out)),
            Value::Number(n) => out.push(n.to_string()),
            Value::Null | Value::Bool(_) => {}
        }
    }
    let mut names = Vec::new();
    flatten(info.get("features")?.get(key)?.get("names")?, &mut names);
    (!names.is_empty()).then_some(names)
}

/// The dataset version a browse request names: a dataset (`NAME` or `NAME@VERSION`); a view
/// is refused (its pages are its datasets').
///
/// # Errors
/// When no dataset has that name.
pub async fn dataset_record(lake: &Lake, name: &str) -> Result<CommitRecord> {
    let base = name.rsplit_once('@').map_or(name, |(base, _)| base);
    if lake_store::validate_name(base).is_ok()
        && lake.version_count(base).await? == 0
        && lake_loader::views::view(lake, base, None).await?.is_some()
    {
        return Err(Error::Invalid(format!("`{base}` is a view; open the datasets it selects")));
    }
    Ok(lake.resolve(name).await?)
}

/// One episode of a dataset version: its steps' columns (every index column, feature and
/// task, not the cameras), the dimension names of its vectors, and its cameras.
///
/// # Errors
/// When the dataset or the episode does not exist.
pub async fn episode(service: &Service, name: &str, episode_index: i64) -> Result<Value> {
    let record = dataset_record(service.lake(), name).await?;
    let loader = service.browsing(&record).await?;
    let ds = &loader.datasets()[0];
    let span = ds.episodes.iter().find(|s| s.episode_index == episode_index).ok_or_else(|| {
        let (first, last) = (ds.episodes.iter().map(|s| s.episode_index).min(), ds.episodes.iter().map(|s| s.episode_index).max());
        Error::NotFound(format!("{}: no episode {episode_index} (episodes {} to {})", ds.label, first.unwrap_or(0), last.unwrap_or(-1)))
    })?;
    let mut columns = Map::new();
    let mut names = Map::new();
    for c in &ds.columns {
        let array = ds.steps.column(c.position).slice(span.first_row as usize, span.len as usize);
        columns.insert(c.key.clone(), array_json(&array)?);
        if let Some(n) = dimension_names(&record.info, &c.key) {
            names.insert(c.key.clone(), n.into());
        }
    }
    let mut tasks: Vec<String> = Vec::new();
    if let Some(task) = ds.columns.iter().find(|c| c.key == tables::TASK) {
        let array = ds.steps.column(task.position).slice(span.first_row as usize, span.len as usize);
        if let Some(strings) = array.as_string_opt::<i32>() {
            for t in strings.iter().flatten() {
                if !tasks.iter().any(|k| k == t) {
                    tasks.push(t.to_string());
                }
            }
        }
    }
    let cameras: Vec<Value> =
        ds.cameras.iter().map(|c| json!({"camera": c.key, "width": c.width, "height": c.height, "video": c.video})).collect();
    Ok(json!({
        "dataset": ds.label, "episode_index": episode_index, "length": span.len, "fps": ds.fps(), "from_index": span.from_index,
        "tasks": tasks, "cameras": cameras, "columns": columns, "names": names,
    }))
}

/// Most frames one answer of [`frames`] holds.
pub const MAX_FRAMES: u64 = 64;
/// Most bytes of RGB one answer of [`frames`] holds: fewer frames of large cameras (at least
/// one).
pub const MAX_FRAMES_BYTES: u64 = 16 << 20;

/// Frames as the web app draws them: consecutive steps' frames of a camera, each a PNG without a
/// colour profile (so browsers take it as sRGB and draw the bytes as they are), and which steps
/// they are.
pub struct Frames {
    /// Each step's PNG file, in step order.
    pub pngs: Vec<Vec<u8>>,
    /// The steps' episode.
    pub episode_index: i64,
    /// The first step's frame within its episode.
    pub frame_index: i64,
}

/// `camera`'s frames at LeRobot `index` of dataset `name` and the `count` − 1 steps after it
/// in its episode (fewer where the episode ends first, or where they would hold more than
/// [`MAX_FRAMES_BYTES`] of RGB), as the loader serves them (RGB, as recorded; only this camera
/// decoded, each GOP once), each encoded as a PNG, in parallel.
///
/// # Errors
/// When the dataset, camera or step does not exist, `count` is 0 or over [`MAX_FRAMES`], or a
/// frame cannot be decoded.
pub async fn frames(service: &Service, name: &str, camera: &str, index: i64, count: u64) -> Result<Frames> {
    if !(1..=MAX_FRAMES).contains(&count) {
        return Err(Error::Invalid(format!("count must be 1 to {MAX_FRAMES} frames, not {count}")));
    }
    let record = dataset_record(service.lake(), name).await?;
    let loader = service.browsing(&record).await?;
    let ds = &loader.datasets()[0];
    let Some(position) = ds.cameras.iter().position(|c| c.key == camera) else {
        let known: Vec<&str> = ds.cameras.iter().map(|c| c.key.as_str()).collect();
        return Err(Error::NotFound(format!("{}: no camera `{camera}` (cameras: {})", ds.label, known.join(", "))));
    };
    let (width, height) = (ds.cameras[position].width, ds.cameras[position].height);
    let frame_bytes = width as usize * height as usize * 3;
    let row = ds.row_of_index(index).map_err(|e| Error::NotFound(e.to_string()))?;
    let span = ds.episodes.iter().find(|s| (s.first_row..s.first_row + s.len).contains(&row));
    let end = span.map_or(row + 1, |s| s.first_row + s.len);
    let rows: Vec<u64> = answered_rows(row, end, count, frame_bytes).collect();
    let (episode_index, frame_index) = ds.episode_and_frame(row as usize);
    let pixels = bytes::Bytes::from(loader.camera_frames(0, position, &rows).await?);
    if pixels.len() != frame_bytes * rows.len() {
        return Err(Error::Internal(format!(
            "{}: camera `{camera}`'s {} frames hold {} bytes, not {} × {width}×{height}×3",
            ds.label,
            rows.len(),
            pixels.len(),
            rows.len()
        )));
    }
    let encodes = (0..rows.len()).map(|k| {
        let frame = pixels.slice(k * frame_bytes..(k + 1) * frame_bytes);
        tokio::task::spawn_blocking(move || png_of(&frame, width, height))
    });
    let pngs = futures::future::try_join_all(encodes).await.map_err(|e| Error::Internal(format!("a PNG encoder stopped: {e}")))?;
    Ok(Frames { pngs: pngs.into_iter().collect::<Result<_>>()?, episode_index, frame_index })
}

/// The rows [`frames`] answers for `count` frames from `row` of an episode ending before `end`:
/// as many as fit in [`MAX_FRAMES_BYTES`] at `frame_bytes` each, and at least one.
fn answered_rows(row: u64, end: u64, count: u64, frame_bytes: usize) -> std::ops::Range<u64> {
    let fit = (MAX_FRAMES_BYTES / frame_bytes.max(1) as u64).max(1);
    row..end.min(row + count.min(fit)).max(row + 1)
}

/// An RGB frame as a PNG without a colour profile, compressed fast.
fn png_of(rgb: &[u8], width: u32, height: u32) -> Result<Vec<u8>> {
    let mut png = Vec::with_capacity(rgb.len() / 2);
    let mut encoder = png::Encoder::new(&mut png, width, height);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    encoder.set_compression(png::Compression::Fastest);
    let encoded = encoder.write_header().and_then(|mut w| w.write_image_data(rgb));
    encoded.map_err(|e| Error::Internal(format!("encoding a PNG: {e}")))?;
    Ok(png)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_of_frames_stops_at_the_episodes_end_and_at_its_bytes() {
        let vga = 640 * 480 * 3;
        assert_eq!(answered_rows(10, 100, 8, vga), 10..18);
        assert_eq!(answered_rows(95, 100, 8, vga), 95..100, "the episode ends");
        assert_eq!(answered_rows(99, 100, 64, vga), 99..100);
        assert_eq!(answered_rows(0, 1000, 64, vga), 0..(MAX_FRAMES_BYTES / vga as u64), "16 MiB of 640×480 is 18 frames");
        assert_eq!(answered_rows(0, 1000, 64, 4096 * 4096 * 3), 0..1, "a frame over the bound still comes alone");
        assert_eq!(answered_rows(0, 1000, 64, 128 * 96 * 3), 0..64);
    }
}
