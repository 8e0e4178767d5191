//! Training proxies (`lake cache NAME --proxy h264|hevc`): every frame some step shows,
//! re-encoded once per stream into short closed GOPs without B-frames, for trainers whose GPU
//! cannot decode the recorded codec (AV1 on Hopper) or that want cheap random access.
//!
//! A proxy's frames are not the recorded frames (the encoding is lossy), so a dataset is served
//! from its proxy only when a request asks (`"proxy": true`), and every camera column then
//! carries [`PROXY_METADATA`] with the proxy's settings and its PSNR against the recorded
//! frames. The table (`proxy.lance` beside the version's tables) has the packets table's shape
//! ([`proxy_schema`]), so every frame path (decoded, planes, packets) reads it as it reads
//! `packets`; its schema metadata holds the [`ProxyInfo`].

use std::{collections::HashMap, sync::Arc};

use arrow::array::{ArrayBuilder, BooleanBuilder, Int64Builder, LargeBinaryBuilder, RecordBatch, UInt32Builder, UInt64Builder};
use lake_codec::{EncodedPacket, ProxyEncoder, ProxySettings, StreamConfig, StreamDecoder, psnr, squared_error};
use lake_schemas::tables::{PROXY, PROXY_METADATA, proxy_schema};

pub use crate::proxy_info::{ProxyCamera, ProxyInfo, ProxyLabel, ProxyLabelEntry};
use lake_store::Lake;

use crate::{
    Error, Result,
    dataset::LoaderDataset,
    frame_writer::{BatchSender, Damage, decode_rows, shown_rows, write_stream_parts},
    frames::READ_ROWS,
};

pub use lake_codec::{ProxyCodec, ProxySettings as Settings};

/// Rows per batch sent to the table writer (a batch holds compressed frames).
const BATCH: usize = 64;

/// What [`write_proxy`] did besides the [`ProxyInfo`].
#[derive(Debug, Clone, PartialEq)]
pub struct ProxyReport {
    /// The proxy.
    pub info: ProxyInfo,
    /// Rows written.
    pub frames: u64,
}

/// Re-encodes every frame some step of `ds` shows (streams in parallel, `threads` at a time)
/// as `settings` say, measures each camera's PSNR against the recorded frames, and stores the
/// result as the version's proxy table, replacing an existing one only once the new one is
/// complete. `done` counts the frames re-encoded so far (for progress reports).
///
/// # Errors
/// When a frame some step shows cannot be decoded or encoded (naming its episode and frame), or
/// the table cannot be written.
pub async fn write_proxy(
    lake: &Lake,
    ds: Arc<LoaderDataset>,
    threads: usize,
    settings: ProxySettings,
    done: &Arc<std::sync::atomic::AtomicU64>,
) -> Result<ProxyReport> {
    if ds.proxy.is_some() || ds.cameras.iter().any(|c| c.yuv.is_some()) {
        return Err(Error::request(format!(
            "{}: a proxy is made from the recorded frames: open the dataset as recorded, in rgb24",
            ds.label
        )));
    }
    let table = lake.derived_table(&ds.record.tables.dir, PROXY);
    let done = done.clone();
    let encode = move |ds: &LoaderDataset, stream, run, tx: &BatchSender| encode_stream(ds, stream, run, settings, tx, &done);
    let parts = write_stream_parts(&table, proxy_schema(), &ds, threads, "proxy encoder", encode).await?;
    let mut ordered = Vec::with_capacity(parts.len());
    let mut streams = Vec::new();
    let mut per_camera: Vec<(String, StreamReport)> = Vec::new();
    for (part, report) in parts {
        ordered.push(part);
        if let Some(config) = report.config.clone() {
            streams.push(config);
        }
        match per_camera.iter_mut().find(|(camera, _)| *camera == report.camera) {
            Some((_, sum)) => sum.add(&report),
            None => per_camera.push((report.camera.clone(), report)),
        }
    }
    let cameras: Vec<ProxyCamera> = ds
        .cameras
        .iter()
        .filter_map(|c| per_camera.iter().find(|(key, _)| *key == c.key))
        .map(|(camera, r)| ProxyCamera {
            camera: camera.clone(),
            frames: r.frames,
            psnr_db: psnr(r.sse, r.samples),
            min_psnr_db: psnr(r.worst.0, r.worst.1),
            bytes: r.bytes,
            recorded_bytes: r.recorded_bytes,
        })
        .collect();
    let info = ProxyInfo { settings, cameras, streams };
    let frames = info.cameras.iter().map(|c| c.frames).sum();
    let metadata = HashMap::from([(PROXY_METADATA.to_string(), serde_json::to_string(&info).expect("plain data"))]);
    table.commit_parts(proxy_schema(), ordered, metadata).await?;
    table.publish().await?;
    Ok(ProxyReport { info, frames })
}

