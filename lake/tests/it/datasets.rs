//! Every sample and real dataset ingests; the lake's steps and episodes equal the source, and
//! every step's packet row rebuilds exactly the frame LeRobot's timestamp rule picks.

use std::{
    collections::{BTreeMap, HashMap},
    path::{Path, PathBuf},
    sync::Arc,
};

use arrow::{
    array::{Array, AsArray},
    compute::cast,
    datatypes::{DataType, Field, Float32Type, Float64Type, Int64Type},
};
use lake_schemas::{InfoJson, PathTemplate, TemplateValue};
use lake_testkit::{FrameHash, PacketDecoder, read_parquet, sequential_frames, shared_dir, testdata};

use crate::common::{binaries, floats, ingest_ok, ints, lake, num, packet_rows, sql_rows, strings, table};

/// One source step: global index, frame index, timestamp, and image bytes per image camera.
#[derive(Debug, Clone)]
struct SourceStep {
    index: i64,
    frame: i64,
    timestamp: f32,
    episode: i64,
    task: i64,
    /// The action vector (`action`, or `actions` as some datasets name it), as stored (f32).
    action: Vec<f32>,
    images: HashMap<String, Vec<u8>>,
}

fn parquet_files(dir: &Path) -> Vec<PathBuf> {
    crate::common::files_under(dir).into_iter().filter(|p| p.extension().is_some_and(|x| x == "parquet")).collect()
}

/// Source steps per episode, read straight from the data parquet files.
fn source_steps(src: &Path, image_cameras: &[String]) -> BTreeMap<i64, Vec<SourceStep>> {
    let mut out: BTreeMap<i64, Vec<SourceStep>> = BTreeMap::new();
    for file in parquet_files(&src.join("data")) {
        for b in read_parquet(&file) {
            let col = |n: &str| {
                cast(b.column_by_name(n).expect("index column"), &DataType::Int64)
                    .expect("int")
                    .as_primitive::<Int64Type>()
                    .values()
                    .to_vec()
            };
            let (ep, fr, idx) = (col("episode_index"), col("frame_index"), col("index"));
            let ts = cast(b.column_by_name("timestamp").expect("timestamp"), &DataType::Float32).expect("f32");
            let ts = ts.as_primitive::<Float32Type>().values().to_vec();
            let tasks = col("task_index");
            let actions = b.column_by_name("action").or_else(|| b.column_by_name("actions")).map(|a| {
                let list = cast(a, &DataType::List(Arc::new(Field::new("item", DataType::Float32, true)))).expect("action is a list");
                let list = list.as_list::<i32>();
                (0..list.len()).map(|r| list.value(r).as_primitive::<Float32Type>().values().to_vec()).collect::<Vec<_>>()
            });
            for r in 0..b.num_rows() {
                let images = image_cameras
                    .iter()
                    .map(|c| {
                        let s = b.column_by_name(c).expect("image column").as_struct();
                        (c.clone(), s.column_by_name("bytes").expect("bytes").as_binary::<i32>().value(r).to_vec())
                    })
                    .collect();
                let action = actions.as_ref().map(|a| a[r].clone()).unwrap_or_default();
                out.entry(ep[r]).or_default().push(SourceStep {
                    index: idx[r],
                    frame: fr[r],
                    timestamp: ts[r],
                    episode: ep[r],
                    task: tasks[r],
                    action,
                    images,
                });
            }
        }
    }
    for steps in out.values_mut() {
        steps.sort_by_key(|s| s.frame);
    }
    out
}

/// `(file, from_timestamp)` of every (episode, camera), from the source metadata.
fn source_videos(src: &Path, info: &InfoJson, cameras: &[String]) -> HashMap<(i64, String), (PathBuf, f64)> {
    let mut out = HashMap::new();
    let Some(template) = info.video_path.as_deref().map(PathTemplate::new) else { return out };
    if info.codebase_version.starts_with("v2") {
        let text = std::fs::read_to_string(src.join("meta/episodes.jsonl")).expect("episodes.jsonl");
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let e = serde_json::from_str::<serde_json::Value>(line).expect("json")["episode_index"].as_i64().expect("index");
            for cam in cameras {
                let path = template
                    .format(&[
                        ("episode_chunk", TemplateValue::Int(e / 1000)),
                        ("video_key", cam.as_str().into()),
                        ("episode_index", TemplateValue::Int(e)),
                    ])
                    .expect("template");
                out.insert((e, cam.clone()), (src.join(path), 0.0));
            }
        }
        return out;
    }
    for shard in parquet_files(&src.join("meta/episodes")) {
        for b in read_parquet(&shard) {
            let int =
                |n: &str| cast(b.column_by_name(n).expect(n), &DataType::Int64).expect("int").as_primitive::<Int64Type>().values().to_vec();
            let eps = int("episode_index");
            for cam in cameras {
                let (chunk, file) = (int(&format!("videos/{cam}/chunk_index")), int(&format!("videos/{cam}/file_index")));
                let from = cast(b.column_by_name(&format!("videos/{cam}/from_timestamp")).expect("from"), &DataType::Float64).expect("f64");
                let from = from.as_primitive::<Float64Type>().values().to_vec();
                for r in 0..b.num_rows() {
                    let path = template
                        .format(&[
                            ("video_key", cam.as_str().into()),
                            ("chunk_index", TemplateValue::Int(chunk[r])),
                            ("file_index", TemplateValue::Int(file[r])),
                        ])
                        .expect("template");
                    out.insert((eps[r], cam.clone()), (src.join(path), from[r]));
                }
            }
        }
    }
    out
}

