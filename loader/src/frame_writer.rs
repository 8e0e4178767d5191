//! Writing a frame table (`lake cache`, `lake ingest --frame-cache`): every frame of a dataset
//! version decoded once, in stream order, and stored as [`crate::frames`] describes, published
//! whole when complete ([`lake_store::DerivedTable`]).

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
};

use arrow::array::{ArrayBuilder, LargeBinaryBuilder, RecordBatch, UInt32Builder, UInt64Builder};
use arrow::datatypes::SchemaRef;
use futures::StreamExt;
use lake_store::{DerivedTable, Lake, UncommittedPart};

use crate::{
    Error, Result,
    dataset::LoaderDataset,
    frames::{BATCH, FrameStorage, LEVEL, READ_ROWS, frame_table_name, frames_schema},
};
use lake_codec::{RgbFrame, StreamConfig, StreamDecoder};
use lake_schemas::FrameSize;

/// What [`write_frame_table`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FrameTableReport {
    /// Frames stored.
    pub frames: u64,
    /// Bytes of RGB before compression.
    pub raw_bytes: u64,
    /// Bytes stored.
    pub stored_bytes: u64,
}

/// The rows `[first, end)` of each stream, in packet row order.
pub(crate) fn stream_runs(ds: &LoaderDataset) -> Vec<(u32, u64, u64)> {
    let mut runs: Vec<(u32, u64, u64)> = Vec::new();
    for (row, &stream) in ds.packets.stream.iter().enumerate() {
        match runs.last_mut() {
            Some(run) if run.0 == stream => run.2 = row as u64 + 1,
            _ => runs.push((stream, row as u64, row as u64 + 1)),
        }
    }
    runs
}

/// Where one stream run's batches go on their way into a derived table.
pub(crate) type BatchSender = tokio::sync::mpsc::Sender<Result<RecordBatch>>;

/// Writes one part of `table` per stream run of `ds` ([`stream_runs`]), `threads` runs at a time:
/// `produce` makes a run's batches on a blocking thread and sends them while the part is being
/// written. Returns each run's part with what `produce` returned, in run order.
///
/// # Errors
/// The first run's error: `produce`'s, the writer's, or `what` (the producer) having stopped.
pub(crate) async fn write_stream_parts<R, F>(
    table: &DerivedTable,
    schema: SchemaRef,
    ds: &Arc<LoaderDataset>,
    threads: usize,
    what: &str,
    produce: F,
) -> Result<Vec<(UncommittedPart, R)>>
where
    R: Send + 'static,
    F: Fn(&LoaderDataset, u32, (u64, u64), &BatchSender) -> Result<R> + Clone + Send + 'static,
{
    let parts = futures::stream::iter(stream_runs(ds))
        .map(|(stream, first, end)| {
            let (ds, produce, schema) = (ds.clone(), produce.clone(), schema.clone());
            async move {
                let (tx, rx) = tokio::sync::mpsc::channel::<Result<RecordBatch>>(2);
                let producer = tokio::task::spawn_blocking(move || produce(&ds, stream, (first, end), &tx));
                let batches = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|b| (b, rx)) });
                let part = table.write_part(schema, batches).await;
                let report = producer.await.map_err(|e| Error::request(format!("{what} stopped: {e}")))?;
                // When the writer failed, the producer only saw its channel close: the writer's
                // error is the cause.
                let part = part?;
                Ok::<_, Error>((part, report?))
            }
        })
        .buffered(threads.max(1))
        .collect::<Vec<_>>()
        .await;
    parts.into_iter().collect()
}

/// Decodes every frame of `ds` (streams in parallel, `threads` at a time) and stores them as
/// the version's `frames` table, as `storage` says, or, with `size`, resized to it (every
/// camera; [`RgbResizer`](lake_codec::RgbResizer)) as its `frames-WxH` table. Replaces an existing
/// table only once the new one is complete. `stored` counts the frames stored so far (for
/// progress reports; the table has one per `packets` row).
///
/// # Errors
/// When a frame cannot be decoded or the table cannot be written.
pub async fn write_frame_table(
    lake: &Lake,
    ds: Arc<LoaderDataset>,
    threads: usize,
    storage: FrameStorage,
    size: Option<FrameSize>,
    stored: &Arc<std::sync::atomic::AtomicU64>,
) -> Result<FrameTableReport> {
    if let Some(camera) = ds.cameras.iter().find(|c| c.yuv.is_some()) {
        return Err(Error::request(format!(
            "{}: camera {} was opened for YUV planes; a frame table stores RGB (open the dataset with rgb24 frames)",
            ds.label, camera.key
        )));
    }
    let table = lake.derived_table(&ds.record.tables.dir, &frame_table_name(size));
    let stored = stored.clone();
    let decode = move |ds: &LoaderDataset, stream, run, tx: &BatchSender| decode_stream(ds, stream, run, (storage, size), tx, &stored);
    let parts = write_stream_parts(&table, frames_schema(storage), &ds, threads, "frame decoder", decode).await?;
    let mut report = FrameTableReport::default();
    let mut ordered = Vec::with_capacity(parts.len());
    for (part, r) in parts {
        report.frames += r.frames;
        report.raw_bytes += r.raw_bytes;
        report.stored_bytes += r.stored_bytes;
        ordered.push(part);
    }
    table.commit_parts(frames_schema(storage), ordered, HashMap::new()).await?;
    table.publish().await?;
    Ok(report)
}

