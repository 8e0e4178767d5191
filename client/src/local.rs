//! Batches for trainers on the machine that runs `lake serve`, through shared memory.
//!
//! Over loopback TCP every byte of a batch is copied three times after the server has made it:
//! into the kernel, out of it, and into gRPC's message buffer. At ~1 GB/s of frames that is a
//! sizeable share of a machine whose cores also decode. `lake serve --local PATH` listens on a
//! Unix socket as well; a stream opened there has its batches written once into a few slots of
//! shared memory (a memfd the server hands over with the first batch), and the client's record
//! batches are views of those slots. A slot holds one Arrow IPC message as the IPC stream format
//! frames it (continuation marker, metadata length, `Message` flatbuffer padded to 64 bytes,
//! body), so any Arrow implementation that maps the segment reads the batch in place. A slot goes back to the server when the last array of its
//! batch is dropped, so the slots also bound how far the server runs ahead of its trainer.
//!
//! The protocol, over a stream socket: every message is `[len: u32 LE][kind: u8][payload]`,
//! `len` counting the kind and the payload; integers are little-endian.
//!
//! | from | kind | payload |
//! |---|---|---|
//! | client | `H` hello | `slots: u32`, `token_len: u32`, the bearer token, the JSON sampling request |
//! | client | `R` release | `segment: u32`, `slot: u32` |
//! | client | `Q` describe | `token_len: u32`, the bearer token, the JSON sampling request (instead of a hello) |
//! | server | `S` schema | the Arrow IPC `Message` flatbuffer of the batches' schema |
//! | server | `P` plan | JSON `{"epoch_len": …, "steps_per_epoch": …, "datasets": […]}` (the request's datasets pinned to `NAME@VERSION`): the answer to a describe, after the schema |
//! | server | `M` segment | `id: u32`, `slots: u32`, `slot_bytes: u64`; the memfd rides along (`SCM_RIGHTS`) |
//! | server | `B` batch | `segment: u32`, `slot: u32`, `len: u64`: the slot's first `len` bytes hold an IPC record batch message |
//! | server | `D` done | nothing: the stream reached its limit, or the server is shutting down |
//! | server | `E` error | JSON `{"code": …, "message": …}`: the request was refused, or the stream failed |
//! | server | `K` keepalive | nothing: sent every second in which the server sent nothing else |
//!
//! A describe is answered with the schema and the plan, or an error, and the connection closes.
//! Keepalives let a client tell a server that works on its next batch (or waits for a slot)
//! from one that stopped answering (frozen, or too loaded to run): a client gives up on a server
//! that sent nothing for a while (a minute by default), as gRPC's keepalive pings do over Flight.
//!
//! A server uses only its newest segment; it sends a larger one when a batch outgrows the
//! slots, and the client unmaps an older one once no batch of it is alive.

use std::{
    collections::{HashMap, VecDeque},
    io,
    os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd},
    path::{Path, PathBuf},
    ptr::NonNull,
    sync::{
        Arc,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};

use tokio::time::Instant;

use arrow::{
    array::RecordBatch,
    buffer::Buffer,
    datatypes::{Schema, SchemaRef},
};
use arrow_flight::FlightData;
use bytes::{Buf, Bytes, BytesMut};
use tokio::{io::Interest, net::UnixStream, sync::mpsc};

use crate::{
    Error, Result, SampleRequest,
    stream::{RemoteBatches, StreamPlan},
};

/// Message kinds and framing shared by the client and `lake serve`.
pub mod wire {
    /// Client: the request.
    pub const HELLO: u8 = b'H';
    /// Client: a slot is free again.
    pub const RELEASE: u8 = b'R';
    /// Client: describe a request instead of streaming it.
    pub const DESCRIBE: u8 = b'Q';
    /// Server: the batches' schema.
    pub const SCHEMA: u8 = b'S';
    /// Server: the shape of a described request's epochs.
    pub const PLAN: u8 = b'P';
    /// Server: a new segment of slots (its memfd attached).
    pub const SEGMENT: u8 = b'M';
    /// Server: a batch in a slot.
    pub const BATCH: u8 = b'B';
    /// Server: the stream ended.
    pub const DONE: u8 = b'D';
    /// Server: refused or failed.
    pub const ERROR: u8 = b'E';
    /// Server: still there (sent whenever a second passed without another message).
    pub const KEEPALIVE: u8 = b'K';
    /// How often an otherwise quiet server sends a keepalive.
    pub const KEEPALIVE_EVERY: std::time::Duration = std::time::Duration::from_secs(1);
    /// Largest message either side accepts (a hello holds the request; a batch message its IPC
    /// metadata).
    pub const MAX_MESSAGE: usize = 16 << 20;
    /// Slots a client asks for unless told otherwise: one batch in the trainer's hands, one
    /// being written (the server prepares further batches in its own memory meanwhile). A
    /// stream then holds as much of the server's memory budget as a Flight stream.
    pub const DEFAULT_SLOTS: u32 = 2;
    /// Most slots a stream may ask for.
    pub const MAX_SLOTS: u32 = 16;

