//! Versions, idempotence, many datasets in one lake, and interrupted ingests.

use std::{
    io::Write,
    path::Path,
    process::Stdio,
    time::{Duration, Instant},
};

use lake_testkit::{committed_snapshot, copy_dir, repeat_dataset, snapshot, testdata};

use crate::common::{ingest_ok, lake, lake_cmd};

#[test]
fn reingest_is_a_noop_and_a_changed_source_is_a_new_version() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("lake");
    let src = tmp.path().join("multi");
    copy_dir(&testdata("v30-h264-multifile"), &src);
    ingest_ok(&root, &testdata("v30-images-tiny"), &[]);
    let other = snapshot(&root, &[]);
    ingest_ok(&root, &src, &[]);
    // Adding a dataset never rewrote the other one.
    for (path, hash) in &other {
        if path.starts_with("datasets/v30-images-tiny") || path.starts_with("catalog/v30-images-tiny") {
            assert_eq!(snapshot(&root, &[]).get(path), Some(hash), "{path} changed");
        }
    }

    let before = snapshot(&root, &[]);
    let again = ingest_ok(&root, &src, &[]);
    assert!(again.stdout.contains("up to date"), "{again:#?}");
    assert_eq!(snapshot(&root, &[]), before, "a no-op ingest wrote something");

    // Touching files (same bytes, new times) is still the same source.
    let t = std::fs::File::options().append(true).open(src.join("meta/stats.json")).expect("open");
    t.set_modified(std::time::SystemTime::now() + Duration::from_secs(5)).expect("touch");
    let touched = ingest_ok(&root, &src, &[]);
    assert!(touched.stdout.contains("same content"), "{touched:#?}");
    assert_eq!(snapshot(&root, &[]), before);

    // Different options make a different version of the same source.
    let strictness = ingest_ok(&root, &src, &["--tolerance-s", "0.0002"]);
    assert!(strictness.stdout.contains("multi@2"), "{strictness:#?}");

    // A changed source makes a new version; old versions stay readable.
    let tasks = src.join("meta/tasks.parquet");
    let batches = lake_testkit::read_parquet(&tasks);
    lake_testkit::write_parquet(&tasks, &batches); // same rows, different bytes
    let changed = ingest_ok(&root, &src, &[]);
    assert!(changed.stdout.contains("multi@3"), "{changed:#?}");
    let v1 = lake(&root, &["inspect", "multi@1"]);
    assert_eq!(v1.code, 0, "{v1:#?}");
    assert!(v1.stdout.contains("version 1 of 3"), "{}", v1.stdout);
    let ls = lake(&root, &["ls"]);
    assert!(ls.stdout.contains("multi@3") && ls.stdout.contains("v30-images-tiny@1"), "{}", ls.stdout);
    let missing = lake(&root, &["inspect", "multi@9"]);
    assert_eq!(missing.code, 2);
    assert!(missing.stderr.contains("no dataset `multi@9`") && missing.stderr.contains("multi@3"), "{}", missing.stderr);

    // Another source under a taken name is a new version, with a note naming the first source.
    let other = ingest_ok(&root, &testdata("v30-images-tiny"), &["--name", "multi"]);
    assert!(other.stdout.contains("multi@4") && other.stdout.contains("came from another source"), "{other:#?}");
}

#[test]
fn a_version_whose_tables_were_lost_says_so_and_a_reingest_replaces_it() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("lake");
    ingest_ok(&root, &testdata("v30-images-tiny"), &[]);
    let steps = std::fs::read_dir(root.join("datasets/v30-images-tiny")).expect("dataset dir").next().expect("a version").expect("entry");
    std::fs::remove_dir_all(steps.path().join("steps.lance")).expect("remove the steps table");
    let sample = lake(&root, &["sample", "--dataset", "v30-images-tiny", "--indices", "0", "--out", "/dev/null"]);
    assert_eq!(sample.code, 2, "{sample:#?}");
    assert!(sample.stderr.contains("steps.lance: the table's files are missing"), "{}", sample.stderr);
    assert!(!sample.stderr.contains(".rs:"), "no Rust source locations: {}", sample.stderr);
    let again = ingest_ok(&root, &testdata("v30-images-tiny"), &[]);
    assert!(
        again.stdout.contains("v30-images-tiny@2") && again.stdout.contains("cannot be read whole: steps (its files are missing)"),
        "{again:#?}"
    );
    let sample = lake(&root, &["sample", "--dataset", "v30-images-tiny", "--indices", "0", "--out", "/dev/null"]);
    assert_eq!(sample.code, 0, "{sample:#?}");

    // A data file gone from a table that is otherwise there: SQL leaves that dataset out and
    // answers for the others, and the next ingest replaces the version.
    ingest_ok(&root, &testdata("v30-images-tiny"), &["--name", "sound"]);
    let copy = tmp.path().join("copy");
    copy_dir(&testdata("v30-images-tiny"), &copy);
    let same = ingest_ok(&root, &copy, &["--name", "sound"]);
    assert!(same.stdout.contains("sound@1 is up to date") && same.stdout.contains("which holds the same content"), "{same:#?}");
    let version = latest_dir(&root, "v30-images-tiny");
    for file in std::fs::read_dir(version.join("steps.lance/data")).expect("data dir") {
        std::fs::remove_file(file.expect("entry").path()).expect("remove a data file");
    }
    let sql = lake(&root, &["sql", "SELECT dataset, sum(index) AS s FROM steps GROUP BY dataset", "--format", "csv"]);
    assert_eq!(sql.code, 0, "{sql:#?}");
    assert_eq!(sql.stdout.trim(), "dataset,s\nsound,1770", "{sql:#?}");
    assert!(sql.stderr.contains("v30-images-tiny@2 cannot be read") && sql.stderr.contains("is missing"), "{}", sql.stderr);
    let third = ingest_ok(&root, &testdata("v30-images-tiny"), &[]);
    assert!(third.stdout.contains("v30-images-tiny@3") && third.stdout.contains("steps (its data file data/"), "{third:#?}");
    // A data file of another size than the one written (overwritten, truncated) counts too.
    let data = latest_dir(&root, "v30-images-tiny").join("episodes.lance/data");
    let file = std::fs::read_dir(&data).expect("data dir").next().expect("a data file").expect("entry").path();
    std::fs::OpenOptions::new().append(true).open(&file).expect("open").write_all(b"x").expect("append");
    let sql = lake(&root, &["sql", "SELECT count(*) FROM episodes"]);
    assert!(sql.stderr.contains("v30-images-tiny@3 cannot be read") && sql.stderr.contains("were written"), "{}", sql.stderr);
    let ls = lake(&root, &["ls"]);
    assert!(ls.stdout.contains("dataset v30-images-tiny@3 cannot be read whole: episodes (its data file"), "{ls:#?}");
    let inspect = lake(&root, &["inspect", "v30-images-tiny"]);
    assert!(inspect.stderr.contains("table episodes of v30-images-tiny@3 cannot be read whole"), "{inspect:#?}");

    // A commit record damaged: that dataset is named and left out, the others answer, and the
    // next ingest makes the next version.
    std::fs::write(root.join("catalog/v30-images-tiny/v00000003.json"), "{").expect("damage the record");
    let ls = lake(&root, &["ls"]);
    assert_eq!(ls.code, 0, "{ls:#?}");
    assert!(ls.stdout.contains("sound@1") && ls.stdout.contains("its catalog record catalog/v30-images-tiny/v00000003.json"), "{ls:#?}");
    let sql = lake(&root, &["sql", "SELECT dataset, count(*) AS n FROM episodes GROUP BY dataset", "--format", "csv"]);
    assert_eq!((sql.code, sql.stdout.trim()), (0, "dataset,n\nsound,3"), "{sql:#?}");
    assert!(sql.stderr.contains("v30-images-tiny@3 cannot be read"), "{sql:#?}");
    let fourth = ingest_ok(&root, &testdata("v30-images-tiny"), &[]);
    assert!(fourth.stdout.contains("v30-images-tiny@4") && fourth.stdout.contains("the version before cannot be read"), "{fourth:#?}");
}

