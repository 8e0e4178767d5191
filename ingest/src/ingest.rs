//! The ingest pipeline: validate a LeRobot dataset, demux its videos, write a new version of
//! the dataset into the lake, and commit it atomically.
//!
//! ```text
//! metadata ─▶ inventory ─▶ fingerprint / content hash (no-op when unchanged)
//!          ─▶ pass 1 over data parquet (validate rows, keep timestamps)   ── refuse here when strict
//!          ─▶ begin version ─▶ demux every camera file in parallel (packets, frame resolution)
//!          ─▶ pass 2 over data parquet (steps, image packets) ─▶ small tables ─▶ commit record
//! ```

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Instant,
};

use arrow::array::AsArray;
use arrow::{
    array::{
        ArrayRef, BinaryBuilder, BooleanBuilder, Float64Builder, Int32Builder, Int64Builder, ListBuilder, RecordBatch, StringBuilder,
        StructBuilder, UInt32Builder, UInt64Builder,
    },
    compute::filter_record_batch,
    datatypes::{DataType, Int64Type},
};
use futures::{StreamExt, TryStreamExt, stream};
use lake_schemas::{
    CodecParams, CommitRecord, FeatureKind, Finding, FindingKind, LAKE_FORMAT_VERSION, Severity, SourceRecord, TableCounts, TableSet,
    tables::{self, EPISODES, FEATURE_STATS, FINDINGS, PACKETS, STATS, STEPS, STREAMS, TASKS},
};
use lake_store::{Committed, Lake, PendingVersion, UncommittedPart, default_name, validate_name, validate_new_name};
use parquet::arrow::ParquetRecordBatchStreamBuilder;

use crate::{
    Error, Report, Result,
    columns::cast_to_schema,
    data::{self, EpisodeRows},
    episode_stats::StatsRows,
    meta::{DatasetMeta, EpisodeMeta},
    report::CameraSummary,
    scratch::Scratch,
    source::{Source, SourceFile},
    steps::StepsLayout,
    streams::{self, Declared, JobEpisode, StreamContext, StreamJob, StreamOutcome},
};

/// How to ingest.
#[derive(Debug, Clone)]
pub struct IngestOptions {
    /// Dataset name in the lake (default: the source directory's name).
    pub name: Option<String>,
    /// LeRobot's `tolerance_s`: how far a frame's time may be from a step's query time.
    pub tolerance_s: f64,
    /// Leave out bad episodes (recording why) instead of refusing the dataset.
    pub skip_bad_episodes: bool,
    /// Leave out cameras that have no video file at all.
    pub drop_missing_cameras: bool,
    /// Keep the rows of an episode whose video file of a camera is missing, without that
    /// camera's frames (a sample that shows one is refused, naming it), instead of counting the
    /// missing file as the episode's error.
    pub keep_rows_without_video: bool,
    /// Camera files demuxed at once.
    pub threads: usize,
    /// Decode every video frame once while demuxing, and report the frames that do not decode
    /// whole (by episode and frame) as errors of their episodes; and check every file of the
    /// latest version's tables against its digest before calling an unchanged source up to date.
    pub verify: bool,
}

impl Default for IngestOptions {
    fn default() -> Self {
        Self {
            name: None,
            tolerance_s: lake_schemas::DEFAULT_TOLERANCE_S,
            skip_bad_episodes: false,
            drop_missing_cameras: false,
            keep_rows_without_video: false,
            threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
            verify: false,
        }
    }
}

/// Live progress of an ingest, shared with whoever displays it. Setting [`Progress::cancel`]
/// stops the ingest, which then removes what it wrote.
#[derive(Debug, Default)]
pub struct Progress {
    phase: Mutex<String>,
    bytes_read: Mutex<Option<Arc<AtomicU64>>>,
    /// Bytes the current work will read in total (0 when unknown).
    pub bytes_total: AtomicU64,
    /// Camera frames (packets) demuxed so far.
    pub frames_done: Arc<AtomicU64>,
    /// Camera frames the ingested steps show (packets may be a few more).
    pub frames_total: AtomicU64,
    /// Steps of the episodes being ingested.
    pub steps_total: AtomicU64,
    /// Episodes being ingested.
    pub episodes_total: AtomicU64,
    /// Set to cancel.
    pub cancel: Arc<AtomicBool>,
}

impl Progress {
    /// The current phase, in words.
    pub fn phase(&self) -> String {
        self.phase.lock().expect("progress phase").clone()
    }

    /// Bytes read from the source so far.
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read.lock().expect("progress counter").as_ref().map_or(0, |c| c.load(Ordering::Relaxed))
    }

    fn set_phase(&self, phase: &str) {
        tracing::info!(phase, bytes_read = self.bytes_read(), "ingest phase");
        *self.phase.lock().expect("progress phase") = phase.to_string();
    }

    fn check(&self) -> Result<()> {
        if self.cancel.load(Ordering::Relaxed) { Err(Error::Cancelled) } else { Ok(()) }
    }
}

/// What an ingest did.
#[derive(Debug)]
pub enum Outcome {
    /// A new version was committed.
    Committed {
        /// Its commit record.
        record: Box<CommitRecord>,
        /// Validation findings and summary.
        report: Box<Report>,
    },
    /// The source is the one the latest version was made from, with the same options.
    Unchanged {
        /// The latest version.
        record: Box<CommitRecord>,
        /// How that was established.
        reason: String,
    },
}

