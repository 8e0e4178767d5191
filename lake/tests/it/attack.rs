//! The attack run, kept: queries built to crash or exhaust the server, and what each must get
//! instead (an answer, or a clear refusal with the server still up). The quick part runs with
//! every `cargo test`; `LAKE_ATTACK_FULL=1` adds the long variants (see docs/reliability.md).

use std::path::Path;

use futures::TryStreamExt;
use lake::sql::limits::{MAX_DEPTH, MAX_JOINED, MAX_QUERY_BYTES, MAX_SUBQUERY_DEPTH};
use lake_testkit::testdata;
use serde_json::Value;

use crate::{
    common::{ingest_ok, lake},
    serve::{Server, TOKEN, http, start_with},
};

/// `SELECT t s t s … t` with `n` terms.
fn chain(term: &str, separator: &str, n: usize) -> String {
    vec![term; n].join(separator)
}

/// A query over HTTP: the status and the body as text.
fn post_sql(server: &Server, query: &str) -> (u16, String) {
    let auth = format!("Bearer {TOKEN}");
    let (code, body) = http(&server.http, "POST", "/v1/sql", &[("Authorization", &auth), ("Accept", "application/json")], query.as_bytes());
    (code, String::from_utf8_lossy(&body).into_owned())
}

/// A Flight SQL query: planned by GetFlightInfo, then read with DoGet; and the same query read
/// with a ticket made by hand (DoGet without GetFlightInfo first). Both results.
fn flight_sql(server: &Server, query: &str) -> [Result<usize, tonic::Status>; 2] {
    use arrow_flight::sql::{ProstMessageExt, TicketStatementQuery, client::FlightSqlServiceClient};
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let channel = tonic::transport::Channel::from_shared(server.flight.clone()).expect("url").connect().await.expect("connect");
        let mut client = FlightSqlServiceClient::new(channel);
        client.set_header("authorization", format!("Bearer {TOKEN}"));
        let status = |e: arrow_flight::error::FlightError| match e {
            arrow_flight::error::FlightError::Tonic(s) => *s,
            other => tonic::Status::unknown(other.to_string()),
        };
        let planned = async {
            let info = client.clone().execute(query.to_string(), None).await.map_err(status)?;
            let ticket = info.endpoint[0].ticket.clone().expect("a ticket");
            let batches: Vec<arrow::array::RecordBatch> =
                client.clone().do_get(ticket).await.map_err(status)?.try_collect().await.map_err(status)?;
            Ok(batches.iter().map(|b| b.num_rows()).sum())
        }
        .await;
        let handmade = async {
            let ticket = TicketStatementQuery { statement_handle: query.as_bytes().to_vec().into() }.as_any();
            let ticket = arrow_flight::Ticket::new(prost::Message::encode_to_vec(&ticket));
            let batches: Vec<arrow::array::RecordBatch> =
                client.clone().do_get(ticket).await.map_err(status)?.try_collect().await.map_err(status)?;
            Ok(batches.iter().map(|b| b.num_rows()).sum())
        }
        .await;
        [planned, handmade]
    })
}

fn healthy(server: &Server) {
    let (code, body) = http(&server.http, "GET", "/healthz", &[], b"");
    assert_eq!(code, 200, "the server answers /healthz: {}", String::from_utf8_lossy(&body));
}

fn small_lake(tmp: &Path) -> std::path::PathBuf {
    let root = tmp.join("lake");
    ingest_ok(&root, &testdata("v30-av1-small"), &[]);
    root
}

