//! Flight `DoGet` without copies. A training batch is tens of MB of frames; tonic's generated
//! service would copy it twice on its way to the socket (Arrow IPC encoding into one body, then
//! protobuf encoding into the gRPC send buffer), each time into freshly faulted pages, which
//! cost the server about a sixth of its CPU under load. Here a batch becomes gRPC frames whose
//! body chunks are the batch's own Arrow buffers: the IPC metadata and the protobuf and gRPC
//! prefixes are written, the buffers are shared, and HTTP/2 hands them to the kernel with
//! vectored writes. On the wire it is ordinary Flight (an IPC schema message, then one record
//! batch message per batch, 64-byte aligned buffers), so every Flight client reads it.
//!
//! The route sits in front of the generated service for `DoGet` only; Flight SQL tickets are
//! answered on it too (their small results are encoded the ordinary way).

use std::{convert::Infallible, ops::Range};

use arrow::{
    array::ArrayData,
    buffer::Buffer,
    datatypes::{DataType, SchemaRef},
    ipc::{self, writer::IpcWriteOptions},
};
use arrow_flight::{FlightData, SchemaAsIpc, Ticket};
use bytes::{BufMut, Bytes, BytesMut};
use futures::{Stream, StreamExt};
use http_body::Frame;
use lake_loader::{BatchColumn, FrameColumn, SampleBatch};
use prost::Message;
use tonic::Status;

use super::flight::{Answer, LakeFlight};

/// Path of Flight's `DoGet`.
pub const DO_GET_PATH: &str = "/arrow.flight.protocol.FlightService/DoGet";

/// Alignment of buffers in the IPC body (Arrow's writer default).
const ALIGN: usize = 64;
static PADDING: [u8; ALIGN] = [0; ALIGN];

/// Largest ticket accepted.
const MAX_TICKET: usize = super::MAX_TICKET_BYTES;

/// The gRPC response frames of a `DoGet`.
type Frames = std::pin::Pin<Box<dyn Stream<Item = Result<Frame<Bytes>, Infallible>> + Send>>;

/// The `DoGet` route: the request's ticket, answered as a gRPC response whose batches share the
/// loader's buffers.
pub async fn do_get(flight: LakeFlight, request: axum::extract::Request) -> axum::response::Response {
    match answer(&flight, request).await {
        Ok(frames) => {
            let mut response = axum::response::Response::new(axum::body::Body::new(http_body_util::StreamBody::new(frames)));
            response.headers_mut().insert(axum::http::header::CONTENT_TYPE, axum::http::HeaderValue::from_static("application/grpc"));
            response
        }
        Err(status) => status.into_http(),
    }
}

async fn answer(flight: &LakeFlight, request: axum::extract::Request) -> Result<Frames, Status> {
    let (parts, body) = request.into_parts();
    let token = super::bearer_token(parts.headers.get("authorization").and_then(|v| v.to_str().ok()));
    flight.authorize(token)?;
    if parts.headers.get("grpc-encoding").is_some_and(|e| e.as_bytes() != b"identity") {
        return Err(Status::unimplemented("compressed requests are not accepted"));
    }
    let bytes = axum::body::to_bytes(body, MAX_TICKET + 5).await.map_err(|e| match std::error::Error::source(&e) {
        Some(cause) if cause.is::<http_body_util::LengthLimitError>() => {
            Status::invalid_argument(format!("the ticket is over the {} MiB limit", MAX_TICKET >> 20))
        }
        _ => Status::invalid_argument(format!("reading the ticket: {e}")),
    })?;
    let ticket = match bytes.as_ref() {
        [0, a, b, c, d, message @ ..] if message.len() == u32::from_be_bytes([*a, *b, *c, *d]) as usize => {
            Ticket::decode(message).map_err(|e| Status::invalid_argument(format!("the ticket is not a Flight Ticket: {e}")))?
        }
        _ => return Err(Status::invalid_argument("the request must be one uncompressed gRPC message holding a Ticket")),
    };
    match flight.ticket_batches(ticket).await? {
        Answer::Batches(schema, batches) => Ok(batch_frames(&schema, batches)),
        Answer::Messages(messages) => Ok(message_frames(messages)),
    }
}

