//! The persistent decoded-frame table: every frame of every stream of a dataset version,
//! decoded once and stored losslessly (RGB24, exactly the bytes the loader's decode path
//! returns; plain, or zstd-compressed to save disk) in `frames.lance` beside the version's
//! other tables, one row per `packets` row. The loader reads frames from it when it exists
//! instead of decoding. The frame column is a Lance blob column, so reading a frame is one
//! positioned read of its bytes. Plain frames cost that read and nothing else; zstd frames
//! take less disk (a third on smooth camera footage, little on noisy footage) and cost a
//! decompression, several times the CPU of the read.
//!
//! Each row also holds the CRC-32 of its stored bytes, and every read checks it: a frame
//! damaged on disk fails its samples instead of being served as other pixels
//! ([decision](../../docs/decisions/0033-frame-checksums-checked-on-every-read.md)). Tables
//! written before rows had checksums are read without the check.
//!
//! The table is written under a temporary name and renamed into place when complete, so a
//! failed or killed `lake cache` leaves no table readers could pick up.

use std::{collections::HashMap, mem::MaybeUninit, sync::Arc};

use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use lake_schemas::FrameSize;
use lake_store::{Lake, deps::lance};

/// Name of the table in a version's directory (frames at their recorded size; a table of
/// resized frames is `frames-WxH`).
pub const FRAMES: &str = "frames";

/// The name of the frame table holding frames at `size` (`None`: as recorded).
pub fn frame_table_name(size: Option<FrameSize>) -> String {
    size.map_or_else(|| FRAMES.to_string(), |s| format!("{FRAMES}-{s}"))
}

/// zstd level of stored frames: fast to write, and reading does not depend on it.
pub(crate) const LEVEL: i32 = 1;

/// Field metadata key with which Lance takes a column's compression scheme.
const LANCE_COMPRESSION: &str = "lance-encoding:compression";

/// Field metadata key that makes a large binary column a Lance blob column.
const LANCE_BLOB: &str = "lance-encoding:blob";

/// Name of the column holding the CRC-32 of each row's stored frame bytes.
pub const FRAME_CHECKSUM: &str = "frame_crc32";

/// Frames per written batch.
pub(crate) const BATCH: usize = 32;

/// Packet rows read from the lake at a time.
pub(crate) const READ_ROWS: u64 = 256;

/// How frames are stored in the table (its frame column's name says which).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FrameStorage {
    /// RGB24 bytes as they are: a read is all a frame costs; 3 bytes per pixel on disk.
    #[default]
    Plain,
    /// zstd-compressed RGB24: less disk (how much depends on the footage), for a
    /// decompression per frame read.
    Zstd,
}

impl FrameStorage {
    /// Name of the frame column.
    pub fn column(self) -> &'static str {
        match self {
            Self::Plain => "rgb",
            Self::Zstd => "rgb_zstd",
        }
    }

    /// Its name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::Plain => "plain",
            Self::Zstd => "zstd",
        }
    }

    /// The storage a frame column name stands for.
    pub fn of_column(name: &str) -> Option<Self> {
        [Self::Plain, Self::Zstd].into_iter().find(|s| s.column() == name)
    }
}

/// Schema of `frames`: the packet row, its frame as RGB24 (HWC), stored as `storage` says, and
/// the CRC-32 of the stored bytes.
///
/// The frame column is a Lance blob column: each frame is stored as it is, out of line, and a
/// read of a frame is one positioned read of its bytes (see `read_frames`). As an ordinary
/// binary column Lance would zstd-compress every value over 32 KiB (a decompression per read,
/// and for zstd frames a second compression for nothing) and copy the values three more times
/// while decoding a take.
pub fn frames_schema(storage: FrameStorage) -> SchemaRef {
    let frame = Field::new(storage.column(), DataType::LargeBinary, false)
        .with_metadata([(LANCE_BLOB.to_string(), "true".to_string()), (LANCE_COMPRESSION.to_string(), "none".to_string())].into());
    Arc::new(Schema::new(vec![Field::new("row", DataType::UInt64, false), frame, Field::new(FRAME_CHECKSUM, DataType::UInt32, false)]))
}

