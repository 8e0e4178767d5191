//! Numbers in words for what the CLI prints.

/// Bytes in the decimal unit that keeps one to three digits before the point (`32.0 MB`).
pub fn decimal_bytes(n: u64) -> String {
    let units = ["bytes", "kB", "MB", "GB", "TB", "PB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1000.0 && unit + 1 < units.len() {
        value /= 1000.0;
        unit += 1;
    }
    if unit == 0 { format!("{n} bytes") } else { format!("{value:.1} {}", units[unit]) }
}

/// `n` and `noun`, plural unless `n` is 1 (`1 episode`, `3 episodes`; a noun's plural adds `s`).
pub fn count(n: impl Into<u64>, noun: &str) -> String {
    let n = n.into();
    if n == 1 { format!("1 {noun}") } else { format!("{n} {noun}s") }
}
