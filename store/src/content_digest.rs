//! The digest of a small derived table's rows (`image_stats`), kept in its schema metadata
//! ([`CONTENT_DIGEST`]) and checked by `lake verify`.
//!
//! A table written beside a committed version has no commit record to hold digests of its
//! files. Its rows' digest travels in the table's own manifest instead, written in the same
//! Lance commit as the rows. It is taken over the values, not the files, so it does not depend
//! on how Lance lays the rows out in pages, or on how a scan splits them into batches.

use arrow::{
    array::{Array, AsArray, RecordBatch},
    datatypes::{DataType, Float32Type, Float64Type, Int32Type, Int64Type, UInt32Type, UInt64Type},
};
use lake_schemas::{CommitRecord, tables::CONTENT_DIGEST};

use crate::{Error, Lake, Result};

/// `blake3:<hex>` of the rows of `batches`, in row order: the column names, then for each row
/// and column a validity byte and the value (integers and floats as their little-endian bytes,
/// strings as their length and bytes).
///
/// # Errors
/// When a column has a type this encoding does not cover (named in the message).
pub fn content_digest(batches: &[RecordBatch]) -> std::result::Result<String, String> {
    let mut hasher = blake3::Hasher::new();
    if let Some(first) = batches.first() {
        for field in first.schema().fields() {
            hasher.update(&(field.name().len() as u64).to_le_bytes());
            hasher.update(field.name().as_bytes());
        }
    }
    for batch in batches {
        for row in 0..batch.num_rows() {
            for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
                if column.is_null(row) {
                    hasher.update(&[0]);
                    continue;
                }
                hasher.update(&[1]);
                match column.data_type() {
                    DataType::Boolean => hasher.update(&[u8::from(column.as_boolean().value(row))]),
                    DataType::Int32 => hasher.update(&column.as_primitive::<Int32Type>().value(row).to_le_bytes()),
                    DataType::Int64 => hasher.update(&column.as_primitive::<Int64Type>().value(row).to_le_bytes()),
                    DataType::UInt32 => hasher.update(&column.as_primitive::<UInt32Type>().value(row).to_le_bytes()),
                    DataType::UInt64 => hasher.update(&column.as_primitive::<UInt64Type>().value(row).to_le_bytes()),
                    DataType::Float32 => hasher.update(&column.as_primitive::<Float32Type>().value(row).to_bits().to_le_bytes()),
                    DataType::Float64 => hasher.update(&column.as_primitive::<Float64Type>().value(row).to_bits().to_le_bytes()),
                    DataType::Utf8 => {
                        let value = column.as_string::<i32>().value(row);
                        hasher.update(&(value.len() as u64).to_le_bytes()).update(value.as_bytes())
                    }
                    other => return Err(format!("column `{}`: no digest is defined for {other} values", field.name())),
                };
            }
        }
    }
    Ok(format!("blake3:{}", hasher.finalize().to_hex()))
}

/// What [`Lake::verify_content`] found in a derived table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContentCheck {
    /// Its rows have the digest they were written with.
    Intact {
        /// Rows read.
        rows: u64,
    },
    /// Written before lake kept its rows' digest: read, not checked.
    Unchecked {
        /// Rows read.
        rows: u64,
    },
    /// Its rows are not the ones written.
    Damaged(String),
}

impl Lake {
    /// Reads the derived table `table` of `record`'s version (`image_stats`) and checks its rows
    /// against the digest written with them; `None` when the version has no such table.
    ///
    /// # Errors
    /// When the store cannot be listed.
    pub async fn verify_content(&self, record: &CommitRecord, table: &str) -> Result<Option<ContentCheck>> {
        if !self.has_table(&record.tables.dir, table).await? {
            return Ok(None);
        }
        let opened = match crate::open_table(self, record, table).await {
            Ok(opened) => opened,
            Err(e) => return Ok(Some(ContentCheck::Damaged(e.to_string()))),
        };
        let written = opened.schema().metadata.get(CONTENT_DIGEST).cloned();
        let columns: Vec<String> = opened.schema().fields.iter().map(|f| f.name.clone()).collect();
        let columns: Vec<&str> = columns.iter().map(String::as_str).collect();
        let batches = match crate::read_columns(self, record, table, &columns).await {
            Ok(batches) => batches,
            Err(e) => return Ok(Some(ContentCheck::Damaged(e.to_string()))),
        };
        let rows = batches.iter().map(|b| b.num_rows() as u64).sum();
        let Some(written) = written else { return Ok(Some(ContentCheck::Unchecked { rows })) };
        Ok(Some(match content_digest(&batches) {
            Ok(now) if now == written => ContentCheck::Intact { rows },
            Ok(now) => ContentCheck::Damaged(format!("its rows are not the ones written ({now}, {written} was recorded)")),
            Err(why) => ContentCheck::Damaged(why),
        }))
    }
}