/// Queries at the nesting limits are answered and one level past them refused, by name, with
/// 400 over HTTP, INVALID_ARGUMENT over Flight SQL (whether or not GetFlightInfo planned it
/// first) and exit 2 from `lake sql`; chains far past the limits (the 958-byte `+1` chain that
/// once aborted the server, 100 000 `AND`s, 1 MiB of `+1`) are refused the same way, and the
/// server stays up through all of them.
#[test]
fn sql_nested_past_the_limits_is_refused_and_never_crashes_the_server() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = small_lake(tmp.path());
    let server = start_with(&root, &["--shutdown-wait", "2", "--sql-timeout", "120"]);

    let nested = |n: usize| format!("SELECT {}1{}", "(SELECT ".repeat(n), ")".repeat(n));
    let joined = |n: usize| format!("SELECT 1 FROM {}", (0..n).map(|i| format!("(SELECT 1) AS t{i}")).collect::<Vec<_>>().join(", "));
    // (query, what a refusal says; None: answered)
    let cases: Vec<(String, Option<String>)> = vec![
        // At the limits: one level for the query, one per chained term past the first.
        (format!("SELECT {}", chain("1", " + ", MAX_DEPTH - 1)), None),
        (format!("SELECT count(*) FROM steps WHERE {}", (0..400).map(|i| format!("index = {i}")).collect::<Vec<_>>().join(" OR ")), None),
        (chain("SELECT 1", " UNION ALL ", MAX_DEPTH - 1), None),
        (nested(MAX_SUBQUERY_DEPTH), None),
        (joined(MAX_JOINED.min(64)), None),
        // The query that once aborted the server: 958 bytes, 501 deep.
        (format!("SELECT 1{}", "+1".repeat(500)), None),
        // Past them.
        (format!("SELECT {}", chain("1", "+", MAX_DEPTH)), Some(format!("expression nested deeper than {MAX_DEPTH}"))),
        (format!("SELECT {}", chain("'a'", " || ", MAX_DEPTH)), Some(format!("expression nested deeper than {MAX_DEPTH}"))),
        (chain("SELECT 1", " UNION ALL ", MAX_DEPTH + 1), Some(format!("expression nested deeper than {MAX_DEPTH}"))),
        (format!("SELECT {}", chain("true", " AND ", 100_000)), Some(format!("expression nested deeper than {MAX_DEPTH}"))),
        (format!("SELECT {}1{}", "(".repeat(200), ")".repeat(200)), Some("expression nested deeper than the parser's limit".into())),
        (format!("SELECT {}1", "- ".repeat(200)), Some("expression nested deeper than the parser's limit".into())),
        (nested(MAX_SUBQUERY_DEPTH + 1), Some(format!("subqueries nested deeper than {MAX_SUBQUERY_DEPTH}"))),
        (joined(MAX_JOINED + 1), Some(format!("joins {} relations, more than the limit of {MAX_JOINED}", MAX_JOINED + 1))),
        // 1 MiB of `+1` (a chain 500 000 deep) is refused for its length.
        (format!("SELECT {}", chain("1", "+", MAX_QUERY_BYTES / 2)), Some(format!("over the limit of {MAX_QUERY_BYTES} bytes"))),
        (format!("SELECT {}", chain("1", "+", MAX_QUERY_BYTES / 2 - 8)), Some(format!("expression nested deeper than {MAX_DEPTH}"))),
    ];
    for (query, refusal) in &cases {
        let label = &query[..query.len().min(60)];
        let (code, body) = post_sql(&server, query);
        match refusal {
            None => assert_eq!(code, 200, "{label}…: {body}"),
            Some(says) => {
                assert_eq!(code, 400, "{label}…: {body}");
                let error = serde_json::from_str::<Value>(&body).expect("a JSON error");
                assert!(error["error"].as_str().is_some_and(|e| e.contains(says.as_str())), "{label}…: {says:?} in {error}");
            }
        }
        healthy(&server);
    }
    // Flight SQL: refused at GetFlightInfo, and at DoGet with a ticket made by hand.
    for (query, refusal) in &cases {
        let label = &query[..query.len().min(60)];
        for (how, answer) in ["GetFlightInfo", "a hand-made ticket"].iter().zip(flight_sql(&server, query)) {
            match (refusal, answer) {
                (None, Ok(rows)) => assert!(rows > 0, "{label}… by {how}"),
                (Some(says), Err(status)) => {
                    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{label}… by {how}: {status:?}");
                    assert!(status.message().contains(says.as_str()), "{label}… by {how}: {says:?} in {status:?}");
                }
                (_, answer) => panic!("{label}… by {how}: {refusal:?}, got {answer:?}"),
            }
        }
        healthy(&server);
    }
    // `lake sql`: the same refusals, exit 2 (queries that fit on a command line).
    for (query, refusal) in cases.iter().filter(|(q, _)| q.len() < 100_000) {
        let run = lake(&root, &["sql", "--format", "csv", query]);
        match refusal {
            None => assert_eq!(run.code, 0, "{run:?}"),
            Some(says) => {
                assert_eq!(run.code, 2, "{}: {}", &query[..60.min(query.len())], run.stderr);
                assert!(run.stderr.contains(says.as_str()), "{says:?} in {}", run.stderr);
            }
        }
    }
}

/// The server's resident memory in bytes.
fn rss(server: &Server) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.child.id())).expect("the server's /proc status");
    let kb = status.lines().find_map(|l| l.strip_prefix("VmRSS:")).expect("VmRSS").trim().trim_end_matches(" kB").trim();
    kb.parse::<u64>().expect("a number of kB") * 1024
}

