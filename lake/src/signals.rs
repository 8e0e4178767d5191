//! How the process is asked to stop, and how a closed pipe reads.

/// Whether this process started with SIGINT ignored (a background job of a shell script):
/// Ctrl-C at the terminal is then not meant for it, and lake keeps ignoring it.
static INTERRUPT_IGNORED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

pub(crate) fn interrupt_ignored() -> bool {
    *INTERRUPT_IGNORED.get_or_init(|| {
        // SAFETY: reads the current action of SIGINT (a null new action changes nothing).
        unsafe {
            let mut current: libc::sigaction = std::mem::zeroed();
            libc::sigaction(libc::SIGINT, std::ptr::null(), &raw mut current) == 0 && current.sa_sigaction == libc::SIG_IGN
        }
    })
}

/// Resolves when the process is asked to stop, with the exit status that says so: 130 for
/// SIGINT (Ctrl-C, unless the process started with it ignored), 143 for SIGTERM.
pub(crate) async fn stop_requested() -> u8 {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut terminate) = signal(SignalKind::terminate()) else {
        return std::future::pending().await;
    };
    if interrupt_ignored() {
        terminate.recv().await;
        return 143;
    }
    let Ok(mut interrupt) = signal(SignalKind::interrupt()) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = interrupt.recv() => 130,
        _ = terminate.recv() => 143,
    }
}

/// Whether `e` is a write to a pipe whose reader has gone. (Writers that keep only the message,
/// CSV's and JSON's, say so in words.)
pub(crate) fn reader_gone(e: &anyhow::Error) -> bool {
    let broken_pipe = std::io::Error::from(std::io::ErrorKind::BrokenPipe).to_string();
    let os_broken_pipe = std::io::Error::from_raw_os_error(32).to_string();
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            || c.to_string().contains(&os_broken_pipe)
            || c.to_string().ends_with(&broken_pipe)
    })
}
