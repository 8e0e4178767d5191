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
}

impl ViewRecord {
    /// Selected episodes over all datasets.
    pub fn episode_count(&self) -> usize {
        self.datasets.iter().map(|d| d.episodes.len()).sum()
    }
}
