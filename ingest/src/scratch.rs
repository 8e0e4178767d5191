//! Per-step bookkeeping of an ingest, kept on disk instead of in memory: each episode's
//! timestamps (from the first pass over the data) and, per video camera, the packet that shows
//! each step's frame (from demuxing); also LeRobot's per-episode statistics (see
//! `episode_stats`). Memory then holds a few numbers per episode, whatever the number of steps;
//! the files live in a directory under `$TMPDIR` removed when the ingest ends.
//! The directory's lock file is locked while its ingest runs: one left by an ingest that was
//! killed is removed by the next.
//!
//! Every step has a slot: an episode's steps take consecutive slots, handed out when its
//! timestamps are stored.

use std::{
    fs::File,
    os::unix::fs::FileExt,
    sync::atomic::{AtomicU64, Ordering},
};

use crate::{Error, Result};

/// The largest packet position the scratch files hold (a stored position is one more, so that
/// a slot never written reads as none).
pub const MAX_POSITION: u64 = u32::MAX as u64 - 1;
/// Prefix of scratch directories' names.
const PREFIX: &str = "lake-ingest-";
/// A scratch directory without its lock file (its ingest killed while making it) is removed
/// when it is this old.
const UNLOCKED_AGE: std::time::Duration = std::time::Duration::from_secs(3600);

/// The scratch files of one ingest.
#[derive(Debug)]
pub struct Scratch {
    dir: tempfile::TempDir,
    /// Locked while the ingest runs.
    _lock: File,
    timestamps: File,
    /// One file per video camera: per slot, a little-endian `u32`, the packet position plus one
    /// (0 for none).
    positions: Vec<File>,
    next_slot: AtomicU64,
}

impl Scratch {
    /// Creates the scratch directory and its timestamps file (the cameras' files come with
    /// [`Scratch::add_cameras`]).
    ///
    /// # Errors
    /// When the directory or its files cannot be created.
    pub fn new() -> Result<Self> {
        remove_abandoned();
        let dir = tempfile::Builder::new()
            .prefix(PREFIX)
            .tempdir()
            .map_err(|source| Error::Scratch { dir: std::env::temp_dir().display().to_string(), source })?;
        let create = |name: String| File::options().read(true).write(true).create_new(true).open(dir.path().join(name));
        let files = || -> std::io::Result<_> {
            // Locked before it takes its name, so that no other ingest finds it unlocked. Where
            // the file system has no locks, other ingests never remove the directory.
            let lock = create("lock.new".into())?;
            let _ = lock.lock();
            std::fs::rename(dir.path().join("lock.new"), dir.path().join("lock"))?;
            Ok((lock, create("timestamps".into())?))
        };
        let (lock, timestamps) = files().map_err(|source| Error::Scratch { dir: dir.path().display().to_string(), source })?;
        Ok(Self { dir, _lock: lock, timestamps, positions: Vec::new(), next_slot: AtomicU64::new(0) })
    }

    /// Creates the packet-position files of `cameras` video cameras.
    ///
    /// # Errors
    /// When they cannot be created.
    pub fn add_cameras(&mut self, cameras: usize) -> Result<()> {
        for _ in 0..cameras {
            let name = format!("positions-{}", self.positions.len());
            let (file, _) = self.create_file(&name)?;
            self.positions.push(file);
        }
        Ok(())
    }

    /// Creates a file of the given name in the scratch directory, open to read and write.
    ///
    /// # Errors
    /// When it cannot be created (or exists).
    pub fn create_file(&self, name: &str) -> Result<(File, std::path::PathBuf)> {
        let path = self.dir.path().join(name);
        let file = File::options().read(true).write(true).create_new(true).open(&path).map_err(self.error())?;
        Ok((file, path))
    }

