//! `lake export`: a LeRobot v3.0 export ingests back into identical steps and packets, a view
//! exports only its episodes, LeRobot itself loads the export with the reference samples (when
//! its environment is installed), and a failed export leaves nothing behind.

use std::path::{Path, PathBuf};

use arrow::array::{Array, AsArray, RecordBatch};
use lake_testkit::{shared_dir, testdata};

use crate::common::{binaries, floats, ingest_ok, ints, lake, strings, table};

/// Steps as comparable rows: every column but the packet pointers, as text.
fn step_rows(batches: &[RecordBatch]) -> Vec<String> {
    let mut out = Vec::new();
    for b in batches {
        let columns: Vec<_> = b
            .schema()
            .fields()
            .iter()
            .enumerate()
            .filter(|(_, f)| f.name() != lake_schemas::tables::PACKET_ROW)
            .map(|(i, f)| {
                (f.name().clone(), arrow::util::display::ArrayFormatter::try_new(b.column(i).as_ref(), &Default::default()).expect("fmt"))
            })
            .collect();
        for r in 0..b.num_rows() {
            out.push(columns.iter().map(|(n, c)| format!("{n}={}", c.value(r))).collect::<Vec<_>>().join(" "));
        }
    }
    out
}

/// Packets that show a step's frame: (camera, episode, frame, keyframe flag, bytes), sorted.
fn frame_packets(batches: &[RecordBatch]) -> Vec<(String, i64, i64, Vec<u8>)> {
    let cams = strings(batches, "camera");
    let eps = ints(batches, "episode_index");
    let frames = ints(batches, "frame_index");
    let data = binaries(batches, "data");
    let mut out: Vec<_> = (0..cams.len())
        .filter(|&i| eps[i] >= 0)
        .map(|i| (cams[i].clone().expect("camera"), eps[i], frames[i], data[i].clone().expect("bytes")))
        .collect();
    out.sort();
    out
}

/// The one `meta/episodes/` parquet file of a LeRobot v3.0 dataset, read whole.
fn episodes_parquet(dataset: &Path) -> RecordBatch {
    let dir = dataset.join("meta/episodes/chunk-000");
    let file = std::fs::File::open(dir.join("file-000.parquet")).expect("meta/episodes/chunk-000/file-000.parquet");
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file).expect("parquet").build().expect("reader");
    let batches: Vec<RecordBatch> = reader.map(|b| b.expect("batch")).collect();
    arrow::compute::concat_batches(&batches[0].schema(), &batches).expect("concat")
}

/// The per-episode statistics columns (`stats/{feature}/{stat}`) of an episodes table, by name.
fn stats_columns(episodes: &RecordBatch) -> std::collections::BTreeMap<String, arrow::array::ArrayRef> {
    let schema = episodes.schema();
    schema
        .fields()
        .iter()
        .zip(episodes.columns())
        .filter(|(f, _)| f.name().starts_with("stats/"))
        .map(|(f, c)| (f.name().clone(), c.clone()))
        .collect()
}

fn export(root: &Path, spec: &str, format: &str, out: &Path) -> crate::common::Run {
    lake(root, &["export", spec, "--format", format, out.to_str().expect("utf-8")])
}

#[test]
fn lerobot_exports_ingest_back_into_identical_steps_and_packets() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (first, second) = (tmp.path().join("lake"), tmp.path().join("again"));
    for name in ["v30-av1-small", "v30-h264-multifile", "v30-images-tiny"] {
        ingest_ok(&first, &testdata(name), &[]);
        let out = tmp.path().join(format!("export-{name}"));
        let run = export(&first, name, "lerobot-v3", &out);
        assert_eq!(run.code, 0, "{run:#?}");
        // Per-episode statistics as LeRobot writes them: the same columns and types; counts,
        // integer minima and maxima and the cameras' (the source's) equal (lake's numbers are
        // exact over the stored values: float32 timestamps, true quantiles).
        let (source, written) = (stats_columns(&episodes_parquet(&testdata(name))), stats_columns(&episodes_parquet(&out)));
        let types = |c: &std::collections::BTreeMap<String, arrow::array::ArrayRef>| -> Vec<(String, arrow::datatypes::DataType)> {
            c.iter().map(|(n, a)| (n.clone(), a.data_type().clone())).collect()
        };
        assert_eq!(types(&written), types(&source), "{name}: meta/episodes statistics columns");
        for (column, values) in &written {
            let camera = column.contains("/observation.images.");
            let int = matches!(values.data_type(), arrow::datatypes::DataType::List(item) if item.data_type().is_integer());
            if camera || int {
                assert_eq!(values, &source[column], "{name}: {column}");
            }
        }
        let run = lake(&second, &["ingest", out.to_str().expect("utf-8"), "--name", name]);
        assert_eq!(run.code, 0, "{name}: the export ingests without findings: {run:#?}");
        assert!(run.stdout.contains("no findings") || run.stderr.contains("no findings"), "{name}: {run:#?}");
        assert_eq!(step_rows(&table(&second, name, "steps")), step_rows(&table(&first, name, "steps")), "{name}: steps");
        assert_eq!(frame_packets(&table(&second, name, "packets")), frame_packets(&table(&first, name, "packets")), "{name}: packets");
        lerobot_loads(&out, name);
    }
}

