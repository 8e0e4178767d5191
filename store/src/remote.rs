//! Lakes and sources on object stores: S3 and S3-compatible servers (`s3://bucket/prefix`), Google
//! Cloud Storage (`gs://`) and Azure Blob Storage (`az://`).
//!
//! Stores are object_store's own clients, configured from the environment as each cloud's tools
//! are (`AWS_ENDPOINT_URL`, `AWS_REGION`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
//! `AWS_SESSION_TOKEN`, `AWS_ALLOW_HTTP`; `GOOGLE_SERVICE_ACCOUNT`; `AZURE_STORAGE_ACCOUNT_NAME`,
//! …), with transient errors (5xx, timeouts, reset connections) retried with backoff
//! (`OBJECT_STORE_CLIENT_MAX_RETRIES`, `OBJECT_STORE_CLIENT_RETRY_TIMEOUT` seconds). Lance opens
//! and commits tables through the same clients: lake registers them with Lance for their schemes
//! ([`session`]), and Lance commits a table version with a conditional put, as the catalog
//! commits its records, so nothing relies on rename.

use std::{
    sync::{Arc, OnceLock},
    time::Duration,
};

use lance::{
    io::{ObjectStoreParams, ObjectStoreRegistry},
    session::Session,
};
use object_store::{ObjectStore, RetryConfig, path::Path};
use url::Url;

use crate::{Error, Result};

/// URL schemes of the object stores lake reads and writes.
pub const SCHEMES: [&str; 3] = ["s3", "gs", "az"];

/// Whether `location` is a URL of an object store lake can use.
pub fn is_remote(location: &str) -> bool {
    location.split_once("://").is_some_and(|(scheme, _)| SCHEMES.contains(&scheme))
}

/// A location on an object store, parsed: the store of its bucket (or container), and the
/// prefix inside it.
#[derive(Debug, Clone)]
pub struct Remote {
    /// The location without a trailing `/` (`s3://bucket/prefix`).
    pub url: String,
    /// The store of the bucket.
    pub store: Arc<dyn ObjectStore>,
    /// The prefix inside the bucket (empty for the bucket's root).
    pub prefix: Path,
}

impl Remote {
    /// Parses `location` and builds its store from the environment.
    ///
    /// # Errors
    /// [`Error::Root`] when the location is not a URL of a known store, has no bucket, or the
    /// store cannot be configured (a missing region, malformed credentials).
    pub fn parse(location: &str) -> Result<Self> {
        let err = |message: String| Error::Root { root: location.to_string(), message };
        let trimmed = location.trim_end_matches('/');
        let url = Url::parse(trimmed).map_err(|e| err(format!("not a URL: {e}")))?;
        if url.host_str().is_none_or(str::is_empty) {
            return Err(err(format!("names no bucket ({}://BUCKET/PREFIX)", url.scheme())));
        }
        let store = store_for(&url).map_err(|e| err(e.to_string()))?;
        let prefix = Path::from_url_path(url.path()).map_err(|e| err(format!("bad path: {e}")))?;
        Ok(Self { url: trimmed.to_string(), store, prefix })
    }

    /// The URL of `relative` (a path below the location).
    pub fn join(&self, relative: &str) -> String {
        match relative.trim_start_matches('/') {
            "" | "." => self.url.clone(),
            rel => format!("{}/{rel}", self.url),
        }
    }

    /// How the files Lance writes at `relative` are named among the digests of what was sent.
    pub(crate) fn sent_key(&self, relative: &str) -> String {
        let url = Url::parse(&self.url).expect("parsed when the remote was made");
        crate::sent_digests::key(&bucket_name(&url), &Path::from(format!("{}/{relative}", self.prefix)))
    }
}

