//! Digests of the files written to an object store, taken from the bytes as they are sent.
//!
//! An ingest records every table file's size and BLAKE3 digest in its commit record, for `lake
//! verify`. On a local disk it reads the files back from the page cache; on an object store that
//! would be a second transfer of every byte it wrote. Instead, every store lake gives Lance is a
//! [`SentDigests`] layer: while a [`Watch`] is held over a prefix (a pending version's
//! directory), each file written under it is hashed as its bytes go out (a single put whole, a
//! multipart upload part by part, in the order its parts are numbered), and the digest is kept
//! once the store confirms the write. [`sent`] hands it out; a file written some other way (or
//! whose write's answer was lost) has none, and is read back as before.

use std::{
    collections::HashMap,
    fmt,
    sync::{Arc, Mutex},
};

use futures::stream::BoxStream;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore, PutMultipartOptions, PutOptions, PutPayload,
    PutResult, RenameOptions, Result, UploadPart, path::Path,
};

/// A file's size in bytes and its `blake3:<hex>` digest.
pub(crate) type Sent = (u64, String);

/// The prefixes watched, and the digests of the files written under them.
#[derive(Default)]
struct Watched {
    prefixes: Vec<String>,
    sent: HashMap<String, Sent>,
}

fn watched() -> std::sync::MutexGuard<'static, Watched> {
    static WATCHED: std::sync::OnceLock<Mutex<Watched>> = std::sync::OnceLock::new();
    // (A panic while it was held cannot leave it inconsistent: each change is one insert or
    // removal.)
    WATCHED.get_or_init(Mutex::default).lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Whether the file `key` is under a watched prefix.
fn is_watched(key: &str) -> bool {
    watched().prefixes.iter().any(|p| key.strip_prefix(p.as_str()).is_some_and(|rest| rest.starts_with('/')))
}

/// Keeps the digests of the files written under a prefix while it lives; dropped, it forgets them.
#[derive(Debug)]
pub(crate) struct Watch {
    prefix: String,
}

impl Watch {
    /// Watches `prefix`: `store://bucket/path`, as [`key`] names files.
    pub(crate) fn new(prefix: String) -> Self {
        watched().prefixes.push(prefix.clone());
        Self { prefix }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let mut watched = watched();
        if let Some(at) = watched.prefixes.iter().position(|p| *p == self.prefix) {
            watched.prefixes.swap_remove(at);
        }
        if !watched.prefixes.contains(&self.prefix) {
            let under = format!("{}/", self.prefix);
            watched.sent.retain(|key, _| !key.starts_with(&under));
        }
    }
}

/// The size and digest of the file `key` as it was written, when it was written under a watched
/// prefix through a [`SentDigests`] store.
pub(crate) fn sent(key: &str) -> Option<Sent> {
    watched().sent.get(key).cloned()
}

/// How a file is named here: the store's `scheme://bucket`, then its path in the bucket.
pub(crate) fn key(store: &str, location: &Path) -> String {
    format!("{store}/{location}")
}

fn record(key: String, sent: Sent) {
    let mut watched = watched();
    let under = watched.prefixes.iter().any(|p| key.strip_prefix(p.as_str()).is_some_and(|rest| rest.starts_with('/')));
    if under {
        watched.sent.insert(key, sent);
    }
}

fn forget(key: &str) {
    watched().sent.remove(key);
}

fn digest(hasher: &blake3::Hasher) -> Sent {
    (hasher.count(), format!("blake3:{}", hasher.finalize().to_hex()))
}

/// A store whose writes under watched prefixes are hashed as they are sent.
#[derive(Debug)]
pub(crate) struct SentDigests {
    inner: Arc<dyn ObjectStore>,
    /// `scheme://bucket`.
    name: String,
}

impl SentDigests {
    pub(crate) fn new(inner: Arc<dyn ObjectStore>, name: String) -> Self {
        Self { inner, name }
    }
}

impl fmt::Display for SentDigests {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt(f)
    }
}

#[async_trait::async_trait]
impl ObjectStore for SentDigests {
    async fn put_opts(&self, location: &Path, payload: PutPayload, opts: PutOptions) -> Result<PutResult> {
        let key = key(&self.name, location);
        if !is_watched(&key) {
            return self.inner.put_opts(location, payload, opts).await;
        }
        let mut hasher = blake3::Hasher::new();
        for chunk in payload.iter() {
            hasher.update(chunk);
        }
        // A failed put may still have replaced the file (its answer lost): no digest then.
        forget(&key);
        let written = self.inner.put_opts(location, payload, opts).await?;
        record(key, digest(&hasher));
        Ok(written)
    }

    async fn put_multipart_opts(&self, location: &Path, opts: PutMultipartOptions) -> Result<Box<dyn MultipartUpload>> {
        let key = key(&self.name, location);
        let upload = self.inner.put_multipart_opts(location, opts).await?;
        if !is_watched(&key) {
            return Ok(upload);
        }
        forget(&key);
        Ok(Box::new(HashedUpload { inner: upload, key, hasher: blake3::Hasher::new() }))
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        self.inner.get_opts(location, options).await
    }