/// Ingests `src` and checks it against the source, expecting exactly `expected` episodes.
fn check_dataset(src: &Path, flags: &[&str], expected: &[i64]) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("lake");
    let name = src.file_name().expect("name").to_str().expect("utf-8");
    ingest_ok(&root, src, flags);

    let info = InfoJson::parse(&std::fs::read_to_string(src.join("meta/info.json")).expect("info")).expect("info parses");
    let features = info.parsed_features().expect("features");
    let image_cameras: Vec<String> = features.iter().filter(|f| f.dtype == "image").map(|f| f.name.clone()).collect();
    let truth = source_steps(src, &image_cameras);

    // Episodes and their lengths.
    let episodes = table(&root, name, "episodes");
    assert_eq!(ints(&episodes, "episode_index"), expected, "{name}: ingested episodes");
    let lengths: Vec<i64> = expected.iter().map(|e| truth[e].len() as i64).collect();
    assert_eq!(ints(&episodes, "length"), lengths, "{name}: episode lengths");

    // Steps: one per source row of the ingested episodes, in order, with the same values.
    let steps = table(&root, name, "steps");
    let want: Vec<&SourceStep> = expected.iter().flat_map(|e| &truth[e]).collect();
    assert_eq!(steps.iter().map(|b| b.num_rows()).sum::<usize>(), want.len(), "{name}: step count");
    assert_eq!(ints(&steps, "index"), want.iter().map(|s| s.index).collect::<Vec<_>>(), "{name}: index column");
    assert_eq!(ints(&steps, "frame_index"), want.iter().map(|s| s.frame).collect::<Vec<_>>(), "{name}: frame_index column");
    let ts: Vec<f32> = floats(&steps, "timestamp").into_iter().map(|t| t as f32).collect();
    assert_eq!(ts, want.iter().map(|s| s.timestamp).collect::<Vec<_>>(), "{name}: timestamps");
    let step_episodes = ints(&steps, "episode_index");
    assert!(strings(&steps, "task").iter().all(Option::is_some), "{name}: every step has its task");

    check_frames(&root, name, src, &info, &steps, &step_episodes, &want);
    check_packets(&root, name, &info, &steps, &want);
    check_sql(&root, name, &info, expected, &want);
    tmp
}

/// The packets of a spread of steps, every camera with a window of three frames, decode on the
/// consumer's side to the frame path's samples, byte for byte; and lake-gpu's resize (its CPU
/// twin) gives those frames at a third of their size as the frame tables' resizer does.
fn check_packets(root: &Path, name: &str, info: &InfoJson, steps: &[arrow::array::RecordBatch], want: &[&SourceStep]) {
    let cameras = packet_rows(steps);
    if cameras.is_empty() {
        return;
    }
    let dt = 1.0 / info.fps;
    let windows: Vec<String> = cameras.iter().map(|(c, _)| format!("\"{c}\": [{}, 0.0, {dt}]", -dt)).collect();
    let windows = format!("{{{}}}", windows.join(", "));
    let indices: Vec<String> = want.iter().step_by((want.len() / 40).max(1)).map(|s| s.index.to_string()).collect();
    let indices = indices.join(",");
    let args = ["sample", "--dataset", name, "--indices", &indices, "--delta-timestamps", &windows];
    let dir = root.parent().expect("parent");
    let frames = dir.join(format!("{name}.windows.arrow"));
    let run = lake(root, &[&args[..], &["--out", frames.to_str().expect("utf-8")]].concat());
    assert_eq!(run.code, 0, "{run:#?}");
    let rgb = crate::common::read_arrow(&frames);
    crate::common::packets_decode_to(root, &args, &dir.join(format!("{name}.packets.arrow")), &rgb, None);
    check_gpu_resize(name, &rgb);
}

/// The first frames of each camera of `rgb` resized to a third of their size (a ratio that is
/// rarely whole) by lake-gpu's resize twin and by `lake_codec::RgbResizer` (libswscale, as frame
/// tables are written): the same bytes. Odd widths are skipped: the kernels leave those to
/// libswscale.
fn check_gpu_resize(name: &str, rgb: &arrow::array::RecordBatch) {
    use arrow::array::{Array as _, AsArray as _};
    for (field, column) in rgb.schema().fields().iter().zip(rgb.columns()) {
        let Some(shape) = field.metadata().get("frame_shape") else { continue };
        let [h, w, _]: [u32; 3] = serde_json::from_str(shape).expect("a frame shape");
        if w % 2 == 1 {
            continue;
        }
        let to = ((w / 3).max(1), (h / 3).max(1));
        let twin = lake_gpu::resize::Resize::new((w, h), to).expect("the kernels resize these frames");
        let mut resizer = lake_codec::RgbResizer::new((w, h), to).expect("libswscale");
        let list = column.as_fixed_size_list();
        let values = list.values().as_primitive::<arrow::datatypes::UInt8Type>().values();
        let values = &values[list.offset() * list.value_length() as usize..];
        for (k, frame) in values.chunks_exact((w * h * 3) as usize).take(6).enumerate() {
            let mut got = vec![0_u8; (to.0 * to.1 * 3) as usize];
            lake_gpu::resize::resize_on_cpu(&[frame], &twin, lake_gpu::colour::Target::Rgb24, &mut got).expect("twin");
            assert!(got == resizer.resize(frame).expect("resize"), "{name} {}: frame {k} resized to {to:?} differs", field.name());
        }
    }
}