    fn error(&self) -> impl FnOnce(std::io::Error) -> Error + '_ {
        |source| Error::Scratch { dir: self.dir.path().display().to_string(), source }
    }

    /// Stores one episode's timestamps (one per step, in frame order) in fresh slots; returns
    /// the first.
    pub fn put_timestamps(&self, timestamps: &[f32]) -> Result<u64> {
        let at = self.next_slot.fetch_add(timestamps.len() as u64, Ordering::Relaxed);
        let bytes: Vec<u8> = timestamps.iter().flat_map(|t| t.to_le_bytes()).collect();
        self.timestamps.write_all_at(&bytes, at * 4).map_err(self.error())?;
        Ok(at)
    }

    /// The timestamps of the `steps` slots from `at`.
    pub fn timestamps(&self, at: u64, steps: usize) -> Result<Vec<f32>> {
        let mut bytes = vec![0u8; steps * 4];
        self.timestamps.read_exact_at(&mut bytes, at * 4).map_err(self.error())?;
        Ok(bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
    }

    /// Stores the packet positions (in its stream, at most [`MAX_POSITION`]) of the frames of
    /// `camera` for the slots from `at`.
    pub fn put_positions(&self, camera: usize, at: u64, positions: &[Option<u32>]) -> Result<()> {
        let bytes: Vec<u8> = positions.iter().flat_map(|p| p.map_or(0, |p| p + 1).to_le_bytes()).collect();
        self.positions[camera].write_all_at(&bytes, at * 4).map_err(self.error())
    }

    /// The packet positions of `camera`'s frames for the `steps` slots from `at` (none where
    /// none was stored).
    pub fn positions(&self, camera: usize, at: u64, steps: usize) -> Result<Vec<Option<u32>>> {
        let mut bytes = vec![0u8; steps * 4];
        self.positions[camera].read_exact_at(&mut bytes, at * 4).map_err(self.error())?;
        Ok(bytes.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]).checked_sub(1)).collect())
    }
}

/// Removes the scratch directories of ingests that no longer run (killed): those whose lock
/// file can be locked, or that have none and are old. Best effort: what cannot be removed stays.
fn remove_abandoned() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        if !entry.file_name().to_str().is_some_and(|n| n.starts_with(PREFIX)) || !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let abandoned = match File::open(path.join("lock")) {
            Ok(lock) => lock.try_lock().is_ok(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                entry.metadata().and_then(|m| m.modified()).is_ok_and(|m| m.elapsed().is_ok_and(|age| age > UNLOCKED_AGE))
            }
            // Another user's, say: not ours to judge.
            Err(_) => false,
        };
        if abandoned {
            tracing::info!(dir = %path.display(), "removing the scratch files of an ingest that no longer runs");
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn episodes_take_consecutive_slots_and_read_back_what_was_stored() {
        let mut scratch = Scratch::new().expect("scratch");
        scratch.add_cameras(2).expect("cameras");
        let a = scratch.put_timestamps(&[0.0, 0.1, 0.2]).expect("a");
        let b = scratch.put_timestamps(&[5.5, 6.5]).expect("b");
        assert_eq!((a, b), (0, 3));
        assert_eq!(scratch.timestamps(b, 2).expect("read"), vec![5.5, 6.5]);
        assert_eq!(scratch.timestamps(a + 1, 2).expect("read"), vec![0.1, 0.2]);
        scratch.put_positions(1, b, &[Some(7), None]).expect("put");
        scratch.put_positions(1, a + 1, &[Some(0), Some(MAX_POSITION as u32)]).expect("put");
        // A slot never written reads as none.
        assert_eq!(scratch.positions(1, a, 5).expect("read"), vec![None, Some(0), Some(MAX_POSITION as u32), Some(7), None]);
        // Reading past what camera 0 holds is an error naming the directory.
        let e = scratch.positions(0, a, 1).expect_err("nothing stored");
        assert!(e.to_string().contains("lake-ingest-") && e.to_string().contains("TMPDIR"), "{e}");
        let dir = scratch.dir.path().to_path_buf();
        drop(scratch);
        assert!(!dir.exists(), "the scratch directory is removed");
    }

    #[test]
    fn a_killed_ingests_scratch_is_removed_and_a_running_ones_kept() {
        let running = Scratch::new().expect("running");
        // What a killed ingest leaves: its lock file, no longer locked.
        let killed = tempfile::Builder::new().prefix(PREFIX).tempdir().expect("dir").keep();
        std::fs::write(killed.join("lock"), b"").expect("lock file");
        std::fs::write(killed.join("timestamps"), [0u8; 64]).expect("timestamps");
        // Being made (no lock file yet) and recent.
        let young = tempfile::Builder::new().prefix(PREFIX).tempdir().expect("dir");
        let next = Scratch::new().expect("next");
        assert!(!killed.exists(), "the killed ingest's scratch is removed");
        assert!(running.dir.path().join("timestamps").exists() && young.path().exists() && next.dir.path().exists());
    }
}