/// Ingests the LeRobot dataset at `location` into `lake`.
///
/// # Errors
/// [`Error::Refused`] with the full report when the dataset has errors (strict mode) or no
/// episode is left; [`Error::Cancelled`]; metadata, I/O and lake errors. In every error case
/// the lake is as it was before.
pub async fn ingest(lake: &Lake, location: &str, options: &IngestOptions, progress: &Progress) -> Result<Outcome> {
    let started = Instant::now();
    // Sources are read and recorded by text paths (object_store's): a directory whose name is
    // not UTF-8 (reached as `.` from inside it) could be neither.
    if let Some(path) = lake_store::local_path(location)
        && let Ok(absolute) = std::path::absolute(&path)
        && absolute.to_str().is_none()
    {
        return Err(Error::Unsupported(format!(
            "the source's path {} is not UTF-8 text; lake reads and records sources by text paths: rename the directory",
            absolute.to_string_lossy()
        )));
    }
    let source = Source::open(location)?;
    *progress.bytes_read.lock().expect("progress counter") = Some(source.counter());
    let name = options.name.clone().unwrap_or_else(|| default_name(location));
    // A name taken before it was reserved goes on taking versions.
    let taken = validate_name(&name).is_ok() && lake.version_count(&name).await? > 0;
    let check = if taken { validate_name } else { validate_new_name };
    check(&name).map_err(|e| match (e, &options.name) {
        (lake_store::Error::BadName { name, message }, None) => lake_store::Error::BadName {
            name,
            message: format!("{message} (the name comes from the source's directory; give one with --name)"),
        },
        (e, _) => e,
    })?;
    progress.set_phase("reading metadata");
    lake.collect_garbage().await?;
    let scratch = Scratch::new()?;
    let meta = DatasetMeta::load(&source, &scratch).await?;
    let mut plan = Plan::new(&name, &source, &meta, options, scratch).await?;
    let record_options = lake_schemas::IngestOptions {
        tolerance_s: options.tolerance_s,
        skip_bad_episodes: options.skip_bad_episodes,
        drop_missing_cameras: options.drop_missing_cameras,
        keep_rows_without_video: options.keep_rows_without_video,
    };

    let fingerprint = fingerprint(&plan.read_files);
    // A latest version whose record or tables were damaged is not one to keep: the source is
    // ingested again, as the next version. With `verify`, every file of its tables is read and
    // checked against its digest; otherwise only the sizes of its data files.
    let latest = lake.latest_readable(&name).await?;
    let intact = match &latest {
        Some(l) if options.verify => !lake.verify_tables(l, options.threads).await?.is_damaged(),
        Some(l) => lake.damaged_tables(l).await?.is_empty(),
        None => true,
    };
    if let Some(l) = &latest
        && intact
        && l.options == record_options
        && l.source.fingerprint == fingerprint
    {
        return Ok(Outcome::Unchanged {
            record: Box::new(l.clone()),
            reason: "same files, sizes and modification times as the latest version".into(),
        });
    }
    progress.set_phase("hashing source");
    progress.bytes_total.store(plan.read_files.iter().map(|f| f.size).sum(), Ordering::Relaxed);
    let content_hash = content_hash(&source, &plan.read_files, options.threads, progress).await?;
    if let Some(l) = &latest
        && intact
        && l.options == record_options
        && l.source.content_hash == content_hash
    {
        return Ok(Outcome::Unchanged {
            record: Box::new(l.clone()),
            reason: "same content as the latest version (only modification times differ)".into(),
        });
    }

    progress.set_phase("checking data");
    plan.scan_data(&source, &meta, options, progress).await?;
    plan.decide(options)?;

    let pending = lake.begin(&name).await?;
    let built = build(&pending, &source, &meta, &mut plan, options, progress).await;
    let (counts, tables_written) = match built {
        Ok(v) => v,
        Err(e) => {
            pending.abort().await?;
            return Err(e);
        }
    };
    // A source changed while it was read would leave a version whose tables and content hash
    // describe different files: nothing is committed, and the next run reads it whole.
    if let Some(changed) = changed_file(&source, &plan.read_files).await? {
        pending.abort().await?;
        return Err(Error::Metadata {
            path: changed,
            message: "changed while the ingest read the source (its size or modification time differs); run the ingest again".into(),
        });
    }
    // Cancelled (Ctrl-C, SIGTERM) at any time before the commit record: nothing is committed.
    if let Err(e) = progress.check() {
        pending.abort().await?;
        return Err(e);
    }
    // What `lake verify` checks the tables against later: every file as written.
    progress.set_phase("recording digests");
    let files = match pending.lake().table_files(pending.dir(), &tables_written, options.threads).await {
        Ok(files) => files,
        Err(e) => {
            pending.abort().await?;
            return Err(e.into());
        }
    };
    progress.set_phase("committing");
    plan.report.seconds = started.elapsed().as_secs_f64();
    plan.report.bytes_read = source.bytes_read();
    let source_record = SourceRecord {
        url: lake_store::absolute_location(location),
        codebase_version: meta.info.codebase_version.clone(),
        content_hash,
        fingerprint,
        files: plan.read_files.len() as u64,
        bytes: plan.read_files.iter().map(|f| f.size).sum(),
    };
    // Another ingest of the same source may commit while this one runs: then this one is the
    // no-op it would have been had it started later. The latest version seen at the start was
    // not the same, or was damaged and is to be replaced.
    let seen = latest.as_ref().map(|l| l.version);
    let is_same = |now: &CommitRecord| {
        Some(now.version) != seen && now.options == record_options && now.source.content_hash == source_record.content_hash
    };
    let record = CommitRecord {
        format_version: LAKE_FORMAT_VERSION,
        name: name.clone(),
        version: 0,
        committed_at: chrono::Utc::now(),
        ingest_seconds: plan.report.seconds,
        tables: TableSet { dir: pending.dir().to_string(), tables: tables_written, files },
        source: source_record.clone(),
        options: record_options.clone(),
        counts,
        fps: meta.fps,
        robot_type: meta.info.robot_type.clone(),
        info: meta.info_value.clone(),
        digest: None,
    };
    let record = match pending.commit_unless(record, is_same).await? {
        Committed::New(record) => record,
        Committed::Found(now) => {
            return Ok(Outcome::Unchanged {
                record: Box::new(now),
                reason: "another ingest committed the same content while this one ran".into(),
            });
        }
    };
    Ok(Outcome::Committed { record: Box::new(record), report: Box::new(plan.report) })
}

/// What ingest decided to read and keep, filled in phase by phase.
struct Plan {
    report: Report,
    /// Every source file read (for the fingerprint and content hash), sorted by path.
    read_files: Vec<SourceFile>,
    /// Parquet files of the data directory that no episode refers to.
    unreferenced: Vec<SourceFile>,
    /// Data files in the order of their first episode, with the episodes they hold.
    data_files: Vec<(String, Option<SourceFile>, Vec<i64>)>,
    /// Video files by path.
    video_files: HashMap<String, Option<SourceFile>>,
    /// (episode, video camera slot) whose file is missing and whose rows are kept without its
    /// frames (`keep_rows_without_video`).
    without_video: HashSet<(i64, usize)>,
    /// Video cameras kept, in feature order.
    video_cameras: Vec<String>,
    /// Image cameras, in feature order.
    image_cameras: Vec<String>,
    /// Rows of each episode (pass 1), their timestamps moved to the scratch files.
    rows: HashMap<i64, EpisodeRows>,
    /// The scratch slot of each episode's first step.
    first_slot: HashMap<i64, u64>,
    /// Per-step bookkeeping on disk: episode statistics (from the metadata), timestamps (from
    /// pass 1) and packet positions (from demuxing).
    scratch: Arc<Scratch>,
    /// Layout of the steps table.
    layout: Option<StepsLayout>,
    /// Episodes to ingest, in order.
    kept: Vec<i64>,
}

impl Plan {
    async fn new(name: &str, source: &Source, meta: &DatasetMeta, options: &IngestOptions, mut scratch: Scratch) -> Result<Self> {
        let mut report = Report {
            dataset: name.to_string(),
            source: source.display().to_string(),
            codebase_version: meta.info.codebase_version.clone(),
            episodes_total: meta.episodes.len() as u64,
            findings: meta.findings.clone(),
            ..Report::default()
        };
        let mut data_files: Vec<(String, Option<SourceFile>, Vec<i64>)> = Vec::new();
        let mut file_of: HashMap<&str, usize> = HashMap::new();
        for e in &meta.episodes {
            let at = *file_of.entry(&e.data_file).or_insert_with(|| {
                data_files.push((e.data_file.clone(), None, Vec::new()));
                data_files.len() - 1
            });
            data_files[at].2.push(e.index);
        }
        let video_paths: BTreeSet<String> = meta.episodes.iter().flat_map(|e| e.videos.iter().map(|v| v.file.clone())).collect();
        let heads: Vec<(String, Option<SourceFile>)> = stream::iter(data_files.iter().map(|d| d.0.clone()).chain(video_paths))
            .map(|p| async move { source.head(&p).await.map(|h| (p, h)) })
            .buffered(16)
            .try_collect()
            .await?;
        let heads: HashMap<String, Option<SourceFile>> = heads.into_iter().collect();
        for d in &mut data_files {
            d.1 = heads[&d.0].clone();
        }

        let mut video_cameras = Vec::new();
        for cam in meta.video_cameras() {
            let any = meta.episodes.iter().filter_map(|e| e.videos.iter().find(|v| v.camera == cam.name)).any(|v| heads[&v.file].is_some());
            if !any && options.drop_missing_cameras && !meta.episodes.is_empty() {
                report.findings.push(
                    Finding::new(
                        Severity::Info,
                        FindingKind::CameraDropped,
                        "no video file of this camera exists; the camera is left out (--drop-missing-cameras)",
                    )
                    .with_camera(&cam.name),
                );
            } else {
                if !any && !meta.episodes.is_empty() {
                    report.hints.push(format!(
                        "camera `{}` has no video file at all; --drop-missing-cameras ingests the episodes without it",
                        cam.name
                    ));
                }
                // Asked to drop missing cameras, but this one has some of its files: say why the
                // flag leaves it in, and what does keep the episodes that have them.
                let shown: Vec<bool> = meta
                    .episodes
                    .iter()
                    .filter_map(|e| e.videos.iter().find(|v| v.camera == cam.name))
                    .map(|v| heads[&v.file].is_some())
                    .collect();
                let with = shown.iter().filter(|s| **s).count();
                if any && options.drop_missing_cameras && with < shown.len() {
                    report.hints.push(format!(
                        "--drop-missing-cameras leaves out only a camera with no video file at all; camera `{}` has its files for {with} of \
                         {} episodes, so it stays (--skip-bad-episodes ingests the episodes whose files are there; --missing-video \
                         keep-rows keeps every episode's rows)",
                        cam.name,
                        shown.len()
                    ));
                }
                video_cameras.push(cam.name.clone());
            }
        }
        let mut without_video = HashSet::new();
        for e in &meta.episodes {
            if heads[&e.data_file].is_none() {
                report
                    .findings
                    .push(Finding::error(FindingKind::MissingFile, "data file not found").with_file(&e.data_file).with_episode(e.index));
            }
            for v in e.videos.iter().filter(|v| video_cameras.contains(&v.camera)) {
                if heads[&v.file].is_some() {
                    continue;
                }
                let finding = if options.keep_rows_without_video {
                    let slot = video_cameras.iter().position(|c| c == &v.camera).expect("a kept camera");
                    without_video.insert((e.index, slot));
                    Finding::new(
                        Severity::Warning,
                        FindingKind::MissingFile,
                        "video file not found; the episode's rows are kept and its frames of this camera are refused by name \
                         (--missing-video keep-rows)",
                    )
                } else {
                    Finding::error(FindingKind::MissingFile, "video file not found")
                };
                report.findings.push(finding.with_file(&v.file).with_episode(e.index).with_camera(&v.camera));
            }
        }
        let lacking: BTreeSet<i64> = report
            .findings
            .iter()
            .filter(|f| f.is_error() && f.kind == FindingKind::MissingFile && f.camera.is_some())
            .filter_map(|f| f.episode)
            .collect();
        if !lacking.is_empty() {
            report.hints.push(format!(
                "{} of {} episodes lack a video file: --skip-bad-episodes ingests the others; --missing-video keep-rows keeps their \
                 rows (for SQL, statistics and state-only training) and refuses their frames by name",
                lacking.len(),
                meta.episodes.len()
            ));
        }
        let unreferenced = match source.can_list() {
            true => {
                report.findings.extend(undeclared_camera_files(source, meta).await?);
                unreferenced_data_files(source, meta, &data_files).await?
            }
            false => {
                report.findings.push(Finding::new(
                    Severity::Info,
                    FindingKind::NotChecked,
                    "the source is served over HTTP and cannot be listed: its files are those the metadata names, and files it does \
                     not name (stray data files, videos of undeclared cameras) were not looked for",
                ));
                Vec::new()
            }
        };
        let mut read_files: Vec<SourceFile> = meta.files.clone();
        read_files.extend(data_files.iter().filter_map(|d| d.1.clone()));
        read_files.extend(unreferenced.iter().cloned());
        let kept_videos: BTreeSet<&String> =
            meta.episodes.iter().flat_map(|e| e.videos.iter().filter(|v| video_cameras.contains(&v.camera)).map(|v| &v.file)).collect();
        read_files.extend(kept_videos.iter().filter_map(|p| heads[*p].clone()));
        read_files.sort_by(|a, b| a.path.cmp(&b.path));
        read_files.dedup_by(|a, b| a.path == b.path);
        scratch.add_cameras(video_cameras.len())?;
        Ok(Self {
            report,
            read_files,
            data_files,
            unreferenced,
            video_files: heads,
            without_video,
            video_cameras,
            image_cameras: meta.image_cameras().iter().map(|f| f.name.clone()).collect(),
            rows: HashMap::new(),
            first_slot: HashMap::new(),
            scratch: Arc::new(scratch),
            layout: None,
            kept: Vec::new(),
        })
    }