/// Episodes sharing one file whose GOPs run across episode boundaries (a camera re-encoded with
/// keyframes every 12 frames, B-frames, episodes of 60): each episode needs packets the one
/// before it wrote, and the export writes every packet once, so the whole dataset comes back
/// packet for packet.
#[test]
fn episodes_beginning_mid_gop_export_each_packet_once() {
    let tmp = tempfile::tempdir().expect("tmp");
    let source = tmp.path().join("gop12");
    lake_testkit::copy_dir(&testdata("v30-h264-multifile"), &source);
    let side = source.join("videos/observation.images.side/chunk-000/file-000.mp4");
    let reencoded = tmp.path().join("side.mp4");
    let args = ["-c:v", "libx264", "-g", "12", "-keyint_min", "12", "-sc_threshold", "0", "-bf", "2", "-pix_fmt", "yuv420p"];
    let (input, output) = (side.to_str().expect("utf-8"), reencoded.to_str().expect("utf-8"));
    lake_testkit::ffmpeg(&[&["-i", input], &args[..], &["-video_track_timescale", "15360", "-an", output]].concat());
    std::fs::rename(&reencoded, &side).expect("replace the side camera");
    let (first, second) = (tmp.path().join("lake"), tmp.path().join("again"));
    ingest_ok(&first, &source, &[]);
    let out = tmp.path().join("export");
    let run = export(&first, "gop12", "lerobot-v3", &out);
    assert_eq!(run.code, 0, "{run:#?}");
    let run = lake(&second, &["ingest", out.to_str().expect("utf-8"), "--name", "gop12"]);
    assert_eq!(run.code, 0, "{run:#?}");
    assert!(run.stdout.contains("no findings") || run.stderr.contains("no findings"), "no frame belongs to no step: {run:#?}");
    let per_camera = |root: &Path| {
        let packets = table(root, "gop12", "packets");
        let mut count = std::collections::BTreeMap::new();
        for camera in strings(&packets, "camera") {
            *count.entry(camera.expect("camera")).or_insert(0) += 1;
        }
        count
    };
    assert_eq!(per_camera(&second), per_camera(&first), "packets per camera");
    assert_eq!(frame_packets(&table(&second, "gop12", "packets")), frame_packets(&table(&first, "gop12", "packets")));
    assert_eq!(step_rows(&table(&second, "gop12", "steps")), step_rows(&table(&first, "gop12", "steps")));
}

