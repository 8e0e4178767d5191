//! Reading a LeRobot dataset's metadata (`meta/`): info, episodes, tasks and stats, for v2.0,
//! v2.1 and v3.0 layouts.

use arrow::array::RecordBatch;
use futures::TryStreamExt;
use lake_schemas::{CodebaseVersion, Feature, FeatureKind, Finding, FindingKind, InfoJson, TemplateValue};
use parquet::arrow::ParquetRecordBatchStreamBuilder;
use serde_json::Value;

use crate::{
    Error, Result,
    columns::{f64s, flatten_json, flatten_numbers, i64s, string_lists, strings},
    episode_stats::{Spill, SpilledStats, StatRow},
    scratch::Scratch,
    source::{Source, SourceFile},
};

const INFO: &str = "meta/info.json";
const STATS: &str = "meta/stats.json";
const TASKS_PARQUET: &str = "meta/tasks.parquet";
const TASKS_JSONL: &str = "meta/tasks.jsonl";
const EPISODES_DIR: &str = "meta/episodes/";
const EPISODES_JSONL: &str = "meta/episodes.jsonl";
const EPISODES_STATS_JSONL: &str = "meta/episodes_stats.jsonl";

/// Everything `meta/` says about a dataset.
#[derive(Debug, Clone)]
pub struct DatasetMeta {
    /// `meta/info.json`, parsed.
    pub info: InfoJson,
    /// `meta/info.json`, verbatim.
    pub info_value: Value,
    /// Format version.
    pub version: CodebaseVersion,
    /// Frames per second.
    pub fps: u32,
    /// Every declared feature, in declaration order.
    pub features: Vec<Feature>,
    /// Episodes, sorted by index.
    pub episodes: Vec<EpisodeMeta>,
    /// Tasks, sorted by `task_index`, which is the key a step's `task_index` is looked up by:
    /// the row position in v3.0's `tasks.parquet` (LeRobot looks tasks up with `iloc`), the
    /// `task_index` of v2.x's `tasks.jsonl` lines (LeRobot builds a dict of them).
    pub tasks: Vec<TaskRow>,
    /// Dataset-level statistics as LeRobot stored them (`meta/stats.json`); each episode's are
    /// in a scratch file of the ingest.
    pub stats: Vec<StatRow>,
    /// Each episode's statistics (v3.0's episode metadata shards, v2.1's
    /// `episodes_stats.jsonl`), in the order they were read.
    episode_stats: Option<SpilledStats>,
    /// The metadata files read.
    pub files: Vec<SourceFile>,
    /// What reading the metadata found.
    pub findings: Vec<Finding>,
}

/// One episode as the metadata describes it.
#[derive(Debug, Clone, PartialEq)]
pub struct EpisodeMeta {
    /// Episode index.
    pub index: i64,
    /// Declared number of steps.
    pub length: i64,
    /// Declared tasks.
    pub tasks: Vec<String>,
    /// First global step index (inclusive).
    pub from_index: i64,
    /// Last global step index (exclusive).
    pub to_index: i64,
    /// Data parquet holding its steps, relative to the dataset root.
    pub data_file: String,
    /// For each video camera (in feature order): the file and where the episode starts in it.
    pub videos: Vec<VideoRef>,
    /// The metadata file listing it (a `meta/episodes` shard, or `meta/episodes.jsonl`).
    pub listed_in: String,
}

/// Where one camera's frames of an episode are.
#[derive(Debug, Clone, PartialEq)]
pub struct VideoRef {
    /// Camera (feature key).
    pub camera: String,
    /// The mp4, relative to the dataset root.
    pub file: String,
    /// Offset of the episode's first frame in the file, seconds (0 for v2.x).
    pub from_timestamp: f64,
    /// End of the episode in the file, seconds, when declared.
    pub to_timestamp: Option<f64>,
}

/// One task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskRow {
    /// Declared `task_index`.
    pub task_index: i64,
    /// The task string.
    pub task: String,
}

