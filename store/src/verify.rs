//! Digests of a version's table files: recorded by the ingest that writes them, in the commit
//! record, and checked against the files by `lake verify`.
//!
//! Lance checks no checksum of its own when it reads a page, so a byte changed inside a table
//! (a failing disk, a copy gone wrong) is read as a different value. A committed table is never
//! written again, so the digest of each of its files, taken once at ingest, tells any later
//! change apart: a file gone, cut short, grown, changed in place, or added beside them.

use std::collections::BTreeMap;

use futures::{StreamExt, TryStreamExt, stream};
use lake_schemas::{CommitRecord, TableFile, ViewRecord};
use object_store::{ObjectStoreExt, path::Path};

use crate::{Error, Lake, Result, record_digest::record_digest};

/// One file of a committed version that is not as its ingest wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileDamage {
    /// The table the file belongs to.
    pub table: String,
    /// The file's path relative to the version's directory (`steps.lance/data/….lance`).
    pub path: String,
    /// What differs.
    pub why: String,
}

/// What [`Lake::verify_tables`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verification {
    /// Files read.
    pub files: u64,
    /// Bytes read.
    pub bytes: u64,
    /// The files that differ from what was written.
    pub damage: Vec<FileDamage>,
    /// The version was committed before lake recorded digests: only the sizes Lance keeps of
    /// its data files were checked.
    pub sizes_only: bool,
    /// What is wrong with the commit record itself: its fields changed after it was committed
    /// (`None`: as committed, or committed before records had digests).
    pub record: Option<String>,
}

impl Verification {
    /// Whether anything checked differs from what was written.
    pub fn is_damaged(&self) -> bool {
        !self.damage.is_empty() || self.record.is_some()
    }
}

impl Lake {
    /// Every file of the tables `tables` in the version directory `dir`, with its size and
    /// digest, sorted by path; `concurrency` files are read at once. On an object store, the
    /// files this process wrote into a version it has not committed yet are not read: their
    /// digests were taken as their bytes were sent.
    ///
    /// # Errors
    /// When the store cannot be listed or a file cannot be read.
    pub async fn table_files(&self, dir: &str, tables: &[String], concurrency: usize) -> Result<Vec<TableFile>> {
        let mut paths = Vec::new();
        for table in tables {
            paths.extend(self.files_of_table(dir, table).await?.into_keys());
        }
        let mut files: Vec<TableFile> = stream::iter(paths)
            .map(|path| async move {
                let relative = format!("{dir}/{path}");
                // On an object store, what was sent while the version was written is not read back.
                let (bytes, blake3) = match self.sent_digest(&relative) {
                    Some(sent) => sent,
                    None => self.digest(&relative).await?,
                };
                Ok::<_, Error>(TableFile { path, bytes, blake3 })
            })
            .buffer_unordered(concurrency.max(1))
            .try_collect()
            .await?;
        files.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(files)
    }

