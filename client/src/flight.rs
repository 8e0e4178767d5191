//! Batches over Arrow Flight: the same batches as the in-process loader streams, from a
//! `lake serve` anywhere on the network.

use std::{collections::HashMap, sync::Arc, time::Duration};

use crate::{
    Error, Result, SampleRequest, resume,
    stream::{RemoteBatches, StreamPlan},
};
use arrow::{
    array::RecordBatch,
    buffer::Buffer,
    datatypes::{Schema, SchemaRef},
    ipc::{MessageHeader, reader::read_record_batch, root_as_message},
};
use arrow_flight::{FlightClient, FlightData, FlightDescriptor, error::FlightError, flight_service_client::FlightServiceClient};

/// The Flight action whose body is a JSON sampling request and whose one result is, as JSON,
/// what a trainer builds its policy from ([`RemoteLoader::sampling_facts`]).
pub const SAMPLING_FACTS: &str = "lake.sampling_facts";

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
    let message = format!("server: {} ({:?})", status.message(), status.code());
    // A connection that broke (the server killed, the network cut) surfaces as `Unknown` or
    // `Internal` with the transport's words.
    let broken = matches!(status.code(), tonic::Code::Unknown | tonic::Code::Internal)
        && ["transport error", "connection", "h2 protocol error", "broken pipe", "stream no longer needed"]
            .iter()
            .any(|w| status.message().to_ascii_lowercase().contains(w));
    match status.code() {
        tonic::Code::Unavailable => Error::Unavailable(message),
        _ if broken => Error::Unavailable(message),
        _ => Error::Server(message),
    }
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
        let channel = flight_endpoint(url)?.connect().await.map_err(|e| Error::Unavailable(format!("{url}: {e}")))?;
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

/// Several `lake serve` processes over one lake, serving the streams of one job: each stream
/// goes to one of them (spread by rank and start step, so the readers of a job share the
/// servers), and when its server becomes unavailable (killed, shutting down, unreachable) it
/// moves to the next and resumes after the last batch received, pinned to the dataset versions
/// the first server read: the same batches, in the same order, as one server sends. With
/// [`ServerPool::with_resume_wait`], a stream whose every server is unavailable (restarting, or
/// the lake's object store unreachable) waits for one to take it again.
#[derive(Debug, Clone)]
pub struct ServerPool {
    urls: Vec<String>,
    token: Option<String>,
    resume_wait: Duration,
}

impl ServerPool {
    /// A pool of the servers at `urls` (`http://host:port`), sending `token` as a bearer
    /// token when given. Nothing is connected yet.
    ///
    /// # Errors
    /// [`Error::Invalid`] for no URL.
    pub fn new(urls: impl IntoIterator<Item = impl Into<String>>, token: Option<String>) -> Result<Self> {
        let urls: Vec<String> = urls.into_iter().map(Into::into).collect();
        if urls.is_empty() {
            return Err(Error::Invalid("no server URL given".into()));
        }
        Ok(Self { urls, token, resume_wait: Duration::ZERO })
    }

    /// How long a stream waits, in one outage, once every server has failed it twice in a row:
    /// it asks again after pauses of 0.5 s doubling up to 5 s, and resumes after the last batch
    /// received when a server takes it; past that wait it ends with [`Error::Unavailable`].
    /// Zero (the default): it ends at once. A request no server can plan is refused at once.
    #[must_use]
    pub fn with_resume_wait(mut self, wait: Duration) -> Self {
        self.resume_wait = wait;
        self
    }

    /// The servers, in order.
    pub fn urls(&self) -> &[String] {
        &self.urls
    }

    /// The server a request's stream starts on.
    pub fn first(&self, request: &SampleRequest) -> usize {
        let stride = request.step_stride.max(1);
        let reader = request.rank.saturating_mul(stride).saturating_add(request.start_step % stride);
        (reader % self.urls.len() as u64) as usize
    }

    /// `call` on the servers in turn from `first`, until one is available; returns which
    /// answered, and its answer.
    async fn on_any<T, F, Fut>(&self, first: usize, call: F) -> Result<(usize, T)>
    where
        F: Fn(RemoteLoader) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let mut last = None;
        for k in 0..self.urls.len() {
            let at = (first + k) % self.urls.len();
            let answered = match RemoteLoader::connect(&self.urls[at], self.token.clone()).await {
                Ok(loader) => call(loader).await,
                Err(e) => Err(e),
            };
            match answered {
                Ok(v) => return Ok((at, v)),
                Err(Error::Unavailable(why)) => last = Some(why),
                Err(e) => return Err(e),
            }
        }
        Err(Error::Unavailable(format!("no server of {} is available (last: {})", self.urls.join(", "), last.unwrap_or_default())))
    }

    /// The plan of `request` ([`RemoteLoader::describe`]) from the first available server.
    ///
    /// # Errors
    /// The server's refusal, or [`Error::Unavailable`] when none answers.
    pub async fn describe(&self, request: &SampleRequest) -> Result<StreamPlan> {
        let request = request.clone();
        Ok(self
            .on_any(self.first(&request), move |l| {
                let r = request.clone();
                async move { l.describe(&r).await }
            })
            .await?
            .1)
    }

    /// The trainer's facts of `request` ([`RemoteLoader::sampling_facts`]) from the first
    /// available server.
    ///
    /// # Errors
    /// The server's refusal, or [`Error::Unavailable`] when none answers.
    pub async fn sampling_facts(&self, request: &SampleRequest) -> Result<serde_json::Value> {
        let request = request.clone();
        Ok(self
            .on_any(self.first(&request), move |l| {
                let r = request.clone();
                async move { l.sampling_facts(&r).await }
            })
            .await?
            .1)
    }

    /// Streams the batches of `request`, moving to another server and resuming from the cursor
    /// when the one serving it becomes unavailable. The stream ends with [`Error::Unavailable`]
    /// once every server has failed it twice in a row and the pool's resume wait is over.
    ///
    /// # Errors
    /// The server's refusal of the request, or [`Error::Unavailable`] when no server answers.
    pub async fn stream(&self, request: &SampleRequest) -> Result<RemoteBatches> {
        let (server, plan) = {
            let request = request.clone();
            self.on_any(self.first(&request), move |l| {
                let r = request.clone();
                async move { l.describe(&r).await }
            })
            .await?
        };
        Ok(resume::resumable(self.clone(), server, request, &plan, self.resume_wait))
    }
}

impl resume::Servers for ServerPool {
    fn count(&self) -> usize {
        self.urls.len()
    }

    fn name(&self, at: usize) -> String {
        self.urls[at].clone()
    }

    fn open(&self, at: usize, request: SampleRequest) -> futures::future::BoxFuture<'static, Result<RemoteBatches>> {
        let (url, token) = (self.urls[at].clone(), self.token.clone());
        Box::pin(async move { RemoteLoader::connect(&url, token).await?.stream(&request).await })
    }
}
