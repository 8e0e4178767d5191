//! Statistics in LeRobot's `meta/stats.json` layout, per dataset and per episode, and the camera
//! statistics `lake stats --images` computes from decoded frames.

use crate::{Error, Result};
use arrow::{
    array::{Array, AsArray},
    datatypes::{Float64Type, Int64Type},
};
use std::collections::{BTreeMap, BTreeSet};

use lake_schemas::tables::QUANTILES;
use lake_store::Lake;
use serde_json::{Map, Value};

/// Nests flat `values` by `shape` (a scalar feature is a one-element list, as LeRobot writes).
fn nest(values: &[f64], shape: &[usize]) -> Value {
    match shape {
        [] | [_] => Value::Array(values.iter().map(|&v| lake_schemas::pyjson::number(v)).collect()),
        [_, rest @ ..] => {
            let inner: usize = rest.iter().product();
            Value::Array(values.chunks(inner.max(1)).map(|c| nest(c, rest)).collect())
        }
    }
}

/// The dataset-level statistics of a version as LeRobot's `stats.json` object; of the steps of
/// `episodes` only when given (a view's selection: numeric features exact over those steps,
/// cameras the per-episode statistics of those episodes, `lake stats --images`' where the
/// version has them, else the source's, aggregated).
///
/// # Errors
/// When the version has no `feature_stats` table (ingested by an older lake) or a table cannot
/// be read.
pub async fn stats_json(lake: &Lake, record: &lake_schemas::CommitRecord, episodes: Option<&BTreeSet<i64>>) -> Result<Value> {
    use lake_schemas::tables::{FEATURE_STATS, IMAGE_STATS, STATS};
    let mut out = Map::new();
    if !record.tables.tables.iter().any(|t| t == FEATURE_STATS) {
        return Err(Error::Invalid(format!(
            "{}@{} was ingested before lake computed exact statistics; ingest it again",
            record.name, record.version
        )));
    }
    let shapes = feature_shapes(&record.info);
    // Exact statistics of numeric features, and of cameras when `lake stats --images` computed
    // them (per channel, shaped [3, 1, 1] as LeRobot stores them).
    let stat_names: Vec<&str> = ["min", "max", "mean", "std"].into_iter().chain(QUANTILES.iter().map(|(q, _)| *q)).collect();
    let mut features = match episodes {
        None => dataset_rows(&lake_store::read_table_where(lake, record, FEATURE_STATS, "episode_index IS NULL").await?, &stat_names),
        Some(subset) => subset_rows(lake, record, subset, &stat_names).await?,
    };
    let image_stats = lake.uri(&record.tables.path(IMAGE_STATS));
    let has_image_stats = lake.has_table(&record.tables.dir, IMAGE_STATS).await?;
    let mut shapes = shapes;
    if episodes.is_none() && has_image_stats {
        let batches = read_image_stats(record, &image_stats).await?;
        for row in dataset_rows(&batches, &stat_names) {
            shapes.insert(row.0.clone(), vec![3, 1, 1]);
            features.push(row);
        }
    }
    for (name, values, count) in features {
        let shape = shapes.get(&name).cloned().unwrap_or_default();
        let mut entry = Map::new();
        for (stat, v) in stat_names.iter().zip(&values) {
            entry.insert(stat.to_string(), nest(v, &shape));
        }
        entry.insert("count".into(), Value::from(vec![count]));
        out.insert(name, Value::Object(entry));
    }
    // Other cameras: the statistics the source stored (ingest does not decode frames): its
    // dataset-level ones when the version holds every episode of the source, else (episodes
    // skipped at ingest, or a v2.x source, which keeps only per-episode ones) those of the
    // ingested episodes aggregated as LeRobot's `aggregate_stats` aggregates per-episode
    // statistics. Cameras left out at ingest (`--drop-missing-cameras`) have none.
    let whole_source = episodes.is_none() && record.info["total_episodes"].as_u64().is_none_or(|total| total == record.counts.episodes);
    let mut cameras_kept = std::collections::HashSet::new();
    for batch in lake_store::read_columns(lake, record, lake_schemas::tables::STREAMS, &["camera"]).await? {
        cameras_kept.extend(batch.column(0).as_string::<i32>().iter().flatten().map(str::to_string));
    }
    let mut episodes_kept = std::collections::HashSet::new();
    for batch in lake_store::read_columns(lake, record, lake_schemas::tables::EPISODES, &["episode_index"]).await? {
        let kept = batch.column(0).as_primitive::<Int64Type>().values().iter().copied();
        episodes_kept.extend(kept.filter(|e| episodes.is_none_or(|subset| subset.contains(e))));
    }
    let dropped_camera = |name: &str| {
        let dtype = record.info["features"][name]["dtype"].as_str();
        matches!(dtype, Some("video" | "image")) && !cameras_kept.contains(name)
    };
    let mut per_episode: BTreeMap<String, BTreeMap<i64, EpisodeStats>> = BTreeMap::new();
    // A selection's cameras with `lake stats --images`' per-episode statistics: those of its
    // episodes, aggregated below as the source's would be (the selection's exported
    // `meta/episodes` holds the same per-episode ones).
    if let Some(subset) = episodes.filter(|_| has_image_stats) {
        let batches = read_image_stats(record, &image_stats).await?;
        for batch in &batches {
            let episode = batch.column_by_name("episode_index").expect("feature_stats schema");
            let feature = batch.column_by_name("feature").expect("feature_stats schema").as_string::<i32>();
            let dim = batch.column_by_name("dim").expect("feature_stats schema").as_primitive::<arrow::datatypes::Int32Type>();
            let count = batch.column_by_name("count").expect("feature_stats schema").as_primitive::<Int64Type>();
            for row in (0..batch.num_rows()).filter(|&r| episode.is_valid(r)) {
                let e = episode.as_primitive::<Int64Type>().value(row);
                if !subset.contains(&e) || dropped_camera(feature.value(row)) {
                    continue;
                }
                let stats = per_episode.entry(feature.value(row).to_string()).or_default().entry(e).or_default();
                let channel = dim.value(row).max(0) as usize;
                for name in &stat_names {
                    let col = batch.column_by_name(name).expect("feature_stats schema").as_primitive::<Float64Type>();
                    let (values, _) = stats.entry(name.to_string()).or_insert_with(|| (Vec::new(), vec![3, 1, 1]));
                    if values.len() <= channel {
                        values.resize(channel + 1, f64::NAN);
                    }
                    values[channel] = if col.is_null(row) { f64::NAN } else { col.value(row) };
                }
                stats.insert("count".into(), (vec![count.value(row) as f64], vec![1]));
            }
        }
    }
    let from_images: std::collections::HashSet<String> = per_episode.keys().cloned().collect();
    let mut source_level = Map::new();
    // Only the source's statistics of features without exact ones above are read (the table has
    // a row per episode, feature and statistic: a million on a large dataset), and none when
    // every feature info.json declares has exact ones.
    let declared = record.info["features"].as_object().into_iter().flat_map(|f| f.keys());
    let wanted: Vec<String> = declared.filter(|k| !out.contains_key(k.as_str())).map(|k| lake_store::sql_string(k)).collect();
    let source_stats = match wanted.is_empty() {
        true => Vec::new(),
        false => lake_store::read_table_where(lake, record, STATS, &format!("feature IN ({})", wanted.join(", "))).await?,
    };
    for batch in source_stats {
        let episode = batch.column_by_name("episode_index").expect("stats schema");
        let feature = batch.column_by_name("feature").expect("stats schema").as_string::<i32>();
        let stat = batch.column_by_name("stat").expect("stats schema").as_string::<i32>();
        let values = batch.column_by_name("values").expect("stats schema").as_list::<i32>();
        let shape = batch.column_by_name("shape").expect("stats schema").as_list::<i32>();
        for row in 0..batch.num_rows() {
            let name = feature.value(row);
            if out.get(name).is_some_and(|e| !e.as_object().is_some_and(|o| o.contains_key("camera")))
                || dropped_camera(name)
                || from_images.contains(name)
            {
                continue; // lake's own statistics above win
            }
            let v: Vec<f64> = values.value(row).as_primitive::<Float64Type>().iter().map(|x| x.unwrap_or(f64::NAN)).collect();
            let s: Vec<usize> = shape.value(row).as_primitive::<Int64Type>().iter().map(|x| x.unwrap_or(1) as usize).collect();
            if episode.is_valid(row) {
                let episode = episode.as_primitive::<Int64Type>().value(row);
                if !episodes_kept.contains(&episode) {
                    continue; // skipped at ingest
                }
                let stats = per_episode.entry(name.to_string()).or_default().entry(episode);
                stats.or_default().insert(stat.value(row).to_string(), (v, s));
                continue;
            }
            // Not the version's whole source: kept aside, for cameras with no per-episode ones.
            let target = if whole_source { &mut out } else { &mut source_level };
            let entry = target.entry(name.to_string()).or_insert_with(|| serde_json::json!({"camera": true}));
            let value =
                if stat.value(row) == "count" { Value::from(v.iter().map(|c| *c as i64).collect::<Vec<_>>()) } else { nest(&v, &s) };
            entry.as_object_mut().expect("object").insert(stat.value(row).to_string(), value);
        }
    }
    for (name, episodes) in per_episode {
        if out.contains_key(&name) {
            continue;
        }
        let episodes: Vec<EpisodeStats> = episodes.into_values().collect();
        if let Some(entry) = aggregate(&episodes) {
            out.insert(name, Value::Object(entry));
        }
    }
    // A source with dataset-level statistics only (LeRobot v2.0): those, over all its episodes,
    // are the best there is.
    for (name, entry) in source_level {
        if !out.contains_key(&name) {
            out.insert(name, entry);
        }
    }
    for entry in out.values_mut() {
        let object = entry.as_object_mut().expect("object");
        object.remove("camera");
        // One order whatever the source's (which a round trip through export would turn).
        let mut pairs: Vec<(String, Value)> = std::mem::take(object).into_iter().collect();
        pairs.sort_by_key(|(k, _)| stat_order(k));
        object.extend(pairs);
    }
    integer_extremes(&mut out, &record.info);
    Ok(Value::Object(out))
}