/// A data file damaged in place, its size unchanged: a footer that no longer fits the file is
/// found when the table is opened (Lance would allocate what its counts ask for, and a failed
/// allocation aborts), and a panic of Lance's decoders in a read is the read's error. Neither
/// crashes a command or prints a panic, and the next ingest replaces the version.
#[test]
fn a_data_file_damaged_in_place_is_named_and_a_reingest_replaces_it() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("lake");
    ingest_ok(&root, &testdata("v30-images-tiny"), &[]);
    ingest_ok(&root, &testdata("v30-images-jpeg"), &[]);
    let data_file = |table: &str| {
        let data = latest_dir(&root, "v30-images-tiny").join(format!("{table}.lance/data"));
        std::fs::read_dir(&data).expect("data dir").next().expect("a data file").expect("entry").path()
    };
    let clean = |run: &crate::common::Run| !run.stderr.contains("panicked") && !run.stderr.contains(".rs:");

    // The footer's count of columns (bytes 28..32 from 40 before the end) made huge.
    let steps = data_file("steps");
    let body = std::fs::read(&steps).expect("read");
    let mut damaged = body.clone();
    damaged[body.len() - 40 + 31] ^= 0xa5;
    std::fs::write(&steps, &damaged).expect("damage");
    let sql = lake(&root, &["sql", "SELECT dataset, count(*) AS n FROM steps GROUP BY dataset", "--format", "csv"]);
    assert_eq!((sql.code, sql.stdout.trim()), (0, "dataset,n\nv30-images-jpeg,60"), "{sql:#?}");
    assert!(sql.stderr.contains("v30-images-tiny@1 cannot be read") && sql.stderr.contains("its footer does not fit the file"), "{sql:#?}");
    let sample = lake(&root, &["sample", "--dataset", "v30-images-tiny", "--indices", "0", "--out", "/dev/null"]);
    assert_eq!(sample.code, 2, "{sample:#?}");
    assert!(
        sample.stderr.contains("steps.lance") && sample.stderr.contains("its footer does not fit the file") && clean(&sample),
        "{sample:#?}"
    );
    let ls = lake(&root, &["ls"]);
    assert!(ls.stdout.contains("dataset v30-images-tiny@1 cannot be read whole: steps"), "{ls:#?}");
    let again = ingest_ok(&root, &testdata("v30-images-tiny"), &[]);
    assert!(again.stdout.contains("v30-images-tiny@2"), "{again:#?}");

    // One byte of the column metadata changed so that Lance's decoder panics: searched from the
    // end of the column metadata (its last pages' descriptions) back.
    let steps = data_file("steps");
    let body = std::fs::read(&steps).expect("read");
    let u64_at = |at: usize| u64::from_le_bytes(body[at..at + 8].try_into().expect("8 bytes")) as usize;
    let (meta, offsets) = (u64_at(body.len() - 40), u64_at(body.len() - 32));
    let failed = (meta..offsets).rev().take(64).find_map(|at| {
        let mut damaged = body.clone();
        damaged[at] ^= 0xa5;
        std::fs::write(&steps, &damaged).expect("damage");
        let sql = lake(&root, &["sql", "SELECT * FROM \"v30-images-tiny\".steps"]);
        assert!(matches!(sql.code, 0 | 2) && clean(&sql), "byte {at}: {sql:#?}");
        sql.stderr.contains("Lance failed reading the table's data").then_some(sql)
    });
    let failed = failed.expect("a byte of the column metadata whose damage makes Lance panic");
    assert!(failed.stderr.contains("/steps.lance/data is damaged"), "{failed:#?}");
    let sample = lake(&root, &["sample", "--dataset", "v30-images-tiny", "--indices", "0,50", "--out", "/dev/null"]);
    assert!(sample.code == 2 && sample.stderr.contains("Lance failed reading the table's data") && clean(&sample), "{sample:#?}");
}

