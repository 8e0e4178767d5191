//! Opening and reading Lance tables, with damaged files as errors rather than panics.

use std::{
    pin::Pin,
    task::{Context, Poll},
};

use futures::{FutureExt, Stream};
use lance::Dataset;

/// Opens the Lance table at `uri`. Lance trusts the offsets and the column types a manifest
/// holds, and a manifest damaged outside lake (truncated, overwritten) can make it panic while
/// opening, or later where it turns the table's schema into Arrow's (an unknown type name):
/// both become an error saying the manifest is damaged, with the panic's message, and nothing
/// is printed for it.
///
/// # Errors
/// Lance's error, or [`lance::Error::CorruptFile`] for a manifest Lance cannot read.
pub async fn open_lance(uri: &str) -> lance::Result<Dataset> {
    let opening = async {
        match crate::remote::is_remote(uri) {
            // Tables on object stores are read through lake's clients for them.
            true => lance::dataset::builder::DatasetBuilder::from_uri(uri).with_session(crate::remote::session()).load().await,
            false if crate::local_io::uring() => {
                lance::dataset::builder::DatasetBuilder::from_uri(crate::local_io::lance_uri(uri)).load().await
            }
            false => Dataset::open(uri).await,
        }
        .inspect(|dataset| {
            // Every reader asks for the Arrow schema; a type Lance cannot map panics here.
            let _ = arrow_schema::Schema::from(dataset.schema());
        })
    };
    let dataset = caught(opening).await.unwrap_or_else(|why| Err(damaged(uri, Part::Manifest, &why)))?;
    if !crate::remote::is_remote(uri) {
        local_footers_sound(uri, &dataset)?;
    }
    Ok(dataset)
}

/// Checks the footer of each data file of `dataset` (the table at `uri`, on the local
/// filesystem) that has the size it was written with. Lance allocates what a footer's counts and
/// offsets ask for before it reads a file: one damaged in place could ask for more memory than
/// the machine has, which aborts the process rather than panicking. A file of another size, or
/// gone, is left to the readers' own checks, which say so in those words; a file on an object
/// store is written whole, once.
fn local_footers_sound(uri: &str, dataset: &Dataset) -> lance::Result<()> {
    let data = std::path::Path::new(uri).join("data");
    for fragment in dataset.fragments().iter() {
        for file in fragment.files.iter().filter(|f| f.base_id.is_none()) {
            let path = data.join(&file.path);
            let written = file.file_size_bytes.get().map(u64::from);
            let why = match footer_damage(&path, written) {
                Ok(None) => continue,
                Ok(Some(why)) => why,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(lance::Error::from(e)),
            };
            return Err(lance::Error::corrupt_file(object_store::path::Path::from(path.to_string_lossy().as_ref()), why));
        }
    }
    Ok(())
}

/// The bytes at the end of a Lance 2.x data file: where its column metadata, the table of their
/// offsets and the table of its global buffers begin, their counts, the format's version and
/// `LANC`.
const FOOTER_LEN: u64 = 40;

/// What is wrong with the footer of the Lance data file at `path`, if anything: its tables must
/// lie in order before the footer, exactly as long as its counts say, and every buffer they
/// name inside the file. A file of another size than `written` (where known), and files of
/// Lance's legacy format (1.x and earlier), are not checked.
fn footer_damage(path: &std::path::Path, written: Option<u64>) -> std::io::Result<Option<String>> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::open(path)?;
    let size = file.metadata()?.len();
    if written.is_some_and(|w| w != size) {
        return Ok(None);
    }
    if size < FOOTER_LEN {
        return Ok(Some(format!("{size} bytes, shorter than a Lance file's footer")));
    }
    let mut footer = [0u8; FOOTER_LEN as usize];
    file.read_exact_at(&mut footer, size - FOOTER_LEN)?;
    let u64_at = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
    let u32_at = |at: usize| u64::from(u32::from_le_bytes(footer[at..at + 4].try_into().expect("4 bytes")));
    if &footer[36..] != b"LANC" {
        return Ok(Some("its footer does not end in Lance's magic bytes".into()));
    }
    let major = u16::from_le_bytes([footer[32], footer[33]]);
    if major < 2 {
        return Ok(None);
    }
    let (meta, meta_offsets, buffer_offsets) = (u64_at(&footer, 0), u64_at(&footer, 8), u64_at(&footer, 16));
    let (buffers, columns) = (u32_at(24), u32_at(28));
    let end = size - FOOTER_LEN;
    let laid_out = meta <= meta_offsets
        && meta_offsets.checked_add(columns * 16) == Some(buffer_offsets)
        && buffer_offsets.checked_add(buffers * 16) == Some(end);
    if !laid_out {
        return Ok(Some(format!(
            "its footer does not fit the file: {columns} columns and {buffers} global buffers, tables at bytes {meta}, \
             {meta_offsets} and {buffer_offsets} of {size}"
        )));
    }
    let mut tables = vec![0u8; (end - meta_offsets) as usize];
    file.read_exact_at(&mut tables, meta_offsets)?;
    for (i, entry) in tables.chunks_exact(16).enumerate() {
        let (position, len) = (u64_at(entry, 0), u64_at(entry, 8));
        if position.checked_add(len).is_none_or(|last| last > size) {
            let what = if (i as u64) < columns { "column metadata" } else { "a global buffer" };
            return Ok(Some(format!("its footer names {what} of {len} bytes at byte {position}, past the file's {size}")));
        }
    }
    Ok(None)
}