/// What one stream's encoding measured.
#[derive(Debug, Clone, Default)]
struct StreamReport {
    camera: String,
    /// The proxy stream's decoder parameters (`None` for pictures, kept as recorded).
    config: Option<StreamConfig>,
    frames: u64,
    sse: u64,
    samples: u64,
    /// The squared error and samples of the frame furthest from its recorded frame.
    worst: (u64, u64),
    bytes: u64,
    recorded_bytes: u64,
}

impl StreamReport {
    fn add(&mut self, other: &Self) {
        self.frames += other.frames;
        self.sse += other.sse;
        self.samples += other.samples;
        if other.worst.0 * self.worst.1.max(1) > self.worst.0 * other.worst.1.max(1) {
            self.worst = other.worst;
        }
        self.bytes += other.bytes;
        self.recorded_bytes += other.recorded_bytes;
    }

    fn frame(&mut self, sse: u64, samples: u64) {
        self.sse += sse;
        self.samples += samples;
        if sse * self.worst.1.max(1) > self.worst.0 * samples || self.worst.1 == 0 {
            self.worst = (sse, samples);
        }
    }
}

/// Proxy rows on their way into the table, in decode order.
struct Rows<'a> {
    tx: &'a BatchSender,
    stream: u32,
    pts: Int64Builder,
    keyframe: BooleanBuilder,
    keyframe_offset: UInt32Builder,
    data: LargeBinaryBuilder,
    checksum: UInt32Builder,
    source_row: UInt64Builder,
    /// Rows since the last keyframe.
    since_key: Option<u32>,
}

impl Rows<'_> {
    fn push(&mut self, packet: &EncodedPacket, source_row: u64, label: &str) -> Result<()> {
        let offset = match (packet.keyframe, self.since_key) {
            (true, _) => 0,
            (false, Some(n)) => n + 1,
            (false, None) => return Err(Error::layout(label, "the proxy encoder began a stream without a keyframe")),
        };
        self.since_key = Some(offset);
        self.pts.append_value(packet.pts);
        self.keyframe.append_value(packet.keyframe);
        self.keyframe_offset.append_value(offset);
        self.data.append_value(&packet.data);
        self.checksum.append_value(crc32fast::hash(&packet.data));
        self.source_row.append_value(source_row);
        if self.pts.len() >= BATCH { self.send() } else { Ok(()) }
    }

    fn send(&mut self) -> Result<()> {
        let pts = Arc::new(self.pts.finish());
        let n = pts.len();
        let keyframe = Arc::new(self.keyframe.finish());
        let batch = RecordBatch::try_new(
            proxy_schema(),
            vec![
                Arc::new(arrow::array::UInt32Array::from(vec![self.stream; n])),
                pts.clone(),
                pts,
                keyframe.clone(),
                keyframe,
                Arc::new(self.keyframe_offset.finish()),
                Arc::new(self.data.finish()),
                Arc::new(self.checksum.finish()),
                Arc::new(self.source_row.finish()),
            ],
        )?;
        self.tx.blocking_send(Ok(batch)).map_err(|_| Error::request("the proxy table writer stopped"))
    }
}