/// Waits up to `seconds` for `done`, checking every 200 ms.
fn eventually(seconds: u64, mut done: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(seconds);
    while std::time::Instant::now() < deadline {
        if done() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    done()
}

/// SQL runs in a memory budget: the attack run's three memory bombs (a 400-million-row top-k
/// sort, a 1.5 GB `repeat`, a 2 MB `IN` list) are refused with "resources exhausted" (507,
/// RESOURCE_EXHAUSTED, exit 2) or for their length, as are values built past the per-call limit
/// by `lpad`, `replace`, `range` and `||`; the server answers /healthz throughout, a client that
/// leaves stops its query, and the memory goes back to the system once the queries end.
#[test]
fn sql_memory_bombs_are_refused_and_the_memory_goes_back() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = small_lake(tmp.path());
    let server = start_with(&root, &["--shutdown-wait", "2", "--memory-mb", "1024", "--sql-memory-mb", "256"]);
    let metrics = || {
        let (_, body) = http(&server.http, "GET", "/metrics", &[("Authorization", &format!("Bearer {TOKEN}"))], b"");
        String::from_utf8_lossy(&body).into_owned()
    };
    assert_eq!(crate::serve::metric(&metrics(), "lake_sql_memory_budget_bytes"), f64::from(256u32 << 20));
    assert_eq!(post_sql(&server, "SELECT count(*) AS n FROM steps").0, 200);
    let baseline = rss(&server);

    let in_list = format!("SELECT 1 IN ({})", (0..300_000).map(|i| i.to_string()).collect::<Vec<_>>().join(","));
    for (query, code, says) in [
        ("SELECT value FROM generate_series(1,400000000) ORDER BY value DESC LIMIT 400000000", 507, "resources exhausted"),
        ("SELECT length(repeat('x',1500000000))", 507, "repeat would build 1500000000 bytes"),
        (in_list.as_str(), 400, "over the limit of 1048576 bytes"),
        ("SELECT lpad('x', 2000000000)", 507, "lpad would build"),
        ("SELECT length(replace(repeat('a', 100000000), 'a', 'bbbbbbbb'))", 507, "replace would build"),
        ("SELECT cardinality(range(1000000000))", 507, "range would build"),
        ("SELECT length(repeat('x', 200000000) || repeat('y', 200000000))", 507, "|| would build"),
        // Each WITH table doubles the string, until the limit.
        (
            "WITH a AS (SELECT repeat('x', 1000000) AS s), b AS (SELECT s || s AS s FROM a), c AS (SELECT s || s AS s FROM b), \
             d AS (SELECT s || s AS s FROM c), e AS (SELECT s || s AS s FROM d), f AS (SELECT s || s AS s FROM e), \
             g AS (SELECT s || s AS s FROM f), h AS (SELECT s || s AS s FROM g), i AS (SELECT s || s AS s FROM h), \
             j AS (SELECT s || s AS s FROM i) SELECT length(s) FROM j",
            507,
            "|| would build",
        ),
    ] {
        let (got, body) = post_sql(&server, query);
        assert_eq!(got, code, "{}…: {body}", &query[..40]);
        assert!(body.contains(says), "{says:?} in {body}");
        healthy(&server);
    }
    // What stays within the limits is answered, with `||`'s nulls (unlike concat's).
    let (code, body) = post_sql(&server, "SELECT length(repeat('x', 1000000) || 'y') AS n, NULL || 'a' AS z, concat(NULL, 'a') AS c");
    assert_eq!((code, body.as_str()), (200, r#"[{"n":1000001,"z":null,"c":"a"}]"#));
    let [planned, handmade] = flight_sql(&server, "SELECT length(repeat('x',1500000000))");
    for answer in [planned, handmade] {
        let status = answer.expect_err("refused");
        assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
        assert!(status.message().contains("resources exhausted"), "{status:?}");
    }
    let run =
        lake(&root, &["sql", "--memory-mb", "64", "SELECT value FROM generate_series(1,100000000) ORDER BY value DESC LIMIT 100000000"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("resources exhausted"), "{}", run.stderr);

    // A client that leaves stops its query (a sort, which spills): its slot comes back.
    let addr = server.http.clone();
    let mut leaving = std::net::TcpStream::connect(&addr).expect("connect");
    let query = "SELECT value FROM generate_series(1,400000000) ORDER BY value DESC";
    let request =
        format!("POST /v1/sql HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: {}\r\n\r\n{query}", query.len());
    std::io::Write::write_all(&mut leaving, request.as_bytes()).expect("send");
    assert!(eventually(30, || crate::serve::metric(&metrics(), "lake_sql_running") == 1.0), "the query runs");
    drop(leaving);
    assert!(eventually(120, || crate::serve::metric(&metrics(), "lake_sql_running") == 0.0), "the query stops when its client leaves");
    healthy(&server);

    // The pages the queries took go back.
    assert!(eventually(30, || rss(&server) < 2 * baseline), "RSS {} after the queries, {baseline} before", rss(&server));
}
