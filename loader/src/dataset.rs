//! A dataset version opened for sampling: its steps in memory (small: numbers and strings), the
//! packet index (stream, pts, keyframe offset per frame; the packet bytes stay in Lance and are
//! read per batch), the codec facts of every stream, and the episode spans.

use std::{collections::HashMap, sync::Arc};

use arrow::{
    array::{Array, AsArray, FixedSizeListArray, RecordBatch, UInt64Array},
    compute::{cast, concat_batches, take},
    datatypes::{DataType, Field, Int64Type, Schema, UInt32Type, UInt64Type},
};
use lake_codec::{StreamConfig, YuvToRgb, yuv420p_bytes};
use lake_schemas::{
    CodecParams, CommitRecord, FeatureMap,
    tables::{self, PACKET_ROW, SHAPE_METADATA, TASK, lerobot_name},
};
use lake_store::{Lake, deps::lance};

use crate::{Error, Result, frames::FrameStorage};
use lake_schemas::FrameFormat;

/// A step column served in samples.
#[derive(Debug, Clone)]
pub struct Column {
    /// The LeRobot key (e.g. `observation.state`).
    pub key: String,
    /// Position in the steps batch.
    pub position: usize,
    /// The feature's declared shape (`[]` for the index columns and `task`).
    pub shape: Vec<usize>,
}

/// A camera: which packet row shows each step, and the frame size.
#[derive(Debug, Clone)]
pub struct Camera {
    /// The camera key.
    pub key: String,
    /// Per step row: the `packets` row of its frame; null for the steps of an episode ingested
    /// without this camera's video (use [`Camera::packet_row`]).
    pub packet_rows: UInt64Array,
    /// Frame height.
    pub height: u32,
    /// Frame width.
    pub width: u32,
    /// Whether its frames are video (`false`: images stored in the parquet). LeRobot drops the
    /// time dimension of a video camera's one-offset window, not of an image camera's.
    pub video: bool,
    /// With [`FrameFormat::Yuv420p`], for a camera whose frames travel as YUV planes: their
    /// conversion to RGB (`None`: the frames are RGB). With [`FrameFormat::Packets`], the
    /// conversion of the planes its packets decode to, for a consumer that takes planes.
    pub yuv: Option<YuvToRgb>,
    /// For frames from a training proxy: what they are ([`crate::proxy_info::ProxyLabel`]), as
    /// the camera's column carries it in [`lake_schemas::tables::PROXY_METADATA`].
    pub proxy: Option<String>,
}

impl Camera {
    /// The `packets` row of step row `step`'s frame, if the step has one.
    pub fn packet_row(&self, step: usize) -> Option<u64> {
        self.packet_rows.is_valid(step).then(|| self.packet_rows.value(step))
    }

    /// Whether every step has a frame (no episode was ingested without this camera's video).
    pub fn every_step_has_a_frame(&self) -> bool {
        self.packet_rows.null_count() == 0
    }

    /// Whether every step of an episode has a frame.
    pub fn shows_every_step_of(&self, episode: &EpisodeSpan) -> bool {
        self.packet_rows.slice(episode.first_row as usize, episode.len as usize).null_count() == 0
    }

    /// Bytes of one frame as samples carry it (RGB, or YUV planes).
    pub fn frame_bytes(&self) -> usize {
        match self.yuv {
            Some(_) => yuv420p_bytes(self.width, self.height),
            None => self.height as usize * self.width as usize * 3,
        }
    }
}

/// How a dataset's camera frames are served: at which size, in which pixel format.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct FrameSpec {
    /// Every camera's frames at this size, from the version's frame table of that size (`lake
    /// cache NAME --size WxH`); `None`: as recorded.
    pub size: Option<lake_schemas::FrameSize>,
    /// RGB, or YUV planes where a camera's frames allow it.
    pub format: FrameFormat,
    /// Every camera's frames from the version's training proxy (`lake cache NAME --proxy
    /// CODEC`): re-encoded, lossy, not the recorded frames.
    pub proxy: bool,
}

/// An episode's rows in the steps batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpisodeSpan {
    /// LeRobot's episode index.
    pub episode_index: i64,
    /// First row in the steps batch.
    pub first_row: u64,
    /// Number of steps.
    pub len: u64,
    /// LeRobot's `index` of the first step (`dataset_from_index`).
    pub from_index: i64,
}

/// Per-frame facts of the packets table (everything but the bytes).
#[derive(Debug, Clone, Default)]
pub struct PacketIndex {
    /// Stream of each row.
    pub stream: Vec<u32>,
    /// Presentation timestamp of each row.
    pub pts: Vec<i64>,
    /// Decode timestamp of each row.
    pub dts: Vec<i64>,
    /// Rows back to the keyframe decoding must start from.
    pub keyframe_offset: Vec<u32>,
    /// Whether the container flagged the packet as a keyframe (decoders get that flag, as they
    /// do when reading the file).
    pub container_keyframe: Vec<bool>,
    /// The CRC-32 of each row's bytes, taken at ingest (lakes ingested before packets had
    /// checksums have none).
    pub checksum: Option<Vec<u32>>,
}

