//! The lake root and its catalog.
//!
//! ```text
//! <root>/
//!   lake.json                       marks the directory as a lake (layout version)
//!   catalog/<name>/v00000001.json   commit records; a version exists once its record does
//!   datasets/<name>/<id>/<table>.lance
//!   staging/<id>.json               lease of an ingest in flight (removed on commit or abort)
//!   views/<name>/v00000001.json     named training sets (`lake view create`), one record per version
//!   removed/<name>/v00000003.json   `lake rm`: the dataset's versions up to 3 are gone (one per rm)
//! ```
//!
//! A version's tables are written into a fresh `datasets/<name>/<id>/` directory nobody reads,
//! then published by creating its commit record with create-if-absent semantics. Readers only
//! follow commit records, so a failed or killed ingest never shows a half dataset; its leftovers
//! are removed by [`Lake::collect_garbage`], which every ingest runs first.
//!
//! `lake rm` ([`Lake::remove`]) writes the dataset's removal record first: from then on every
//! reader treats its versions up to that number as gone, and the record keeps their numbers
//! taken (a later ingest of the name continues after them, so `NAME@N` never means two things).
//! Their tables and commit records are deleted after it; garbage collection finishes a removal
//! that was interrupted.

use std::{collections::BTreeMap, path::PathBuf, sync::Arc};

use chrono::{DateTime, Utc};
use futures::TryStreamExt;
use lake_schemas::{CommitRecord, ViewRecord};
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, local::LocalFileSystem, path::Path};
use serde::{Deserialize, Serialize};

use crate::{
    Error, Result,
    lease::{HeldLease, Lease, hostname, process_alive},
    removal::Removal,
};

const CATALOG: &str = "catalog";
const DATASETS: &str = "datasets";
const STAGING: &str = "staging";
const VIEWS: &str = "views";
const REMOVED: &str = "removed";
const MARKER: &str = "lake.json";
/// What a new lake's marker is written as before it is renamed into place (followed by the
/// writer's pid).
const NEW_MARKER: &str = ".lake.json.new-";
/// Where [`Lake::take_back`] moves the marker while it checks that no other writer started
/// (followed by its pid: one left by a process that died is put back).
const TAKING_BACK: &str = ".lake.json.taking-back-";
/// Written by a failed first ingest that could not take back the lake it created because other
/// writers were at work in it: the last of them to fail takes it back instead. Holds whether
/// the directory existed before the lake.
const UNCLAIMED: &str = "unclaimed.json";
/// Layout version written to `lake.json`.
const LAYOUT: u32 = 1;

/// What [`Lake::remove`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct RemovalReport {
    /// The removal as recorded.
    pub removal: Removal,
    /// The versions whose tables and records were deleted now (older removals' are not).
    pub versions: Vec<u64>,
    /// Bytes of table files deleted.
    pub bytes: u64,
    /// Versions committed by an ingest while the removal was written: they stay.
    pub kept: Vec<u64>,
    /// This finished an earlier removal that was interrupted (nothing was visible).
    pub finished_earlier: bool,
    /// Ingests of the name under way: not stopped, each commits a version after the removed ones.
    pub under_way: Vec<IngestUnderWay>,
}

/// An ingest at work on a dataset (from its lease).
#[derive(Debug, Clone, PartialEq)]
pub struct IngestUnderWay {
    /// Its process.
    pub pid: u32,
    /// The host it runs on.
    pub host: String,
    /// When it began writing.
    pub started_at: DateTime<Utc>,
}

/// The contents of `lake.json`.
#[derive(Debug, Serialize, Deserialize)]
struct Marker {
    format: String,
    layout: u32,
}

/// A lake: a root directory (object store prefix) holding many datasets and their versions.
#[derive(Debug, Clone)]
pub struct Lake {
    /// The lake's directory, for a lake on the local disk (empty on an object store).
    root: PathBuf,
    /// The lake's location, for a lake on an object store.
    remote: Option<Arc<crate::remote::Remote>>,
    display: String,
    store: Arc<dyn ObjectStore>,
    /// Opened to be created where there is none ([`Lake::create`]).
    creates: bool,
    /// This handle made the lake again after a failed ingest beside it took it back.
    remade: Arc<std::sync::atomic::AtomicBool>,
}

impl Lease {
    /// Whether this lease, read from `path`, names the version directory `begin` gives it:
    /// `datasets/NAME/ID` for a valid name and the lease file `staging/ID.json`. Anything else
    /// (a lease edited by hand, a foreign file) must not make garbage collection delete what
    /// it names.
    fn names_its_own_version(&self, path: &Path) -> bool {
        let Some(id) = path.filename().and_then(|f| f.strip_suffix(".json")) else { return false };
        let plain = !id.is_empty() && !id.starts_with('.') && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
        plain && validate_name(&self.name).is_ok() && self.dir == format!("{DATASETS}/{}/{id}", self.name)
    }
}

/// The markers moved aside in `root` by [`Lake::take_back`], with the pid of the process that
/// moved each.
fn taking_back(root: &std::path::Path) -> Vec<(PathBuf, Option<u32>)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(root).into_iter().flatten().flatten() {
        let name = entry.file_name();
        if let Some(pid) = name.to_str().and_then(|n| n.strip_prefix(TAKING_BACK)) {
            out.push((entry.path(), pid.parse().ok()));
        }
    }
    out
}

/// A catalog or view record that cannot be parsed (damaged outside lake).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreadable {
    /// The dataset's or view's name.
    pub name: String,
    /// The version the record is of.
    pub version: u64,
    /// The record's path, relative to the lake root.
    pub path: String,
    /// Why it cannot be read.
    pub why: String,
}

/// What [`Lake::collect_garbage`] removed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct GarbageReport {
    /// Directories of ingests that died before committing.
    pub removed_dirs: Vec<String>,
    /// Versions (dataset, version) whose deletion by an interrupted `lake rm` was finished.
    pub finished_removals: Vec<(String, u64)>,
}

impl Lake {
    /// Opens the existing lake at `root` (a local directory path or `file://` URL).
    ///
    /// # Errors
    /// When there is no lake directory there, or `root` is a URL of a scheme this build cannot
    /// use.
    pub fn open(root: &str) -> Result<Self> {
        Self::open_inner(root, false)
    }

    /// Opens the lake at `root`, creating it when the directory does not exist yet or is empty.
    ///
    /// # Errors
    /// As [`Lake::open`], when the directory cannot be created, or when it exists, holds files
    /// and is not a lake (lake never writes into a directory it did not make).
    pub fn create(root: &str) -> Result<Self> {
        Self::open_inner(root, true)
    }

    fn open_inner(root: &str, create: bool) -> Result<Self> {
        let root_err = |message: String| Error::Root { root: root.to_string(), message };
        if crate::remote::is_remote(root) {
            return Self::open_remote(root, create);
        }
        let Some(path) = local_path(root) else {
            return Err(root_err("is neither a local path (or file:// URL) nor an object store URL (s3://, gs://, az://)".into()));
        };
        let abs = std::path::absolute(&path).map_err(|e| root_err(e.to_string()))?;
        if !abs.exists()
            && let Ok(target) = std::fs::read_link(&abs)
        {
            return Err(root_err(format!("is a symbolic link to {}, which does not exist", target.display())));
        }
        if abs.exists() && !abs.is_dir() {
            return Err(root_err("exists and is not a directory".into()));
        }
        let marker = abs.join(MARKER);
        if marker.is_file() {
            let text = std::fs::read_to_string(&marker).map_err(|e| root_err(format!("cannot read {MARKER}: {e}")))?;
            let found: Marker = serde_json::from_str(&text).map_err(|e| root_err(format!("{MARKER} is not readable: {e}")))?;
            if found.format != "lake" || found.layout > LAYOUT {
                return Err(root_err(format!(
                    "{MARKER} says format `{}` layout {}; this build reads format `lake` up to layout {LAYOUT}",
                    found.format, found.layout
                )));
            }
        } else if let Some((aside, pid)) = taking_back(&abs).into_iter().next() {
            // A failed first ingest is deciding whether to remove the lake it made; if it died
            // doing so, the lake is put back as it was.
            // Moved aside a minute ago or more, it is a dead process's (whose pid may be reused).
            let recent = std::fs::symlink_metadata(&aside).is_ok_and(|m| {
                use std::os::unix::fs::MetadataExt;
                Utc::now().timestamp() - m.ctime() < 60
            });
            if recent && pid.is_some_and(process_alive) {
                return Err(root_err("a failed ingest is removing the lake it created here; run this again once it has finished".into()));
            }
            if std::fs::rename(&aside, &marker).is_err() && !marker.is_file() {
                return Err(root_err(format!("cannot put back {MARKER} from {}", aside.display())));
            }
            return Self::open_inner(root, create);
        } else {
            // What a creator killed before it renamed its marker into place left is not content.
            let mut entries = Vec::new();
            for entry in std::fs::read_dir(&abs).into_iter().flatten().flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                match name.strip_prefix(NEW_MARKER).map(str::parse::<u32>) {
                    Some(Ok(pid)) if !process_alive(pid) => {
                        if create {
                            drop(std::fs::remove_file(entry.path()));
                        }
                    }
                    _ => entries.push(name),
                }
            }
            // Another command creating the lake right now (its directory made, its tables or
            // marker on the way) puts its marker in a moment.
            let lake_made =
                entries.iter().all(|n| [CATALOG, STAGING, DATASETS, VIEWS, REMOVED].contains(&n.as_str()) || n.starts_with(NEW_MARKER));
            if !entries.is_empty() && lake_made {
                for _ in 0..50 {
                    if marker.is_file() {
                        return Self::open_inner(root, create);
                    }
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
            }
            if !create {
                // An empty directory, or one a creator is making a lake in (its marker on the
                // way), has no lake yet; a lake's directories without a marker are not one.
                let creating = entries.iter().any(|n| n.starts_with(NEW_MARKER));
                let message = if entries.is_empty() || (creating && lake_made) {
                    "no lake here yet (`lake ingest` creates it)"
                } else {
                    "this directory is not a lake (no lake.json)"
                };
                return Err(root_err(message.into()));
            }
            if !entries.is_empty() {
                if marker.is_file() {
                    return Self::open_inner(root, create);
                }
                return Err(root_err(
                    "this directory holds other files and is not a lake (no lake.json); choose a new or empty directory".into(),
                ));
            }
            std::fs::create_dir_all(&abs).map_err(|e| root_err(format!("cannot create: {e}")))?;
            // Written whole under another name and renamed, so that no reader sees half of it.
            let body = serde_json::to_vec_pretty(&Marker { format: "lake".into(), layout: LAYOUT }).expect("marker serialises");
            let new = abs.join(format!("{NEW_MARKER}{}", std::process::id()));
            std::fs::write(&new, body)
                .and_then(|()| std::fs::rename(&new, &marker))
                .map_err(|e| root_err(format!("cannot write {MARKER}: {e}")))?;
        }
        let store = LocalFileSystem::new_with_prefix(&abs).map_err(|e| root_err(e.to_string()))?.with_automatic_cleanup(true);
        Ok(Self { root: abs, remote: None, display: root.to_string(), store: Arc::new(store), creates: create, remade: Arc::default() })
    }

    /// Opens (with `create`, creates) the lake at the object store location `root`. A new lake's
    /// marker is created with a conditional put: of two creators one writes it, and both use it.
    fn open_remote(root: &str, create: bool) -> Result<Self> {
        let root_err = |message: String| Error::Root { root: root.to_string(), message };
        let remote = crate::remote::Remote::parse(root)?;
        // Checked with a client of its own, on a runtime of its own (this is called from sync
        // and async code alike); the lake's client starts with no connection made.
        let checked = on_own_runtime(|| async {
            let probe = crate::remote::Remote::parse(root)?;
            let store = object_store::prefix::PrefixStore::new(probe.store.clone(), probe.prefix.clone());
            let marker = Path::from(MARKER);
            let found = match store.get(&marker).await {
                Ok(got) => Some(got.bytes().await),
                Err(object_store::Error::NotFound { .. }) => None,
                Err(e) => Some(Err(e)),
            };
            let text = match found {
                Some(text) => text.map_err(|e| root_err(format!("cannot read {MARKER}: {}", crate::error::store_message(&e))))?,
                None => {
                    let occupied = store
                        .list(None)
                        .try_next()
                        .await
                        .map_err(|e| root_err(format!("cannot list it: {}", crate::error::store_message(&e))))?
                        .is_some();
                    match (occupied, create) {
                        (true, _) => {
                            return Err(root_err(
                                "holds other objects and is not a lake (no lake.json); choose a new or empty prefix".into(),
                            ));
                        }
                        (false, false) => return Err(root_err("no lake here yet (`lake ingest` creates it)".into())),
                        (false, true) => {}
                    }
                    let body = serde_json::to_vec_pretty(&Marker { format: "lake".into(), layout: LAYOUT }).expect("marker serialises");
                    match store.put_opts(&marker, PutPayload::from(body.clone()), PutOptions::from(PutMode::Create)).await {
                        // Another creator's marker is as good as this one.
                        Ok(_) | Err(object_store::Error::AlreadyExists { .. }) => {}
                        Err(e) => return Err(root_err(format!("cannot write {MARKER}: {}", crate::error::store_message(&e)))),
                    }
                    body.into()
                }
            };
            let found: Marker = serde_json::from_slice(&text).map_err(|e| root_err(format!("{MARKER} is not readable: {e}")))?;
            if found.format != "lake" || found.layout > LAYOUT {
                return Err(root_err(format!(
                    "{MARKER} says format `{}` layout {}; this build reads format `lake` up to layout {LAYOUT}",
                    found.format, found.layout
                )));
            }
            Ok(())
        });
        checked?;
        let store: Arc<dyn ObjectStore> = Arc::new(object_store::prefix::PrefixStore::new(remote.store.clone(), remote.prefix.clone()));
        Ok(Self {
            root: PathBuf::new(),
            remote: Some(Arc::new(remote)),
            display: root.to_string(),
            store,
            creates: create,
            remade: Arc::default(),
        })
    }

    /// The lake's directory, when it is on the local disk.
    pub fn local_root(&self) -> Option<&std::path::Path> {
        self.remote.is_none().then_some(self.root.as_path())
    }

    /// The size and digest of the file at `relative`, taken as this process sent it to the
    /// lake's object store while a pending version's directory held it.
    pub(crate) fn sent_digest(&self, relative: &str) -> Option<crate::sent_digests::Sent> {
        crate::sent_digests::sent(&self.remote.as_ref()?.sent_key(relative))
    }