/// `lake sql` answers about the dataset equal facts computed here from the source files: steps
/// per episode and per task, min/max/mean of every action dimension, and `feature_stats`' exact
/// quantiles (against the sorted source values).
fn check_sql(root: &Path, name: &str, info: &InfoJson, expected: &[i64], want: &[&SourceStep]) {
    let q = |query: String| sql_rows(root, &query);
    let per_episode =
        q(format!("SELECT episode_index, count(*) AS n FROM steps WHERE dataset = '{name}' GROUP BY episode_index ORDER BY episode_index"));
    let truth: Vec<(f64, f64)> = expected.iter().map(|e| (*e as f64, want.iter().filter(|s| s.episode == *e).count() as f64)).collect();
    let got: Vec<(f64, f64)> = per_episode.iter().map(|r| (num(r, "episode_index"), num(r, "n"))).collect();
    assert_eq!(got, truth, "{name}: steps per episode through SQL");

    let mut tasks: BTreeMap<i64, usize> = BTreeMap::new();
    for s in want {
        *tasks.entry(s.task).or_default() += 1;
    }
    let per_task = q(format!("SELECT task_index, count(*) AS n FROM \"{name}\".steps GROUP BY task_index ORDER BY task_index"));
    let got: Vec<(f64, f64)> = per_task.iter().map(|r| (num(r, "task_index"), num(r, "n"))).collect();
    assert_eq!(got, tasks.iter().map(|(t, n)| (*t as f64, *n as f64)).collect::<Vec<_>>(), "{name}: steps per task through SQL");

    let features = info.parsed_features().expect("features");
    let Some(key) = ["action", "actions"].into_iter().find(|k| features.iter().any(|f| f.name == *k)) else { return };
    let dims = want[0].action.len();
    let select: Vec<String> =
        (1..=dims).map(|d| format!("min({key}[{d}]) AS min{d}, max({key}[{d}]) AS max{d}, avg({key}[{d}]) AS mean{d}")).collect();
    let row = &q(format!("SELECT {} FROM \"{name}\".steps", select.join(", ")))[0];
    let stats = q(format!(
        "SELECT dim, count, min, max, q01, q10, q50, q90, q99 FROM feature_stats \
         WHERE dataset = '{name}' AND feature = '{key}' AND episode_index IS NULL ORDER BY dim"
    ));
    assert_eq!(stats.len(), dims, "{name}: one feature_stats row per action dimension");
    for (d, s) in stats.iter().enumerate() {
        let mut values: Vec<f64> = want.iter().map(|s| f64::from(s.action[d])).collect();
        values.sort_by(f64::total_cmp);
        let mean = values.iter().sum::<f64>() / values.len() as f64;
        let (lo, hi) = (values[0], values[values.len() - 1]);
        assert_eq!(num(row, &format!("min{}", d + 1)) as f32, lo as f32, "{name}: min of {key}[{d}]");
        assert_eq!(num(row, &format!("max{}", d + 1)) as f32, hi as f32, "{name}: max of {key}[{d}]");
        let got_mean = num(row, &format!("mean{}", d + 1));
        assert!((got_mean - mean).abs() <= 1e-9 * mean.abs().max(1.0), "{name}: mean of {key}[{d}]: {got_mean} vs {mean}");
        // JSON numbers parse to within an ulp; the values themselves are f32 actions.
        let got = (num(s, "count") as usize, num(s, "min") as f32, num(s, "max") as f32);
        assert_eq!(got, (values.len(), lo as f32, hi as f32), "{name}: feature_stats {key}[{d}]");
        for (col, p) in [("q01", 0.01), ("q10", 0.10), ("q50", 0.50), ("q90", 0.90), ("q99", 0.99)] {
            // Reference: the value at fractional rank p·(n−1), by linear interpolation.
            let rank = p * (values.len() - 1) as f64;
            let (below, frac) = (rank as usize, rank.fract());
            let above = values[(below + 1).min(values.len() - 1)];
            let reference = values[below] * (1.0 - frac) + above * frac;
            let got = num(s, col);
            assert!((got - reference).abs() <= 1e-9 * reference.abs().max(1.0), "{name}: {col} of {key}[{d}]: {got} vs {reference}");
        }
    }
}