/// Whether a frame table's frame column is a blob column (tables written before it was are
/// read as ordinary binary columns).
pub fn is_blob_table(table: &lance::Dataset) -> bool {
    table.schema().fields.get(1).is_some_and(|f| f.is_blob())
}

/// Reads the frames of `rows` (sorted, distinct) from a blob frame table, in that order: one
/// positioned read per frame, all at once.
///
/// # Errors
/// When Lance cannot locate or read a frame.
pub async fn read_frames(table: &Arc<lance::Dataset>, column: &str, rows: &[u64]) -> lance::Result<Vec<bytes::Bytes>> {
    lake_store::read_lance(table.uri(), async {
        let blobs = table.take_blobs_by_indices(rows, column).await?;
        let reads = blobs.into_iter().zip(rows).map(|(blob, row)| async move {
            match blob {
                Some(blob) => blob.read().await,
                None => Err(lance::Error::invalid_input(format!("frame table row {row} holds no frame"))),
            }
        });
        futures::future::try_join_all(reads).await
    })
    .await
}

/// The CRC-32 of every row's stored frame, in row order, or `None` for a table written before
/// rows had checksums.
///
/// # Errors
/// When Lance cannot read them, or they are not one per row (a damaged table).
pub async fn read_checksums(table: &lance::Dataset) -> lance::Result<Option<Vec<u32>>> {
    use arrow::{array::AsArray, datatypes::UInt32Type};
    use futures::TryStreamExt;
    if table.schema().field(FRAME_CHECKSUM).is_none() {
        return Ok(None);
    }
    let mut scan = table.scan();
    scan.project(&[FRAME_CHECKSUM])?;
    let batches = lake_store::read_lance(table.uri(), async { scan.try_into_stream().await?.try_collect::<Vec<_>>().await }).await?;
    let sums: Vec<u32> = batches.iter().flat_map(|b| b.column(0).as_primitive::<UInt32Type>().values().iter().copied()).collect();
    let rows = table.count_rows(None).await?;
    if sums.len() != rows {
        return Err(lance::Error::corrupt_file_named(table.uri(), format!("{} checksums for {rows} frames", sums.len())));
    }
    Ok(Some(sums))
}

/// What [`verify_frame_table`] found in a frame table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FrameTableCheck {
    /// Frames read.
    pub frames: usize,
    /// Bytes of stored frames read.
    pub bytes: u64,
    /// Whether the table stores each frame's CRC-32: without, frames are only read.
    pub checksums: bool,
    /// The rows (packet rows) whose frame is not the one stored, with what was read.
    pub damaged: Vec<(u64, Mismatch)>,
}

/// Frames [`verify_frame_table`] reads at once.
const VERIFY_ROWS: usize = 64;

/// Reads every frame of the frame table at `uri` and checks each against the CRC-32 stored
/// with it.
///
/// # Errors
/// When Lance cannot open the table or read a frame (its files are missing or cut short).
pub async fn verify_frame_table(uri: &str) -> lance::Result<FrameTableCheck> {
    use arrow::array::{Array, AsArray};
    use futures::TryStreamExt;
    let table = Arc::new(lake_store::open_lance(uri).await?);
    let column = match table.schema().fields.get(1) {
        Some(field) if FrameStorage::of_column(&field.name).is_some() => field.name.clone(),
        _ => return Err(lance::Error::corrupt_file_named(uri, "no frame column")),
    };
    let sums = read_checksums(&table).await?;
    let mut found = FrameTableCheck { checksums: sums.is_some(), ..FrameTableCheck::default() };
    let mut check_row = |row: u64, bytes: &[u8]| {
        if let Err(mismatch) = check(bytes, sums.as_ref().map(|s| s[row as usize])) {
            found.damaged.push((row, mismatch));
        }
        found.frames += 1;
        found.bytes += bytes.len() as u64;
    };
    if is_blob_table(&table) {
        let rows: Vec<u64> = (0..table.count_rows(None).await? as u64).collect();
        for chunk in rows.chunks(VERIFY_ROWS) {
            for (row, bytes) in chunk.iter().zip(read_frames(&table, &column, chunk).await?) {
                check_row(*row, &bytes);
            }
        }
    } else {
        let mut scan = table.scan();
        scan.project(&[column.as_str()])?;
        let mut batches = lake_store::stream_lance(uri, lake_store::read_lance(uri, scan.try_into_stream()).await?);
        let mut row = 0u64;
        while let Some(batch) = batches.try_next().await? {
            let frames = batch.column(0);
            let frames = frames.as_binary_opt::<i64>().ok_or_else(|| lance::Error::corrupt_file_named(uri, "frames not binary"))?;
            for i in 0..frames.len() {
                check_row(row, frames.value(i));
                row += 1;
            }
        }
    }
    Ok(found)
}

