//! Clients of `lake serve`: a typed [`SampleRequest`], and the two ways batches reach a trainer,
//! [`RemoteLoader`] over Arrow Flight and [`LocalLoader`] through shared memory on the server's
//! machine. Both yield the Arrow record batches the in-process loader makes, one row per sample.
//!
//! A request is built in Rust, no JSON by hand; every transport carries it as JSON:
//!
//! ```
//! use lake_client::SampleRequest;
//!
//! let mut request = SampleRequest::new(["aloha_sim"]);
//! request.preset = "act".into();
//! request.batch_size = 8;
//! (request.rank, request.world_size) = (1, 4);
//! request.check().unwrap();
//! assert_eq!(SampleRequest::from_json(request.to_json().as_bytes()).unwrap(), request);
//!
//! request.rank = 4;
//! assert_eq!(request.check().unwrap_err().to_string(), "rank 4 is outside a world of 4 (ranks 0 to 3)");
//! ```
//!
//! Streaming one (with a server running):
//!
//! ```no_run
//! # async fn demo() -> lake_client::Result<()> {
//! use futures::StreamExt;
//! let client = lake_client::RemoteLoader::connect("http://127.0.0.1:50051", Some("token".into())).await?;
//! let mut request = lake_client::SampleRequest::new(["my_dataset"]);
//! request.limit_batches = Some(10);
//! let mut batches = client.stream(&request).await?;
//! while let Some(batch) = batches.next().await {
//!     let batch = batch?; // one training batch
//! #   let _ = batch;
//! }
//! # Ok(()) }
//! ```

mod error;
mod flight;
pub mod local;
mod request;
mod resume;
mod stream;

pub use lake_schemas::{FrameFormat, FrameSize};

pub use crate::{
    error::{Error, Result},
    flight::{RemoteLoader, SAMPLING_FACTS, ServerPool, flight_endpoint},
    local::LocalLoader,
    request::{DatasetRef, MAX_BATCH_SIZE, MAX_DATASETS, MAX_REQUEST_BYTES, MAX_TICKET_BYTES, MAX_WORLD_SIZE, SampleRequest},
    stream::{RemoteBatches, StreamPlan},
};
