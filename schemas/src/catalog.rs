//! Catalog records: one JSON document per committed dataset version.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// Where a committed version's tables live, relative to the lake root.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableSet {
    /// Directory holding `<table>.lance` for every table of the version.
    pub dir: String,
    /// Table names present in `dir`.
    pub tables: Vec<String>,
    /// Every file of those tables as the ingest wrote it, sorted by path: what `lake verify`
    /// checks them against. Empty in versions committed before lake recorded them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<TableFile>,
}

/// One file of a committed table, as written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableFile {
    /// Its path relative to the version's directory (`steps.lance/data/….lance`).
    pub path: String,
    /// Its size in bytes.
    pub bytes: u64,
    /// `blake3:<hex>` of its bytes.
    pub blake3: String,
}

impl TableSet {
    /// Path of `table`, relative to the lake root.
    pub fn path(&self, table: &str) -> String {
        format!("{}/{table}.lance", self.dir)
    }
}

/// Where a version came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SourceRecord {
    /// The source location as given (a path or URL).
    pub url: String,
    /// LeRobot `codebase_version` of the source.
    pub codebase_version: String,
    /// `blake3:<hex>` over every source file lake read (relative path, size, bytes).
    pub content_hash: String,
    /// `blake3:<hex>` over (relative path, size, modification time) of the same files: a cheap
    /// check that the source did not change.
    pub fingerprint: String,
    /// Number of source files read.
    pub files: u64,
    /// Bytes of source files read.
    pub bytes: u64,
}

/// Options that change what ingest produces; a re-ingest with different options is a new version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IngestOptions {
    /// Largest distance (seconds) between a step's query time and its video frame.
    pub tolerance_s: f64,
    /// Whether bad episodes were left out instead of refusing the dataset.
    pub skip_bad_episodes: bool,
    /// Whether cameras with no video files at all were left out.
    pub drop_missing_cameras: bool,
    /// Whether episodes whose video files are missing kept their rows (without frames of those
    /// cameras) instead of being refused.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub keep_rows_without_video: bool,
}

/// Row counts of a committed version.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableCounts {
    /// Episodes ingested.
    pub episodes: u64,
    /// Steps (frames of the data parquet) ingested.
    pub steps: u64,
    /// Compressed packets (video frames and encoded images) stored.
    pub packets: u64,
    /// Camera streams (one per camera and source file).
    pub streams: u64,
    /// Cameras ingested (video and image).
    pub cameras: u64,
    /// Tasks.
    pub tasks: u64,
    /// Episodes left out by `--skip-bad-episodes`.
    pub skipped_episodes: u64,
    /// Findings by severity name.
    pub findings: BTreeMap<String, u64>,
}

/// The commit record of one dataset version: written once, with create-if-absent semantics, as
/// `catalog/<name>/<version>.json`. Its existence is what makes the version visible.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CommitRecord {
    /// Lake format version of the tables.
    pub format_version: u32,
    /// Dataset name.
    pub name: String,
    /// Version number, starting at 1.
    pub version: u64,
    /// When the version was committed.
    pub committed_at: DateTime<Utc>,
    /// How long the ingest took, in seconds.
    pub ingest_seconds: f64,
    /// The tables.
    pub tables: TableSet,
    /// The source.
    pub source: SourceRecord,
    /// The options used.
    pub options: IngestOptions,
    /// Row counts.
    pub counts: TableCounts,
    /// Frames per second.
    pub fps: u32,
    /// Robot type from `info.json`.
    pub robot_type: Option<String>,
    /// The source `meta/info.json`, verbatim.
    pub info: serde_json::Value,
    /// `blake3:<hex>` of the record's other fields (its JSON without this one, compact, keys
    /// sorted), set when it is committed: `lake verify` tells a record changed after its commit.
    /// Absent in records committed before lake set it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
}

/// One dataset version a view selects from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ViewDataset {
    /// Dataset name.
    pub name: String,
    /// The version current when the view was made; the view keeps reading it.
    pub version: u64,
    /// Mixture weight of this dataset when the view is sampled (default 1).
    pub weight: f64,
    /// Selected episode indices, ascending.
    pub episodes: Vec<i64>,
    /// How samples present this dataset's features (renamed, cut to some dimensions, left out).
    #[serde(default, skip_serializing_if = "FeatureMap::is_empty")]
    pub features: FeatureMap,
}

/// How a view presents one dataset's features in samples, so that datasets recorded under other
/// names or with other dimensions stack in one mixture: `actions` served as `action`, the first 6
/// of 14 state dimensions, a camera the others lack left out. Steps, SQL and the stored data are
/// unchanged; only samples (and the statistics a trainer normalises them with) see the mapping.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FeatureMap {
    /// Stored LeRobot key → the key samples carry.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub rename: BTreeMap<String, String>,
    /// Key as samples carry it (after renaming) → the dimensions kept, in this order, of a
    /// one-dimensional feature.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub dims: BTreeMap<String, Vec<usize>>,
    /// Stored LeRobot keys left out of samples.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drop: Vec<String>,
}