    /// Takes back the lake this process created for an ingest that failed: removes the lake
    /// directory (when `dir_existed`, only what it holds) unless another writer has started in
    /// it meanwhile, and says whether it did. The marker is moved aside first: a writer that
    /// starts from here on finds no lake once its lease is written ([`Lake::begin`] checks), and
    /// one that wrote its lease before is seen here, so that the lake stays.
    pub fn take_back(&self, dir_existed: bool) -> bool {
        if self.remote.is_some() {
            // On an object store the lake stays: an empty lake is one marker object.
            return false;
        }
        let marker = self.root.join(MARKER);
        let aside = self.root.join(format!("{TAKING_BACK}{}", std::process::id()));
        if std::fs::rename(&marker, &aside).is_err() {
            return false;
        }
        // Staging first: a writer's lease goes only once its commit record is there.
        let empty = |dir: &str| std::fs::read_dir(self.root.join(dir)).map_or(true, |mut d| d.next().is_none());
        if ![STAGING, CATALOG, VIEWS, REMOVED].iter().all(|dir| empty(dir)) {
            let _ = std::fs::rename(&aside, &marker);
            if empty(CATALOG) && empty(VIEWS) {
                // Only other writers' leases: the last of them to fail takes the lake back.
                let _ = std::fs::write(self.root.join(UNCLAIMED), serde_json::json!({"dir_existed": dir_existed}).to_string());
            }
            return false;
        }
        let removed = if dir_existed {
            let entries: Vec<_> = std::fs::read_dir(&self.root).into_iter().flatten().flatten().map(|e| e.path()).collect();
            let mut all = true;
            for p in entries.iter().filter(|p| **p != aside) {
                all &= if p.is_dir() { std::fs::remove_dir_all(p) } else { std::fs::remove_file(p) }.is_ok();
            }
            all && std::fs::remove_file(&aside).is_ok()
        } else {
            std::fs::remove_dir_all(&self.root).is_ok()
        };
        // A writer that started meanwhile made files again: what is left stays a lake.
        if !removed && self.root.is_dir() {
            let body = serde_json::to_vec_pretty(&Marker { format: "lake".into(), layout: LAYOUT }).expect("marker serialises");
            let new = self.root.join(format!("{NEW_MARKER}{}", std::process::id()));
            let _ = std::fs::write(&new, body).and_then(|()| std::fs::rename(&new, &marker));
            let _ = std::fs::remove_file(&aside);
        }
        removed
    }

