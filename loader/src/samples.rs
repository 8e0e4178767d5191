//! A batch as the loader assembles it, before its frames are copied into columns.
//!
//! A training batch is mostly frames (an `act` batch of 32 at 480x640 is 30 MB), and each of
//! them is already in memory once decoded: in the frame cache, kept ahead for this batch, or
//! just made by its GOP decode. A [`SampleBatch`] holds a camera column as the frames its slots
//! show, shared, so that a transport that writes buffers in pieces (Flight, the HTTP Arrow
//! stream, shared memory) sends them without first copying them into one buffer, which cost a
//! served batch a tenth of the server's CPU. [`SampleBatch::to_record_batch`] makes the
//! ordinary Arrow batch, with the copy. A batch for an in-process caller
//! ([`Loader::batch`](crate::Loader::batch), the stream API) skips that copy for the frames it
//! decodes: they are written straight into its camera columns.

use std::sync::Arc;

use arrow::{
    array::{ArrayRef, FixedSizeListArray, RecordBatch, UInt8Array},
    buffer::Buffer,
    compute::interleave,
    datatypes::{DataType, Field, SchemaRef},
    error::ArrowError,
};

use crate::cache::Frame;

/// Field metadata key: the sample value's shape as JSON (`[50, 6]`, `[2, 96, 128, 3]`).
pub const SHAPE: &str = "shape";
/// Field metadata key: the element dtype (`float32`, `uint8`, `bool`, …).
pub const DTYPE: &str = "dtype";
/// Field metadata key on camera columns: `HWC`, or `THWC` with a time window (a video
/// camera's window of one offset is `HWC`, as in LeRobot).
pub const LAYOUT: &str = "layout";

/// A batch of samples: the loader's schema, and a column per field.
#[derive(Debug, Clone)]
pub struct SampleBatch {
    schema: SchemaRef,
    columns: Vec<BatchColumn>,
    rows: usize,
}

/// A column of a [`SampleBatch`].
#[derive(Debug, Clone)]
pub enum BatchColumn {
    /// An Arrow array.
    Array(ArrayRef),
    /// A camera column (a `FixedSizeList` of `uint8` per sample) as the frames it shows: for
    /// each sample in order, the frame of each window slot in order, each `frame_bytes` long
    /// (one frame shown in several slots is shared, not repeated).
    Frames(FrameColumn),
}

/// The frames of a camera column, slot by slot.
#[derive(Debug, Clone)]
pub struct FrameColumn {
    /// One per (sample, slot), sample-major.
    pub frames: Vec<Frame>,
    /// Bytes of each frame (`height * width * 3`, or YUV planes' [`yuv420p_bytes`](crate::yuv420p_bytes)).
    pub frame_bytes: usize,
}

impl FrameColumn {
    /// Bytes of the column's values.
    pub fn len_bytes(&self) -> usize {
        self.frames.len() * self.frame_bytes
    }
}

impl From<RecordBatch> for SampleBatch {
    fn from(batch: RecordBatch) -> Self {
        Self { schema: batch.schema(), rows: batch.num_rows(), columns: batch.columns().iter().cloned().map(BatchColumn::Array).collect() }
    }
}

impl SampleBatch {
    /// A batch of `rows` samples with `columns` for `schema`'s fields.
    ///
    /// # Errors
    /// When the columns do not match the schema: their number, a column's length, or frames
    /// that do not fill a camera field's values.
    pub fn try_new(schema: SchemaRef, columns: Vec<BatchColumn>, rows: usize) -> Result<Self, ArrowError> {
        if columns.len() != schema.fields().len() {
            return Err(ArrowError::InvalidArgumentError(format!("{} columns for {} fields", columns.len(), schema.fields().len())));
        }
        for (column, field) in columns.iter().zip(schema.fields()) {
            match column {
                BatchColumn::Array(array) if array.len() != rows || array.data_type() != field.data_type() => {
                    return Err(ArrowError::InvalidArgumentError(format!(
                        "column {}: {} values of {} for {rows} rows of {}",
                        field.name(),
                        array.len(),
                        array.data_type(),
                        field.data_type()
                    )));
                }
                BatchColumn::Array(_) => {}
                BatchColumn::Frames(f) => {
                    let per_sample = frame_values_per_sample(field.data_type()).ok_or_else(|| {
                        ArrowError::InvalidArgumentError(format!("column {} holds frames but is not uint8 lists", field.name()))
                    })?;
                    if f.frame_bytes == 0 || f.len_bytes() != rows * per_sample || per_sample % f.frame_bytes != 0 {
                        return Err(ArrowError::InvalidArgumentError(format!(
                            "column {}: {} frames of {} bytes do not make {rows} samples of {per_sample} bytes",
                            field.name(),
                            f.frames.len(),
                            f.frame_bytes
                        )));
                    }
                    if let Some(frame) = f.frames.iter().find(|frame| frame.len() != f.frame_bytes) {
                        return Err(ArrowError::InvalidArgumentError(format!(
                            "column {}: a frame of {} bytes among frames of {}",
                            field.name(),
                            frame.len(),
                            f.frame_bytes
                        )));
                    }
                }
            }
        }
        Ok(Self { schema, columns, rows })
    }

