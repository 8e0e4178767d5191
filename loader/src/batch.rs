//! Sample assembly: LeRobot's `__getitem__` for a batch of steps at once.
//!
//! For every windowed key the query rows are the step's row plus each offset, clamped to the
//! episode, with `{key}_is_pad` marking the clamped slots (padded slots repeat the boundary
//! step's values and frame, as LeRobot does). Step columns are gathered with Arrow `take`.
//! Frames are planned per batch: the distinct `packets` rows the batch shows are looked up in
//! the frame cache, the rest grouped by `(stream, keyframe)`; each group's packets are read in
//! one Lance `take`, decoded once on the decode pool by a decoder reused for the stream, and
//! fanned out to every sample and window slot that shows them.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    mem::MaybeUninit,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Instant,
};

use arrow::{
    array::{ArrayRef, AsArray, BooleanArray, FixedSizeListArray, Int64Array, RecordBatch, UInt64Array},
    compute::{cast, take},
    datatypes::{DataType, Field, Schema, SchemaRef},
};
use lake_codec::{PIXEL_FORMAT, StreamDecoder, YUV_TO_RGB};
use lake_schemas::tables::TASK;
use rayon::prelude::*;

use crate::{
    Error, Result,
    cache::{CacheStats, Frame, FrameCache},
    dataset::{LoaderDataset, StoredFrames},
    frames::{FrameExtent, FrameStorage, ReadError},
    idle::{IDLE_DECODER_BYTES_PER_THREAD, IdlePool},
    lookahead::{Ahead, FrameRef},
    sampler::Draw,
    samples::{BatchColumn, DTYPE, FrameColumn, LAYOUT, SHAPE, SampleBatch, camera_array},
    spec::{DatasetKeys, Window, Windows, resolve_windows},
    usage::thread_cpu_seconds,
};
use lake_schemas::FrameFormat;

/// The column a mixture's batches end with: which of its datasets (their position among the
/// datasets sampled, a view's each) each sample came from, as LeRobot's `MultiLeRobotDataset`
/// adds it (int64).
pub const DATASET_INDEX: &str = "dataset_index";

/// Index columns LeRobot returns as int64 scalars.
const INT64_COLUMNS: [&str; 4] = ["index", "episode_index", "frame_index", "task_index"];

/// The decoded-frame cache's default budget, in MiB. A stream keeps there the frames it decodes
/// ahead for its own later batches (the rest of each GOP it decodes): with LeRobot's GOP 2, 2 GiB
/// let a 10 000-step, 480x640 dataset decode nearly every frame once per epoch (48 % of frames
/// shown came from it, against 28 % with 512 MiB).
pub const DEFAULT_CACHE_MIB: u64 = 2048;

/// Settings of a [`Loader`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoaderOptions {
    /// Decode threads (0: one per core).
    pub threads: usize,
    /// Byte budget of the decoded-frame cache (0 disables it).
    pub cache_bytes: u64,
    /// Read frames from a dataset's decoded-frame table (`lake cache`) when it has one.
    pub frame_table: bool,
}

/// What loaders can share: the decode pool and the decoded-frame cache. A server shares one
/// between all its loaders, so its decode threads and cache bytes stay within their settings
/// however many requests it serves.
#[derive(Debug, Clone)]
pub struct Resources {
    pool: Arc<rayon::ThreadPool>,
    cache: Arc<FrameCache>,
}

impl Resources {
    /// A decode pool of `threads` (0: one per core) and a cache of `cache_bytes`.
    ///
    /// # Errors
    /// When the threads cannot be started.
    pub fn new(threads: usize, cache_bytes: u64) -> Result<Self> {
        let threads = if threads == 0 { std::thread::available_parallelism().map_or(2, usize::from) } else { threads };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("lake-decode-{i}"))
            .build()
            .map_err(|e| Error::request(format!("cannot start {threads} decode threads: {e}")))?;
        Ok(Self { pool: Arc::new(pool), cache: Arc::new(FrameCache::new(cache_bytes)) })
    }

    /// Decode threads.
    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// The shared cache's counters.
    pub fn cache_stats(&self) -> CacheStats {
        self.cache.stats()
    }
}

impl Default for LoaderOptions {
    fn default() -> Self {
        Self { threads: 0, cache_bytes: DEFAULT_CACHE_MIB << 20, frame_table: true }
    }
}

/// Counters of the decode work done so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DecodeStats {
    /// GOP groups decoded.
    pub groups: u64,
    /// Packets fed to decoders.
    pub packets: u64,
    /// Frames converted to RGB and handed out.
    pub frames: u64,
    /// Time spent in decode workers, in nanoseconds.
    pub decode_ns: u64,
    /// Packet bytes read from the lake.
    pub packet_bytes: u64,
    /// Time spent reading packet bytes from the lake, in nanoseconds.
    pub fetch_ns: u64,
    /// Frames that were to be read from a frame table and were decoded from their packets
    /// instead, the table having failed (damaged, cut short or gone).
    pub table_frames_decoded: u64,
}

#[derive(Debug, Default)]
struct Counters {
    groups: AtomicU64,
    packets: AtomicU64,
    frames: AtomicU64,
    decode_ns: AtomicU64,
    packet_bytes: AtomicU64,
    fetch_ns: AtomicU64,
    table_frames_decoded: AtomicU64,
}

type DecoderPool = Mutex<IdlePool<(usize, u32), StreamDecoder>>;

/// A decoded GOP's frames by packet row, or the row that failed and why.
type GroupResult = std::result::Result<Vec<(u64, Frame)>, GroupError>;

/// Why a GOP gave no frames: its first wanted row and what went wrong, and whether the fault is
/// the decoder's rather than the frames' (no stream of that id, no decoder for the codec).
struct GroupError {
    row: u64,
    message: String,
    setup: bool,
}

/// Turns draws (dataset, step row) into Arrow batches of LeRobot samples.
#[derive(Debug)]
pub struct Loader {
    datasets: Vec<Arc<LoaderDataset>>,
    windows: Vec<Vec<Window>>,
    /// Per dataset, where each column of the batch schema is among the columns the dataset
    /// makes, when a mixture's dataset makes them in another order (a view's feature mapping
    /// gives datasets the same keys, not the same column order).
    orders: Vec<Option<Vec<usize>>>,
    schema: SchemaRef,
    pool: Arc<rayon::ThreadPool>,
    cache: Arc<FrameCache>,
    decoders: Arc<DecoderPool>,
    counters: Arc<Counters>,
    frame_table: bool,
}

impl Loader {
    /// A loader over `datasets` (several make a mixture: their samples must have the same
    /// columns and shapes) with `windows` resolved against each.
    ///
    /// # Errors
    /// When the windows do not fit a dataset, or the datasets' samples differ in shape.
    pub fn new(datasets: Vec<Arc<LoaderDataset>>, windows: &Windows, options: LoaderOptions) -> Result<Self> {
        let resources = Resources::new(options.threads, options.cache_bytes)?;
        Self::with_resources(datasets, windows, options.frame_table, resources)
    }

