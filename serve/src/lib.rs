//! `lake serve`: the loader's batch streams over Arrow Flight and HTTP, from one process.
//!
//! A sampling request (a Flight descriptor command, a Flight ticket, or a `POST /v1/sample`
//! body) is JSON:
//!
//! ```json
//! {"datasets": ["name"] | [{"name": "a", "weight": 0.7}, {"name": "b", "weight": 0.3}],
//!  "preset": "act", "delta_timestamps": {"action": [0.0, 0.033]},
//!  "batch_size": 32, "seed": 0, "shuffle": true, "epoch": 0, "start_step": 0, "rank": 0,
//!  "world_size": 1, "limit_batches": 100, "drop_last": true, "episodes": [0, 3],
//!  "drop_n_first_frames": 0, "drop_n_last_frames": 0, "frame_size": "224x224",
//!  "frame_format": "rgb24"}
//! ```
//!
//! `batch_size` is what each rank receives; the global batch is `batch_size × world_size`, and
//! global step `s` covers positions `[s·G, (s+1)·G)` of the sampler's order, so ranks are
//! disjoint and a stream resumes exactly from `(seed, epoch, start_step)`. Datasets may be views.
//! `"shuffle": false` gives the eligible steps in the order recorded instead, every epoch the
//! same (an evaluation pass).
//! The server is stateless over the lake: the ticket is the request itself, so any server over
//! the same lake can serve any rank.
//!
//! The service under every transport, in process:
//!
//! ```
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! # let dir = tempfile::tempdir().unwrap();
//! # let lake = lake_store::Lake::create(dir.path().join("lake").to_str().unwrap()).unwrap();
//! # let source = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/lerobot/v30-images-tiny");
//! # lake_ingest::ingest(&lake, source, &Default::default(), &lake_ingest::Progress::default()).await.unwrap();
//! use futures::StreamExt;
//! let service = lake_serve::Service::new(lake, lake_serve::ServeOptions::default()).unwrap();
//! let request = lake_client::SampleRequest::from_json(br#"{"datasets": ["v30-images-tiny"], "batch_size": 4, "limit_batches": 2}"#).unwrap();
//! let (_, mut batches) = service.batches(&request).await.unwrap();
//! let mut rows = 0;
//! while let Some(batch) = batches.next().await {
//!     rows += batch.unwrap().num_rows();
//! }
//! assert_eq!(rows, 8);
//! # });
//! ```

use std::{
    collections::HashMap,
    pin::Pin,
    sync::{
        Arc, Mutex, Weak,
        atomic::{AtomicU64, Ordering},
    },
    task::Poll,
    time::Instant,
};

use arrow::datatypes::{DataType, SchemaRef};
use futures::{Stream, StreamExt};
use lake_loader::{
    Cursor, DecodeStats, Loader, LoaderOptions, Lookahead, Member, Order, Resources, SampleBatch, Sharding, Spawned, StreamRequest, Windows,
};
use lake_store::Lake;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use lake_client::{DatasetRef, MAX_BATCH_SIZE, MAX_DATASETS, MAX_REQUEST_BYTES, MAX_TICKET_BYTES, MAX_WORLD_SIZE, SampleRequest};
use lake_loader::views;

pub use lake_query::{Error, Result};

/// How many `k` in `0..n` have `(a + k·b) mod m = m - 1` (for `a < m`): the visits of an
/// epoch's last step by a stream from step `a` taking every `b`-th step of epochs of `m` steps.
fn congruent_count(a: u64, b: u64, m: u64, n: u64) -> u64 {
    fn gcd(x: u128, y: u128) -> u128 {
        if y == 0 { x } else { gcd(y, x % y) }
    }
    // The inverse of `x` modulo `m` (x and m coprime), by the extended Euclidean algorithm.
    fn inverse(x: i128, m: i128) -> i128 {
        let (mut r0, mut r1, mut s0, mut s1) = (m, x % m, 0i128, 1i128);
        while r1 != 0 {
            let q = r0 / r1;
            (r0, r1) = (r1, r0 - q * r1);
            (s0, s1) = (s1, s0 - q * s1);
        }
        s0.rem_euclid(m)
    }
    let (a, b, m, n) = (u128::from(a % m), u128::from(b), u128::from(m), u128::from(n));
    let target = m - 1 - a;
    let d = gcd(b % m, m);
    if target % d != 0 {
        return 0;
    }
    let period = m / d;
    let first = if period == 1 {
        0
    } else {
        let (b, t, p) = ((b / d) % period, target / d, period);
        (t * inverse(b as i128, p as i128) as u128) % p
    };
    if first >= n { 0 } else { u64::try_from(1 + (n - 1 - first) / period).unwrap_or(u64::MAX) }
}

/// A request's slot in [`Service::prepared`] while its loader is being made: when the last
/// request waiting on it goes without one (refused, or its client gone mid-way), the empty slot
/// leaves the map.
struct Unmade<'a> {
    map: &'a Mutex<HashMap<String, Arc<tokio::sync::OnceCell<Arc<Prepared>>>>>,
    key: String,
    slot: Arc<tokio::sync::OnceCell<Arc<Prepared>>>,
}

impl Drop for Unmade<'_> {
    fn drop(&mut self) {
        let mut map = self.map.lock().expect("not poisoned");
        // Others clone the slot only under this lock: two holders (the map and this guard)
        // mean no other request waits on it.
        let last = map.get(&self.key).is_some_and(|s| Arc::ptr_eq(s, &self.slot) && Arc::strong_count(s) == 2);
        if last && !self.slot.initialized() {
            map.remove(&self.key);
        }
    }
}

/// What the server makes of a request: its windows, what it samples, and the key of the loader
/// and order it needs.
trait Planned {
    fn windows(&self) -> Result<Windows>;
    fn spec(&self) -> views::SamplingSpec;
    fn key(&self) -> String;
}

impl Planned for SampleRequest {
    fn windows(&self) -> Result<Windows> {
        // A preset that does not exist is refused even where delta_timestamps overrides it.
        let preset = self.preset.parse().map_err(|e: lake_loader::Error| Error::Invalid(e.to_string()))?;
        Ok(match &self.delta_timestamps {
            Some(v) => Windows::from_json(v)?,
            None => Windows::Preset(preset),
        })
    }

    fn spec(&self) -> views::SamplingSpec {
        views::SamplingSpec {
            datasets: self
                .datasets
                .iter()
                .map(|d| match d {
                    DatasetRef::Name(n) => n.clone(),
                    DatasetRef::Weighted { name, weight } => format!("{name}={weight}"),
                })
                .collect(),
            episodes: self.episodes.clone(),
            drop_n_first_frames: self.drop_n_first_frames,
            drop_n_last_frames: self.drop_n_last_frames,
            frame_size: self.frame_size,
            frame_format: self.frame_format,
            proxy: self.proxy,
        }
    }

    /// What identifies the loader and order a request needs (not its position or rank).
    fn key(&self) -> String {
        let mut shape = self.clone();
        (shape.epoch, shape.start_step, shape.rank, shape.world_size, shape.limit_batches, shape.batch_size, shape.step_stride) =
            (0, 0, 0, 1, None, 0, 1);
        serde_json::to_string(&shape).expect("requests serialise")
    }
}

/// A request the client crate refused, as the server's refusal.
fn invalid(e: lake_client::Error) -> Error {
    Error::Invalid(e.to_string())
}

/// How often the server pings an HTTP/2 client (Flight's, and HTTP's over HTTP/2) whose
/// connection is quiet, and how long it waits for the answer before it ends the connection: a
/// client whose host went away without closing (power loss, a cut network) stops answering,
/// and its connection ends instead of holding its socket for ever.
pub const PING_EVERY: std::time::Duration = std::time::Duration::from_secs(30);
/// See [`PING_EVERY`].
pub const PING_ANSWER_WAIT: std::time::Duration = std::time::Duration::from_secs(20);

/// What a request will stream.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The request's datasets with every dataset name pinned to the version served
    /// (`NAME@VERSION`); a request that names these reads the same versions after a later ingest.
    pub datasets: Vec<DatasetRef>,
    /// The datasets sampled (`NAME@VERSION`), a view's each: a mixture's `dataset_index` column
    /// is a position in this list.
    pub sources: Vec<String>,
    /// Schema of the batches.
    pub schema: SchemaRef,
    /// Eligible steps per epoch.
    pub epoch_len: u64,
    /// Global steps (batches per rank) per epoch; a stream moves to step 0 of the next epoch
    /// after the last.
    pub steps_per_epoch: u64,
}

impl Plan {
    /// The epoch shape clients keep their `(epoch, step)` cursor with, as JSON (Flight's
    /// `app_metadata`, a local stream's plan message).
    pub fn shape_json(&self) -> String {
        serde_json::json!({
            "epoch_len": self.epoch_len,
            "steps_per_epoch": self.steps_per_epoch,
            "datasets": self.datasets,
            "sources": self.sources,
        })
        .to_string()
    }
}

