use std::fmt;

/// Errors from parsing and validating metadata; they never involve I/O.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A path template in `info.json` could not be formatted.
    #[error("path template `{template}`: {message}")]
    Template {
        /// The template as written in `info.json`.
        template: String,
        /// What is wrong with it.
        message: String,
    },
    /// A metadata document does not have the shape LeRobot writes.
    #[error("{what}: {message}")]
    Metadata {
        /// The document and field, e.g. `meta/info.json: features.action.shape`.
        what: String,
        /// What is wrong with it.
        message: String,
    },
}

impl Error {
    /// A metadata error about `what` (a document and field).
    pub fn metadata(what: impl fmt::Display, message: impl fmt::Display) -> Self {
        Self::Metadata { what: what.to_string(), message: message.to_string() }
    }
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