    /// A loader that decodes on `resources`' pool into its cache (shared with other loaders).
    /// `frame_table`: read frames from a dataset's decoded-frame table when it has one.
    ///
    /// # Errors
    /// As [`Loader::new`].
    pub fn with_resources(datasets: Vec<Arc<LoaderDataset>>, windows: &Windows, frame_table: bool, resources: Resources) -> Result<Self> {
        if datasets.is_empty() {
            return Err(Error::request("no dataset to load from"));
        }
        let mut resolved = Vec::with_capacity(datasets.len());
        let mut orders = Vec::with_capacity(datasets.len());
        // The sample schemas of the datasets served from proxies, whose labels a mixture merges.
        let mut proxied = Vec::new();
        let mut schema: Option<SchemaRef> = None;
        for ds in &datasets {
            if let Some(size) = ds.frame_size().filter(|_| !frame_table) {
                return Err(Error::request(format!(
                    "{}: frames at {size} come only from its frame table of that size, which this loader is told not to read",
                    ds.label
                )));
            }
            let features: Vec<String> = ds.keys().into_iter().filter(|k| k != TASK).collect();
            let cameras: Vec<String> = ds.cameras.iter().map(|c| c.key.clone()).collect();
            let keys = DatasetKeys {
                fps: ds.fps(),
                features: &features,
                cameras: &cameras,
                tolerance_s: ds.record.options.tolerance_s,
                has_video: ds.cameras.iter().any(|c| c.video),
            };
            let w = match windows.delta_timestamps(&keys).map_err(|e| Error::request(format!("{}: {e}", ds.label)))? {
                Some(delta) => {
                    let dropped = delta.iter().map(|(key, _)| key).find(|key| {
                        !features.contains(key)
                            && !cameras.contains(key)
                            && matches!(ds.record.info["features"][key.as_str()]["dtype"].as_str(), Some("video" | "image"))
                    });
                    if let Some(key) = dropped {
                        return Err(Error::request(format!(
                            "{}: `{key}` is a camera its source declares, left out at ingest (--drop-missing-cameras: it had no \
                             video); no window can show it",
                            ds.label
                        )));
                    }
                    resolve_windows(&delta, &keys).map_err(|e| Error::request(format!("{}: {e}", ds.label)))?
                }
                None => vec![],
            };
            let mut s = sample_schema(ds, &w);
            if ds.proxy.is_some() {
                proxied.push(s.clone());
            }
            let mut order = None;
            if let Some(first) = &schema {
                // The same columns in another order are put in the first dataset's order.
                let position: Option<Vec<usize>> = (s.fields().len() == first.fields().len())
                    .then(|| first.fields().iter().map(|f| s.index_of(f.name()).ok()).collect())
                    .flatten();
                if let Some(position) = position.filter(|p| p.iter().enumerate().any(|(i, j)| i != *j)) {
                    s = Schema::new_with_metadata(position.iter().map(|&j| s.field(j).clone()).collect::<Vec<_>>(), s.metadata().clone());
                    order = Some(position);
                }
                // Names, types and, of cameras, what their bytes are (frame shape, pixel format,
                // conversion): the batch carries the first dataset's metadata for every source.
                let strip =
                    |s: &Schema| s.fields().iter().map(|f| (f.name().clone(), f.data_type().clone(), camera_facts(f))).collect::<Vec<_>>();
                if strip(first) != strip(&s) {
                    return Err(Error::request(format!(
                        "{} and {} give samples of different columns or shapes ({}); a mixture needs the same features, cameras and \
                         windows",
                        datasets[0].label,
                        ds.label,
                        first_difference(first, &s)
                    )));
                }
            } else {
                schema = Some(Arc::new(s));
            }
            resolved.push(w);
            orders.push(order);
        }
        let mut schema = schema.expect("at least one dataset");
        if proxied.len() > 1 {
            schema = Arc::new(crate::proxy_info::merge_labels(&schema, &proxied));
        }
        if datasets.len() > 1 {
            if let Some(ds) = datasets.iter().find(|ds| ds.keys().iter().any(|k| k == DATASET_INDEX)) {
                return Err(Error::request(format!(
                    "{} has a feature `{DATASET_INDEX}`, the name of the column a mixture adds to say which dataset each \
                     sample came from; sample it alone",
                    ds.label
                )));
            }
            let mut fields: Vec<Field> = schema.fields().iter().map(|f| f.as_ref().clone()).collect();
            fields.push(Field::new(DATASET_INDEX, DataType::Int64, false).with_metadata(meta(&[], "int64")));
            schema = Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()));
        }
        Ok(Self {
            datasets,
            windows: resolved,
            orders,
            schema,
            decoders: Arc::new(Mutex::new(IdlePool::new(IDLE_DECODER_BYTES_PER_THREAD * resources.pool.current_num_threads() as u64))),
            pool: resources.pool,
            cache: resources.cache,
            counters: Arc::new(Counters::default()),
            frame_table,
        })
    }

    /// The schema of every batch.
    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// The datasets, in source order.
    pub fn datasets(&self) -> &[Arc<LoaderDataset>] {
        &self.datasets
    }

    /// The resolved windows of dataset `source`.
    pub fn windows(&self, source: usize) -> &[Window] {
        &self.windows[source]
    }

    /// Frame cache counters.
    pub fn cache_stats(&self) -> CacheStats {
        self.cache.stats()
    }

    pub(crate) fn cache(&self) -> &FrameCache {
        &self.cache
    }

    /// Whether frames of `ds` are read from its frame table rather than decoded.
    fn reads_frame_table(&self, ds: &LoaderDataset) -> bool {
        self.frame_table && ds.has_frame_table()
    }

    /// Whether this loader decodes the frames of `ds` (it has cameras, read neither from a frame
    /// table nor shipped as packets).
    fn decodes(&self, ds: &LoaderDataset) -> bool {
        !ds.cameras.is_empty() && !self.reads_frame_table(ds) && ds.frame_format != FrameFormat::Packets
    }

    /// Whether some dataset's frames are decoded from packets.
    pub(crate) fn decodes_any(&self) -> bool {
        self.datasets.iter().any(|ds| self.decodes(ds))
    }

    /// The distinct frames `draws` show that are decoded from packets (not read from a frame
    /// table), as `(source, packets row)`.
    pub(crate) fn decoded_frames(&self, draws: &[Draw]) -> Vec<FrameRef> {
        let mut by_source: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
        for d in draws {
            by_source.entry(d.source).or_default().push(d.row);
        }
        let mut out = Vec::new();
        for (source, rows) in by_source {
            if !self.decodes(&self.datasets[source]) {
                continue;
            }
            // A batch that shows a frame no video holds fails when it is made; nothing is
            // decoded ahead for it.
            let Ok((wanted, _)) = self.camera_rows(source, &rows) else { continue };
            let rows: BTreeSet<u64> = wanted.into_iter().flatten().collect();
            out.extend(rows.into_iter().map(|r| (source, r)));
        }
        out
    }

    /// The stream of a packets row of dataset `source` and the row of the keyframe it depends on.
    pub(crate) fn gop_of(&self, source: usize, row: u64) -> (u32, u64) {
        let packets = &self.datasets[source].packets;
        (packets.stream[row as usize], row - u64::from(packets.keyframe_offset[row as usize]))
    }

    /// Decode counters.
    pub fn decode_stats(&self) -> DecodeStats {
        let c = &self.counters;
        DecodeStats {
            groups: c.groups.load(Ordering::Relaxed),
            packets: c.packets.load(Ordering::Relaxed),
            frames: c.frames.load(Ordering::Relaxed),
            decode_ns: c.decode_ns.load(Ordering::Relaxed),
            packet_bytes: c.packet_bytes.load(Ordering::Relaxed),
            fetch_ns: c.fetch_ns.load(Ordering::Relaxed),
            table_frames_decoded: c.table_frames_decoded.load(Ordering::Relaxed),
        }
    }

    /// The samples of `draws`, one row each, in order.
    ///
    /// # Errors
    /// When packets cannot be read or a frame cannot be decoded.
    pub async fn batch(&self, draws: &[Draw]) -> Result<RecordBatch> {
        self.batch_with(draws, &Ahead::default()).await
    }

    /// The samples of `draws`, taking frames from `ahead` (kept for this batch by its stream's
    /// [`Lookahead`](crate::Lookahead)) first, and keeping decoded frames later batches show.
    ///
    /// # Errors
    /// As [`Loader::batch`].
    pub async fn batch_with(&self, draws: &[Draw], ahead: &Ahead) -> Result<RecordBatch> {
        Ok(self.samples_in(draws, ahead, Layout::Columns).await?.to_record_batch()?)
    }

    /// [`Loader::batch_with`] before the frames are copied into their columns: camera columns
    /// hold the frames they show, shared with the cache (see [`SampleBatch`]).
    ///
    /// # Errors
    /// As [`Loader::batch`].
    pub async fn samples_with(&self, draws: &[Draw], ahead: &Ahead) -> Result<SampleBatch> {
        self.samples_in(draws, ahead, Layout::Shared).await
    }

    /// Camera `camera`'s frames (an index into the dataset's cameras) at steps `rows` of
    /// dataset `source`, one after another in one buffer: the frames a batch of those steps
    /// shows (from the frame cache, the frame table, or decoded, each GOP once), without the
    /// other cameras, the step columns or windows.
    ///
    /// # Errors
    /// As [`Loader::batch`]; [`Error::NoVideo`] for a step of an episode ingested without the
    /// camera's video.
    ///
    /// # Panics
    /// When `source` or `camera` is out of range.
    pub async fn camera_frames(&self, source: usize, camera: usize, rows: &[u64]) -> Result<Vec<u8>> {
        let ds = &self.datasets[source];
        let cam = &ds.cameras[camera];
        let mut shown_by = HashMap::with_capacity(rows.len());
        let packet_rows = rows
            .iter()
            .map(|&step| {
                let row = cam.packet_row(step as usize).ok_or_else(|| {
                    let (episode, frame) = ds.episode_and_frame(step as usize);
                    Error::NoVideo { dataset: ds.label.clone(), camera: cam.key.clone(), episode, frame }
                })?;
                shown_by.entry(row).or_insert(step);
                Ok(row)
            })
            .collect::<Result<Vec<u64>>>()?;
        let cameras = vec![(cam.frame_bytes(), packet_rows)];
        Ok(match Box::pin(self.frame_values(source, cameras, &shown_by, &Ahead::default(), Layout::Columns)).await? {
            FrameValues::Columns(mut columns) => columns.swap_remove(0),
            FrameValues::Shared(cameras, ready) => {
                let (size, rows) = &cameras[0];
                let mut frames = Vec::with_capacity(size * rows.len());
                for row in rows {
                    frames.extend_from_slice(&ready[row]);
                }
                frames
            }
        })
    }

    async fn samples_in(&self, draws: &[Draw], ahead: &Ahead, layout: Layout) -> Result<SampleBatch> {
        // A batch whose frames are all in memory is made without waiting for anything: a share
        // of the task's budget keeps a consumer of many such batches from starving whatever it
        // runs beside (a Ctrl-C handler, other streams).
        tokio::task::consume_budget().await;
        if draws.is_empty() {
            return Ok(RecordBatch::new_empty(self.schema.clone()).into());
        }
        let mut by_source: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
        for d in draws {
            by_source.entry(d.source).or_default().push(d.row);
        }
        if by_source.len() == 1 {
            let (source, rows) = by_source.into_iter().next().expect("one source");
            return self.assemble(source, &rows, ahead, layout).await;
        }
        let mut parts = Vec::with_capacity(by_source.len());
        let mut slot_of = HashMap::new();
        for (source, rows) in &by_source {
            slot_of.insert(*source, parts.len());
            parts.push(self.assemble(*source, rows, ahead, layout).await?);
        }
        let mut next = vec![0usize; parts.len()];
        let order: Vec<(usize, usize)> = draws
            .iter()
            .map(|d| {
                let slot = slot_of[&d.source];
                next[slot] += 1;
                (slot, next[slot] - 1)
            })
            .collect();
        let batch = SampleBatch::interleave(&parts, &order)?;
        if self.datasets[0].frame_format == FrameFormat::Packets {
            // Each part numbered its own frames; the mixture's batch numbers them anew.
            return crate::packets::renumber(&parts, &order, batch);
        }
        Ok(batch)
    }

    async fn assemble(&self, source: usize, rows: &[u64], ahead: &Ahead, layout: Layout) -> Result<SampleBatch> {
        let ds = &self.datasets[source];
        let windows = &self.windows[source];
        let window_of = |key: &str| windows.iter().find(|w| w.key == key);
        let query = |w: &Window| window_rows(ds, rows, &w.offsets);

        let mut columns: Vec<BatchColumn> = Vec::with_capacity(self.schema.fields().len());
        let own_rows = UInt64Array::from(rows.to_vec());
        for (col, field) in ds.columns.iter().zip(self.schema.fields()) {
            let array = ds.steps.column(col.position);
            match window_of(&col.key) {
                Some(w) => {
                    let (q, _) = query(w);
                    let taken = take(array, &UInt64Array::from(q), None)?;
                    columns.push(BatchColumn::Array(regroup(taken, field)?));
                }
                None => {
                    let taken = take(array, &own_rows, None)?;
                    columns.push(BatchColumn::Array(if taken.data_type() == field.data_type() {
                        taken
                    } else {
                        cast(&taken, field.data_type())?
                    }));
                }
            }
        }

        let (wanted, shown_by) = self.camera_rows(source, rows)?;
        // Both paths' futures are boxed: they nest Lance's reads deep, and a caller's future
        // holding them inline outgrows the compiler's layout depth limit.
        if ds.frame_format == FrameFormat::Packets {
            let fetch_began = Instant::now();
            let (shipped, read) = Box::pin(crate::packets::packet_columns(ds, &wanted, rows.len(), &shown_by)).await?;
            self.counters.fetch_ns.fetch_add(fetch_began.elapsed().as_nanos() as u64, Ordering::Relaxed);
            self.counters.packet_bytes.fetch_add(read, Ordering::Relaxed);
            let (numbers, gops): (Vec<ArrayRef>, Vec<ArrayRef>) = shipped.into_iter().map(|[n, g]| (n, g)).unzip();
            for (camera, numbers) in ds.cameras.iter().zip(numbers) {
                let field = self.schema.field_with_name(&camera.key)?;
                columns.push(BatchColumn::Array(match field.data_type() {
                    DataType::FixedSizeList(item, slots) => Arc::new(FixedSizeListArray::try_new(item.clone(), *slots, numbers, None)?),
                    _ => numbers,
                }));
            }
            columns.extend(gops.into_iter().map(BatchColumn::Array));
        } else {
            Box::pin(self.frame_columns(source, wanted, &shown_by, ahead, layout, &mut columns)).await?;
        }
        for w in windows {
            let (_, pad) = query(w);
            let field = self.schema.field_with_name(&format!("{}_is_pad", w.key))?;
            let DataType::FixedSizeList(item, size) = field.data_type() else { unreachable!("pad columns are fixed-size lists") };
            let pad = FixedSizeListArray::try_new(item.clone(), *size, Arc::new(BooleanArray::from(pad)), None)?;
            columns.push(BatchColumn::Array(Arc::new(pad)));
        }
        if self.datasets.len() > 1 {
            columns.push(BatchColumn::Array(Arc::new(Int64Array::from(vec![source as i64; rows.len()]))));
        }
        if let Some(order) = &self.orders[source] {
            let mut made: Vec<Option<BatchColumn>> = columns.into_iter().map(Some).collect();
            let rest = made.split_off(order.len());
            columns = order.iter().map(|&j| made[j].take().expect("each column once")).chain(rest.into_iter().flatten()).collect();
        }
        Ok(SampleBatch::try_new(self.schema.clone(), columns, rows.len())?)
    }

    /// The camera columns of a batch of dataset `source`, frames decoded or read (`wanted`: per
    /// camera, the packets row of each sample and slot), appended to `columns`.
    async fn frame_columns(
        &self,
        source: usize,
        wanted: Vec<Vec<u64>>,
        shown_by: &HashMap<u64, u64>,
        ahead: &Ahead,
        layout: Layout,
        columns: &mut Vec<BatchColumn>,
    ) -> Result<()> {
        let ds = &self.datasets[source];
        let cameras: Vec<(usize, Vec<u64>)> = ds.cameras.iter().map(|c| c.frame_bytes()).zip(wanted).collect();
        match self.frame_values(source, cameras, shown_by, ahead, layout).await? {
            FrameValues::Columns(values) => {
                for (camera, values) in ds.cameras.iter().zip(values) {
                    columns.push(BatchColumn::Array(camera_array(self.schema.field_with_name(&camera.key)?, values)?));
                }
            }
            FrameValues::Shared(cameras, ready) => {
                for (size, rows) in cameras {
                    let frames = rows.iter().map(|row| ready.get(row).expect("every frame a batch shows is found").clone()).collect();
                    columns.push(BatchColumn::Frames(FrameColumn { frames, frame_bytes: size }));
                }
            }
        }
        Ok(())
    }

    /// The frames `cameras` show (`(frame bytes, packets row of each slot)` per camera) of
    /// dataset `source` as camera column values: decoded into place or read from the frame table
    /// straight into the batch, on the pool, in parallel; or, when every frame is in memory, those
    /// frames, for the columns to share. A frame the table turns out not to give, where the
    /// table is at fault ([`mends`]), has the batch decoded from packets instead.
    async fn frame_values(
        &self,
        source: usize,
        mut cameras: Vec<(usize, Vec<u64>)>,
        shown_by: &HashMap<u64, u64>,
        ahead: &Ahead,
        layout: Layout,
    ) -> Result<FrameValues> {
        let ds = &self.datasets[source];
        let mut from_packets = false;
        loop {
            let found = self.frames(source, &cameras, shown_by, ahead, layout, from_packets).await?;
            if let Some(values) = found.columns {
                return Ok(FrameValues::Columns(values));
            }
            if found.stored.is_empty() {
                return Ok(FrameValues::Shared(cameras, found.ready));
            }
            let (tx, rx) = tokio::sync::oneshot::channel();
            let read_began = Instant::now();
            self.pool.spawn(move || {
                let values = fill_frame_columns(&cameras, &found);
                let _ = tx.send((values, cameras, found));
            });
            let (values, back, found) = rx.await.map_err(|_| Error::request("the decode pool stopped"))?;
            cameras = back;
            self.counters.fetch_ns.fetch_add(read_began.elapsed().as_nanos() as u64, Ordering::Relaxed);
            match values.map_err(|(row, e)| stored_frame_error(ds, row, e)) {
                Ok(values) => {
                    self.counters.frames.fetch_add(found.stored.len() as u64, Ordering::Relaxed);
                    if self.cache.enabled() {
                        self.cache_stored(ds.cache_id, &cameras, &values, &found.stored);
                    }
                    return Ok(FrameValues::Columns(values));
                }
                Err(e) if mends(ds, &e) => {
                    self.decoding_instead(ds, found.stored.len(), &e);
                    from_packets = true;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Which `packets` row each (camera, sample, window slot) shows, per camera; and for each
    /// packet row, a step showing it (to name episode and frame in errors).
    ///
    /// # Errors
    /// [`Error::NoVideo`] for a step of an episode ingested without the camera's video.
    fn camera_rows(&self, source: usize, rows: &[u64]) -> Result<CameraRows> {
        let ds = &self.datasets[source];
        let mut wanted = Vec::with_capacity(ds.cameras.len());
        let mut shown_by = HashMap::new();
        for camera in &ds.cameras {
            let steps = match self.windows[source].iter().find(|w| w.key == camera.key) {
                Some(w) => window_rows(ds, rows, &w.offsets).0,
                None => rows.to_vec(),
            };
            let packet_rows: Vec<u64> = steps
                .iter()
                .map(|&s| {
                    camera.packet_row(s as usize).ok_or_else(|| {
                        let (episode, frame) = ds.episode_and_frame(s as usize);
                        Error::NoVideo { dataset: ds.label.clone(), camera: camera.key.clone(), episode, frame }
                    })
                })
                .collect::<Result<_>>()?;
            for (p, s) in packet_rows.iter().zip(&steps) {
                shown_by.entry(*p).or_insert(*s);
            }
            wanted.push(packet_rows);
        }
        Ok((wanted, shown_by))
    }

    /// The GOP decodes `draws` need when nothing is cached: per dataset and stream, the packet
    /// rows from each keyframe to the last frame wanted from it.
    pub fn plan(&self, draws: &[Draw]) -> Vec<GopJob> {
        let mut by_source: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
        for d in draws {
            by_source.entry(d.source).or_default().push(d.row);
        }
        let mut jobs = Vec::new();
        for (source, rows) in by_source {
            if self.datasets[source].frame_format == FrameFormat::Packets {
                continue;
            }
            // Draws that show a frame no video holds fail when their batch is made.
            let Ok((wanted, _)) = self.camera_rows(source, &rows) else { continue };
            let rows: BTreeSet<u64> = wanted.into_iter().flatten().collect();
            for ((stream, start), targets) in group_by_gop(&self.datasets[source], rows) {
                jobs.push(GopJob { source, stream, start, targets });
            }
        }
        jobs
    }

    /// The CPU time the decoders alone (FFmpeg; libjpeg-turbo for JPEG pictures) need for
    /// `jobs`: decode each GOP's packets (read into memory beforehand, not timed) with one
    /// reused decoder per stream and convert the wanted frames to RGB, on this thread. This is the decode-bound limit a loader is measured against.
    ///
    /// # Errors
    /// When packets cannot be read or decoded.
    pub async fn decode_bound(&self, jobs: &[GopJob]) -> Result<DecodeBound> {
        let mut data: HashMap<(usize, u64), bytes::Bytes> = HashMap::new();
        let mut by_source: BTreeMap<usize, BTreeSet<u64>> = BTreeMap::new();
        for j in jobs {
            by_source.entry(j.source).or_default().extend(j.start..=*j.targets.last().expect("non-empty"));
        }
        for (source, rows) in by_source {
            let rows: Vec<u64> = rows.into_iter().collect();
            let bytes = self.datasets[source].packet_bytes(&rows).await?;
            data.extend(rows.into_iter().zip(bytes).map(|(r, b)| ((source, r), b)));
        }
        let mut decoders: HashMap<(usize, u32), StreamDecoder> = HashMap::new();
        let mut bound = DecodeBound::default();
        let mut cpu_seconds = 0.0;
        for (n, j) in jobs.iter().enumerate() {
            if n % 64 == 0 {
                // Long measurements let the caller's other work (a Ctrl-C handler) run between
                // GOPs, on the same thread, outside the time measured.
                tokio::task::yield_now().await;
            }
            let began = thread_cpu_seconds();
            let ds = &self.datasets[j.source];
            let decoder = match decoders.entry((j.source, j.stream)) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => {
                    let config = ds.streams.get(&j.stream).ok_or_else(|| Error::layout(&ds.label, format!("no stream {}", j.stream)))?;
                    e.insert(StreamDecoder::open(config).map_err(|e| Error::layout(&ds.label, e.to_string()))?)
                }
            };
            let index = &ds.packets;
            let last = *j.targets.last().expect("non-empty");
            let packets: Vec<(i64, i64, bool, &[u8])> = (j.start..=last)
                .map(|r| {
                    (index.pts[r as usize], index.dts[r as usize], index.container_keyframe[r as usize], data[&(j.source, r)].as_ref())
                })
                .collect();
            let wanted: Vec<i64> = j.targets.iter().map(|&r| index.pts[r as usize]).collect();
            let frames = decoder.decode(&packets, &wanted).map_err(|e| Error::layout(&ds.label, e.to_string()))?;
            bound.packets += packets.len() as u64;
            bound.frames += frames.len() as u64;
            cpu_seconds += thread_cpu_seconds() - began;
        }
        bound.cpu_seconds = cpu_seconds;
        Ok(bound)
    }

    /// Puts the frames a batch read from the frame table into the in-memory cache, copied out
    /// of the batch's columns (a frame's first slot).
    fn cache_stored(&self, cache_id: u64, cameras: &[(usize, Vec<u64>)], columns: &[Vec<u8>], stored: &HashMap<u64, FrameExtent>) {
        let mut cached = BTreeSet::new();
        for ((size, rows), column) in cameras.iter().zip(columns) {
            for (frame, row) in column.chunks_exact(*size).zip(rows) {
                if stored.contains_key(row) && cached.insert(*row) {
                    self.cache.insert((cache_id, *row), Frame::copy_from_slice(frame));
                }
            }
        }
    }

    /// The stored frames of packet rows `rows` (sorted, distinct) of `ds`'s frame table: where
    /// they lie, for reading straight into the batch, or read, each checked, decompressed where
    /// stored so, and of its frame's size, or the error that names it.
    async fn read_frame_table(&self, ds: &Arc<LoaderDataset>, rows: &[u64]) -> Result<TableFrames> {
        let fetch_began = Instant::now();
        if let Some(extents) = ds.locate_stored_frames(rows).await? {
            self.counters.fetch_ns.fetch_add(fetch_began.elapsed().as_nanos() as u64, Ordering::Relaxed);
            let mut stored = HashMap::with_capacity(rows.len());
            for (&row, extent) in rows.iter().zip(extents) {
                let size = ds.frame_bytes_of_row(row);
                if extent.len() != size {
                    return Err(wrong_size(ds, row, extent.len(), size));
                }
                stored.insert(row, extent);
            }
            return Ok(TableFrames::Located(stored));
        }
        let stored = ds.stored_frames(rows).await?.expect("the dataset has a frame table");
        self.counters.fetch_ns.fetch_add(fetch_began.elapsed().as_nanos() as u64, Ordering::Relaxed);
        let sizes: Vec<usize> = rows.iter().map(|&r| ds.frame_bytes_of_row(r)).collect();
        // Checked, and decompressed where stored so, on the pool.
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (copy, expected) = (self.cache.enabled(), sizes.clone());
        self.pool.spawn(move || {
            let StoredFrames { storage, frames, checksums } = stored;
            let frames: Vec<std::result::Result<Frame, ReadError>> = frames
                .into_par_iter()
                .enumerate()
                .map(|(i, f)| {
                    crate::frames::check(&f, checksums.as_ref().map(|sums| sums[i])).map_err(ReadError::Damaged)?;
                    match storage {
                        // Slices of what Lance read; a cached frame is copied out so that it
                        // does not keep the whole read alive (the budget counts frames, not
                        // reads).
                        FrameStorage::Plain => Ok(if copy { Frame::copy_from_slice(&f) } else { f }),
                        FrameStorage::Zstd => zstd::bulk::decompress(&f, expected[i]).map(Frame::from).map_err(ReadError::Io),
                    }
                })
                .collect();
            let _ = tx.send(frames);
        });
        let frames = rx.await.map_err(|_| Error::request("the decode pool stopped"))?;
        let frames = rows
            .iter()
            .zip(frames)
            .zip(sizes)
            .map(|((&row, frame), size)| {
                let frame = frame.map_err(|e| stored_frame_error(ds, row, e))?;
                if frame.len() != size {
                    return Err(wrong_size(ds, row, frame.len(), size));
                }
                self.counters.frames.fetch_add(1, Ordering::Relaxed);
                Ok(frame)
            })
            .collect();
        Ok(TableFrames::Read(frames))
    }

    /// Counts `frames` of `ds` that were to be read from its frame table and are decoded from
    /// their packets instead, the table having failed (`why`), and says so in the log: the first
    /// time, then at most once every [`TABLE_WARNING_EVERY`]. (A read into the batch stops at its
    /// first failed frame, and the batch's frames are then all decoded.)
    fn decoding_instead(&self, ds: &LoaderDataset, frames: usize, why: &Error) {
        self.counters.table_frames_decoded.fetch_add(frames as u64, Ordering::Relaxed);
        if let Some(count) = ds.frame_table_failed(frames as u64, TABLE_WARNING_EVERY) {
            tracing::warn!(
                "{why}; the frames the table was to give are decoded from their packets instead ({count} since this was last said)"
            );
        }
    }

    /// The RGB frames `cameras` show (`(frame bytes, packets row of each slot)` per camera) of
    /// dataset `source`: kept ahead for this batch, cached, decoded, or to be read from the frame
    /// table (`from_packets`: decoded instead). A frame the table cannot give, where the table is
    /// at fault and holds the frames at their recorded size, is decoded from its packets. With
    /// [`Layout::Columns`], a batch that decodes frames gets its camera columns whole, each
    /// decoded frame written straight into its first slot.
    async fn frames(
        &self,
        source: usize,
        cameras: &[(usize, Vec<u64>)],
        shown_by: &HashMap<u64, u64>,
        ahead: &Ahead,
        layout: Layout,
        from_packets: bool,
    ) -> Result<Found> {
        let packet_rows: BTreeSet<u64> = cameras.iter().flat_map(|(_, rows)| rows.iter().copied()).collect();
        let ds = self.datasets[source].clone();
        if self.frame_table {
            ds.discover_frame_table().await;
        }
        let slot = ds.cache_id;
        let mut found = HashMap::with_capacity(packet_rows.len());
        let mut missing = BTreeSet::new();
        let mut not_handed = BTreeSet::new();
        for row in packet_rows {
            match ahead.frames.get(&(source, row)) {
                Some(frame) => drop(found.insert(row, frame.clone())),
                None => drop(not_handed.insert(row)),
            }
        }
        // Frames another batch kept for this one since it began (or is decoding now).
        if let Some(l) = ahead.lookahead.as_deref()
            && !not_handed.is_empty()
        {
            for (row, frame) in l.take_late(ahead, source, &not_handed).await {
                not_handed.remove(&row);
                found.insert(row, frame);
            }
        }
        for row in not_handed {
            match self.cache.get((slot, row)) {
                Some(frame) => drop(found.insert(row, frame)),
                None => drop(missing.insert(row)),
            }
        }
        if self.frame_table && ds.has_frame_table() && !missing.is_empty() && !from_packets {
            let rows: Vec<u64> = missing.iter().copied().collect();
            match self.read_frame_table(&ds, &rows).await {
                Ok(TableFrames::Located(stored)) => return Ok(Found { ready: found, stored, columns: None }),
                Ok(TableFrames::Read(frames)) => {
                    let mut failed = None;
                    for (row, frame) in rows.into_iter().zip(frames) {
                        match frame {
                            Ok(frame) => {
                                self.cache.insert((slot, row), frame.clone());
                                found.insert(row, frame);
                                missing.remove(&row);
                            }
                            Err(e) if !mends(&ds, &e) => return Err(e),
                            Err(e) => drop(failed.get_or_insert(e)),
                        }
                    }
                    match failed {
                        None => return Ok(Found::ready(found)),
                        Some(e) => self.decoding_instead(&ds, missing.len(), &e),
                    }
                }
                Err(e) if mends(&ds, &e) => self.decoding_instead(&ds, missing.len(), &e),
                Err(e) => return Err(e),
            }
        }
        let groups = group_by_gop(&ds, missing);
        if groups.is_empty() {
            return Ok(Found::ready(found));
        }
        // Each GOP's own frames, and with them the frames of the same GOP that later batches of
        // the stream show and will keep (decoded now, once, instead of again from the keyframe),
        // with room claimed for them. Batches begun before this one decodes that show some of
        // these frames wait for them (the promise) instead of decoding them too.
        let lookahead = ahead.lookahead.clone();
        let mut jobs: Vec<GopTargets> =
            groups.into_iter().map(|((stream, start), own)| GopTargets { stream, start, all: own.clone(), own }).collect();
        let mut kept_for_later: BTreeSet<u64> = BTreeSet::new();
        let promise = lookahead.as_ref().map(|l| {
            let frame_bytes = |stream: u32| {
                ds.streams.get(&stream).and_then(|c| ds.cameras.iter().find(|k| k.key == c.camera)).map_or(0, |c| c.frame_bytes())
            };
            let gops: Vec<_> = jobs.iter().map(|j| (j.stream, j.start, j.own.as_slice(), frame_bytes(j.stream))).collect();
            let (later, promise) = l.claim(source, &gops);
            for (j, later) in jobs.iter_mut().zip(later) {
                kept_for_later.extend(&later);
                j.all.extend(later);
                j.all.sort_unstable();
            }
            promise
        });
        let needed: BTreeSet<u64> = jobs.iter().flat_map(|j| j.start..=*j.all.last().expect("non-empty")).collect();
        let needed: Vec<u64> = needed.into_iter().collect();
        // Into place: the frames already in memory are copied into the columns on the pool too.
        let in_place = (layout == Layout::Columns).then(|| (cameras.to_vec(), std::mem::take(&mut found)));
        let mut decoded_rows: BTreeSet<u64> = match in_place {
            Some(_) if lookahead.is_none() && self.cache.enabled() => jobs.iter().flat_map(|j| j.own.iter().copied()).collect(),
            _ => BTreeSet::new(),
        };
        let (decoders, counters, pool, ds2, keeper) =
            (self.decoders.clone(), self.counters.clone(), self.pool.clone(), ds.clone(), lookahead.clone());
        let work = async move {
            let fetch_began = Instant::now();
            let bytes = ds2.packet_bytes(&needed).await?;
            counters.fetch_ns.fetch_add(fetch_began.elapsed().as_nanos() as u64, Ordering::Relaxed);
            counters.packet_bytes.fetch_add(bytes.iter().map(|b| b.len() as u64).sum(), Ordering::Relaxed);
            let data: HashMap<u64, bytes::Bytes> = needed.into_iter().zip(bytes).collect();
            let (tx, rx) = tokio::sync::oneshot::channel();
            pool.spawn(move || {
                let gops = Gops { ds: &ds2, source, data: &data, decoders: &decoders, counters: &counters };
                let decoded = match &in_place {
                    None => Decoded { results: jobs.par_iter().map(|j| gops.decode(j, &mut [])).collect(), columns: None },
                    Some((cameras, ready)) => gops.decode_into_columns(&jobs, cameras, ready),
                };
                // Frames later batches show are kept before the promise is settled, so the
                // batches waiting for them find them.
                if let Some(l) = &keeper {
                    for (row, frame) in decoded.results.iter().filter_map(|r| r.as_ref().ok()).flatten() {
                        l.keep((source, *row), frame);
                    }
                }
                drop(promise);
                let _ = tx.send(decoded);
            });
            rx.await.map_err(|_| Error::request("the decode pool stopped"))
        };
        // With a lookahead other batches may wait for this decode, so it goes on whether or not
        // this batch's future is polled (a stream read in turns with others); it is abandoned
        // (its promise settled) when this batch is dropped before it started decoding.
        let decoded = match &lookahead {
            Some(_) => Spawned(tokio::spawn(work)).await.map_err(|e| Error::request(format!("a decode task failed: {e}")))??,
            None => work.await?,
        };
        for r in decoded.results {
            match r {
                Ok(frames) => {
                    for (row, frame) in frames {
                        // A stream that plans ahead keeps what its later batches show and caches
                        // nothing else: under its horizon an LRU entry would be gone long before
                        // the stream came back to it.
                        if lookahead.is_none() {
                            self.cache.insert((slot, row), frame.clone());
                        } else if kept_for_later.contains(&row) {
                            continue;
                        }
                        found.insert(row, frame);
                    }
                }
                Err(GroupError { row, message, setup }) => {
                    let camera = ds.streams.get(&ds.packets.stream[row as usize]).map(|s| s.camera.clone()).unwrap_or_default();
                    if setup {
                        return Err(Error::layout(&ds.label, format!("camera {camera}: {message}")));
                    }
                    let (episode, frame) = ds.episode_and_frame(shown_by.get(&row).copied().unwrap_or_default() as usize);
                    return Err(Error::Decode { dataset: ds.label.clone(), camera, episode, frame, row, message });
                }
            }
        }
        let Some(columns) = decoded.columns else { return Ok(Found::ready(found)) };
        // What was decoded into place, cached (without a lookahead) as frames of their own.
        for ((size, rows), values) in cameras.iter().zip(&columns) {
            for (frame, row) in values.chunks_exact(*size).zip(rows) {
                if decoded_rows.remove(row) {
                    self.cache.insert((slot, *row), Frame::copy_from_slice(frame));
                }
            }
        }
        Ok(Found { ready: HashMap::new(), stored: HashMap::new(), columns: Some(columns) })
    }
}

/// A spawned task, aborted when dropped (the batch it works for was given up).
pub struct Spawned<T>(pub tokio::task::JoinHandle<T>);

impl<T> Drop for Spawned<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl<T> std::future::Future for Spawned<T> {
    type Output = std::result::Result<T, tokio::task::JoinError>;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.0).poll(cx)
    }
}