    async fn get_ranges(&self, location: &Path, ranges: &[std::ops::Range<u64>]) -> Result<Vec<bytes::Bytes>> {
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(&self, locations: BoxStream<'static, Result<Path>>) -> BoxStream<'static, Result<Path>> {
        let name = self.name.clone();
        let locations = futures::StreamExt::boxed(futures::StreamExt::map(locations, move |location| {
            if let Ok(location) = &location {
                forget(&key(&name, location));
            }
            location
        }));
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    fn list_with_offset(&self, prefix: Option<&Path>, offset: &Path) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        let to_key = key(&self.name, to);
        forget(&to_key);
        self.inner.copy_opts(from, to, options).await?;
        if let Some(sent) = sent(&key(&self.name, from)) {
            record(to_key, sent);
        }
        Ok(())
    }

    async fn rename_opts(&self, from: &Path, to: &Path, options: RenameOptions) -> Result<()> {
        let (from_key, to_key) = (key(&self.name, from), key(&self.name, to));
        let moved = sent(&from_key);
        forget(&to_key);
        self.inner.rename_opts(from, to, options).await?;
        forget(&from_key);
        if let Some(sent) = moved {
            record(to_key, sent);
        }
        Ok(())
    }
}

/// A multipart upload hashed part by part, in the order the parts are numbered (the order
/// `put_part` is called in, whichever part's request finishes first).
#[derive(Debug)]
struct HashedUpload {
    inner: Box<dyn MultipartUpload>,
    key: String,
    hasher: blake3::Hasher,
}

#[async_trait::async_trait]
impl MultipartUpload for HashedUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        for chunk in data.iter() {
            self.hasher.update(chunk);
        }
        self.inner.put_part(data)
    }

    async fn complete(&mut self) -> Result<PutResult> {
        let written = self.inner.complete().await?;
        record(self.key.clone(), digest(&self.hasher));
        Ok(written)
    }

    async fn abort(&mut self) -> Result<()> {
        self.inner.abort().await
    }
}

#[cfg(test)]
mod tests {
    use object_store::{ObjectStoreExt, memory::InMemory};

    use super::*;

    async fn stored(store: &InMemory, path: &Path) -> Sent {
        let bytes = store.get(path).await.unwrap().bytes().await.unwrap();
        (bytes.len() as u64, format!("blake3:{}", blake3::hash(&bytes).to_hex()))
    }

    #[tokio::test]
    async fn files_written_under_a_watched_prefix_have_the_digest_of_what_the_store_holds() {
        let inner = Arc::new(InMemory::new());
        let store = SentDigests::new(inner.clone(), "memory://one".into());
        let watch = Watch::new("memory://one/lake/datasets/d/v1".into());
        let (small, large, elsewhere, beside) = (
            Path::from("lake/datasets/d/v1/t.lance/_versions/1.manifest"),
            Path::from("lake/datasets/d/v1/t.lance/data/a.lance"),
            Path::from("lake/datasets/d/v2/t.lance/data/a.lance"),
            Path::from("lake/datasets/d/v10/t.lance/data/a.lance"),
        );
        store.put(&small, PutPayload::from_iter([bytes::Bytes::from_static(b"mani"), bytes::Bytes::from_static(b"fest")])).await.unwrap();
        let mut upload = store.put_multipart(&large).await.unwrap();
        for part in 0..3u8 {
            upload.put_part(vec![part; 5000 + usize::from(part)].into()).await.unwrap();
        }
        upload.complete().await.unwrap();
        for path in [&elsewhere, &beside] {
            store.put(path, b"not watched".to_vec().into()).await.unwrap();
        }
        for path in [&small, &large] {
            assert_eq!(sent(&key("memory://one", path)), Some(stored(&inner, path).await), "{path}");
        }
        assert_eq!(sent(&key("memory://one", &elsewhere)), None, "another version's files are not watched");
        assert_eq!(sent(&key("memory://one", &beside)), None, "nor those of a directory whose name begins the same");
        assert_eq!(sent(&key("memory://other", &small)), None, "nor those of another bucket");

        // A copy or a rename carries the digest; a delete, or an upload not completed, leaves none.
        let (copied, renamed) = (Path::from("lake/datasets/d/v1/t.lance/b"), Path::from("lake/datasets/d/v1/t.lance/c"));
        store.copy(&small, &copied).await.unwrap();
        store.rename(&copied, &renamed).await.unwrap();
        assert_eq!(sent(&key("memory://one", &renamed)), Some(stored(&inner, &small).await));
        assert_eq!(sent(&key("memory://one", &copied)), None);
        store.delete(&renamed).await.unwrap();
        assert_eq!(sent(&key("memory://one", &renamed)), None);
        let mut upload = store.put_multipart(&large).await.unwrap();
        upload.put_part(vec![9; 10].into()).await.unwrap();
        upload.abort().await.unwrap();
        assert_eq!(sent(&key("memory://one", &large)), None, "a file being written again has no digest until it is");

        drop(watch);
        assert_eq!(sent(&key("memory://one", &small)), None, "an ended watch forgets its files");
        store.put(&small, b"again".to_vec().into()).await.unwrap();
        assert_eq!(sent(&key("memory://one", &small)), None);
    }
}
