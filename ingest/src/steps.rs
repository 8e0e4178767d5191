//! The second pass over the data parquet: LeRobot rows become `steps` rows (features
//! normalised, task resolved, per-camera packet rows attached), and encoded images become
//! packet rows of their own streams.

use std::{collections::HashMap, sync::Arc};

use arrow::{
    array::{
        ArrayRef, AsArray, BooleanBuilder, Int64Builder, LargeBinaryBuilder, RecordBatch, StringBuilder, StructArray, UInt32Builder,
        UInt64Builder,
    },
    compute::cast,
    datatypes::{DataType, Field, Fields, Int64Type, Schema, SchemaRef},
};
use lake_schemas::tables::{self, DTYPE_METADATA, NAME_METADATA, PACKET_ROW, SHAPE_METADATA, TASK, storage_name};

use crate::{
    Error, Result,
    data::{ColumnPlan, Role, arrow_dtype, image_bytes, normalize_numeric},
};

/// How data rows map to `steps` rows.
#[derive(Debug, Clone)]
pub struct StepsLayout {
    /// Schema of the steps table.
    pub schema: SchemaRef,
    columns: Vec<(String, Role)>,
    /// Cameras with a field in `packet_row`, in feature order.
    pub cameras: Vec<String>,
    /// The image cameras among them.
    pub image_cameras: Vec<String>,
}

/// Packet rows of one image camera produced from one data batch.
#[derive(Debug)]
pub struct ImagePackets {
    /// Index into [`StepsLayout::image_cameras`].
    pub camera: usize,
    /// The rows.
    pub batch: RecordBatch,
}

impl StepsLayout {
    /// The layout for data files shaped like `plan`, keeping `cameras` (video and image, in
    /// feature order).
    ///
    /// # Errors
    /// When a declared dtype has no Arrow type.
    pub fn new(plan: &ColumnPlan, cameras: Vec<String>, image_cameras: Vec<String>) -> Result<Self> {
        let mut fields = Vec::new();
        let mut columns = Vec::new();
        for ((name, role), field) in plan.columns.iter().zip(plan.schema.fields()) {
            match role {
                Role::Numeric(f) => {
                    let dtype = arrow_dtype(&f.dtype)
                        .ok_or_else(|| Error::Unsupported(format!("feature `{}`: dtype {} is not supported", f.name, f.dtype)))?;
                    let is_list = matches!(field.data_type(), DataType::List(_) | DataType::LargeList(_) | DataType::FixedSizeList(_, _));
                    let dt =
                        if is_list { DataType::FixedSizeList(Arc::new(Field::new("item", dtype, false)), f.numel() as i32) } else { dtype };
                    let metadata = HashMap::from([
                        (DTYPE_METADATA.to_string(), f.dtype.clone()),
                        (SHAPE_METADATA.to_string(), serde_json::to_string(&f.shape).expect("shape serialises")),
                    ]);
                    fields.push(stored(Field::new(name, dt, false).with_metadata(metadata)));
                    columns.push((name.clone(), role.clone()));
                }
                Role::Image(_) => {}
                Role::Passthrough => {
                    fields.push(stored(field.as_ref().clone()));
                    columns.push((name.clone(), role.clone()));
                }
            }
        }
        fields.push(Field::new(TASK, DataType::Utf8, false));
        if !cameras.is_empty() {
            // A step of an episode kept without a camera's video (`--missing-video keep-rows`)
            // has no packet row for it: null.
            let camera_fields: Fields = cameras.iter().map(|c| stored(Field::new(c, DataType::UInt64, true))).collect();
            fields.push(Field::new(PACKET_ROW, DataType::Struct(camera_fields), false));
        }
        let mut names: Vec<&str> = fields.iter().map(|f| f.name().as_str()).collect();
        names.sort_unstable();
        if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(Error::Unsupported(format!("two columns are both stored as `{}` (lake stores `.` in names as `/`)", w[0])));
        }
        Ok(Self { schema: Arc::new(Schema::new(fields)), columns, cameras, image_cameras })
    }

    /// How a file's plan differs in columns from this layout's reference, in words (`None`
    /// when they have the same).
    pub fn difference(&self, plan: &ColumnPlan) -> Option<String> {
        let mine: std::collections::BTreeSet<&str> = self.columns.iter().map(|(n, _)| n.as_str()).collect();
        let theirs: std::collections::BTreeSet<&str> =
            plan.columns.iter().filter(|(_, r)| !matches!(r, Role::Image(_))).map(|(n, _)| n.as_str()).collect();
        let list = |names: Vec<&&str>| names.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ");
        let (extra, missing): (Vec<&&str>, Vec<&&str>) = (theirs.difference(&mine).collect(), mine.difference(&theirs).collect());
        let mut parts = Vec::new();
        if !extra.is_empty() {
            parts.push(format!("it has {} the first lacks", list(extra)));
        }
        if !missing.is_empty() {
            parts.push(format!("it lacks {}", list(missing)));
        }
        (!parts.is_empty()).then(|| parts.join("; "))
    }

    /// Converts a batch of data rows (already filtered to ingested episodes).
    ///
    /// `packet_rows[camera][row]` is the packet row of a video camera's frame, `None` where the
    /// episode was kept without that camera's video (the list is empty for image cameras); image camera `i` is packet stream `image_streams[i].0` whose rows start at
    /// `image_streams[i].1`, one row per ingested step; `first_ordinal` counts the steps
    /// converted before this batch.
    ///
    /// # Errors
    /// When a column cannot be converted (the first pass makes this unexpected).
    pub fn convert<'t>(
        &self,
        batch: &RecordBatch,
        tasks: &dyn Fn(i64) -> Option<&'t str>,
        packet_rows: &[Vec<Option<u64>>],
        image_streams: &[(u32, u64)],
        first_ordinal: u64,
    ) -> Result<(RecordBatch, Vec<ImagePackets>)> {
        let n = batch.num_rows();
        let mut arrays: Vec<ArrayRef> = Vec::with_capacity(self.schema.fields().len());
        for (name, role) in &self.columns {
            let col = batch.column_by_name(name).ok_or_else(|| Error::metadata(name.clone(), "column vanished between passes"))?;
            arrays.push(match role {
                Role::Numeric(f) => normalize_numeric(col, f).map_err(|(row, _, m)| {
                    let at = |key: &str| {
                        batch
                            .column_by_name(key)
                            .and_then(|c| cast(c, &DataType::Int64).ok())
                            .map_or(-1, |c| c.as_primitive::<Int64Type>().value(row))
                    };
                    Error::metadata(name.clone(), format!("episode {}, frame {}: {m}", at("episode_index"), at("frame_index")))
                })?,
                _ => col.clone(),
            });
        }
        let int = |name: &str| int_column(batch, name);
        let (episode, frame, task_index) = (int("episode_index")?, int("frame_index")?, int("task_index")?);
        let mut task = StringBuilder::with_capacity(n, n * 32);
        for t in &task_index {
            task.append_value(
                tasks(*t)
                    .ok_or_else(|| Error::metadata("task_index", format!("{t} names no task (the first pass makes this unexpected)")))?,
            );
        }
        arrays.push(Arc::new(task.finish()));

        let mut images = Vec::new();
        if !self.cameras.is_empty() {
            let mut camera_arrays: Vec<ArrayRef> = Vec::with_capacity(self.cameras.len());
            for (ci, camera) in self.cameras.iter().enumerate() {
                let mut rows = UInt64Builder::with_capacity(n);
                if let Some(ii) = self.image_cameras.iter().position(|c| c == camera) {
                    for r in 0..n {
                        rows.append_value(image_streams[ii].1 + first_ordinal + r as u64);
                    }
                    let col = batch.column_by_name(camera).ok_or_else(|| Error::metadata(camera.clone(), "image column missing"))?;
                    images
                        .push(ImagePackets { camera: ii, batch: image_packet_batch(image_streams[ii].0, camera, col, &episode, &frame)? });
                } else {
                    rows.extend(packet_rows[ci].iter().copied());
                }
                camera_arrays.push(Arc::new(rows.finish()));
            }
            let DataType::Struct(fields) = self.schema.field_with_name(PACKET_ROW).expect("packet_row field").data_type().clone() else {
                unreachable!()
            };
            arrays.push(Arc::new(StructArray::try_new(fields, camera_arrays, None).map_err(Error::arrow(tables::STEPS))?));
        }
        let out = RecordBatch::try_new(self.schema.clone(), arrays).map_err(Error::arrow(tables::STEPS))?;
        Ok((out, images))
    }
}

