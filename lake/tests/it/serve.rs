//! `lake serve` as a real process on free loopback ports: batches over Flight and HTTP equal the
//! in-process loader's, ranks are disjoint, resuming replays, bad requests get their specific
//! errors, tokens are required, and SQL over HTTP and Flight SQL answers as `lake sql` does.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::TcpStream,
    path::Path,
    process::{Child, Stdio},
    sync::Arc,
};

use arrow::{
    array::{ArrayRef, AsArray, RecordBatch},
    datatypes::DataType,
    ipc::reader::StreamReader,
};
use arrow_flight::{FlightClient, FlightDescriptor};
use futures::{StreamExt, TryStreamExt};
use lake_testkit::testdata;
use serde_json::{Value, json};

use crate::common::{ingest_ok, lake, lake_cmd, sql_rows};

pub(crate) const TOKEN: &str = "s3cret-token";

/// The connection preface an HTTP/2 client sends first.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// A running `lake serve`, killed when dropped.
pub(crate) struct Server {
    pub(crate) child: Child,
    pub(crate) flight: String,
    pub(crate) http: String,
    /// The Unix socket of local (shared-memory) streams.
    pub(crate) local: std::path::PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Log lines written by a `tracing` subscriber, for tests that check what was logged.
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("not poisoned")).into_owned()
    }
}

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("not poisoned").extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Self;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

fn start(root: &Path) -> Server {
    start_with(root, &["--shutdown-wait", "2"])
}

/// [`start`] with more arguments for `lake serve`.
pub(crate) fn start_with(root: &Path, args: &[&str]) -> Server {
    let local = root.with_file_name("serve.sock");
    let server = launch(root, "127.0.0.1:0", &[&["--local", local.to_str().expect("utf-8")], args].concat());
    assert_eq!(server.local, local, "the server says where its local socket is");
    server
}

/// `lake serve` on `root` with Flight at `flight` (`HOST:PORT`), HTTP on a free port, and `args`;
/// returns once it says where it listens.
fn launch(root: &Path, flight: &str, args: &[&str]) -> Server {
    let mut child = lake_cmd(root)
        .args(["serve", "--flight", flight, "--http", "127.0.0.1:0", "--threads", "2"])
        .args(args)
        .env("LAKE_TOKENS", TOKEN)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start lake serve");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("the server says where it listens");
    let addr = |prefix: &str| line.split_whitespace().find_map(|w| w.strip_prefix(prefix)).unwrap_or_else(|| panic!("{line}")).to_string();
    let local = line.split_once(" local ").map(|(_, path)| std::path::PathBuf::from(path.trim())).unwrap_or_default();
    Server { flight: format!("http://{}", addr("grpc://")), http: addr("http://"), child, local }
}