/// The schema message, then each batch's frames as it comes, then the status trailers.
fn batch_frames(schema: &SchemaRef, batches: std::pin::Pin<Box<dyn Stream<Item = Result<SampleBatch, Status>> + Send>>) -> Frames {
    let head: FlightData = SchemaAsIpc::new(schema, &IpcWriteOptions::default()).into();
    let head = futures::stream::iter(vec![Ok(Frame::data(message_frame(&head)))]);
    let body = futures::stream::unfold(Some(batches), |state| async move {
        let mut batches = state?;
        Some(match batches.next().await {
            Some(Ok(batch)) => match encode_batch(&batch) {
                Ok(chunks) => (chunks.into_iter().map(|c| Ok(Frame::data(c))).collect(), Some(batches)),
                Err(status) => (vec![Ok(trailers(&status))], None),
            },
            Some(Err(status)) => (vec![Ok(trailers(&status))], None),
            None => (vec![Ok(trailers(&Status::ok("")))], None),
        })
    })
    .flat_map(futures::stream::iter);
    Box::pin(head.chain(body))
}

fn message_frames(messages: std::pin::Pin<Box<dyn Stream<Item = Result<FlightData, Status>> + Send>>) -> Frames {
    let frames = futures::stream::unfold(Some(messages), |state| async move {
        let mut messages = state?;
        Some(match messages.next().await {
            Some(Ok(data)) => (Ok(Frame::data(message_frame(&data))), Some(messages)),
            Some(Err(status)) => (Ok(trailers(&status)), None),
            None => (Ok(trailers(&Status::ok(""))), None),
        })
    });
    Box::pin(frames)
}

/// The status as gRPC trailers.
fn trailers(status: &Status) -> Frame<Bytes> {
    let mut headers = status.clone().into_http::<()>().into_parts().0.headers;
    headers.remove(axum::http::header::CONTENT_TYPE);
    Frame::trailers(headers)
}

/// One protobuf message as a gRPC frame.
fn message_frame(message: &impl Message) -> Bytes {
    let len = message.encoded_len();
    let mut buf = BytesMut::with_capacity(5 + len);
    buf.put_u8(0);
    buf.put_u32(len as u32);
    message.encode(&mut buf).expect("the buffer has room");
    buf.freeze()
}

/// A batch as Arrow IPC: its record batch `Message` (flatbuffer), then its body as chunks (the
/// batch's own buffers and frames, shared, not copied, with their alignment padding) and the
/// body's length. Batches whose layout this encoder does not write (sliced arrays,
/// dictionaries, views, unions) go through Arrow's IPC writer instead, which copies: while it
/// runs such a batch is held three times (as given, as one record batch, encoded). The
/// loader's batches never take that path.
///
/// # Errors
/// When Arrow cannot encode the batch.
pub fn ipc_parts(batch: &SampleBatch) -> Result<(Vec<u8>, Vec<Bytes>, usize), Status> {
    if let Some(body) = shared_body(batch) {
        return Ok((record_batch_header(batch.num_rows(), &body), body.chunks, body.len));
    }
    let batch = batch.to_record_batch().map_err(|e| Status::internal(format!("encoding a batch: {e}")))?;
    let mut tracker = ipc::writer::DictionaryTracker::new(false);
    let (dictionaries, encoded) = ipc::writer::IpcDataGenerator::default()
        .encode(&batch, &mut tracker, &IpcWriteOptions::default(), &mut ipc::writer::CompressionContext::default())
        .map_err(|e| Status::internal(format!("encoding a batch: {e}")))?;
    if !dictionaries.is_empty() {
        return Err(Status::internal("dictionary-encoded columns are not served"));
    }
    let len = encoded.arrow_data.len();
    Ok((encoded.ipc_message, vec![Bytes::from(encoded.arrow_data)], len))
}

/// A batch as the chunks of one gRPC frame holding a `FlightData` record batch message: the
/// prefixes, then the body's chunks from [`ipc_parts`].
///
/// # Errors
/// When the message would exceed gRPC's 4 GiB frame limit, or Arrow cannot encode the batch.
pub fn encode_batch(batch: &SampleBatch) -> Result<Vec<Bytes>, Status> {
    let (header, chunks, body_len) = ipc_parts(batch)?;
    let head = FlightData { data_header: header.into(), ..Default::default() };
    let mut prefix = BytesMut::with_capacity(5 + head.encoded_len() + 16);
    let body_key = prost::encoding::key_len(1000) + prost::encoding::encoded_len_varint(body_len as u64);
    let len = u32::try_from(head.encoded_len() + body_key + body_len)
        .map_err(|_| Status::resource_exhausted("a batch larger than 4 GiB cannot be one gRPC message; ask for smaller batches"))?;
    prefix.put_u8(0);
    prefix.put_u32(len);
    head.encode(&mut prefix).expect("the buffer has room");
    // FlightData.data_body is field 1000, length-delimited.
    prost::encoding::encode_key(1000, prost::encoding::WireType::LengthDelimited, &mut prefix);
    prost::encoding::encode_varint(body_len as u64, &mut prefix);
    Ok(std::iter::once(prefix.freeze()).chain(chunks).collect())
}

