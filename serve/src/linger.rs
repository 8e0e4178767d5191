//! TCP connections that end without losing their last bytes.
//!
//! Bytes that reach a socket the server has closed make the kernel reset the connection, and
//! the reset throws away what the server wrote that has not reached the client yet; a client
//! whose write fails on the reset may also stop before reading what it did receive (an HTTP/2
//! client flushes its window updates before it reads the next frame). An HTTP/2 client sends
//! window updates and pings while it reads, so a Flight stream ended at a shutdown could lose
//! its last batches and the `UNAVAILABLE` status that tells its client to resume (seen on a
//! loaded machine: the client got "connection reset" instead); an HTTP/1 client refused while
//! it still sent its body could lose the refusal. So when the server is done with a connection,
//! its socket goes to a task that ends the server's side (FIN after everything written) and
//! reads what the client still sends until the client closes too, or has acknowledged every
//! byte and stayed quiet for [`QUIET`], for at most [`LINGER`]: the "lingering close" of HTTP
//! servers. The server waits for its connections, open and lingering, before it exits
//! ([`Closes::finished`]).

use std::{
    io,
    net::SocketAddr,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf},
    net::{TcpListener, TcpStream},
};

/// How long a closed connection's socket waits at most for its client to take what was sent.
pub const LINGER: Duration = Duration::from_secs(10);

/// How long a client that has every byte must stay silent before its socket closes without
/// waiting for it to close first: a client that is still reading sends window updates (HTTP/2)
/// or the rest of its request (HTTP/1); an idle kept-alive one says nothing until it next
/// uses the connection. (Without the kernel's count of unacknowledged bytes, off Linux, a
/// socket waits for its client to close, or for [`LINGER`].)
pub const QUIET: Duration = Duration::from_secs(1);

/// How often a lingering socket looks whether its client took everything.
const LOOK: Duration = Duration::from_millis(20);

/// Accepts connections that linger when closed, with Nagle's delay off (a batch's last bytes
/// and a stream's status go out when written), whose clients must open them within a wait
/// (see `Opening`).
pub struct Listener {
    inner: TcpListener,
    closes: Closes,
    opening_wait: Duration,
}

impl Listener {
    /// Connections from `inner`, counted in `closes` from their accept until they closed, whose
    /// clients have `opening_wait` from their connect to open them.
    pub fn new(inner: TcpListener, closes: Closes, opening_wait: Duration) -> Self {
        Self { inner, closes, opening_wait }
    }

    /// The connections, as tonic's `serve_with_incoming` takes them.
    pub fn incoming(self) -> impl futures::Stream<Item = io::Result<Connection>> + Send + 'static {
        futures::stream::unfold(self, |mut listener| async move {
            let (connection, _) = axum::serve::Listener::accept(&mut listener).await;
            Some((Ok(connection), listener))
        })
    }
}

impl axum::serve::Listener for Listener {
    type Io = Connection;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Connection, SocketAddr) {
        // axum's accept retries what fails (and waits out a full file table).
        let (stream, addr) = axum::serve::Listener::accept(&mut self.inner).await;
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!("TCP_NODELAY on a connection from {addr}: {e}");
        }
        let opening = Opening { by: Box::pin(tokio::time::sleep(self.opening_wait)), wait: self.opening_wait, seen: 0, header: [0; 9] };
        (Connection { stream: Some(stream), open: Some(self.closes.begin()), opening: Some(opening) }, addr)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

/// An accepted connection; dropped, it lingers (see the module's documentation).
pub struct Connection {
    stream: Option<TcpStream>,
    /// Counts the connection in its listener's [`Closes`] until its socket is closed.
    open: Option<Open>,
    /// Until the client has opened the connection.
    opening: Option<Opening>,
}

impl Connection {
    fn stream(&mut self) -> Pin<&mut TcpStream> {
        Pin::new(self.stream.as_mut().expect("a connection's stream leaves only when it is dropped"))
    }
}