/// Python (`client_python`) running `script` with `args` and lake's client on its path, its
/// stdin and stdout piped.
pub(crate) fn python_client(python: &Path, script: &str, args: &[&str]) -> Child {
    std::process::Command::new(python)
        .args(["-c", script])
        .args(args)
        .env("PYTHONPATH", Path::new(env!("CARGO_MANIFEST_DIR")).join("../clients/python"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("run python")
}

/// One HTTP/1.1 request; returns the status and the body (chunked bodies decoded).
pub(crate) fn http(addr: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> (u16, Vec<u8>) {
    let (status, _, body) = http_with_head(addr, method, path, headers, body);
    (status, body)
}

/// [`http`], with the response's head (status line and headers, lower-cased) too.
pub(crate) fn http_with_head(addr: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> (u16, String, Vec<u8>) {
    let r = lake_testkit::http_request(addr, method, path, headers, body);
    (r.status, r.head, r.body)
}

fn arrow_batches(body: &[u8]) -> Vec<RecordBatch> {
    StreamReader::try_new(std::io::Cursor::new(body.to_vec()), None).expect("an Arrow stream").map(|b| b.expect("batch")).collect()
}

/// A request the client sends as typed.
fn typed(request: &Value) -> lake_client::SampleRequest {
    lake_client::SampleRequest::from_json(request.to_string().as_bytes()).expect("valid")
}

/// The same request through the loader in-process.
pub(crate) async fn in_process(root: &Path, request: &Value) -> Vec<RecordBatch> {
    let lake = lake_store::Lake::open(root.to_str().expect("utf-8")).expect("lake");
    let service = lake_serve::Service::new(lake, Default::default()).expect("service");
    let (_, batches) = service.batches(&typed(request)).await.expect("batches");
    records(batches.try_collect().await.expect("all batches"))
}

/// A request's batches made with the loader's own API, the sampler built by hand from the
/// request's fields (one dataset, a preset, the sampling fields): what the service plans must
/// be exactly this.
async fn through_the_loader_api(root: &Path, request: &Value) -> Vec<RecordBatch> {
    use lake_loader::{Cursor, Eligible, Loader, LoaderDataset, LoaderOptions, Order, Preset, Sharding, Source, StreamRequest, Windows};
    let field = |key: &str, default: u64| request.get(key).and_then(Value::as_u64).unwrap_or(default);
    let lake = lake_store::Lake::open(root.to_str().expect("utf-8")).expect("lake");
    let ds = LoaderDataset::open(&lake, request["datasets"][0].as_str().expect("one dataset")).await.expect("open");
    let eligible = Eligible::new(ds.episodes.iter().map(|e| (e.first_row, e.len)), field("drop_n_first_frames", 0), 0);
    let order = std::sync::Arc::new(Order::new(field("seed", 0), vec![Source { eligible, weight: 1.0 }]).expect("order"));
    // A request's batch is the rank's: the global batch is world_size of them.
    let world = field("world_size", 1);
    let sharding = Sharding::new(field("batch_size", 32) * world, field("rank", 0), world, true).expect("sharding");
    let preset: Preset = request["preset"].as_str().expect("preset").parse().expect("a preset");
    let loader = std::sync::Arc::new(Loader::new(vec![ds], &Windows::Preset(preset), LoaderOptions::default()).expect("loader"));
    let stream = lake_loader::stream(
        loader,
        StreamRequest {
            order,
            sharding,
            start: Cursor { epoch: field("epoch", 0), step: field("start_step", 0) },
            limit: Some(field("limit_batches", 1)),
            stride: 1,
            prefetch: 1,
            lookahead: 0,
        },
    );
    stream.map(|b| b.expect("batch").batch).collect().await
}

/// Served batches as record batches.
fn records(batches: Vec<lake_loader::SampleBatch>) -> Vec<RecordBatch> {
    batches.iter().map(|b| b.to_record_batch().expect("a record batch")).collect()
}

pub(crate) async fn flight_client(server: &Server) -> FlightClient {
    let channel = tonic::transport::Channel::from_shared(server.flight.clone()).expect("url").connect().await.expect("connect");
    let inner = arrow_flight::flight_service_client::FlightServiceClient::new(channel).max_decoding_message_size(usize::MAX);
    let mut client = FlightClient::new_from_inner(inner);
    client.add_header("authorization", &format!("Bearer {TOKEN}")).expect("header");
    client
}

pub(crate) async fn over_flight(client: &mut FlightClient, request: &Value) -> Result<Vec<RecordBatch>, tonic::Status> {
    let info = client.get_flight_info(FlightDescriptor::new_cmd(request.to_string())).await.map_err(status)?;
    let ticket = info.endpoint[0].ticket.clone().expect("a ticket");
    let stream = client.do_get(ticket).await.map_err(status)?;
    stream.try_collect().await.map_err(status)
}

fn status(e: arrow_flight::error::FlightError) -> tonic::Status {
    match e {
        arrow_flight::error::FlightError::Tonic(s) => *s,
        other => tonic::Status::unknown(other.to_string()),
    }
}

fn same_rows(a: &[RecordBatch], b: &[RecordBatch], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: batch count");
    for (x, y) in a.iter().zip(b) {
        assert_eq!(x.num_rows(), y.num_rows(), "{what}: rows");
        assert_eq!(x.columns(), y.columns(), "{what}: values");
        let names = |b: &RecordBatch| b.schema().fields().iter().map(|f| f.name().clone()).collect::<Vec<_>>();
        assert_eq!(names(x), names(y), "{what}: columns");
    }
}

#[test]
fn flight_and_http_serve_the_loaders_batches_with_auth_and_precise_errors() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("lake");
    ingest_ok(&root, &testdata("v30-av1-small"), &[]);
    let server = start(&root);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let request = json!({"datasets": ["v30-av1-small"], "preset": "act", "batch_size": 8, "seed": 3, "limit_batches": 3});
    let expected = rt.block_on(in_process(&root, &request));
    assert_eq!(expected.len(), 3);
    // The service's batches are the loader's: the same order, shard and cursor.
    for r in [
        request.clone(),
        json!({"datasets": ["v30-av1-small"], "preset": "diffusion", "batch_size": 6, "seed": 9, "epoch": 2, "start_step": 29,
               "rank": 1, "world_size": 3, "drop_n_first_frames": 2, "limit_batches": 4}),
    ] {
        same_rows(&rt.block_on(in_process(&root, &r)), &rt.block_on(through_the_loader_api(&root, &r)), &format!("loader API: {r}"));
    }

    rt.block_on(async {
        let mut client = flight_client(&server).await;
        // Flight: the same batches, in the same order.
        let got = over_flight(&mut client, &request).await.expect("flight stream");
        same_rows(&got, &expected, "flight");

        // Two ranks of a global batch of 16, read at the same time (they plan ahead together, and
        // keep what one decodes for the other): each batch the rank's half of the world-size-1
        // batch, so the ranks are disjoint and together take the global batches.
        let global = json!({"datasets": ["v30-av1-small"], "preset": "act", "batch_size": 16, "seed": 3, "limit_batches": 12});
        let whole = in_process(&root, &global).await;
        let rank = |r: u64| {
            json!({"datasets": ["v30-av1-small"], "preset": "act", "batch_size": 8, "seed": 3, "limit_batches": 12, "rank": r, "world_size": 2})
        };
        let mut second = flight_client(&server).await;
        let (r0, r1) = (rank(0), rank(1));
        let (first, other) = futures::join!(over_flight(&mut client, &r0), over_flight(&mut second, &r1));
        for (r, got) in [first, other].into_iter().enumerate() {
            let half: Vec<RecordBatch> = whole.iter().map(|b| b.slice(8 * r, 8)).collect();
            same_rows(&got.expect("rank stream"), &half, &format!("rank {r} of 2"));
        }

        // Resume from step 2 replays the third batch.
        let resume = json!({"datasets": ["v30-av1-small"], "preset": "act", "batch_size": 8, "seed": 3, "start_step": 2, "limit_batches": 1});
        same_rows(&over_flight(&mut client, &resume).await.expect("resumed"), &expected[2..], "resume");

        // A mixture: each batch interleaves samples of two sources, frames included.
        let mixture = json!({"datasets": ["v30-av1-small=2", {"name": "v30-av1-small", "weight": 1}], "preset": "act", "batch_size": 8, "seed": 3, "limit_batches": 2});
        let want = in_process(&root, &mixture).await;
        same_rows(&over_flight(&mut client, &mixture).await.expect("mixture"), &want, "mixture");
        // Each sample of a mixture names the entry it came from, as LeRobot's MultiLeRobotDataset
        // does; a single dataset's batches have no such column.
        let sources: Vec<i64> =
            want.iter().flat_map(|b| b["dataset_index"].as_primitive::<arrow::datatypes::Int64Type>().values().to_vec()).collect();
        assert!(sources.contains(&0) && sources.contains(&1) && sources.iter().all(|s| (0..=1).contains(s)), "{sources:?}");
        assert_eq!(want[0].schema().fields().last().expect("a column").name(), "dataset_index");
        assert!(expected[0].column_by_name("dataset_index").is_none());

        // Every camera's frames at another size, from the dataset's frame table of that size
        // (written while the server runs).
        let run = crate::common::lake(&root, &["cache", "v30-av1-small", "--size", "32x24"]);
        assert_eq!(run.code, 0, "{run:#?}");
        let small = json!({"datasets": ["v30-av1-small"], "preset": "act", "batch_size": 8, "seed": 3, "limit_batches": 2, "frame_size": "32x24"});
        let want = in_process(&root, &small).await;
        let front = want[0].column_by_name("observation.images.front").expect("front").as_fixed_size_list().value_length();
        assert_eq!(front, 24 * 32 * 3);
        same_rows(&over_flight(&mut client, &small).await.expect("resized"), &want, "resized frames");

        // Video frames as YUV planes: the in-process batches over Flight, half the bytes.
        let planes = json!({"datasets": ["v30-av1-small"], "preset": "diffusion", "batch_size": 8, "seed": 3, "limit_batches": 2, "frame_format": "yuv420p"});
        let want = in_process(&root, &planes).await;
        let field = want[0].schema().field_with_name("observation.images.front").expect("front").clone();
        assert_eq!(field.metadata()["pixel_format"], "yuv420p");
        assert_eq!(want[0].column_by_name("observation.images.front").expect("front").as_fixed_size_list().value_length(), 2 * 480 * 640 * 3 / 2);
        same_rows(&over_flight(&mut client, &planes).await.expect("planes"), &want, "yuv planes");

        // Bad requests: each gets its code and says why.
        for (bad, code, says) in [
            (json!({"datasets": ["nope"]}), tonic::Code::NotFound, "nope"),
            (json!({"datasets": ["v30-av1-small"], "frame_size": "big"}), tonic::Code::InvalidArgument, "expected WIDTHxHEIGHT"),
            (json!({"datasets": ["v30-av1-small"], "frame_size": "16x16"}), tonic::Code::InvalidArgument, "no frame table of 16x16 frames"),
            (json!({"datasets": ["v30-av1-small"], "frame_format": "bgr24"}), tonic::Code::InvalidArgument, "unknown frame format `bgr24` (known: rgb24, yuv420p, packets)"),
            (json!({"datasets": ["v30-av1-small"], "frame_format": "yuv420p", "frame_size": "32x24"}), tonic::Code::InvalidArgument, "frames at 32x24 come from a frame table, which stores RGB"),
            (json!({"datasets": ["v30-av1-small"], "rank": 2, "world_size": 2}), tonic::Code::InvalidArgument, "outside a world"),
            (json!({"datasets": ["v30-av1-small"], "delta_timestamps": {"action": [0.01]}}), tonic::Code::InvalidArgument, "action"),
            (json!({"datasets": ["v30-av1-small"], "batch_sise": 3}), tonic::Code::InvalidArgument, "batch_sise"),
            (json!([]), tonic::Code::InvalidArgument, "it must be a JSON object"),
            // Numbers too large for any lake are refused, never wrapped.
            (json!({"datasets": ["v30-av1-small"], "batch_size": 4294967296u64, "world_size": 4294967296u64}), tonic::Code::InvalidArgument, "batch_size is 4294967296; it may be at most"),
            (json!({"datasets": ["v30-av1-small"], "world_size": 0}), tonic::Code::InvalidArgument, "`world_size`: 0 is too small: expected a whole number, 1 or more"),
            (json!({"datasets": ["v30-av1-small"], "epoch": u64::MAX}), tonic::Code::InvalidArgument, "epoch is"),
            (json!({"datasets": ["v30-av1-small"], "drop_n_first_frames": u64::MAX, "drop_n_last_frames": u64::MAX}), tonic::Code::InvalidArgument, "drop_n_first_frames is"),
            (json!({"datasets": ["v30-av1-small"], "start_step": u64::MAX}), tonic::Code::InvalidArgument, "past the epoch's last step"),
            (json!({"datasets": ["v30-av1-small"], "delta_timestamps": {"action": [1e300]}}), tonic::Code::InvalidArgument, "action: 1e300 s is more than 2^31 - 1 frames"),
            (json!({"datasets": ["v30-av1-small"], "preset": "bogus", "delta_timestamps": {"action": [0.0]}}), tonic::Code::InvalidArgument, "bogus"),
            (json!({"datasets": ["v30-av1-small=inf"]}), tonic::Code::InvalidArgument, "the weight inf is not a positive finite number"),
            (json!({"datasets": ["v30-av1-small"], "step_stride": 0}), tonic::Code::InvalidArgument, "`step_stride`: 0 is too small: expected a whole number, 1 or more"),
            (json!({"datasets": [{"name": "v30-av1-small"}]}), tonic::Code::InvalidArgument, "dataset `v30-av1-small`: `weight` is missing"),
            (json!({"datasets": [{"name": "v30-av1-small", "weight": 1, "foo": 3}]}), tonic::Code::InvalidArgument, "unknown field `foo`"),
            (json!({"datasets": ["v30-av1-small@1@2"]}), tonic::Code::InvalidArgument, "is not NAME or NAME@VERSION"),
            (json!({"datasets": ["v30-av1-small"], "batch_size": "4"}), tonic::Code::InvalidArgument, "`batch_size`: invalid type: string \"4\", expected a whole number"),
            (json!({"datasets": ["v30-av1-small"], "episodes": [0.5]}), tonic::Code::InvalidArgument, "`episodes[0]`: invalid type: floating point"),
            (json!({"datasets": [{"name": "v30-av1-small", "weight": -1}]}), tonic::Code::InvalidArgument, "dataset `v30-av1-small`: the weight -1 is not"),
            (json!({"datasets": ["v30-av1-small"], "drop_n_first_frames": 1000}), tonic::Code::InvalidArgument, "v30-av1-small@1: no step is eligible"),
            (json!({"datasets": ["v30-av1-small"], "start_step": 1_000_000_000}), tonic::Code::InvalidArgument, "past the epoch's last step"),
            (json!({"datasets": ["v30-av1-small"], "batch_size": 1 << 20}), tonic::Code::InvalidArgument, "larger than the 600 eligible steps"),
            (json!({"datasets": ["v30-av1-small"], "episodes": vec![0; 1 << 20]}), tonic::Code::InvalidArgument, "over the 2 MiB limit"),
            (json!({"datasets": vec!["v30-av1-small"; 257]}), tonic::Code::InvalidArgument, "names 257 datasets; a mixture may have at most 256"),
        ] {
            // Refused when planned: a plan never hands out a ticket its stream would refuse.
            let e = client.get_flight_info(FlightDescriptor::new_cmd(bad.to_string())).await.map_err(status).expect_err("refused");
            assert_eq!(e.code(), code, "{bad}: {e:?}");
            assert!(e.message().contains(says), "{bad}: {}", e.message());
        }
        // Bytes after the request's object are no part of any request.
        for bad in [r#"{"datasets": ["v30-av1-small"]}{"batch_size": 0}"#, r#"{"datasets": ["v30-av1-small"]} xyz"#] {
            let e = client.get_flight_info(FlightDescriptor::new_cmd(bad.to_string())).await.map_err(status).expect_err("refused");
            assert!(e.code() == tonic::Code::InvalidArgument && e.message().contains("more after the request's JSON object"), "{e:?}");
        }
        // Whole numbers written as floats, in the episode list too; a limited stream whose
        // epoch ends in a short batch still tells its rows up front (7 steps of 2 ranks of 40
        // from step 5 of the 8 an epoch of 600 has: 40, 40, 0 for rank 1 at the short step
        // (600 - 7 * 80 = 40 rows, all rank 0's), then 40 × 4 in the next epoch).
        let counted = json!({"datasets": ["v30-av1-small"], "episodes": [0.0, 1.0, 2.0, 3.0, 4.0, 5.0], "batch_size": 40.0,
            "world_size": 2, "rank": 1, "drop_last": false, "start_step": 5, "limit_batches": 7});
        let info = client.get_flight_info(FlightDescriptor::new_cmd(counted.to_string())).await.expect("planned");
        let rows: usize = over_flight(&mut client, &counted).await.expect("counted").iter().map(RecordBatch::num_rows).sum();
        assert_eq!((info.total_records, rows), (240, 240));
        let e = client.do_get(arrow_flight::Ticket::new(vec![b' '; 5 << 20])).await.map_err(status).expect_err("refused");
        assert!(e.code() == tonic::Code::InvalidArgument && e.message().contains("the ticket is over the 4 MiB limit"), "{e:?}");
        // A request just under the limit gets a ticket (larger: defaults and versions filled
        // in) that its stream redeems.
        let with = |n: usize| json!({"datasets": ["v30-av1-small"], "batch_size": 4, "limit_batches": 1, "episodes": vec![0; n]});
        let long = with(((2 << 20) - 100 - with(0).to_string().len()) / 2);
        assert!(((2 << 20) - 110..=2 << 20).contains(&long.to_string().len()));
        assert_eq!(over_flight(&mut client, &long).await.expect("a long request").len(), 1);
        // Weights only matter relative to each other, also near the largest float.
        let huge = json!({"datasets": [{"name": "v30-av1-small", "weight": 1e308}, {"name": "v30-av1-small", "weight": 1e308}],
            "batch_size": 4, "limit_batches": 1});
        let plain = json!({"datasets": [{"name": "v30-av1-small", "weight": 1}, {"name": "v30-av1-small", "weight": 1}],
            "batch_size": 4, "limit_batches": 1});
        same_rows(&over_flight(&mut client, &huge).await.expect("huge weights"), &over_flight(&mut client, &plain).await.expect("plain"), "weights");
        // The Rust client gets the same batches.
        let remote = lake_client::RemoteLoader::connect(&server.flight, Some(TOKEN.into())).await.expect("connect");
        let got: Vec<RecordBatch> = remote.stream(&typed(&request)).await.expect("stream").try_collect().await.expect("batches");
        same_rows(&got, &expected, "rust client");
        let refused = remote.stream(&lake_client::SampleRequest::new(["nope"])).await.err().expect("refused");
        assert!(refused.to_string().contains("nope") && refused.to_string().contains("NotFound"), "{refused}");

        // Local streams (shared memory) get the same batches, also when the trainer must give
        // each slot back before the next batch fits (one slot; two ranks read at once).
        let local = lake_client::LocalLoader::new(&server.local, Some(TOKEN.into()));
        // Three batches kept at once: three slots.
        let all = local.clone().with_slots(3);
        let got: Vec<RecordBatch> = all.stream(&typed(&request)).await.expect("local stream").try_collect().await.expect("batches");
        same_rows(&got, &expected, "local stream");
        // An epoch's short last batch, then full ones: the slots outgrow their segment, and
        // the stream moves to a larger one while the short batch is still held.
        let growing = json!({"datasets": ["v30-av1-small"], "preset": "act", "batch_size": 7, "seed": 3, "drop_last": false,
            "start_step": 85, "limit_batches": 3});
        let want = in_process(&root, &growing).await;
        assert_eq!(want.iter().map(RecordBatch::num_rows).collect::<Vec<_>>(), [5, 7, 7]);
        let got: Vec<RecordBatch> = all.stream(&typed(&growing)).await.expect("local stream").try_collect().await.expect("batches");
        same_rows(&got, &want, "local stream across segments");
        let one_slot = local.clone().with_slots(1);
        let read_one_by_one = |r: usize| {
            let (one_slot, request, whole) = (one_slot.clone(), rank(r as u64), &whole);
            async move {
                let mut batches = one_slot.stream(&typed(&request)).await.expect("local stream");
                let mut read = 0;
                // Each batch is checked and dropped (its slot goes back) before the next.
                while let Some(batch) = batches.next().await {
                    let batch = batch.unwrap_or_else(|e| panic!("local rank {r} of 2, one slot, after {read} batches: {e}"));
                    assert!(read < whole.len(), "local rank {r} of 2, one slot: a batch past the {} of the epoch", whole.len());
                    same_rows(&[batch], &[whole[read].slice(8 * r, 8)], &format!("local rank {r} of 2, one slot, batch {read}"));
                    read += 1;
                }
                read
            }
        };
        assert_eq!(futures::join!(read_one_by_one(0), read_one_by_one(1)), (12, 12));
        let refused = local.stream(&lake_client::SampleRequest::new(["nope"])).await.err().expect("refused");
        assert!(refused.to_string().contains("nope") && refused.to_string().contains("not_found"), "{refused}");
        let refused = local.clone().with_slots(1).stream(&typed(&json!({"datasets": ["v30-av1-small"], "rank": 2, "world_size": 2}))).await;
        assert!(refused.err().expect("refused").to_string().contains("outside a world"));
        let anonymous = lake_client::LocalLoader::new(&server.local, None).stream(&typed(&request)).await;
        assert!(anonymous.err().expect("needs a token").to_string().contains("unauthorized"));
        // A trainer holding a batch in its only slot while it waits for the next is told so.
        let logs = Captured::default();
        let subscriber = tracing_subscriber::fmt().with_writer(logs.clone()).with_ansi(false).finish();
        let stalled = {
            let _logging = tracing::subscriber::set_default(subscriber);
            // The server, waiting for the slot, says every second that it is there: the wait
            // outlasts the client's server timeout.
            let stalling = local
                .clone()
                .with_slots(1)
                .with_stall_warning(std::time::Duration::from_millis(200))
                .with_server_timeout(std::time::Duration::from_secs(3));
            let two = json!({"datasets": ["v30-av1-small"], "preset": "act", "batch_size": 8, "limit_batches": 2});
            let mut batches = stalling.stream(&typed(&two)).await.expect("local stream");
            let first = batches.next().await.expect("a batch").expect("batch");
            let waited = tokio::time::timeout(std::time::Duration::from_secs(4), batches.next()).await;
            assert!(waited.is_err(), "the second batch waits for the slot the first holds");
            drop(first);
            let second = batches.next().await.expect("a batch once the slot is free").expect("batch");
            assert_eq!(second.num_rows(), 8);
            logs.text()
        };
        assert!(stalled.contains("holds a batch in each of its 1 slots"), "{stalled}");

        // A request described over either transport: the batches' schema and the epoch shape.
        let described = local.describe(&typed(&request)).await.expect("describe");
        assert_eq!(described, remote.describe(&typed(&request)).await.expect("describe over Flight"));
        assert_eq!(described.schema, expected[0].schema());
        assert_eq!((described.epoch_len, described.steps_per_epoch), (600, 600 / 8));
        assert_eq!(described.datasets, json!(["v30-av1-small@1"]), "the plan pins the version read");
        let weighted = local.describe(&typed(&json!({"datasets": ["v30-av1-small=2", {"name": "v30-av1-small", "weight": 1}]}))).await.expect("weighted");
        assert_eq!(weighted.datasets, json!(["v30-av1-small@1=2", {"name": "v30-av1-small@1", "weight": 1.0}]));
        // `sources`: the datasets sampled, in the order a mixture's `dataset_index` counts them.
        assert_eq!((described.sources.as_slice(), weighted.sources.as_slice()), (&["v30-av1-small@1".to_string()][..], &["v30-av1-small@1".to_string(), "v30-av1-small@1".to_string()][..]));
        let refused = local.describe(&lake_client::SampleRequest::new(["no such!"])).await.expect_err("refused");
        assert!(refused.to_string().contains("no dataset or view `no such!`"), "{refused}");
        let refused = local.describe(&lake_client::SampleRequest::new(["nope"])).await.expect_err("refused");
        assert!(refused.to_string().contains("not_found"), "{refused}");

        // A server that stops answering (stopped here with SIGSTOP) ends a local stream with
        // `unavailable` once it has sent nothing, not even a keepalive, for the server timeout.
        let patient = local.clone().with_server_timeout(std::time::Duration::from_secs(2));
        let endless = json!({"datasets": ["v30-av1-small"], "preset": "act", "batch_size": 8});
        let mut batches = patient.stream(&typed(&endless)).await.expect("local stream");
        let first = batches.next().await.expect("a batch").expect("batch");
        let signal = |name: &str| {
            let sent = std::process::Command::new("kill").args([name, &server.child.id().to_string()]).status().expect("kill");
            assert!(sent.success());
        };
        let stopped = std::time::Instant::now();
        signal("-STOP");
        let ended = loop {
            match tokio::time::timeout(std::time::Duration::from_secs(30), batches.next()).await {
                Ok(Some(Ok(_))) => continue,
                other => break other,
            }
        };
        let waited = stopped.elapsed();
        signal("-CONT");
        let e = ended.expect("ended before 30 s").expect("an error, not an end").expect_err("an error");
        assert!(e.to_string().contains("sent nothing for 2.0 s") && matches!(e, lake_client::Error::Unavailable(_)), "{e}");
        // Counted from the last message heard, up to a keepalive interval before the stop.
        assert!(waited >= std::time::Duration::from_millis(900), "{waited:?}");
        drop(first);

        let flights: Vec<_> = client.list_flights(Vec::<u8>::new()).await.expect("list").try_collect().await.expect("flights");
        assert_eq!(flights.len(), 1);
        let listed = flights[0].clone().try_decode_schema().expect("a dataset's flight carries its schema");
        assert!(listed.field_with_name("observation.images.front").is_ok() && listed.field_with_name("task").is_ok(), "{listed:?}");
        // A listed flight is one epoch: read to its end, every step once.
        let ticket = flights[0].endpoint[0].ticket.clone().expect("a ticket");
        let epoch: Vec<RecordBatch> = client.do_get(ticket).await.expect("do_get").try_collect().await.expect("one epoch");
        let mut seen: Vec<i64> = epoch.iter().flat_map(|b| b["index"].as_primitive::<arrow::datatypes::Int64Type>().values().to_vec()).collect();
        seen.sort_unstable();
        assert_eq!((seen.len() as i64, flights[0].total_records), (600, 600));
        assert_eq!(seen, (0..600).collect::<Vec<i64>>(), "every step once");
        let actions: Vec<String> =
            client.list_actions().await.expect("actions").map_ok(|a| a.r#type).try_collect().await.expect("action types");
        assert_eq!(actions, ["lake.sampling_facts", "CreatePreparedStatement", "ClosePreparedStatement"], "only the actions served");
        // The facts a remote trainer builds its policy from, over Flight.
        let facts: Vec<_> = client
            .do_action(arrow_flight::Action::new("lake.sampling_facts", r#"{"datasets": ["v30-av1-small"]}"#))
            .await
            .expect("facts")
            .try_collect()
            .await
            .expect("one result");
        let facts: Value = serde_json::from_slice(&facts[0]).expect("json");
        assert_eq!(facts["features"]["observation.state"]["shape"], json!([6]), "{facts:#}");
        let refused = status(
            client.do_action(arrow_flight::Action::new("lake.sampling_facts", r#"{"datasets": ["nope"]}"#)).await.err().expect("refused"),
        );
        assert!(refused.code() == tonic::Code::NotFound && refused.message().contains("`nope`"), "{refused:?}");
        let unknown = status(client.do_action(arrow_flight::Action::new("Compact", "")).await.err().expect("no such action"));
        assert!(unknown.code() == tonic::Code::Unimplemented && unknown.message().contains("`Compact`"), "{unknown:?}");

        // Without the token: refused.
        let channel = tonic::transport::Channel::from_shared(server.flight.clone()).expect("url").connect().await.expect("connect");
        let mut anonymous = FlightClient::new(channel);
        let e = over_flight(&mut anonymous, &request).await.expect_err("needs a token");
        assert_eq!(e.code(), tonic::Code::Unauthenticated);
    });

    // HTTP: the same batches as an Arrow IPC stream.
    let auth = format!("Bearer {TOKEN}");
    let headers = [("Authorization", auth.as_str()), ("Content-Type", "application/json")];
    let (code, head, body) = http_with_head(&server.http, "POST", "/v1/sample", &headers, request.to_string().as_bytes());
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
    same_rows(&arrow_batches(&body), &expected, "http");
    // The plan in headers, as GetFlightInfo has it: 600 steps, 75 batches of 8, version pinned.
    for line in ["\r\nlake-epoch-len: 600\r\n", "\r\nlake-steps-per-epoch: 75\r\n", r#""datasets":["v30-av1-small@1"]"#] {
        assert!(head.contains(line), "{line:?} in {head}");
    }
    let (code, body) = http(&server.http, "POST", "/v1/sample", &headers, br#"{"datasets": ["nope"]}"#);
    assert_eq!(code, 404, "{}", String::from_utf8_lossy(&body));
    let (code, _) = http(&server.http, "POST", "/v1/sample", &headers, b"{not json");
    assert_eq!(code, 400);
    let (code, body) = http(&server.http, "POST", "/v1/sample", &headers, br#"{"datasets": ["#);
    let error = String::from_utf8_lossy(&body);
    assert!(code == 400 && error.contains("EOF while parsing") && !error.contains('?'), "no field to name where the text ends: {error}");
    // A path that is not UTF-8: a JSON error too.
    let (code, body) = http(&server.http, "GET", "/v1/datasets/%ff%fe", &[("Authorization", auth.as_str())], b"");
    let error = serde_json::from_slice::<Value>(&body).expect("a JSON error");
    assert!(code == 400 && error["error"].as_str().is_some_and(|e| e.contains("UTF-8")), "{error}");
    // A body declared over the limit is refused at once, unread, without `100 Continue`.
    let mut oversized = TcpStream::connect(&server.http).expect("connect");
    oversized.set_read_timeout(Some(std::time::Duration::from_secs(10))).expect("timeout");
    write!(
        oversized,
        "POST /v1/sample HTTP/1.1\r\nHost: lake\r\nAuthorization: {auth}\r\nContent-Type: application/json\r\nExpect: 100-continue\r\n\
         Content-Length: 999999999\r\n\r\n"
    )
    .expect("send the head");
    let mut answer = [0u8; 512];
    let n = oversized.read(&mut answer).expect("an answer before any body");
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.starts_with("HTTP/1.1 413") && answer.contains("2 MiB"), "{answer}");
    let (code, body) = http(&server.http, "POST", "/v1/sample", &headers, br#"{"datasets": ["v30-av1-small"], "episodes": []}"#);
    assert_eq!(code, 400, "an empty episode list selects nothing, not everything");
    assert!(String::from_utf8_lossy(&body).contains("selects no episode"), "{}", String::from_utf8_lossy(&body));
    let (code, _) = http(&server.http, "POST", "/v1/sample", &[("Authorization", "Bearer wrong")], request.to_string().as_bytes());
    assert_eq!(code, 401);
    let (code, _) = http(&server.http, "GET", "/v1/datasets", &[], b"");
    assert_eq!(code, 401, "tokens are required everywhere but /healthz");
    let lower = format!("bearer {TOKEN}");
    assert_eq!(
        http(&server.http, "GET", "/v1/datasets", &[("Authorization", lower.as_str())], b"").0,
        200,
        "the scheme is case-insensitive"
    );
    let errors = |kind: &str| {
        let (_, body) = http(&server.http, "GET", "/metrics", &[("Authorization", auth.as_str())], b"");
        metric(&String::from_utf8_lossy(&body), &format!("lake_errors_total{{kind=\"{kind}\"}}"))
    };
    let (not_found, bad) = (errors("not_found"), errors("bad_request"));
    let (code, body) = http(&server.http, "GET", "/v1/nothing", &[("Authorization", auth.as_str())], b"");
    assert_eq!((code, serde_json::from_slice::<Value>(&body).expect("a JSON error")["error"].is_string()), (404, true));
    let (code, body) = http(&server.http, "GET", "/v1/sample", &[("Authorization", auth.as_str())], b"");
    let error = serde_json::from_slice::<Value>(&body).expect("a JSON error");
    assert_eq!((code, &error["error"]), (405, &json!("/v1/sample does not take GET (see /v1/openapi.json)")), "{error}");
    assert_eq!(
        (errors("not_found"), errors("bad_request")),
        (not_found + 1.0, bad + 1.0),
        "an unknown path and a wrong method are counted"
    );
    assert_eq!(http(&server.http, "GET", "/healthz", &[], b"").0, 200);

    // SQL over HTTP answers as lake sql does; bad SQL is a 400 with DataFusion's message.
    let query = "SELECT episode_index, length FROM episodes ORDER BY episode_index";
    let (code, body) =
        http(&server.http, "POST", "/v1/sql", &[("Authorization", auth.as_str()), ("Accept", "application/json")], query.as_bytes());
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
    let rows: Vec<serde_json::Map<String, Value>> = serde_json::from_slice(&body).expect("json rows");
    assert_eq!(rows, sql_rows(&root, query));
    let (code, body) = http(
        &server.http,
        "POST",
        "/v1/sql",
        &[("Authorization", auth.as_str()), ("Accept", "application/json")],
        b"SELECT CAST(NULL AS INT) AS x, 1 AS y",
    );
    assert_eq!((code, serde_json::from_slice::<Value>(&body).expect("json")), (200, json!([{"x": null, "y": 1}])), "nulls are kept");
    // JSON rows stream batch by batch: many batches make one array.
    let (code, body) = http(
        &server.http,
        "POST",
        "/v1/sql",
        &[("Authorization", auth.as_str()), ("Accept", "application/json")],
        b"SELECT value FROM generate_series(1, 20000) ORDER BY value",
    );
    let rows = serde_json::from_slice::<Vec<Value>>(&body).expect("one JSON array");
    assert_eq!((code, rows.len(), &rows[19999]), (200, 20000, &json!({"value": 20000})));
    let (code, body) = http(
        &server.http,
        "POST",
        "/v1/sql",
        &[("Authorization", auth.as_str()), ("Accept", "application/json")],
        b"SELECT 1 AS x WHERE false",
    );
    assert_eq!((code, serde_json::from_slice::<Value>(&body).expect("json")), (200, json!([])), "no rows: an empty array");
    // CSV by the Accept header, as `lake sql --format csv` writes it (vectors as text); an Accept
    // that takes none of the answer's forms is a 406 naming them.
    let query = "SELECT episode_index, action FROM steps ORDER BY index LIMIT 5";
    let csv = [("Authorization", auth.as_str()), ("Accept", "text/html;q=0.9, text/csv")];
    let (code, body) = http(&server.http, "POST", "/v1/sql", &csv, query.as_bytes());
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
    let cli = lake(&root, &["sql", "--format", "csv", query]);
    assert_eq!((cli.code, String::from_utf8_lossy(&body).as_ref()), (0, cli.stdout.as_str()));
    let (code, body) = http(&server.http, "POST", "/v1/sql", &csv, b"SELECT 1 AS x WHERE false");
    assert_eq!((code, String::from_utf8_lossy(&body).as_ref()), (200, "x\n"), "an empty answer keeps its header row");
    let refused = [("Authorization", auth.as_str()), ("Accept", "application/xml, application/json;q=0")];
    let (code, body) = http(&server.http, "POST", "/v1/sql", &refused, query.as_bytes());
    let error = serde_json::from_slice::<Value>(&body).expect("a JSON error");
    assert_eq!(code, 406, "{error}");
    assert!(error["error"].as_str().is_some_and(|e| e.contains("text/csv") && e.contains("application/xml")), "{error}");
    let (code, _) = http(&server.http, "POST", "/v1/sample", &[refused[0], ("Accept", "text/csv")], request.to_string().as_bytes());
    assert_eq!(code, 406, "samples are Arrow streams only");
    let form = [refused[0], ("Content-Type", "application/x-www-form-urlencoded")];
    let (code, body) = http(&server.http, "POST", "/v1/sample", &form, request.to_string().as_bytes());
    assert_eq!(code, 415, "{}", String::from_utf8_lossy(&body));
    assert!(String::from_utf8_lossy(&body).contains("Content-Type: application/json"), "{}", String::from_utf8_lossy(&body));
    let anything = [("Authorization", auth.as_str()), ("Accept", "application/*;q=0.5, */*;q=0.1")];
    let (code, body) = http(&server.http, "POST", "/v1/sql", &anything, query.as_bytes());
    assert_eq!((code, arrow_batches(&body).iter().map(RecordBatch::num_rows).sum::<usize>()), (200, 5), "a wildcard gets Arrow");
    let (code, body) = http(&server.http, "POST", "/v1/sql", &[("Authorization", auth.as_str())], b"SELEC 1");
    assert_eq!(code, 400);
    assert!(String::from_utf8_lossy(&body).contains("Line: 1"), "{}", String::from_utf8_lossy(&body));
    // An error of the running query is still a 400 when it comes with the first batch.
    let (code, body) =
        http(&server.http, "POST", "/v1/sql", &[("Authorization", auth.as_str())], b"SELECT 1 / (episode_index - 3) FROM steps");
    assert_eq!(code, 400, "{}", String::from_utf8_lossy(&body));
    assert!(String::from_utf8_lossy(&body).contains("Divide by zero"), "{}", String::from_utf8_lossy(&body));

    // Datasets, OpenAPI and metrics.
    let (code, body) = http(&server.http, "GET", "/v1/datasets/nope", &[("Authorization", auth.as_str())], b"");
    let message = String::from_utf8_lossy(&body);
    assert!(code == 404 && message.contains("no dataset or view `nope`") && !message.contains(root.to_str().expect("utf-8")), "{message}");
    let (code, body) = http(&server.http, "GET", "/v1/datasets/v30-av1-small", &[("Authorization", auth.as_str())], b"");
    assert_eq!(code, 200);
    let info: Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(info["episodes"].as_array().map(Vec::len), Some(6));
    assert_eq!(info["frame_tables"][0]["size"], "32x24", "the frame table sizes a request may ask for: {info:#}");
    assert_eq!(info["frame_tables"][0]["frames"], 1200);
    // What a trainer on another machine builds its policy from, read by the server.
    let facts_request = br#"{"datasets": ["v30-av1-small"], "preset": "act"}"#;
    let (code, body) = http(&server.http, "POST", "/v1/facts", &[("Authorization", auth.as_str())], facts_request);
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
    let facts: Value = serde_json::from_slice(&body).expect("json");
    assert_eq!((facts["fps"].as_f64(), &facts["datasets"]), (Some(30.0), &json!(["v30-av1-small@1"])), "{facts:#}");
    assert_eq!(facts["features"]["action"]["shape"], json!([6]));
    assert_eq!(facts["stats"]["action"]["mean"].as_array().map(Vec::len), Some(6), "{facts:#}");
    let (code, _) = http(&server.http, "POST", "/v1/facts", &[], facts_request);
    assert_eq!(code, 401, "the facts are behind the token too");
    // A request its stream would refuse for its windows is refused for its facts too.
    let typo = br#"{"datasets": ["v30-av1-small"], "preset": "actt"}"#;
    let (code, body) = http(&server.http, "POST", "/v1/facts", &[("Authorization", auth.as_str())], typo);
    assert_eq!(code, 400, "{}", String::from_utf8_lossy(&body));
    assert!(String::from_utf8_lossy(&body).contains("unknown preset `actt`"), "{}", String::from_utf8_lossy(&body));
    let (code, body) = http(&server.http, "GET", "/v1/openapi.json", &[("Authorization", auth.as_str())], b"");
    assert_eq!(code, 200);
    let document: Value = serde_json::from_slice(&body).expect("json");
    assert!(document["paths"]["/v1/sample"].is_object());
    // Every operation that reads the lake may find its object store unreachable: 503.
    let unavailable = |path: &str, method: &str| document["paths"][path][method]["responses"]["503"].clone();
    let sql = unavailable("/v1/sql", "post");
    assert!(sql["description"].as_str().is_some_and(|d| d.contains("as many SQL queries") && d.contains("object store")), "{sql}");
    let listed = unavailable("/v1/datasets", "get");
    assert!(
        listed["description"].as_str().is_some_and(|d| d.contains("object store")) && listed["headers"]["Retry-After"].is_object(),
        "{listed}"
    );
    assert!(unavailable("/v1/openapi.json", "get").is_null());
    let (_, body) = http(&server.http, "GET", "/metrics", &[("Authorization", auth.as_str())], b"");
    let metrics = String::from_utf8_lossy(&body);
    let batches: f64 = metrics.lines().find_map(|l| l.strip_prefix("lake_batches_total ")).expect("counter").parse().expect("number");
    assert!(batches >= 34.0, "{metrics}");
    assert!(metric(&metrics, "lake_frame_cache_ahead_hits_total") > 0.0, "frames decoded ahead were shown: {metrics}");
    assert_eq!(metric(&metrics, "lake_frame_cache_ahead_bytes"), 0.0, "no stream is open: {metrics}");
    assert!(metrics.contains("lake_errors_total{kind=\"unauthorized\"}"), "{metrics}");
    assert!(metric(&metrics, "lake_errors_total{kind=\"sql\"}") >= 2.0, "bad SQL is counted: {metrics}");
    assert!(metric(&metrics, "lake_errors_total{kind=\"not_found\"}") >= 1.0, "unknown datasets are counted: {metrics}");

    // A new version ingested under the same name (another recording) while the server runs: new
    // requests read it; a ticket planned before reads the version it was planned on.
    rt.block_on(async {
        let mut client = flight_client(&server).await;
        let plan = |info: &arrow_flight::FlightInfo| serde_json::from_slice::<Value>(&info.app_metadata).expect("plan json");
        let before = client.get_flight_info(FlightDescriptor::new_cmd(request.to_string())).await.expect("info");
        assert_eq!(plan(&before)["datasets"], json!(["v30-av1-small@1"]));
        assert_eq!(before.total_records, 3 * 8, "3 whole batches of 8");
        ingest_ok(&root, &testdata("v30-h264-multifile"), &["--name", "v30-av1-small"]);
        let after = client.get_flight_info(FlightDescriptor::new_cmd(request.to_string())).await.expect("info");
        assert_eq!(plan(&after)["datasets"], json!(["v30-av1-small@2"]));
        assert_ne!(plan(&after)["epoch_len"], plan(&before)["epoch_len"]);
        // Its cameras once each, however many files hold them.
        let auth = format!("Bearer {TOKEN}");
        let (code, body) = http(&server.http, "GET", "/v1/datasets/v30-av1-small@2", &[("Authorization", auth.as_str())], b"");
        let shown: Value = serde_json::from_slice(&body).expect("json");
        let cameras: Vec<(&str, u64)> = shown["cameras"]
            .as_array()
            .expect("cameras")
            .iter()
            .map(|c| (c["camera"].as_str().expect("name"), c["files"].as_u64().expect("files")))
            .collect();
        assert_eq!(code, 200);
        assert_eq!(
            cameras,
            [("observation.images.front", 3), ("observation.images.wrist", 2), ("observation.images.side", 1)],
            "{shown:#}"
        );
        let newer = over_flight(&mut client, &request).await.expect("the new version");
        same_rows(&newer, &in_process(&root, &request).await, "the new version");
        let ticket = before.endpoint[0].ticket.clone().expect("a ticket");
        let planned: Vec<RecordBatch> = client.do_get(ticket).await.expect("do_get").try_collect().await.expect("batches");
        same_rows(&planned, &expected, "a ticket planned before the new version");

        // So does a view replaced by another selection while the server runs.
        let view = json!({"datasets": ["early"], "preset": "act", "batch_size": 8, "seed": 5, "limit_batches": 3});
        let create = |query: &str, extra: &[&str]| {
            let run = lake(&root, &[&["view", "create", "early", query], extra].concat());
            assert_eq!(run.code, 0, "{run:#?}");
        };
        create("SELECT dataset, episode_index FROM episodes WHERE episode_index < 2", &[]);
        let before = client.get_flight_info(FlightDescriptor::new_cmd(view.to_string())).await.expect("info");
        assert_eq!(plan(&before)["datasets"], json!(["early@1"]));
        let first = in_process(&root, &view).await;
        create("SELECT dataset, episode_index FROM episodes WHERE episode_index >= 2", &["--replace"]);
        let after = client.get_flight_info(FlightDescriptor::new_cmd(view.to_string())).await.expect("info");
        assert_eq!(plan(&after)["datasets"], json!(["early@2"]));
        let auth = format!("Bearer {TOKEN}");
        let (code, body) = http(&server.http, "GET", "/v1/datasets", &[("Authorization", auth.as_str())], b"");
        let listed: Value = serde_json::from_slice(&body).expect("json");
        assert_eq!((code, &listed["views"][0]["name"], &listed["views"][0]["version"]), (200, &json!("early"), &json!(2)), "{listed}");
        let (code, body) = http(&server.http, "GET", "/v1/datasets/early@1", &[("Authorization", auth.as_str())], b"");
        let shown: Value = serde_json::from_slice(&body).expect("json");
        assert_eq!((code, &shown["kind"], &shown["version"]), (200, &json!("view"), &json!(1)), "{shown}");
        let replaced = in_process(&root, &view).await;
        assert_ne!(episodes_of(&replaced), episodes_of(&first), "the replaced view draws other episodes");
        same_rows(&over_flight(&mut client, &view).await.expect("the new selection"), &replaced, "the replaced view");
        let ticket = before.endpoint[0].ticket.clone().expect("a ticket");
        let planned: Vec<RecordBatch> = client.do_get(ticket).await.expect("do_get").try_collect().await.expect("batches");
        same_rows(&planned, &first, "a ticket planned before the view was replaced");
        assert!(episodes_of(&planned).iter().all(|e| *e < 2), "{:?}", episodes_of(&planned));
    });

    // Files of the lake lost under a running server: a query reading them is the server's
    // failure (500, counted as internal), told without the lake's paths; the log has them.
    for version in std::fs::read_dir(root.join("datasets/v30-av1-small")).expect("versions") {
        for file in std::fs::read_dir(version.expect("entry").path().join("steps.lance/data")).expect("data files") {
            std::fs::remove_file(file.expect("entry").path()).expect("remove");
        }
    }
    let (_, before) = http(&server.http, "GET", "/metrics", &[("Authorization", auth.as_str())], b"");
    let (code, body) = http(&server.http, "POST", "/v1/sql", &[("Authorization", auth.as_str())], b"SELECT sum(index) FROM steps");
    let message = String::from_utf8_lossy(&body);
    assert_eq!(code, 500, "{message}");
    assert!(message.contains("reading the lake's files failed") && !message.contains(".lance") && !message.contains(".rs:"), "{message}");
    let (_, after) = http(&server.http, "GET", "/metrics", &[("Authorization", auth.as_str())], b"");
    let count = |text: &[u8], kind: &str| metric(&String::from_utf8_lossy(text), &format!("lake_errors_total{{kind=\"{kind}\"}}"));
    assert_eq!(count(&after, "internal") - count(&before, "internal"), 1.0);
    assert_eq!(count(&after, "sql"), count(&before, "sql"), "not the query's fault");
}

/// The `episode_index` of every row of `batches`.
fn episodes_of(batches: &[RecordBatch]) -> Vec<i64> {
    int64s(batches, "episode_index")
}

/// The values of the int64 column `name` of every row of `batches`.
fn int64s(batches: &[RecordBatch], name: &str) -> Vec<i64> {
    let column = |b: &RecordBatch| b.column_by_name(name).expect(name).as_primitive::<arrow::datatypes::Int64Type>().values().to_vec();
    batches.iter().flat_map(column).collect()
}

#[test]
fn a_stride_shares_a_ranks_steps_lake_rm_and_sigterm_end_streams_with_their_reason() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("lake");
    ingest_ok(&root, &testdata("v30-av1-small"), &[]);
    // A token file without tokens is refused, not read as "no authentication".
    let empty = tmp.path().join("tokens");
    std::fs::write(&empty, "# tokens\n\n").expect("write");
    let run = lake(&root, &["serve", "--http", "127.0.0.1:0", "--flight", "127.0.0.1:0", "--token-file", empty.to_str().expect("utf-8")]);
    assert!(run.code != 0 && run.stderr.contains("hold no token"), "{run:#?}");
    // Nor is a token with a comment after it read as one long token.
    std::fs::write(&empty, "first\nsecond # the CI runner\n").expect("write");
    let run = lake(&root, &["serve", "--http", "127.0.0.1:0", "--flight", "127.0.0.1:0", "--token-file", empty.to_str().expect("utf-8")]);
    assert!(run.code != 0 && run.stderr.contains("token 2") && run.stderr.contains("whitespace"), "{run:#?}");
    // Without tokens on an address others can reach: a warning naming the port it bound.
    let mut open = lake_cmd(&root)
        .args(["serve", "--flight", "0.0.0.0:0", "--http", "127.0.0.1:0"])
        .env_remove("LAKE_TOKENS")
        .env_remove("LAKE_TOKEN_FILE")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start lake serve");
    let mut listening = String::new();
    BufReader::new(open.stdout.take().expect("stdout")).read_line(&mut listening).expect("the server says where it listens");
    // (Written before that line; read once the server is gone, so that it cannot hang.)
    open.kill().expect("kill");
    open.wait().expect("wait");
    let warning = BufReader::new(open.stderr.take().expect("stderr")).lines().map_while(Result::ok).find(|l| l.contains("without tokens"));
    let port = listening.split_whitespace().find_map(|w| w.strip_prefix("grpc://")).and_then(|a| a.rsplit_once(':')).expect("address").1;
    assert_ne!(port, "0", "{listening}");
    let warning = warning.unwrap_or_else(|| panic!("no warning for serving on 0.0.0.0 without tokens ({listening})"));
    assert!(warning.contains(&format!("serving on 0.0.0.0:{port} without tokens")), "{warning}");
    // Settings come from `LAKE_*` variables too (an empty one unset), and a bad one is named.
    let out = lake_cmd(&root)
        .args(["serve", "--http", "127.0.0.1:0", "--flight", "127.0.0.1:0"])
        .env("LAKE_TOKEN_FILE", &empty)
        .env("LAKE_SERVE_CACHE_MB", "") // an empty variable is unset
        .output()
        .expect("run lake");
    assert!(out.status.code() == Some(2) && String::from_utf8_lossy(&out.stderr).contains("token 2"), "{out:#?}");
    // Sizes and times past what any server needs are refused, not wrapped or overflowed later.
    // Below the least, or not whole: one message.
    let year = "not a whole number of seconds from 1 to 31536000 (a year)";
    for (flag, value, says) in [
        ("--memory-mb", "17592186044416", "not a whole number of MiB from 1 to 16777216 (16 TiB)"),
        ("--sql-timeout", "9223372036854775807", year),
        ("--request-wait", "0", year),
        ("--request-wait", "0.5", year),
    ] {
        let run = lake(&root, &["serve", "--http", "127.0.0.1:0", "--flight", "127.0.0.1:0", flag, value]);
        assert!(run.code == 2 && run.stderr.contains(says), "{run:#?}");
    }
    let out = lake_cmd(&root).args(["serve", "--http", "127.0.0.1:0"]).env("LAKE_SERVE_MEMORY_MB", "4 GB").output().expect("run lake");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.code() == Some(2)
            && stderr.contains("'4 GB' for '--memory-mb")
            && stderr.contains("environment variable LAKE_SERVE_MEMORY_MB"),
        "{out:#?}"
    );

    // The drain bound gives the Flight reader below time to take the batches sent before
    // SIGTERM and the status after them, also on a loaded machine, before the stalled HTTP
    // client is cut.
    ingest_ok(&root, &testdata("v30-images-tiny"), &["--name", "doomed"]);
    let view = lake(&root, &["view", "create", "over-doomed", "SELECT dataset, episode_index FROM episodes WHERE dataset = 'doomed'"]);
    assert_eq!(view.code, 0, "{view:#?}");
    let mut server = start_with(&root, &["--shutdown-wait", "20", "--request-wait", "2"]);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let mut client = flight_client(&server).await;
        // Two readers of one rank (a DataLoader's workers) taking turns: every other step each.
        let every =
            json!({"datasets": ["v30-av1-small"], "preset": "act", "batch_size": 4, "seed": 9, "start_step": 146, "limit_batches": 6});
        let want = in_process(&root, &every).await;
        let turn = |first: u64| {
            let mut r = every.clone();
            (r["start_step"], r["step_stride"], r["limit_batches"]) = ((146 + first).into(), 2.into(), 3.into());
            r
        };
        let (even, odd) = (over_flight(&mut client, &turn(0)).await.expect("even"), over_flight(&mut client, &turn(1)).await.expect("odd"));
        let taking_turns: Vec<RecordBatch> = even.into_iter().zip(odd).flat_map(|(a, b)| [a, b]).collect();
        // Steps 146..152 cross the end of the epoch (600 / 4 = 150 steps) into the next.
        same_rows(&taking_turns, &want, "two readers taking turns");

        // A client that stalls while sending its body is answered 408 after the request wait;
        // one that sends nothing is cut.
        let mut stalling = TcpStream::connect(&server.http).expect("connect");
        let mut silent = TcpStream::connect(&server.http).expect("connect");
        // So is a Flight client that connects and says nothing, while a Flight client that
        // speaks (the stream below) is served; and on either port a client that begins HTTP/2
        // (one byte of it, or the whole preface) and does not finish the handshake.
        let flight_addr = server.flight.trim_start_matches("http://");
        let mut unopened = Vec::new();
        for (addr, opening) in [(server.http.as_str(), &b"P"[..]), (&server.http, PREFACE), (flight_addr, b""), (flight_addr, b"P"), (flight_addr, PREFACE)] {
            let mut socket = TcpStream::connect(addr).expect("connect");
            socket.write_all(opening).expect("send");
            unopened.push((socket, addr, String::from_utf8_lossy(opening).into_owned()));
        }
        for socket in [&stalling, &silent].into_iter().chain(unopened.iter().map(|u| &u.0)) {
            socket.set_read_timeout(Some(std::time::Duration::from_secs(30))).expect("timeout");
        }
        write!(
            stalling,
            "POST /v1/sample HTTP/1.1\r\nHost: lake\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nContent-Length: \
             100\r\n\r\n{{\"datasets\""
        )
        .expect("send a part");
        let mut answer = Vec::new();
        let _ = stalling.read_to_end(&mut answer);
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 408") && answer.contains("the request body did not arrive within 2 s"), "{answer}");
        assert_eq!(silent.read(&mut [0u8; 16]).expect("an end, not a timeout"), 0, "a client that sends nothing is cut");
        for (mut socket, addr, opening) in unopened {
            // (An HTTP/2 server may send its SETTINGS first.)
            let ended = socket.read_to_end(&mut Vec::new());
            assert!(
                ended.as_ref().map_or_else(|e| e.kind() == std::io::ErrorKind::ConnectionReset, |_| true),
                "a client of {addr} that sent {opening:?} and stopped is cut: {ended:?}"
            );
        }
        // `lake rm` of a dataset a stream reads ends that stream with NOT_FOUND and the reason
        // (not a failure to read files), refuses new requests for it, and leaves the rest served.
        let doomed = json!({"datasets": ["doomed"], "preset": "act", "batch_size": 2, "seed": 1});
        let info = client.get_flight_info(FlightDescriptor::new_cmd(doomed.to_string())).await.expect("info");
        let mut reading = client.do_get(info.endpoint[0].ticket.clone().expect("ticket")).await.expect("do_get");
        reading.next().await.expect("a batch").expect("batch");
        let run = lake(&root, &["rm", "doomed", "--force"]);
        assert_eq!(run.code, 0, "{run:#?}");
        let ended = loop {
            match tokio::time::timeout(std::time::Duration::from_secs(30), reading.next()).await.expect("the stream ends") {
                Some(Ok(_)) => continue,
                Some(Err(e)) => break status(e),
                None => panic!("the stream ended as if it were complete"),
            }
        };
        assert_eq!(ended.code(), tonic::Code::NotFound, "{ended:?}");
        assert!(
            ended.message().contains("dataset `doomed@1` was removed from the lake while this stream read it: `doomed` was removed with `lake rm` at "),
            "{ended:?}"
        );
        let again = over_flight(&mut client, &doomed).await.expect_err("removed");
        assert!(again.code() == tonic::Code::NotFound && again.message().contains("`doomed` was removed with `lake rm`"), "{again:?}");
        let (code, body) = http(&server.http, "POST", "/v1/sample", &[("Authorization", &format!("Bearer {TOKEN}"))], doomed.to_string().as_bytes());
        assert!(code == 404 && String::from_utf8_lossy(&body).contains("`doomed` was removed with `lake rm`"), "{code} {body:?}");
        // Counted as what is not found, not as a stream that failed.
        let (_, body) = http(&server.http, "GET", "/metrics", &[("Authorization", &format!("Bearer {TOKEN}"))], b"");
        let metrics = String::from_utf8_lossy(&body);
        assert!(
            metric(&metrics, "lake_errors_total{kind=\"stream\"}") == 0.0 && metric(&metrics, "lake_errors_total{kind=\"not_found\"}") >= 3.0,
            "{metrics}"
        );
        // A view over it shows the removal of what it selects.
        let (code, body) = http(&server.http, "GET", "/v1/datasets/over-doomed", &[("Authorization", &format!("Bearer {TOKEN}"))], b"");
        let shown: Value = serde_json::from_slice(&body).expect("json");
        assert!(code == 200 && shown["selects"][0]["removed"]["through_version"] == 1, "{code} {shown}");

        // An endless stream; SIGTERM ends it after the batch in flight, with UNAVAILABLE, and
        // the server drains and exits.
        let endless = json!({"datasets": ["v30-av1-small"], "preset": "act", "batch_size": 4, "seed": 9});
        let info = client.get_flight_info(FlightDescriptor::new_cmd(endless.to_string())).await.expect("info");
        let mut stream = client.do_get(info.endpoint[0].ticket.clone().expect("ticket")).await.expect("do_get");
        stream.next().await.expect("a batch").expect("batch");
        // And an HTTP client that stopped reading an endless stream: the shutdown does not
        // wait for it past its bound.
        let mut stalled = TcpStream::connect(&server.http).expect("connect");
        let body = json!({"datasets": ["v30-av1-small"], "preset": "act", "batch_size": 32}).to_string();
        write!(
            stalled,
            "POST /v1/sample HTTP/1.1\r\nHost: lake\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .expect("send");
        let mut first = vec![0u8; 4 << 20];
        stalled.read_exact(&mut first).expect("the first batch arrives");
        // And one that reads: its stream breaks off after a whole batch.
        let reading = std::thread::spawn({
            let addr = server.http.clone();
            move || {
                let mut http = TcpStream::connect(&addr).expect("connect");
                let body = json!({"datasets": ["v30-av1-small"], "preset": "act", "batch_size": 4, "seed": 3}).to_string();
                write!(
                    http,
                    "POST /v1/sample HTTP/1.1\r\nHost: lake\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nContent-Length: \
                     {}\r\n\r\n{body}",
                    body.len()
                )
                .expect("send");
                // Slower than the server sends, so that a batch is on its way at the signal.
                let (mut raw, mut buf) = (Vec::new(), vec![0u8; 256 << 10]);
                while let Ok(n @ 1..) = http.read(&mut buf) {
                    raw.extend_from_slice(&buf[..n]);
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                raw
            }
        });
        // And a SQL query still running: stopped, and answered 503 "shutting down".
        let query = std::thread::spawn({
            let addr = server.http.clone();
            move || {
                let q = "SELECT count(*) FROM generate_series(1, 100000) a CROSS JOIN generate_series(1, 100000) b";
                http(&addr, "POST", "/v1/sql", &[("Authorization", &format!("Bearer {TOKEN}"))], q.as_bytes())
            }
        });
        tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
        let kill = std::process::Command::new("kill").args(["-TERM", &server.child.id().to_string()]).status().expect("kill");
        assert!(kill.success());
        let ended = loop {
            match tokio::time::timeout(std::time::Duration::from_secs(20), stream.next()).await.expect("the stream ends") {
                Some(Ok(_)) => continue,
                Some(Err(e)) => break status(e),
                None => panic!("the stream ended as if it were complete"),
            }
        };
        assert_eq!(ended.code(), tonic::Code::Unavailable, "{ended:?}");
        assert!(ended.message().contains("shutting down"), "{ended:?}");
        let (code, body) = query.join().expect("the query");
        assert!(code == 503 && String::from_utf8_lossy(&body).contains("shutting down"), "{code} {}", String::from_utf8_lossy(&body));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while server.child.try_wait().expect("wait").is_none() {
            assert!(std::time::Instant::now() < deadline, "the server still runs 60 s after SIGTERM");
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        drop(stalled);
        let raw = reading.join().expect("the reading client");
        let start = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("a response head") + 4;
        assert!(String::from_utf8_lossy(&raw[..start]).to_lowercase().contains("transfer-encoding: chunked"));
        let (body, trailers) = lake_testkit::dechunk(&raw[start..]);
        assert!(trailers.is_none(), "a stream cut by the shutdown does not end as if complete");
        let batches: Vec<_> = StreamReader::try_new(std::io::Cursor::new(body), None).expect("an Arrow stream").collect();
        let broken: Vec<String> = batches.iter().filter_map(|b| b.as_ref().err().map(ToString::to_string)).collect();
        assert!(!batches.is_empty() && broken.is_empty(), "whole batches up to the break: {} read, {broken:?}", batches.len());
    });
    let exited = server.child.wait().expect("the server exits");
    assert!(exited.success(), "{exited:?}");
    assert!(!server.local.exists(), "the local socket is removed");
}

/// A shutdown refuses at once the streams still waiting for room to start (503 / `UNAVAILABLE`,
/// "shutting down"), instead of holding them until the drain bound and dropping them unanswered.
#[test]
fn a_shutdown_refuses_the_streams_waiting_to_start() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("lake");
    ingest_ok(&root, &testdata("v30-av1-small"), &[]);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let auth = format!("Bearer {TOKEN}");
    for attempt in 0.. {
        let mut server = start_with(&root, &["--memory-mb", "100", "--sql-memory-mb", "1", "--shutdown-wait", "3"]);
        // A stream that takes the whole budget, and is not read on.
        let mut open = rt.block_on(async {
            let mut client = flight_client(&server).await;
            let ticket = arrow_flight::Ticket::new(json!({"datasets": ["v30-av1-small"], "preset": "act"}).to_string());
            let mut stream = client.do_get(ticket).await.expect("do_get");
            stream.next().await.expect("a batch").expect("batch");
            stream
        });
        let waiting = std::thread::spawn({
            let (addr, auth) = (server.http.clone(), auth.clone());
            move || {
                let body = json!({"datasets": ["v30-av1-small"], "preset": "act", "seed": 1}).to_string();
                http(
                    &addr,
                    "POST",
                    "/v1/sample",
                    &[("Authorization", auth.as_str()), ("Content-Type", "application/json")],
                    body.as_bytes(),
                )
            }
        });
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            let (_, text) = http(&server.http, "GET", "/metrics", &[("Authorization", auth.as_str())], b"");
            if lake_testkit::prometheus_values(&String::from_utf8_lossy(&text)).get("lake_streams_waiting_to_start") == Some(&1.0) {
                break;
            }
            assert!(std::time::Instant::now() < deadline && !waiting.is_finished(), "the second stream waits for room");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let kill = std::process::Command::new("kill").args(["-TERM", &server.child.id().to_string()]).status().expect("kill");
        assert!(kill.success());
        let (code, body) = match waiting.join() {
            Ok(answer) => answer,
            // On a loaded host the open stream's client can be idle long enough before the SIGTERM
            // that its lent room is taken back and the waiting stream starts (then cut by the
            // shutdown, which other tests cover): the scenario is run again.
            Err(_) if attempt < 2 => {
                drop(open);
                let _ = server.child.wait();
                continue;
            }
            Err(panic) => std::panic::resume_unwind(panic),
        };
        let error: Value = serde_json::from_slice(&body).expect("a JSON error");
        assert_eq!(code, 503, "{error}");
        assert!(error["error"].as_str().is_some_and(|e| e.contains("shutting down")), "{error}");
        let ended = rt.block_on(async {
            loop {
                match tokio::time::timeout(std::time::Duration::from_secs(20), open.next()).await.expect("the stream ends") {
                    Some(Ok(_)) => continue,
                    Some(Err(e)) => break status(e),
                    None => panic!("the stream ended as if it were complete"),
                }
            }
        });
        assert_eq!(ended.code(), tonic::Code::Unavailable, "{ended:?}");
        assert!(server.child.wait().expect("the server exits").success());
        break;
    }
}

/// A gauge or counter from Prometheus text.
pub(crate) fn metric(text: &str, name: &str) -> f64 {
    text.lines().find_map(|l| l.strip_prefix(&format!("{name} "))).unwrap_or_else(|| panic!("no {name}: {text}")).parse().expect("number")
}

#[test]
fn streams_share_the_memory_budget_without_stalling_and_oversized_batches_are_refused() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("lake");
    ingest_ok(&root, &testdata("v30-av1-small"), &[]);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let request = |seed: u64, batch: u64| {
            let r = json!({"datasets": ["v30-av1-small"], "preset": "act", "batch_size": batch, "seed": seed, "limit_batches": 4});
            lake_client::SampleRequest::from_json(r.to_string().as_bytes()).expect("valid")
        };
        let lake = lake_store::Lake::open(root.to_str().expect("utf-8")).expect("lake");
        let probe = lake_serve::Service::new(lake.clone(), Default::default()).expect("service");
        let schema = probe.describe(&request(0, 4), lake_serve::Footprint::ENCODED).await.expect("plan").schema;
        let batch = lake_serve::batch_bytes(&schema, 4);
        // Room for three streams (send buffer and one batch with its encoding each) and two
        // batches more; each stream would like 16 ahead.
        let options = lake_serve::ServeOptions { memory_bytes: 13 * batch + 4096, prefetch_bytes: 32 * batch, ..Default::default() };
        let service = lake_serve::Service::new(lake, options).expect("service");
        let streams = (0..3u64).map(|seed| {
            let service = service.clone();
            let req = request(seed, 4);
            async move {
                let (_, mut batches) = service.batches(&req).await.expect("stream");
                let mut got = Vec::new();
                while let Some(b) = batches.next().await {
                    got.extend(records(vec![b.expect("batch")]));
                    let text = service.prometheus().await;
                    assert!(metric(&text, "lake_memory_used_bytes") <= metric(&text, "lake_memory_budget_bytes"), "{text}");
                }
                got
            }
        });
        let got = futures::future::join_all(streams).await;
        for (seed, batches) in got.iter().enumerate() {
            let (_, expected) = probe.batches(&request(seed as u64, 4)).await.expect("stream");
            let expected = records(expected.try_collect().await.expect("batches"));
            same_rows(batches, &expected, "within the budget");
        }
        let text = service.prometheus().await;
        assert_eq!(metric(&text, "lake_memory_used_bytes"), 0.0, "every batch's room is given back: {text}");
        assert_eq!(metric(&text, "lake_active_streams"), 0.0, "{text}");

        // A batch that cannot fit at all is refused with the sizes.
        let e = service.batches(&request(0, 32)).await.err().expect("refused");
        assert!(e.to_string().contains("memory budget") && matches!(lake_serve::refusal(&e).0, lake_serve::Refusal::BadRequest), "{e}");
        // And so is its plan (a Flight ticket that could never be redeemed).
        let e = service.describe(&request(0, 32), lake_serve::Footprint::ENCODED).await.expect_err("refused");
        assert!(e.to_string().contains("memory budget"), "{e}");

        // A stream whose client keeps its first batch is lent free room for a few batches
        // ahead (twice the decode threads), not all of it: streams opened after it still start.
        let lake = lake_store::Lake::open(root.to_str().expect("utf-8")).expect("lake");
        let options = lake_serve::ServeOptions {
            loader: lake_loader::LoaderOptions { threads: 1, ..Default::default() },
            memory_bytes: 3 * 3 * batch + 2 * 2 * batch + 16 * 1024,
            prefetch_bytes: 64 * batch,
            admission_wait: std::time::Duration::from_millis(500),
            ..Default::default()
        };
        let lending = lake_serve::Service::new(lake, options).expect("service");
        let (_, mut first) = lending.batches(&request(0, 4)).await.expect("first stream");
        first.next().await.expect("a batch").expect("batch");
        let text = lending.prometheus().await;
        assert_eq!(metric(&text, "lake_lent_batches"), 2.0, "{text}");
        let later = futures::future::try_join_all((1..3).map(|seed| {
            let lending = lending.clone();
            async move { lending.batches(&request(seed, 4)).await }
        }))
        .await
        .expect("streams opened later start");
        let text = lending.prometheus().await;
        assert!(metric(&text, "lake_memory_used_bytes") <= metric(&text, "lake_memory_budget_bytes"), "{text}");
        for (_, batches) in later {
            assert_eq!(batches.try_collect::<Vec<_>>().await.expect("batches").len(), 4);
        }
        assert_eq!(first.try_collect::<Vec<_>>().await.expect("batches").len(), 3);
        assert_eq!(metric(&lending.prometheus().await, "lake_lent_batches"), 0.0);

        // A client that stops reading (a trainer paused to evaluate) keeps its own room, but the
        // room lent to it is taken back for a stream that waits to start; its batches are made
        // again when it reads on, and are the same batches.
        let lake = lake_store::Lake::open(root.to_str().expect("utf-8")).expect("lake");
        let options = lake_serve::ServeOptions {
            loader: lake_loader::LoaderOptions { threads: 1, ..Default::default() },
            memory_bytes: 2 * 3 * batch + 2 * 2 * batch + 16 * 1024,
            prefetch_bytes: 64 * batch,
            admission_wait: std::time::Duration::from_secs(10),
            ..Default::default()
        };
        let paused = lake_serve::Service::new(lake, options).expect("service");
        let (_, mut first) = paused.batches(&request(0, 4)).await.expect("first stream");
        let mut kept = records(vec![first.next().await.expect("a batch").expect("batch")]);
        assert_eq!(metric(&paused.prometheus().await, "lake_lent_batches"), 2.0);
        let (_, second) = paused.batches(&request(1, 4)).await.expect("fits beside the lent room");
        let (_, third) = paused.batches(&request(2, 4)).await.expect("the paused stream's lent room is taken back");
        let text = paused.prometheus().await;
        assert_eq!(metric(&text, "lake_lent_reclaimed_total"), 1.0, "{text}");
        assert!(metric(&text, "lake_memory_used_bytes") <= metric(&text, "lake_memory_budget_bytes"), "{text}");
        for (seed, batches) in [(1, second), (2, third)] {
            let (_, expected) = probe.batches(&request(seed, 4)).await.expect("stream");
            let expected = records(expected.try_collect().await.expect("batches"));
            same_rows(&records(batches.try_collect().await.expect("batches")), &expected, "beside a paused stream");
        }
        kept.extend(records(first.try_collect().await.expect("the paused stream reads on")));
        let (_, expected) = probe.batches(&request(0, 4)).await.expect("stream");
        same_rows(&kept, &records(expected.try_collect().await.expect("batches")), "made again after its room was taken back");
        assert_eq!(metric(&paused.prometheus().await, "lake_memory_used_bytes"), 0.0);
        // A client that goes away while batches sit in lent room gives all of it back.
        let (_, mut gone) = paused.batches(&request(0, 4)).await.expect("stream");
        gone.next().await.expect("a batch").expect("batch");
        assert_eq!(metric(&paused.prometheus().await, "lake_lent_batches"), 2.0);
        drop(gone);
        let text = paused.prometheus().await;
        assert_eq!((metric(&text, "lake_lent_batches"), metric(&text, "lake_memory_used_bytes")), (0.0, 0.0), "{text}");
        // A client paused holding a batch made in lent room (its second): that batch moves into
        // its stream's own room, and the lent room is free for a stream waiting to start.
        let (_, mut holding) = paused.batches(&request(0, 4)).await.expect("stream");
        holding.next().await.expect("a batch").expect("batch");
        holding.next().await.expect("a batch").expect("batch");
        let (_, second) = paused.batches(&request(1, 4)).await.expect("fits beside the lent room");
        let (_, third) = paused.batches(&request(2, 4)).await.expect("the paused stream's lent room is taken back, all of it");
        let text = paused.prometheus().await;
        assert_eq!(metric(&text, "lake_lent_batches"), 0.0, "the batch handed out sits in its own room now: {text}");
        assert!(metric(&text, "lake_memory_used_bytes") <= metric(&text, "lake_memory_budget_bytes"), "{text}");
        for batches in [second, third] {
            assert_eq!(batches.try_collect::<Vec<_>>().await.expect("batches").len(), 4);
        }
        assert_eq!(holding.try_collect::<Vec<_>>().await.expect("the paused stream reads on").len(), 2);
        assert_eq!(metric(&paused.prometheus().await, "lake_memory_used_bytes"), 0.0);

        // Room for three streams: while they are open, a fourth waits, then is refused as busy;
        // once they close, streams run again.
        let lake = lake_store::Lake::open(root.to_str().expect("utf-8")).expect("lake");
        let wait = std::time::Duration::from_millis(200);
        let options = lake_serve::ServeOptions { memory_bytes: 9 * batch + 16 * 1024, admission_wait: wait, ..Default::default() };
        let small = lake_serve::Service::new(lake, options).expect("service");
        let open: Vec<_> = futures::future::try_join_all((0..3).map(|seed| {
            let small = small.clone();
            async move { small.batches(&request(seed, 4)).await }
        }))
        .await
        .expect("three streams fit");
        let e = small.batches(&request(3, 4)).await.err().expect("busy");
        assert_eq!(lake_serve::refusal(&e).0, lake_serve::Refusal::Busy, "{e}");
        assert!(e.to_string().contains("retry later"), "{e}");
        drop(open);
        let (_, batches) = small.batches(&request(0, 4)).await.expect("room again");
        assert_eq!(batches.try_collect::<Vec<_>>().await.expect("batches").len(), 4);
        assert!(metric(&small.prometheus().await, "lake_errors_total{kind=\"busy\"}") >= 1.0);
    });
}

/// Flight SQL rows as JSON objects, written as `lake sql --format json` writes them.
fn json_rows(batches: &[RecordBatch]) -> Vec<serde_json::Map<String, Value>> {
    let mut writer = arrow::json::ArrayWriter::new(Vec::new());
    for b in batches {
        writer.write(b).expect("json");
    }
    writer.finish().expect("json");
    let bytes = writer.into_inner();
    if bytes.is_empty() { Vec::new() } else { serde_json::from_slice(&bytes).expect("rows") }
}

async fn flight_sql_rows(
    client: &mut arrow_flight::sql::client::FlightSqlServiceClient<tonic::transport::Channel>,
    info: arrow_flight::FlightInfo,
) -> Vec<RecordBatch> {
    let ticket = info.endpoint[0].ticket.clone().expect("a ticket");
    client.do_get(ticket).await.expect("do_get").try_collect().await.expect("batches")
}

#[test]
fn flight_sql_answers_as_lake_sql_does_and_refuses_what_is_not_a_query() {
    use arrow_flight::sql::{CommandGetTables, SqlInfo, client::FlightSqlServiceClient};
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("lake");
    ingest_ok(&root, &testdata("v30-av1-small"), &[]);
    let server = start(&root);
    let query = "SELECT task_index, count(*) AS steps, min(action[1]) AS lo FROM steps GROUP BY task_index ORDER BY task_index";
    let expected = sql_rows(&root, query);
    assert!(!expected.is_empty());
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let channel = tonic::transport::Channel::from_shared(server.flight.clone()).expect("url").connect().await.expect("connect");
        let mut client = FlightSqlServiceClient::new(channel.clone());
        client.set_header("authorization", format!("Bearer {TOKEN}"));

        // A statement, and the same as a prepared statement.
        let info = client.execute(query.to_string(), None).await.expect("statement");
        assert_eq!(json_rows(&flight_sql_rows(&mut client, info).await), expected, "statement");
        let mut prepared = client.prepare(query.to_string(), None).await.expect("prepare");
        assert_eq!(prepared.dataset_schema().expect("schema").fields().len(), 3);
        let info = prepared.execute().await.expect("prepared");
        assert_eq!(json_rows(&flight_sql_rows(&mut client, info).await), expected, "prepared statement");
        prepared.close().await.expect("close");

        // Catalog calls: the stacked tables and each dataset's own, with their schemas.
        let tables = CommandGetTables { table_name_filter_pattern: Some("steps".into()), include_schema: true, ..Default::default() };
        let info = client.get_tables(tables).await.expect("tables");
        let listed = flight_sql_rows(&mut client, info).await;
        let rows = json_rows(&listed);
        let schemas: Vec<&str> = rows.iter().map(|r| r["db_schema_name"].as_str().expect("schema name")).collect();
        assert_eq!(schemas, ["public", "v30-av1-small"], "{rows:?}");
        assert!(rows.iter().all(|r| r["catalog_name"] == "lake" && r["table_name"] == "steps"), "{rows:?}");
        assert!(listed[0].column_by_name("table_schema").is_some());
        let info = client.get_sql_info(vec![SqlInfo::FlightSqlServerName, SqlInfo::FlightSqlServerReadOnly]).await.expect("sql info");
        assert_eq!(flight_sql_rows(&mut client, info).await.iter().map(RecordBatch::num_rows).sum::<usize>(), 2);
        let info = client.get_catalogs().await.expect("catalogs");
        assert_eq!(json_rows(&flight_sql_rows(&mut client, info).await)[0]["catalog_name"], "lake");

        // Bad SQL: DataFusion's message with the position. Statements that would read or write
        // files on the server are refused.
        let e = client.execute("SELEC 1".into(), None).await.expect_err("bad sql");
        assert!(e.to_string().contains("invalid argument") && e.to_string().contains("Line: 1"), "{e}");
        let e = client.execute("SELECT * FROM nope.steps".into(), None).await.expect_err("missing dataset");
        assert!(e.to_string().contains("no dataset `nope`"), "{e}");
        let e = client.prepare("SELEC 2".into(), None).await.expect_err("bad sql, prepared");
        assert!(e.to_string().contains("Line: 1"), "{e}");
        let (_, metrics) = http(&server.http, "GET", "/metrics", &[("Authorization", format!("Bearer {TOKEN}").as_str())], b"");
        let errors = metric(&String::from_utf8_lossy(&metrics), "lake_errors_total{kind=\"sql\"}");
        assert_eq!(errors, 3.0, "every refused statement is counted, prepared ones too");
        for statement in ["COPY (SELECT 1) TO '/tmp/lake-flight-sql.csv'", "CREATE EXTERNAL TABLE t STORED AS CSV LOCATION '/etc/hostname'"]
        {
            let e = client.execute(statement.into(), None).await.expect_err("not a query");
            assert!(e.to_string().contains("invalid argument") && e.to_string().contains("not supported"), "{statement}: {e}");
        }

        // Sessions see what changed since the tables were first opened: a derived table made
        // beside the version, a dataset ingested.
        let count = |query: &'static str| {
            let mut client = client.clone();
            async move {
                let info = client.execute(query.to_string(), None).await.unwrap_or_else(|e| panic!("{query}: {e}"));
                json_rows(&flight_sql_rows(&mut client, info).await)[0]["n"].as_i64().expect("a count")
            }
        };
        let run = lake(&root, &["stats", "v30-av1-small", "--images"]);
        assert_eq!(run.code, 0, "{run:#?}");
        assert!(count("SELECT count(*) AS n FROM \"v30-av1-small\".image_stats").await > 0);
        ingest_ok(&root, &testdata("v30-images-tiny"), &[]);
        assert_eq!(count("SELECT count(DISTINCT dataset) AS n FROM steps").await, 2);

        // Messages that do not decode: INVALID_ARGUMENT saying so, counted as bad requests.
        let bearer = format!("Bearer {TOKEN}");
        let bad = || {
            let (_, text) = http(&server.http, "GET", "/metrics", &[("Authorization", bearer.as_str())], b"");
            metric(&String::from_utf8_lossy(&text), "lake_errors_total{kind=\"bad_request\"}")
        };
        let bad_before = bad();
        let mut flight = FlightClient::new(channel.clone());
        flight.add_header("authorization", &format!("Bearer {TOKEN}")).expect("header");
        let garbled = arrow_flight::sql::Any {
            type_url: "type.googleapis.com/arrow.flight.protocol.sql.CommandStatementQuery".into(),
            value: vec![0xff, 0xff, 0xff].into(),
        };
        let e =
            status(flight.get_flight_info(FlightDescriptor::new_cmd(prost::Message::encode_to_vec(&garbled))).await.expect_err("garbled"));
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
        assert!(e.message().contains("Flight SQL command cannot be decoded") && !e.message().contains("ParseError("), "{e:?}");
        let action = arrow_flight::Action::new("CreatePreparedStatement", vec![1u8, 2]);
        let e = status(flight.do_action(action).await.err().expect("garbled body"));
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
        assert!(e.message().contains("body of the CreatePreparedStatement action cannot be decoded"), "{e:?}");
        // A PATH descriptor, and a protobuf message of another kind, are named as such.
        let e = status(flight.get_flight_info(FlightDescriptor::new_path(vec!["steps".into()])).await.expect_err("path"));
        assert!(e.code() == tonic::Code::InvalidArgument && e.message().contains("not PATH descriptors"), "{e:?}");
        let other = arrow_flight::sql::Any { type_url: "type.googleapis.com/google.protobuf.Duration".into(), value: vec![].into() };
        let e = status(flight.get_flight_info(FlightDescriptor::new_cmd(prost::Message::encode_to_vec(&other))).await.expect_err("other"));
        assert!(e.message().contains("is a type.googleapis.com/google.protobuf.Duration message, which lake does not take"), "{e:?}");
        assert_eq!(bad() - bad_before, 4.0, "each counted");
        // A Flight SQL command lake does not answer says which, in lake's words.
        let xdbc = arrow_flight::sql::Any::pack(&arrow_flight::sql::CommandGetXdbcTypeInfo { data_type: None }).expect("pack");
        let e = status(flight.get_flight_info(FlightDescriptor::new_cmd(prost::Message::encode_to_vec(&xdbc))).await.expect_err("xdbc"));
        assert_eq!(e.code(), tonic::Code::Unimplemented, "{e:?}");
        assert!(e.message().contains("does not answer CommandGetXdbcTypeInfo"), "{e:?}");

        // Without the token: refused.
        let mut anonymous = FlightSqlServiceClient::new(channel);
        let e = anonymous.execute(query.to_string(), None).await.expect_err("needs a token");
        assert!(e.to_string().contains("bearer token"), "{e}");
    });
}

/// The Python to run the Python client's tests with: `$LAKE_PYTHON` (scripts/test.sh sets it
/// from scripts/python-env.sh), else the LeRobot environment (it has torch too).
pub(crate) fn client_python() -> Option<std::path::PathBuf> {
    let home = std::env::var_os("HOME").map(std::path::PathBuf::from);
    std::env::var_os("LAKE_PYTHON")
        .map(std::path::PathBuf::from)
        .into_iter()
        .chain(home.iter().flat_map(|h| [h.join(".cache/lake/lerobot-venv/bin/python"), h.join(".cache/lake/py-venv/bin/python")]))
        .find(|p| p.is_file())
}

/// `lake serve` on `root` with its Flight port fixed, so that a server started again is where
/// its clients look.
fn serve_on_port(root: &Path, flight_port: u16, local: &Path) -> Server {
    launch(root, &format!("127.0.0.1:{flight_port}"), &["--local", &local.to_string_lossy()])
}

/// A trainer's stream outlives its only server's restart, over Flight and over the local socket:
/// the Python clients (`resume_wait_s`) and the Rust ones (`ServerPool::with_resume_wait`,
/// `LocalLoader::with_resume_wait`, what `lake train --server`/`--local` use) wait for the
/// server to answer again and resume after the last batch received, the same batches as a
/// stream never cut; a server that stays down ends the stream once the wait is over.
#[test]
fn a_stream_waits_out_its_servers_restart_and_resumes_where_it_stopped() {
    let Some(python) = client_python() else {
        panic!("no Python with pyarrow: run scripts/python-env.sh, or set LAKE_PYTHON");
    };
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("lake");
    ingest_ok(&root, &testdata("v30-av1-small"), &[]);
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port").local_addr().expect("addr").port();
    let socket = tmp.path().join("serve.sock");
    let mut server = Some(serve_on_port(&root, port, &socket));
    let location = format!("grpc://127.0.0.1:{port}");
    // Batches of about 4 MB: a Flight stream's flow-control window holds a few (a local
    // stream's two slots, two), so most of the 30 must come after the restart.
    let script = r#"
import json, sys, warnings
import lake_client
transport, where, token, wait, mode = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5]
request = {"datasets": ["v30-av1-small"], "batch_size": 4, "seed": 3, "limit_batches": 30}
client = lake_client.LakeClient if transport == "flight" else lake_client.LocalClient
stream = client(where, token, resume_wait_s=wait).batches(request)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try:
        for i, batch in enumerate(stream):
            print(json.dumps(batch.column("index").to_pylist()), flush=True)
            if i == 2 and mode == "cut":
                sys.stdin.readline()  # the server is stopped meanwhile
    except lake_client.LakeError as e:
        print("error", e.code, e.message, flush=True)
print("warned", sum("every server of the lake is unavailable" in str(w.message) for w in caught), flush=True)
"#;
    let socket_arg = socket.to_string_lossy().to_string();
    let run = |transport: &str, wait: &str, mode: &str| {
        let at = if transport == "flight" { location.as_str() } else { socket_arg.as_str() };
        python_client(&python, script, &[transport, at, TOKEN, wait, mode])
    };
    let reference = run("flight", "0", "whole").wait_with_output().expect("reference");
    let reference: Vec<String> = String::from_utf8_lossy(&reference.stdout).lines().map(String::from).collect();
    assert_eq!((reference.len(), reference.last().map(String::as_str)), (31, Some("warned 0")), "{reference:?}");

    // Python: three batches read, the server stopped, started again two seconds later.
    let cut = |transport: &str, wait: &str, restart: bool, server: &mut Option<Server>| {
        let mut child = run(transport, wait, "cut");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let mut got: Vec<String> = (0..3).map(|_| lines.next().expect("a batch").expect("utf-8")).collect();
        drop(server.take());
        writeln!(child.stdin.as_mut().expect("stdin")).expect("go on");
        if restart {
            std::thread::sleep(std::time::Duration::from_secs(2));
            *server = Some(serve_on_port(&root, port, &socket));
        }
        got.extend(lines.map(|l| l.expect("utf-8")));
        assert!(child.wait().expect("python").success(), "{transport}: {got:?}");
        got
    };
    for transport in ["flight", "local"] {
        if server.is_none() {
            server = Some(serve_on_port(&root, port, &socket));
        }
        let got = cut(transport, "60", true, &mut server);
        assert_eq!(got.last().map(String::as_str), Some("warned 1"), "{transport}: {got:?}");
        assert_eq!(got[..30], reference[..30], "{transport}: the stream resumed exactly where it stopped");
        // A server that stays down: the stream ends once the wait is over.
        let got = cut(transport, "1", false, &mut server);
        let error = got.iter().find(|l| l.starts_with("error ")).unwrap_or_else(|| panic!("{transport}: {got:?}"));
        assert!(
            error.starts_with("error unavailable ")
                && error.ends_with("no server of the lake took the stream again within 1 s (resume_wait_s)"),
            "{transport}: {error}"
        );
        assert_eq!(got.last().map(String::as_str), Some("warned 1"), "{transport}");
    }

    // Rust: the same, through a pool of one server and through the local socket.
    // The indices as Python's `json.dumps` writes them.
    let indices = |batch: &RecordBatch| -> String {
        let values = batch.column_by_name("index").expect("index").as_primitive::<arrow::datatypes::Int64Type>().values().to_vec();
        format!("[{}]", values.iter().map(i64::to_string).collect::<Vec<_>>().join(", "))
    };
    let mut request = lake_client::SampleRequest::new(["v30-av1-small"]);
    (request.batch_size, request.seed, request.limit_batches) = (4, 3, Some(30));
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let open = |transport: &str, wait: u64| {
            let wait = std::time::Duration::from_secs(wait);
            let request = request.clone();
            let flight = format!("http://127.0.0.1:{port}");
            let socket = socket.clone();
            let transport = transport.to_string();
            async move {
                if transport == "flight" {
                    let pool = lake_client::ServerPool::new([flight], Some(TOKEN.to_string())).expect("pool");
                    pool.with_resume_wait(wait).stream(&request).await
                } else {
                    lake_client::LocalLoader::new(socket, Some(TOKEN.to_string())).with_resume_wait(wait).stream(&request).await
                }
            }
        };
        for transport in ["flight", "local"] {
            server = Some(serve_on_port(&root, port, &socket));
            let mut stream = open(transport, 60).await.expect("stream");
            let mut got = Vec::new();
            for _ in 0..3 {
                got.push(indices(&stream.next().await.expect("a batch").expect("batch")));
            }
            drop(server.take());
            let restarted = tokio::task::spawn_blocking({
                let (root, socket) = (root.clone(), socket.clone());
                move || {
                    std::thread::sleep(std::time::Duration::from_secs(2));
                    serve_on_port(&root, port, &socket)
                }
            });
            while let Some(batch) = stream.next().await {
                got.push(indices(&batch.unwrap_or_else(|e| panic!("{transport}: the stream goes on once the server is back: {e}"))));
            }
            assert_eq!(got[..], reference[..30], "{transport}: the stream resumed exactly where it stopped");
            server = Some(restarted.await.expect("restarted"));

            let mut stream = open(transport, 1).await.expect("stream");
            stream.next().await.expect("a batch").expect("batch");
            drop(server.take());
            let ended = loop {
                match stream.next().await.expect("an end") {
                    Ok(_) => continue,
                    Err(e) => break e,
                }
            };
            assert!(matches!(ended, lake_client::Error::Unavailable(_)), "{transport}: {ended}");
            assert!(ended.to_string().contains("none took it again within 1s"), "{transport}: {ended}");
        }
    });
}