/// Copies the files under the local directory `dir` to the object store prefix `to` (each
/// under its path relative to `dir`), streaming each file in parts, and returns the bytes
/// copied. Refuses a prefix that holds objects already; when a copy fails, the objects it wrote
/// are deleted again.
///
/// # Errors
/// [`Error::Root`] for a prefix that is not empty or cannot be reached; the store's error,
/// naming the object, when a copy fails.
pub async fn upload_dir(dir: &std::path::Path, to: &str) -> Result<u64> {
    use object_store::ObjectStoreExt;
    let remote = Remote::parse(to)?;
    let root_err = |message: String| Error::Root { root: to.to_string(), message };
    let occupied = futures::TryStreamExt::try_next(&mut remote.store.list(Some(&remote.prefix)))
        .await
        .map_err(|e| root_err(format!("cannot list it: {}", crate::error::store_message(&e))))?
        .is_some();
    if occupied {
        return Err(root_err("holds objects already; choose a new or empty prefix".into()));
    }
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        for entry in std::fs::read_dir(&d).map_err(|e| root_err(format!("reading {}: {e}", d.display())))? {
            let entry = entry.map_err(|e| root_err(format!("reading {}: {e}", d.display())))?;
            match entry.file_type() {
                Ok(t) if t.is_dir() => pending.push(entry.path()),
                Ok(_) => files.push(entry.path()),
                Err(e) => return Err(root_err(format!("reading {}: {e}", entry.path().display()))),
            }
        }
    }
    files.sort();
    let mut written = Vec::new();
    let mut bytes = 0;
    for file in &files {
        let relative = file.strip_prefix(dir).expect("under dir").to_string_lossy().into_owned();
        let key = Path::from(format!("{}/{relative}", remote.prefix).trim_start_matches('/'));
        written.push(key.clone());
        let copied = async {
            let mut reader = tokio::fs::File::open(file).await.map_err(|e| root_err(format!("reading {}: {e}", file.display())))?;
            let mut writer = object_store::buffered::BufWriter::new(remote.store.clone(), key.clone());
            let n = tokio::io::copy(&mut reader, &mut writer)
                .await
                .map_err(|e| root_err(format!("writing {}: {e}", remote.join(&relative))))?;
            tokio::io::AsyncWriteExt::shutdown(&mut writer)
                .await
                .map_err(|e| root_err(format!("writing {}: {e}", remote.join(&relative))))?;
            Ok::<u64, Error>(n)
        }
        .await;
        match copied {
            Ok(n) => bytes += n,
            Err(e) => {
                for key in &written {
                    let _ = remote.store.delete(key).await;
                }
                return Err(e);
            }
        }
    }
    Ok(bytes)
}

/// Whether `location` is a dataset served over HTTP(S) (`http://`, `https://`, or the Hugging
/// Face Hub's `hf://datasets/OWNER/NAME`): a read-only source.
pub fn is_http(location: &str) -> bool {
    location.split_once("://").is_some_and(|(scheme, _)| matches!(scheme, "http" | "https" | "hf"))
}

/// The HTTPS URL of a dataset on the Hugging Face Hub, `hf://datasets/OWNER/NAME[@REVISION]`
/// (revision `main` unless given): where the Hub serves the files of that revision.
///
/// # Errors
/// When the location is not of that form.
pub fn hub_url(location: &str) -> std::result::Result<String, String> {
    let rest = location.strip_prefix("hf://").ok_or_else(|| "not an hf:// location".to_string())?;
    let rest = rest.trim_end_matches('/');
    let form = "hf://datasets/OWNER/NAME[@REVISION]";
    let Some(repo) = rest.strip_prefix("datasets/") else {
        return Err(format!("names no dataset repository ({form})"));
    };
    let (repo, revision) = repo.split_once('@').unwrap_or((repo, "main"));
    let parts: Vec<&str> = repo.split('/').collect();
    let plain = |p: &str| !p.is_empty() && p.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) && p != "." && p != "..";
    if parts.len() != 2 || !parts.iter().all(|p| plain(p)) || revision.is_empty() || revision.contains(['/', '?', '#']) {
        return Err(format!("is not {form}"));
    }
    Ok(format!("https://huggingface.co/datasets/{repo}/resolve/{revision}"))
}

