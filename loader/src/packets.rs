//! Packet batches (`frame_format: packets`): the compressed GOPs a batch's frames come from,
//! for the consumer to decode, and [`PacketBatchDecoder`], which decodes them into the frames the
//! other formats carry.
//!
//! In a packet batch a camera column holds, per sample (and window slot), the number of the
//! decoded frame it shows among the batch's frames of that camera, as `uint32`. The column
//! `{camera}_packets` carries the GOPs: each is listed in the row of the first sample that
//! shows one of its frames, and holds its stream (the codec facts a decoder opens from), its
//! packets from the keyframe on in decode order, and the frames wanted from it. A batch's frames
//! of a camera are numbered in the order its GOPs are listed (row by row), and within a GOP in
//! the order of its `frames`. Decoding the packets with the loader's decoders gives the frames
//! of the frame path byte for byte: the same packets, from the same keyframe, through the same
//! FFmpeg calls.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex},
};

use arrow::{
    array::{
        Array, ArrayRef, AsArray, BinaryArray, BooleanArray, FixedSizeListArray, Int64Array, ListArray, RecordBatch, StringArray,
        StructArray, UInt32Array, UInt64Array,
    },
    buffer::OffsetBuffer,
    datatypes::{DataType, Field, Fields, Int64Type, Schema, SchemaRef, UInt32Type, UInt64Type},
};
use lake_codec::{PIXEL_FORMAT, StreamConfig, StreamDecoder, YUV_TO_RGB, YuvToRgb, yuv420p_bytes};
use lake_schemas::{FrameFormat, FrameSize};
use rayon::prelude::*;

use crate::{
    Error, Result,
    dataset::{Camera, LoaderDataset},
    idle::{IDLE_DECODER_BYTES_PER_THREAD, IdlePool},
    samples::{BatchColumn, DTYPE, LAYOUT, SHAPE, SampleBatch, camera_array},
};

/// The suffix of the column that carries a camera's GOPs in a packet batch (`{camera}_packets`).
pub const PACKETS_SUFFIX: &str = "_packets";

/// The type of a `{camera}_packets` column: per sample, the GOPs first shown by it.
pub fn gops_type() -> DataType {
    let packet = Fields::from(vec![
        Field::new("pts", DataType::Int64, false),
        Field::new("dts", DataType::Int64, false),
        Field::new("keyframe", DataType::Boolean, false),
        Field::new("data", DataType::Binary, false),
    ]);
    let frame = Fields::from(vec![
        Field::new("pts", DataType::Int64, false),
        Field::new("row", DataType::UInt64, false),
        Field::new("episode_index", DataType::Int64, false),
        Field::new("frame_index", DataType::Int64, false),
    ]);
    let gop = Fields::from(vec![
        Field::new("dataset", DataType::Utf8, false),
        Field::new("stream", DataType::Utf8, false),
        Field::new("packets", DataType::List(Arc::new(Field::new("item", DataType::Struct(packet), false))), false),
        Field::new("frames", DataType::List(Arc::new(Field::new("item", DataType::Struct(frame), false))), false),
    ]);
    DataType::List(Arc::new(Field::new("item", DataType::Struct(gop), false)))
}

/// The two fields of a camera in a packet batch: the frame number of each slot (`uint32`, one
/// per slot of a `THWC` window) with the metadata of the frames it stands for, and its GOPs.
pub(crate) fn packet_fields(camera: &Camera, slots: Option<usize>, layout: &str) -> [Field; 2] {
    let (h, w) = (camera.height as usize, camera.width as usize);
    let (data_type, shape) = match slots {
        Some(t) => (DataType::FixedSizeList(Arc::new(Field::new("item", DataType::UInt32, false)), t as i32), vec![t]),
        None => (DataType::UInt32, vec![]),
    };
    let mut m = HashMap::from([
        (SHAPE.to_string(), serde_json::to_string(&shape).expect("shape")),
        (DTYPE.to_string(), "uint32".to_string()),
        (LAYOUT.to_string(), layout.to_string()),
        ("frame_shape".to_string(), serde_json::to_string(&[h, w, 3]).expect("shape")),
        (PIXEL_FORMAT.to_string(), FrameFormat::Packets.to_string()),
    ]);
    if let Some(yuv) = camera.yuv {
        // The conversion every file of the camera shares, for a consumer that takes planes.
        m.insert(YUV_TO_RGB.to_string(), serde_json::to_string(&yuv).expect("integers"));
    }
    if let Some(label) = &camera.proxy {
        m.insert(lake_schemas::tables::PROXY_METADATA.to_string(), label.clone());
    }
    [Field::new(&camera.key, data_type, false).with_metadata(m), Field::new(format!("{}{PACKETS_SUFFIX}", camera.key), gops_type(), false)]
}