#[test]
#[allow(clippy::print_stderr)] // says why the Python client was not tested, or what ran
fn python_client_reads_a_full_epoch_equal_to_lerobots_reference() {
    let Some(python) = client_python() else {
        eprintln!("skipped: no Python with pyarrow (run scripts/python-env.sh, or set LAKE_PYTHON)");
        return;
    };
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("lake");
    ingest_ok(&root, &testdata("v30-av1-small"), &[]);
    let server = start(&root);
    let client_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../clients/python");
    let out = std::process::Command::new(python)
        .arg(client_dir.join("tests/test_client.py"))
        .current_dir(&client_dir)
        .env("PYTHONPATH", &client_dir)
        .env("LAKE_FLIGHT", server.flight.replace("http://", "grpc://"))
        .env("LAKE_LOCAL", &server.local)
        .env("LAKE_HTTP", &server.http)
        .env("LAKE_TOKEN", TOKEN)
        .env("LAKE_DATASET", "v30-av1-small")
        .env("LAKE_REFERENCE_DIR", lake_testkit::shared_dir().join("fixtures/reference"))
        .output()
        .expect("run python");
    let report = format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the Python client's tests failed:\n{report}");
    assert!(report.contains("OK"), "{report}");
    // unittest's summary: how many ran, and how many were skipped (the torch ones without torch).
    eprintln!("python client: {}", report.lines().filter(|l| l.starts_with("Ran ") || l.starts_with("OK")).collect::<Vec<_>>().join("; "));
}