/// Every camera frame of every step: its packet row is in its stream, shows the frame whose
/// time is `from_timestamp + timestamp` (LeRobot's rule, computed here from the source), and
/// decoding rows `row - keyframe_offset ..= row` gives exactly the sequentially decoded frame.
fn check_frames(
    root: &Path,
    name: &str,
    src: &Path,
    info: &InfoJson,
    steps: &[arrow::array::RecordBatch],
    step_episodes: &[i64],
    want: &[&SourceStep],
) {
    let cameras = packet_rows(steps);
    if cameras.is_empty() {
        return;
    }
    let streams = table(root, name, "streams");
    let packets = table(root, name, "packets");
    let (p_stream, p_pts, p_dts, p_off, p_data) = (
        ints(&packets, "stream"),
        ints(&packets, "pts"),
        ints(&packets, "dts"),
        ints(&packets, "keyframe_offset"),
        binaries(&packets, "data"),
    );
    let s_id = ints(&streams, "stream");
    let (s_kind, s_codec, s_file) = (strings(&streams, "kind"), strings(&streams, "codec"), strings(&streams, "file"));
    let (s_first, s_packets, s_w, s_h) =
        (ints(&streams, "first_row"), ints(&streams, "packets"), ints(&streams, "width"), ints(&streams, "height"));
    let (s_tbn, s_tbd) = (ints(&streams, "time_base_num"), ints(&streams, "time_base_den"));
    let s_extra = binaries(&streams, "extradata");
    let video_cams: Vec<String> = cameras.iter().map(|c| c.0.clone()).filter(|c| !want[0].images.contains_key(c)).collect();
    let videos = source_videos(src, info, &video_cams);

    let mut sequential: HashMap<i64, Vec<(i64, FrameHash)>> = HashMap::new();
    let mut decoders: HashMap<i64, PacketDecoder> = HashMap::new();
    let mut checked = 0usize;
    for (camera, rows) in &cameras {
        for (i, &row) in rows.iter().enumerate() {
            let row = row as usize;
            let sid = p_stream[row];
            let k = s_id.iter().position(|s| *s == sid).expect("stream listed");
            assert!((s_first[k]..s_first[k] + s_packets[k]).contains(&(row as i64)), "{name}: row {row} outside stream {sid}");
            if s_kind[k].as_deref() == Some("image") {
                assert_eq!(
                    p_data[row].as_deref(),
                    Some(want[i].images[camera].as_slice()),
                    "{name}: image bytes of step {i} camera {camera}"
                );
                continue;
            }
            let (file, from) = &videos[&(step_episodes[i], camera.clone())];
            assert_eq!(src.join(s_file[k].as_deref().expect("file")), *file, "{name}: stream file of step {i} camera {camera}");
            let seq = sequential.entry(sid).or_insert_with(|| sequential_frames(file));
            let tb = s_tbn[k] as f64 / s_tbd[k] as f64;
            // LeRobot: query = from_timestamp + timestamp; the frame nearest to it, within 1e-4 s.
            let query = from + f64::from(want[i].timestamp);
            let (near_pts, _) =
                seq.iter().min_by(|a, b| ((a.0 as f64 * tb) - query).abs().total_cmp(&((b.0 as f64 * tb) - query).abs())).expect("frames");
            assert!((*near_pts as f64 * tb - query).abs() <= 1e-4, "{name}: no frame within tolerance for step {i} camera {camera}");
            assert_eq!(p_pts[row], *near_pts, "{name}: step {i} camera {camera} points at pts {} but LeRobot picks {near_pts}", p_pts[row]);
            let want_hash = seq.iter().find(|(p, _)| *p == *near_pts).expect("decoded").1;
            let start = row - p_off[row] as usize;
            assert!(p_stream[start..=row].iter().all(|s| *s == sid), "{name}: decode range crosses streams");
            let pkts: Vec<(i64, i64, &[u8])> = (start..=row).map(|r| (p_pts[r], p_dts[r], p_data[r].as_deref().expect("data"))).collect();
            let decoder = decoders.entry(sid).or_insert_with(|| {
                PacketDecoder::new(s_codec[k].as_deref().expect("codec"), s_extra[k].as_deref(), s_w[k] as u32, s_h[k] as u32)
            });
            let got = decoder.decode(&pkts, p_pts[row]);
            assert_eq!(
                got,
                Some(want_hash),
                "{name}: step {i} camera {camera}: rows {start}..={row} do not rebuild the frame at pts {}",
                p_pts[row]
            );
            checked += 1;
        }
    }
    assert!(checked > 0 || video_cams.is_empty(), "{name}: no video frame checked");
}

#[test]
fn sample_av1_two_cameras() {
    let _ = check_dataset(&testdata("v30-av1-small"), &[], &[0, 1, 2, 3, 4, 5]);
}

#[test]
fn sample_h264_multifile_per_camera_offsets() {
    let src = testdata("v30-h264-multifile");
    let tmp = check_dataset(&src, &[], &[0, 1, 2, 3, 4]);
    // A tolerance wider than a frame period (LeRobot takes any) still picks each step's nearest
    // frame, also at the border between two episodes of one file.
    let root = tmp.path().join("lake");
    let wide = ingest_ok(&root, &src, &["--tolerance-s", "0.04"]);
    assert!(wide.stdout.contains("no findings"), "{wide:#?}");
    let steps = |version: &str| packet_rows(&table(&root, &format!("v30-h264-multifile@{version}"), "steps"));
    assert_eq!(steps("2"), steps("1"));
}

#[test]
fn sample_png_images_in_parquet() {
    let tmp = check_dataset(&testdata("v30-images-tiny"), &[], &[0, 1, 2]);
    // Asking for the size every camera is recorded at, without a table of it, says so.
    let out = tmp.path().join("x.arrow");
    let run = lake(
        &tmp.path().join("lake"),
        &["sample", "--dataset", "v30-images-tiny", "--indices", "0", "--out", out.to_str().expect("utf-8"), "--frame-size", "48x36"],
    );
    assert_eq!(run.code, 2, "{run:#?}");
    assert!(run.stderr.contains("every camera is recorded at 48x36: leave out the frame size"), "{run:#?}");
    // Indices from a file (for more than a command line holds) are those indices.
    let list = tmp.path().join("indices.txt");
    std::fs::write(&list, "5, 3\n59\n").expect("write");
    let (from_file, inline) = (tmp.path().join("f.arrow"), tmp.path().join("i.arrow"));
    let at = format!("@{}", list.display());
    for (indices, out) in [(format!("0,{at},1"), &from_file), ("0,5,3,59,1".to_string(), &inline)] {
        let run = lake(
            &tmp.path().join("lake"),
            &["sample", "--dataset", "v30-images-tiny", "--indices", &indices, "--out", out.to_str().expect("utf-8")],
        );
        assert_eq!(run.code, 0, "{run:#?}");
    }
    assert_eq!(crate::common::read_arrow(&from_file), crate::common::read_arrow(&inline));
}

