//! Batches over Arrow Flight: the same batches as the in-process loader streams, from a
//! `lake serve` anywhere on the network.

use std::{collections::HashMap, pin::Pin, sync::Arc};

use arrow::{
    array::RecordBatch,
    buffer::Buffer,
    datatypes::{Schema, SchemaRef},
    ipc::{MessageHeader, reader::read_record_batch, root_as_message},
};
use arrow_flight::{FlightClient, FlightData, FlightDescriptor, error::FlightError, flight_service_client::FlightServiceClient};
use futures::Stream;

use crate::{Error, Result, SampleRequest};

/// The Flight action whose body is a JSON sampling request and whose one result is, as JSON,
/// what a trainer builds its policy from ([`RemoteLoader::sampling_facts`]).
pub const SAMPLING_FACTS: &str = "lake.sampling_facts";

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

/// A connection to `lake serve`'s Flight endpoint.
#[derive(Debug, Clone)]
pub struct RemoteLoader {
    channel: tonic::transport::Channel,
    token: Option<String>,
}

fn remote(e: FlightError) -> Error {
    match e {
        FlightError::Tonic(status) => refused(&status),
        other => Error::Server(format!("server: {other}")),
    }
}

fn refused(status: &tonic::Status) -> Error {
    Error::Server(format!("server: {} ({:?})", status.message(), status.code()))
}

/// A gRPC endpoint set up for training batches: HTTP/2 receive windows and frames sized for
/// messages of tens of MB (the defaults, a 64 KB window and 16 KB frames, cut a loopback stream's
/// throughput several times over), and no Nagle delay.
///
/// # Errors
/// When `url` is not a valid URI.
pub fn flight_endpoint(url: &str) -> Result<tonic::transport::Endpoint> {
    Ok(tonic::transport::Channel::from_shared(url.to_string())
        .map_err(|e| Error::Server(format!("{url}: {e}")))?
        .initial_stream_window_size(32 << 20)
        .initial_connection_window_size(64 << 20)
        .max_frame_size((1 << 24) - 1)
        .tcp_nodelay(true))
}

impl RemoteLoader {
    /// Connects to `url` (`http://host:port`), sending `token` as a bearer token when given.
    ///
    /// # Errors
    /// When the server cannot be reached.
    pub async fn connect(url: &str, token: Option<String>) -> Result<Self> {
        let channel = flight_endpoint(url)?.connect().await.map_err(|e| Error::Server(format!("{url}: {e}")))?;
        Ok(Self { channel, token })
    }

    /// The generated client; a training batch is one message, larger than gRPC's default 4 MB
    /// limit.
    fn inner(&self) -> FlightServiceClient<tonic::transport::Channel> {
        FlightServiceClient::new(self.channel.clone()).max_decoding_message_size(usize::MAX)
    }

    fn client(&self) -> Result<FlightClient> {
        let mut client = FlightClient::new_from_inner(self.inner());
        if let Some(token) = &self.token {
            client.add_header("authorization", &format!("Bearer {token}")).map_err(remote)?;
        }
        Ok(client)
    }

    /// The schema of a sampling request's batches and the shape of its epochs (`GetFlightInfo`).
    ///
    /// # Errors
    /// The server's refusal (unknown dataset, bad request, missing token) with its message.
    pub async fn describe(&self, request: &SampleRequest) -> Result<StreamPlan> {
        let info = self.client()?.get_flight_info(FlightDescriptor::new_cmd(request.to_json())).await.map_err(remote)?;
        let schema = info.clone().try_decode_schema().map_err(|e| Error::Server(format!("server: a bad schema: {e}")))?;
        StreamPlan::from_json(Arc::new(schema), &info.app_metadata)
    }

    /// What a trainer builds its policy from for a sampling request, as the server reads it from
    /// its lake: `{"fps", "features", "stats", "datasets"}` (the Flight action
    /// [`SAMPLING_FACTS`]), so that a trainer need not read the lake itself.
    ///
    /// # Errors
    /// The server's refusal (unknown dataset, a mixture whose features differ, missing token).
    pub async fn sampling_facts(&self, request: &SampleRequest) -> Result<serde_json::Value> {
        let action = arrow_flight::Action::new(SAMPLING_FACTS, request.to_json());
        let mut results = self.client()?.do_action(action).await.map_err(remote)?;
        let body = futures::StreamExt::next(&mut results)
            .await
            .ok_or_else(|| Error::Server("the server answered the facts action with nothing".into()))?
            .map_err(remote)?;
        serde_json::from_slice(&body).map_err(|e| Error::Server(format!("server: facts that are not JSON: {e}")))
    }

    /// Streams the batches of a sampling request, in order.
    ///
    /// # Errors
    /// The server's refusal (unknown dataset, bad request, missing token) with its message.
    pub async fn stream(&self, request: &SampleRequest) -> Result<RemoteBatches> {
        let mut client = self.client()?;
        let info = client.get_flight_info(FlightDescriptor::new_cmd(request.to_json())).await.map_err(remote)?;
        let ticket =
            info.endpoint.first().and_then(|e| e.ticket.clone()).ok_or_else(|| Error::Server("the server sent no ticket".into()))?;
        let mut request = tonic::Request::new(ticket);
        if let Some(token) = &self.token {
            let value = format!("Bearer {token}").parse().map_err(|_| Error::Server("the token is not a valid header value".into()))?;
            request.metadata_mut().insert("authorization", value);
        }
        let messages = self.inner().do_get(request).await.map_err(|s| refused(&s))?.into_inner();
        Ok(decode(messages))
    }
}

/// Flight messages → record batches whose buffers are slices of the message bodies as received.
/// (arrow-flight's decoder copies each body once more before decoding it: for training batches,
/// a full copy of every frame.)
fn decode(messages: tonic::Streaming<FlightData>) -> RemoteBatches {
    let bad = |what: String| Error::Server(format!("server: {what}"));
    let batches = futures::stream::try_unfold((messages, None::<SchemaRef>), move |(mut messages, mut schema)| async move {
        loop {
            let Some(data) = messages.message().await.map_err(|s| refused(&s))? else { return Ok(None) };
            let message = root_as_message(&data.data_header).map_err(|e| bad(format!("a Flight message that is not Arrow IPC: {e}")))?;
            match message.header_type() {
                MessageHeader::Schema => {
                    schema = Some(Arc::new(Schema::try_from(&data).map_err(|e| bad(format!("a bad schema: {e}")))?));
                }
                MessageHeader::RecordBatch => {
                    let of = schema.as_ref().ok_or_else(|| bad("a record batch before the schema".into()))?;
                    let batch = batch_from_ipc(&data.data_header, &Buffer::from(data.data_body), of)?;
                    return Ok(Some((batch, (messages, schema))));
                }
                other => return Err(bad(format!("an unexpected {other:?} message"))),
            }
        }
    });
    Box::pin(batches)
}

/// A record batch from its IPC `Message` and its body, the arrays viewing the body in place.
pub(crate) fn batch_from_ipc(header: &[u8], body: &Buffer, schema: &SchemaRef) -> Result<RecordBatch> {
    let bad = |what: String| Error::Server(format!("server: {what}"));
    let message = root_as_message(header).map_err(|e| bad(format!("a message that is not Arrow IPC: {e}")))?;
    let batch = message.header_as_record_batch().ok_or_else(|| bad("a record batch message without its header".into()))?;
    read_record_batch(body, batch, schema.clone(), &HashMap::new(), None, &message.version())
        .map_err(|e| bad(format!("an unreadable record batch: {e}")))
}
