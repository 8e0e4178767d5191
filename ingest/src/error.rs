use crate::Report;

/// Errors from ingest. Each names the source file (relative to the dataset root) it concerns.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file or directory that must exist does not.
    #[error("{path}: {what} not found")]
    Missing {
        /// Path relative to the dataset root (or the location given).
        path: String,
        /// What was expected there.
        what: String,
    },
    /// Reading a source file failed.
    #[error("{path}: {source}")]
    SourceIo {
        /// Path relative to the dataset root.
        path: String,
        /// The store's error.
        source: object_store::Error,
    },
    /// A JSON or JSON-lines document is malformed.
    #[error("{path}{}: {source}", line.map(|l| format!(" line {l}")).unwrap_or_default())]
    Json {
        /// Path relative to the dataset root.
        path: String,
        /// 1-based line for JSON-lines files.
        line: Option<usize>,
        /// The parse error.
        source: serde_json::Error,
    },
    /// A parquet file cannot be read.
    #[error("{path}: not a readable parquet file: {source}")]
    Parquet {
        /// Path relative to the dataset root.
        path: String,
        /// Parquet's error.
        source: parquet::errors::ParquetError,
    },
    /// Metadata does not have the shape LeRobot writes.
    #[error("{path}: {message}")]
    Metadata {
        /// Path relative to the dataset root.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// The dataset has errors and strict ingest refuses it; the report lists them all.
    #[error("{}", .0.refusal())]
    Refused(Box<Report>),
    /// Something this build cannot do.
    #[error("{0}")]
    Unsupported(String),
    /// The lake could not be written.
    #[error(transparent)]
    Store(#[from] lake_store::Error),
    /// Arrow failed while building a table.
    #[error("building table {table}: {source}")]
    Arrow {
        /// The lake table.
        table: &'static str,
        /// Arrow's error.
        source: arrow_schema::ArrowError,
    },
    /// The scratch files ingest keeps its per-step bookkeeping in could not be written or read.
    #[error(
        "ingest's scratch files in {dir}: {source} (4 bytes per step, and 4 more per step and video camera; set TMPDIR to a directory with room)"
    )]
    Scratch {
        /// The scratch directory.
        dir: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The ingest was cancelled (Ctrl-C); the lake is unchanged.
    #[error("cancelled; the lake is unchanged")]
    Cancelled,
    /// A worker thread panicked.
    #[error("internal error: {0}")]
    Internal(String),
}

impl Error {
    pub(crate) fn source_io(path: impl Into<String>) -> impl FnOnce(object_store::Error) -> Self {
        let path = path.into();
        move |source| Self::SourceIo { path, source }
    }

    pub(crate) fn parquet(path: impl Into<String>) -> impl FnOnce(parquet::errors::ParquetError) -> Self {
        let path = path.into();
        move |source| Self::Parquet { path, source }
    }

    pub(crate) fn metadata(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Metadata { path: path.into(), message: message.into() }
    }

    pub(crate) fn arrow(table: &'static str) -> impl FnOnce(arrow_schema::ArrowError) -> Self {
        move |source| Self::Arrow { table, source }
    }
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    #[test]
    fn error_stays_small() {
        assert!(std::mem::size_of::<super::Error>() <= 104, "{}", std::mem::size_of::<super::Error>());
    }
}