/// How a batch holds its camera columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// Each camera column one Arrow array, decoded frames written straight into it (a batch for
    /// the caller: one copy of each frame fewer than assembling it from frames).
    Columns,
    /// Camera columns as the frames they show, shared ([`SampleBatch`]: a transport sends
    /// them from where they are).
    Shared,
}

/// The frames a batch shows: in memory, to be read from the frame table into the batch, or
/// decoded into the batch's camera columns (all of them, every slot filled).
struct Found {
    ready: HashMap<u64, Frame>,
    stored: HashMap<u64, FrameExtent>,
    columns: Option<Vec<Vec<u8>>>,
}

impl Found {
    fn ready(ready: HashMap<u64, Frame>) -> Self {
        Self { ready, stored: HashMap::new(), columns: None }
    }
}

/// The frame column values of each camera (`(frame bytes, packet row of each slot)`): every
/// slot filled from a frame in memory, or read from the frame table straight into place
/// ([`crate::frames::read_frames_into`]; a frame shown in two slots is read twice, which costs
/// what a copy would). A failed read names the row.
fn fill_frame_columns(cameras: &[(usize, Vec<u64>)], found: &Found) -> std::result::Result<Vec<Vec<u8>>, (u64, ReadError)> {
    let mut columns: Vec<Vec<u8>> = cameras.iter().map(|(size, rows)| Vec::with_capacity(size * rows.len())).collect();
    let mut reads = Vec::new();
    for ((size, rows), column) in cameras.iter().zip(columns.iter_mut()) {
        let values = &mut column.spare_capacity_mut()[..size * rows.len()];
        for (slot, row) in values.chunks_exact_mut(*size).zip(rows) {
            match (found.ready.get(row), found.stored.get(row)) {
                (Some(frame), _) => drop(slot.write_copy_of_slice(frame)),
                (None, Some(extent)) => reads.push((*row, extent, slot)),
                (None, None) => unreachable!("every frame a batch shows is found or stored"),
            }
        }
    }
    crate::frames::read_frames_into(reads)?;
    for ((size, rows), column) in cameras.iter().zip(columns.iter_mut()) {
        // SAFETY: every slot of the first `size * rows.len()` bytes was written above.
        unsafe { column.set_len(size * rows.len()) };
    }
    Ok(columns)
}

