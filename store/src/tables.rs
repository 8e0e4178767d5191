//! Writing and opening the Lance tables of a dataset version.

use std::sync::Arc;

use arrow::record_batch::{RecordBatch, RecordBatchIterator};
use arrow_schema::SchemaRef;
use futures::{Stream, StreamExt, TryStreamExt};
use lake_schemas::CommitRecord;
use lance::{
    Dataset,
    dataset::{
        CommitBuilder, InsertBuilder, WriteMode, WriteParams,
        transaction::{Operation, Transaction},
    },
    deps::datafusion::{
        error::DataFusionError,
        physical_plan::{SendableRecordBatchStream, stream::RecordBatchStreamAdapter},
    },
    table::format::Fragment,
};

use crate::{
    Error, Lake, Result,
    lance_open::{open_lance, read_lance, stream_lance},
};

/// Rows per Lance data file; packets tables split into files of this many rows.
const MAX_ROWS_PER_FILE: usize = 256 * 1024;
/// Bytes per Lance data file before a new one starts (soft limit).
const MAX_BYTES_PER_FILE: usize = 1 << 30;

/// How lake writes a table at `uri`: files of bounded size, and on object stores through lake's
/// clients for them.
pub(crate) fn write_params(uri: &str, mode: WriteMode) -> WriteParams {
    let session = crate::remote::is_remote(uri).then(crate::remote::session);
    WriteParams { mode, max_rows_per_file: MAX_ROWS_PER_FILE, max_bytes_per_file: MAX_BYTES_PER_FILE, session, ..Default::default() }
}

/// Writes `batches` as a new Lance table at `uri` and returns its row count.
///
/// # Errors
/// When Lance cannot write the table.
pub async fn write_table(uri: &str, schema: SchemaRef, batches: Vec<RecordBatch>) -> Result<u64> {
    let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
    let reader = RecordBatchIterator::new(batches.into_iter().map(Ok), schema);
    Dataset::write(reader, uri, Some(write_params(uri, WriteMode::Create))).await.map_err(Error::lance(uri))?;
    Ok(rows as u64)
}

/// Data files written into a table but not yet part of any version: one piece of a table that
/// several writers fill at once and [`commit_parts`] publishes in a chosen order.
#[derive(Debug, Clone)]
pub struct UncommittedPart {
    fragments: Vec<Fragment>,
    schema: lance::datatypes::Schema,
    rows: u64,
}

impl UncommittedPart {
    /// Rows in this part.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Paths of the part's data files, relative to the table's `data/` directory.
    pub fn data_files(&self) -> Vec<String> {
        self.fragments.iter().flat_map(|f| f.files.iter().map(|d| d.path.clone())).collect()
    }
}

/// Writes a stream of batches into data files of the table at `uri` without committing them.
/// Several calls may run at once on the same `uri`.
///
/// # Errors
/// When Lance cannot write, or the stream yields an error (which is returned as is).
pub async fn write_uncommitted<S, E>(uri: String, schema: SchemaRef, batches: S) -> Result<UncommittedPart, E>
where
    S: Stream<Item = Result<RecordBatch, E>> + Send + 'static,
    E: From<Error> + Send + 'static,
{
    write_uncommitted_in(uri, schema, batches, WriteMode::Create).await
}

/// [`write_uncommitted`] into a table that exists already when `mode` is
/// [`WriteMode::Overwrite`] (its next version).
pub(crate) async fn write_uncommitted_in<S, E>(uri: String, schema: SchemaRef, batches: S, mode: WriteMode) -> Result<UncommittedPart, E>
where
    S: Stream<Item = Result<RecordBatch, E>> + Send + 'static,
    E: From<Error> + Send + 'static,
{
    // Lance consumes a DataFusion stream; a producer error is parked here and returned instead
    // of Lance's wrapped version of it.
    let failure: Arc<std::sync::Mutex<Option<E>>> = Arc::default();
    let slot = failure.clone();
    let rows = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counted = rows.clone();
    let stream = batches.map(move |item| match item {
        Ok(batch) => {
            counted.fetch_add(batch.num_rows() as u64, std::sync::atomic::Ordering::Relaxed);
            Ok(batch)
        }
        Err(e) => {
            *slot.lock().expect("producer error slot") = Some(e);
            Err(DataFusionError::Execution("the producer of this table failed".into()))
        }
    });
    let stream: SendableRecordBatchStream = Box::pin(RecordBatchStreamAdapter::new(schema, stream));
    let params = write_params(&uri, mode);
    let result = InsertBuilder::new(uri.as_str()).with_params(&params).execute_uncommitted_stream(stream).await;
    if let Some(e) = failure.lock().expect("producer error slot").take() {
        return Err(e);
    }
    let txn = result.map_err(|e| E::from(Error::lance(uri.as_str())(e)))?;
    match txn.operation {
        Operation::Overwrite { fragments, schema, .. } => {
            Ok(UncommittedPart { fragments, schema, rows: rows.load(std::sync::atomic::Ordering::Relaxed) })
        }
        other => Err(E::from(Error::Lance {
            table: uri.clone(),
            error: Box::new(lance::Error::internal(format!("unexpected uncommitted operation {}", other.name()))),
        })),
    }
}