    /// Pass 1: every data file, checked row by row.
    async fn scan_data(&mut self, source: &Source, meta: &DatasetMeta, options: &IngestOptions, progress: &Progress) -> Result<()> {
        let by_index: HashMap<i64, &EpisodeMeta> = meta.episodes.iter().map(|e| (e.index, e)).collect();
        let mut jobs: Vec<(SourceFile, Vec<&EpisodeMeta>)> =
            self.data_files.iter().filter_map(|(_, f, eps)| f.clone().map(|f| (f, eps.iter().map(|e| by_index[e]).collect()))).collect();
        // LeRobot reads every parquet file under the data directory: one no episode refers to
        // (its episodes' metadata lost, say with a meta/episodes shard) is read too, and each
        // episode in it named.
        let planned: HashSet<String> = self.data_files.iter().map(|d| d.0.clone()).collect();
        jobs.extend(self.unreferenced.iter().map(|f| (f.clone(), Vec::new())));
        progress.bytes_total.store(jobs.iter().map(|j| j.0.size).sum(), Ordering::Relaxed);
        let scratch = self.scratch.clone();
        let mut scans = stream::iter(jobs)
            .map(|(file, eps)| async move {
                progress.check()?;
                let scan = data::scan_file(source, meta, &file, &eps, options.tolerance_s).await?;
                Ok::<_, Error>((file.path, scan))
            })
            .buffered(options.threads.max(1));
        let cameras: Vec<String> = meta
            .features
            .iter()
            .filter(|f| self.video_cameras.contains(&f.name) || f.kind() == FeatureKind::Image)
            .map(|f| f.name.clone())
            .collect();
        // Each file's findings and rows are taken as its scan ends; the timestamps go to the
        // scratch files.
        let mut spans: Vec<(String, (i64, i64))> = Vec::new();
        let findings_before = self.report.findings.len();
        while let Some((path, scan)) = scans.try_next().await? {
            if let Some(span) = scan.index_span {
                spans.push((path.clone(), span));
            }
            self.take_scan(path, scan, &planned, &cameras, &scratch)?;
        }
        // LeRobot reads the data files in path order as one table and finds a sample by its
        // row: a file whose rows come before the previous file's breaks that (as rows out of
        // order within a file do, which `scan_file` reports).
        spans.sort_by(|a, b| a.0.cmp(&b.0));
        if let Some(pair) = spans.windows(2).find(|w| w[1].1.0 < w[0].1.1) {
            let ((before, (_, last)), (after, (first, _))) = (&pair[0], &pair[1]);
            self.report.findings.insert(
                findings_before,
                Finding::warning(
                    FindingKind::BadMetadata,
                    format!(
                        "rows are not in `index` order across files: its first row has index {first}, but {before}, before it in \
                         path order, ends at {last}; LeRobot reads the files in that order and finds a sample by its row, so its \
                         sample i is not the step whose index is i (lake's is)"
                    ),
                )
                .with_file(after),
            );
        }
        // One image format per camera across batches and files too: the one most rows have.
        for cam in &self.image_cameras {
            let mut formats: BTreeMap<&str, u64> = BTreeMap::new();
            for rows in self.rows.values() {
                for ((c, format), (_, n)) in &rows.format_rows {
                    if c == cam {
                        *formats.entry(format).or_default() += n;
                    }
                }
            }
            let Some((&usual, _)) = formats.iter().max_by_key(|(_, n)| **n) else { continue };
            for (path, _, episodes) in &self.data_files {
                for e in episodes {
                    // An episode already refused (by a batch's own check) is not named twice.
                    if self.report.findings.iter().any(|f| f.is_error() && f.episode == Some(*e)) {
                        continue;
                    }
                    let Some(rows) = self.rows.get(e) else { continue };
                    let other = rows.format_rows.iter().find(|((c, format), _)| c == cam && *format != usual);
                    let Some(((_, format), (frame, _))) = other else { continue };
                    self.report.findings.push(
                        Finding::error(
                            FindingKind::FormatMismatch,
                            format!(
                                "column `{cam}`: image is {} where the camera's others are {}; lake takes one image format per camera",
                                data::image_format_name(format),
                                data::image_format_name(usual)
                            ),
                        )
                        .with_file(path)
                        .with_episode(*e)
                        .with_frame(*frame),
                    );
                }
            }
        }
        Ok(())
    }

    /// Takes one data file's scan: its findings, its column plan, and its episodes' rows (their
    /// timestamps stored in the scratch files).
    fn take_scan(
        &mut self,
        path: String,
        scan: data::FileScan,
        planned: &HashSet<String>,
        cameras: &[String],
        scratch: &Scratch,
    ) -> Result<()> {
        if !planned.contains(&path) {
            // Its rows are of no episode the metadata places here, each named; a file
            // without such rows is named itself. Nothing of it is kept.
            if !scan.findings.iter().any(Finding::is_error) {
                self.report.findings.push(
                    Finding::error(
                        FindingKind::BadMetadata,
                        "no episode of the metadata refers to this data file (LeRobot reads every data file: in v3.0 \
                         data/*/*.parquet, in v2.x every parquet file under data/)",
                    )
                    .with_file(&path),
                );
            }
            self.report.findings.extend(scan.findings);
            return Ok(());
        }
        self.report.findings.extend(scan.findings);
        if let Some(plan) = scan.plan {
            match &self.layout {
                None => self.layout = Some(StepsLayout::new(&plan, cameras.to_vec(), self.image_cameras.clone())?),
                Some(layout) if let Some(difference) = layout.difference(&plan) => {
                    for e in &self.data_files.iter().find(|d| d.0 == path).expect("scanned file is planned").2 {
                        self.report.findings.push(
                            Finding::error(FindingKind::SchemaMismatch, format!("columns differ from the first data file's: {difference}"))
                                .with_file(&path)
                                .with_episode(*e),
                        );
                    }
                }
                Some(_) => {}
            }
        }
        let mut episodes: Vec<(i64, EpisodeRows)> = scan.episodes.into_iter().collect();
        episodes.sort_by_key(|(e, _)| *e);
        for (episode, mut rows) in episodes {
            self.first_slot.insert(episode, scratch.put_timestamps(&std::mem::take(&mut rows.timestamps))?);
            self.rows.insert(episode, rows);
        }
        Ok(())
    }

