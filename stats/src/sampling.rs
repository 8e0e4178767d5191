//! What a trainer builds its policy from, for the datasets a sampling request draws: the frame
//! rate, the features as samples carry them, and the statistics of the steps sampled (a
//! mixture's combined as LeRobot's `aggregate_stats` combines them). `lake serve` hands these to
//! remote trainers, which need not read the lake.

use std::collections::BTreeSet;

use lake_loader::views::{self, SamplingSpec};
use lake_store::Lake;
use serde_json::{Map, Value};

use crate::{
    Error, Result,
    lerobot::{EpisodeStats, aggregate, stats_json},
};

/// The facts of the datasets a request samples.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SamplingFacts {
    /// Frames per second (every dataset's: a mixture of rates is refused).
    pub fps: f64,
    /// The first dataset's `info.json` features as samples carry them: a view's mapping
    /// applied, cameras ingest left out removed, index columns kept as LeRobot lists them.
    pub features: Value,
    /// Statistics over the steps sampled, in LeRobot's `stats.json` layout.
    pub stats: Value,
    /// The sampled datasets, `NAME@VERSION`.
    pub datasets: Vec<String>,
}

/// The facts of the datasets `spec` samples, read from the lake.
///
/// # Errors
/// [`Error::Loader`] for a dataset that cannot be opened, [`Error::Invalid`] for a mixture whose
/// datasets differ in rate or in the features their samples carry, and unreadable statistics.
pub async fn sampling_facts(lake: &Lake, spec: &SamplingSpec) -> Result<SamplingFacts> {
    let sampling = views::open_sampling(lake, spec).await?;
    let first = sampling.datasets.first().ok_or_else(|| Error::Invalid("the request samples no dataset".into()))?;
    let fps = f64::from(first.fps());
    let features = carried_features(first);
    let mut parts = Vec::new();
    for ds in &sampling.datasets {
        if f64::from(ds.fps()) != fps {
            return Err(Error::Invalid(format!(
                "{} runs at {} fps and {} at {fps}: a policy's windows are in seconds of one rate",
                ds.label,
                ds.fps(),
                first.label
            )));
        }
        let theirs = carried_features(ds);
        if let Some(key) = differing(&features, &theirs) {
            return Err(Error::Invalid(format!(
                "{} and {} have different features (`{key}` first); a mixture's samples must have the same keys and shapes",
                first.label, ds.label
            )));
        }
        let whole = ds.episodes.len() as u64 == ds.record.counts.episodes;
        let episodes: BTreeSet<i64> = ds.episodes.iter().map(|e| e.episode_index).collect();
        let stats = stats_json(lake, &ds.record, (!whole).then_some(&episodes)).await?;
        let steps: u64 = ds.episodes.iter().map(|e| e.len).sum();
        parts.push((ds.features.stats(&stats), steps));
    }
    let stats = if parts.len() == 1 { parts.remove(0).0 } else { combine(&parts) };
    Ok(SamplingFacts { fps, features, stats, datasets: sampling.datasets.iter().map(|d| d.label.clone()).collect() })
}

/// A dataset's `info.json` features as its samples carry them: mapped by its view, and without
/// the cameras ingest left out (`--drop-missing-cameras`).
fn carried_features(ds: &lake_loader::LoaderDataset) -> Value {
    let mapped = ds.features.info_features(&ds.record.info["features"]);
    let cameras: BTreeSet<&str> = ds.cameras.iter().map(|c| c.key.as_str()).collect();
    let Value::Object(all) = mapped else { return mapped };
    let kept = all.into_iter().filter(|(key, f)| !matches!(f["dtype"].as_str(), Some("video" | "image")) || cameras.contains(key.as_str()));
    Value::Object(kept.collect())
}

/// The first key whose dtype or shape differs between two features objects, or that one lacks
/// (the index columns, which every sample carries with one type, aside).
fn differing(a: &Value, b: &Value) -> Option<String> {
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else { return Some("features".into()) };
    let shape = |f: &Value| (f["dtype"].clone(), f["shape"].clone());
    a.keys()
        .chain(b.keys())
        .filter(|k| !lake_schemas::tables::INDEX_COLUMNS.contains(&k.as_str()))
        .find(|k| a.get(*k).map(shape) != b.get(*k).map(shape))
        .cloned()
}