    /// Waits (briefly) for the lake's marker to be in place: it is missing while a failed
    /// ingest that created the lake checks whether to remove it, and for good once it did.
    async fn still_a_lake(&self) -> bool {
        if self.remote.is_some() {
            return self.store.head(&Path::from(MARKER)).await.is_ok();
        }
        for _ in 0..100 {
            if self.root.join(MARKER).is_file() {
                return true;
            }
            if taking_back(&self.root).is_empty() {
                return false;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        false
    }

    /// The root as the user gave it, for messages.
    pub fn display_root(&self) -> &str {
        &self.display
    }

    /// The URI Lance should use for a path relative to the root.
    pub fn uri(&self, relative: &str) -> String {
        match &self.remote {
            Some(remote) => remote.join(relative),
            None => self.root.join(relative).to_string_lossy().into_owned(),
        }
    }

    /// The object store rooted at the lake root.
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// The tables of `record` that cannot be read whole, with what is wrong: a table with no
    /// Lance version left, or one whose latest version names a data file that is gone or has
    /// another size than the one written. Such a version was damaged outside lake; a re-ingest
    /// must replace it, not keep it, and queries leave it out.
    ///
    /// # Errors
    /// When the store cannot be listed.
    pub async fn damaged_tables(&self, record: &CommitRecord) -> Result<Vec<(String, String)>> {
        let mut damaged = Vec::new();
        for table in &record.tables.tables {
            let path = record.tables.path(table);
            if let Some(why) = self.table_damage(&path).await? {
                damaged.push((table.clone(), why));
            }
        }
        Ok(damaged)
    }

    /// What is wrong with the Lance table at `path` (relative to the root), if anything.
    async fn table_damage(&self, path: &str) -> Result<Option<String>> {
        let dataset = match crate::lance_open::open_lance(&self.uri(path)).await {
            Ok(dataset) => dataset,
            Err(lance::Error::DatasetNotFound { .. }) => return Ok(Some("its files are missing".into())),
            Err(e) => return Ok(Some(crate::lance_message(&e))),
        };
        self.data_file_damage(path, &dataset).await
    }

    /// What is wrong with the data files of `dataset`, the Lance table at `path` (relative to
    /// the root), opened: a file its latest version names that is gone, or has another size than
    /// the one written.
    ///
    /// # Errors
    /// When the store cannot be listed.
    pub async fn data_file_damage(&self, path: &str, dataset: &lance::Dataset) -> Result<Option<String>> {
        let data = Path::from(format!("{path}/data"));
        let sizes: BTreeMap<String, u64> = match self.store.list(Some(&data)).try_collect::<Vec<_>>().await {
            Ok(objects) => objects.into_iter().filter_map(|o| Some((o.location.filename()?.to_string(), o.size))).collect(),
            Err(object_store::Error::NotFound { .. }) => BTreeMap::new(),
            Err(e) => return Err(Error::store(data.to_string())(e)),
        };
        for fragment in dataset.fragments().iter() {
            for file in fragment.files.iter().filter(|f| f.base_id.is_none()) {
                let written = file.file_size_bytes.get().map(u64::from);
                match (sizes.get(&file.path), written) {
                    (None, _) => return Ok(Some(format!("its data file data/{} is missing", file.path))),
                    (Some(&size), Some(written)) if size != written => {
                        return Ok(Some(format!("its data file data/{} has {size} bytes, {written} were written", file.path)));
                    }
                    _ => {}
                }
            }
        }
        Ok(None)
    }

    /// The latest version of every dataset whose latest commit record can be read, sorted by
    /// name; see [`Lake::datasets_listed`] for the others.
    ///
    /// # Errors
    /// When the catalog cannot be listed or read.
    pub async fn datasets(&self) -> Result<Vec<CommitRecord>> {
        Ok(self.datasets_listed().await?.0)
    }

    /// The latest version of every dataset, sorted by name, and apart from them the datasets
    /// whose latest commit record cannot be parsed (damaged outside lake): one such record
    /// takes only its own dataset out, and the next ingest of its source makes a new version.
    ///
    /// # Errors
    /// When the catalog cannot be listed or read.
    pub async fn datasets_listed(&self) -> Result<(Vec<CommitRecord>, Vec<Unreadable>)> {
        let removed = self.removed_through().await?;
        let mut latest: BTreeMap<String, Path> = BTreeMap::new();
        for path in self.list(CATALOG).await? {
            let parts: Vec<_> = path.parts().collect();
            if parts.len() == 3 && parts[2].as_ref().ends_with(".json") {
                let name = parts[1].as_ref().to_string();
                let newer = latest.get(&name).is_none_or(|p| p.as_ref() < path.as_ref());
                let gone = removed.get(&name).is_some_and(|through| version_of(&path).is_some_and(|v| v <= *through));
                if newer && !gone {
                    latest.insert(name, path);
                }
            }
        }
        let (mut out, mut unreadable) = (Vec::with_capacity(latest.len()), Vec::new());
        for (name, path) in &latest {
            match self.read_record(path).await {
                Ok(record) => out.push(record),
                Err(Error::Record { path, source }) => unreadable.push(Unreadable {
                    name: name.clone(),
                    version: version_of(&Path::from(path.as_str())).unwrap_or_default(),
                    path,
                    why: source.to_string(),
                }),
                Err(e) => return Err(e),
            }
        }
        Ok((out, unreadable))
    }

    /// Every committed version of `name`, oldest first.
    ///
    /// # Errors
    /// When the catalog cannot be read or a record cannot be parsed.
    pub async fn versions(&self, name: &str) -> Result<Vec<CommitRecord>> {
        let paths = self.version_paths(name).await?;
        let mut out = Vec::with_capacity(paths.len());
        for p in &paths {
            out.push(self.read_record(p).await?);
        }
        Ok(out)
    }

    /// The newest version number of `name` (its record is not read), if it has one.
    ///
    /// # Errors
    /// When the catalog cannot be listed.
    pub async fn newest_version(&self, name: &str) -> Result<Option<u64>> {
        Ok(self.version_paths(name).await?.iter().filter_map(version_of).max())
    }

    /// How many versions of `name` were committed (their records are not read).
    ///
    /// # Errors
    /// When the catalog cannot be listed.
    pub async fn version_count(&self, name: &str) -> Result<usize> {
        Ok(self.version_paths(name).await?.len())
    }

    /// The commit records of `name`, oldest first (their names order them), without the
    /// versions `lake rm` removed.
    async fn version_paths(&self, name: &str) -> Result<Vec<Path>> {
        let paths = self.all_version_paths(name).await?;
        let gone = self.removal(name).await?.map_or(0, |r| r.through_version);
        Ok(paths.into_iter().filter(|p| version_of(p).is_none_or(|v| v > gone)).collect())
    }

    /// The commit records of `name`, oldest first, also those of removed versions whose
    /// deletion is not done yet.
    async fn all_version_paths(&self, name: &str) -> Result<Vec<Path>> {
        validate_name(name)?;
        let mut paths: Vec<Path> =
            self.list(&format!("{CATALOG}/{name}")).await?.into_iter().filter(|p| p.as_ref().ends_with(".json")).collect();
        paths.sort_by(|a, b| a.as_ref().cmp(b.as_ref()));
        Ok(paths)
    }

    /// The removals of `name` by `lake rm`, oldest first.
    ///
    /// # Errors
    /// When the removal records cannot be listed.
    pub async fn removals(&self, name: &str) -> Result<Vec<Removal>> {
        validate_name(name)?;
        let prefix = Path::from(format!("{REMOVED}/{name}"));
        let listed = match self.store.list(Some(&prefix)).try_collect::<Vec<_>>().await {
            Ok(v) => v,
            Err(object_store::Error::NotFound { .. }) => Vec::new(),
            Err(e) => return Err(Error::store(prefix.to_string())(e)),
        };
        let mut records: Vec<(u64, DateTime<Utc>)> =
            listed.iter().filter_map(|m| Some((removal_record(&m.location).filter(|(n, _)| n == name)?.1, m.last_modified))).collect();
        records.sort();
        records.dedup_by_key(|(through, _)| *through);
        let mut from = 1;
        let mut out = Vec::with_capacity(records.len());
        for (through, removed_at) in records {
            out.push(Removal { name: name.to_string(), from_version: from, through_version: through, removed_at });
            from = through + 1;
        }
        Ok(out)
    }

    /// The removal of version `version` of `name` (the removal that took it), or, without a
    /// version or when none took it while nothing of the name is left, the latest removal.
    ///
    /// # Errors
    /// When the removal records or the catalog cannot be listed.
    pub async fn removal_of(&self, name: &str, version: Option<u64>) -> Result<Option<Removal>> {
        let mut removals = self.removals(name).await?;
        if let Some(v) = version
            && let Some(i) = removals.iter().position(|r| (r.from_version..=r.through_version).contains(&v))
        {
            return Ok(Some(removals.swap_remove(i)));
        }
        if version.is_some() && !self.version_paths(name).await?.is_empty() {
            return Ok(None);
        }
        Ok(removals.pop())
    }

    /// The latest removal of `name` by `lake rm`, if it was ever removed.
    ///
    /// # Errors
    /// When the removal records cannot be listed.
    pub async fn removal(&self, name: &str) -> Result<Option<Removal>> {
        Ok(self.removals(name).await?.pop())
    }

    /// The removal that explains a failure to read a dataset's files: `message` names a path
    /// under a version's directory (`datasets/NAME/DIR/…`), `NAME` was removed with `lake rm`
    /// after that version was begun, and no live version has that directory.
    pub async fn removal_behind(&self, message: &str) -> Option<Removal> {
        let prefix = format!("{DATASETS}/");
        for (at, _) in message.match_indices(&prefix) {
            let mut parts = message[at + prefix.len()..].splitn(3, '/');
            let (Some(name), Some(dir), Some(_)) = (parts.next(), parts.next(), parts.next()) else { continue };
            let Some(begun) = dir.get(..15).and_then(|t| chrono::NaiveDateTime::parse_from_str(t, "%Y%m%dT%H%M%S").ok()) else {
                continue;
            };
            if validate_name(name).is_err() {
                continue;
            }
            let Ok(Some(removal)) = self.removal(name).await else { continue };
            if removal.removed_at.naive_utc() < begun {
                continue;
            }
            // Its files may be going still: the version is gone once no live record has them.
            let dir = format!("{DATASETS}/{name}/{dir}");
            match self.versions(name).await {
                Ok(live) if live.iter().all(|r| r.tables.dir != dir) => return Some(removal),
                _ => {}
            }
        }
        None
    }

    /// The latest removal of every dataset `lake rm` removed, by name.
    ///
    /// # Errors
    /// When the removal records cannot be listed.
    pub async fn removed_datasets(&self) -> Result<BTreeMap<String, Removal>> {
        let mut out = BTreeMap::new();
        for name in self.removed_through().await?.into_keys() {
            if validate_name(&name).is_ok()
                && let Some(removal) = self.removal(&name).await?
            {
                out.insert(name, removal);
            }
        }
        Ok(out)
    }

    /// The newest version `lake rm` removed, by dataset name.
    async fn removed_through(&self) -> Result<BTreeMap<String, u64>> {
        let mut out: BTreeMap<String, u64> = BTreeMap::new();
        for path in self.list(REMOVED).await? {
            if let Some((name, through)) = removal_record(&path) {
                let newest = out.entry(name).or_default();
                *newest = (*newest).max(through);
            }
        }
        Ok(out)
    }

    /// Removes dataset `name` (`lake rm`): every committed version, its tables (frame tables
    /// included) and commit records. The removal record is written first (create-only, named by
    /// the newest version it takes) and is the moment it happens: from then on no reader sees
    /// those versions, a later ingest of the name numbers its versions after them, and `NAME@N`
    /// of a removed version says it was removed. An ingest of the name that commits meanwhile
    /// keeps its version. With nothing left to remove, this finishes a removal that was
    /// interrupted.
    ///
    /// Unless `force`, a view made while the removal record was written that selects a version
    /// it takes makes it back out (the caller checked the views before); the view's own check
    /// sees the removal otherwise (see [`Lake::put_view`]).
    ///
    /// # Errors
    /// [`Error::NotFound`] when the lake has no such dataset (and no removal is left to
    /// finish); [`Error::Selected`] when a view made meanwhile selects it (nothing changed);
    /// [`Error::Unfinished`] when the dataset is removed but deleting its files failed; an I/O
    /// error when the removal record cannot be written (nothing changed).
    pub async fn remove(&self, name: &str, force: bool) -> Result<RemovalReport> {
        let before = self.removal(name).await?;
        let Some(through) = self.version_paths(name).await?.iter().filter_map(version_of).max() else {
            if let Some(removal) = before {
                let (versions, bytes) = self.finish_removal(name, removal.through_version).await.map_err(|e| unfinished(name, &e))?;
                if !versions.is_empty() || bytes > 0 {
                    let under_way = self.ingests_under_way(name).await.unwrap_or_default();
                    return Ok(RemovalReport { removal, versions, bytes, kept: Vec::new(), finished_earlier: true, under_way });
                }
            }
            return Err(self.not_found(name).await);
        };
        if through == u64::MAX {
            return Err(Error::BadName { name: name.to_string(), message: format!("version {through} cannot be followed by another") });
        }
        let path = Path::from(format!("{REMOVED}/{name}/v{through:08}.json"));
        let body = serde_json::json!({"name": name, "through_version": through, "removed_at": Utc::now()});
        let body = serde_json::to_vec_pretty(&body).expect("removal record serialises");
        let wrote =
            match self.store.put_opts(&path, PutPayload::from(body), PutOptions { mode: PutMode::Create, ..Default::default() }).await {
                Ok(_) => true,
                // Another `lake rm` of the same versions at the same moment: one record says it.
                Err(object_store::Error::AlreadyExists { .. }) => false,
                Err(e) => return Err(Error::store(path.to_string())(e)),
            };
        let from_version = before.map_or(1, |r| r.through_version + 1);
        if !force {
            let views: Vec<String> = self
                .views()
                .await?
                .into_iter()
                .filter(|v| v.datasets.iter().any(|d| d.name == name && (from_version..=through).contains(&d.version)))
                .map(|v| format!("{}@{}", v.name, v.version))
                .collect();
            if !views.is_empty() {
                if wrote {
                    self.store.delete(&path).await.map_err(Error::store(path.to_string()))?;
                    self.prune(&format!("{REMOVED}/{name}"));
                }
                return Err(Error::Selected { name: name.to_string(), views });
            }
        }
        let removal = Removal { name: name.to_string(), from_version, through_version: through, removed_at: Utc::now() };
        let (versions, bytes) = self.finish_removal(name, through).await.map_err(|e| unfinished(name, &e))?;
        let kept = self.version_paths(name).await.unwrap_or_default().iter().filter_map(version_of).collect();
        let under_way = self.ingests_under_way(name).await.unwrap_or_default();
        Ok(RemovalReport { removal, versions, bytes, kept, finished_earlier: false, under_way })
    }

    /// Deletes the tables and commit records of the versions of `name` up to `through` that are
    /// still there: the version directory first, then the record, so that an interrupted
    /// removal leaves records (hidden) that name what is left to delete. Returns the versions
    /// deleted and the bytes their tables held.
    async fn finish_removal(&self, name: &str, through: u64) -> Result<(Vec<u64>, u64)> {
        let (mut versions, mut bytes) = (Vec::new(), 0);
        for path in self.all_version_paths(name).await? {
            let Some(version) = version_of(&path).filter(|v| *v <= through) else { continue };
            match self.read_record(&path).await {
                Ok(record) if record.tables.dir.starts_with(&format!("{DATASETS}/{name}/")) => {
                    bytes += self.delete_prefix(&record.tables.dir).await?;
                }
                // A record damaged outside lake names no directory: it goes, and its tables
                // stay for a look by hand (the dataset's directory is not swept: an ingest may
                // be writing into it).
                Ok(_) | Err(Error::Record { .. }) => {}
                // Another removal (or garbage collection) deleted it meanwhile: done.
                Err(Error::ObjectStore { source: object_store::Error::NotFound { .. }, .. }) => continue,
                Err(e) => return Err(e),
            }
            match self.store.delete(&path).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(Error::store(path.to_string())(e)),
            }
            versions.push(version);
        }
        // (Each version's directory went with its tables, and its emptied parents with it.)
        self.prune(&format!("{CATALOG}/{name}"));
        bytes += self.sweep_unnamed_versions(name).await?;
        Ok((versions, bytes))
    }

    /// Deletes the version directories of `name` that neither a commit record nor an ingest's
    /// lease names: what `lake cache` or `lake stats --images` published into a version while
    /// `lake rm` removed it. Directories are listed first, then leases, then records: a writer
    /// writes its lease before its directory and drops it only once its record is there, so a
    /// live writer's directory is always named by one of them. Anything unreadable among them
    /// might name a directory, and then nothing is swept.
    async fn sweep_unnamed_versions(&self, name: &str) -> Result<u64> {
        // Ids are compared, not paths: a version's id (time and random) is unique in the lake,
        // also where the file system folds `Foo` and `foo` together.
        let found = self.child_dirs(&format!("{DATASETS}/{name}")).await?;
        if found.is_empty() {
            return Ok(0);
        }
        // A lease is `staging/<id>.json` for the directory `datasets/<name>/<id>`: its file name
        // protects the directory, whether or not its contents can be read.
        let mut named: std::collections::HashSet<String> = std::collections::HashSet::new();
        for path in self.list(STAGING).await? {
            if let Some(id) = path.filename().map(|f| f.split('.').next().unwrap_or(f).to_string()) {
                named.insert(id);
            }
        }
        for path in self.all_version_paths(name).await? {
            match self.read_record(&path).await {
                Ok(record) => named.insert(record.tables.dir.rsplit('/').next().unwrap_or_default().to_string()),
                // A damaged record might name any of them.
                Err(_) => return Ok(0),
            };
        }
        let mut bytes = 0;
        for id in found.iter().filter(|id| !named.contains(*id)) {
            bytes += self.delete_prefix(&format!("{DATASETS}/{name}/{id}")).await?;
        }
        Ok(bytes)
    }

    /// The error for a dataset `spec` the lake does not have, listing what it has and saying
    /// when `lake rm` removed it (the removal of that version, when one is given).
    async fn not_found(&self, spec: &str) -> Error {
        let (name, version) = match spec.rsplit_once('@') {
            Some((name, v)) => (name, parse_version(v)),
            None => (spec, None),
        };
        let removed = if validate_name(name).is_ok() { self.removal_of(name, version).await.ok().flatten() } else { None };
        Error::NotFound {
            name: spec.to_string(),
            root: self.display.clone(),
            available: match self.datasets().await {
                Ok(records) => records.into_iter().map(|r| format!("{}@{}", r.name, r.version)).collect(),
                Err(e) => return e,
            },
            removed: removed.map(Box::new),
        }
    }

    /// The latest version of `name`, if any (one listing and one record read, whatever the
    /// number of versions).
    ///
    /// # Errors
    /// When the catalog cannot be read.
    pub async fn latest(&self, name: &str) -> Result<Option<CommitRecord>> {
        match self.version_paths(name).await?.last() {
            Some(p) => Ok(Some(self.read_record(p).await?)),
            None => Ok(None),
        }
    }

    /// The latest version of `name` to build on: as [`Lake::latest`], but `None` when that
    /// version's commit record cannot be parsed (it was damaged outside lake, and the next
    /// ingest replaces it).
    ///
    /// # Errors
    /// When the catalog cannot be read.
    pub async fn latest_readable(&self, name: &str) -> Result<Option<CommitRecord>> {
        match self.latest(name).await {
            Err(Error::Record { .. }) => Ok(None),
            other => other,
        }
    }

    /// Resolves `name` or `name@version` to a committed version.
    ///
    /// # Errors
    /// [`Error::NotFound`] (listing what the lake has) when there is no such dataset or version.
    pub async fn resolve(&self, spec: &str) -> Result<CommitRecord> {
        let (name, version) = match spec.rsplit_once('@') {
            Some((name, v)) => {
                let v = parse_version(v)
                    .ok_or_else(|| Error::BadName { name: spec.to_string(), message: "expected NAME or NAME@VERSION (a number)".into() })?;
                (name, Some(v))
            }
            None => (spec, None),
        };
        // A name never holds `@` (`validate_name`): `a@1@2` is malformed, not missing.
        if name.contains('@') {
            return Err(Error::BadName { name: spec.to_string(), message: "expected NAME or NAME@VERSION (a number)".into() });
        }
        let paths = self.version_paths(name).await?;
        let any = !paths.is_empty();
        let path = match version {
            Some(v) => paths.into_iter().find(|p| version_of(p) == Some(v)),
            None => paths.into_iter().last(),
        };
        let found = match path {
            Some(p) => Some(self.read_record(&p).await?),
            None => None,
        };
        if found.is_none()
            && !any
            && let Ok(Some(view)) = self.view(name).await
        {
            let from: Vec<String> = view.datasets.iter().map(|d| format!("{}@{}", d.name, d.version)).collect();
            return Err(Error::View {
                name: name.to_string(),
                message: format!("is a view, and this takes a dataset (the view selects from {})", from.join(", ")),
            });
        }
        match found {
            Some(r) => Ok(r),
            None => Err(self.not_found(spec).await),
        }
    }

    /// Every view's current version whose record can be read, sorted by name (dropped views
    /// left out); see [`Lake::views_listed`] for the others.
    ///
    /// # Errors
    /// When the views cannot be listed or read.
    pub async fn views(&self) -> Result<Vec<ViewRecord>> {
        Ok(self.views_listed().await?.0)
    }

    /// Every view's current version, sorted by name (dropped views left out), and apart from
    /// them the views whose current record cannot be parsed (damaged outside lake).
    ///
    /// # Errors
    /// When the views cannot be listed or read.
    pub async fn views_listed(&self) -> Result<(Vec<ViewRecord>, Vec<Unreadable>)> {
        let names = self.view_names().await?;
        let (mut out, mut unreadable) = (Vec::with_capacity(names.len()), Vec::new());
        for name in &names {
            match self.view(name).await {
                Ok(view) => out.extend(view),
                Err(Error::Record { path, source }) => unreadable.push(Unreadable {
                    name: name.clone(),
                    version: version_of(&Path::from(path.as_str())).unwrap_or(1),
                    path,
                    why: source.to_string(),
                }),
                Err(e) => return Err(e),
            }
        }
        Ok((out, unreadable))
    }

    /// The name of every view that has a record, dropped ones too, sorted.
    ///
    /// # Errors
    /// When the views cannot be listed.
    pub async fn view_names(&self) -> Result<Vec<String>> {
        let mut names = std::collections::BTreeSet::new();
        for p in self.list(VIEWS).await? {
            let parts: Vec<_> = p.parts().collect();
            match parts.as_slice() {
                [_, file] => names.extend(file.as_ref().strip_suffix(".json").map(str::to_string)),
                [_, name, file] if file.as_ref().ends_with(".json") => {
                    names.insert(name.as_ref().to_string());
                }
                _ => {}
            }
        }
        Ok(names.into_iter().filter(|n| validate_name(n).is_ok()).collect())
    }

    /// The current version of the view `name`, if there is one (and it was not dropped).
    ///
    /// # Errors
    /// When the name is not valid or the record cannot be read.
    pub async fn view(&self, name: &str) -> Result<Option<ViewRecord>> {
        match self.view_paths(name).await?.pop() {
            Some((version, path)) => Ok(Some(self.read_view(version, &path).await?).filter(|v| !v.dropped)),
            None => Ok(None),
        }
    }

    /// Version `version` of the view `name`, if there is one; a version stays readable after
    /// the view is replaced or dropped.
    ///
    /// # Errors
    /// When the name is not valid or the record cannot be read.
    pub async fn view_version(&self, name: &str, version: u64) -> Result<Option<ViewRecord>> {
        match self.view_paths(name).await?.into_iter().find(|(v, _)| *v == version) {
            Some((version, path)) => Ok(Some(self.read_view(version, &path).await?).filter(|v| !v.dropped)),
            None => Ok(None),
        }
    }

    /// Every version of the view `name`, oldest first (drops left out).
    ///
    /// # Errors
    /// When the name is not valid or a record cannot be read.
    pub async fn view_versions(&self, name: &str) -> Result<Vec<ViewRecord>> {
        let mut out = self.view_records(name).await?;
        out.retain(|v| !v.dropped);
        Ok(out)
    }

    /// Every record of the view `name`, oldest first, the drops (`lake view drop`) included.
    ///
    /// # Errors
    /// When the name is not valid or a record cannot be read.
    pub async fn view_records(&self, name: &str) -> Result<Vec<ViewRecord>> {
        let mut out = Vec::new();
        for (version, path) in self.view_paths(name).await? {
            out.push(self.read_view(version, &path).await?);
        }
        Ok(out)
    }

    /// Stores `view` as the next version of its name and returns that version; without
    /// `replace` the name must have no current version. A view never takes the name of a
    /// dataset.
    ///
    /// # Errors
    /// [`Error::View`] when the name is taken, another `lake view` wrote the same version at
    /// the same moment, or the record cannot be written.
    pub async fn put_view(&self, view: &ViewRecord, replace: bool) -> Result<u64> {
        validate_name(&view.name)?;
        let taken = || Error::View { name: view.name.clone(), message: "a dataset has this name; choose another".into() };
        if self.dataset_claims(&view.name).await? {
            if self.version_paths(&view.name).await?.is_empty()
                && let Some(removal) = self.removal(&view.name).await?
            {
                let message = format!("{removal}, and its name stays a dataset's (`NAME@N` never names two things); choose another");
                return Err(Error::View { name: view.name.clone(), message });
            }
            return Err(taken());
        }
        // The number taken follows the version checked: another `lake view` that wrote one
        // since takes it first, and this one is refused (a create never replaces).
        let last = self.view_paths(&view.name).await?.pop();
        if !replace
            && let Some((version, path)) = &last
            && !self.read_view(*version, path).await?.dropped
        {
            return Err(Error::View { name: view.name.clone(), message: "already exists (use --replace to overwrite it)".into() });
        }
        let version = last.map_or(1, |(v, _)| v + 1);
        let path = self.put_view_version(&ViewRecord { version, ..view.clone() }).await?;
        let withdraw = async |e: Error| {
            self.store.delete(&path).await.map_err(Error::store(path.to_string()))?;
            self.prune(&format!("{VIEWS}/{}", view.name));
            Err(e)
        };
        // An ingest of the same name that started meanwhile either sees this view when it
        // commits, or is seen here (its lease, or its version): then the view goes again.
        if self.dataset_claims(&view.name).await? {
            return withdraw(taken()).await;
        }
        // So with `lake rm` of a dataset the view selects: it refuses (without --force) once it
        // sees this view, or has written its removal, seen here.
        for selected in &view.datasets {
            if self.removal(&selected.name).await?.is_some_and(|r| r.through_version >= selected.version) {
                let name = &selected.name;
                let message = format!(
                    "`lake rm {name}` ran while the view was made, and the view selected `{name}@{}`; make it again (if that \
                     `lake rm` refused, for this view, `{name}` is still there)",
                    selected.version
                );
                return withdraw(Error::View { name: view.name.clone(), message }).await;
            }
        }
        Ok(version)
    }

    /// Drops the view `name`: it has no current version afterwards, while its versions stay
    /// readable as `NAME@VERSION` for streams that pinned them, and a view made later under
    /// the name continues their numbering.
    ///
    /// # Errors
    /// [`Error::View`] when there is no such view, or it cannot be dropped.
    pub async fn drop_view(&self, name: &str) -> Result<()> {
        let Some(current) = self.view(name).await? else {
            return Err(Error::View { name: name.to_string(), message: "no such view".into() });
        };
        let tombstone = ViewRecord {
            version: current.version + 1,
            dropped: true,
            sql: String::new(),
            created_at: Utc::now(),
            lake_versions: Vec::new(),
            datasets: Vec::new(),
            ..current
        };
        self.put_view_version(&tombstone).await.map(drop)
    }

    /// Writes `view`'s record (create-if-absent) and returns its path.
    async fn put_view_version(&self, view: &ViewRecord) -> Result<Path> {
        let path = Path::from(format!("{VIEWS}/{}/v{:08}.json", view.name, view.version));
        let mut view = ViewRecord { digest: None, ..view.clone() };
        view.digest = Some(crate::record_digest::record_digest(&serde_json::to_value(&view).expect("view serialises")));
        let body = serde_json::to_vec_pretty(&view).expect("view serialises");
        match self.store.put_opts(&path, PutPayload::from(body), PutOptions { mode: PutMode::Create, ..Default::default() }).await {
            Ok(_) => Ok(path),
            Err(object_store::Error::AlreadyExists { .. }) => Err(Error::View {
                name: view.name.clone(),
                message: format!("another `lake view` wrote version {} at the same moment; run this one again", view.version),
            }),
            Err(e) => Err(Error::store(path.to_string())(e)),
        }
    }

    /// The records of view `name` with their versions, oldest first: `views/<name>/v*.json`,
    /// and `views/<name>.json` (how views were stored before they had versions) as version 1.
    pub(crate) async fn view_paths(&self, name: &str) -> Result<Vec<(u64, Path)>> {
        validate_name(name)?;
        let mut out = Vec::new();
        let unversioned = Path::from(format!("{VIEWS}/{name}.json"));
        match self.store.head(&unversioned).await {
            Ok(_) => out.push((1, unversioned)),
            Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(Error::store(unversioned.to_string())(e)),
        }
        for path in self.list(&format!("{VIEWS}/{name}")).await? {
            out.extend(version_of(&path).map(|v| (v, path)));
        }
        out.sort_by_key(|(v, _)| *v);
        Ok(out)
    }

    async fn read_view(&self, version: u64, path: &Path) -> Result<ViewRecord> {
        Ok(ViewRecord { version, ..self.get_json(path).await? })
    }

    /// Starts writing a new version of `name`: reserves a fresh directory and records a lease.
    ///
    /// # Errors
    /// When the name is not valid or a view's (also a dropped view's), or the lease cannot be
    /// written.
    pub async fn begin(&self, name: &str) -> Result<PendingVersion> {
        validate_name(name)?;
        if let Some(message) = self.view_claims(name).await? {
            return Err(Error::View { name: name.to_string(), message });
        }
        // A failed first ingest beside this one may take back the lake it created while this
        // writer starts; a writer that may create the lake makes it again and starts over.
        for _ in 0..4 {
            match self.begin_once(name).await {
                Err(Error::Root { .. }) if self.creates && self.remote.is_none() && !self.root.join(MARKER).is_file() => {
                    Self::open_inner(&self.display, true)?;
                    self.remade.store(true, std::sync::atomic::Ordering::Relaxed);
                }
                other => return other,
            }
        }
        self.begin_once(name).await
    }

    /// Whether a failed writer should take the lake back ([`Lake::take_back`]), and with which
    /// `dir_existed`: this handle made the lake again after a failed first ingest beside it took
    /// it back ([`Lake::begin`]), or that ingest could not, while others wrote, and left it to
    /// the last of them.
    pub fn left_to_take_back(&self) -> Option<bool> {
        if self.remade.load(std::sync::atomic::Ordering::Relaxed) {
            return Some(false);
        }
        let note: serde_json::Value = serde_json::from_slice(&std::fs::read(self.local_root()?.join(UNCLAIMED)).ok()?).ok()?;
        Some(note["dir_existed"].as_bool().unwrap_or(true))
    }

    async fn begin_once(&self, name: &str) -> Result<PendingVersion> {
        let id = format!("{}-{}", Utc::now().format("%Y%m%dT%H%M%S"), &uuid::Uuid::new_v4().simple().to_string()[..12]);
        let dir = format!("{DATASETS}/{name}/{id}");
        let lease_path = Path::from(format!("{STAGING}/{id}.json"));
        let local = self.local_root().map(|root| root.join(lease_path.as_ref()));
        let lease = HeldLease::create(&self.store, lease_path, local, Lease::new(name, &dir)).await?;
        let sent = self.remote.as_ref().map(|remote| crate::sent_digests::Watch::new(remote.sent_key(&dir)));
        let pending = PendingVersion {
            lake: self.clone(),
            name: name.to_string(),
            dir,
            lease,
            done: false,
            _sent: sent,
            #[cfg(test)]
            before_put: None,
        };
        // The version's directory exists from here on, so that `datasets/NAME` is never empty
        // while this writer lives and a writer that finishes meanwhile cannot remove it.
        self.make_dir(&pending.dir)?;
        // A failed first ingest beside this one may be taking back the lake it created; the
        // lease is written, so it either sees it and keeps the lake, or removed it before.
        if !self.still_a_lake().await {
            pending.abort().await?;
            return Err(Error::Root {
                root: self.display.clone(),
                message: "was removed while this ingest started (another ingest had created it and failed); run this one again".into(),
            });
        }
        Ok(pending)
    }

    /// Why `name` cannot be a dataset's because a view has it, if it does. A view's name stays
    /// a view's after a drop: its versions stay readable as NAME@N for the runs that pinned
    /// them, so NAME@N must never come to mean a dataset's version. (A dataset that took a
    /// dropped view's name before lake kept such names keeps it.)
    async fn view_claims(&self, name: &str) -> Result<Option<String>> {
        if self.view_paths(name).await?.is_empty() {
            return Ok(None);
        }
        if self.view(name).await?.is_some() {
            return Ok(Some("is a view; a dataset cannot take its name (choose another with --name)".into()));
        }
        if !self.version_paths(name).await?.is_empty() {
            return Ok(None);
        }
        let kept: Vec<String> = self.view_versions(name).await?.iter().map(|v| format!("{name}@{}", v.version)).collect();
        Ok(Some(format!(
            "was a view, dropped, whose versions stay readable ({}) for the runs that pinned them; a dataset cannot take its \
             name (choose another with --name)",
            kept.join(", ")
        )))
    }

    /// Whether a dataset has `name`: a committed version, or an ingest under way (its lease).
    async fn dataset_claims(&self, name: &str) -> Result<bool> {
        // A removed dataset keeps its name, so that `NAME@N` never names two things.
        if !self.all_version_paths(name).await?.is_empty() || self.removal(name).await?.is_some() {
            return Ok(true);
        }
        Ok(!self.ingests_under_way(name).await?.is_empty())
    }

    /// The ingests of `name` at work now: their leases, where the writer is alive.
    async fn ingests_under_way(&self, name: &str) -> Result<Vec<IngestUnderWay>> {
        let host = hostname();
        let mut found = Vec::new();
        for lease_path in self.list(STAGING).await? {
            if let Ok(lease) = self.get_json::<Lease>(&lease_path).await
                && lease.name == name
                && lease.names_its_own_version(&lease_path)
                && !lease.is_dead(&host, Utc::now())
            {
                found.push(IngestUnderWay { pid: lease.pid, host: lease.host, started_at: lease.started_at });
            }
        }
        found.sort_by_key(|i| i.started_at);
        Ok(found)
    }

    /// Creates `dir` (relative to the root) and its parents, again when a writer that finished
    /// meanwhile removed an emptied parent between two steps.
    fn make_dir(&self, dir: &str) -> Result<()> {
        let Some(root) = self.local_root() else { return Ok(()) };
        let abs = root.join(dir);
        let mut attempts = 0;
        loop {
            match std::fs::create_dir_all(&abs) {
                Ok(()) if abs.is_dir() => return Ok(()),
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && attempts < 100 => {}
                Err(e) => {
                    let source = object_store::Error::Generic { store: "LocalFileSystem", source: Box::new(e) };
                    return Err(Error::store(dir.to_string())(source));
                }
            }
            attempts += 1;
        }
    }

    /// Removes what ingests that died before committing left behind: directories named by a
    /// lease whose process is gone (same host) or older than a day (other hosts), unless a commit
    /// record refers to them.
    ///
    /// # Errors
    /// When the lake cannot be listed or cleaned.
    pub async fn collect_garbage(&self) -> Result<GarbageReport> {
        let mut report = GarbageReport::default();
        let host = hostname();
        for lease_path in self.list(STAGING).await? {
            let (lease, version): (Lease, _) = match self.get_json_versioned(&lease_path).await {
                Ok(l) => l,
                Err(_) => continue, // half-written lease of a live writer, or foreign file
            };
            if !lease.names_its_own_version(&lease_path) {
                continue; // not a lease lake wrote: nothing it names is removed
            }
            // Taken over first: a writer that renewed it since it was read is alive after all,
            // and one that renews it after this finds it taken and does not commit.
            let local = self.local_root().map(|root| root.join(lease_path.as_ref()));
            if !lease.is_dead(&host, Utc::now())
                || !crate::lease::take_over(&self.store, &lease_path, local.as_deref(), &lease, version).await?
            {
                continue;
            }
            // A record that cannot be read might be the one naming this directory: it stays.
            let mut committed = false;
            for path in self.all_version_paths(&lease.name).await? {
                committed |= self.read_record(&path).await.map_or(true, |r| r.tables.dir == lease.dir);
            }
            if !committed {
                self.delete_prefix(&lease.dir).await?;
                self.remove_local_dir(&lease.dir)?;
                report.removed_dirs.push(lease.dir.clone());
            }
            match self.store.delete(&lease_path).await {
                // (The writer, finding its lease taken, may have deleted it.)
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(Error::store(lease_path.to_string())(e)),
            }
        }
        report.removed_dirs.extend(self.remove_orphans().await?);
        self.remove_finished_uploads();
        self.remove_dead_lease_staging(&host);
        // (A writer killed between dropping its lease and pruning leaves `staging/` empty.)
        self.prune(STAGING);
        for (name, through) in self.removed_through().await? {
            // One that cannot be finished now (another removal at work, a file that will not
            // go) is left for later: it must not fail the ingest that collects.
            if validate_name(&name).is_ok()
                && let Ok((versions, _)) = self.finish_removal(&name, through).await
            {
                report.finished_removals.extend(versions.into_iter().map(|v| (name.clone(), v)));
            }
        }
        Ok(report)
    }

    /// Removes the staging copies of catalog and view records whose write finished (`NAME#N`
    /// beside `NAME`): a local store's put links its staging file into place and then deletes
    /// it, and a writer killed between the two leaves both. A staging file without its record
    /// may be a live writer's, and stays.
    fn remove_finished_uploads(&self) {
        let Some(root) = self.local_root() else { return };
        for top in [CATALOG, VIEWS] {
            let Ok(dirs) = std::fs::read_dir(root.join(top)) else { continue };
            for dir in dirs.flatten().filter(|e| e.path().is_dir()) {
                let Ok(files) = std::fs::read_dir(dir.path()) else { continue };
                for file in files.flatten() {
                    let name = file.file_name();
                    let Some((base, n)) = name.to_str().and_then(|n| n.rsplit_once('#')) else { continue };
                    if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) && dir.path().join(base).is_file() {
                        let _ = std::fs::remove_file(file.path());
                    }
                }
            }
        }
    }