/// A GOP a batch ships: its stream, the keyframe row it starts from, and the rows wanted from
/// it, ascending.
struct Gop {
    stream: u32,
    start: u64,
    targets: Vec<u64>,
}

/// The camera columns of a packet batch of `samples` samples of `ds`: per camera (`wanted`: the
/// packets row of each sample and slot, sample-major), the frame numbers and the GOPs. The
/// packet bytes are read in one take for all cameras; `shown_by` gives a step showing each
/// row, to name episode and frame. Returns the columns and the packet bytes read.
pub(crate) async fn packet_columns(
    ds: &LoaderDataset,
    wanted: &[Vec<u64>],
    samples: usize,
    shown_by: &HashMap<u64, u64>,
) -> Result<(Vec<[ArrayRef; 2]>, u64)> {
    let index = &ds.packets;
    let gop_of = |row: u64| (index.stream[row as usize], row - u64::from(index.keyframe_offset[row as usize]));
    // Per camera, its GOPs in the order the samples first show them, and the row of each.
    let mut cameras: Vec<(Vec<Gop>, Vec<usize>)> = Vec::with_capacity(wanted.len());
    for rows in wanted {
        let mut targets: BTreeMap<(u32, u64), Vec<u64>> = BTreeMap::new();
        for &row in rows {
            targets.entry(gop_of(row)).or_default().push(row);
        }
        let slots = rows.len() / samples.max(1);
        let mut gops = Vec::with_capacity(targets.len());
        let mut first_shown = Vec::with_capacity(targets.len());
        for (sample, slot_rows) in rows.chunks(slots.max(1)).enumerate() {
            for &row in slot_rows {
                let key = gop_of(row);
                if let Some(mut t) = targets.remove(&key) {
                    t.sort_unstable();
                    t.dedup();
                    gops.push(Gop { stream: key.0, start: key.1, targets: t });
                    first_shown.push(sample);
                }
            }
        }
        cameras.push((gops, first_shown));
    }
    let mut needed: Vec<u64> =
        cameras.iter().flat_map(|(gops, _)| gops.iter().flat_map(|g| g.start..=*g.targets.last().expect("a GOP shows a frame"))).collect();
    needed.sort_unstable();
    needed.dedup();
    let bytes = ds.packet_bytes(&needed).await?;
    let read: u64 = bytes.iter().map(|b| b.len() as u64).sum();
    let data: HashMap<u64, &[u8]> = needed.iter().copied().zip(bytes.iter().map(|b| b.as_ref())).collect();

    let mut configs: HashMap<u32, String> = HashMap::new();
    let mut out = Vec::with_capacity(cameras.len());
    for (rows, (gops, first_shown)) in wanted.iter().zip(&cameras) {
        let mut number: HashMap<u64, u32> = HashMap::new();
        for g in gops {
            for &row in &g.targets {
                let next = number.len() as u32;
                number.insert(row, next);
            }
        }
        let numbers = UInt32Array::from(rows.iter().map(|row| number[row]).collect::<Vec<_>>());
        for g in gops {
            if let std::collections::hash_map::Entry::Vacant(e) = configs.entry(g.stream) {
                let mut config = ds
                    .streams
                    .get(&g.stream)
                    .cloned()
                    .ok_or_else(|| Error::layout(&ds.label, format!("stream {} is not in the streams table", g.stream)))?;
                // The consumer chooses what its decoder puts out.
                config.yuv = None;
                e.insert(serde_json::to_string(&config).expect("plain data"));
            }
        }
        let gop_list = gop_array(ds, gops, first_shown, samples, &data, &configs, shown_by)?;
        out.push([Arc::new(numbers) as ArrayRef, gop_list]);
    }
    Ok((out, read))
}

