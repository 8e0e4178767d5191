//! `lake sql`, `lake view` and `lake stats`: errors that say where, filters and projections that
//! reach Lance, output formats that agree, views that restrict sampling and outlive later
//! ingests, and statistics in LeRobot's `stats.json` layout. (Answers against facts computed from
//! the source files are checked for every dataset in `datasets.rs`.)

use std::{
    io::Write,
    path::{Path, PathBuf},
    process::Stdio,
};

use arrow::array::{Array, AsArray};
use lake_testkit::testdata;
use serde_json::Value;

use crate::common::{ingest_ok, lake, lake_cmd, num, read_arrow, sql_rows};

/// A lake holding the bundled `datasets`.
fn lake_with(datasets: &[&str]) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("lake");
    for d in datasets {
        ingest_ok(&root, &testdata(d), &[]);
    }
    (tmp, root)
}

#[test]
fn bad_queries_get_datafusion_errors_with_position_and_missing_datasets_are_named() {
    let (_tmp, root) = lake_with(&["v30-av1-small"]);
    let run = lake(&root, &["sql", "SELEC count(*) FROM steps"]);
    assert_eq!(run.code, 2, "{run:#?}");
    assert!(run.stderr.contains("Line: 1, Column: 1"), "syntax errors give the position: {}", run.stderr);
    let run = lake(&root, &["sql", "SELECT count(*)\nFROM steps WHERE (dataset = 'x'  \n"]);
    assert!(run.code == 2 && run.stderr.contains("found: EOF at the end of the query (Line: 2, Column: 32)"), "{}", run.stderr);

    // SQL's own schema names are not dataset or view names (the lake is left as it was).
    let before = lake_testkit::snapshot(&root, &[]);
    let run = lake(&root, &["ingest", testdata("v30-images-tiny").to_str().expect("utf-8"), "--name", "public"]);
    assert!(run.code == 2 && run.stderr.contains("dataset name `public`: is reserved"), "{run:#?}");
    let run = lake(&root, &["view", "create", "Information_Schema", "SELECT dataset, episode_index FROM episodes"]);
    assert!(run.code == 2 && run.stderr.contains("is reserved: SQL names its own schema `information_schema`"), "{run:#?}");
    assert_eq!(lake_testkit::snapshot(&root, &[]), before);

    let run = lake(&root, &["sql", "SELECT count(*) FROM \"no-such-set\".steps"]);
    assert_eq!(run.code, 2, "{run:#?}");
    assert!(run.stderr.contains("no dataset `no-such-set`") && run.stderr.contains("v30-av1-small"), "{}", run.stderr);

    let run = lake(&root, &["sql", "SELECT * FROM nope"]);
    assert!(run.code == 2 && run.stderr.contains("the lake's tables: ") && run.stderr.contains("feature_stats"), "{}", run.stderr);
    let run = lake(&root, &["sql", "SELECT * FROM \"v30-av1-small\".image_stats"]);
    assert!(run.code == 2 && run.stderr.contains("`lake stats NAME --images` makes"), "{}", run.stderr);
    assert_eq!(lake(&root, &["view", "create", "few", "SELECT episode_index FROM episodes WHERE episode_index < 2"]).code, 0);
    let run = lake(&root, &["sql", "SELECT count(*) FROM few.steps"]);
    assert!(run.code == 2 && run.stderr.contains("`few` is a view, not a dataset"), "{}", run.stderr);
    // Queries only, as the server answers.
    for statement in ["CREATE TABLE t AS SELECT 1", "COPY (SELECT 1) TO '/tmp/lake-copy.csv'"] {
        let run = lake(&root, &["sql", statement]);
        assert!(run.code == 2 && run.stderr.contains("lake answers queries only"), "{statement}: {run:#?}");
    }

    let run = lake(&root, &["sql", "SELECT no_such_column FROM steps"]);
    assert_eq!(run.code, 2, "{run:#?}");
    assert!(run.stderr.contains("no_such_column"), "{}", run.stderr);
    assert!(run.stdout.is_empty(), "nothing on stdout for a failed query: {}", run.stdout);
}

