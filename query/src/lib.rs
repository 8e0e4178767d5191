//! SQL over the lake: a DataFusion session whose tables are the lake's Lance tables, the
//! limits that keep any query from taking its process down, and the SQL side of views.
//!
//! - [`sql::LakeSql`]: a session over the lake's current datasets and views (`steps`,
//!   `episodes`, `tasks`, … spanning every dataset, and `"<dataset>".<table>` per dataset).
//! - [`sql::limits`]: text, nesting, subquery and join limits, and the stack SQL threads get.
//! - [`sql::SqlMemory`]: the memory pool queries draw from; [`sql::capped`]: the per-call
//!   limit on values scalar functions build.
//! - [`views::create`]: a named training set from a query's `episode_index` (and `dataset`,
//!   `weight`) columns. Reading views back is the loader's (`lake_loader::views`): a trainer
//!   samples a view without compiling DataFusion.
//!
//! This is the only crate of the workspace that compiles DataFusion.
//!
//! ```
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let dir = tempfile::tempdir().unwrap();
//! let root = dir.path().join("lake");
//! let root = root.to_str().unwrap();
//! let lake = lake_store::Lake::create(root).unwrap();
//! let session = lake_query::sql::LakeSql::open(&lake).await.unwrap().read_only();
//! let (_, batches) = session.query("SELECT count(*) AS n FROM datasets").await.unwrap();
//! assert_eq!(batches[0].num_rows(), 1);
//! // Nested past the limit: refused before it is planned.
//! let deep = format!("SELECT {}", vec!["1"; 2000].join(" + "));
//! let refused = session.query(&deep).await.unwrap_err();
//! assert!(refused.to_string().contains("expression nested deeper than 1000"));
//! # });
//! ```

pub mod sql;
mod sql_functions;
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
    /// The lake's object store could not be reached, or answered only with server errors
    /// through its retries (see [`store_unreachable`]): HTTP 503, gRPC `UNAVAILABLE`; asking
    /// again once the store answers succeeds.
    #[error("{0}")]
    StoreUnavailable(String),
    /// The lake may not be written here: the server serves it read-only (`lake serve
    /// --read-only`), or its storage refuses writes. HTTP 403, gRPC `PERMISSION_DENIED`; asking
    /// again fails again.
    #[error("{0}")]
    ReadOnly(String),
    /// The server is shutting down; a stream it ended resumes at its next step elsewhere.
    #[error(
        "the server is shutting down; a stream resumes from its next step (epoch and step of the batch after the last one read), a query is asked again, elsewhere or after the restart"
    )]
    ShuttingDown,
}

/// Whether `e` or one of its causes says that the lake's object store could not be reached or
/// answered only with server errors ([`lake_store::store_unreachable`]), looking also into the
/// Lance errors that lake's errors hold beside their causes.
pub fn store_unreachable(e: &(dyn std::error::Error + 'static)) -> bool {
    use lake_loader::Error as L;
    if let Some(e) = e.downcast_ref::<Error>() {
        match e {
            Error::StoreUnavailable(_) => return true,
            Error::Open { error, .. } => return lake_store::store_unreachable(error.as_ref()),
            Error::Store(e) => return lake_store::store_unreachable(e),
            Error::Loader(e) => return store_unreachable(e),
            _ => {}
        }
    }
    match e.downcast_ref::<L>() {
        Some(L::Lance { error, .. }) => lake_store::store_unreachable(error.as_ref()),
        Some(L::Store(e)) => lake_store::store_unreachable(e),
        _ => lake_store::unreachable_link(e) || e.source().is_some_and(store_unreachable),
    }
}

/// Result with lake's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
