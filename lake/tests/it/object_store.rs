//! Lakes on an S3-compatible object store: a real server on loopback (moto's S3 behind
//! `scripts/s3_server.py`, conditional writes atomic), reached through lake's own clients. Every
//! command that reads a lake works on one as on a local lake, with the same results; commits
//! stay atomic with no rename: racing ingests, a killed ingest and a killed store. And sources
//! served over HTTP by a real web server (nginx).

use std::{
    path::Path,
    process::{Child, Stdio},
    time::{Duration, Instant},
};

use lake_testkit::{S3Server, WebServer, testdata};

use crate::common::{Run, ingest_ok, lake, lake_cmd, read_arrow};

/// A lake of its own on `server`: `s3://lake/<name>-<random>`.
fn s3_root(name: &str) -> String {
    format!("s3://lake/{name}-{}", &uuid_like())
}

fn uuid_like() -> String {
    format!("{:x}{:x}", std::process::id(), std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_nanos())
}

/// `lake --lake ROOT ARGS…` pointed at `server`, retrying a failed request a few times only.
fn s3_cmd(server: &S3Server, root: &str, args: &[&str]) -> std::process::Command {
    let mut cmd = lake_cmd(Path::new(root));
    cmd.args(args).envs(server.env().iter().cloned());
    cmd.env("OBJECT_STORE_CLIENT_MAX_RETRIES", "2").env("OBJECT_STORE_CLIENT_RETRY_TIMEOUT", "10");
    cmd
}

fn s3_lake(server: &S3Server, root: &str, args: &[&str]) -> Run {
    let out = s3_cmd(server, root, args).output().expect("run lake");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into(),
        stderr: String::from_utf8_lossy(&out.stderr).into(),
    }
}

fn spawn(server: &S3Server, root: &str, args: &[&str]) -> Child {
    s3_cmd(server, root, args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn lake")
}

fn finish(child: Child) -> Run {
    let out = child.wait_with_output().expect("wait");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into(),
        stderr: String::from_utf8_lossy(&out.stderr).into(),
    }
}