/// An IPC message body being laid out: buffer descriptors, field nodes and the chunks.
#[derive(Default)]
struct Body {
    nodes: Vec<ipc::FieldNode>,
    buffers: Vec<ipc::Buffer>,
    chunks: Vec<Bytes>,
    len: usize,
}

/// An Arrow buffer as the owner of [`Bytes`].
struct Shared(Buffer);

impl AsRef<[u8]> for Shared {
    fn as_ref(&self) -> &[u8] {
        self.0.as_slice()
    }
}

impl Body {
    /// Appends `range` of `buffer`, then padding to the alignment.
    fn push(&mut self, buffer: &Buffer, range: Range<usize>) -> Option<()> {
        if range.end > buffer.len() {
            return None;
        }
        let len = range.len();
        self.buffers.push(ipc::Buffer::new(self.len as i64, len as i64));
        if len > 0 {
            self.chunks.push(Bytes::from_owner(Shared(buffer.clone())).slice(range));
        }
        let pad = len.next_multiple_of(ALIGN) - len;
        if pad > 0 {
            self.chunks.push(Bytes::from_static(&PADDING[..pad]));
        }
        self.len += len + pad;
        Some(())
    }

    /// Appends one buffer made of `frames` (in order, shared), then padding to the alignment.
    fn push_frames(&mut self, frames: &FrameColumn) {
        let len = frames.len_bytes();
        self.buffers.push(ipc::Buffer::new(self.len as i64, len as i64));
        self.chunks.extend(frames.frames.iter().cloned());
        let pad = len.next_multiple_of(ALIGN) - len;
        if pad > 0 {
            self.chunks.push(Bytes::from_static(&PADDING[..pad]));
        }
        self.len += len + pad;
    }

    /// Lays out a camera column held as frames: a fixed-size list of `rows` samples without
    /// nulls, whose `uint8` values are the frames.
    fn push_frame_column(&mut self, rows: usize, frames: &FrameColumn) {
        self.nodes.push(ipc::FieldNode::new(rows as i64, 0));
        self.push_empty();
        self.nodes.push(ipc::FieldNode::new(frames.len_bytes() as i64, 0));
        self.push_empty();
        self.push_frames(frames);
    }

    /// Appends an empty buffer (an absent validity bitmap).
    fn push_empty(&mut self) {
        self.buffers.push(ipc::Buffer::new(self.len as i64, 0));
    }

    /// Lays out one array and its children, as Arrow's IPC writer does; `None` for layouts it
    /// leaves to that writer.
    fn push_array(&mut self, data: &ArrayData) -> Option<()> {
        let len = data.len();
        if data.offset() != 0 || matches!(data.data_type(), DataType::Null) {
            return None;
        }
        self.nodes.push(ipc::FieldNode::new(len as i64, data.null_count() as i64));
        match data.nulls() {
            Some(nulls) if nulls.null_count() > 0 => {
                if nulls.offset() != 0 {
                    return None;
                }
                self.push(nulls.buffer(), 0..len.div_ceil(8))?;
            }
            _ => self.push_empty(),
        }
        let buffers = data.buffers();
        match data.data_type() {
            DataType::Boolean => self.push(&buffers[0], 0..len.div_ceil(8)),
            DataType::Utf8 | DataType::Binary | DataType::LargeUtf8 | DataType::LargeBinary => {
                let end = self.push_offsets(&buffers[0], len, matches!(data.data_type(), DataType::LargeUtf8 | DataType::LargeBinary))?;
                self.push(&buffers[1], 0..end)
            }
            DataType::List(_) | DataType::LargeList(_) => {
                let end = self.push_offsets(&buffers[0], len, matches!(data.data_type(), DataType::LargeList(_)))?;
                self.push_child(&data.child_data()[0], end)
            }
            DataType::FixedSizeList(_, size) => self.push_child(&data.child_data()[0], len * usize::try_from(*size).ok()?),
            DataType::Struct(_) => data.child_data().iter().try_for_each(|child| self.push_child(child, len)),
            DataType::FixedSizeBinary(width) => self.push(&buffers[0], 0..len * usize::try_from(*width).ok()?),
            t if t.is_primitive() => self.push(&buffers[0], 0..len * t.primitive_width()?),
            _ => None,
        }
    }