    /// Removes the lease staging files (`staging/.<id>.json.<pid>@<host>`) of this host's writers
    /// that are gone: what a writer killed between writing its lease and moving it into place
    /// leaves. Another host's stay (its pids mean nothing here).
    fn remove_dead_lease_staging(&self, host: &str) {
        let Some(root) = self.local_root() else { return };
        let Ok(files) = std::fs::read_dir(root.join(STAGING)) else { return };
        for file in files.flatten() {
            let name = file.file_name();
            let Some((pid, writer_host)) = name.to_str().and_then(crate::lease::staging_writer) else { continue };
            if writer_host == host && !crate::lease::process_alive(pid) {
                let _ = std::fs::remove_file(file.path());
            }
        }
    }

    /// Removes what is left of `dir` (relative to the root) on the local disk once its objects
    /// are deleted: files an object store never lists, such as the partial upload a writer
    /// killed in the middle of a write leaves (`NAME#1`).
    fn remove_local_dir(&self, dir: &str) -> Result<()> {
        let Some(root) = self.local_root() else { return Ok(()) };
        let abs = root.join(dir);
        match std::fs::remove_dir_all(&abs) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                let source = object_store::Error::Generic { store: "LocalFileSystem", source: Box::new(e) };
                return Err(Error::store(dir.to_string())(source));
            }
        }
        self.prune(dir);
        Ok(())
    }

    /// Removes version directories no commit record names and no lease protects: what a writer
    /// left whose lease went before its directory (killed while it aborted). A lease protects
    /// its directory from the moment it is written, before the directory is made, and is
    /// dropped only after a commit record names the directory or the directory is gone, so no
    /// live writer's directory is ever without one. A dataset with a record that cannot be read
    /// is left alone (that record might name any of its directories).
    async fn remove_orphans(&self) -> Result<Vec<String>> {
        let leased: std::collections::HashSet<String> = self
            .list(STAGING)
            .await?
            .iter()
            .filter_map(|p| p.filename().and_then(|f| f.strip_suffix(".json")).map(str::to_string))
            .collect();
        let mut removed = Vec::new();
        for name in self.child_dirs(DATASETS).await? {
            if validate_name(&name).is_err() {
                continue;
            }
            let mut named = std::collections::HashSet::new();
            let mut readable = true;
            for path in self.all_version_paths(&name).await? {
                match self.read_record(&path).await {
                    Ok(record) => {
                        named.insert(record.tables.dir);
                    }
                    Err(_) => readable = false,
                }
            }
            if !readable {
                continue;
            }
            for id in self.child_dirs(&format!("{DATASETS}/{name}")).await? {
                let rel = format!("{DATASETS}/{name}/{id}");
                if leased.contains(&id) || named.contains(&rel) {
                    continue;
                }
                // A lease written between the listing and now protects a directory made after
                // it: look once more before removing.
                if self.store.head(&Path::from(format!("{STAGING}/{id}.json"))).await.is_ok() {
                    continue;
                }
                if self.remote.is_some() {
                    self.delete_prefix(&rel).await?;
                }
                self.remove_local_dir(&rel)?;
                removed.push(rel);
            }
        }
        Ok(removed)
    }

    /// The names of the directories in `dir` (relative to the root): on an object store, the
    /// prefixes one level below it.
    pub(crate) async fn child_dirs(&self, dir: &str) -> Result<Vec<String>> {
        if let Some(root) = self.local_root() {
            let Ok(entries) = std::fs::read_dir(root.join(dir)) else { return Ok(Vec::new()) };
            return Ok(entries
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .filter_map(|e| e.file_name().to_str().map(String::from))
                .collect());
        }
        let prefix = Path::from(dir);
        match self.store.list_with_delimiter(Some(&prefix)).await {
            Ok(listed) => Ok(listed.common_prefixes.iter().filter_map(|p| p.filename().map(String::from)).collect()),
            Err(object_store::Error::NotFound { .. }) => Ok(Vec::new()),
            Err(e) => Err(Error::store(prefix.to_string())(e)),
        }
    }

    async fn list(&self, prefix: &str) -> Result<Vec<Path>> {
        let prefix = Path::from(prefix);
        match self.store.list(Some(&prefix)).map_ok(|m| m.location).try_collect::<Vec<_>>().await {
            Ok(v) => Ok(v),
            Err(object_store::Error::NotFound { .. }) => Ok(Vec::new()),
            Err(e) => Err(Error::store(prefix.to_string())(e)),
        }
    }

    async fn get_json<T: serde::de::DeserializeOwned>(&self, path: &Path) -> Result<T> {
        let bytes =
            self.store.get(path).await.map_err(Error::store(path.to_string()))?.bytes().await.map_err(Error::store(path.to_string()))?;
        serde_json::from_slice(&bytes).map_err(|source| Error::Record { path: path.to_string(), source })
    }

    /// [`get_json`](Self::get_json), with the version read (for a conditional update of it).
    async fn get_json_versioned<T: serde::de::DeserializeOwned>(&self, path: &Path) -> Result<(T, object_store::UpdateVersion)> {
        let got = self.store.get(path).await.map_err(Error::store(path.to_string()))?;
        let version = object_store::UpdateVersion { e_tag: got.meta.e_tag.clone(), version: got.meta.version.clone() };
        let bytes = got.bytes().await.map_err(Error::store(path.to_string()))?;
        let value = serde_json::from_slice(&bytes).map_err(|source| Error::Record { path: path.to_string(), source })?;
        Ok((value, version))
    }

    /// Where the commit record of `name`'s version `version` is, below the root.
    pub fn record_path(name: &str, version: u64) -> Path {
        Path::from(format!("{CATALOG}/{name}/v{version:08}.json"))
    }

    async fn read_record(&self, path: &Path) -> Result<CommitRecord> {
        self.get_json(path).await
    }

    /// Deletes every object under `prefix` and returns the bytes they held.
    async fn delete_prefix(&self, prefix: &str) -> Result<u64> {
        let listed = Path::from(prefix);
        let objects = match self.store.list(Some(&listed)).try_collect::<Vec<_>>().await {
            Ok(v) => v,
            Err(object_store::Error::NotFound { .. }) => Vec::new(),
            Err(e) => return Err(Error::store(listed.to_string())(e)),
        };
        let mut bytes = 0;
        for meta in objects {
            match self.store.delete(&meta.location).await {
                Ok(()) => bytes += meta.size,
                Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(Error::store(meta.location.to_string())(e)),
            }
        }
        self.prune(prefix);
        Ok(bytes)
    }

    /// Removes the directories left empty in `dir` (relative to the root), `dir` itself when it
    /// is left empty, and then each parent up to the root that is empty (a local store keeps
    /// directories that deleting objects emptied). Below `datasets/`, only a tree that one
    /// writer owns (its own version, a dead writer's) is walked: another writer may have just
    /// made an empty directory in its own version and be about to write into it. `staging/`
    /// holds only lease files, and a writer whose lease's directory was just removed makes it
    /// again.
    fn prune(&self, dir: &str) {
        if self.remote.is_some() {
            // An object store has no directories to leave behind.
            return;
        }
        fn prune_tree(dir: &std::path::Path) -> bool {
            let Ok(entries) = std::fs::read_dir(dir) else { return false };
            let mut empty = true;
            for entry in entries.flatten() {
                let p = entry.path();
                if !(p.is_dir() && prune_tree(&p) && std::fs::remove_dir(&p).is_ok()) {
                    empty = false;
                }
            }
            empty
        }
        let abs = self.root.join(dir);
        if abs.is_dir() && !(prune_tree(&abs) && std::fs::remove_dir(&abs).is_ok()) {
            return;
        }
        for parent in abs.ancestors().skip(1).take_while(|p| p.starts_with(&self.root) && *p != self.root) {
            if std::fs::remove_dir(parent).is_err() {
                break;
            }
        }
    }
}