    /// Applies strict or skip mode to what is known so far.
    fn decide(&mut self, options: &IngestOptions) -> Result<()> {
        let errors: Vec<&Finding> = self.report.findings.iter().filter(|f| f.is_error()).collect();
        if errors.is_empty() {
            self.kept = self.episode_order().into_iter().filter(|e| self.rows.contains_key(e)).collect();
            if self.kept.is_empty() {
                return Err(self.refuse("the dataset has no episodes"));
            }
            return Ok(());
        }
        if !options.skip_bad_episodes || errors.iter().any(|f| f.episode.is_none()) {
            return Err(Error::Refused(Box::new(self.report.clone())));
        }
        let bad: BTreeMap<i64, String> = {
            let mut m = BTreeMap::new();
            for f in &errors {
                if let Some(e) = f.episode {
                    m.entry(e).or_insert_with(|| f.to_string());
                }
            }
            m
        };
        self.report.skipped.extend(bad);
        self.kept =
            self.episode_order().into_iter().filter(|e| !self.report.skipped.contains_key(e) && self.rows.contains_key(e)).collect();
        if self.kept.is_empty() {
            return Err(self.refuse("every episode has errors"));
        }
        Ok(())
    }

    fn episode_order(&self) -> Vec<i64> {
        self.data_files.iter().flat_map(|d| d.2.iter().copied()).collect()
    }

    fn refuse(&self, why: &str) -> Error {
        let mut report = self.report.clone();
        report.findings.push(Finding::error(FindingKind::BadMetadata, why));
        Error::Refused(Box::new(report))
    }

    /// Moves episodes with new errors to the skipped set, or refuses in strict mode.
    fn apply_new_errors(&mut self, options: &IngestOptions) -> Result<()> {
        let mut newly = BTreeMap::new();
        for f in self.report.findings.iter().filter(|f| f.is_error()) {
            match f.episode {
                Some(e) if self.kept.contains(&e) => {
                    newly.entry(e).or_insert_with(|| f.to_string());
                }
                Some(_) => {}
                None => return Err(Error::Refused(Box::new(self.report.clone()))),
            }
        }
        if newly.is_empty() {
            return Ok(());
        }
        if !options.skip_bad_episodes {
            return Err(Error::Refused(Box::new(self.report.clone())));
        }
        self.kept.retain(|e| !newly.contains_key(e));
        self.report.skipped.extend(newly);
        if self.kept.is_empty() {
            return Err(self.refuse("every episode has errors"));
        }
        Ok(())
    }
}

/// Writes every table of the version; returns the counts and table names.
async fn build(
    pending: &PendingVersion,
    source: &Source,
    meta: &DatasetMeta,
    plan: &mut Plan,
    options: &IngestOptions,
    progress: &Progress,
) -> Result<(TableCounts, Vec<String>)> {
    let by_index: HashMap<i64, &EpisodeMeta> = meta.episodes.iter().map(|e| (e.index, e)).collect();

    // Camera files → packet rows.
    progress.set_phase("demuxing video");
    let jobs = stream_jobs(meta, plan, &by_index);
    progress.bytes_total.store(jobs.iter().map(|j| j.file.size).sum(), Ordering::Relaxed);
    progress.episodes_total.store(plan.kept.len() as u64, Ordering::Relaxed);
    let steps_total: u64 = plan.kept.iter().map(|e| plan.rows[e].rows as u64).sum();
    progress.steps_total.store(steps_total, Ordering::Relaxed);
    progress.frames_total.store(steps_total * plan.video_cameras.len() as u64, Ordering::Relaxed);
    let ctx = StreamContext {
        source: source.clone(),
        packets_uri: pending.table_uri(PACKETS),
        tolerance_s: options.tolerance_s,
        fps: f64::from(meta.fps),
        cancel: progress.cancel.clone(),
        frames_done: progress.frames_done.clone(),
        scratch: plan.scratch.clone(),
        verify: options.verify,
    };
    let strict_failed = AtomicBool::new(false);
    let files = jobs.len();
    let finished = |o: &StreamOutcome| {
        if !options.skip_bad_episodes && o.findings.iter().any(Finding::is_error) {
            strict_failed.store(true, Ordering::Relaxed);
            progress.cancel.store(true, Ordering::Relaxed); // stop the other files early
        }
    };
    let lanes = streams::split_lanes(jobs, options.threads);
    let lanes = futures::future::join_all(lanes.into_iter().map(|jobs| streams::run_lane(ctx.clone(), jobs, &finished))).await;
    let mut outcomes = Vec::new();
    let mut parts = Vec::new();
    for lane in lanes {
        outcomes.extend(lane.outcomes);
        match lane.part {
            Ok(part) => parts.push(part),
            Err(Error::Cancelled) if strict_failed.load(Ordering::Relaxed) => {}
            Err(e) => return Err(e),
        }
    }
    let unchecked = files - outcomes.len();
    outcomes.sort_by_key(|o| o.job.stream);
    for o in &outcomes {
        plan.report.findings.extend(o.findings.iter().cloned());
    }
    let sizes = streams::frame_size_findings(&outcomes);
    if !sizes.is_empty() && !options.skip_bad_episodes {
        strict_failed.store(true, Ordering::Relaxed);
    }
    plan.report.findings.extend(sizes);
    if strict_failed.load(Ordering::Relaxed) {
        progress.cancel.store(false, Ordering::Relaxed);
        if unchecked > 0 {
            plan.report.hints.push(format!(
                "checking stopped at the first camera file with errors: {unchecked} of {files} camera files were not read to the end \
                 (--skip-bad-episodes checks every file)"
            ));
        }
        return Err(Error::Refused(Box::new(plan.report.clone())));
    }
    progress.check()?;
    plan.apply_new_errors(options)?;

    // Global rows: the lanes' parts in lane order hold the published streams' rows in stream
    // order.
    let mut bases: HashMap<u32, u64> = HashMap::new();
    let mut next_row = 0u64;
    for o in outcomes.iter().filter(|o| o.published) {
        bases.insert(o.job.stream, next_row);
        next_row += o.packets;
    }
    let mut video_parts: Vec<UncommittedPart> = Vec::new();
    for part in parts {
        if part.rows() == 0 {
            pending.discard(PACKETS, &part.data_files()).await?;
        } else {
            video_parts.push(part);
        }
    }
    let written: u64 = video_parts.iter().map(UncommittedPart::rows).sum();
    if written != next_row {
        return Err(Error::Internal(format!("the camera files' packet rows number {written}, but {next_row} packets were published")));
    }
    let layout = plan.layout.clone().ok_or_else(|| Error::Internal("no steps layout".into()))?;
    let kept: BTreeSet<i64> = plan.kept.iter().copied().collect();
    // Per (episode, layout camera) of the video cameras: where the stream's rows begin, and the
    // first and last rows the episode's steps show.
    let mut pointers: Pointers = HashMap::new();
    for o in &outcomes {
        let Some(base) = bases.get(&o.job.stream) else { continue };
        let cam = layout.cameras.iter().position(|c| *c == o.job.camera).expect("stream camera is in the layout");
        for &(episode, first, last) in o.extents.iter().filter(|(e, ..)| kept.contains(e)) {
            pointers.insert((episode, cam), (*base, base + first, base + last));
        }
    }

    // Steps and image packets.
    progress.set_phase("writing steps");
    let kept_steps: u64 = plan.kept.iter().map(|e| plan.rows[e].rows as u64).sum();
    let first_image_stream = outcomes.len() as u32;
    let image_streams: Vec<(u32, u64)> =
        (0..layout.image_cameras.len()).map(|i| (first_image_stream + i as u32, next_row + i as u64 * kept_steps)).collect();
    let (steps_part, image_parts, image_bytes) =
        write_steps(pending, source, plan, &layout, &pointers, &image_streams, meta, progress).await?;
    let steps = steps_part.rows();
    if steps != kept_steps {
        return Err(Error::Internal(format!("wrote {steps} steps, expected {kept_steps}")));
    }
    progress.check()?;
    lake_store::commit_parts(&pending.table_uri(STEPS), layout.schema.clone(), vec![steps_part]).await?;
    progress.check()?;
    let mut all_parts = video_parts;
    all_parts.extend(image_parts.iter().cloned());
    let packets = lake_store::commit_parts(&pending.table_uri(PACKETS), tables::packets_schema(), all_parts).await?;

    // Small tables.
    progress.check()?;
    progress.set_phase("writing metadata tables");
    write_stats(pending, meta, &kept, progress).await?;
    progress.set_phase("computing exact feature statistics");
    progress.check()?;
    write_streamed(pending.table_uri(FEATURE_STATS), tables::feature_stats_schema(), async |tx| {
        let (steps, over, limits) = (pending.table_uri(STEPS), crate::feature_stats::Over::Dataset, Default::default());
        crate::feature_stats::compute_into(&steps, &layout.schema, over, limits, |batch| {
            let (checked, tx) = (progress.check(), tx.clone());
            async move {
                checked?;
                tx.send(Ok(batch)).await.map_err(|_| Error::Internal("the feature statistics writer stopped".into()))
            }
        })
        .await
    })
    .await?;
    for (e, reason) in &plan.report.skipped {
        plan.report.findings.push(
            Finding::new(Severity::Info, FindingKind::EpisodeSkipped, format!("left out by --skip-bad-episodes: {reason}"))
                .with_episode(*e),
        );
    }
    // Each table is built when it is written.
    for table in [STREAMS, EPISODES, TASKS, FINDINGS] {
        progress.check()?;
        let batch = match table {
            STREAMS => streams_table(plan, &outcomes, &bases, &image_streams, &image_bytes, kept_steps, meta)?,
            EPISODES => episodes_table(plan, &by_index, &outcomes, &pointers, &layout, &image_streams)?,
            TASKS => tasks_table(meta)?,
            _ => findings_table(&plan.report.findings)?,
        };
        lake_store::write_table(&pending.table_uri(table), batch.schema(), vec![batch]).await?;
    }

    summarise(plan, &outcomes, &image_bytes, kept_steps, packets, meta);
    let mut findings = BTreeMap::new();
    for f in &plan.report.findings {
        *findings.entry(f.severity.as_str().to_string()).or_insert(0) += 1;
    }
    let counts = TableCounts {
        episodes: plan.kept.len() as u64,
        steps,
        packets,
        streams: (outcomes.iter().filter(|o| o.published).count() + image_streams.len()) as u64,
        cameras: layout.cameras.len() as u64,
        tasks: meta.tasks.len() as u64,
        skipped_episodes: plan.report.skipped.len() as u64,
        findings,
    };
    Ok((counts, tables::ALL.iter().map(|t| t.to_string()).collect()))
}