/// Server settings.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Loader settings: decode threads and decoded-frame cache bytes, both shared by every
    /// request the server serves, and frame table use.
    pub loader: LoaderOptions,
    /// Bytes of batches each stream prepares ahead of its client (at least one batch).
    pub prefetch_bytes: u64,
    /// Bytes of batches all streams together may hold (being made, ready, or being sent);
    /// streams wait for room beyond it, and a request whose one batch exceeds it is refused.
    pub memory_bytes: u64,
    /// How long a new stream waits for room in the memory budget before it is refused.
    pub admission_wait: std::time::Duration,
    /// Bearer tokens accepted; empty: no authentication.
    pub tokens: Vec<String>,
    /// Opened loaders kept for reuse by later requests.
    pub max_loaders: usize,
    /// Draws planned ahead, together, by the streams of one order and global batch (the ranks
    /// of a training job), to keep the frames a decode yields for the rank that shows them
    /// next (0: none; see [`lake_loader::Lookahead`]).
    pub lookahead: u64,
    /// Longest a SQL query (over HTTP or Flight SQL) may run; past it, it is stopped and its
    /// answer ends with an error.
    pub sql_timeout: std::time::Duration,
    /// SQL queries run at once (each on a thread of its own); one more is refused as busy.
    pub sql_concurrency: usize,
    /// Bytes SQL queries may hold together (sorts, joins and aggregations spill to temporary
    /// files past it; what cannot spill fails as resources exhausted), apart from
    /// [`ServeOptions::memory_bytes`].
    pub sql_memory_bytes: u64,
    /// Longest an HTTP client may take to send a request's head, and then its body; a slower
    /// one is cut (head) or answered 408 (body).
    pub request_wait: std::time::Duration,
    /// Refuse every request that would write to the lake (`POST /v1/views`, the only one), as
    /// [`Error::ReadOnly`].
    pub read_only: bool,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            loader: LoaderOptions::default(),
            prefetch_bytes: 128 << 20,
            memory_bytes: 4 << 30,
            admission_wait: std::time::Duration::from_secs(10),
            tokens: Vec::new(),
            max_loaders: 8,
            lookahead: lake_loader::DEFAULT_HORIZON,
            sql_timeout: std::time::Duration::from_secs(300),
            sql_concurrency: std::thread::available_parallelism().map_or(2, usize::from),
            sql_memory_bytes: 1 << 30,
            request_wait: std::time::Duration::from_secs(30),
            read_only: false,
        }
    }
}

/// What a stream's transport holds of its batches, counted in the memory budget in batch sizes.
#[derive(Debug, Clone, Copy)]
pub struct Footprint {
    /// Batches held for as long as the stream is open.
    pub held: u64,
    /// Sizes each batch takes while it is made, ready or being sent.
    pub per_batch: u64,
    /// What they are, for the message that refuses a stream too large for the budget.
    pub what: &'static str,
}

impl Footprint {
    /// gRPC and HTTP: the send buffer keeps one encoded batch, and each batch counts twice, as
    /// made and encoded. `lake serve`'s own `DoGet` route and HTTP Arrow stream send a batch's
    /// buffers and frames without copying them, so the second count is a margin there; the
    /// encoders that do copy (Flight's generated service, JSON and CSV) use it. (Layouts left to
    /// Arrow's IPC writer would hold a third copy while encoded; the loader makes none.)
    pub const ENCODED: Self = Self { held: 1, per_batch: 2, what: "the batch, its encoding and the send buffer" };

    /// Local streams: their slots of shared memory, and each batch once until it is copied into
    /// a slot.
    #[must_use]
    pub fn shared_memory(slots: u32) -> Self {
        Self { held: u64::from(slots), per_batch: 1, what: "the batch being made and the stream's slots of shared memory" }
    }
}

/// Budget accounting unit: the semaphore counts KiB.
const UNIT: u64 = 1024;

/// The Arrow bytes one row of `data_type` takes (strings and binaries estimated at 64 bytes).
fn value_bytes(data_type: &DataType) -> u64 {
    match data_type {
        DataType::FixedSizeList(item, n) => *n as u64 * value_bytes(item.data_type()),
        DataType::Utf8 | DataType::Binary => 4 + 64,
        DataType::LargeUtf8 | DataType::LargeBinary => 8 + 64,
        DataType::Boolean => 1,
        other => other.primitive_width().unwrap_or(64) as u64,
    }
}

/// The bytes a batch of `rows` samples of `schema` takes. A packet camera's GOPs
/// (`{camera}_packets`) are counted as one RGB frame of the camera per sample: a GOP of
/// compressed frames that a sample ships, and which later samples share, stays within that
/// unless its frames compress less than its length.
pub fn batch_bytes(schema: &SchemaRef, rows: usize) -> u64 {
    let row = |f: &arrow::datatypes::FieldRef| -> u64 {
        let camera = f.name().strip_suffix(lake_loader::PACKETS_SUFFIX).and_then(|c| schema.field_with_name(c).ok());
        match camera.and_then(|c| c.metadata().get("frame_shape")).and_then(|s| serde_json::from_str::<Vec<u64>>(s).ok()) {
            Some(shape) => shape.iter().product(),
            None => value_bytes(f.data_type()),
        }
    };
    schema.fields().iter().map(row).sum::<u64>() * rows as u64
}

/// Counters exported at `/metrics`.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Batches sent.
    pub batches: AtomicU64,
    /// Samples sent.
    pub samples: AtomicU64,
    /// Arrow bytes sent (in-memory size of the batches).
    pub bytes: AtomicU64,
    /// Streams open now.
    pub active_streams: AtomicU64,
    /// Requests refused as invalid.
    pub bad_requests: AtomicU64,
    /// Requests for a dataset, version or view the lake does not have.
    pub not_found: AtomicU64,
    /// SQL queries refused or failed (bad SQL, a missing table, an error while running).
    pub sql_errors: AtomicU64,
    /// Requests that failed inside the server.
    pub internal_errors: AtomicU64,
    /// Requests refused for a missing or wrong token.
    pub unauthorized: AtomicU64,
    /// Streams that failed after starting, for another reason than a frame.
    pub stream_errors: AtomicU64,
    /// Requests and streams that failed on a frame the lake's data cannot give (see
    /// [`Refusal::Frame`]).
    pub frame_errors: AtomicU64,
    /// Requests and streams that failed because the lake's object store could not be reached
    /// (see [`Refusal::StoreUnavailable`]).
    pub store_errors: AtomicU64,
    /// Nanoseconds spent producing batches.
    pub batch_ns: AtomicU64,
    /// Streams waiting for room in the memory budget now (to start, or for their next batch).
    pub waiting_for_memory: AtomicU64,
    /// Streams waiting for room to start now (open streams prepare no batches in free room
    /// meanwhile).
    pub waiting_to_start: AtomicU64,
    /// Batches made and not yet taken by their client.
    pub ready_batches: AtomicU64,
    /// Batches being made now.
    pub batches_in_progress: AtomicU64,
    /// Batches waiting for one of the slots in which batches are made.
    pub batches_queued: AtomicU64,
    /// Batches made in free room of the memory budget, lent beyond their stream's own.
    pub lent_batches: AtomicU64,
    /// Times the room lent to a stream whose client was not reading was taken back for a
    /// stream waiting to start.
    pub reclaimed: AtomicU64,
    /// Streams refused because the memory budget had no room for them.
    pub busy: AtomicU64,
}

struct Prepared {
    /// The request's datasets, pinned to the versions the loader reads.
    datasets: Vec<DatasetRef>,
    loader: Arc<Loader>,
    order: Arc<Order>,
    last_used: Mutex<Instant>,
    /// The lookahead the open streams of each global batch and `drop_last` share (the ranks
    /// of one job): alive while one of them is.
    lookaheads: Mutex<HashMap<(u64, bool), Weak<Lookahead>>>,
    /// When the streams over this loader last looked whether `lake rm` removed one of its
    /// datasets.
    removal_looked: Mutex<Option<Instant>>,
}

impl Prepared {
    /// The lookahead of the streams of `sharding`'s global batch, joined by a stream that will
    /// visit `cursors`.
    fn join(&self, sharding: Sharding, cursors: impl Iterator<Item = Cursor> + Send + 'static, horizon: u64) -> Option<Member> {
        let mut shared = self.lookaheads.lock().expect("not poisoned");
        shared.retain(|_, l| l.strong_count() > 0);
        let key = (sharding.global_batch, sharding.drop_last);
        let lookahead = match shared.get(&key).and_then(Weak::upgrade) {
            Some(l) => l,
            None => {
                let budget = self.loader.cache_stats().budget;
                let l = Lookahead::new(self.loader.clone(), self.order.clone(), sharding, horizon, budget)?;
                shared.insert(key, Arc::downgrade(&l));
                l
            }
        };
        lookahead.join(sharding, cursors)
    }
}

/// The state shared by the Flight and HTTP services.
pub struct Service {
    lake: Lake,
    pub(crate) options: ServeOptions,
    resources: Resources,
    memory: Arc<Semaphore>,
    /// Slots in which batches are made, taken in order of asking (see [`Service::new`]).
    making: Arc<Semaphore>,
    /// SQL queries that may run at once ([`ServeOptions::sql_concurrency`]).
    sql_slots: Arc<Semaphore>,
    /// Decode counters of loaders no longer kept.
    retired: Mutex<DecodeStats>,
    stopping: tokio::sync::watch::Sender<bool>,
    /// The loaders of requests planned, by request; each made once, outside the map's lock, so
    /// that a request slow to plan (a mixture of many datasets) holds up only those asking
    /// for the same.
    prepared: Mutex<HashMap<String, Arc<tokio::sync::OnceCell<Arc<Prepared>>>>>,
    /// Loaders that may be made at once ([`ServeOptions::max_loaders`]).
    planning: Semaphore,
    /// Dataset versions' tables opened by earlier SQL sessions.
    sql_tables: lake_query::sql::OpenedTables,
    /// The memory every SQL query of the server draws from.
    sql_memory: lake_query::sql::SqlMemory,
    /// Streams that may hold lent room (see [`Service::reclaim_lent`]).
    lenders: Mutex<Vec<Weak<Making>>>,
    /// Counters.
    pub metrics: Metrics,
}