/// What became of a commit record's create.
enum Written {
    /// The record is there, this writer's.
    Yes,
    /// Another writer's record took the number.
    Taken,
    /// Not written.
    Failed(object_store::Error),
}

/// What [`PendingVersion::commit_unless`] did.
#[derive(Debug)]
pub enum Committed {
    /// Published this version.
    New(CommitRecord),
    /// Published nothing: the latest version already was what this one would have been.
    Found(CommitRecord),
}

/// How many version numbers a commit tries while other writers keep taking them.
const COMMIT_TRIES: usize = 64;

/// A version being written. Commit it with [`PendingVersion::commit`]; on failure call
/// [`PendingVersion::abort`] so that the lake is exactly as before.
#[derive(Debug)]
pub struct PendingVersion {
    lake: Lake,
    name: String,
    dir: String,
    lease: HeldLease,
    done: bool,
    /// On an object store, keeps the digests of the files written into the version's directory.
    _sent: Option<crate::sent_digests::Watch>,
    /// Tests: waited at before the commit record's first write, so that writers collide.
    #[cfg(test)]
    before_put: Option<Arc<tokio::sync::Barrier>>,
}

impl PendingVersion {
    /// The dataset name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The version's directory, relative to the lake root.
    pub fn dir(&self) -> &str {
        &self.dir
    }

    /// The lake.
    pub fn lake(&self) -> &Lake {
        &self.lake
    }

    /// The Lance URI of `table` in this version.
    pub fn table_uri(&self, table: &str) -> String {
        self.lake.uri(&format!("{}/{table}.lance", self.dir))
    }