/// Where a statistic goes among a feature's: `min`, `max`, `mean`, `std`, `count`, the
/// quantiles by level (`q01` before `q10`), then any other by name.
fn stat_order(name: &str) -> (u8, u64, String) {
    match name {
        "min" => (0, 0, String::new()),
        "max" => (1, 0, String::new()),
        "mean" => (2, 0, String::new()),
        "std" => (3, 0, String::new()),
        "count" => (4, 0, String::new()),
        _ => match name.strip_prefix('q').filter(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit())) {
            // `q01` is 0.01 and `q5` 0.5: compared as decimal fractions.
            Some(digits) => (5, format!("{digits:0<18}").parse().unwrap_or(u64::MAX), name.to_string()),
            None => (6, 0, name.to_string()),
        },
    }
}

/// Writes the `min` and `max` of integer features as whole numbers, as LeRobot's `stats.json`
/// has them (`"min": [0]`, not `[0.0]`).
fn integer_extremes(stats: &mut Map<String, Value>, info: &Value) {
    fn whole(v: &mut Value) {
        match v {
            Value::Array(items) => items.iter_mut().for_each(whole),
            Value::Number(n) => {
                if let Some(f) = n.as_f64().filter(|f| f.fract() == 0.0 && f.abs() < 9.0e15) {
                    *v = Value::from(f as i64);
                }
            }
            _ => {}
        }
    }
    for (name, entry) in stats.iter_mut() {
        let dtype = info["features"][name.as_str()]["dtype"].as_str().unwrap_or_default();
        if !(dtype.starts_with("int") || dtype.starts_with("uint")) {
            continue;
        }
        for stat in ["min", "max"] {
            if let Some(v) = entry.get_mut(stat) {
                whole(v);
            }
        }
    }
}