/// How often the streams over a loader look whether `lake rm` removed one of its datasets.
const REMOVAL_LOOK: std::time::Duration = std::time::Duration::from_secs(1);

/// How long a client must have left a stream's batches untaken before the room lent to it may
/// be taken back for a stream that waits to start.
const IDLE_LENDER: std::time::Duration = std::time::Duration::from_secs(1);

/// A batch made for a stream: the loader's result (or why the stream ends), its room, and the
/// `ready_batches` unit.
type Made = (Result<lake_loader::LoadedBatch<SampleBatch>>, (OwnedSemaphorePermit, Option<LentRoom>), Gauge);

/// The batches a stream is making, shared with admission, which takes them back from a client
/// that does not read while room lent to it is wanted (see [`Service::reclaim_lent`]).
struct Making {
    state: Mutex<MakingState>,
    /// Batches of this stream in lent room now (counted by [`LentRoom`], which must not hold
    /// the `Making` its batch sits in).
    lent: Arc<AtomicU64>,
    /// The stream's own room, and how much of it a batch takes.
    own: Arc<Semaphore>,
    need: u32,
}

struct MakingState {
    /// The batches being made and ready, in order; `None` once taken back (made again from
    /// `delivered` on when the client asks).
    pipeline: Option<Pin<Box<dyn Stream<Item = Made> + Send>>>,
    /// Batches handed to the client.
    delivered: u64,
    /// Whether the client waits for a batch now.
    waiting: bool,
    /// When the client last took a batch (or the stream started).
    last_taken: Instant,
    /// The room of the batch last handed to the client (being encoded, sent, or waiting in the
    /// transport for a client that paused), given back when the client asks for the next.
    held: Option<(OwnedSemaphorePermit, Option<LentRoom>)>,
}

/// Room lent to a batch: the server's `lent_batches` unit and its stream's.
struct LentRoom(#[allow(dead_code)] Gauge, Arc<AtomicU64>);

impl LentRoom {
    fn new(service: Arc<Service>, stream: Arc<AtomicU64>) -> Self {
        stream.fetch_add(1, Ordering::Relaxed);
        Self(Gauge::up(service, |m| &m.lent_batches), stream)
    }
}

impl Drop for LentRoom {
    fn drop(&mut self) {
        self.1.fetch_sub(1, Ordering::Relaxed);
    }
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service").field("lake", &self.lake.display_root()).finish_non_exhaustive()
    }
}

/// Batches of one request, in order.
pub type Batches = Pin<Box<dyn Stream<Item = Result<SampleBatch>> + Send>>;

/// One unit of a gauge, given back when dropped (a stream that ends, a client that goes away).
struct Gauge {
    service: Arc<Service>,
    pick: fn(&Metrics) -> &AtomicU64,
}

impl Gauge {
    fn up(service: Arc<Service>, pick: fn(&Metrics) -> &AtomicU64) -> Self {
        pick(&service.metrics).fetch_add(1, Ordering::Relaxed);
        Self { service, pick }
    }
}

impl Drop for Gauge {
    fn drop(&mut self) {
        (self.pick)(&self.service.metrics).fetch_sub(1, Ordering::Relaxed);
    }
}

fn add_stats(a: &DecodeStats, b: &DecodeStats) -> DecodeStats {
    DecodeStats {
        groups: a.groups + b.groups,
        packets: a.packets + b.packets,
        frames: a.frames + b.frames,
        decode_ns: a.decode_ns + b.decode_ns,
        packet_bytes: a.packet_bytes + b.packet_bytes,
        fetch_ns: a.fetch_ns + b.fetch_ns,
        table_frames_decoded: a.table_frames_decoded + b.table_frames_decoded,
    }
}

impl Service {
    /// A service over `lake`.
    ///
    /// Batches are made in twice as many slots as there are decode threads, which streams take
    /// in the order they ask: that keeps the pool busy (one batch's packets are read while
    /// another's are decoded), and a batch, once started, finishes in about the time the pool
    /// needs for it. With a slot per stream, 64 streams each had a half-decoded batch in memory
    /// at once, and the server spent a tenth of its decode time faulting in fresh pages.
    ///
    /// # Errors
    /// When the decode threads cannot be started.
    pub fn new(lake: Lake, options: ServeOptions) -> Result<Arc<Self>> {
        let (stopping, _) = tokio::sync::watch::channel(false);
        let resources = Resources::new(options.loader.threads, options.loader.cache_bytes)?;
        let sql_memory = lake_query::sql::SqlMemory::new(options.sql_memory_bytes.max(1))?;
        let slots = 2 * resources.threads();
        let sql_slots = options.sql_concurrency.max(1);
        let planning = Semaphore::new(options.max_loaders.max(1));
        let permits = usize::try_from((options.memory_bytes / UNIT).max(1)).unwrap_or(Semaphore::MAX_PERMITS).min(Semaphore::MAX_PERMITS);
        Ok(Arc::new(Self {
            lake,
            options,
            resources,
            memory: Arc::new(Semaphore::new(permits)),
            making: Arc::new(Semaphore::new(slots)),
            sql_slots: Arc::new(Semaphore::new(sql_slots)),
            retired: Mutex::new(DecodeStats::default()),
            stopping,
            prepared: Mutex::new(HashMap::new()),
            planning,
            sql_tables: lake_query::sql::OpenedTables::default(),
            sql_memory,
            lenders: Mutex::new(Vec::new()),
            metrics: Metrics::default(),
        }))
    }