    /// Reads every file of `record`'s tables and compares it with the digest its ingest
    /// recorded; `concurrency` files are read at once. A version whose record holds no digests
    /// gets the check of [`Lake::damaged_tables`] (the data files' sizes) instead.
    ///
    /// # Errors
    /// When the store cannot be listed, or a file that is there cannot be read.
    pub async fn verify_tables(&self, record: &CommitRecord, concurrency: usize) -> Result<Verification> {
        let set = &record.tables;
        let record_damage = self.record_damage(record).await?;
        if set.files.is_empty() {
            let damage = self.damaged_tables(record).await?;
            let damage = damage.into_iter().map(|(table, why)| FileDamage { path: format!("{table}.lance"), table, why }).collect();
            return Ok(Verification { damage, sizes_only: true, record: record_damage, ..Verification::default() });
        }
        let mut present = BTreeMap::new();
        for table in &set.tables {
            present.extend(self.files_of_table(&set.dir, table).await?);
        }
        let table_of = |path: &str| path.split_once(".lance/").map_or(path, |(table, _)| table).to_string();
        let mut damage: Vec<FileDamage> = present
            .keys()
            .filter(|path| set.files.binary_search_by(|f| f.path.as_str().cmp(path)).is_err())
            .map(|path| FileDamage { table: table_of(path), path: path.clone(), why: "the ingest did not write this file".into() })
            .collect();
        let read: Vec<Option<FileDamage>> = stream::iter(&set.files)
            .map(|file| {
                let size = present.get(&file.path).copied();
                async move {
                    let damaged = |why: String| Ok(Some(FileDamage { table: table_of(&file.path), path: file.path.clone(), why }));
                    match size {
                        None => return damaged("it is missing".into()),
                        Some(size) if size != file.bytes => return damaged(format!("it has {size} bytes, {} were written", file.bytes)),
                        Some(_) => {}
                    }
                    let (_, digest) = self.digest(&format!("{}/{}", set.dir, file.path)).await?;
                    if digest == file.blake3 {
                        return Ok(None);
                    }
                    damaged(format!("its bytes are not the ones written ({digest}, {} was recorded)", file.blake3))
                }
            })
            .buffer_unordered(concurrency.max(1))
            .try_collect()
            .await?;
        damage.extend(read.into_iter().flatten());
        damage.sort_by(|a, b| a.path.cmp(&b.path));
        let files = set.files.len() as u64;
        let bytes = set.files.iter().filter(|f| present.get(&f.path) == Some(&f.bytes)).map(|f| f.bytes).sum();
        Ok(Verification { files, bytes, damage, sizes_only: false, record: record_damage })
    }

    /// What is wrong with `record`'s file, read again as it is now: its fields are not those
    /// committed (their digest differs from the one it holds).
    async fn record_damage(&self, record: &CommitRecord) -> Result<Option<String>> {
        let Some(committed) = &record.digest else { return Ok(None) };
        let path = Self::record_path(&record.name, record.version);
        self.fields_changed(&path, committed, "committed").await
    }

    /// What is wrong with the record of `view`'s version, read again as it is now, with the
    /// record's path: it is gone, or its fields are not those written (their digest differs
    /// from the one it holds). `None` for a record written before view records had digests.
    ///
    /// # Errors
    /// When the view's records cannot be listed or read.
    pub async fn view_record_damage(&self, view: &ViewRecord) -> Result<Option<(String, String)>> {
        let Some(written) = &view.digest else { return Ok(None) };
        let paths = self.view_paths(&view.name).await?;
        Ok(match paths.into_iter().find(|(version, _)| *version == view.version) {
            Some((_, path)) => self.fields_changed(&path, written, "written").await?.map(|why| (path.to_string(), why)),
            None => Some((format!("views/{}", view.name), format!("version {} is missing", view.version))),
        })
    }

    /// Whether the catalog record at `path` still has the digest `digest` it was `done` with.
    async fn fields_changed(&self, path: &Path, digest: &str, done: &str) -> Result<Option<String>> {
        let bytes = self.store().get(path).await.map_err(Error::store(path.to_string()))?;
        let bytes = bytes.bytes().await.map_err(Error::store(path.to_string()))?;
        let now = match serde_json::from_slice::<serde_json::Value>(&bytes) {
            Ok(value) => record_digest(&value),
            Err(e) => return Ok(Some(format!("it is no longer JSON ({e})"))),
        };
        Ok((now != digest).then(|| format!("its fields are not the ones {done} ({now}, {digest} was recorded)")))
    }

    /// The files under `DIR/TABLE.lance/`, by path relative to `dir`, with their sizes.
    async fn files_of_table(&self, dir: &str, table: &str) -> Result<BTreeMap<String, u64>> {
        let prefix = Path::from(format!("{dir}/{table}.lance"));
        let objects: Vec<_> = match self.store().list(Some(&prefix)).try_collect().await {
            Ok(objects) => objects,
            Err(object_store::Error::NotFound { .. }) => Vec::new(),
            Err(e) => return Err(Error::store(prefix.to_string())(e)),
        };
        let dir = Path::from(dir);
        Ok(objects
            .into_iter()
            .filter_map(|o| {
                let relative: Vec<String> = o.location.prefix_match(&dir)?.map(|part| part.as_ref().to_string()).collect();
                Some((relative.join("/"), o.size))
            })
            .collect())
    }

