//! Leases: which writer is writing which version directory, renewed while it writes, so that
//! garbage collection on any host tells a dead writer's leftovers from a live writer's work.
//!
//! - A writer creates its lease when it begins (`staging/<id>.json`, only if absent) and rewrites
//!   it every [`RENEW`] with the time. Each rewrite is conditional on the lease being the one it
//!   last wrote (its ETag), so a lease taken over is never written back.
//! - A lease is dead when its process is gone (asked of the kernel, on the writer's own host) or
//!   when it went unrenewed for [`EXPIRY`] (on any other host).
//! - Garbage collection takes a dead lease over with a conditional write of its own before it
//!   deletes what the lease names. A writer that was only paused (or cut off from the store)
//!   finds its lease changed at its next renewal, or at the latest when it confirms the lease
//!   right before committing, and stops with nothing committed.
//! - A store without conditional updates (a local filesystem) gets the same steps as plain reads
//!   and writes; there, writers on one host are told apart by their pids. On a local disk a
//!   lease is written through a staging file named for its writer (`.<id>.json.<pid>@<host>`,
//!   see [`local_staging`]), linked or renamed into place, so that what a writer killed
//!   mid-write leaves can be told apart and removed once that writer is gone.

use std::{
    path::{Path as FilePath, PathBuf},
    sync::Arc,
    time::Duration,
};

use chrono::{DateTime, Utc};
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion, path::Path};
use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// How often a writer renews its lease.
pub(crate) const RENEW: Duration = Duration::from_secs(60);

/// How long a lease lasts unrenewed, for garbage collection on another host than the writer's:
/// ten renewals, and room for clocks that disagree by minutes.
pub(crate) const EXPIRY: chrono::TimeDelta = chrono::TimeDelta::minutes(10);

/// How long a lease that is never renewed (written by a lake that did not renew leases) lasts on
/// another host.
const UNRENEWED_EXPIRY: chrono::TimeDelta = chrono::TimeDelta::days(1);

/// A lease, as stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Lease {
    pub(crate) name: String,
    pub(crate) dir: String,
    pub(crate) pid: u32,
    pub(crate) host: String,
    pub(crate) started_at: DateTime<Utc>,
    /// When the writer last renewed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) renewed_at: Option<DateTime<Utc>>,
    /// The host whose garbage collection took the lease over (the writer is dead).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) collected_by: Option<String>,
}

impl Lease {
    /// A new lease of this process for the version directory `dir` of `name`.
    pub(crate) fn new(name: &str, dir: &str) -> Self {
        let now = Utc::now();
        Self {
            name: name.to_string(),
            dir: dir.to_string(),
            pid: std::process::id(),
            host: hostname(),
            started_at: now,
            renewed_at: Some(now),
            collected_by: None,
        }
    }

    /// Whether the writer that holds this lease is gone, seen from `host` at `now`: its process
    /// is, on its own host; it went unrenewed for [`EXPIRY`], on another; or garbage collection
    /// took the lease over.
    pub(crate) fn is_dead(&self, host: &str, now: DateTime<Utc>) -> bool {
        if self.collected_by.is_some() {
            return true;
        }
        if self.host == host {
            return !process_alive(self.pid);
        }
        match self.renewed_at {
            Some(renewed) => now.signed_duration_since(renewed) > EXPIRY,
            None => now.signed_duration_since(self.started_at) > UNRENEWED_EXPIRY,
        }
    }

    fn body(&self) -> PutPayload {
        PutPayload::from(serde_json::to_vec_pretty(self).expect("lease serialises"))
    }
}

/// The staging file this process writes lease `file` through on a local disk:
/// `.<name>.<pid>@<host>` beside it. object_store's own (`<name>#<n>`) would not say whose it
/// is, and a writer killed between making it and moving it into place would leave a file no
/// one could remove.
pub(crate) fn local_staging(file: &FilePath) -> PathBuf {
    let name = file.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    file.with_file_name(format!(".{name}.{}@{}", std::process::id(), hostname()))
}

/// The writer of a lease staging file named as [`local_staging`] names it: `(pid, host)`.
pub(crate) fn staging_writer(file_name: &str) -> Option<(u32, &str)> {
    let (rest, host) = file_name.strip_prefix('.')?.rsplit_once('@')?;
    let (lease, pid) = rest.rsplit_once('.')?;
    lease.ends_with(".json").then_some(())?;
    Some((pid.parse().ok()?, host))
}