/// `lake rm`: the dataset's files go, every other dataset stays byte for byte, views over it
/// hold it back unless forced, and whatever asks for it afterwards is told it was removed.
#[test]
fn lake_rm_removes_a_dataset_and_says_so_to_whoever_asks_for_it() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("lake");
    ingest_ok(&root, &testdata("v30-images-tiny"), &[]);
    ingest_ok(&root, &testdata("v30-images-jpeg"), &["--name", "v30-images-tiny"]);
    ingest_ok(&root, &testdata("v30-h264-multifile"), &[]);
    let view = lake(
        &root,
        &["view", "create", "first", "SELECT dataset, episode_index FROM episodes WHERE dataset = 'v30-images-tiny' AND episode_index = 0"],
    );
    assert_eq!(view.code, 0, "{view:#?}");
    let kept = |snap: &std::collections::BTreeMap<String, String>| -> Vec<(String, String)> {
        snap.iter().filter(|(p, _)| p.contains("v30-h264-multifile")).map(|(p, h)| (p.clone(), h.clone())).collect()
    };
    let before = snapshot(&root, &[]);

    for (args, says) in [
        (vec!["rm", "v30-images-tiny"], "is selected from by view first@1: drop it first"),
        (vec!["rm", "v30-images-tiny@1"], "lake rm takes a dataset's name alone"),
        (vec!["rm", "first"], "`first` is a view; drop it with `lake view drop first`"),
        (vec!["rm", "nothing"], "no dataset `nothing` in the lake"),
    ] {
        let run = lake(&root, &args);
        assert_eq!(run.code, 2, "{args:?}: {run:#?}");
        assert!(run.stderr.contains(says), "{args:?}: {run:#?}");
        assert_eq!(snapshot(&root, &[]), before, "{args:?} changed the lake");
    }

    let run = lake(&root, &["rm", "v30-images-tiny", "--force"]);
    assert_eq!(run.code, 0, "{run:#?}");
    assert!(run.stdout.starts_with("removed dataset v30-images-tiny (versions 1 to 2; "), "{run:#?}");
    assert!(run.stdout.contains("views that select from it and now fail to load: first@1"), "{run:#?}");
    let after = snapshot(&root, &[]);
    assert!(!after.keys().any(|p| p.starts_with("datasets/v30-images-tiny") || p.starts_with("catalog/v30-images-tiny")), "{after:#?}");
    assert_eq!(kept(&after), kept(&before), "the other dataset is untouched");

    let ls = lake(&root, &["ls", "--json"]);
    let listing: serde_json::Value = serde_json::from_str(&ls.stdout).expect("json");
    let removed = &listing["removed"][0];
    assert_eq!(
        (&removed["name"], &removed["from_version"], &removed["through_version"]),
        (&"v30-images-tiny".into(), &1.into(), &2.into())
    );
    // The view over it says so to JSON readers too.
    let first = listing["views"].as_array().expect("views").iter().find(|v| v["name"] == "first").expect("the view");
    assert_eq!(
        (&first["datasets"][0]["removed"]["name"], &first["datasets"][0]["removed"]["through_version"]),
        (&"v30-images-tiny".into(), &2.into()),
        "{first}"
    );
    let ls = lake(&root, &["ls"]);
    assert!(ls.stdout.contains("v30-h264-multifile@1") && !ls.stdout.contains("\nv30-images-tiny@"), "{ls:#?}");
    assert!(ls.stdout.contains("from v30-images-tiny@2 (removed with lake rm)\n"), "{ls:#?}");
    let views = lake(&root, &["view", "ls"]);
    assert!(views.stdout.contains("  v30-images-tiny@2 (removed with lake rm)\n"), "{views:#?}");
    let out = tmp.path().join("s.arrow");
    let out = out.to_str().expect("utf-8");
    for (args, says) in [
        (vec!["inspect", "v30-images-tiny"], "no dataset `v30-images-tiny` in the lake"),
        (vec!["sample", "--dataset", "v30-images-tiny@1", "--indices", "0", "--out", out], "no dataset or view `v30-images-tiny@1`"),
        (
            vec!["sample", "--dataset", "first", "--indices", "0", "--out", out],
            "no dataset `v30-images-tiny@2` in the lake (view `first@1` selects it)",
        ),
        (vec!["sql", "SELECT count(*) FROM \"v30-images-tiny\".steps"], "the lake has no dataset `v30-images-tiny`"),
        (vec!["rm", "v30-images-tiny"], "no dataset `v30-images-tiny` in the lake"),
    ] {
        let run = lake(&root, &args);
        assert_ne!(run.code, 0, "{args:?}: {run:#?}");
        assert!(run.stderr.contains(says), "{args:?}: {run:#?}");
        assert!(run.stderr.contains("`v30-images-tiny` was removed with `lake rm` at "), "{args:?}: {run:#?}");
        assert!(run.stderr.contains("(versions 1 to 2)"), "{args:?}: {run:#?}");
    }
    // SQL over every dataset answers without it.
    let sql = lake(&root, &["sql", "--format", "csv", "SELECT dataset, count(*) AS n FROM steps GROUP BY dataset"]);
    assert_eq!(sql.stdout, "dataset,n\nv30-h264-multifile,300\n", "{sql:#?}");

    // An ingest under the name continues after the removed versions; a view cannot take it.
    let run = ingest_ok(&root, &testdata("v30-images-tiny"), &[]);
    assert!(run.stdout.contains("as v30-images-tiny@3"), "{run:#?}");
    let run = lake(&root, &["sample", "--dataset", "v30-images-tiny", "--indices", "0", "--out", out]);
    assert_eq!(run.code, 0, "{run:#?}");

    // A damaged commit record: `lake ls --json` names it as an object.
    let record = root.join("catalog/v30-images-tiny/v00000003.json");
    let intact = std::fs::read(&record).expect("record");
    std::fs::write(&record, b"{\"name\": ").expect("damage");
    let ls = lake(&root, &["ls", "--json"]);
    assert_eq!(ls.code, 0, "{ls:#?}");
    let listing: serde_json::Value = serde_json::from_str(&ls.stdout).expect("json");
    let entry = &listing["unreadable"][0];
    assert_eq!((&entry["kind"], &entry["name"], &entry["version"]), (&"dataset".into(), &"v30-images-tiny".into(), &3.into()), "{entry}");
    assert_eq!(entry["record"], "catalog/v30-images-tiny/v00000003.json");
    assert!(entry["why"].as_str().is_some_and(|w| !w.is_empty()) && entry["message"].as_str().is_some(), "{entry}");
    assert!(ls.stderr.contains("warning: dataset v30-images-tiny@3 is left out: its catalog record"), "{ls:#?}");
    std::fs::write(&record, intact).expect("repair");

    // `lake rm` killed after its removal record (made here by hand): nothing of the version is
    // seen, and the next `lake rm` finishes deleting it.
    std::fs::write(root.join("removed/v30-images-tiny/v00000003.json"), b"").expect("record");
    let ls = lake(&root, &["ls"]);
    assert!(!ls.stdout.contains("\nv30-images-tiny@") && ls.stderr.is_empty(), "{ls:#?}");
    let run = lake(&root, &["rm", "v30-images-tiny"]);
    assert_eq!(run.code, 0, "{run:#?}");
    assert!(run.stdout.starts_with("finished removing dataset v30-images-tiny, removed at "), "{run:#?}");
    assert!(run.stdout.contains(" (version 3; ") && !root.join("datasets/v30-images-tiny").exists(), "{run:#?}");
    let view = lake(&root, &["view", "create", "v30-images-tiny", "SELECT dataset, episode_index FROM episodes"]);
    assert!(view.code != 0 && view.stderr.contains("`v30-images-tiny` was removed with `lake rm`"), "{view:#?}");
}