/// A camera whose frames turn out to be in another colour space than ingest recorded cannot
/// give the YUV planes its schema promised: the stream ends with DATA_LOSS (`frame` to the
/// Python client, over Flight and local streams), naming the frame and the way out, and is
/// counted as such. As RGB, the whole epoch is served, every frame converted in its own colour
/// space as a fresh decoder (LeRobot's) gives it, whichever part of the stream the server's
/// decoders read before.
#[test]
fn a_frame_the_lake_cannot_give_ends_the_stream_with_data_loss_naming_it() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("lake");
    crate::common::ingest_recoloured(&root, tmp.path(), &[false, true]);
    let sequential = lake_testkit::sequential_rgb(&tmp.path().join("recoloured/videos/observation.images.side/chunk-000/file-000.mp4"));
    let server = start(&root);
    let every = json!({"datasets": ["recoloured"], "preset": "none", "batch_size": 100, "seed": 1, "limit_batches": 3});
    let mut as_planes = every.clone();
    as_planes["frame_format"] = "yuv420p".into();
    let says = [
        "dataset recoloured@1, camera observation.images.side, episode ",
        "colour space bt709",
        "what ingest recorded for the stream (colour space unknown, limited range)",
        "ask for rgb24",
    ];
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let mut client = flight_client(&server).await;
        let epoch = over_flight(&mut client, &every).await.expect("rgb24");
        assert_eq!(epoch.iter().map(RecordBatch::num_rows).sum::<usize>(), 300);
        for batch in &epoch {
            let (index, side) =
                (batch["index"].as_primitive::<arrow::datatypes::Int64Type>(), batch["observation.images.side"].as_fixed_size_list());
            for row in 0..batch.num_rows() {
                // (One file of 300 frames at 30 fps, in a time base of 1/15360: 512 a frame.)
                let (pts, want) = &sequential[index.value(row) as usize];
                assert_eq!(*pts, 512 * index.value(row));
                assert!(
                    side.value(row).as_primitive::<arrow::datatypes::UInt8Type>().values() == want.as_slice(),
                    "step {}",
                    index.value(row)
                );
            }
        }
        let failed = over_flight(&mut client, &as_planes).await.expect_err("frames in another colour space");
        assert_eq!(failed.code(), tonic::Code::DataLoss, "{failed:?}");
        for says in says {
            assert!(failed.message().contains(says), "{says:?} in {failed:?}");
        }
    });
    // Over HTTP, the status went with the first batch: an error after it ends the body before
    // its last chunk, or, for a client that takes trailers, with the status and message as
    // trailers; the Arrow stream has no end marker either way. (A stream of single steps whose
    // first is of the part in the recorded colour space, and a later one of the other part.)
    let auth = format!("Bearer {TOKEN}");
    let headers = [("Authorization", auth.as_str()), ("Content-Type", "application/json")];
    let (seed, broken) = (0..32u64)
        .find_map(|seed| {
            let mut one_by_one = as_planes.clone();
            (one_by_one["batch_size"], one_by_one["limit_batches"], one_by_one["seed"]) = (1.into(), 40.into(), seed.into());
            let r = lake_testkit::http_request(&server.http, "POST", "/v1/sample", &headers, one_by_one.to_string().as_bytes());
            (r.status == 200).then_some((seed, one_by_one))
        })
        .expect("a seed whose first step can be given as YUV planes");
    let with_trailers = [&headers[..], &[("TE", "trailers")]].concat();
    let r = lake_testkit::http_request(&server.http, "POST", "/v1/sample", &with_trailers, broken.to_string().as_bytes());
    assert!(r.head.contains("trailer: lake-error-status, lake-error"), "seed {seed}: {}", r.head);
    let trailers = r.trailers.expect("a body that ends with its trailers");
    assert!(trailers.contains("lake-error-status: 500\r\n"), "{trailers}");
    let message = trailers.lines().find_map(|l| l.strip_prefix("lake-error: ")).unwrap_or_else(|| panic!("a message in {trailers}"));
    assert!(says.iter().all(|s| message.contains(&s.to_lowercase())), "{says:?} in {message}");
    let end_marker = [0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0];
    let read: Vec<_> = StreamReader::try_new(std::io::Cursor::new(&r.body), None).expect("an Arrow stream").collect();
    assert!(!read.is_empty() && read.iter().all(Result::is_ok), "whole batches before the error");
    assert!(!r.body.ends_with(&end_marker), "the Arrow stream has no end marker");
    let r = lake_testkit::http_request(&server.http, "POST", "/v1/sample", &headers, broken.to_string().as_bytes());
    assert!(r.status == 200 && r.trailers.is_none() && !r.head.contains("trailer:"), "without trailers, the body breaks off: {}", r.head);
    assert!(!r.body.ends_with(&end_marker));
    let (_, body) = http(&server.http, "GET", "/metrics", &[("Authorization", &format!("Bearer {TOKEN}"))], b"");
    let metrics = String::from_utf8_lossy(&body);
    assert!(
        // (Over Flight, and over HTTP: each seed tried, then with and without trailers.)
        metric(&metrics, "lake_errors_total{kind=\"frame\"}") == (1 + (seed + 1) + 2) as f64
            && metric(&metrics, "lake_errors_total{kind=\"stream\"}") == 0.0,
        "a frame the lake cannot give is counted as such: {metrics}"
    );
    let Some(python) = client_python() else { return };
    let script = r#"