#[test]
fn filters_and_projections_reach_the_lance_scan_and_counts_never_read_packets() {
    let (_tmp, root) = lake_with(&["v30-av1-small", "v30-images-tiny"]);
    let plan = lake(
        &root,
        &["sql", "--format", "csv", "EXPLAIN SELECT count(*) FROM steps WHERE dataset = 'v30-av1-small' AND episode_index = 2"],
    );
    assert_eq!(plan.code, 0, "{plan:#?}");
    assert!(plan.stdout.contains("steps.lance"), "{}", plan.stdout);
    assert!(!plan.stdout.contains("packets.lance"), "a step count must not touch packets: {}", plan.stdout);
    assert!(plan.stdout.contains("full_filter=episode_index = Int64(2)"), "the filter reaches Lance: {}", plan.stdout);
    // The other dataset's branch is planned with a false filter: Lance reads none of its rows.
    assert!(plan.stdout.contains("full_filter=Boolean(false)"), "{}", plan.stdout);

    let rows = sql_rows(&root, "SELECT count(*) AS n FROM steps WHERE dataset = 'v30-av1-small' AND episode_index = 2");
    assert_eq!(num(&rows[0], "n"), 134.0);

    // byte_length: the bytes of a packet (DataFusion's own length functions take text), as
    // many as its hex spelling's half.
    let rows = sql_rows(
        &root,
        "SELECT camera, sum(byte_length(data)) AS bytes, sum(length(encode(data, 'hex'))) / 2 AS hex_half, min(byte_length(data)) AS least \
         FROM packets WHERE dataset = 'v30-av1-small' GROUP BY camera ORDER BY camera",
    );
    assert_eq!(rows.len(), 2);
    for row in &rows {
        assert!(num(row, "bytes") > 0.0 && num(row, "bytes") == num(row, "hex_half") && num(row, "least") > 0.0, "{row:?}");
    }

    // A sort over the stacked table by dataset, then a column whose ranges differ between
    // datasets (indices 0..=599 and 0..=59): the top rows are the last dataset's, whatever
    // the other's indices.
    // (Which partition runs first decides whether a wrong plan shows: asked many times.)
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let lake = lake_store::Lake::open(root.to_str().expect("utf-8")).expect("lake");
        let session = lake_query::sql::LakeSql::open(&lake).await.expect("session");
        for _ in 0..40 {
            let (_, batches) =
                session.query("SELECT dataset, index FROM steps ORDER BY dataset DESC, index DESC LIMIT 2").await.expect("query");
            let batch = arrow::compute::concat_batches(&batches[0].schema(), &batches).expect("concat");
            let names = arrow::compute::cast(batch.column(0), &arrow::datatypes::DataType::Utf8).expect("names");
            let names: Vec<&str> = names.as_string::<i32>().iter().map(|n| n.expect("name")).collect();
            let index: Vec<i64> = batch.column(1).as_primitive::<arrow::datatypes::Int64Type>().values().to_vec();
            assert_eq!((names, index), (vec!["v30-images-tiny"; 2], vec![59, 58]));
        }
    });

    let plan = lake(&root, &["sql", "--format", "csv", "EXPLAIN SELECT action FROM \"v30-av1-small\".steps"]);
    assert!(plan.stdout.contains("projection=[action]"), "only the asked column is read: {}", plan.stdout);
}

#[test]
fn stacked_tables_widen_vectors_of_different_sizes_and_keep_lerobot_keys() {
    let (_tmp, root) = lake_with(&["v30-av1-small", "v30-h264-multifile"]);
    let rows = sql_rows(
        &root,
        "SELECT dataset, max(array_length(action)) AS dims, max(array_length(\"observation.state\")) AS state_dims, count(*) AS n \
         FROM steps GROUP BY dataset ORDER BY dataset",
    );
    let got: Vec<(String, f64, f64, f64)> = rows
        .iter()
        .map(|r| (r["dataset"].as_str().expect("name").to_string(), num(r, "dims"), num(r, "state_dims"), num(r, "n")))
        .collect();
    assert_eq!(got, vec![("v30-av1-small".into(), 6.0, 6.0, 600.0), ("v30-h264-multifile".into(), 14.0, 14.0, 300.0)]);
    // Joins across tables, and the datasets table, work like any SQL.
    let rows = sql_rows(
        &root,
        "SELECT d.dataset, d.steps, sum(e.length) AS total FROM datasets d JOIN episodes e ON d.dataset = e.dataset \
         GROUP BY d.dataset, d.steps ORDER BY d.dataset",
    );
    assert!(rows.iter().all(|r| num(r, "steps") == num(r, "total")), "{rows:?}");
}