/// A stored frame whose bytes are not those `lake cache` wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mismatch {
    /// The CRC-32 stored with the frame.
    pub stored: u32,
    /// The CRC-32 of the bytes read.
    pub read: u32,
}

/// Checks a stored frame's bytes against the CRC-32 stored with them (`None`: nothing to check).
///
/// # Errors
/// When they differ.
pub fn check(bytes: &[u8], stored: Option<u32>) -> Result<(), Mismatch> {
    match stored {
        Some(stored) => match crc32fast::hash(bytes) {
            read if read == stored => Ok(()),
            read => Err(Mismatch { stored, read }),
        },
        None => Ok(()),
    }
}

/// Why a stored frame could not be read into its slot.
#[derive(Debug)]
pub(crate) enum ReadError {
    /// The read failed (the message names the file).
    Io(std::io::Error),
    /// The bytes read are not those stored.
    Damaged(Mismatch),
}

/// Reads each stored frame into its slot (exactly its size) and checks it, naming the row of a
/// read that fails: through this thread's io_uring, every read in flight at once, when the
/// lake's files are read through io_uring (`lake --io uring`); else with positioned reads, in
/// parallel on the pool. A frame is checked as soon as it is read, while its bytes are in the
/// CPU's cache.
pub(crate) fn read_frames_into(mut reads: Vec<(u64, &FrameExtent, &mut [MaybeUninit<u8>])>) -> Result<(), (u64, ReadError)> {
    use rayon::prelude::*;
    if lake_store::local_io::uring()
        && let Some(read) = with_ring(|ring| read_through(ring, &mut reads))
    {
        read.map_err(|(row, e)| (row, ReadError::Io(e)))?;
        return reads.par_iter().try_for_each(|(row, extent, slot)| extent.check(slot).map_err(|m| (*row, ReadError::Damaged(m))));
    }
    reads.into_par_iter().try_for_each(|(row, extent, slot)| {
        extent.read_into(slot).map_err(|e| (row, ReadError::Io(e)))?;
        extent.check(slot).map_err(|m| (row, ReadError::Damaged(m)))
    })
}

/// Runs `f` with this thread's ring, made on first use; `None` when the kernel refuses one.
fn with_ring<T>(f: impl FnOnce(&mut lake_store::local_io::Ring) -> T) -> Option<T> {
    use std::cell::RefCell;
    thread_local! {
        static RING: RefCell<Option<lake_store::local_io::Ring>> = const { RefCell::new(None) };
    }
    RING.with_borrow_mut(|ring| {
        if ring.is_none() {
            *ring = lake_store::local_io::Ring::new().inspect_err(|e| tracing::warn!("io_uring: {e}")).ok();
        }
        ring.as_mut().map(f)
    })
}