/// `reading`, a read of the Lance table at `uri`. Lance's decoders trust the bytes of a table's
/// data files, and a file damaged in place (its size unchanged) can make them panic: that
/// becomes an error saying the table's data is damaged, with the panic's message.
///
/// Neither the panic of one of Lance's tasks nor the one Lance raises where it awaits it is
/// printed.
///
/// # Errors
/// `reading`'s error, or [`lance::Error::CorruptFile`] for data Lance cannot read.
pub fn read_lance<F, T>(uri: &str, reading: F) -> impl Future<Output = lance::Result<T>> + use<F, T>
where
    F: Future<Output = lance::Result<T>>,
{
    let uri = uri.to_string();
    caught(reading).map(move |read| read.unwrap_or_else(|why| Err(damaged(&uri, Part::Data, &why))))
}

/// [`read_lance`] for a stream of batches (Lance's, or a query engine's over a Lance table): a
/// panic while one is read is the stream's last item, the error saying the table's data is
/// damaged.
pub fn stream_lance<S, T, E>(uri: &str, stream: S) -> impl Stream<Item = Result<T, E>> + Send + use<S, T, E>
where
    S: Stream<Item = Result<T, E>> + Send + Unpin,
    E: From<lance::Error>,
{
    quiet_panics::install();
    Guarded { inner: Some(stream), uri: uri.to_string() }
}

/// Which part of a table a panic says is damaged.
enum Part {
    Manifest,
    Data,
}

fn damaged(uri: &str, part: Part, why: &str) -> lance::Error {
    let (dir, message) = match part {
        Part::Manifest => ("_versions", format!("the table's manifest is damaged (Lance failed reading it: {why})")),
        Part::Data => ("data", format!("Lance failed reading the table's data: {why}")),
    };
    lance::Error::corrupt_file(object_store::path::Path::from(format!("{uri}/{dir}")), message)
}

/// `future`'s output, or the words of the panic it raised (not printed).
/// (`future` is boxed at once: the caller's future holds a pointer to it, not a copy.)
fn caught<F: Future>(future: F) -> impl Future<Output = Result<F::Output, String>> {
    quiet_panics::install();
    std::panic::AssertUnwindSafe(quiet_panics::Quiet(Box::pin(future)))
        .catch_unwind()
        .map(|done| done.map_err(|panic| panic_words(&*panic)))
}

/// What a panic says: the message of a Lance error it carries in its `Debug` form (``called
/// `Result::unwrap()` on an `Err` value: Schema { message: "…", location: … }``), or of a
/// panic in a task Lance awaited (``JoinError::Panic(Id(7), "…", …)``), on one line.
fn panic_words(panic: &(dyn std::any::Any + Send)) -> String {
    let text = panic.downcast_ref::<&str>().map(ToString::to_string).or_else(|| panic.downcast_ref::<String>().cloned());
    let Some(text) = text else { return "a panic".into() };
    let quoted = text
        .split_once("message: \"")
        .map(|(_, rest)| rest)
        .or_else(|| text.split_once("JoinError::Panic(").and_then(|(_, rest)| rest.split_once('"')).map(|(_, rest)| rest));
    let words = quoted.and_then(|rest| rest.split_once('"')).map_or(text.as_str(), |(words, _)| words);
    words.replace("\\n", " ").split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The stream [`stream_lance`] returns.
struct Guarded<S> {
    inner: Option<S>,
    uri: String,
}

impl<S, T, E> Stream for Guarded<S>
where
    S: Stream<Item = Result<T, E>> + Unpin,
    E: From<lance::Error>,
{
    type Item = Result<T, E>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let Some(inner) = self.inner.as_mut() else { return Poll::Ready(None) };
        let polled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| quiet_panics::quietly(|| Pin::new(inner).poll_next(cx))));
        match polled {
            Ok(poll) => poll,
            Err(panic) => {
                self.inner = None;
                Poll::Ready(Some(Err(damaged(&self.uri, Part::Data, &panic_words(&*panic)).into())))
            }
        }
    }
}

/// Makes the panics raised on this thread from now on one line of the log each (where, and
/// the panic's words) instead of Rust's report with its backtrace. For threads that catch every
/// panic of the work they run and report it as that work's error (a query's thread); panics
/// Lance raises and lake catches stay silent there too.
pub fn log_panics_on_this_thread() {
    quiet_panics::log_on_this_thread();
}

