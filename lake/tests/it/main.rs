//! Integration tests of the `lake` binary: one test binary, one module per area.

mod attack;
mod common;
mod corrupt;
mod datasets;
mod docs;
mod export;
mod lifecycle;
mod loader;
mod object_store;
mod serve;
mod sql;