/// The camera column values of a batch: whole, or (every frame in memory) the frames each slot
/// shows, by packet row.
enum FrameValues {
    Columns(Vec<Vec<u8>>),
    Shared(Vec<(usize, Vec<u64>)>, HashMap<u64, Frame>),
}

/// How often at most a dataset's log says again that its frame table cannot give frames.
const TABLE_WARNING_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// The stored frames of a batch: where they lie, to be read into the batch; or read, each frame
/// or the error that names it.
enum TableFrames {
    Located(HashMap<u64, FrameExtent>),
    Read(Vec<Result<Frame>>),
}

/// Whether the frames a failed frame table read (`e`) was to give are decoded from their packets
/// instead: when the table is at fault, and its frames are what decoding gives (a table at the
/// recorded size; a resized one's frames are made only by `lake cache --size`).
fn mends(ds: &LoaderDataset, e: &Error) -> bool {
    ds.frame_size().is_none() && e.frame_table_at_fault()
}

/// A stored frame of another size than its row's frames.
fn wrong_size(ds: &LoaderDataset, row: u64, len: usize, size: usize) -> Error {
    Error::layout(&ds.label, format!("frame table row {row}: {len} bytes, expected {size}; run `{}` again", ds.cache_command()))
}

/// The error of a frame of packet row `row` that could not be read from the frame table.
fn stored_frame_error(ds: &LoaderDataset, row: u64, e: ReadError) -> Error {
    match e {
        ReadError::Io(e) => Error::layout(&ds.label, format!("frame table row {row}: {e}; run `{}` again", ds.cache_command())),
        ReadError::Damaged(damage) => ds.damaged_frame(row, damage),
    }
}