    /// The schema.
    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// Samples in the batch.
    pub fn num_rows(&self) -> usize {
        self.rows
    }

    /// The columns, in schema order.
    pub fn columns(&self) -> &[BatchColumn] {
        &self.columns
    }

    /// Bytes the batch's values take once in one Arrow batch (what a client receives).
    pub fn memory_size(&self) -> usize {
        self.columns
            .iter()
            .map(|c| match c {
                BatchColumn::Array(a) => a.get_array_memory_size(),
                BatchColumn::Frames(f) => f.len_bytes(),
            })
            .sum()
    }

    /// The batch as an Arrow record batch: each camera column's frames copied into its values.
    ///
    /// # Errors
    /// When Arrow refuses the columns (not for a batch the loader made).
    pub fn to_record_batch(&self) -> Result<RecordBatch, ArrowError> {
        let columns = (0..self.columns.len()).map(|c| self.array(c)).collect::<Result<_, _>>()?;
        RecordBatch::try_new(self.schema.clone(), columns)
    }

    /// Rows of `parts` (batches of one schema) in the order of `indices` (`(part, row)`). A
    /// camera column stays frames when every part holds it as frames of one size; otherwise
    /// it becomes an array.
    ///
    /// # Errors
    /// When the parts' columns differ in type, or an index is out of range.
    pub fn interleave(parts: &[Self], indices: &[(usize, usize)]) -> Result<Self, ArrowError> {
        let first = parts.first().ok_or_else(|| ArrowError::InvalidArgumentError("no batches to interleave".into()))?;
        let mut columns = Vec::with_capacity(first.columns.len());
        for (c, field) in first.schema.fields().iter().enumerate() {
            let column = match &first.columns[c] {
                BatchColumn::Frames(f)
                    if parts.iter().all(|p| matches!(&p.columns[c], BatchColumn::Frames(o) if o.frame_bytes == f.frame_bytes)) =>
                {
                    let slots = frame_values_per_sample(field.data_type()).unwrap_or(0) / f.frame_bytes.max(1);
                    let mut frames = Vec::with_capacity(indices.len() * slots);
                    for &(part, row) in indices {
                        let BatchColumn::Frames(of) = &parts[part].columns[c] else { unreachable!("checked above") };
                        let slice = of
                            .frames
                            .get(row * slots..(row + 1) * slots)
                            .ok_or_else(|| ArrowError::InvalidArgumentError(format!("row {row} of part {part} is out of range")))?;
                        frames.extend_from_slice(slice);
                    }
                    BatchColumn::Frames(FrameColumn { frames, frame_bytes: f.frame_bytes })
                }
                _ => {
                    // Frames of one part and an array of another (a part read from a frame
                    // table): as arrays.
                    let arrays = parts.iter().map(|p| p.array(c)).collect::<Result<Vec<_>, _>>()?;
                    let refs: Vec<&dyn arrow::array::Array> = arrays.iter().map(AsRef::as_ref).collect();
                    BatchColumn::Array(interleave(&refs, indices)?)
                }
            };
            columns.push(column);
        }
        Self::try_new(first.schema.clone(), columns, indices.len())
    }

    /// Column `c` as an Arrow array (frames copied).
    fn array(&self, c: usize) -> Result<ArrayRef, ArrowError> {
        match &self.columns[c] {
            BatchColumn::Array(a) => Ok(a.clone()),
            BatchColumn::Frames(f) => {
                let mut values = Vec::with_capacity(f.len_bytes());
                for frame in &f.frames {
                    values.extend_from_slice(frame);
                }
                camera_array(self.schema.field(c), values)
            }
        }
    }
}

/// A camera column of `field`'s type (a `FixedSizeList` of `uint8`) over `values`.
pub(crate) fn camera_array(field: &Field, values: Vec<u8>) -> Result<ArrayRef, ArrowError> {
    let DataType::FixedSizeList(item, per_sample) = field.data_type() else {
        return Err(ArrowError::InvalidArgumentError(format!("column {} holds frames but is not a list", field.name())));
    };
    let values = Arc::new(UInt8Array::new(Buffer::from_vec(values).into(), None));
    Ok(Arc::new(FixedSizeListArray::try_new(item.clone(), *per_sample, values, None)?))
}