#[test]
fn every_output_format_writes_the_same_rows() {
    let (tmp, root) = lake_with(&["v30-av1-small"]);
    let query = "SELECT episode_index, length FROM episodes ORDER BY episode_index";
    let want: Vec<(i64, i64)> = sql_rows(&root, query).iter().map(|r| (num(r, "episode_index") as i64, num(r, "length") as i64)).collect();
    assert_eq!(want.len(), 6);

    let csv = lake(&root, &["sql", "--format", "csv", query]);
    let lines: Vec<&str> = csv.stdout.lines().collect();
    assert_eq!(lines[0], "episode_index,length");
    let got: Vec<(i64, i64)> = lines[1..]
        .iter()
        .map(|l| {
            let (a, b) = l.split_once(',').expect("two columns");
            (a.parse().expect("int"), b.parse().expect("int"))
        })
        .collect();
    assert_eq!(got, want, "csv");
    let empty = lake(&root, &["sql", "--format", "csv", "SELECT episode_index, length FROM episodes WHERE length < 0"]);
    assert_eq!(empty.stdout, "episode_index,length\n", "an empty result keeps its header row");
    let broken = tmp.path().join("broken.csv");
    let run =
        lake(&root, &["sql", "--format", "csv", "--output", broken.to_str().expect("utf-8"), "SELECT 1 / (episode_index - 3) FROM steps"]);
    assert!(run.code != 0 && run.stderr.contains("Divide by zero"), "{run:#?}");
    let left: Vec<_> = std::fs::read_dir(tmp.path()).expect("tmp").map(|e| e.expect("entry").file_name()).collect();
    assert!(!broken.exists() && left.iter().all(|n| !n.to_string_lossy().contains("broken")), "a failed query leaves no file: {left:?}");

    let ndjson = lake(&root, &["sql", "--format", "ndjson", query]);
    let got: Vec<(i64, i64)> = ndjson
        .stdout
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).expect("a JSON object per line");
            (v["episode_index"].as_i64().expect("int"), v["length"].as_i64().expect("int"))
        })
        .collect();
    assert_eq!(got, want, "ndjson");

    let arrow_file = tmp.path().join("episodes.arrow");
    let run = lake(&root, &["sql", "--format", "arrow", "--output", arrow_file.to_str().expect("utf-8"), query]);
    assert_eq!(run.code, 0, "{run:#?}");
    let batch = read_arrow(&arrow_file);
    assert_eq!(crate::common::ints(std::slice::from_ref(&batch), "length"), want.iter().map(|w| w.1).collect::<Vec<_>>(), "arrow");

    let parquet_file = tmp.path().join("episodes.parquet");
    // The format is the file's, when --format is not given.
    let run = lake(&root, &["sql", "--output", parquet_file.to_str().expect("utf-8"), query]);
    assert_eq!(run.code, 0, "{run:#?}");
    let batches = lake_testkit::read_parquet(&parquet_file);
    assert_eq!(crate::common::ints(&batches, "episode_index"), want.iter().map(|w| w.0).collect::<Vec<_>>(), "parquet");

    // A vector column that may be null is written as a variable-size list (readable by pyarrow).
    let vectors = tmp.path().join("vectors.parquet");
    let query = "SELECT index, CASE WHEN index = 0 THEN NULL ELSE action END AS a FROM \"v30-av1-small\".steps ORDER BY index LIMIT 2";
    let run = lake(&root, &["sql", "--output", vectors.to_str().expect("utf-8"), query]);
    assert_eq!(run.code, 0, "{run:#?}");
    let batches = lake_testkit::read_parquet(&vectors);
    let a = batches[0].column_by_name("a").expect("a");
    assert!(matches!(a.data_type(), arrow::datatypes::DataType::List(_)), "{:?}", a.data_type());
    let a = a.as_list::<i32>();
    assert!(a.is_null(0) && a.value(1).len() == 6, "{a:?}");
}