/// The parquet files under the data directory of `data_path` that no episode's metadata names.
async fn unreferenced_data_files(
    source: &Source,
    meta: &DatasetMeta,
    data_files: &[(String, Option<SourceFile>, Vec<i64>)],
) -> Result<Vec<SourceFile>> {
    let template = &meta.info.data_path;
    let fixed = &template[..template.find('{').unwrap_or(template.len())];
    let Some(dir) = fixed.rfind('/').map(|slash| &fixed[..=slash]) else { return Ok(Vec::new()) };
    let referenced: HashSet<&str> = data_files.iter().map(|d| d.0.as_str()).collect();
    // LeRobot v3.0 reads `data/*/*.parquet` (one level of chunk directories); v2.x every parquet
    // file under the directory.
    let v3 = meta.info.codebase_version.starts_with("v3");
    let read_by_lerobot = |path: &str| !v3 || path.strip_prefix(dir).is_some_and(|rest| rest.matches('/').count() == 1);
    Ok(source
        .list(dir)
        .await?
        .into_iter()
        .filter(|f| f.path.ends_with(".parquet") && read_by_lerobot(&f.path) && !referenced.contains(f.path.as_str()))
        .collect())
}

/// A warning for each camera whose video files are in the dataset but which `info.json` does
/// not declare (removed from its features, say): its files are not ingested, and the warning
/// says so instead of leaving them out without a word.
async fn undeclared_camera_files(source: &Source, meta: &DatasetMeta) -> Result<Vec<Finding>> {
    let Some(template) = meta.info.video_path.as_deref() else { return Ok(Vec::new()) };
    let parts: Vec<&str> = template.split('/').collect();
    let Some(key_at) = parts.iter().position(|p| p.contains("{video_key}")) else { return Ok(Vec::new()) };
    // The directory the template's fixed beginning names: every camera's files are under it.
    let fixed = parts.iter().take_while(|p| !p.contains('{')).map(|p| format!("{p}/")).collect::<String>();
    if fixed.is_empty() {
        return Ok(Vec::new());
    }
    let declared: HashSet<&str> = meta.features.iter().filter(|f| f.kind() == FeatureKind::Video).map(|f| f.name.as_str()).collect();
    let mut undeclared: BTreeMap<String, (usize, String)> = BTreeMap::new();
    for file in source.list(&fixed).await? {
        let Some(camera) = file.path.split('/').nth(key_at) else { continue };
        if !file.path.ends_with(".mp4") || file.path.split('/').count() != parts.len() || declared.contains(camera) {
            continue;
        }
        let entry = undeclared.entry(camera.to_string()).or_insert((0, file.path.clone()));
        entry.0 += 1;
    }
    Ok(undeclared
        .into_iter()
        .map(|(camera, (files, first))| {
            Finding::warning(
                FindingKind::BadMetadata,
                format!(
                    "{files} video file(s) of camera `{camera}`, which info.json does not declare, are not ingested (first: {first}); \
                     declare the camera in info.json's features to ingest them"
                ),
            )
            .with_camera(&camera)
        })
        .collect())
}

/// One job per (camera, file) used by a kept episode, numbered in camera then first-use order.
fn stream_jobs(meta: &DatasetMeta, plan: &Plan, by_index: &HashMap<i64, &EpisodeMeta>) -> Vec<StreamJob> {
    let mut jobs: Vec<StreamJob> = Vec::new();
    for (camera_slot, cam) in plan.video_cameras.iter().enumerate() {
        let feature = meta.features.iter().find(|f| &f.name == cam).expect("camera is a feature");
        let hwc = feature.camera_hwc();
        let declared = Declared {
            codec: feature.info_str("video.codec").map(str::to_string),
            height: feature.info_f64("video.height").map(|v| v as u32).or(hwc.map(|h| h.0 as u32)),
            width: feature.info_f64("video.width").map(|v| v as u32).or(hwc.map(|h| h.1 as u32)),
            pix_fmt: feature.info_str("video.pix_fmt").map(str::to_string),
            shape: hwc.map(|(h, w, _)| (h as u32, w as u32)),
        };
        let mut job_of: HashMap<&str, usize> = HashMap::new();
        for e in plan.kept.iter().filter(|e| !plan.without_video.contains(&(**e, camera_slot))) {
            let em = by_index[e];
            let v = em.videos.iter().find(|v| &v.camera == cam).expect("every episode has every camera");
            let rows = &plan.rows[e];
            let at = *job_of.entry(&v.file).or_insert_with(|| {
                let file = plan.video_files[&v.file].clone().expect("kept episodes have their files");
                jobs.push(StreamJob {
                    stream: jobs.len() as u32,
                    camera: cam.clone(),
                    camera_slot,
                    file,
                    declared: declared.clone(),
                    episodes: Vec::new(),
                    left_out: Vec::new(),
                });
                jobs.len() - 1
            });
            jobs[at].episodes.push(JobEpisode {
                index: em.index,
                from_timestamp: v.from_timestamp,
                to_timestamp: v.to_timestamp,
                length: em.length,
                first_slot: plan.first_slot[e],
                steps: rows.rows,
            });
        }
    }
    // The parts of the files that episodes left out hold (skipped, or in files no kept episode
    // shares): their frames are not extra frames of the file.
    let kept: HashSet<i64> = plan.kept.iter().copied().collect();
    let mut left_out: HashMap<(&str, &str), Vec<(f64, f64)>> = HashMap::new();
    for em in meta.episodes.iter().filter(|e| !kept.contains(&e.index)) {
        for v in &em.videos {
            let to = v.to_timestamp.unwrap_or(v.from_timestamp + em.length as f64 / f64::from(meta.fps.max(1)));
            left_out.entry((&v.camera, &v.file)).or_default().push((v.from_timestamp, to));
        }
    }
    for j in &mut jobs {
        if let Some(mut parts) = left_out.remove(&(j.camera.as_str(), j.file.path.as_str())) {
            parts.sort_by(|a, b| a.0.total_cmp(&b.0));
            for (from, to) in parts {
                match j.left_out.last_mut() {
                    Some(last) if from <= last.1 => last.1 = last.1.max(to),
                    _ => j.left_out.push((from, to)),
                }
            }
        }
    }
    jobs
}