/// Panics that a future is expected to raise (and whose unwinding is caught) are not printed.
mod quiet_panics {
    use std::{
        cell::Cell,
        pin::Pin,
        sync::Once,
        task::{Context, Poll},
    };

    thread_local! {
        static QUIET: Cell<bool> = const { Cell::new(false) };
        static LOGGED: Cell<bool> = const { Cell::new(false) };
    }

    /// Puts a panic hook in front of the one in place that stays silent while a [`Quiet`]
    /// future is being polled on the panicking thread, and for a panic inside Lance on a thread
    /// other than the process's main one: Lance runs its decoders as tasks on a runtime and finds
    /// their panics in the task it awaits, whose error or panic carries the message on (where
    /// lake reads, [`super::read_lance`], [`super::stream_lance`] and the SQL engine's guard make
    /// it an error). On the main thread nothing awaits a panic, so it is always printed.
    pub fn install() {
        static ONCE: Once = Once::new();
        ONCE.call_once(|| {
            let previous = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                if QUIET.with(Cell::get) || in_lance_task(info) {
                    return;
                }
                if LOGGED.with(Cell::get) {
                    let place = info.location().map_or_else(String::new, |l| format!(" at {}:{}", crate_path(l.file()), l.line()));
                    let payload = info.payload();
                    let words = payload.downcast_ref::<&str>().copied().or_else(|| payload.downcast_ref::<String>().map(String::as_str));
                    tracing::warn!(target: "lake::panic", "caught a panic{place}: {}", words.unwrap_or("(no message)"));
                    return;
                }
                previous(info);
            }));
        });
    }

    /// Whether a panic was raised in Lance's code (its crates are `lance` and `lance-*`) on a
    /// thread other than the main one (`main`, or lake's `lake-main`).
    fn in_lance_task(info: &std::panic::PanicHookInfo<'_>) -> bool {
        let in_lance = info.location().is_some_and(|l| l.file().contains("/lance-") || l.file().contains("\\lance-"));
        let main = std::thread::current().name().is_none_or(|n| n == "main" || n == "lake-main");
        in_lance && !main
    }

    /// Makes the panics raised on this thread from now on a line of the log (where, and the
    /// panic's words) instead of the default report with its backtrace: for threads whose every
    /// panic is caught and becomes the error of the work they run, which is reported as such.
    pub fn log_on_this_thread() {
        install();
        LOGGED.with(|l| l.set(true));
    }

    /// A source path from its crate's directory on (`arrow-buffer-58.4.1/src/buffer/offset.rs`),
    /// without the registry's or the checkout's directories before it.
    pub(super) fn crate_path(file: &str) -> &str {
        match file.rfind("/src/") {
            Some(at) => file[..at].rfind('/').map_or(file, |start| &file[start + 1..]),
            None => file,
        }
    }

    /// `f`, whose panics are not printed (the caller catches them).
    pub fn quietly<T>(f: impl FnOnce() -> T) -> T {
        let _restore = Restore(QUIET.with(|q| q.replace(true)));
        f()
    }

    /// A future whose panics are not printed (the caller catches them).
    pub struct Quiet<F>(pub F);

    impl<F: Future + Unpin> Future for Quiet<F> {
        type Output = F::Output;

        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
            quietly(|| Pin::new(&mut self.0).poll(cx))
        }
    }

    /// Puts back the flag as it was, also when the poll unwinds.
    struct Restore(bool);

    impl Drop for Restore {
        fn drop(&mut self) {
            QUIET.with(|q| q.set(self.0));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    /// The log's lines, kept.
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Lines {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("not poisoned").extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_thread_that_logs_its_panics_gives_each_one_line_naming_where() {
        let lines = Lines::default();
        let writer = lines.clone();
        let subscriber = tracing_subscriber::fmt().with_writer(move || writer.clone()).with_ansi(false).finish();
        let caught = std::thread::spawn(move || {
            tracing::subscriber::with_default(subscriber, || {
                super::log_panics_on_this_thread();
                std::panic::catch_unwind(|| panic!("a value past the engine's limits")).is_err()
            })
        })
        .join()
        .expect("the thread caught its panic");
        assert!(caught);
        let logged = String::from_utf8(lines.0.lock().expect("not poisoned").clone()).expect("utf-8");
        assert_eq!(logged.lines().count(), 1, "{logged}");
        assert!(logged.contains("WARN lake::panic: caught a panic at store/src/lance_open.rs:"), "{logged}");
        assert!(logged.trim_end().ends_with(": a value past the engine's limits"), "{logged}");
    }

    #[test]
    fn a_source_path_is_named_from_its_crate_on() {
        let registry = "/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/arrow-buffer-58.4.1/src/buffer/offset.rs";
        assert_eq!(super::quiet_panics::crate_path(registry), "arrow-buffer-58.4.1/src/buffer/offset.rs");
        assert_eq!(super::quiet_panics::crate_path("store/src/lance_open.rs"), "store/src/lance_open.rs");
        assert_eq!(super::quiet_panics::crate_path("build.rs"), "build.rs");
    }
}