/// Rows of one stream on their way into the table, in row order.
struct RowWriter<'a> {
    tx: &'a BatchSender,
    storage: FrameStorage,
    /// Resizes frames to the table's size, when it has one.
    resizer: Option<lake_codec::RgbResizer>,
    /// Frames stored by every writer of the table.
    stored: &'a std::sync::atomic::AtomicU64,
    rows: UInt64Builder,
    data: LargeBinaryBuilder,
    checksums: UInt32Builder,
    /// Frames that came out before a row preceding them (B-frames): row → stored frame.
    pending: BTreeMap<u64, Vec<u8>>,
    next: u64,
    report: FrameTableReport,
}

impl RowWriter<'_> {
    fn add(&mut self, row: u64, rgb: &[u8]) -> std::io::Result<()> {
        let resized;
        let rgb = match &mut self.resizer {
            Some(r) => {
                resized = r.resize(rgb).map_err(std::io::Error::other)?;
                &resized[..]
            }
            None => rgb,
        };
        let stored = match self.storage {
            FrameStorage::Plain => rgb.to_vec(),
            FrameStorage::Zstd => zstd::bulk::compress(rgb, LEVEL)?,
        };
        self.report.raw_bytes += rgb.len() as u64;
        self.pending.insert(row, stored);
        Ok(())
    }

    /// Writes every pending frame whose predecessors are all written.
    fn flush_ready(&mut self) -> Result<()> {
        while let Some(stored) = self.pending.remove(&self.next) {
            self.report.frames += 1;
            self.stored.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.report.stored_bytes += stored.len() as u64;
            self.rows.append_value(self.next);
            self.data.append_value(&stored);
            self.checksums.append_value(crc32fast::hash(&stored));
            self.next += 1;
            if self.rows.len() >= BATCH {
                self.send()?;
            }
        }
        Ok(())
    }

    fn send(&mut self) -> Result<()> {
        let batch = RecordBatch::try_new(
            frames_schema(self.storage),
            vec![Arc::new(self.rows.finish()), Arc::new(self.data.finish()), Arc::new(self.checksums.finish())],
        )?;
        self.tx.blocking_send(Ok(batch)).map_err(|_| Error::request("the frame table writer stopped"))
    }
}

/// The `packets` rows of `stream` that some step shows.
pub(crate) fn shown_rows(ds: &LoaderDataset, stream: u32) -> std::collections::HashSet<u64> {
    let camera = ds.streams.get(&stream).map(|s| s.camera.as_str());
    ds.cameras.iter().filter(|c| Some(c.key.as_str()) == camera).flat_map(|c| c.packet_rows.iter().flatten()).collect()
}

/// A packet that failed to decode, as [`decode_rows`] hands it on.
pub(crate) struct Damage {
    /// The row of the next keyframe (the run's end where none follows), where decoding starts
    /// again.
    pub next_key: u64,
    /// The decoder's message.
    pub message: String,
}