/// How an export numbers the index columns of the steps it writes: `index` and `episode_index`
/// from 0, in the version's step order; for a selection of episodes (a view's), `task_index` too,
/// over the tasks its steps use, from 0 in task order (LeRobot looks a task up by its position
/// in `tasks.parquet`, and its own subset tools renumber so).
#[derive(Debug, Clone)]
pub struct Numbering {
    /// The episodes written, in order: (the version's episode index, steps).
    pub episodes: Vec<(i64, usize)>,
    /// For a selection: each written step's new `task_index`, in order, and old → new.
    pub tasks: Option<(Vec<i64>, BTreeMap<i64, i64>)>,
}

impl Numbering {
    /// The numbering of `episodes` (in order: episode index, steps) whose steps have the task
    /// indices `step_tasks`, in order; tasks renumbered when `selection`.
    pub fn new(episodes: Vec<(i64, usize)>, step_tasks: Option<&[i64]>, selection: bool) -> Self {
        let tasks = step_tasks.filter(|_| selection).map(|old| {
            let used: BTreeSet<i64> = old.iter().copied().collect();
            let map: BTreeMap<i64, i64> = used.into_iter().enumerate().map(|(new, old)| (old, new as i64)).collect();
            (old.iter().map(|t| map[t]).collect(), map)
        });
        Self { episodes, tasks }
    }

    /// The renumbered index columns' values over the steps of the written episodes `range`.
    fn columns(&self, range: std::ops::Range<usize>) -> Vec<(&'static str, Vec<f64>)> {
        let first: usize = self.episodes[..range.start].iter().map(|(_, n)| n).sum();
        let steps: usize = self.episodes[range.clone()].iter().map(|(_, n)| n).sum();
        let episode: Vec<f64> = range.flat_map(|i| std::iter::repeat_n(i as f64, self.episodes[i].1)).collect();
        let mut out = vec![("index", (first..first + steps).map(|i| i as f64).collect()), ("episode_index", episode)];
        if let Some((tasks, _)) = &self.tasks {
            out.push(("task_index", tasks[first..first + steps].iter().map(|&t| t as f64).collect()));
        }
        out
    }
}

/// The statistics of the steps an export writes (its `meta/stats.json`): [`stats_json`] of
/// `selected` with the index columns as `numbering` numbers them.
///
/// # Errors
/// As [`stats_json`].
pub async fn written_stats_json(
    lake: &Lake,
    record: &lake_schemas::CommitRecord,
    selected: Option<&BTreeSet<i64>>,
    numbering: &Numbering,
) -> Result<Value> {
    let mut stats = stats_json(lake, record, selected).await?;
    if let Some(stats) = stats.as_object_mut() {
        for (name, mut values) in numbering.columns(0..numbering.episodes.len()) {
            if stats.contains_key(name) {
                stats.insert(name.into(), scalar_entry(&mut values));
            }
        }
        integer_extremes(stats, &record.info);
    }
    Ok(stats)
}

