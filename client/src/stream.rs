//! What every transport gives a trainer: the plan of a sampling request, and its batches.

use std::pin::Pin;

use arrow::{array::RecordBatch, datatypes::SchemaRef};
use futures::Stream;

use crate::{Error, Result};

/// Batches from a server.
pub type RemoteBatches = Pin<Box<dyn Stream<Item = Result<RecordBatch>> + Send>>;

/// What a server plans for a sampling request: its batches' schema and the shape of its epochs,
/// with which a trainer keeps its `(epoch, step)` cursor for exact resumption.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamPlan {
    /// The batches' schema.
    pub schema: SchemaRef,
    /// Samples in an epoch (eligible steps of every dataset).
    pub epoch_len: u64,
    /// Global steps in an epoch.
    pub steps_per_epoch: u64,
    /// The request's `datasets` (JSON) with every dataset name pinned to the version the server
    /// reads (`NAME@VERSION`): later requests that carry it (a resume) read the same versions
    /// whatever is ingested meanwhile. `null` from a server that does not pin.
    pub datasets: serde_json::Value,
    /// The datasets sampled (`NAME@VERSION`; a view's each): a mixture's `dataset_index`
    /// column is a position in this list. Empty from a server that does not say.
    pub sources: Vec<String>,
}

impl StreamPlan {
    /// The plan from the server's JSON shape (`{"epoch_len": …, "steps_per_epoch": …,
    /// "datasets": […], "sources": […]}`).
    pub(crate) fn from_json(schema: SchemaRef, shape: &[u8]) -> Result<Self> {
        let bad = || Error::Server(format!("server: a plan that is not an epoch shape: {}", String::from_utf8_lossy(shape)));
        let value: serde_json::Value = serde_json::from_slice(shape).map_err(|_| bad())?;
        let field = |name: &str| value[name].as_u64().ok_or_else(bad);
        // Absent from an older server's plans.
        let datasets = value.get("datasets").cloned().unwrap_or(serde_json::Value::Null);
        let sources = match value.get("sources") {
            None => Vec::new(),
            Some(v) => serde_json::from_value(v.clone()).map_err(|_| bad())?,
        };
        Ok(Self { schema, epoch_len: field("epoch_len")?, steps_per_epoch: field("steps_per_epoch")?, datasets, sources })
    }
}
