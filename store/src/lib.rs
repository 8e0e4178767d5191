//! The lake's storage layer: the catalog of datasets and versions, and the Lance tables of each
//! version. Ingest writes through it and every reader (loader, SQL, CLI) reads through it.
//!
//! ```no_run
//! # async fn demo() -> lake_store::Result<()> {
//! let lake = lake_store::Lake::open("./lake")?;
//! for record in lake.datasets().await? {
//!     println!("{} v{}: {} steps", record.name, record.version, record.counts.steps);
//! }
//! # Ok(()) }
//! ```

mod catalog;
mod error;
mod tables;

pub use crate::{
    catalog::{
        Committed, GarbageReport, IngestUnderWay, Lake, PendingVersion, RESERVED_NAMES, Removal, RemovalReport, Unreadable,
        absolute_location, default_name, hostname, local_path, parse_version, process_alive, validate_name, validate_new_name,
    },
    error::{Error, Result, abbreviated, lance_message, machine_error, removed_hint, selected_message, without_source_locations},
    tables::{
        UncommittedPart, commit_parts, open_lance, open_table, publish_dir, read_columns, read_columns_at, read_table, read_whole_at,
        remove_abandoned, remove_when_done, stream_columns_at, write_table, write_uncommitted,
    },
};

/// Pinned dependencies, re-exported so that users build against the same versions.
pub mod deps {
    pub use lance;
    pub use object_store;
}