/// A dataset version opened for sampling.
#[derive(Debug)]
pub struct LoaderDataset {
    /// `name@version`.
    pub label: String,
    /// The commit record.
    pub record: CommitRecord,
    /// The steps, in lake order (episodes contiguous, steps in `index` order).
    pub steps: RecordBatch,
    /// Served step columns, in table order (index columns, features, `task`).
    pub columns: Vec<Column>,
    /// Cameras, in feature order.
    pub cameras: Vec<Camera>,
    /// Episodes, in row order.
    pub episodes: Vec<EpisodeSpan>,
    /// Episode (position in `episodes`) of each step row.
    pub row_episode: Vec<u32>,
    /// The packet index.
    pub packets: PacketIndex,
    /// Codec facts per stream id.
    pub streams: HashMap<u32, StreamConfig>,
    packets_table: lance::Dataset,
    /// Identifies this dataset version's frames in a frame cache shared by several loaders.
    pub cache_id: u64,
    /// The decoded-frame table, when `lake cache` made one, and how it stores frames.
    frames_table: std::sync::RwLock<Option<FrameTable>>,
    /// Where the frame table is (or would be).
    frames_uri: String,
    /// The inode and modification time of a frame table directory that could not be opened (it
    /// is not tried again, nor warned about again, until it changes).
    frames_unreadable: tokio::sync::Mutex<Option<(u64, std::time::SystemTime)>>,
    /// When a frame table on an object store was last looked for.
    frames_looked: tokio::sync::Mutex<Option<std::time::Instant>>,
    /// Frames the frame table could not give since the log last said so, and when it did.
    frames_failed: std::sync::Mutex<(u64, Option<std::time::Instant>)>,
    /// The frame table's open data files.
    frame_files: crate::frames::FrameFiles,
    /// The size every camera's frames are read at, from a resized frame table (`None`: as
    /// recorded).
    frame_size: Option<lake_schemas::FrameSize>,
    /// Whether frames may come from the frame table (it stores RGB; YUV planes are decoded).
    frame_table_allowed: bool,
    /// How camera frames travel: decoded here (RGB or YUV planes), or as packets.
    pub frame_format: FrameFormat,
    /// The training proxy the frames come from (a request for `proxy`), with how far each
    /// camera's frames are from the recorded ones; `None`: the recorded frames.
    pub proxy: Option<Arc<crate::proxy_info::ProxyInfo>>,
    /// How samples present the features (a view's mapping; empty for a plain dataset): the
    /// columns and cameras above are already mapped, and statistics read elsewhere are mapped
    /// with it.
    pub features: FeatureMap,
}

impl LoaderDataset {
    /// Opens `spec` (`name` or `name@version`) in `lake`.
    ///
    /// # Errors
    /// When the dataset does not exist or its tables are not shaped as ingest writes them.
    pub async fn open(lake: &Lake, spec: &str) -> Result<Arc<Self>> {
        Self::open_as(lake, spec, FrameSpec::default()).await
    }

    /// Opens `spec` with its camera frames served as `frames` says: at a size read from the
    /// version's frame table of that size (`lake cache NAME --size WxH`), as YUV planes where a
    /// camera's frames allow it. The default is [`open`](Self::open).
    ///
    /// # Errors
    /// As [`open`](Self::open), when there is no frame table of that size, and for YUV planes at
    /// another size (frame tables hold RGB).
    pub async fn open_as(lake: &Lake, spec: &str, frames: FrameSpec) -> Result<Arc<Self>> {
        Self::open_mapped(lake, spec, frames, &FeatureMap::default()).await
    }

