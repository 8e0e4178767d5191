//! Files that commands write their output to (`--out`, `--output`).
//!
//! A regular file appears whole or not at all: the output is written to a temporary file beside
//! it and renamed over it at the end, so a command that fails part-way (or is killed) leaves
//! what was there before. A symlink is followed, and the file it leads to is the one replaced.
//! Anything else at the path (a device such as `/dev/null`, a named pipe), and whatever
//! `/dev/stdout` or `/proc/self/fd/N` lead to, is written straight into: renaming over it would
//! replace the device with a regular file, or the file a shell redirected output to.

use std::{
    fs::File,
    io::{self, BufWriter, Write},
    path::{Path, PathBuf},
};

/// An output being written; [`Output::commit`] makes it visible.
pub struct Output {
    writer: BufWriter<Destination>,
    path: PathBuf,
}

enum Destination {
    /// A temporary file beside the target, renamed over it on commit (removed when dropped).
    Staged { file: tempfile::NamedTempFile, target: PathBuf },
    /// A device or pipe, written into directly.
    Direct(File),
}

impl Write for Destination {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Self::Staged { file, .. } => file.write(buf),
            Self::Direct(file) => file.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Self::Staged { file, .. } => file.flush(),
            Self::Direct(file) => file.flush(),
        }
    }
}

impl Output {
    /// Starts writing `path`.
    ///
    /// # Errors
    /// When the path's directory cannot be written, or a device cannot be opened.
    pub fn create(path: &Path) -> io::Result<Self> {
        // `/dev/stdout`, `/dev/fd/N`, `/proc/self/fd/N`: a file this process was handed, written
        // through its own descriptor (so that what else goes to it stays in order), whatever
        // it is.
        if let Some(fd) = own_descriptor(path) {
            return Ok(Self { writer: BufWriter::new(Destination::Direct(fd?)), path: path.to_path_buf() });
        }
        let destination = match std::fs::metadata(path) {
            Ok(meta) if !meta.is_file() && !meta.is_dir() => Destination::Direct(std::fs::OpenOptions::new().write(true).open(path)?),
            Ok(meta) if meta.is_dir() => return Err(io::Error::other("is a directory")),
            Ok(meta) if meta.permissions().readonly() => {
                return Err(io::Error::new(io::ErrorKind::PermissionDenied, "the file is read-only"));
            }
            found => {
                let target = match found {
                    Ok(_) => std::fs::canonicalize(path)?,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => dangling_target(path),
                    Err(e) => return Err(e),
                };
                let dir = target.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
                let name = target.file_name().and_then(|n| n.to_str()).unwrap_or("output");
                // Short enough that the temporary name fits where the target's does.
                let prefix = format!(".{}.", name.chars().take(100).collect::<String>());
                let mut builder = tempfile::Builder::new();
                builder.prefix(&prefix).suffix(".partial");
                #[cfg(unix)]
                {
                    use std::os::unix::fs::PermissionsExt;
                    // As a plain create would make it (the umask applies), not the private
                    // mode temporary files get.
                    builder.permissions(std::fs::Permissions::from_mode(0o666));
                }
                // The error names the directory, not the temporary file's name.
                let file = builder.tempfile_in(dir).map_err(|e| lake_store::in_directory(dir, &e))?;
                // A file replaced keeps its mode.
                if let Ok(meta) = std::fs::metadata(&target) {
                    file.as_file().set_permissions(meta.permissions())?;
                }
                Destination::Staged { file, target }
            }
        };
        Ok(Self { writer: BufWriter::new(destination), path: path.to_path_buf() })
    }

    /// The path as given, for messages.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Flushes the output and puts it in place.
    ///
    /// # Errors
    /// When writing or renaming fails (the target is then left as it was).
    pub fn commit(self) -> io::Result<()> {
        match self.writer.into_inner().map_err(io::IntoInnerError::into_error)? {
            Destination::Staged { file, target } => {
                file.as_file().sync_data()?;
                file.persist(&target).map_err(|e| e.error)?;
            }
            Destination::Direct(mut file) => file.flush()?,
        }
        Ok(())
    }
}

/// Set (to the exit status) once the process is asked to stop: writes into an [`Output`] fail
/// from then on, so that a command writing without pause (no `await` to stop it at) stops at
/// its next write, and the unfinished file is removed.
pub static STOP: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

impl Write for Output {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if STOP.load(std::sync::atomic::Ordering::Relaxed) != 0 {
            return Err(io::Error::other("cancelled"));
        }
        self.writer.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.writer.flush()
    }
}