/// The `{camera}_packets` column of `samples` rows: each GOP in the row of the sample that
/// first shows it.
fn gop_array(
    ds: &LoaderDataset,
    gops: &[Gop],
    first_shown: &[usize],
    samples: usize,
    data: &HashMap<u64, &[u8]>,
    configs: &HashMap<u32, String>,
    shown_by: &HashMap<u64, u64>,
) -> Result<ArrayRef> {
    let DataType::List(gop_item) = gops_type() else { unreachable!("a list") };
    let DataType::Struct(gop_fields) = gop_item.data_type() else { unreachable!("a struct") };
    let list_item = |name: &str| -> (Arc<Field>, Fields) {
        let DataType::List(item) = gop_fields.find(name).expect("field").1.data_type() else { unreachable!("a list") };
        let DataType::Struct(fields) = item.data_type() else { unreachable!("a struct") };
        (item.clone(), fields.clone())
    };
    let index = &ds.packets;
    let packet_rows: Vec<u64> = gops.iter().flat_map(|g| g.start..=*g.targets.last().expect("a GOP shows a frame")).collect();
    let frame_rows: Vec<u64> = gops.iter().flat_map(|g| g.targets.iter().copied()).collect();
    let (packet_item, packet_fields) = list_item("packets");
    let packets = StructArray::try_new(
        packet_fields,
        vec![
            Arc::new(Int64Array::from_iter_values(packet_rows.iter().map(|&r| index.pts[r as usize]))),
            Arc::new(Int64Array::from_iter_values(packet_rows.iter().map(|&r| index.dts[r as usize]))),
            Arc::new(BooleanArray::from(packet_rows.iter().map(|&r| index.container_keyframe[r as usize]).collect::<Vec<_>>())),
            Arc::new(BinaryArray::from_iter_values(packet_rows.iter().map(|r| data[r]))),
        ],
        None,
    )?;
    let (frame_item, frame_fields) = list_item("frames");
    let steps: Vec<(i64, i64)> =
        frame_rows.iter().map(|r| ds.episode_and_frame(shown_by.get(r).copied().unwrap_or_default() as usize)).collect();
    let frames = StructArray::try_new(
        frame_fields,
        vec![
            Arc::new(Int64Array::from_iter_values(frame_rows.iter().map(|&r| index.pts[r as usize]))),
            Arc::new(UInt64Array::from(frame_rows.clone())),
            Arc::new(Int64Array::from_iter_values(steps.iter().map(|s| s.0))),
            Arc::new(Int64Array::from_iter_values(steps.iter().map(|s| s.1))),
        ],
        None,
    )?;
    let packet_lists = ListArray::try_new(
        packet_item,
        OffsetBuffer::from_lengths(gops.iter().map(|g| (g.targets.last().expect("a GOP shows a frame") - g.start + 1) as usize)),
        Arc::new(packets),
        None,
    )?;
    let frame_lists =
        ListArray::try_new(frame_item, OffsetBuffer::from_lengths(gops.iter().map(|g| g.targets.len())), Arc::new(frames), None)?;
    let gop_structs = StructArray::try_new(
        gop_fields.clone(),
        vec![
            Arc::new(StringArray::from_iter_values(gops.iter().map(|_| ds.label.as_str()))),
            Arc::new(StringArray::from_iter_values(gops.iter().map(|g| configs[&g.stream].as_str()))),
            Arc::new(packet_lists),
            Arc::new(frame_lists),
        ],
        None,
    )?;
    let mut per_sample = vec![0usize; samples];
    for &s in first_shown {
        per_sample[s] += 1;
    }
    Ok(Arc::new(ListArray::try_new(gop_item, OffsetBuffer::from_lengths(per_sample), Arc::new(gop_structs), None)?))
}