#[test]
fn real_lingzu_mpeg4_gop12_missing_videos() {
    let src = shared_dir().join("lerobot-real/lingzu-open50-v30");
    let kept = [0, 3, 4, 5];
    let tmp = check_dataset(&src, &["--skip-bad-episodes"], &kept);

    // Camera statistics cover the ingested episodes only: the per-episode ones of the source,
    // aggregated (its dataset-level ones span all 50 episodes).
    let mut count = 0;
    for file in parquet_files(&src.join("meta/episodes")) {
        for b in read_parquet(&file) {
            let episodes = cast(b.column_by_name("episode_index").expect("episode_index"), &DataType::Int64).expect("int");
            let counts = b.column_by_name("stats/image/count").expect("per-episode image count");
            let counts = cast(&counts.as_list::<i32>().values().clone(), &DataType::Int64).expect("int");
            for (episode, n) in episodes.as_primitive::<Int64Type>().values().iter().zip(counts.as_primitive::<Int64Type>().values()) {
                count += if kept.contains(episode) { *n } else { 0 };
            }
        }
    }
    let stats: serde_json::Value = serde_json::from_str(&run_stats(&tmp.path().join("lake"), "lingzu-open50-v30")).expect("stats.json");
    assert_eq!(stats["image"]["count"], serde_json::json!([count]), "{}", stats["image"]);
}

/// `--missing-video keep-rows` keeps all 50 episodes' rows of a dataset whose videos are there
/// for 4 of them: SQL and statistics see every step, a sample of an episode with its video
/// decodes, and one of an episode without is refused naming dataset, camera, episode and frame.
#[test]
fn missing_videos_keep_their_rows_and_refuse_their_frames_by_name() {
    let src = shared_dir().join("lerobot-real/lingzu-open50-v30");
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("lake");
    let refused = lake(&root, &["ingest", src.to_str().expect("utf-8")]);
    assert_eq!(refused.code, 1, "{refused:#?}");
    assert!(
        refused.stderr.contains("46 of 50 episodes lack a video file") && refused.stderr.contains("--missing-video keep-rows"),
        "{}",
        refused.stderr
    );

    let run = ingest_ok(&root, &src, &["--missing-video", "keep-rows"]);
    assert!(run.stdout.contains("50 of 50 episodes"), "{}", run.stdout);
    let ds = "\"lingzu-open50-v30\"";
    let counts = sql_rows(&root, &format!("SELECT count(*) AS steps, count(DISTINCT episode_index) AS episodes FROM {ds}.steps"));
    assert_eq!((num(&counts[0], "steps"), num(&counts[0], "episodes")), (20_814.0, 50.0), "{counts:?}");
    let warned = sql_rows(&root, &format!("SELECT count(*) AS n FROM {ds}.findings WHERE kind = 'missing-file' AND severity = 'warning'"));
    assert_eq!(num(&warned[0], "n"), 46.0, "{warned:?}");
    let stats: serde_json::Value = serde_json::from_str(&run_stats(&root, "lingzu-open50-v30")).expect("stats.json");
    assert_eq!(stats["state"]["count"], serde_json::json!([20_814]), "{}", stats["state"]);

    let first_step = |episode: i64| {
        let rows = sql_rows(&root, &format!("SELECT min(index) AS i FROM {ds}.steps WHERE episode_index = {episode}"));
        (num(&rows[0], "i") as i64 + 2).to_string()
    };
    let out = tmp.path().join("sample.arrow");
    let with_video =
        lake(&root, &["sample", "--dataset", "lingzu-open50-v30", "--indices", &first_step(0), "--out", out.to_str().expect("utf-8")]);
    assert_eq!(with_video.code, 0, "{with_video:#?}");
    let without =
        lake(&root, &["sample", "--dataset", "lingzu-open50-v30", "--indices", &first_step(1), "--out", out.to_str().expect("utf-8")]);
    assert_ne!(without.code, 0, "{without:#?}");
    assert!(
        without.stderr.contains("dataset lingzu-open50-v30@1, camera image, episode 1, frame 2: the episode has no video for this camera"),
        "{}",
        without.stderr
    );

    // LeRobot's format needs every camera's video: the export says which episodes lack it.
    let export = lake(&root, &["export", "lingzu-open50-v30", "--format", "lerobot-v3", tmp.path().join("out").to_str().expect("utf-8")]);
    assert_ne!(export.code, 0, "{export:#?}");
    assert!(export.stderr.contains("46 episode(s) (the first is episode 1) have no video for camera image"), "{}", export.stderr);

    // A stream over every episode is refused before its first batch, with the view that samples
    // the episodes that have their video; that view streams.
    let bench = ["bench", "--preset", "none", "--batches", "2", "--batch-size", "4", "--dataset"];
    let refused = lake(&root, &[&bench[..], &["lingzu-open50-v30"]].concat());
    assert_ne!(refused.code, 0, "{refused:#?}");
    assert!(
        refused.stderr.contains("46 of the 50 episodes sampled have no video for camera image (episodes 1, 2, 6 to 49)")
            && !refused.stderr.contains("first batch"),
        "{}",
        refused.stderr
    );
    let view = run_suggested_view(&root, &refused.stderr);
    assert!(view.stdout.contains("4 episodes"), "{view:#?}");
    let streamed = lake(&root, &[&bench[..], &["lingzu-open50-v30-with-video"]].concat());
    assert_eq!(streamed.code, 0, "{streamed:#?}");
}