#[allow(clippy::too_many_arguments)] // the pass needs the whole plan; splitting it would only move the list
async fn write_steps(
    pending: &PendingVersion,
    source: &Source,
    plan: &Plan,
    layout: &StepsLayout,
    pointers: &Pointers,
    image_streams: &[(u32, u64)],
    meta: &DatasetMeta,
    progress: &Progress,
) -> Result<(UncommittedPart, Vec<UncommittedPart>, Vec<u64>)> {
    let tasks = |task_index: i64| meta.task(task_index);
    let (steps_tx, steps_rx) = tokio::sync::mpsc::channel::<Result<RecordBatch>>(2);
    let steps_writer =
        tokio::spawn(lake_store::write_uncommitted(pending.table_uri(STEPS), layout.schema.clone(), receiver_stream(steps_rx)));
    let mut image_txs = Vec::new();
    let mut image_writers = Vec::new();
    for _ in &layout.image_cameras {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<RecordBatch>>(2);
        image_txs.push(tx);
        image_writers.push(tokio::spawn(lake_store::write_uncommitted(
            pending.table_uri(PACKETS),
            tables::packets_schema(),
            receiver_stream(rx),
        )));
    }
    let kept: BTreeSet<i64> = plan.kept.iter().copied().collect();
    let mut ordinal = 0u64;
    let mut image_bytes = vec![0u64; layout.image_cameras.len()];
    let produced: Result<()> = async {
        for (_, file, episodes) in &plan.data_files {
            if !episodes.iter().any(|e| kept.contains(e)) {
                continue;
            }
            let file = file.as_ref().expect("files of kept episodes exist");
            let builder = ParquetRecordBatchStreamBuilder::new(source.parquet(file)).await.map_err(Error::parquet(&file.path))?;
            let mut batches = builder.with_batch_size(4096).build().map_err(Error::parquet(&file.path))?;
            while let Some(batch) = batches.try_next().await.map_err(Error::parquet(&file.path))? {
                progress.check()?;
                let ep = arrow::compute::cast(batch.column_by_name("episode_index").expect("checked in pass 1"), &DataType::Int64)
                    .map_err(Error::arrow(STEPS))?;
                let mask: arrow::array::BooleanArray = ep
                    .as_any()
                    .downcast_ref::<arrow::array::PrimitiveArray<Int64Type>>()
                    .expect("cast to int64")
                    .iter()
                    .map(|e| Some(e.is_some_and(|e| kept.contains(&e))))
                    .collect();
                let batch = filter_record_batch(&batch, &mask).map_err(Error::arrow(STEPS))?;
                if batch.num_rows() == 0 {
                    continue;
                }
                let packet_rows = batch_packet_rows(plan, layout, pointers, &batch)?;
                let (steps, images) = layout
                    .convert(&batch, &tasks, &packet_rows, image_streams, ordinal)
                    .map_err(|e| Error::metadata(file.path.clone(), e.to_string()))?;
                ordinal += steps.num_rows() as u64;
                if steps_tx.send(Ok(steps)).await.is_err() {
                    break;
                }
                for img in images {
                    image_bytes[img.camera] +=
                        img.batch.column_by_name("data").map_or(0, |data| data.as_binary::<i64>().values().len() as u64);
                    if image_txs[img.camera].send(Ok(img.batch)).await.is_err() {
                        break;
                    }
                }
            }
        }
        Ok(())
    }
    .await;
    if let Err(e) = produced {
        let _ = steps_tx.send(Err(e)).await;
    }
    drop(steps_tx);
    drop(image_txs);
    let steps_part = steps_writer.await.map_err(|e| Error::Internal(format!("steps writer: {e}")))??;
    let mut image_parts = Vec::new();
    for w in image_writers {
        image_parts.push(w.await.map_err(|e| Error::Internal(format!("image writer: {e}")))??);
    }
    Ok((steps_part, image_parts, image_bytes))
}

/// Per video camera of the batch's episode: where the camera's stream begins in the packets
/// table, and the first and last rows the episode's steps show; keyed by (episode, camera in
/// the steps layout).
type Pointers = HashMap<(i64, usize), (u64, u64, u64)>;

/// The packet row of each video camera's frame for every row of a data batch, read from the
/// scratch files: `[camera in the layout][row]` (empty for image cameras; `None` for the steps
/// of an episode kept without that camera's video).
fn batch_packet_rows(plan: &Plan, layout: &StepsLayout, pointers: &Pointers, batch: &RecordBatch) -> Result<Vec<Vec<Option<u64>>>> {
    let scratch = &plan.scratch;
    let (episode, frame) = (crate::steps::int_column(batch, "episode_index")?, crate::steps::int_column(batch, "frame_index")?);
    let mut out = vec![Vec::new(); layout.cameras.len()];
    for (ci, cam) in layout.cameras.iter().enumerate() {
        let Some(slot) = plan.video_cameras.iter().position(|c| c == cam) else { continue };
        let rows = &mut out[ci];
        rows.reserve(episode.len());
        // Rows come in runs of one episode, whose frames are read from the scratch at once.
        let mut start = 0;
        while start < episode.len() {
            let e = episode[start];
            let end = episode[start..].iter().position(|x| *x != e).map_or(episode.len(), |n| start + n);
            let frames = &frame[start..end];
            if plan.without_video.contains(&(e, slot)) {
                rows.extend(std::iter::repeat_n(None, frames.len()));
                start = end;
                continue;
            }
            let (lo, hi) = (*frames.iter().min().expect("a run has rows"), *frames.iter().max().expect("a run has rows"));
            let (Some(&(base, ..)), Some(steps), Some(first)) = (pointers.get(&(e, ci)), plan.rows.get(&e), plan.first_slot.get(&e)) else {
                return Err(Error::Internal(format!("episode {e}: no frames of camera {cam} were indexed")));
            };
            if lo < 0 || hi as usize >= steps.rows {
                return Err(Error::Internal(format!("episode {e}: frame_index {hi} changed between passes")));
            }
            let positions = scratch.positions(slot, first + lo as u64, (hi - lo + 1) as usize)?;
            rows.extend(frames.iter().map(|f| Some(positions[(f - lo) as usize].map_or(u64::MAX, |p| base + u64::from(p)))));
            start = end;
        }
    }
    Ok(out)
}

fn receiver_stream(
    rx: tokio::sync::mpsc::Receiver<Result<RecordBatch>>,
) -> impl futures::Stream<Item = Result<RecordBatch>> + Send + 'static {
    futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (item, rx)) })
}

/// Whether any episode that shows frames of `o`'s file was kept.
fn shows_kept(o: &StreamOutcome, plan: &Plan) -> bool {
    o.job.episodes.iter().any(|e| plan.kept.contains(&e.index))
}

