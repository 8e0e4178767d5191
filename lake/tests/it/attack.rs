//! The attack run, kept: queries built to crash or exhaust the server, and what each must get
//! instead (an answer, or a clear refusal with the server still up). The quick part runs with
//! every `cargo test`; `LAKE_ATTACK_FULL=1` adds the long variants (see docs/reliability.md).

use std::path::Path;

use arrow::datatypes::DataType;
use futures::TryStreamExt;
use lake_query::sql::limits::{MAX_DEPTH, MAX_JOINED, MAX_QUERY_BYTES, MAX_SUBQUERY_DEPTH};
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

/// `call` with a Flight SQL client of `server` that sends the token, on a runtime of its own.
fn with_flight_sql<T, F: std::future::Future<Output = T>>(
    server: &Server,
    call: impl FnOnce(arrow_flight::sql::client::FlightSqlServiceClient<tonic::transport::Channel>) -> F,
) -> T {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let channel = tonic::transport::Channel::from_shared(server.flight.clone()).expect("url").connect().await.expect("connect");
        let mut client = arrow_flight::sql::client::FlightSqlServiceClient::new(channel);
        client.set_header("authorization", format!("Bearer {TOKEN}"));
        call(client).await
    })
}

/// A Flight call's error as the status the server sent.
fn flight_status(e: arrow_flight::error::FlightError) -> tonic::Status {
    match e {
        arrow_flight::error::FlightError::Tonic(s) => *s,
        other => tonic::Status::unknown(other.to_string()),
    }
}

/// The rows of the answer to `ticket`.
async fn rows_of(
    mut client: arrow_flight::sql::client::FlightSqlServiceClient<tonic::transport::Channel>,
    ticket: arrow_flight::Ticket,
) -> Result<usize, tonic::Status> {
    let batches: Vec<arrow::array::RecordBatch> =
        client.do_get(ticket).await.map_err(flight_status)?.try_collect().await.map_err(flight_status)?;
    Ok(batches.iter().map(|b| b.num_rows()).sum())
}

