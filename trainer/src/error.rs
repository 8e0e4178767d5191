//! The crate's one error type.

use std::path::PathBuf;

/// What went wrong building, running, saving or loading a policy (ACT or Diffusion).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A configuration value that LeRobot's policy (or lake's implementation of it) does not accept.
    /// A user error: report it with the field named.
    #[error("invalid policy config: {field}: {reason}")]
    InvalidConfig {
        /// The `config.json` field at fault.
        field: String,
        /// Why the value is refused.
        reason: String,
    },
    /// The dataset features cannot drive the policy (no camera and no environment state, no
    /// `action`, a shape of the wrong rank).
    #[error("features: {0}")]
    Features(String),
    /// A file that is not as LeRobot writes it (a config that does not parse, a processor file
    /// without its normaliser step, a state file with a malformed key).
    #[error("{path}: {reason}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong in it.
        reason: String,
    },
    /// Normalisation statistics missing for a feature the mode needs them for.
    #[error("normalisation stats: {0}")]
    Stats(String),
    /// A checkpoint whose tensors do not fit the architecture its config (or the caller) asks
    /// for; names the key and both shapes.
    #[error("checkpoint {path}: tensor {key}: {reason}")]
    Mismatch {
        /// The `model.safetensors` (or weights) file.
        path: PathBuf,
        /// The state-dict key.
        key: String,
        /// Expected versus found.
        reason: String,
    },
    /// A batch whose tensors do not fit the policy (missing camera, wrong shape).
    #[error("batch: {0}")]
    Batch(String),
    /// Image transforms that lake does not apply, or arguments torchvision would refuse; names
    /// the transform.
    #[error("image transforms: {0}")]
    Transforms(String),
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// A safetensors file could not be parsed or written.
    #[error("{path}: safetensors: {source}")]
    SafeTensors {
        /// The file.
        path: PathBuf,
        /// The parser's error.
        source: safetensors::SafeTensorError,
    },
    /// The training data could not be had: a dataset that is not in the lake, a server that
    /// refused the stream or went away, a frame that cannot be decoded (the message names it).
    #[error("{0}")]
    Data(String),
    /// A run that cannot start or go on as asked (a resume whose checkpoint is missing or was
    /// made for another run, an option this build lacks).
    #[error("{0}")]
    Run(String),
    /// The ranks of a data-parallel run could not meet or exchange values: a launch whose
    /// variables are incomplete, a rendezvous that timed out, a rank that went away.
    #[error("ranks: {0}")]
    Ranks(String),
    /// libtorch reported an error (a shape mismatch inside an operation, an unavailable device).
    #[cfg(feature = "torch")]
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.into();
        move |source| Error::Io { path, source }
    }

    pub(crate) fn config(field: &str, reason: impl Into<String>) -> Error {
        Error::InvalidConfig { field: field.to_string(), reason: reason.into() }
    }

    pub(crate) fn format(path: impl Into<PathBuf>, reason: impl Into<String>) -> Error {
        Error::Format { path: path.into(), reason: reason.into() }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn error_stays_small() {
        assert!(std::mem::size_of::<super::Error>() <= 80, "{}", std::mem::size_of::<super::Error>());
    }
}