    /// The size and `blake3:<hex>` digest of the file at `path` (relative to the root).
    async fn digest(&self, path: &str) -> Result<(u64, String)> {
        if let Some(root) = self.local_root() {
            // Read in blocks of the hasher's own size rather than object_store's 8 KiB chunks:
            // six times the bytes per second (docs/decisions/0034-table-digests-checked-by-lake-verify.md).
            let file = root.join(path);
            let hashed = tokio::task::spawn_blocking(move || {
                let mut hasher = blake3::Hasher::new();
                hasher.update_reader(std::fs::File::open(&file)?)?;
                Ok::<_, std::io::Error>((hasher.count(), hasher.finalize()))
            });
            let (size, hash) = hashed
                .await
                .map_err(|e| Error::store(path)(object_store::Error::JoinError { source: e }))?
                .map_err(|e| Error::store(path)(object_store::Error::Generic { store: "LocalFileSystem", source: Box::new(e) }))?;
            return Ok((size, format!("blake3:{}", hash.to_hex())));
        }
        let location = Path::from(path);
        let mut bytes = self.store().get(&location).await.map_err(Error::store(path))?.into_stream();
        let mut hasher = blake3::Hasher::new();
        let mut size = 0u64;
        while let Some(chunk) = bytes.try_next().await.map_err(Error::store(path))? {
            hasher.update(&chunk);
            size += chunk.len() as u64;
        }
        Ok((size, format!("blake3:{}", hasher.finalize().to_hex())))
    }
}

#[cfg(test)]
mod tests {
    use chrono::Utc;

    use super::*;

    /// Every view record the store writes (a create, a replace, a drop) carries the digest of its
    /// fields; a field changed afterwards is named with the record's path.
    #[tokio::test]
    async fn a_view_records_changed_fields_are_named() {
        let tmp = tempfile::tempdir().expect("tmp");
        let lake = Lake::create(tmp.path().join("lake").to_str().expect("utf-8")).expect("lake");
        let view = ViewRecord {
            name: "v".into(),
            version: 0,
            dropped: false,
            sql: "SELECT 1".into(),
            created_at: Utc::now(),
            lake_versions: Vec::new(),
            datasets: Vec::new(),
            digest: Some("blake3:not-this-one".into()),
        };
        lake.put_view(&view, false).await.expect("view");
        lake.put_view(&view, true).await.expect("replaced");
        lake.drop_view("v").await.expect("dropped");
        let records = lake.view_records("v").await.expect("records");
        assert_eq!(records.iter().map(|r| (r.version, r.dropped)).collect::<Vec<_>>(), [(1, false), (2, false), (3, true)]);
        for record in &records {
            assert!(record.digest.as_ref().is_some_and(|d| d.starts_with("blake3:") && d != "blake3:not-this-one"), "{record:?}");
            assert_eq!(lake.view_record_damage(record).await.expect("checked"), None);
        }
        let path = tmp.path().join("lake/views/v/v00000002.json");
        let mut json: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).expect("read")).expect("json");
        json["sql"] = "SELECT 2".into();
        std::fs::write(&path, serde_json::to_vec_pretty(&json).expect("json")).expect("write");
        let (named, why) = lake.view_record_damage(&records[1]).await.expect("checked").expect("named");
        assert_eq!(named, "views/v/v00000002.json");
        assert!(why.starts_with("its fields are not the ones written (blake3:"), "{why}");
        assert_eq!(lake.view_record_damage(&records[0]).await.expect("checked"), None, "the other records are as written");
    }
}
