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
    #[error("dataset name `{}`: {message}", abbreviated(name))]
    BadName {
        /// The name as given.
        name: String,
        /// What is wrong.
        message: String,
    },
    /// No dataset (or version) of that name.
    #[error("no dataset `{name}` in the lake at {root}{}{}", available_hint(.available), removed_hint(.removed.as_deref()))]
    NotFound {
        /// The name asked for (with `@version` when one was given).
        name: String,
        /// The lake root.
        root: String,
        /// The datasets that do exist.
        available: Vec<String>,
        /// When `lake rm` removed the dataset of that name.
        removed: Option<Box<crate::removal::Removal>>,
    },
    /// A view name is taken, or a view does not exist.
    #[error("view `{name}`: {message}")]
    View {
        /// The view name.
        name: String,
        /// What is wrong.
        message: String,
    },
    /// Other writers kept taking the version numbers a commit tried.
    #[error("dataset `{name}`: other ingests kept committing versions (up to {version}) while this one tried to; run it again")]
    Conflict {
        /// Dataset name.
        name: String,
        /// The last version number tried.
        version: u64,
    },
    /// `lake rm` without `--force` of a dataset that views select from.
    #[error("{}", selected_message(name, views))]
    Selected {
        /// Dataset name.
        name: String,
        /// The views, as `NAME@VERSION`.
        views: Vec<String>,
    },
    /// `lake rm` removed the dataset while a version of it was being committed, through the
    /// number that version took.
    #[error("dataset `{name}` was removed with `lake rm` while this ingest committed it as version {version}; run the ingest again")]
    RemovedWhileCommitting {
        /// Dataset name.
        name: String,
        /// The version number taken.
        version: u64,
    },
    /// An ingest's lease was taken over by another process's garbage collection (the ingest
    /// stopped renewing it for longer than a lease lasts), so it must not commit.
    #[error(
        "dataset `{name}`: this ingest's lease was collected by another process (it went unrenewed for longer than {expiry_minutes} \
         minutes: was this process paused, or cut off from the store?); nothing was committed, run the ingest again"
    )]
    LeaseLost {
        /// Dataset name.
        name: String,
        /// How long a lease lasts unrenewed.
        expiry_minutes: i64,
    },
    /// Writing a commit record failed in a way that leaves unknown whether it was written (the
    /// store took the request and the answer was lost), and reading it back failed too.
    #[error(
        "dataset `{name}`: whether version {version} was committed is unknown ({message}); `lake ls` shows whether it was, and the \
         next ingest removes what this one wrote if not"
    )]
    CommitUnknown {
        /// Dataset name.
        name: String,
        /// The version number tried.
        version: u64,
        /// What failed.
        message: String,
    },
    /// A dataset is removed (its removal record is written) but deleting its files failed.
    #[error(
        "dataset `{name}` is removed (no reader sees it any more), but deleting its files failed: {message}; `lake rm {name}` again, \
         or the next ingest, deletes what is left"
    )]
    Unfinished {
        /// Dataset name.
        name: String,
        /// Why deleting failed.
        message: String,
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
    #[error("table {table}: {}", lance_message(error))]
    Lance {
        /// The table's path relative to the lake root.
        table: String,
        /// Lance's error (its message is in this one's, without Lance's internals; not a
        /// `source`, so that they are not printed after it).
        error: Box<lance::Error>,
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

/// What `lake rm` says of a dataset that views select from.
pub fn selected_message(name: &str, views: &[String]) -> String {
    let one = views.len() == 1;
    format!(
        "dataset `{name}` is selected from by {} {}: drop {} first (`lake view drop NAME`), or pass --force (loading {} then fails, \
         saying the dataset was removed)",
        if one { "view" } else { "views" },
        views.join(", "),
        if one { "it" } else { "them" },
        if one { "it" } else { "them" },
    )
}

/// `; NAME was removed …` when a removal explains why a dataset is missing.
pub fn removed_hint(removed: Option<&crate::removal::Removal>) -> String {
    removed.map_or_else(String::new, |r| format!("; {r}"))
}

fn available_hint(available: &[String]) -> String {
    if available.is_empty() { " (the lake is empty)".to_string() } else { format!(" (it has: {})", available.join(", ")) }
}

/// Lance's error for users: a missing table said plainly, and without the Rust source file
/// locations Lance appends (`, /…/src/io/commit.rs:653:26`).
pub fn lance_message(e: &lance::Error) -> String {
    if matches!(e, lance::Error::DatasetNotFound { .. }) {
        return "the table's files are missing from the lake (removed or damaged); ingesting the dataset's source again makes \
                a new, whole version"
            .into();
    }
    if let lance::Error::CorruptFile { path, source, .. } = e {
        // Lance keeps local paths without their leading `/`.
        return format!("file /{path} is damaged: {}", without_source_locations(&source.to_string()));
    }
    let message = without_source_locations(&e.to_string());
    // A panic in one of Lance's tasks, which Lance passes on as its error (`Wrapped error: task 7
    // panicked with message "…"`): its decoders met a damaged file.
    if let Some((_, words)) = message.split_once(" panicked with message ") {
        return format!("Lance failed reading the table's data: {}", words.trim().trim_matches('"'));
    }
    // Lance's variant name (`LanceError(IO): …`) says nothing to a user.
    match message.strip_prefix("LanceError(").and_then(|rest| rest.split_once("): ")) {
        Some((_, rest)) => rest.to_string(),
        None => message,
    }
}

/// The operating system's refusal behind `e`, where a read failed for a reason of the machine
/// rather than of the files read (descriptors or memory run out, permission refused), as a
/// message to show instead of calling the files damaged.
pub fn machine_error(e: &lance::Error) -> Option<String> {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(error) = next {
        if let Some(io) = error.downcast_ref::<std::io::Error>()
            && let Some(code) = io.raw_os_error()
            && [libc::EMFILE, libc::ENFILE, libc::ENOMEM, libc::EACCES, libc::EPERM, libc::EAGAIN].contains(&code)
        {
            let hint = if matches!(code, libc::EMFILE | libc::ENFILE) { "; raise the limit on open files (`ulimit -n`)" } else { "" };
            return Some(format!("{io}{hint}"));
        }
        next = error.source();
    }
    None
}

/// `message` without the source file locations some libraries' errors carry (`, /…/x.rs:12:5`,
/// `, src/x.rs:12:5`).
pub fn without_source_locations(message: &str) -> String {
    let location = |part: &str| {
        part.contains(".rs:") && !part.contains(' ') && part.rsplit(':').next().is_some_and(|n| n.chars().all(|c| c.is_ascii_digit()))
    };
    message.split(", ").filter(|part| !location(part)).collect::<Vec<_>>().join(", ")
}

/// An object store's error in one line, with its causes (which name the request that failed: a
/// refused connection, a timeout) where its own message leaves them out.
pub fn store_message(e: &object_store::Error) -> String {
    let mut message = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        let text = cause.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = cause.source();
    }
    message
}

/// Why the lake's storage refused a write, when `e` (or one of its causes) says it did: a
/// read-only file system, a file or directory without write permission, or an object store that
/// refuses the credentials' write (403) or has none (401). A refusal of that kind does not go away
/// by asking again.
pub fn write_refusal(e: &(dyn std::error::Error + 'static)) -> Option<&'static str> {
    let mut cause = Some(e);
    while let Some(e) = cause {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            match io.kind() {
                std::io::ErrorKind::ReadOnlyFilesystem => return Some("its file system is read-only"),
                std::io::ErrorKind::PermissionDenied => return Some("its files may not be written by the server's user"),
                _ => {}
            }
        }
        match e.downcast_ref::<object_store::Error>() {
            Some(object_store::Error::PermissionDenied { .. }) => return Some("its object store refuses the server's credentials a write"),
            Some(object_store::Error::Unauthenticated { .. }) => return Some("its object store takes no write without credentials"),
            _ => {}
        }
        cause = e.source();
    }
    None
}

/// Whether `e` or one of its causes says that the lake's object store could not be reached (no
/// connection, a request cut or timed out) or answered only with server errors (5xx, 429) through
/// its retries: a failure that passes with the store, unlike a refusal, a missing object or a
/// damaged file.
pub fn store_unreachable(e: &(dyn std::error::Error + 'static)) -> bool {
    if let Some(Error::Lance { error, .. }) = e.downcast_ref::<Error>() {
        return store_unreachable(error.as_ref());
    }
    unreachable_link(e) || e.source().is_some_and(store_unreachable)
}

/// Whether `e` itself, not its causes, is an object store request that could not reach the
/// store or was answered with a server error.
pub fn unreachable_link(e: &(dyn std::error::Error + 'static)) -> bool {
    use object_store::client::{HttpError, HttpErrorKind};
    if let Some(http) = e.downcast_ref::<HttpError>() {
        return matches!(
            http.kind(),
            HttpErrorKind::Connect | HttpErrorKind::Request | HttpErrorKind::Timeout | HttpErrorKind::Interrupted
        );
    }
    // object_store's retry error, which holds the status, is private; its message is its status.
    e.to_string()
        .strip_prefix("Server returned non-2xx status code: ")
        .is_some_and(|status| status.starts_with('5') || status.starts_with("429"))
}

impl Error {
    pub(crate) fn store(path: impl Into<String>) -> impl FnOnce(object_store::Error) -> Self {
        let path = path.into();
        move |source| Self::ObjectStore { path, source }
    }

    pub(crate) fn lance(table: impl Into<String>) -> impl FnOnce(lance::Error) -> Self {
        let table = table.into();
        move |source| Self::Lance { table, error: Box::new(source) }
    }
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A name as an error shows it: a long one (no valid name is over 128 characters) cut to its
/// first 64 characters, with its length.
pub fn abbreviated(name: &str) -> String {
    match name.char_indices().nth(64) {
        Some((end, _)) if name.chars().count() > 128 => format!("{}… ({} characters)", &name[..end], name.chars().count()),
        _ => name.to_string(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn long_names_are_cut_in_errors() {
        assert_eq!(super::abbreviated("ds"), "ds");
        let long = "a".repeat(8000);
        assert_eq!(super::abbreviated(&long), format!("{}… (8000 characters)", "a".repeat(64)));
    }

    /// A read that failed for want of file descriptors says so, directly from the OS or through
    /// the object store; a file cut short (no OS error) is the files' fault.
    #[test]
    fn a_machine_error_is_told_apart_from_a_damaged_file() {
        let emfile = || std::io::Error::from_raw_os_error(libc::EMFILE);
        let direct = lance::Error::from(emfile());
        let stored = lance::Error::from(object_store::Error::Generic { store: "LocalFileSystem", source: Box::new(emfile()) });
        for e in [direct, stored] {
            let why = super::machine_error(&e).unwrap_or_else(|| panic!("{e}"));
            assert!(why.contains("Too many open files") && why.contains("`ulimit -n`"), "{why}");
        }
        let cut = lance::Error::from(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "early eof"));
        assert_eq!(super::machine_error(&cut), None);
    }

    /// A write the storage refuses is told apart, through the lake's and the store's errors,
    /// from one that failed otherwise.
    #[test]
    fn a_refused_write_is_told_apart_from_other_failures() {
        let local = |errno| super::Error::ObjectStore {
            path: "views/v/v00000001.json".into(),
            source: object_store::Error::Generic { store: "LocalFileSystem", source: Box::new(std::io::Error::from_raw_os_error(errno)) },
        };
        assert_eq!(super::write_refusal(&local(libc::EROFS)), Some("its file system is read-only"));
        assert_eq!(super::write_refusal(&local(libc::EACCES)), Some("its files may not be written by the server's user"));
        assert_eq!(super::write_refusal(&local(libc::ENOSPC)), None);
        let denied = object_store::Error::PermissionDenied { path: "views/v".into(), source: "AccessDenied".into() };
        assert_eq!(
            super::write_refusal(&super::Error::ObjectStore { path: "views/v".into(), source: denied }).map(|w| w.contains("refuses")),
            Some(true)
        );
        let missing = object_store::Error::NotFound { path: "views/v".into(), source: "NoSuchKey".into() };
        assert_eq!(super::write_refusal(&missing), None);
    }

    /// A store that could not be reached, or answered with server errors, is told apart from
    /// one that answered: through the lake's errors, and through Lance's held beside them.
    #[test]
    fn an_unreachable_store_is_told_apart_from_one_that_answered() {
        use object_store::client::{HttpError, HttpErrorKind};
        let refused = || std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let generic = |source: Box<dyn std::error::Error + Send + Sync>| object_store::Error::Generic { store: "S3", source };
        let connect = generic(Box::new(HttpError::new(HttpErrorKind::Connect, refused())));
        let in_lance = super::Error::Lance {
            table: "steps.lance".into(),
            error: Box::new(lance::Error::from(generic(Box::new(HttpError::new(HttpErrorKind::Timeout, refused()))))),
        };
        assert!(super::store_unreachable(&connect));
        assert!(super::store_unreachable(&in_lance));
        #[derive(Debug, thiserror::Error)]
        #[error("Server returned non-2xx status code: {0}")]
        struct Status(&'static str);
        for (status, unreachable) in
            [("503 Service Unavailable", true), ("429 Too Many Requests", true), ("404 Not Found", false), ("403 Forbidden", false)]
        {
            assert_eq!(super::store_unreachable(&generic(Box::new(Status(status)))), unreachable, "{status}");
        }
        assert!(!super::store_unreachable(&generic(Box::new(HttpError::new(HttpErrorKind::Decode, refused())))));
        let missing = object_store::Error::NotFound { path: "catalog/x".into(), source: "NoSuchKey".into() };
        assert!(!super::store_unreachable(&super::Error::ObjectStore { path: "catalog/x".into(), source: missing }));
    }

    #[test]
    fn error_stays_small() {
        assert!(std::mem::size_of::<super::Error>() <= 96, "{}", std::mem::size_of::<super::Error>());
    }
}