/// The store of a dataset served over HTTP(S) at `location` (`hf://` is the Hub's URL, see
/// [`hub_url`]): its files are read with HEAD and ranged GET requests below that URL, retried as
/// object stores' are. Listing needs a WebDAV server (`PROPFIND`); a plain web server answers
/// reads only.
///
/// # Errors
/// What is wrong, naming the location, when it is not such a URL.
pub fn http_store(location: &str) -> std::result::Result<Arc<dyn ObjectStore>, String> {
    let err = |message: String| format!("`{location}` {message}");
    let url = if location.starts_with("hf://") { hub_url(location).map_err(err)? } else { location.trim_end_matches('/').to_string() };
    let parsed = Url::parse(&url).map_err(|e| err(format!("not a URL: {e}")))?;
    if parsed.host_str().is_none_or(str::is_empty) || parsed.query().is_some() || parsed.fragment().is_some() {
        return Err(err("names no host, or has a query or fragment: give the URL of the dataset's directory".into()));
    }
    install_crypto();
    let options = object_store::ClientOptions::new().with_allow_http(parsed.scheme() == "http");
    let store = object_store::http::HttpBuilder::new()
        .with_url(url)
        .with_retry(retry_config())
        .with_client_options(options)
        .build()
        .map_err(|e| err(e.to_string()))?;
    Ok(Arc::new(store))
}

/// How many times a request is retried, and for how long: object_store's defaults, or the
/// environment's `OBJECT_STORE_CLIENT_MAX_RETRIES` and `OBJECT_STORE_CLIENT_RETRY_TIMEOUT`
/// (seconds), the names Lance reads too.
fn retry_config() -> RetryConfig {
    let mut retry = RetryConfig::default();
    if let Some(n) = std::env::var("OBJECT_STORE_CLIENT_MAX_RETRIES").ok().and_then(|v| v.parse().ok()) {
        retry.max_retries = n;
    }
    if let Some(s) = std::env::var("OBJECT_STORE_CLIENT_RETRY_TIMEOUT").ok().and_then(|v| v.parse::<f64>().ok()) {
        retry.retry_timeout = Duration::from_secs_f64(s.max(0.0));
    }
    retry
}

/// The process's read-through cache of table data, once [`use_object_cache`] set it.
static OBJECT_CACHE: OnceLock<Arc<crate::object_cache::ObjectCache>> = OnceLock::new();

/// Reads Lance data files of every object store through a local cache from now on
/// ([`crate::object_cache`]); set once, before the first store is made.
///
/// # Errors
/// When the cache's directory cannot be made or read, or a cache was set already.
pub fn use_object_cache(settings: crate::object_cache::CacheSettings) -> std::io::Result<()> {
    let cache = crate::object_cache::ObjectCache::open(settings)?;
    OBJECT_CACHE.set(cache).map_err(|_| std::io::Error::other("the object cache is set once per process"))
}

/// The store of the bucket (container) `url` names, configured from the environment, read
/// through the object cache when there is one.
fn store_for(url: &Url) -> object_store::Result<Arc<dyn ObjectStore>> {
    let store = client_for(url)?;
    Ok(match OBJECT_CACHE.get() {
        Some(cache) => Arc::new(crate::object_cache::CachedStore::new(store, bucket_name(url), cache.clone())),
        None => store,
    })
}

/// `scheme://bucket` of a location on an object store.
fn bucket_name(url: &Url) -> String {
    format!("{}://{}", url.scheme(), url.host_str().unwrap_or_default())
}

/// The client of the bucket (container) `url` names, configured from the environment.
fn client_for(url: &Url) -> object_store::Result<Arc<dyn ObjectStore>> {
    install_crypto();
    Ok(match url.scheme() {
        "s3" => {
            let mut builder = object_store::aws::AmazonS3Builder::from_env().with_url(url.as_str()).with_retry(retry_config());
            // An S3-compatible server named by AWS_ENDPOINT_URL is usually reached by path.
            if std::env::var_os("AWS_ENDPOINT_URL").is_some() || std::env::var_os("AWS_ENDPOINT").is_some() {
                builder = builder.with_virtual_hosted_style_request(false);
            }
            Arc::new(builder.build()?)
        }
        "gs" => {
            Arc::new(object_store::gcp::GoogleCloudStorageBuilder::from_env().with_url(url.as_str()).with_retry(retry_config()).build()?)
        }
        "az" => Arc::new(object_store::azure::MicrosoftAzureBuilder::from_env().with_url(url.as_str()).with_retry(retry_config()).build()?),
        other => {
            return Err(object_store::Error::NotSupported {
                source: format!("`{other}://` is not an object store lake can use (s3://, gs://, az://)").into(),
            });
        }
    })
}