/// Combines per-dataset statistics (each with its steps) as LeRobot combines a mixture's: each
/// dataset's as one episode of LeRobot's `aggregate_stats` ([`aggregate`]). A feature
/// some dataset has no usable statistics of is left out.
fn combine(parts: &[(Value, u64)]) -> Value {
    let mut out = Map::new();
    let Some(first) = parts.first().and_then(|(s, _)| s.as_object()) else { return Value::Object(out) };
    for feature in first.keys() {
        let each: Option<Vec<EpisodeStats>> = parts.iter().map(|(s, steps)| as_episode_stats(s.get(feature)?, *steps)).collect();
        if let Some(entry) = each.as_deref().and_then(aggregate) {
            out.insert(feature.clone(), Value::Object(entry));
        }
    }
    Value::Object(out)
}

/// One feature's `stats.json` entry as statistic → (values, shape); `count`, when absent, the
/// dataset's steps.
fn as_episode_stats(entry: &Value, steps: u64) -> Option<EpisodeStats> {
    let mut out = EpisodeStats::new();
    for (stat, values) in entry.as_object()? {
        let mut flat = Vec::new();
        flatten(values, &mut flat)?;
        out.insert(stat.clone(), (flat, shape_of(values)));
    }
    out.entry("count".into()).or_insert_with(|| (vec![steps as f64], vec![1]));
    Some(out)
}

fn flatten(v: &Value, out: &mut Vec<f64>) -> Option<()> {
    match v {
        Value::Array(items) => items.iter().try_for_each(|i| flatten(i, out)),
        other => {
            out.push(lake_schemas::pyjson::as_f64(other)?);
            Some(())
        }
    }
}

/// The nesting of a list of lists (`[[[0.5]], [[0.2]], [[0.1]]]` is `[3, 1, 1]`).
fn shape_of(v: &Value) -> Vec<usize> {
    let mut shape = Vec::new();
    let mut at = v;
    while let Value::Array(items) = at {
        shape.push(items.len());
        let Some(first) = items.first() else { break };
        at = first;
    }
    shape
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_mixtures_stats_combine_as_one_dataset_of_all_the_steps_would() {
        // Two datasets of one feature: [0, 2] (mean 1, std 1) and [4, 6, 8] (mean 6, std √(8/3)).
        let a = json!({"x": {"mean": [1.0], "std": [1.0], "min": [0.0], "max": [2.0], "count": [2]}});
        let b = json!({"x": {"mean": [6.0], "std": [(8.0f64 / 3.0).sqrt()], "min": [4.0], "max": [8.0], "count": [3]}});
        let all = combine(&[(a, 0), (b, 0)]);
        let values = [0.0, 2.0, 4.0, 6.0, 8.0];
        let mean = values.iter().sum::<f64>() / 5.0;
        let std = (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / 5.0).sqrt();
        let got = |stat: &str| all["x"][stat][0].as_f64().expect("a number");
        assert!((got("mean") - mean).abs() < 1e-12 && (got("std") - std).abs() < 1e-12, "{all}");
        assert_eq!((got("min"), got("max"), got("count")), (0.0, 8.0, 5.0));
    }

    #[test]
    fn nested_stats_keep_their_shape() {
        let channels = |v: f64| json!([[[v]], [[v]], [[v]]]);
        let a = json!({"cam": {"mean": [[[0.5]], [[0.25]], [[0.0]]], "std": channels(1.0), "min": channels(0.0), "max": channels(1.0), "count": [1]}});
        let all = combine(&[(a.clone(), 0), (a, 0)]);
        assert_eq!(all["cam"]["mean"], json!([[[0.5]], [[0.25]], [[0.0]]]));
    }

    #[test]
    fn features_differ_by_key_dtype_or_shape() {
        let a = json!({"action": {"dtype": "float32", "shape": [6]}, "state": {"dtype": "float32", "shape": [6]}});
        assert_eq!(differing(&a, &a), None);
        let b = json!({"action": {"dtype": "float32", "shape": [7]}, "state": {"dtype": "float32", "shape": [6]}});
        assert_eq!(differing(&a, &b).as_deref(), Some("action"));
        let c = json!({"action": {"dtype": "float32", "shape": [6]}});
        assert_eq!(differing(&a, &c).as_deref(), Some("state"));
    }
}