/// Writes lease `file` on a local disk through this process's staging file: created only if
/// absent (`create`, a hard link), else replaced (a rename).
fn put_local(file: &FilePath, body: &PutPayload, create: bool) -> std::result::Result<(), object_store::Error> {
    let failed = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::AlreadyExists => object_store::Error::AlreadyExists { path: file.display().to_string(), source: Box::new(e) },
        _ => object_store::Error::Generic { store: "LocalFileSystem", source: Box::new(e) },
    };
    let staged = local_staging(file);
    let bytes: Vec<u8> = body.iter().flat_map(|b| b.iter().copied()).collect();
    // A writer that finishes prunes `staging/` once it is empty, which it is between making the
    // directory here and writing into it when this is the only lease: made again, a few times.
    let mut tries = 0;
    loop {
        if let Some(dir) = file.parent() {
            std::fs::create_dir_all(dir).map_err(failed)?;
        }
        match std::fs::write(&staged, &bytes) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && tries < 8 => tries += 1,
            written => break written.map_err(failed)?,
        }
    }
    let placed = if create { std::fs::hard_link(&staged, file) } else { std::fs::rename(&staged, file) };
    if create || placed.is_err() {
        let _ = std::fs::remove_file(&staged);
    }
    placed.map_err(failed)
}

/// Takes over the dead lease `lease` at `path` (`local`: its file, on a local disk), read with
/// `version`, for this host's garbage collection; false when its writer renewed it since it was
/// read (it is alive).
///
/// # Errors
/// When the store fails.
pub(crate) async fn take_over(
    store: &Arc<dyn ObjectStore>,
    path: &Path,
    local: Option<&FilePath>,
    lease: &Lease,
    version: UpdateVersion,
) -> Result<bool> {
    if lease.collected_by.is_some() {
        return Ok(true);
    }
    let taken = Lease { collected_by: Some(hostname()), ..lease.clone() };
    if let Some(file) = local {
        put_local(file, &taken.body(), false).map_err(Error::store(path.to_string()))?;
        return Ok(true);
    }
    match store.put_opts(path, taken.body(), PutOptions::from(PutMode::Update(version))).await {
        Ok(_) => Ok(true),
        Err(object_store::Error::Precondition { .. } | object_store::Error::NotFound { .. }) => Ok(false),
        Err(object_store::Error::NotImplemented { .. }) => {
            store.put_opts(path, taken.body(), PutOptions::from(PutMode::Overwrite)).await.map_err(Error::store(path.to_string()))?;
            Ok(true)
        }
        Err(e) => Err(Error::store(path.to_string())(e)),
    }
}

/// A lease this process holds: renewed in the background until it is stopped or dropped.
#[derive(Debug)]
pub(crate) struct HeldLease {
    path: Path,
    state: Arc<tokio::sync::Mutex<Held>>,
    renewal: tokio::task::JoinHandle<()>,
}

#[derive(Debug)]
struct Held {
    store: Arc<dyn ObjectStore>,
    path: Path,
    /// The lease's file, on a local disk.
    local: Option<PathBuf>,
    lease: Lease,
    /// The version this process last wrote, when the store takes conditional updates.
    version: Option<UpdateVersion>,
    /// Taken over by another process's garbage collection.
    lost: bool,
    /// No more renewals (the lease is being deleted).
    stopped: bool,
}

impl HeldLease {
    /// Creates `lease` at `path` (`local`: its file, on a local disk), failing if a lease is
    /// there, and starts renewing it.
    ///
    /// # Errors
    /// When the lease cannot be created.
    pub(crate) async fn create(store: &Arc<dyn ObjectStore>, path: Path, local: Option<PathBuf>, lease: Lease) -> Result<Self> {
        let version = match &local {
            Some(file) => {
                put_local(file, &lease.body(), true).map_err(Error::store(path.to_string()))?;
                None
            }
            None => {
                let put = store
                    .put_opts(&path, lease.body(), PutOptions { mode: PutMode::Create, ..Default::default() })
                    .await
                    .map_err(Error::store(path.to_string()))?;
                Some(UpdateVersion { e_tag: put.e_tag, version: put.version })
            }
        };
        let state = Arc::new(tokio::sync::Mutex::new(Held {
            store: store.clone(),
            path: path.clone(),
            local,
            lease,
            version,
            lost: false,
            stopped: false,
        }));
        let renewing = state.clone();
        let renewal = tokio::spawn(async move {
            loop {
                tokio::time::sleep(RENEW).await;
                let mut held = renewing.lock().await;
                if held.stopped {
                    return;
                }
                match held.renew().await {
                    Ok(true) => {}
                    Ok(false) => {
                        tracing::warn!(lease = %held.path, "garbage collection of another process took this writer's lease over");
                        return;
                    }
                    Err(e) => tracing::warn!(lease = %held.path, "renewing the lease failed (tried again in {} s): {e}", RENEW.as_secs()),
                }
            }
        });
        Ok(Self { path, state, renewal })
    }

