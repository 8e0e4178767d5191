//! lake as a library: SQL over the lake and named training sets (views), shared by the `lake`
//! binary and the serving layer.

pub mod export;
pub mod serve;
pub mod sql;
pub mod stats;
pub mod views;

/// Errors of the SQL and view layer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The lake's catalog or tables could not be read.
    #[error(transparent)]
    Store(#[from] lake_store::Error),
    /// The loader refused a dataset or request.
    #[error(transparent)]
    Loader(#[from] lake_loader::Error),
    /// A table could not be opened.
    #[error("table {table}: {}", lake_store::lance_message(error))]
    Open {
        /// The table's path.
        table: String,
        /// Lance's error (in this one's message, without Lance's internals).
        error: Box<lance::Error>,
    },
    /// The query is not valid or failed.
    #[error("{0}")]
    Query(String),
    /// A query's tables could not be read (a damaged or missing file of the lake): the lake's
    /// fault, not the query's.
    #[error("{0}")]
    Storage(String),
    /// No dataset or view of that name.
    #[error("{0}")]
    NotFound(String),
    /// The server has no room for another stream now (its memory budget is taken).
    #[error("{0}")]
    Busy(String),
    /// A request is not valid (e.g. a view's query lacks a column).
    #[error("{0}")]
    Invalid(String),
    /// Something that should not fail did (encoding an answer); the message is for the log.
    #[error("{0}")]
    Internal(String),
    /// The server is shutting down; a stream it ended resumes at its next step elsewhere.
    #[error("the server is shutting down; resume from the next step (epoch and step of the batch after the last one read)")]
    ShuttingDown,
}

/// Result with lake's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