/// [`read_frames_into`] through `ring`; a read cut short (a signal, the file's end) is done
/// again with positioned reads, which finish it or name why not.
fn read_through(
    ring: &mut lake_store::local_io::Ring,
    reads: &mut [(u64, &FrameExtent, &mut [MaybeUninit<u8>])],
) -> Result<(), (u64, std::io::Error)> {
    use std::os::fd::AsRawFd;
    let list: Vec<lake_store::local_io::Read> = reads
        .iter_mut()
        .map(|(_, extent, slot)| {
            assert_eq!(slot.len(), extent.len, "a frame is read into a slot of its size");
            lake_store::local_io::Read {
                fd: extent.file.file.as_raw_fd(),
                offset: extent.offset,
                dst: slot.as_mut_ptr().cast(),
                len: extent.len,
            }
        })
        .collect();
    // SAFETY: each destination is its own slot of exactly `len` bytes, borrowed mutably by
    // `reads` for the whole call, and uninitialised memory is a valid read target.
    let done = unsafe { ring.read_all(&list) }.map_err(|(i, e)| {
        let (row, extent, _) = &reads[i];
        (*row, std::io::Error::new(e.kind(), format!("{}: {e}", extent.file.path)))
    })?;
    for ((row, extent, slot), n) in reads.iter_mut().zip(done) {
        if n < extent.len {
            extent.read_into(slot).map_err(|e| (*row, e))?;
        }
    }
    Ok(())
}

/// Where a stored frame lies in a file on the local filesystem: what a read straight into its
/// place in a batch needs (see [`locate_frames`]).
#[derive(Debug, Clone)]
pub struct FrameExtent {
    file: Arc<FrameFile>,
    offset: u64,
    len: usize,
    /// The CRC-32 stored with the frame, if the table has checksums.
    crc32: Option<u32>,
}

#[derive(Debug)]
struct FrameFile {
    path: String,
    file: std::fs::File,
}

impl FrameExtent {
    /// Bytes of the stored frame.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the stored frame has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Reads the frame into `dst` (exactly [`len`](Self::len) bytes) with positioned reads,
    /// the kernel copying from the page cache straight into it.
    ///
    /// # Errors
    /// When the read fails or the file ends inside the frame (both name the file).
    pub fn read_into(&self, dst: &mut [MaybeUninit<u8>]) -> std::io::Result<()> {
        use std::os::fd::AsRawFd;
        assert_eq!(dst.len(), self.len, "a frame is read into a slot of its size");
        let fd = self.file.file.as_raw_fd();
        let mut done = 0usize;
        while done < self.len {
            let at = libc::off_t::try_from(self.offset + done as u64).map_err(std::io::Error::other)?;
            // SAFETY: the destination is `len - done` writable bytes of `dst`; the kernel
            // writes at most that many, and uninitialised memory is a valid read target.
            let n = unsafe { libc::pread(fd, dst[done..].as_mut_ptr().cast(), self.len - done, at) };
            match n {
                0 => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        format!("{} ends inside a frame (at byte {} of {} from {})", self.file.path, done, self.len, self.offset),
                    ));
                }
                n if n < 0 => {
                    let e = std::io::Error::last_os_error();
                    if e.kind() != std::io::ErrorKind::Interrupted {
                        return Err(std::io::Error::new(e.kind(), format!("{}: {e}", self.file.path)));
                    }
                }
                n => done += n as usize,
            }
        }
        Ok(())
    }

    /// Checks the frame read into `slot` by [`read_into`](Self::read_into) against its
    /// checksum.
    fn check(&self, slot: &[MaybeUninit<u8>]) -> Result<(), Mismatch> {
        // SAFETY: the slot was filled by a read of the frame, every byte of it.
        check(unsafe { std::slice::from_raw_parts(slot.as_ptr().cast::<u8>(), slot.len()) }, self.crc32)
    }
}

/// The open data files of a frame table (a table's files never change once written).
#[derive(Debug, Default)]
pub struct FrameFiles(std::sync::Mutex<HashMap<String, Arc<FrameFile>>>);

impl FrameFiles {
    /// Lets go of every open file (reads under way keep theirs).
    pub(crate) fn clear(&self) {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clear();
    }

    fn open(&self, path: String) -> std::io::Result<Arc<FrameFile>> {
        let mut files = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(f) = files.get(&path) {
            return Ok(f.clone());
        }
        let file = std::fs::File::open(&path).map_err(|e| std::io::Error::new(e.kind(), format!("{path}: {e}")))?;
        let f = Arc::new(FrameFile { path: path.clone(), file });
        files.insert(path, f.clone());
        Ok(f)
    }
}