/// Per-episode statistics of the episodes an export writes (`numbering`'s, in order), as
/// LeRobot keeps them in `meta/episodes/` (`stats/{feature}/{stat}`): for each episode,
/// `{feature: {stat: value}}` in `stats.json`'s layout. Numeric features: lake's exact
/// `feature_stats` (the index columns as `numbering` writes them); cameras: `lake stats
/// --images`' per-episode statistics where the version has them, else the source's. A feature
/// some written episode has no statistics of is left out of every episode's.
///
/// # Errors
/// When a statistics table cannot be read.
pub async fn episode_stats(lake: &Lake, record: &lake_schemas::CommitRecord, numbering: &Numbering) -> Result<Vec<Map<String, Value>>> {
    use lake_schemas::tables::{FEATURE_STATS, IMAGE_STATS, STATS};
    let position: std::collections::HashMap<i64, usize> = numbering.episodes.iter().enumerate().map(|(i, (e, _))| (*e, i)).collect();
    let mut out: Vec<Map<String, Value>> = vec![Map::new(); numbering.episodes.len()];
    let stat_names: Vec<&str> = ["min", "max", "mean", "std"].into_iter().chain(QUANTILES.iter().map(|(q, _)| *q)).collect();
    let mut shapes = feature_shapes(&record.info);
    // `feature_stats`-shaped tables: one row per (episode, feature, dimension).
    let mut exact = lake_store::read_table(lake, record, FEATURE_STATS).await?;
    let image_stats = lake.uri(&record.tables.path(IMAGE_STATS));
    if lake.has_table(&record.tables.dir, IMAGE_STATS).await? {
        let batches = read_image_stats(record, &image_stats).await?;
        for batch in &batches {
            for name in batch.column_by_name("feature").expect("feature_stats schema").as_string::<i32>().iter().flatten() {
                shapes.insert(name.to_string(), vec![3, 1, 1]);
            }
        }
        exact.extend(batches);
    }
    // (episode position, feature) → per statistic the values by dimension, and the count.
    type ByDimension = (Vec<Vec<f64>>, i64);
    let mut rows: BTreeMap<(usize, String), ByDimension> = BTreeMap::new();
    for batch in &exact {
        let episode = batch.column_by_name("episode_index").expect("feature_stats schema");
        let feature = batch.column_by_name("feature").expect("feature_stats schema").as_string::<i32>();
        let count = batch.column_by_name("count").expect("feature_stats schema").as_primitive::<Int64Type>();
        let stats: Vec<_> =
            stat_names.iter().map(|s| batch.column_by_name(s).expect("feature_stats schema").as_primitive::<Float64Type>()).collect();
        for row in (0..batch.num_rows()).filter(|&r| episode.is_valid(r)) {
            let Some(&at) = position.get(&episode.as_primitive::<Int64Type>().value(row)) else { continue };
            let entry =
                rows.entry((at, feature.value(row).to_string())).or_insert_with(|| (vec![Vec::new(); stat_names.len()], count.value(row)));
            for (v, col) in entry.0.iter_mut().zip(&stats) {
                v.push(if col.is_null(row) { f64::NAN } else { col.value(row) });
            }
        }
    }
    for ((at, name), (values, count)) in rows {
        let shape = shapes.get(&name).cloned().unwrap_or_default();
        let mut entry = Map::new();
        for (stat, v) in stat_names.iter().zip(&values) {
            entry.insert(stat.to_string(), nest(v, &shape));
        }
        entry.insert("count".into(), Value::from(vec![count]));
        out[at].insert(name, Value::Object(entry));
    }
    // Cameras lake has no statistics of: the source's per-episode ones.
    for batch in lake_store::read_table(lake, record, STATS).await? {
        let episode = batch.column_by_name("episode_index").expect("stats schema");
        let feature = batch.column_by_name("feature").expect("stats schema").as_string::<i32>();
        let stat = batch.column_by_name("stat").expect("stats schema").as_string::<i32>();
        let values = batch.column_by_name("values").expect("stats schema").as_list::<i32>();
        let shape = batch.column_by_name("shape").expect("stats schema").as_list::<i32>();
        for row in (0..batch.num_rows()).filter(|&r| episode.is_valid(r)) {
            let Some(&at) = position.get(&episode.as_primitive::<Int64Type>().value(row)) else { continue };
            let name = feature.value(row);
            let dtype = record.info["features"][name]["dtype"].as_str();
            if !matches!(dtype, Some("video" | "image"))
                || out[at].get(name).is_some_and(|e| !e.as_object().is_some_and(|o| o.contains_key("source")))
            {
                continue;
            }
            let v: Vec<f64> = values.value(row).as_primitive::<Float64Type>().iter().map(|x| x.unwrap_or(f64::NAN)).collect();
            let s: Vec<usize> = shape.value(row).as_primitive::<Int64Type>().iter().map(|x| x.unwrap_or(1) as usize).collect();
            let value =
                if stat.value(row) == "count" { Value::from(v.iter().map(|c| *c as i64).collect::<Vec<_>>()) } else { nest(&v, &s) };
            let entry = out[at].entry(name.to_string()).or_insert_with(|| serde_json::json!({"source": true}));
            entry.as_object_mut().expect("object").insert(stat.value(row).to_string(), value);
        }
    }
    for (at, episode) in out.iter_mut().enumerate() {
        for entry in episode.values_mut() {
            entry.as_object_mut().expect("object").remove("source");
        }
        for (name, mut values) in numbering.columns(at..at + 1) {
            if episode.contains_key(name) {
                episode.insert(name.into(), scalar_entry(&mut values));
            }
        }
    }
    // Only features (and statistics) every written episode has.
    if let Some((first, rest)) = out.split_first() {
        let mut common: Map<String, Value> = first.clone();
        common.retain(|name, entry| {
            let keys: BTreeSet<&String> = entry.as_object().map(|o| o.keys().collect()).unwrap_or_default();
            rest.iter().all(|e| e.get(name).and_then(Value::as_object).is_some_and(|o| o.keys().collect::<BTreeSet<_>>() == keys))
        });
        for episode in &mut out {
            episode.retain(|name, _| common.contains_key(name));
        }
    }
    Ok(out)
}