impl DatasetMeta {
    /// Reads the metadata of the dataset at `source`; each episode's statistics go to a file
    /// in `scratch`.
    ///
    /// # Errors
    /// When `meta/info.json` or the episode metadata is missing or malformed, or the scratch
    /// file cannot be written. Problems that do not stop reading are returned as findings
    /// instead.
    pub(crate) async fn load(source: &Source, scratch: &Scratch) -> Result<Self> {
        let mut files = Vec::new();
        let info_file = source.head(INFO).await?.ok_or_else(|| Error::Missing {
            path: format!("{}/{INFO}", source.display().trim_end_matches('/')),
            what: "LeRobot metadata (is this a LeRobot dataset root?)".into(),
        })?;
        let info_bytes = source.get(INFO).await?;
        files.push(info_file);
        let info_value: Value =
            serde_json::from_slice(&info_bytes).map_err(|source| Error::Json { path: INFO.into(), line: None, source })?;
        // The schema's errors name the file already.
        let from_info = |e: lake_schemas::Error| {
            let message = e.to_string();
            Error::metadata(INFO, message.strip_prefix(&format!("{INFO}: ")).unwrap_or(&message))
        };
        let info = InfoJson::parse(std::str::from_utf8(&info_bytes).unwrap_or_default()).map_err(from_info)?;
        let version = info.version().map_err(from_info)?;
        let fps = info.fps_int().map_err(from_info)?;
        let features = info.parsed_features().map_err(from_info)?;
        if features.iter().any(|f| f.kind() == FeatureKind::Video) && info.video_path.is_none() {
            return Err(Error::metadata(INFO, "declares video features but `video_path` is null"));
        }

        let mut meta = Self {
            info,
            info_value,
            version,
            fps,
            features,
            episodes: Vec::new(),
            tasks: Vec::new(),
            stats: Vec::new(),
            episode_stats: None,
            files,
            findings: Vec::new(),
        };
        let mut spill = Spill::create(scratch)?;
        if version.is_v2() {
            meta.load_v2(source, &mut spill).await?;
        } else {
            meta.load_v3(source, &mut spill).await?;
        }
        meta.episode_stats = Some(spill.finish()?);
        meta.key_tasks();
        meta.load_stats_json(source).await?;
        meta.check_totals();
        meta.check_features();
        Ok(meta)
    }

    /// The task a step's `task_index` names, if the task table has it.
    pub fn task(&self, task_index: i64) -> Option<&str> {
        self.tasks.binary_search_by_key(&task_index, |t| t.task_index).ok().map(|i| self.tasks[i].task.as_str())
    }

    /// Keys the tasks read in file order as LeRobot looks them up (see [`Self::tasks`]), with a
    /// warning where the file's own numbers say otherwise.
    fn key_tasks(&mut self) {
        if self.version.is_v2() {
            // A dict of the lines: of two lines with one `task_index`, the later wins.
            let mut keyed: std::collections::BTreeMap<i64, String> = std::collections::BTreeMap::new();
            let mut repeated = Vec::new();
            for t in std::mem::take(&mut self.tasks) {
                if let Some(earlier) = keyed.insert(t.task_index, t.task.clone())
                    && earlier != t.task
                {
                    repeated.push(t.task_index);
                }
            }
            if let Some(first) = repeated.first() {
                self.findings.push(
                    Finding::warning(
                        FindingKind::BadMetadata,
                        format!(
                            "{} task_index value(s) appear again on a later line with another task (first: {first}); the later \
                             line is used, as in LeRobot",
                            repeated.len()
                        ),
                    )
                    .with_file(TASKS_JSONL),
                );
            }
            self.tasks = keyed.into_iter().map(|(task_index, task)| TaskRow { task_index, task }).collect();
        } else {
            let moved: Vec<(usize, i64)> =
                self.tasks.iter().enumerate().filter(|(row, t)| t.task_index != *row as i64).map(|(row, t)| (row, t.task_index)).collect();
            if let Some((row, declared)) = moved.first() {
                self.findings.push(
                    Finding::warning(
                        FindingKind::BadMetadata,
                        format!(
                            "{} of {} rows have a task_index other than their position (first: row {row} says {declared}); a step's \
                             task_index names the task at that row, as in LeRobot, and the lake numbers the tasks so",
                            moved.len(),
                            self.tasks.len()
                        ),
                    )
                    .with_file(TASKS_PARQUET),
                );
            }
            for (row, t) in self.tasks.iter_mut().enumerate() {
                t.task_index = row as i64;
            }
        }
    }

    /// The video cameras, in feature order.
    pub fn video_cameras(&self) -> Vec<&Feature> {
        self.features.iter().filter(|f| f.kind() == FeatureKind::Video).collect()
    }

    /// The image (encoded-in-parquet) cameras, in feature order.
    pub fn image_cameras(&self) -> Vec<&Feature> {
        self.features.iter().filter(|f| f.kind() == FeatureKind::Image).collect()
    }