/// Makes ring rustls' default crypto provider, once: the HTTP client is built without one.
fn install_crypto() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        // Another part of the process may have installed one first; either serves.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// Lance's access to the object stores, through lake's clients.
#[derive(Debug)]
struct Provider;

#[async_trait::async_trait]
impl lance_io::object_store::ObjectStoreProvider for Provider {
    async fn new_store(&self, base: Url, params: &ObjectStoreParams) -> lance::Result<lance::io::ObjectStore> {
        let store = store_for(&base).map_err(|e| lance::Error::invalid_input(format!("{base}: {e}")))?;
        // What Lance writes is hashed as it is sent, for the commit record's digests.
        let store = Arc::new(crate::sent_digests::SentDigests::new(store, bucket_name(&base)));
        Ok(lance::io::ObjectStore::new(
            store,
            base,
            params.block_size,
            params.object_store_wrapper.clone(),
            params.use_constant_size_upload_parts,
            // Object stores list keys in lexical order.
            params.list_is_lexically_ordered.unwrap_or(true),
            lance_io_parallelism(),
            DOWNLOAD_RETRIES,
            None,
        ))
    }
}

/// Reads in flight per store: Lance's default for cloud stores.
fn lance_io_parallelism() -> usize {
    64
}

/// Retries of a download whose body broke off: Lance's default.
const DOWNLOAD_RETRIES: usize = 3;

/// The Lance session every table on an object store is opened and written with: Lance's
/// default caches, and lake's clients for [`SCHEMES`].
pub fn session() -> Arc<Session> {
    static SESSION: OnceLock<Arc<Session>> = OnceLock::new();
    SESSION
        .get_or_init(|| {
            let registry = ObjectStoreRegistry::default();
            for scheme in SCHEMES {
                registry.insert(scheme, Arc::new(Provider));
            }
            Arc::new(Session::new(
                lance::dataset::DEFAULT_INDEX_CACHE_SIZE,
                lance::dataset::DEFAULT_METADATA_CACHE_SIZE,
                Arc::new(registry),
            ))
        })
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_store_urls_are_told_from_paths_and_parsed_with_their_prefix() {
        assert!(is_remote("s3://bucket/lake") && is_remote("gs://b") && is_remote("az://c/p"));
        assert!(!is_remote("/data/lake") && !is_remote("file:///data/lake") && !is_remote("http://host/lake") && !is_remote("lake"));
        let remote = Remote::parse("s3://bucket/some/lake/").expect("parses");
        assert_eq!((remote.url.as_str(), remote.prefix.as_ref()), ("s3://bucket/some/lake", "some/lake"));
        assert_eq!(remote.join("catalog/a/v00000001.json"), "s3://bucket/some/lake/catalog/a/v00000001.json");
        assert_eq!(remote.join("."), "s3://bucket/some/lake");
        let err = Remote::parse("s3:///lake").unwrap_err().to_string();
        assert!(err.contains("names no bucket"), "{err}");
    }

    #[test]
    fn http_sources_are_told_apart_and_hub_datasets_name_their_files_url() {
        assert!(is_http("http://127.0.0.1:8080/d") && is_http("https://host/d") && is_http("hf://datasets/lerobot/pusht"));
        assert!(!is_http("s3://b/d") && !is_http("/data/d") && !is_http("file:///d"));
        assert_eq!(hub_url("hf://datasets/lerobot/pusht").as_deref(), Ok("https://huggingface.co/datasets/lerobot/pusht/resolve/main"));
        assert_eq!(
            hub_url("hf://datasets/lerobot/aloha_sim_insertion_human@v3.0/").as_deref(),
            Ok("https://huggingface.co/datasets/lerobot/aloha_sim_insertion_human/resolve/v3.0")
        );
        for bad in ["hf://lerobot/pusht", "hf://datasets/lerobot", "hf://datasets/a/b/c", "hf://datasets/../b", "hf://datasets/a/b@"] {
            assert!(hub_url(bad).is_err(), "{bad}");
        }
        assert!(http_store("https://host/d?x=1").is_err());
        assert!(http_store("http://127.0.0.1:1/d").is_ok());
    }
}
