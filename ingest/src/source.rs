//! Reading a LeRobot dataset through `object_store`: whole files, parquet row groups, and a
//! `Read + Seek` view for FFmpeg's demuxer. Local directories, object stores, and datasets served
//! over HTTP(S) (read-only, and not listed: see [`Source::can_list`]).

use std::{
    io::{self, Read, Seek, SeekFrom},
    ops::Range,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
};

use bytes::Bytes;
use futures::{FutureExt, TryStreamExt, future::BoxFuture};
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt, local::LocalFileSystem, path::Path};
use parquet::{
    arrow::{arrow_reader::ArrowReaderOptions, async_reader::AsyncFileReader},
    errors::ParquetError,
    file::metadata::{ParquetMetaData, ParquetMetaDataReader},
};

use crate::{Error, Result};

/// A dataset root in an object store, with a running count of the bytes read from it.
#[derive(Debug, Clone)]
pub struct Source {
    store: Arc<dyn ObjectStore>,
    display: String,
    bytes_read: Arc<AtomicU64>,
    /// The directory of a local source, whose files are checked to be regular files before
    /// they are opened (opening a FIFO would wait for a writer forever).
    local: Option<std::path::PathBuf>,
    /// Whether the source's files can be listed (not over HTTP).
    listable: bool,
}

/// A file of the source: its path relative to the dataset root, size and modification time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceFile {
    /// Path relative to the dataset root, `/`-separated.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// Last modification, as the store reports it.
    pub modified: chrono::DateTime<chrono::Utc>,
}

impl Source {
    /// Opens a dataset root: a local directory or `file://` URL, or an object store prefix
    /// (`s3://bucket/prefix/DATASET`, `gs://…`, `az://…`; configured as lake-store's
    /// [`remote`](lake_store::remote) says).
    ///
    /// # Errors
    /// [`Error::Missing`] when the directory does not exist; [`Error::Unsupported`] for URL
    /// schemes this build cannot read, or an object store that cannot be configured.
    pub fn open(location: &str) -> Result<Self> {
        if lake_store::remote::is_http(location) {
            let store = lake_store::remote::http_store(location).map_err(|e| Error::Unsupported(format!("source {e}")))?;
            return Ok(Self { listable: false, ..Self::from_store(store, location) });
        }
        if lake_store::remote::is_remote(location) {
            let remote = lake_store::remote::Remote::parse(location).map_err(|e| Error::Unsupported(format!("source {e}")))?;
            let store = object_store::prefix::PrefixStore::new(remote.store, remote.prefix);
            return Ok(Self::from_store(Arc::new(store), location));
        }
        let Some(path) = lake_store::local_path(location) else {
            return Err(Error::Unsupported(format!(
                "source `{location}`: only local directories (a path or an absolute file:// URL) can be read by this build"
            )));
        };
        if path.is_file() {
            return Err(Error::Metadata {
                path: location.to_string(),
                message: "is a file; give the dataset's directory (the one holding meta/info.json)".into(),
            });
        }
        if !path.is_dir() {
            return Err(Error::Missing { path: location.to_string(), what: "dataset directory".into() });
        }
        let store = LocalFileSystem::new_with_prefix(&path).map_err(Error::source_io(location))?;
        Ok(Self { local: Some(path), ..Self::from_store(Arc::new(store), location) })
    }

    /// Wraps any object store whose root is the dataset root.
    pub fn from_store(store: Arc<dyn ObjectStore>, display: impl Into<String>) -> Self {
        Self { store, display: display.into(), bytes_read: Arc::new(AtomicU64::new(0)), local: None, listable: true }
    }

    /// Whether the source's files can be listed. A dataset served over HTTP(S) cannot be (a web
    /// server answers reads of named files): its files are those its metadata names.
    pub fn can_list(&self) -> bool {
        self.listable
    }