/// Where the frames of `rows` (sorted, distinct) of a blob frame table lie, in that order, with
/// their checksums (`checksums`: the table's, by row), or `None` when the table is not on the
/// local filesystem (then [`read_frames`] reads them).
///
/// Lance locates each blob (its data file, offset and size); the loader then reads it straight
/// into the batch, saving the copy out of a buffer Lance would read it into.
///
/// # Errors
/// When Lance cannot locate a frame or its file cannot be opened.
pub async fn locate_frames(
    table: &Arc<lance::Dataset>,
    column: &str,
    rows: &[u64],
    checksums: Option<&[u32]>,
    files: &FrameFiles,
) -> lance::Result<Option<Vec<FrameExtent>>> {
    use lance::datatypes::BlobKind;
    if !table.object_store(None).await?.has_direct_local_paths() {
        return Ok(None);
    }
    let blobs = lake_store::read_lance(table.uri(), table.take_blobs_by_indices(rows, column)).await?;
    let mut extents = Vec::with_capacity(blobs.len());
    for (blob, row) in blobs.into_iter().zip(rows) {
        let blob = blob.ok_or_else(|| lance::Error::invalid_input(format!("frame table row {row} holds no frame")))?;
        if !matches!(blob.kind(), BlobKind::Inline | BlobKind::Packed | BlobKind::Dedicated) {
            return Ok(None);
        }
        let file = files.open(format!("/{}", blob.data_path())).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => lance::Error::not_found(blob.data_path().to_string()),
            // (The OS error kept, so that a failure of the machine is not taken for a damaged file.)
            _ => lance::Error::from(e),
        })?;
        let len = usize::try_from(blob.size())
            .map_err(|_| lance::Error::invalid_input(format!("frame table row {row}: {} bytes", blob.size())))?;
        extents.push(FrameExtent { file, offset: blob.position(), len, crc32: checksums.map(|sums| sums[*row as usize]) });
    }
    Ok(Some(extents))
}

/// A frame table of a dataset version, as `lake inspect` lists it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct FrameTableInfo {
    /// The size its frames are stored at (`None`: as recorded).
    pub size: Option<FrameSize>,
    /// How its frames are stored (`None`: the table cannot be read).
    pub storage: Option<&'static str>,
    /// Frames it holds (`None`: the table cannot be read).
    pub frames: Option<usize>,
    /// Whether each frame has its checksum stored with it, checked on every read (`None`: the
    /// table cannot be read).
    pub checksums: Option<bool>,
    /// Bytes on disk.
    pub bytes: u64,
    /// What is wrong with its files, if anything (a data file missing, or of another size than
    /// the one written: damaged outside lake).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub damage: Option<String>,
}