#[test]
fn the_shell_reads_statements_and_lists_tables() {
    let (_tmp, root) = lake_with(&["v30-images-tiny"]);
    // The listing commands work as one-shot queries too.
    let run = lake(&root, &["sql", "\\d episodes"]);
    assert!(run.code == 0 && run.stdout.contains("episode_index"), "{run:#?}");
    let run = lake(&root, &["sql", "\\d nope"]);
    assert!(run.code == 2 && run.stderr.contains("no table `nope`"), "{run:#?}");
    // A version named with `@` is opened for the listing, as for a query.
    let run = lake(&root, &["sql", "\\d \"v30-images-tiny@1\".episodes"]);
    assert!(run.code == 0 && run.stdout.contains("v30-images-tiny@1.episodes") && run.stdout.contains("length"), "{run:#?}");
    let run = lake(&root, &["sql", "\\d \"v30-images-tiny@7\".episodes"]);
    assert!(run.code == 2 && run.stderr.contains("no dataset `v30-images-tiny@7`"), "{run:#?}");
    // A table a version does not have is named as such, with the version's tables.
    let run = lake(&root, &["sql", "SELECT 1 FROM \"v30-images-tiny@1\".nosuch"]);
    assert!(run.code == 2 && run.stderr.contains("(`v30-images-tiny@1`'s tables: episodes, "), "{run:#?}");
    let mut child = lake_cmd(&root)
        .arg("sql")
        .env("LAKE_HISTORY", root.join("history"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the shell");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"\\d\nSELECT count(*) AS n\n  FROM steps; \\d \"v30-images-tiny\".steps\nSELECT 1\n  AS one \\q\nSELECT 2;\n")
        .expect("write statements");
    let out = child.wait_with_output().expect("shell exits");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("feature_stats") && stdout.contains("\"v30-images-tiny\".steps"), "\\d lists tables: {stdout}");
    assert!(stdout.contains("| 60 |"), "a multi-line statement runs: {stdout}");
    assert!(stdout.contains("struct<observation/images/front: UInt64>"), "\\d NAME shows columns by the names queries use: {stdout}");
    assert!(!stdout.contains("| one") && !stdout.contains("Int64(2)"), "\\q in a statement quits without running it: {stdout}");

    // A script whose output's reader has gone ends the shell quietly, not one error a statement.
    let mut child = lake_cmd(&root)
        .arg("sql")
        .env("LAKE_HISTORY", root.join("history"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the shell");
    drop(child.stdout.take());
    // The shell may be gone before every statement is written.
    let _ = child.stdin.take().expect("stdin").write_all("SELECT 1;\n".repeat(20).as_bytes());
    let out = child.wait_with_output().expect("shell exits");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && !stderr.contains("error"), "{:?}: {stderr}", out.status);
}

/// Episodes of `dataset` with `length > min_len`, straight from the episodes table.
fn long_episodes(root: &Path, dataset: &str, min_len: i64) -> Vec<i64> {
    let rows = sql_rows(root, &format!("SELECT episode_index FROM \"{dataset}\".episodes WHERE length > {min_len} ORDER BY 1"));
    rows.iter().map(|r| num(r, "episode_index") as i64).collect()
}

#[test]
fn views_restrict_what_is_sampled_and_survive_later_ingests() {
    let (_tmp, root) = lake_with(&["v30-av1-small", "v30-h264-multifile"]);
    let selected = long_episodes(&root, "v30-av1-small", 100);
    assert_eq!(selected, vec![1, 2, 3]);
    let run = lake(
        &root,
        &["view", "create", "long", "SELECT dataset, episode_index FROM episodes WHERE dataset = 'v30-av1-small' AND length > 100"],
    );
    assert_eq!(run.code, 0, "{run:#?}");

    // A whole epoch of the view's sampler draws only its episodes, and every step of them.
    let draws = epoch_episodes(&root, "long");
    let mut seen: Vec<i64> = draws.clone();
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen, selected, "an epoch covers exactly the view's episodes");
    assert_eq!(draws.len(), 104 + 134 + 159, "an epoch is a permutation of the view's steps");

    // lake sample refuses steps outside the view; lake bench samples through it.
    let run = lake(&root, &["sample", "--dataset", "long", "--indices", "0", "--out", root.join("x.arrow").to_str().expect("utf-8")]);
    assert_eq!(run.code, 2, "{run:#?}");
    assert!(run.stderr.contains("does not select"), "{}", run.stderr);
    let run = lake(&root, &["sample", "--dataset", "long", "--indices", "120", "--out", root.join("x.arrow").to_str().expect("utf-8")]);
    assert_eq!(run.code, 0, "{run:#?}");
    let run = lake(&root, &["bench", "--dataset", "long", "--batch-size", "4", "--batches", "2", "--json"]);
    assert_eq!(run.code, 0, "{run:#?}");
    let run = lake(&root, &["bench", "--dataset", "long", "--episodes", "0", "--batches", "2"]);
    assert!(run.code == 2 && run.stderr.contains("episode 0 is not in the view"), "{run:#?}");

    // Bad views are refused with the reason.
    for (name, query, reason) in [
        ("v30-av1-small", "SELECT dataset, episode_index FROM episodes", "a dataset has this name"),
        ("nothing", "SELECT dataset, episode_index FROM episodes WHERE length < 0", "selects no episodes"),
        ("noepisode", "SELECT dataset FROM episodes", "`episode_index`"),
        ("ghost", "SELECT 'v30-av1-small' AS dataset, 99 AS episode_index", "has no episode 99"),
        ("long", "SELECT dataset, episode_index FROM episodes", "already exists"),
        (
            "textweight",
            "SELECT dataset, episode_index, 'heavy' AS weight FROM episodes",
            "`weight` must be a number, the query returns Utf8",
        ),
        ("nullweight", "SELECT dataset, episode_index, CAST(NULL AS DOUBLE) AS weight FROM episodes", "returned a null `weight`"),
        ("textepisode", "SELECT dataset, 'x' AS episode_index FROM episodes", "`episode_index` must be an integer"),
        (
            "mixed",
            "SELECT dataset, episode_index FROM episodes",
            "v30-h264-multifile@1 has `observation.images.side` that v30-av1-small@1 lacks",
        ),
    ] {
        let run = lake(&root, &["view", "create", name, query]);
        assert_eq!(run.code, 2, "{name}: {run:#?}");
        assert!(run.stderr.contains(reason), "{name}: {}", run.stderr);
    }

    // Ingesting other data (and a new version of nothing the view reads) leaves it as it was.
    ingest_ok(&root, &testdata("v30-images-tiny"), &[]);
    assert_eq!(epoch_episodes(&root, "long"), draws, "the view samples the same sequence after another ingest");
    let rows = sql_rows(&root, "SELECT view, view_version, dataset, version, episodes FROM views");
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!((rows[0]["dataset"].as_str(), num(&rows[0], "version"), num(&rows[0], "episodes")), (Some("v30-av1-small"), 1.0, 3.0));
    assert_eq!(num(&rows[0], "view_version"), 1.0);
    let show = lake(&root, &["view", "show", "long"]);
    let record: Value = serde_json::from_str(&show.stdout).expect("view record");
    assert_eq!(record["lake_versions"], serde_json::json!(["v30-av1-small@1", "v30-h264-multifile@1"]));

    // Replacing a view makes its next version; the first stays readable as `long@1` (what a
    // stream that pinned it keeps drawing).
    let run = lake(
        &root,
        &[
            "view",
            "create",
            "long",
            "SELECT dataset, episode_index FROM episodes WHERE dataset = 'v30-h264-multifile' AND episode_index = 0",
            "--replace",
        ],
    );
    assert_eq!(run.code, 0, "{run:#?}");
    assert!(run.stdout.contains("view long@2 created"), "{}", run.stdout);
    assert_eq!(epoch_episodes(&root, "long@1"), draws, "version 1 draws as it did");
    let replaced = epoch_episodes(&root, "long");
    let steps =
        num(&sql_rows(&root, "SELECT sum(length) AS n FROM episodes WHERE dataset = 'v30-h264-multifile' AND episode_index = 0")[0], "n");
    assert_eq!(replaced.len() as f64, steps, "version 2 draws episode 0 of the other dataset");
    assert!(replaced.iter().all(|e| *e == 0));
    assert_eq!(epoch_episodes(&root, "long@2"), replaced);
    let show = lake(&root, &["view", "show", "long@1"]);
    assert_eq!(serde_json::from_str::<Value>(&show.stdout).expect("view record")["version"], 1, "{show:#?}");
    let run = lake(&root, &["view", "show", "long@7"]);
    assert!(run.code != 0 && run.stderr.contains("view `long` has no version 7 (versions: 1, 2)"), "{run:#?}");
    let run = lake(&root, &["ingest", testdata("v30-av1-small").to_str().expect("utf-8"), "--name", "long"]);
    assert!(run.code != 0 && run.stderr.contains("is a view"), "a dataset cannot take a view's name: {run:#?}");

    // Dropping it leaves no current version, keeps the old ones, and a view made later under
    // the name continues their numbering (`long@1` never means another selection).
    let run = lake(&root, &["view", "drop", "long"]);
    assert_eq!(run.code, 0, "{run:#?}");
    assert!(sql_rows(&root, "SELECT * FROM views").is_empty());
    assert!(lake(&root, &["view", "ls"]).stdout.contains("no views"));
    assert_eq!(epoch_episodes(&root, "long@1"), draws, "a dropped view's versions stay readable");
    let run = lake(&root, &["bench", "--dataset", "long", "--batch-size", "4", "--batches", "1"]);
    assert!(run.code != 0 && run.stderr.contains("no dataset or view `long`"), "{run:#?}");
    assert!(run.stderr.contains("view `long` was dropped, its versions stay readable as `long@N` (1, 2)"), "{run:#?}");
    let run = lake(
        &root,
        &["view", "create", "long", "SELECT dataset, episode_index FROM episodes WHERE dataset = 'v30-av1-small' AND episode_index = 0"],
    );
    assert!(run.stdout.contains("view long@4 created"), "{run:#?}");

    // A view pins the version its `dataset` column names (`NAME@VERSION`), and says so when the
    // query read another version than the one it pins.
    ingest_ok(&root, &testdata("v30-av1-small"), &["--tolerance-s", "0.0002"]);
    let run =
        lake(&root, &["view", "create", "old", "SELECT 'v30-av1-small@1' AS dataset, episode_index FROM \"v30-av1-small@1\".episodes"]);
    assert!(run.code == 0 && run.stdout.contains("(v30-av1-small@1: 6 episodes)") && !run.stdout.contains("note"), "{run:#?}");
    let run =
        lake(&root, &["view", "create", "latest", "SELECT 'v30-av1-small' AS dataset, episode_index FROM \"v30-av1-small@1\".episodes"]);
    assert!(run.code == 0 && run.stdout.contains("(v30-av1-small@2: 6 episodes)"), "{run:#?}");
    assert!(run.stdout.contains("note: the query reads v30-av1-small@1, but the view draws v30-av1-small@2"), "{run:#?}");
    // And the other way: the query read the latest version, the view pins an older one.
    let run =
        lake(&root, &["view", "create", "pinned", "SELECT 'v30-av1-small@1' AS dataset, episode_index FROM \"v30-av1-small\".episodes"]);
    assert!(run.code == 0 && run.stdout.contains("(v30-av1-small@1: 6 episodes)"), "{run:#?}");
    assert!(run.stdout.contains("note: the query reads v30-av1-small@2, but the view draws v30-av1-small@1"), "{run:#?}");
    // Spellings of one version are one dataset: episodes merged, weights that must agree.
    let run = lake(
        &root,
        &["view", "create", "spelled", "SELECT 'v30-av1-small@1' AS dataset, 0 AS episode_index UNION ALL SELECT 'v30-av1-small@01', 1"],
    );
    assert!(run.code == 0 && run.stdout.contains("created: 2 episodes (v30-av1-small@1: 2 episodes)"), "{run:#?}");
    let query = "SELECT 'v30-av1-small' AS dataset, 0 AS episode_index, 1.0 AS weight UNION ALL SELECT 'v30-av1-small@2', 1, 5.0";
    let run = lake(&root, &["view", "create", "twice", query]);
    assert!(
        run.code == 2 && run.stderr.contains("`v30-av1-small@2` has two weights (1 as `v30-av1-small` and 5 as `v30-av1-small@2`)"),
        "{run:#?}"
    );
}