import json, sys
from lake_client import LakeClient, LakeError, LocalClient
flight, local, token, request = sys.argv[1:]
for client in (LakeClient(flight, token), LocalClient(local, token)):
    try:
        for _ in client.batches(json.loads(request)):
            pass
    except LakeError as e:
        print(f"{type(client).__name__}: {e.code}: {e.message}")
"#;
    let client_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../clients/python");
    let out = std::process::Command::new(python)
        .args(["-c", script, &server.flight.replace("http://", "grpc://")])
        .arg(&server.local)
        .args([TOKEN, &as_planes.to_string()])
        .env("PYTHONPATH", &client_dir)
        .output()
        .expect("run python");
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:#?}");
    for client in ["LakeClient: frame: ", "LocalClient: frame: "] {
        let line = report.lines().find(|l| l.starts_with(client)).unwrap_or_else(|| panic!("{client:?} in {report}"));
        assert!(says.iter().all(|s| line.contains(s)), "{line}");
    }
}

#[test]
fn a_sql_query_past_the_timeout_is_stopped_with_an_error() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("lake");
    ingest_ok(&root, &testdata("v30-av1-small"), &[]);
    // Two datasets: `steps` is a union, whose joins run longest without yielding.
    ingest_ok(&root, &testdata("v30-images-tiny"), &[]);
    let server = start_with(&root, &["--sql-timeout", "3", "--shutdown-wait", "2", "--sql-concurrency", "1"]);
    let auth = format!("Bearer {TOKEN}");
    // Billions of joined rows, made batch after batch from each input batch, where the join
    // never yields to its runtime: long past the timeout, and stopped within a batch of it.
    let heavy = b"SELECT count(*) FROM steps a JOIN steps b ON a.task_index = b.task_index \
                  JOIN steps c ON b.task_index = c.task_index JOIN steps d ON c.task_index = d.task_index";
    let sql = |query: &'static [u8]| {
        let (addr, auth) = (server.http.clone(), auth.clone());
        move || http(&addr, "POST", "/v1/sql", &[("Authorization", auth.as_str()), ("Accept", "application/json")], query)
    };
    // While it runs, the server's one SQL slot is taken: another query is told to come back.
    // (A probe that takes the slot before the heavy query does makes that one busy instead:
    // then the round is tried again.)
    let mut refused = None;
    for _ in 0..5 {
        let running = std::thread::spawn(sql(heavy));
        std::thread::sleep(std::time::Duration::from_millis(300));
        let probe = loop {
            let (code, body) = sql(b"SELECT 1")();
            if code != 200 || running.is_finished() {
                break (code, body);
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        let heavy_answer = running.join().expect("the heavy query");
        if probe.0 == 503 && heavy_answer.0 != 503 {
            refused = Some((probe, heavy_answer));
            break;
        }
    }
    let ((_, probe), (code, body)) = refused.expect("a query running holds the only slot");
    assert!(String::from_utf8_lossy(&probe).contains("--sql-concurrency"), "{}", String::from_utf8_lossy(&probe));
    let error = serde_json::from_slice::<Value>(&body).expect("a JSON error");
    assert_eq!(code, 400, "{error}");
    assert!(error["error"].as_str().is_some_and(|e| e.contains("SQL timeout of 3 s")), "{error}");
    // Its thread stops within about a second of its timeout and gives the slot back.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while sql(b"SELECT count(*) FROM steps")().0 != 200 {
        assert!(std::time::Instant::now() < deadline, "the slot comes back");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // The operators watched for the timeout show as themselves, once each, as `lake sql` shows them.
    let analyze = "EXPLAIN ANALYZE SELECT count(*) FROM steps a JOIN steps b ON a.task_index = b.task_index";
    let (code, body) =
        http(&server.http, "POST", "/v1/sql", &[("Authorization", auth.as_str()), ("Accept", "text/csv")], analyze.as_bytes());
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
    let local = crate::common::lake(&root, &["sql", "--format", "csv", analyze]);
    let operators =
        |plan: &str| plan.lines().map(|l| l.trim_start().split([':', ',']).next().unwrap_or("").to_string()).collect::<Vec<_>>();
    assert_eq!(operators(&String::from_utf8_lossy(&body)), operators(&local.stdout));

    // Flight SQL shares the slots: while the heavy query holds the only one, a Flight SQL
    // query is told RESOURCE_EXHAUSTED (its client may retry), then answers once it is back.
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let flight_sql = |query: &'static str| {
        let (addr, auth) = (server.flight.clone(), auth.clone());
        rt.block_on(async move {
            let channel = tonic::transport::Channel::from_shared(addr).expect("url").connect().await.expect("connect");
            let mut client = arrow_flight::sql::client::FlightSqlServiceClient::new(channel);
            client.set_header("authorization", auth);
            let info = client.execute(query.to_string(), None).await?;
            let ticket = info.endpoint[0].ticket.clone().expect("a ticket");
            let batches: Vec<RecordBatch> = client.do_get(ticket).await?.try_collect().await?;
            Ok::<_, arrow_flight::error::FlightError>(batches)
        })
    };
    let mut busy = None;
    for _ in 0..5 {
        let running = std::thread::spawn(sql(heavy));
        std::thread::sleep(std::time::Duration::from_millis(300));
        let answer = flight_sql("SELECT 1");
        let heavy_answer = running.join().expect("the heavy query");
        if let (Err(e), false) = (&answer, heavy_answer.0 == 503) {
            busy = Some(e.to_string());
            break;
        }
    }
    let busy = busy.expect("a Flight SQL query meets the slot taken");
    assert!(busy.contains("ResourceExhausted") || busy.contains("resource exhausted") || busy.contains("--sql-concurrency"), "{busy}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while flight_sql("SELECT count(*) AS n FROM steps").is_err() {
        assert!(std::time::Instant::now() < deadline, "the slot comes back for Flight SQL");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Each stream leaves one access-log line, by default: its request, the batches, rows and bytes
/// sent, and how it ended.
#[test]
fn an_unshuffled_stream_serves_the_steps_as_recorded_every_epoch() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("lake");
    ingest_ok(&root, &testdata("v30-images-tiny"), &[]);
    ingest_ok(&root, &testdata("v30-images-tiny"), &["--name", "again"]);
    tokio::runtime::Runtime::new().expect("runtime").block_on(async {
        // Episodes 0 (rows 0–18) and 2 (rows 40–59): 39 steps, 5 global steps of 8 with the
        // last short, then the next epoch from the start.
        let request = json!({"datasets": ["v30-images-tiny"], "shuffle": false, "drop_last": false, "episodes": [0, 2],
                             "batch_size": 8, "limit_batches": 7});
        let batches = in_process(&root, &request).await;
        let epoch: Vec<i64> = (0..19).chain(40..60).collect();
        assert_eq!(batches.iter().map(RecordBatch::num_rows).collect::<Vec<_>>(), [8, 8, 8, 8, 7, 8, 8]);
        assert_eq!(int64s(&batches, "index"), [&epoch[..], &epoch[..16]].concat());
        let shuffled = in_process(&root, &json!({"datasets": ["v30-images-tiny"], "batch_size": 8, "limit_batches": 4})).await;
        let shuffled = int64s(&shuffled, "index");
        assert_ne!(shuffled, (0..32).collect::<Vec<i64>>(), "the default is a shuffle");
        // A mixture in sequence: the first dataset's steps, then the second's, no block rounding.
        let mixed = in_process(
            &root,
            &json!({"datasets": ["v30-images-tiny", "again"], "shuffle": false, "batch_size": 30,
                                              "limit_batches": 4}),
        )
        .await;
        assert_eq!(int64s(&mixed, "dataset_index"), [vec![0; 60], vec![1; 60]].concat());
        assert_eq!(int64s(&mixed, "index"), [(0..60).collect::<Vec<i64>>(), (0..60).collect()].concat());
        // A weight only mixes datasets in a shuffle.
        let lake = lake_store::Lake::open(root.to_str().expect("utf-8")).expect("lake");
        let service = lake_serve::Service::new(lake, Default::default()).expect("service");
        let weighted = typed(&json!({"datasets": ["v30-images-tiny=2", "again"], "shuffle": false}));
        let refused = service.batches(&weighted).await.err().expect("refused").to_string();
        assert!(refused.contains("dataset `v30-images-tiny`: a weight (2) mixes datasets in a shuffle"), "{refused}");
    });
}

#[test]
fn each_stream_leaves_an_access_log_line() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("lake");
    ingest_ok(&root, &testdata("v30-av1-small"), &[]);
    let mut child = lake_cmd(&root)
        .args(["serve", "--flight", "127.0.0.1:0", "--http", "127.0.0.1:0", "--shutdown-wait", "1"])
        .env("LAKE_TOKENS", TOKEN)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start lake serve");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("the server says where it listens");
    let addr = line.split_whitespace().find_map(|w| w.strip_prefix("http://")).expect("http address").to_string();
    let request = json!({"datasets": ["v30-av1-small"], "batch_size": 4, "seed": 9, "limit_batches": 2});
    let (code, _) = http(&addr, "POST", "/v1/sample", &[("Authorization", &format!("Bearer {TOKEN}"))], request.to_string().as_bytes());
    assert_eq!(code, 200);
    // SIGTERM: the server shuts down and its stderr ends.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let mut log = String::new();
    child.stderr.take().expect("stderr").read_to_string(&mut log).expect("log");
    let _ = child.wait();
    assert!(
        log.contains("stream datasets=v30-av1-small@1 rank=0/1 batch_size=4 seed=9 epoch=0 start_step=0: 2 batches, 8 rows, ")
            && log.contains("; complete"),
        "{log}"
    );
}