    /// [`open_as`](Self::open_as), its features presented as a view's mapping says (renamed,
    /// cut to some dimensions, left out).
    ///
    /// # Errors
    /// As [`open_as`](Self::open_as), and when the mapping names a feature the dataset lacks,
    /// an index column, a dimension past a feature's end, or gives two features one key.
    pub async fn open_mapped(lake: &Lake, spec: &str, frames: FrameSpec, features: &FeatureMap) -> Result<Arc<Self>> {
        let FrameSpec { size: frame_size, format, proxy } = frames;
        let record = lake.resolve(spec).await?;
        let label = format!("{}@{}", record.name, record.version);
        let bad = |m: String| Error::layout(&label, m);
        if let (FrameFormat::Yuv420p | FrameFormat::Packets, Some(size)) = (format, frame_size) {
            return Err(Error::request(format!(
                "{label}: frames at {size} come from a frame table, which stores RGB; ask for rgb24 frames at {size}, or for {format} \
                 frames without a frame size (they come from the packets, at the size each camera recorded)"
            )));
        }

        let batches = lake_store::read_table(lake, &record, tables::STEPS).await?;
        let schema = batches.first().map(RecordBatch::schema).ok_or_else(|| bad("the steps table is empty".into()))?;
        let steps = concat_batches(&schema, &batches)?;
        drop(batches);

        let mut columns = Vec::new();
        let mut cameras = Vec::new();
        for (position, field) in schema.fields().iter().enumerate() {
            if field.name() == PACKET_ROW {
                let rows = steps.column(position).as_struct();
                for (camera_field, array) in rows.fields().iter().zip(rows.columns()) {
                    let packet_rows = array.as_primitive::<UInt64Type>().clone();
                    cameras.push(Camera {
                        key: lerobot_name(camera_field).to_string(),
                        packet_rows,
                        height: 0,
                        width: 0,
                        video: true,
                        yuv: None,
                        proxy: None,
                    });
                }
                continue;
            }
            let shape = match field.metadata().get(SHAPE_METADATA) {
                Some(s) => serde_json::from_str(s).map_err(|e| bad(format!("column {}: bad shape metadata: {e}", field.name())))?,
                None => vec![],
            };
            columns.push(Column { key: lerobot_name(field).to_string(), position, shape });
        }
        if !columns.iter().any(|c| c.key == TASK) {
            return Err(bad("the steps table has no task column".into()));
        }

        let (episodes, row_episode) = episode_spans(&label, &steps, lake, &record).await?;
        let mut streams = read_streams(lake, &record, &label).await?;
        if proxy && let Some(size) = frame_size {
            return Err(Error::request(format!(
                "{label}: frames at {size} come from a frame table of the recorded frames; a proxy's frames come at the recorded size"
            )));
        }
        let proxy_table = match proxy {
            true => Some(open_proxy(lake, &record, &label).await?),
            false => None,
        };
        if let Some((_, info)) = &proxy_table {
            for config in &info.streams {
                streams.insert(config.stream, config.clone());
            }
        }
        // Cameras the view's mapping leaves out are never read.
        let kept = |c: &Camera| features.key(&c.key).is_some();
        let frameless: Vec<&str> =
            cameras.iter().filter(|c| kept(c) && !streams.values().any(|s| s.camera == c.key)).map(|c| c.key.as_str()).collect();
        if !frameless.is_empty() {
            return Err(Error::request(format!(
                "{label}: camera{s} {keys} {has} no frames: every one of {their} files was missing at ingest, and --missing-video \
                 keep-rows kept the rows only. Samples carry every camera: ingest the source again with --drop-missing-cameras, or \
                 leave {them} out with a view: lake view create {name}-without-video \"SELECT dataset, episode_index FROM episodes \
                 WHERE dataset = '{name}'\" --drop {drops}",
                s = if frameless.len() == 1 { "" } else { "s" },
                keys = frameless.join(", "),
                has = if frameless.len() == 1 { "has" } else { "have" },
                their = if frameless.len() == 1 { "its" } else { "their" },
                them = if frameless.len() == 1 { "it" } else { "them" },
                name = record.name,
                drops = frameless.join(" --drop "),
            )));
        }
        for camera in cameras.iter_mut().filter(|c| kept(c)) {
            camera.video = streams.values().any(|s| s.camera == camera.key && s.kind == "video");
            let mut sizes = streams.values().filter(|s| s.camera == camera.key).map(|s| (s.params.height, s.params.width));
            let (h, w) = sizes.next().ok_or_else(|| bad(format!("camera {} has no stream", camera.key)))?;
            if sizes.any(|other| other != (h, w)) {
                return Err(bad(format!("camera {}: its files have different frame sizes; samples cannot stack them", camera.key)));
            }
            (camera.height, camera.width) = (h, w);
            if matches!(format, FrameFormat::Yuv420p | FrameFormat::Packets) && camera.video {
                // Planes only where every file of the camera converts the same way.
                let mut conversions = streams
                    .values()
                    .filter(|s| s.camera == camera.key)
                    .map(|s| YuvToRgb::for_stream(s.params.pix_fmt.as_deref(), s.params.color_space.as_deref(), w, h));
                let first = conversions.next().flatten();
                if conversions.all(|c| c == first) {
                    camera.yuv = first;
                }
            }
            if let Some(yuv) = camera.yuv {
                for s in streams.values_mut().filter(|s| s.camera == camera.key) {
                    s.yuv = Some(yuv);
                }
            }
        }
        let (packets_table, packets, proxy) = match proxy_table {
            Some((table, info)) => {
                let (index, source_rows) = read_proxy_index(lake, &record).await?;
                remap_to_proxy(&label, &mut cameras, &source_rows)?;
                for camera in &mut cameras {
                    camera.proxy = Some(crate::proxy_info::ProxyLabel::of(&info, &label, &camera.key).to_json());
                }
                (table, index, Some(Arc::new(info)))
            }
            None => {
                let table = lake_store::open_table(lake, &record, tables::PACKETS).await?;
                let checksums = table.schema().field(tables::PACKET_CHECKSUM).is_some();
                let index = read_packet_index(lake, &record, tables::PACKETS, checksums).await?;
                (table, index, None)
            }
        };
        let frames_uri = lake.uri(&record.tables.path(&crate::frames::frame_table_name(frame_size)));
        let frame_table_allowed = format == FrameFormat::Rgb24 && proxy.is_none();
        let frames_table = match frame_table_allowed {
            true => open_frame_table(&frames_uri, packets.stream.len(), &label).await,
            false => None,
        };
        let frames_unreadable = if frames_table.is_none() { modified(&frames_uri) } else { None };
        if let Some(size) = frame_size {
            if frames_table.is_none() {
                let recorded = !cameras.is_empty() && cameras.iter().all(|c| (c.height, c.width) == (size.height, size.width));
                let hint = if recorded {
                    format!("every camera is recorded at {size}: leave out the frame size to read the frames as recorded")
                } else {
                    format!("make one with `lake cache {label} --size {size}`")
                };
                return Err(Error::request(format!("{label}: no frame table of {size} frames: {hint}")));
            }
            for camera in &mut cameras {
                (camera.height, camera.width) = (size.height, size.width);
            }
        }
        let cache_id = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            (packets_table.uri(), &label, frame_size, format, proxy.is_some()).hash(&mut h);
            h.finish()
        };
        let mut ds = Self {
            label,
            record,
            steps,
            columns,
            cameras,
            episodes,
            row_episode,
            packets,
            streams,
            packets_table,
            cache_id,
            frames_table: std::sync::RwLock::new(frames_table),
            frames_uri,
            frames_unreadable: tokio::sync::Mutex::new(frames_unreadable),
            frames_looked: tokio::sync::Mutex::new(Some(std::time::Instant::now())),
            frames_failed: std::sync::Mutex::new((0, None)),
            frame_files: crate::frames::FrameFiles::default(),
            frame_size,
            frame_table_allowed,
            frame_format: format,
            proxy,
            features: FeatureMap::default(),
        };
        ds.map_features(features)?;
        Ok(Arc::new(ds))
    }

    /// Presents the features as `map` says: columns and cameras renamed or left out, and
    /// one-dimensional columns cut to the kept dimensions (the steps batch holds the cut column).
    fn map_features(&mut self, map: &FeatureMap) -> Result<()> {
        if map.is_empty() {
            return Ok(());
        }
        let label = self.label.clone();
        let refuse = |m: String| Error::request(format!("{label}: the view's feature mapping {m}"));
        let keys = self.keys();
        for key in map.rename.keys().chain(&map.drop) {
            if !keys.contains(key) {
                return Err(refuse(format!("names `{key}`, which this dataset lacks (it has {})", keys.join(", "))));
            }
            if tables::INDEX_COLUMNS.contains(&key.as_str()) || key == TASK {
                return Err(refuse(format!("names `{key}`, an index column every sample carries as it is")));
            }
        }
        self.columns.retain(|c| map.key(&c.key).is_some());
        self.cameras.retain(|c| map.key(&c.key).is_some());
        for key in self.columns.iter_mut().map(|c| &mut c.key).chain(self.cameras.iter_mut().map(|c| &mut c.key)) {
            *key = map.key(key).unwrap_or(key).to_string();
        }
        let mut seen = std::collections::HashSet::new();
        if let Some(twice) = self.keys().into_iter().find(|k| !seen.insert(k.clone())) {
            return Err(refuse(format!("gives two features the key `{twice}`")));
        }
        for (key, dims) in &map.dims {
            let Some(column) = self.columns.iter_mut().find(|c| &c.key == key) else {
                return Err(refuse(format!("cuts `{key}`, which samples of this dataset do not carry")));
            };
            let array = self.steps.column(column.position).clone();
            let (Some(list), [width]) = (array.as_fixed_size_list_opt(), column.shape.as_slice()) else {
                return Err(refuse(format!("cuts `{key}`, which is not a one-dimensional feature (shape {:?})", column.shape)));
            };
            if let Some(past) = dims.iter().find(|&&d| d >= *width) {
                return Err(refuse(format!("keeps dimension {past} of `{key}`, which has {width}")));
            }
            if dims.is_empty() {
                return Err(refuse(format!("keeps no dimension of `{key}`")));
            }
            let width = *width as u64;
            let at: UInt64Array = (0..list.len() as u64).flat_map(|row| dims.iter().map(move |&d| row * width + d as u64)).collect();
            let values = take(list.values(), &at, None)?;
            let DataType::FixedSizeList(item, _) = list.data_type() else { unreachable!("a fixed-size list") };
            let cut = FixedSizeListArray::try_new(item.clone(), dims.len() as i32, values, list.nulls().cloned())?;
            let schema = self.steps.schema();
            let mut fields: Vec<Field> = schema.fields().iter().map(|f| f.as_ref().clone()).collect();
            let field = &fields[column.position];
            fields[column.position] =
                Field::new(field.name(), cut.data_type().clone(), field.is_nullable()).with_metadata(field.metadata().clone());
            let mut arrays = self.steps.columns().to_vec();
            arrays[column.position] = Arc::new(cut);
            self.steps = RecordBatch::try_new(Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone())), arrays)?;
            column.shape = vec![dims.len()];
        }
        self.features = map.clone();
        Ok(())
    }

    /// Frames per second.
    pub fn fps(&self) -> u32 {
        self.record.fps
    }

    /// Every served key (index columns, features, task, cameras).
    pub fn keys(&self) -> Vec<String> {
        self.columns.iter().map(|c| c.key.clone()).chain(self.cameras.iter().map(|c| c.key.clone())).collect()
    }

    /// The steps row of LeRobot's absolute `index`.
    ///
    /// # Errors
    /// When no ingested episode holds that index.
    pub fn row_of_index(&self, index: i64) -> Result<u64> {
        let e = self.episodes.partition_point(|s| s.from_index <= index);
        let span = e.checked_sub(1).map(|e| self.episodes[e]).filter(|s| index < s.from_index + s.len as i64);
        span.map(|s| s.first_row + (index - s.from_index) as u64).ok_or_else(|| {
            // The ingested indices as ranges (skipped episodes leave gaps), the first few.
            let mut ranges: Vec<(i64, i64)> = Vec::new();
            for s in &self.episodes {
                match ranges.last_mut() {
                    Some(last) if last.1 == s.from_index => last.1 += s.len as i64,
                    _ => ranges.push((s.from_index, s.from_index + s.len as i64)),
                }
            }
            let shown: Vec<String> = ranges.iter().take(8).map(|(a, b)| format!("{a} to {}", b - 1)).collect();
            let more = if ranges.len() > 8 { format!(" and {} more", ranges.len() - 8) } else { String::new() };
            Error::request(format!("{}: index {index} is not in any ingested episode (indices {}{more})", self.label, shown.join(", ")))
        })
    }

    /// The span of the episode holding step `row`.
    pub fn episode_of_row(&self, row: u64) -> &EpisodeSpan {
        &self.episodes[self.row_episode[row as usize] as usize]
    }

    /// Reads the bytes of packet rows (sorted, distinct), in that order.
    ///
    /// # Errors
    /// When Lance cannot read them.
    pub async fn packet_bytes(&self, rows: &[u64]) -> Result<Vec<bytes::Bytes>> {
        let bytes = take_binary(&self.label, &self.packets_table, tables::PACKETS, "data", rows).await?;
        if let Some(sums) = &self.packets.checksum {
            for (&row, data) in rows.iter().zip(&bytes) {
                let (stored, read) = (sums[row as usize], crc32fast::hash(data));
                if stored != read {
                    return Err(self.damaged_packet(row, stored, read));
                }
            }
        }
        Ok(bytes)
    }

    /// The error of a packet whose bytes are not those ingest stored.
    fn damaged_packet(&self, row: u64, stored: u32, read: u32) -> Error {
        self.decode_error(
            row,
            format!(
                "the packet's bytes are not those ingest stored (CRC-32 {read:08x}, stored {stored:08x}): the lake's packets \
                 file is damaged; ingest the dataset again"
            ),
        )
    }

    /// The error of packet row `row`, naming its camera and the episode and frame of the first
    /// step that shows it (-1 where none does).
    pub(crate) fn decode_error(&self, row: u64, message: String) -> Error {
        let (episode, frame) = self.step_showing(row).map_or((-1, -1), |step| self.episode_and_frame(step));
        let stream = self.packets.stream.get(row as usize).and_then(|s| self.streams.get(s));
        let camera = stream.map_or_else(String::new, |s| s.camera.clone());
        Error::Decode { dataset: self.label.clone(), camera, episode, frame, row, message }
    }

    /// The episode and frame index of step row `step`, for messages.
    pub fn episode_and_frame(&self, step: usize) -> (i64, i64) {
        let int = |name: &str| {
            self.steps
                .column_by_name(name)
                .and_then(|c| cast(c, &DataType::Int64).ok())
                .map_or(-1, |c| c.as_primitive::<Int64Type>().value(step))
        };
        (int("episode_index"), int("frame_index"))
    }

    /// The first step row that shows packet row `row` (its camera's frame), if one does.
    pub fn step_showing(&self, row: u64) -> Option<usize> {
        let camera = &self.streams.get(self.packets.stream.get(row as usize)?)?.camera;
        let rows = &self.cameras.iter().find(|c| &c.key == camera)?.packet_rows;
        rows.iter().position(|r| r == Some(row))
    }

    /// Whether a decoded-frame table exists for this version.
    pub fn has_frame_table(&self) -> bool {
        self.frame_table().is_some()
    }

    /// Picks up a frame table `lake cache` made after this dataset was opened, so that the
    /// streams of a running server read it from their next batch on instead of decoding; true
    /// when there is one. While there is none this costs one `stat`.
    pub async fn discover_frame_table(&self) -> bool {
        if self.has_frame_table() {
            return true;
        }
        if !self.frame_table_allowed {
            return false;
        }
        if lake_store::remote::is_remote(&self.frames_uri) {
            return self.discover_remote_frame_table().await;
        }
        let Some(changed) = modified(&self.frames_uri) else { return false };
        // One attempt at a time: the others wait for its outcome rather than decode meanwhile.
        let mut unreadable = self.frames_unreadable.lock().await;
        if self.has_frame_table() {
            return true;
        }
        if *unreadable == Some(changed) {
            return false;
        }
        match open_frame_table(&self.frames_uri, self.packets.stream.len(), &self.label).await {
            Some(table) => {
                tracing::info!(dataset = %self.label, "reading the frame table `lake cache` made since the dataset was opened");
                *self.frames_table.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(table);
                true
            }
            None => {
                *unreadable = Some(changed);
                false
            }
        }
    }

    /// [`discover_frame_table`](Self::discover_frame_table) on an object store, where a look
    /// costs a request: at most one every [`REMOTE_LOOK`].
    async fn discover_remote_frame_table(&self) -> bool {
        let mut looked = self.frames_looked.lock().await;
        if self.has_frame_table() {
            return true;
        }
        if looked.is_some_and(|at| at.elapsed() < REMOTE_LOOK) {
            return false;
        }
        *looked = Some(std::time::Instant::now());
        match open_frame_table(&self.frames_uri, self.packets.stream.len(), &self.label).await {
            Some(table) => {
                tracing::info!(dataset = %self.label, "reading the frame table `lake cache` made since the dataset was opened");
                *self.frames_table.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(table);
                true
            }
            None => false,
        }
    }

    fn frame_table(&self) -> Option<FrameTable> {
        self.frames_table.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// After a read of `stale` found one of its files gone: whether `lake cache` has replaced
    /// the table since this dataset opened it (then the new one is read from now on, the old
    /// one's open files let go).
    async fn reopen_frame_table(&self, stale: &lance::Dataset) -> bool {
        let files = |t: &lance::Dataset| -> Vec<String> {
            t.get_fragments().iter().flat_map(|f| f.metadata().files.iter().map(|d| d.path.clone()).collect::<Vec<_>>()).collect()
        };
        let Some(fresh) = open_frame_table(&self.frames_uri, self.packets.stream.len(), &self.label).await else { return false };
        if files(&fresh.table) == files(stale) {
            return false;
        }
        tracing::info!(dataset = %self.label, "reading the frame table `lake cache` wrote since it was opened");
        *self.frames_table.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(fresh);
        self.frame_files.clear();
        true
    }

    /// Reads the stored frames of packet rows (sorted, distinct), in that order, or `None` without
    /// a frame table.
    ///
    /// # Errors
    /// When Lance cannot read them.
    pub async fn stored_frames(&self, rows: &[u64]) -> Result<Option<StoredFrames>> {
        let mut reopened = false;
        loop {
            let Some(found) = self.frame_table() else { return Ok(None) };
            let (table, storage) = (&found.table, found.storage);
            let checksums = match found.checksums().await {
                Ok(sums) => sums.map(|sums| rows.iter().map(|&r| sums[r as usize]).collect()),
                Err(e) if e.is_not_found() && !reopened && self.reopen_frame_table(table).await => {
                    reopened = true;
                    continue;
                }
                Err(e) => return Err(self.frame_table_error(table, e)),
            };
            if !crate::frames::is_blob_table(table) {
                let frames = take_binary(&self.label, table, crate::frames::FRAMES, storage.column(), rows).await?;
                return Ok(Some(StoredFrames { storage, frames, checksums }));
            }
            match crate::frames::read_frames(table, storage.column(), rows).await {
                Ok(frames) => return Ok(Some(StoredFrames { storage, frames, checksums })),
                Err(e) if e.is_not_found() && !reopened && self.reopen_frame_table(table).await => reopened = true,
                Err(e) => return Err(self.frame_table_error(table, e)),
            }
        }
    }

    /// Where the stored frames of packet rows (sorted, distinct) lie, in that order, for reading
    /// them straight into a batch: `None` unless the frame table stores plain frames in a blob
    /// column on the local filesystem (then [`stored_frames`](Self::stored_frames) reads them).
    ///
    /// # Errors
    /// When Lance cannot locate them or a file cannot be opened.
    pub async fn locate_stored_frames(&self, rows: &[u64]) -> Result<Option<Vec<crate::frames::FrameExtent>>> {
        let mut reopened = false;
        loop {
            let Some(found) = self.frame_table() else { return Ok(None) };
            let table = &found.table;
            if found.storage != FrameStorage::Plain || !crate::frames::is_blob_table(table) {
                return Ok(None);
            }
            let located = async {
                let checksums = found.checksums().await?;
                crate::frames::locate_frames(table, found.storage.column(), rows, checksums.as_deref(), &self.frame_files).await
            };
            match located.await {
                Ok(extents) => return Ok(extents),
                Err(e) if e.is_not_found() && !reopened && self.reopen_frame_table(table).await => reopened = true,
                Err(e) => return Err(self.frame_table_error(table, e)),
            }
        }
    }

    /// Counts `frames` that the frame table could not give. When the log is due to say so (the
    /// first time, then at most once every `every`), the frames counted since it last did.
    pub(crate) fn frame_table_failed(&self, frames: u64, every: std::time::Duration) -> Option<u64> {
        let mut failed = self.frames_failed.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (count, said) = &mut *failed;
        *count += frames;
        if said.is_some_and(|at| at.elapsed() < every) {
            return None;
        }
        *said = Some(std::time::Instant::now());
        Some(std::mem::take(count))
    }

    /// The error of a stored frame whose bytes are not those `lake cache` wrote.
    pub(crate) fn damaged_frame(&self, row: u64, damage: crate::frames::Mismatch) -> Error {
        self.decode_error(
            row,
            format!(
                "the frame table's frame is not the one `lake cache` stored (CRC-32 {:08x}, stored {:08x}): the frame table is \
                 damaged; run `{}` again",
                damage.read,
                damage.stored,
                self.cache_command()
            ),
        )
    }

    /// A failed frame table read: a missing data file is named, with what to do about it.
    fn frame_table_error(&self, table: &lance::Dataset, source: lance::Error) -> Error {
        if let Some(why) = lake_store::machine_error(&source) {
            return Error::Machine { dataset: self.label.clone(), what: "the frame table".into(), why };
        }
        match source {
            lance::Error::NotFound { uri, .. } => {
                // Lance names local files by their path without the leading `/`.
                let path = if table.uri().starts_with('/') && !uri.starts_with('/') { format!("/{uri}") } else { uri };
                Error::layout(&self.label, format!("the frame table's file {path} is missing; run `{}` again", self.cache_command()))
            }
            lance::Error::IO { .. } | lance::Error::CorruptFile { .. } => Error::layout(
                &self.label,
                format!(
                    "the frame table cannot be read ({}): a file of it is damaged or cut short; run `{}` again",
                    lake_store::lance_message(&source),
                    self.cache_command()
                ),
            ),
            source => Error::Lance { dataset: self.label.clone(), table: crate::frames::FRAMES.into(), error: Box::new(source) },
        }
    }

    /// The command that (re)writes the frame table this dataset reads.
    pub fn cache_command(&self) -> String {
        match self.frame_size {
            Some(size) => format!("lake cache {} --size {size}", self.record.name),
            None => format!("lake cache {}", self.record.name),
        }
    }

    /// The size every camera's frames are read at, when they come from a resized frame table.
    pub fn frame_size(&self) -> Option<lake_schemas::FrameSize> {
        self.frame_size
    }

    /// Bytes of the frame of packet row `row` as samples carry it (RGB, or YUV planes).
    pub fn frame_bytes_of_row(&self, row: u64) -> usize {
        if let Some(size) = self.frame_size {
            return size.width as usize * size.height as usize * 3;
        }
        self.streams.get(&self.packets.stream[row as usize]).map_or(0, |s| match s.yuv {
            Some(_) => yuv420p_bytes(s.params.width, s.params.height),
            None => s.params.width as usize * s.params.height as usize * 3,
        })
    }
}