    fn chunks_size(&self) -> i64 {
        self.info.chunks_size.filter(|c| *c > 0).unwrap_or(1000)
    }

    fn data_file(&self, episode: i64, chunk: i64, file: i64) -> Result<String> {
        let values = [
            ("chunk_index", TemplateValue::Int(chunk)),
            ("file_index", TemplateValue::Int(file)),
            ("episode_index", TemplateValue::Int(episode)),
            ("episode_chunk", TemplateValue::Int(episode / self.chunks_size())),
        ];
        self.info.data_template().format(&values).map_err(|e| Error::metadata(INFO, e.to_string()))
    }

    fn video_file(&self, camera: &str, episode: i64, chunk: i64, file: i64) -> Result<String> {
        let template = self.info.video_template().ok_or_else(|| Error::metadata(INFO, "`video_path` is null"))?;
        let values = [
            ("video_key", TemplateValue::Str(camera.to_string())),
            ("chunk_index", TemplateValue::Int(chunk)),
            ("file_index", TemplateValue::Int(file)),
            ("episode_index", TemplateValue::Int(episode)),
            ("episode_chunk", TemplateValue::Int(episode / self.chunks_size())),
        ];
        template.format(&values).map_err(|e| Error::metadata(INFO, e.to_string()))
    }

    /// The episode metadata shards of a source that cannot be listed: those LeRobot's writer
    /// names (`meta/episodes/chunk-CCC/file-FFF.parquet`, files numbered from 0 in each chunk of
    /// `chunks_size` files), asked for in order until one is missing. (A shard missing in the
    /// middle leaves episodes out, which the episode count in `info.json` then reports.)
    async fn named_episode_shards(&self, source: &Source) -> Result<Vec<SourceFile>> {
        let mut shards = Vec::new();
        let (mut chunk, mut file) = (0i64, 0i64);
        while let Some(found) = source.head(&format!("{EPISODES_DIR}chunk-{chunk:03}/file-{file:03}.parquet")).await? {
            shards.push(found);
            file += 1;
            if file == self.chunks_size() {
                (chunk, file) = (chunk + 1, 0);
            }
        }
        Ok(shards)
    }

    async fn load_v3(&mut self, source: &Source, spill: &mut Spill) -> Result<()> {
        let shards: Vec<SourceFile> = match source.can_list() {
            true => source.list(EPISODES_DIR).await?.into_iter().filter(|f| f.path.ends_with(".parquet")).collect(),
            false => self.named_episode_shards(source).await?,
        };
        if shards.is_empty() {
            return Err(Error::Missing { path: EPISODES_DIR.into(), what: "episode metadata shards (*.parquet)".into() });
        }
        let cameras: Vec<String> = self.video_cameras().iter().map(|f| f.name.clone()).collect();
        // A shard is read a batch at a time (LeRobot appends a row group per flush, and a
        // shard can hold thousands): its episodes are kept, their statistics checked and
        // spilled.
        for shard in &shards {
            let builder = ParquetRecordBatchStreamBuilder::new(source.parquet(shard)).await.map_err(Error::parquet(&shard.path))?;
            let mut batches = builder.build().map_err(Error::parquet(&shard.path))?;
            while let Some(batch) = batches.try_next().await.map_err(Error::parquet(&shard.path))? {
                self.episodes_from_v3_batch(&shard.path, &batch, &cameras)?;
                episode_stats_from_v3_batch(&shard.path, &batch, &mut |row| spill.push(&row))?;
                spill.flush()?;
            }
        }
        self.files.extend(shards);
        self.sort_and_check_episodes()?;

        let tasks_file =
            source.head(TASKS_PARQUET).await?.ok_or_else(|| Error::Missing { path: TASKS_PARQUET.into(), what: "task table".into() })?;
        let batches = read_parquet(source, &tasks_file).await?;
        let task_col = tasks_column(source, &tasks_file).await?;
        for batch in &batches {
            let indices = i64s(batch, "task_index")
                .ok_or_else(|| Error::metadata(TASKS_PARQUET, "no `task_index` column"))?
                .map_err(|e| Error::metadata(TASKS_PARQUET, e))?;
            let col = batch.column_by_name(&task_col).ok_or_else(|| Error::metadata(TASKS_PARQUET, format!("no `{task_col}` column")))?;
            let names = strings(col).map_err(|e| Error::metadata(TASKS_PARQUET, format!("column `{task_col}`: {e}")))?;
            for (i, (idx, name)) in indices.into_iter().zip(names).enumerate() {
                match (idx, name) {
                    (Some(task_index), Some(task)) => self.tasks.push(TaskRow { task_index, task }),
                    _ => return Err(Error::metadata(TASKS_PARQUET, format!("row {i} has a null task or task_index"))),
                }
            }
        }
        self.files.push(tasks_file);
        Ok(())
    }