/// Packet batches (`frame_format: packets`): the same batches in process, over Flight, HTTP
/// and shared memory, a mixture's too; decoded on the consumer's side they are the frame path's
/// batches, and they are a small part of their bytes.
#[test]
fn packet_batches_travel_every_transport_and_decode_to_the_frames() {
    use lake_loader::{FrameFormat, PacketBatchDecoder};
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("lake");
    ingest_ok(&root, &testdata("v30-av1-small"), &[]);
    let server = start(&root);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let frames = json!({"datasets": ["v30-av1-small"], "preset": "diffusion", "batch_size": 8, "seed": 5, "limit_batches": 3});
    let mixture = json!({"datasets": ["v30-av1-small=2", {"name": "v30-av1-small", "weight": 1}], "preset": "act", "batch_size": 8,
        "seed": 5, "limit_batches": 2});
    let decoder = PacketBatchDecoder::new(FrameFormat::Rgb24, 2).expect("decoder");
    let auth = format!("Bearer {TOKEN}");
    let headers = [("Authorization", auth.as_str()), ("Content-Type", "application/json")];
    for request in [frames, mixture] {
        let mut packets = request.clone();
        packets["frame_format"] = "packets".into();
        let (want, shipped) = rt.block_on(async { (in_process(&root, &request).await, in_process(&root, &packets).await) });
        let camera = shipped[0].schema().field_with_name("observation.images.front").expect("camera").clone();
        assert_eq!(
            (camera.metadata()["pixel_format"].as_str(), camera.data_type().is_nested()),
            ("packets", request["preset"] == "diffusion")
        );
        for (batch, frames) in shipped.iter().zip(&want) {
            assert!(&decoder.decode(batch).expect("decode") == frames, "{request}: decoded packets differ from the frame path");
            let (p, f) = (crate::common::ipc_bytes(batch), crate::common::ipc_bytes(frames));
            assert!(p * 20 < f, "{request}: a packet batch is {p} bytes against {f} of frames");
        }
        rt.block_on(async {
            let mut client = flight_client(&server).await;
            same_rows(&over_flight(&mut client, &packets).await.expect("flight"), &shipped, "packets over flight");
            // Every batch is kept: a slot each.
            let local = lake_client::LocalLoader::new(&server.local, Some(TOKEN.into())).with_slots(3);
            let got: Vec<RecordBatch> = local.stream(&typed(&packets)).await.expect("local").try_collect().await.expect("batches");
            same_rows(&got, &shipped, "packets over shared memory");
        });
        let (code, body) = http(&server.http, "POST", "/v1/sample", &headers, packets.to_string().as_bytes());
        assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
        same_rows(&arrow_batches(&body), &shipped, "packets over http");
    }

    // A batch whose GOPs do not decode fails naming the dataset, camera, episode and frame; one
    // whose numbers point past its frames is refused.
    let packets = json!({"datasets": ["v30-av1-small"], "preset": "act", "batch_size": 4, "seed": 5, "limit_batches": 1,
        "frame_format": "packets"});
    let batch = rt.block_on(in_process(&root, &packets)).remove(0);
    let replaced = |name: &str, column: ArrayRef| {
        let mut columns = batch.columns().to_vec();
        columns[batch.schema().index_of(name).expect("column")] = column;
        RecordBatch::try_new(batch.schema(), columns).expect("batch")
    };
    let gops = batch.column_by_name("observation.images.front_packets").expect("gops").as_list::<i32>().clone();
    let structs = gops.values().as_struct();
    let mut fields = structs.columns().to_vec();
    let streams: Vec<String> = fields[1].as_string::<i32>().iter().map(|s| s.expect("stream").replace("\"av1\"", "\"h264\"")).collect();
    fields[1] = Arc::new(arrow::array::StringArray::from(streams));
    let structs = arrow::array::StructArray::try_new(structs.fields().clone(), fields, None).expect("gops");
    let DataType::List(item) = arrow::array::Array::data_type(&gops).clone() else { unreachable!("a list") };
    let gops = arrow::array::ListArray::try_new(item, gops.offsets().clone(), Arc::new(structs), None).expect("gops");
    let e = decoder.decode(&replaced("observation.images.front_packets", Arc::new(gops))).expect_err("h264 decodes no AV1");
    let (episode, frame) = (
        batch["episode_index"].as_primitive::<arrow::datatypes::Int64Type>(),
        batch["frame_index"].as_primitive::<arrow::datatypes::Int64Type>(),
    );
    let said = e.to_string();
    assert!(said.contains("v30-av1-small@1") && said.contains("observation.images.front"), "{said}");
    assert!(
        (0..4).any(|r| said.contains(&format!("episode {}", episode.value(r))) && said.contains(&format!("frame {}", frame.value(r)))),
        "{said}"
    );
    let past = Arc::new(arrow::array::UInt32Array::from(vec![0, 1, 2, 99]));
    let e = decoder.decode(&replaced("observation.images.front", past)).expect_err("frame 99");
    assert!(e.to_string().contains("packet camera `observation.images.front`: frame 99 of a batch whose GOPs give"), "{e}");
}