/// `batch`, interleaved from `parts` (row `i` is row `order[i].1` of part `order[i].0`), with
/// its packet cameras' frames numbered as a packet batch numbers them: each part numbered its
/// own, and the GOPs listed in its rows now come in the batch's row order.
pub(crate) fn renumber(parts: &[SampleBatch], order: &[(usize, usize)], batch: SampleBatch) -> Result<SampleBatch> {
    let schema = batch.schema();
    let mut columns = batch.columns().to_vec();
    for (i, field) in schema.fields().iter().enumerate() {
        if !is_packet_camera(field) {
            continue;
        }
        let gops_at = schema.index_of(&format!("{}{PACKETS_SUFFIX}", field.name()))?;
        // Per part: where each row's frames begin among the part's (rows list GOPs in order),
        // and its frame numbers.
        let mut bases: Vec<Vec<u32>> = Vec::with_capacity(parts.len());
        let mut numbers: Vec<Vec<u32>> = Vec::with_capacity(parts.len());
        for part in parts {
            let (BatchColumn::Array(n), BatchColumn::Array(g)) = (&part.columns()[i], &part.columns()[gops_at]) else {
                unreachable!("packet columns are arrays")
            };
            numbers.push(frame_numbers(n).values().to_vec());
            let listed = g.as_list::<i32>();
            let frames = listed.values().as_struct().column_by_name("frames").expect("typed").as_list::<i32>().clone();
            let offsets = listed.value_offsets();
            let mut base = Vec::with_capacity(listed.len() + 1);
            base.push(0);
            for r in 0..listed.len() {
                let (first, end) = (offsets[r] as usize, offsets[r + 1] as usize);
                let counted: i32 = (first..end).map(|g| frames.value_length(g)).sum();
                base.push(base[r] + counted as u32);
            }
            bases.push(base);
        }
        let slots = numbers.first().zip(parts.first()).map_or(1, |(n, p)| n.len() / p.num_rows().max(1));
        let mut at = HashMap::with_capacity(order.len());
        let mut new_base = Vec::with_capacity(order.len());
        let mut next = 0;
        for (position, &(p, r)) in order.iter().enumerate() {
            at.insert((p, r), position);
            new_base.push(next);
            next += bases[p][r + 1] - bases[p][r];
        }
        let mut renumbered = Vec::with_capacity(order.len() * slots);
        for &(p, r) in order {
            for &n in &numbers[p][r * slots..(r + 1) * slots] {
                let owner = bases[p].partition_point(|&b| b <= n) - 1;
                renumbered.push(new_base[at[&(p, owner)]] + (n - bases[p][owner]));
            }
        }
        let renumbered = Arc::new(UInt32Array::from(renumbered)) as ArrayRef;
        columns[i] = BatchColumn::Array(match field.data_type() {
            DataType::FixedSizeList(item, size) => Arc::new(FixedSizeListArray::try_new(item.clone(), *size, renumbered, None)?),
            _ => renumbered,
        });
    }
    Ok(SampleBatch::try_new(schema, columns, order.len())?)
}

/// The frame numbers of a packet camera column, slot by slot.
fn frame_numbers(column: &ArrayRef) -> UInt32Array {
    match column.data_type() {
        DataType::FixedSizeList(_, size) => {
            let list = column.as_fixed_size_list();
            let size = *size as usize;
            list.values().slice(list.offset() * size, list.len() * size).as_primitive::<UInt32Type>().clone()
        }
        _ => column.as_primitive::<UInt32Type>().clone(),
    }
}

/// Decodes packet batches into the batches the frame path makes: each camera column its frames
/// as `rgb24`, or as YUV planes (`yuv420p`) for the cameras whose planes convert one way, and
/// the `{camera}_packets` columns gone; RGB frames resized as a frame table of a size resizes
/// them when the decoder is made [`resizing_to`](Self::resizing_to) it. Decoders are kept per
/// stream, within a memory budget, and a batch's GOPs are decoded in parallel on the decoder's
/// own threads.
pub struct PacketBatchDecoder {
    format: FrameFormat,
    size: Option<FrameSize>,
    pool: rayon::ThreadPool,
    decoders: Mutex<IdlePool<String, StreamDecoder>>,
}