/// Data holding NaN and infinities: statistics over it are NaN or infinite (numpy's), and the
/// export writes them as LeRobot does (`NaN`, `Infinity` in `stats.json`, numbers in
/// `meta/episodes`), so that the export ingests again with the same statistics.
#[test]
fn non_finite_statistics_survive_an_export() {
    let tmp = tempfile::tempdir().expect("tmp");
    let source = tmp.path().join("nonfinite");
    lake_testkit::copy_dir(&testdata("v30-images-tiny"), &source);
    let data = source.join("data/chunk-000/file-000.parquet");
    let batches = lake_testkit::read_parquet(&data);
    let all = arrow::compute::concat_batches(&batches[0].schema(), &batches).expect("concat");
    let with = |name: &str, changes: &[(usize, usize, f32)]| -> arrow::array::ArrayRef {
        let list = all.column_by_name(name).expect(name).as_fixed_size_list();
        let width = list.value_length() as usize;
        let mut values = list.values().as_primitive::<arrow::datatypes::Float32Type>().values().to_vec();
        for &(row, dim, v) in changes {
            values[row * width + dim] = v;
        }
        let field = match list.data_type() {
            arrow::datatypes::DataType::FixedSizeList(f, _) => f.clone(),
            other => panic!("{name} is {other}"),
        };
        std::sync::Arc::new(arrow::array::FixedSizeListArray::new(
            field,
            width as i32,
            std::sync::Arc::new(arrow::array::Float32Array::from(values)),
            None,
        ))
    };
    let action = with("action", &[(7, 1, f32::INFINITY), (8, 1, f32::NEG_INFINITY)]);
    let state = with("observation.state", &[(5, 0, f32::NAN)]);
    let columns = all
        .schema()
        .fields()
        .iter()
        .zip(all.columns())
        .map(|(f, c)| match f.name().as_str() {
            "action" => action.clone(),
            "observation.state" => state.clone(),
            _ => c.clone(),
        })
        .collect();
    lake_testkit::write_parquet(&data, &[RecordBatch::try_new(all.schema(), columns).expect("batch")]);

    let (first, second) = (tmp.path().join("lake"), tmp.path().join("again"));
    let run = lake(&first, &["ingest", source.to_str().expect("utf-8")]);
    assert_eq!(run.code, 0, "{run:#?}");
    let out = tmp.path().join("export");
    let run = export(&first, "nonfinite", "lerobot-v3", &out);
    assert_eq!(run.code, 0, "{run:#?}");
    let text = std::fs::read_to_string(out.join("meta/stats.json")).expect("stats.json");
    let stats = lake_schemas::pyjson::parse(text.as_bytes()).expect("stats.json as LeRobot writes it");
    let stat = |feature: &str, stat: &str, dim: usize| lake_schemas::pyjson::as_f64(&stats[feature][stat][dim]).expect("a number");
    assert_eq!((stat("action", "min", 1), stat("action", "max", 1)), (f64::NEG_INFINITY, f64::INFINITY), "{text}");
    assert!(stat("action", "mean", 1).is_nan() && stat("observation.state", "mean", 0).is_nan(), "{text}");
    assert!(stat("action", "mean", 0).is_finite(), "the other dimensions keep their numbers");
    assert!(!text.contains("null"), "no statistic lost: {text}");
    let episodes = episodes_parquet(&out);
    let min = stats_columns(&episodes)["stats/action/min"].clone();
    assert_eq!(min.null_count() + min.as_list::<i32>().values().null_count(), 0, "per-episode statistics are numbers too");

    let run = lake(&second, &["ingest", out.to_str().expect("utf-8"), "--name", "nonfinite"]);
    assert_eq!(run.code, 0, "the export ingests: {run:#?}");
    let numeric = |root: &Path| {
        let text = lake(root, &["stats", "nonfinite"]).stdout;
        let value = lake_schemas::pyjson::parse(text.as_bytes()).expect("stats");
        [value["action"].clone(), value["observation.state"].clone()]
    };
    assert_eq!(numeric(&second), numeric(&first), "the same statistics after the round trip");
}

/// A dataset whose cameras were dropped at ingest (no video of them exists) exports without
/// them: no camera feature in `info.json`, no video path template, no statistics of theirs.
#[test]
fn an_export_leaves_out_dropped_cameras_everywhere() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("lake");
    ingest_ok(&root, &shared_dir().join("lerobot-real/so101-record-test-v30"), &["--drop-missing-cameras"]);
    let out = tmp.path().join("export");
    let run = export(&root, "so101-record-test-v30", "lerobot-v3", &out);
    assert_eq!(run.code, 0, "{run:#?}");
    let json =
        |path: &str| -> serde_json::Value { serde_json::from_slice(&std::fs::read(out.join(path)).expect("exported file")).expect("json") };
    let (info, stats) = (json("meta/info.json"), json("meta/stats.json"));
    assert_eq!(info["video_path"], serde_json::Value::Null, "no video feature, no template");
    let features: Vec<&String> = info["features"].as_object().expect("features").keys().collect();
    let stated: Vec<&String> = stats.as_object().expect("stats").keys().collect();
    assert!(!features.iter().any(|f| f.starts_with("observation.images.")), "{features:?}");
    assert_eq!(stated, features, "statistics of exactly the exported features");
    assert!(!out.join("videos").exists());
}

