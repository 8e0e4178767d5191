//! How the lake's files on the local filesystem are read: with positioned reads (`pread`, the
//! default), or through io_uring (`lake --io uring`), which keeps many reads in flight from one
//! thread, where the kernel allows it. Lance reads tables through its `file+uring` store then,
//! and the loader reads a frame table's frames through [`Ring`]s.

use std::sync::atomic::{AtomicBool, Ordering};

/// Whether io_uring reads were asked for and the kernel allows them.
static URING: AtomicBool = AtomicBool::new(false);

/// Reads the lake's local files through io_uring from now on, where the kernel allows it.
///
/// # Errors
/// Why io_uring cannot be used here (a kernel without it, or a container whose seccomp policy
/// refuses it): reads stay positioned reads.
pub fn use_uring() -> Result<(), String> {
    match io_uring::IoUring::new(2) {
        Ok(_) => {
            URING.store(true, Ordering::Relaxed);
            Ok(())
        }
        Err(e) => Err(format!("io_uring is refused here ({e}); the lake's files are read with positioned reads")),
    }
}

/// Whether the lake's local files are read through io_uring.
pub fn uring() -> bool {
    URING.load(Ordering::Relaxed)
}

/// The URI Lance opens a local table at: its path, or `file+uring://` and its absolute path
/// when reads go through io_uring.
pub fn lance_uri(path: &str) -> String {
    if !uring() {
        return path.to_string();
    }
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.into());
    format!("file+uring://{}", absolute.display())
}

/// An io_uring of one thread, for reading many ranges of files at once.
pub struct Ring(io_uring::IoUring);

/// One read: `len` bytes at `offset` of the file `fd` into `dst`.
pub struct Read {
    /// The open file.
    pub fd: std::os::fd::RawFd,
    /// Where in the file.
    pub offset: u64,
    /// Where the bytes go: exactly `len` writable bytes that stay valid until
    /// [`Ring::read_all`] returns.
    pub dst: *mut u8,
    /// How many bytes.
    pub len: usize,
}

/// Reads in flight on one ring at most: a batch's frames are read in rounds of this many.
const DEPTH: u32 = 128;

impl Ring {
    /// A ring.
    ///
    /// # Errors
    /// When the kernel refuses io_uring.
    pub fn new() -> std::io::Result<Self> {
        Ok(Self(io_uring::IoUring::new(DEPTH)?))
    }

    /// Runs `reads`, up to 128 in flight at once, and returns how many bytes each read
    /// (a read may return fewer than it asked for at the end of a file, or when interrupted:
    /// the caller finishes it). Every read submitted has completed when this returns, failed
    /// or not, so no buffer is written after.
    ///
    /// # Safety
    /// Each `dst` must be `len` writable bytes, not aliased by another read, valid until this
    /// returns.
    ///
    /// # Errors
    /// The first read's error, by its position in `reads`.
    pub unsafe fn read_all(&mut self, reads: &[Read]) -> Result<Vec<usize>, (usize, std::io::Error)> {
        use io_uring::{opcode, types};
        let mut done = vec![0usize; reads.len()];
        let mut failed: Option<(usize, std::io::Error)> = None;
        for (round, chunk) in reads.chunks(DEPTH as usize).enumerate() {
            let first = round * DEPTH as usize;
            for (i, read) in chunk.iter().enumerate() {
                let len = u32::try_from(read.len).unwrap_or(u32::MAX);
                let entry = opcode::Read::new(types::Fd(read.fd), read.dst, len).offset(read.offset).build().user_data((first + i) as u64);
                // SAFETY: the queue has room for a round (DEPTH entries, drained below), and
                // the caller keeps each buffer valid until every completion is reaped.
                unsafe { self.0.submission().push(&entry) }.expect("a round fits the submission queue");
            }
            let mut left = chunk.len();
            while left > 0 {
                if let Err(e) = self.0.submit_and_wait(1)
                    && !matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN | libc::EBUSY))
                {
                    // Nothing more can be reaped while the kernel may still write into the
                    // buffers: neither returning nor unwinding is safe.
                    tracing::error!("io_uring stopped answering with reads in flight: {e}");
                    std::process::abort();
                }
                for cqe in self.0.completion() {
                    let i = cqe.user_data() as usize;
                    left -= 1;
                    match cqe.result() {
                        n if n >= 0 => done[i] = n as usize,
                        e => {
                            let error = std::io::Error::from_raw_os_error(-e);
                            if failed.as_ref().is_none_or(|(j, _)| i < *j) {
                                failed = Some((i, error));
                            }
                        }
                    }
                }
            }
        }
        match failed {
            Some(f) => Err(f),
            None => Ok(done),
        }
    }
}