impl std::fmt::Debug for PacketBatchDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PacketBatchDecoder")
            .field("format", &self.format)
            .field("size", &self.size)
            .field("threads", &self.pool.current_num_threads())
            .finish()
    }
}

/// A GOP of a packet batch, borrowed from it.
#[derive(Debug, Clone)]
pub struct ShippedGop<'a> {
    /// The dataset it comes from, `name@version`.
    pub dataset: &'a str,
    /// Its stream's codec facts, as JSON ([`ShippedGop::stream_config`]).
    pub stream: &'a str,
    /// `(pts, dts, keyframe flag, bytes)` from the keyframe on, in decode order.
    pub packets: Vec<(i64, i64, bool, &'a [u8])>,
    /// `(pts, packets row, episode, frame)` of each wanted frame, in numbering order.
    pub frames: Vec<(i64, u64, i64, i64)>,
}

impl ShippedGop<'_> {
    /// The codec facts a decoder of this GOP opens from (frames as RGB: set `yuv` for planes).
    ///
    /// # Errors
    /// [`Error::Request`] when the stream is not a stream configuration.
    pub fn stream_config(&self) -> Result<StreamConfig> {
        serde_json::from_str(self.stream).map_err(|e| Error::request(format!("a GOP's stream is not a stream configuration: {e}")))
    }

    /// The pts of the wanted frames, in numbering order.
    pub fn wanted(&self) -> Vec<i64> {
        self.frames.iter().map(|f| f.0).collect()
    }
}