#[test]
fn a_view_exports_only_its_episodes_renumbered_from_zero() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (first, second) = (tmp.path().join("lake"), tmp.path().join("again"));
    ingest_ok(&first, &testdata("v30-av1-small"), &[]);
    let run = lake(&first, &["view", "create", "long", "SELECT episode_index FROM episodes WHERE length > 100"]);
    assert_eq!(run.code, 0, "{run:#?}");
    let out = tmp.path().join("long");
    assert_eq!(export(&first, "long", "lerobot-v3", &out).code, 0);
    ingest_ok(&second, &out, &["--name", "long"]);

    let source = table(&first, "v30-av1-small", "steps");
    let kept: Vec<usize> =
        ints(&source, "episode_index").iter().enumerate().filter(|(_, e)| [1, 2, 3].contains(*e)).map(|(i, _)| i).collect();
    let exported = table(&second, "long", "steps");
    assert_eq!(ints(&exported, "episode_index"), kept.iter().map(|&i| ints(&source, "episode_index")[i] - 1).collect::<Vec<_>>());
    assert_eq!(ints(&exported, "index"), (0..kept.len() as i64).collect::<Vec<_>>(), "index renumbered from 0");
    let (ts, src_ts) = (floats(&exported, "timestamp"), floats(&source, "timestamp"));
    assert_eq!(ts, kept.iter().map(|&i| src_ts[i]).collect::<Vec<_>>(), "timestamps kept");
    // Every frame of the kept episodes, bit for bit, under the new episode numbers.
    let renumbered: Vec<_> = frame_packets(&table(&first, "v30-av1-small", "packets"))
        .into_iter()
        .filter(|p| [1, 2, 3].contains(&p.1))
        .map(|(c, e, f, d)| (c, e - 1, f, d))
        .collect();
    assert_eq!(frame_packets(&table(&second, "long", "packets")), renumbered);

    // Its stats.json holds the statistics of its steps (numeric features exact, as `lake stats
    // VIEW` prints them), cameras those of its episodes.
    let stats: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("meta/stats.json")).expect("stats.json")).expect("json");
    assert_eq!(stats["index"]["count"], serde_json::json!([kept.len()]));
    let n = kept.len() as f64;
    assert_eq!(
        (&stats["index"]["min"], &stats["index"]["max"]),
        (&serde_json::json!([0]), &serde_json::json!([n as i64 - 1])),
        "renumbered"
    );
    assert_eq!(stats["episode_index"]["max"], serde_json::json!([2]));
    let mut view_stats: serde_json::Value = serde_json::from_str(&lake(&first, &["stats", "long"]).stdout).expect("lake stats VIEW");
    assert_eq!(view_stats["index"]["min"], serde_json::json!([ints(&source, "index")[kept[0]]]), "the view's own numbers");
    for renumbered in ["index", "episode_index"] {
        view_stats[renumbered] = stats[renumbered].clone();
    }
    assert_eq!(view_stats, stats, "lake stats VIEW prints what the export holds, but for the numbering");
    let camera_count = stats["observation.images.front"]["count"][0].as_i64().expect("camera count");
    let whole: serde_json::Value = serde_json::from_str(&lake(&first, &["stats", "v30-av1-small"]).stdout).expect("lake stats");
    assert!(camera_count > 0 && camera_count < whole["observation.images.front"]["count"][0].as_i64().expect("count"));

    // Per-episode statistics of the written steps, numbered as written; the cameras' are the
    // source's of those episodes, so a view of the export gets its episodes' camera statistics.
    let written = episodes_parquet(&out);
    let column = |name: &str| written.column_by_name(name).unwrap_or_else(|| panic!("{name}")).clone();
    let (starts, ends) = (column("dataset_from_index"), column("dataset_to_index"));
    let (starts, ends) = (starts.as_primitive::<arrow::datatypes::Int64Type>(), ends.as_primitive::<arrow::datatypes::Int64Type>());
    let index_min = column("stats/index/min");
    let index_max = column("stats/index/max");
    let episode_mean = column("stats/episode_index/mean");
    for e in 0..written.num_rows() {
        let first_of = |a: &arrow::array::ArrayRef| a.as_list::<i32>().value(e);
        assert_eq!(first_of(&index_min).as_primitive::<arrow::datatypes::Int64Type>().value(0), starts.value(e));
        assert_eq!(first_of(&index_max).as_primitive::<arrow::datatypes::Int64Type>().value(0), ends.value(e) - 1);
        assert_eq!(first_of(&episode_mean).as_primitive::<arrow::datatypes::Float64Type>().value(0), e as f64);
    }
    let source_episodes = episodes_parquet(&testdata("v30-av1-small"));
    let front = "stats/observation.images.front/mean";
    for (e, source_e) in [(0, 1), (1, 2), (2, 3)] {
        let (got, want) = (
            written.column_by_name(front).expect("camera stats").slice(e, 1),
            source_episodes.column_by_name(front).expect("camera stats").slice(source_e, 1),
        );
        assert_eq!(&got, &want, "episode {e}");
    }
    let run = lake(
        &second,
        &["view", "create", "long-first", "SELECT dataset, episode_index FROM episodes WHERE dataset = 'long' AND episode_index = 0"],
    );
    assert_eq!(run.code, 0, "{run:#?}");
    let first_stats: serde_json::Value = serde_json::from_str(&lake(&second, &["stats", "long-first"]).stdout).expect("lake stats VIEW");
    let counts = column("stats/observation.images.front/count");
    let count = counts.as_list::<i32>().value(0).as_primitive::<arrow::datatypes::Int64Type>().value(0);
    assert_eq!(first_stats["observation.images.front"]["count"], serde_json::json!([count]), "the first episode's, not the dataset's");

    // With lake's own camera statistics (`lake stats --images`), the view's come from those of
    // its episodes: what its exported `meta/episodes` holds, aggregated (count-weighted means).
    assert_eq!(lake(&first, &["stats", "v30-av1-small", "--images"]).code, 0);
    let out = tmp.path().join("long-images");
    assert_eq!(export(&first, "long", "lerobot-v3", &out).code, 0);
    let stats = lake_schemas::pyjson::parse(&std::fs::read(out.join("meta/stats.json")).expect("stats.json")).expect("json");
    let written = episodes_parquet(&out);
    let per_episode = |stat: &str, channel: usize| -> Vec<f64> {
        let column = written.column_by_name(&format!("stats/observation.images.front/{stat}")).expect("camera stats").clone();
        (0..written.num_rows())
            .map(|e| {
                let channels = column.as_list::<i32>().value(e);
                let pixel = channels.as_list::<i32>().value(channel);
                let value = pixel.as_list::<i32>().value(0);
                value.as_primitive::<arrow::datatypes::Float64Type>().value(0)
            })
            .collect()
    };
    let counts = written.column_by_name("stats/observation.images.front/count").expect("counts").clone();
    let counts: Vec<f64> = (0..written.num_rows())
        .map(|e| counts.as_list::<i32>().value(e).as_primitive::<arrow::datatypes::Int64Type>().value(0) as f64)
        .collect();
    for channel in 0..3 {
        let means = per_episode("mean", channel);
        let want = means.iter().zip(&counts).map(|(m, c)| m * c).sum::<f64>() / counts.iter().sum::<f64>();
        let got = stats["observation.images.front"]["mean"][channel][0][0].as_f64().expect("mean");
        assert!((got - want).abs() < 1e-12, "channel {channel}: {got} vs {want} from the exported episodes");
    }

    // Only the tasks its steps use, numbered from 0 (LeRobot finds a task by its position).
    let run = lake(&first, &["view", "create", "one-task", "SELECT episode_index FROM episodes WHERE episode_index IN (1, 4)"]);
    assert_eq!(run.code, 0, "{run:#?}");
    let out = tmp.path().join("one-task");
    assert_eq!(export(&first, "one-task", "lerobot-v3", &out).code, 0);
    ingest_ok(&second, &out, &["--name", "one-task"]);
    let tasks = table(&second, "one-task", "tasks");
    assert_eq!(strings(&tasks, "task"), [Some("Pick up the red cube and place it in the bin.".to_string())]);
    let steps = table(&second, "one-task", "steps");
    assert!(ints(&steps, "task_index").iter().all(|t| *t == 0), "renumbered");
    assert!(strings(&steps, "task").iter().all(|t| t.as_deref().is_some_and(|t| t.starts_with("Pick up"))));
}

