//! The lake loader: LeRobot-identical training samples from a lake dataset.
//!
//! ```text
//! (dataset(s), windows) ── Loader ──▶ Arrow batches, one row per sample
//!        ▲                    │  plan: windows clamped per episode, frames grouped by GOP
//!  Order (seed, epoch)        │  fetch: packet bytes by row from Lance (one take per batch)
//!  Sharding (rank, world)     │  decode: a decoder per stream, reused, on the decode pool
//!                             ▼  cache: RGB frames, LRU bounded in bytes, and frames a
//!                                stream decoded ahead for later batches (Lookahead: its own,
//!                                or those of every rank of its order, as a server shares it)
//! ```
//!
//! ```
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! # let dir = tempfile::tempdir().unwrap();
//! # let lake = lake_store::Lake::create(dir.path().join("lake").to_str().unwrap()).unwrap();
//! # let source = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/lerobot/v30-images-tiny");
//! # let progress = lake_ingest::Progress::default();
//! # lake_ingest::ingest(&lake, source, &Default::default(), &progress).await.unwrap();
//! use lake_loader::{Draw, Loader, LoaderDataset, LoaderOptions, Preset, Windows};
//! // A lake holding the bundled sample `v30-images-tiny` (ingested above).
//! let ds = LoaderDataset::open(&lake, "v30-images-tiny").await.unwrap();
//! let loader = Loader::new(vec![ds], &Windows::Preset(Preset::Act), LoaderOptions::default()).unwrap();
//! // Steps 0 and 5: each row the sample `LeRobotDataset[index]` is, ACT's 100 actions ahead.
//! let batch = loader.batch(&[Draw { source: 0, row: 0 }, Draw { source: 0, row: 5 }]).await.unwrap();
//! assert_eq!(batch.num_rows(), 2);
//! assert!(batch.column_by_name("action_is_pad").is_some());
//! # });
//! ```
//!
//! A sample is what LeRobot's `LeRobotDataset.__getitem__` returns for the same step and
//! `delta_timestamps`: every step column, windows clamped at episode edges with
//! `{key}_is_pad`, the task string, and camera frames as uint8 HWC (THWC with a window),
//! decoded and converted to RGB exactly as LeRobot's CPU path does.

mod batch;
mod cache;
mod dataset;
mod error;
mod frame_writer;
mod frames;
mod idle;
mod lookahead;
mod packets;
pub mod proxy;
mod proxy_info;
mod sampler;
mod samples;
mod spec;
mod stream;
mod usage;
pub mod views;

/// The pixel formats camera frames travel in, and the conversion of YUV planes a trainer runs.
pub use lake_codec::{PIXEL_FORMAT, YUV_TO_RGB, YuvToRgb, yuv420p_bytes};
pub use lake_schemas::{FrameFormat, FrameSize};

pub use crate::{
    batch::{DATASET_INDEX, DEFAULT_CACHE_MIB, DecodeBound, DecodeStats, GopJob, Loader, LoaderOptions, Resources, Spawned},
    cache::{CacheStats, Frame, FrameCache, FrameKey},
    dataset::{Camera, Column, EpisodeSpan, FrameSpec, LoaderDataset, PacketIndex, StoredFrames},
    error::{Error, Result},
    frame_writer::{FrameTableReport, write_frame_table},
    frames::{
        FRAME_CHECKSUM, FRAMES, FrameStorage, FrameTableCheck, FrameTableInfo, Mismatch, frame_table_name, frame_tables, frames_schema,
        verify_frame_table,
    },
    lookahead::{Ahead, DEFAULT_HORIZON, FrameRef, FrameSource, Lookahead, MAX_HORIZON, Member},
    packets::{PACKETS_SUFFIX, PacketBatchDecoder, PacketCamera, ShippedGop, gops_type},
    proxy::{ProxyCamera, ProxyInfo, ProxyReport, write_proxy},
    proxy_info::{ProxyCheck, verify_proxy},
    sampler::{Cursor, Draw, Eligible, MIX_BLOCK, Order, Permutation, Sharding, Source},
    samples::{BatchColumn, DTYPE, FrameColumn, LAYOUT, SHAPE, SampleBatch},
    spec::{DatasetKeys, Preset, Window, Windows, resolve_windows},
    stream::{BatchStream, LoadedBatch, StreamRequest, cursors, load, load_samples_with, load_with, stream, stream_with},
    usage::{ProcessUsage, process_usage},
    views::{Sampling, SamplingSpec, Selection, open_sampling, resolve},
};