/// The `stats.json` entry of a scalar feature with these `values` (a renumbered index column
/// of an export): every statistic a one-element list.
pub fn scalar_entry(values: &mut [f64]) -> Value {
    let mut entry = Map::new();
    if let Some(s) = lake_ingest::feature_stats::summarise(values) {
        for (stat, v) in ["min", "max", "mean", "std"].into_iter().zip([s.min, s.max, s.mean, s.std]) {
            entry.insert(stat.into(), Value::Array(vec![lake_schemas::pyjson::number(v)]));
        }
        for ((q, _), v) in QUANTILES.iter().zip(s.quantiles) {
            entry.insert((*q).into(), Value::Array(vec![lake_schemas::pyjson::number(v)]));
        }
        entry.insert("count".into(), Value::from(vec![s.count]));
    }
    Value::Object(entry)
}

/// Like [`dataset_rows`], computed over the steps of `episodes` (exact, from the steps table,
/// streamed in bounded memory).
async fn subset_rows(
    lake: &Lake,
    record: &lake_schemas::CommitRecord,
    episodes: &BTreeSet<i64>,
    stat_names: &[&str],
) -> Result<Vec<(String, Vec<Vec<f64>>, i64)>> {
    use lake_ingest::feature_stats::{Limits, Over, compute};
    use lake_schemas::tables::STEPS;
    let schema = arrow::datatypes::Schema::from(lake_store::open_table(lake, record, STEPS).await?.schema());
    let uri = lake.uri(&record.tables.path(STEPS));
    let batch = compute(&uri, &schema, Over::Episodes(episodes), Limits::default())
        .await
        .map_err(|e| Error::Invalid(format!("{}@{}: {e}", record.name, record.version)))?;
    Ok(dataset_rows(&[batch], stat_names))
}

/// The `image_stats` table `lake stats --images` wrote beside a version, at `uri`.
async fn read_image_stats(record: &lake_schemas::CommitRecord, uri: &str) -> Result<Vec<arrow::array::RecordBatch>> {
    let schema = lake_schemas::tables::feature_stats_schema();
    let columns: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    lake_store::read_columns_at(uri, &columns)
        .await
        .map_err(|e| Error::Invalid(format!("{}@{}: {e} (`lake stats --images` makes it again)", record.name, record.version)))
}

/// One episode's statistics of a feature: statistic name → (values, shape).
pub(crate) type EpisodeStats = BTreeMap<String, (Vec<f64>, Vec<usize>)>;