/// Runs the `lake view create NAME "QUERY" [ARGS]` a refusal suggests, and checks it succeeded.
fn run_suggested_view(root: &Path, refusal: &str) -> crate::common::Run {
    let (_, command) = refusal.split_once("lake view create ").unwrap_or_else(|| panic!("no view suggested: {refusal}"));
    let (name, rest) = command.split_once(" \"").expect("a quoted query");
    let (query, rest) = rest.split_once('"').expect("the query's end");
    let mut args = vec!["view", "create", name, query];
    args.extend(rest.split_whitespace());
    let made = lake(root, &args);
    assert_eq!(made.code, 0, "{made:#?}");
    made
}

/// A camera none of whose files were there at ingest (`--missing-video keep-rows`) is refused
/// when the dataset is opened for sampling, naming both remedies; the view it suggests leaves
/// the camera out and streams the steps without frames.
#[test]
fn a_camera_without_any_video_names_its_remedies() {
    let src = shared_dir().join("lerobot-real/reachy2-apple-storage-v30");
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("lake");
    ingest_ok(&root, &src, &["--missing-video", "keep-rows"]);
    let bench = ["bench", "--preset", "none", "--batches", "2", "--batch-size", "4", "--dataset"];
    let refused = lake(&root, &[&bench[..], &["reachy2-apple-storage-v30"]].concat());
    assert_ne!(refused.code, 0, "{refused:#?}");
    assert!(
        refused.stderr.contains("camera observation.image has no frames") && refused.stderr.contains("--drop-missing-cameras"),
        "{}",
        refused.stderr
    );
    run_suggested_view(&root, &refused.stderr);
    let streamed = lake(&root, &[&bench[..], &["reachy2-apple-storage-v30-without-video"]].concat());
    assert_eq!(streamed.code, 0, "{streamed:#?}");
}

#[test]
fn real_g1_v21_av1_missing_videos() {
    let src = shared_dir().join("lerobot-real/g1-pick-bottle-v21");
    let tmp = check_dataset(&src, &["--skip-bad-episodes"], &[1, 2, 4, 5]);
    let root = tmp.path().join("lake");

    // The source keeps camera statistics per episode only (v2.1): `lake stats` aggregates those
    // of the ingested episodes, as LeRobot does when it loads the dataset.
    let kept: Vec<i64> = crate::common::sql_rows(&root, "SELECT episode_index FROM \"g1-pick-bottle-v21\".episodes")
        .iter()
        .map(|r| crate::common::num(r, "episode_index") as i64)
        .collect();
    let (mut count, mut weighted_mean) = (0.0, 0.0);
    for line in std::fs::read_to_string(src.join("meta/episodes_stats.jsonl")).expect("episodes_stats").lines() {
        let row: serde_json::Value = serde_json::from_str(line).expect("json line");
        if kept.contains(&row["episode_index"].as_i64().expect("episode")) {
            let cam = &row["stats"]["observation.images.cam_high"];
            let n = cam["count"][0].as_f64().expect("count");
            count += n;
            weighted_mean += n * cam["mean"][0][0][0].as_f64().expect("mean");
        }
    }
    let run = crate::common::lake(&root, &["stats", "g1-pick-bottle-v21"]);
    assert_eq!(run.code, 0, "{run:#?}");
    let stats: serde_json::Value = serde_json::from_str(&run.stdout).expect("stats.json");
    let cam = &stats["observation.images.cam_high"];
    assert_eq!(cam["count"][0].as_f64(), Some(count), "{cam}");
    let mean = cam["mean"][0][0][0].as_f64().expect("mean");
    assert!((mean - weighted_mean / count).abs() < 1e-12, "{mean} vs {}", weighted_mean / count);
    for stat in ["min", "max", "std"] {
        assert_eq!(cam[stat].as_array().map(Vec::len), Some(3), "{stat}: per channel, [3, 1, 1]: {cam}");
    }

    // Without its per-episode statistics the dataset still ingests, with a warning that says
    // what LeRobot will make of it.
    let copy = tmp.path().join("g1-no-stats");
    lake_testkit::copy_dir(&src, &copy);
    std::fs::remove_file(copy.join("meta/episodes_stats.jsonl")).expect("remove");
    let run = crate::common::lake(&root, &["ingest", copy.to_str().expect("utf-8"), "--skip-bad-episodes", "--json"]);
    assert_eq!(run.code, 0, "{run:#?}");
    let out: serde_json::Value = serde_json::from_str(&run.stdout).expect("json");
    let findings = out["report"]["findings"].as_array().expect("findings");
    assert!(
        findings.iter().any(|f| f["severity"] == "warning"
            && f["file"] == "meta/episodes_stats.jsonl"
            && f["message"].as_str().is_some_and(|m| m.contains("LeRobot cannot load this v2.1 dataset"))),
        "{findings:#?}"
    );

    // The same recording as v2.0 (dataset statistics in meta/stats.json, none per episode)
    // ingests to the same steps, with the cameras' statistics taken from stats.json.
    let info = copy.join("meta/info.json");
    let mut meta: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&info).expect("info")).expect("json");
    meta["codebase_version"] = "v2.0".into();
    std::fs::write(&info, serde_json::to_vec_pretty(&meta).expect("json")).expect("write");
    std::fs::write(copy.join("meta/stats.json"), run_stats(&root, "g1-pick-bottle-v21")).expect("stats.json");
    let run = crate::common::lake(&root, &["ingest", copy.to_str().expect("utf-8"), "--name", "g1-v20", "--skip-bad-episodes", "--json"]);
    assert_eq!(run.code, 0, "{run:#?}");
    let out: serde_json::Value = serde_json::from_str(&run.stdout).expect("json");
    assert_eq!(out["record"]["source"]["codebase_version"], "v2.0");
    assert!(!run.stdout.contains("episodes_stats.jsonl is missing"), "v2.0 keeps no per-episode statistics");
    let count = |name: &str| {
        let rows = crate::common::sql_rows(&root, &format!("SELECT count(*) AS n, sum(index) AS s FROM \"{name}\".steps"));
        (crate::common::num(&rows[0], "n"), crate::common::num(&rows[0], "s"))
    };
    assert_eq!(count("g1-v20"), count("g1-pick-bottle-v21"));
    let v20: serde_json::Value = serde_json::from_str(&run_stats(&root, "g1-v20")).expect("stats");
    assert_eq!(v20["observation.images.cam_high"]["mean"], stats["observation.images.cam_high"]["mean"]);

    // v2.x tasks are looked up by their `task_index`, not their line (LeRobot makes a dict of
    // the lines): listed out of order, every step still gets task 0's text.
    let task = "Pick up the yellow bottle on the table.";
    let tasks = copy.join("meta/tasks.jsonl");
    std::fs::write(&tasks, format!("{{\"task_index\": 1, \"task\": \"other\"}}\n{{\"task_index\": 0, \"task\": \"{task}\"}}\n"))
        .expect("tasks");
    ingest_ok(&root, &copy, &["--name", "g1-tasks", "--skip-bad-episodes"]);
    let rows = crate::common::sql_rows(&root, "SELECT DISTINCT task_index, task FROM \"g1-tasks\".steps");
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!((rows[0]["task_index"].as_i64(), rows[0]["task"].as_str()), (Some(0), Some(task)));
    let table = crate::common::sql_rows(&root, "SELECT task_index, task FROM \"g1-tasks\".tasks");
    assert_eq!(table.iter().map(|r| r["task"].as_str().expect("task")).collect::<Vec<_>>(), [task, "other"]);
    // A task_index no line has is refused, naming the file's rule.
    std::fs::write(&tasks, format!("{{\"task_index\": 5, \"task\": \"{task}\"}}\n")).expect("tasks");
    let run = crate::common::lake(
        &root,
        &["ingest", copy.to_str().expect("utf-8"), "--name", "g1-unknown-task", "--skip-bad-episodes", "--json"],
    );
    assert_eq!(run.code, 1, "{run:#?}");
    let out: serde_json::Value = serde_json::from_str(&run.stdout).expect("json");
    let unknown = out["report"]["findings"].as_array().expect("findings").iter().filter(|f| f["kind"] == "unknown-task");
    let messages: Vec<&str> = unknown.map(|f| f["message"].as_str().expect("message")).collect();
    assert_eq!(messages.len(), 100, "one per episode");
    assert!(messages.iter().all(|m| m.starts_with("task_index 0: no line of meta/tasks.jsonl has it")), "{messages:?}");
}