/// Publishes `parts` as version 1 of a new table at `uri` (the next version of one there); rows are numbered in the order of
/// `parts` (the first part's rows are 0.., the next part's follow, and so on).
///
/// # Errors
/// When the parts have different schemas or Lance cannot commit.
pub async fn commit_parts(uri: &str, fallback_schema: SchemaRef, parts: Vec<UncommittedPart>) -> Result<u64> {
    commit_parts_with(uri, fallback_schema, parts, std::collections::HashMap::new()).await
}

/// [`commit_parts`], with `metadata` added to the table's schema metadata (facts known only once
/// every part is written).
///
/// # Errors
/// As [`commit_parts`].
pub async fn commit_parts_with(
    uri: &str,
    fallback_schema: SchemaRef,
    parts: Vec<UncommittedPart>,
    metadata: std::collections::HashMap<String, String>,
) -> Result<u64> {
    let mut fragments = Vec::new();
    let mut schema = None;
    let mut rows = 0;
    for part in parts {
        if let Some(s) = &schema
            && s != &part.schema
        {
            return Err(Error::Lance { table: uri.to_string(), error: Box::new(lance::Error::internal("parts have different schemas")) });
        }
        schema.get_or_insert(part.schema);
        fragments.extend(part.fragments);
        rows += part.rows;
    }
    let mut schema = match schema {
        Some(s) => s,
        None => lance::datatypes::Schema::try_from(fallback_schema.as_ref()).map_err(Error::lance(uri))?,
    };
    schema.metadata.extend(metadata);
    let op = Operation::Overwrite { fragments, schema, config_upsert_values: None, initial_bases: None };
    // Over a table that exists (a derived table on an object store, rewritten), this is its next
    // version, read from the latest.
    let read_version = open_lance(uri).await.map_or(0, |t| t.version().version);
    let mut commit = CommitBuilder::new(uri);
    if crate::remote::is_remote(uri) {
        commit = commit.with_session(crate::remote::session());
    }
    commit.execute(Transaction::new(read_version, op, None)).await.map_err(Error::lance(uri))?;
    Ok(rows)
}

/// Opens `table` of a committed version.
///
/// # Errors
/// When the table does not exist or cannot be opened.
pub async fn open_table(lake: &Lake, record: &CommitRecord, table: &str) -> Result<Dataset> {
    let uri = lake.uri(&record.tables.path(table));
    open_lance(&uri).await.map_err(Error::lance(record.tables.path(table)))
}

/// Reads some columns of a table into memory.
///
/// # Errors
/// When the table cannot be opened or scanned, or a column does not exist.
pub async fn read_columns(lake: &Lake, record: &CommitRecord, table: &str, columns: &[&str]) -> Result<Vec<RecordBatch>> {
    let ds = open_table(lake, record, table).await?;
    scan_columns(&ds, &record.tables.path(table), columns).await
}

/// Reads some columns of the committed table at `uri` (also one of a version not yet published)
/// into memory.
///
/// # Errors
/// When the table cannot be opened or scanned, or a column does not exist.
pub async fn read_columns_at(uri: &str, columns: &[&str]) -> Result<Vec<RecordBatch>> {
    let ds = open_lance(uri).await.map_err(Error::lance(uri))?;
    scan_columns(&ds, uri, columns).await
}