fn streams_table(
    plan: &Plan,
    outcomes: &[StreamOutcome],
    bases: &HashMap<u32, u64>,
    image_streams: &[(u32, u64)],
    image_bytes: &[u64],
    kept_steps: u64,
    meta: &DatasetMeta,
) -> Result<RecordBatch> {
    let schema = tables::streams_schema();
    let mut b: Vec<Box<dyn arrow::array::ArrayBuilder>> =
        schema.fields().iter().map(|f| arrow::array::make_builder(f.data_type(), 16)).collect();
    let mut rows = Vec::new();
    for o in outcomes.iter().filter(|o| o.published) {
        let f = o.facts.as_ref().expect("published streams have facts");
        rows.push(StreamRow {
            stream: o.job.stream,
            camera: o.job.camera.clone(),
            // A file none of whose episodes was kept is listed, but never served.
            kind: if shows_kept(o, plan) { "video" } else { tables::SKIPPED_STREAM },
            file: Some(o.job.file.path.clone()),
            params: f.params.clone(),
            declared_codec: o.job.declared.codec.clone(),
            profile: f.profile.clone(),
            declared: (o.job.declared.width, o.job.declared.height),
            declared_pix_fmt: o.job.declared.pix_fmt.clone(),
            time_base: f.time_base,
            avg_frame_rate: f.avg_frame_rate,
            first_row: bases[&o.job.stream],
            packets: o.packets,
            keyframes: o.keyframes,
            max_gop: o.max_gop,
            reordered: o.reordered,
            bytes: o.bytes,
            duration_s: f.duration_s,
        });
    }
    for (((stream, first_row), cam), bytes) in image_streams.iter().zip(&plan.image_cameras).zip(image_bytes) {
        let feature = meta.features.iter().find(|f| &f.name == cam).expect("image camera is a feature");
        let first = plan.kept.iter().find_map(|e| plan.rows[e].image_formats.iter().find(|(c, ..)| c == cam).cloned());
        let (codec, w, h) = first.map_or(("png", 0, 0), |(_, fmt, w, h)| (fmt, w, h));
        let hwc = feature.camera_hwc();
        rows.push(StreamRow {
            stream: *stream,
            camera: cam.clone(),
            kind: "image",
            file: None,
            params: CodecParams { codec: codec.to_string(), width: w, height: h, ..CodecParams::default() },
            declared_codec: None,
            profile: None,
            declared: (hwc.map(|x| x.1 as u32), hwc.map(|x| x.0 as u32)),
            declared_pix_fmt: None,
            time_base: (1, meta.fps as i32),
            avg_frame_rate: Some(f64::from(meta.fps)),
            first_row: *first_row,
            packets: kept_steps,
            keyframes: kept_steps,
            max_gop: 1,
            reordered: false,
            bytes: *bytes,
            duration_s: None,
        });
    }
    for r in rows {
        r.append(&mut b);
    }
    let columns: Vec<ArrayRef> = b.iter_mut().map(|c| c.finish()).collect();
    RecordBatch::try_new(schema, columns).map_err(Error::arrow(STREAMS))
}

struct StreamRow {
    stream: u32,
    camera: String,
    kind: &'static str,
    file: Option<String>,
    params: CodecParams,
    declared_codec: Option<String>,
    profile: Option<String>,
    declared: (Option<u32>, Option<u32>),
    declared_pix_fmt: Option<String>,
    time_base: (i32, i32),
    avg_frame_rate: Option<f64>,
    first_row: u64,
    packets: u64,
    keyframes: u64,
    max_gop: u64,
    reordered: bool,
    bytes: u64,
    duration_s: Option<f64>,
}

impl StreamRow {
    /// Appends to builders made from [`tables::streams_schema`], in its column order.
    fn append(self, b: &mut [Box<dyn arrow::array::ArrayBuilder>]) {
        fn at<T: 'static>(b: &mut [Box<dyn arrow::array::ArrayBuilder>], i: usize) -> &mut T {
            b[i].as_any_mut().downcast_mut::<T>().expect("builder type follows the schema")
        }
        at::<UInt32Builder>(b, 0).append_value(self.stream);
        at::<StringBuilder>(b, 1).append_value(&self.camera);
        at::<StringBuilder>(b, 2).append_value(self.kind);
        at::<StringBuilder>(b, 3).append_option(self.file);
        let p = self.params;
        at::<StringBuilder>(b, 4).append_value(&p.codec);
        at::<StringBuilder>(b, 5).append_option(self.declared_codec);
        at::<StringBuilder>(b, 6).append_option(self.profile);
        at::<BinaryBuilder>(b, 7).append_option(p.extradata);
        at::<UInt32Builder>(b, 8).append_value(p.width);
        at::<UInt32Builder>(b, 9).append_value(p.height);
        at::<UInt32Builder>(b, 10).append_option(self.declared.0);
        at::<UInt32Builder>(b, 11).append_option(self.declared.1);
        at::<StringBuilder>(b, 12).append_option(p.pix_fmt);
        at::<StringBuilder>(b, 13).append_option(self.declared_pix_fmt);
        let colour = [p.color_range, p.color_space, p.color_primaries, p.color_trc, p.chroma_location];
        for (i, c) in colour.into_iter().enumerate() {
            at::<StringBuilder>(b, 14 + i).append_option(c);
        }
        at::<Int32Builder>(b, 19).append_value(self.time_base.0);
        at::<Int32Builder>(b, 20).append_value(self.time_base.1);
        at::<Float64Builder>(b, 21).append_option(self.avg_frame_rate);
        at::<UInt64Builder>(b, 22).append_value(self.first_row);
        at::<UInt64Builder>(b, 23).append_value(self.packets);
        at::<UInt64Builder>(b, 24).append_value(self.keyframes);
        at::<UInt64Builder>(b, 25).append_value(self.max_gop);
        at::<BooleanBuilder>(b, 26).append_value(self.reordered);
        at::<UInt64Builder>(b, 27).append_value(self.bytes);
        at::<Float64Builder>(b, 28).append_option(self.duration_s);
    }
}

fn episodes_table(
    plan: &Plan,
    by_index: &HashMap<i64, &EpisodeMeta>,
    outcomes: &[StreamOutcome],
    pointers: &Pointers,
    layout: &StepsLayout,
    image_streams: &[(u32, u64)],
) -> Result<RecordBatch> {
    let schema = tables::episodes_schema();
    let mut index = Int64Builder::new();
    let mut length = Int64Builder::new();
    let mut tasks = ListBuilder::new(StringBuilder::new());
    let mut from = Int64Builder::new();
    let mut to = Int64Builder::new();
    let mut data_file = StringBuilder::new();
    let mut cameras = ListBuilder::new(StructBuilder::from_fields(tables::episode_camera_fields(), 4));
    let stream_of: HashMap<(&str, &str), u32> =
        outcomes.iter().map(|o| ((o.job.camera.as_str(), o.job.file.path.as_str()), o.job.stream)).collect();
    let mut ordinal = 0u64;
    for e in &plan.kept {
        let em = by_index[e];
        let n = plan.rows[e].rows as u64;
        index.append_value(em.index);
        length.append_value(em.length);
        for t in &em.tasks {
            tasks.values().append_value(t);
        }
        tasks.append(true);
        from.append_value(em.from_index);
        to.append_value(em.to_index);
        data_file.append_value(&em.data_file);
        let entries = cameras.values();
        for (ci, cam) in layout.cameras.iter().enumerate() {
            let slot = plan.video_cameras.iter().position(|c| c == cam);
            if slot.is_some_and(|slot| plan.without_video.contains(&(*e, slot))) {
                // Kept without this camera's video: the episode lists no stream of it.
                continue;
            }
            let (stream, file, from_ts, to_ts, first, last) = match layout.image_cameras.iter().position(|c| c == cam) {
                Some(ii) => {
                    let (stream, base) = image_streams[ii];
                    (stream, None, None, None, base + ordinal, base + ordinal + n - 1)
                }
                None => {
                    let v = em.videos.iter().find(|v| &v.camera == cam).expect("episode has the camera");
                    let stream = stream_of[&(cam.as_str(), v.file.as_str())];
                    let (_, first, last) = pointers[&(*e, ci)];
                    (stream, Some(v.file.clone()), Some(v.from_timestamp), v.to_timestamp, first, last)
                }
            };
            entries.field_builder::<StringBuilder>(0).expect("camera").append_value(cam);
            entries.field_builder::<UInt32Builder>(1).expect("stream").append_value(stream);
            entries.field_builder::<StringBuilder>(2).expect("file").append_option(file);
            entries.field_builder::<Float64Builder>(3).expect("from").append_option(from_ts);
            entries.field_builder::<Float64Builder>(4).expect("to").append_option(to_ts);
            entries.field_builder::<UInt64Builder>(5).expect("frames").append_value(n);
            entries.field_builder::<UInt64Builder>(6).expect("first_row").append_value(first);
            entries.field_builder::<UInt64Builder>(7).expect("last_row").append_value(last);
            entries.append(true);
        }
        cameras.append(true);
        ordinal += n;
    }
    let columns: Vec<ArrayRef> = vec![
        Arc::new(index.finish()),
        Arc::new(length.finish()),
        Arc::new(tasks.finish()),
        Arc::new(from.finish()),
        Arc::new(to.finish()),
        Arc::new(data_file.finish()),
        Arc::new(cameras.finish()),
    ];
    let columns = cast_to_schema(columns, &schema)?;
    RecordBatch::try_new(schema, columns).map_err(Error::arrow(EPISODES))
}

