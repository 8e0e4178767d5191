/// Errors from the lake's catalog and tables.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The lake root could not be used.
    #[error("lake root `{root}`: {message}")]
    Root {
        /// The root as given.
        root: String,
        /// What is wrong.
        message: String,
    },
    /// A dataset name is not usable.
    #[error("dataset name `{name}`: {message}")]
    BadName {
        /// The name as given.
        name: String,
        /// What is wrong.
        message: String,
    },
    /// No dataset (or version) of that name.
    #[error("no dataset `{name}` in the lake at {root}{}", available_hint(.available))]
    NotFound {
        /// The name asked for (with `@version` when one was given).
        name: String,
        /// The lake root.
        root: String,
        /// The datasets that do exist.
        available: Vec<String>,
    },
    /// A view name is taken, or a view does not exist.
    #[error("view `{name}`: {message}")]
    View {
        /// The view name.
        name: String,
        /// What is wrong.
        message: String,
    },
    /// Another writer committed the same version first.
    #[error("dataset `{name}`: version {version} was committed by another ingest meanwhile; run it again")]
    Conflict {
        /// Dataset name.
        name: String,
        /// The version both tried to commit.
        version: u64,
    },
    /// A catalog record could not be read.
    #[error("catalog record {path}: {source}")]
    Record {
        /// Path of the record, relative to the lake root.
        path: String,
        /// The parse error.
        source: serde_json::Error,
    },
    /// Object store I/O failed.
    #[error("{path}: {source}")]
    ObjectStore {
        /// Path relative to the lake root.
        path: String,
        /// The store's error.
        source: object_store::Error,
    },
    /// A Lance table operation failed.
    #[error("table {table}: {source}")]
    Lance {
        /// The table's path relative to the lake root.
        table: String,
        /// Lance's error.
        source: Box<lance::Error>,
    },
    /// Arrow failed (building or casting batches).
    #[error("table {table}: {source}")]
    Arrow {
        /// The table.
        table: String,
        /// Arrow's error.
        source: arrow_schema::ArrowError,
    },
}

fn available_hint(available: &[String]) -> String {
    if available.is_empty() { " (the lake is empty)".to_string() } else { format!(" (it has: {})", available.join(", ")) }
}

impl Error {
    pub(crate) fn store(path: impl Into<String>) -> impl FnOnce(object_store::Error) -> Self {
        let path = path.into();
        move |source| Self::ObjectStore { path, source }
    }

    pub(crate) fn lance(table: impl Into<String>) -> impl FnOnce(lance::Error) -> Self {
        let table = table.into();
        move |source| Self::Lance { table, source: Box::new(source) }
    }
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    #[test]
    fn error_stays_small() {
        assert!(std::mem::size_of::<super::Error>() <= 96, "{}", std::mem::size_of::<super::Error>());
    }
}
