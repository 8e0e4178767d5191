//! One camera file → packet rows: demux in a blocking worker, resolve LeRobot's timestamp
//! rule to packet positions, and stream the rows into uncommitted Lance data files.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
};

use arrow::{
    array::{ArrayRef, BooleanBuilder, Int64Builder, LargeBinaryBuilder, RecordBatch, StringBuilder, UInt32Builder},
    datatypes::SchemaRef,
};
use lake_schemas::{Finding, FindingKind, tables};
use lake_store::UncommittedPart;

use crate::{
    Error, Result,
    scratch::{MAX_POSITION, Scratch},
    source::{Source, SourceFile},
};
use lake_codec::{DemuxedPacket, FrameCheck, StreamFacts, VideoDemuxer, same_codec};

/// Rows per packets batch handed to Lance.
const BATCH_ROWS: usize = 2048;
/// Bytes of packet data per batch handed to Lance.
const BATCH_BYTES: usize = 8 << 20;
/// Read-ahead of the demuxer's I/O.
const READ_BLOCK: usize = 4 << 20;

/// A step whose frame must be found in the stream.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Query {
    /// Seconds into the file: `from_timestamp + timestamp`, as LeRobot computes it.
    pub t: f64,
    /// Episode index.
    pub episode: i64,
    /// Frame index inside the episode.
    pub frame: i64,
    /// `from_timestamp` of the episode in this file (for messages).
    pub from_timestamp: f64,
}

/// What the metadata declares about a camera.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Declared {
    /// `video.codec`.
    pub codec: Option<String>,
    /// Declared height.
    pub height: Option<u32>,
    /// Declared width.
    pub width: Option<u32>,
    /// `video.pix_fmt`.
    pub pix_fmt: Option<String>,
    /// The feature's `shape`, as height and width.
    pub shape: Option<(u32, u32)>,
}

/// An episode with steps in a camera file.
#[derive(Debug, Clone, PartialEq)]
pub struct JobEpisode {
    /// Episode index.
    pub index: i64,
    /// Where its part of the file begins, seconds.
    pub from_timestamp: f64,
    /// Where it ends, when the metadata says.
    pub to_timestamp: Option<f64>,
    /// Its length in the metadata.
    pub length: i64,
    /// The scratch slot of its first step.
    pub first_slot: u64,
    /// Its steps in the data.
    pub steps: usize,
}

/// One camera file to demux.
#[derive(Debug, Clone)]
pub struct StreamJob {
    /// Stream id (its position in the `streams` table).
    pub stream: u32,
    /// Camera key.
    pub camera: String,
    /// The camera's position among the video cameras (its scratch file of positions).
    pub camera_slot: usize,
    /// The file.
    pub file: SourceFile,
    /// What `info.json` declares.
    pub declared: Declared,
    /// The episodes whose steps show frames of this file.
    pub episodes: Vec<JobEpisode>,
    /// `[from, to)` (seconds) of the parts of the file that hold episodes not ingested, sorted
    /// and disjoint (overlapping parts merged).
    pub left_out: Vec<(f64, f64)>,
}

/// The result of one stream.
#[derive(Debug)]
pub struct StreamOutcome {
    /// The job.
    pub job: StreamJob,
    /// Container facts, when the file could be opened.
    pub facts: Option<StreamFacts>,
    /// Whether its packet rows are in the packets table: the file could be opened and at least
    /// one frame read (one row per packet, in its lane's part).
    pub published: bool,
    /// Packets demuxed (each sent to the lane's writer as a row).
    pub packets: u64,
    /// Keyframes among them.
    pub keyframes: u64,
    /// Longest distance between keyframes, in packets.
    pub max_gop: u64,
    /// Whether presentation order differs from decode order (B-frames).
    pub reordered: bool,
    /// Bytes of packet data.
    pub bytes: u64,
    /// Per episode of the job whose frames were found: the first and last packet position
    /// its steps show (the positions of every step are in the scratch files).
    pub extents: Vec<(i64, u64, u64)>,
    /// Problems found.
    pub findings: Vec<Finding>,
}

/// Shared counters a stream reports into.
#[derive(Debug, Clone)]
pub struct StreamContext {
    /// Source of the files.
    pub source: Source,
    /// Lance URI of the packets table.
    pub packets_uri: String,
    /// Tolerance of the timestamp rule, seconds.
    pub tolerance_s: f64,
    /// Frames per second of the dataset.
    pub fps: f64,
    /// Set to stop early.
    pub cancel: Arc<AtomicBool>,
    /// Packets demuxed so far (for progress).
    pub frames_done: Arc<AtomicU64>,
    /// Where steps' timestamps are read and their packet positions written.
    pub scratch: Arc<Scratch>,
    /// Decode every frame once ([`FrameCheck`]).
    pub verify: bool,
}

