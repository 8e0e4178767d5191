//! The lake's storage layer: the catalog of datasets and versions, and the Lance tables of each
//! version. Ingest writes through it and every reader (loader, SQL, CLI) reads through it.
//!
//! ```
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let dir = tempfile::tempdir().unwrap();
//! let root = dir.path().join("lake");
//! // A new lake: its marker file, and no dataset yet.
//! let lake = lake_store::Lake::create(root.to_str().unwrap()).unwrap();
//! assert!(lake.datasets().await.unwrap().is_empty());
//! assert!(root.join("lake.json").is_file());
//! # });
//! ```

mod catalog;
mod content_digest;
mod derived;
mod error;
mod lance_open;
mod lease;
pub mod local_io;
pub mod object_cache;
mod record_digest;
pub mod remote;
mod removal;
mod sent_digests;
mod tables;
mod verify;

pub use crate::{
    catalog::{
        Committed, GarbageReport, IngestUnderWay, Lake, PendingVersion, RESERVED_NAMES, RemovalReport, Unreadable, absolute_location,
        default_name, local_path, parse_version, validate_name, validate_new_name,
    },
    content_digest::{ContentCheck, content_digest},
    derived::DerivedTable,
    error::{
        Error, Result, abbreviated, lance_message, machine_error, removed_hint, selected_message, store_message, store_unreachable,
        unreachable_link, without_source_locations, write_refusal,
    },
    lance_open::{log_panics_on_this_thread, open_lance, read_lance, stream_lance},
    lease::{hostname, process_alive},
    removal::Removal,
    tables::{
        UncommittedPart, commit_parts, commit_parts_with, open_table, publish_dir, read_columns, read_columns_at, read_table,
        read_table_where, read_whole_at, remove_abandoned, remove_when_done, sql_string, stream_columns_at, write_table, write_uncommitted,
    },
    verify::{FileDamage, Verification},
};

/// Pinned dependencies, re-exported so that users build against the same versions.
pub mod deps {
    pub use lance;
    pub use object_store;
}

/// What went wrong creating a file in `dir`, said of the directory (an error of the file's own
/// would name a temporary file the user never asked for).
pub fn in_directory(dir: &std::path::Path, e: &std::io::Error) -> std::io::Error {
    let why = match e.kind() {
        std::io::ErrorKind::NotFound if !dir.exists() => format!("the directory {} does not exist", dir.display()),
        std::io::ErrorKind::PermissionDenied => format!("no permission to create files in {}", dir.display()),
        kind => match e.raw_os_error() {
            Some(code) => format!("cannot create files in {}: {}", dir.display(), std::io::Error::from_raw_os_error(code)),
            None => format!("cannot create files in {}: {}", dir.display(), std::io::Error::from(kind)),
        },
    };
    std::io::Error::new(e.kind(), why)
}
