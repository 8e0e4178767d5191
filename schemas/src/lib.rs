//! Types every lake crate shares, with no I/O: LeRobot metadata (`info.json`, features, path
//! templates), the Arrow schemas of the lake's tables, catalog records and validation findings.
//!
//! ```
//! use lake_schemas::{CodebaseVersion, PathTemplate};
//!
//! let template = PathTemplate::new("data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet");
//! let path = template.format(&[("chunk_index", 0.into()), ("file_index", 12.into())]).unwrap();
//! assert_eq!(path, "data/chunk-000/file-012.parquet");
//! assert_eq!("v2.1".parse::<CodebaseVersion>().unwrap(), CodebaseVersion::V21);
//! ```

mod catalog;
mod codec;
mod error;
mod finding;
mod frame;
mod lerobot;
pub mod picture;
pub mod pyjson;
pub mod tables;
mod template;

pub use crate::{
    catalog::{CommitRecord, FeatureMap, IngestOptions, SourceRecord, TableCounts, TableFile, TableSet, ViewDataset, ViewRecord},
    codec::CodecParams,
    error::{Error, Result},
    finding::{Finding, FindingKind, Severity},
    frame::{FrameFormat, FrameSize},
    lerobot::{CodebaseVersion, DEFAULT_TOLERANCE_S, Feature, FeatureKind, InfoJson},
    template::{PathTemplate, TemplateValue},
};

/// The on-disk format version of a lake written by this build. Bumped when a table's layout
/// changes in a way older readers cannot read.
pub const LAKE_FORMAT_VERSION: u32 = 1;