/// The camera files of one lane, demuxed one after another into one part of the packets
/// table: a lane's rows are its files' rows in job order, one Lance writer per lane however
/// many files there are (a part per file would hold a fragment and a schema in memory per file,
/// and leave the table with a fragment per file).
pub struct Lane {
    /// The outcomes of the files whose demux was not cut short by a cancel, in job order.
    pub outcomes: Vec<StreamOutcome>,
    /// The part holding every published file's rows, or why the lane stopped.
    pub part: Result<UncommittedPart>,
}

/// Demuxes `jobs` in order; `finished` sees each outcome as its file ends.
///
/// The lane's part is an error when the lake or the scratch files cannot be written, a file
/// has more frames than the scratch files hold, or the ingest was cancelled; problems with a
/// file become findings.
pub async fn run_lane(ctx: StreamContext, jobs: Vec<StreamJob>, finished: impl Fn(&StreamOutcome)) -> Lane {
    let schema = tables::packets_schema();
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<RecordBatch>>(2);
    let batches = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (item, rx)) });
    let writer = lake_store::write_uncommitted(ctx.packets_uri.clone(), schema.clone(), batches);
    let work = async {
        // Dropped when the work ends, which ends the part.
        let tx = tx;
        let mut outcomes = Vec::new();
        for job in jobs {
            if tx.is_closed() {
                break; // the writer failed: its error is the lane's
            }
            let runtime = tokio::runtime::Handle::current();
            let (worker_ctx, worker_schema, worker_tx) = (ctx.clone(), schema.clone(), tx.clone());
            let worker = tokio::task::spawn_blocking(move || demux(&worker_ctx, &job, worker_schema, runtime, worker_tx));
            let mut outcome = match worker.await {
                Ok(Ok(outcome)) => outcome,
                Ok(Err(e)) => return (outcomes, Err(e)),
                Err(e) => return (outcomes, Err(Error::Internal(format!("demux worker: {e}")))),
            };
            if ctx.cancel.load(Ordering::Relaxed) {
                return (outcomes, Err(Error::Cancelled));
            }
            // The frames of a file that breaks off part-way are published up to the break
            // (steps in the rest are errors); a file that could not be read wrote no rows.
            outcome.published = outcome.facts.is_some() && outcome.packets > 0;
            finished(&outcome);
            outcomes.push(outcome);
        }
        (outcomes, Ok(()))
    };
    let (written, (outcomes, worked)) = tokio::join!(writer, work);
    // A writer's own error (a full disk, say) is the lane's, also when the work stopped on a
    // cancel it would otherwise hide.
    let part = match (worked, written) {
        (Err(Error::Cancelled), Err(e)) => Err(e),
        (worked, written) => worked.and(written),
    };
    Lane { outcomes, part }
}

/// Splits jobs (in stream order) into at most `lanes` runs of consecutive jobs with about the
/// same bytes each, so that the packets table keeps stream order whatever the lane count.
pub fn split_lanes(jobs: Vec<StreamJob>, lanes: usize) -> Vec<Vec<StreamJob>> {
    let lanes = lanes.max(1);
    let total: u128 = jobs.iter().map(|j| u128::from(j.file.size.max(1))).sum();
    let mut out: Vec<Vec<StreamJob>> = (0..lanes).map(|_| Vec::new()).collect();
    let mut before = 0u128;
    for job in jobs {
        let lane = (before * lanes as u128 / total.max(1)) as usize;
        before += u128::from(job.file.size.max(1));
        out[lane.min(lanes - 1)].push(job);
    }
    out.retain(|lane| !lane.is_empty());
    out
}

struct Rows {
    stream: UInt32Builder,
    camera: StringBuilder,
    episode: Int64Builder,
    frame: Int64Builder,
    pts: Int64Builder,
    dts: Int64Builder,
    duration: Int64Builder,
    keyframe: BooleanBuilder,
    container_keyframe: BooleanBuilder,
    keyframe_offset: arrow::array::UInt32Builder,
    data: LargeBinaryBuilder,
    checksum: arrow::array::UInt32Builder,
    rows: usize,
    bytes: usize,
}

impl Rows {
    fn new() -> Self {
        Self {
            stream: UInt32Builder::with_capacity(BATCH_ROWS),
            camera: StringBuilder::new(),
            episode: Int64Builder::with_capacity(BATCH_ROWS),
            frame: Int64Builder::with_capacity(BATCH_ROWS),
            pts: Int64Builder::with_capacity(BATCH_ROWS),
            dts: Int64Builder::with_capacity(BATCH_ROWS),
            duration: Int64Builder::with_capacity(BATCH_ROWS),
            keyframe: BooleanBuilder::with_capacity(BATCH_ROWS),
            container_keyframe: BooleanBuilder::with_capacity(BATCH_ROWS),
            keyframe_offset: arrow::array::UInt32Builder::with_capacity(BATCH_ROWS),
            data: LargeBinaryBuilder::new(),
            checksum: arrow::array::UInt32Builder::with_capacity(BATCH_ROWS),
            rows: 0,
            bytes: 0,
        }
    }

