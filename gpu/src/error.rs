//! The crate's one error type.

/// What went wrong reaching or using a GPU.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No usable GPU here: no driver library, no device, or no NVRTC to compile kernels with.
    /// The message says which; callers take their CPU path.
    #[error("no GPU: {0}")]
    Unavailable(String),
    /// NVRTC refused the kernels (its log follows).
    #[error("NVRTC could not compile lake's kernels: {0}")]
    Compile(String),
    /// The CUDA driver reported an error.
    #[error("CUDA: {0}")]
    Driver(String),
    /// Buffers or sizes that do not describe the frames asked for.
    #[error("{0}")]
    Layout(String),
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<cudarc::driver::DriverError> for Error {
    fn from(e: cudarc::driver::DriverError) -> Self {
        Error::Driver(e.to_string())
    }
}