/// `batches` with their digest added to `schema`'s metadata ([`CONTENT_DIGEST`]), for writing.
///
/// # Errors
/// When a column's type has no digest ([`content_digest`]).
pub(crate) fn with_content_digest(
    table: &str,
    schema: &arrow_schema::SchemaRef,
    batches: Vec<RecordBatch>,
) -> Result<(arrow_schema::SchemaRef, Vec<RecordBatch>)> {
    let invalid = |why: String| Error::Arrow { table: table.to_string(), source: arrow_schema::ArrowError::InvalidArgumentError(why) };
    let digest = content_digest(&batches).map_err(invalid)?;
    let mut metadata = schema.metadata().clone();
    metadata.insert(CONTENT_DIGEST.to_string(), digest);
    let schema = std::sync::Arc::new(schema.as_ref().clone().with_metadata(metadata));
    let batches = batches.into_iter().map(|b| b.with_schema(schema.clone())).collect::<std::result::Result<_, _>>();
    Ok((schema, batches.map_err(|source| Error::Arrow { table: table.to_string(), source })?))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Float64Array, Int64Array, StringArray};
    use arrow_schema::{Field, Schema};

    use super::*;

    fn batch(episodes: &[Option<i64>], features: &[&str], values: &[f64]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("episode_index", DataType::Int64, true),
            Field::new("feature", DataType::Utf8, false),
            Field::new("mean", DataType::Float64, false),
        ]));
        let columns: Vec<arrow::array::ArrayRef> = vec![
            Arc::new(Int64Array::from(episodes.to_vec())),
            Arc::new(StringArray::from(features.to_vec())),
            Arc::new(Float64Array::from(values.to_vec())),
        ];
        RecordBatch::try_new(schema, columns).expect("batch")
    }

    /// The digest follows the rows, not how they are split into batches, and changes with any
    /// value, a null, or a byte moved between neighbouring strings.
    #[test]
    fn a_tables_digest_follows_its_rows_not_its_batches() {
        let whole = content_digest(&[batch(&[Some(0), None, Some(2)], &["a", "ab", "c"], &[0.5, 1.0, -0.0])]).expect("digest");
        let split = content_digest(&[batch(&[Some(0)], &["a"], &[0.5]), batch(&[None, Some(2)], &["ab", "c"], &[1.0, -0.0])]);
        assert_eq!(split.expect("digest"), whole);
        for changed in [
            batch(&[Some(0), None, Some(2)], &["a", "ab", "c"], &[0.5, 1.0, 0.0]),
            batch(&[Some(0), Some(0), Some(2)], &["a", "ab", "c"], &[0.5, 1.0, -0.0]),
            batch(&[Some(0), None, Some(2)], &["aa", "b", "c"], &[0.5, 1.0, -0.0]),
            batch(&[Some(0), None, Some(3)], &["a", "ab", "c"], &[0.5, 1.0, -0.0]),
        ] {
            assert_ne!(content_digest(&[changed]).expect("digest"), whole);
        }
    }

    #[test]
    fn a_column_without_an_encoding_is_named() {
        let schema = Arc::new(Schema::new(vec![Field::new("blob", DataType::Binary, false)]));
        let blob = RecordBatch::try_new(schema, vec![Arc::new(arrow::array::BinaryArray::from(vec![b"x".as_slice()]))]).expect("batch");
        let e = content_digest(&[blob]).expect_err("no encoding for binary");
        assert!(e.contains("`blob`") && e.contains("Binary"), "{e}");
    }
}