/// What a batch's GOP decodes gave: per GOP, the frames made as frames of their own (all of
/// them, or with [`Layout::Columns`] those kept for later batches), or the row that failed; and
/// the camera columns the frames were decoded into.
struct Decoded {
    results: Vec<GroupResult>,
    columns: Option<Vec<Vec<u8>>>,
}

/// What the GOP decodes of one batch share.
struct Gops<'a> {
    ds: &'a LoaderDataset,
    source: usize,
    data: &'a HashMap<u64, bytes::Bytes>,
    decoders: &'a DecoderPool,
    counters: &'a Counters,
}

impl Gops<'_> {
    /// Decodes `job`: its own rows into `places` (in order; none: as frames of their own), the
    /// rows kept for later batches as frames of their own, which are returned. A failure of a
    /// row kept for later does not fail the batch: its own rows are decoded again, alone (a
    /// later batch reports that row's error).
    fn decode(&self, job: &GopTargets, places: &mut [&mut [MaybeUninit<u8>]]) -> GroupResult {
        match self.decode_rows(job, &job.all, places) {
            Err(_) if job.all.len() > job.own.len() => self.decode_rows(job, &job.own, places),
            result => result,
        }
    }

    fn decode_rows(&self, job: &GopTargets, targets: &[u64], places: &mut [&mut [MaybeUninit<u8>]]) -> GroupResult {
        let (ds, index) = (self.ds, &self.ds.packets);
        let began = Instant::now();
        let first = targets[0];
        let setup = |message: String| GroupError { row: first, message, setup: true };
        let config = ds.streams.get(&job.stream).ok_or_else(|| setup(format!("stream {} is not in the streams table", job.stream)))?;
        let key = (self.source, job.stream);
        let pooled = self.decoders.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take(&key);
        let mut decoder = match pooled {
            Some(d) => d,
            None => StreamDecoder::open(config).map_err(|e| setup(e.to_string()))?,
        };
        let last = *targets.last().expect("non-empty");
        let packets: Vec<(i64, i64, bool, &[u8])> = (job.start..=last)
            .map(|r| (index.pts[r as usize], index.dts[r as usize], index.container_keyframe[r as usize], self.data[&r].as_ref()))
            .collect();
        let wanted: Vec<i64> = targets.iter().map(|&r| index.pts[r as usize]).collect();
        // Own rows into their places (with any), the others into frames of their own.
        let in_place = !places.is_empty();
        let placed = |row: &u64| in_place && job.own.binary_search(row).is_ok();
        let mut made: Vec<(u64, usize, Vec<u8>)> = targets
            .iter()
            .filter(|r| !placed(r))
            .map(|&row| {
                let size = ds.frame_bytes_of_row(row);
                (row, size, Vec::with_capacity(size))
            })
            .collect();
        let result = {
            let (mut places, mut made) = (places.iter_mut(), made.iter_mut());
            let mut outs: Vec<&mut [MaybeUninit<u8>]> = targets
                .iter()
                .map(|row| match placed(row) {
                    true => &mut **places.next().expect("a place for each own row"),
                    false => {
                        let (_, size, frame) = made.next().expect("a frame for each other row");
                        &mut frame.spare_capacity_mut()[..*size]
                    }
                })
                .collect();
            decoder.decode_into(&packets, &wanted, &mut outs)
        };
        let idle_bytes = decoder.idle_bytes();
        self.decoders.lock().unwrap_or_else(std::sync::PoisonError::into_inner).put(key, decoder, idle_bytes);
        result.map_err(|e| GroupError { row: first, message: e.to_string(), setup: false })?;
        let counters = self.counters;
        counters.groups.fetch_add(1, Ordering::Relaxed);
        counters.packets.fetch_add(packets.len() as u64, Ordering::Relaxed);
        counters.frames.fetch_add(targets.len() as u64, Ordering::Relaxed);
        counters.decode_ns.fetch_add(began.elapsed().as_nanos() as u64, Ordering::Relaxed);
        Ok(made
            .into_iter()
            .map(|(row, size, mut frame)| {
                // SAFETY: `decode_into` wrote all `size` bytes of each place it was given.
                unsafe { frame.set_len(size) };
                (row, Frame::from(frame))
            })
            .collect())
    }

    /// Decodes `jobs` in parallel into the camera columns of `cameras` (`(frame bytes, packets
    /// row of each slot)`): each frame the batch decodes straight into the first slot showing
    /// it, then every other slot copied from that one or from the frame in memory (`ready`).
    /// The columns are whole only when every GOP decoded.
    fn decode_into_columns(&self, jobs: &[GopTargets], cameras: &[(usize, Vec<u64>)], ready: &HashMap<u64, Frame>) -> Decoded {
        let mut columns: Vec<Vec<u8>> = cameras.iter().map(|(size, rows)| Vec::with_capacity(size * rows.len())).collect();
        let results: Vec<GroupResult> = {
            let mut places: HashMap<u64, &mut [MaybeUninit<u8>]> = HashMap::new();
            for ((size, rows), column) in cameras.iter().zip(columns.iter_mut()) {
                for (place, row) in column.spare_capacity_mut()[..size * rows.len()].chunks_exact_mut(*size).zip(rows) {
                    if !ready.contains_key(row) {
                        places.entry(*row).or_insert(place);
                    }
                }
            }
            let work: Vec<(&GopTargets, Vec<&mut [MaybeUninit<u8>]>)> = jobs
                .iter()
                .map(|j| (j, j.own.iter().map(|row| places.remove(row).expect("a place for each frame the batch decodes")).collect()))
                .collect();
            if let Some(row) = places.keys().next() {
                // A frame neither in memory nor decoded would leave its slots unwritten.
                return Decoded {
                    results: vec![Err(GroupError { row: *row, message: "no GOP decode makes this frame".into(), setup: true })],
                    columns: None,
                };
            }
            work.into_par_iter().map(|(j, mut places)| self.decode(j, &mut places)).collect()
        };
        if results.iter().any(std::result::Result::is_err) {
            return Decoded { results, columns: None };
        }
        for ((size, rows), column) in cameras.iter().zip(columns.iter_mut()) {
            let values = &mut column.spare_capacity_mut()[..size * rows.len()];
            let mut first: HashMap<u64, usize> = HashMap::with_capacity(rows.len());
            for (slot, row) in rows.iter().enumerate() {
                match first.entry(*row) {
                    std::collections::hash_map::Entry::Occupied(e) => values.copy_within(e.get() * size..(e.get() + 1) * size, slot * size),
                    std::collections::hash_map::Entry::Vacant(e) => {
                        e.insert(slot);
                        if let Some(frame) = ready.get(row) {
                            if frame.len() != *size {
                                let message = format!("a frame of {} bytes where {size} were expected", frame.len());
                                return Decoded { results: vec![Err(GroupError { row: *row, message, setup: false })], columns: None };
                            }
                            values[slot * size..(slot + 1) * size].write_copy_of_slice(frame);
                        }
                    }
                }
            }
            // SAFETY: each slot was written: decoded into (the first slot of a row not in
            // `ready`, every GOP having decoded), copied from `ready`, or copied from the first
            // slot of its row, written before it.
            unsafe { column.set_len(size * rows.len()) };
        }
        Decoded { results, columns: Some(columns) }
    }
}