/// How often a dataset on an object store looks for a frame table `lake cache` made since it
/// was opened (a look is a request to the store).
const REMOTE_LOOK: std::time::Duration = std::time::Duration::from_secs(30);

/// Which directory is at `uri` (a local path), if one is, and when it last changed: a table
/// published in its place (a new directory) differs even within the clock's resolution.
fn modified(uri: &str) -> Option<(u64, std::time::SystemTime)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(uri).ok().filter(std::fs::Metadata::is_dir)?;
    Some((m.ino(), m.modified().ok()?))
}

/// Frames read from a frame table: their stored bytes and the checksums stored with them.
#[derive(Debug)]
pub struct StoredFrames {
    /// How the frames are stored.
    pub storage: FrameStorage,
    /// Each frame's stored bytes.
    pub frames: Vec<bytes::Bytes>,
    /// The CRC-32 stored with each frame (`None`: the table has no checksums).
    pub checksums: Option<Vec<u32>>,
}

/// A frame table, how it stores frames, and the checksum of each row's stored bytes, read when
/// the table is first read from (`None`: a table written before rows had checksums).
#[derive(Debug, Clone)]
struct FrameTable {
    table: Arc<lance::Dataset>,
    storage: FrameStorage,
    checksums: Arc<tokio::sync::OnceCell<Option<Arc<[u32]>>>>,
}