/// Streams some columns of the committed table at `uri` (also one of a version not yet
/// published), in row order, a batch at a time.
///
/// # Errors
/// When the table cannot be opened or scanned, or a column does not exist; the stream yields
/// the errors of reading.
pub async fn stream_columns_at(uri: &str, columns: &[&str]) -> Result<impl Stream<Item = Result<RecordBatch>> + Send + use<>> {
    let ds = open_lance(uri).await.map_err(Error::lance(uri))?;
    let mut scan = ds.scan();
    scan.project(columns).map_err(Error::lance(uri))?;
    let stream = read_lance(uri, scan.try_into_stream()).await.map_err(Error::lance(uri))?;
    let path = uri.to_string();
    Ok(stream_lance(uri, stream).map(move |b| b.map_err(Error::lance(path.clone()))))
}

async fn scan_columns(ds: &Dataset, path: &str, columns: &[&str]) -> Result<Vec<RecordBatch>> {
    let mut scan = ds.scan();
    scan.project(columns).map_err(Error::lance(path))?;
    collect_scan(ds, path, scan).await
}

/// Every batch of `scan`, a scan of `ds` (the table at `path`), in memory.
async fn collect_scan(ds: &Dataset, path: &str, scan: lance::dataset::scanner::Scanner) -> Result<Vec<RecordBatch>> {
    read_lance(ds.uri(), async move { scan.try_into_stream().await?.try_collect::<Vec<_>>().await }).await.map_err(Error::lance(path))
}

/// Reads a whole (small) table into memory.
///
/// # Errors
/// When the table cannot be opened or scanned.
pub async fn read_table(lake: &Lake, record: &CommitRecord, table: &str) -> Result<Vec<RecordBatch>> {
    let ds = open_table(lake, record, table).await?;
    collect_scan(&ds, &record.tables.path(table), ds.scan()).await
}

/// Reads the rows of a table that `filter` (Lance's SQL filter syntax) keeps, every column.
///
/// # Errors
/// When the table cannot be opened or scanned, or the filter is not valid for it.
pub async fn read_table_where(lake: &Lake, record: &CommitRecord, table: &str, filter: &str) -> Result<Vec<RecordBatch>> {
    let ds = open_table(lake, record, table).await?;
    let path = record.tables.path(table);
    let mut scan = ds.scan();
    scan.filter(filter).map_err(Error::lance(path.clone()))?;
    collect_scan(&ds, &path, scan).await
}