/// Dataset-level statistics from per-episode ones, as LeRobot's `aggregate_stats` makes them:
/// element-wise min and max, means weighted by count, the pooled standard deviation (each
/// episode's variance plus its mean's squared distance from the total mean, weighted by count),
/// counts summed, and quantiles as count-weighted means of the episodes' quantiles (an
/// approximation LeRobot makes; lake's own numeric statistics are exact). `None` when an
/// episode lacks min, max, mean, std or count, or their sizes disagree.
pub(crate) fn aggregate(episodes: &[EpisodeStats]) -> Option<Map<String, Value>> {
    let first = episodes.first()?;
    let (_, shape) = first.get("mean")?;
    let n = first.get("mean")?.0.len();
    let counts: Vec<f64> = episodes.iter().map(|e| e.get("count").and_then(|(c, _)| c.first().copied())).collect::<Option<_>>()?;
    let total: f64 = counts.iter().sum();
    let stack = |stat: &str| {
        episodes.iter().map(|e| e.get(stat).map(|(v, _)| v.as_slice()).filter(|v| v.len() == n)).collect::<Option<Vec<&[f64]>>>()
    };
    let (mins, maxs, means, stds) = (stack("min")?, stack("max")?, stack("mean")?, stack("std")?);
    let fold = |rows: &[&[f64]], f: fn(f64, f64) -> f64| -> Vec<f64> {
        (0..n).map(|j| rows.iter().map(|r| r[j]).reduce(f).unwrap_or(f64::NAN)).collect()
    };
    let weighted =
        |rows: &[&[f64]]| -> Vec<f64> { (0..n).map(|j| rows.iter().zip(&counts).map(|(r, c)| r[j] * c).sum::<f64>() / total).collect() };
    let mean = weighted(&means);
    let std: Vec<f64> = (0..n)
        .map(|j| {
            let pooled: f64 = means.iter().zip(&stds).zip(&counts).map(|((m, s), c)| (s[j] * s[j] + (m[j] - mean[j]).powi(2)) * c).sum();
            (pooled / total).sqrt()
        })
        .collect();
    let mut entry = Map::new();
    entry.insert("min".into(), nest(&fold(&mins, f64::min), shape));
    entry.insert("max".into(), nest(&fold(&maxs, f64::max), shape));
    entry.insert("mean".into(), nest(&mean, shape));
    entry.insert("std".into(), nest(&std, shape));
    entry.insert("count".into(), Value::from(vec![total as i64]));
    let quantiles = first.keys().filter(|k| k.strip_prefix('q').is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit())));
    for q in quantiles {
        if let Some(rows) = stack(q) {
            entry.insert(q.clone(), nest(&weighted(&rows), shape));
        }
    }
    Some(entry)
}

/// The dataset-level rows (null `episode_index`) of a `feature_stats`-shaped table as
/// `(feature, values per statistic in dimension order, count)`, features in table order.
fn dataset_rows(batches: &[arrow::array::RecordBatch], stat_names: &[&str]) -> Vec<(String, Vec<Vec<f64>>, i64)> {
    let mut features: Vec<(String, Vec<Vec<f64>>, i64)> = Vec::new();
    for batch in batches {
        let episode = batch.column_by_name("episode_index").expect("feature_stats schema");
        let feature = batch.column_by_name("feature").expect("feature_stats schema").as_string::<i32>();
        let count = batch.column_by_name("count").expect("feature_stats schema").as_primitive::<Int64Type>();
        let stats: Vec<_> =
            stat_names.iter().map(|s| batch.column_by_name(s).expect("feature_stats schema").as_primitive::<Float64Type>()).collect();
        for row in (0..batch.num_rows()).filter(|&r| episode.is_null(r)) {
            let name = feature.value(row);
            if features.last().is_none_or(|(n, ..)| n != name) {
                features.push((name.to_string(), vec![Vec::new(); stat_names.len()], count.value(row)));
            }
            let (_, values, _) = features.last_mut().expect("pushed above");
            for (v, col) in values.iter_mut().zip(&stats) {
                v.push(if col.is_null(row) { f64::NAN } else { col.value(row) });
            }
        }
    }
    features
}

/// Declared shapes of features from `info.json`.
fn feature_shapes(info: &Value) -> std::collections::HashMap<String, Vec<usize>> {
    let mut out = std::collections::HashMap::new();
    if let Some(features) = info.get("features").and_then(Value::as_object) {
        for (name, f) in features {
            if let Some(shape) = f.get("shape").and_then(Value::as_array) {
                out.insert(name.clone(), shape.iter().filter_map(Value::as_u64).map(|d| d as usize).collect());
            }
        }
    }
    out
}

/// LeRobot's frame subsample of an episode of `len` frames (`sample_indices` in its
/// `compute_stats.py`): `max(min(100, len), min(len^0.75, 10 000))` positions spread evenly from
/// the first frame to the last, rounded half to even.
pub fn sample_positions(len: u64) -> Vec<u64> {
    if len == 0 {
        return Vec::new();
    }
    let n = (len.min(100)).max(((len as f64).powf(0.75) as u64).min(10_000));
    if n == 1 {
        return vec![0];
    }
    (0..n).map(|i| (i as f64 * (len - 1) as f64 / (n - 1) as f64).round_ties_even() as u64).collect()
}

/// LeRobot's stride for statistics frames (`auto_downsample_height_width`): none below 300
/// pixels, else the longer side over 150, rounded down.
pub fn downsample_stride(height: u32, width: u32) -> usize {
    if height.max(width) < 300 {
        return 1;
    }
    (if width > height { width / 150 } else { height / 150 }).max(1) as usize
}

/// Per-channel histograms of 8-bit pixel values over some frames.
#[derive(Debug, Clone)]
struct ChannelHistograms {
    counts: [[u64; 256]; 3],
    frames: u64,
}

impl Default for ChannelHistograms {
    fn default() -> Self {
        Self { counts: [[0; 256]; 3], frames: 0 }
    }
}

