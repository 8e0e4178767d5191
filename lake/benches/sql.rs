//! SQL latency on a lake of over a million steps: `count(*)`, a group-by over tasks, an exact
//! quantile over an action dimension (computed by DataFusion from every step, and read from
//! `feature_stats`), and a filtered count, each timed in-process on an open session and as a
//! whole `lake sql` command (process start, opening every dataset, planning, the scan).
//!
//! The lake is built by ingesting the bundled `v30-av1-small` sample, repeated to 60 000 steps
//! with its videos left out (SQL never reads them), under as many names as it takes.
//!
//! ```text
//! cargo bench -p lake --bench sql                   # ≥ 1 000 000 steps, 5 runs per query
//! cargo bench -p lake --bench sql -- 3000000        # choose the step count
//! LAKE_BENCH_DIR=/tmp cargo bench -p lake --bench sql   # keep the lake for a look
//! ```
#![allow(clippy::print_stdout, clippy::print_stderr)] // a bench binary prints its table

use std::{
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use futures::StreamExt;
use lake_query::sql::LakeSql;
use lake_testkit::{bench_workdir, repeat_dataset, testdata};

const REPEATS: usize = 100; // 600-step sample × 100 = 60 000 steps per dataset
const RUNS: usize = 5;

fn lake_cli(root: &Path, args: &[&str]) -> std::process::Output {
    let out = Command::new(env!("CARGO_BIN_EXE_lake")).arg("--lake").arg(root).args(args).output().expect("run lake");
    assert!(out.status.success(), "lake {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    out
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let target: u64 = std::env::args().skip(1).find(|a| !a.starts_with('-')).map_or(1_000_000, |a| a.parse().expect("a step count"));
    let (_guard, dir) = bench_workdir();
    let src = dir.join("source");
    repeat_dataset(&testdata("v30-av1-small"), &src, REPEATS);
    std::fs::remove_dir_all(src.join("videos")).expect("drop the videos");
    let per_dataset = 600 * REPEATS as u64;
    let copies = target.div_ceil(per_dataset);
    let root = dir.join("lake");
    let began = Instant::now();
    for i in 0..copies {
        let name = format!("sample-{i:03}");
        lake_cli(&root, &["ingest", src.to_str().expect("utf-8"), "--name", &name, "--drop-missing-cameras"]);
    }
    eprintln!("built a lake of {copies} datasets, {} steps, in {:.0} s", copies * per_dataset, began.elapsed().as_secs_f64());

    let queries = [
        ("count(*)", "SELECT count(*) FROM steps".to_string()),
        (
            "group by task",
            "SELECT task, count(*) AS steps, count(DISTINCT dataset) AS datasets FROM steps GROUP BY task ORDER BY steps DESC".into(),
        ),
        ("exact q99 of action[1]", "SELECT percentile_cont(0.99) WITHIN GROUP (ORDER BY action[1]) FROM steps".into()),
        (
            "q99 from feature_stats",
            "SELECT dataset, q99 FROM feature_stats WHERE feature = 'action' AND dim = 0 AND episode_index IS NULL".into(),
        ),
        ("filtered count", "SELECT count(*) FROM steps WHERE dataset = 'sample-001' AND episode_index < 100".into()),
    ];

    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let lake = lake_store::Lake::open(root.to_str().expect("utf-8")).expect("lake");
    let opened = Instant::now();
    let session = rt.block_on(LakeSql::open(&lake)).expect("session");
    let open_time = opened.elapsed();

    println!(
        "lake sql latency: {} steps in {copies} datasets (v30-av1-small x{REPEATS} each, no video), median of {RUNS} runs, 2 cores",
        copies * per_dataset
    );
    println!("session open (every dataset's tables): {:.0} ms", open_time.as_secs_f64() * 1e3);
    println!("{:<26} {:>14} {:>14} {:>8}", "query", "in-process ms", "lake sql ms", "rows");
    for (label, query) in &queries {
        let mut inproc = Vec::new();
        let mut rows = 0;
        for _ in 0..RUNS {
            let t = Instant::now();
            rows = rt.block_on(async {
                let mut stream = session.stream(query).await.expect("query plans");
                let mut n = 0;
                while let Some(b) = stream.next().await {
                    n += b.expect("query runs").num_rows();
                }
                n
            });
            inproc.push(t.elapsed());
        }
        let mut cli = Vec::new();
        for _ in 0..RUNS {
            let t = Instant::now();
            lake_cli(&root, &["sql", "--format", "csv", query]);
            cli.push(t.elapsed());
        }
        println!("{label:<26} {:>14.1} {:>14.1} {rows:>8}", median(inproc).as_secs_f64() * 1e3, median(cli).as_secs_f64() * 1e3);
    }
}