#[test]
fn parquet_export_writes_the_tables_with_lerobot_keys() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("lake");
    ingest_ok(&root, &testdata("v30-h264-multifile"), &[]);
    let run = lake(&root, &["stats", "v30-h264-multifile", "--images"]);
    assert_eq!(run.code, 0, "{run:#?}");
    let out = tmp.path().join("tables");
    let run = export(&root, "v30-h264-multifile", "parquet", &out);
    assert_eq!(run.code, 0, "{run:#?}");
    let steps = lake_testkit::read_parquet(&out.join("steps.parquet"));
    assert_eq!(steps.iter().map(|b| b.num_rows()).sum::<usize>(), 300);
    assert!(steps[0].schema().column_with_name("observation.state").is_some(), "{:?}", steps[0].schema());
    for t in ["episodes", "tasks", "stats", "feature_stats", "streams", "packets", "findings", "image_stats"] {
        assert!(out.join(format!("{t}.parquet")).is_file(), "{t}.parquet");
    }
    // No findings: the table is written with its columns; image statistics of every episode.
    let rows = |t: &str| lake_testkit::read_parquet(&out.join(format!("{t}.parquet"))).iter().map(|b| b.num_rows()).sum::<usize>();
    let findings = std::fs::File::open(out.join("findings.parquet")).expect("findings");
    let findings = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(findings).expect("parquet");
    assert!(findings.schema().column_with_name("message").is_some() && rows("findings") == 0, "{:?}", findings.schema());
    assert!(rows("image_stats") > 0);
    let all = packet_rows_point_at_their_frames(&out, 300);

    // A view's export keeps the packets its episodes' frames need (each back to its keyframe),
    // not whole files shared with episodes left out, and renumbers the rows into them.
    let run = lake(&root, &["view", "create", "later", "SELECT episode_index FROM episodes WHERE episode_index >= 1"]);
    assert_eq!(run.code, 0, "{run:#?}");
    let out = tmp.path().join("later");
    let run = export(&root, "later", "parquet", &out);
    assert_eq!(run.code, 0, "{run:#?}");
    let later = crate::common::sql_rows(&root, "SELECT sum(length) AS n FROM episodes WHERE episode_index >= 1");
    let kept = packet_rows_point_at_their_frames(&out, crate::common::num(&later[0], "n") as usize);
    let cameras = steps_cameras(&out);
    let lead_in = kept - crate::common::num(&later[0], "n") as usize * cameras;
    assert!(kept < all && lead_in < 300 * cameras / 10, "{kept} packets of {all}, {lead_in} of them before an episode's first frame");
}

