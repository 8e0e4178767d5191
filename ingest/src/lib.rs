//! LeRobot v2.0/v2.1/v3.0 datasets → lake datasets.
//!
//! Ingest reads a dataset through `object_store`, validates its metadata, every parquet row and
//! every camera file, demuxes (never decodes) the videos with FFmpeg into a per-frame packet
//! index, and commits a new dataset version to the lake atomically.
//!
//! ```
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let dir = tempfile::tempdir().unwrap();
//! let lake = lake_store::Lake::create(dir.path().join("lake").to_str().unwrap()).unwrap();
//! // A bundled sample: 3 episodes, a camera whose pictures are in the parquet.
//! let source = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/lerobot/v30-images-tiny");
//! let options = lake_ingest::IngestOptions { skip_bad_episodes: true, ..Default::default() };
//! let progress = lake_ingest::Progress::default();
//! match lake_ingest::ingest(&lake, source, &options, &progress).await.unwrap() {
//!     lake_ingest::Outcome::Committed { record, report } => {
//!         assert_eq!((record.name.as_str(), record.version), ("v30-images-tiny", 1));
//!         assert!(report.steps > 0 && report.skipped.is_empty());
//!     }
//!     lake_ingest::Outcome::Unchanged { .. } => unreachable!("a new lake has no version to keep"),
//! }
//! # });
//! ```

mod columns;
mod data;
mod episode_stats;
mod error;
pub mod feature_stats;
mod ingest;
mod meta;
mod report;
mod scratch;
mod source;
mod steps;
mod streams;

pub use crate::{
    episode_stats::StatRow,
    error::{Error, Result},
    ingest::{IngestOptions, Outcome, Progress, ingest},
    meta::{DatasetMeta, EpisodeMeta, TaskRow, VideoRef},
    report::{CameraSummary, Report},
    source::{Source, SourceFile},
};