/// The HTTP/2 connection preface a client sends first.
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The opening of a connection, which its client must send within the listener's wait: a
/// client that says nothing, or that begins HTTP/2 and does not finish the preface and the
/// frame after it (its SETTINGS, which completes the handshake) in time, has its connection
/// closed, so that connections that never finish opening cannot pile up and use up the
/// server's file descriptors, nor hold a shutdown. (An HTTP/2 client that opened its
/// connection and answers pings may keep it idle, as gRPC channels do.) HTTP's servers time what follows
/// themselves: an HTTP/1 request's head (the HTTP server's head wait, from the first byte
/// that is not HTTP/2's), an HTTP/2 peer that stops answering pings.
struct Opening {
    by: Pin<Box<tokio::time::Sleep>>,
    wait: Duration,
    /// Bytes of the opening seen so far.
    seen: usize,
    /// The first frame's header, as it arrives.
    header: [u8; 9],
}

impl Opening {
    /// Takes bytes the client sent; true once the opening is complete (or is no HTTP/2
    /// opening, which is not this one's to time).
    fn complete_with(&mut self, bytes: &[u8]) -> bool {
        let head = PREFACE.len() + self.header.len();
        for &byte in bytes {
            if self.seen < PREFACE.len() {
                if byte != PREFACE[self.seen] {
                    return true;
                }
            } else if self.seen < head {
                self.header[self.seen - PREFACE.len()] = byte;
            }
            self.seen += 1;
            if self.seen >= head {
                let length = usize::from(self.header[0]) << 16 | usize::from(self.header[1]) << 8 | usize::from(self.header[2]);
                if self.seen == head + length {
                    return true;
                }
            }
        }
        false
    }
}

impl tonic::transport::server::Connected for Connection {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.as_ref().expect("open").connect_info()
    }
}

impl AsyncRead for Connection {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if let Some(opening) = &mut self.opening
            && opening.by.as_mut().poll(cx).is_ready()
        {
            let wait = opening.wait;
            tracing::debug!("a connection was not opened within {wait:?}; closed");
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client did not open the connection within {wait:?}"),
            )));
        }
        let before = buf.filled().len();
        let read = self.stream().poll_read(cx, buf);
        if let (Poll::Ready(Ok(())), Some(opening)) = (&read, &mut self.opening)
            && opening.complete_with(&buf.filled()[before..])
        {
            self.opening = None;
        }
        read
    }
}

impl AsyncWrite for Connection {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.stream().poll_write(cx, buf)
    }

    fn poll_write_vectored(mut self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        self.stream().poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.as_ref().is_some_and(AsyncWrite::is_write_vectored)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.stream().poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.stream().poll_shutdown(cx)
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        let (Some(stream), open) = (self.stream.take(), self.open.take()) else { return };
        // Outside a runtime (nothing of the server's is) the socket just closes.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        runtime.spawn(async move {
            let _open = open;
            linger(stream).await;
        });
    }
}

/// Ends the server's side of `stream` and reads what the client sends until the client closed,
/// or has acknowledged everything the server sent and stayed quiet for [`QUIET`], or
/// [`LINGER`] passed.
async fn linger(mut stream: TcpStream) {
    use tokio::time::Instant;
    // Sent once already when the server ended the connection cleanly; harmless again.
    let _ = stream.shutdown().await;
    let deadline = Instant::now() + LINGER;
    let mut heard = Instant::now();
    let mut sink = vec![0u8; 16 << 10];
    loop {
        let now = Instant::now();
        if now >= deadline || (unacknowledged(&stream) == Some(0) && now - heard >= QUIET) {
            break;
        }
        match tokio::time::timeout(LOOK, stream.read(&mut sink)).await {
            // The client closed (or the connection broke): the close is clean.
            Ok(Ok(0) | Err(_)) => return,
            Ok(Ok(_)) => heard = Instant::now(),
            Err(_) => {}
        }
    }
    // What arrived meanwhile is read, so that the close is a FIN, not a reset, where it can be
    // (from the socket itself: tokio's `try_read` reads only once it has seen it readable).
    {
        use std::os::fd::AsRawFd;
        let fd = stream.as_raw_fd();
        // SAFETY: `recv` writes at most `sink.len()` bytes into `sink`; the descriptor is open
        // while `stream` lives.
        while unsafe { libc::recv(fd, sink.as_mut_ptr().cast(), sink.len(), libc::MSG_DONTWAIT) } > 0 {}
    }
}