/// The episode of every draw of epoch 0 of sampling `spec`, in order.
fn epoch_episodes(root: &Path, spec: &str) -> Vec<i64> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let lake = lake_store::Lake::open(root.to_str().expect("utf-8")).expect("lake");
        let spec = lake_loader::views::SamplingSpec { datasets: vec![spec.to_string()], ..Default::default() };
        let sampling = lake_loader::views::open_sampling(&lake, &spec).await.expect("view opens");
        let order = lake_loader::Order::new(7, sampling.sources).expect("order");
        (0..order.epoch_len())
            .map(|p| {
                let draw = order.draw(0, p);
                let ds = &sampling.datasets[draw.source];
                ds.episodes
                    .iter()
                    .find(|e| (e.first_row..e.first_row + e.len).contains(&draw.row))
                    .expect("row in an episode")
                    .episode_index
            })
            .collect()
    })
}

/// Nesting depth and lengths of a JSON value (`[3, 1, 1]` for `[[[a]], [[b]], [[c]]]`).
fn json_shape(v: &Value) -> Vec<usize> {
    match v {
        Value::Array(items) => std::iter::once(items.len()).chain(items.first().map(json_shape).unwrap_or_default()).collect(),
        _ => Vec::new(),
    }
}

#[test]
fn stats_export_has_lerobot_layout_exact_numbers_and_the_sources_camera_stats() {
    let (tmp, root) = lake_with(&["v30-av1-small"]);
    let out = tmp.path().join("stats.json");
    let run = lake(&root, &["stats", "v30-av1-small", "--output", out.to_str().expect("utf-8")]);
    assert_eq!(run.code, 0, "{run:#?}");
    let ours: Value = serde_json::from_str(&std::fs::read_to_string(&out).expect("written")).expect("json");
    let source: Value =
        serde_json::from_str(&std::fs::read_to_string(testdata("v30-av1-small").join("meta/stats.json")).expect("source")).expect("json");
    let (ours, source) = (ours.as_object().expect("object"), source.as_object().expect("object"));
    assert_eq!(ours.keys().collect::<Vec<_>>().len(), source.len());
    for (feature, theirs) in source {
        let mine = ours.get(feature).unwrap_or_else(|| panic!("stats.json lacks {feature}"));
        let (mine, theirs) = (mine.as_object().expect("object"), theirs.as_object().expect("object"));
        let mut keys: Vec<&String> = mine.keys().collect();
        // In LeRobot's order, whatever the source's (so an export round trip keeps the file).
        let order = ["min", "max", "mean", "std", "count", "q01", "q10", "q50", "q90", "q99"];
        let ranks: Vec<Option<usize>> = keys.iter().map(|k| order.iter().position(|o| o == k)).collect();
        assert!(ranks.iter().all(Option::is_some) && ranks.is_sorted(), "{feature}: statistics in order: {keys:?}");
        let mut want: Vec<&String> = theirs.keys().collect();
        keys.sort();
        want.sort();
        assert_eq!(keys, want, "{feature}: statistics");
        for (stat, value) in theirs {
            assert_eq!(json_shape(&mine[stat]), json_shape(value), "{feature}.{stat}: shape");
        }
        assert_eq!(mine["count"], theirs["count"], "{feature}: count");
        if feature.starts_with("observation.images.") {
            assert_eq!(mine, theirs, "{feature}: camera statistics are the source's");
        }
    }
    // With --images, camera statistics are lake's own: LeRobot's subsample (the same frame
    // count), per channel, over the decoded frames, also queryable as `image_stats`.
    let run = lake(&root, &["stats", "v30-av1-small", "--images"]);
    assert_eq!(run.code, 0, "{run:#?}");
    let with_images: Value = serde_json::from_str(&run.stdout).expect("json");
    for camera in ["observation.images.front", "observation.images.wrist"] {
        let mine = &with_images[camera];
        assert_eq!(mine["count"], source[camera]["count"], "{camera}: LeRobot's subsample size");
        assert_ne!(mine["mean"], source[camera]["mean"], "{camera}: computed by lake, not copied");
        // Close to LeRobot's means, which it took from the frames before encoding; lake's std is
        // the pixels' and larger than LeRobot's, whose per-episode image std is 0 (its estimator
        // squares uint8 pixels, which wrap) and whose dataset std is the episode means' spread.
        let channels =
            |v: &Value| -> Vec<f64> { v.as_array().expect("channels").iter().map(|c| c[0][0].as_f64().expect("number")).collect() };
        for (m, t) in channels(&mine["mean"]).iter().zip(channels(&source[camera]["mean"])) {
            assert!((m - t).abs() < 0.02, "{camera}: mean {m} against LeRobot's {t}");
        }
        for (m, t) in channels(&mine["std"]).iter().zip(channels(&source[camera]["std"])) {
            assert!(*m > t && *m < 0.5, "{camera}: std {m} against LeRobot's {t}");
        }
        assert_eq!(json_shape(&mine["q50"]), vec![3, 1, 1]);
    }
    let rows =
        sql_rows(&root, "SELECT feature, dim, min, q01, q50, q99, max FROM image_stats WHERE episode_index IS NULL ORDER BY feature, dim");
    assert_eq!(rows.len(), 6, "{rows:?}");
    for r in &rows {
        let v: Vec<f64> = ["min", "q01", "q50", "q99", "max"].iter().map(|k| num(r, k)).collect();
        assert!(v.windows(2).all(|w| w[0] <= w[1]) && v[0] >= 0.0 && v[4] <= 1.0, "{r:?}");
    }

    // Exact where LeRobot stores an envelope of per-episode estimates: episode 0 holds the lowest
    // 99 of the 600 steps, so the dataset's q01 of episode_index is 0 (the source says 2.2).
    assert_eq!(ours["episode_index"]["q01"], serde_json::json!([0.0]));
    // Integer features' extremes as whole numbers, as LeRobot writes them.
    assert_eq!(ours["index"]["min"], serde_json::json!([0]));
    assert_eq!(ours["index"]["max"], serde_json::json!([599]));
    assert_eq!(ours["index"]["min"], source["index"]["min"]);
    assert_eq!(ours["index"]["q50"], serde_json::json!([299.5]));

    // A derived table damaged outside lake is left out by itself, with a warning saying how to
    // make it again; the dataset's other tables still answer.
    let dir = std::fs::read_dir(root.join("datasets/v30-av1-small")).expect("versions").next().expect("a version").expect("entry").path();
    for file in std::fs::read_dir(dir.join("image_stats.lance/data")).expect("data dir") {
        std::fs::remove_file(file.expect("entry").path()).expect("remove");
    }
    let run = lake(&root, &["sql", "--format", "csv", "SELECT count(*) AS n FROM steps"]);
    assert_eq!((run.code, run.stdout.as_str()), (0, "n\n600\n"), "{run:#?}");
    assert!(
        run.stderr.contains("table image_stats of v30-av1-small@1 is left out") && run.stderr.contains("lake stats --images"),
        "{}",
        run.stderr
    );
}