impl ChannelHistograms {
    /// Adds an HWC RGB frame, every `stride`-th row and column (as LeRobot samples them).
    fn add(&mut self, hwc: &[u8], height: usize, width: usize, stride: usize) {
        for y in (0..height).step_by(stride) {
            let row = &hwc[y * width * 3..(y + 1) * width * 3];
            for x in (0..width).step_by(stride) {
                for c in 0..3 {
                    self.counts[c][row[x * 3 + c] as usize] += 1;
                }
            }
        }
        self.frames += 1;
    }

    fn merge(&mut self, other: &Self) {
        for (mine, theirs) in self.counts.iter_mut().zip(&other.counts) {
            for (a, b) in mine.iter_mut().zip(theirs) {
                *a += b;
            }
        }
        self.frames += other.frames;
    }

    /// Statistics of channel `c`, in [0, 1] (value / 255); `count` is the number of frames, as
    /// LeRobot counts them for images. Quantiles are exact over the sampled pixels.
    fn summary(&self, c: usize) -> Option<lake_ingest::feature_stats::Summary> {
        let hist = &self.counts[c];
        let n: u64 = hist.iter().sum();
        if n == 0 {
            return None;
        }
        let value_at = |rank: u64| {
            let mut seen = 0;
            for (v, &count) in hist.iter().enumerate() {
                seen += count;
                if seen > rank {
                    return v as f64;
                }
            }
            255.0
        };
        let mean = hist.iter().enumerate().map(|(v, &k)| v as f64 * k as f64).sum::<f64>() / n as f64;
        let var = hist.iter().enumerate().map(|(v, &k)| (v as f64 - mean).powi(2) * k as f64).sum::<f64>() / n as f64;
        let quantile = |p: f64| {
            let h = (n - 1) as f64 * p;
            let lo = h.floor() as u64;
            lake_ingest::feature_stats::lerp(value_at(lo), value_at((lo + 1).min(n - 1)), h - lo as f64)
        };
        let min = hist.iter().position(|&k| k > 0).unwrap_or(0) as f64;
        let max = hist.iter().rposition(|&k| k > 0).unwrap_or(255) as f64;
        Some(lake_ingest::feature_stats::Summary {
            count: self.frames as i64,
            min: min / 255.0,
            max: max / 255.0,
            mean: mean / 255.0,
            std: var.sqrt() / 255.0,
            quantiles: QUANTILES.map(|(_, p)| quantile(p) / 255.0),
        })
    }
}

/// What `lake stats --images` computed.
#[derive(Debug, Clone, Default)]
pub struct ImageStatsReport {
    /// Cameras.
    pub cameras: usize,
    /// Frames decoded (all cameras).
    pub frames: u64,
    /// Episodes left out because they were ingested without some camera's video
    /// (`--missing-video keep-rows`).
    pub episodes_without_video: usize,
}