impl FrameTable {
    /// The checksum of each row's stored frame, by row.
    ///
    /// # Errors
    /// When Lance cannot read them.
    async fn checksums(&self) -> lance::Result<Option<Arc<[u32]>>> {
        let read = || async { Ok::<_, lance::Error>(crate::frames::read_checksums(&self.table).await?.map(Arc::from)) };
        self.checksums.get_or_try_init(read).await.cloned()
    }
}

/// The frame table at `uri`, when there is one holding a frame for each of `rows` packet rows
/// (an unreadable or incomplete one is ignored, with a warning).
async fn open_frame_table(uri: &str, rows: usize, label: &str) -> Option<FrameTable> {
    let opened = if lake_store::remote::is_remote(uri) {
        // On an object store a table is there once it has a committed version.
        match lake_store::open_lance(uri).await {
            Err(lance::Error::DatasetNotFound { .. }) => return None,
            opened => opened.ok(),
        }
    } else if std::path::Path::new(uri).is_dir() {
        lake_store::open_lance(uri).await.ok()
    } else {
        return None;
    };
    let storage = opened.as_ref().and_then(|t| t.schema().fields.get(1).and_then(|f| FrameStorage::of_column(&f.name)));
    match (opened, storage) {
        (Some(table), Some(storage)) if table.count_rows(None).await.ok() == Some(rows) => {
            Some(FrameTable { table: Arc::new(table), storage, checksums: Arc::default() })
        }
        _ => {
            tracing::warn!(dataset = %label, "ignoring an unreadable or incomplete frame table at {uri}; run `lake cache` again");
            None
        }
    }
}

