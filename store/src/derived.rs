//! Tables a command adds beside a committed version (frame tables, training proxies, image
//! statistics): written whole, then published under their name in one step, replacing the table
//! there. Readers see the old table or the new one, never a part of one.
//!
//! - On the local disk the table is written under a temporary name in the version's directory
//!   (`.<table>-<pid>-<id>.lance`, the pid telling a dead writer's leftovers from a live one's
//!   work) and renamed into place ([`publish_dir`](crate::publish_dir)).
//! - An object store has no rename. The table's data files are written under its own name,
//!   where no version of it names them yet, and a Lance commit publishes them: the next
//!   manifest, put only if no other writer put that version first (the conditional put every
//!   commit of the lake relies on). Of two writers racing, both publish a complete version and
//!   the later one is the table. The files only older versions name are deleted once the new
//!   one is in; files no version names (a writer that died before committing) are deleted by a
//!   later publish once they are a week old, Lance's rule for telling them from a live writer's.

use arrow::record_batch::{RecordBatch, RecordBatchIterator};
use arrow_schema::SchemaRef;
use futures::TryStreamExt;
use lance::dataset::{WriteMode, cleanup::CleanupPolicy};
use object_store::path::Path;

use crate::{Error, Lake, Result, UncommittedPart};

/// A derived table being written: where its parts go, and how it is published.
#[derive(Debug)]
pub struct DerivedTable {
    /// The table's path below the lake root (`datasets/NAME/ID/frames.lance`).
    path: String,
    /// Where the table is written: a temporary directory on the local disk, the table's own URI
    /// on an object store.
    write_uri: String,
    /// The temporary directory, on the local disk (removed unless published).
    local: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

impl Lake {
    /// Starts writing the derived table `table` (`frames`, `frames-64x48`, `proxy`, …) of the
    /// version whose tables are in `dir`. On the local disk, the unpublished tables of writers
    /// that are gone are removed first.
    pub fn derived_table(&self, dir: &str, table: &str) -> DerivedTable {
        let path = format!("{dir}/{table}.lance");
        match self.local_root() {
            Some(root) => {
                remove_dead_writers(&root.join(dir));
                let tmp = root.join(dir).join(format!(".{table}-{}-{}.lance", std::process::id(), uuid::Uuid::new_v4().simple()));
                DerivedTable { write_uri: tmp.to_string_lossy().into_owned(), local: Some((tmp, root.join(&path))), path }
            }
            None => DerivedTable { write_uri: self.uri(&path), local: None, path },
        }
    }

    /// Whether the version whose tables are in `dir` has the table `table`: published, on the
    /// local disk; with a committed version, on an object store (data files alone are a writer's
    /// work in progress, or a dead writer's).
    ///
    /// # Errors
    /// When the object store cannot be listed.
    pub async fn has_table(&self, dir: &str, table: &str) -> Result<bool> {
        if let Some(root) = self.local_root() {
            return Ok(root.join(dir).join(format!("{table}.lance")).is_dir());
        }
        let versions = Path::from(format!("{dir}/{table}.lance/_versions"));
        match self.store().list(Some(&versions)).try_next().await {
            Ok(first) => Ok(first.is_some()),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(Error::store(versions.to_string())(e)),
        }
    }

    /// The tables in the directory `dir` (relative to the root) whose names start with `prefix`,
    /// by name (without `.lance`), sorted; on an object store, those with a committed version.
    ///
    /// # Errors
    /// When the object store cannot be listed.
    pub async fn tables_named(&self, dir: &str, prefix: &str) -> Result<Vec<String>> {
        let mut names: Vec<String> = Vec::new();
        for child in self.child_dirs(dir).await? {
            if let Some(name) = child.strip_suffix(".lance").filter(|n| n.starts_with(prefix))
                && self.has_table(dir, name).await?
            {
                names.push(name.to_string());
            }
        }
        names.sort();
        Ok(names)
    }

    /// The bytes of every file under `path` (relative to the root).
    ///
    /// # Errors
    /// When the object store cannot be listed.
    pub async fn bytes_under(&self, path: &str) -> Result<u64> {
        if let Some(root) = self.local_root() {
            return Ok(dir_bytes(&root.join(path)));
        }
        let prefix = Path::from(path);
        match self.store().list(Some(&prefix)).try_fold(0, |sum, meta| async move { Ok(sum + meta.size) }).await {
            Ok(bytes) => Ok(bytes),
            Err(object_store::Error::NotFound { .. }) => Ok(0),
            Err(e) => Err(Error::store(prefix.to_string())(e)),
        }
    }
}

impl DerivedTable {
    /// The table's path below the lake root.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Writes one part of the table ([`write_uncommitted`](crate::write_uncommitted) where the
    /// table is written). Several parts may be written at once.
    ///
    /// # Errors
    /// As [`write_uncommitted`](crate::write_uncommitted).
    pub async fn write_part<S, E>(&self, schema: SchemaRef, batches: S) -> Result<UncommittedPart, E>
    where
        S: futures::Stream<Item = Result<RecordBatch, E>> + Send + 'static,
        E: From<Error> + Send + 'static,
    {
        crate::tables::write_uncommitted_in(self.write_uri.clone(), schema, batches, self.mode()).await
    }

    /// How the table is written: a table of an earlier run is overwritten (a new version of it)
    /// on an object store; the temporary directory on the local disk is always new.
    fn mode(&self) -> WriteMode {
        if self.local.is_some() { WriteMode::Create } else { WriteMode::Overwrite }
    }