impl PacketBatchDecoder {
    /// A decoder that puts out `format` (`rgb24`, or `yuv420p` planes where a camera's metadata
    /// gives their conversion) on `threads` threads (0: one per core).
    ///
    /// # Errors
    /// For another format, and when the threads cannot be started.
    pub fn new(format: FrameFormat, threads: usize) -> Result<Self> {
        if format == FrameFormat::Packets {
            return Err(Error::request("a packet decoder puts out rgb24 or yuv420p frames, not packets"));
        }
        let threads = if threads == 0 { std::thread::available_parallelism().map_or(2, usize::from) } else { threads };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("lake-packets-{i}"))
            .build()
            .map_err(|e| Error::request(format!("cannot start {threads} decode threads: {e}")))?;
        let budget = IDLE_DECODER_BYTES_PER_THREAD * threads as u64;
        Ok(Self { format, size: None, pool, decoders: Mutex::new(IdlePool::new(budget)) })
    }

    /// This decoder with every camera's frames resized to `size` as the frame tables resize
    /// them (`lake_codec::RgbResizer`): its batches are those a frame table of `size` gives,
    /// with no such table.
    ///
    /// # Errors
    /// [`Error::Request`] for a decoder of planes: they come at the size each camera recorded.
    pub fn resizing_to(mut self, size: FrameSize) -> Result<Self> {
        if self.format != FrameFormat::Rgb24 {
            return Err(Error::request(format!(
                "frames at {size} are resized RGB; {} frames come at the size each camera recorded",
                self.format
            )));
        }
        self.size = Some(size);
        Ok(self)
    }

    /// The schema of the batches [`decode`](Self::decode) makes from batches of `schema`: the
    /// frame path's schema (`schema` itself when it has no packet cameras).
    ///
    /// # Errors
    /// When a packet camera's metadata or companion column is missing or malformed.
    pub fn decoded_schema(&self, schema: &Schema) -> Result<SchemaRef> {
        let mut fields = Vec::with_capacity(schema.fields().len());
        for field in schema.fields() {
            if is_packet_camera(field) {
                fields.push(self.frame_field(field, schema)?.0);
            } else if !is_gops_of_a_camera(field, schema) {
                fields.push(field.as_ref().clone());
            }
        }
        Ok(Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone())))
    }

    /// The frame field a packet camera's column becomes, and the planes' conversion when its
    /// frames come out as planes.
    fn frame_field(&self, field: &Field, schema: &Schema) -> Result<(Field, Option<YuvToRgb>)> {
        let name = field.name();
        let bad = |m: String| Error::request(format!("packet camera `{name}`: {m}"));
        let meta = |key: &str| field.metadata().get(key).ok_or_else(|| bad(format!("no `{key}` metadata")));
        let slots: Vec<usize> = serde_json::from_str(meta(SHAPE)?).map_err(|e| bad(format!("`{SHAPE}`: {e}")))?;
        let [mut h, mut w, c]: [usize; 3] = serde_json::from_str(meta("frame_shape")?).map_err(|e| bad(format!("`frame_shape`: {e}")))?;
        let yuv: Option<YuvToRgb> = match (self.format, field.metadata().get(YUV_TO_RGB)) {
            (FrameFormat::Yuv420p, Some(text)) => Some(serde_json::from_str(text).map_err(|e| bad(format!("`{YUV_TO_RGB}`: {e}")))?),
            _ => None,
        };
        if schema.field_with_name(&format!("{name}{PACKETS_SUFFIX}")).map(|f| f.data_type() != &gops_type()).unwrap_or(true) {
            return Err(bad(format!("no `{name}{PACKETS_SUFFIX}` column of GOPs")));
        }
        if let Some(size) = self.size {
            (h, w) = (size.height as usize, size.width as usize);
        }
        let mut shape = slots;
        let mut m = HashMap::from([
            (DTYPE.to_string(), "uint8".to_string()),
            (LAYOUT.to_string(), meta(LAYOUT)?.clone()),
            ("frame_shape".to_string(), serde_json::to_string(&[h, w, c]).expect("shape")),
        ]);
        match yuv {
            Some(conversion) => {
                shape.push(yuv420p_bytes(w as u32, h as u32));
                m.insert(PIXEL_FORMAT.to_string(), FrameFormat::Yuv420p.to_string());
                m.insert(YUV_TO_RGB.to_string(), serde_json::to_string(&conversion).expect("integers"));
            }
            None => {
                shape.extend([h, w, c]);
                m.insert(PIXEL_FORMAT.to_string(), FrameFormat::Rgb24.to_string());
            }
        }
        if let Some(label) = field.metadata().get(lake_schemas::tables::PROXY_METADATA) {
            m.insert(lake_schemas::tables::PROXY_METADATA.to_string(), label.clone());
        }
        let values: usize = shape.iter().product();
        m.insert(SHAPE.to_string(), serde_json::to_string(&shape).expect("shape"));
        let list = DataType::FixedSizeList(Arc::new(Field::new("item", DataType::UInt8, false)), values as i32);
        Ok((Field::new(name, list, false).with_metadata(m), yuv))
    }

    /// The batch the frame path makes for the samples of packet batch `batch` (a batch without
    /// packet cameras is returned as it is).
    ///
    /// # Errors
    /// [`Error::Decode`] naming the dataset, camera, episode and frame when a GOP does not
    /// decode; [`Error::Request`] for a malformed packet batch.
    pub fn decode(&self, batch: &RecordBatch) -> Result<RecordBatch> {
        let schema = batch.schema();
        let cameras: Vec<usize> = (0..schema.fields().len()).filter(|&i| is_packet_camera(schema.field(i))).collect();
        if cameras.is_empty() {
            return Ok(batch.clone());
        }
        let mut shipped = Vec::with_capacity(cameras.len());
        for &i in &cameras {
            let field = schema.field(i);
            let (out, yuv) = self.frame_field(field, &schema)?;
            shipped.push(CameraGops { out, yuv, shipped: PacketCamera::of(batch, field.name())? });
        }
        let mut gops = Vec::new();
        for (c, camera) in shipped.iter().enumerate() {
            gops.extend(camera.shipped.gops()?.into_iter().map(|g| (c, g)));
        }
        let decoded: Vec<Vec<Vec<u8>>> = self
            .pool
            .install(|| gops.par_iter().map(|(c, g)| self.decode_gop(g, shipped[*c].out.name(), shipped[*c].yuv)).collect::<Result<_>>())?;
        // Each camera's frames, numbered in the order its GOPs are listed.
        let mut frames: Vec<Vec<&[u8]>> = vec![Vec::new(); cameras.len()];
        for ((c, _), made) in gops.iter().zip(&decoded) {
            frames[*c].extend(made.iter().map(Vec::as_slice));
        }
        let mut replaced: HashMap<usize, (Field, ArrayRef)> = HashMap::new();
        for ((&i, camera), frames) in cameras.iter().zip(&shipped).zip(&frames) {
            let out = &camera.out;
            let numbers = camera.shipped.numbers();
            let frame_bytes = frames.first().map_or(0, |f| f.len());
            let mut values = Vec::with_capacity(numbers.len() * frame_bytes);
            for n in numbers {
                let frame = frames.get(*n as usize).ok_or_else(|| {
                    Error::request(format!("packet camera `{}`: frame {n} of a batch whose GOPs give {}", out.name(), frames.len()))
                })?;
                values.extend_from_slice(frame);
            }
            let array = camera_array(out, values)?;
            replaced.insert(i, (out.clone(), array));
        }
        let mut fields = Vec::with_capacity(schema.fields().len());
        let mut columns = Vec::with_capacity(schema.fields().len());
        for (i, field) in schema.fields().iter().enumerate() {
            if let Some((f, a)) = replaced.remove(&i) {
                fields.push(f);
                columns.push(a);
            } else if !is_gops_of_a_camera(field, &schema) {
                fields.push(field.as_ref().clone());
                columns.push(batch.column(i).clone());
            }
        }
        Ok(RecordBatch::try_new(Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone())), columns)?)
    }

    /// The wanted frames of `gops`, GOPs of camera `camera`, decoded on this decoder's threads
    /// all at once: each GOP's frames in its `frames` order, as YUV planes converting with `yuv`
    /// when it is given, else as RGB24 (whatever format this decoder puts out in batches).
    ///
    /// # Errors
    /// [`Error::Decode`] naming the dataset, camera, episode and frame when a GOP does not decode.
    pub fn decode_gops(&self, gops: &[ShippedGop<'_>], camera: &str, yuv: Option<YuvToRgb>) -> Result<Vec<Vec<Vec<u8>>>> {
        self.pool.install(|| gops.par_iter().map(|g| self.decode_gop(g, camera, yuv)).collect())
    }

    /// The wanted frames of one GOP, in its `frames` order.
    fn decode_gop(&self, gop: &ShippedGop<'_>, camera: &str, yuv: Option<YuvToRgb>) -> Result<Vec<Vec<u8>>> {
        let (_, row, episode, frame) = gop.frames[0];
        let fail =
            |message: String| Error::Decode { dataset: gop.dataset.to_string(), camera: camera.to_string(), episode, frame, row, message };
        let key = format!("{}{}", gop.stream, if yuv.is_some() { " planes" } else { "" });
        let pooled = self.decoders.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take(&key);
        let mut decoder = match pooled {
            Some(d) => d,
            None => {
                let mut config = gop.stream_config().map_err(|e| fail(e.to_string()))?;
                config.yuv = yuv;
                StreamDecoder::open(&config).map_err(|e| fail(e.to_string()))?
            }
        };
        let made = decoder.decode(&gop.packets, &gop.wanted()).map_err(|e| fail(e.to_string()))?;
        let idle = decoder.idle_bytes();
        self.decoders.lock().unwrap_or_else(std::sync::PoisonError::into_inner).put(key, decoder, idle);
        match (self.size, made.first()) {
            (Some(size), Some(first)) if yuv.is_none() => {
                let mut resizer =
                    lake_codec::RgbResizer::new((first.width, first.height), (size.width, size.height)).map_err(|e| fail(e.to_string()))?;
                made.iter().map(|f| resizer.resize(&f.data).map_err(|e| fail(e.to_string()))).collect()
            }
            _ => Ok(made.into_iter().map(|f| f.data).collect()),
        }
    }
}

