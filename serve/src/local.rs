//! Batch streams for trainers on the server's own machine, through shared memory
//! (`lake serve --local PATH`; the protocol is in [`lake_client::local`]).
//!
//! Each stream gets a segment of a few slots (a memfd the client maps once). A batch is laid out
//! as an Arrow IPC message and copied into a free slot, its one copy after the loader made it; the client's
//! arrays view the slot in place and give it back when dropped. With every slot taken the
//! stream waits for its trainer, as a gRPC stream waits on a full socket. Requests, tokens,
//! refusals, the memory budget and the batches are those of Flight's `DoGet`. A stream that
//! sent nothing for a second (its next batch is being made, or every slot is held) sends a
//! keepalive, so that its client can tell a server at work from one that stopped answering.

use std::{sync::Arc, time::Duration};

use arrow::ipc::writer::IpcWriteOptions;
use arrow_flight::{FlightData, SchemaAsIpc};
use futures::StreamExt;
use lake_client::local::{SharedMemory, send_message_with_fd, wire};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{
        UnixListener, UnixStream,
        unix::{OwnedReadHalf, OwnedWriteHalf},
    },
    sync::mpsc,
    time::{Interval, MissedTickBehavior},
};

use lake_loader::Spawned;

use super::{Footprint, Refusal, Service, refusal};

/// How long a new connection may take to send its request.
const HELLO_WAIT: Duration = Duration::from_secs(10);

/// Slot sizes are rounded up to this: room for later batches whose strings run a little
/// longer (a batch that outgrows it gets a new segment), and little beyond the batch size the
/// memory budget counts.
const SLOT_ROUNDING: usize = 1 << 20;

/// Accepts local streams until `stop` completes, each served on its own task, then waits for
/// the open ones to end (the service is shutting down: each ends after the batch it is on;
/// the caller bounds the wait).
pub async fn serve(service: Arc<Service>, listener: UnixListener, stop: impl std::future::Future<Output = ()>) {
    let mut stop = std::pin::pin!(stop);
    let mut open = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((socket, _)) => {
                    let service = service.clone();
                    open.spawn(async move {
                        if let Err(e) = connection(service, socket).await {
                            tracing::debug!("a local stream ended early: {e}");
                        }
                    });
                }
                // Out of descriptors, say: waited out as the TCP listeners do, not retried at
                // once (the pending connection would make every retry fail alike).
                Err(e) => {
                    tracing::warn!("accepting a local stream: {e}; trying again in 1 s");
                    tokio::select! {
                        () = tokio::time::sleep(Duration::from_secs(1)) => {}
                        () = &mut stop => break,
                    }
                }
            },
            Some(_) = open.join_next(), if !open.is_empty() => {}
            () = &mut stop => break,
        }
    }
    drop(listener);
    while open.join_next().await.is_some() {}
}

/// The message refusing or failing a stream, as its code and text.
fn error_message(e: &crate::Error) -> Vec<u8> {
    let (kind, message) = refusal(e);
    let code = match kind {
        Refusal::BadRequest => "bad_request",
        Refusal::NotFound => "not_found",
        Refusal::Busy => "busy",
        Refusal::TooLarge => "resources_exhausted",
        Refusal::Unavailable | Refusal::StoreUnavailable => "unavailable",
        Refusal::Internal => "internal",
        Refusal::Frame => "frame",
        Refusal::ReadOnly => "read_only",
    };
    wire::error(code, &message)
}

/// One client message: its kind and payload.
async fn read_message(reader: &mut OwnedReadHalf) -> std::io::Result<(u8, Vec<u8>)> {
    let len = reader.read_u32_le().await? as usize;
    if len == 0 || len > wire::MAX_MESSAGE {
        return Err(std::io::Error::other(format!("a message of {len} bytes")));
    }
    let mut message = vec![0; len];
    reader.read_exact(&mut message).await?;
    let kind = message.remove(0);
    Ok((kind, message))
}

/// The request in a hello (kind `H`): slots, token, JSON.
fn hello(message: &[u8]) -> Option<(u32, &[u8], &[u8])> {
    let slots = u32::from_le_bytes(message.get(..4)?.try_into().ok()?);
    let (token, request) = token_and_request(message.get(4..)?)?;
    Some((slots, token, request))
}

/// The token and JSON request of a hello (after its slots) or a describe.
fn token_and_request(message: &[u8]) -> Option<(&[u8], &[u8])> {
    let token_len = u32::from_le_bytes(message.get(..4)?.try_into().ok()?) as usize;
    Some((message.get(4..4 + token_len)?, message.get(4 + token_len..)?))
}