/// The directory of a dataset's latest version, from its commit record.
fn latest_dir(root: &Path, name: &str) -> std::path::PathBuf {
    let ls = lake(root, &["ls", "--json"]);
    let records: serde_json::Value = serde_json::from_str(&ls.stdout).expect("json");
    let record = records["datasets"].as_array().expect("list").iter().find(|r| r["name"] == name).expect("the dataset");
    root.join(record["tables"]["dir"].as_str().expect("dir"))
}

#[test]
fn a_failed_first_ingest_leaves_no_lake_and_dot_is_named_after_its_directory() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("lake");
    let run = lake(&root, &["ingest", tmp.path().join("no-such-dataset").to_str().expect("utf-8"), "--json"]);
    assert_eq!(run.code, 2, "{run:#?}");
    let out: serde_json::Value = serde_json::from_str(&run.stdout).expect("json even when it fails");
    assert_eq!(out["outcome"], "failed");
    assert!(out["error"].as_str().expect("error").contains("no-such-dataset"), "{out}");
    assert!(!root.exists(), "the lake directory it would have made is not left behind");
    std::fs::create_dir(&root).expect("empty dir");
    let run = lake(&root, &["ingest", testdata("v30-av1-small").join("meta/info.json").to_str().expect("utf-8")]);
    assert!(run.code != 0 && run.stderr.contains("is a file; give the dataset's directory"), "{run:#?}");
    assert_eq!(std::fs::read_dir(&root).expect("dir").count(), 0, "an empty directory stays empty");
    // A directory whose name is not UTF-8, given as an argument or reached as `.`, is refused
    // by name (sources are read and recorded by text paths).
    use std::os::unix::ffi::OsStrExt;
    let odd = tmp.path().join(std::ffi::OsStr::from_bytes(b"na\xffme"));
    copy_dir(&testdata("v30-images-tiny"), &odd);
    let run = lake_cmd(&root).arg("ingest").arg(&odd).output().expect("run");
    assert!(run.status.code() == Some(2) && String::from_utf8_lossy(&run.stderr).contains("me is not UTF-8 text; "), "{run:?}");
    let run = lake_cmd(&root).args(["ingest", "."]).current_dir(&odd).output().expect("run");
    assert!(String::from_utf8_lossy(&run.stderr).contains("me is not UTF-8 text; "), "{run:?}");
    assert_eq!(std::fs::read_dir(&root).expect("dir").count(), 0, "an empty directory stays empty");

    let run = lake_cmd(&root).args(["ingest", "."]).current_dir(testdata("v30-images-tiny")).output().expect("run");
    assert!(run.status.success(), "{run:?}");
    assert!(String::from_utf8_lossy(&run.stdout).contains("as v30-images-tiny@1"), "{run:?}");
    let ls = lake(&root, &["ls", "--json"]);
    let records: serde_json::Value = serde_json::from_str(&ls.stdout).expect("json");
    assert_eq!(
        records["datasets"][0]["source"]["url"],
        testdata("v30-images-tiny").to_str().expect("utf-8"),
        "the source is recorded absolute"
    );
    assert_eq!((records["views"].as_array().map(Vec::len), records["unreadable"].as_array().map(Vec::len)), (Some(0), Some(0)));
    assert!(!String::from_utf8_lossy(&run.stdout).contains("note: named"), "{run:?}");

    // A directory name that is no dataset name is made one, and the summary says so.
    let odd = tmp.path().join("my data ü");
    lake_testkit::copy_dir(&testdata("v30-images-tiny"), &odd);
    let run = crate::common::ingest_ok(&root, &odd, &[]);
    assert!(
        run.stdout.contains("as my_data__@1") && run.stdout.contains("note: named `my_data__` after its directory `my data ü`"),
        "{run:#?}"
    );
}