/// A packet camera of a batch: the field its column becomes, the planes' conversion when its
/// frames come out as planes, and its GOPs.
struct CameraGops {
    out: Field,
    yuv: Option<YuvToRgb>,
    shipped: PacketCamera,
}

/// A camera of a packet batch, for a consumer that decodes its GOPs itself (on a GPU, say): its
/// GOPs in the order its frames are numbered, and the frame number of each sample's slots.
#[derive(Debug, Clone)]
pub struct PacketCamera {
    name: String,
    listed: ListArray,
    numbers: UInt32Array,
}

impl PacketCamera {
    /// Camera `name` of packet batch `batch`.
    ///
    /// # Errors
    /// [`Error::Request`] when `batch` has no packet camera of that name.
    pub fn of(batch: &RecordBatch, name: &str) -> Result<Self> {
        let bad = |m: &str| Error::request(format!("packet camera `{name}`: {m}"));
        let schema = batch.schema();
        let field = schema.field_with_name(name).map_err(|_| bad("no such column"))?;
        if !is_packet_camera(field) {
            return Err(bad("the column does not carry packets"));
        }
        let gops = batch.column_by_name(&format!("{name}{PACKETS_SUFFIX}")).ok_or_else(|| bad("no column of GOPs"))?;
        if gops.data_type() != &gops_type() {
            return Err(bad("its GOPs are not of the packet batch type"));
        }
        let numbers = frame_numbers(batch.column_by_name(name).expect("the field's column"));
        Ok(Self { name: name.to_string(), listed: gops.as_list::<i32>().clone(), numbers })
    }