    /// The lease's path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Renews the lease now: false when another process took it over (this writer must not
    /// commit).
    ///
    /// # Errors
    /// When the store fails.
    pub(crate) async fn confirm(&self) -> Result<bool> {
        let mut held = self.state.lock().await;
        held.renew().await.map_err(Error::store(self.path.to_string()))
    }

    /// Stops renewing: once this returns, no renewal is under way or follows.
    pub(crate) async fn stop(&self) {
        let mut held = self.state.lock().await;
        held.stopped = true;
        self.renewal.abort();
    }
}

impl Drop for HeldLease {
    fn drop(&mut self) {
        self.renewal.abort();
    }
}

impl Held {
    /// Rewrites the lease with the time, unless another process took it over (then false).
    async fn renew(&mut self) -> std::result::Result<bool, object_store::Error> {
        if self.lost {
            return Ok(false);
        }
        self.lease.renewed_at = Some(Utc::now());
        if let Some(version) = self.version.clone() {
            match self.store.put_opts(&self.path, self.lease.body(), PutOptions::from(PutMode::Update(version))).await {
                Ok(put) => {
                    self.version = Some(UpdateVersion { e_tag: put.e_tag, version: put.version });
                    return Ok(true);
                }
                Err(object_store::Error::Precondition { .. } | object_store::Error::NotFound { .. }) => {
                    self.lost = true;
                    return Ok(false);
                }
                Err(object_store::Error::NotImplemented { .. }) => self.version = None,
                Err(e) => return Err(e),
            }
        }
        // Without conditional updates: the lease must still be this writer's before it is
        // rewritten.
        let current: Option<Lease> = match self.store.get(&self.path).await {
            Ok(got) => serde_json::from_slice(&got.bytes().await?).ok(),
            Err(object_store::Error::NotFound { .. }) => None,
            Err(e) => return Err(e),
        };
        let ours = current.is_some_and(|c| {
            c.collected_by.is_none() && (c.pid, &c.host, c.started_at) == (self.lease.pid, &self.lease.host, self.lease.started_at)
        });
        if !ours {
            self.lost = true;
            return Ok(false);
        }
        match &self.local {
            Some(file) => put_local(file, &self.lease.body(), false)?,
            None => drop(self.store.put_opts(&self.path, self.lease.body(), PutOptions::from(PutMode::Overwrite)).await?),
        }
        Ok(true)
    }
}

/// This machine's name (what leases record, to tell this machine's writers from others').
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|s| s.trim().to_string()).unwrap_or_else(|_| "localhost".into())
}

/// Whether process `pid` exists on this machine (a writer that died leaves files that may go).
pub fn process_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else { return false };
    // SAFETY: kill with signal 0 only checks whether the process exists.
    let rc = unsafe { libc::kill(pid, 0) };
    let exists = rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
    // A process killed but not reaped yet (a zombie, which a container whose first process
    // reaps nothing keeps for good) still answers the signal; it is gone all the same.
    exists && !std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| zombie(&stat))
}

