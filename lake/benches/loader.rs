//! Loader throughput: `lake bench` (release build, as a child process) on a dataset of ~10k
//! steps made by repeating the bundled `v30-av1-small` sample (2 cameras, AV1 GOP 2, 480×640 +
//! 96×128, 30 fps), for the `act` and `diffusion` presets: frames decoded from packets (the
//! cold path) with the in-memory frame cache off and on, as RGB and as YUV planes
//! (`--frame-format yuv420p`, rows `y-off` / `y-on`), then frames read from the stored frame
//! table that `lake cache` writes, stored plain and then zstd-compressed, and (`act`) from a table
//! of frames resized to 224×224 (`lake cache --size`). Prints one table, with
//! the decode-bound limit measured in the same run by `lake bench` itself.
//!
//! ```text
//! cargo bench -p lake --bench loader                 # 17 repeats (10 200 steps), 100 batches of 32
//! cargo bench -p lake --bench loader -- 17 200       # repeats, batches
//! LAKE_BENCH_DIR=/tmp cargo bench -p lake --bench loader   # keep the generated data and lake
//! ```
#![allow(clippy::print_stdout, clippy::print_stderr)] // a bench binary prints its table

use std::path::Path;

use lake_testkit::{bench_lake, run_lake};

fn lake(root: &Path, args: &[&str]) -> String {
    run_lake(Path::new(env!("CARGO_BIN_EXE_lake")), root, args)
}

fn main() {
    let numbers: Vec<u64> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let repeats = numbers.first().copied().unwrap_or(17) as usize;
    let batches = numbers.get(1).copied().unwrap_or(100);
    let (_guard, root) = bench_lake(Path::new(env!("CARGO_BIN_EXE_lake")), repeats);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "lake loader throughput: {} steps (v30-av1-small x{repeats}: AV1 GOP 2, 480x640 + 96x128), batch 32, {batches} batches after the first, {cores} cores",
        600 * repeats
    );
    println!(
        "{:<10} {:>5} {:>10} {:>13} {:>15} {:>12} {:>10} {:>11} {:>9} {:>9}",
        "preset", "cache", "samples/s", "CPU ms/sample", "bound ms/sample", "% of bound", "first ms", "copy ms/s.", "hit rate", "peak RSS"
    );
    let row = |preset: &str, cache: &str, label: &str, extra: &[&str]| {
        let batches = batches.to_string();
        let mut args = vec!["bench", "--dataset", "bench", "--preset", preset, "--cache", cache, "--batches", &batches, "--json"];
        args.extend(extra);
        let json = lake(&root, &args);
        let r: serde_json::Value = serde_json::from_str(&json).expect("bench json");
        let f = |k: &str| r[k].as_f64().unwrap_or(f64::NAN);
        println!(
            "{:<10} {:>5} {:>10.1} {:>13.3} {:>15.3} {:>11.0}% {:>10.1} {:>11.4} {:>8.1}% {:>6.0} MB",
            preset,
            label,
            f("samples_per_s"),
            f("cpu_ms_per_sample"),
            f("bound_cpu_ms_per_sample"),
            f("bound_fraction") * 100.0,
            f("first_batch_ms"),
            f("copy_ms_per_sample"),
            f("cache_hit_rate") * 100.0,
            f("peak_rss_mb"),
        );
    };
    for preset in ["act", "diffusion"] {
        for cache in ["off", "on"] {
            row(preset, cache, cache, &[]);
        }
        // Video frames as YUV planes for the trainer to convert (`--frame-format yuv420p`): no
        // colour conversion, half the bytes.
        for (cache, label) in [("off", "y-off"), ("on", "y-on")] {
            row(preset, cache, label, &["--frame-format", "yuv420p"]);
        }
    }
    // Frames read from the stored frame table (`lake cache`), plain and then zstd-compressed;
    // the in-memory cache off, so every frame is read from the table.
    let mut notes = Vec::new();
    for storage in ["plain", "zstd"] {
        let stored = lake(&root, &["cache", "bench", "--storage", storage]);
        notes.push(format!("{storage}: {}", stored.trim()));
        for preset in if storage == "plain" { &["act", "diffusion"][..] } else { &["act"][..] } {
            row(preset, "off", storage, &[]);
        }
    }
    // Every camera's frames resized to 224x224, from their own table (`lake cache --size`).
    let stored = lake(&root, &["cache", "bench", "--size", "224x224"]);
    notes.push(format!("224x224: {}", stored.trim()));
    row("act", "off", "224px", &["--frame-size", "224x224"]);
    println!(
        "frame table (`lake cache --storage plain|zstd`, `--size 224x224`; rows `plain` / `zstd` / `224px` read every frame from it):"
    );
    for note in notes {
        println!("  {note}");
    }
}