#[test]
fn earlier_versions_are_queryable_and_a_damaged_dataset_leaves_the_others_readable() {
    let (_tmp, root) = lake_with(&["v30-av1-small", "v30-images-tiny"]);
    ingest_ok(&root, &testdata("v30-h264-multifile"), &["--name", "v30-av1-small"]);
    let count = |query: &str| num(&sql_rows(&root, query)[0], "n");
    assert_eq!(count("SELECT count(*) AS n FROM \"v30-av1-small@1\".steps"), 600.0, "version 1: the AV1 recording");
    let latest = count("SELECT count(*) AS n FROM \"v30-av1-small\".steps");
    assert_eq!(count("SELECT count(*) AS n FROM \"v30-av1-small@2\".steps"), latest);
    assert_ne!(latest, 600.0);
    let run = lake(&root, &["sql", "SELECT count(*) FROM \"v30-av1-small@7\".steps"]);
    assert!(run.code != 0 && run.stderr.contains("no dataset `v30-av1-small@7`") && run.stderr.contains("v30-av1-small@2"), "{run:#?}");

    // One dataset's steps table lost: the others stay queryable, and the damaged one is named.
    let version_dir =
        std::fs::read_dir(root.join("datasets/v30-images-tiny")).expect("dir").next().expect("a version").expect("entry").path();
    std::fs::remove_dir_all(version_dir.join("steps.lance")).expect("remove");
    let run = lake(&root, &["sql", "--format", "json", "SELECT count(*) AS n FROM steps"]);
    assert_eq!(run.code, 0, "{run:#?}");
    assert!(run.stderr.contains("warning: dataset v30-images-tiny@1 cannot be read"), "{run:#?}");
    assert!(!run.stderr.contains(".rs:"), "no source locations: {}", run.stderr);
    let run = lake(&root, &["sql", "SELECT count(*) FROM \"v30-images-tiny\".steps"]);
    assert!(run.code != 0 && run.stderr.contains("error: dataset v30-images-tiny@1 cannot be read"), "{run:#?}");
}

