//! `lake serve` under load, on loopback: the same ~10k-step dataset as the loader bench
//! (`v30-av1-small` repeated: 2 cameras, AV1 GOP 2, 480×640 + 96×128), `act` preset, 32 samples
//! per stream per batch. First the in-process figure (`lake bench`, same cache), then a real
//! `lake serve` child process read by 1, 8 and 64 concurrent streams for a fixed time each
//! (stream `r` of `n` is rank `r` of a world of `n`, so together they read one global order),
//! over Flight (loopback TCP) and then as local streams (shared memory, `serve --local`). Prints
//! the steady-state samples/s and bytes/s (batches received after the first third of each
//! level), batch latency p50/p99 (time a client waits for its next batch), over that window the
//! CPU milliseconds the server and the clients spent per sample, the packets the server decoded
//! per sample sent and the share of frames it showed from those decoded ahead (its
//! `/metrics`), the server's peak RSS for that level (against its memory budget plus cache
//! budget) and errors.
//!
//! ```text
//! cargo bench -p lake --bench serve                      # 17 repeats, 30 s per level, 1 8 64 streams
//! cargo bench -p lake --bench serve -- 17 30 1 8 64 128  # repeats, seconds per level, stream counts
//! LAKE_BENCH_DIR=/tmp cargo bench -p lake --bench serve  # keep the generated data and lake
//! LAKE_BENCH_MEMORY_MB=2048 LAKE_BENCH_CACHE_MB=0 cargo bench -p lake --bench serve  # server budgets
//! LAKE_BENCH_LOOKAHEAD=0 cargo bench -p lake --bench serve  # served streams do not decode ahead
//! LAKE_BENCH_TRANSPORTS=flight cargo bench -p lake --bench serve  # only Flight (or only local)
//! ```
#![allow(clippy::print_stdout, clippy::print_stderr)] // a bench binary prints its table

use std::{
    collections::HashMap,
    io::{BufRead, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use futures::StreamExt;
use lake_testkit::{bench_lake, run_lake};

// The clients stand in for trainers on other machines, but share this one with the server: they
// run on jemalloc and keep the pages they free, as `lake serve` does under load. With glibc's
// allocator, or jemalloc handing pages back (its defaults, or a 10 s decay), each 30 MB message
// was received into freshly faulted pages, a sixth of the machine's CPU at 64 streams.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The configuration jemalloc reads at start-up.
#[allow(non_upper_case_globals)] // the symbol name jemalloc reads its configuration from
#[unsafe(export_name = "_rjem_malloc_conf")]
pub static malloc_conf: &[u8] = b"dirty_decay_ms:-1,muzzy_decay_ms:-1,narenas:2,oversize_threshold:0\0";

const BATCH: u64 = 32;

/// A server setting (a number) from the environment, or its default.
fn setting(var: &str, default: u64) -> u64 {
    std::env::var(var).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn lake(root: &Path, args: &[&str]) -> String {
    run_lake(Path::new(env!("CARGO_BIN_EXE_lake")), root, args)
}

/// A `lake serve` child, killed when dropped.
struct Server {
    child: Child,
    flight: String,
    http: String,
    local: std::path::PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    fn start(root: &Path, cache_mb: u64, memory_mb: u64, lookahead: u64) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_lake"))
            .arg("--lake")
            .arg(root)
            .args(["serve", "--flight", "127.0.0.1:0", "--http", "127.0.0.1:0"])
            .args(["--cache-mb", &cache_mb.to_string(), "--memory-mb", &memory_mb.to_string()])
            .args(["--lookahead", &lookahead.to_string()])
            .arg("--local")
            .arg(root.with_file_name("serve.sock"))
            .stdout(Stdio::piped())
            .spawn()
            .expect("start lake serve");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("the server says where it listens");
        let addr = line.split_whitespace().find_map(|w| w.strip_prefix("grpc://")).unwrap_or_else(|| panic!("{line}")).to_string();
        let http = line.split_whitespace().find_map(|w| w.strip_prefix("http://")).unwrap_or_else(|| panic!("{line}")).to_string();
        Self { child, flight: format!("http://{addr}"), http, local: root.with_file_name("serve.sock") }
    }

    /// The server's counters (`GET /metrics`).
    fn metrics(&self) -> HashMap<String, f64> {
        let response = lake_testkit::http_request(&self.http, "GET", "/metrics", &[], b"");
        lake_testkit::prometheus_values(&String::from_utf8_lossy(&response.body))
    }

    /// A memory figure of the server's `/proc/PID/status` in MiB.
    fn status_mb(&self, key: &str) -> f64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap_or_default();
        let kb: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(f64::NAN);
        kb / 1024.0
    }

    /// Peak resident memory (MiB) since the last reset.
    fn peak_rss_mb(&self) -> f64 {
        self.status_mb("VmHWM:")
    }

    /// Resident memory now (MiB).
    fn rss_mb(&self) -> f64 {
        self.status_mb("VmRSS:")
    }

    /// Starts a new peak-RSS measurement (Linux: writing 5 to `clear_refs` resets VmHWM).
    fn reset_peak(&self) {
        let _ = std::fs::write(format!("/proc/{}/clear_refs", self.child.id()), "5");
    }
}

/// User plus system CPU seconds of process `pid`, all its threads (`/proc/PID/stat` counts
/// them in USER_HZ ticks, 100 per second on Linux).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) start at the state, field 3.
    let fields: Vec<&str> = stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace().collect()).unwrap_or_default();
    let ticks = |i: usize| fields.get(i - 3).and_then(|v| v.parse::<f64>().ok()).unwrap_or(f64::NAN);
    (ticks(14) + ticks(15)) / 100.0
}

