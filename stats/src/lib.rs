//! Statistics in LeRobot's `meta/stats.json` layout: lake's exact ones for numeric features
//! (`feature_stats`), the source's stored ones for cameras (lake does not decode frames at
//! ingest; `lake stats --images` computes them), aggregated from the per-episode ones of the
//! ingested episodes where the source stored only those (LeRobot v2.x) or episodes were skipped
//! (the source's dataset-level ones when it has no per-episode ones, LeRobot v2.0).
//!
//! ```
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! # let dir = tempfile::tempdir().unwrap();
//! # let lake = lake_store::Lake::create(dir.path().join("lake").to_str().unwrap()).unwrap();
//! # let source = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/lerobot/v30-images-tiny");
//! # lake_ingest::ingest(&lake, source, &Default::default(), &lake_ingest::Progress::default()).await.unwrap();
//! let record = lake.resolve("v30-images-tiny").await.unwrap();
//! let stats = lake_stats::stats_json(&lake, &record, None).await.unwrap();
//! // Every numeric feature, in `meta/stats.json`'s layout.
//! assert!(stats["action"]["mean"].is_array() && stats["action"]["q50"].is_array());
//! # });
//! ```

mod error;
mod lerobot;
mod sampling;

pub use crate::{
    error::{Error, Result},
    lerobot::{
        ImageStatsReport, Numbering, downsample_stride, episode_stats, sample_positions, scalar_entry, stats_json, write_image_stats,
        written_stats_json,
    },
    sampling::{SamplingFacts, sampling_facts},
};