/// Whether a `/proc/PID/stat` line is a dead process's: its state (after the parenthesised
/// command name, which may itself hold parentheses) `Z` or `X`.
fn zombie(stat: &str) -> bool {
    stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next()).is_some_and(|state| matches!(state, 'Z' | 'X'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zombies_are_not_alive() {
        assert!(zombie("4242 (lake) Z 1 4242 4242 0 -1"));
        assert!(zombie("4242 (a) b) X 1"), "the state follows the last parenthesis");
        assert!(!zombie("4242 (lake) S 1 4242"));
        assert!(process_alive(std::process::id()), "this process is alive");
        let mut child = std::process::Command::new("true").spawn().expect("spawn");
        let pid = child.id();
        while std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !zombie(&s)) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(!process_alive(pid), "exited, not reaped yet");
        child.wait().expect("reaped");
        assert!(!process_alive(pid));
    }

    #[test]
    fn a_lease_is_dead_when_its_process_is_gone_or_it_went_unrenewed() {
        let now = Utc::now();
        let mut lease = Lease::new("ds", "datasets/ds/x");
        let here = hostname();
        assert!(!lease.is_dead(&here, now), "this process is alive");
        assert!(!lease.is_dead(&here, now + chrono::TimeDelta::days(3)), "on its own host, its pid decides");
        lease.pid = i32::MAX as u32;
        assert!(lease.is_dead(&here, now));

        // On another host: the time since its last renewal.
        let elsewhere = format!("{here}-elsewhere");
        let mut lease = Lease::new("ds", "datasets/ds/x");
        lease.started_at = now - chrono::TimeDelta::days(2);
        lease.renewed_at = Some(now - chrono::TimeDelta::minutes(2));
        assert!(!lease.is_dead(&elsewhere, now), "renewed two minutes ago: a long ingest, alive");
        lease.renewed_at = Some(now - EXPIRY - chrono::TimeDelta::seconds(1));
        assert!(lease.is_dead(&elsewhere, now));
        // A lease that is never renewed lasts a day.
        lease.renewed_at = None;
        lease.started_at = now - chrono::TimeDelta::hours(23);
        assert!(!lease.is_dead(&elsewhere, now));
        lease.started_at = now - chrono::TimeDelta::hours(25);
        assert!(lease.is_dead(&elsewhere, now));
        // Taken over: dead for everyone.
        let mut lease = Lease::new("ds", "datasets/ds/x");
        lease.collected_by = Some("other".into());
        assert!(lease.is_dead(&here, now) && lease.is_dead(&elsewhere, now));
    }

    /// A writer whose lease garbage collection took over finds out when it confirms, and a
    /// lease renewed since it was read is not taken over. Both through a store with
    /// conditional updates and through a local filesystem without them.
    #[tokio::test]
    async fn a_lease_taken_over_is_lost_to_its_writer_and_a_renewed_one_is_not_taken() {
        let tmp = tempfile::tempdir().expect("tmp");
        let stores: [Arc<dyn ObjectStore>; 2] = [
            Arc::new(object_store::memory::InMemory::new()),
            Arc::new(object_store::local::LocalFileSystem::new_with_prefix(tmp.path()).expect("local")),
        ];
        for (store, local) in stores.into_iter().zip([None, Some(tmp.path().join("staging/x.json"))]) {
            let path = Path::from("staging/x.json");
            let read = |store: Arc<dyn ObjectStore>| async move {
                let got = store.get(&Path::from("staging/x.json")).await.expect("get");
                let version = UpdateVersion { e_tag: got.meta.e_tag.clone(), version: got.meta.version.clone() };
                (serde_json::from_slice::<Lease>(&got.bytes().await.expect("bytes")).expect("a lease"), version)
            };
            let create = || HeldLease::create(&store, path.clone(), local.clone(), Lease::new("ds", "datasets/ds/x"));
            let held = create().await.expect("create");
            assert!(create().await.is_err(), "one lease per path");
            let (stale, version) = read(store.clone()).await;
            assert!(held.confirm().await.expect("confirm"), "{store}");
            // Read before the writer renewed it: not taken over (where the store can tell).
            let taken = take_over(&store, &path, local.as_deref(), &stale, version).await.expect("take over");
            let conditional = format!("{store}").starts_with("InMemory");
            assert_eq!(taken, !conditional, "{store}");
            if !taken {
                let (current, version) = read(store.clone()).await;
                assert!(take_over(&store, &path, local.as_deref(), &current, version).await.expect("take over"), "{store}");
            }
            let (collected, _) = read(store.clone()).await;
            assert_eq!(collected.collected_by, Some(hostname()));
            assert!(!held.confirm().await.expect("confirm"), "{store}: the writer lost its lease");
            held.stop().await;
            store.delete(&path).await.expect("delete");
            if local.is_some() {
                let left: Vec<_> =
                    std::fs::read_dir(tmp.path().join("staging")).expect("staging").flatten().map(|e| e.file_name()).collect();
                assert!(left.is_empty(), "no staging file is left: {left:?}");
            }
        }
    }

    /// A lease's local staging file names its writer, and only such names are read as one.
    #[test]
    fn a_local_staging_file_names_its_writer() {
        let staged = local_staging(FilePath::new("/lake/staging/20261130T064738-fcc43957f174.json"));
        let name = staged.file_name().and_then(|n| n.to_str()).expect("a name");
        assert_eq!(staged.parent(), Some(FilePath::new("/lake/staging")));
        assert_eq!(staging_writer(name), Some((std::process::id(), hostname().as_str())));
        assert_eq!(staging_writer(".x.json.12@host-a.example"), Some((12, "host-a.example")));
        for other in ["x.json", ".x.json", "x.json#1", ".x.json.12", ".x.lance.12@h", ".x.json.pid@h"] {
            assert_eq!(staging_writer(other), None, "{other}");
        }
    }
}