    /// Appends the `len + 1` offsets (`i64` when `large`, else `i32`) of a variable-size array
    /// whose first offset is 0, and returns the last: how many values the array uses.
    fn push_offsets(&mut self, offsets: &Buffer, len: usize, large: bool) -> Option<usize> {
        let (first, end, width) = if large {
            let o: &[i64] = offsets.typed_data();
            (*o.first()?, *o.get(len)?, 8)
        } else {
            let o: &[i32] = offsets.typed_data();
            (i64::from(*o.first()?), i64::from(*o.get(len)?), 4)
        };
        (first == 0).then_some(())?;
        self.push(offsets, 0..(len + 1) * width)?;
        usize::try_from(end).ok()
    }

    /// A child array cut to the `len` values its parent uses.
    fn push_child(&mut self, child: &ArrayData, len: usize) -> Option<()> {
        if child.len() < len {
            return None;
        }
        if child.len() == len { self.push_array(child) } else { self.push_array(&child.slice(0, len)) }
    }
}

/// The batch's body, its buffers shared; `None` when a column's layout is left to Arrow's writer.
fn shared_body(batch: &SampleBatch) -> Option<Body> {
    let mut body = Body::default();
    for column in batch.columns() {
        match column {
            BatchColumn::Array(array) => body.push_array(&array.to_data())?,
            BatchColumn::Frames(frames) => body.push_frame_column(batch.num_rows(), frames),
        }
    }
    Some(body)
}

