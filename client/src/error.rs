/// Errors of the clients.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request is not valid; it was not sent.
    #[error("{0}")]
    Invalid(String),
    /// The server refused the request, or the connection to it failed (the message says which,
    /// with the server's status code).
    #[error("{0}")]
    Server(String),
    /// The server cannot be reached, went away, or is shutting down: another server of the
    /// lake can take the stream over from its cursor ([`crate::ServerPool`]).
    #[error("{0}")]
    Unavailable(String),
}

/// Results of the clients.
pub type Result<T, E = Error> = std::result::Result<T, E>;