    /// The number, among the batch's frames of this camera, of the frame each slot shows
    /// (sample-major).
    pub fn numbers(&self) -> &[u32] {
        self.numbers.values()
    }

    /// The GOPs, in the order their frames are numbered.
    ///
    /// # Errors
    /// [`Error::Request`] for a GOP without packets or frames.
    pub fn gops(&self) -> Result<Vec<ShippedGop<'_>>> {
        let bad = |m: String| Error::request(format!("packet camera `{}`: {m}", self.name));
        let structs = self.listed.values().as_struct();
        let text = |name: &'static str| structs.column_by_name(name).expect("typed").as_string::<i32>();
        let list = |name: &'static str| structs.column_by_name(name).expect("typed").as_list::<i32>();
        let (datasets, streams, packets, frames) = (text("dataset"), text("stream"), list("packets"), list("frames"));
        let (p, f) = (packets.values().as_struct(), frames.values().as_struct());
        let (pts, dts) = (p.column(0).as_primitive::<Int64Type>(), p.column(1).as_primitive::<Int64Type>());
        let (keys, data) = (p.column(2).as_boolean(), p.column(3).as_binary::<i32>());
        let (fpts, frow) = (f.column(0).as_primitive::<Int64Type>(), f.column(1).as_primitive::<UInt64Type>());
        let (fep, fidx) = (f.column(2).as_primitive::<Int64Type>(), f.column(3).as_primitive::<Int64Type>());
        let offsets = self.listed.value_offsets();
        let mut gops = Vec::new();
        for g in offsets[0] as usize..offsets[self.listed.len()] as usize {
            let packet_range = packets.value_offsets()[g] as usize..packets.value_offsets()[g + 1] as usize;
            let frame_range = frames.value_offsets()[g] as usize..frames.value_offsets()[g + 1] as usize;
            if packet_range.is_empty() || frame_range.is_empty() {
                return Err(bad(format!("GOP {g} has no {}", if packet_range.is_empty() { "packets" } else { "frames" })));
            }
            gops.push(ShippedGop {
                dataset: datasets.value(g),
                stream: streams.value(g),
                packets: packet_range.map(|k| (pts.value(k), dts.value(k), keys.value(k), data.value(k))).collect(),
                frames: frame_range.map(|k| (fpts.value(k), frow.value(k), fep.value(k), fidx.value(k))).collect(),
            });
        }
        Ok(gops)
    }
}

/// Whether `field` is a camera column of a packet batch.
fn is_packet_camera(field: &Field) -> bool {
    field.metadata().get(PIXEL_FORMAT).is_some_and(|f| f == "packets")
}

/// Whether `field` is the `{camera}_packets` column of a packet camera of `schema`.
fn is_gops_of_a_camera(field: &Field, schema: &Schema) -> bool {
    field.name().strip_suffix(PACKETS_SUFFIX).and_then(|camera| schema.field_with_name(camera).ok()).is_some_and(is_packet_camera)
}