/// The IPC `Message` (flatbuffer) of a record batch laid out as `body`.
fn record_batch_header(rows: usize, body: &Body) -> Vec<u8> {
    let mut fbb = flatbuffers::FlatBufferBuilder::new();
    let buffers = fbb.create_vector(&body.buffers);
    let nodes = fbb.create_vector(&body.nodes);
    let header = {
        let mut b = ipc::RecordBatchBuilder::new(&mut fbb);
        b.add_length(rows as i64);
        b.add_nodes(nodes);
        b.add_buffers(buffers);
        b.finish().as_union_value()
    };
    let mut message = ipc::MessageBuilder::new(&mut fbb);
    message.add_version(ipc::MetadataVersion::V5);
    message.add_header_type(ipc::MessageHeader::RecordBatch);
    message.add_bodyLength(body.len as i64);
    message.add_header(header);
    let root = message.finish();
    fbb.finish(root, None);
    fbb.finished_data().to_vec()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::{
        array::{
            ArrayRef, BooleanArray, FixedSizeListArray, Float32Array, Int64Array, LargeStringArray, ListArray, RecordBatch, StringArray,
            StructArray, UInt8Array,
        },
        datatypes::{Field, Int32Type},
    };

    use super::*;

    /// The frame's chunks, parsed back as a client would: gRPC frame → FlightData → batch.
    fn round_trip(batch: &RecordBatch) -> (RecordBatch, bool) {
        round_trip_samples(&SampleBatch::from(batch.clone()))
    }

    fn round_trip_samples(batch: &SampleBatch) -> (RecordBatch, bool) {
        let shared = shared_body(batch).is_some();
        let chunks = encode_batch(batch).expect("encodes");
        let frame: Vec<u8> = chunks.iter().flat_map(|c| c.iter().copied()).collect();
        let len = u32::from_be_bytes(frame[1..5].try_into().expect("4 bytes")) as usize;
        assert_eq!((frame[0], frame.len()), (0, 5 + len), "one whole uncompressed gRPC message");
        let data = FlightData::decode(&frame[5..]).expect("a FlightData");
        let decoded = arrow_flight::utils::flight_data_to_arrow_batch(&data, batch.schema(), &Default::default()).expect("a record batch");
        (decoded, shared)
    }

    fn batch(columns: Vec<(&str, ArrayRef)>) -> RecordBatch {
        RecordBatch::try_from_iter(columns).expect("batch")
    }

    #[test]
    fn batches_of_every_served_layout_decode_to_themselves_without_copies() {
        let frames = UInt8Array::from_iter_values((0..4 * 2 * 3).map(|i| i as u8));
        let frames = FixedSizeListArray::new(Arc::new(Field::new("item", DataType::UInt8, false)), 6, Arc::new(frames), None);
        let windows = FixedSizeListArray::new(
            Arc::new(Field::new("item", DataType::Float32, true)),
            3,
            Arc::new(Float32Array::from(vec![
                Some(1.0),
                None,
                Some(3.5),
                Some(-1.0),
                Some(0.0),
                None,
                Some(7.0),
                Some(8.0),
                Some(9.0),
                None,
                None,
                None,
            ])),
            Some(vec![true, true, true, false].into()),
        );
        let lists =
            ListArray::from_iter_primitive::<Int32Type, _, _>(vec![Some(vec![Some(1), None]), None, Some(vec![]), Some(vec![Some(4)])]);
        let parts = StructArray::from(vec![
            (Arc::new(Field::new("a", DataType::Int64, false)), Arc::new(Int64Array::from(vec![1, 2, 3, 4])) as ArrayRef),
            (
                Arc::new(Field::new("b", DataType::Boolean, true)),
                Arc::new(BooleanArray::from(vec![Some(true), None, Some(false), Some(true)])),
            ),
        ]);
        let b = batch(vec![
            ("index", Arc::new(Int64Array::from(vec![10, 11, 12, 13])) as ArrayRef),
            ("task", Arc::new(StringArray::from(vec![Some("pick"), None, Some(""), Some("place the cube")]))),
            ("large", Arc::new(LargeStringArray::from(vec!["a", "bb", "ccc", "dddd"]))),
            ("pad", Arc::new(BooleanArray::from(vec![false, true, false, false, true, true, false, true, true]).slice(0, 4))),
            ("frames", Arc::new(frames)),
            ("window", Arc::new(windows)),
            ("lists", Arc::new(lists)),
            ("parts", Arc::new(parts)),
        ]);
        let (decoded, shared) = round_trip(&b);
        assert!(shared, "every column written from its own buffers");
        assert_eq!(decoded, b);
    }

    #[test]
    fn sliced_batches_take_the_copying_writer_and_still_decode() {
        let b = batch(vec![
            ("index", Arc::new(Int64Array::from_iter_values(0..100)) as ArrayRef),
            ("task", Arc::new(StringArray::from_iter_values((0..100).map(|i| format!("task {i}"))))),
        ]);
        let part = b.slice(17, 40);
        let (decoded, shared) = round_trip(&part);
        assert!(!shared);
        assert_eq!(decoded, part);
        let (decoded, _) = round_trip(&b.slice(0, 0));
        assert_eq!(decoded.num_rows(), 0);
    }

    /// A camera column held as frames (one shown in two slots) is sent from them and arrives
    /// as the column the frames make.
    #[test]
    fn camera_columns_held_as_frames_are_sent_from_them() {
        let item = Arc::new(Field::new("item", DataType::UInt8, false));
        let schema = Arc::new(arrow::datatypes::Schema::new(vec![
            Field::new("index", DataType::Int64, false),
            Field::new("camera", DataType::FixedSizeList(item, 2 * 5), false),
            Field::new("wrist", DataType::FixedSizeList(Arc::new(Field::new("item", DataType::UInt8, false)), 3), false),
        ]));
        let frame = |v: u8, n: usize| bytes::Bytes::from(vec![v; n]);
        let (a, b) = (frame(1, 5), frame(2, 5));
        let camera = FrameColumn { frames: vec![a.clone(), a, b.clone(), b], frame_bytes: 5 };
        let wrist = FrameColumn { frames: vec![frame(7, 3), frame(9, 3)], frame_bytes: 3 };
        let samples = SampleBatch::try_new(
            schema,
            vec![BatchColumn::Array(Arc::new(Int64Array::from(vec![4, 5]))), BatchColumn::Frames(camera), BatchColumn::Frames(wrist)],
            2,
        )
        .expect("valid");
        let (decoded, shared) = round_trip_samples(&samples);
        assert!(shared);
        assert_eq!(decoded, samples.to_record_batch().expect("batch"));
        let (decoded, _) = round_trip(&decoded.slice(1, 1));
        assert_eq!(decoded, samples.to_record_batch().expect("batch").slice(1, 1));
    }
}