/// A GOP a batch decodes: the rows it shows, and with them those kept for later batches.
struct GopTargets {
    stream: u32,
    start: u64,
    own: Vec<u64>,
    /// `own` and the rows kept for later, ascending.
    all: Vec<u64>,
}

/// One GOP decode: packet rows `start..=last target` of a stream, for the frames of `targets`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GopJob {
    /// The dataset's position in the loader.
    pub source: usize,
    /// The stream.
    pub stream: u32,
    /// The keyframe row decoding starts from.
    pub start: u64,
    /// The rows whose frames are wanted, ascending.
    pub targets: Vec<u64>,
}

/// What the decode-bound measurement did.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DecodeBound {
    /// CPU seconds of decoding and colour conversion.
    pub cpu_seconds: f64,
    /// Packets decoded.
    pub packets: u64,
    /// Frames converted to RGB.
    pub frames: u64,
}

/// Packet rows grouped by `(stream, keyframe row)`, each group's targets ascending.
/// Per camera, the `packets` row each (sample, window slot) shows; and a step showing each row.
type CameraRows = (Vec<Vec<u64>>, HashMap<u64, u64>);

fn group_by_gop(ds: &LoaderDataset, rows: BTreeSet<u64>) -> BTreeMap<(u32, u64), Vec<u64>> {
    let mut groups: BTreeMap<(u32, u64), Vec<u64>> = BTreeMap::new();
    for row in rows {
        let r = row as usize;
        let start = row - u64::from(ds.packets.keyframe_offset[r]);
        groups.entry((ds.packets.stream[r], start)).or_default().push(row);
    }
    groups
}