/// Decodes rows `[first, end)` of one stream in decode order, re-encodes the frames some step
/// shows, decodes the proxy's packets again to measure them against the recorded frames, and
/// sends the proxy rows. Pictures are kept as recorded.
fn encode_stream(
    ds: &LoaderDataset,
    stream: u32,
    (first, end): (u64, u64),
    settings: ProxySettings,
    tx: &BatchSender,
    done: &std::sync::atomic::AtomicU64,
) -> Result<StreamReport> {
    let config = ds.streams.get(&stream).ok_or_else(|| Error::layout(&ds.label, format!("stream {stream} is not in the streams table")))?;
    let failed = |row: u64, message: String| ds.decode_error(row, message);
    let rt = tokio::runtime::Handle::current();
    let index = &ds.packets;
    let shown = shown_rows(ds, stream);
    let mut rows = Rows {
        tx,
        stream,
        pts: Int64Builder::new(),
        keyframe: BooleanBuilder::new(),
        keyframe_offset: UInt32Builder::new(),
        data: LargeBinaryBuilder::new(),
        checksum: UInt32Builder::new(),
        source_row: UInt64Builder::new(),
        since_key: None,
    };
    let mut report = StreamReport { camera: config.camera.clone(), ..StreamReport::default() };
    let progress = |n: u64| done.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    if config.kind == "image" {
        // Every picture is a keyframe already: kept as recorded.
        let wanted: Vec<u64> = (first..end).filter(|r| shown.contains(r)).collect();
        for chunk in wanted.chunks(READ_ROWS as usize) {
            let bytes = rt.block_on(ds.packet_bytes(chunk))?;
            for (&row, data) in chunk.iter().zip(&bytes) {
                let packet = EncodedPacket { pts: index.pts[row as usize], keyframe: true, data: data.to_vec() };
                rows.push(&packet, row, &ds.label)?;
                report.frames += 1;
                report.bytes += data.len() as u64;
                report.recorded_bytes += data.len() as u64;
            }
            progress(chunk.len() as u64);
        }
        if !rows.pts.is_empty() {
            rows.send()?;
        }
        return Ok(report);
    }
    let (width, height) = (config.params.width, config.params.height);
    let proxy_config = StreamConfig {
        stream,
        camera: config.camera.clone(),
        kind: config.kind.clone(),
        params: ProxyEncoder::params(settings.codec, width, height),
        yuv: None,
    };
    let mut encoder = ProxyEncoder::open(settings, width, height, ds.fps()).map_err(|e| failed(first, e.to_string()))?;
    let mut check = StreamDecoder::open(&proxy_config).map_err(|e| failed(first, e.to_string()))?;
    let row_of_pts: HashMap<i64, u64> = (first..end).filter(|r| shown.contains(r)).map(|r| (index.pts[r as usize], r)).collect();
    // Recorded frames waiting for their proxy frame to come out of the check decoder.
    let mut recorded: HashMap<i64, Vec<u8>> = HashMap::new();
    let mut take = |packets: Vec<EncodedPacket>, rows: &mut Rows<'_>, report: &mut StreamReport, recorded: &mut HashMap<i64, Vec<u8>>| {
        for packet in packets {
            let row = row_of_pts[&packet.pts];
            for (pts, frame) in check.feed(packet.pts, packet.pts, packet.keyframe, &packet.data).map_err(|e| failed(row, e.to_string()))? {
                let original =
                    recorded.remove(&pts).ok_or_else(|| failed(row, format!("the proxy decoder put out an unknown frame (pts {pts})")))?;
                report.frame(squared_error(&original, &frame.data), original.len() as u64);
            }
            report.frames += 1;
            report.bytes += packet.data.len() as u64;
            rows.push(&packet, row, &ds.label)?;
            progress(1);
        }
        Ok::<_, Error>(())
    };
    // The shown frames not yet re-encoded.
    let mut unseen: std::collections::HashSet<i64> = row_of_pts.keys().copied().collect();
    let mut encode = |frames: Vec<(i64, lake_codec::RgbFrame)>, rows: &mut Rows<'_>, report: &mut StreamReport| {
        for (pts, frame) in frames {
            if !unseen.remove(&pts) {
                continue;
            }
            let row = row_of_pts[&pts];
            let packets = encoder.encode(pts, &frame.data).map_err(|e| failed(row, e.to_string()))?;
            recorded.insert(pts, frame.data);
            take(packets, rows, report, &mut recorded)?;
        }
        Ok::<_, Error>(())
    };
    let tail = decode_rows(ds, config, (first, end), |row, bytes, decoded| match decoded {
        Ok(frames) => {
            report.recorded_bytes += if shown.contains(&row) { bytes.len() as u64 } else { 0 };
            encode(frames, &mut rows, &mut report)
        }
        Err(Damage { next_key, message }) => {
            // A damaged packet no step needs: decoding starts again at the next keyframe, unless
            // a step shows a frame before it.
            let from = row - u64::from(index.keyframe_offset[row as usize]);
            if (from..next_key).any(|k| shown.contains(&k)) { Err(failed(row, message)) } else { Ok(()) }
        }
    })?;
    encode(tail, &mut rows, &mut report)?;
    let last = end.saturating_sub(1);
    let tail = encoder.finish().map_err(|e| failed(last, e.to_string()))?;
    take(tail, &mut rows, &mut report, &mut recorded)?;
    for (pts, frame) in check.finish().map_err(|e| failed(last, e.to_string()))? {
        let original =
            recorded.remove(&pts).ok_or_else(|| failed(last, format!("the proxy decoder put out an unknown frame (pts {pts})")))?;
        report.frame(squared_error(&original, &frame.data), original.len() as u64);
    }
    if let Some((&pts, _)) = recorded.iter().next() {
        return Err(failed(row_of_pts[&pts], "the proxy's frame did not come out of its decoder".into()));
    }
    if let Some(row) = unseen.iter().map(|pts| row_of_pts[pts]).min() {
        return Err(failed(row, "the decoder put out no frame for this packet".into()));
    }
    if !rows.pts.is_empty() {
        rows.send()?;
    }
    report.config = Some(proxy_config);
    Ok(report)
}