/// A command stopped by SIGTERM (what service managers and `timeout` send) removes the output
/// file it was writing and says so in its exit status (143).
#[test]
fn a_terminated_query_leaves_no_partial_output() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("lake");
    ingest_ok(&root, &testdata("v30-images-tiny"), &[]);
    let out = tmp.path().join("answer.parquet");
    let child = lake_cmd(&root)
        .args(["sql", "SELECT a.index, b.index FROM steps a, steps b, steps c, steps d", "--output", out.to_str().expect("utf-8")])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sql");
    let partial = || std::fs::read_dir(tmp.path()).expect("dir").flatten().any(|e| e.file_name().to_string_lossy().contains(".partial"));
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut child = child;
    while !partial() {
        assert!(Instant::now() < deadline && child.try_wait().expect("wait").is_none(), "the query never started writing");
        std::thread::sleep(Duration::from_millis(20));
    }
    let terminate = std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status().expect("kill");
    assert!(terminate.success());
    let run = child.wait_with_output().expect("exits");
    assert_eq!(run.status.code(), Some(143), "{run:?}");
    assert!(!partial() && !out.exists(), "the output being written is removed");
}

/// Output that cannot be written (a full disk) is an error with its exit status, never a
/// panic; the ingest itself is committed, and a full stderr does not change the outcome.
#[test]
fn unwritable_output_is_an_error_not_a_crash() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("lake");
    let full = || std::fs::OpenOptions::new().write(true).open("/dev/full").expect("/dev/full");
    let src = testdata("v30-av1-small");
    let run = lake_cmd(&root).args(["ingest", src.to_str().expect("utf-8")]).stdout(full()).output().expect("run");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("No space left on device") && !stderr.contains("panicked"), "{stderr}");
    assert!(lake(&root, &["ls"]).stdout.contains("v30-av1-small@1"), "committed before its summary was printed");
    let run = lake_cmd(&root).args(["ingest", "/no/such/dataset"]).stderr(full()).output().expect("run");
    assert_eq!(run.status.code(), Some(2), "{run:?}");
    for args in [&["view", "ls"][..], &["ls"], &["inspect", "v30-av1-small"], &["sql", "SELECT 1"]] {
        let run = lake_cmd(&root).args(args).stdout(full()).output().expect("run");
        assert_eq!(run.status.code(), Some(2), "{args:?}: {run:?}");
    }
}

#[test]
fn two_ingests_of_one_source_at_once_make_one_version() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("lake");
    ingest_ok(&root, &testdata("v30-images-tiny"), &[]);
    let src = testdata("v30-av1-small");
    let start = || lake_cmd(&root).args(["ingest", src.to_str().expect("utf-8")]).stdout(Stdio::piped()).spawn().expect("ingest");
    let (a, b) = (start(), start());
    for run in [a.wait_with_output().expect("a"), b.wait_with_output().expect("b")] {
        assert!(run.status.success(), "{run:?}");
    }
    let ls = lake(&root, &["ls"]);
    assert!(ls.stdout.contains("v30-av1-small@1") && !ls.stdout.contains("v30-av1-small@2"), "{}", ls.stdout);
}