/// The frame tables of a dataset version (`frames.lance`, `frames-WxH.lance`), recorded size
/// first, then by size; none when the lake cannot be listed.
pub async fn frame_tables(lake: &Lake, record: &lake_schemas::CommitRecord) -> Vec<FrameTableInfo> {
    let dir = &record.tables.dir;
    let names = lake.tables_named(dir, FRAMES).await.inspect_err(|e| tracing::warn!("listing frame tables: {e}")).unwrap_or_default();
    let mut found: Vec<(Option<FrameSize>, String)> = names
        .into_iter()
        .filter_map(|name| {
            let size = match name.strip_prefix(FRAMES)? {
                "" => None,
                rest => Some(rest.strip_prefix('-')?.parse().ok()?),
            };
            Some((size, name))
        })
        .collect();
    found.sort_by_key(|(size, _)| size.map(|s| (s.width, s.height)));
    let mut out = Vec::with_capacity(found.len());
    for (size, name) in found {
        let path = record.tables.path(&name);
        let opened = lake_store::open_lance(&lake.uri(&path)).await.ok();
        let storage =
            opened.as_ref().and_then(|t| t.schema().fields.get(1).and_then(|f| FrameStorage::of_column(&f.name))).map(FrameStorage::name);
        let checksums = opened.as_ref().map(|t| t.schema().field(FRAME_CHECKSUM).is_some());
        let frames = match &opened {
            Some(t) => t.count_rows(None).await.ok(),
            None => None,
        };
        let damage = match &opened {
            Some(t) => lake.data_file_damage(&path, t).await.ok().flatten(),
            None => None,
        };
        out.push(FrameTableInfo { size, storage, frames, checksums, bytes: lake.bytes_under(&path).await.unwrap_or(0), damage });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Frames of a file read through a ring and with positioned reads are the file's bytes; a
    /// frame past the file's end is an error naming the file either way.
    #[test]
    fn frames_read_through_io_uring_are_the_files_bytes() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("frames.blob");
        let bytes: Vec<u8> = (0..3_000_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        std::fs::write(&path, &bytes).expect("write");
        let file = Arc::new(FrameFile { path: path.display().to_string(), file: std::fs::File::open(&path).expect("open") });
        // More extents than a ring keeps in flight, of sizes from a byte to a megabyte.
        let extents: Vec<FrameExtent> = (0..300u64)
            .map(|i| {
                let len = [1, 4096, 9_999, 1 << 20][i as usize % 4];
                let offset = (i * 7919 * 97) % (bytes.len() - len) as u64;
                FrameExtent { file: file.clone(), offset, len, crc32: None }
            })
            .collect();
        let check = |slots: &[Vec<MaybeUninit<u8>>], how: &str| {
            for (e, slot) in extents.iter().zip(slots) {
                // SAFETY: every byte of the slot was read.
                let got = unsafe { std::slice::from_raw_parts(slot.as_ptr().cast::<u8>(), slot.len()) };
                assert!(got == &bytes[e.offset as usize..e.offset as usize + e.len], "{how}: the frame at {} ({} bytes)", e.offset, e.len);
            }
        };
        let mut slots: Vec<Vec<MaybeUninit<u8>>> = extents.iter().map(|e| vec![MaybeUninit::uninit(); e.len]).collect();
        for (e, slot) in extents.iter().zip(slots.iter_mut()) {
            e.read_into(slot).expect("a positioned read");
        }
        check(&slots, "positioned reads");
        // The kernels lake is built and tested on allow io_uring.
        let mut ring = lake_store::local_io::Ring::new().expect("an io_uring");
        let mut slots: Vec<Vec<MaybeUninit<u8>>> = extents.iter().map(|e| vec![MaybeUninit::uninit(); e.len]).collect();
        let mut reads: Vec<_> =
            extents.iter().zip(slots.iter_mut()).enumerate().map(|(row, (e, slot))| (row as u64, e, slot.as_mut_slice())).collect();
        read_through(&mut ring, &mut reads).expect("read");
        drop(reads);
        check(&slots, "io_uring");
        let past = FrameExtent { file, offset: bytes.len() as u64 - 10, len: 100, crc32: None };
        let mut slot = vec![MaybeUninit::uninit(); 100];
        let (row, e) = read_through(&mut ring, &mut [(7, &past, slot.as_mut_slice())]).expect_err("past the end");
        assert_eq!((row, e.kind()), (7, std::io::ErrorKind::UnexpectedEof));
        assert!(e.to_string().contains("frames.blob ends inside a frame"), "{e}");
    }

    #[test]
    fn frame_columns_are_uncompressed_lance_blobs() {
        for storage in [FrameStorage::Plain, FrameStorage::Zstd] {
            let schema = lance::datatypes::Schema::try_from(frames_schema(storage).as_ref()).expect("a Lance schema");
            let frame = schema.field(storage.column()).expect("the frame column");
            assert!(frame.is_blob(), "{}: {:?}", storage.name(), frame.metadata);
            assert_eq!(frame.metadata.get(LANCE_COMPRESSION).map(String::as_str), Some("none"));
            assert_eq!(FrameStorage::of_column(storage.column()), Some(storage));
        }
    }
}