/// A Flight SQL query: planned by GetFlightInfo, then read with DoGet; and the same query read
/// with a ticket made by hand (DoGet without GetFlightInfo first). Both results.
fn flight_sql(server: &Server, query: &str) -> [Result<usize, tonic::Status>; 2] {
    use arrow_flight::sql::{ProstMessageExt, TicketStatementQuery};
    with_flight_sql(server, |mut client| async move {
        let planned = async {
            let info = client.execute(query.to_string(), None).await.map_err(flight_status)?;
            rows_of(client.clone(), info.endpoint[0].ticket.clone().expect("a ticket")).await
        }
        .await;
        let ticket = TicketStatementQuery { statement_handle: query.as_bytes().to_vec().into() }.as_any();
        let handmade = rows_of(client, arrow_flight::Ticket::new(prost::Message::encode_to_vec(&ticket))).await;
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
/// server stays up through all of them. A view made over HTTP gets the same limits.
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
    // A view's query over HTTP: the same limits, and the walk over its answer on a stack that
    // holds it (a 300-term UNION ALL once aborted the server here). A query whose answer runs
    // to billions of rows is refused at its first episode the dataset lacks.
    let views = [
        ("deep", chain("SELECT 0 AS episode_index", " UNION ALL ", MAX_DEPTH - 1), None),
        (
            "deeper",
            chain("SELECT 0 AS episode_index", " UNION ALL ", MAX_DEPTH + 1),
            Some(format!("expression nested deeper than {MAX_DEPTH}")),
        ),
        ("endless", "SELECT value AS episode_index FROM generate_series(0, 4000000000)".into(), Some("has no episode 6".into())),
    ];
    let auth = format!("Bearer {TOKEN}");
    for (name, query, refusal) in &views {
        let request = serde_json::json!({"name": name, "sql": query}).to_string();
        let (code, body) = http(&server.http, "POST", "/v1/views", &[("Authorization", &auth)], request.as_bytes());
        let body = String::from_utf8_lossy(&body);
        match refusal {
            None => assert_eq!(code, 201, "view {name}: {body}"),
            Some(says) => assert!(code == 400 && body.contains(says.as_str()), "view {name}: {says:?} in {code} {body}"),
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
        // Instants by the nanosecond over the whole range of timestamps; by a step that may
        // make no headway (a month less 30 days), as many as by the nanosecond.
        (
            "SELECT cardinality(generate_series(TIMESTAMP '1677-09-22', TIMESTAMP '2262-04-11', INTERVAL '1 nanosecond'))",
            507,
            "generate_series would build",
        ),
        ("SELECT cardinality(range(DATE '2000-01-01', DATE '2020-01-01', INTERVAL '1 month -30 days'))", 507, "range would build"),
        ("SELECT length(repeat('x', 200000000) || repeat('y', 200000000))", 507, "|| would build"),
        // `concat` folds literal arguments at planning: sized before it does.
        ("SELECT length(concat(repeat('a', 100000000), repeat('b', 100000000), repeat('c', 100000000)))", 507, "concat would build"),
        ("SELECT length(concat_ws(repeat(',', 100000000), repeat('a', 100000000), repeat('b', 100000000)))", 507, "concat_ws would build"),
        // A value within the limit, repeated over a batch past Arrow's 2 GiB of offsets: the
        // engine panics, on the query's thread, and the query is refused.
        ("SELECT length(string_agg(repeat('x', 1000000), ',')) FROM generate_series(1, 100000)", 507, "over 2 GiB of values in one batch"),
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
    let run = lake(&root, &["sql", "SELECT length(string_agg(repeat('x', 1000000), ',')) FROM generate_series(1, 100000)"]);
    assert!(run.code == 2 && run.stderr.contains("over 2 GiB of values in one batch"), "{run:?}");
    // The engine's panic is one line of the log, saying where, without Rust's report.
    assert!(run.stderr.contains("caught a panic at arrow-buffer-") && !run.stderr.contains("panicked at"), "{run:?}");

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

/// Queries that DataFusion's own code fails on are refused as queries, never as the server's
/// fault: a panic while planning (`date_trunc` of the earliest timestamp unwraps nothing) and a
/// pattern that is no regular expression get 400 over HTTP, INVALID_ARGUMENT over Flight SQL and
/// exit 2 from `lake sql`. Recursive queries run under the operators that stop a query (they
/// pass the work table on and reset with each round); a dictionary column is answered as its
/// values, also as Arrow over HTTP, and every other type a query can make as Arrow, JSON and
/// CSV and over Flight SQL. Flight SQL's listing of tables refuses a LIKE pattern too large for a regular
/// expression as the request's fault.
#[test]
fn sql_the_engine_fails_on_is_refused_and_recursion_and_dictionaries_are_answered() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = small_lake(tmp.path());
    let server = start_with(&root, &["--shutdown-wait", "2"]);
    for query in [
        "SELECT date_trunc('week', arrow_cast(-9223372036854775808, 'Timestamp(Nanosecond, None)'))",
        "SELECT regexp_like('abc', '(')",
        "SELECT count(*) FROM steps WHERE task ~ '['",
    ] {
        let (code, body) = post_sql(&server, query);
        assert_eq!(code, 400, "{query}: {body}");
        healthy(&server);
        for (how, answer) in ["GetFlightInfo", "a hand-made ticket"].iter().zip(flight_sql(&server, query)) {
            let status = answer.expect_err(query);
            assert_eq!(status.code(), tonic::Code::InvalidArgument, "{query} by {how}: {status:?}");
        }
        let run = lake(&root, &["sql", query]);
        assert_eq!(run.code, 2, "{query}: {run:?}");
        assert!(!run.stderr.contains("panicked at") && !run.stderr.contains("stack backtrace"), "{query}: {run:?}");
    }
    let recursive = [
        (
            "WITH RECURSIVE r AS (SELECT 1 AS n UNION ALL SELECT n + 1 FROM r WHERE n < 100) SELECT count(*) AS n, sum(n) AS s FROM r",
            r#"[{"n":100,"s":5050}]"#,
        ),
        ("WITH RECURSIVE r AS (SELECT 1 AS n UNION ALL SELECT n FROM r) SELECT n FROM r LIMIT 3", r#"[{"n":1},{"n":1},{"n":1}]"#),
        (
            "WITH RECURSIVE r AS (SELECT 'x' AS s UNION ALL SELECT s || s FROM r WHERE length(s) < 8) SELECT length(s) AS l FROM r ORDER BY l",
            r#"[{"l":1},{"l":2},{"l":4},{"l":8}]"#,
        ),
    ];
    for (query, answer) in recursive {
        assert_eq!(post_sql(&server, query), (200, answer.to_string()), "{query}");
        assert_eq!(flight_sql(&server, query).map(|a| a.expect(query)), [answer.matches('{').count(); 2], "{query}");
    }
    let query = "SELECT arrow_cast(300, 'Dictionary(Int8, Int64)') AS d, arrow_cast(task, 'Dictionary(Int32, Utf8)') AS t, \
         map(['k'], [arrow_cast('x', 'Dictionary(Int32, Utf8)')]) AS m FROM steps LIMIT 2";
    let auth = format!("Bearer {TOKEN}");
    let (code, body) = http(
        &server.http,
        "POST",
        "/v1/sql",
        &[("Authorization", &auth), ("Accept", "application/vnd.apache.arrow.stream")],
        query.as_bytes(),
    );
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
    let batches: Vec<arrow::array::RecordBatch> = arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(body), None)
        .expect("an Arrow stream")
        .collect::<Result<_, _>>()
        .expect("whole");
    let schema = batches[0].schema();
    assert_eq!(schema.fields()[..2].iter().map(|f| f.data_type().clone()).collect::<Vec<_>>(), [DataType::Int64, DataType::Utf8]);
    let DataType::Map(entries, _) = schema.field(2).data_type() else { panic!("a map: {schema:?}") };
    let DataType::Struct(entry) = entries.data_type() else { panic!("a map's entries: {entries:?}") };
    assert_eq!(entry[1].data_type(), &DataType::Utf8);
    assert_eq!(batches.iter().map(arrow::array::RecordBatch::num_rows).sum::<usize>(), 2);
    assert_eq!(flight_sql(&server, query).map(|a| a.expect(query)), [2, 2]);
    healthy(&server);

    // Every type a query can make, as Arrow (read whole), JSON and CSV, and over Flight SQL.
    for value in [
        "named_struct('a', 1, 'b', [named_struct('c', 'x')])",
        "map(['k'], [1])",
        "arrow_cast(1, 'Float16')",
        "arrow_cast(1, 'Decimal256(50, 2)')",
        "INTERVAL '1 month 2 days'",
        "arrow_cast(1, 'Duration(Second)')",
        "arrow_cast(1, 'Time64(Nanosecond)')",
        "arrow_cast(1, 'Timestamp(Nanosecond, Some(\"+05:00\"))')",
        "arrow_cast('ab', 'BinaryView')",
        "arrow_cast('ab', 'Utf8View')",
        "arrow_cast([1, 2], 'LargeList(Int64)')",
        "arrow_cast([1], 'ListView(Int64)')",
        "[X'00FF']",
        "arrow_cast(NULL, 'Null')",
    ] {
        let query = format!("SELECT {value} AS v FROM steps LIMIT 3");
        for accept in ["application/vnd.apache.arrow.stream", "application/json", "text/csv"] {
            let (code, body) = http(&server.http, "POST", "/v1/sql", &[("Authorization", &auth), ("Accept", accept)], query.as_bytes());
            assert_eq!(code, 200, "{query} as {accept}: {}", String::from_utf8_lossy(&body));
            if accept.ends_with("arrow.stream") {
                let rows: usize = arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(body), None)
                    .expect("an Arrow stream")
                    .map(|b| b.expect("whole").num_rows())
                    .sum();
                assert_eq!(rows, 3, "{query}");
            }
        }
        assert_eq!(flight_sql(&server, &query).map(|a| a.expect(&query)), [3, 3], "{query}");
    }

    // Flight SQL's listing of tables, filtered by a LIKE pattern: one that names tables, and
    // one whose regular expression is past what the regex crate builds.
    for (pattern, tables) in [("st_ps", Ok(2)), (&"_".repeat(200_000) as &str, Err(tonic::Code::InvalidArgument))] {
        assert_eq!(flight_tables(&server, pattern).map_err(|s| s.code()), tables, "{}", &pattern[..pattern.len().min(20)]);
        healthy(&server);
    }
}

/// The tables Flight SQL's GetTables lists whose name is `like`, with their schemas.
fn flight_tables(server: &Server, like: &str) -> Result<usize, tonic::Status> {
    with_flight_sql(server, |mut client| async move {
        let command = arrow_flight::sql::CommandGetTables {
            catalog: None,
            db_schema_filter_pattern: None,
            table_name_filter_pattern: Some(like.to_string()),
            table_types: Vec::new(),
            include_schema: true,
        };
        let info = client.get_tables(command).await.map_err(flight_status)?;
        rows_of(client, info.endpoint[0].ticket.clone().expect("a ticket")).await
    })
}

/// Every file under `root`, relative, sorted.
fn tree(root: &Path) -> Vec<String> {
    let mut out: Vec<String> =
        crate::common::files_under(root).iter().map(|p| p.strip_prefix(root).expect("under root").display().to_string()).collect();
    out.sort();
    out
}

/// Whether a lake has reached a moment of an ingest.
type Reached = Box<dyn Fn(&Path) -> bool>;

/// An ingest killed (SIGKILL) at each boundary between its phases (as each table of the new
/// version appears, as its commit record appears, as its lease goes) leaves the lake as it
/// was or with the whole version; the next ingest then succeeds, and the lake's tree holds
/// nothing but committed versions: no version directory of the killed run, no lease, no empty
/// `staging/`, no partial file.
#[test]
fn an_ingest_killed_at_every_phase_boundary_leaves_only_committed_versions() {
    let tmp = tempfile::tempdir().expect("tmp");
    let source = testdata("v30-av1-small");
    let boundaries: Vec<(&str, Reached)> = {
        let table = |t: &'static str| -> Reached {
            Box::new(move |root: &Path| {
                std::fs::read_dir(root.join("datasets/x"))
                    .into_iter()
                    .flatten()
                    .flatten()
                    .any(|d| d.path().join(format!("{t}.lance")).exists())
            })
        };
        let mut b: Vec<(&str, Reached)> = vec![(
            "its lease appears",
            Box::new(|root: &Path| std::fs::read_dir(root.join("staging")).is_ok_and(|mut d| d.next().is_some())),
        )];
        for t in ["packets", "steps", "streams", "episodes", "tasks", "stats", "feature_stats", "findings"] {
            b.push((t, table(t)));
        }
        b.push(("its commit record appears", Box::new(|root: &Path| root.join("catalog/x/v00000001.json").exists())));
        b.push((
            "its lease goes",
            Box::new(|root: &Path| root.join("catalog/x/v00000001.json").exists() && !root.join("staging").exists()),
        ));
        b
    };
    for (i, (boundary, reached)) in boundaries.iter().enumerate() {
        let root = tmp.path().join(format!("lake{i}"));
        ingest_ok(&root, &testdata("v30-images-tiny"), &[]);
        let mut child = crate::common::lake_cmd(&root)
            .args(["ingest", source.to_str().expect("utf-8"), "--name", "x"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn");
        while !reached(&root) && child.try_wait().expect("wait").is_none() {
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
        let _ = child.kill();
        let _ = child.wait();
        // The dataset is whole or absent.
        let listed = lake(&root, &["ls"]).stdout;
        if listed.contains("x@1") {
            assert_eq!(
                lake(&root, &["sample", "--dataset", "x", "--indices", "0", "--out", "/dev/null"]).code,
                0,
                "killed after {boundary}"
            );
        }
        let rerun = lake(&root, &["ingest", source.to_str().expect("utf-8"), "--name", "x"]);
        assert_eq!(rerun.code, 0, "the ingest after a kill when {boundary}: {rerun:?}");
        let files = tree(&root);
        let version_dirs: std::collections::BTreeSet<&str> =
            files.iter().filter_map(|f| f.strip_prefix("datasets/x/")).filter_map(|f| f.split('/').next()).collect();
        assert_eq!(version_dirs.len(), 1, "killed when {boundary}: only the committed version's directory: {version_dirs:?}");
        let record: Value = serde_json::from_slice(&std::fs::read(root.join("catalog/x/v00000001.json")).expect("record")).expect("json");
        let committed = record["tables"]["dir"].as_str().expect("dir");
        assert_eq!(format!("datasets/x/{}", version_dirs.iter().next().expect("one")), committed, "killed when {boundary}");
        assert!(!root.join("staging").exists(), "killed when {boundary}: {files:?}");
        assert!(!files.iter().any(|f| f.contains('#')), "killed when {boundary}: a partial upload is left: {files:?}");
        assert!(!root.join("catalog/x/v00000002.json").exists(), "killed when {boundary}: one version");
    }
}

/// Whether the long variants of the attack run are asked for (`LAKE_ATTACK_FULL=1`).
fn full() -> bool {
    std::env::var_os("LAKE_ATTACK_FULL").is_some_and(|v| v != "0")
}

/// The auth matrix (every endpoint but /healthz, with each way a token can be missing or
/// wrong, over HTTP and Flight), the path traversals (dataset names in URLs, requests and SQL
/// that point outside the lake) and the statements that write or read files: every one is
/// refused, and none reads or writes outside the lake. Refusals over Flight that echo what the
/// client sent are cut to fit a gRPC header.
#[test]
fn auth_traversal_and_file_statements_are_refused() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = small_lake(tmp.path());
    let server = start_with(&root, &["--shutdown-wait", "2"]);
    let secret = tmp.path().join("secret.txt");
    std::fs::write(&secret, "not the lake's").expect("secret");
    let good = format!("Bearer {TOKEN}");
    let bad_headers: Vec<Vec<(&str, String)>> = vec![
        vec![],
        vec![("Authorization", String::new())],
        vec![("Authorization", "Bearer".into())],
        vec![("Authorization", "Bearer ".into())],
        vec![("Authorization", format!("Basic {TOKEN}"))],
        vec![("Authorization", format!("Bearer {TOKEN}x"))],
        vec![("Authorization", format!("Bearer {}", &TOKEN[..TOKEN.len() - 1]))],
        vec![("Authorization", format!("Bearer {}", TOKEN.to_uppercase()))],
        vec![("Authorization", format!("Bearer{TOKEN}"))],
        vec![("Authorization", format!("Token {TOKEN}"))],
        vec![("X-Api-Key", TOKEN.into())],
        vec![("Cookie", format!("token={TOKEN}"))],
    ];
    let endpoints: [(&str, &str, &[u8]); 11] = [
        ("GET", "/metrics", b""),
        ("GET", "/v1/datasets", b""),
        ("GET", "/v1/datasets/v30-av1-small", b""),
        ("GET", "/v1/datasets/v30-av1-small/episodes", b""),
        ("GET", "/v1/datasets/v30-av1-small/episodes/0", b""),
        ("GET", "/v1/datasets/v30-av1-small/findings", b""),
        ("GET", "/v1/datasets/v30-av1-small/frame?camera=observation.images.front&index=0", b""),
        ("GET", "/v1/datasets/v30-av1-small/frames?camera=observation.images.front&index=0&count=4", b""),
        ("POST", "/v1/sample", br#"{"datasets": ["v30-av1-small"], "limit_batches": 1}"#),
        ("POST", "/v1/sql", b"SELECT 1"),
        ("GET", "/v1/openapi.json", b""),
    ];
    let mut tried = 0;
    for (method, path, body) in endpoints {
        for headers in &bad_headers {
            let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let (code, _) = http(&server.http, method, path, &headers, body);
            assert_eq!(code, 401, "{method} {path} with {headers:?}");
            tried += 1;
        }
        // A token in the query string is not a token.
        let (code, _) = http(&server.http, method, &format!("{path}?token={TOKEN}"), &[], body);
        assert_eq!(code, 401, "{method} {path}?token=");
        let (code, body) = http(&server.http, method, path, &[("Authorization", &good), ("Accept", "*/*")], body);
        assert_eq!(code, 200, "{method} {path}: {}", String::from_utf8_lossy(&body));
    }
    assert!(tried >= 60);
    // Flight: the same tokens in gRPC metadata.
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        for header in ["", "Bearer", "Bearer wrong", &format!("Basic {TOKEN}"), &format!("Bearer {TOKEN}x")] {
            let channel = tonic::transport::Channel::from_shared(server.flight.clone()).expect("url").connect().await.expect("connect");
            let mut client = arrow_flight::FlightClient::new(channel);
            if !header.is_empty() {
                client.add_header("authorization", header).expect("header");
            }
            let ticket = arrow_flight::Ticket::new(r#"{"datasets": ["v30-av1-small"], "limit_batches": 1}"#);
            let refused = match client.do_get(ticket).await {
                Err(e) => e.to_string(),
                Ok(stream) => stream.try_collect::<Vec<_>>().await.expect_err("refused").to_string(),
            };
            assert!(refused.contains("Unauthenticated") || refused.contains("bearer token"), "{header:?}: {refused}");
        }
        // What a client sent, echoed in a refusal, is cut to fit a gRPC header (a client cannot
        // read a longer one, and shows its own error instead).
        let channel = tonic::transport::Channel::from_shared(server.flight.clone()).expect("url").connect().await.expect("connect");
        let mut client = arrow_flight::FlightClient::new(channel);
        client.add_header("authorization", &good).expect("header");
        let path = arrow_flight::FlightDescriptor::new_path(vec!["a".to_string(); 20_000]);
        let action = arrow_flight::Action::new("x".repeat(100_000), "");
        let ticket = arrow_flight::Ticket::new(format!(r#"{{"datasets": ["v30-av1-small"], "{}": 1}}"#, "é".repeat(50_000)));
        let refusals = [
            (client.get_flight_info(path).await.map(|_| ()), tonic::Code::InvalidArgument),
            (client.do_action(action).await.map(|_| ()), tonic::Code::Unimplemented),
            (client.do_get(ticket).await.map(|_| ()), tonic::Code::InvalidArgument),
        ];
        for (answer, code) in refusals {
            let Err(arrow_flight::error::FlightError::Tonic(status)) = answer else { panic!("refused: {answer:?}") };
            assert_eq!(status.code(), code, "{status:?}");
            assert!(
                status.message().ends_with('…') && status.message().len() <= lake_serve::MAX_STATUS_BYTES,
                "{}",
                status.message().len()
            );
        }
    });

    // Traversals: names that point outside the lake are not datasets.
    let secret_path = secret.display().to_string();
    let names = [
        "..",
        "../lake",
        "..%2F..%2Fetc%2Fpasswd",
        "%2e%2e",
        "a%2Fb",
        "%00",
        "v30-av1-small%2F..%2F..",
        "...",
        "CON",
        &format!("..%2F{}", tmp.path().file_name().expect("name").to_string_lossy()),
    ];
    for name in names {
        let (code, body) = http(&server.http, "GET", &format!("/v1/datasets/{name}"), &[("Authorization", &good)], b"");
        assert!(matches!(code, 400 | 404), "{name}: {code} {}", String::from_utf8_lossy(&body));
        let request = serde_json::json!({"datasets": [name.replace("%2F", "/").replace("%2f", "/")], "limit_batches": 1});
        let (code, _) = http(&server.http, "POST", "/v1/sample", &[("Authorization", &good)], request.to_string().as_bytes());
        assert!(matches!(code, 400 | 404), "{name} in a request: {code}");
    }
    for name in ["../../etc/passwd", "/etc/passwd", secret_path.as_str(), "v30-av1-small/../../x", "v30-av1-small@1/../.."] {
        let run = lake(&root, &["sample", "--dataset", name, "--indices", "0", "--out", "/dev/null"]);
        assert_eq!(run.code, 2, "{name}: {run:?}");
    }

    // Statements that would read or write files, or change anything: refused everywhere.
    let out = tmp.path().join("written.csv").display().to_string();
    let statements = [
        format!("COPY (SELECT 1) TO '{out}'"),
        format!("COPY steps TO '{out}' STORED AS CSV"),
        format!("CREATE EXTERNAL TABLE s STORED AS CSV LOCATION '{secret_path}'"),
        "CREATE TABLE t AS SELECT 1".into(),
        "CREATE VIEW v AS SELECT 1".into(),
        "INSERT INTO steps SELECT * FROM steps".into(),
        "DELETE FROM steps".into(),
        "DROP TABLE steps".into(),
        "SET datafusion.execution.batch_size = 1".into(),
        format!("SELECT * FROM '{secret_path}'"),
        format!("SELECT * FROM read_csv('{secret_path}')"),
        format!("SELECT * FROM \"{secret_path}\""),
        "SELECT * FROM \"../../etc\".passwd".into(),
    ];
    for statement in &statements {
        let (code, body) = post_sql(&server, statement);
        assert!(matches!(code, 400 | 404), "{statement}: {code} {body}");
        for answer in flight_sql(&server, statement) {
            assert!(answer.is_err(), "{statement} over Flight SQL: {answer:?}");
        }
        let run = lake(&root, &["sql", statement]);
        assert_eq!(run.code, 2, "{statement}: {run:?}");
    }
    assert!(!Path::new(&out).exists(), "a statement wrote a file");
    healthy(&server);
}

/// Floods: oversized bodies are refused, hundreds of idle connections and clients killed in
/// the middle of their streams leave the server serving, and the streams it serves meanwhile
/// are exactly `lake sample`'s batches. LAKE_ATTACK_FULL=1 runs the attack run's own sizes
/// (100 MB bodies, 400 idle connections, 64 concurrent streams, 40 killed clients). A local
/// client flooding the server with slots it gives back is read no faster than the stream goes.
#[test]
fn floods_of_bodies_connections_and_killed_clients_leave_the_server_serving() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = small_lake(tmp.path());
    let server = start_with(&root, &["--shutdown-wait", "2", "--request-wait", "5"]);
    let (idle, streams, killed, body_mb) = if full() { (400, 64, 40, 100) } else { (100, 8, 8, 8) };
    let good = format!("Bearer {TOKEN}");

    // A body far over the limit is refused as it arrives, without the server taking it whole.
    let big = vec![b'x'; body_mb << 20];
    for path in ["/v1/sql", "/v1/sample"] {
        let (code, _) = http(&server.http, "POST", path, &[("Authorization", &good)], &big);
        assert_eq!(code, 413, "{path}");
    }

    // Idle connections: opened and left silent.
    let silent: Vec<std::net::TcpStream> = (0..idle).map(|_| std::net::TcpStream::connect(&server.http).expect("connect")).collect();
    healthy(&server);

    // Clients that ask for an endless stream and are killed after a batch.
    let request = serde_json::json!({"datasets": ["v30-av1-small"], "batch_size": 4, "seed": 7});
    for _ in 0..killed {
        let mut client = std::net::TcpStream::connect(&server.http).expect("connect");
        let body = request.to_string();
        let head = format!(
            "POST /v1/sample HTTP/1.1\r\nHost: x\r\nAuthorization: {good}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        std::io::Write::write_all(&mut client, head.as_bytes()).expect("send");
        let mut first = [0u8; 4096];
        let _ = std::io::Read::read(&mut client, &mut first);
        drop(client);
    }

    // Concurrent finite streams, each equal to the loader's own batches for its rank.
    let want = |rank: u64| {
        let request = serde_json::json!({"datasets": ["v30-av1-small"], "batch_size": 8, "seed": 3, "world_size": streams, "rank": rank, "limit_batches": 2});
        (request.clone(), request)
    };
    let answers: Vec<(u16, Vec<u8>, serde_json::Value)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..streams as u64)
            .map(|rank| {
                let (request, echo) = want(rank);
                let (addr, good) = (server.http.clone(), good.clone());
                scope.spawn(move || {
                    let (code, body) = http(&addr, "POST", "/v1/sample", &[("Authorization", &good)], request.to_string().as_bytes());
                    (code, body, echo)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("client")).collect()
    });
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    for (code, body, request) in answers {
        assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
        let got: Vec<arrow::array::RecordBatch> = arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(body), None)
            .expect("arrow")
            .collect::<Result<_, _>>()
            .expect("batches");
        let expected = rt.block_on(crate::serve::in_process(&root, &request));
        assert_eq!(got, expected, "rank {}", request["rank"]);
    }
    drop(silent);
    healthy(&server);

    // A local client that gives its two slots back again and again and never reads: the server
    // fills them, its messages fill the socket, and it stops reading the client (whose writes
    // stall) instead of queueing what the client sends.
    use lake_client::local::wire;
    let mut flooder = std::os::unix::net::UnixStream::connect(&server.local).expect("local socket");
    let request = r#"{"datasets": ["v30-av1-small"], "preset": "none", "batch_size": 1}"#;
    let token_len = u32::try_from(TOKEN.len()).expect("short").to_le_bytes();
    let hello = wire::frame(wire::HELLO, &[&2u32.to_le_bytes(), &token_len, TOKEN.as_bytes(), request.as_bytes()]);
    std::io::Write::write_all(&mut flooder, &hello).expect("hello");
    // Slots 0 and 1 of the stream's first segment (segments count from 1).
    let release = |slot: u32| wire::frame(wire::RELEASE, &[&1u32.to_le_bytes(), &slot.to_le_bytes()]);
    let releases: Vec<u8> = [release(0), release(1)].concat().repeat(5_000);
    flooder.set_write_timeout(Some(std::time::Duration::from_secs(5))).expect("timeout");
    let mut sent = 0;
    while sent < 1_000_000 && std::io::Write::write_all(&mut flooder, &releases).is_ok() {
        sent += 10_000;
    }
    assert!(sent < 1_000_000, "the server read a million slots given back by a client that never reads");
    drop(flooder);
    healthy(&server);
}
