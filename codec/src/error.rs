//! What can go wrong in FFmpeg's hands, by what the caller does about it.

/// Why lake-codec could not open, read, decode or write a stream. Each message names what it
/// concerns (the packet, the picture, the file); callers add the dataset, episode and camera.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// FFmpeg does not know the codec, has no decoder for it, or cannot open one.
    #[error("{0}")]
    Open(String),
    /// A frame could not be produced from its packets or picture bytes.
    #[error("{0}")]
    Decode(String),
    /// A container could not be read: not a container FFmpeg knows, truncated, damaged.
    #[error("{0}")]
    Demux(String),
    /// A picture could not be encoded.
    #[error("{0}")]
    Encode(String),
    /// A container could not be written.
    #[error("{0}")]
    Mux(String),
    /// The caller's cancel flag stopped the read.
    #[error("cancelled")]
    Cancelled,
}

/// lake-codec's results.
pub type Result<T, E = Error> = std::result::Result<T, E>;