    fn push(&mut self, stream: u32, camera: &str, shows: Option<(i64, i64)>, p: &DemuxedPacket, keyframe_offset: u32) {
        self.stream.append_value(stream);
        self.camera.append_value(camera);
        self.episode.append_option(shows.map(|s| s.0));
        self.frame.append_option(shows.map(|s| s.1));
        self.pts.append_value(p.pts);
        self.dts.append_value(p.dts);
        self.duration.append_value(p.duration);
        self.keyframe.append_value(p.keyframe);
        self.container_keyframe.append_value(p.container_keyframe);
        self.keyframe_offset.append_value(keyframe_offset);
        self.data.append_value(&p.data);
        self.checksum.append_value(crc32fast::hash(&p.data));
        self.rows += 1;
        self.bytes += p.data.len();
    }

    fn full(&self) -> bool {
        self.rows >= BATCH_ROWS || self.bytes >= BATCH_BYTES
    }

    fn finish(&mut self, schema: &SchemaRef) -> Result<RecordBatch> {
        let columns: Vec<ArrayRef> = vec![
            Arc::new(self.stream.finish()),
            Arc::new(self.camera.finish()),
            Arc::new(self.episode.finish()),
            Arc::new(self.frame.finish()),
            Arc::new(self.pts.finish()),
            Arc::new(self.dts.finish()),
            Arc::new(self.duration.finish()),
            Arc::new(self.keyframe.finish()),
            Arc::new(self.container_keyframe.finish()),
            Arc::new(self.keyframe_offset.finish()),
            Arc::new(self.data.finish()),
            Arc::new(self.checksum.finish()),
        ];
        self.rows = 0;
        self.bytes = 0;
        RecordBatch::try_new(schema.clone(), columns).map_err(Error::arrow(tables::PACKETS))
    }
}

/// The steps of a job's episodes, sorted by time.
fn queries(scratch: &Scratch, job: &StreamJob) -> Result<Vec<Query>> {
    let mut queries = Vec::with_capacity(job.episodes.iter().map(|e| e.steps).sum());
    for e in &job.episodes {
        for (frame, ts) in scratch.timestamps(e.first_slot, e.steps)?.into_iter().enumerate() {
            // LeRobot: from_timestamp (float64) + the float32 timestamp as a Python float.
            let t = e.from_timestamp + f64::from(ts);
            queries.push(Query { t, episode: e.index, frame: frame as i64, from_timestamp: e.from_timestamp });
        }
    }
    queries.sort_by(|a, b| a.t.total_cmp(&b.t));
    Ok(queries)
}

/// Writes each step's packet position to the scratch files; returns the first and last
/// position of each episode that has any.
fn store_positions(scratch: &Scratch, job: &StreamJob, queries: &[Query], positions: &[Option<u64>]) -> Result<Vec<(i64, u64, u64)>> {
    let index_of: HashMap<i64, usize> = job.episodes.iter().enumerate().map(|(i, e)| (e.index, i)).collect();
    let mut stored: Vec<Vec<Option<u32>>> = job.episodes.iter().map(|e| vec![None; e.steps]).collect();
    let mut extents: Vec<Option<(u64, u64)>> = vec![None; job.episodes.len()];
    for (q, p) in queries.iter().zip(positions) {
        let Some(p) = *p else { continue };
        let i = index_of[&q.episode];
        if p > MAX_POSITION {
            return Err(Error::Unsupported(format!("{}: lake indexes at most {} frames per camera file", job.file.path, MAX_POSITION + 1)));
        }
        stored[i][q.frame as usize] = Some(p as u32);
        extents[i] = Some(extents[i].map_or((p, p), |(lo, hi)| (lo.min(p), hi.max(p))));
    }
    for (e, positions) in job.episodes.iter().zip(&stored) {
        scratch.put_positions(job.camera_slot, e.first_slot, positions)?;
    }
    Ok(job.episodes.iter().zip(extents).filter_map(|(e, x)| x.map(|(lo, hi)| (e.index, lo, hi))).collect())
}