/// Bytes per sample of a camera column's type (`FixedSizeList<uint8>`), if it is one.
fn frame_values_per_sample(data_type: &DataType) -> Option<usize> {
    match data_type {
        DataType::FixedSizeList(item, n) if item.data_type() == &DataType::UInt8 => usize::try_from(*n).ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use arrow::{
        array::{Array, AsArray, Int64Array},
        datatypes::{Schema, UInt8Type},
    };

    use super::*;

    fn schema(slots: usize, frame_bytes: usize) -> SchemaRef {
        let item = Arc::new(Field::new("item", DataType::UInt8, false));
        Arc::new(Schema::new(vec![
            Field::new("index", DataType::Int64, false),
            Field::new("camera", DataType::FixedSizeList(item, (slots * frame_bytes) as i32), false),
        ]))
    }

    fn frame(value: u8, bytes: usize) -> Frame {
        Frame::from(vec![value; bytes])
    }

    /// Two samples of two slots of 3-byte frames, the first showing frame 1 twice.
    fn batch(first: i64) -> SampleBatch {
        let frames = vec![frame(1, 3), frame(1, 3), frame(2, 3), frame(3, 3)];
        SampleBatch::try_new(
            schema(2, 3),
            vec![
                BatchColumn::Array(Arc::new(Int64Array::from(vec![first, first + 1]))),
                BatchColumn::Frames(FrameColumn { frames, frame_bytes: 3 }),
            ],
            2,
        )
        .expect("valid")
    }

    fn values(batch: &RecordBatch) -> Vec<u8> {
        batch.column(1).as_fixed_size_list().values().as_primitive::<UInt8Type>().values().to_vec()
    }

    #[test]
    fn frames_become_the_columns_values_in_slot_order() {
        let b = batch(10);
        assert_eq!(b.memory_size(), Int64Array::from(vec![10, 11]).get_array_memory_size() + 12);
        let rb = b.to_record_batch().expect("batch");
        assert_eq!(values(&rb), [1, 1, 1, 1, 1, 1, 2, 2, 2, 3, 3, 3]);
        assert_eq!(rb.column(0).as_primitive::<arrow::datatypes::Int64Type>().values().to_vec(), [10, 11]);
        let back = SampleBatch::from(rb.clone()).to_record_batch().expect("batch");
        assert_eq!(back, rb);
    }

    #[test]
    fn interleaving_moves_each_samples_slots_together() {
        let parts = [batch(10), batch(20)];
        let mixed = SampleBatch::interleave(&parts, &[(1, 1), (0, 0), (1, 0)]).expect("interleaved");
        assert!(matches!(mixed.columns()[1], BatchColumn::Frames(_)), "frames stay shared");
        let rb = mixed.to_record_batch().expect("batch");
        assert_eq!(rb.column(0).as_primitive::<arrow::datatypes::Int64Type>().values().to_vec(), [21, 10, 20]);
        assert_eq!(values(&rb), [2, 2, 2, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]);
        // A part whose frames were read into an array mixes with one holding frames.
        let array_part = SampleBatch::from(batch(20).to_record_batch().expect("batch"));
        let mixed = SampleBatch::interleave(&[batch(10), array_part], &[(1, 1), (0, 0)]).expect("interleaved");
        assert_eq!(values(&mixed.to_record_batch().expect("batch")), [2, 2, 2, 3, 3, 3, 1, 1, 1, 1, 1, 1]);
    }

    #[test]
    fn frames_that_do_not_fill_the_column_are_refused() {
        let short = vec![frame(1, 3); 3];
        let refused = SampleBatch::try_new(
            schema(2, 3),
            vec![
                BatchColumn::Array(Arc::new(Int64Array::from(vec![1, 2]))),
                BatchColumn::Frames(FrameColumn { frames: short, frame_bytes: 3 }),
            ],
            2,
        );
        assert!(refused.unwrap_err().to_string().contains("do not make 2 samples"));
        let odd = vec![frame(1, 3), frame(1, 3), frame(1, 3), frame(1, 2)];
        let refused = SampleBatch::try_new(
            schema(2, 3),
            vec![
                BatchColumn::Array(Arc::new(Int64Array::from(vec![1, 2]))),
                BatchColumn::Frames(FrameColumn { frames: odd, frame_bytes: 3 }),
            ],
            2,
        );
        assert!(refused.unwrap_err().to_string().contains("a frame of 2 bytes"));
    }
}