/// An integer column of a data batch as `i64` values.
///
/// # Errors
/// When the column is missing or not integers.
pub fn int_column(batch: &RecordBatch, name: &str) -> Result<Vec<i64>> {
    let col = batch.column_by_name(name).ok_or_else(|| Error::metadata(name.to_string(), "missing"))?;
    Ok(cast(col, &DataType::Int64).map_err(Error::arrow(tables::STEPS))?.as_primitive::<Int64Type>().values().to_vec())
}

/// The field under its stored name, with the LeRobot key in metadata when they differ.
fn stored(field: Field) -> Field {
    let name = storage_name(field.name());
    if &name == field.name() {
        return field;
    }
    let mut metadata = field.metadata().clone();
    metadata.insert(NAME_METADATA.to_string(), field.name().clone());
    field.with_name(name).with_metadata(metadata)
}

/// Packet rows for the encoded images of one camera: each image is a keyframe on its own.
fn image_packet_batch(stream_id: u32, camera: &str, col: &ArrayRef, episode: &[i64], frame: &[i64]) -> Result<RecordBatch> {
    let bytes = image_bytes(col).map_err(|(row, m)| Error::metadata(camera.to_string(), format!("row {row}: {m}")))?;
    let n = bytes.len();
    let mut stream = UInt32Builder::with_capacity(n);
    let mut cam = StringBuilder::new();
    let (mut ep, mut fr, mut pts, mut dts, mut dur) =
        (Int64Builder::new(), Int64Builder::new(), Int64Builder::new(), Int64Builder::new(), Int64Builder::new());
    let (mut key, mut ckey) = (BooleanBuilder::new(), BooleanBuilder::new());
    let mut offset = UInt32Builder::new();
    let mut data = LargeBinaryBuilder::new();
    let mut checksum = UInt32Builder::with_capacity(n);
    for (r, b) in bytes.iter().enumerate() {
        stream.append_value(stream_id);
        cam.append_value(camera);
        ep.append_value(episode[r]);
        fr.append_value(frame[r]);
        pts.append_value(frame[r]);
        dts.append_value(frame[r]);
        dur.append_value(1);
        key.append_value(true);
        ckey.append_value(true);
        offset.append_value(0);
        data.append_value(b);
        checksum.append_value(crc32fast::hash(b));
    }
    let columns: Vec<ArrayRef> = vec![
        Arc::new(stream.finish()),
        Arc::new(cam.finish()),
        Arc::new(ep.finish()),
        Arc::new(fr.finish()),
        Arc::new(pts.finish()),
        Arc::new(dts.finish()),
        Arc::new(dur.finish()),
        Arc::new(key.finish()),
        Arc::new(ckey.finish()),
        Arc::new(offset.finish()),
        Arc::new(data.finish()),
        Arc::new(checksum.finish()),
    ];
    RecordBatch::try_new(tables::packets_schema(), columns).map_err(Error::arrow(tables::PACKETS))
}