/// For a window of frame `offsets` around each of `rows`: the rows queried (clamped to the
/// episode, as LeRobot does) and whether each slot was padded.
fn window_rows(ds: &LoaderDataset, rows: &[u64], offsets: &[i64]) -> (Vec<u64>, Vec<bool>) {
    let mut q = Vec::with_capacity(rows.len() * offsets.len());
    let mut pad = Vec::with_capacity(rows.len() * offsets.len());
    for &row in rows {
        let span = ds.episode_of_row(row);
        let at = (row - span.first_row) as i64;
        for &d in offsets {
            let want = at + d;
            pad.push(want < 0 || want >= span.len as i64);
            q.push(span.first_row + want.clamp(0, span.len as i64 - 1) as u64);
        }
    }
    (q, pad)
}

/// Rows of `n * T` taken values regrouped into `n` fixed-size lists of `T` steps each.
fn regroup(taken: ArrayRef, field: &Field) -> Result<ArrayRef> {
    let DataType::FixedSizeList(item, size) = field.data_type() else { unreachable!("windowed columns are fixed-size lists") };
    let values = match taken.data_type() {
        DataType::FixedSizeList(_, _) => taken.as_fixed_size_list().values().clone(),
        _ => taken,
    };
    let values = if values.data_type() == item.data_type() { values } else { cast(&values, item.data_type())? };
    Ok(Arc::new(FixedSizeListArray::try_new(item.clone(), *size, values, None)?))
}

fn meta(shape: &[usize], dtype: &str) -> HashMap<String, String> {
    HashMap::from([(SHAPE.to_string(), serde_json::to_string(shape).expect("shape")), (DTYPE.to_string(), dtype.to_string())])
}

fn dtype_name(dt: &DataType) -> String {
    match dt {
        DataType::Float32 => "float32".into(),
        DataType::Float64 => "float64".into(),
        DataType::Int64 => "int64".into(),
        DataType::Int32 => "int32".into(),
        DataType::Int16 => "int16".into(),
        DataType::Int8 => "int8".into(),
        DataType::UInt8 => "uint8".into(),
        DataType::Boolean => "bool".into(),
        DataType::Utf8 | DataType::LargeUtf8 => "str".into(),
        other => other.to_string().to_lowercase(),
    }
}

/// What a camera column's bytes are, beyond their type: the frame's shape, pixel format and
/// YUV conversion (empty for other columns).
fn camera_facts(f: &Field) -> Vec<Option<String>> {
    if !f.metadata().contains_key(LAYOUT) {
        return Vec::new();
    }
    ["frame_shape", PIXEL_FORMAT, YUV_TO_RGB].iter().map(|k| f.metadata().get(*k).cloned()).collect()
}

/// The first column where two datasets' sample schemas differ, in words (for a camera of
/// another frame size, how to read both at one size).
fn first_difference(a: &Schema, b: &Schema) -> String {
    let shape = |f: &Field| f.metadata().get("shape").cloned().unwrap_or_else(|| f.data_type().to_string());
    for (i, fa) in a.fields().iter().enumerate() {
        let Some(fb) = b.fields().get(i) else { return format!("`{}` is missing from the second", fa.name()) };
        if fa.name() != fb.name() {
            return match b.field_with_name(fa.name()) {
                Ok(_) => format!("their columns come in another order: `{}` where the second has `{}`", fa.name(), fb.name()),
                Err(_) => format!("the second lacks `{}`", fa.name()),
            };
        }
        let camera = fa.metadata().contains_key(LAYOUT);
        let frame_shape = |f: &Field| f.metadata().get("frame_shape").cloned().unwrap_or_default();
        let same_frames = camera && frame_shape(fa) == frame_shape(fb);
        if !same_frames && (camera || fa.data_type() != fb.data_type()) {
            let planes = [fa, fb].iter().any(|f| f.metadata().get(PIXEL_FORMAT).is_some_and(|p| p != "rgb24"));
            let hint = match (camera, planes) {
                (false, _) => "",
                (true, false) => "; read both from frame tables of one size (`lake cache NAME --size WxH`, then --frame-size WxH)",
                (true, true) => "; frames of different sizes cannot be stacked, and resized frames come only as rgb24",
            };
            let (sa, sb) = if camera { (frame_shape(fa), frame_shape(fb)) } else { (shape(fa), shape(fb)) };
            return format!("`{}` is shaped {sa} in the first and {sb} in the second{hint}", fa.name());
        }
        if camera_facts(fa) != camera_facts(fb) {
            let facts = |f: &Field| match f.metadata().get(YUV_TO_RGB) {
                Some(c) => format!("yuv420p planes converting with {c}"),
                None => "rgb24".to_string(),
            };
            return format!(
                "`{}` comes as {} from the first and as {} from the second (another pixel format, colour matrix or range); ask \
                 for rgb24 frames to mix them",
                fa.name(),
                facts(fa),
                facts(fb)
            );
        }
    }
    match b.fields().get(a.fields().len()) {
        Some(extra) => format!("the first lacks `{}`", extra.name()),
        None => "their column types differ".into(),
    }
}