/// Starts an ingest of a dataset big enough to take a while and returns once it is writing
/// packet data.
fn start_long_ingest(root: &Path, src: &Path, scratch: &Path) -> std::process::Child {
    let mut child = lake_cmd(root)
        .args(["ingest", src.to_str().expect("utf-8"), "--name", "big"])
        .env("TMPDIR", scratch)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if Instant::now() > deadline || child.try_wait().is_ok_and(|s| s.is_some()) {
            let _ = child.kill();
            let status = child.wait();
            panic!("the ingest never started writing packets ({status:?})");
        }
        let writing = std::fs::read_dir(root.join("datasets/big"))
            .into_iter()
            .flatten()
            .flatten()
            .any(|d| std::fs::read_dir(d.path().join("packets.lance/data")).is_ok_and(|mut e| e.next().is_some()));
        if writing {
            return child;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn big_source(tmp: &Path) -> std::path::PathBuf {
    let src = tmp.join("big-src");
    repeat_dataset(&testdata("v30-av1-small"), &src, 12);
    src
}

#[test]
fn killed_ingest_leaves_the_lake_unchanged_and_a_rerun_succeeds() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("lake");
    ingest_ok(&root, &testdata("v30-images-tiny"), &[]);
    let src = big_source(tmp.path());
    let committed = committed_snapshot(&root);
    let listing = lake(&root, &["ls"]).stdout;

    let scratch = tmp.path().join("scratch");
    std::fs::create_dir(&scratch).expect("scratch dir");
    let mut child = start_long_ingest(&root, &src, &scratch);
    // SIGKILL: no handler runs, nothing is cleaned up by the process itself.
    child.kill().expect("kill");
    let status = child.wait().expect("wait");
    assert!(!status.success());
    assert_eq!(std::fs::read_dir(&scratch).expect("scratch").count(), 1, "the killed ingest's scratch files remain");

    assert_eq!(committed_snapshot(&root), committed, "committed state changed");
    assert_eq!(lake(&root, &["ls"]).stdout, listing, "a half dataset is visible");
    assert!(
        root.join("staging").read_dir().expect("lease left").next().is_some(),
        "the killed ingest's lease should remain until collected"
    );

    let rerun = lake_cmd(&root).args(["ingest", src.to_str().expect("utf-8"), "--name", "big"]).env("TMPDIR", &scratch).output();
    let rerun = rerun.expect("rerun");
    assert!(rerun.status.success() && String::from_utf8_lossy(&rerun.stdout).contains("big@1"), "{rerun:#?}");
    assert_eq!(
        std::fs::read_dir(&scratch).expect("scratch").count(),
        0,
        "the rerun removed the killed ingest's scratch files, and its own"
    );
    assert!(!root.join("staging").exists(), "leftovers of the killed ingest were not collected");
    let dirs: Vec<_> = std::fs::read_dir(root.join("datasets/big")).expect("dataset dir").flatten().collect();
    assert_eq!(dirs.len(), 1, "only the committed version's directory remains: {dirs:?}");
    let ls = lake(&root, &["ls"]).stdout;
    assert!(ls.contains("big@1") && ls.contains("7200"), "{ls}");
}

#[test]
fn interrupted_ingest_removes_everything_it_wrote() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("lake");
    ingest_ok(&root, &testdata("v30-images-tiny"), &[]);
    let src = big_source(tmp.path());
    let before = snapshot(&root, &[]);
    let scratch = tmp.path().join("scratch");
    std::fs::create_dir(&scratch).expect("scratch dir");
    let child = start_long_ingest(&root, &src, &scratch);
    // SAFETY: sending SIGINT to our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().expect("wait");
    assert_eq!(out.status.code(), Some(130), "{out:?}");
    assert_eq!(snapshot(&root, &[]), before, "Ctrl-C left files behind");
    assert_eq!(std::fs::read_dir(&scratch).expect("scratch").count(), 0, "Ctrl-C left scratch files behind");

    // Late, with every packet written and the small tables being made: still nothing is
    // committed (SIGTERM, exit 143).
    let mut child = lake_cmd(&root)
        .args(["ingest", src.to_str().expect("utf-8"), "--name", "big"])
        .env("LAKE_LOG", "lake_ingest=info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut log = std::io::BufReader::new(child.stderr.take().expect("stderr"));
    let mut line = String::new();
    while !line.contains("phase=\"writing metadata tables\"") {
        line.clear();
        assert!(std::io::BufRead::read_line(&mut log, &mut line).expect("log") > 0, "the ingest ended before its last phase");
    }
    // SAFETY: sending SIGTERM to our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    std::io::copy(&mut log, &mut std::io::sink()).expect("drain the log");
    assert_eq!(child.wait().expect("wait").code(), Some(143));
    assert_eq!(snapshot(&root, &[]), before, "a late SIGTERM committed or left files behind");
}

/// `lake cache` interrupted (Ctrl-C) leaves no unpublished table behind, and the leftovers of
/// one killed outright are removed by the next run.
#[test]
fn interrupted_or_killed_frame_caching_leaves_nothing_behind() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("lake");
    ingest_ok(&root, &testdata("v30-av1-small"), &[]);
    let version = std::fs::read_dir(root.join("datasets/v30-av1-small")).expect("dir").next().expect("a version").expect("entry").path();
    let hidden = || -> Vec<String> {
        std::fs::read_dir(&version)
            .expect("dir")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with('.'))
            .collect()
    };
    // What a killed run leaves: an unpublished table of a process that is gone.
    std::fs::create_dir_all(version.join(".frames-4194000-0123abcd.lance/data")).expect("leftover");
    let mut child = lake_cmd(&root)
        .args(["cache", "v30-av1-small", "--storage", "zstd", "--threads", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cache");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !hidden().iter().any(|n| n.contains(&format!("-{}-", child.id()))) {
        assert!(Instant::now() < deadline && child.try_wait().expect("wait").is_none(), "the cache run never started a table");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!hidden().iter().any(|n| n.contains("4194000")), "the dead writer's table is removed");
    let interrupt = std::process::Command::new("kill").args(["-INT", &child.id().to_string()]).status().expect("kill");
    assert!(interrupt.success());
    let out = child.wait_with_output().expect("exits");
    assert_eq!(out.status.code(), Some(130), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("no frame table was stored"), "{out:?}");
    assert!(hidden().is_empty(), "{:?}", hidden());
    assert!(!version.join("frames.lance").exists());

    // `lake ingest --frame-cache` interrupted while it stores frames: the version it committed
    // stays, the table being written goes.
    let child = lake_cmd(&root)
        .args(["ingest", testdata("v30-av1-small").to_str().expect("utf-8"), "--name", "second", "--frame-cache", "native"])
        .args(["--frame-storage", "zstd", "--threads", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ingest");
    let storing = |root: &Path| -> bool {
        std::fs::read_dir(root.join("datasets/second")).into_iter().flatten().flatten().any(|v| {
            std::fs::read_dir(v.path()).into_iter().flatten().flatten().any(|e| e.file_name().to_string_lossy().starts_with(".frames-"))
        })
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut child = child;
    while !storing(&root) {
        assert!(Instant::now() < deadline && child.try_wait().expect("wait").is_none(), "the ingest never started storing frames");
        std::thread::sleep(Duration::from_millis(20));
    }
    let interrupt = std::process::Command::new("kill").args(["-INT", &child.id().to_string()]).status().expect("kill");
    assert!(interrupt.success());
    let out = child.wait_with_output().expect("exits");
    assert_eq!(out.status.code(), Some(130), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("second@1 is in the lake, its frames are not stored"), "{out:?}");
    assert!(!storing(&root), "the table being stored was left behind");
    assert!(lake(&root, &["ls"]).stdout.contains("second@1"));
}

/// A lake started with SIGINT ignored (a background job of a shell script) keeps ignoring it:
/// Ctrl-C at the terminal is not meant for it. SIGTERM still stops it.
#[test]
fn an_interrupt_ignored_by_the_parent_stays_ignored() {
    use std::io::BufRead as _;
    use std::os::unix::process::CommandExt;
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("lake");
    ingest_ok(&root, &testdata("v30-images-tiny"), &[]);
    let mut cmd = lake_cmd(&root);
    cmd.args(["serve", "--http", "127.0.0.1:0", "--flight", "127.0.0.1:0"]).stdout(Stdio::piped()).stderr(Stdio::null());
    // SAFETY: between fork and exec this only sets a signal's action (async-signal-safe).
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_IGN);
            Ok(())
        });
    }
    let mut child = cmd.spawn().expect("serve");
    let mut first = String::new();
    std::io::BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut first).expect("read");
    assert!(first.starts_with("lake serving"), "{first}");
    // SAFETY: signals to our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    std::thread::sleep(Duration::from_millis(500));
    assert!(child.try_wait().expect("wait").is_none(), "SIGINT stopped it");
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert!(child.wait().expect("exits").success());
}