    /// Refuses a local `path` (relative to the root) that exists but is not a regular file
    /// (after following links): a FIFO, socket or device would block or never end, and a
    /// directory is not the file the dataset names.
    fn regular(&self, path: &str) -> Result<()> {
        use std::os::unix::fs::FileTypeExt;
        let Some(root) = &self.local else { return Ok(()) };
        let Ok(meta) = std::fs::metadata(root.join(path)) else { return Ok(()) };
        let kind = meta.file_type();
        let what = if kind.is_file() {
            return Ok(());
        } else if kind.is_dir() {
            "a directory"
        } else if kind.is_fifo() {
            "a FIFO"
        } else if kind.is_socket() {
            "a socket"
        } else if kind.is_block_device() || kind.is_char_device() {
            "a device"
        } else {
            "not a regular file"
        };
        Err(Error::Metadata { path: path.to_string(), message: format!("is {what}; lake reads a dataset's files only from regular files") })
    }

    /// The location as given, for messages.
    pub fn display(&self) -> &str {
        &self.display
    }

    /// Bytes read so far through this source (all clones share the count).
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read.load(Ordering::Relaxed)
    }

    /// Size and modification time of `path`, or `None` when it does not exist.
    ///
    /// # Errors
    /// When the store fails for another reason.
    pub async fn head(&self, path: &str) -> Result<Option<SourceFile>> {
        self.regular(path)?;
        match self.store.head(&Path::from(path)).await {
            Ok(meta) => Ok(Some(to_file(path.to_string(), &meta))),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(Error::source_io(path)(e)),
        }
    }

    /// The whole content of `path`.
    ///
    /// # Errors
    /// [`Error::Missing`] when it does not exist, or an I/O error naming it.
    pub async fn get(&self, path: &str) -> Result<Bytes> {
        self.regular(path)?;
        let result = match self.store.get(&Path::from(path)).await {
            Ok(r) => r,
            Err(object_store::Error::NotFound { .. }) => return Err(Error::Missing { path: path.to_string(), what: "file".into() }),
            Err(e) => return Err(Error::source_io(path)(e)),
        };
        let bytes = result.bytes().await.map_err(Error::source_io(path))?;
        self.bytes_read.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        Ok(bytes)
    }

    /// Every file under `prefix`, sorted by path.
    ///
    /// # Errors
    /// When listing fails, or the source cannot be listed ([`can_list`](Self::can_list)).
    pub async fn list(&self, prefix: &str) -> Result<Vec<SourceFile>> {
        if !self.listable {
            return Err(Error::Unsupported(format!("{}: a dataset served over HTTP cannot be listed ({prefix})", self.display)));
        }
        let root = Path::from(prefix);
        let metas: Vec<ObjectMeta> = match self.store.list(Some(&root)).try_collect().await {
            Ok(v) => v,
            Err(object_store::Error::NotFound { .. }) => Vec::new(),
            Err(e) => return Err(Error::source_io(prefix)(e)),
        };
        let mut files: Vec<SourceFile> = metas.iter().map(|m| to_file(m.location.to_string(), m)).collect();
        files.sort_by(|a, b| a.path.cmp(&b.path));
        for f in &files {
            self.regular(&f.path)?;
        }
        Ok(files)
    }

    /// A parquet reader over `file`, fetching only the byte ranges it needs.
    pub fn parquet(&self, file: &SourceFile) -> ParquetSource {
        ParquetSource { source: self.clone(), path: file.path.clone(), size: file.size }
    }

    /// A blocking `Read + Seek` view of `file` for FFmpeg, reading ahead `block` bytes at a time.
    /// Must be used from a thread that may block (not a tokio worker).
    pub fn blocking_reader(&self, file: &SourceFile, runtime: tokio::runtime::Handle, block: usize) -> BlockingReader {
        BlockingReader {
            source: self.clone(),
            path: Path::from(file.path.as_str()),
            size: file.size,
            pos: 0,
            buf: Bytes::new(),
            buf_start: 0,
            block: block.max(64 * 1024) as u64,
            runtime,
        }
    }

    /// Bytes `range` of the file at `path`.
    ///
    /// # Errors
    /// When the file cannot be read.
    pub(crate) async fn get_range_of(&self, path: &str, range: Range<u64>) -> Result<Bytes> {
        self.get_range(&Path::from(path), range).await.map_err(Error::source_io(path))
    }

    async fn get_range(&self, path: &Path, range: Range<u64>) -> object_store::Result<Bytes> {
        let bytes = self.store.get_range(path, range).await?;
        self.bytes_read.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        Ok(bytes)
    }
}

