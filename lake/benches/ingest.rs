//! Ingest throughput: `lake ingest` of the bundled `v30-av1-small` sample (2 cameras, AV1,
//! 30 fps) and of larger datasets made by repeating it, each into a fresh lake, as a child
//! process whose wall time and peak RSS are measured. Prints one table.
//!
//! ```text
//! cargo bench -p lake --bench ingest              # sizes 1x, 10x, 50x; 3 runs each
//! cargo bench -p lake --bench ingest -- 1 100     # choose the repeat factors
//! LAKE_BENCH_RUNS=5 cargo bench -p lake --bench ingest
//! LAKE_BENCH_DIR=/tmp cargo bench -p lake --bench ingest   # keep the generated data
//! ```
//!
//! "x real time" is seconds of recording (steps / fps) per wall-clock second of ingest;
//! frames/s counts camera frames (both cameras); MB/s is source bytes per second; "CPU ms/s"
//! is CPU time (user + system, all threads) per second of recording, which stays meaningful
//! on a machine whose wall-clock times are noisy.
#![allow(clippy::print_stdout, clippy::print_stderr)] // a bench binary prints its table

use std::{path::Path, process::Command, time::Instant};

use lake_testkit::{repeat_dataset, testdata};

struct Run {
    seconds: f64,
    cpu_seconds: f64,
    peak_rss_mb: f64,
}

fn dir_bytes(dir: &Path) -> u64 {
    lake_testkit::snapshot(dir, &[])
        .keys()
        .filter(|k| !k.ends_with('/'))
        .map(|k| std::fs::metadata(dir.join(k)).map_or(0, |m| m.len()))
        .sum()
}

/// Runs `lake ingest` once into a fresh lake; returns wall time and the child's peak RSS.
fn ingest_once(src: &Path, lake: &Path) -> Run {
    let _ = std::fs::remove_dir_all(lake);
    let started = Instant::now();
    #[allow(clippy::zombie_processes)] // reaped by wait4 below, which also gives its rusage
    let child = Command::new(env!("CARGO_BIN_EXE_lake"))
        .arg("--lake")
        .arg(lake)
        .arg("ingest")
        .arg(src)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("spawn lake");
    let mut status = 0;
    // SAFETY: waiting for our own child; rusage is plain data written by the kernel.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    let seconds = started.elapsed().as_secs_f64();
    assert!(pid > 0 && libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "lake ingest failed (status {status})");
    let cpu = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Run { seconds, cpu_seconds: cpu(usage.ru_utime) + cpu(usage.ru_stime), peak_rss_mb: usage.ru_maxrss as f64 / 1024.0 }
}

fn main() {
    let factors: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let factors = if factors.is_empty() { vec![1, 10, 50] } else { factors };
    let runs: usize = std::env::var("LAKE_BENCH_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(3);
    let (_guard, work) = lake_testkit::bench_workdir();
    let sample = testdata("v30-av1-small");
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("lake ingest throughput ({runs} runs each, median; {cores} cores; fresh lake per run; source in page cache)");
    println!(
        "{:<22} {:>7} {:>7} {:>9} {:>8} {:>8} {:>9} {:>7} {:>11} {:>9} {:>11}",
        "dataset", "steps", "frames", "source MB", "wall s", "CPU s", "frames/s", "MB/s", "x real time", "CPU ms/s", "peak RSS MB"
    );
    for factor in factors {
        let src = if factor == 1 {
            sample.clone()
        } else {
            let dir = work.join(format!("av1-small-x{factor}"));
            repeat_dataset(&sample, &dir, factor);
            dir
        };
        let steps = 600 * factor as u64;
        let frames = steps * 2;
        let bytes = dir_bytes(&src);
        // Each lake is removed once measured: at x2000 one takes 9 GB.
        let lake = work.join("lake");
        ingest_once(&src, &lake); // page cache and first-run effects
        let mut results: Vec<Run> = (0..runs).map(|_| ingest_once(&src, &lake)).collect();
        let _ = std::fs::remove_dir_all(&lake);
        results.sort_by(|a, b| a.seconds.total_cmp(&b.seconds));
        let median = &results[results.len() / 2];
        let peak = results.iter().map(|r| r.peak_rss_mb).fold(0.0, f64::max);
        let mut cpu: Vec<f64> = results.iter().map(|r| r.cpu_seconds).collect();
        cpu.sort_by(f64::total_cmp);
        let cpu = cpu[cpu.len() / 2];
        let recorded = steps as f64 / 30.0;
        println!(
            "{:<22} {:>7} {:>7} {:>9.1} {:>8.3} {:>8.3} {:>9.0} {:>7.1} {:>11.0} {:>9.1} {:>11.0}",
            format!("v30-av1-small x{factor}"),
            steps,
            frames,
            bytes as f64 / 1e6,
            median.seconds,
            cpu,
            frames as f64 / median.seconds,
            bytes as f64 / 1e6 / median.seconds,
            recorded / median.seconds,
            cpu * 1e3 / recorded,
            peak
        );
    }
}