/// `lake stats NAME` (LeRobot's stats.json) as text.
fn run_stats(root: &Path, name: &str) -> String {
    let run = crate::common::lake(root, &["stats", name]);
    assert_eq!(run.code, 0, "{run:#?}");
    run.stdout
}

#[test]
fn real_so101_without_any_video() {
    let src = shared_dir().join("lerobot-real/so101-record-test-v30");
    // Strict and skip modes refuse (every episode lacks its videos) and say what would help.
    let tmp = tempfile::tempdir().expect("tmp");
    let run = crate::common::lake(tmp.path(), &["ingest", src.to_str().expect("utf-8"), "--skip-bad-episodes"]);
    assert_eq!(run.code, 1, "{run:#?}");
    assert!(run.stderr.contains("--drop-missing-cameras"), "{}", run.stderr);
    let tmp = check_dataset(&src, &["--drop-missing-cameras"], &[0, 1, 2, 3]);
    // Cameras left out have no statistics either.
    let stats: serde_json::Value = serde_json::from_str(&run_stats(&tmp.path().join("lake"), "so101-record-test-v30")).expect("stats.json");
    let cameras: Vec<&String> = stats.as_object().expect("object").keys().filter(|k| k.starts_with("observation.images")).collect();
    assert!(cameras.is_empty(), "{cameras:?}");
}

#[test]
fn real_reachy2_channel_first_and_wrong_totals() {
    let _ = check_dataset(&shared_dir().join("lerobot-real/reachy2-apple-storage-v30"), &["--drop-missing-cameras"], &[0, 1, 2]);
}