    /// Takes back the room lent to streams whose clients have left their batches untaken for
    /// [`IDLE_LENDER`] (a trainer paused to evaluate or checkpoint): the batches they were
    /// making or had ready are dropped, and made again, in their own room, when the client
    /// reads on. Called while a stream waits to start, so that prepared-ahead batches never
    /// keep it out.
    fn reclaim_lent(&self) {
        let mut lenders = self.lenders.lock().expect("not poisoned");
        lenders.retain(|l| l.strong_count() > 0);
        for making in lenders.iter().filter_map(Weak::upgrade) {
            if making.lent.load(Ordering::Relaxed) == 0 {
                continue;
            }
            // A stream being polled now is read: left alone.
            let Ok(mut state) = making.state.try_lock() else { continue };
            if state.waiting || state.last_taken.elapsed() < IDLE_LENDER {
                continue;
            }
            let mut freed = state.pipeline.take().is_some();
            // The batch the client was handed last, in lent room, moves into the stream's own
            // (free once its pipeline is gone): it stays where it is, in the transport, and the
            // lent room is free.
            if matches!(state.held, Some((_, Some(_))))
                && let Ok(mine) = making.own.clone().try_acquire_many_owned(making.need)
            {
                state.held = Some((mine, None));
                freed = true;
            }
            if freed {
                self.metrics.reclaimed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Begins a graceful shutdown: every open stream ends after the batch it is sending, so the
    /// servers can finish their calls and stop.
    pub fn shut_down(&self) {
        self.stopping.send_replace(true);
    }

    /// The lake served.
    pub fn lake(&self) -> &Lake {
        &self.lake
    }

    /// Refuses a request that would write to the lake when the server serves it read-only.
    ///
    /// # Errors
    /// [`Error::ReadOnly`] under [`ServeOptions::read_only`].
    pub fn writable(&self) -> Result<()> {
        if self.options.read_only {
            return Err(Error::ReadOnly(
                "this server serves its lake read-only (`lake serve --read-only`): make views with `lake view create`, or through a \
                 server that may write"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Whether `token` (the value after `Bearer `) is accepted.
    pub fn authorized(&self, token: Option<&str>) -> bool {
        // Compared in constant time: how long a refusal takes says nothing about a token.
        let same = |k: &String, t: &str| k.len() == t.len() && k.bytes().zip(t.bytes()).fold(0u8, |d, (a, b)| d | (a ^ b)) == 0;
        let ok = self.options.tokens.is_empty() || token.is_some_and(|t| self.options.tokens.iter().fold(false, |hit, k| hit | same(k, t)));
        if !ok {
            self.metrics.unauthorized.fetch_add(1, Ordering::Relaxed);
        }
        ok
    }

    /// The loader single steps of a dataset version are read with (the web app's frames and
    /// episodes): no windows, the recorded frames; shared and evicted like a request's.
    ///
    /// # Errors
    /// When the version cannot be opened.
    pub(crate) async fn browsing(&self, record: &lake_schemas::CommitRecord) -> Result<Arc<Loader>> {
        let spec = format!("{}@{}", record.name, record.version);
        let request: SampleRequest = serde_json::from_value(serde_json::json!({"datasets": [spec], "delta_timestamps": null}))
            .map_err(|e| Error::Internal(format!("a browse request: {e}")))?;
        Ok(self.prepare(&request).await?.loader.clone())
    }

    /// `request` with every dataset and view it names by name alone pinned to its latest
    /// version (`NAME@VERSION` as it is), so that a later ingest or `lake view create --replace`
    /// makes a new loader for new requests while streams already open keep their version.
    async fn pinned(&self, request: &SampleRequest) -> SampleRequest {
        let mut pinned = request.clone();
        for d in &mut pinned.datasets {
            let entry = match d {
                DatasetRef::Name(name) | DatasetRef::Weighted { name, .. } => name,
            };
            // `NAME=WEIGHT` is a name with its weight, as on the command line.
            let (name, weight) = match entry.rsplit_once('=') {
                Some((name, weight)) => (name, Some(weight)),
                None => (entry.as_str(), None),
            };
            // A bad or unknown name is left for opening to refuse with the lake's list.
            if name.contains('@') || lake_store::validate_name(name).is_err() {
                continue;
            }
            let version = match self.lake.latest(name).await.ok().flatten() {
                Some(record) => Some(record.version),
                None => self.lake.view(name).await.ok().flatten().map(|v| v.version),
            };
            if let Some(version) = version {
                let weight = weight.map(|w| format!("={w}")).unwrap_or_default();
                *entry = format!("{name}@{version}{weight}");
            }
        }
        pinned
    }

    /// The first dataset of `prepared`'s loader that `lake rm` removed, with its removal (one
    /// listing of the removal records per dataset).
    async fn removed_from(&self, prepared: &Prepared) -> Result<Option<(String, lake_store::Removal)>> {
        *prepared.removal_looked.lock().expect("not poisoned") = Some(Instant::now());
        for ds in prepared.loader.datasets() {
            let version = ds.record.version;
            let removals = self.lake.removals(&ds.record.name).await?;
            if let Some(removal) = removals.into_iter().find(|r| (r.from_version..=r.through_version).contains(&version)) {
                return Ok(Some((ds.label.clone(), removal)));
            }
        }
        Ok(None)
    }

    /// The error that ends a stream over `prepared` when `lake rm` removed one of its datasets
    /// (its files are gone, or soon will be): looked for after a batch failed, and before
    /// making one at most every [`REMOVAL_LOOK`] (streams over one loader share the look), so
    /// that a stream ends with the reason whether or not its next batch would have found the
    /// files it needs.
    async fn ended_by_removal(&self, prepared: &Prepared, failed: bool) -> Option<Error> {
        {
            let mut looked = prepared.removal_looked.lock().expect("not poisoned");
            if !failed && looked.is_some_and(|at| at.elapsed() < REMOVAL_LOOK) {
                return None;
            }
            // Looked at from here on: the streams over this loader do not all look at once.
            *looked = Some(Instant::now());
        }
        match self.removed_from(prepared).await {
            Ok(Some((label, removal))) => {
                Some(Error::NotFound(format!("dataset `{label}` was removed from the lake while this stream read it: {removal}")))
            }
            // A lake whose records cannot be listed now fails the batch that needs it instead.
            Ok(None) | Err(_) => None,
        }
    }

    /// `e`, or, when it is a failure to read the files of a dataset that `lake rm` removed
    /// while the request read it, the removal (not found, as the dataset now is).
    pub async fn explained(&self, e: Error) -> Error {
        if refusal_kind(&e) != Refusal::Internal {
            return e;
        }
        match self.lake.removal_behind(&e.to_string()).await {
            Some(removal) => Error::NotFound(format!("{removal}, while this request read it")),
            None => e,
        }
    }

    async fn prepare(&self, request: &SampleRequest) -> Result<Arc<Prepared>> {
        request.check().map_err(invalid)?;
        let request = &self.pinned(request).await;
        let key = request.key();
        let guard = {
            let mut prepared = self.prepared.lock().expect("not poisoned");
            Unmade { map: &self.prepared, slot: prepared.entry(key.clone()).or_default().clone(), key: key.clone() }
        };
        let p = guard
            .slot
            .get_or_try_init(|| async {
                // At most `max_loaders` made at once (a burst of new requests would otherwise
                // open every one's datasets together, before the limit trims them).
                let _permit = self.planning.acquire().await.map_err(|_| Error::ShuttingDown)?;
                let sampling = views::open_sampling(&self.lake, &request.spec()).await?;
                let loader = Arc::new(Loader::with_resources(
                    sampling.datasets,
                    &request.windows()?,
                    self.options.loader.frame_table,
                    self.resources.clone(),
                )?);
                let order = if request.shuffle { Order::new(request.seed, sampling.sources) } else { Order::in_sequence(sampling.sources) };
                let order = Arc::new(order?);
                Ok::<_, Error>(Arc::new(Prepared {
                    datasets: request.datasets.clone(),
                    loader,
                    order,
                    last_used: Mutex::new(Instant::now()),
                    lookaheads: Mutex::default(),
                    removal_looked: Mutex::default(),
                }))
            })
            .await;
        let p = match p {
            Ok(p) => p.clone(),
            Err(e) => return Err(self.explained(e).await),
        };
        drop(guard);
        // A dataset `lake rm` removed since the loader was made is gone for new requests too.
        if let Some((label, removal)) = self.removed_from(&p).await? {
            let mut prepared = self.prepared.lock().expect("not poisoned");
            // Only this loader's slot (a request may be making a new one under the key).
            if prepared.get(&key).and_then(|s| s.get()).is_some_and(|made| Arc::ptr_eq(made, &p)) {
                prepared.remove(&key);
                let (old, mut retired) = (p.loader.decode_stats(), self.retired.lock().expect("not poisoned"));
                *retired = add_stats(&retired, &old);
            }
            return Err(Error::NotFound(format!("no dataset `{label}` in the lake: {removal}")));
        }
        let p = &p;
        let mut prepared = self.prepared.lock().expect("not poisoned");
        *p.last_used.lock().expect("not poisoned") = Instant::now();
        // Loaders beyond the limit go, the least recently used first (those being made stay).
        while prepared.values().filter(|s| s.initialized()).count() > self.options.max_loaders.max(1) {
            let Some(oldest) = prepared
                .iter()
                .filter_map(|(k, s)| Some((k, *s.get()?.last_used.lock().expect("not poisoned"))))
                .filter(|(k, _)| **k != key)
                .min_by_key(|(_, used)| *used)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            if let Some(evicted) = prepared.remove(&oldest).and_then(|s| s.get().cloned()) {
                let (old, mut retired) = (evicted.loader.decode_stats(), self.retired.lock().expect("not poisoned"));
                *retired = add_stats(&retired, &old);
            }
        }
        Ok(p.clone())
    }

    /// The schema of a request's batches and the shape of its epochs, for a stream over a
    /// transport holding `footprint` of its batches.
    ///
    /// # Errors
    /// When the request is not valid for the lake, or its stream could never fit in the memory
    /// budget.
    pub async fn describe(&self, request: &SampleRequest, footprint: Footprint) -> Result<Plan> {
        let prepared = self.prepare(request).await.inspect_err(|e| self.count_refusal(e))?;
        let epoch_len = prepared.order.epoch_len();
        let (_, steps_per_epoch) = self.steps_of(request, epoch_len)?;
        // Nor is a stream that could never fit in the memory budget.
        self.room(&prepared.loader.schema(), request.batch_size, footprint)?;
        let sources = prepared.loader.datasets().iter().map(|ds| ds.label.clone()).collect();
        Ok(Plan { datasets: prepared.datasets.clone(), sources, schema: prepared.loader.schema(), epoch_len, steps_per_epoch })
    }

    /// What a trainer builds its policy from for `request`: the rate, the features as samples
    /// carry them, the statistics of the steps sampled (a mixture's combined), the datasets.
    ///
    /// # Errors
    /// As [`Service::describe`] for datasets that cannot be opened; [`Error::Invalid`] for a
    /// mixture of rates or of features.
    pub async fn sampling_facts(&self, request: &SampleRequest) -> Result<lake_stats::SamplingFacts> {
        request.check().map_err(invalid).inspect_err(|e| self.count_refusal(e))?;
        // The facts do not depend on the windows, but a request whose windows cannot be made is
        // refused here as its stream would be.
        request.windows().inspect_err(|e| self.count_refusal(e))?;
        lake_stats::sampling_facts(&self.lake, &request.spec())
            .await
            .map_err(|e| match e {
                lake_stats::Error::Store(e) => Error::Store(e),
                lake_stats::Error::Loader(e) => Error::Loader(e),
                lake_stats::Error::Invalid(m) => Error::Invalid(m),
            })
            .inspect_err(|e| self.count_refusal(e))
    }

    /// The request's sharding and steps per epoch over `epoch_len` positions, refusing (and
    /// counting) a global batch larger than the epoch or a start past its last step: what a
    /// plan promises, its stream must be able to keep.
    fn steps_of(&self, request: &SampleRequest, epoch_len: u64) -> Result<(Sharding, u64)> {
        let global = request.batch_size * request.world_size;
        let sharding = Sharding::new(global, request.rank, request.world_size, request.drop_last).inspect_err(|_| self.count_bad())?;
        let steps = sharding.steps_per_epoch(epoch_len);
        if steps == 0 {
            self.count_bad();
            let what = if request.datasets.len() > 1 {
                "positions of the mixture's epoch (its datasets' eligible steps rounded up to whole blocks of 4096)"
            } else {
                "eligible steps"
            };
            return Err(Error::Invalid(format!("the global batch of {global} is larger than the {epoch_len} {what}")));
        }
        if request.start_step >= steps {
            self.count_bad();
            return Err(Error::Invalid(format!(
                "start_step {} is past the epoch's last step ({steps} steps of {global} samples per epoch: steps 0 to {})",
                request.start_step,
                steps - 1
            )));
        }
        Ok((sharding, steps))
    }

    /// The rows a request's stream sends in all, when known up front (a limited stream): every
    /// batch whole, less what this rank misses at each visit of an epoch's short last step.
    /// `None` for an endless stream.
    pub fn records(&self, request: &SampleRequest, epoch_len: u64) -> Option<u64> {
        let limit = request.limit_batches?;
        let (sharding, steps) = self.steps_of(request, epoch_len).ok()?;
        let last = sharding.positions(epoch_len, steps - 1);
        let short = sharding.per_rank() - (last.end - last.start);
        // Global steps from the start: start_step + k * stride for k in 0..limit, each at step
        // (start_step + k * stride) mod steps of its epoch.
        let visits = if short == 0 { 0 } else { congruent_count(request.start_step, request.step_stride.max(1), steps, limit) };
        let rows = u128::from(limit) * u128::from(sharding.per_rank()) - u128::from(visits) * u128::from(short);
        u64::try_from(rows).ok()
    }

    /// A read-only SQL session over the lake as it is now, whose spanning tables refuse to
    /// answer without a dataset that cannot be read. Versions' tables opened by earlier sessions
    /// are reused.
    ///
    /// # Errors
    /// When the catalog cannot be read.
    pub async fn sql_session(&self) -> Result<lake_query::sql::LakeSql> {
        lake_query::sql::LakeSql::open_with(&self.lake, &self.sql_tables, &self.sql_memory).await?.read_only().whole_answers_only().await
    }

    /// Runs `query` in `session` on a thread of its own, as a stream that ends with an error
    /// once it has run for the server's SQL timeout (see
    /// [`LakeSql::stream_apart`](lake_query::sql::LakeSql::stream_apart)).
    ///
    /// # Errors
    /// As [`LakeSql::stream`](lake_query::sql::LakeSql::stream).
    pub async fn sql_stream(
        &self,
        session: lake_query::sql::LakeSql,
        query: &str,
        slot: OwnedSemaphorePermit,
    ) -> Result<datafusion::execution::SendableRecordBatchStream> {
        let limit = self.options.sql_timeout;
        // A shutdown stops a query still running (it is dropped, so its thread stops too), with
        // an error that answers `UNAVAILABLE` / 503 before the answer began.
        let mut stopping = self.stopping.subscribe();
        let stream = tokio::select! {
            stream = session.stream_apart(query.to_string(), tokio::time::Instant::now() + limit, limit, slot) => stream?,
            _ = stopping.wait_for(|s| *s) => return Err(Error::ShuttingDown),
        };
        let schema = stream.schema();
        let stopped = || datafusion::error::DataFusionError::External(Box::new(Error::ShuttingDown));
        Ok(Box::pin(datafusion::physical_plan::stream::RecordBatchStreamAdapter::new(schema, self.until_shutdown(stream, stopped))))
    }

    /// `stream`, ended by a shutdown with the error `stopped` makes (never as if it were
    /// complete).
    fn until_shutdown<T, E>(
        &self,
        stream: impl Stream<Item = std::result::Result<T, E>> + Send + 'static,
        stopped: impl Fn() -> E + Send + 'static,
    ) -> impl Stream<Item = std::result::Result<T, E>> + Send + 'static {
        let mut stopping = self.stopping.subscribe();
        let mut stop = Some(Box::pin(async move {
            let _ = stopping.wait_for(|s| *s).await;
        }));
        // Dropped with the stop: its work stops then, not when the consumer lets go.
        let mut stream = Some(Box::pin(stream));
        futures::stream::poll_fn(move |cx| {
            let (Some(waiting), Some(inner)) = (stop.as_mut(), stream.as_mut()) else { return Poll::Ready(None) };
            if waiting.as_mut().poll(cx).is_ready() {
                (stop, stream) = (None, None);
                return Poll::Ready(Some(Err(stopped())));
            }
            let next = inner.as_mut().poll_next(cx);
            if matches!(next, Poll::Ready(None)) {
                (stop, stream) = (None, None);
            }
            next
        })
    }

    /// SQL queries running now.
    pub fn sql_running(&self) -> usize {
        self.options.sql_concurrency.max(1).saturating_sub(self.sql_slots.available_permits())
    }

    /// One of the server's SQL slots ([`ServeOptions::sql_concurrency`]), for a query to hold
    /// while its thread runs (at most until its timeout).
    ///
    /// # Errors
    /// [`Error::Busy`] when every slot is taken.
    pub fn sql_slot(&self) -> Result<OwnedSemaphorePermit> {
        self.sql_slots.clone().try_acquire_owned().map_err(|_| {
            Error::Busy(format!(
                "{} SQL queries are running, as many as this server runs at once (`lake serve --sql-concurrency`); retry shortly",
                self.options.sql_concurrency.max(1)
            ))
        })
    }

    /// Parses a sampling request, counting malformed ones.
    ///
    /// # Errors
    /// [`Error::Invalid`] naming the field and position.
    pub fn parse_request(&self, bytes: &[u8]) -> Result<SampleRequest> {
        self.parse_within(bytes, MAX_REQUEST_BYTES, "sampling request")
    }

    /// Parses a Flight ticket: a request as a plan wrote it back out, with its defaults and
    /// dataset versions filled in, so allowed to be larger than a request.
    ///
    /// # Errors
    /// As [`Service::parse_request`].
    pub fn parse_ticket(&self, bytes: &[u8]) -> Result<SampleRequest> {
        self.parse_within(bytes, MAX_TICKET_BYTES, "ticket")
    }

    fn parse_within(&self, bytes: &[u8], limit: usize, what: &str) -> Result<SampleRequest> {
        if bytes.len() > limit {
            self.count_bad();
            return Err(Error::Invalid(format!("the {what} is {} bytes, over the {} MiB limit", bytes.len(), limit >> 20)));
        }
        SampleRequest::from_json(bytes).map_err(invalid).inspect_err(|_| self.count_bad())
    }

    pub(crate) fn count_bad(&self) {
        self.metrics.bad_requests.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a refused request by its kind.
    fn count_refusal(&self, e: &Error) {
        let counter = match refusal_kind(e) {
            Refusal::BadRequest | Refusal::TooLarge | Refusal::ReadOnly => &self.metrics.bad_requests,
            Refusal::NotFound => &self.metrics.not_found,
            Refusal::Busy | Refusal::Unavailable => &self.metrics.busy,
            Refusal::Internal => &self.metrics.internal_errors,
            Refusal::Frame => &self.metrics.frame_errors,
            Refusal::StoreUnavailable => &self.metrics.store_errors,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a SQL query that was refused or failed: as a SQL error, as busy when every SQL
    /// slot was taken, or as an internal one when the lake's files could not be read.
    pub fn count_sql_error(&self, e: &Error) {
        let counter = match refusal_kind(e) {
            Refusal::Internal | Refusal::Frame => &self.metrics.internal_errors,
            Refusal::StoreUnavailable => &self.metrics.store_errors,
            Refusal::Busy | Refusal::Unavailable => &self.metrics.busy,
            _ => &self.metrics.sql_errors,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// The batches of `request` for its rank, from its start on. The work stops when the returned
    /// stream is dropped (a client that goes away), and at most `prefetch` batches are prepared
    /// ahead of a slow reader.
    ///
    /// # Errors
    /// When the request is not valid for the lake (unknown dataset, impossible window, rank
    /// outside the world, …).
    pub async fn batches(self: &Arc<Self>, request: &SampleRequest) -> Result<(SchemaRef, Batches)> {
        self.batches_held(request, Footprint::ENCODED).await
    }

    /// The room in the memory budget a stream of `batch_size` samples of `schema` holds while
    /// open and takes for each batch, in budget units; refused (and counted) when the two do not
    /// fit in the whole budget.
    fn room(&self, schema: &SchemaRef, batch_size: u64, footprint: Footprint) -> Result<(u64, u64)> {
        let one = batch_bytes(schema, batch_size as usize).div_ceil(UNIT).max(1);
        let need = footprint.per_batch.max(1) * one;
        let held = footprint.held * one;
        let budget = (self.options.memory_bytes / UNIT).max(1);
        if held + need > budget {
            self.count_bad();
            return Err(Error::Invalid(format!(
                "one batch of {batch_size} samples takes {} MiB, and a stream needs room for {} of them ({}): more than the server's memory budget of {} MiB; ask for smaller batches",
                (one * UNIT) >> 20,
                footprint.held + footprint.per_batch.max(1),
                footprint.what,
                self.options.memory_bytes >> 20
            )));
        }
        Ok((held, need))
    }

    /// [`Service::batches`] for a transport that holds `footprint` of the stream's batches.
    ///
    /// # Errors
    /// As [`Service::batches`].
    pub async fn batches_held(self: &Arc<Self>, request: &SampleRequest, footprint: Footprint) -> Result<(SchemaRef, Batches)> {
        let prepared = self.prepare(request).await.inspect_err(|e| self.count_refusal(e))?;
        let (sharding, _) = self.steps_of(request, prepared.order.epoch_len())?;
        let schema = prepared.loader.schema();
        // What a stream costs (see `Footprint`): over gRPC / HTTP its send buffer keeps one
        // encoded batch for as long as the stream is open, and each batch it makes counts twice,
        // as made and encoded (a margin where nothing is copied). A stream reserves what its transport holds and room
        // for one batch when it starts, so it always makes progress; batches prepared beyond that
        // use free room only when there is some, never waiting for it, so they cannot crowd out
        // streams waiting to start.
        let (held, need) = self.room(&schema, request.batch_size, footprint)?;
        // Room frees as clients take prefetched batches, so a new stream waits a little for it
        // before it is refused.
        let waiting = (Gauge::up(self.clone(), |m| &m.waiting_for_memory), Gauge::up(self.clone(), |m| &m.waiting_to_start));
        let units = u32::try_from(held + need).unwrap_or(u32::MAX);
        let mut stopping = self.stopping.subscribe();
        let admission = async {
            // Room lent to streams whose clients stopped reading is taken back while this waits.
            let acquire = self.memory.clone().acquire_many_owned(units);
            tokio::pin!(acquire);
            let mut look = tokio::time::interval(IDLE_LENDER / 4);
            loop {
                tokio::select! {
                    admitted = &mut acquire => break Some(admitted),
                    _ = look.tick() => self.reclaim_lent(),
                    // A shutdown refuses the streams still waiting to start, at once.
                    _ = stopping.wait_for(|s| *s) => break None,
                }
            }
        };
        let admitted = tokio::time::timeout(self.options.admission_wait, admission).await;
        drop(waiting);
        if matches!(admitted, Ok(None)) {
            self.count_refusal(&Error::ShuttingDown);
            return Err(Error::ShuttingDown);
        }
        let admitted = admitted.map(|a| a.expect("a shutdown returned above"));
        let Ok(Ok(reserved)) = admitted else {
            self.metrics.busy.fetch_add(1, Ordering::Relaxed);
            return Err(Error::Busy(format!(
                "the server's memory budget of {} MiB is taken by the streams open now (a stream of {} samples needs {} MiB to start); retry later",
                self.options.memory_bytes >> 20,
                request.batch_size,
                ((held + need) * UNIT) >> 20
            )));
        };
        // Batches prepared ahead: as many as fit in the per-stream prefetch bytes (at least one).
        let ahead = (self.options.prefetch_bytes / (need * UNIT)).clamp(1, 16) as usize;
        let need = u32::try_from(need).unwrap_or(u32::MAX);
        let stream_request = StreamRequest {
            order: prepared.order.clone(),
            sharding,
            start: Cursor { epoch: request.epoch, step: request.start_step },
            limit: request.limit_batches,
            stride: request.step_stride,
            prefetch: ahead,
            lookahead: self.options.lookahead,
        };
        // A GOP's other frames are mostly shown by other ranks of the same order, so the ranks
        // plan ahead together: each keeps what it decodes for whichever rank shows it next.
        let member = if stream_request.lookahead > 0 {
            prepared.join(sharding, lake_loader::cursors(&stream_request), stream_request.lookahead)
        } else {
            None
        };
        let guard = Gauge::up(self.clone(), |m| &m.active_streams);
        let mut last = Instant::now();
        let mut stopping = self.stopping.subscribe();
        let stop = async move {
            let _ = stopping.wait_for(|s| *s).await;
        };
        // Room for each batch is taken, in order, before it is made, and given back when the
        // client asks for the batch after it (by then the encoder is done with it): prepared,
        // ready and in-transit batches of all streams stay within the budget. The room is the
        // stream's own if it is free; else free room of the budget, lent for at most twice as
        // many batches as there are decode threads server-wide and only while no stream waits
        // to start; else the stream waits for its own. Preparing ahead hides a lone stream's
        // latency; with enough work queued it only holds memory, and it must not keep new
        // streams out (with free room taken whenever there was some, 64 streams opened at once
        // found the budget full and some were refused, although their own room fits).
        let lendable = 2 * self.resources.threads() as u64;
        let own = Arc::new(Semaphore::new(need as usize));
        let making = Arc::new(Making {
            state: Mutex::new(MakingState { pipeline: None, delivered: 0, waiting: false, last_taken: Instant::now(), held: None }),
            lent: Arc::new(AtomicU64::new(0)),
            own: own.clone(),
            need,
        });
        self.lenders.lock().expect("not poisoned").push(Arc::downgrade(&making));
        // Batches begun with the lookahead (each exactly once; a batch made again after its
        // room was taken back decodes its frames itself).
        let begun = Arc::new(AtomicU64::new(0));
        let member = member.map(Arc::new);
        let (loader, order, memory, counted) = (prepared.loader.clone(), prepared.order.clone(), self.memory.clone(), self.clone());
        let read = prepared.clone();
        let lender = making.lent.clone();
        let build = move |from: u64| -> Pin<Box<dyn Stream<Item = Made> + Send>> {
            let (memory, own, counted, lender) = (memory.clone(), own.clone(), counted.clone(), lender.clone());
            let (loader, order, member, begun, read) = (loader.clone(), order.clone(), member.clone(), begun.clone(), read.clone());
            let lending = counted.clone();
            let made = futures::stream::iter(lake_loader::cursors(&stream_request).zip(0u64..).skip(from as usize))
                .then(move |(cursor, index)| {
                    let (memory, own, service, lender) = (memory.clone(), own.clone(), lending.clone(), lender.clone());
                    async move {
                        if let Ok(mine) = own.clone().try_acquire_many_owned(need) {
                            return (cursor, index, (mine, None));
                        }
                        if service.metrics.waiting_to_start.load(Ordering::Relaxed) == 0
                            && service.metrics.lent_batches.load(Ordering::Relaxed) < lendable
                            && let Ok(free) = memory.try_acquire_many_owned(need)
                        {
                            return (cursor, index, (free, Some(LentRoom::new(service, lender))));
                        }
                        let waiting = Gauge::up(service, |m| &m.waiting_for_memory);
                        let permit = own.acquire_many_owned(need).await.expect("a stream's room is never closed");
                        drop(waiting);
                        (cursor, index, (permit, None))
                    }
                })
                .map(move |(cursor, index, permit)| {
                    let (loader, order, service, read) = (loader.clone(), order.clone(), counted.clone(), read.clone());
                    let ahead = match &member {
                        Some(m) if index >= begun.load(Ordering::Relaxed) => {
                            begun.store(index + 1, Ordering::Relaxed);
                            m.begin(cursor)
                        }
                        _ => lake_loader::Ahead::default(),
                    };
                    // Made on its own task: a batch that holds a making slot finishes whether or
                    // not its client reads (a slow reader must not keep the slot from other
                    // streams), and is abandoned when the stream is dropped.
                    let made = Spawned(tokio::spawn({
                        let service = service.clone();
                        async move {
                            // (Before taking a making slot: the look lists files, and must not
                            // hold a slot while it waits for them.)
                            if let Some(removed) = service.ended_by_removal(&read, false).await {
                                return Err(removed);
                            }
                            let queued = Gauge::up(service.clone(), |m| &m.batches_queued);
                            let slot = service.making.clone().acquire_owned().await.expect("the making slots are never closed");
                            drop(queued);
                            let _making = (Gauge::up(service.clone(), |m| &m.batches_in_progress), slot);
                            match lake_loader::load_samples_with(&loader, &order, sharding, cursor, &ahead).await {
                                Ok(loaded) => Ok(loaded),
                                Err(e) => Err(service.ended_by_removal(&read, true).await.unwrap_or(Error::Loader(e))),
                            }
                        }
                    }));
                    async move {
                        let loaded = made.await.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
                        (loaded, permit, Gauge::up(service, |m| &m.ready_batches))
                    }
                })
                .buffered(ahead);
            Box::pin(made)
        };
        let service = self.clone();
        // A shutdown ends the stream after the batch being sent, with an error (not the end of
        // a stream that was asked for), so that its client resumes from the next step.
        let mut stop = Some(Box::pin(stop));
        let batches = futures::stream::poll_fn(move |cx| {
            let _alive = (&guard, &reserved);
            // The client asks for another batch: the one it had is sent, its room is free. (Given
            // back here, not when the next batch arrives: a stream waiting for room holds none.)
            drop(making.state.lock().expect("not poisoned").held.take());
            let Some(stopping) = stop.as_mut() else { return Poll::Ready(None) };
            if stopping.as_mut().poll(cx).is_ready() {
                stop = None;
                return Poll::Ready(Some(Err(Error::ShuttingDown)));
            }
            let mut state = making.state.lock().expect("not poisoned");
            let from = state.delivered;
            let pipeline = state.pipeline.get_or_insert_with(|| build(from));
            let Poll::Ready(next) = pipeline.poll_next_unpin(cx) else {
                state.waiting = true;
                return Poll::Pending;
            };
            state.waiting = false;
            let Some((item, permit, ready)) = next else { return Poll::Ready(None) };
            state.delivered += 1;
            state.last_taken = Instant::now();
            state.held = Some(permit);
            drop(state);
            drop(ready);
            let m = &service.metrics;
            m.batch_ns.fetch_add(last.elapsed().as_nanos() as u64, Ordering::Relaxed);
            last = Instant::now();
            Poll::Ready(Some(match item {
                Ok(loaded) => {
                    m.batches.fetch_add(1, Ordering::Relaxed);
                    m.samples.fetch_add(loaded.batch.num_rows() as u64, Ordering::Relaxed);
                    m.bytes.fetch_add(loaded.batch.memory_size() as u64, Ordering::Relaxed);
                    Ok(loaded.batch)
                }
                // A dataset `lake rm` removed under the stream: what it reads is gone, as for
                // a request that names it.
                Err(e) if refusal_kind(&e) == Refusal::NotFound => {
                    m.not_found.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!("stream ended: {e}");
                    Err(e)
                }
                // A frame the lake's data cannot give: counted as such, the message sent.
                Err(e) if refusal_kind(&e) == Refusal::Frame => {
                    m.frame_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::error!("stream failed: {e}");
                    Err(e)
                }
                // The store went away under the stream: the client resumes once it answers.
                Err(e) if refusal_kind(&e) == Refusal::StoreUnavailable => {
                    m.store_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::error!("stream stopped, the lake's store unreachable: {e}");
                    Err(e)
                }
                Err(e) => {
                    m.stream_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::error!("stream failed: {e}");
                    Err(e)
                }
            }))
        });
        Ok((schema, Box::pin(AccessLog::new(request, batches))))
    }

    /// Decode counters of every loader the server has used.
    pub async fn decode_stats(&self) -> DecodeStats {
        let mut total = *self.retired.lock().expect("not poisoned");
        let loaders: Vec<Arc<Prepared>> = self.prepared.lock().expect("not poisoned").values().filter_map(|s| s.get().cloned()).collect();
        for p in loaders {
            total = add_stats(&total, &p.loader.decode_stats());
        }
        total
    }

    /// The metrics in Prometheus' text format.
    pub async fn prometheus(&self) -> String {
        let m = &self.metrics;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed).to_string();
        let seconds = |ns: u64| format!("{:.6}", ns as f64 / 1e9);
        let decode = self.decode_stats().await;
        let cache = self.resources.cache_stats();
        let budget = (self.options.memory_bytes / UNIT).max(1) * UNIT;
        let free = self.memory.available_permits() as u64 * UNIT;
        let mut out = String::new();
        for (name, kind, help, value) in [
            ("lake_batches_total", "counter", "Batches sent.", g(&m.batches)),
            ("lake_samples_total", "counter", "Samples sent.", g(&m.samples)),
            ("lake_bytes_total", "counter", "Arrow bytes of the batches sent.", g(&m.bytes)),
            ("lake_active_streams", "gauge", "Batch streams open now.", g(&m.active_streams)),
            (
                "lake_batch_seconds_total",
                "counter",
                "Time between batches, summed over streams.",
                seconds(m.batch_ns.load(Ordering::Relaxed)),
            ),
            ("lake_ready_batches", "gauge", "Batches made and waiting for their client (queue depth).", g(&m.ready_batches)),
            ("lake_batches_in_progress", "gauge", "Batches being made.", g(&m.batches_in_progress)),
            ("lake_batches_queued", "gauge", "Batches waiting for a slot to be made in.", g(&m.batches_queued)),
            ("lake_lent_batches", "gauge", "Batches held in room lent beyond their stream's own.", g(&m.lent_batches)),
            (
                "lake_lent_reclaimed_total",
                "counter",
                "Streams whose lent room was taken back (their client not reading) for a stream waiting to start.",
                g(&m.reclaimed),
            ),
            (
                "lake_streams_waiting_for_memory",
                "gauge",
                "Streams whose next batch waits for their own room (held by the batch being sent, or made ahead): free room is lent \
                 to at most twice the decode threads' batches, so this counts streams at their own pace, not a full budget.",
                g(&m.waiting_for_memory),
            ),
            ("lake_streams_waiting_to_start", "gauge", "Streams waiting for room in the memory budget to start.", g(&m.waiting_to_start)),
            ("lake_memory_budget_bytes", "gauge", "Bytes all streams' batches may hold.", budget.to_string()),
            ("lake_sql_memory_budget_bytes", "gauge", "Bytes SQL queries may hold together.", self.sql_memory.bytes().to_string()),
            ("lake_sql_memory_used_bytes", "gauge", "Bytes running SQL queries hold.", self.sql_memory.reserved().to_string()),
            ("lake_sql_running", "gauge", "SQL queries running.", self.sql_running().to_string()),
            (
                "lake_memory_used_bytes",
                "gauge",
                "Bytes held by batches being made, ready or sent.",
                budget.saturating_sub(free).to_string(),
            ),
            ("lake_decode_seconds_total", "counter", "Decode worker time.", seconds(decode.decode_ns)),
            ("lake_decoded_frames_total", "counter", "Frames decoded or read from frame tables.", decode.frames.to_string()),
            ("lake_decoded_packets_total", "counter", "Compressed packets fed to decoders.", decode.packets.to_string()),
            (
                "lake_frame_table_misses_total",
                "counter",
                "Frames that were to be read from a frame table and were decoded from their packets instead, the table having \
                 failed (damaged, cut short or gone): `lake verify` names it, `lake cache` mends it.",
                decode.table_frames_decoded.to_string(),
            ),
            ("lake_packet_bytes_total", "counter", "Compressed packet bytes read.", decode.packet_bytes.to_string()),
            ("lake_frame_cache_hits_total", "counter", "Decoded-frame cache hits.", cache.hits.to_string()),
            ("lake_frame_cache_misses_total", "counter", "Decoded-frame cache misses.", cache.misses.to_string()),
            ("lake_frame_cache_hit_ratio", "gauge", "Hits over lookups since start.", format!("{:.6}", cache.hit_rate())),
            ("lake_frame_cache_bytes", "gauge", "Bytes of frames cached.", cache.bytes.to_string()),
            (
                "lake_frame_cache_ahead_hits_total",
                "counter",
                "Frames shown from those decoded ahead for a later batch of the same order (counted in the hits).",
                cache.ahead_hits.to_string(),
            ),
            (
                "lake_frame_cache_ahead_bytes",
                "gauge",
                "Bytes of the cache's budget holding frames decoded ahead for later batches.",
                cache.reserved.to_string(),
            ),
            ("lake_frame_cache_budget_bytes", "gauge", "The cache's byte budget.", cache.budget.to_string()),
            ("lake_decode_threads", "gauge", "Threads of the decode pool.", self.resources.threads().to_string()),
        ] {
            out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n"));
        }
        out.push_str("# HELP lake_errors_total Requests refused or failed, by kind.\n# TYPE lake_errors_total counter\n");
        for (kind, v) in [
            ("bad_request", g(&m.bad_requests)),
            ("not_found", g(&m.not_found)),
            ("sql", g(&m.sql_errors)),
            ("internal", g(&m.internal_errors)),
            ("busy", g(&m.busy)),
            ("unauthorized", g(&m.unauthorized)),
            ("stream", g(&m.stream_errors)),
            ("frame", g(&m.frame_errors)),
            ("store", g(&m.store_errors)),
        ] {
            out.push_str(&format!("lake_errors_total{{kind=\"{kind}\"}} {v}\n"));
        }
        out
    }
}

pub mod assets;
pub mod browse;
pub mod do_get;
pub mod flight;
pub mod flight_sql;
pub mod http;
pub mod linger;
pub mod local;

/// How a failed request is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The request is malformed or impossible (HTTP 400, gRPC `INVALID_ARGUMENT`).
    BadRequest,
    /// It names something the lake does not have (404, `NOT_FOUND`).
    NotFound,
    /// The server's memory budget has no room for another stream now (503,
    /// `RESOURCE_EXHAUSTED`); retry later, or serve with a larger `--memory-mb`.
    Busy,
    /// A query needs more memory than its budget (507, `RESOURCE_EXHAUSTED`); asking again
    /// fails again (a smaller query, or a server with a larger `--sql-memory-mb`, may not).
    TooLarge,
    /// The server failed (500, `INTERNAL`); the message does not show internals.
    Internal,
    /// A frame could not be made from the lake's data (500, `DATA_LOSS`): its packets are
    /// damaged, or it decodes otherwise than ingest recorded its stream (in a colour space
    /// whose YUV planes cannot be served as the stream's schema promised). The message names
    /// the dataset, camera, episode, frame and what went wrong; asking again fails again.
    Frame,
    /// The server is shutting down (a stream it ended: gRPC `UNAVAILABLE`, an HTTP body broken
    /// off); resume from the next step.
    Unavailable,
    /// The lake's object store cannot be reached, or answers only with server errors (503 with
    /// `Retry-After`, `UNAVAILABLE`): a stream resumes, a query is asked again, once it answers.
    /// Logged in full and answered without the store's address.
    StoreUnavailable,
    /// The request would write to the lake, which this server may not (403,
    /// `PERMISSION_DENIED`): it serves it read-only, or the lake's storage refuses its writes.
    ReadOnly,
}

/// A stream's line in the access log (target `lake::access`, shown by default): the request,
/// the batches, rows and bytes sent, how long it ran and how it ended, written when the stream
/// is dropped.
struct AccessLog<S> {
    inner: S,
    request: String,
    batches: u64,
    rows: u64,
    bytes: u64,
    started: Instant,
    ended: Option<String>,
}

impl<S> AccessLog<S> {
    fn new(request: &SampleRequest, inner: S) -> Self {
        let datasets: Vec<String> = request
            .datasets
            .iter()
            .map(|d| match d {
                DatasetRef::Name(n) => n.clone(),
                DatasetRef::Weighted { name, weight } => format!("{name}={weight}"),
            })
            .collect();
        let request = format!(
            "datasets={} rank={}/{} batch_size={} seed={}{} epoch={} start_step={}",
            datasets.join(","),
            request.rank,
            request.world_size,
            request.batch_size,
            request.seed,
            if request.shuffle { "" } else { " unshuffled" },
            request.epoch,
            request.start_step
        );
        Self { inner, request, batches: 0, rows: 0, bytes: 0, started: Instant::now(), ended: None }
    }
}

impl<S: Stream<Item = Result<SampleBatch>> + Unpin> Stream for AccessLog<S> {
    type Item = Result<SampleBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<Option<Self::Item>> {
        let next = self.inner.poll_next_unpin(cx);
        match &next {
            Poll::Ready(Some(Ok(batch))) => {
                self.batches += 1;
                self.rows += batch.num_rows() as u64;
                self.bytes += batch.memory_size() as u64;
            }
            Poll::Ready(Some(Err(e))) => self.ended = Some(format!("failed: {e}")),
            Poll::Ready(None) if self.ended.is_none() => self.ended = Some("complete".into()),
            _ => {}
        }
        next
    }
}

impl<S> Drop for AccessLog<S> {
    fn drop(&mut self) {
        let ended = self.ended.take().unwrap_or_else(|| "closed before its end (the client left, or the server stopped it)".into());
        tracing::info!(
            target: "lake::access",
            "stream {}: {} batches, {} rows, {} bytes in {:.3} s; {ended}",
            self.request,
            self.batches,
            self.rows,
            self.bytes,
            self.started.elapsed().as_secs_f64()
        );
    }
}

/// The most bytes a status message takes in its `grpc-message` header, percent-encoded: gRPC
/// clients refuse a response whose headers pass their metadata limit, and then show their own
/// "metadata size exceeds limit" instead of the message (pyarrow 21 read a 3.7 KB message and
/// refused a 5 KB one); half of that leaves room for the other headers.
pub const MAX_STATUS_BYTES: usize = 2048;

/// `message`, cut to [`MAX_STATUS_BYTES`] once percent-encoded as gRPC sends it (what the client
/// sent, echoed in a refusal, can be long), and ending in `…` where cut.
pub fn status_message(message: String) -> String {
    // Printable ASCII travels as it is, but for `%`; every other byte as `%XX`.
    let cost = |c: char| if (' '..='~').contains(&c) && c != '%' { 1 } else { 3 * c.len_utf8() };
    if message.chars().map(cost).sum::<usize>() <= MAX_STATUS_BYTES {
        return message;
    }
    let room = MAX_STATUS_BYTES - cost('…');
    let mut used = 0;
    let cut = message.char_indices().find(|&(_, c)| {
        used += cost(c);
        used > room
    });
    let end = cut.map_or(message.len(), |(at, _)| at);
    format!("{}…", &message[..end])
}

/// The gRPC status answering a failed request.
pub fn grpc_status(e: &Error) -> tonic::Status {
    let (kind, message) = refusal(e);
    let message = status_message(message);
    match kind {
        Refusal::BadRequest => tonic::Status::invalid_argument(message),
        Refusal::NotFound => tonic::Status::not_found(message),
        Refusal::Busy | Refusal::TooLarge => tonic::Status::resource_exhausted(message),
        Refusal::Unavailable => tonic::Status::unavailable(message),
        Refusal::Internal => tonic::Status::internal(message),
        Refusal::Frame => tonic::Status::data_loss(message),
        Refusal::ReadOnly => tonic::Status::permission_denied(message),
        Refusal::StoreUnavailable => tonic::Status::unavailable(message),
    }
}

/// The token of an `Authorization: Bearer <token>` header value (the scheme in any case, as RFC
/// 9110 has it).
pub fn bearer_token(header: Option<&str>) -> Option<&str> {
    header.and_then(|v| v.split_once(' ')).filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer")).map(|(_, token)| token.trim())
}

/// The answer to a failed request: its kind and the message the client sees. Internal errors
/// are logged here in full and reported without detail.
pub fn refusal(e: &Error) -> (Refusal, String) {
    use lake_loader::Error as L;
    use lake_store::Error as S;
    let kind = refusal_kind(e);
    if kind == Refusal::StoreUnavailable {
        tracing::error!("request failed, the lake's store unreachable: {e}");
        return (kind, "the lake's object store cannot be reached now (the server log has the details); retry shortly".into());
    }
    if kind == Refusal::Internal {
        tracing::error!("request failed: {e}");
        let what = if matches!(e, Error::Storage(_)) { "reading the lake's files failed" } else { "internal error" };
        return (kind, format!("{what}; the server log has the details"));
    }
    // The lake's path on the server's disk is no business of its clients.
    if let Error::Store(S::NotFound { name, available, removed, .. })
    | Error::Loader(L::Store(S::NotFound { name, available, removed, .. })) = e
    {
        let has = if available.is_empty() { "the lake is empty".to_string() } else { format!("it has: {}", available.join(", ")) };
        return (kind, format!("no dataset `{name}` in the lake ({has}){}", lake_store::removed_hint(removed.as_deref())));
    }
    (kind, e.to_string())
}

fn refusal_kind(e: &Error) -> Refusal {
    use lake_loader::Error as L;
    use lake_store::Error as S;
    match e {
        Error::Invalid(_) | Error::Query(_) | Error::Loader(L::Request(_) | L::NoVideo { .. }) => Refusal::BadRequest,
        Error::Busy(_) => Refusal::Busy,
        Error::ResourcesExhausted(_) => Refusal::TooLarge,
        Error::ShuttingDown => Refusal::Unavailable,
        Error::ReadOnly(_) => Refusal::ReadOnly,
        Error::NotFound(_)
        | Error::Loader(L::NotFound(_))
        | Error::Store(S::NotFound { .. } | S::View { .. })
        | Error::Loader(L::Store(S::NotFound { .. })) => Refusal::NotFound,
        Error::Store(S::BadName { .. }) | Error::Loader(L::Store(S::BadName { .. })) => Refusal::BadRequest,
        Error::Loader(L::Decode { .. }) => Refusal::Frame,
        Error::StoreUnavailable(_) => Refusal::StoreUnavailable,
        e if lake_query::store_unreachable(e) => Refusal::StoreUnavailable,
        _ => Refusal::Internal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_message_fits_a_grpc_header_once_encoded() {
        let encoded = |m: &str| m.chars().map(|c| if (' '..='~').contains(&c) && c != '%' { 1 } else { 3 * c.len_utf8() }).sum::<usize>();
        assert_eq!(status_message("short".into()), "short");
        let at_limit = "a".repeat(MAX_STATUS_BYTES);
        assert_eq!(status_message(at_limit.clone()), at_limit, "a message at the limit is whole");
        for long in ["a".repeat(100_000), "é".repeat(50_000), "%".repeat(10_000), format!("{}ü", "a".repeat(MAX_STATUS_BYTES))] {
            let cut = status_message(long.clone());
            assert!(cut.ends_with('…') && encoded(&cut) <= MAX_STATUS_BYTES, "{} encoded bytes", encoded(&cut));
            assert!(long.starts_with(cut.trim_end_matches('…')), "a prefix of the message");
            assert!(encoded(&cut) > MAX_STATUS_BYTES - 12, "cut at the limit, not before: {}", encoded(&cut));
        }
    }

    #[test]
    fn a_null_delta_timestamps_means_no_windows_and_survives_a_ticket() {
        let windows = |json: &str| {
            let request = SampleRequest::from_json(json.as_bytes()).expect("valid");
            // A ticket is the request written back as JSON.
            let ticket = SampleRequest::from_json(&serde_json::to_vec(&request).expect("json")).expect("a valid ticket");
            assert_eq!(ticket, request, "{json}");
            request.windows().expect("windows")
        };
        let none = lake_loader::Preset::None;
        assert_eq!(windows(r#"{"datasets": ["a"], "preset": "act", "delta_timestamps": null}"#), Windows::Preset(none));
        assert_eq!(windows(r#"{"datasets": ["a"], "preset": "act"}"#), Windows::Preset(lake_loader::Preset::Act));
        let given = windows(r#"{"datasets": ["a"], "preset": "act", "delta_timestamps": {"action": [0.0]}}"#);
        assert_eq!(given, Windows::DeltaTimestamps(vec![("action".into(), vec![0.0])]));
    }

    #[test]
    fn visits_of_an_epochs_last_step_are_counted_as_a_walk_would() {
        for m in 1..12u64 {
            for b in 1..15u64 {
                for a in 0..m {
                    for n in 0..40u64 {
                        let walked = (0..n).filter(|k| (a + k * b) % m == m - 1).count() as u64;
                        assert_eq!(congruent_count(a, b, m, n), walked, "a {a} b {b} m {m} n {n}");
                    }
                }
            }
        }
        // Large values answer at once.
        assert_eq!(congruent_count(0, 65_536, 1 << 40, 1 << 40), 0);
        assert_eq!(congruent_count(3, 1, 4, u64::MAX), u64::MAX / 4 + 1);
    }
}
