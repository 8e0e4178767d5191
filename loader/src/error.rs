/// Errors from the loader. Each names the dataset, and where it applies the episode, camera and
/// frame it concerns.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The sampling request is not valid for the dataset (unknown key, offset off the frame
    /// grid, empty selection, rank outside the world, …).
    #[error("{0}")]
    Request(String),
    /// No dataset or view has the name (the message lists what the lake has).
    #[error("{0}")]
    NotFound(String),
    /// A dataset's tables do not have the shape ingest writes.
    #[error("dataset {dataset}: {message}")]
    Layout {
        /// Dataset name and version.
        dataset: String,
        /// What is wrong.
        message: String,
    },
    /// A frame could not be decoded.
    #[error("dataset {dataset}, camera {camera}, episode {episode}, frame {frame} (packet row {row}): {message}")]
    Decode {
        /// Dataset name and version.
        dataset: String,
        /// Camera key.
        camera: String,
        /// Episode index.
        episode: i64,
        /// Frame index in the episode.
        frame: i64,
        /// Row of the `packets` table.
        row: u64,
        /// What went wrong.
        message: String,
    },
    /// A sample shows a frame of an episode that was ingested without that camera's video
    /// (`lake ingest --missing-video keep-rows`).
    #[error(
        "dataset {dataset}, camera {camera}, episode {episode}, frame {frame}: the episode has no video for this camera (its file \
         was missing at ingest, and --missing-video keep-rows kept its rows only); sample the episodes that have it (`episodes`, or \
         a view that selects them)"
    )]
    NoVideo {
        /// Dataset name and version.
        dataset: String,
        /// Camera key.
        camera: String,
        /// Episode index.
        episode: i64,
        /// Frame index in the episode.
        frame: i64,
    },
    /// The machine refused a read of a dataset's files (too many open files, too little memory,
    /// no permission): the files are not at fault, and the read may succeed later.
    #[error("dataset {dataset}: {what} cannot be read now: {why}")]
    Machine {
        /// Dataset name and version.
        dataset: String,
        /// What was read.
        what: String,
        /// The machine's reason.
        why: String,
    },
    /// The lake could not be read.
    #[error(transparent)]
    Store(#[from] lake_store::Error),
    /// A Lance read failed.
    #[error("dataset {dataset}: reading {table}: {}", lake_store::lance_message(error))]
    Lance {
        /// Dataset name and version.
        dataset: String,
        /// The table.
        table: String,
        /// Lance's error (in this one's message, without Lance's internals).
        error: Box<lance::Error>,
    },
    /// Arrow failed while assembling a batch.
    #[error("assembling a batch: {0}")]
    Arrow(#[from] arrow_schema::ArrowError),
}

impl Error {
    pub(crate) fn request(message: impl Into<String>) -> Self {
        Self::Request(message.into())
    }

    pub(crate) fn layout(dataset: &str, message: impl Into<String>) -> Self {
        Self::Layout { dataset: dataset.to_string(), message: message.into() }
    }

    /// Whether this failed read of a frame table is the table's own fault (a frame damaged, a
    /// file cut short or gone, rows of the wrong size), so that the frames can be decoded from
    /// their packets instead; not when the machine or the lake's store refused the read, which
    /// the packets' read would meet too.
    pub(crate) fn frame_table_at_fault(&self) -> bool {
        match self {
            Self::Layout { .. } | Self::Decode { .. } => true,
            Self::Lance { error, .. } => lake_store::machine_error(error).is_none() && !lake_store::store_unreachable(error.as_ref()),
            Self::Store(e) => !lake_store::store_unreachable(e),
            _ => false,
        }
    }
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    #[test]
    fn error_stays_small() {
        assert!(std::mem::size_of::<super::Error>() <= 128, "{}", std::mem::size_of::<super::Error>());
    }
}