/// Streams whose decode order differs from presentation order (HEVC `I B I B`, as x265 writes
/// with GOP 2, and H.264 with B-pyramids): every frame still resolves and rebuilds.
#[test]
fn b_frame_streams_rebuild_every_frame() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = tmp.path().join("bframes");
    lake_testkit::copy_dir(&testdata("v30-av1-small"), &src);
    let front = src.join("videos/observation.images.front/chunk-000/file-000.mp4");
    let wrist = src.join("videos/observation.images.wrist/chunk-000/file-000.mp4");
    let (front_in, wrist_in) = (tmp.path().join("front.mp4"), tmp.path().join("wrist.mp4"));
    std::fs::rename(&front, &front_in).expect("move");
    std::fs::rename(&wrist, &wrist_in).expect("move");
    let s = |p: &Path| p.to_str().expect("utf-8").to_string();
    lake_testkit::ffmpeg(&["-i", &s(&front_in), "-c:v", "libx264", "-bf", "3", "-g", "12", "-pix_fmt", "yuv420p", &s(&front)]);
    lake_testkit::ffmpeg(&[
        "-i",
        &s(&wrist_in),
        "-c:v",
        "libx265",
        "-x265-params",
        "keyint=2:min-keyint=2:bframes=1:log-level=error",
        "-pix_fmt",
        "yuv420p",
        &s(&wrist),
    ]);
    let info_path = src.join("meta/info.json");
    let info = std::fs::read_to_string(&info_path).expect("info");
    let info = info.replacen("\"video.codec\": \"av1\"", "\"video.codec\": \"h264\"", 1).replacen(
        "\"video.codec\": \"av1\"",
        "\"video.codec\": \"hevc\"",
        1,
    );
    std::fs::write(&info_path, info).expect("write info");
    let lake = check_dataset(&src, &[], &[0, 1, 2, 3, 4, 5]);
    let streams = table(&lake.path().join("lake"), "bframes", "streams");
    let reordered = streams[0].column_by_name("reordered").expect("reordered").as_boolean().clone();
    assert!(reordered.value(0) && reordered.value(1), "both re-encoded streams have B-frames");

    // The loader returns every step's frame exactly as a sequential decode of the file shows it
    // (LeRobot's own reader fails on about half of these).
    let root = lake.path().join("lake");
    let out = lake.path().join("all.arrow");
    let indices: Vec<String> = (0..600).map(|i| i.to_string()).collect();
    let run = crate::common::lake(&root, &["sample", "--dataset", "bframes", "--indices", &indices.join(","), "--out", &s(&out)]);
    assert_eq!(run.code, 0, "{run:#?}");
    let got = crate::common::read_arrow(&out);
    // The same frames from the stored frame table (decoded sequentially, B-frames reordered).
    let run = crate::common::lake(&root, &["cache", "bframes"]);
    assert_eq!(run.code, 0, "{run:#?}");
    let cached = lake.path().join("cached.arrow");
    let run = crate::common::lake(&root, &["sample", "--dataset", "bframes", "--indices", &indices.join(","), "--out", &s(&cached)]);
    assert_eq!(run.code, 0, "{run:#?}");
    assert!(crate::common::read_arrow(&cached) == got, "frames from the frame table differ from decoded ones");
    // The same frames from the packets, decoded on the consumer's side.
    let args = ["sample", "--dataset", "bframes", "--indices", &indices.join(","), "--frame-table", "off"];
    let (shipped, decoded) = crate::common::packets_decode_to(&root, &args, &lake.path().join("packets.arrow"), &got, None);
    assert!(shipped * 10 < decoded, "packets carry a tenth of the frames' bytes or less: {shipped} against {decoded}");
    for (camera, path) in [("observation.images.front", &front), ("observation.images.wrist", &wrist)] {
        let mut frames = lake_testkit::sequential_rgb(path);
        frames.sort_by_key(|f| f.0);
        assert_eq!(frames.len(), 600);
        let col = got.column_by_name(camera).expect("camera column").as_fixed_size_list().clone();
        for (i, (_, rgb)) in frames.iter().enumerate() {
            let value = col.value(i);
            let have = value.as_primitive::<arrow::datatypes::UInt8Type>().values();
            assert!(have == rgb.as_slice(), "{camera}: index {i} differs from the sequential decode");
        }
    }
}

/// `lake ingest OWNER/NAME` that is no directory here ingests the Hugging Face dataset's
/// snapshot from the local hub cache (the one `refs/main` names), under the repo's name; one
/// the cache does not hold is refused with how to download it first.
#[test]
fn a_hugging_face_repo_id_is_read_from_the_local_hub_cache() {
    let tmp = tempfile::tempdir().expect("tmp");
    let hub = tmp.path().join("hub");
    let repo = hub.join("datasets--lerobot--tiny");
    for snapshot in ["0ld", "ma1n"] {
        lake_testkit::copy_dir(&testdata("v30-images-tiny"), &repo.join("snapshots").join(snapshot));
    }
    std::fs::create_dir_all(repo.join("refs")).expect("refs");
    std::fs::write(repo.join("refs/main"), "ma1n\n").expect("refs/main");
    let root = tmp.path().join("lake");
    let run = |args: &[&str]| {
        let out = crate::common::lake_cmd(&root).args(args).env("HF_HUB_CACHE", &hub).current_dir(tmp.path()).output().expect("run lake");
        (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (code, stdout, stderr) = run(&["ingest", "lerobot/tiny"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("as tiny@1") && stdout.contains("snapshots/ma1n"), "{stdout}");
    let (code, _, stderr) = run(&["ingest", "lerobot/pusht"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("huggingface-cli download --repo-type dataset lerobot/pusht"), "{stderr}");
}

/// `lake train` in a build without libtorch (the default features) says how to get one, and
/// exits non-zero without touching the run's directory.
#[cfg(not(feature = "torch"))]
#[test]
fn train_without_libtorch_says_how_to_build_it() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("lake");
    let out = tmp.path().join("run");
    let run = crate::common::lake(&root, &["train", "--dataset", "x", "--steps", "1", "--out", out.to_str().expect("utf-8")]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("built without libtorch") && run.stderr.contains("scripts/torch-env.sh"), "{}", run.stderr);
    assert!(!out.exists());
    // Arguments that contradict each other are refused first, whatever the build.
    let run =
        crate::common::lake(&root, &["train", "--dataset", "x", "--steps", "1", "--decode", "gpu", "--out", out.to_str().expect("utf-8")]);
    assert!(run.code == 2 && run.stderr.contains("--decode gpu decodes on the run's GPU: add --device cuda"), "{}", run.stderr);
}