/// An Arrow buffer as the owner of [`bytes::Bytes`].
struct OwnedBuffer(arrow::buffer::Buffer);

impl AsRef<[u8]> for OwnedBuffer {
    fn as_ref(&self) -> &[u8] {
        self.0.as_slice()
    }
}

/// A binary column of `rows` (sorted, distinct) of a Lance table, in that order.
/// Reads `column` (large binary) of `rows` (sorted, distinct) of a table, in that order, as
/// slices of what Lance read.
///
/// Each fragment is read by its own take, all at once: a take over the whole table would copy
/// every fragment's values once more to join them into one array, which for frames is most of
/// the cost of a read.
async fn take_binary(label: &str, table: &lance::Dataset, name: &str, column: &str, rows: &[u64]) -> Result<Vec<bytes::Bytes>> {
    let lance_err = |source| Error::Lance { dataset: label.to_string(), table: name.into(), error: Box::new(source) };
    let projection = table.schema().project(&[column]).map_err(lance_err)?;
    let fragments = table.get_fragments();
    // With deletions (lake never deletes from these tables) a fragment's offsets are not its
    // rows: let Lance resolve them.
    let sizes: Option<Vec<u64>> =
        fragments.iter().map(|f| f.metadata().physical_rows.filter(|_| f.metadata().deletion_file.is_none()).map(|n| n as u64)).collect();
    let batches = match sizes {
        Some(sizes) => {
            let mut takes = Vec::new();
            let (mut first, mut rest) = (0u64, rows);
            for (fragment, size) in fragments.iter().zip(sizes) {
                let end = first + size;
                let n = rest.partition_point(|&r| r < end);
                if n > 0 {
                    let offsets: Vec<u32> = rest[..n].iter().map(|&r| (r - first) as u32).collect();
                    let projection = &projection;
                    takes.push(async move { fragment.take(&offsets, projection).await });
                }
                (first, rest) = (end, &rest[n..]);
            }
            if !rest.is_empty() {
                return Err(Error::layout(label, format!("{name} has {first} rows; asked for row {}", rest[0])));
            }
            lake_store::read_lance(table.uri(), futures::future::try_join_all(takes)).await.map_err(lance_err)?
        }
        None => vec![lake_store::read_lance(table.uri(), table.take(rows, projection)).await.map_err(lance_err)?],
    };
    let mut out = Vec::with_capacity(rows.len());
    for batch in &batches {
        let data = batch.column(0).as_binary::<i64>();
        // The values as they came from Lance, shared (not copied) by the returned slices.
        let buffer = bytes::Bytes::from_owner(OwnedBuffer(data.values().clone()));
        let offsets = data.value_offsets();
        out.extend((0..data.len()).map(|i| buffer.slice(offsets[i] as usize..offsets[i + 1] as usize)));
    }
    if out.len() != rows.len() {
        return Err(Error::layout(label, format!("asked {name} for {} rows, got {}", rows.len(), out.len())));
    }
    Ok(out)
}