/// A duplicate of the descriptor that `path` names (`/dev/stdout`, `/dev/stderr`, `/dev/fd/N`,
/// `/proc/self/fd/N`), if it names one this process was handed (one without close-on-exec:
/// those lake opens itself all have it).
fn own_descriptor(path: &Path) -> Option<io::Result<File>> {
    use std::os::fd::BorrowedFd;
    let name = path.to_str()?;
    let fd: i32 = match name {
        "/dev/stdout" => 1,
        "/dev/stderr" => 2,
        _ => name.strip_prefix("/dev/fd/").or_else(|| name.strip_prefix("/proc/self/fd/"))?.parse().ok()?,
    };
    // SAFETY: fcntl only reads the descriptor's flags.
    let flags = if fd < 0 { -1 } else { unsafe { libc::fcntl(fd, libc::F_GETFD) } };
    if flags == -1 || flags & libc::FD_CLOEXEC != 0 {
        return Some(Err(io::Error::other(format!("descriptor {fd} is not one this process was handed"))));
    }
    // SAFETY: `fd` is open (checked above) and nothing here closes it; the borrow ends with
    // the duplicate made at once.
    let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
    Some(borrowed.try_clone_to_owned().map(File::from))
}

/// Where a path that does not exist will be created: the target of a dangling symlink (a link
/// to a file not written yet), else the path itself.
fn dangling_target(path: &Path) -> PathBuf {
    let mut current = path.to_path_buf();
    // A bounded walk: a cycle of links is left to the create that follows to report.
    for _ in 0..40 {
        match std::fs::read_link(&current) {
            Ok(next) => current = current.parent().map_or(next.clone(), |dir| dir.join(&next)),
            Err(_) => return current,
        }
    }
    current
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::FileTypeExt;

    use super::*;

    #[test]
    fn a_device_is_written_into_and_a_symlink_replaces_its_target() {
        let tmp = tempfile::tempdir().unwrap();
        // A named pipe (as a device would be) is written into and stays a pipe.
        let pipe = tmp.path().join("pipe");
        let c_path = std::ffi::CString::new(pipe.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path we own.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        let reader = {
            let pipe = pipe.clone();
            std::thread::spawn(move || std::fs::read(pipe).unwrap())
        };
        let mut out = Output::create(&pipe).unwrap();
        out.write_all(b"through").unwrap();
        out.commit().unwrap();
        assert_eq!(reader.join().unwrap(), b"through");
        assert!(std::fs::symlink_metadata(&pipe).unwrap().file_type().is_fifo(), "the pipe is still a pipe");

        let real = tmp.path().join("real.txt");
        std::fs::write(&real, "old").unwrap();
        let link = tmp.path().join("link.txt");
        std::os::unix::fs::symlink("real.txt", &link).unwrap();
        let mut out = Output::create(&link).unwrap();
        out.write_all(b"new").unwrap();
        out.commit().unwrap();
        assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink(), "the link stays a link");
        assert_eq!(std::fs::read_to_string(&real).unwrap(), "new");

        // A dangling link: the file it names is created.
        let later = tmp.path().join("later.txt");
        std::os::unix::fs::symlink("made.txt", &later).unwrap();
        let mut out = Output::create(&later).unwrap();
        out.write_all(b"made").unwrap();
        out.commit().unwrap();
        assert_eq!(std::fs::read_to_string(tmp.path().join("made.txt")).unwrap(), "made");

        // A descriptor of this process (as `/dev/stdout` is) is written through, the file it
        // leads to kept.
        let held = tmp.path().join("held.txt");
        let file = std::fs::File::create(&held).unwrap();
        // As a shell hands it over: without close-on-exec (lake's own files have it).
        let cloexec = std::os::fd::AsRawFd::as_raw_fd(&file);
        assert!(Output::create(Path::new(&format!("/proc/self/fd/{cloexec}"))).is_err(), "lake's own descriptor is not an output");
        // SAFETY: dup of a descriptor we hold; the copy is closed below.
        let fd = unsafe { libc::dup(cloexec) };
        let mut out = Output::create(Path::new(&format!("/proc/self/fd/{fd}"))).unwrap();
        out.write_all(b"through").unwrap();
        out.commit().unwrap();
        assert_eq!(std::fs::read_to_string(&held).unwrap(), "through");
        // SAFETY: the duplicate made above, closed once.
        unsafe { libc::close(fd) };
        drop(file);
        assert!(Output::create(Path::new("/dev/fd/987654")).is_err(), "a descriptor that is not open");

        // A replaced file keeps its mode; a read-only one is refused.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o600)).unwrap();
        let mut out = Output::create(&real).unwrap();
        out.write_all(b"newer").unwrap();
        out.commit().unwrap();
        assert_eq!(std::fs::metadata(&real).unwrap().permissions().mode() & 0o777, 0o600);
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o444)).unwrap();
        assert!(Output::create(&real).is_err(), "a read-only file is not replaced");
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::write(&real, "new").unwrap();

        // An output dropped before its commit leaves the file as it was, and nothing beside it.
        let mut out = Output::create(&real).unwrap();
        out.write_all(b"half").unwrap();
        drop(out);
        assert_eq!(std::fs::read_to_string(&real).unwrap(), "new");
        let names: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names.len(), 6, "{names:?}");
    }
}