    fn episodes_from_v3_batch(&mut self, shard: &str, batch: &RecordBatch, cameras: &[String]) -> Result<()> {
        let bad = |m: String| Error::metadata(shard, m);
        let need_i64 = |name: &str| -> Result<Vec<Option<i64>>> {
            i64s(batch, name)
                .ok_or_else(|| Error::metadata(shard, format!("no `{name}` column")))
                .and_then(|r| r.map_err(|e| Error::metadata(shard, e)))
        };
        let index = need_i64("episode_index")?;
        let length = need_i64("length")?;
        let from = need_i64("dataset_from_index")?;
        let to = need_i64("dataset_to_index")?;
        let data_chunk = need_i64("data/chunk_index")?;
        let data_file = need_i64("data/file_index")?;
        let tasks = match batch.column_by_name("tasks") {
            Some(col) => string_lists(col).map_err(|e| bad(format!("column `tasks`: {e}")))?,
            None => vec![Vec::new(); batch.num_rows()],
        };
        let mut video_cols = Vec::new();
        for cam in cameras {
            let chunk = need_i64(&format!("videos/{cam}/chunk_index"))?;
            let file = need_i64(&format!("videos/{cam}/file_index"))?;
            let from_ts = f64s(batch, &format!("videos/{cam}/from_timestamp"))
                .ok_or_else(|| bad(format!("no `videos/{cam}/from_timestamp` column")))?
                .map_err(&bad)?;
            let to_ts = f64s(batch, &format!("videos/{cam}/to_timestamp")).transpose().map_err(&bad)?;
            video_cols.push((cam, chunk, file, from_ts, to_ts));
        }
        for row in 0..batch.num_rows() {
            let get = |v: &[Option<i64>], col: &str| v[row].ok_or_else(|| bad(format!("row {row}: null `{col}`")));
            let idx = get(&index, "episode_index")?;
            let mut videos = Vec::with_capacity(video_cols.len());
            for (cam, chunk, file, from_ts, to_ts) in &video_cols {
                let (Some(chunk), Some(file), Some(from_ts)) = (chunk[row], file[row], from_ts[row]) else {
                    return Err(bad(format!("episode {idx}: null video location for camera `{cam}`")));
                };
                videos.push(VideoRef {
                    camera: (*cam).clone(),
                    file: self.video_file(cam, idx, chunk, file)?,
                    from_timestamp: from_ts,
                    to_timestamp: to_ts.as_ref().and_then(|t| t[row]),
                });
            }
            self.episodes.push(EpisodeMeta {
                index: idx,
                length: get(&length, "length")?,
                tasks: tasks[row].clone(),
                from_index: get(&from, "dataset_from_index")?,
                to_index: get(&to, "dataset_to_index")?,
                data_file: self.data_file(idx, get(&data_chunk, "data/chunk_index")?, get(&data_file, "data/file_index")?)?,
                videos,
                listed_in: shard.to_string(),
            });
        }
        Ok(())
    }

    /// Each episode's statistics, a batch of `stats` table rows at a time, in the order they
    /// were read.
    ///
    /// # Errors
    /// When the scratch file cannot be read.
    pub(crate) fn episode_stats(&self) -> Result<Box<dyn Iterator<Item = Result<RecordBatch>>>> {
        match &self.episode_stats {
            Some(spilled) => Ok(Box::new(spilled.batches()?)),
            None => Ok(Box::new(std::iter::empty())),
        }
    }