    /// Commits `parts` as the table's content, in that order, with `metadata` added to its
    /// schema's; on an object store this publishes it ([`publish`](Self::publish) then only
    /// tidies up).
    ///
    /// # Errors
    /// As [`commit_parts`](crate::commit_parts).
    pub async fn commit_parts(
        &self,
        fallback_schema: SchemaRef,
        parts: Vec<UncommittedPart>,
        metadata: std::collections::HashMap<String, String>,
    ) -> Result<u64> {
        crate::commit_parts_with(&self.write_uri, fallback_schema, parts, metadata).await
    }

    /// Writes `batches` as the table's content (a small table, in one go), with their digest in
    /// its schema metadata for `lake verify` ([`content_digest`](crate::content_digest)); on an
    /// object store this publishes it.
    ///
    /// # Errors
    /// When a column's type has no digest, or Lance cannot write the table.
    pub async fn write(&self, schema: SchemaRef, batches: Vec<RecordBatch>) -> Result<u64> {
        let (schema, batches) = crate::content_digest::with_content_digest(&self.path, &schema, batches)?;
        let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
        let reader = RecordBatchIterator::new(batches.into_iter().map(Ok), schema);
        lance::Dataset::write(reader, self.write_uri.as_str(), Some(crate::tables::write_params(&self.write_uri, self.mode())))
            .await
            .map_err(Error::lance(self.path.clone()))?;
        Ok(rows as u64)
    }

    /// Publishes the committed table under its name, replacing the one there: on the local disk
    /// by renaming it into place; on an object store (where committing published it) by deleting
    /// the files of the versions it replaced.
    ///
    /// # Errors
    /// When a rename fails on the local disk (the table is then removed again). Failing to delete
    /// old versions on an object store is only logged: the table is published, and the next
    /// publish deletes them.
    pub async fn publish(mut self) -> Result<()> {
        match self.local.take() {
            Some((tmp, dest)) => {
                let published = crate::publish_dir(&tmp, &dest);
                if published.is_err() {
                    crate::remove_when_done(tmp);
                }
                published.map_err(|e| Error::Root { root: dest.display().to_string(), message: format!("publishing the table: {e}") })
            }
            None => {
                let removed = async {
                    let table = crate::open_lance(&self.write_uri).await?;
                    let policy = CleanupPolicy { before_version: Some(table.version().version), ..CleanupPolicy::default() };
                    table.cleanup_with_policy(policy).await
                };
                match removed.await {
                    Ok(stats) => {
                        tracing::debug!(table = %self.write_uri, versions = stats.old_versions, bytes = stats.bytes_removed, "replaced versions deleted")
                    }
                    Err(e) => {
                        tracing::warn!(table = %self.write_uri, "the files of replaced versions stay until the next publish: {}", crate::lance_message(&e))
                    }
                }
                Ok(())
            }
        }
    }
}

impl Drop for DerivedTable {
    /// An unpublished table on the local disk is removed, also when the command writing it is
    /// cancelled; on an object store its data files stay unnamed (see the module's docs).
    fn drop(&mut self) {
        if let Some((tmp, _)) = self.local.take() {
            crate::remove_when_done(tmp);
        }
    }
}

/// Removes the unpublished derived tables (`.<table>-<pid>-<id>.lance`) in the local version
/// directory `dir` whose writer no longer runs.
fn remove_dead_writers(dir: &std::path::Path) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let file = entry.file_name();
        let Some(name) = file.to_str().and_then(|n| n.strip_prefix('.')).and_then(|n| n.strip_suffix(".lance")) else { continue };
        let mut parts = name.rsplitn(3, '-');
        let (_id, pid, table) = (parts.next(), parts.next().and_then(|p| p.parse::<u32>().ok()), parts.next());
        if let (Some(pid), Some(_table)) = (pid, table)
            && !crate::process_alive(pid)
        {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

fn dir_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::Int64Array;
    use arrow_schema::{DataType, Field, Schema};

    use super::*;

    fn batch(values: Vec<i64>) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
        RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(values))]).expect("batch")
    }

    /// On the local disk a derived table appears only once published, replaces the one there,
    /// and a dropped one leaves nothing.
    #[tokio::test]
    async fn a_local_derived_table_appears_whole_when_published() {
        let tmp = tempfile::tempdir().expect("tmp");
        let lake = Lake::create(tmp.path().join("lake").to_str().expect("utf-8")).expect("lake");
        let dir = "datasets/d/v1";
        std::fs::create_dir_all(tmp.path().join("lake").join(dir)).expect("dir");
        for values in [vec![1, 2, 3], vec![4, 5]] {
            let table = lake.derived_table(dir, "frames");
            table.write(batch(values.clone()).schema(), vec![batch(values.clone())]).await.expect("write");
            assert!(lake.tables_named(dir, "frames").await.expect("list").len() <= 1, "an unpublished table is listed");
            table.publish().await.expect("publish");
            let read = crate::read_whole_at(&lake.uri(&format!("{dir}/frames.lance"))).await.expect("read");
            assert_eq!(read.columns(), batch(values.clone()).columns());
            let digest = crate::content_digest(&[batch(values)]).expect("digest");
            assert_eq!(
                read.schema().metadata().get(lake_schemas::tables::CONTENT_DIGEST),
                Some(&digest),
                "the rows' digest is kept with them"
            );
        }
        assert_eq!(lake.tables_named(dir, "frames").await.expect("list"), ["frames"]);
        assert!(lake.has_table(dir, "frames").await.expect("has"));
        let dropped = lake.derived_table(dir, "frames-8x6");
        dropped.write(batch(vec![7]).schema(), vec![batch(vec![7])]).await.expect("write");
        drop(dropped);
        let names: Vec<String> = std::fs::read_dir(tmp.path().join("lake").join(dir))
            .expect("dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["frames.lance"], "what a dropped table leaves");
        assert!(lake.bytes_under(&format!("{dir}/frames.lance")).await.expect("bytes") > 0);
    }
}
