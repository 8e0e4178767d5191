//! Opening a Lance table, with a damaged manifest as an error rather than a panic.

use lance::Dataset;

/// Opens the Lance table at `uri`. Lance trusts the offsets a manifest holds, and a manifest
/// damaged outside lake (truncated, overwritten) can make it panic: that becomes an error
/// saying the manifest is damaged, with the panic's message, and nothing is printed for it.
///
/// # Errors
/// Lance's error, or [`lance::Error::CorruptFile`] for a manifest Lance cannot read.
pub async fn open_lance(uri: &str) -> lance::Result<Dataset> {
    use futures::FutureExt;
    quiet_panics::install();
    let opening = async {
        match crate::remote::is_remote(uri) {
            // Tables on object stores are read through lake's clients for them.
            true => lance::dataset::builder::DatasetBuilder::from_uri(uri).with_session(crate::remote::session()).load().await,
            false if crate::local_io::uring() => {
                lance::dataset::builder::DatasetBuilder::from_uri(crate::local_io::lance_uri(uri)).load().await
            }
            false => Dataset::open(uri).await,
        }
    };
    match std::panic::AssertUnwindSafe(quiet_panics::Quiet(Box::pin(opening))).catch_unwind().await {
        Ok(opened) => opened,
        Err(panic) => {
            let why = panic.downcast_ref::<&str>().map(ToString::to_string).or_else(|| panic.downcast_ref::<String>().cloned());
            Err(lance::Error::corrupt_file(
                object_store::path::Path::from(format!("{uri}/_versions")),
                format!("the table's manifest is damaged (Lance failed reading it: {})", why.as_deref().unwrap_or("a panic")),
            ))
        }
    }
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
    }

    /// Puts a panic hook in front of the one in place that stays silent while a [`Quiet`]
    /// future is being polled on the panicking thread.
    pub fn install() {
        static ONCE: Once = Once::new();
        ONCE.call_once(|| {
            let previous = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                if !QUIET.with(Cell::get) {
                    previous(info);
                }
            }));
        });
    }

    /// A future whose panics are not printed (the caller catches them).
    pub struct Quiet<F>(pub F);

    impl<F: Future + Unpin> Future for Quiet<F> {
        type Output = F::Output;

        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
            let _restore = Restore(QUIET.with(|q| q.replace(true)));
            Pin::new(&mut self.0).poll(cx)
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
