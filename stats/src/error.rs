//! What can go wrong computing or reading statistics.

/// What went wrong computing or reading statistics.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The lake's catalog or tables could not be read.
    #[error(transparent)]
    Store(#[from] lake_store::Error),
    /// A dataset could not be opened or its frames decoded.
    #[error(transparent)]
    Loader(#[from] lake_loader::Error),
    /// The statistics asked for cannot be made (a table of the version is not as written, a
    /// selection that leaves nothing).
    #[error("{0}")]
    Invalid(String),
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