/// The batch schema of dataset `ds` with `windows`: step columns (windowed ones as fixed-size
/// lists with a leading time dimension), `task`, cameras as uint8 HWC/THWC, then the
/// `{key}_is_pad` masks.
fn sample_schema(ds: &LoaderDataset, windows: &[Window]) -> Schema {
    let stored = ds.steps.schema();
    let mut fields = Vec::new();
    let window_of = |key: &str| windows.iter().find(|w| w.key == key);
    for col in &ds.columns {
        let field = stored.field(col.position);
        let (item, numel) = match field.data_type() {
            DataType::FixedSizeList(item, n) => (item.data_type().clone(), *n as usize),
            // The index columns have fixed types, windowed or not.
            _ if INT64_COLUMNS.contains(&col.key.as_str()) => (DataType::Int64, 1),
            _ if col.key == "timestamp" => (DataType::Float32, 1),
            other => (other.clone(), 1),
        };
        let out = if col.key == TASK {
            Field::new(TASK, DataType::Utf8, false).with_metadata(meta(&[], "str"))
        } else if let Some(w) = window_of(&col.key) {
            let t = w.offsets.len();
            let mut shape = vec![t];
            shape.extend(&col.shape);
            if col.shape.len() == 1 && col.shape[0] == 1 && numel == 1 && !matches!(field.data_type(), DataType::FixedSizeList(..)) {
                shape.truncate(1);
            }
            let list = DataType::FixedSizeList(Arc::new(Field::new("item", item.clone(), false)), (t * numel) as i32);
            Field::new(&col.key, list, false).with_metadata(meta(&shape, &dtype_name(&item)))
        } else if INT64_COLUMNS.contains(&col.key.as_str()) {
            Field::new(&col.key, DataType::Int64, false).with_metadata(meta(&[], "int64"))
        } else if col.key == "timestamp" {
            Field::new(&col.key, DataType::Float32, false).with_metadata(meta(&[], "float32"))
        } else {
            let shape = if matches!(field.data_type(), DataType::FixedSizeList(..)) { col.shape.clone() } else { vec![] };
            Field::new(&col.key, field.data_type().clone(), field.is_nullable()).with_metadata(meta(&shape, &dtype_name(&item)))
        };
        fields.push(out);
    }
    let mut packet_columns = Vec::new();
    for camera in &ds.cameras {
        let (h, w) = (camera.height as usize, camera.width as usize);
        // LeRobot squeezes a video camera's one-frame window (`frames.squeeze(0)`), and stacks
        // an image camera's.
        let (mut shape, layout) = match window_of(&camera.key) {
            Some(win) if !(camera.video && win.offsets.len() == 1) => (vec![win.offsets.len(), h, w, 3], "THWC"),
            _ => (vec![h, w, 3], "HWC"),
        };
        if ds.frame_format == FrameFormat::Packets {
            let [numbers, gops] = crate::packets::packet_fields(camera, (layout == "THWC").then(|| shape[0]), layout);
            fields.push(numbers);
            packet_columns.push(gops);
            continue;
        }
        if camera.yuv.is_some() {
            // A frame's planes, one dimension; `layout` and `frame_shape` are of its RGB.
            shape.truncate(shape.len() - 3);
            shape.push(camera.frame_bytes());
        }
        let size: usize = shape.iter().product();
        let list = DataType::FixedSizeList(Arc::new(Field::new("item", DataType::UInt8, false)), size as i32);
        let mut m = meta(&shape, "uint8");
        m.insert(LAYOUT.into(), layout.into());
        m.insert("frame_shape".into(), serde_json::to_string(&[h, w, 3]).expect("shape"));
        match camera.yuv {
            Some(yuv) => {
                m.insert(PIXEL_FORMAT.into(), FrameFormat::Yuv420p.to_string());
                m.insert(YUV_TO_RGB.into(), serde_json::to_string(&yuv).expect("integers"));
            }
            None => drop(m.insert(PIXEL_FORMAT.into(), FrameFormat::Rgb24.to_string())),
        }
        if let Some(label) = &camera.proxy {
            m.insert(lake_schemas::tables::PROXY_METADATA.into(), label.clone());
        }
        fields.push(Field::new(&camera.key, list, false).with_metadata(m));
    }
    fields.extend(packet_columns);
    for w in windows {
        let t = w.offsets.len();
        let list = DataType::FixedSizeList(Arc::new(Field::new("item", DataType::Boolean, false)), t as i32);
        fields.push(Field::new(format!("{}_is_pad", w.key), list, false).with_metadata(meta(&[t], "bool")));
    }
    Schema::new(fields)
}

impl crate::lookahead::FrameSource for Loader {
    fn cache(&self) -> &FrameCache {
        Loader::cache(self)
    }

    fn decodes_any(&self) -> bool {
        Loader::decodes_any(self)
    }

    fn decoded_frames(&self, draws: &[Draw]) -> Vec<FrameRef> {
        Loader::decoded_frames(self, draws)
    }

    fn gop_of(&self, source: usize, row: u64) -> (u32, u64) {
        Loader::gop_of(self, source, row)
    }
}

#[cfg(test)]
mod tests {
    use std::{collections::HashMap, sync::Arc};

    use arrow::datatypes::{DataType, Field, Schema};

    use super::{LAYOUT, PIXEL_FORMAT, YUV_TO_RGB, camera_facts, first_difference};

    fn camera(frame_shape: &str, format: &str, conversion: Option<&str>) -> Schema {
        let mut m = HashMap::from([
            (LAYOUT.to_string(), "HWC".to_string()),
            ("frame_shape".to_string(), frame_shape.to_string()),
            (PIXEL_FORMAT.to_string(), format.to_string()),
        ]);
        if let Some(c) = conversion {
            m.insert(YUV_TO_RGB.to_string(), c.to_string());
        }
        let list = DataType::FixedSizeList(Arc::new(Field::new("item", DataType::UInt8, false)), 460_800);
        Schema::new(vec![Field::new("cam", list, false).with_metadata(m)])
    }

    #[test]
    fn a_mixture_of_cameras_with_bytes_of_other_meaning_is_told_apart() {
        let bt601 = camera("[480,640,3]", "yuv420p", Some("bt601"));
        let bt709 = camera("[480,640,3]", "yuv420p", Some("bt709"));
        let rgb = camera("[320,480,3]", "rgb24", None);
        let facts = |s: &Schema| camera_facts(s.field(0));
        assert_eq!(facts(&bt601), facts(&camera("[480,640,3]", "yuv420p", Some("bt601"))));
        assert_ne!(facts(&bt601), facts(&bt709), "same bytes, another conversion");
        assert_ne!(facts(&bt601), facts(&rgb), "same byte count, RGB of another size");
        assert!(first_difference(&bt601, &bt709).contains("ask for rgb24 frames to mix them"), "{}", first_difference(&bt601, &bt709));
        let sizes = first_difference(&bt601, &rgb);
        assert!(sizes.contains("is shaped [480,640,3] in the first and [320,480,3]") && sizes.contains("only as rgb24"), "{sizes}");
        let rgb_sizes = first_difference(&camera("[480,640,3]", "rgb24", None), &rgb);
        assert!(rgb_sizes.contains("--frame-size WxH"), "{rgb_sizes}");
        assert!(camera_facts(&Field::new("x", DataType::Int64, false)).is_empty());
        // Frames of one shape, as planes from one and RGB from the other (another pixel format).
        let mut rgb_same = camera("[480,640,3]", "rgb24", None);
        let list = DataType::FixedSizeList(Arc::new(Field::new("item", DataType::UInt8, false)), 921_600);
        rgb_same = Schema::new(vec![rgb_same.field(0).clone().with_data_type(list)]);
        let formats = first_difference(&bt601, &rgb_same);
        assert!(formats.contains("comes as yuv420p planes") && formats.contains("as rgb24 from the second"), "{formats}");
    }
}