/// One byte flipped inside a table's data file (its size unchanged, so Lance and `lake ls` see
/// nothing), a file added beside the tables and one frame of a frame table changed: `lake
/// verify` names each, exits 1 without touching the lake, and prints the commands that mend it.
/// A plain re-ingest calls the source up to date; the printed one (`--verify`) replaces the
/// version. A version recorded without digests gets the size check.
#[test]
fn lake_verify_names_each_damaged_file_and_frame_and_its_ingest_mends_the_version() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("lake");
    let source = testdata("v30-h264-multifile");
    let name = "v30-h264-multifile";
    ingest_ok(&root, &source, &[]);
    assert_eq!(lake(&root, &["cache", name]).code, 0);
    let intact = lake(&root, &["verify"]);
    assert_eq!(intact.code, 0, "{intact:#?}");
    assert!(
        intact.stdout.contains(&format!("{name}@1: intact (tables: ")) && intact.stdout.contains("frame tables: 900 frames"),
        "{intact:#?}"
    );

    let dir = latest_dir(&root, name);
    let largest = |table: &str| {
        let files = std::fs::read_dir(dir.join(format!("{table}.lance/data"))).expect("data dir").map(|e| e.expect("entry").path());
        files.max_by_key(|p| std::fs::metadata(p).expect("stat").len()).expect("a data file")
    };
    let flip = |path: &Path| {
        let mut bytes = std::fs::read(path).expect("read");
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x10;
        std::fs::write(path, bytes).expect("damage");
    };
    let (steps, frames) = (largest("steps"), largest("frames"));
    flip(&steps);
    flip(&frames);
    std::fs::write(dir.join("episodes.lance/data/stray.lance"), b"not lake's").expect("stray file");
    let before = snapshot(&root, &[]);
    let damaged = lake(&root, &["verify", name]);
    assert_eq!(damaged.code, 1, "{damaged:#?}");
    let relative = |path: &Path| path.strip_prefix(&root).expect("in the lake").display().to_string();
    for expected in [
        format!("{name}@1: DAMAGED"),
        format!("{}: its bytes are not the ones written (blake3:", relative(&steps)),
        format!("{}: the ingest did not write this file", relative(&dir.join("episodes.lance/data/stray.lance"))),
        format!("{}: camera observation.images.", relative(&dir.join("frames.lance"))),
        format!("to mend: lake ingest {} --name {name} --verify", source.display()),
        format!("to mend: lake cache {name}@1"),
    ] {
        assert!(damaged.stdout.contains(&expected), "{expected}: {damaged:#?}");
    }
    assert!(
        damaged.stdout.contains("(packet row ") && damaged.stdout.contains("the frame is not the one `lake cache` stored"),
        "{damaged:#?}"
    );
    assert_eq!(snapshot(&root, &[]), before, "verify changed the lake");
    let json = lake(&root, &["verify", name, "--json"]);
    let json: serde_json::Value = serde_json::from_str(&json.stdout).expect("json");
    assert_eq!(json["versions"][0]["damage"].as_array().expect("damage").len(), 3, "{json:#}");

    let plain = ingest_ok(&root, &source, &[]);
    assert!(plain.stdout.contains("is up to date"), "{plain:#?}");
    let mended = ingest_ok(&root, &source, &["--verify"]);
    assert!(
        mended.stdout.contains(&format!("{name}@2")) && mended.stdout.contains(&format!("replaces {name}@1, which is damaged")),
        "{mended:#?}"
    );
    assert_eq!(lake(&root, &["verify", name]).code, 0);
    let every = lake(&root, &["verify", "--every-version"]);
    assert_eq!(every.code, 1, "{every:#?}");
    assert!(every.stdout.contains(&format!("to mend: nothing: {name}@1 is kept as it is; {name}@2 is the latest version")), "{every:#?}");

    // The commit record's own fields changed (it still parses): named, and mended as the tables.
    let record_path = root.join(format!("catalog/{name}/v00000002.json"));
    let committed = std::fs::read(&record_path).expect("record");
    let mut record: serde_json::Value = serde_json::from_slice(&committed).expect("json");
    record["counts"]["steps"] = serde_json::json!(299);
    std::fs::write(&record_path, serde_json::to_vec_pretty(&record).expect("json")).expect("write");
    let changed = lake(&root, &["verify", name]);
    assert_eq!(changed.code, 1, "{changed:#?}");
    assert!(changed.stdout.contains(&format!("catalog/{name}/v00000002.json: its fields are not the ones committed")), "{changed:#?}");
    assert!(changed.stdout.contains(&format!("to mend: lake ingest {}", source.display())), "{changed:#?}");

    // A record written before lake recorded digests: only the data files' sizes are checked.
    let mut record: serde_json::Value = serde_json::from_slice(&committed).expect("json");
    record.as_object_mut().expect("record").remove("digest").expect("the record's digest");
    record["tables"].as_object_mut().expect("tables").remove("files").expect("digests recorded");
    std::fs::write(&record_path, serde_json::to_vec_pretty(&record).expect("json")).expect("write");
    let old = lake(&root, &["verify", name]);
    assert_eq!(old.code, 0, "{old:#?}");
    assert!(old.stdout.contains("tables: data file sizes only (committed before lake recorded digests)"), "{old:#?}");
}