    async fn load_v2(&mut self, source: &Source, spill: &mut Spill) -> Result<()> {
        let (file, lines) = read_jsonl(source, EPISODES_JSONL)
            .await?
            .ok_or_else(|| Error::Missing { path: EPISODES_JSONL.into(), what: "episode list".into() })?;
        self.files.push(file);
        let mut rows = Vec::with_capacity(lines.len());
        for (line, value) in lines {
            let bad = |m: &str| Error::Metadata { path: format!("{EPISODES_JSONL} line {line}"), message: m.to_string() };
            let index = value.get("episode_index").and_then(Value::as_i64).ok_or_else(|| bad("no integer `episode_index`"))?;
            let length = value.get("length").and_then(Value::as_i64).ok_or_else(|| bad("no integer `length`"))?;
            let tasks = value
                .get("tasks")
                .and_then(Value::as_array)
                .map(|t| t.iter().filter_map(|s| s.as_str().map(str::to_string)).collect())
                .unwrap_or_default();
            rows.push((index, length, tasks));
        }
        rows.sort_by_key(|r| r.0);
        let cameras: Vec<String> = self.video_cameras().iter().map(|f| f.name.clone()).collect();
        let mut next = 0i64;
        for (index, length, tasks) in rows {
            let chunk = index / self.chunks_size();
            let videos = cameras
                .iter()
                .map(|cam| {
                    Ok(VideoRef {
                        camera: cam.clone(),
                        file: self.video_file(cam, index, chunk, index)?,
                        from_timestamp: 0.0,
                        to_timestamp: None,
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            self.episodes.push(EpisodeMeta {
                index,
                length,
                tasks,
                from_index: next,
                to_index: next + length,
                data_file: self.data_file(index, chunk, index)?,
                videos,
                listed_in: EPISODES_JSONL.to_string(),
            });
            next += length;
        }
        self.sort_and_check_episodes()?;

        let (file, lines) =
            read_jsonl(source, TASKS_JSONL).await?.ok_or_else(|| Error::Missing { path: TASKS_JSONL.into(), what: "task list".into() })?;
        self.files.push(file);
        for (line, value) in lines {
            let task_index = value.get("task_index").and_then(Value::as_i64);
            let task = value.get("task").and_then(Value::as_str);
            match (task_index, task) {
                (Some(task_index), Some(task)) => self.tasks.push(TaskRow { task_index, task: task.to_string() }),
                _ => {
                    return Err(Error::Metadata {
                        path: format!("{TASKS_JSONL} line {line}"),
                        message: "needs integer `task_index` and string `task`".into(),
                    });
                }
            }
        }

        if let Some(file) = source.head(EPISODES_STATS_JSONL).await? {
            // Checked and spilled a block of lines at a time.
            let mut lines = LineReader::new(source, &file);
            while let Some(block) = lines.next_block().await? {
                for (line, text) in block {
                    episode_stats_from_jsonl(line, &text, &mut |row| spill.push(&row))?;
                }
                spill.flush()?;
            }
            self.files.push(file);
        } else if self.version == CodebaseVersion::V21 {
            // lake needs no statistics to ingest or serve, but LeRobot's v2.1 reader loads its
            // dataset statistics from this file, and the cameras have no others.
            self.findings.push(
                Finding::warning(
                    FindingKind::MissingFile,
                    "meta/episodes_stats.jsonl is missing: LeRobot cannot load this v2.1 dataset without it, and lake has no \
                     camera statistics for it (`lake stats --images` computes them)",
                )
                .with_file(EPISODES_STATS_JSONL),
            );
        }
        Ok(())
    }

    async fn load_stats_json(&mut self, source: &Source) -> Result<()> {
        let Some(file) = source.head(STATS).await? else { return Ok(()) };
        let bytes = source.get(STATS).await?;
        self.files.push(file);
        let value = lake_schemas::pyjson::parse(&bytes).map_err(|source| Error::Json { path: STATS.into(), line: None, source })?;
        let obj = value.as_object().ok_or_else(|| Error::metadata(STATS, "is not a JSON object"))?;
        let stats = &mut self.stats;
        stats_object(None, obj, &mut |row| stats.push(row)).map_err(|m| Error::metadata(STATS, m))
    }

    fn sort_and_check_episodes(&mut self) -> Result<()> {
        // Listed (shards in path order, rows in order) otherwise than by index: LeRobot takes
        // an episode's metadata from the position its index names, another episode's.
        if let Some(pair) = self.episodes.windows(2).find(|w| w[1].index < w[0].index) {
            self.findings.push(
                Finding::warning(
                    FindingKind::BadMetadata,
                    format!(
                        "episodes are not listed in index order: episode {} comes after episode {}; LeRobot finds an episode's \
                         metadata by its position, so it would read other episodes' bounds (lake finds each by its index)",
                        pair[1].index, pair[0].index
                    ),
                )
                .with_file(&pair[1].listed_in)
                .with_episode(pair[1].index),
            );
        }
        self.episodes.sort_by_key(|e| e.index);
        for pair in self.episodes.windows(2) {
            if pair[0].index == pair[1].index {
                let also = if pair[0].listed_in == pair[1].listed_in { String::new() } else { format!(" (also in {})", pair[0].listed_in) };
                return Err(Error::metadata(&pair[1].listed_in, format!("episode {} is listed twice{also}", pair[0].index)));
            }
        }
        // LeRobot finds an episode's metadata by its position (v3.0 refuses to load a dataset
        // whose episodes are not 0..N-1; v2.x takes another episode's bounds).
        if let Some((position, e)) = self.episodes.iter().enumerate().find(|(p, e)| e.index != *p as i64) {
            let after =
                position.checked_sub(1).map_or("the first episode".to_string(), |p| format!("after episode {}", self.episodes[p].index));
            self.findings.push(
                Finding::warning(
                    FindingKind::BadMetadata,
                    format!(
                        "episode indices are not 0 to {}: episode {} comes {after}; LeRobot finds an episode's metadata by its \
                         position, so it cannot read this dataset as it is (lake finds each by its index)",
                        self.episodes.len() - 1,
                        e.index
                    ),
                )
                .with_file(&e.listed_in)
                .with_episode(e.index),
            );
        }
        // Steps are numbered by `index` from 0, each episode from where the one before ended:
        // two episodes claiming one index make a step unreachable (an error of the later one);
        // a gap (or a first index other than 0) leaves LeRobot, which finds sample `i` by its
        // row, numbering samples otherwise than their `index` (a warning).
        let mut end = 0;
        for (i, e) in self.episodes.iter().enumerate() {
            let before = i.checked_sub(1).map(|p| &self.episodes[p]);
            if e.from_index < end {
                let other = before.map_or(String::new(), |b| format!(" of episode {}", b.index));
                self.findings.push(
                    Finding::error(
                        FindingKind::BadMetadata,
                        format!("index range [{}, {}) overlaps the range [.., {end}){other}", e.from_index, e.to_index),
                    )
                    .with_file(&e.listed_in)
                    .with_episode(e.index),
                );
            } else if e.from_index > end {
                let after = before.map_or("the dataset starts at index 0".to_string(), |b| format!("episode {} ends at {end}", b.index));
                self.findings.push(
                    Finding::warning(
                        FindingKind::BadMetadata,
                        format!(
                            "starts at index {} but {after}: LeRobot finds a sample by its row, so from here on its sample i is not \
                             the step whose index is i (lake's is)",
                            e.from_index
                        ),
                    )
                    .with_file(&e.listed_in)
                    .with_episode(e.index),
                );
            }
            end = end.max(e.to_index);
        }
        for e in &self.episodes {
            if e.length <= 0 || e.to_index - e.from_index != e.length {
                self.findings.push(
                    Finding::error(
                        FindingKind::BadMetadata,
                        format!("length {} disagrees with index range [{}, {})", e.length, e.from_index, e.to_index),
                    )
                    .with_file(&e.listed_in)
                    .with_episode(e.index),
                );
            }
        }
        Ok(())
    }

    /// Features lake cannot read as what they claim to be: a dtype LeRobot does not write (its
    /// column is carried through as stored, not as a vector of that many numbers), a camera
    /// whose shape is not (height, width, channels) in some order (the frames' own size is used).
    fn check_features(&mut self) {
        for f in &self.features {
            let what = match f.kind() {
                FeatureKind::Other => {
                    format!("features.{}: dtype `{}` is not one LeRobot writes; its column is carried through as stored", f.name, f.dtype)
                }
                FeatureKind::Video | FeatureKind::Image if f.shape.len() != 3 => format!(
                    "features.{}: shape {:?} is not a camera's (height, width, channels); the frames' own size is used",
                    f.name, f.shape
                ),
                _ => continue,
            };
            self.findings.push(Finding::warning(FindingKind::BadMetadata, what).with_file(INFO));
        }
    }

    fn check_totals(&mut self) {
        let episodes = self.episodes.len() as i64;
        let frames: i64 = self.episodes.iter().map(|e| e.length).sum();
        let mut check = |name: &str, declared: Option<i64>, actual: i64| {
            if let Some(d) = declared
                && d != actual
            {
                let lister = if name == "total_tasks" { "the task table" } else { "the episode metadata" };
                self.findings.push(
                    Finding::warning(FindingKind::TotalsMismatch, format!("info.json says {name} = {d}, {lister} lists {actual}"))
                        .with_file(INFO),
                );
            }
        };
        check("total_episodes", self.info.total_episodes, episodes);
        check("total_frames", self.info.total_frames, frames);
        check("total_tasks", self.info.total_tasks, self.tasks.len() as i64);
    }
}

/// The column of `meta/tasks.parquet` holding the task strings: `task`, or the pandas index
/// column that pandas wrote the `task` index into.
async fn tasks_column(source: &Source, file: &SourceFile) -> Result<String> {
    let builder = ParquetRecordBatchStreamBuilder::new(source.parquet(file)).await.map_err(Error::parquet(&file.path))?;
    let schema = builder.schema().clone();
    if schema.field_with_name("task").is_ok() {
        return Ok("task".into());
    }
    if let Some(pandas) = schema.metadata().get("pandas")
        && let Ok(v) = serde_json::from_str::<Value>(pandas)
        && let Some(cols) = v.get("index_columns").and_then(Value::as_array)
    {
        for c in cols {
            if let Some(name) = c.as_str()
                && schema.field_with_name(name).is_ok()
            {
                return Ok(name.to_string());
            }
        }
    }
    let strings: Vec<_> = schema
        .fields()
        .iter()
        .filter(|f| matches!(f.data_type(), arrow::datatypes::DataType::Utf8 | arrow::datatypes::DataType::LargeUtf8))
        .collect();
    match strings.as_slice() {
        [only] => Ok(only.name().clone()),
        _ => Err(Error::metadata(&file.path, "cannot tell which column holds the task strings (no `task` column or pandas index)")),
    }
}

/// The rows of a JSON `stats` object (feature → statistic → nested numbers).
fn stats_object(
    episode: Option<i64>,
    stats: &serde_json::Map<String, Value>,
    sink: &mut dyn FnMut(StatRow),
) -> std::result::Result<(), String> {
    for (feature, per_stat) in stats {
        let Some(per_stat) = per_stat.as_object() else { return Err(format!("stats of `{feature}` are not an object")) };
        for (stat, value) in per_stat {
            let (values, shape) = flatten_json(value).map_err(|e| format!("`{feature}.{stat}`: {e}"))?;
            sink(StatRow { episode, feature: feature.clone(), stat: stat.clone(), values, shape });
        }
    }
    Ok(())
}

/// The statistics rows of one line of v2.1's `episodes_stats.jsonl` (1-based `line`).
fn episode_stats_from_jsonl(line: usize, text: &str, sink: &mut dyn FnMut(StatRow)) -> Result<()> {
    let bad = |m: String| Error::Metadata { path: format!("{EPISODES_STATS_JSONL} line {line}"), message: m };
    let value = lake_schemas::pyjson::parse(text.as_bytes()).map_err(|source| Error::Json {
        path: EPISODES_STATS_JSONL.into(),
        line: Some(line),
        source,
    })?;
    let episode = value.get("episode_index").and_then(Value::as_i64).ok_or_else(|| bad("no integer `episode_index`".into()))?;
    let stats = value.get("stats").and_then(Value::as_object).ok_or_else(|| bad("no `stats` object".into()))?;
    stats_object(Some(episode), stats, sink).map_err(bad)
}

/// The statistics rows of a batch of a v3.0 episode metadata shard (its `stats/…` columns).
fn episode_stats_from_v3_batch(shard: &str, batch: &RecordBatch, sink: &mut dyn FnMut(StatRow)) -> Result<()> {
    let index = i64s(batch, "episode_index")
        .ok_or_else(|| Error::metadata(shard, "no `episode_index` column"))?
        .map_err(|e| Error::metadata(shard, e))?;
    for (field, col) in batch.schema().fields().iter().zip(batch.columns()) {
        let Some((feature, stat)) = field.name().strip_prefix("stats/").and_then(|s| s.rsplit_once('/')) else { continue };
        for (row, episode) in index.iter().enumerate() {
            if col.is_null(row) {
                continue;
            }
            let (values, shape) = flatten_numbers(col.as_ref(), row)
                .map_err(|e| Error::metadata(shard, format!("column `{}` row {row}: {e}", field.name())))?;
            sink(StatRow { episode: *episode, feature: feature.to_string(), stat: stat.to_string(), values, shape });
        }
    }
    Ok(())
}

/// A JSON-lines file read a block of whole lines at a time (4 MiB of text or more, when one
/// line is longer), with their 1-based numbers; blank lines are skipped.
struct LineReader<'a> {
    source: &'a Source,
    file: &'a SourceFile,
    at: u64,
    line: usize,
    rest: Vec<u8>,
    block: u64,
}

impl<'a> LineReader<'a> {
    fn new(source: &'a Source, file: &'a SourceFile) -> Self {
        Self { source, file, at: 0, line: 0, rest: Vec::new(), block: 4 << 20 }
    }

    async fn next_block(&mut self) -> Result<Option<Vec<(usize, String)>>> {
        loop {
            if self.at >= self.file.size && self.rest.is_empty() {
                return Ok(None);
            }
            let end = (self.at + self.block).min(self.file.size);
            let read_from = self.rest.len();
            if self.at < end {
                self.rest.extend_from_slice(&self.source.get_range_of(&self.file.path, self.at..end).await?);
                self.at = end;
            }
            // Whole lines only, unless the file has ended; only the bytes just read can hold the
            // last newline (a long line is not scanned again for each block).
            let cut = if self.at >= self.file.size {
                self.rest.len()
            } else {
                self.rest[read_from..].iter().rposition(|b| *b == b'\n').map_or(0, |i| read_from + i + 1)
            };
            if cut == 0 {
                continue;
            }
            let text: Vec<u8> = self.rest.drain(..cut).collect();
            let text = std::str::from_utf8(&text).map_err(|e| {
                let line = self.line + 1 + text[..e.valid_up_to()].iter().filter(|b| **b == b'\n').count();
                Error::metadata(&self.file.path, format!("line {line}: not UTF-8"))
            })?;
            let mut block = Vec::new();
            for line in text.lines() {
                self.line += 1;
                if !line.trim().is_empty() {
                    block.push((self.line, line.to_string()));
                }
            }
            return Ok(Some(block));
        }
    }
}

/// Reads every row of a parquet file.
pub(crate) async fn read_parquet(source: &Source, file: &SourceFile) -> Result<Vec<RecordBatch>> {
    let builder = ParquetRecordBatchStreamBuilder::new(source.parquet(file)).await.map_err(Error::parquet(&file.path))?;
    let stream = builder.build().map_err(Error::parquet(&file.path))?;
    stream.try_collect().await.map_err(Error::parquet(&file.path))
}

async fn read_jsonl(source: &Source, path: &str) -> Result<Option<(SourceFile, Vec<(usize, Value)>)>> {
    let Some(file) = source.head(path).await? else { return Ok(None) };
    let bytes = source.get(path).await?;
    let text = std::str::from_utf8(&bytes).map_err(|e| Error::metadata(path, format!("not UTF-8: {e}")))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v =
            lake_schemas::pyjson::parse(line.as_bytes()).map_err(|source| Error::Json { path: path.into(), line: Some(i + 1), source })?;
        out.push((i + 1, v));
    }
    Ok(Some((file, out)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn json_lines_are_read_whole_across_blocks_with_their_numbers() {
        let dir = tempfile::tempdir().expect("tmp");
        let text = "{\"a\": 1}\n\n{\"long line\": \"0123456789abcdef\"}\r\nx\n  \nlast without newline";
        std::fs::write(dir.path().join("lines.jsonl"), text).expect("write");
        let source = Source::open(dir.path().to_str().expect("utf-8")).expect("source");
        let file = source.head("lines.jsonl").await.expect("head").expect("exists");
        for block in [1, 7, 4 << 20] {
            let mut reader = LineReader { block, ..LineReader::new(&source, &file) };
            let mut lines = Vec::new();
            while let Some(b) = reader.next_block().await.expect("read") {
                lines.extend(b);
            }
            let want = [(1, "{\"a\": 1}"), (3, "{\"long line\": \"0123456789abcdef\"}"), (4, "x"), (6, "last without newline")];
            assert_eq!(lines, want.map(|(n, l)| (n, l.to_string())), "block {block}");
        }
        std::fs::write(dir.path().join("bad.jsonl"), b"{}\n{}\n{\"x\": \"\xff\"}\n").expect("write");
        let file = source.head("bad.jsonl").await.expect("head").expect("exists");
        let e = LineReader::new(&source, &file).next_block().await.expect_err("not UTF-8");
        assert!(e.to_string().contains("bad.jsonl: line 3: not UTF-8"), "{e}");
    }
}
