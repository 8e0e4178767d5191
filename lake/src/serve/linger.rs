//! TCP connections that end without losing their last bytes.
//!
//! A socket closed while bytes from the client sit unread in its receive buffer makes the
//! kernel reset the connection, and the reset throws away what the server wrote that has not
//! reached the client yet. An HTTP/2 client sends window updates and pings while it reads, so
//! a Flight stream ended at a shutdown could lose its last batches and the `UNAVAILABLE`
//! status that tells its client to resume (seen on a loaded machine: the client got "connection
//! reset" instead); an HTTP/1 client refused before its body was read could lose the refusal.
//! So when the server is done with a connection, its socket goes to a task that ends the
//! server's side (FIN after everything written) and reads what the client still sends until
//! the client has acknowledged every byte or closed too, for at most [`LINGER`]: the
//! "lingering close" of HTTP servers. The server waits for these before it exits
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

/// How often a lingering socket looks whether its client took everything.
const LOOK: Duration = Duration::from_millis(20);

/// Accepts connections that linger when closed, with Nagle's delay off (a batch's last bytes
/// and a stream's status go out when written).
pub struct Listener {
    inner: TcpListener,
    closes: Closes,
}

impl Listener {
    /// Connections from `inner`, counted in `closes` while they linger.
    pub fn new(inner: TcpListener, closes: Closes) -> Self {
        Self { inner, closes }
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
        (Connection { stream: Some(stream), closes: self.closes.clone() }, addr)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

/// An accepted connection; dropped, it lingers (see the module's documentation).
pub struct Connection {
    stream: Option<TcpStream>,
    closes: Closes,
}

impl Connection {
    fn stream(&mut self) -> Pin<&mut TcpStream> {
        Pin::new(self.stream.as_mut().expect("a connection's stream leaves only when it is dropped"))
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
        self.stream().poll_read(cx, buf)
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
        let Some(stream) = self.stream.take() else { return };
        // Outside a runtime (nothing of the server's is) the socket just closes.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let closing = self.closes.begin();
        runtime.spawn(async move {
            let _closing = closing;
            linger(stream).await;
        });
    }
}

/// Ends the server's side of `stream` and reads what the client sends until the client has
/// acknowledged everything the server sent, or closed, or [`LINGER`] passed.
async fn linger(mut stream: TcpStream) {
    // Sent once already when the server ended the connection cleanly; harmless again.
    let _ = stream.shutdown().await;
    let deadline = tokio::time::Instant::now() + LINGER;
    let mut sink = vec![0u8; 16 << 10];
    while unacknowledged(&stream) != Some(0) && tokio::time::Instant::now() < deadline {
        // The client closed (or the connection broke): nothing left to wait for.
        if let Ok(Ok(0) | Err(_)) = tokio::time::timeout(LOOK, stream.read(&mut sink)).await {
            return;
        }
    }
    // What arrived meanwhile is read, so that the close is a FIN, not a reset, where it can be.
    while let Ok(1..) = stream.try_read(&mut sink) {}
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

/// The connections still lingering.
#[derive(Clone)]
pub struct Closes(Arc<tokio::sync::watch::Sender<usize>>);

impl Default for Closes {
    fn default() -> Self {
        Self(Arc::new(tokio::sync::watch::Sender::new(0)))
    }
}

impl Closes {
    fn begin(&self) -> Closing {
        self.0.send_modify(|n| *n += 1);
        Closing(self.clone())
    }

    /// Returns when no connection lingers (each does for at most [`LINGER`]).
    pub async fn finished(&self) {
        let _ = self.0.subscribe().wait_for(|n| *n == 0).await;
    }
}

struct Closing(Closes);

impl Drop for Closing {
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
        let mut listener = Listener::new(listener, closes.clone());
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
                // Slower than the server writes, and writing back as it reads.
                tokio::time::sleep(Duration::from_millis(1)).await;
                let _ = socket.write_all(&[0u8; 64]).await;
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
}