/// Ticks a second after the last message a stream sent, and every second after that.
fn keepalives() -> Interval {
    let mut every = tokio::time::interval_at(tokio::time::Instant::now() + wire::KEEPALIVE_EVERY, wire::KEEPALIVE_EVERY);
    every.set_missed_tick_behavior(MissedTickBehavior::Delay);
    every
}

/// Sends a keepalive.
async fn keepalive(writer: &mut OwnedWriteHalf) -> std::io::Result<()> {
    writer.write_all(&wire::frame(wire::KEEPALIVE, &[])).await
}

/// Runs `work`, sending keepalives while it takes.
async fn keeping_alive<T>(writer: &mut OwnedWriteHalf, work: impl std::future::Future<Output = T>) -> std::io::Result<T> {
    let mut work = std::pin::pin!(work);
    let mut every = keepalives();
    loop {
        tokio::select! {
            out = &mut work => return Ok(out),
            _ = every.tick() => keepalive(writer).await?,
        }
    }
}

/// Answers a describe (kind `Q`): the schema and the epoch shape, as `GetFlightInfo` does.
async fn describe(service: &Service, message: &[u8], writer: &mut OwnedWriteHalf) -> std::io::Result<()> {
    let Some((token, request)) = token_and_request(message) else {
        service.metrics.bad_requests.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        return writer.write_all(&wire::error("bad_request", "a describe holds a token and a request")).await;
    };
    if !service.authorized(std::str::from_utf8(token).ok().filter(|t| !t.is_empty())) {
        return writer.write_all(&wire::error("unauthorized", "a valid bearer token is required")).await;
    }
    let plan = match service.parse_request(request) {
        // The smallest a local stream holds: one slot.
        Ok(request) => keeping_alive(writer, service.describe(&request, super::Footprint::shared_memory(1))).await?,
        Err(e) => Err(e),
    };
    let plan = match plan {
        Ok(plan) => plan,
        Err(e) => return writer.write_all(&error_message(&e)).await,
    };
    let head: FlightData = SchemaAsIpc::new(&plan.schema, &IpcWriteOptions::default()).into();
    writer.write_all(&wire::frame(wire::SCHEMA, &[&head.data_header])).await?;
    writer.write_all(&wire::frame(wire::PLAN, &[plan.shape_json().as_bytes()])).await
}

/// The slots of a stream: its newest segment and which of its slots the client has free.
struct Ring {
    id: u32,
    memory: SharedMemory,
    slot_bytes: usize,
    slots: u32,
    free: Vec<u32>,
}

impl Ring {
    /// A slot the client gave back, if it is one of this segment's (an older segment's slots
    /// are forgotten with it).
    fn release(&mut self, (segment, slot): (u32, u32)) {
        if segment == self.id && slot < self.slots && !self.free.contains(&slot) {
            self.free.push(slot);
        }
    }
}