/// `lake verify` also checks what lies beside a version and what names it: each view's record
/// (and the dataset versions it reads), the training proxy's packets and `image_stats`' rows.
/// The commands it prints, run as a shell would read them, mend each.
#[test]
fn lake_verify_checks_views_proxies_and_image_statistics_and_prints_their_mends() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("lake");
    let name = "v30-h264-multifile";
    ingest_ok(&root, &testdata(name), &[]);
    let query = format!("SELECT '{name}' AS dataset, episode_index FROM \"{name}\".episodes WHERE episode_index < 2");
    for args in [
        vec!["view", "create", "mix", query.as_str(), "--rename", "action=the action", "--dims", "the action=0:3"],
        vec!["cache", name, "--proxy", "h264"],
        vec!["stats", name, "--images"],
    ] {
        let run = lake(&root, &args);
        assert_eq!(run.code, 0, "{args:?}: {run:#?}");
    }
    let intact = lake(&root, &["verify"]);
    assert_eq!(intact.code, 0, "{intact:#?}");
    for expected in ["proxy: 900 packets", "image_stats: 54 rows", &format!("view mix@1: intact (reads {name}@1)")] {
        assert!(intact.stdout.contains(expected), "{expected}: {intact:#?}");
    }

    // Damage: episodes changed in the view's record, a byte of one proxy packet, a byte of
    // image_stats' values.
    let view_path = root.join("views/mix/v00000001.json");
    let mut view: serde_json::Value = serde_json::from_slice(&std::fs::read(&view_path).expect("view")).expect("json");
    view["datasets"][0]["episodes"] = serde_json::json!([0, 2]);
    std::fs::write(&view_path, serde_json::to_vec_pretty(&view).expect("json")).expect("write");
    let dir = latest_dir(&root, name);
    let proxy = crate::common::table(&root, name, "proxy");
    let packet = arrow::array::AsArray::as_binary::<i64>(proxy[0].column_by_name("data").expect("data")).value(10).to_vec();
    let data_files =
        |table: &str| std::fs::read_dir(dir.join(format!("{table}.lance/data"))).expect("data").map(|e| e.expect("entry").path());
    let flipped = data_files("proxy").find_map(|path| {
        let mut bytes = std::fs::read(&path).expect("read");
        let at = bytes.windows(packet.len()).position(|w| w == packet)?;
        bytes[at + packet.len() / 2] ^= 0x10;
        std::fs::write(&path, bytes).expect("damage");
        Some(())
    });
    assert!(flipped.is_some(), "the proxy's packet stored as it is");
    let stats_file = data_files("image_stats").next().expect("a data file");
    let mut bytes = std::fs::read(&stats_file).expect("read");
    bytes[100] ^= 0x10;
    std::fs::write(&stats_file, bytes).expect("damage");

    let before = snapshot(&root, &[]);
    let damaged = lake(&root, &["verify"]);
    assert_eq!(damaged.code, 1, "{damaged:#?}");
    let relative = |table: &str| dir.join(format!("{table}.lance")).strip_prefix(&root).expect("in the lake").display().to_string();
    for expected in [
        "view mix@1: DAMAGED".to_string(),
        "views/mix/v00000001.json: its fields are not the ones written (blake3:".to_string(),
        format!("{}: camera observation.images.", relative("proxy")),
        "the proxy's packet of this frame is not the one `lake cache --proxy` stored".to_string(),
        format!("{}: its rows are not the ones written (blake3:", relative("image_stats")),
        format!("to mend: lake cache {name}@1 --proxy h264 --gop 2 --crf 18"),
        format!("to mend: lake stats {name}@1 --images"),
        "to mend: lake view create mix --replace ".to_string(),
    ] {
        assert!(damaged.stdout.contains(&expected), "{expected}: {damaged:#?}");
    }
    assert_eq!(snapshot(&root, &[]), before, "verify changed the lake");

    // Each printed mend, split as a shell splits it.
    for line in damaged.stdout.lines().filter_map(|l| l.trim().strip_prefix("to mend: lake ")) {
        let command = line.split("  (").next().expect("the command");
        let args = shlex::split(command).expect("shell words");
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let run = lake(&root, &args);
        assert_eq!(run.code, 0, "{args:?}: {run:#?}");
    }
    let mended = lake(&root, &["verify"]);
    assert_eq!(mended.code, 0, "{mended:#?}");
    assert!(mended.stdout.contains(&format!("view mix@2: intact (reads {name}@1)")), "{mended:#?}");
    let view = std::fs::read_to_string(root.join("views/mix/v00000002.json")).expect("view 2");
    assert!(view.contains("\"the action\"") && view.contains("\"episodes\": [\n        0,\n        1\n      ]"), "{view}");
}
