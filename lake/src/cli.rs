//! The commands, a file each, as a user types them: `lake ingest` is `cli/ingest.rs`.

pub mod bench;
pub mod cache;
pub mod export;
pub mod gpu;
pub mod ingest;
pub mod inspect;
pub mod ls;
pub mod rm;
pub mod sample;
pub mod serve;
pub mod sql;
pub mod stats;
pub mod train;
pub mod verify;
pub mod view;