async fn episode_spans(label: &str, steps: &RecordBatch, lake: &Lake, record: &CommitRecord) -> Result<(Vec<EpisodeSpan>, Vec<u32>)> {
    let bad = |m: String| Error::layout(label, m);
    let int = |name: &str| -> Result<Vec<i64>> {
        let col = steps.column_by_name(name).ok_or_else(|| bad(format!("the steps table has no {name} column")))?;
        Ok(cast(col, &DataType::Int64)?.as_primitive::<Int64Type>().values().to_vec())
    };
    let (episode, index) = (int("episode_index")?, int("index")?);
    let mut spans: Vec<EpisodeSpan> = Vec::new();
    let mut row_episode = Vec::with_capacity(episode.len());
    for (row, (&e, &i)) in episode.iter().zip(&index).enumerate() {
        match spans.last_mut() {
            Some(s) if s.episode_index == e => {
                if i != s.from_index + s.len as i64 {
                    return Err(bad(format!("episode {e}: step row {row} has index {i}, expected {}", s.from_index + s.len as i64)));
                }
                s.len += 1;
            }
            _ => {
                if spans.iter().any(|s| s.episode_index == e) {
                    return Err(bad(format!("episode {e}: its steps are not contiguous")));
                }
                spans.push(EpisodeSpan { episode_index: e, first_row: row as u64, len: 1, from_index: i });
            }
        }
        row_episode.push((spans.len() - 1) as u32);
    }
    // The episodes table must agree: LeRobot clamps windows to dataset_from_index..to_index.
    let batches =
        lake_store::read_columns(lake, record, tables::EPISODES, &["episode_index", "dataset_from_index", "dataset_to_index"]).await?;
    let mut declared = HashMap::new();
    for b in &batches {
        let (e, from, to) =
            (b.column(0).as_primitive::<Int64Type>(), b.column(1).as_primitive::<Int64Type>(), b.column(2).as_primitive::<Int64Type>());
        for r in 0..b.num_rows() {
            declared.insert(e.value(r), (from.value(r), to.value(r)));
        }
    }
    for s in &spans {
        let range = declared.get(&s.episode_index).copied();
        if range != Some((s.from_index, s.from_index + s.len as i64)) {
            return Err(bad(format!(
                "episode {}: steps hold indices {}..{}, the episodes table says {range:?}",
                s.episode_index,
                s.from_index,
                s.from_index + s.len as i64
            )));
        }
    }
    let mut sorted = spans.clone();
    sorted.sort_by_key(|s| s.from_index);
    if sorted != spans {
        return Err(bad("episodes are not stored in index order".into()));
    }
    Ok((spans, row_episode))
}