/// Cameras of an exported `steps.parquet` (members of its `packet_row`).
fn steps_cameras(out: &Path) -> usize {
    use arrow::array::AsArray;
    let steps = lake_testkit::read_parquet(&out.join("steps.parquet"));
    steps[0].column_by_name(lake_schemas::tables::PACKET_ROW).expect("packet_row").as_struct().num_columns()
}

/// Checks that every step's packet row in an exported `steps.parquet` is a packet of
/// `packets.parquet` showing that step's episode and frame; returns the packets' count.
fn packet_rows_point_at_their_frames(out: &Path, steps_expected: usize) -> usize {
    use arrow::array::AsArray;
    use arrow::datatypes::{Int64Type, UInt64Type};
    let steps = lake_testkit::read_parquet(&out.join("steps.parquet"));
    let packets = lake_testkit::read_parquet(&out.join("packets.parquet"));
    let (episode, frame) = (ints(&packets, "episode_index"), ints(&packets, "frame_index"));
    let mut checked = 0;
    for b in &steps {
        let rows = b.column_by_name(lake_schemas::tables::PACKET_ROW).expect("packet_row").as_struct();
        let (ep, fr) = (b.column_by_name("episode_index").expect("ep"), b.column_by_name("frame_index").expect("fr"));
        let (ep, fr) = (ep.as_primitive::<Int64Type>(), fr.as_primitive::<Int64Type>());
        for camera in rows.columns() {
            for (r, row) in camera.as_primitive::<UInt64Type>().values().iter().enumerate() {
                let row = *row as usize;
                assert!(row < episode.len(), "packet row {row} of {}", episode.len());
                assert_eq!((episode[row], frame[row]), (ep.value(r), fr.value(r)), "step {r}");
                checked += 1;
            }
        }
    }
    assert_eq!(checked, steps_expected * steps_cameras(out));
    packets_decode_from_their_own_rows(out, &packets);
    episode.len()
}

