//! A local read-through cache of a lake's table data on an object store (`--object-cache DIR
//! --object-cache-gb N`): the first read of a Lance data file fetches it whole into DIR, later
//! reads (the next epoch's, another process's) are served from there. Data files are written
//! once and never changed (a table's new version writes new files), so a cached file never goes
//! stale; manifests and the catalog are always read from the store. The cache holds at most its
//! budget in bytes, least recently used files out first.

use std::{
    collections::HashMap,
    fmt,
    io::Write,
    path::{Path as FsPath, PathBuf},
    sync::{Arc, Mutex},
};

use bytes::Bytes;
use futures::stream::BoxStream;
use object_store::{
    CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta, ObjectStore, ObjectStoreExt,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, Result, path::Path,
};

/// Where the cache lives and how much it may hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheSettings {
    /// The cache's directory (made when missing).
    pub dir: PathBuf,
    /// Bytes it may hold.
    pub budget: u64,
}

/// The files held, shared by every store of the process.
#[derive(Debug)]
pub struct ObjectCache {
    settings: CacheSettings,
    index: Mutex<Index>,
}

#[derive(Debug, Default)]
struct Index {
    /// File name → (bytes, last use).
    files: HashMap<String, (u64, u64)>,
    bytes: u64,
    clock: u64,
}

impl ObjectCache {
    /// The cache in `settings.dir`, with the files a previous process left there.
    ///
    /// # Errors
    /// When the directory cannot be made or listed.
    pub fn open(settings: CacheSettings) -> std::io::Result<Arc<Self>> {
        std::fs::create_dir_all(&settings.dir)?;
        let mut index = Index::default();
        for entry in std::fs::read_dir(&settings.dir)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            // Files written by a process that died before renaming them.
            if name.ends_with(".part") {
                let _ = std::fs::remove_file(entry.path());
                continue;
            }
            let bytes = entry.metadata()?.len();
            index.clock += 1;
            index.files.insert(name, (bytes, index.clock));
            index.bytes += bytes;
        }
        let cache = Arc::new(Self { settings, index: Mutex::new(index) });
        cache.evict(0);
        Ok(cache)
    }

    /// Bytes held now.
    pub fn bytes(&self) -> u64 {
        self.index.lock().expect("not poisoned").bytes
    }

    /// The cache's file name of `location` in the store named `store`.
    fn name(store: &str, location: &Path) -> String {
        format!("{}.lance", blake3::hash(format!("{store}\n{location}").as_bytes()).to_hex())
    }

    /// The path of a held file, marked as just used.
    fn hit(&self, name: &str) -> Option<PathBuf> {
        let mut index = self.index.lock().expect("not poisoned");
        index.clock += 1;
        let clock = index.clock;
        let entry = index.files.get_mut(name)?;
        entry.1 = clock;
        Some(self.settings.dir.join(name))
    }

    /// Stores `data` as `name`, making room for it; `false` when it is larger than the budget.
    fn insert(&self, name: &str, data: &[u8]) -> std::io::Result<bool> {
        let size = data.len() as u64;
        if size > self.settings.budget {
            return Ok(false);
        }
        self.evict(size);
        let part = self.settings.dir.join(format!("{name}.{}.part", std::process::id()));
        let mut file = std::fs::File::create(&part)?;
        file.write_all(data)?;
        std::fs::rename(&part, self.settings.dir.join(name))?;
        let mut index = self.index.lock().expect("not poisoned");
        index.clock += 1;
        let clock = index.clock;
        if let Some((old, _)) = index.files.insert(name.to_string(), (size, clock)) {
            index.bytes -= old;
        }
        index.bytes += size;
        Ok(true)
    }

    /// Deletes least recently used files until `room` more bytes fit in the budget.
    fn evict(&self, room: u64) {
        let mut index = self.index.lock().expect("not poisoned");
        while index.bytes + room > self.settings.budget {
            let Some(oldest) = index.files.iter().min_by_key(|(_, (_, used))| *used).map(|(name, _)| name.clone()) else { break };
            let (bytes, _) = index.files.remove(&oldest).expect("listed");
            index.bytes -= bytes;
            let _ = std::fs::remove_file(self.settings.dir.join(&oldest));
        }
    }
}

/// Whether `location` is a Lance data file: written once, never changed.
fn immutable(location: &Path) -> bool {
    let text = location.as_ref();
    text.ends_with(".lance") && text.contains(".lance/data/")
}

/// A store whose reads of Lance data files go through an [`ObjectCache`].
#[derive(Debug)]
pub struct CachedStore {
    inner: Arc<dyn ObjectStore>,
    /// Names the store (its URL's scheme and bucket) in cache keys.
    store: String,
    cache: Arc<ObjectCache>,
}

impl CachedStore {
    /// `inner` (the store of bucket `store`, e.g. `s3://bucket`) read through `cache`.
    pub fn new(inner: Arc<dyn ObjectStore>, store: String, cache: Arc<ObjectCache>) -> Self {
        Self { inner, store, cache }
    }