async fn read_streams(lake: &Lake, record: &CommitRecord, label: &str) -> Result<HashMap<u32, StreamConfig>> {
    let mut out = HashMap::new();
    for b in lake_store::read_table(lake, record, tables::STREAMS).await? {
        let col = |name: &str| b.column_by_name(name).ok_or_else(|| Error::layout(label, format!("streams table has no {name} column")));
        let text =
            |name: &str| -> Result<Vec<Option<String>>> { Ok(col(name)?.as_string::<i32>().iter().map(|s| s.map(String::from)).collect()) };
        let stream = col("stream")?.as_primitive::<UInt32Type>().clone();
        let (width, height) = (col("width")?.as_primitive::<UInt32Type>().clone(), col("height")?.as_primitive::<UInt32Type>().clone());
        let extradata = col("extradata")?.as_binary::<i32>().clone();
        let (camera, kind, codec, pix_fmt) = (text("camera")?, text("kind")?, text("codec")?, text("pix_fmt")?);
        let (range, space, primaries, trc, chroma) =
            (text("color_range")?, text("color_space")?, text("color_primaries")?, text("color_trc")?, text("chroma_location")?);
        for r in 0..b.num_rows() {
            // A file whose every episode was left out at ingest is never served.
            if kind[r].as_deref() == Some(tables::SKIPPED_STREAM) {
                continue;
            }
            let config = StreamConfig {
                stream: stream.value(r),
                camera: camera[r].clone().unwrap_or_default(),
                kind: kind[r].clone().unwrap_or_default(),
                params: CodecParams {
                    codec: codec[r].clone().unwrap_or_default(),
                    extradata: extradata.is_valid(r).then(|| extradata.value(r).to_vec()),
                    width: width.value(r),
                    height: height.value(r),
                    pix_fmt: pix_fmt[r].clone(),
                    color_range: range[r].clone(),
                    color_space: space[r].clone(),
                    color_primaries: primaries[r].clone(),
                    color_trc: trc[r].clone(),
                    chroma_location: chroma[r].clone(),
                },
                yuv: None,
            };
            out.insert(config.stream, config);
        }
    }
    Ok(out)
}

/// Opens the version's proxy table, with what its metadata says of it.
async fn open_proxy(lake: &Lake, record: &CommitRecord, label: &str) -> Result<(lance::Dataset, crate::proxy_info::ProxyInfo)> {
    if !lake.has_table(&record.tables.dir, tables::PROXY).await? {
        return Err(Error::request(format!(
            "{label} has no training proxy: make one with `lake cache {label} --proxy h264` (or hevc), or ask for the recorded frames"
        )));
    }
    let table = lake_store::open_table(lake, record, tables::PROXY).await?;
    let info = crate::proxy_info::ProxyInfo::of_table(&table, label)?;
    Ok((table, info))
}

/// The proxy's index, and the `packets` row each of its rows re-encodes.
async fn read_proxy_index(lake: &Lake, record: &CommitRecord) -> Result<(PacketIndex, Vec<u64>)> {
    let index = read_packet_index(lake, record, tables::PROXY, true).await?;
    let mut source_rows = Vec::with_capacity(index.stream.len());
    for b in lake_store::read_columns(lake, record, tables::PROXY, &["source_row"]).await? {
        source_rows.extend_from_slice(b.column(0).as_primitive::<UInt64Type>().values());
    }
    Ok((index, source_rows))
}

/// Points every camera's steps at the proxy rows that re-encode their recorded frames.
fn remap_to_proxy(label: &str, cameras: &mut [Camera], source_rows: &[u64]) -> Result<()> {
    let proxy_row: HashMap<u64, u64> = source_rows.iter().enumerate().map(|(row, &source)| (source, row as u64)).collect();
    for camera in cameras {
        let mut rows = arrow::array::UInt64Builder::with_capacity(camera.packet_rows.len());
        for row in camera.packet_rows.iter() {
            match row.map(|r| proxy_row.get(&r)) {
                None => rows.append_null(),
                Some(Some(&at)) => rows.append_value(at),
                Some(None) => {
                    return Err(Error::layout(
                        label,
                        format!("the proxy has no frame of camera {} that a step shows: make it again with `lake cache`", camera.key),
                    ));
                }
            }
        }
        camera.packet_rows = rows.finish();
    }
    Ok(())
}

/// The packets' (or the proxy's) index columns, with their checksums where the table has them.
async fn read_packet_index(lake: &Lake, record: &CommitRecord, table: &str, checksums: bool) -> Result<PacketIndex> {
    let mut out = PacketIndex::default();
    let mut columns = vec!["stream", "pts", "dts", "keyframe_offset", "container_keyframe"];
    if checksums {
        columns.push(tables::PACKET_CHECKSUM);
        out.checksum = Some(Vec::new());
    }
    for b in lake_store::read_columns(lake, record, table, &columns).await? {
        out.stream.extend_from_slice(b.column(0).as_primitive::<UInt32Type>().values());
        out.pts.extend_from_slice(b.column(1).as_primitive::<Int64Type>().values());
        out.dts.extend_from_slice(b.column(2).as_primitive::<Int64Type>().values());
        out.keyframe_offset.extend_from_slice(b.column(3).as_primitive::<UInt32Type>().values());
        out.container_keyframe.extend(b.column(4).as_boolean().values().iter());
        if let Some(sums) = out.checksum.as_mut() {
            sums.extend_from_slice(b.column(5).as_primitive::<UInt32Type>().values());
        }
    }
    Ok(out)
}