/// The blocking half: demux, resolve and batch. Problems with the file become findings; only
/// the scratch files failing is an error.
fn demux(
    ctx: &StreamContext,
    job: &StreamJob,
    schema: SchemaRef,
    runtime: tokio::runtime::Handle,
    tx: tokio::sync::mpsc::Sender<Result<RecordBatch>>,
) -> Result<StreamOutcome> {
    let queries = queries(&ctx.scratch, job)?;
    let mut positions: Vec<Option<u64>> = vec![None; queries.len()];
    let mut out = StreamOutcome {
        job: job.clone(),
        facts: None,
        published: false,
        packets: 0,
        keyframes: 0,
        max_gop: 0,
        reordered: false,
        bytes: 0,
        extents: Vec::new(),
        findings: Vec::new(),
    };
    // For each query, the distance and PTS of the nearest frame so far.
    let mut nearest: Vec<Option<(f64, i64)>> = vec![None; queries.len()];
    let episode_error = |kind: FindingKind, message: &str| -> Vec<Finding> {
        job.episodes
            .iter()
            .map(|e| Finding::error(kind, message).with_file(&job.file.path).with_episode(e.index).with_camera(&job.camera))
            .collect()
    };
    let reader = ctx.source.blocking_reader(&job.file, runtime, READ_BLOCK);
    let size = reader.len();
    let mut demuxer = match VideoDemuxer::open(reader, size, &job.file.path, ctx.cancel.clone()) {
        Ok(d) => d,
        Err(lake_codec::Error::Cancelled) => return Ok(out),
        Err(e) => {
            out.findings = episode_error(FindingKind::CorruptFile, &e.to_string());
            return Ok(out);
        }
    };
    let facts = demuxer.facts().clone();
    check_declared(job, &facts, ctx.fps, &mut out.findings);
    let mut check = match ctx.verify.then(|| FrameCheck::open(&facts.params)) {
        Some(Err(why)) => {
            out.findings = episode_error(FindingKind::CorruptFile, &format!("its frames cannot be checked: {why}"));
            return Ok(out);
        }
        Some(Ok(check)) => Some(check),
        None => None,
    };
    let (tb_num, tb_den) = facts.time_base;
    let seconds = |pts: i64| pts as f64 * (f64::from(tb_num) / f64::from(tb_den));

    let mut rows = Rows::new();
    let mut keyframes: Vec<(u64, i64)> = Vec::new(); // (position, pts) of every keyframe
    let mut all_pts: Vec<i64> = Vec::new();
    let mut max_pts = i64::MIN;
    let mut flag_mismatches = 0u64;
    let mut undecodable: BTreeMap<u64, i64> = BTreeMap::new();
    // Packets whose bytes are not the codec's framing: (position, why).
    let mut damaged: Vec<(u64, String)> = Vec::new();
    let mut last_key = None;
    let tol = ctx.tolerance_s;
    // Why the file ends before its last frame, when it does.
    let mut broken: Option<String> = None;
    loop {
        if ctx.cancel.load(Ordering::Relaxed) {
            return Ok(out);
        }
        let packet = match demuxer.next_packet() {
            Ok(Some(p)) => p,
            Ok(None) => break,
            Err(lake_codec::Error::Cancelled) => return Ok(out),
            Err(e) => {
                broken = Some(e.to_string());
                break;
            }
        };
        let pos = out.packets;
        out.packets += 1;
        out.bytes += packet.data.len() as u64;
        if let Some(why) = &packet.damaged {
            damaged.push((pos, why.clone()));
        }
        if let Some(check) = check.as_mut() {
            check.feed(pos, &packet);
        }
        if packet.keyframe != packet.container_keyframe {
            flag_mismatches += 1;
        }
        if packet.pts < max_pts {
            out.reordered = true;
        }
        max_pts = max_pts.max(packet.pts);
        if packet.keyframe {
            if let Some(prev) = last_key {
                out.max_gop = out.max_gop.max(pos - prev);
            }
            last_key = Some(pos);
            out.keyframes += 1;
            keyframes.push((pos, packet.pts));
        }
        // Decoding starts at the latest keyframe (in decode order) that is not later than this
        // frame in presentation order; frames before every keyframe cannot be decoded alone.
        let start = keyframes.iter().rev().find(|(_, kpts)| *kpts <= packet.pts).map(|(kpos, _)| *kpos);
        let offset = match start {
            Some(k) => u32::try_from(pos - k).unwrap_or(u32::MAX),
            None => {
                undecodable.insert(pos, packet.pts);
                0
            }
        };
        // LeRobot's rule: each query shows the frame nearest to it (of two equally near, the
        // earlier), refused later when that is farther than the tolerance. Only frames within
        // the tolerance can be that frame, so only their queries are looked at. The packet's
        // own row names the query nearest to it.
        let t = seconds(packet.pts);
        let lo = queries.partition_point(|q| q.t < t - tol);
        let mut shows: Option<(f64, (i64, i64))> = None;
        for (qi, q) in queries.iter().enumerate().skip(lo) {
            if q.t > t + tol {
                break;
            }
            let distance = (q.t - t).abs();
            if distance > tol {
                continue;
            }
            if shows.is_none_or(|(d, _)| distance < d) {
                shows = Some((distance, (q.episode, q.frame)));
            }
            let nearer = match nearest[qi] {
                None => true,
                Some((d, pts)) => distance < d || (distance == d && packet.pts < pts),
            };
            if nearer {
                nearest[qi] = Some((distance, packet.pts));
                positions[qi] = Some(pos);
            }
        }
        let shows = shows.map(|(_, s)| s);
        all_pts.push(packet.pts);
        rows.push(job.stream, &job.camera, shows, &packet, offset);
        ctx.frames_done.fetch_add(1, Ordering::Relaxed);
        if rows.full() && tx.blocking_send(rows.finish(&schema)).is_err() {
            return Ok(out); // the writer failed; its error is the lane's
        }
    }
    if rows.rows > 0 {
        let _ = tx.blocking_send(rows.finish(&schema));
    }
    drop(tx);
    out.facts = Some(facts.clone());
    if let Some(check) = check {
        for (pos, why) in check.finish(out.packets.saturating_sub(1)) {
            if !damaged.iter().any(|(p, _)| *p == pos) {
                damaged.push((pos, why));
            }
        }
        damaged.sort_by_key(|(pos, _)| *pos);
    }

    if broken.is_none() && facts.nb_frames > 0 && facts.nb_frames != out.packets {
        broken = Some(format!("the container lists {} frames but only {} could be read (truncated?)", facts.nb_frames, out.packets));
    }
    // Episodes (or their ends) in the part of the file that cannot be read; the frames before it
    // are sound, and their episodes are kept when bad episodes are skipped.
    let readable_until = broken.as_ref().map(|_| all_pts.iter().max().map_or(f64::NEG_INFINITY, |p| seconds(*p)) + tol);
    if let (Some(message), Some(until)) = (&broken, readable_until) {
        let mut cut: BTreeMap<i64, Query> = BTreeMap::new();
        for (qi, q) in queries.iter().enumerate() {
            if positions[qi].is_none() && q.t > until {
                cut.entry(q.episode)
                    .and_modify(|first| {
                        if q.frame < first.frame {
                            *first = *q
                        }
                    })
                    .or_insert(*q);
            }
        }
        let read = match all_pts.iter().max() {
            Some(p) => format!("the file breaks off after {} readable frames (the last at {:.3} s)", out.packets, seconds(*p)),
            None => "no frame of the file can be read".to_string(),
        };
        if cut.is_empty() {
            out.findings.push(
                Finding::warning(FindingKind::CorruptFile, format!("{message}; {read}; every step's frame lies before the break"))
                    .with_file(&job.file.path)
                    .with_camera(&job.camera),
            );
        }
        for (episode, q) in cut {
            out.findings.push(
                Finding::error(
                    FindingKind::CorruptFile,
                    format!("{message}; {read}; this episode's frames from {} on are missing", q.frame),
                )
                .with_file(&job.file.path)
                .with_episode(episode)
                .with_camera(&job.camera)
                .with_frame(q.frame),
            );
        }
    }
    if flag_mismatches > 0 {
        out.findings.push(
            Finding::warning(
                FindingKind::KeyframeFlags,
                format!(
                    "{flag_mismatches} packets where the container's keyframe flag disagrees with the bitstream; the bitstream is used"
                ),
            )
            .with_file(&job.file.path)
            .with_camera(&job.camera),
        );
    }
    report_unresolved(job, &queries, &positions, &all_pts, seconds, tol, readable_until, &mut out.findings);
    // Where one episode's part of a file ends and the next begins is sure only to half a frame:
    // a tolerance wider than that (LeRobot allows any) moves the border no further.
    let border = if ctx.fps > 0.0 { tol.min(0.5 / ctx.fps) } else { tol };
    report_foreign_frames(job, &queries, &mut positions, &all_pts, seconds, border, &mut out.findings);
    // A step whose frame cannot be decoded from any keyframe is as bad as a missing frame.
    for (qi, q) in queries.iter().enumerate() {
        if let Some(pos) = positions[qi]
            && undecodable.contains_key(&pos)
        {
            out.findings.push(
                Finding::error(
                    FindingKind::FrameUnresolved,
                    format!("the frame (packet {pos}) precedes every keyframe of the file and cannot be decoded"),
                )
                .with_file(&job.file.path)
                .with_episode(q.episode)
                .with_camera(&job.camera)
                .with_frame(q.frame),
            );
            positions[qi] = None;
        }
    }
    report_damaged(job, &queries, &damaged, &keyframes, &mut positions, &mut out.findings);
    let used: std::collections::HashSet<u64> = positions.iter().flatten().copied().collect();
    // The parts are sorted by start and do not overlap: the one a time may fall in is the last
    // that starts at or before it.
    let left_out = |pts: i64| {
        let t = seconds(pts);
        let after = job.left_out.partition_point(|(from, _)| from - border <= t);
        after > 0 && t < job.left_out[after - 1].1 - border
    };
    let unused = (0..out.packets).filter(|p| !used.contains(p) && !all_pts.get(*p as usize).is_some_and(|pts| left_out(*pts))).count();
    if unused > 0 {
        out.findings.push(
            Finding::warning(FindingKind::FrameCountMismatch, format!("{unused} of the file's {} frames belong to no step", out.packets))
                .with_file(&job.file.path)
                .with_camera(&job.camera),
        );
    }
    for &JobEpisode { index: episode, from_timestamp: from, to_timestamp: to, length, .. } in &job.episodes {
        if let Some(to) = to {
            let expected = from + length as f64 / ctx.fps;
            if (to - expected).abs() > tol.max(1e-3) {
                out.findings.push(
                    Finding::warning(
                        FindingKind::BadMetadata,
                        format!("to_timestamp is {to:.6} s, but from_timestamp + length / fps is {expected:.6} s"),
                    )
                    .with_file(&job.file.path)
                    .with_episode(episode)
                    .with_camera(&job.camera),
                );
            }
        }
    }
    out.extents = store_positions(&ctx.scratch, job, &queries, &positions)?;
    Ok(out)
}