    /// One message: length, kind, then the parts of the payload back to back.
    #[must_use]
    pub fn frame(kind: u8, parts: &[&[u8]]) -> Vec<u8> {
        let len = 1 + parts.iter().map(|p| p.len()).sum::<usize>();
        let mut out = Vec::with_capacity(4 + len);
        out.extend_from_slice(&u32::try_from(len).expect("messages stay far below 4 GiB").to_le_bytes());
        out.push(kind);
        for p in parts {
            out.extend_from_slice(p);
        }
        out
    }

    /// IPC's continuation marker, before each message's metadata length.
    const CONTINUATION: [u8; 4] = [0xff; 4];
    /// Where the body of an encapsulated message starts: its prefix and metadata are padded to
    /// this (Arrow's writer pads to 64 bytes too).
    const ALIGN: usize = 64;

    /// The prefix of an encapsulated IPC message: continuation marker, metadata length, the
    /// `Message` flatbuffer, padding; the body follows it.
    #[must_use]
    pub fn message_prefix(header: &[u8]) -> Vec<u8> {
        let padded = (8 + header.len()).next_multiple_of(ALIGN);
        let mut out = Vec::with_capacity(padded);
        out.extend_from_slice(&CONTINUATION);
        out.extend_from_slice(&i32::try_from(padded - 8).expect("metadata stays far below 2 GiB").to_le_bytes());
        out.extend_from_slice(header);
        out.resize(padded, 0);
        out
    }

    /// Where an encapsulated IPC message keeps its metadata and its body.
    #[must_use]
    pub fn split_message(message: &[u8]) -> Option<(std::ops::Range<usize>, std::ops::Range<usize>)> {
        if message.get(..4)? != CONTINUATION {
            return None;
        }
        let meta = usize::try_from(i32::from_le_bytes(message.get(4..8)?.try_into().ok()?)).ok()?;
        let body = 8usize.checked_add(meta).filter(|&b| b <= message.len())?;
        Some((8..body, body..message.len()))
    }

    /// The refusal or failure message.
    #[must_use]
    pub fn error(code: &str, message: &str) -> Vec<u8> {
        frame(ERROR, &[serde_json::json!({"code": code, "message": message}).to_string().as_bytes()])
    }
}

/// A shared memory segment mapped into this process: a memfd, created here (read-write) or
/// received from the server (read-only). Unmapped when dropped.
#[derive(Debug)]
pub struct SharedMemory {
    ptr: NonNull<u8>,
    len: usize,
    fd: OwnedFd,
}

// SAFETY: the mapping is plain memory owned by this value; writes go through `write_at`, whose
// callers own the range they write (a slot the client has given back).
unsafe impl Send for SharedMemory {}
// SAFETY: as above; `&SharedMemory` only reads, or writes ranges no reader is using.
unsafe impl Sync for SharedMemory {}

impl SharedMemory {
    /// A new segment of `len` bytes (zeroed), mapped read-write.
    ///
    /// # Errors
    /// When the kernel refuses the memfd or the mapping.
    pub fn create(len: usize) -> io::Result<Self> {
        // SAFETY: a NUL-terminated name and valid flags; the result is checked.
        let raw = unsafe { libc::memfd_create(c"lake-batches".as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a new descriptor this function owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let size = libc::off_t::try_from(len).map_err(|_| io::Error::other("segment too large"))?;
        // SAFETY: `fd` is an open memfd.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), size) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Self::map(fd, len, true)
    }

    /// Maps `len` bytes of a segment received from the server, read-only.
    ///
    /// # Errors
    /// When the descriptor is smaller than `len` or cannot be mapped.
    pub fn open(fd: OwnedFd, len: usize) -> io::Result<Self> {
        // SAFETY: `stat` is plain data filled by fstat on an open descriptor.
        let size = unsafe {
            let mut stat: libc::stat = std::mem::zeroed();
            if libc::fstat(fd.as_raw_fd(), &raw mut stat) != 0 {
                return Err(io::Error::last_os_error());
            }
            stat.st_size
        };
        if usize::try_from(size).ok().is_none_or(|s| s < len) {
            return Err(io::Error::other(format!("a segment of {size} bytes announced as {len}")));
        }
        Self::map(fd, len, false)
    }

    fn map(fd: OwnedFd, len: usize, writable: bool) -> io::Result<Self> {
        if len == 0 {
            return Err(io::Error::other("an empty segment"));
        }
        let prot = if writable { libc::PROT_READ | libc::PROT_WRITE } else { libc::PROT_READ };
        // SAFETY: a fresh shared mapping of an open descriptor at least `len` bytes long; the
        // result is checked.
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, fd.as_raw_fd(), 0) };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Self { ptr: NonNull::new(ptr.cast()).expect("mmap does not return null on success"), len, fd })
    }

    /// The segment's descriptor (to hand to a client).
    #[must_use]
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Length in bytes.
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the segment is empty (never: segments have at least one byte).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies `chunks` back to back from `offset` on; false when they do not fit.
    ///
    /// The caller owns the range: no batch a client holds lies in it.
    #[must_use]
    pub fn write_at(&self, offset: usize, chunks: &[Bytes]) -> bool {
        let total: usize = chunks.iter().map(Bytes::len).sum();
        if offset.checked_add(total).is_none_or(|end| end > self.len) {
            return false;
        }
        let mut at = offset;
        for c in chunks {
            // SAFETY: `at + c.len() <= self.len` (checked above), the mapping is writable on
            // the server, and a chunk (heap memory) never overlaps the mapping.
            unsafe { std::ptr::copy_nonoverlapping(c.as_ptr(), self.ptr.as_ptr().add(at), c.len()) };
            at += c.len();
        }
        true
    }
}