fn tasks_table(meta: &DatasetMeta) -> Result<RecordBatch> {
    let index: Vec<i64> = meta.tasks.iter().map(|t| t.task_index).collect();
    let task: Vec<&str> = meta.tasks.iter().map(|t| t.task.as_str()).collect();
    RecordBatch::try_new(
        tables::tasks_schema(),
        vec![Arc::new(arrow::array::Int64Array::from(index)), Arc::new(arrow::array::StringArray::from(task))],
    )
    .map_err(Error::arrow(TASKS))
}

/// Writes the `stats` table: the statistics LeRobot stored for each kept episode (read back
/// from the scratch file a batch at a time), then the dataset's.
async fn write_stats(pending: &PendingVersion, meta: &DatasetMeta, kept: &BTreeSet<i64>, progress: &Progress) -> Result<()> {
    write_streamed(pending.table_uri(STATS), tables::stats_schema(), async |tx| {
        for batch in meta.episode_stats()? {
            progress.check()?;
            let batch = batch?;
            let episodes = batch.column(0).as_primitive::<Int64Type>();
            let keep: arrow::array::BooleanArray = episodes.iter().map(|e| Some(e.is_some_and(|e| kept.contains(&e)))).collect();
            let batch = arrow::compute::filter_record_batch(&batch, &keep).map_err(Error::arrow(STATS))?;
            if batch.num_rows() > 0 && tx.send(Ok(batch)).await.is_err() {
                return Err(Error::Internal("the stats writer stopped".into()));
            }
        }
        let mut rows = StatsRows::default();
        for s in meta.stats.iter().filter(|s| s.episode.is_none()) {
            rows.push(s);
        }
        if rows.len() > 0 {
            let _ = tx.send(rows.finish()).await;
        }
        Ok(())
    })
    .await
}

/// Writes the table at `uri` from the batches `produce` sends, as they come; an error of
/// `produce` is the table's.
async fn write_streamed(
    uri: String,
    schema: arrow::datatypes::SchemaRef,
    produce: impl AsyncFnOnce(&tokio::sync::mpsc::Sender<Result<RecordBatch>>) -> Result<()>,
) -> Result<()> {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<RecordBatch>>(2);
    let writer = tokio::spawn(lake_store::write_uncommitted(uri.clone(), schema.clone(), receiver_stream(rx)));
    if let Err(e) = produce(&tx).await {
        let _ = tx.send(Err(e)).await;
    }
    drop(tx);
    let part = writer.await.map_err(|e| Error::Internal(format!("writing {uri}: {e}")))??;
    lake_store::commit_parts(&uri, schema, vec![part]).await?;
    Ok(())
}

fn findings_table(findings: &[Finding]) -> Result<RecordBatch> {
    let mut severity = StringBuilder::new();
    let mut kind = StringBuilder::new();
    let mut file = StringBuilder::new();
    let mut episode = Int64Builder::new();
    let mut camera = StringBuilder::new();
    let mut frame = Int64Builder::new();
    let mut message = StringBuilder::new();
    for f in findings {
        severity.append_value(f.severity.as_str());
        kind.append_value(f.kind.as_str());
        file.append_option(f.file.as_deref());
        episode.append_option(f.episode);
        camera.append_option(f.camera.as_deref());
        frame.append_option(f.frame);
        message.append_value(&f.message);
    }
    let columns: Vec<ArrayRef> = vec![
        Arc::new(severity.finish()),
        Arc::new(kind.finish()),
        Arc::new(file.finish()),
        Arc::new(episode.finish()),
        Arc::new(camera.finish()),
        Arc::new(frame.finish()),
        Arc::new(message.finish()),
    ];
    RecordBatch::try_new(tables::findings_schema(), columns).map_err(Error::arrow(FINDINGS))
}

fn summarise(plan: &mut Plan, outcomes: &[StreamOutcome], image_bytes: &[u64], kept_steps: u64, packets: u64, meta: &DatasetMeta) {
    let shown: Vec<bool> = outcomes.iter().map(|o| shows_kept(o, plan)).collect();
    let report = &mut plan.report;
    report.episodes = plan.kept.len() as u64;
    report.steps = kept_steps;
    report.packets = packets;
    report.recorded_seconds = kept_steps as f64 / f64::from(meta.fps);
    report.packet_bytes = outcomes.iter().filter(|o| o.published).map(|o| o.bytes).sum::<u64>() + image_bytes.iter().sum::<u64>();
    report.cameras.clear();
    let layout_cameras: Vec<String> = meta
        .features
        .iter()
        .filter(|f| plan.video_cameras.contains(&f.name) || plan.image_cameras.contains(&f.name))
        .map(|f| f.name.clone())
        .collect();
    for cam in layout_cameras {
        if plan.image_cameras.contains(&cam) {
            let first = plan.kept.iter().find_map(|e| plan.rows[e].image_formats.iter().find(|(c, ..)| *c == cam).cloned());
            let (codec, w, h) = first.map_or(("png", 0, 0), |(_, f, w, h)| (f, w, h));
            report.cameras.push(CameraSummary {
                name: cam,
                kind: "image".into(),
                codec: codec.into(),
                declared_codec: None,
                width: w,
                height: h,
                streams: 1,
                packets: kept_steps,
                max_gop: 1,
            });
            continue;
        }
        let mine: Vec<&StreamOutcome> =
            outcomes.iter().zip(&shown).filter(|(o, shown)| o.job.camera == cam && o.published && **shown).map(|(o, _)| o).collect();
        let Some(first) = mine.first().and_then(|o| o.facts.clone()) else { continue };
        report.cameras.push(CameraSummary {
            name: cam,
            kind: "video".into(),
            codec: first.params.codec,
            declared_codec: mine[0].job.declared.codec.clone(),
            width: first.params.width,
            height: first.params.height,
            streams: mine.len() as u64,
            packets: mine.iter().map(|o| o.packets).sum(),
            max_gop: mine.iter().map(|o| o.max_gop).max().unwrap_or(0),
        });
    }
}

/// `blake3:` hash of (path, size, modification time) of every file: changes when any file does.
/// The first of `files` whose size or modification time is not what was read (or that is gone).
async fn changed_file(source: &Source, files: &[SourceFile]) -> Result<Option<String>> {
    for f in files {
        if source.head(&f.path).await?.as_ref() != Some(f) {
            return Ok(Some(f.path.clone()));
        }
    }
    Ok(None)
}

fn fingerprint(files: &[SourceFile]) -> String {
    let mut h = blake3::Hasher::new();
    for f in files {
        h.update(format!("{}\0{}\0{}\n", f.path, f.size, f.modified.timestamp_nanos_opt().unwrap_or_default()).as_bytes());
    }
    format!("blake3:{}", h.finalize().to_hex())
}

/// `blake3:` hash of (path, size, content hash) of every file.
async fn content_hash(source: &Source, files: &[SourceFile], threads: usize, progress: &Progress) -> Result<String> {
    let hashes: Vec<(String, u64, blake3::Hash)> = stream::iter(files)
        .map(|f| async move {
            progress.check()?;
            Ok::<_, Error>((f.path.clone(), f.size, source.hash(f).await?))
        })
        .buffered(threads.max(1))
        .try_collect()
        .await?;
    let mut h = blake3::Hasher::new();
    for (path, size, hash) in hashes {
        h.update(format!("{path}\0{size}\0{}\n", hash.to_hex()).as_bytes());
    }
    Ok(format!("blake3:{}", h.finalize().to_hex()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_file_changed_after_it_was_listed_is_named() {
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::create_dir(dir.path().join("meta")).expect("dir");
        std::fs::write(dir.path().join("meta/info.json"), b"{}").expect("write");
        std::fs::write(dir.path().join("data.parquet"), b"1234").expect("write");
        let source = Source::open(dir.path().to_str().expect("utf-8")).expect("source");
        let files = source.list("").await.expect("list");
        assert_eq!(changed_file(&source, &files).await.expect("stat"), None);
        std::fs::write(dir.path().join("data.parquet"), b"12345").expect("rewrite");
        assert_eq!(changed_file(&source, &files).await.expect("stat").as_deref(), Some("data.parquet"));
        std::fs::remove_file(dir.path().join("data.parquet")).expect("remove");
        assert_eq!(changed_file(&source, &files).await.expect("stat").as_deref(), Some("data.parquet"));
    }
}