/// One error per episode whose frames decode through a damaged packet: every frame from the
/// keyframe before it (in decode order) to the next keyframe, naming the first such frame;
/// those steps' frames are left unresolved.
fn report_damaged(
    job: &StreamJob,
    queries: &[Query],
    damaged: &[(u64, String)],
    keyframes: &[(u64, i64)],
    positions: &mut [Option<u64>],
    findings: &mut Vec<Finding>,
) {
    if damaged.is_empty() {
        return;
    }
    // Decode-order ranges of packets that cannot be decoded, each with the damage that spoils it.
    let spoiled: Vec<(std::ops::Range<u64>, &(u64, String))> = damaged
        .iter()
        .map(|d| {
            let start = keyframes.iter().rev().find(|(k, _)| *k <= d.0).map_or(0, |(k, _)| *k);
            let end = keyframes.iter().find(|(k, _)| *k > d.0).map_or(u64::MAX, |(k, _)| *k);
            (start..end, d)
        })
        .collect();
    let mut first: BTreeMap<i64, (Query, &(u64, String), usize)> = BTreeMap::new();
    for (qi, q) in queries.iter().enumerate() {
        let Some(pos) = positions[qi] else { continue };
        if let Some((_, d)) = spoiled.iter().find(|(range, _)| range.contains(&pos)) {
            positions[qi] = None;
            let entry = first.entry(q.episode).or_insert((*q, d, 0));
            if q.frame < entry.0.frame {
                (entry.0, entry.1) = (*q, d);
            }
            entry.2 += 1;
        }
    }
    for (episode, (q, (pos, why), count)) in first {
        findings.push(
            Finding::error(
                FindingKind::CorruptFile,
                format!("packet {pos} is damaged ({why}); {count} of this episode's frames decode through it, the first this one"),
            )
            .with_file(&job.file.path)
            .with_episode(episode)
            .with_camera(&job.camera)
            .with_frame(q.frame),
        );
    }
}