/// Checks an exported `packets.parquet` against itself and the tables that point into it: every
/// row's `keyframe_offset` leads to a keyframe of its stream (lead-in rows' too), `streams.parquet` counts each
/// stream's rows, and `episodes.parquet`'s camera rows are packets of that episode.
fn packets_decode_from_their_own_rows(out: &Path, packets: &[RecordBatch]) {
    use arrow::array::AsArray;
    let (stream, keyframe, offset) = (ints(packets, "stream"), ints(packets, "keyframe"), ints(packets, "keyframe_offset"));
    let (episode, bytes) = (ints(packets, "episode_index"), binaries(packets, "data"));
    for row in 0..stream.len() {
        let from = usize::try_from(row as i64 - offset[row]).unwrap_or_else(|_| panic!("row {row} decodes from before the table"));
        // Offset 0: the row starts its own decode (a keyframe, or a frame before every keyframe).
        if offset[row] > 0 {
            assert_eq!((stream[from], keyframe[from]), (stream[row], 1), "row {row} decodes from row {from}");
        }
    }
    let streams = lake_testkit::read_parquet(&out.join("streams.parquet"));
    let (ids, first, count) = (ints(&streams, "stream"), ints(&streams, "first_row"), ints(&streams, "packets"));
    let (keyframes, total) = (ints(&streams, "keyframes"), ints(&streams, "bytes"));
    assert_eq!(count.iter().sum::<i64>() as usize, stream.len(), "streams count every exported packet once");
    for (i, id) in ids.iter().enumerate() {
        let rows = first[i] as usize..(first[i] + count[i]) as usize;
        assert!(rows.clone().all(|r| stream[r] == *id), "stream {id}: rows {rows:?}");
        assert_eq!(keyframes[i], rows.clone().map(|r| keyframe[r]).sum::<i64>(), "stream {id}: keyframes");
        assert_eq!(total[i] as usize, rows.map(|r| bytes[r].as_ref().expect("bytes").len()).sum::<usize>(), "stream {id}: bytes");
    }
    for b in lake_testkit::read_parquet(&out.join("episodes.parquet")) {
        let eps = b.column_by_name("episode_index").expect("episode_index").as_primitive::<arrow::datatypes::Int64Type>();
        let cameras = b.column_by_name("cameras").expect("cameras").as_list::<i32>();
        for (e, ep) in eps.values().iter().enumerate() {
            let entries = cameras.value(e);
            let entries = entries.as_struct();
            let cam_stream = ints(&[RecordBatch::from(entries.clone())], "stream");
            for name in ["first_row", "last_row"] {
                for (c, row) in ints(&[RecordBatch::from(entries.clone())], name).into_iter().enumerate() {
                    let row = row as usize;
                    assert_eq!((episode[row], stream[row]), (*ep, cam_stream[c]), "episode {ep}: {name} {row}");
                }
            }
        }
    }
}

