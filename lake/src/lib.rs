//! lake as a library: SQL over the lake and named training sets (views), shared by the `lake`
//! binary and the serving layer.

pub mod export;
pub mod serve;
pub mod sql;
mod sql_functions;
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
    /// A query needs more memory than its budget (the SQL memory pool, or the limit on a
    /// value one function call may build): HTTP 507, gRPC `RESOURCE_EXHAUSTED`. Asking again
    /// fails again.
    #[error("{0}")]
    ResourcesExhausted(String),
    /// A request is not valid (e.g. a view's query lacks a column).
    #[error("{0}")]
    Invalid(String),
    /// Something that should not fail did (encoding an answer); the message is for the log.
    #[error("{0}")]
    Internal(String),
    /// The server is shutting down; a stream it ended resumes at its next step elsewhere.
    #[error(
        "the server is shutting down; a stream resumes from its next step (epoch and step of the batch after the last one read), a query is asked again, elsewhere or after the restart"
    )]
    ShuttingDown,
}

/// Result with lake's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong creating a file in `dir`, said of the directory (an error of the file's own
/// would name a temporary file the user never asked for).
pub fn in_directory(dir: &std::path::Path, e: &std::io::Error) -> std::io::Error {
    let why = match e.kind() {
        std::io::ErrorKind::NotFound if !dir.exists() => format!("the directory {} does not exist", dir.display()),
        std::io::ErrorKind::PermissionDenied => format!("no permission to create files in {}", dir.display()),
        kind => match e.raw_os_error() {
            Some(code) => format!("cannot create files in {}: {}", dir.display(), std::io::Error::from_raw_os_error(code)),
            None => format!("cannot create files in {}: {}", dir.display(), std::io::Error::from(kind)),
        },
    };
    std::io::Error::new(e.kind(), why)
}

/// Bytes in the decimal unit that keeps one to three digits before the point (`32.0 MB`).
pub fn decimal_bytes(n: u64) -> String {
    let units = ["bytes", "kB", "MB", "GB", "TB", "PB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1000.0 && unit + 1 < units.len() {
        value /= 1000.0;
        unit += 1;
    }
    if unit == 0 { format!("{n} bytes") } else { format!("{value:.1} {}", units[unit]) }
}

/// `n` and `noun`, plural unless `n` is 1 (`1 episode`, `3 episodes`; a noun's plural adds `s`).
pub fn count(n: impl Into<u64>, noun: &str) -> String {
    let n = n.into();
    if n == 1 { format!("1 {noun}") } else { format!("{n} {noun}s") }
}