/// One error per episode for the steps whose query time matches no frame, naming the first
/// such frame and the nearest frame the file has (steps after `readable_until`, in a part of
/// the file that cannot be read, are reported as such already).
#[allow(clippy::too_many_arguments)] // what one file's demux learned, passed as it is
fn report_unresolved(
    job: &StreamJob,
    queries: &[Query],
    positions: &[Option<u64>],
    all_pts: &[i64],
    seconds: impl Fn(i64) -> f64,
    tol: f64,
    readable_until: Option<f64>,
    findings: &mut Vec<Finding>,
) {
    let mut sorted = all_pts.to_vec();
    sorted.sort_unstable();
    let mut per_episode: BTreeMap<i64, (Query, u64)> = BTreeMap::new();
    for (q, p) in queries.iter().zip(positions) {
        if p.is_none() && readable_until.is_none_or(|until| q.t <= until) {
            let entry = per_episode.entry(q.episode).or_insert((*q, 0));
            if q.frame < entry.0.frame {
                entry.0 = *q;
            }
            entry.1 += 1;
        }
    }
    for (episode, (q, count)) in per_episode {
        let nearest = {
            let i = sorted.partition_point(|p| seconds(*p) < q.t);
            [i.checked_sub(1), Some(i)]
                .into_iter()
                .flatten()
                .filter_map(|i| sorted.get(i))
                .map(|p| seconds(*p))
                .min_by(|a, b| (a - q.t).abs().total_cmp(&(b - q.t).abs()))
        };
        let near = match nearest {
            Some(n) => format!("the nearest frame is at {n:.6} s ({} away)", milliseconds((n - q.t).abs())),
            None => "the file has no frames".into(),
        };
        let last = sorted
            .last()
            .map(|p| format!("; the file's last frame is at {:.6} s ({} frames)", seconds(*p), sorted.len()))
            .unwrap_or_default();
        findings.push(
            Finding::error(
                FindingKind::FrameUnresolved,
                format!(
                    "{count} steps have no video frame within {} of their time; first: query {:.6} s (from_timestamp {:.6} + timestamp {:.6}), {near}{last}",
                    milliseconds(tol),
                    q.t,
                    q.from_timestamp,
                    q.t - q.from_timestamp,
                ),
            )
            .with_file(&job.file.path)
            .with_episode(episode)
            .with_camera(&job.camera)
            .with_frame(q.frame),
        );
    }
}