/// Computes per-channel statistics of every camera over LeRobot's frame subsample of each
/// episode (decoded as the loader decodes them) and stores them as `image_stats` beside the
/// version: per episode, and for the whole dataset over every sampled frame (exact, not
/// LeRobot's envelope of per-episode quantiles).
///
/// # Errors
/// When the dataset cannot be opened, a frame cannot be decoded, or the table cannot be written.
pub async fn write_image_stats(lake: &Lake, spec: &str) -> Result<ImageStatsReport> {
    use lake_loader::{Draw, Loader, LoaderDataset, LoaderOptions, Preset, Windows};
    let ds = LoaderDataset::open(lake, spec).await?;
    let loader =
        Loader::new(vec![ds.clone()], &Windows::Preset(Preset::None), LoaderOptions { threads: 0, cache_bytes: 0, frame_table: true })?;
    let cameras: Vec<(String, usize, usize, usize)> =
        ds.cameras.iter().map(|c| (c.key.clone(), c.height as usize, c.width as usize, downsample_stride(c.height, c.width))).collect();
    let mut rows = Vec::new();
    let mut totals = vec![ChannelHistograms::default(); cameras.len()];
    let mut report = ImageStatsReport { cameras: cameras.len(), ..ImageStatsReport::default() };
    for episode in &ds.episodes {
        if ds.cameras.iter().any(|c| c.packet_row(episode.first_row as usize).is_none()) {
            report.episodes_without_video += 1;
            continue;
        }
        let draws: Vec<Draw> = sample_positions(episode.len).into_iter().map(|p| Draw { source: 0, row: episode.first_row + p }).collect();
        let mut hists = vec![ChannelHistograms::default(); cameras.len()];
        for chunk in draws.chunks(64) {
            let batch = loader.batch(chunk).await?;
            for (i, (key, height, width, stride)) in cameras.iter().enumerate() {
                let column = batch.column_by_name(key).ok_or_else(|| Error::Invalid(format!("{}: no frames of {key}", ds.label)))?;
                let frames = column.as_fixed_size_list();
                let bytes = frames.values().as_primitive::<arrow::datatypes::UInt8Type>().values();
                let size = height * width * 3;
                for r in 0..frames.len() {
                    hists[i].add(&bytes[r * size..(r + 1) * size], *height, *width, *stride);
                }
                report.frames += frames.len() as u64;
            }
        }
        for (i, (key, ..)) in cameras.iter().enumerate() {
            for c in 0..3 {
                rows.push((Some(episode.episode_index), key.clone(), c, hists[i].summary(c)));
            }
            totals[i].merge(&hists[i]);
        }
    }
    for (i, (key, ..)) in cameras.iter().enumerate() {
        for c in 0..3 {
            rows.push((None, key.clone(), c, totals[i].summary(c)));
        }
    }
    let batch = lake_ingest::feature_stats::rows_batch(rows).map_err(|e| Error::Invalid(format!("{}: {e}", ds.label)))?;
    let table = lake.derived_table(&ds.record.tables.dir, lake_schemas::tables::IMAGE_STATS);
    table.write(batch.schema(), vec![batch]).await?;
    table.publish().await?;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_episode_statistics_aggregate_like_pooling_the_values() {
        // Two episodes of a 2-channel feature, from their values: [0, 2] and [4, 4, 4, 8] in
        // channel 0; channel 1 twice that.
        let episode = |values: &[f64], q50: f64| -> EpisodeStats {
            let n = values.len() as f64;
            let mean = values.iter().sum::<f64>() / n;
            let std = (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n).sqrt();
            let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let two = |x: f64| (vec![x, 2.0 * x], vec![2, 1, 1]);
            [("min", two(lo)), ("max", two(hi)), ("mean", two(mean)), ("std", two(std)), ("q50", two(q50)), ("count", (vec![n], vec![1]))]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect()
        };
        let all = [0.0, 2.0, 4.0, 4.0, 4.0, 8.0];
        let entry = aggregate(&[episode(&all[..2], 1.0), episode(&all[2..], 4.0)]).expect("aggregates");
        let mean = all.iter().sum::<f64>() / 6.0;
        let std = (all.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / 6.0).sqrt();
        let channels = |v: &Value| -> Vec<f64> { v.as_array().unwrap().iter().map(|c| c[0][0].as_f64().unwrap()).collect() };
        assert_eq!(channels(&entry["min"]), [0.0, 0.0]);
        assert_eq!(channels(&entry["max"]), [8.0, 16.0]);
        assert_eq!(channels(&entry["mean"]), [mean, 2.0 * mean]);
        let got = channels(&entry["std"]);
        assert!((got[0] - std).abs() < 1e-12 && (got[1] - 2.0 * std).abs() < 1e-12, "{got:?} vs {std}");
        assert_eq!(channels(&entry["q50"]), [3.0, 6.0], "quantiles: count-weighted means, as LeRobot aggregates them");
        assert_eq!(entry["count"], serde_json::json!([6]));
        let mut partial = episode(&all[2..], 4.0);
        partial.remove("std");
        assert!(aggregate(&[episode(&all[..2], 1.0), partial]).is_none(), "an episode without std cannot be pooled");
    }

    #[test]
    fn subsample_matches_lerobot_counts_and_spacing() {
        // numpy: np.round(np.linspace(0, n - 1, k)) with LeRobot's k.
        assert_eq!(sample_positions(5), vec![0, 1, 2, 3, 4]);
        assert_eq!(sample_positions(99).len(), 99);
        assert_eq!(sample_positions(104).len(), 100);
        assert_eq!(sample_positions(1000).len(), 177);
        assert_eq!(sample_positions(20_000).len(), 1681);
        let p = sample_positions(104);
        assert_eq!((p[0], p[1], p[2], p[99]), (0, 1, 2, 103));
        assert_eq!(p[50], 52); // 50 · 103/99 = 52.02
        assert_eq!(downsample_stride(480, 640), 4);
        assert_eq!(downsample_stride(96, 128), 1);
    }

    #[test]
    fn histogram_statistics_equal_sorting_the_pixels() {
        let (h, w) = (7, 5);
        let frame: Vec<u8> = (0..h * w * 3).map(|i| ((i * 37 + i / 3 * 11) % 251) as u8).collect();
        let mut hist = ChannelHistograms::default();
        hist.add(&frame, h, w, 2);
        for c in 0..3 {
            let mut values: Vec<f64> = (0..h)
                .step_by(2)
                .flat_map(|y| (0..w).step_by(2).map(move |x| (y, x)))
                .map(|(y, x)| f64::from(frame[(y * w + x) * 3 + c]))
                .collect();
            let want = lake_ingest::feature_stats::summarise(&mut values).expect("values");
            let got = hist.summary(c).expect("pixels");
            assert_eq!(got.count, 1, "count is frames");
            for (g, w) in [got.min, got.max, got.mean, got.std]
                .into_iter()
                .chain(got.quantiles)
                .zip([want.min, want.max, want.mean, want.std].into_iter().chain(want.quantiles))
            {
                assert!((g - w / 255.0).abs() < 1e-12, "channel {c}: {g} vs {}", w / 255.0);
            }
        }
    }
}
