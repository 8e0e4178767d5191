//! CPU time and memory of this process and thread, as the benches and the trainer report them.

/// What this process has used so far.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProcessUsage {
    /// User plus system CPU seconds of every thread.
    pub cpu_s: f64,
    /// Peak resident set size, MiB.
    pub peak_rss_mb: f64,
}

/// This process's CPU time and peak RSS (`getrusage(RUSAGE_SELF)`).
pub fn process_usage() -> ProcessUsage {
    // SAFETY: getrusage fills the struct we pass.
    let usage = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        u
    };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    ProcessUsage { cpu_s: seconds(usage.ru_utime) + seconds(usage.ru_stime), peak_rss_mb: usage.ru_maxrss as f64 / 1024.0 }
}

/// CPU seconds of the calling thread.
pub(crate) fn thread_cpu_seconds() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime fills the struct we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}