impl Drop for SharedMemory {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `map`, which nothing borrows any more (the
        // buffers that view it hold an `Arc` of this value).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// A `msghdr` over one buffer and the first `control_len` bytes of a control buffer (u64s keep
/// it aligned for `cmsghdr`).
fn msghdr(iov: &mut libc::iovec, control: &mut [u64], control_len: usize) -> libc::msghdr {
    debug_assert!(control_len <= std::mem::size_of_val(control));
    // SAFETY: msghdr is plain data, for which all zeroes is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = control_len as _;
    msg
}

/// Sends `bytes` with `pass` attached as `SCM_RIGHTS`; returns how many bytes went.
fn send_with_fd(socket: RawFd, bytes: &[u8], pass: RawFd) -> io::Result<usize> {
    let mut iov = libc::iovec { iov_base: bytes.as_ptr().cast_mut().cast(), iov_len: bytes.len() };
    let mut control = [0u64; 8];
    // SAFETY: the header points at live locals, the control buffer (64 bytes) holds one cmsghdr
    // with one descriptor, and sendmsg's result is checked.
    unsafe {
        let msg = msghdr(&mut iov, &mut control, libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) as usize);
        let cmsg = libc::CMSG_FIRSTHDR(&raw const msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<libc::c_int>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::c_int>(), pass);
        let n = libc::sendmsg(socket, &raw const msg, libc::MSG_NOSIGNAL);
        if n < 0 { Err(io::Error::last_os_error()) } else { Ok(n as usize) }
    }
}

/// Receives into `buf`'s spare room, keeping any descriptors that come along in `fds`.
fn recv_with_fds(socket: RawFd, buf: &mut BytesMut, fds: &mut VecDeque<OwnedFd>) -> io::Result<usize> {
    buf.reserve(64 << 10);
    let spare = buf.spare_capacity_mut();
    let mut iov = libc::iovec { iov_base: spare.as_mut_ptr().cast(), iov_len: spare.len() };
    let mut control = [0u64; 32];
    let control_len = std::mem::size_of_val(&control);
    // SAFETY: the header points at live locals; recvmsg writes at most `iov_len` bytes into the
    // spare capacity (then counted with set_len) and at most `msg_controllen` into `control`;
    // the control messages are walked with the CMSG macros within that length, and each
    // received descriptor is owned from here on.
    unsafe {
        let mut msg = msghdr(&mut iov, &mut control, control_len);
        let n = libc::recvmsg(socket, &raw mut msg, libc::MSG_CMSG_CLOEXEC);
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut cmsg = libc::CMSG_FIRSTHDR(&raw const msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg).cast::<libc::c_int>();
                let count = ((*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / std::mem::size_of::<libc::c_int>();
                for i in 0..count {
                    fds.push_back(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&raw const msg, cmsg);
        }
        if msg.msg_flags & libc::MSG_CTRUNC != 0 {
            return Err(io::Error::other("the server sent more descriptors than expected"));
        }
        buf.set_len(buf.len() + n as usize);
        Ok(n as usize)
    }
}

/// Writes one message with `pass` attached to its first bytes.
///
/// # Errors
/// When the socket fails (the peer went away).
pub async fn send_message_with_fd(socket: &UnixStream, message: &[u8], pass: BorrowedFd<'_>) -> io::Result<()> {
    let sent = loop {
        socket.writable().await?;
        match socket.try_io(Interest::WRITABLE, || send_with_fd(socket.as_raw_fd(), message, pass.as_raw_fd())) {
            Ok(n) => break n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    };
    write_all(socket, &message[sent..]).await
}

/// Writes all of `bytes` through a shared reference to the socket.
async fn write_all(socket: &UnixStream, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        socket.writable().await?;
        match socket.try_write(bytes) {
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Messages received from the server, and the descriptors that came with them.
#[derive(Default)]
struct Inbox {
    buf: BytesMut,
    fds: VecDeque<OwnedFd>,
}

impl Inbox {
    /// The next whole message in the buffer.
    fn take(&mut self) -> io::Result<Option<(u8, Bytes)>> {
        if self.buf.len() < 5 {
            return Ok(None);
        }
        let len = u32::from_le_bytes(self.buf[..4].try_into().expect("4 bytes")) as usize;
        if len == 0 || len > wire::MAX_MESSAGE {
            return Err(io::Error::other(format!("a message of {len} bytes from the server")));
        }
        if self.buf.len() < 4 + len {
            return Ok(None);
        }
        self.buf.advance(4);
        let mut message = self.buf.split_to(len).freeze();
        let kind = message.get_u8();
        Ok(Some((kind, message)))
    }

    /// The next message. Cancel-safe: what was read stays in the inbox.
    async fn next(&mut self, socket: &UnixStream) -> io::Result<(u8, Bytes)> {
        loop {
            if let Some(m) = self.take()? {
                return Ok(m);
            }
            socket.readable().await?;
            match socket.try_io(Interest::READABLE, || recv_with_fds(socket.as_raw_fd(), &mut self.buf, &mut self.fds)) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// The next message other than a keepalive, waiting at most `timeout` after `heard` (when the
/// server was last heard from, kept up to date here).
///
/// # Errors
/// As [`Inbox::next`]; [`io::ErrorKind::TimedOut`] when the server stayed silent.
async fn heard_from(inbox: &mut Inbox, socket: &UnixStream, heard: &mut Instant, timeout: Duration) -> io::Result<(u8, Bytes)> {
    loop {
        match tokio::time::timeout_at(*heard + timeout, inbox.next(socket)).await {
            Err(_) => return Err(io::Error::new(io::ErrorKind::TimedOut, silent(timeout))),
            Ok(Ok((wire::KEEPALIVE, _))) => *heard = Instant::now(),
            Ok(Ok(message)) => {
                *heard = Instant::now();
                return Ok(message);
            }
            Ok(Err(e)) => return Err(e),
        }
    }
}

/// What a client says of a server that sent nothing for `timeout`.
fn silent(timeout: Duration) -> String {
    format!("the server sent nothing for {:.1} s: it stopped answering (frozen, or too loaded to run)", timeout.as_secs_f64())
}

/// A slot of a segment, owned by the arrays of the batch in it; given back when dropped.
struct Slot {
    _memory: Arc<SharedMemory>,
    segment: u32,
    slot: u32,
    release: std::panic::AssertUnwindSafe<mpsc::UnboundedSender<(u32, u32)>>,
    /// Slots of the stream whose batches are alive.
    held: Arc<AtomicU32>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.held.fetch_sub(1, Ordering::Relaxed);
        // The stream may be gone; then the server is too, and nothing waits for the slot.
        let _ = self.release.send((self.segment, self.slot));
    }
}

/// How long a stream waits with every slot held by the trainer before it says so, by default.
const STALL_WARNING: Duration = Duration::from_secs(10);

/// How long a client waits for a server that sends nothing (not even keepalives), by default.
const SERVER_TIMEOUT: Duration = Duration::from_secs(60);

/// A connection to `lake serve --local PATH`: batch streams for trainers on the same machine,
/// in shared memory.
///
/// ```no_run
/// # async fn demo() -> lake_client::Result<()> {
/// use futures::StreamExt;
/// let local = lake_client::LocalLoader::new("/run/lake/serve.sock", None);
/// let mut request = lake_client::SampleRequest::new(["my_dataset"]);
/// (request.preset, request.limit_batches) = ("act".into(), Some(10));
/// let mut batches = local.stream(&request).await?;
/// while let Some(batch) = batches.next().await {
///     let batch = batch?; // its frames are views of the server's shared memory
/// #   let _ = batch;
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct LocalLoader {
    path: PathBuf,
    token: Option<String>,
    slots: u32,
    stall_warning: Duration,
    server_timeout: Duration,
    resume_wait: Duration,
}

fn refused(payload: &[u8]) -> Error {
    let value: serde_json::Value = serde_json::from_slice(payload).unwrap_or_default();
    let code = value["code"].as_str().unwrap_or("unknown");
    let message = format!("server: {} ({code})", value["message"].as_str().unwrap_or("no message"));
    // Shutting down, or its lake's object store unreachable: the stream can be taken up again.
    if code == "unavailable" { Error::Unavailable(message) } else { Error::Server(message) }
}

/// A failure to talk to the server at `path`: unavailable when no server is there (never
/// started, restarting, or gone leaving its socket file) or it went away or fell silent, as
/// Flight says of an address nothing answers at.
fn at(path: &Path, e: &io::Error) -> Error {
    let message = format!("{}: {e}", path.display());
    match e.kind() {
        io::ErrorKind::NotFound
        | io::ErrorKind::ConnectionRefused
        | io::ErrorKind::UnexpectedEof
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::BrokenPipe
        | io::ErrorKind::TimedOut => Error::Unavailable(message),
        _ => Error::Server(message),
    }
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

impl LocalLoader {
    /// A client of the server listening at `path`, sending `token` when given.
    pub fn new(path: impl AsRef<Path>, token: Option<String>) -> Self {
        Self {
            path: path.as_ref().to_path_buf(),
            token,
            slots: wire::DEFAULT_SLOTS,
            stall_warning: STALL_WARNING,
            server_timeout: SERVER_TIMEOUT,
            resume_wait: Duration::ZERO,
        }
    }

    /// Slots of shared memory per stream (1 to 16; default 2): batches the trainer may hold at
    /// once. The stream waits while the trainer holds them all, so a trainer that keeps every
    /// batch it reads (as `try_collect` does) needs as many slots as batches, or must copy them
    /// (a stream waiting so logs a warning, see [`with_stall_warning`](Self::with_stall_warning)).
    #[must_use]
    pub fn with_slots(mut self, slots: u32) -> Self {
        self.slots = slots.clamp(1, wire::MAX_SLOTS);
        self
    }

    /// How long a stream may wait for its next batch while the trainer holds a batch in every
    /// slot (so the server cannot write one) before it logs a warning saying so (default 10 s).
    #[must_use]
    pub fn with_stall_warning(mut self, after: Duration) -> Self {
        self.stall_warning = after;
        self
    }

    /// How long the server may send nothing, not even the keepalive it sends every second,
    /// before a stream (or a describe) ends with `unavailable` (default 60 s): a frozen server,
    /// or one too loaded to run, is then told from one working on the next batch.
    #[must_use]
    pub fn with_server_timeout(mut self, timeout: Duration) -> Self {
        self.server_timeout = timeout;
        self
    }

    /// How long a stream waits, in one outage, for its server to answer again (restarting, or
    /// its lake's object store unreachable): it asks again after pauses of 0.5 s doubling up to
    /// 5 s, and resumes after the last batch received once the server takes it; past that wait
    /// it ends with [`Error::Unavailable`]. Zero (the default): it ends at once. A request the
    /// server cannot plan is refused at once.
    #[must_use]
    pub fn with_resume_wait(mut self, wait: Duration) -> Self {
        self.resume_wait = wait;
        self
    }

    /// The schema of a sampling request's batches and the shape of its epochs, as the
    /// server plans it (what [`RemoteLoader::describe`](crate::RemoteLoader::describe) gives
    /// over Flight).
    ///
    /// # Errors
    /// As [`stream`](Self::stream).
    pub async fn describe(&self, request: &SampleRequest) -> Result<StreamPlan> {
        let at = |e: io::Error| at(&self.path, &e);
        let socket = UnixStream::connect(&self.path).await.map_err(at)?;
        let token = self.token.as_deref().unwrap_or("");
        let describe = wire::frame(wire::DESCRIBE, &[&(token.len() as u32).to_le_bytes(), token.as_bytes(), request.to_json().as_bytes()]);
        write_all(&socket, &describe).await.map_err(at)?;
        let (mut inbox, mut heard) = (Inbox::default(), Instant::now());
        let schema = read_schema(&mut inbox, &socket, &mut heard, self.server_timeout).await.map_err(at)??;
        match heard_from(&mut inbox, &socket, &mut heard, self.server_timeout).await.map_err(at)? {
            (wire::PLAN, payload) => StreamPlan::from_json(schema, &payload),
            (wire::ERROR, payload) => Err(refused(&payload)),
            (kind, _) => Err(Error::Server(format!("server: an unexpected message {kind} instead of the plan"))),
        }
    }

    /// Streams the batches of a sampling request, in order: the same batches as over Flight.
    /// With [`with_resume_wait`](Self::with_resume_wait), the stream waits out its server's
    /// outages and resumes after the last batch received, pinned to the dataset versions first
    /// planned.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when no server listens on the socket; otherwise the server's
    /// refusal (unknown dataset, bad request, missing token) with its message.
    pub async fn stream(&self, request: &SampleRequest) -> Result<RemoteBatches> {
        if self.resume_wait.is_zero() {
            return self.stream_once(request).await;
        }
        let plan = self.describe(request).await?;
        Ok(crate::resume::resumable(self.clone(), 0, request, &plan, self.resume_wait))
    }

    /// One stream of the request, ending at the first failure.
    async fn stream_once(&self, request: &SampleRequest) -> Result<RemoteBatches> {
        let at = |e: io::Error| at(&self.path, &e);
        let socket = UnixStream::connect(&self.path).await.map_err(at)?;
        let token = self.token.as_deref().unwrap_or("");
        let hello = wire::frame(
            wire::HELLO,
            &[&self.slots.to_le_bytes(), &(token.len() as u32).to_le_bytes(), token.as_bytes(), request.to_json().as_bytes()],
        );
        write_all(&socket, &hello).await.map_err(at)?;
        let (mut inbox, mut heard) = (Inbox::default(), Instant::now());
        let schema = read_schema(&mut inbox, &socket, &mut heard, self.server_timeout).await.map_err(at)??;
        let (batches, received) = mpsc::channel(self.slots as usize + 1);
        // The stream's task logs to the subscriber of the task that opened it.
        tokio::spawn(tracing::instrument::WithSubscriber::with_current_subscriber(receive(
            socket,
            inbox,
            schema,
            batches,
            Waits { slots: self.slots, stall_warning: self.stall_warning, heard, server_timeout: self.server_timeout },
        )));
        Ok(Box::pin(futures::stream::unfold(received, |mut r| async move { r.recv().await.map(|b| (b, r)) })))
    }
}

impl crate::resume::Servers for LocalLoader {
    fn count(&self) -> usize {
        1
    }

    fn name(&self, _: usize) -> String {
        self.path.display().to_string()
    }

    fn open(&self, _: usize, request: SampleRequest) -> futures::future::BoxFuture<'static, Result<RemoteBatches>> {
        let this = self.clone();
        Box::pin(async move { this.stream_once(&request).await })
    }
}

/// The server's first answer: the schema, or its refusal.
async fn read_schema(inbox: &mut Inbox, socket: &UnixStream, heard: &mut Instant, timeout: Duration) -> io::Result<Result<SchemaRef>> {
    Ok(match heard_from(inbox, socket, heard, timeout).await? {
        (wire::SCHEMA, header) => {
            let data = FlightData { data_header: header, ..Default::default() };
            Schema::try_from(&data).map(Arc::new).map_err(|e| Error::Server(format!("server: a bad schema: {e}")))
        }
        (wire::ERROR, payload) => Err(refused(&payload)),
        (kind, _) => Err(Error::Server(format!("server: an unexpected message {kind} before the schema"))),
    })
}

/// How a stream waits: for its trainer to give a slot back, and for its server.
struct Waits {
    slots: u32,
    stall_warning: Duration,
    /// When the server was last heard from.
    heard: Instant,
    server_timeout: Duration,
}

/// Reads the server's messages, sends the batches on, and gives slots back as their batches
/// are dropped; ends with the stream, or when its reader goes away.
async fn receive(
    socket: UnixStream,
    mut inbox: Inbox,
    schema: SchemaRef,
    batches: mpsc::Sender<Result<RecordBatch>>,
    Waits { slots, stall_warning, mut heard, server_timeout }: Waits,
) {
    let (release, mut released) = mpsc::unbounded_channel::<(u32, u32)>();
    let held = Arc::new(AtomicU32::new(0));
    let mut warned = false;
    let mut segments: HashMap<u32, (Arc<SharedMemory>, u64)> = HashMap::new();
    let failed = |what: String| Err(Error::Server(format!("server: {what}")));
    // Closed without an error message, or reset (a server killed with our give-backs unread):
    // the server stopped (or cut a client that held every slot through a shutdown) or went
    // away, as a Flight stream's UNAVAILABLE.
    let gone = || Error::Unavailable("server: the server closed the stream (it stopped or went away); resume from the next step".into());
    let closed =
        |e: &io::Error| matches!(e.kind(), io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe);
    // Whether the server closed its side: it may have sent the stream's end (or an error) just
    // before, still to be read, so slots given back after are not sent, and what it sent decides.
    let mut server_closed = false;
    loop {
        let message = tokio::select! {
            m = heard_from(&mut inbox, &socket, &mut heard, server_timeout) => m,
            Some((segment, slot)) = released.recv(), if !server_closed => {
                let message = wire::frame(wire::RELEASE, &[&segment.to_le_bytes(), &slot.to_le_bytes()]);
                match write_all(&socket, &message).await {
                    Ok(()) => {}
                    Err(e) if closed(&e) => server_closed = true,
                    Err(e) => {
                        // Never a silent end, which would read as the stream's last batch.
                        let _ = batches.send(Err(Error::Server(format!("server: the connection failed: {e}")))).await;
                        return;
                    }
                }
                continue;
            }
            () = batches.closed() => return,
            // Nothing for a while: stalled if the trainer holds a batch in every slot and has
            // taken every batch sent (the server cannot write the next one until it drops one).
            () = tokio::time::sleep(stall_warning), if !warned => {
                if held.load(Ordering::Relaxed) < slots || batches.capacity() < batches.max_capacity() {
                    continue;
                }
                warned = true;
                tracing::warn!(
                    "a local stream has waited {stall_warning:?} for its next batch while the trainer holds a batch in each of its \
                     {slots} slots: drop a batch (or copy it) before asking for the next, or ask for more slots"
                );
                continue;
            }
        };
        let item = match message {
            Ok((wire::SEGMENT, m)) if m.len() == 16 => {
                let (id, slots, slot_bytes) = (le_u32(&m, 0), le_u32(&m, 4), le_u64(&m, 8));
                let len = usize::try_from(slot_bytes).ok().and_then(|b| b.checked_mul(slots as usize));
                let mapped = match (inbox.fds.pop_front(), len) {
                    (Some(fd), Some(len)) => SharedMemory::open(fd, len).map_err(|e| format!("mapping its shared memory: {e}")),
                    (None, _) => Err("a segment without its descriptor".to_string()),
                    (_, None) => Err(format!("a segment of {slots} slots of {slot_bytes} bytes")),
                };
                match mapped {
                    Ok(memory) => {
                        // The server writes only into its newest segment; batches still alive
                        // in older ones keep theirs mapped.
                        segments.clear();
                        segments.insert(id, (Arc::new(memory), slot_bytes));
                        continue;
                    }
                    Err(what) => failed(what),
                }
            }
            Ok((wire::BATCH, m)) if m.len() == 16 => {
                let (segment, slot, len) = (le_u32(&m, 0), le_u32(&m, 4), le_u64(&m, 8));
                match segments.get(&segment) {
                    Some((memory, slot_bytes)) if len <= *slot_bytes && (u64::from(slot) + 1) * slot_bytes <= memory.len() as u64 => {
                        let offset = (u64::from(slot) * slot_bytes) as usize;
                        held.fetch_add(1, Ordering::Relaxed);
                        let owner = Slot {
                            _memory: memory.clone(),
                            segment,
                            slot,
                            release: std::panic::AssertUnwindSafe(release.clone()),
                            held: held.clone(),
                        };
                        // SAFETY: `offset + len` lies within the mapping (checked above), which
                        // `owner` keeps alive for as long as the buffer; the server leaves the
                        // slot alone until `owner` is dropped and gives it back.
                        let message = unsafe {
                            Buffer::from_custom_allocation(
                                NonNull::new(memory.ptr.as_ptr().add(offset)).expect("inside a mapping"),
                                len as usize,
                                Arc::new(owner),
                            )
                        };
                        match wire::split_message(&message) {
                            Some((header, body)) => {
                                crate::flight::batch_from_ipc(&message[header], &message.slice_with_length(body.start, body.len()), &schema)
                            }
                            None => failed(format!("slot {slot} of segment {segment} does not hold an IPC message")),
                        }
                    }
                    _ => failed(format!("a batch in slot {slot} of segment {segment}, which it did not send")),
                }
            }
            Ok((wire::DONE, _)) => return,
            Ok((wire::ERROR, payload)) => Err(refused(&payload)),
            Ok((kind, _)) => failed(format!("an unexpected message {kind}")),
            Err(e) if closed(&e) => Err(gone()),
            Err(e) if e.kind() == io::ErrorKind::TimedOut => Err(Error::Unavailable(format!("server: {e}; resume from the next step"))),
            Err(e) => failed(format!("the connection failed: {e}")),
        };
        let end = item.is_err();
        if batches.send(item).await.is_err() || end {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_segment_written_here_reads_back_through_its_descriptor() {
        let memory = SharedMemory::create(3 << 12).expect("memfd");
        let chunks = [Bytes::from_static(b"lake"), Bytes::from(vec![7u8; 5000])];
        assert!(memory.write_at(4096, &chunks));
        assert!(!memory.write_at((3 << 12) - 4, &chunks), "a write past the end is refused");
        let fd = memory.fd().try_clone_to_owned().expect("dup");
        let seen = SharedMemory::open(fd, 3 << 12).expect("mapped again");
        // SAFETY: both mappings are 12 KiB long and nothing writes while this reads.
        let bytes = unsafe { std::slice::from_raw_parts(seen.ptr.as_ptr(), seen.len()) };
        assert_eq!(&bytes[4096..4100], b"lake");
        assert!(bytes[4100..9100].iter().all(|&b| b == 7) && bytes[..4096].iter().all(|&b| b == 0));
        let fd = memory.fd().try_clone_to_owned().expect("dup");
        assert!(SharedMemory::open(fd, 4 << 12).is_err(), "a segment announced larger than it is");
    }

    #[test]
    fn encapsulated_messages_split_into_metadata_and_a_64_byte_aligned_body() {
        let header = vec![1u8; 100];
        let mut message = wire::message_prefix(&header);
        assert_eq!(message.len() % 64, 0);
        message.extend_from_slice(b"body");
        let (meta, body) = wire::split_message(&message).expect("a message");
        assert_eq!(&message[meta][..100], &header[..]);
        assert_eq!((body.start % 64, &message[body]), (0, &b"body"[..]));
        assert!(wire::split_message(b"not a message").is_none());
        let mut short = wire::message_prefix(&header);
        short.truncate(40);
        assert!(wire::split_message(&short).is_none(), "metadata running past the end");
    }

    /// A server that sends three batches into one slot, then its end, and closes at once: the
    /// trainer gives a slot back while the end waits unread, and the stream still ends cleanly
    /// (the end decides, not the failed give-back), every time.
    #[tokio::test]
    async fn a_slot_given_back_after_the_server_closed_still_ends_the_stream_cleanly() {
        use arrow::{
            array::Int64Array,
            datatypes::{DataType, Field},
            ipc::writer::{DictionaryTracker, IpcDataGenerator, IpcWriteOptions},
        };
        use futures::StreamExt;
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
        let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(Int64Array::from(vec![1, 2, 3]))]).expect("batch");
        let (ipc, options) = (IpcDataGenerator::default(), IpcWriteOptions::default());
        let schema_header = ipc.schema_to_bytes_with_dictionary_tracker(&schema, &mut DictionaryTracker::new(false), &options).ipc_message;
        let (_, encoded) = ipc.encode(&batch, &mut DictionaryTracker::new(false), &options, &mut Default::default()).expect("encode");
        let mut message = wire::message_prefix(&encoded.ipc_message);
        message.extend_from_slice(&encoded.arrow_data);
        let dir = tempfile::tempdir().expect("tmp");
        for round in 0..40 {
            let path = dir.path().join(format!("s{round}.sock"));
            let listener = tokio::net::UnixListener::bind(&path).expect("bind");
            let (schema_header, message) = (schema_header.clone(), message.clone());
            let server = tokio::spawn(async move {
                let (socket, _) = listener.accept().await.expect("accept");
                let mut inbox = Inbox::default();
                let (kind, _) = inbox.next(&socket).await.expect("hello");
                assert_eq!(kind, wire::HELLO);
                write_all(&socket, &wire::frame(wire::SCHEMA, &[&schema_header])).await.expect("schema");
                let memory = SharedMemory::create(4096).expect("memfd");
                assert!(memory.write_at(0, &[Bytes::from(message.clone())]));
                let segment = wire::frame(wire::SEGMENT, &[&0u32.to_le_bytes(), &1u32.to_le_bytes(), &4096u64.to_le_bytes()]);
                send_message_with_fd(&socket, &segment, memory.fd()).await.expect("segment");
                let sent = wire::frame(wire::BATCH, &[&0u32.to_le_bytes(), &0u32.to_le_bytes(), &(message.len() as u64).to_le_bytes()]);
                for _ in 0..3 {
                    write_all(&socket, &sent).await.expect("batch");
                }
                write_all(&socket, &wire::frame(wire::DONE, &[])).await.expect("done");
                drop(socket);
                memory
            });
            let loader = LocalLoader::new(&path, None).with_slots(1);
            let mut batches = loader.stream(&SampleRequest::new(["d"])).await.expect("stream");
            let _memory = server.await.expect("the server");
            let mut read = 0;
            while let Some(got) = batches.next().await {
                assert_eq!(got.unwrap_or_else(|e| panic!("round {round}, after {read} batches: {e}")), batch);
                read += 1;
            }
            assert_eq!(read, 3, "round {round}");
        }
    }

    #[test]
    fn the_inbox_takes_whole_messages_only() {
        let mut inbox = Inbox::default();
        let one = wire::frame(wire::BATCH, &[b"abc"]);
        inbox.buf.extend_from_slice(&one[..5]);
        assert!(inbox.take().expect("ok").is_none());
        inbox.buf.extend_from_slice(&one[5..]);
        inbox.buf.extend_from_slice(&wire::frame(wire::DONE, &[]));
        assert_eq!(inbox.take().expect("ok"), Some((wire::BATCH, Bytes::from_static(b"abc"))));
        assert_eq!(inbox.take().expect("ok"), Some((wire::DONE, Bytes::new())));
        inbox.buf.extend_from_slice(&[0, 0, 0, 0, 0]);
        assert!(inbox.take().is_err(), "a message of no bytes");
    }
}