/// Bytes (the FIN included) the server sent on `stream` that its client has not acknowledged,
/// where the kernel says.
fn unacknowledged(stream: &TcpStream) -> Option<u32> {
    use std::os::fd::AsRawFd;
    let mut queued: libc::c_int = 0;
    // SAFETY: `TIOCOUTQ` (`SIOCOUTQ` for a socket) writes one `int` through the pointer, which
    // points at one; the descriptor is open for the duration of the call (`stream` borrows it).
    let done = unsafe { libc::ioctl(stream.as_raw_fd(), libc::TIOCOUTQ, &raw mut queued) };
    if done == 0 { u32::try_from(queued).ok() } else { None }
}

/// The connections of a server's listeners, open or lingering.
#[derive(Clone)]
pub struct Closes(Arc<tokio::sync::watch::Sender<usize>>);

impl Default for Closes {
    fn default() -> Self {
        Self(Arc::new(tokio::sync::watch::Sender::new(0)))
    }
}

impl Closes {
    fn begin(&self) -> Open {
        self.0.send_modify(|n| *n += 1);
        Open(self.clone())
    }

    /// Returns when every connection is closed (one the server ended lingers for at most
    /// [`LINGER`]).
    pub async fn finished(&self) {
        let _ = self.0.subscribe().wait_for(|n| *n == 0).await;
    }

    /// The connections open or lingering now.
    pub fn open(&self) -> usize {
        *self.0.borrow()
    }
}