/// A string as a literal of Lance's SQL filters (quoted, quotes doubled).
pub fn sql_string(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// Every row of the Lance table at `uri` as one batch (of the table's schema when it has no
/// rows).
///
/// # Errors
/// When the table cannot be opened or scanned.
pub async fn read_whole_at(uri: &str) -> Result<RecordBatch> {
    let ds = open_lance(uri).await.map_err(Error::lance(uri))?;
    let schema: SchemaRef = std::sync::Arc::new(arrow_schema::Schema::from(ds.schema()));
    let batches = collect_scan(&ds, uri, ds.scan()).await?;
    let schema = batches.first().map_or(schema, RecordBatch::schema);
    arrow::compute::concat_batches(&schema, &batches).map_err(|e| Error::lance(uri)(lance::Error::from(e)))
}

/// Publishes a derived table (one a command adds beside a committed version, like decoded
/// frames) that was written complete at `tmp`: moves an existing table at `dest` aside, renames
/// `tmp` into place, then removes the old one. Readers see the old table or the new one, never a
/// partial one.
///
/// # Errors
/// When a rename fails (`tmp` is then left for the caller to remove).
pub fn publish_dir(tmp: &std::path::Path, dest: &std::path::Path) -> std::io::Result<()> {
    let old = dest.with_extension(format!("old-{}", uuid::Uuid::new_v4().simple()));
    let replaced = dest.exists();
    if replaced {
        std::fs::rename(dest, &old)?;
    }
    std::fs::rename(tmp, dest)?;
    if replaced {
        let _ = std::fs::remove_dir_all(&old);
    }
    Ok(())
}

/// Directories of unpublished work that a cancelled command dropped ([`remove_when_done`]).
static ABANDONED: std::sync::Mutex<Vec<std::path::PathBuf>> = std::sync::Mutex::new(Vec::new());

/// Removes `dir`, a derived table being written whose work was dropped, now and again at
/// [`remove_abandoned`]: a write already under way on a blocking thread (the object store's
/// file writes) may make files in it after the first removal.
pub fn remove_when_done(dir: std::path::PathBuf) {
    let _ = std::fs::remove_dir_all(&dir);
    ABANDONED.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(dir);
}

/// Removes the directories [`remove_when_done`] was given; for the end of a process, once its
/// runtime has stopped.
pub fn remove_abandoned() {
    for dir in ABANDONED.lock().unwrap_or_else(std::sync::PoisonError::into_inner).drain(..) {
        let _ = std::fs::remove_dir_all(dir);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::{array::Int64Array, record_batch::RecordBatch};
    use arrow_schema::{DataType, Field, Schema};

    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_data_file_damaged_in_place_is_an_error_not_a_panic() {
        use arrow::array::Float64Array;
        let tmp = tempfile::tempdir().unwrap();
        let uri = tmp.path().join("t.lance").to_string_lossy().into_owned();
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false), Field::new("y", DataType::Float64, false)]));
        let n = 500;
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from_iter_values((0..n).map(|i| i * i % 977))),
                Arc::new(Float64Array::from_iter_values((0..n).map(|i| (i as f64).sin()))),
            ],
        )
        .unwrap();
        write_table(&uri, schema, vec![batch]).await.unwrap();
        let file = std::fs::read_dir(tmp.path().join("t.lance/data")).unwrap().next().unwrap().unwrap().path();
        let body = std::fs::read(&file).unwrap();
        // Lance trusts the offsets and counts a data file holds: with one byte changed (the size
        // unchanged) a read may succeed or fail, and where Lance would panic or ask for more
        // memory than there is (a count in the footer), the read fails saying why.
        let (mut footer, mut panicked) = (0, 0);
        let mut count = |e: &Error| {
            let text = e.to_string();
            footer += usize::from(text.contains("its footer"));
            panicked += usize::from(text.contains("Lance failed reading the table's data"));
        };
        for at in (0..body.len()).step_by(5) {
            let mut damaged = body.clone();
            damaged[at] ^= 0xa5;
            std::fs::write(&file, &damaged).unwrap();
            if let Err(e) = read_columns_at(&uri, &["x", "y"]).await {
                count(&e);
            }
            let streamed: Vec<Result<RecordBatch>> = match stream_columns_at(&uri, &["x", "y"]).await {
                Ok(stream) => stream.collect().await,
                Err(e) => vec![Err(e)],
            };
            if let Some(Err(e)) = streamed.last() {
                count(e);
            }
        }
        assert!(footer > 0 && panicked > 0, "{footer} footers found damaged, {panicked} reads that panicked");
    }

    #[tokio::test]
    async fn a_damaged_manifest_is_an_error_not_a_panic() {
        let tmp = tempfile::tempdir().unwrap();
        let uri = tmp.path().join("t.lance").to_string_lossy().into_owned();
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
        let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(Int64Array::from(vec![1, 2, 3]))]).unwrap();
        write_table(&uri, schema, vec![batch]).await.unwrap();
        assert_eq!(open_lance(&uri).await.unwrap().count_rows(None).await.unwrap(), 3);

        let manifest = std::fs::read_dir(tmp.path().join("t.lance/_versions"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.extension().is_some_and(|e| e == "manifest"))
            .unwrap();
        let body = std::fs::read(&manifest).unwrap();
        // Cut short, Lance reads a footer offset past the end (it panicked on this).
        std::fs::write(&manifest, &body[..100]).unwrap();
        let message = crate::lance_message(&open_lance(&uri).await.map(drop).unwrap_err());
        assert!(message.contains("manifest is damaged"), "{message}");
        std::fs::write(&manifest, body.iter().map(|b| b.wrapping_mul(31).wrapping_add(7)).collect::<Vec<_>>()).unwrap();
        let message = crate::lance_message(&open_lance(&uri).await.map(drop).unwrap_err());
        assert!(message.contains("damaged") || message.contains("corrupt"), "{message}");
        // A column's type name changed: Lance opens the table and panicked making its Arrow schema.
        let mut renamed = body.clone();
        let at: Vec<usize> = body.windows(5).enumerate().filter(|(_, w)| *w == b"int64").map(|(i, _)| i).collect();
        assert!(!at.is_empty(), "the column's type is in the manifest");
        for i in at {
            renamed[i..i + 5].copy_from_slice(b"intx4");
        }
        std::fs::write(&manifest, &renamed).unwrap();
        let message = crate::lance_message(&open_lance(&uri).await.map(drop).unwrap_err());
        assert!(message.contains("manifest is damaged") && message.contains("Unsupported logical type: intx4"), "{message}");
    }
}