fn to_file(path: String, meta: &ObjectMeta) -> SourceFile {
    SourceFile { path, size: meta.size, modified: meta.last_modified }
}

/// Parquet's async reader interface over a [`Source`] file.
#[derive(Debug, Clone)]
pub struct ParquetSource {
    source: Source,
    path: String,
    size: u64,
}

impl AsyncFileReader for ParquetSource {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, parquet::errors::Result<Bytes>> {
        async move {
            let path = Path::from(self.path.as_str());
            self.source.get_range(&path, range).await.map_err(|e| ParquetError::External(Box::new(e)))
        }
        .boxed()
    }

    fn get_byte_ranges(&mut self, ranges: Vec<Range<u64>>) -> BoxFuture<'_, parquet::errors::Result<Vec<Bytes>>> {
        async move {
            let path = Path::from(self.path.as_str());
            let out = self.source.store.get_ranges(&path, &ranges).await.map_err(|e| ParquetError::External(Box::new(e)))?;
            let n: u64 = out.iter().map(|b| b.len() as u64).sum();
            self.source.bytes_read.fetch_add(n, Ordering::Relaxed);
            Ok(out)
        }
        .boxed()
    }

    fn get_metadata<'a>(
        &'a mut self,
        options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, parquet::errors::Result<Arc<ParquetMetaData>>> {
        async move {
            let mut reader = ParquetMetaDataReader::new();
            if let Some(opts) = options {
                reader = reader.with_column_index_policy(opts.column_index_policy()).with_offset_index_policy(opts.offset_index_policy());
            }
            let size = self.size;
            Ok(Arc::new(reader.load_and_finish(self, size).await?))
        }
        .boxed()
    }
}

/// A blocking, read-ahead `Read + Seek` over one source file (FFmpeg's custom I/O).
#[derive(Debug)]
pub struct BlockingReader {
    source: Source,
    path: Path,
    size: u64,
    pos: u64,
    buf: Bytes,
    buf_start: u64,
    block: u64,
    runtime: tokio::runtime::Handle,
}

impl BlockingReader {
    /// Size of the file.
    pub fn len(&self) -> u64 {
        self.size
    }

    /// Whether the file is empty.
    pub fn is_empty(&self) -> bool {
        self.size == 0
    }
}

impl Read for BlockingReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if self.pos >= self.size || out.is_empty() {
            return Ok(0);
        }
        let buf_end = self.buf_start + self.buf.len() as u64;
        if self.pos < self.buf_start || self.pos >= buf_end {
            let end = (self.pos + self.block.max(out.len() as u64)).min(self.size);
            let range = self.pos..end;
            let fetched = self.runtime.block_on(self.source.get_range(&self.path, range)).map_err(io::Error::other)?;
            if fetched.is_empty() {
                return Ok(0);
            }
            self.buf = fetched;
            self.buf_start = self.pos;
        }
        let offset = (self.pos - self.buf_start) as usize;
        let n = out.len().min(self.buf.len() - offset);
        out[..n].copy_from_slice(&self.buf[offset..offset + n]);
        self.pos += n as u64;
        Ok(n)
    }
}

impl Seek for BlockingReader {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let target = match to {
            SeekFrom::Start(p) => Some(p),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
            SeekFrom::End(d) => self.size.checked_add_signed(d),
        };
        self.pos = target.ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "seek before start of file"))?;
        Ok(self.pos)
    }
}

impl Source {
    /// BLAKE3 of the whole content of `file`, streamed.
    ///
    /// # Errors
    /// When the file cannot be read.
    pub async fn hash(&self, file: &SourceFile) -> Result<blake3::Hash> {
        let path = Path::from(file.path.as_str());
        let result = self.store.get(&path).await.map_err(Error::source_io(&file.path))?;
        let mut stream = result.into_stream();
        let mut hasher = blake3::Hasher::new();
        while let Some(chunk) = stream.try_next().await.map_err(Error::source_io(&file.path))? {
            hasher.update(&chunk);
            self.bytes_read.fetch_add(chunk.len() as u64, Ordering::Relaxed);
        }
        Ok(hasher.finalize())
    }

    /// The shared count of bytes read, for progress displays.
    pub fn counter(&self) -> Arc<AtomicU64> {
        self.bytes_read.clone()
    }
}