/// Waits until a key under `prefix` exists (an ingest's lease, say).
fn wait_for_key(server: &S3Server, prefix: &str) {
    let began = Instant::now();
    while server.keys(prefix).is_empty() {
        assert!(began.elapsed() < Duration::from_secs(60), "no key under {prefix}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The bucket prefix of a lake root.
fn prefix(root: &str) -> String {
    root.trim_start_matches("s3://lake/").to_string()
}

#[test]
fn a_lake_on_s3_ingests_queries_and_samples_as_a_local_lake_does() {
    let server = S3Server::start();
    let root = s3_root("parity");
    let tmp = tempfile::tempdir().expect("tmp");
    let local = tmp.path().join("lake");

    let run = s3_lake(&server, &root, &["ls"]);
    assert_ne!(run.code, 0, "{run:#?}");
    assert!(run.stderr.contains("no lake here yet"), "{}", run.stderr);

    for name in ["v30-av1-small", "v30-images-tiny"] {
        let run = s3_lake(&server, &root, &["ingest", testdata(name).to_str().expect("utf-8")]);
        assert_eq!(run.code, 0, "{run:#?}");
        ingest_ok(&local, &testdata(name), &[]);
    }
    let run = s3_lake(&server, &root, &["ls"]);
    assert!(run.stdout.contains("v30-av1-small@1") && run.stdout.contains("v30-images-tiny@1"), "{run:#?}");

    // The same samples, byte for byte, and the same answers to SQL.
    for (name, indices) in [("v30-av1-small", "0,57,310,599"), ("v30-images-tiny", "0,1,59")] {
        let (remote_out, local_out) = (tmp.path().join(format!("{name}-s3.arrow")), tmp.path().join(format!("{name}-local.arrow")));
        let args = |out: &Path| -> Vec<String> {
            ["sample", "--dataset", name, "--indices", indices, "--preset", "act", "--out", out.to_str().expect("utf-8")]
                .map(String::from)
                .to_vec()
        };
        let remote_args = args(&remote_out);
        let run = s3_lake(&server, &root, &remote_args.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(run.code, 0, "{run:#?}");
        let local_args = args(&local_out);
        assert_eq!(lake(&local, &local_args.iter().map(String::as_str).collect::<Vec<_>>()).code, 0);
        assert!(read_arrow(&remote_out) == read_arrow(&local_out), "{name}: samples from S3 differ from the local lake's");
    }
    let query = "SELECT episode_index, count(*) AS steps, sum(\"action\"[1]) AS a FROM steps GROUP BY episode_index ORDER BY episode_index";
    let (remote_sql, local_sql) =
        (s3_lake(&server, &root, &["sql", query, "--format", "json"]), lake(&local, &["sql", query, "--format", "json"]));
    assert_eq!(remote_sql.code, 0, "{remote_sql:#?}");
    assert_eq!(remote_sql.stdout, local_sql.stdout);

    // The same source again: no new version.
    let run = s3_lake(&server, &root, &["ingest", testdata("v30-images-tiny").to_str().expect("utf-8"), "--json"]);
    assert_eq!(run.code, 0, "{run:#?}");
    assert!(run.stdout.contains(r#""outcome":"unchanged""#) || run.stdout.contains(r#""outcome": "unchanged""#), "{}", run.stdout);

    // `lake rm` deletes the dataset's objects; no lease is left anywhere.
    let run = s3_lake(&server, &root, &["rm", "v30-images-tiny"]);
    assert_eq!(run.code, 0, "{run:#?}");
    assert!(server.keys(&format!("{}/datasets/v30-images-tiny/", prefix(&root))).is_empty(), "tables of a removed dataset");
    assert!(server.keys(&format!("{}/staging/", prefix(&root))).is_empty(), "leases left");
    let run = s3_lake(&server, &root, &["ls"]);
    assert!(run.stdout.contains("v30-av1-small@1") && !run.stdout.contains("v30-images-tiny@1"), "{run:#?}");
}

/// The data files under a table's `data/` on `server`.
fn data_files(server: &S3Server, root: &str, table: &str) -> Vec<String> {
    server
        .keys(&format!("{}/datasets/v30-av1-small/", prefix(root)))
        .into_iter()
        .filter(|k| k.contains(&format!("/{table}.lance/data/")))
        .collect()
}

#[test]
fn tables_beside_a_version_are_written_on_s3_as_on_the_local_disk() {
    let server = S3Server::start_with(&[("LAKE_S3_VERBOSE", "1")]);
    let root = s3_root("derived");
    let tmp = tempfile::tempdir().expect("tmp");
    let local = tmp.path().join("lake");
    let name = "v30-av1-small";
    assert_eq!(s3_lake(&server, &root, &["ingest", testdata(name).to_str().expect("utf-8")]).code, 0);
    // The commit record's digests are taken as the tables are sent, not read back (the plain
    // `lake verify` below holds them to the stored bytes): no transaction, manifest or packet
    // file is read.
    for what in ["/_transactions/", ".manifest", "/packets.lance/data/"] {
        assert_eq!(server.requests(&["\"GET ", &format!("/datasets/{name}/"), what]), 0, "{what} read back by the ingest");
    }
    ingest_ok(&local, &testdata(name), &[]);
    let both = |args: &[&str]| {
        let (remote, here) = (s3_lake(&server, &root, args), lake(&local, args));
        assert_eq!((remote.code, here.code), (0, 0), "{args:?}: {remote:#?} {here:#?}");
        (remote, here)
    };
    let same_samples = |extra: &[&str], what: &str| {
        let (remote_out, local_out) = (tmp.path().join("s3.arrow"), tmp.path().join("local.arrow"));
        for (out, on_s3) in [(&remote_out, true), (&local_out, false)] {
            let mut args = vec!["sample", "--dataset", name, "--indices", "0,7,300,599", "--preset", "diffusion", "--out"];
            args.push(out.to_str().expect("utf-8"));
            args.extend(extra);
            let run = if on_s3 { s3_lake(&server, &root, &args) } else { lake(&local, &args) };
            assert_eq!(run.code, 0, "{what}: {run:#?}");
        }
        assert!(read_arrow(&remote_out) == read_arrow(&local_out), "{what}: samples from S3 differ from the local lake's");
    };

    // A lake cache killed on the store leaves no table: samples decode, as before it.
    let mut child = spawn(&server, &root, &["cache", name, "--size", "64x48"]);
    let began = Instant::now();
    while data_files(&server, &root, "frames-64x48").is_empty() {
        assert!(began.elapsed() < Duration::from_secs(120), "the cache wrote no data file");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");
    // (Files no version names stay for a week, in case their writer is alive: Lance's rule.)
    let killed = data_files(&server, &root, "frames-64x48");
    let run = s3_lake(&server, &root, &["inspect", name]);
    assert!(run.stdout.contains("frames    decoded from packets"), "no partial table: {run:#?}");
    let out = tmp.path().join("none.arrow");
    let run = s3_lake(
        &server,
        &root,
        &["sample", "--dataset", name, "--indices", "0", "--frame-size", "64x48", "--out", out.to_str().expect("utf-8")],
    );
    assert!(run.code != 0 && run.stderr.contains("no frame table of 64x48 frames"), "{run:#?}");

    // Frame tables: listed, and read to the same samples as the local lake's.
    both(&["cache", name, "--size", "64x48"]);
    let (remote, here) = both(&["inspect", name]);
    assert!(remote.stdout.contains("frames    64x48: 1200 frames, plain, "), "{remote:#?}");
    assert!(here.stdout.contains("frames    64x48: 1200 frames, plain, "), "{here:#?}");
    same_samples(&["--frame-size", "64x48"], "a resized frame table");
    let files: Vec<String> = data_files(&server, &root, "frames-64x48").into_iter().filter(|f| !killed.contains(f)).collect();
    assert!(!files.is_empty());
    // Written again (zstd): one table, the replaced version's files deleted.
    let (remote, _) = both(&["cache", name, "--size", "64x48", "--storage", "zstd"]);
    assert!(!remote.stderr.contains("WARN"), "{remote:#?}");
    let run = s3_lake(&server, &root, &["inspect", name]);
    assert!(run.stdout.contains("frames    64x48: 1200 frames, zstd, "), "{run:#?}");
    let rewritten = data_files(&server, &root, "frames-64x48");
    assert!(rewritten.iter().all(|f| !files.contains(f)), "the first table's files stay: {rewritten:?}");
    same_samples(&["--frame-size", "64x48"], "a frame table written twice");

    // Camera statistics.
    both(&["stats", name, "--images"]);
    let (remote, here) = both(&["stats", name]);
    assert!(remote.stdout.contains("observation.images.front"), "{remote:#?}");
    assert_eq!(remote.stdout, here.stdout, "`lake stats` with camera statistics");

    // A training proxy.
    let (remote, _) = both(&["cache", name, "--proxy", "h264", "--gop", "4"]);
    assert!(remote.stdout.contains("stored the h264 proxy (GOP 4, CRF 18) of v30-av1-small@1: 1200 frames"), "{remote:#?}");
    same_samples(&["--proxy"], "the proxy's frames");

    // Every file of the tables checked against its recorded digest, every stored frame and
    // proxy packet against its checksum, the camera statistics against their rows' digest and a
    // view's record against its own, as on the local disk.
    both(&["view", "create", "half", "SELECT dataset, episode_index FROM episodes WHERE episode_index < 3"]);
    let (remote, here) = both(&["verify"]);
    for run in [&remote, &here] {
        for expected in [
            format!("{name}@1: intact (tables: "),
            "frame tables: 1200 frames".into(),
            "proxy: 1200 packets".into(),
            "image_stats: 42 rows".into(),
            format!("view half@1: intact (reads {name}@1)"),
        ] {
            assert!(run.stdout.contains(&expected), "{expected}: {run:#?}");
        }
    }
}

#[test]
fn two_ingests_of_one_name_racing_on_s3_commit_two_clean_versions() {
    let server = S3Server::start();
    let root = s3_root("race");
    // The lake exists before the race: both find it.
    assert_eq!(s3_lake(&server, &root, &["ingest", testdata("v30-av1-small").to_str().expect("utf-8")]).code, 0);
    let racers: Vec<Child> = ["v30-images-tiny", "v30-images-jpeg"]
        .iter()
        .map(|source| spawn(&server, &root, &["ingest", testdata(source).to_str().expect("utf-8"), "--name", "raced"]))
        .collect();
    for racer in racers {
        let run = finish(racer);
        assert_eq!(run.code, 0, "{run:#?}");
    }
    let mut sources = Vec::new();
    for version in ["raced@1", "raced@2"] {
        let run = s3_lake(&server, &root, &["inspect", version, "--json"]);
        assert_eq!(run.code, 0, "{run:#?}");
        let record: serde_json::Value = serde_json::from_str(&run.stdout).expect("json");
        sources.push(record["record"]["source"]["url"].as_str().expect("source").rsplit('/').next().expect("name").to_string());
        let out = tempfile::NamedTempFile::new().expect("tmp");
        let run =
            s3_lake(&server, &root, &["sample", "--dataset", version, "--indices", "0,59", "--out", out.path().to_str().expect("utf-8")]);
        assert_eq!(run.code, 0, "{version} reads whole: {run:#?}");
    }
    sources.sort();
    assert_eq!(sources, ["v30-images-jpeg", "v30-images-tiny"], "one version each");
    assert_eq!(s3_lake(&server, &root, &["inspect", "raced@3"]).code, 2, "no third version");
    assert!(server.keys(&format!("{}/staging/", prefix(&root))).is_empty(), "leases left");
}

#[test]
fn an_ingest_killed_on_s3_shows_nothing_and_the_next_one_cleans_up_after_it() {
    let server = S3Server::start();
    let root = s3_root("killed");
    assert_eq!(s3_lake(&server, &root, &["ingest", testdata("v30-images-tiny").to_str().expect("utf-8")]).code, 0);
    let mut child = spawn(&server, &root, &["ingest", testdata("v30-av1-small").to_str().expect("utf-8")]);
    wait_for_key(&server, &format!("{}/datasets/v30-av1-small/", prefix(&root)));
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");
    let run = s3_lake(&server, &root, &["ls"]);
    assert!(run.stdout.contains("v30-images-tiny@1") && !run.stdout.contains("v30-av1-small"), "no partial version: {run:#?}");
    assert!(!server.keys(&format!("{}/staging/", prefix(&root))).is_empty(), "the killed ingest's lease stays until collected");

    // The next ingest collects the dead writer's leftovers, then commits.
    let run = s3_lake(&server, &root, &["ingest", testdata("v30-av1-small").to_str().expect("utf-8")]);
    assert_eq!(run.code, 0, "{run:#?}");
    let dirs: std::collections::BTreeSet<String> = server
        .keys(&format!("{}/datasets/v30-av1-small/", prefix(&root)))
        .iter()
        .filter_map(|k| k.split('/').nth(3).map(String::from))
        .collect();
    assert_eq!(dirs.len(), 1, "only the committed version's directory: {dirs:?}");
    assert!(server.keys(&format!("{}/staging/", prefix(&root))).is_empty(), "leases left");
}

/// A lease as a writer on another host writes it, for `datasets/NAME/ID`, renewed `minutes` ago.
fn foreign_lease(name: &str, id: &str, minutes: i64) -> Vec<u8> {
    let renewed = chrono::Utc::now() - chrono::TimeDelta::minutes(minutes);
    let started = chrono::Utc::now() - chrono::TimeDelta::days(2);
    serde_json::to_vec(&serde_json::json!({
        "name": name, "dir": format!("datasets/{name}/{id}"), "pid": 1, "host": "a-host-of-another-rack",
        "started_at": started.to_rfc3339(), "renewed_at": renewed.to_rfc3339(),
    }))
    .expect("json")
}

#[test]
fn writers_on_other_hosts_keep_their_work_while_they_renew_their_leases() {
    let server = S3Server::start();
    let root = s3_root("leases");
    let lake_prefix = prefix(&root);
    assert_eq!(s3_lake(&server, &root, &["ingest", testdata("v30-images-tiny").to_str().expect("utf-8")]).code, 0);
    // Two writers on another host, both started two days ago: one renewed its lease a minute
    // ago (a long ingest at work), one has not for twenty minutes (it died).
    for (name, id, minutes) in [("alive", "20261128T000000-aaaaaaaaaaaa", 1), ("dead", "20261128T000000-bbbbbbbbbbbb", 20)] {
        server.put(&format!("{lake_prefix}/staging/{id}.json"), &foreign_lease(name, id, minutes));
        server.put(&format!("{lake_prefix}/datasets/{name}/{id}/steps.lance/data/part.lance"), b"rows");
    }
    // The next ingest collects garbage.
    assert_eq!(s3_lake(&server, &root, &["ingest", testdata("v30-av1-small").to_str().expect("utf-8")]).code, 0);
    assert_eq!(server.keys(&format!("{lake_prefix}/datasets/alive/")).len(), 1, "a renewed lease keeps its writer's files");
    assert_eq!(server.keys(&format!("{lake_prefix}/staging/20261128T000000-aaaaaaaaaaaa")).len(), 1);
    assert!(server.keys(&format!("{lake_prefix}/datasets/dead/")).is_empty(), "an unrenewed lease's files are collected");
    assert!(server.keys(&format!("{lake_prefix}/staging/20261128T000000-bbbbbbbbbbbb")).is_empty());

    // A writer paused for longer than a lease lasts, whose lease another host's collection took
    // over meanwhile, commits nothing once it runs again. (A slow store, so that it is paused
    // before it commits.)
    let server = S3Server::start_with(&[("LAKE_S3_DELAY_MS", "20")]);
    let root = s3_root("paused");
    let lake_prefix = prefix(&root);
    let child = spawn(&server, &root, &["ingest", testdata("v30-images-tiny").to_str().expect("utf-8"), "--name", "taken"]);
    wait_for_key(&server, &format!("{lake_prefix}/staging/"));
    // SAFETY: signals to the child this test started and still holds.
    unsafe { libc::kill(child.id() as i32, libc::SIGSTOP) };
    let lease = server.keys(&format!("{lake_prefix}/staging/")).pop().expect("its lease");
    let id = lease.rsplit('/').next().and_then(|f| f.strip_suffix(".json")).expect("an id").to_string();
    let mut taken: serde_json::Value = serde_json::from_slice(&foreign_lease("taken", &id, 20)).expect("json");
    taken["collected_by"] = "a-host-of-another-rack".into();
    server.put(&lease, &serde_json::to_vec(&taken).expect("json"));
    // SAFETY: as above.
    unsafe { libc::kill(child.id() as i32, libc::SIGCONT) };
    let run = finish(child);
    assert_ne!(run.code, 0, "{run:#?}");
    assert!(run.stderr.contains("this ingest's lease was collected by another process"), "{}", run.stderr);
    let run = s3_lake(&server, &root, &["ls"]);
    assert!(!run.stdout.contains("taken"), "{run:#?}");
    assert!(server.keys(&format!("{lake_prefix}/datasets/taken/")).is_empty(), "what it wrote is gone");
}

#[test]
fn the_store_killed_during_an_ingest_fails_it_naming_the_store() {
    let server = S3Server::start();
    let root = s3_root("store-killed");
    let child = spawn(&server, &root, &["ingest", testdata("v30-av1-small").to_str().expect("utf-8")]);
    wait_for_key(&server, &format!("{}/staging/", prefix(&root)));
    server.kill();
    let began = Instant::now();
    let run = finish(child);
    assert_ne!(run.code, 0, "{run:#?}");
    assert!(began.elapsed() < Duration::from_secs(120), "it gives up after its retries");
    assert!(run.stderr.contains("ingest of") && run.stderr.contains(server.endpoint().trim_start_matches("http://")), "{}", run.stderr);
}

/// `lake serve` on `root` (an S3 lake on `server`) with `extra` flags; killed when dropped.
fn serve_s3(server: &S3Server, root: &str, extra: &[&str]) -> crate::serve::Server {
    use std::io::BufRead;
    let args = [&["serve", "--flight", "127.0.0.1:0", "--http", "127.0.0.1:0", "--threads", "1"], extra].concat();
    let mut child = s3_cmd(server, root, &args)
        .env("LAKE_TOKENS", crate::serve::TOKEN)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start lake serve");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("the server says where it listens");
    let addr = |prefix: &str| line.split_whitespace().find_map(|w| w.strip_prefix(prefix)).unwrap_or_else(|| panic!("{line}")).to_string();
    crate::serve::Server { flight: format!("grpc://{}", addr("grpc://")), http: addr("http://"), child, local: std::path::PathBuf::new() }
}

/// A server that may not write to its lake refuses a view with 403 and says why, before running
/// its query under `--read-only`, and after it when the store refuses the server's writes (403
/// AccessDenied, as S3 answers credentials allowed to read only); it serves samples and SQL as
/// before, and the lake is as it was.
#[test]
fn a_server_that_may_not_write_refuses_views_with_the_reason_and_serves_the_rest() {
    let root = s3_root("read-only");
    let views = format!("lake/{}/views/", prefix(&root));
    let server = S3Server::start_with(&[("LAKE_S3_DENY_WRITES", &views)]);
    assert_eq!(s3_lake(&server, &root, &["ingest", testdata("v30-images-tiny").to_str().expect("utf-8")]).code, 0);
    let auth = format!("Bearer {}", crate::serve::TOKEN);
    let post = |served: &crate::serve::Server, path: &str, body: &str| {
        let accept = if path == "/v1/sample" { "application/vnd.apache.arrow.stream" } else { "application/json" };
        let headers = [("Authorization", auth.as_str()), ("Content-Type", "application/json"), ("Accept", accept)];
        let (code, body) = crate::serve::http(&served.http, "POST", path, &headers, body.as_bytes());
        (code, String::from_utf8_lossy(&body).into_owned())
    };
    let view = r#"{"name": "all", "sql": "SELECT episode_index FROM \"v30-images-tiny\".episodes"}"#;
    let refusals = [
        (vec!["--read-only"], "this server serves its lake read-only (`lake serve --read-only`)"),
        (vec![], "this server may not write to its lake (its object store refuses the server's credentials a write)"),
    ];
    for (flags, reason) in refusals {
        let served = serve_s3(&server, &root, &flags);
        // Said before any view is asked for, so that a client leaves views out (the web app).
        let (code, said) = crate::serve::http(&served.http, "GET", "/v1/server", &[("Authorization", auth.as_str())], b"");
        let said: serde_json::Value = serde_json::from_slice(&said).expect("json");
        assert_eq!((code, &said["read_only"]), (200, &serde_json::json!(!flags.is_empty())), "{flags:?}: {said}");
        let (code, body) = post(&served, "/v1/views", view);
        assert_eq!(code, 403, "{flags:?}: {body}");
        let error: serde_json::Value = serde_json::from_str(&body).expect("json");
        assert!(error["error"].as_str().is_some_and(|e| e.starts_with(reason) && !e.contains(&prefix(&root))), "{body}");
        let (code, rows) = post(&served, "/v1/sql", "SELECT count(*) AS n FROM steps");
        assert_eq!((code, rows.as_str()), (200, r#"[{"n":60}]"#), "{flags:?}");
        let (code, batches) =
            post(&served, "/v1/sample", r#"{"datasets": ["v30-images-tiny"], "preset": "act", "batch_size": 4, "limit_batches": 1}"#);
        assert_eq!(code, 200, "{flags:?}: {batches}");
    }
    assert_eq!(server.requests(&["denied PUT", &views]), 1, "--read-only refused before writing; the store refused the other");
    // `lake view create` with the same credentials says the store refused the write, and names it.
    let run = s3_lake(&server, &root, &["view", "create", "all", r#"SELECT episode_index FROM "v30-images-tiny".episodes"#]);
    assert_eq!(run.code, 2, "{run:#?}");
    assert!(run.stderr.contains("views/all/") && run.stderr.contains("AccessDenied"), "{}", run.stderr);
    assert!(server.keys(&format!("{}/views/", prefix(&root))).is_empty(), "no view was written");
    assert!(s3_lake(&server, &root, &["view", "ls"]).stdout.trim().lines().all(|l| !l.starts_with("all")));
}

/// A store that stops answering under a server, for the lake's tables (the catalog still
/// answers) and then altogether: SQL, samples and Flight are refused as unavailable (503 with
/// `Retry-After`, `UNAVAILABLE`), without the store's address, counted as `store`, and the server
/// answers as before once the store does.
#[test]
fn a_store_that_stops_answering_makes_requests_unavailable_until_it_answers_again() {
    let server = S3Server::start();
    let root = s3_root("outage");
    assert_eq!(s3_lake(&server, &root, &["ingest", testdata("v30-av1-small").to_str().expect("utf-8")]).code, 0);
    let served = serve_s3(&server, &root, &[]);
    let auth = format!("Bearer {}", crate::serve::TOKEN);
    let post = |path: &str, accept: &str, body: &str| {
        let headers = [("Authorization", auth.as_str()), ("Content-Type", "application/json"), ("Accept", accept)];
        crate::serve::http_with_head(&served.http, "POST", path, &headers, body.as_bytes())
    };
    let sql = || post("/v1/sql", "application/json", r#"SELECT sum(frame_index) AS s, count(DISTINCT data_crc32) AS c FROM packets"#);
    let request = serde_json::json!({"datasets": ["v30-av1-small"], "preset": "act", "batch_size": 4, "seed": 5, "limit_batches": 2});
    let sample = || post("/v1/sample", "application/vnd.apache.arrow.stream", &request.to_string());
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let flight = || {
        rt.block_on(async {
            let mut client = crate::serve::flight_client(&served).await;
            crate::serve::over_flight(&mut client, &request).await
        })
    };
    let (code, _, answer) = sql();
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&answer));
    let (code, _, batches) = sample();
    assert_eq!(code, 200);
    let over_flight = flight().expect("a stream");
    let unavailable = |(code, head, body): (u16, String, Vec<u8>), what: &str| {
        let error: serde_json::Value = serde_json::from_slice(&body).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(code, 503, "{what}: {error}");
        assert!(head.contains("retry-after: "), "{what}: {head}");
        assert_eq!(
            error["error"], "the lake's object store cannot be reached now (the server log has the details); retry shortly",
            "{what}"
        );
    };
    let metric = |name: &str| {
        let (_, text) = crate::serve::http(&served.http, "GET", "/metrics", &[("Authorization", &auth)], b"");
        crate::serve::metric(&String::from_utf8_lossy(&text), name)
    };

    // The tables' files answer 503 SlowDown through every retry; the catalog answers.
    server.fail_under(&[&format!("lake/{}/datasets/", prefix(&root))]);
    unavailable(sql(), "SQL over the tables");
    unavailable(sample(), "samples over HTTP");
    let refused = flight().expect_err("no stream");
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused}");
    assert_eq!(crate::serve::http(&served.http, "GET", "/healthz", &[], b"").0, 200);
    assert_eq!(metric(r#"lake_errors_total{kind="store"}"#), 3.0);
    assert_eq!(metric(r#"lake_errors_total{kind="internal"}"#), 0.0);
    assert_eq!(metric("lake_sql_running"), 0.0);

    // Answering again, the store gets the same answers as before.
    server.fail_under(&[]);
    assert_eq!(sql().2, answer);
    assert!(sample().2 == batches, "the same samples");
    assert!(flight().expect("a stream") == over_flight, "the same stream");

    // A store that is gone refuses connections: the same refusals.
    server.kill();
    unavailable(sql(), "SQL, the store gone");
    unavailable(sample(), "samples, the store gone");
    let listed = crate::serve::http_with_head(&served.http, "GET", "/v1/datasets", &[("Authorization", &auth)], b"");
    unavailable(listed, "the datasets, the store gone");
    assert_eq!(metric(r#"lake_errors_total{kind="store"}"#), 6.0, "every refusal counted");
    let run = s3_lake(&server, &root, &["sql", "SELECT count(*) FROM steps"]);
    assert_eq!(run.code, 2, "{run:#?}");
    assert!(run.stderr.contains(server.endpoint()) && run.stderr.contains("Connection refused"), "{}", run.stderr);
}

/// Two stateless servers over one S3 lake serve one job: the Python client spreads its ranks
/// over them, and a stream whose server is killed resumes on the other exactly after the last
/// batch received (the same batches as one server sends).
#[test]
fn a_stream_whose_server_dies_resumes_on_another_server_of_the_lake() {
    use std::io::{BufRead, Write};
    let Some(python) = crate::serve::client_python() else {
        panic!("no Python with pyarrow: run scripts/python-env.sh, or set LAKE_PYTHON");
    };
    let server = S3Server::start();
    let root = s3_root("scale-out");
    assert_eq!(s3_lake(&server, &root, &["ingest", testdata("v30-av1-small").to_str().expect("utf-8")]).code, 0);
    let (mut first, second) = (serve_s3(&server, &root, &[]), serve_s3(&server, &root, &[]));
    let script = r#"
import json, sys
import lake_client
locations, token = sys.argv[1].split(","), sys.argv[2]
request = {"datasets": ["v30-av1-small"], "batch_size": 4, "seed": 3, "limit_batches": 10, "step_stride": 1}
if sys.argv[3] == "reference":
    for batch in lake_client.LakeClient(locations[-1], token).batches(request):
        print(json.dumps(batch.column("index").to_pylist()), flush=True)
    sys.exit(0)
client = lake_client.LakeClient(locations, token)
assert [client._first({**request, "rank": r}) for r in range(4)] == [0, 1, 0, 1], "ranks spread over the servers"
stream = client.batches(request)
for i, batch in enumerate(stream):
    print(json.dumps(batch.column("index").to_pylist()), flush=True)
    if i == 2:
        sys.stdin.readline()  # the first server is killed meanwhile
print("moves", stream.moves, flush=True)
"#;
    let locations = format!("{},{}", first.flight, second.flight);
    let run = |mode: &str| crate::serve::python_client(&python, script, &[&locations, crate::serve::TOKEN, mode]);
    let reference = run("reference").wait_with_output().expect("reference");
    assert!(reference.status.success());
    let reference: Vec<String> = String::from_utf8_lossy(&reference.stdout).lines().map(String::from).collect();
    assert_eq!(reference.len(), 10);

    let mut child = run("failover");
    let mut lines = std::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut got: Vec<String> = (0..3).map(|_| lines.next().expect("a batch").expect("utf-8")).collect();
    let _ = first.child.kill();
    let _ = first.child.wait();
    writeln!(child.stdin.as_mut().expect("stdin")).expect("go on");
    got.extend(lines.map(|l| l.expect("utf-8")));
    assert!(child.wait().expect("python").success(), "{got:?}");
    assert_eq!(got.last().map(String::as_str), Some("moves 1"), "one move to the other server: {got:?}");
    got.pop();
    assert_eq!(got, reference, "the stream resumed exactly where it stopped");
    drop(second);
}

/// The Rust client's pool of servers: the same as the Python client's, through
/// `lake_client::ServerPool` (what `lake train --server A,B` uses).
#[test]
fn a_rust_stream_whose_server_dies_resumes_on_another_server_of_the_lake() {
    use futures::StreamExt;
    let server = S3Server::start();
    let root = s3_root("pool");
    assert_eq!(s3_lake(&server, &root, &["ingest", testdata("v30-av1-small").to_str().expect("utf-8")]).code, 0);
    let (mut first, second) = (serve_s3(&server, &root, &[]), serve_s3(&server, &root, &[]));
    let http = |s: &crate::serve::Server| s.flight.replace("grpc://", "http://");
    // Batches of 4 MB: a stream's flow-control window (32 MB) holds a few, so most of the 30
    // must come from the second server once the first is killed.
    let mut request = lake_client::SampleRequest::new(["v30-av1-small"]);
    (request.batch_size, request.seed, request.limit_batches) = (4, 5, Some(30));
    let indices = |batch: &arrow::array::RecordBatch| -> Vec<i64> {
        use arrow::array::AsArray;
        batch.column_by_name("index").expect("index").as_primitive::<arrow::datatypes::Int64Type>().values().to_vec()
    };
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let token = Some(crate::serve::TOKEN.to_string());
        let one = lake_client::ServerPool::new([http(&second)], token.clone()).expect("pool");
        let reference: Vec<Vec<i64>> = one.stream(&request).await.expect("stream").map(|b| indices(&b.expect("batch"))).collect().await;
        assert_eq!(reference.len(), 30);

        let pool = lake_client::ServerPool::new([http(&first), http(&second)], token).expect("pool");
        assert_eq!(pool.first(&request), 0);
        let mut stream = pool.stream(&request).await.expect("stream");
        let mut got = Vec::new();
        for _ in 0..3 {
            got.push(indices(&stream.next().await.expect("a batch").expect("batch")));
        }
        let _ = first.child.kill();
        let _ = first.child.wait();
        while let Some(batch) = stream.next().await {
            got.push(indices(&batch.expect("the stream goes on on the other server")));
        }
        assert_eq!(got, reference, "the stream resumed exactly where it stopped");
        // With every server gone, it says so.
        drop(second);
        let err = pool.stream(&request).await.err().expect("no server").to_string();
        assert!(err.contains("no server of") && err.contains("is available"), "{err}");
    });
}

/// A store that answers every 7th request with `503 SlowDown` and holds every request 20 ms:
/// ingest, SQL and sampling retry and finish with what a local lake gives.
#[test]
fn a_slow_store_that_sheds_load_is_retried_and_gives_the_same_samples() {
    let server = S3Server::start_with(&[("LAKE_S3_FAIL_EVERY", "7"), ("LAKE_S3_DELAY_MS", "20")]);
    let root = s3_root("faults");
    let tmp = tempfile::tempdir().expect("tmp");
    let local = tmp.path().join("lake");
    let name = "v30-images-tiny";
    let retrying = |args: &[&str]| {
        let out = s3_cmd(&server, &root, args).env("OBJECT_STORE_CLIENT_MAX_RETRIES", "10").output().expect("run lake");
        Run {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into(),
            stderr: String::from_utf8_lossy(&out.stderr).into(),
        }
    };
    let run = retrying(&["ingest", testdata(name).to_str().expect("utf-8")]);
    assert_eq!(run.code, 0, "{run:#?}");
    ingest_ok(&local, &testdata(name), &[]);
    let (remote_out, local_out) = (tmp.path().join("s3.arrow"), tmp.path().join("local.arrow"));
    let args = |out: &Path| {
        ["sample", "--dataset", name, "--indices", "0,7,33,59", "--preset", "act", "--out", out.to_str().expect("utf-8")].map(String::from)
    };
    let run = retrying(&args(&remote_out).iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(run.code, 0, "{run:#?}");
    assert_eq!(lake(&local, &args(&local_out).iter().map(String::as_str).collect::<Vec<_>>()).code, 0);
    assert!(read_arrow(&remote_out) == read_arrow(&local_out), "samples through retries differ");
    let query = "SELECT count(*) AS n FROM steps";
    let run = retrying(&["sql", query, "--format", "json"]);
    assert_eq!(run.code, 0, "{run:#?}");
    assert_eq!(run.stdout, lake(&local, &["sql", query, "--format", "json"]).stdout);
    assert!(server.injected_failures() >= 10, "the store shed {} requests", server.injected_failures());
}

/// `--object-cache`: the first read of table data fetches it from the store, every later one
/// (another process, the next epoch) reads it locally, with the same samples.
#[test]
fn an_object_cache_makes_the_second_read_local() {
    let server = S3Server::start_with(&[("LAKE_S3_VERBOSE", "1")]);
    let root = s3_root("cached");
    let tmp = tempfile::tempdir().expect("tmp");
    let name = "v30-av1-small";
    assert_eq!(s3_lake(&server, &root, &["ingest", testdata(name).to_str().expect("utf-8")]).code, 0);
    let cache = tmp.path().join("object-cache");
    let sample = |out: &str| {
        let out = tmp.path().join(out);
        let args = [
            "--object-cache",
            cache.to_str().expect("utf-8"),
            "--object-cache-gb",
            "1",
            "sample",
            "--dataset",
            name,
            "--indices",
            "0,57,310,599",
            "--preset",
            "act",
            "--out",
            out.to_str().expect("utf-8"),
        ];
        let run = s3_lake(&server, &root, &args);
        assert_eq!(run.code, 0, "{run:#?}");
        read_arrow(&out)
    };
    let data_reads = || server.requests(&["\"GET ", ".lance/data/"]);
    let before = data_reads();
    let first = sample("first.arrow");
    let fetched = data_reads() - before;
    assert!(fetched > 0, "the first read fetches table data");
    assert!(std::fs::read_dir(&cache).expect("the cache").count() > 0);
    let second = sample("second.arrow");
    assert_eq!(data_reads() - before, fetched, "the second read fetched no table data");
    assert!(first == second, "the same samples from the cache");
    let run = s3_lake(&server, &root, &["--object-cache-gb", "0", "--object-cache", cache.to_str().expect("utf-8"), "ls"]);
    assert_eq!(run.code, 2, "{run:#?}");
    assert!(run.stderr.contains("--object-cache-gb must be a positive number"), "{}", run.stderr);
}

/// `lake export` to an object store prefix: the files the export to a directory makes, written
/// once the export is complete, and never over objects already there.
#[test]
fn an_export_to_s3_writes_the_files_an_export_to_a_directory_does() {
    let server = S3Server::start();
    let tmp = tempfile::tempdir().expect("tmp");
    let local = tmp.path().join("lake");
    ingest_ok(&local, &testdata("v30-images-tiny"), &[]);
    let target = s3_root("export");
    for format in ["parquet", "lerobot-v3"] {
        let dir = tmp.path().join(format);
        assert_eq!(lake(&local, &["export", "--format", format, "v30-images-tiny", dir.to_str().expect("utf-8")]).code, 0);
        let to = format!("{target}/{format}");
        let mut cmd = lake_cmd(&local);
        cmd.args(["export", "--format", format, "v30-images-tiny", &to]).envs(server.env().iter().cloned());
        let out = cmd.output().expect("run lake");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let mut uploaded: Vec<(String, u64)> = server
            .objects(&format!("{}/{format}/", prefix(&target)))
            .into_iter()
            .map(|(key, size)| (key.splitn(3, '/').nth(2).expect("under the prefix").to_string(), size))
            .collect();
        uploaded.sort();
        let mut written: Vec<(String, u64)> = crate::common::files_under(&dir)
            .iter()
            .map(|p| (p.strip_prefix(&dir).expect("under").to_string_lossy().into_owned(), std::fs::metadata(p).expect("meta").len()))
            .collect();
        written.sort();
        assert_eq!(uploaded.iter().map(|(k, _)| k).collect::<Vec<_>>(), written.iter().map(|(k, _)| k).collect::<Vec<_>>(), "{format}");
        assert!(!uploaded.is_empty());
        // Again to the same prefix: refused, the objects there kept.
        let mut again = lake_cmd(&local);
        again.args(["export", "--format", format, "v30-images-tiny", &to]).envs(server.env().iter().cloned());
        let out = again.output().expect("run lake");
        assert!(!out.status.success());
        assert!(String::from_utf8_lossy(&out.stderr).contains("holds objects already"), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(server.objects(&format!("{}/{format}/", prefix(&target))).len(), uploaded.len());
    }
    // A LeRobot dataset on S3 (the export above) ingests as its local original does.
    let mut ingest = lake_cmd(&local);
    ingest.args(["ingest", &format!("{target}/lerobot-v3"), "--name", "from-s3"]).envs(server.env().iter().cloned());
    let out = ingest.output().expect("run lake");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let sample = |name: &str| {
        let file = tmp.path().join(format!("{name}.arrow"));
        let run = lake(
            &local,
            &["sample", "--dataset", name, "--indices", "0,7,33,59", "--preset", "act", "--out", file.to_str().expect("utf-8")],
        );
        assert_eq!(run.code, 0, "{run:#?}");
        read_arrow(&file)
    };
    assert!(sample("from-s3") == sample("v30-images-tiny"), "samples of the dataset read from S3 differ");
}

#[test]
fn a_dataset_served_over_http_ingests_as_its_directory_does() {
    let web = WebServer::serve(&testdata("v30-av1-small").join(".."));
    let tmp = tempfile::tempdir().expect("tmp");
    let (over_http, local) = (tmp.path().join("http"), tmp.path().join("local"));
    for name in ["v30-av1-small", "v30-h264-multifile"] {
        let url = format!("{}/{name}", web.url());
        let run = lake(&over_http, &["ingest", &url]);
        assert_eq!(run.code, 0, "{run:#?}");
        assert!(run.stdout.contains(&format!("as {name}@1")), "named after the URL's last segment: {}", run.stdout);
        assert!(run.stdout.contains("cannot be listed"), "says what was not checked: {}", run.stdout);
        ingest_ok(&local, &testdata(name), &[]);
        let (http_out, local_out) = (tmp.path().join(format!("{name}-http.arrow")), tmp.path().join(format!("{name}-local.arrow")));
        for (root, out) in [(&over_http, &http_out), (&local, &local_out)] {
            let run = lake(
                root,
                &["sample", "--dataset", name, "--indices", "0,57,150,299", "--preset", "act", "--out", out.to_str().expect("utf-8")],
            );
            assert_eq!(run.code, 0, "{run:#?}");
        }
        assert!(read_arrow(&http_out) == read_arrow(&local_out), "{name}: samples of the HTTP source differ from its directory's");
        // Again: the source's files did not change, so no new version.
        let run = lake(&over_http, &["ingest", &url, "--json"]);
        assert!(run.stdout.contains(r#""outcome":"unchanged""#) || run.stdout.contains(r#""outcome": "unchanged""#), "{}", run.stdout);
    }
    let query = "SELECT dataset, episode_index, count(*) AS steps, sum(\"action\"[1]) AS a FROM steps GROUP BY dataset, episode_index \
                 ORDER BY dataset, episode_index";
    let (a, b) = (lake(&over_http, &["sql", query, "--format", "json"]), lake(&local, &["sql", query, "--format", "json"]));
    assert_eq!((a.code, &a.stdout), (0, &b.stdout), "{a:#?}");
    assert!(web.requests(&["\"GET /v30-av1-small/videos/", "\" 206 "]) > 0, "videos are read with ranged GETs");

    // A missing dataset, or a missing file of one, is named.
    let run = lake(&over_http, &["ingest", &format!("{}/no-such-dataset", web.url())]);
    assert_ne!(run.code, 0, "{run:#?}");
    assert!(run.stderr.contains("meta/info.json"), "{}", run.stderr);
}
