//! Test and benchmark support for lake: where the sample data is, derived and corrupted copies
//! of datasets, byte-exact lake snapshots, and a reference decoder for checking packet rows.
//!
//! ```
//! let sample = lake_testkit::testdata("v30-av1-small");
//! assert!(sample.join("meta/info.json").is_file());
//! let copy = tempfile::tempdir().unwrap();
//! lake_testkit::copy_dir(&sample, copy.path());
//! assert_eq!(lake_testkit::snapshot(&sample, &[]), lake_testkit::snapshot(copy.path(), &[]));
//! ```

#![allow(clippy::print_stdout, clippy::print_stderr)] // test support reports what it does

mod decode;
mod derive;
mod files;
mod http;
mod s3;
mod web_server;

pub use crate::{
    decode::{FrameHash, PacketDecoder, sequential_frames, sequential_rgb},
    derive::{read_parquet, repeat_dataset, write_parquet},
    files::{bench_lake, bench_workdir, committed_snapshot, copy_dir, ffmpeg, run_lake, shared_dir, snapshot, testdata, workspace_root},
    http::{HttpResponse, dechunk, http_request, prometheus_values},
    s3::S3Server,
    web_server::WebServer,
};
