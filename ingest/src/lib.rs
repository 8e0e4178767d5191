//! LeRobot v2.0/v2.1/v3.0 datasets → lake datasets.
//!
//! Ingest reads a dataset through `object_store`, validates its metadata, every parquet row and
//! every camera file, demuxes (never decodes) the videos with FFmpeg into a per-frame packet
//! index, and commits a new dataset version to the lake atomically.
//!
//! ```no_run
//! # async fn demo() -> lake_ingest::Result<()> {
//! let lake = lake_store::Lake::open("./lake")?;
//! let options = lake_ingest::IngestOptions { skip_bad_episodes: true, ..Default::default() };
//! let progress = lake_ingest::Progress::default();
//! match lake_ingest::ingest(&lake, "./my_dataset", &options, &progress).await? {
//!     lake_ingest::Outcome::Committed { record, report } => {
//!         println!("{} v{}: {} steps, {} skipped", record.name, record.version, report.steps, report.skipped.len())
//!     }
//!     lake_ingest::Outcome::Unchanged { reason, .. } => println!("unchanged: {reason}"),
//! }
//! # Ok(()) }
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
mod video;

pub use crate::{
    error::{Error, Result},
    ingest::{IngestOptions, Outcome, Progress, ingest},
    meta::{DatasetMeta, EpisodeMeta, StatRow, TaskRow, VideoRef},
    report::{CameraSummary, Report},
    source::{Source, SourceFile},
    video::init_ffmpeg,
};