/// Datasets recorded under other names (`actions` and `state`, 34 dimensions, against `action`
/// and `observation.state`, 6) stack in one view once it maps their features: renamed, cut to
/// the dimensions they share, cameras left out. Samples carry the mapped values, `lake stats` of
/// the view its mapped statistics, and an export of a mapped view is refused.
#[test]
fn a_view_maps_features_so_datasets_from_other_robots_stack() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("lake");
    ingest_ok(&root, &testdata("v30-images-tiny"), &[]);
    let lingzu = lake_testkit::shared_dir().join("lerobot-real/lingzu-open50-v30");
    ingest_ok(&root, &lingzu, &["--missing-video", "keep-rows"]);
    let both = "SELECT dataset, episode_index FROM episodes";

    let plain = lake(&root, &["view", "create", "mix", both]);
    assert_ne!(plain.code, 0, "{plain:#?}");
    assert!(plain.stderr.contains("its samples could not stack"), "{}", plain.stderr);

    let lz = "lingzu-open50-v30";
    let (actions, state) = (format!("{lz}:actions=action"), format!("{lz}:state=observation.state"));
    let mapped = ["--rename", &actions, "--rename", &state, "--dims", "observation.state=0:6", "--dims", "action=0:6"];
    let cameras = ["--drop", "image", "--drop", "observation.images.front"];
    let mut args = vec!["view", "create", "mix", both];
    args.extend(mapped);
    args.extend(cameras);
    let made = lake(&root, &args);
    assert_eq!(made.code, 0, "{made:#?}");
    let shown = lake(&root, &["view", "show", "mix"]);
    assert!(shown.stdout.contains("\"observation.state\": [") || shown.stdout.contains("\"observation.state\":["), "{}", shown.stdout);
    let bench = lake(&root, &["bench", "--dataset", "mix", "--batches", "3", "--batch-size", "8", "--preset", "none"]);
    assert_eq!(bench.code, 0, "{bench:#?}");

    // One dataset's view: its samples carry the cut, renamed values.
    let mut args = vec!["view", "create", "lz", "SELECT 'lingzu-open50-v30' AS dataset, episode_index FROM \"lingzu-open50-v30\".episodes"];
    args.extend(["--rename", "state=observation.state", "--dims", "observation.state=4,0", "--drop", "image"]);
    let made = lake(&root, &args);
    assert_eq!(made.code, 0, "{made:#?}");
    let step = sql_rows(&root, "SELECT index, state FROM \"lingzu-open50-v30\".steps WHERE episode_index = 7 AND frame_index = 3");
    let index = num(&step[0], "index") as i64;
    // float32 values, printed by SQL as the shortest text that reads back as the same float32.
    let stored: Vec<f32> = step[0]["state"].as_array().expect("a list").iter().map(|v| v.as_f64().expect("a number") as f32).collect();
    let out = tmp.path().join("lz.arrow");
    let run = lake(
        &root,
        &["sample", "--dataset", "lz", "--indices", &index.to_string(), "--preset", "none", "--out", out.to_str().expect("utf-8")],
    );
    assert_eq!(run.code, 0, "{run:#?}");
    let batch = read_arrow(&out);
    assert!(batch.column_by_name("state").is_none() && batch.column_by_name("image").is_none(), "{:?}", batch.schema());
    let got = batch.column_by_name("observation.state").expect("renamed").as_fixed_size_list().value(0);
    let got: Vec<f32> = got.as_primitive::<arrow::datatypes::Float32Type>().values().to_vec();
    assert_eq!(got, vec![stored[4], stored[0]], "dimensions 4 and 0 of the stored state");

    let stats: Value = serde_json::from_str(&lake(&root, &["stats", "lz"]).stdout).expect("stats.json");
    let whole: Value = serde_json::from_str(&lake(&root, &["stats", lz]).stdout).expect("stats.json");
    assert_eq!(stats["observation.state"]["mean"], serde_json::json!([whole["state"]["mean"][4], whole["state"]["mean"][0]]));
    assert!(stats.get("state").is_none() && stats.get("image").is_none(), "{stats}");

    let export = lake(&root, &["export", "lz", "--format", "parquet", tmp.path().join("out").to_str().expect("utf-8")]);
    assert_ne!(export.code, 0, "{export:#?}");
    assert!(export.stderr.contains("maps its features"), "{}", export.stderr);

    // A mapping that names what no dataset has is refused at once.
    let bad = lake(&root, &["view", "create", "bad", both, "--rename", "nope:actions=action"]);
    assert!(bad.stderr.contains("the mapping names dataset `nope`"), "{}", bad.stderr);
    let bad = lake(&root, &["view", "create", "bad", both, "--dims", &format!("{lz}:actions=30:40")]);
    assert!(bad.stderr.contains("`actions` has 34 dimensions, the mapping keeps dimension 34"), "{}", bad.stderr);
}

/// A struct field read in an aggregate over a stacked table plans and answers (the query that
/// picks the episodes with a camera's video, as the ingest guide gives it).
#[test]
fn struct_fields_are_read_through_stacked_tables() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("lake");
    ingest_ok(&root, &testdata("v30-av1-small"), &[]);
    let rows = sql_rows(
        &root,
        "SELECT episode_index, count(packet_row['observation/images/front']) AS n FROM steps GROUP BY episode_index \
         HAVING count(packet_row['observation/images/front']) > 0 ORDER BY episode_index",
    );
    let counted: f64 = rows.iter().map(|r| num(r, "n")).sum();
    assert_eq!((rows.len(), counted), (6, 600.0), "{rows:?}");
}
