//! Statistics in LeRobot's `meta/stats.json` layout: lake's exact ones for numeric features
//! (`feature_stats`), the source's stored ones for cameras (lake does not decode frames at
//! ingest).

use arrow::{
    array::{Array, AsArray},
    datatypes::{Float64Type, Int64Type},
};
use lake_store::Lake;
use serde_json::{Map, Value};

use crate::{Error, Result};

/// Nests flat `values` by `shape` (a scalar feature is a one-element list, as LeRobot writes).
fn nest(values: &[f64], shape: &[usize]) -> Value {
    match shape {
        [] | [_] => Value::from(values.to_vec()),
        [_, rest @ ..] => {
            let inner: usize = rest.iter().product();
            Value::Array(values.chunks(inner.max(1)).map(|c| nest(c, rest)).collect())
        }
    }
}

/// The dataset-level statistics of a version as LeRobot's `stats.json` object.
///
/// # Errors
/// When the version has no `feature_stats` table (ingested by an older lake) or a table cannot
/// be read.
pub async fn stats_json(lake: &Lake, record: &lake_schemas::CommitRecord) -> Result<Value> {
    use lake_schemas::tables::{FEATURE_STATS, QUANTILES, STATS};
    let mut out = Map::new();
    if !record.tables.tables.iter().any(|t| t == FEATURE_STATS) {
        return Err(Error::Invalid(format!(
            "{}@{} was ingested before lake computed exact statistics; ingest it again",
            record.name, record.version
        )));
    }
    let shapes = feature_shapes(&record.info);
    // Exact statistics of numeric features: dataset rows, by feature then dimension.
    let mut features: Vec<(String, Vec<Vec<f64>>, i64)> = Vec::new();
    let stat_names: Vec<&str> = ["min", "max", "mean", "std"].into_iter().chain(QUANTILES.iter().map(|(q, _)| *q)).collect();
    for batch in lake_store::read_table(lake, record, FEATURE_STATS).await? {
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
    for (name, values, count) in features {
        let shape = shapes.get(&name).cloned().unwrap_or_default();
        let mut entry = Map::new();
        for (stat, v) in stat_names.iter().zip(&values) {
            entry.insert(stat.to_string(), nest(v, &shape));
        }
        entry.insert("count".into(), Value::from(vec![count]));
        out.insert(name, Value::Object(entry));
    }
    // Cameras: the statistics the source stored (lake does not decode frames at ingest).
    for batch in lake_store::read_table(lake, record, STATS).await? {
        let episode = batch.column_by_name("episode_index").expect("stats schema");
        let feature = batch.column_by_name("feature").expect("stats schema").as_string::<i32>();
        let stat = batch.column_by_name("stat").expect("stats schema").as_string::<i32>();
        let values = batch.column_by_name("values").expect("stats schema").as_list::<i32>();
        let shape = batch.column_by_name("shape").expect("stats schema").as_list::<i32>();
        for row in (0..batch.num_rows()).filter(|&r| episode.is_null(r)) {
            let name = feature.value(row);
            if out.get(name).is_some_and(|e| !e.as_object().is_some_and(|o| o.contains_key("camera"))) {
                continue; // numeric: lake's exact statistics above win
            }
            let v: Vec<f64> = values.value(row).as_primitive::<Float64Type>().iter().map(|x| x.unwrap_or(f64::NAN)).collect();
            let s: Vec<usize> = shape.value(row).as_primitive::<Int64Type>().iter().map(|x| x.unwrap_or(1) as usize).collect();
            let entry = out.entry(name.to_string()).or_insert_with(|| serde_json::json!({"camera": true}));
            let value =
                if stat.value(row) == "count" { Value::from(v.iter().map(|c| *c as i64).collect::<Vec<_>>()) } else { nest(&v, &s) };
            entry.as_object_mut().expect("object").insert(stat.value(row).to_string(), value);
        }
    }
    for entry in out.values_mut() {
        entry.as_object_mut().expect("object").remove("camera");
    }
    Ok(Value::Object(out))
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