/// One error per episode for the steps whose frame lies in another episode's part of the file
/// (before its own `from_timestamp`, or from the next episode's on): a timestamp or
/// `from_timestamp` that points past the episode. Their frames are unresolved afterwards. A part
/// begins `tol` before its `from_timestamp`.
fn report_foreign_frames(
    job: &StreamJob,
    queries: &[Query],
    positions: &mut [Option<u64>],
    all_pts: &[i64],
    seconds: impl Fn(i64) -> f64,
    tol: f64,
    findings: &mut Vec<Finding>,
) {
    let mut starts: Vec<(f64, i64)> = job.episodes.iter().map(|e| (e.from_timestamp, e.index)).collect();
    starts.sort_by(|a, b| a.0.total_cmp(&b.0));
    let owner = |t: f64| starts.iter().rev().find(|(from, _)| *from <= t + tol).map(|(_, e)| *e);
    // An episode's part ends where the next part begins, of an episode ingested or not (one
    // skipped, say): a step whose frame lies in a part left out shows another episode's frame.
    let mut borders: Vec<f64> = starts.iter().map(|(from, _)| *from).chain(job.left_out.iter().map(|(from, _)| *from)).collect();
    borders.sort_by(f64::total_cmp);
    let in_left_out = |t: f64| {
        let after = job.left_out.partition_point(|(from, _)| *from <= t + tol);
        after > 0 && t < job.left_out[after - 1].1 - tol
    };
    let mut per_episode: BTreeMap<i64, (Query, f64, u64)> = BTreeMap::new();
    for (q, p) in queries.iter().zip(positions.iter_mut()) {
        let Some(pos) = *p else { continue };
        let Some(t) = all_pts.get(pos as usize).map(|pts| seconds(*pts)) else { continue };
        let from = q.from_timestamp;
        let next = borders.get(borders.partition_point(|f| *f <= from + tol)).copied();
        if t >= from - tol && next.is_none_or(|next| t < next - tol) {
            continue;
        }
        *p = None;
        let entry = per_episode.entry(q.episode).or_insert((*q, t, 0));
        if q.frame < entry.0.frame {
            (entry.0, entry.1) = (*q, t);
        }
        entry.2 += 1;
    }
    for (episode, (q, t, count)) in per_episode {
        let whose = match owner(t) {
            _ if in_left_out(t) => "the part of the file of an episode not ingested".to_string(),
            Some(other) if other != episode => format!("episode {other}'s part of the file"),
            _ => "no episode's part of the file".to_string(),
        };
        findings.push(
            Finding::error(
                FindingKind::FrameUnresolved,
                format!(
                    "{count} steps show a frame outside the episode: first, timestamp {:.6} (from_timestamp {:.6}) picks the frame at {t:.6} s, in {whose}",
                    q.t - q.from_timestamp,
                    q.from_timestamp,
                ),
            )
            .with_file(&job.file.path)
            .with_episode(episode)
            .with_camera(&job.camera)
            .with_frame(q.frame),
        );
    }
}

fn check_declared(job: &StreamJob, facts: &StreamFacts, fps: f64, findings: &mut Vec<Finding>) {
    let warn = |kind, message: String| Finding::warning(kind, message).with_file(&job.file.path).with_camera(&job.camera);
    if let Some(codec) = &job.declared.codec
        && !same_codec(codec, &facts.params.codec)
    {
        findings.push(warn(
            FindingKind::CodecMismatch,
            format!("info.json declares codec `{codec}`, the file holds `{}` (the file's codec is used)", facts.params.codec),
        ));
    }
    if let (Some(w), Some(h)) = (job.declared.width, job.declared.height)
        && (w != facts.params.width || h != facts.params.height)
    {
        findings.push(warn(
            FindingKind::FormatMismatch,
            format!("info.json declares {w}x{h}, the file is {}x{}", facts.params.width, facts.params.height),
        ));
    }
    if let Some((h, w)) = job.declared.shape
        && (w != facts.params.width || h != facts.params.height)
        && (job.declared.width, job.declared.height) != (Some(w), Some(h))
    {
        findings.push(warn(
            FindingKind::FormatMismatch,
            format!("info.json declares shape {h}x{w} (height x width), the file is {}x{}", facts.params.height, facts.params.width),
        ));
    }
    if let Some(rate) = facts.avg_frame_rate
        && fps > 0.0
        && (rate - fps).abs() > 0.01 * fps
    {
        findings.push(warn(
            FindingKind::FormatMismatch,
            format!("info.json declares {fps} fps, the file's frames come at {rate:.2} per second"),
        ));
    }
    if let (Some(d), Some(a)) = (&job.declared.pix_fmt, &facts.params.pix_fmt)
        && d != a
    {
        findings.push(warn(FindingKind::FormatMismatch, format!("info.json declares pixel format `{d}`, the file has `{a}`")));
    }
}