    /// Removes data files written into `table` that will not be published (the parts of a
    /// camera file that failed part-way), named as an uncommitted part's `data_files()`.
    ///
    /// # Errors
    /// When a file cannot be deleted.
    pub async fn discard(&self, table: &str, data_files: &[String]) -> Result<()> {
        for file in data_files {
            let path = Path::from(format!("{}/{table}.lance/data/{file}", self.dir));
            match self.lake.store.delete(&path).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(Error::store(path.to_string())(e)),
            }
        }
        Ok(())
    }

    /// Publishes the version: gives `record` the next version number and the time, and creates
    /// its commit record.
    ///
    /// # Errors
    /// [`Error::Conflict`] when other writers kept taking the number (the version's files are
    /// then removed), or an I/O error.
    pub async fn commit(self, record: CommitRecord) -> Result<CommitRecord> {
        match self.commit_unless(record, |_| false).await? {
            Committed::New(record) | Committed::Found(record) => Ok(record),
        }
    }

    /// As [`PendingVersion::commit`], unless the latest version when the number is taken is one
    /// `same` accepts: then this version is removed and that one returned. Two writers of the
    /// same content never both publish: whichever takes a number second sees the first's record
    /// (it is listed before the number is picked, or holds the number this writer tries to take).
    ///
    /// # Errors
    /// As [`PendingVersion::commit`].
    pub async fn commit_unless(mut self, mut record: CommitRecord, same: impl Fn(&CommitRecord) -> bool) -> Result<Committed> {
        // A view may have taken the name since `begin` (`Lake::put_view` checks for this
        // version's lease after writing, this for the view before publishing).
        if let Some(message) = self.lake.view_claims(&self.name).await? {
            self.abort_inner().await?;
            return Err(Error::View { name: self.name.clone(), message });
        }
        let mut version = 0;
        for _ in 0..COMMIT_TRIES {
            // After every version there was, removed ones included: a number never names two.
            let last = self.lake.all_version_paths(&self.name).await?.last().and_then(version_of).unwrap_or(0);
            let removed = self.lake.removal(&self.name).await?.map_or(0, |r| r.through_version);
            version = last.max(removed) + 1;
            let latest = match self.lake.latest_readable(&self.name).await {
                // A record listed and then removed by `lake rm` before it was read: look again.
                Err(Error::ObjectStore { source: object_store::Error::NotFound { .. }, .. }) => continue,
                other => other?,
            };
            if let Some(latest) = latest
                && same(&latest)
            {
                self.abort_inner().await?;
                return Ok(Committed::Found(latest));
            }
            #[cfg(test)]
            if let Some(barrier) = self.before_put.take() {
                barrier.wait().await;
            }
            // Renewed right before the record is written: garbage collection that took the
            // lease over (this writer went unrenewed too long) may be deleting the directory.
            if !self.lease.confirm().await? {
                self.abort_inner().await?;
                return Err(Error::LeaseLost { name: self.name.clone(), expiry_minutes: crate::lease::EXPIRY.num_minutes() });
            }
            record.version = version;
            record.committed_at = chrono::Utc::now();
            record.digest = None;
            record.digest = Some(crate::record_digest::record_digest(&serde_json::to_value(&record).expect("commit record serialises")));
            let path = Lake::record_path(&self.name, version);
            let body = serde_json::to_vec_pretty(&record).expect("commit record serialises");
            let put =
                self.lake.store.put_opts(&path, PutPayload::from(body), PutOptions { mode: PutMode::Create, ..Default::default() }).await;
            // An object store may take a request whose answer is lost: a retry of the create then
            // finds the record there, and an error may follow a write that happened. The record
            // at the path says whose it is.
            let written = match put {
                Ok(_) => Written::Yes,
                Err(object_store::Error::AlreadyExists { .. }) => match self.record_is_ours(&path).await {
                    Ok(true) => Written::Yes,
                    _ => Written::Taken,
                },
                Err(e) => match self.record_is_ours(&path).await {
                    Ok(true) => Written::Yes,
                    Ok(false) => Written::Failed(e),
                    Err(unread) => {
                        // The directory and lease stay: a record may name them. Garbage
                        // collection keeps them if one does, and removes them once this
                        // process is gone otherwise.
                        self.done = true;
                        let message = format!("{}; reading it back: {unread}", crate::error::store_message(&e));
                        return Err(Error::CommitUnknown { name: self.name.clone(), version, message });
                    }
                },
            };
            match written {
                Written::Yes => {
                    // `lake rm` may have removed the version this one took the number after, and
                    // its record with it, between the listing and the write: then this version
                    // is hidden by the removal, and finishing the removal would delete it.
                    if self.lake.removal(&self.name).await?.is_some_and(|r| r.through_version >= version) {
                        let _ = self.lake.store.delete(&path).await;
                        self.abort_inner().await?;
                        self.lake.prune(&format!("{CATALOG}/{}", self.name));
                        return Err(Error::RemovedWhileCommitting { name: self.name.clone(), version });
                    }
                    self.done = true;
                    // The version is visible now; a failure to drop the lease only leaves a lease
                    // that garbage collection recognises as committed.
                    self.lease.stop().await;
                    let _ = self.lake.store.delete(self.lease.path()).await;
                    self.lake.prune(STAGING);
                    // The lake holds a dataset now: no failed ingest is to take it back.
                    if let Some(root) = self.lake.local_root() {
                        let _ = std::fs::remove_file(root.join(UNCLAIMED));
                    }
                    return Ok(Committed::New(record));
                }
                // Another writer took the number between the listing and now: the next one.
                Written::Taken => {}
                Written::Failed(e) => {
                    self.abort_inner().await?;
                    // The record's directory, made for it, goes when it is left empty.
                    self.lake.prune(&format!("{CATALOG}/{}", self.name));
                    return Err(Error::store(path.to_string())(e));
                }
            }
        }
        self.abort_inner().await?;
        Err(Error::Conflict { name: self.name.clone(), version })
    }

    /// Whether the commit record at `path` is this writer's (names its directory); `false` when
    /// there is none.
    async fn record_is_ours(&self, path: &Path) -> Result<bool> {
        match self.lake.read_record(path).await {
            Ok(record) => Ok(record.tables.dir == self.dir),
            Err(Error::ObjectStore { source: object_store::Error::NotFound { .. }, .. }) => Ok(false),
            // Another writer's record being written, or damaged: not this writer's.
            Err(Error::Record { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Removes everything this version wrote, leaving the lake as it was before [`Lake::begin`].
    ///
    /// # Errors
    /// When files cannot be deleted.
    pub async fn abort(mut self) -> Result<()> {
        self.abort_inner().await
    }

    async fn abort_inner(&mut self) -> Result<()> {
        self.done = true;
        self.lake.delete_prefix(&self.dir).await?;
        self.lake.remove_local_dir(&self.dir)?;
        self.lease.stop().await;
        match self.lake.store.delete(self.lease.path()).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(Error::store(self.lease.path().to_string())(e)),
        }
        self.lake.prune(STAGING);
        Ok(())
    }
}

impl Drop for PendingVersion {
    fn drop(&mut self) {
        if !self.done {
            // Dropped without commit or abort (a panic or a cancelled task): remove the files
            // synchronously so nothing half-written stays behind.
            if self.lake.remote.is_some() {
                // On an object store, deleted in the background where a runtime runs; otherwise
                // the next garbage collection removes them (this process's lease is dead then).
                if let Ok(handle) = tokio::runtime::Handle::try_current() {
                    let (lake, dir, lease) = (self.lake.clone(), self.dir.clone(), self.lease.path().clone());
                    handle.spawn(async move {
                        if lake.delete_prefix(&dir).await.is_ok() {
                            let _ = lake.store.delete(&lease).await;
                        }
                    });
                }
                return;
            }
            let root = self.lake.root.clone();
            let _ = std::fs::remove_dir_all(root.join(&self.dir));
            let _ = std::fs::remove_file(root.join(self.lease.path().as_ref()));
            self.lake.prune(&self.dir);
            self.lake.prune(STAGING);
        }
    }
}

/// Runs the future `make` gives on a runtime of its own, on a thread of its own: for sync code
/// that may itself run inside a runtime.
fn on_own_runtime<T: Send, F: std::future::Future<Output = T>>(make: impl FnOnce() -> F + Send) -> T {
    std::thread::scope(|scope| {
        scope
            .spawn(|| tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime").block_on(make()))
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// The error of a removal whose record is written but whose files could not all be deleted.
fn unfinished(name: &str, e: &Error) -> Error {
    Error::Unfinished { name: name.to_string(), message: e.to_string() }
}

/// The dataset and version a removal record's path names: exactly `removed/<name>/v00000003.json`
/// (as `lake rm` writes it; nothing else in `removed/` counts), with a version that another can
/// follow.
fn removal_record(path: &Path) -> Option<(String, u64)> {
    let parts: Vec<_> = path.parts().collect();
    let [dir, name, file] = parts.as_slice() else { return None };
    let through = version_of(path).filter(|v| *v < u64::MAX)?;
    (dir.as_ref() == REMOVED && file.as_ref() == format!("v{through:08}.json")).then(|| (name.as_ref().to_string(), through))
}

/// The version number a record's path names (`…/v00000003.json`).
fn version_of(path: &Path) -> Option<u64> {
    path.filename()?.strip_prefix('v')?.strip_suffix(".json")?.parse().ok()
}

/// A version as written after `@`: digits, optionally after one `v` (`3`, `03`, `v3`); not a
/// sign, a space or anything else `u64::from_str` would take or ignore.
pub fn parse_version(text: &str) -> Option<u64> {
    let digits = text.strip_prefix('v').unwrap_or(text);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Checks that `name` can be a dataset name: letters, digits, `.`, `_`, `-`, at most 128 bytes,
/// not starting with `.` or `-`.
///
/// # Errors
/// [`Error::BadName`] saying what is wrong.
pub fn validate_name(name: &str) -> Result<()> {
    let bad = |message: &str| Err(Error::BadName { name: name.to_string(), message: message.to_string() });
    if name.is_empty() || name.len() > 128 {
        return bad("must be 1 to 128 characters");
    }
    if name.starts_with(['.', '-']) {
        return bad("must not start with `.` or `-`");
    }
    if !name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')) {
        return bad("may only hold ASCII letters and digits, `.`, `_` and `-`");
    }
    Ok(())
}

/// Names SQL gives schemas of its own: the schema of the tables spanning every dataset
/// (`public`) and the one describing them (`information_schema`). A dataset (or view) so named
/// would take their place.
pub const RESERVED_NAMES: [&str; 2] = ["public", "information_schema"];

/// [`validate_name`] for a name about to be given to a new dataset or view: also refuses the
/// [`RESERVED_NAMES`], in any case.
///
/// # Errors
/// [`Error::BadName`] saying what is wrong.
pub fn validate_new_name(name: &str) -> Result<()> {
    validate_name(name)?;
    if RESERVED_NAMES.iter().any(|r| r.eq_ignore_ascii_case(name)) {
        return Err(Error::BadName {
            name: name.to_string(),
            message: format!("is reserved: SQL names its own schema `{}`; choose another", name.to_ascii_lowercase()),
        });
    }
    Ok(())
}

/// The local path a location names: a path as it is, a `file://` URL decoded (`%20` is a
/// space); `None` for URLs of other schemes and `file://` URLs that are not valid.
pub fn local_path(location: &str) -> Option<PathBuf> {
    if location.starts_with("file://") {
        return url::Url::parse(location).ok()?.to_file_path().ok();
    }
    (!location.contains("://")).then(|| PathBuf::from(location))
}

/// A source location as the catalog records it: a local path (or `file://` URL) made absolute,
/// with `.` and `..` taken out lexically (symbolic links are kept as given); URLs of other
/// schemes as they are.
pub fn absolute_location(location: &str) -> String {
    let Some(path) = local_path(location) else { return location.to_string() };
    let Ok(abs) = std::path::absolute(path) else { return location.to_string() };
    let mut out = PathBuf::new();
    for c in abs.components() {
        match c {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out.to_string_lossy().into_owned()
}

/// Turns a source directory name into a valid dataset name (invalid characters become `_`);
/// `.`, `..` and relative paths are named after the directory they lead to.
pub fn default_name(source: &str) -> String {
    let source = &absolute_location(source);
    let base = source.trim_end_matches('/').rsplit('/').next().unwrap_or("dataset");
    let mut name: String = base.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '_' }).collect();
    while name.starts_with(['.', '-']) {
        name.remove(0);
    }
    if name.is_empty() { "dataset".to_string() } else { name.chars().take(128).collect() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for (text, version) in
            [("3", Some(3)), ("03", Some(3)), ("v3", Some(3)), ("+1", None), ("vv3", None), ("", None), ("v", None), (" 3", None)]
        {
            assert_eq!(parse_version(text), version, "{text:?}");
        }
        assert!(validate_name("so101_v3.0-small").is_ok());
        for bad in ["", ".hidden", "-x", "a/b", "a b", "a@1"] {
            assert!(validate_name(bad).is_err(), "{bad}");
        }
        assert_eq!(default_name("../shared/fixtures/v30-av1-small/"), "v30-av1-small");
        assert_eq!(default_name("/data/my set"), "my_set");
        let here = std::env::current_dir().unwrap();
        let dir = here.file_name().unwrap().to_str().unwrap().to_string();
        assert_eq!(default_name("."), default_name(&dir));
        assert_eq!(default_name("./"), default_name(&dir));
        assert_eq!(default_name(&format!("../{dir}/./")), default_name(&dir));
        assert_eq!(absolute_location("s3://bucket/x/"), "s3://bucket/x/");
        assert_eq!(absolute_location("file:///data/a/../b/"), "/data/b");
    }

    #[test]
    fn root_must_be_a_lake_or_new() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("lake");
        let root = root.to_str().unwrap();
        assert!(Lake::open(root).unwrap_err().to_string().contains("no lake here yet"));
        Lake::create(root).unwrap();
        assert!(std::path::Path::new(root).join(MARKER).is_file());
        Lake::open(root).unwrap();
        Lake::create(root).unwrap();

        let other = dir.path().join("project");
        std::fs::create_dir(&other).unwrap();
        std::fs::write(other.join("Cargo.toml"), "[package]\n").unwrap();
        let other = other.to_str().unwrap();
        assert!(Lake::create(other).unwrap_err().to_string().contains("holds other files and is not a lake"));
        assert!(Lake::open(other).unwrap_err().to_string().contains("not a lake"));
        assert!(!std::path::Path::new(other).join(CATALOG).exists());

        let empty = dir.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        Lake::create(empty.to_str().unwrap()).unwrap();
    }

    #[test]
    fn a_lake_being_created_is_waited_for_and_a_dead_creators_leftover_is_not_content() {
        let dir = tempfile::tempdir().unwrap();
        // A creator killed before its marker was renamed into place.
        let root = dir.path().join("killed");
        std::fs::create_dir(&root).unwrap();
        std::fs::write(root.join(format!("{NEW_MARKER}4194000")), b"{").unwrap();
        Lake::create(root.to_str().unwrap()).unwrap();
        assert!(root.join(MARKER).is_file() && !root.join(format!("{NEW_MARKER}4194000")).exists());
        // Another command creating the lake: its directories are there, its marker comes soon.
        let root = dir.path().join("racing");
        std::fs::create_dir_all(root.join(STAGING)).unwrap();
        let marker = root.join(MARKER);
        let writer = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(200));
            let staged = marker.with_extension("staged");
            std::fs::write(&staged, br#"{"format": "lake", "layout": 1}"#).unwrap();
            std::fs::rename(staged, marker).unwrap();
        });
        Lake::create(root.to_str().unwrap()).unwrap();
        writer.join().unwrap();
        // A reader waits for it too, and an empty directory has no lake yet.
        let root = dir.path().join("read-while-made");
        std::fs::create_dir_all(&root).unwrap();
        let open = |root: &std::path::Path| Lake::open(root.to_str().unwrap()).map(drop).map_err(|e| e.to_string());
        assert!(open(&root).unwrap_err().contains("no lake here yet"), "an empty directory");
        std::fs::write(root.join(format!("{NEW_MARKER}{}", std::process::id())), b"{").unwrap();
        let marker = root.join(MARKER);
        let writer = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(200));
            // Whole or not at all, as a creator puts it in place (a plain write is seen empty).
            let staged = marker.with_extension("staged");
            std::fs::write(&staged, br#"{"format": "lake", "layout": 1}"#).unwrap();
            std::fs::rename(staged, marker).unwrap();
        });
        assert_eq!(open(&root), Ok(()));
        writer.join().unwrap();
        // A lake's directories without its marker (lost outside lake) are no lake.
        std::fs::create_dir_all(dir.path().join("unmarked").join(CATALOG)).unwrap();
        assert!(open(&dir.path().join("unmarked")).unwrap_err().contains("is not a lake (no lake.json)"));
        std::fs::create_dir(dir.path().join("other")).unwrap();
        std::fs::write(dir.path().join("other/notes.txt"), b"").unwrap();
        assert!(open(&dir.path().join("other")).unwrap_err().contains("is not a lake (no lake.json)"));
    }

    #[test]
    fn process_liveness() {
        assert!(process_alive(std::process::id()));
        assert!(!process_alive(u32::MAX / 2));
    }
}

#[cfg(test)]
mod lifecycle_tests {
    use lake_schemas::{IngestOptions, SourceRecord, TableCounts, ViewDataset};

    use super::*;

    fn record(name: &str, version: u64, dir: &str) -> CommitRecord {
        CommitRecord {
            format_version: 1,
            name: name.into(),
            version,
            committed_at: Utc::now(),
            ingest_seconds: 0.0,
            tables: lake_schemas::TableSet { dir: dir.into(), tables: vec![], files: vec![] },
            source: SourceRecord {
                url: "src".into(),
                codebase_version: "v3.0".into(),
                content_hash: "h".into(),
                fingerprint: "f".into(),
                files: 0,
                bytes: 0,
            },
            options: IngestOptions {
                tolerance_s: 1e-4,
                skip_bad_episodes: false,
                drop_missing_cameras: false,
                keep_rows_without_video: false,
            },
            counts: TableCounts::default(),
            fps: 30,
            robot_type: None,
            info: serde_json::Value::Null,
            digest: None,
        }
    }

    fn write_file(lake: &Lake, rel: &str) {
        let p = lake.root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, b"data").unwrap();
    }

    fn entries(lake: &Lake) -> Vec<String> {
        std::fs::read_dir(&lake.root).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect()
    }

    #[tokio::test]
    async fn a_failed_first_ingest_takes_back_its_lake_only_while_no_other_writer_started() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("lake");
        // Alone: the lake directory goes, and a writer that opened it meanwhile finds no lake.
        let made = Lake::create(root.to_str().unwrap()).unwrap();
        let late = Lake::open(root.to_str().unwrap()).unwrap();
        let creator = Lake::create(root.to_str().unwrap()).unwrap();
        assert!(made.take_back(false));
        assert!(!root.exists());
        let err = late.begin("ds").await.unwrap_err().to_string();
        assert!(err.contains("was removed while this ingest started"), "{err}");
        // A writer that may create the lake (an ingest) makes it again and goes on.
        let pending = creator.begin("ds").await.unwrap();
        assert!(creator.left_to_take_back() == Some(false) && root.join(MARKER).is_file());
        pending.abort().await.unwrap();
        assert!(creator.take_back(false) && !root.exists());

        // Beside a writer whose lease is written: the lake stays, marker and all.
        let made = Lake::create(root.to_str().unwrap()).unwrap();
        let other = Lake::open(root.to_str().unwrap()).unwrap();
        let pending = other.begin("ds").await.unwrap();
        assert!(!made.take_back(false));
        assert!(root.join(MARKER).is_file() && taking_back(&root).is_empty());
        // ... left to that writer, should it fail too, until it commits.
        assert_eq!(other.left_to_take_back(), Some(false));
        let dir = pending.dir().to_string();
        pending.commit(record("ds", 0, &dir)).await.unwrap();
        assert_eq!(Lake::open(root.to_str().unwrap()).unwrap().datasets().await.unwrap().len(), 1);
        assert_eq!(other.left_to_take_back(), None);

        // A marker left aside by a process that died meanwhile is put back by the next open.
        std::fs::rename(root.join(MARKER), root.join(format!("{TAKING_BACK}4194000"))).unwrap();
        assert_eq!(Lake::open(root.to_str().unwrap()).unwrap().datasets().await.unwrap().len(), 1);
        assert!(root.join(MARKER).is_file() && taking_back(&root).is_empty());

        // In a directory that existed (empty): only what the lake put there goes.
        let empty = tmp.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        assert!(Lake::create(empty.to_str().unwrap()).unwrap().take_back(true));
        assert!(empty.is_dir() && std::fs::read_dir(&empty).unwrap().next().is_none());
    }

    /// Commits a version of `name` with one table file in its directory; returns the directory.
    async fn commit_version(lake: &Lake, name: &str) -> String {
        let pending = lake.begin(name).await.unwrap();
        let dir = pending.dir().to_string();
        write_file(lake, &format!("{dir}/steps.lance/data/part.lance"));
        pending.commit(record(name, 0, &dir)).await.unwrap();
        dir
    }

    /// A store that writes a commit record and then loses the answer, as an object store
    /// behind a flaky network can: `reset` answers with an error, otherwise with the
    /// `AlreadyExists` a retried create gets.
    #[derive(Debug)]
    struct LostAnswers {
        inner: Arc<dyn ObjectStore>,
        reset: bool,
        unreadable: bool,
        lost: std::sync::atomic::AtomicBool,
    }

    impl std::fmt::Display for LostAnswers {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("LostAnswers")
        }
    }

    #[async_trait::async_trait]
    impl ObjectStore for LostAnswers {
        async fn put_opts(&self, location: &Path, payload: PutPayload, opts: PutOptions) -> object_store::Result<object_store::PutResult> {
            let written = self.inner.put_opts(location, payload, opts).await?;
            let record = location.as_ref().starts_with(CATALOG);
            if record && !self.lost.swap(true, std::sync::atomic::Ordering::SeqCst) {
                let source = "connection reset by peer".into();
                return Err(match self.reset {
                    true => object_store::Error::Generic { store: "S3", source },
                    false => object_store::Error::AlreadyExists { path: location.to_string(), source },
                });
            }
            Ok(written)
        }
        async fn put_multipart_opts(
            &self,
            location: &Path,
            opts: object_store::PutMultipartOptions,
        ) -> object_store::Result<Box<dyn object_store::MultipartUpload>> {
            self.inner.put_multipart_opts(location, opts).await
        }
        async fn get_opts(&self, location: &Path, options: object_store::GetOptions) -> object_store::Result<object_store::GetResult> {
            if self.unreadable && location.as_ref().starts_with(CATALOG) {
                return Err(object_store::Error::Generic { store: "S3", source: "timed out".into() });
            }
            self.inner.get_opts(location, options).await
        }
        fn delete_stream(
            &self,
            locations: futures::stream::BoxStream<'static, object_store::Result<Path>>,
        ) -> futures::stream::BoxStream<'static, object_store::Result<Path>> {
            self.inner.delete_stream(locations)
        }
        fn list(&self, prefix: Option<&Path>) -> futures::stream::BoxStream<'static, object_store::Result<object_store::ObjectMeta>> {
            self.inner.list(prefix)
        }
        async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<object_store::ListResult> {
            self.inner.list_with_delimiter(prefix).await
        }
        async fn copy_opts(&self, from: &Path, to: &Path, options: object_store::CopyOptions) -> object_store::Result<()> {
            self.inner.copy_opts(from, to, options).await
        }
    }

    #[tokio::test]
    async fn a_commit_whose_answer_was_lost_is_this_writers_version_or_says_it_is_unknown() {
        for (reset, unreadable) in [(false, false), (true, false), (true, true)] {
            let tmp = tempfile::tempdir().unwrap();
            let mut lake = Lake::create(tmp.path().join("lake").to_str().unwrap()).unwrap();
            let lost = LostAnswers { inner: lake.store.clone(), reset, unreadable, lost: Default::default() };
            lake.store = Arc::new(lost);
            let pending = lake.begin("ds").await.unwrap();
            let dir = pending.dir().to_string();
            write_file(&lake, &format!("{dir}/steps.lance/data/part.lance"));
            let committed = pending.commit(record("ds", 0, &dir)).await;
            let case = format!("reset {reset}, record unreadable {unreadable}");
            if unreadable {
                let err = committed.unwrap_err().to_string();
                assert!(err.contains("whether version 1 was committed is unknown"), "{case}: {err}");
                assert!(lake.root.join(&dir).is_dir(), "{case}: the directory a record may name stays");
                continue;
            }
            let r = committed.unwrap();
            assert_eq!((r.version, r.tables.dir.as_str()), (1, dir.as_str()), "{case}");
            assert!(lake.root.join(&dir).is_dir(), "{case}: the committed version's tables stay");
            assert_eq!(lake.resolve("ds").await.unwrap().version, 1, "{case}: one version, no second record");
            assert!(lake.list(STAGING).await.unwrap().is_empty(), "{case}: the lease is dropped");
        }
    }

    #[tokio::test]
    async fn a_removed_dataset_is_gone_and_its_version_numbers_stay_taken() {
        let tmp = tempfile::tempdir().unwrap();
        let lake = Lake::create(tmp.path().join("lake").to_str().unwrap()).unwrap();
        let dirs = [commit_version(&lake, "ds").await, commit_version(&lake, "ds").await];
        let other = commit_version(&lake, "other").await;
        // An ingest of the name under way is named, and goes on.
        let writing = lake.begin("ds").await.unwrap();
        let report = lake.remove("ds", false).await.unwrap();
        assert_eq!((report.versions.clone(), report.bytes, report.kept.clone()), (vec![1, 2], 8, vec![]));
        assert_eq!(report.removal.through_version, 2);
        assert_eq!(report.under_way.len(), 1, "{report:?}");
        assert_eq!((report.under_way[0].pid, report.under_way[0].host.as_str()), (std::process::id(), hostname().as_str()));
        assert!(lake.root.join(writing.dir()).is_dir(), "the ingest's directory stays");
        writing.abort().await.unwrap();
        for dir in &dirs {
            assert!(!lake.root.join(dir).exists(), "{dir} deleted");
        }
        assert!(!lake.root.join("catalog/ds").exists() && !lake.root.join("datasets/ds").exists());
        assert!(lake.root.join(&other).exists(), "other datasets keep their files");
        let names: Vec<String> = lake.datasets().await.unwrap().into_iter().map(|r| r.name).collect();
        assert_eq!(names, ["other"]);
        assert!(lake.latest("ds").await.unwrap().is_none() && lake.versions("ds").await.unwrap().is_empty());
        for spec in ["ds", "ds@1", "ds@2"] {
            let e = lake.resolve(spec).await.unwrap_err().to_string();
            assert!(e.contains(&format!("no dataset `{spec}`")) && e.contains("`ds` was removed with `lake rm` at "), "{e}");
            assert!(e.ends_with("(versions 1 to 2)"), "{e}");
        }
        assert!(matches!(lake.remove("ds", false).await.unwrap_err(), Error::NotFound { removed: Some(_), .. }));
        // An ingest under the name later continues after the removed versions.
        commit_version(&lake, "ds").await;
        assert_eq!(lake.resolve("ds").await.unwrap().version, 3);
        assert!(lake.resolve("ds@2").await.is_err());
        let report = lake.remove("ds", false).await.unwrap();
        assert_eq!((report.versions, report.removal.through_version), (vec![3], 3));
        // Each version's message names the removal that took it.
        assert!(lake.resolve("ds@1").await.unwrap_err().to_string().ends_with("(versions 1 to 2)"));
        assert!(lake.resolve("ds@3").await.unwrap_err().to_string().ends_with("(version 3)"));
        assert!(lake.resolve("ds").await.unwrap_err().to_string().ends_with("(version 3)"));
        assert_eq!(lake.removals("ds").await.unwrap().len(), 2);
    }

    #[tokio::test]
    async fn a_records_staging_copy_left_by_a_kill_goes_once_the_record_is_in_place() {
        let tmp = tempfile::tempdir().unwrap();
        let lake = Lake::create(tmp.path().join("lake").to_str().unwrap()).unwrap();
        commit_version(&lake, "ds").await;
        let catalog = tmp.path().join("lake/catalog/ds");
        // Killed between linking the record into place and deleting its staging name.
        std::fs::write(catalog.join("v00000001.json#1"), b"{}").unwrap();
        // A writer still at work (or one killed before linking) has no record yet: left alone.
        std::fs::write(catalog.join("v00000002.json#1"), b"{").unwrap();
        lake.collect_garbage().await.unwrap();
        assert!(!catalog.join("v00000001.json#1").exists());
        assert!(catalog.join("v00000001.json").is_file() && catalog.join("v00000002.json#1").is_file());
    }

    /// A writer killed after writing its lease's staging file and before moving it into place
    /// leaves that file: it goes with the next garbage collection once its pid is gone, while a
    /// live writer's, and another host's, stay.
    #[tokio::test]
    async fn a_killed_writers_lease_staging_file_goes_and_a_live_ones_stays() {
        let tmp = tempfile::tempdir().unwrap();
        let lake = Lake::create(tmp.path().join("lake").to_str().unwrap()).unwrap();
        let staging = tmp.path().join("lake/staging");
        std::fs::create_dir_all(&staging).unwrap();
        let host = hostname();
        let dead = format!(".20261130T064738-fcc43957f174.json.{}@{host}", u32::MAX / 2);
        let live = format!(".20261130T064739-0123456789ab.json.{}@{host}", std::process::id());
        let foreign = format!(".20261130T064740-ba9876543210.json.{}@{host}-elsewhere", u32::MAX / 2);
        for name in [&dead, &live, &foreign] {
            std::fs::write(staging.join(name), b"{").unwrap();
        }
        lake.collect_garbage().await.unwrap();
        assert!(!staging.join(&dead).exists(), "a dead writer's staging file goes");
        assert!(staging.join(&live).exists() && staging.join(&foreign).exists(), "a live writer's and another host's stay");
        std::fs::remove_file(staging.join(&live)).unwrap();
        std::fs::remove_file(staging.join(&foreign)).unwrap();
        lake.collect_garbage().await.unwrap();
        assert!(!staging.exists(), "an empty staging directory goes");
    }

    #[tokio::test]
    async fn an_interrupted_removal_hides_its_versions_and_is_finished_later() {
        let tmp = tempfile::tempdir().unwrap();
        let lake = Lake::create(tmp.path().join("lake").to_str().unwrap()).unwrap();
        let first = commit_version(&lake, "ds").await;
        let second = commit_version(&lake, "ds").await;
        // `lake rm` killed right after writing its removal record (through version 1 only:
        // version 2 came after it, as an ingest committing meanwhile would). What the record
        // holds is for people: its path says what was removed, even when damaged.
        write_file(&lake, "removed/ds/v00000001.json");
        // Nothing else in `removed/` counts.
        for odd in [
            "removed/ds/notes.txt",
            "removed/stray.json",
            "removed/ds/x/v00000009.json",
            "removed/ds/v2.json",
            "removed/ds/v18446744073709551615.json",
        ] {
            write_file(&lake, odd);
        }
        let listed: Vec<(String, u64)> = lake.datasets().await.unwrap().into_iter().map(|r| (r.name, r.version)).collect();
        assert_eq!(listed, [("ds".to_string(), 2)]);
        assert_eq!(lake.versions("ds").await.unwrap().len(), 1);
        let e = lake.resolve("ds@1").await.unwrap_err().to_string();
        assert!(e.contains("`ds` was removed with `lake rm` at ") && e.ends_with("(version 1)"), "{e}");
        assert!(!lake.resolve("ds@3").await.unwrap_err().to_string().contains("removed"), "no removal covers version 3");
        assert!(lake.root.join(&first).exists());
        let report = lake.collect_garbage().await.unwrap();
        assert_eq!(report.finished_removals, [("ds".to_string(), 1)]);
        assert!(!lake.root.join(&first).exists() && lake.root.join(&second).exists());
        assert!(!lake.root.join("catalog/ds/v00000001.json").exists() && lake.root.join("catalog/ds/v00000002.json").exists());
        assert!(lake.collect_garbage().await.unwrap().finished_removals.is_empty());
        // A frame table published into version 1 while it was removed: nothing names it, and
        // the next collection deletes it; an ingest's directory (named by its lease) stays.
        write_file(&lake, &format!("{first}/frames.lance/data/part.lance"));
        let pending = lake.begin("ds").await.unwrap();
        // A lease whose contents cannot be read still protects its directory (its name is the id).
        let unreadable = "datasets/ds/20261126T000000-000000000000";
        write_file(&lake, &format!("{unreadable}/steps.lance/x"));
        write_file(&lake, "staging/20261126T000000-000000000000.json");
        lake.collect_garbage().await.unwrap();
        assert!(!lake.root.join(&first).exists() && lake.root.join(pending.dir()).is_dir() && lake.root.join(&second).exists());
        assert!(lake.root.join(unreadable).is_dir());
        pending.abort().await.unwrap();
        std::fs::remove_file(lake.root.join("staging/20261126T000000-000000000000.json")).unwrap();
        lake.collect_garbage().await.unwrap();
        assert!(!lake.root.join(unreadable).exists(), "unnamed once its lease is gone");

        // Killed again, after the record for version 2: `remove` finishes it (nothing is left to
        // see, so there is nothing else to remove).
        write_file(&lake, "removed/ds/v00000002.json");
        assert!(lake.datasets().await.unwrap().is_empty());
        let report = lake.remove("ds", false).await.unwrap();
        assert!(report.finished_earlier && report.versions == [2] && report.removal.from_version == 2, "{report:?}");
        assert!(!lake.root.join(&second).exists());
        assert!(matches!(lake.remove("ds", false).await.unwrap_err(), Error::NotFound { removed: Some(_), .. }));
        // A view cannot take a removed dataset's name.
        let view = ViewRecord {
            name: "ds".into(),
            version: 0,
            sql: "SELECT 1".into(),
            created_at: Utc::now(),
            lake_versions: Vec::new(),
            datasets: Vec::new(),
            dropped: false,
            digest: None,
        };
        let e = lake.put_view(&view, false).await.unwrap_err().to_string();
        assert!(e.contains("`ds` was removed with `lake rm`") && e.contains("choose another"), "{e}");
    }

    #[tokio::test]
    async fn a_damaged_commit_record_takes_out_only_its_dataset_and_the_next_ingest_replaces_it() {
        let tmp = tempfile::tempdir().unwrap();
        let lake = Lake::create(tmp.path().join("lake").to_str().unwrap()).unwrap();
        for name in ["a", "b"] {
            let p = lake.begin(name).await.unwrap();
            let dir = p.dir().to_string();
            p.commit(record(name, 0, &dir)).await.unwrap();
        }
        std::fs::write(lake.root.join("catalog/a/v00000001.json"), b"garbage").unwrap();
        let (datasets, unreadable) = lake.datasets_listed().await.unwrap();
        assert_eq!(datasets.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(), ["b"]);
        assert_eq!((unreadable[0].name.as_str(), unreadable[0].version), ("a", 1));
        assert_eq!(unreadable[0].path, "catalog/a/v00000001.json");
        let err = lake.resolve("a").await.unwrap_err().to_string();
        assert!(err.contains("catalog/a/v00000001.json"), "{err}");
        assert!(lake.latest_readable("a").await.unwrap().is_none());

        // Garbage collection keeps what a record it cannot read might name; a new version
        // comes after the damaged one.
        lake.collect_garbage().await.unwrap();
        let p = lake.begin("a").await.unwrap();
        let dir = p.dir().to_string();
        assert_eq!(p.commit(record("a", 0, &dir)).await.unwrap().version, 2);
        assert_eq!(lake.datasets().await.unwrap().len(), 2);
        assert!(lake.datasets_listed().await.unwrap().1.is_empty());
        // An earlier version stays readable by number when a later record is damaged.
        std::fs::write(lake.root.join("catalog/a/v00000002.json"), b"").unwrap();
        std::fs::write(lake.root.join("catalog/a/v00000001.json"), serde_json::to_vec(&record("a", 1, "d")).unwrap()).unwrap();
        assert_eq!(lake.resolve("a@1").await.unwrap().version, 1);
        assert_eq!(lake.version_count("a").await.unwrap(), 2);

        std::fs::create_dir_all(lake.root.join("views/v")).unwrap();
        std::fs::write(lake.root.join("views/v/v00000001.json"), b"{").unwrap();
        let (views, unreadable) = lake.views_listed().await.unwrap();
        assert!(views.is_empty());
        assert_eq!((unreadable[0].name.as_str(), unreadable[0].path.as_str()), ("v", "views/v/v00000001.json"));
    }

    #[tokio::test]
    async fn a_view_and_an_ingest_racing_for_a_name_do_not_both_get_it() {
        let tmp = tempfile::tempdir().unwrap();
        let lake = Lake::create(tmp.path().join("lake").to_str().unwrap()).unwrap();
        let view = |name: &str| ViewRecord {
            name: name.into(),
            version: 0,
            sql: "SELECT 1".into(),
            created_at: Utc::now(),
            lake_versions: Vec::new(),
            datasets: Vec::new(),
            dropped: false,
            digest: None,
        };
        // An ingest under way holds its name: the view is refused and nothing stays of it.
        let pending = lake.begin("foo").await.unwrap();
        let err = lake.put_view(&view("foo"), false).await.unwrap_err().to_string();
        assert!(err.contains("a dataset has this name"), "{err}");
        assert!(lake.view_paths("foo").await.unwrap().is_empty());
        pending.abort().await.unwrap();

        // A view made while an ingest ran: the ingest is refused at its commit.
        let pending = lake.begin("bar").await.unwrap();
        lake.put_view_version(&ViewRecord { version: 1, ..view("bar") }).await.unwrap();
        let dir = pending.dir().to_string();
        let err = pending.commit(record("bar", 0, &dir)).await.unwrap_err().to_string();
        assert!(err.contains("is a view"), "{err}");
        assert!(lake.datasets().await.unwrap().is_empty());
        assert!(!lake.root.join(&dir).exists());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn writers_that_pick_one_number_at_once_publish_once() {
        let tmp = tempfile::tempdir().unwrap();
        let lake = Lake::create(tmp.path().join("lake").to_str().unwrap()).unwrap();
        // Both list no version, both see no latest to be the same as, both try version 1.
        let writers = writers_in_step(&lake, 2).await;
        let commits = writers.into_iter().map(|p| {
            let r = record("ds", 0, p.dir());
            tokio::spawn(async move { p.commit_unless(r, |_| true).await.unwrap() })
        });
        let done: Vec<Committed> = futures::future::join_all(commits).await.into_iter().map(Result::unwrap).collect();
        assert!(matches!(done[..], [Committed::New(_), Committed::Found(_)] | [Committed::Found(_), Committed::New(_)]), "{done:?}");
        assert_eq!(lake.versions("ds").await.unwrap().len(), 1);
        // Different contents at once: the one that collides takes the next number.
        let writers = writers_in_step(&lake, 2).await;
        let commits = writers.into_iter().map(|p| {
            let r = record("ds", 0, p.dir());
            tokio::spawn(async move { p.commit_unless(r, |_| false).await.unwrap() })
        });
        let versions = new_versions(commits).await;
        assert_eq!(versions, [2, 3]);
    }

    /// `n` writers of "ds" that each wait before their put until all of them are there.
    async fn writers_in_step(lake: &Lake, n: usize) -> Vec<PendingVersion> {
        let barrier = Arc::new(tokio::sync::Barrier::new(n));
        let mut writers = Vec::new();
        for _ in 0..n {
            let mut p = lake.begin("ds").await.unwrap();
            p.before_put = Some(barrier.clone());
            writers.push(p);
        }
        writers
    }

    /// The versions that commits each expected to make a new one made, in order.
    async fn new_versions(commits: impl Iterator<Item = tokio::task::JoinHandle<Committed>>) -> Vec<u64> {
        let mut versions: Vec<u64> = futures::future::join_all(commits)
            .await
            .into_iter()
            .map(|c| match c.unwrap() {
                Committed::New(r) => r.version,
                Committed::Found(r) => panic!("found {r:?}"),
            })
            .collect();
        versions.sort_unstable();
        versions
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn writers_of_the_same_content_at_once_publish_one_version_and_others_each_their_own() {
        let tmp = tempfile::tempdir().unwrap();
        let lake = Lake::create(tmp.path().join("lake").to_str().unwrap()).unwrap();
        let with_hash = |dir: &str, hash: &str| {
            let mut r = record("ds", 0, dir);
            r.source.content_hash = hash.into();
            r
        };
        // Eight writers of one content, begun together, commit together: one publishes.
        let mut pendings = Vec::new();
        for _ in 0..8 {
            pendings.push(lake.begin("ds").await.unwrap());
        }
        let commits = pendings.into_iter().map(|p| {
            let r = with_hash(p.dir(), "same");
            tokio::spawn(async move { p.commit_unless(r, |now| now.source.content_hash == "same").await.unwrap() })
        });
        let done = futures::future::join_all(commits).await;
        let made: Vec<u64> = done
            .iter()
            .filter_map(|c| match c.as_ref().unwrap() {
                Committed::New(r) => Some(r.version),
                Committed::Found(_) => None,
            })
            .collect();
        assert_eq!(made, [1], "{done:?}");
        assert!(done.iter().all(|c| matches!(c.as_ref().unwrap(), Committed::New(r) | Committed::Found(r) if r.version == 1)));
        assert_eq!(lake.versions("ds").await.unwrap().len(), 1);
        assert!(!lake.root.join("staging").exists(), "the writers that found it removed their files");
        // Writers of different contents at once each take their own number.
        let mut pendings = Vec::new();
        for _ in 0..6 {
            pendings.push(lake.begin("ds").await.unwrap());
        }
        let commits = pendings.into_iter().enumerate().map(|(i, p)| {
            let r = with_hash(p.dir(), &format!("h{i}"));
            tokio::spawn(async move { p.commit_unless(r, |_| false).await.unwrap() })
        });
        let versions = new_versions(commits).await;
        assert_eq!(versions, [2, 3, 4, 5, 6, 7]);
        for v in 2..=7 {
            assert_eq!(lake.resolve(&format!("ds@{v}")).await.unwrap().version, v, "each record holds its own number");
        }
    }

    #[tokio::test]
    async fn commit_abort_and_versions() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(Lake::open(tmp.path().join("none").to_str().unwrap()).is_err());
        let lake = Lake::create(tmp.path().join("lake").to_str().unwrap()).unwrap();

        let aborted = lake.begin("ds").await.unwrap();
        write_file(&lake, &format!("{}/steps.lance/x", aborted.dir()));
        aborted.abort().await.unwrap();
        assert_eq!(entries(&lake), vec![MARKER.to_string()], "abort leaves nothing");

        for v in 1..=2 {
            let p = lake.begin("ds").await.unwrap();
            write_file(&lake, &format!("{}/steps.lance/x", p.dir()));
            let dir = p.dir().to_string();
            let r = p.commit(record("ds", 0, &dir)).await.unwrap();
            assert_eq!(r.version, v);
        }
        assert!(!lake.root.join("staging").exists());
        assert_eq!(lake.versions("ds").await.unwrap().len(), 2);
        assert_eq!(lake.resolve("ds").await.unwrap().version, 2);
        assert_eq!(lake.resolve("ds@1").await.unwrap().version, 1);
        let err = lake.resolve("other").await.unwrap_err().to_string();
        assert!(err.contains("ds@2"), "{err}");
        assert!(lake.resolve("ds@x").await.is_err());
    }

    #[tokio::test]
    async fn garbage_of_dead_ingests_is_collected() {
        let tmp = tempfile::tempdir().unwrap();
        let lake = Lake::create(tmp.path().to_str().unwrap()).unwrap();
        let p = lake.begin("ds").await.unwrap();
        let dir = p.dir().to_string();
        write_file(&lake, &format!("{dir}/packets.lance/data/f"));
        // Pretend the writer died: rewrite its lease with a pid that does not exist.
        let lease_path = std::fs::read_dir(lake.root.join("staging")).unwrap().next().unwrap().unwrap().path();
        let mut lease: Lease = serde_json::from_slice(&std::fs::read(&lease_path).unwrap()).unwrap();
        lease.pid = i32::MAX as u32;
        std::fs::write(&lease_path, serde_json::to_vec(&lease).unwrap()).unwrap();
        std::mem::forget(p); // a killed process runs no destructor
        let report = lake.collect_garbage().await.unwrap();
        assert_eq!(report.removed_dirs, vec![dir]);
        assert_eq!(entries(&lake), vec![MARKER.to_string()]);

        // A lease naming anything but its own version directory is left alone, and so is what
        // it names.
        write_file(&lake, "datasets/other/v/steps.lance/data/f");
        for (file, name, dir) in
            [("x.json", "ds", "datasets"), ("y.json", "ds", "datasets/other/v"), ("v.json", "../..", "datasets/../../v")]
        {
            let forged = Lease { pid: i32::MAX as u32, ..Lease::new(name, dir) };
            write_file(&lake, &format!("staging/{file}"));
            std::fs::write(lake.root.join("staging").join(file), serde_json::to_vec(&forged).unwrap()).unwrap();
        }
        assert!(lake.collect_garbage().await.unwrap().removed_dirs.is_empty());
        assert!(lake.root.join("datasets/other/v/steps.lance/data/f").is_file());
        std::fs::remove_dir_all(lake.root.join("staging")).unwrap();
        std::fs::remove_dir_all(lake.root.join("datasets")).unwrap();

        // A live writer's files are left alone.
        let live = lake.begin("ds").await.unwrap();
        write_file(&lake, &format!("{}/t", live.dir()));
        assert!(lake.collect_garbage().await.unwrap().removed_dirs.is_empty());
        live.abort().await.unwrap();
    }

    /// Writers of one name side by side: one finishing (commit, abort, or dropped on a panic)
    /// leaves the other's directories alone, the empty ones it is about to write into
    /// included.
    #[tokio::test]
    async fn a_finishing_writer_leaves_anothers_empty_directories() {
        let tmp = tempfile::tempdir().unwrap();
        let lake = Lake::create(tmp.path().join("lake").to_str().unwrap()).unwrap();
        let other = lake.begin("ds").await.unwrap();
        assert!(lake.root.join(other.dir()).is_dir(), "begin makes the version's directory");
        let about_to_write = lake.root.join(other.dir()).join("streams.lance/data");
        std::fs::create_dir_all(&about_to_write).unwrap();

        let aborted = lake.begin("ds").await.unwrap();
        write_file(&lake, &format!("{}/steps.lance/data/x", aborted.dir()));
        aborted.abort().await.unwrap();
        assert!(about_to_write.is_dir(), "abort");
        let dropped = lake.begin("ds").await.unwrap();
        write_file(&lake, &format!("{}/steps.lance/data/x", dropped.dir()));
        drop(dropped);
        assert!(about_to_write.is_dir(), "drop");
        let committed = lake.begin("ds").await.unwrap();
        let dir = committed.dir().to_string();
        write_file(&lake, &format!("{dir}/steps.lance/data/x"));
        committed.commit(record("ds", 0, &dir)).await.unwrap();
        assert!(about_to_write.is_dir(), "commit");
        assert!(lake.collect_garbage().await.unwrap().removed_dirs.is_empty());
        assert!(about_to_write.is_dir(), "garbage collection");

        other.abort().await.unwrap();
        let left = std::fs::read_dir(lake.root.join(DATASETS).join("ds")).unwrap().map(|e| e.unwrap().path()).collect::<Vec<_>>();
        assert_eq!(left, vec![lake.root.join(&dir)], "the aborted writer's tree is gone");
    }

    fn view(name: &str, sql: &str) -> ViewRecord {
        ViewRecord {
            name: name.into(),
            version: 0,
            dropped: false,
            sql: sql.into(),
            created_at: Utc::now(),
            lake_versions: vec![],
            datasets: vec![],
            digest: None,
        }
    }

    #[tokio::test]
    async fn a_removal_and_a_view_made_at_once_never_leave_a_view_over_a_removed_dataset() {
        let tmp = tempfile::tempdir().unwrap();
        let lake = Lake::create(tmp.path().join("lake").to_str().unwrap()).unwrap();
        let over = |version: u64| ViewRecord {
            datasets: vec![ViewDataset { name: "ds".into(), version, weight: 1.0, episodes: vec![0], features: Default::default() }],
            ..view("v", "q")
        };
        // A view written after `lake rm` checked the views: the removal backs out.
        let dir = commit_version(&lake, "ds").await;
        lake.put_view(&over(1), false).await.unwrap();
        let e = lake.remove("ds", false).await.unwrap_err();
        assert!(matches!(&e, Error::Selected { views, .. } if views == &["v@1"]), "{e}");
        assert!(e.to_string().contains("pass --force"), "{e}");
        assert!(lake.removal("ds").await.unwrap().is_none() && lake.resolve("ds").await.is_ok() && lake.root.join(&dir).is_dir());
        // Forced, it goes; a view made then over the removed version is withdrawn.
        lake.remove("ds", true).await.unwrap();
        let e = lake.put_view(&over(1), true).await.unwrap_err().to_string();
        assert!(e.contains("`lake rm ds` ran while the view was made") && e.contains("selected `ds@1`"), "{e}");
        assert_eq!(lake.view("v").await.unwrap().unwrap().version, 1, "the withdrawn version is gone");

        // Why reading a removed version's files failed: its removal.
        let removed = format!("table /somewhere/{dir}/steps.lance: Not found: /somewhere/{dir}/steps.lance/data/x.lance");
        assert_eq!(lake.removal_behind(&removed).await.map(|r| r.through_version), Some(1));
        let live = commit_version(&lake, "ds").await;
        for unexplained in [format!("{live}/steps.lance: Not found"), "Not found: steps.lance".into(), dir.clone()] {
            assert!(lake.removal_behind(&unexplained).await.is_none(), "{unexplained}");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn views_created_at_once_without_replace_make_one_version() {
        let tmp = tempfile::tempdir().unwrap();
        let lake = Lake::create(tmp.path().join("lake").to_str().unwrap()).unwrap();
        let creates = (0..8).map(|i| {
            let lake = lake.clone();
            tokio::spawn(async move { lake.put_view(&view("n", &format!("q{i}")), false).await })
        });
        let done = futures::future::join_all(creates).await;
        let made: Vec<u64> = done.iter().filter_map(|r| r.as_ref().unwrap().as_ref().ok().copied()).collect();
        assert_eq!(made, [1], "{done:?}");
        assert_eq!(lake.view_versions("n").await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn views_keep_every_version() {
        let tmp = tempfile::tempdir().unwrap();
        let lake = Lake::create(tmp.path().to_str().unwrap()).unwrap();
        // A view stored before views had versions is version 1.
        let mut old = serde_json::to_value(view("old", "q1")).unwrap();
        old.as_object_mut().unwrap().remove("version");
        std::fs::create_dir_all(lake.root.join(VIEWS)).unwrap();
        std::fs::write(lake.root.join("views/old.json"), serde_json::to_vec(&old).unwrap()).unwrap();
        assert_eq!(lake.view("old").await.unwrap().unwrap().version, 1);
        assert!(lake.put_view(&view("old", "q2"), false).await.unwrap_err().to_string().contains("already exists"));
        assert_eq!(lake.put_view(&view("old", "q2"), true).await.unwrap(), 2);
        assert_eq!(lake.view("old").await.unwrap().unwrap().sql, "q2");
        assert_eq!(lake.view_version("old", 1).await.unwrap().unwrap().sql, "q1");

        lake.drop_view("old").await.unwrap();
        assert!(lake.view("old").await.unwrap().is_none());
        assert!(lake.views().await.unwrap().is_empty());
        assert!(lake.view_version("old", 3).await.unwrap().is_none(), "a drop is no version of the view");
        assert_eq!(lake.view_versions("old").await.unwrap().iter().map(|v| v.version).collect::<Vec<_>>(), [1, 2]);
        assert!(lake.drop_view("old").await.is_err());
        let refused = lake.begin("old").await.unwrap_err().to_string();
        assert!(refused.contains("was a view, dropped, whose versions stay readable (old@1, old@2)"), "{refused}");
        // A dataset that took a dropped view's name before such names were kept keeps it.
        let taken = lake.begin("taken").await.unwrap();
        let dir = taken.dir().to_string();
        taken.commit(record("taken", 0, &dir)).await.unwrap();
        std::fs::create_dir_all(lake.root.join("views/taken")).unwrap();
        let dropped = ViewRecord { version: 1, dropped: true, ..view("taken", "") };
        std::fs::write(lake.root.join("views/taken/v00000001.json"), serde_json::to_vec(&dropped).unwrap()).unwrap();
        lake.begin("taken").await.expect("its next version").abort().await.unwrap();
        assert_eq!(lake.put_view(&view("old", "q4"), false).await.unwrap(), 4);
        assert_eq!(lake.put_view(&view("new", "q"), false).await.unwrap(), 1);
        let names: Vec<_> = lake.views().await.unwrap().into_iter().map(|v| (v.name, v.version)).collect();
        assert_eq!(names, [("new".to_string(), 1), ("old".to_string(), 4)]);
        assert!(lake.begin("new").await.unwrap_err().to_string().contains("is a view"));
        assert!(lake.resolve("new").await.unwrap_err().to_string().contains("is a view, and this takes a dataset"));
    }
}