/// Decodes rows `[first, end)` of one stream in decode order, reading their packets
/// [`READ_ROWS`] at a time, and hands `each` a packet's row, bytes, and the frames it let out
/// or its [`Damage`]. After damage, decoding starts again at the next keyframe with a new
/// decoder, unless `each` stops it with an error. Returns the frames the decoder held at the end.
pub(crate) fn decode_rows(
    ds: &LoaderDataset,
    config: &StreamConfig,
    (first, end): (u64, u64),
    mut each: impl FnMut(u64, &[u8], std::result::Result<Vec<(i64, RgbFrame)>, Damage>) -> Result<()>,
) -> Result<Vec<(i64, RgbFrame)>> {
    let index = &ds.packets;
    let rt = tokio::runtime::Handle::current();
    let mut decoder = StreamDecoder::open(config).map_err(|e| ds.decode_error(first, e.to_string()))?;
    // Rows before this are skipped: a span that failed to decode.
    let mut resume_at = first;
    let mut chunk = first;
    while chunk < end {
        let chunk_end = (chunk + READ_ROWS).min(end);
        let bytes = rt.block_on(ds.packet_bytes(&(chunk..chunk_end).collect::<Vec<_>>()))?;
        for (row, b) in (chunk..chunk_end).zip(&bytes) {
            if row < resume_at {
                continue;
            }
            let r = row as usize;
            match decoder.feed(index.pts[r], index.dts[r], index.container_keyframe[r], b) {
                Ok(frames) => each(row, b, Ok(frames))?,
                Err(e) => {
                    let next_key = (row + 1..end).find(|&k| index.keyframe_offset[k as usize] == 0).unwrap_or(end);
                    each(row, b, Err(Damage { next_key, message: e.to_string() }))?;
                    decoder = StreamDecoder::open(config).map_err(|e| ds.decode_error(next_key, e.to_string()))?;
                    resume_at = next_key;
                }
            }
        }
        chunk = chunk_end;
    }
    decoder.finish().map_err(|e| ds.decode_error(end.saturating_sub(1), e.to_string()))
}

/// Decodes rows `[first, end)` of one stream sequentially, in decode order, and sends them in
/// row order as batches of the frames table.
fn decode_stream(
    ds: &LoaderDataset,
    stream: u32,
    (first, end): (u64, u64),
    (storage, size): (FrameStorage, Option<FrameSize>),
    tx: &BatchSender,
    stored: &std::sync::atomic::AtomicU64,
) -> Result<FrameTableReport> {
    let config = ds.streams.get(&stream).ok_or_else(|| Error::layout(&ds.label, format!("stream {stream} is not in the streams table")))?;
    let index = &ds.packets;
    let intra_only = config.kind == "image";
    let row_of_pts: HashMap<i64, u64> =
        if intra_only { HashMap::new() } else { (first..end).map(|r| (index.pts[r as usize], r)).collect() };
    let resizer = match size {
        Some(s) => Some(
            lake_codec::RgbResizer::new((config.params.width, config.params.height), (s.width, s.height))
                .map_err(|e| ds.decode_error(first, e.to_string()))?,
        ),
        None => None,
    };
    let mut out = RowWriter {
        tx,
        storage,
        resizer,
        stored,
        rows: UInt64Builder::new(),
        data: LargeBinaryBuilder::new(),
        checksums: UInt32Builder::new(),
        pending: BTreeMap::new(),
        next: first,
        report: FrameTableReport::default(),
    };
    let zstd_err = |e: std::io::Error| Error::layout(&ds.label, format!("storing a frame: {e}"));
    // Rows some step shows, made when a packet first fails to decode.
    let mut shown: Option<std::collections::HashSet<u64>> = None;
    let tail = decode_rows(ds, config, (first, end), |row, _, decoded| {
        let frames = match decoded {
            Ok(frames) => frames,
            Err(Damage { next_key, message }) => {
                // A damaged packet no step needs (of an episode left out at ingest, or of frames
                // no step shows): the rows up to the next keyframe are stored empty, unless a step
                // shows one of them.
                let shown = shown.get_or_insert_with(|| shown_rows(ds, stream));
                if (out.next..next_key).any(|k| shown.contains(&k)) {
                    return Err(ds.decode_error(row, message));
                }
                for k in out.next..next_key {
                    out.pending.entry(k).or_default();
                }
                return out.flush_ready();
            }
        };
        if intra_only {
            // One picture per packet, out at once (image pts repeat across episodes).
            if frames.len() != 1 {
                return Err(ds.decode_error(row, format!("{} pictures from one image", frames.len())));
            }
            out.add(row, &frames[0].1.data).map_err(zstd_err)?;
        } else {
            for (pts, frame) in frames {
                if let Some(&at) = row_of_pts.get(&pts) {
                    out.add(at, &frame.data).map_err(zstd_err)?;
                }
            }
        }
        out.flush_ready()
    })?;
    for (pts, frame) in tail {
        if let Some(&at) = row_of_pts.get(&pts) {
            out.add(at, &frame.data).map_err(zstd_err)?;
        }
    }
    out.flush_ready()?;
    if out.next != end {
        return Err(ds.decode_error(out.next, "the decoder put out no frame for this packet".into()));
    }
    if !out.rows.is_empty() {
        out.send()?;
    }
    Ok(out.report)
}