#[test]
fn the_web_apps_endpoints_page_episodes_and_give_the_loaders_frames_as_png() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("lake");
    ingest_ok(&root, &testdata("v30-bframes"), &[]);
    let server = start(&root);
    let auth = format!("Bearer {TOKEN}");
    let get = |path: &str| {
        let (code, head, body) = http_with_head(&server.http, "GET", path, &[("Authorization", auth.as_str())], b"");
        (code, head, body)
    };
    let json_of = |path: &str| {
        let (code, _, body) = get(path);
        (code, serde_json::from_slice::<Value>(&body).unwrap_or_else(|e| panic!("{path}: {e}: {}", String::from_utf8_lossy(&body))))
    };

    // The app's files need no token (they hold no data); every page's data does.
    let (code, head, body) = http_with_head(&server.http, "GET", "/", &[], b"");
    assert_eq!(code, 200);
    assert!(head.contains("content-type: text/html") && head.contains("content-security-policy: default-src 'self'"), "{head}");
    assert!(String::from_utf8_lossy(&body).contains("/app/app.js"), "the page loads the app");
    assert_eq!(http(&server.http, "GET", "/app/app.js", &[], b"").0, 200);
    assert_eq!(http(&server.http, "GET", "/app/secrets.txt", &[], b"").0, 404);
    for path in ["/v1/datasets/v30-bframes/episodes", "/v1/datasets/v30-bframes/episodes/0", "/v1/datasets/v30-bframes/findings"] {
        assert_eq!(http(&server.http, "GET", path, &[], b"").0, 401, "{path}");
    }

    // A page of episodes: filtered, sorted and cut by the server, as `lake sql` orders them.
    let by_length = sql_rows(&root, r#"SELECT episode_index, length FROM "v30-bframes".episodes ORDER BY length DESC, episode_index"#);
    let (code, page) = json_of("/v1/datasets/v30-bframes/episodes?sort=length&order=desc&limit=2&offset=1");
    assert_eq!(code, 200, "{page}");
    assert_eq!(page["total"], 5);
    let got: Vec<(i64, i64)> = page["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| (r["episode_index"].as_i64().unwrap(), r["length"].as_i64().unwrap()))
        .collect();
    let want: Vec<(i64, i64)> =
        by_length[1..3].iter().map(|r| (r["episode_index"].as_i64().unwrap(), r["length"].as_i64().unwrap())).collect();
    assert_eq!(got, want, "{page}");
    let task =
        sql_rows(&root, r#"SELECT task FROM "v30-bframes".tasks ORDER BY task_index LIMIT 1"#)[0]["task"].as_str().unwrap().to_string();
    let with_task =
        sql_rows(&root, &format!(r#"SELECT count(*) AS n FROM "v30-bframes".episodes WHERE array_has(tasks, '{task}') AND length >= 50"#));
    let words = task.split_whitespace().take(3).collect::<Vec<_>>().join("%20").to_uppercase();
    let (_, filtered) = json_of(&format!("/v1/datasets/v30-bframes/episodes?task={words}&min_length=50"));
    assert_eq!(filtered["total"], with_task[0]["n"], "a task's words in any case, and a length: {filtered}");
    let (code, refused) = json_of("/v1/datasets/v30-bframes/episodes?sort=tasks");
    assert_eq!((code, refused["error"].as_str()), (400, Some("sort must be episode_index, length or findings, not `tasks`")));

    // One episode: its steps' columns as `lake sql` gives them, and the dimension names.
    let (code, episode) = json_of("/v1/datasets/v30-bframes/episodes/1");
    assert_eq!(code, 200, "{episode}");
    let steps = sql_rows(&root, r#"SELECT "index", action FROM "v30-bframes".steps WHERE episode_index = 1 ORDER BY "index""#);
    assert_eq!(episode["length"].as_u64(), Some(steps.len() as u64));
    assert_eq!(episode["from_index"], steps[0]["index"]);
    let column = |key: &str| episode["columns"][key].as_array().unwrap_or_else(|| panic!("no column {key}: {episode}")).clone();
    assert_eq!(column("index"), steps.iter().map(|r| r["index"].clone()).collect::<Vec<_>>());
    assert_eq!(column("action"), steps.iter().map(|r| r["action"].clone()).collect::<Vec<_>>());
    assert_eq!(episode["cameras"].as_array().map(Vec::len), Some(3), "{episode}");
    let (code, missing) = json_of("/v1/datasets/v30-bframes/episodes/99");
    assert_eq!((code, missing["error"].as_str()), (404, Some("v30-bframes@1: no episode 99 (episodes 0 to 4)")));

    // A frame: the loader's RGB bytes at that step, in a PNG, whatever the stream's B-frames.
    let index = steps[7]["index"].as_i64().expect("index");
    let camera = "observation.images.front";
    let (code, head, png_bytes) = get(&format!("/v1/datasets/v30-bframes/frame?camera={camera}&index={index}"));
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&png_bytes));
    assert!(
        head.contains("content-type: image/png") && head.contains("lake-episode-index: 1") && head.contains("lake-frame-index: 7"),
        "{head}"
    );
    let mut reader = png::Decoder::new(std::io::Cursor::new(png_bytes)).read_info().expect("a PNG");
    let mut pixels = vec![0; reader.output_buffer_size().expect("size")];
    let info = reader.next_frame(&mut pixels).expect("decode");
    assert_eq!((info.color_type, info.bit_depth), (png::ColorType::Rgb, png::BitDepth::Eight));
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    // The loader's frames of `camera` at LeRobot indices `indices`, one batch.
    let loaders_frames = |indices: &[i64]| {
        rt.block_on(async {
            use lake_loader::{Draw, Loader, LoaderDataset, LoaderOptions, Preset, Windows};
            let lake = lake_store::Lake::open(root.to_str().expect("utf-8")).expect("lake");
            let ds = LoaderDataset::open(&lake, "v30-bframes").await.expect("open");
            let loader = Loader::new(vec![ds.clone()], &Windows::Preset(Preset::None), LoaderOptions::default()).expect("loader");
            let draws: Vec<Draw> = indices.iter().map(|&i| Draw { source: 0, row: ds.row_of_index(i).expect("row") }).collect();
            let batch = loader.batch(&draws).await.expect("batch");
            let frames = batch.column_by_name(camera).expect("camera").as_fixed_size_list().clone();
            (0..indices.len()).map(|k| frames.value(k).as_primitive::<arrow::datatypes::UInt8Type>().values().to_vec()).collect::<Vec<_>>()
        })
    };
    let decode_png = |bytes: &[u8]| {
        let mut reader = png::Decoder::new(std::io::Cursor::new(bytes.to_vec())).read_info().expect("a PNG");
        let mut pixels = vec![0; reader.output_buffer_size().expect("size")];
        let info = reader.next_frame(&mut pixels).expect("decode");
        assert_eq!((info.width, info.height, info.color_type), (152, 120, png::ColorType::Rgb));
        pixels
    };
    assert_eq!((info.width, info.height), (152, 120));
    assert!(pixels == loaders_frames(&[index])[0], "the PNG holds the loader's frame");

    // Frames of consecutive steps, one PNG each, up to the episode's end: the loader's.
    let last_three: Vec<i64> = steps[steps.len() - 3..].iter().map(|r| r["index"].as_i64().expect("index")).collect();
    let (code, head, body) = get(&format!("/v1/datasets/v30-bframes/frames?camera={camera}&index={}&count=8", last_three[0]));
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
    let header =
        |name: &str| head.lines().find_map(|l| l.strip_prefix(&format!("{name}: "))).unwrap_or_else(|| panic!("no {name}: {head}"));
    assert_eq!(header("content-type"), "application/octet-stream");
    assert_eq!(header("lake-frame-count"), "3", "the episode ends after three steps");
    assert_eq!(header("lake-frame-index"), (steps.len() - 3).to_string());
    let sizes: Vec<usize> = header("lake-frame-bytes").split(',').map(|n| n.parse().expect("a size")).collect();
    assert_eq!((sizes.len(), sizes.iter().sum::<usize>()), (3, body.len()), "{head}");
    let mut at = 0;
    for (size, want) in sizes.iter().zip(loaders_frames(&last_three)) {
        assert!(decode_png(&body[at..at + size]) == want, "each PNG holds the loader's frame at its step");
        at += size;
    }
    // Asked again, the frames come from the server's frame cache: the same PNGs.
    let (code, _, again) = get(&format!("/v1/datasets/v30-bframes/frames?camera={camera}&index={}&count=8", last_three[0]));
    assert!(code == 200 && again == body, "frames from the cache are the decoded ones");
    for (query, error) in [
        ("count=0", "count must be 1 to 64 frames, not 0"),
        ("count=65", "count must be 1 to 64 frames, not 65"),
        ("", "`count` is missing: how many frames, 1 to 64"),
    ] {
        let (code, refused) = json_of(&format!("/v1/datasets/v30-bframes/frames?camera={camera}&index={index}&{query}"));
        assert_eq!((code, refused["error"].as_str()), (400, Some(error)), "{query}");
    }
    let (code, refused) = json_of(&format!("/v1/datasets/v30-bframes/frame?camera={camera}&index={index}&count=2"));
    assert_eq!((code, refused["error"].as_str()), (400, Some("`frame` is one frame: ask `frames` for `count` of them")));
    let (code, missing) = json_of(&format!("/v1/datasets/v30-bframes/frame?camera=observation.images.top&index={index}"));
    assert_eq!(code, 404, "{missing}");
    assert!(missing["error"].as_str().is_some_and(|e| e.contains("no camera `observation.images.top` (cameras: ")), "{missing}");

    // SQL: answers cut at `max_rows`, errors with their position.
    let sql = |query: &str, path: &str| {
        let headers = [("Authorization", auth.as_str()), ("Accept", "application/json")];
        let (code, body) = http(&server.http, "POST", path, &headers, query.as_bytes());
        (code, serde_json::from_slice::<Value>(&body).expect("json"))
    };
    let (code, rows) = sql(r#"SELECT "index" FROM "v30-bframes".steps ORDER BY "index""#, "/v1/sql?max_rows=3");
    assert_eq!((code, rows), (200, json!([{"index": 0}, {"index": 1}, {"index": 2}])));
    let (code, error) = sql("SELECT nope\nFROM steps", "/v1/sql");
    assert_eq!((code, &error["position"]), (400, &json!({"line": 1, "column": 8})), "{error}");
    let (code, error) = sql("SELECT 1 FROM steps\nWHERE", "/v1/sql");
    assert_eq!((code, &error["position"]["line"]), (400, &json!(2)), "{error}");

    // A view saved from the console is a view like `lake view create`'s.
    let view = json!({"name": "long_ones", "sql": r#"SELECT episode_index FROM "v30-bframes".episodes WHERE length > 50"#});
    let post = |body: &Value| {
        let headers = [("Authorization", auth.as_str()), ("Content-Type", "application/json")];
        let (code, body) = http(&server.http, "POST", "/v1/views", &headers, body.to_string().as_bytes());
        (code, serde_json::from_slice::<Value>(&body).expect("json"))
    };
    let long = sql_rows(&root, r#"SELECT episode_index FROM "v30-bframes".episodes WHERE length > 50 ORDER BY 1"#);
    let (code, made) = post(&view);
    assert_eq!((code, made["kind"].as_str(), made["version"].as_u64()), (201, Some("view"), Some(1)), "{made}");
    assert_eq!(made["selects"][0]["episodes"], json!(long.iter().map(|r| r["episode_index"].clone()).collect::<Vec<_>>()));
    let (code, again) = post(&view);
    assert_eq!(code, 400, "{again}");
    assert!(again["error"].as_str().is_some_and(|e| e.contains("already exists")), "{again}");
    let (_, listed) = json_of("/v1/datasets");
    assert_eq!(listed["views"][0]["name"], "long_ones", "{listed}");
    let (code, refused) = json_of("/v1/datasets/long_ones/episodes");
    assert_eq!((code, refused["error"].as_str()), (400, Some("`long_ones` is a view; open the datasets it selects")));
    let summary = &listed["datasets"][0];
    assert_eq!((summary["duration_s"].as_f64(), summary["camera_list"].as_array().map(Vec::len)), (Some(10.0), Some(3)), "{summary}");
    assert!(summary["bytes"].as_u64().is_some_and(|b| b > 100_000), "{summary}");
}