#[test]
fn failed_exports_leave_nothing_behind() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("lake");
    ingest_ok(&root, &testdata("v30-images-tiny"), &[]);
    ingest_ok(&root, &testdata("v30-av1-small"), &[]);
    let occupied = tmp.path().join("occupied");
    std::fs::create_dir_all(&occupied).expect("dir");
    std::fs::write(occupied.join("keep.txt"), "mine").expect("file");
    let run = export(&root, "v30-images-tiny", "lerobot-v3", &occupied);
    assert_eq!(run.code, 2, "{run:#?}");
    assert!(run.stderr.contains("not empty"), "{}", run.stderr);
    assert_eq!(std::fs::read_dir(&occupied).expect("dir").count(), 1, "the directory is untouched");
    let run = export(&root, "v30-images-tiny", "lerobot-v3", &occupied.join("keep.txt/sub/out"));
    assert!(run.code == 2 && run.stderr.contains("keep.txt is not a directory; "), "{run:#?}");

    ingest_ok(&root, &testdata("v30-images-tiny"), &["--name", "twin"]);
    let run = lake(&root, &["view", "create", "both", "SELECT dataset, episode_index FROM episodes WHERE dataset <> 'v30-av1-small'"]);
    assert_eq!(run.code, 0, "{run:#?}");
    let run = export(&root, "both", "lerobot-v3", &tmp.path().join("both"));
    assert_eq!(run.code, 2, "{run:#?}");
    assert!(run.stderr.contains("spans 2 datasets"), "{}", run.stderr);
    let run = export(&root, "nothing-here", "lerobot-v3", &tmp.path().join("nothing"));
    assert_eq!(run.code, 2, "{run:#?}");
    let before = lake_testkit::snapshot(&root, &[]);
    let run = export(&root, "v30-images-tiny", "lerobot-v3", &root.join("catalog/../catalog/export"));
    assert_eq!(run.code, 2, "{run:#?}");
    assert!(run.stderr.contains("inside the lake"), "{}", run.stderr);
    assert_eq!(lake_testkit::snapshot(&root, &[]), before, "the lake is untouched");
    let leftovers: Vec<PathBuf> = std::fs::read_dir(tmp.path()).expect("dir").flatten().map(|e| e.path()).collect();
    assert_eq!(leftovers.len(), 2, "no partial export directories: {leftovers:?}");

    // A symbolic link to nothing is refused before anything is written; one to an empty
    // directory exports into that directory. A partial export whose process is gone (killed
    // outright) is removed by the next export to the same place.
    let dangling = tmp.path().join("dangling");
    std::os::unix::fs::symlink(tmp.path().join("nowhere"), &dangling).expect("link");
    let run = export(&root, "v30-images-tiny", "lerobot-v3", &dangling);
    assert_eq!(run.code, 2, "{run:#?}");
    assert!(run.stderr.contains("which does not exist"), "{}", run.stderr);
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).expect("dir");
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").expect("hostname");
    let dead = tmp.path().join(format!(".empty.partial-4194000@{}-0123abcd", host.trim()));
    let elsewhere = tmp.path().join(".empty.partial-4194000@another-host-0123abcd");
    std::fs::create_dir_all(&elsewhere).expect("another machine's export");
    std::fs::create_dir_all(dead.join("meta")).expect("leftover");
    let linked = tmp.path().join("linked");
    std::os::unix::fs::symlink(&empty, &linked).expect("link");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&empty, std::fs::Permissions::from_mode(0o750)).expect("chmod");
    let run = export(&root, "v30-images-tiny", "lerobot-v3", &linked);
    assert_eq!(run.code, 0, "{run:#?}");
    assert!(empty.join("meta/info.json").is_file() && linked.is_symlink());
    let mode = std::fs::metadata(&empty).expect("dir").permissions().mode() & 0o777;
    assert_eq!(mode, 0o750, "an existing directory is written into, and keeps its mode");
    assert!(!std::fs::read_dir(&empty).expect("dir").flatten().any(|e| e.file_name().to_string_lossy().starts_with('.')));
    let mut names: Vec<String> =
        std::fs::read_dir(tmp.path()).expect("dir").flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    assert_eq!(
        names,
        [".empty.partial-4194000@another-host-0123abcd", "dangling", "empty", "lake", "linked", "occupied"],
        "this machine's dead partial export is gone, another machine's stays, nothing else is left"
    );
}

/// The Python of the LeRobot environment (`bench/compare_lerobot.sh` makes it), if installed.
fn lerobot_python() -> Option<PathBuf> {
    let path = std::env::var_os("LAKE_LEROBOT_PYTHON")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/lake/lerobot-venv/bin/python")))?;
    path.is_file().then_some(path)
}

/// LeRobot's `LeRobotDataset` loads the export and returns the reference samples of `name`.
#[allow(clippy::print_stderr)] // says why the LeRobot check did not run
fn lerobot_loads(root: &Path, name: &str) {
    let Some(python) = lerobot_python() else {
        eprintln!(
            "skipped: loading the {name} export with LeRobot (no LeRobot environment; set LAKE_LEROBOT_PYTHON or run \
             bench/compare_lerobot.sh once to create ~/.cache/lake/lerobot-venv)"
        );
        return;
    };
    let reference = shared_dir().join(format!("fixtures/reference/{name}.none.arrow"));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/lerobot_parity.py");
    let out = std::process::Command::new(python).arg(script).arg(root).arg(&reference).output().expect("run python");
    assert!(
        out.status.success(),
        "LeRobot reads the {name} export differently from the reference:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