/// CPU and server counters at a moment, or their change over a window.
struct Window {
    server_cpu: f64,
    client_cpu: f64,
    metrics: HashMap<String, f64>,
}

impl Window {
    fn since(self, from: &Window) -> Window {
        let metrics = self.metrics.iter().map(|(k, v)| (k.clone(), v - from.metrics.get(k).copied().unwrap_or(0.0))).collect();
        Window { server_cpu: self.server_cpu - from.server_cpu, client_cpu: self.client_cpu - from.client_cpu, metrics }
    }

    fn counter(&self, name: &str) -> f64 {
        self.metrics.get(name).copied().unwrap_or(f64::NAN)
    }
}

/// One batch a stream received.
struct Arrival {
    at: Instant,
    samples: u64,
    bytes: u64,
    latency_ms: f64,
}

/// What one stream saw.
#[derive(Default)]
struct Seen {
    batches: Vec<Arrival>,
    errors: u64,
}

/// How a stream reaches the server.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Transport {
    /// Arrow Flight over loopback TCP.
    Flight,
    /// A local stream: batches in shared memory.
    Local,
}

impl Transport {
    fn name(self) -> &'static str {
        match self {
            Self::Flight => "flight",
            Self::Local => "local",
        }
    }
}

/// Reads rank `rank` of `world` until `deadline`, then hangs up.
async fn read_stream(server: (String, std::path::PathBuf), transport: Transport, rank: u64, world: u64, deadline: Instant) -> Seen {
    let mut seen = Seen::default();
    let mut request = lake_client::SampleRequest::new(["bench"]);
    (request.preset, request.batch_size, request.rank, request.world_size) = ("act".into(), BATCH, rank, world);
    let mut asked = Instant::now();
    // lake's Rust clients (the same Flight stream any client reads; local streams' batches are
    // views of the server's shared memory).
    let (flight, local) = server;
    let stream = async {
        match transport {
            Transport::Flight => lake_client::RemoteLoader::connect(&flight, None).await?.stream(&request).await,
            Transport::Local => lake_client::LocalLoader::new(&local, None).stream(&request).await,
        }
    };
    let mut batches = match stream.await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("stream {rank}/{world}: {e}");
            seen.errors += 1;
            return seen;
        }
    };
    loop {
        let next = tokio::time::timeout_at(deadline.into(), batches.next()).await;
        match next {
            Err(_) | Ok(None) => break,
            Ok(Some(Ok(batch))) => {
                seen.batches.push(Arrival {
                    at: Instant::now(),
                    samples: batch.num_rows() as u64,
                    // The bytes of the values (a decoded batch's buffers share the message's memory).
                    bytes: batch.columns().iter().map(|c| c.to_data().get_slice_memory_size().unwrap_or(0) as u64).sum(),
                    latency_ms: asked.elapsed().as_secs_f64() * 1e3,
                });
                asked = Instant::now();
            }
            Ok(Some(Err(e))) => {
                eprintln!("stream {rank}/{world}: {e}");
                seen.errors += 1;
                break;
            }
        }
    }
    seen
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn main() {
    let numbers: Vec<u64> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let repeats = numbers.first().copied().unwrap_or(17) as usize;
    let seconds = numbers.get(1).copied().unwrap_or(30);
    let levels: Vec<u64> = if numbers.len() > 2 { numbers[2..].to_vec() } else { vec![1, 8, 64] };
    let (cache_mb, memory_mb) = (setting("LAKE_BENCH_CACHE_MB", lake_loader::DEFAULT_CACHE_MIB), setting("LAKE_BENCH_MEMORY_MB", 6144));
    let lookahead = setting("LAKE_BENCH_LOOKAHEAD", lake_loader::DEFAULT_HORIZON);
    let transports: Vec<Transport> = std::env::var("LAKE_BENCH_TRANSPORTS")
        .unwrap_or_else(|_| "flight,local".into())
        .split(',')
        .map(|t| match t.trim() {
            "flight" => Transport::Flight,
            "local" => Transport::Local,
            other => panic!("LAKE_BENCH_TRANSPORTS: {other:?} is neither flight nor local"),
        })
        .collect();
    let (_guard, root) = bench_lake(Path::new(env!("CARGO_BIN_EXE_lake")), repeats);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());

    // The in-process figure (the same loader, cache and batch size, no network; a whole epoch,
    // as the served levels read more than one), before the server levels and again after them:
    // this machine's speed drifts with its neighbours' load, and the ratio uses the mean of the
    // two.
    let in_process_rate = || {
        let batches = (600 * repeats as u64 / BATCH).to_string();
        let cache = cache_mb.to_string();
        let json = lake(&root, &["bench", "--dataset", "bench", "--preset", "act", "--cache-mb", &cache, "--batches", &batches, "--json"]);
        let reference: serde_json::Value = serde_json::from_str(&json).expect("bench json");
        let number = |key: &str| reference[key].as_f64().unwrap_or(f64::NAN);
        let packets = number("packets_decoded") / number("samples");
        (number("samples_per_s"), number("cpu_ms_per_sample"), packets, number("ahead_hit_rate") * 100.0)
    };
    let before = in_process_rate();
    let mut rows = Vec::new();
    println!(
        "lake serve under load: {} steps (v30-av1-small x{repeats}), act preset, {BATCH} samples per stream batch, {seconds} s per level, {cores} cores, loopback",
        600 * repeats
    );
    let server = Server::start(&root, cache_mb, memory_mb, lookahead);
    let idle_mb = server.peak_rss_mb();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    for (transport, n) in transports.iter().flat_map(|&t| levels.iter().map(move |&n| (t, n))) {
        server.reset_peak();
        let began = Instant::now();
        let deadline = began + Duration::from_secs(seconds);
        // Steady state: what arrived after the first third of the level (streams starting and
        // their first prefetch filling), over that time. Batches still being made when the
        // level ends are not counted, and no longer bias the rate.
        let window_start = began + Duration::from_secs_f64(seconds as f64 / 3.0);
        let (seen, window): (Vec<Seen>, Window) = runtime.block_on(async {
            let at = (server.flight.clone(), server.local.clone());
            let tasks: Vec<_> = (0..n).map(|r| tokio::spawn(read_stream(at.clone(), transport, r, n, deadline))).collect();
            // The server's and this process's (the clients') CPU and the server's counters,
            // over the same window.
            let window = async {
                let read = || Window {
                    server_cpu: cpu_seconds(server.child.id()),
                    client_cpu: cpu_seconds(std::process::id()),
                    metrics: server.metrics(),
                };
                tokio::time::sleep_until(window_start.into()).await;
                let from = tokio::task::block_in_place(read);
                tokio::time::sleep_until(deadline.into()).await;
                tokio::task::block_in_place(read).since(&from)
            };
            let (seen, window) = futures::join!(futures::future::join_all(tasks), window);
            (seen.into_iter().map(|t| t.expect("stream task")).collect(), window)
        });
        let elapsed = deadline.saturating_duration_since(window_start).as_secs_f64();
        let in_window = || seen.iter().flat_map(|s| s.batches.iter()).filter(|a| a.at >= window_start);
        let samples: u64 = in_window().map(|a| a.samples).sum();
        let bytes: u64 = in_window().map(|a| a.bytes).sum();
        let errors: u64 = seen.iter().map(|s| s.errors).sum();
        let mut latencies: Vec<f64> = in_window().map(|a| a.latency_ms).collect();
        latencies.sort_by(f64::total_cmp);
        let rate = samples as f64 / elapsed;
        let peak = server.peak_rss_mb();
        let ceiling = idle_mb + (cache_mb + memory_mb) as f64;
        rows.push((
            transport.name(),
            n,
            rate,
            bytes as f64 / elapsed / 1e6,
            percentile(&latencies, 0.5),
            percentile(&latencies, 0.99),
            window.server_cpu * 1e3 / samples.max(1) as f64,
            window.client_cpu * 1e3 / samples.max(1) as f64,
            window.counter("lake_decoded_packets_total") / window.counter("lake_samples_total"),
            window.counter("lake_frame_cache_ahead_hits_total")
                / (window.counter("lake_frame_cache_hits_total") + window.counter("lake_frame_cache_misses_total")),
            peak,
            if peak <= ceiling { "within" } else { "OVER" },
            errors,
        ));
        // Let the server notice the hang-ups and drain before the next level.
        std::thread::sleep(Duration::from_secs(1));
    }
    // With its streams closed, the server hands the pages it kept under load back (after 10 s
    // of calm).
    std::thread::sleep(Duration::from_secs(13));
    let idle_after_mb = server.rss_mb();
    drop(server);
    let after = in_process_rate();
    let in_process = (before.0 + after.0) / 2.0;
    println!(
        "server: --cache-mb {cache_mb} --memory-mb {memory_mb} --lookahead {lookahead}; in-process `lake bench` (cache on): {:.1} samples/s before, {:.1} after ({:.3} and {:.3} CPU ms, {:.2} and {:.2} packets per sample, {:.0} % and {:.0} % of frames decoded ahead)",
        before.0, after.0, before.1, after.1, before.2, after.2, before.3, after.3
    );
    println!(
        "{:<9} {:>7} {:>10} {:>10} {:>12} {:>9} {:>9} {:>10} {:>10} {:>8} {:>6} {:>14} {:>8} {:>7}",
        "transport",
        "streams",
        "samples/s",
        "MB/s",
        "% in-proc",
        "p50 ms",
        "p99 ms",
        "server ms",
        "client ms",
        "packets",
        "ahead",
        "server peak",
        "budget",
        "errors"
    );
    // A level with errors, or over the memory budget, fails the run (after the table).
    let failed: Vec<String> = rows.iter().filter(|r| r.12 > 0 || r.11 == "OVER").map(|r| format!("{} with {} streams", r.0, r.1)).collect();
    for (transport, n, rate, mb_s, p50, p99, server_ms, client_ms, packets, ahead, peak, within, errors) in rows {
        println!(
            "{transport:<9} {n:>7} {rate:>10.1} {mb_s:>10.1} {:>11.0}% {p50:>9.1} {p99:>9.1} {server_ms:>10.3} {client_ms:>10.3} {packets:>8.2} {:>5.0}% {peak:>11.0} MB {within:>8} {errors:>7}",
            rate / in_process * 100.0,
            ahead * 100.0
        );
    }
    println!("budget: peak RSS within idle RSS ({idle_mb:.0} MB) + cache ({cache_mb} MB) + memory budget ({memory_mb} MB)");
    println!("server RSS 13 s after the last stream closed: {idle_after_mb:.0} MB (decoded-frame cache included)");
    if !failed.is_empty() {
        eprintln!("failed: errors or memory over the budget at {}", failed.join(", "));
        std::process::exit(1);
    }
}