/// Errors for the camera files whose frames differ in size from the camera's (what `info.json`
/// declares where some file has it, else the size of most of its frames): samples of one camera stack frames of one
/// size, so the loader could serve none of the camera's samples. One finding per episode that
/// shows frames of such a file, naming the file, both sizes and where the camera's size comes
/// from; `--skip-bad-episodes` leaves those episodes out.
pub fn frame_size_findings(outcomes: &[StreamOutcome]) -> Vec<Finding> {
    let mut cameras: Vec<&str> = outcomes.iter().map(|o| o.job.camera.as_str()).collect();
    cameras.dedup();
    let mut findings = Vec::new();
    for camera in cameras {
        let files: Vec<(&StreamOutcome, (u32, u32))> = outcomes
            .iter()
            .filter(|o| o.job.camera == camera)
            .filter_map(|o| o.facts.as_ref().map(|f| (o, (f.params.width, f.params.height))))
            .collect();
        let declared = files.iter().find_map(|(o, _)| match (o.job.declared.width, o.job.declared.height, o.job.declared.shape) {
            (Some(w), Some(h), _) => Some((w, h)),
            (_, _, Some((h, w))) => Some((w, h)),
            _ => None,
        });
        // (A declared size no file has is a wrong declaration, warned of by `check_declared`:
        // the files' own size stands.)
        let (size, whence) = match declared.filter(|d| files.iter().any(|(_, size)| size == d)) {
            Some(size) => (size, "as info.json declares"),
            None => {
                let mut frames: BTreeMap<(u32, u32), u64> = BTreeMap::new();
                for (o, size) in &files {
                    *frames.entry(*size).or_default() += o.packets.max(1);
                }
                match frames.into_iter().max_by_key(|(size, n)| (*n, std::cmp::Reverse(*size))) {
                    Some((size, _)) => (size, "as most of its frames are"),
                    None => continue,
                }
            }
        };
        for (o, (w, h)) in files.iter().filter(|(_, other)| *other != size) {
            for episode in &o.job.episodes {
                findings.push(
                    Finding::error(
                        FindingKind::FormatMismatch,
                        format!(
                            "frames are {w}x{h} where the camera's are {}x{} ({whence}); a camera's samples stack frames of one size",
                            size.0, size.1
                        ),
                    )
                    .with_file(&o.job.file.path)
                    .with_episode(episode.index)
                    .with_camera(camera),
                );
            }
        }
    }
    findings
}

/// Seconds as milliseconds, to three decimals, or in scientific notation below a microsecond
/// (a tolerance of 1e-9 s is not "0.000 ms").
fn milliseconds(seconds: f64) -> String {
    let ms = seconds * 1e3;
    if ms == 0.0 || ms.abs() >= 1e-3 { format!("{ms:.3} ms") } else { format!("{ms:.2e} ms") }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(stream: u32, size: u64) -> StreamJob {
        StreamJob {
            stream,
            camera: "observation.images.front".into(),
            camera_slot: 0,
            file: SourceFile { path: format!("videos/file-{stream:03}.mp4"), size, modified: chrono::DateTime::UNIX_EPOCH },
            declared: Declared::default(),
            episodes: Vec::new(),
            left_out: Vec::new(),
        }
    }

    fn streams(lanes: &[Vec<StreamJob>]) -> Vec<Vec<u32>> {
        lanes.iter().map(|lane| lane.iter().map(|j| j.stream).collect()).collect()
    }

    #[test]
    fn lanes_are_runs_of_consecutive_files_with_about_the_same_bytes() {
        // Even sizes split evenly; the table's rows stay in stream order lane after lane.
        let even: Vec<StreamJob> = (0..8).map(|s| job(s, 100)).collect();
        assert_eq!(streams(&split_lanes(even, 2)), vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]]);
        // One large file takes a lane's share on its own.
        let uneven = vec![job(0, 900), job(1, 100), job(2, 100), job(3, 100), job(4, 100)];
        assert_eq!(streams(&split_lanes(uneven, 2)), vec![vec![0], vec![1, 2, 3, 4]]);
        // Fewer files than lanes, empty files, no lanes asked for, no files.
        assert_eq!(streams(&split_lanes(vec![job(0, 5), job(1, 5)], 4)), vec![vec![0], vec![1]]);
        assert_eq!(streams(&split_lanes(vec![job(0, 0), job(1, 0), job(2, 0), job(3, 0)], 2)), vec![vec![0, 1], vec![2, 3]]);
        assert_eq!(streams(&split_lanes(vec![job(0, 7), job(1, 7)], 0)), vec![vec![0, 1]]);
        assert!(split_lanes(Vec::new(), 2).is_empty());
    }
}