    /// The bytes `options` ask for of the held file `path`, as a store answers them.
    fn answer(path: &FsPath, location: &Path, options: &GetOptions) -> Result<GetResult> {
        let fail = |e: std::io::Error| object_store::Error::Generic { store: "object cache", source: Box::new(e) };
        let data = std::fs::read(path).map_err(fail)?;
        let len = data.len() as u64;
        let meta = ObjectMeta {
            location: location.clone(),
            last_modified: chrono::DateTime::<chrono::Utc>::UNIX_EPOCH,
            size: len,
            e_tag: None,
            version: None,
        };
        let range = match &options.range {
            Some(r) => r.as_range(len).map_err(|e| object_store::Error::Generic { store: "object cache", source: Box::new(e) })?,
            None => 0..len,
        };
        let bytes = Bytes::from(data).slice(range.start as usize..range.end as usize);
        let payload = match options.head {
            true => futures::StreamExt::boxed(futures::stream::empty()),
            false => futures::StreamExt::boxed(futures::stream::once(async move { Ok(bytes) })),
        };
        Ok(GetResult {
            payload: GetResultPayload::Stream(payload),
            meta,
            range,
            attributes: Default::default(),
            extensions: Default::default(),
        })
    }
}

impl fmt::Display for CachedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (read through {})", self.inner, self.cache.settings.dir.display())
    }
}

#[async_trait::async_trait]
impl ObjectStore for CachedStore {
    async fn put_opts(&self, location: &Path, payload: PutPayload, opts: PutOptions) -> Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(&self, location: &Path, opts: PutMultipartOptions) -> Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        let plain = options.if_match.is_none()
            && options.if_none_match.is_none()
            && options.if_modified_since.is_none()
            && options.if_unmodified_since.is_none()
            && options.version.is_none();
        if !(plain && immutable(location)) {
            return self.inner.get_opts(location, options).await;
        }
        let name = ObjectCache::name(&self.store, location);
        if let Some(path) = self.cache.hit(&name)
            && let Ok(answer) = Self::answer(&path, location, &options)
        {
            return Ok(answer);
        }
        // A miss: the whole file, kept, then the part asked for.
        let data = self.inner.get(location).await?.bytes().await?;
        let fail = |e: std::io::Error| object_store::Error::Generic { store: "object cache", source: Box::new(e) };
        if self.cache.insert(&name, &data).map_err(fail)?
            && let Some(path) = self.cache.hit(&name)
            && let Ok(answer) = Self::answer(&path, location, &options)
        {
            return Ok(answer);
        }
        // Larger than the budget (or evicted at once by another insert): read as it is.
        self.inner.get_opts(location, options).await
    }

    fn delete_stream(&self, locations: BoxStream<'static, Result<Path>>) -> BoxStream<'static, Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn data_files_are_read_once_then_served_locally_within_the_budget() {
        let tmp = tempfile::tempdir().unwrap();
        let inner: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let data = |n: u8, len: usize| Bytes::from(vec![n; len]);
        let (a, b, manifest) =
            (Path::from("t.lance/data/a.lance"), Path::from("t.lance/data/b.lance"), Path::from("t.lance/_versions/1.manifest"));
        for (p, d) in [(&a, data(1, 600)), (&b, data(2, 600)), (&manifest, data(3, 10))] {
            inner.put(p, d.into()).await.unwrap();
        }
        let cache = ObjectCache::open(CacheSettings { dir: tmp.path().join("cache"), budget: 1000 }).unwrap();
        let store = CachedStore::new(inner.clone(), "memory://".into(), cache.clone());
        let got = store.get_range(&a, 10..20).await.unwrap();
        assert_eq!(got, data(1, 10));
        assert_eq!(cache.bytes(), 600, "the whole file is kept");
        // Gone from the store, still served: the next read is local.
        inner.delete(&a).await.unwrap();
        assert_eq!(store.get_range(&a, 590..600).await.unwrap(), data(1, 10));
        assert_eq!(store.get(&a).await.unwrap().bytes().await.unwrap(), data(1, 600));
        // A second file does not fit beside the first: the least recently used goes.
        assert_eq!(store.get_range(&b, 0..5).await.unwrap(), data(2, 5));
        assert_eq!(cache.bytes(), 600);
        assert!(store.get_range(&a, 0..1).await.is_err(), "evicted, and gone from the store");
        // Manifests are always read from the store.
        inner.put(&manifest, data(4, 10).into()).await.unwrap();
        assert_eq!(store.get(&manifest).await.unwrap().bytes().await.unwrap(), data(4, 10));
        // Another process finds what this one kept.
        let again = ObjectCache::open(CacheSettings { dir: tmp.path().join("cache"), budget: 1000 }).unwrap();
        assert_eq!(again.bytes(), 600);
        let store = CachedStore::new(inner.clone(), "memory://".into(), again);
        inner.delete(&b).await.unwrap();
        assert_eq!(store.get_range(&b, 1..3).await.unwrap(), data(2, 2));
    }
}