async fn connection(service: Arc<Service>, socket: UnixStream) -> std::io::Result<()> {
    let (mut reader, mut writer) = socket.into_split();
    let (kind, message) = tokio::time::timeout(HELLO_WAIT, read_message(&mut reader))
        .await
        .map_err(|_| std::io::Error::other("no request within 10 s"))??;
    if kind == wire::DESCRIBE {
        return describe(&service, &message, &mut writer).await;
    }
    let refuse = |what: &str| {
        service.metrics.bad_requests.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        wire::error("bad_request", what)
    };
    let Some((slots, token, request)) = hello(&message).filter(|_| kind == wire::HELLO) else {
        return writer.write_all(&refuse("the first message must be a hello or a describe with the request")).await;
    };
    if !(1..=wire::MAX_SLOTS).contains(&slots) {
        return writer.write_all(&refuse(&format!("a stream has 1 to {} slots, not {slots}", wire::MAX_SLOTS))).await;
    }
    if !service.authorized(std::str::from_utf8(token).ok().filter(|t| !t.is_empty())) {
        return writer.write_all(&wire::error("unauthorized", "a valid bearer token is required")).await;
    }
    let request = match service.parse_request(request) {
        Ok(r) => r,
        Err(e) => return writer.write_all(&error_message(&e)).await,
    };
    let (schema, mut batches) = match keeping_alive(&mut writer, service.batches_held(&request, Footprint::shared_memory(slots))).await? {
        Ok(b) => b,
        Err(e) => return writer.write_all(&error_message(&e)).await,
    };
    let head: FlightData = SchemaAsIpc::new(&schema, &IpcWriteOptions::default()).into();
    writer.write_all(&wire::frame(wire::SCHEMA, &[&head.data_header])).await?;

    // The client's messages (slots it gives back) arrive on their own task; the channel closes
    // when the client goes away, which ends the stream and its work. A client gives back at most
    // the slots of two segments (the one it reads, and the one it read before) between two of
    // the stream's turns, so the channel holds that many; a client that sends more waits (its
    // socket fills) instead of growing the server's memory.
    let (given_back, mut released) = mpsc::channel(2 * wire::MAX_SLOTS as usize);
    let _reading = Spawned(tokio::spawn(async move {
        while let Ok((kind, m)) = read_message(&mut reader).await {
            if kind != wire::RELEASE || m.len() != 8 {
                break;
            }
            let slot = (u32::from_le_bytes(m[..4].try_into().expect("4 bytes")), u32::from_le_bytes(m[4..].try_into().expect("4 bytes")));
            if given_back.send(slot).await.is_err() {
                break;
            }
        }
    }));
    let mut ring: Option<Ring> = None;
    let mut segments = 0u32;
    let mut every = keepalives();
    loop {
        let item = loop {
            tokio::select! {
                biased;
                slot = released.recv() => match (slot, ring.as_mut()) {
                    (Some(slot), Some(ring)) => ring.release(slot),
                    (Some(_), None) => {}
                    (None, _) => return Ok(()),
                },
                item = batches.next() => break item,
                _ = every.tick() => keepalive(&mut writer).await?,
            }
        };
        let batch = match item {
            None => return writer.write_all(&wire::frame(wire::DONE, &[])).await,
            Some(Err(e)) => return writer.write_all(&error_message(&e)).await,
            Some(Ok(batch)) => batch,
        };
        let (header, body, body_len) = match super::do_get::ipc_parts(&batch) {
            Ok(parts) => parts,
            Err(status) => return writer.write_all(&wire::error("internal", status.message())).await,
        };
        drop(batch);
        let prefix = wire::message_prefix(&header);
        let len = prefix.len() + body_len;
        let chunks: Vec<bytes::Bytes> = std::iter::once(bytes::Bytes::from(prefix)).chain(body).collect();
        if ring.as_ref().is_none_or(|r| r.slot_bytes < len) {
            let slot_bytes = (len + 1).next_multiple_of(SLOT_ROUNDING);
            let memory = SharedMemory::create(slot_bytes * slots as usize)?;
            segments += 1;
            let announce = wire::frame(wire::SEGMENT, &[&segments.to_le_bytes(), &slots.to_le_bytes(), &(slot_bytes as u64).to_le_bytes()]);
            send_message_with_fd(writer.as_ref(), &announce, memory.fd()).await?;
            ring = Some(Ring { id: segments, memory, slot_bytes, slots, free: (0..slots).rev().collect() });
        }
        let ring = ring.as_mut().expect("made above");
        let slot = loop {
            if let Some(slot) = ring.free.pop() {
                break slot;
            }
            tokio::select! {
                slot = released.recv() => match slot {
                    Some(slot) => ring.release(slot),
                    None => return Ok(()),
                },
                _ = every.tick() => keepalive(&mut writer).await?,
            }
        };
        if !ring.memory.write_at(slot as usize * ring.slot_bytes, &chunks) {
            return writer.write_all(&wire::error("internal", "a batch larger than its slot")).await;
        }
        drop(chunks);
        let placed = [ring.id.to_le_bytes(), slot.to_le_bytes()].concat();
        writer.write_all(&wire::frame(wire::BATCH, &[&placed, &(len as u64).to_le_bytes()])).await?;
        every.reset();
    }
}

/// Binds the local socket at `path`, replacing a socket left there by a server that is gone.
///
/// # Errors
/// When `path` exists and is not a socket, a live server answers on it, or it cannot be bound.
pub async fn bind(path: &std::path::Path) -> std::io::Result<UnixListener> {
    use std::os::unix::fs::FileTypeExt;
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(std::io::Error::other(format!("{} exists and is not a socket", path.display())));
        }
        if UnixStream::connect(path).await.is_ok() {
            return Err(std::io::Error::other(format!("a server is already listening on {}", path.display())));
        }
        std::fs::remove_file(path)?;
    }
    UnixListener::bind(path)
}