impl FeatureMap {
    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        self.rename.is_empty() && self.dims.is_empty() && self.drop.is_empty()
    }

    /// The key samples carry for stored key `key`, or `None` when it is left out.
    pub fn key<'a>(&'a self, key: &'a str) -> Option<&'a str> {
        if self.drop.iter().any(|d| d == key) {
            return None;
        }
        Some(self.rename.get(key).map_or(key, String::as_str))
    }

    /// The dimensions kept of the feature samples carry as `key`, when cut.
    pub fn dims_of(&self, key: &str) -> Option<&[usize]> {
        self.dims.get(key).map(Vec::as_slice)
    }

    /// `info.json`'s `features` object as samples see it: keys renamed, dropped ones left out,
    /// and a cut feature's shape the number of dimensions kept.
    pub fn info_features(&self, features: &serde_json::Value) -> serde_json::Value {
        let Some(all) = features.as_object() else { return features.clone() };
        let mut out = serde_json::Map::new();
        for (stored, feature) in all {
            let Some(key) = self.key(stored) else { continue };
            let mut feature = feature.clone();
            if let Some(dims) = self.dims_of(key) {
                feature["shape"] = serde_json::json!([dims.len()]);
                if let Some(names) = feature.get("names").and_then(serde_json::Value::as_array).filter(|n| n.len() > 1) {
                    let names: Vec<serde_json::Value> = dims.iter().filter_map(|&d| names.get(d).cloned()).collect();
                    feature["names"] = serde_json::Value::Array(names);
                }
            }
            out.insert(key.to_string(), feature);
        }
        serde_json::Value::Object(out)
    }

    /// LeRobot `stats.json`-layout statistics (`{key: {stat: values}}`) as samples see them: keys
    /// renamed, dropped ones left out, and each per-dimension statistic cut to the kept
    /// dimensions (`count`, one number for all dimensions, stays).
    pub fn stats(&self, stats: &serde_json::Value) -> serde_json::Value {
        let Some(all) = stats.as_object() else { return stats.clone() };
        let mut out = serde_json::Map::new();
        for (stored, per_stat) in all {
            let Some(key) = self.key(stored) else { continue };
            let mut per_stat = per_stat.clone();
            if let (Some(dims), Some(stats)) = (self.dims_of(key), per_stat.as_object_mut()) {
                for (stat, values) in stats.iter_mut() {
                    if let Some(list) = values.as_array().filter(|l| stat != "count" && l.len() > 1) {
                        *values = serde_json::Value::Array(dims.iter().filter_map(|&d| list.get(d).cloned()).collect());
                    }
                }
            }
            out.insert(key.to_string(), per_stat);
        }
        serde_json::Value::Object(out)
    }
}

/// A named training set: the episodes a SQL query selected, pinned to the dataset versions
/// current when it ran. Every `lake view create` (and `--replace`) of a name stores a new
/// version, `views/<name>/v00000001.json` and on; older versions stay readable as
/// `NAME@VERSION`, so a stream that pinned one keeps drawing what it drew.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ViewRecord {
    /// View name (same rules as dataset names; never the name of a dataset).
    pub name: String,
    /// Version of this view (1 for the first `lake view create` of the name); set by the
    /// store from the record's path.
    #[serde(default)]
    pub version: u64,
    /// A removal (`lake view drop`): the view has no current version, yet its number is not
    /// given again, so `NAME@VERSION` never comes to mean another selection.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dropped: bool,
    /// The query that made it.
    pub sql: String,
    /// When it was made.
    pub created_at: DateTime<Utc>,
    /// Every dataset of the lake at that moment, as `name@version`: the lake version the view was
    /// made at.
    pub lake_versions: Vec<String>,
    /// What it selects, per dataset, sorted by name.
    pub datasets: Vec<ViewDataset>,
    /// `blake3:<hex>` of the record's other fields (its JSON without this one, compact, keys
    /// sorted), set when the store writes it: `lake verify` tells a record changed after it was
    /// written. Absent in records written before lake set it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
}

impl ViewRecord {
    /// Selected episodes over all datasets.
    pub fn episode_count(&self) -> usize {
        self.datasets.iter().map(|d| d.episodes.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::FeatureMap;

    #[test]
    fn a_feature_map_renames_cuts_and_drops_features_and_their_statistics() {
        let map = FeatureMap {
            rename: [("actions".to_string(), "action".to_string())].into(),
            dims: [("action".to_string(), vec![2, 0])].into(),
            drop: vec!["image".into()],
        };
        assert_eq!(map.key("actions"), Some("action"));
        assert_eq!(map.key("image"), None);
        assert_eq!(map.key("state"), Some("state"));
        let stats =
            json!({"actions": {"mean": [1.0, 2.0, 3.0], "count": [10]}, "image": {"mean": [[[0.5]]]}, "state": {"min": [0.0, 1.0]}});
        assert_eq!(map.stats(&stats), json!({"action": {"mean": [3.0, 1.0], "count": [10]}, "state": {"min": [0.0, 1.0]}}));
        let features = json!({"actions": {"dtype": "float32", "shape": [3], "names": ["x", "y", "z"]}, "image": {"dtype": "video"}});
        assert_eq!(map.info_features(&features), json!({"action": {"dtype": "float32", "shape": [2], "names": ["z", "x"]}}));
        let record = serde_json::to_string(&FeatureMap::default()).expect("json");
        assert_eq!(record, "{}", "an empty map writes nothing into a view's record");
    }
}