struct Open(Closes);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.0.send_modify(|n| *n -= 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The server's last bytes reach a client that keeps writing while it reads (as an HTTP/2
    /// client sends window updates), although the server stopped reading before it closed.
    #[tokio::test]
    async fn a_closed_connection_delivers_what_was_written_to_a_client_still_writing() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let closes = Closes::default();
        let mut listener = Listener::new(listener, closes.clone(), LINGER);
        let reply = vec![7u8; 8 << 20];
        let client = tokio::spawn(async move {
            let mut socket = TcpStream::connect(addr).await.expect("connect");
            socket.write_all(b"go").await.expect("ask");
            let (mut got, mut buf) = (Vec::new(), vec![0u8; 64 << 10]);
            loop {
                match socket.read(&mut buf).await {
                    Ok(0) => break Ok(got),
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                    Err(e) => break Err(e),
                }
                // Slower than the server writes, and writing back as it reads; as an HTTP/2
                // client, one whose write fails reads nothing more.
                tokio::time::sleep(Duration::from_millis(1)).await;
                if let Err(e) = socket.write_all(&[0u8; 64]).await {
                    break Err(e);
                }
            }
        });
        let (mut connection, _) = axum::serve::Listener::accept(&mut listener).await;
        let mut ask = [0u8; 2];
        connection.read_exact(&mut ask).await.expect("the request");
        connection.write_all(&reply).await.expect("reply");
        connection.shutdown().await.expect("FIN");
        // The client's writes arrive unread from here on.
        drop(connection);
        let got = client.await.expect("client").expect("no reset");
        assert_eq!(got.len(), reply.len());
        tokio::time::timeout(LINGER * 2, closes.finished()).await.expect("the lingering close ends once the client closes");
    }

    /// What completes an opening: HTTP/2's preface and the frame after it, whole; anything
    /// that is not HTTP/2 at its first byte that differs (HTTP/1, which its server times).
    #[tokio::test]
    async fn an_opening_is_complete_with_the_preface_and_the_first_frame_whole() {
        let opening = || Opening { by: Box::pin(tokio::time::sleep(Duration::ZERO)), wait: Duration::ZERO, seen: 0, header: [0; 9] };
        let settings = |payload: &[u8]| {
            let mut frame = vec![0, 0, u8::try_from(payload.len()).expect("short"), 4, 0, 0, 0, 0, 0];
            frame.extend_from_slice(payload);
            frame
        };
        let whole = [PREFACE.as_slice(), &settings(&[0, 3, 0, 0, 0, 100])].concat();
        for at in 0..whole.len() {
            let mut o = opening();
            assert!(!o.complete_with(&whole[..at]), "{at} bytes are not the whole opening");
            assert!(o.complete_with(&whole[at..]), "the rest completes it");
        }
        let mut o = opening();
        for (i, byte) in whole.iter().enumerate() {
            assert_eq!(o.complete_with(&[*byte]), i + 1 == whole.len(), "byte by byte, at {i}");
        }
        assert!(opening().complete_with(&[PREFACE.as_slice(), &settings(&[])].concat()), "an empty SETTINGS frame");
        assert!(opening().complete_with(b"GET / HTTP/1.1\r\n"), "HTTP/1");
        assert!(opening().complete_with(b"PO"), "HTTP/1, told at the second byte");
        assert!(!opening().complete_with(b"PRI * HTTP/2.0\r\n"), "a part of the preface");
        // A large first frame (Flight's server takes frames of up to 16 MiB) must arrive whole.
        let large = [PREFACE.as_slice(), &[0, 0x40, 1, 4, 0, 0, 0, 0, 0], &[0; 0x4000]].concat();
        assert!(!opening().complete_with(&large), "a byte short of a 16 KiB + 1 frame");
        assert!(opening().complete_with(&[PREFACE.as_slice(), &[0, 0x40, 1, 4, 0, 0, 0, 0, 0], &[0; 0x4001]].concat()));
    }

    /// A client that sends a part of HTTP/2's opening and stops has its connection's reads
    /// fail after the wait; one that sent it whole is not timed.
    #[tokio::test]
    async fn a_connection_not_opened_within_the_wait_fails_to_read() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let wait = Duration::from_millis(300);
        let mut listener = Listener::new(listener, Closes::default(), wait);
        let mut partial = TcpStream::connect(addr).await.expect("connect");
        partial.write_all(b"P").await.expect("send");
        let (mut connection, _) = axum::serve::Listener::accept(&mut listener).await;
        let mut buf = [0u8; 64];
        assert_eq!(connection.read(&mut buf).await.expect("the first byte"), 1);
        let failed = tokio::time::timeout(wait * 10, connection.read(&mut buf)).await.expect("not left waiting").expect_err("cut");
        assert_eq!(failed.kind(), io::ErrorKind::TimedOut, "{failed}");

        let mut opened = TcpStream::connect(addr).await.expect("connect");
        opened.write_all(&[PREFACE.as_slice(), &[0, 0, 0, 4, 0, 0, 0, 0, 0]].concat()).await.expect("send");
        let (mut connection, _) = axum::serve::Listener::accept(&mut listener).await;
        let mut got = vec![0u8; PREFACE.len() + 9];
        connection.read_exact(&mut got).await.expect("the opening");
        tokio::time::timeout(wait * 2, connection.read(&mut buf)).await.expect_err("an opened connection waits for its client");
    }

    /// A client that keeps an idle connection open (HTTP/1 keep-alive) and says nothing does not
    /// hold a closed connection for [`LINGER`]: once it has every byte and stayed quiet, the socket
    /// closes.
    #[tokio::test]
    async fn a_quiet_client_that_has_everything_does_not_hold_the_close() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let closes = Closes::default();
        let mut listener = Listener::new(listener, closes.clone(), LINGER);
        let mut idle = TcpStream::connect(addr).await.expect("connect");
        let (mut connection, _) = axum::serve::Listener::accept(&mut listener).await;
        assert_eq!(closes.open(), 1, "counted from its accept");
        connection.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").await.expect("reply");
        drop(connection);
        assert_eq!(closes.open(), 1, "counted while it lingers");
        tokio::time::timeout(LINGER - QUIET, closes.finished()).await.expect("closed before the bound");
        let mut got = Vec::new();
        idle.read_to_end(&mut got).await.expect("the reply, then the end");
        assert!(got.starts_with(b"HTTP/1.1 200 OK"));
    }
}
