//! The loader against LeRobot itself: `lake sample` must return, for the same step index and
//! `delta_timestamps`, exactly what LeRobot's `LeRobotDataset.__getitem__` returned when the
//! reference dumps in `../shared/fixtures/reference/` were made: every value bit for bit, every
//! frame's SHA-256. Plus the loader's own guarantees: cache on and off give identical batches,
//! the cache stays within its byte budget, streams follow the sampler.

use std::{os::unix::fs::FileTypeExt, path::Path, sync::Arc};

use arrow::{
    array::{Array, ArrayRef, AsArray, RecordBatch},
    datatypes::{DataType, Float32Type, Float64Type, Int64Type},
};
use futures::StreamExt;
use lake_loader::{
    Cursor, Eligible, Loader, LoaderDataset, LoaderOptions, Lookahead, Order, Preset, Sharding, Source, StreamRequest, Windows,
};
use lake_testkit::{shared_dir, testdata};
use sha2::{Digest, Sha256};

use crate::common::{files_under, ingest_ok, lake, read_arrow};

/// A reference dump LeRobot made (`../shared/fixtures/reference/`); `preset` may name a backend
/// too (`act.pyav`).
fn reference(name: &str, preset: &str) -> RecordBatch {
    read_arrow(&shared_dir().join(format!("fixtures/reference/{name}.{preset}.arrow")))
}

/// Flattened values of a list or fixed-size-list row (or the scalar) as comparable bit patterns.
fn bits(array: &ArrayRef, row: usize) -> Vec<u64> {
    let values = match array.data_type() {
        DataType::List(_) => array.as_list::<i32>().value(row),
        DataType::FixedSizeList(..) => array.as_fixed_size_list().value(row),
        _ => array.slice(row, 1),
    };
    match values.data_type() {
        DataType::Float32 => values.as_primitive::<Float32Type>().values().iter().map(|v| u64::from(v.to_bits())).collect(),
        DataType::Float64 => values.as_primitive::<Float64Type>().values().iter().map(|v| v.to_bits()).collect(),
        DataType::Int64 => values.as_primitive::<Int64Type>().values().iter().map(|v| *v as u64).collect(),
        DataType::Boolean => values.as_boolean().iter().map(|v| u64::from(v.expect("no nulls"))).collect(),
        other => panic!("unexpected value type {other}"),
    }
}

fn shape(json: &str) -> Vec<usize> {
    serde_json::from_str(json).unwrap_or_else(|e| panic!("shape {json}: {e}"))
}

fn frame_hashes(array: &ArrayRef, row: usize, frame_bytes: usize) -> Vec<String> {
    let list = array.as_fixed_size_list().value(row);
    let bytes = list.as_primitive::<arrow::datatypes::UInt8Type>().values();
    bytes.chunks(frame_bytes).map(|f| format!("{:x}", Sha256::digest(f))).collect()
}

/// Runs `lake sample` for every row of the reference and compares everything.
fn check_preset(root: &Path, name: &str, preset: &str) {
    check_against(root, name, preset, &reference(name, preset));
}

/// Runs `lake sample` with `preset` for every row of `expected` (a dump in the layout of
/// `../shared/fixtures/reference/`) and compares everything.
fn check_against(root: &Path, name: &str, preset: &str, expected: &RecordBatch) {
    let indices: Vec<String> =
        expected.column_by_name("index").expect("index").as_primitive::<Int64Type>().values().iter().map(i64::to_string).collect();
    let out = root.parent().expect("parent").join(format!("{name}.{preset}.arrow"));
    let run = lake(
        root,
        &["sample", "--dataset", name, "--indices", &indices.join(","), "--preset", preset, "--out", out.to_str().expect("utf-8")],
    );
    assert_eq!(run.code, 0, "{run:#?}");
    let got = read_arrow(&out);
    assert_eq!(got.num_rows(), expected.num_rows());
    let cameras: Vec<String> = serde_json::from_str(&expected.schema().metadata()["camera_keys"]).expect("camera keys");
    let mut compared = 0;
    for field in expected.schema().fields() {
        let key = field.name();
        // Bookkeeping, the pixels of the hashed frames, and how LeRobot's backends compare.
        if matches!(key.as_str(), "getitem_idx" | "lerobot_error") || key.ends_with(".hwc") || key.ends_with("_vs_torchcodec") {
            continue;
        }
        let want = expected.column_by_name(key).expect("column");
        if let Some(camera) = key.strip_suffix(".sha256") {
            assert!(cameras.iter().any(|c| c == camera));
            let col = got.column_by_name(camera).unwrap_or_else(|| panic!("{name}/{preset}: no column {camera}"));
            let frame_shape: Vec<usize> = serde_json::from_str(&field.metadata()["frame_shape"]).expect("frame shape");
            let ours = got.schema().field_with_name(camera).expect("field").metadata().clone();
            assert_eq!(shape(&ours["shape"]), shape(&field.metadata()["shape"]), "{name}/{preset}/{camera}: shape");
            assert_eq!(ours["layout"], field.metadata()["layout"], "{name}/{preset}/{camera}: layout");
            for (row, index) in indices.iter().enumerate() {
                let want: Vec<String> = match want.data_type() {
                    DataType::Utf8 => vec![want.as_string::<i32>().value(row).to_string()],
                    _ => want.as_list::<i32>().value(row).as_string::<i32>().iter().map(|s| s.expect("hash").to_string()).collect(),
                };
                let have = frame_hashes(col, row, frame_shape.iter().product());
                assert_eq!(have, want, "{name}/{preset}: camera {camera}, index {index}");
            }
        } else {
            let col = got.column_by_name(key).unwrap_or_else(|| panic!("{name}/{preset}: no column {key}"));
            if let Some(shape) = field.metadata().get("shape") {
                let ours = got.schema().field_with_name(key).expect("field").metadata().get("shape").cloned();
                assert_eq!(ours.as_deref().map(self::shape), Some(self::shape(shape)), "{name}/{preset}/{key}: shape");
            }
            for (row, index) in indices.iter().enumerate() {
                if want.data_type() == &DataType::Utf8 {
                    assert_eq!(col.as_string::<i32>().value(row), want.as_string::<i32>().value(row), "{name}/{preset}/{key} row {row}");
                } else {
                    assert_eq!(bits(col, row), bits(want, row), "{name}/{preset}/{key}, index {index}");
                }
            }
        }
        compared += 1;
    }
    let extra: Vec<&String> = got
        .schema_ref()
        .fields()
        .iter()
        .map(|f| f.name())
        .filter(|n| expected.column_by_name(n).is_none() && expected.column_by_name(&format!("{n}.sha256")).is_none())
        .collect();
    assert!(extra.is_empty(), "{name}/{preset}: columns LeRobot does not return: {extra:?}");
    assert!(compared >= 8, "{name}/{preset}: only {compared} columns compared");
}

/// `lake sample --frame-format yuv420p` for the reference's indices (after [`check_preset`]
/// wrote the RGB samples): every column but the cameras sent as planes equal, and those planes,
/// converted with the integers in their metadata ([`lake_loader::YuvToRgb`], the arithmetic
/// trainers run on their GPU), equal to the RGB frames byte for byte.
fn yuv_planes_convert_to_the_rgb_frames(root: &Path, name: &str, preset: &str) -> usize {
    let rgb = read_arrow(&root.parent().expect("parent").join(format!("{name}.{preset}.arrow")));
    let indices: Vec<String> =
        rgb.column_by_name("index").expect("index").as_primitive::<Int64Type>().values().iter().map(i64::to_string).collect();
    let out = root.parent().expect("parent").join(format!("{name}.{preset}.yuv.arrow"));
    let args = ["sample", "--dataset", name, "--indices", &indices.join(","), "--preset", preset, "--frame-format", "yuv420p"];
    let run = lake(root, &[&args[..], &["--out", out.to_str().expect("utf-8")]].concat());
    assert_eq!(run.code, 0, "{run:#?}");
    let yuv = read_arrow(&out);
    assert_eq!(yuv.schema().fields().len(), rgb.schema().fields().len(), "{name}/{preset}: the same columns");
    let mut cameras = 0;
    for (field, want) in rgb.schema().fields().iter().zip(rgb.columns()) {
        let got_field = yuv.schema().field_with_name(field.name()).expect("column").clone();
        let got = yuv.column_by_name(field.name()).expect("column");
        let Some(conversion) = got_field.metadata().get(lake_loader::YUV_TO_RGB) else {
            assert_eq!(got, want, "{name}/{preset}/{}: not a camera sent as planes, so unchanged", field.name());
            continue;
        };
        assert_eq!(got_field.metadata()[lake_loader::PIXEL_FORMAT], "yuv420p");
        assert_eq!(field.metadata()[lake_loader::PIXEL_FORMAT], "rgb24");
        let conversion: lake_loader::YuvToRgb = serde_json::from_str(conversion).expect("integers");
        let frame_shape = shape(&field.metadata()["frame_shape"]);
        let (h, w) = (frame_shape[0] as u32, frame_shape[1] as u32);
        let (planes, frames) = (got.as_fixed_size_list().values(), want.as_fixed_size_list().values());
        let planes = planes.as_primitive::<arrow::datatypes::UInt8Type>().values();
        let frames = frames.as_primitive::<arrow::datatypes::UInt8Type>().values();
        let plane_bytes = lake_loader::yuv420p_bytes(w, h);
        assert_eq!(planes.len() / plane_bytes, frames.len() / (h * w * 3) as usize, "{name}/{preset}/{}: as many frames", field.name());
        assert_eq!(planes.len() * 2, frames.len(), "{name}/{preset}/{}: planes are half the bytes", field.name());
        let mut converted = vec![0_u8; (h * w * 3) as usize];
        for (n, (p, f)) in planes.chunks_exact(plane_bytes).zip(frames.chunks_exact((h * w * 3) as usize)).enumerate() {
            conversion.convert(p, w, h, &mut converted);
            assert!(converted == f, "{name}/{preset}/{}: frame {n} converts to other RGB than the loader's", field.name());
        }
        cameras += 1;
    }
    cameras
}

fn check_dataset(source: &Path, flags: &[&str], frame_table: bool) {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("lake");
    ingest_ok(&root, source, flags);
    let name = source.file_name().expect("name").to_str().expect("utf-8");
    for preset in ["act", "diffusion", "none"] {
        check_preset(&root, name, preset);
    }
    // LeRobot's other CPU backend (pyav) returned the same frames where a dump of it exists.
    if shared_dir().join(format!("fixtures/reference/{name}.act.pyav.arrow")).exists() {
        check_against(&root, name, "act", &reference(name, "act.pyav"));
    }
    one_frame_camera_windows(&root, source, name);
    index_column_windows(&root, source, name);
    for preset in ["act", "diffusion"] {
        let planes = yuv_planes_convert_to_the_rgb_frames(&root, name, preset);
        // The fixtures' and real datasets' videos are all 8-bit 4:2:0 at widths of 32s; only
        // pictures stored in the parquet stay RGB.
        assert!(planes > 0 || name.contains("images"), "{name}/{preset}: no camera sent as planes");
        // Their packets, decoded on the consumer's side, are the same frames, byte for byte.
        let dir = root.parent().expect("parent");
        let rgb = read_arrow(&dir.join(format!("{name}.{preset}.arrow")));
        let yuv = read_arrow(&dir.join(format!("{name}.{preset}.yuv.arrow")));
        let indices: Vec<String> =
            rgb.column_by_name("index").expect("index").as_primitive::<Int64Type>().values().iter().map(i64::to_string).collect();
        let args = ["sample", "--dataset", name, "--indices", &indices.join(","), "--preset", preset];
        let out = dir.join(format!("{name}.{preset}.packets.arrow"));
        crate::common::packets_decode_to(&root, &args, &out, &rgb, Some(&yuv));
    }
    if frame_table {
        // Frames stored by `lake cache` are the decoded frames, byte for byte.
        let run = lake(&root, &["cache", name]);
        assert_eq!(run.code, 0, "{run:#?}");
        assert!(run.stdout.contains(", plain)"), "plain is the default storage: {run:#?}");
        for preset in ["act", "diffusion"] {
            check_preset(&root, name, preset);
        }
        // And from a zstd-compressed table.
        let run = lake(&root, &["cache", name, "--storage", "zstd"]);
        assert_eq!(run.code, 0, "{run:#?}");
        assert!(run.stdout.contains(", zstd)"), "{run:#?}");
        check_preset(&root, name, "act");
    }
}

/// The byte position and size of the keyframe packet nearest the middle of a video file.
fn middle_keyframe_packet(video: &Path) -> (usize, usize) {
    let out = std::process::Command::new("ffprobe")
        .args(["-v", "error", "-select_streams", "v", "-show_entries", "packet=pos,size,flags", "-of", "csv=p=0"])
        .arg(video)
        .output()
        .expect("ffprobe (scripts/setup.sh installs it)");
    let packets: Vec<(usize, usize)> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (f.len() == 3 && f[2].starts_with('K')).then(|| (f[1].parse().expect("pos"), f[0].parse().expect("size")))
        })
        .collect();
    packets[packets.len() / 2]
}

/// The byte range of the last OBU's payload in an AV1 packet (after its header and size).
fn last_obu_payload(packet: &[u8]) -> std::ops::Range<usize> {
    let mut at = 0;
    loop {
        let header = packet[at];
        let mut next = at + 1 + usize::from(header & 4 != 0);
        let size = if header & 2 != 0 {
            let mut size = 0usize;
            for i in 0.. {
                let b = packet[next];
                next += 1;
                size |= usize::from(b & 0x7f) << (7 * i);
                if b & 0x80 == 0 {
                    break;
                }
            }
            size
        } else {
            packet.len() - next
        };
        if next + size >= packet.len() {
            return next..packet.len();
        }
        at = next + size;
    }
}

/// A camera window of one offset: LeRobot squeezes the time dimension of a video camera's
/// (`frames.squeeze(0)`) and keeps an image camera's (`[1, C, H, W]`); the frame is the one
/// without a window either way.
fn one_frame_camera_windows(root: &Path, source: &Path, name: &str) {
    let info: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(source.join("meta/info.json")).expect("info.json")).expect("json");
    let sample = |windows: Option<&str>| {
        let out = root.parent().expect("parent").join(format!("{name}.one-frame.arrow"));
        let mut args = vec!["sample", "--dataset", name, "--indices", "0,5", "--out", out.to_str().expect("utf-8")];
        args.extend(windows.iter().flat_map(|w| ["--delta-timestamps", *w]));
        let run = lake(root, &args);
        assert_eq!(run.code, 0, "{run:#?}");
        read_arrow(&out)
    };
    let plain = sample(None);
    let cameras: Vec<String> =
        plain.schema().fields().iter().filter(|f| f.metadata().contains_key("layout")).map(|f| f.name().clone()).collect();
    assert!(!cameras.is_empty(), "{name} has cameras");
    let windows: serde_json::Map<String, serde_json::Value> = cameras.iter().map(|c| (c.clone(), serde_json::json!([0.0]))).collect();
    let windowed = sample(Some(&serde_json::Value::Object(windows).to_string()));
    for camera in &cameras {
        let (field, frame) = (
            windowed.schema().field_with_name(camera).expect("camera").clone(),
            plain.schema().field_with_name(camera).expect("camera").clone(),
        );
        let video = info["features"][camera.as_str()]["dtype"] == "video";
        let frame_shape = shape(&frame.metadata()["shape"]);
        let (expected_shape, layout) = if video { (frame_shape, "HWC") } else { ([vec![1], frame_shape].concat(), "THWC") };
        assert_eq!(shape(&field.metadata()["shape"]), expected_shape, "{name}/{camera}");
        assert_eq!(field.metadata()["layout"], layout, "{name}/{camera}");
        assert_eq!(windowed.column_by_name(camera), plain.column_by_name(camera), "{name}/{camera}: the same frames");
        let pad = windowed.column_by_name(&format!("{camera}_is_pad")).expect("pad mask");
        assert_eq!(pad.as_fixed_size_list().value_length(), 1, "{name}/{camera}");
    }
}

/// Windows over the index columns (and `timestamp`, when no camera is a video): each slot is the
/// column's value at the clamped neighbouring step, as LeRobot stacks them, int64 and float32;
/// `timestamp` beside video cameras, and `task_index`, are refused.
fn index_column_windows(root: &Path, source: &Path, name: &str) {
    let info: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(source.join("meta/info.json")).expect("info.json")).expect("json");
    let fps = info["fps"].as_f64().expect("fps");
    let video = info["features"].as_object().expect("features").values().any(|f| f["dtype"] == "video");
    let bounds =
        crate::common::sql_rows(root, &format!("SELECT min(\"index\") AS lo, max(\"index\") AS hi FROM steps WHERE dataset = '{name}'"));
    let (lo, hi) = (crate::common::num(&bounds[0], "lo") as i64, crate::common::num(&bounds[0], "hi") as i64);
    let sample = |indices: &[i64], windows: Option<&str>| {
        let out = root.parent().expect("parent").join(format!("{name}.index-windows.arrow"));
        let list = indices.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
        let mut args = vec!["sample", "--dataset", name, "--indices", &list, "--out", out.to_str().expect("utf-8")];
        args.extend(windows.iter().flat_map(|w| ["--delta-timestamps", *w]));
        lake(root, &args)
    };
    let mut keys = vec!["index", "episode_index", "frame_index"];
    if !video {
        keys.push("timestamp");
    }
    let offsets = [-2i64, 0, 2];
    let seconds: Vec<String> = offsets.iter().map(|d| format!("{}", *d as f64 / fps)).collect();
    let windows = format!("{{{}}}", keys.iter().map(|k| format!("\"{k}\": [{}]", seconds.join(", "))).collect::<Vec<_>>().join(", "));
    let samples = [lo, lo + 1, hi];
    let run = sample(&samples, Some(&windows));
    assert_eq!(run.code, 0, "{run:#?}");
    let windowed = read_arrow(&root.parent().expect("parent").join(format!("{name}.index-windows.arrow")));
    // The clamped step each slot shows (the first episode starts at `lo`, the last ends at `hi`).
    let shown = |i: i64, d: i64| if i == hi { (hi + d).min(hi) } else { (i + d).max(lo) };
    let needed: Vec<i64> =
        samples.iter().flat_map(|&i| offsets.map(|d| shown(i, d))).collect::<std::collections::BTreeSet<_>>().into_iter().collect();
    assert_eq!(sample(&needed, None).code, 0);
    let plain = read_arrow(&root.parent().expect("parent").join(format!("{name}.index-windows.arrow")));
    let plain_index = plain.column_by_name("index").expect("index").as_primitive::<Int64Type>().clone();
    let row_of = |step: i64| plain_index.values().iter().position(|&v| v == step).expect("step sampled");
    for key in &keys {
        let column = windowed.column_by_name(key).unwrap_or_else(|| panic!("{name}: {key}"));
        let field = windowed.schema().field_with_name(key).expect("field").clone();
        assert_eq!(shape(&field.metadata()["shape"]), vec![3], "{name}/{key}");
        assert_eq!(field.metadata()["dtype"], if *key == "timestamp" { "float32" } else { "int64" }, "{name}/{key}");
        for (row, &i) in samples.iter().enumerate() {
            let want: Vec<u64> =
                offsets.iter().flat_map(|&d| bits(plain.column_by_name(key).expect("plain"), row_of(shown(i, d)))).collect();
            assert_eq!(bits(column, row), want, "{name}/{key} at {i}");
        }
        let pad = windowed.column_by_name(&format!("{key}_is_pad")).expect("pad");
        let pads: Vec<Vec<u64>> = (0..3).map(|row| bits(pad, row)).collect();
        assert_eq!(pads, vec![vec![1, 0, 0], vec![1, 0, 0], vec![0, 0, 1]], "{name}/{key}");
    }
    for key in ["task_index", "timestamp"].into_iter().filter(|k| *k == "task_index" || video) {
        let run = sample(&[lo], Some(&format!("{{\"{key}\": [0.0]}}")));
        assert!(run.code == 2 && run.stderr.contains(&format!("`{key}` cannot be windowed here")), "{name}/{key}: {run:#?}");
    }
}

#[test]
fn parity_av1_two_cameras() {
    check_dataset(&shared_dir().join("fixtures/v30-av1-small"), &[], false);
}

#[test]
fn parity_h264_multifile_per_camera_offsets() {
    check_dataset(&shared_dir().join("fixtures/v30-h264-multifile"), &[], true);
}

#[test]
fn parity_png_images_in_parquet() {
    check_dataset(&shared_dir().join("fixtures/v30-images-tiny"), &[], true);
}

/// JPEG pictures inside the parquet (datasets converted from other formats carry them): every
/// frame equals what LeRobot's reader returned for it (PIL on libjpeg-turbo), decoded from the
/// packets and from a frame table, for 4:2:0, 4:2:2 and progressive 4:4:4 pictures of a size that
/// is no multiple of the JPEG block, and pictures stored upside down with an EXIF orientation
/// (LeRobot's reader turns them upright).
#[test]
fn parity_jpeg_images_in_parquet() {
    let reference: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(testdata("v30-images-jpeg").join("../../reference/v30-images-jpeg.json")).expect("reference"),
    )
    .expect("json");
    let camera = reference["camera"].as_str().expect("camera");
    let want: Vec<&str> = reference["sha256_by_index"].as_array().expect("hashes").iter().map(|h| h.as_str().expect("hex")).collect();
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("lake");
    ingest_ok(&root, &testdata("v30-images-jpeg"), &[]);
    let indices: Vec<String> = (0..want.len()).map(|i| i.to_string()).collect();
    let sample = |out: &str| {
        let out = tmp.path().join(out);
        let run = lake(
            &root,
            &[
                "sample",
                "--dataset",
                "v30-images-jpeg",
                "--indices",
                &indices.join(","),
                "--preset",
                "none",
                "--out",
                out.to_str().expect("utf-8"),
            ],
        );
        assert_eq!(run.code, 0, "{run:#?}");
        let got = read_arrow(&out);
        let index = got.column_by_name("index").expect("index").as_primitive::<Int64Type>().clone();
        let column = got.column_by_name(camera).expect("camera column");
        (0..got.num_rows()).map(|row| (index.value(row) as usize, frame_hashes(column, row, 36 * 48 * 3).remove(0))).collect::<Vec<_>>()
    };
    for (label, out) in [("from packets", "packets.arrow"), ("from the frame table", "table.arrow")] {
        if out == "table.arrow" {
            let run = lake(&root, &["cache", "v30-images-jpeg"]);
            assert_eq!(run.code, 0, "{run:#?}");
        }
        let got = sample(out);
        assert_eq!(got.len(), want.len());
        for (index, hash) in got {
            assert_eq!(hash, want[index], "{label}: index {index}");
        }
    }
}

/// Streams with B-frames (HEVC `I B I B` at GOP 2, H.264 B-pyramids) and widths of no multiple
/// of 32 (FFmpeg converts those to RGB through a filter graph), over several files per camera:
/// every value and frame equals what LeRobot's reader returned (`testdata/reference/`, made by
/// `scripts/make_bframe_sample.py`; where stock LeRobot raised `FrameTimestampError`, its
/// frames with exact seeking), decoded from packets and from a frame table.
#[test]
fn parity_b_frames_and_odd_widths() {
    let name = "v30-bframes";
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("lake");
    ingest_ok(&root, &testdata(name), &[]);
    let expected = |preset: &str| read_arrow(&testdata(name).join(format!("../../reference/{name}.{preset}.arrow")));
    let failed = |dump: &RecordBatch| dump.column_by_name("lerobot_error").expect("lerobot_error").null_count() < dump.num_rows();
    for preset in ["diffusion", "none"] {
        let dump = expected(preset);
        assert!(failed(&dump), "{preset}: the dump holds rows stock LeRobot fails on");
        check_against(&root, name, preset, &dump);
    }
    // Planes only where the GPU's arithmetic is swscale's: `side` (64 wide); the others stay RGB.
    let planes = yuv_planes_convert_to_the_rgb_frames(&root, name, "diffusion");
    assert_eq!(planes, 1, "only `side` sent as planes");
    let run = lake(&root, &["cache", name]);
    assert_eq!(run.code, 0, "{run:#?}");
    check_against(&root, name, "diffusion", &expected("diffusion"));
}

#[test]
fn parity_real_lingzu_mpeg4_gop12() {
    check_dataset(&shared_dir().join("lerobot-real/lingzu-open50-v30"), &["--skip-bad-episodes"], false);
}

#[test]
fn bad_sample_requests_are_refused_clearly() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("lake");
    ingest_ok(&root, &testdata("v30-images-tiny"), &[]);
    let out = tmp.path().join("x.arrow");
    let out = out.to_str().expect("utf-8");
    for (args, message) in [
        (vec!["--indices", "60"], "index 60 is not in any ingested episode (indices 0 to 59)"),
        (vec!["--indices", "-1"], "index -1 is not in any ingested episode"),
        (vec!["--indices", "1, x"], "`x` is not a whole number"),
        (vec!["--indices", "1", "--delta-timestamps", r#"{"action": [0.01]}"#], "not a multiple of 1/30"),
        (vec!["--indices", "1", "--delta-timestamps", r#"{"nope": [0.0]}"#], "`nope` is not a feature"),
        (vec!["--indices", "1", "--preset", "pi0"], "unknown preset `pi0`"),
        (vec!["--indices", "1", "--frame-format", "bgr24"], "unknown frame format `bgr24` (known: rgb24, yuv420p, packets)"),
        (
            vec!["--indices", "1", "--frame-format", "yuv420p", "--frame-size", "24x18"],
            "frames at 24x18 come from a frame table, which stores RGB",
        ),
    ] {
        let mut full = vec!["sample", "--dataset", "v30-images-tiny", "--out", out];
        full.extend(args);
        let run = lake(&root, &full);
        assert_eq!(run.code, 2, "{run:#?}");
        assert!(run.stderr.contains(message), "expected `{message}` in {}", run.stderr);
        assert!(!Path::new(out).exists(), "no output file on error");
    }
    let run = lake(&root, &["sample", "--dataset", "nope", "--indices", "1", "--out", out]);
    assert!(run.stderr.contains("no dataset or view `nope`"), "{run:#?}");
    let missing = tmp.path().join("no/such/dir/x.arrow");
    let run = lake(&root, &["sample", "--dataset", "v30-images-tiny", "--indices", "1", "--out", missing.to_str().expect("utf-8")]);
    assert!(
        run.code == 2 && run.stderr.contains("does not exist") && !run.stderr.contains(".partial"),
        "the directory, not a temporary file: {run:#?}"
    );
    let run = lake(&root, &["sample", "--dataset", "v30-images-tiny", "--indices", " 1, 2", "--out", out]);
    assert_eq!(run.code, 0, "spaces after commas: {run:#?}");
    let windows = tmp.path().join("windows.json");
    std::fs::write(&windows, r#"{"action": [0.0, 0.0333333]}"#).expect("write");
    let from_file = format!("@{}", windows.display());
    let run = lake(&root, &["sample", "--dataset", "v30-images-tiny", "--indices", "1", "--delta-timestamps", &from_file, "--out", out]);
    assert_eq!(run.code, 0, "delta_timestamps from a file: {run:#?}");
    assert!(read_arrow(Path::new(out)).column_by_name("action_is_pad").is_some(), "the file's windows");
    std::fs::remove_file(out).expect("written");
    let dir = tmp.path().join("d.arrow");
    std::fs::create_dir(&dir).expect("dir");
    let run = lake(&root, &["sample", "--dataset", "v30-images-tiny", "--indices", "1", "--out", dir.to_str().expect("utf-8")]);
    assert!(run.code == 2 && run.stderr.contains("is a directory"), "{run:#?}");
    let left: Vec<_> = std::fs::read_dir(tmp.path()).expect("tmp").map(|e| e.expect("entry").file_name()).collect();
    assert!(left.iter().all(|n| !n.to_string_lossy().ends_with(".partial")), "no partial file is left: {left:?}");
    // A device is written into, never replaced by a file (a FIFO stands in for /dev/null).
    let pipe = tmp.path().join("pipe.arrow");
    assert!(std::process::Command::new("mkfifo").arg(&pipe).status().expect("mkfifo").success());
    let reader = std::thread::spawn({
        let pipe = pipe.clone();
        move || std::fs::read(pipe).expect("read the pipe")
    });
    let run = lake(&root, &["sample", "--dataset", "v30-images-tiny", "--indices", "1", "--out", pipe.to_str().expect("utf-8")]);
    assert_eq!(run.code, 0, "{run:#?}");
    let sent = reader.join().expect("reader");
    assert!(sent.starts_with(b"ARROW1"), "an Arrow file went through the pipe");
    assert!(std::fs::symlink_metadata(&pipe).expect("pipe").file_type().is_fifo(), "the pipe is still a pipe");
    for (args, message) in [
        (vec!["--batches", "0"], "must be at least 1"),
        (vec!["--threads", "5000"], "not a number of threads from 1 to 256"),
        (vec!["--prefetch", "1000"], "not a number of batches from 1 to 64"),
        (vec!["--batch-size", "0"], "must be at least 1"),
        (vec!["--episodes", "7"], "no episode 7 (episodes 0 to 2)"),
    ] {
        let run = lake(&root, &[&["bench", "--dataset", "v30-images-tiny"], args.as_slice()].concat());
        assert!(run.code == 2 && run.stderr.contains(message), "{args:?}: {run:#?}");
    }
}

/// Frames read from the stored frame table straight into batches: the same batches as
/// decoding, with the in-memory cache off and on (frames the table gave are cached, and a
/// diffusion window shows them again), nothing decoded; a dataset opened before `lake cache`
/// made or replaced the table reads the new one; and a table whose data files are gone is
/// reported by file, not read as something else.
/// A stream whose colour description switches (parts unspecified, BT.709, unspecified) gives
/// every frame as a freshly opened decoder would, whatever a decoder read before: a step after
/// one of the BT.709 part in the same request (one decoder for both), a step alone in a
/// process of its own, and the frame table (one decoder through the whole stream) agree.
#[test]
fn a_stream_that_switches_colour_gives_each_frame_as_a_fresh_decoder_would() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("lake");
    crate::common::ingest_recoloured(&root, tmp.path(), &[false, true, false]);
    let side = |indices: &str, flags: &[&str]| {
        let out = tmp.path().join("side.arrow");
        let args = [
            &["sample", "--dataset", "recoloured", "--indices", indices, "--preset", "none", "--threads", "1"][..],
            flags,
            &["--out", out.to_str().expect("utf-8")],
        ]
        .concat();
        let run = lake(&root, &args);
        assert_eq!(run.code, 0, "{run:#?}");
        let got = read_arrow(&out);
        let column = got.column_by_name("observation.images.side").expect("side").as_fixed_size_list().clone();
        (0..got.num_rows()).map(|r| column.value(r).as_primitive::<arrow::datatypes::UInt8Type>().values().to_vec()).collect::<Vec<_>>()
    };
    // Steps 0-89 name no colour space, 90-179 say BT.709, 180-299 name none again.
    let (early, tagged, late) = (side("5", &[]), side("150", &[]), side("250", &[]));
    let after_tagged = side("150,250", &["--frame-table", "off"]);
    assert!(after_tagged[0] == tagged[0], "the BT.709 frame");
    assert!(after_tagged[1] == late[0], "a frame of the last part, decoded after the BT.709 part, as alone");
    assert!(early[0] != late[0] || early == late, "(frames of different scenes)");
    let run = lake(&root, &["cache", "recoloured"]);
    assert_eq!(run.code, 0, "{run:#?}");
    for (index, alone) in [("5", &early), ("150", &tagged), ("250", &late)] {
        assert!(side(index, &["--frame-table", "on"]) == *alone, "step {index} from the frame table, as decoded alone");
    }
}

#[test]
fn frame_table_batches_equal_decoded_ones() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("lake");
    let name = "v30-av1-small";
    ingest_ok(&root, &testdata(name), &[]);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    rt.block_on(async {
        let lake = lake_store::Lake::open(root.to_str().expect("utf-8")).expect("lake");
        // Opened before `lake cache` ran, as under a running server.
        let ds = LoaderDataset::open(&lake, name).await.expect("open");
        assert!(!ds.has_frame_table());
        let eligible = Eligible::new(ds.episodes.iter().map(|e| (e.first_row, e.len)), 0, 0);
        let order = Arc::new(Order::new(9, vec![Source { eligible, weight: 1.0 }]).expect("order"));
        let run = |frame_table: bool, cache_bytes: u64| {
            let loader = Arc::new(
                Loader::new(vec![ds.clone()], &Windows::Preset(Preset::Diffusion), LoaderOptions { threads: 2, cache_bytes, frame_table })
                    .expect("loader"),
            );
            let request = StreamRequest {
                order: order.clone(),
                sharding: Sharding::new(24, 0, 1, true).expect("sharding"),
                start: Cursor { epoch: 0, step: 0 },
                limit: Some(10),
                stride: 1,
                prefetch: 2,
                lookahead: 0,
            };
            async move {
                let batches: Vec<RecordBatch> =
                    lake_loader::stream(loader.clone(), request).map(|b| b.expect("batch").batch).collect().await;
                (batches, loader.cache_stats(), loader.decode_stats())
            }
        };
        let (decoded, _, from_packets) = run(true, 0).await;
        let cached = crate::common::lake(&root, &["cache", name]);
        assert_eq!(cached.code, 0, "{cached:#?}");
        // The open dataset finds the table at its next batch.
        let (table, _, plain) = run(true, 0).await;
        assert!(ds.has_frame_table());
        let (table_cached, cached, _) = run(true, 8 << 20).await;
        assert_eq!(decoded.len(), 10);
        assert!(from_packets.packets > 0);
        assert_eq!((plain.packets, plain.groups), (0, 0), "frames come from the table, none decoded: {plain:?}");
        assert!(plain.frames > 0, "{plain:?}");
        assert!(cached.hits > 0, "frames read from the table are cached and shown again: {cached:?}");
        assert!(decoded == table, "frames read from the table differ from decoded ones");
        assert!(decoded == table_cached, "with the in-memory cache on too");
        // `lake cache` replaces the table (its files with new ones) while the dataset is open,
        // as under a running server: the new table is read, zstd and then plain again.
        for storage in ["zstd", "plain"] {
            let cached = crate::common::lake(&root, &["cache", name, "--storage", storage]);
            assert_eq!(cached.code, 0, "{cached:#?}");
            let (again, _, stats) = run(true, 0).await;
            assert_eq!(stats.packets, 0, "{stats:?}");
            assert!(decoded == again, "frames read from the {storage} table that replaced the open one");
        }

        // The table's data files cut short under the open dataset: its frames are decoded from
        // their packets instead, and counted.
        for f in files_under(&root).into_iter().filter(|p| p.to_string_lossy().contains("frames.lance/data/")) {
            std::fs::OpenOptions::new().write(true).open(f).and_then(|file| file.set_len(100)).expect("truncate");
        }
        let (mended, _, stats) = run(true, 0).await;
        assert!(decoded == mended, "frames decoded in place of the table's");
        assert!(stats.table_frames_decoded > 0 && stats.packets > 0, "{stats:?}");
    });

    // The table's data files cut short, then gone, for a process that opens them: the samples
    // are those decoded from packets, and the log says why and what mends the table.
    let files: Vec<std::path::PathBuf> =
        files_under(&root).into_iter().filter(|p| p.to_string_lossy().contains("frames.lance/data/")).collect();
    assert!(!files.is_empty(), "the frame table has data files under {}", root.display());
    let sample = |out: &str, flags: &[&str]| {
        let out = tmp.path().join(out);
        let mut args = vec!["sample", "--dataset", name, "--indices", "0,7,300", "--preset", "act", "--out", out.to_str().expect("utf-8")];
        args.extend_from_slice(flags);
        (lake(&root, &args), std::fs::read(&out).ok())
    };
    let (run, from_packets) = sample("decoded.arrow", &["--frame-table", "off"]);
    assert_eq!(run.code, 0, "{run:#?}");
    let instead = "the frames the table was to give are decoded from their packets instead";
    let (run, mended) = sample("cut.arrow", &[]);
    assert!(run.code == 0 && mended == from_packets, "{run:#?}");
    assert!(run.stderr.contains("damaged or cut short") && run.stderr.contains(instead), "{run:#?}");
    assert!(run.stderr.contains(&format!("run `lake cache {name}` again")), "{run:#?}");
    assert!(!run.stderr.contains("LanceError"), "{run:#?}");
    let inspect = lake(&root, &["inspect", name]);
    assert!(inspect.stdout.contains("recorded size: damaged outside lake: its data file data/"), "inspect says so: {inspect:#?}");
    for f in &files {
        std::fs::remove_file(f).expect("remove");
    }
    let (run, mended) = sample("gone.arrow", &[]);
    assert!(run.code == 0 && mended == from_packets, "{run:#?}");
    assert!(files.iter().any(|f| run.stderr.contains(f.to_str().expect("utf-8"))), "the log names the missing file: {run:#?}");
    assert!(run.stderr.contains(instead) && run.stderr.contains(&format!("run `lake cache {name}` again")), "{run:#?}");
    assert!(!run.stderr.contains(".rs:"), "no source locations: {run:#?}");
}

/// A frame damaged in a frame table (its data file's size and footer intact) is decoded from its
/// packets instead, so that the samples showing it are the recorded ones, and the log names
/// camera, episode and frame and the `lake cache` command that mends the table, for plain frames
/// (read straight into the batch) and zstd ones (read through Lance) alike; `lake verify` names
/// the frame, and `lake cache` again mends the table. A resized table, whose frames only `lake
/// cache --size` makes, fails the samples showing a damaged frame instead.
#[test]
fn a_frame_damaged_in_its_table_is_decoded_from_its_packets_and_lake_cache_mends_the_table() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("lake");
    let name = "v30-h264-multifile";
    ingest_ok(&root, &testdata(name), &[]);
    let every_step = tmp.path().join("steps.txt");
    std::fs::write(&every_step, (0..300).map(|i| i.to_string()).collect::<Vec<_>>().join(",")).expect("write");
    let indices = format!("@{}", every_step.display());
    let out = tmp.path().join("samples.arrow");
    let sample = |flags: &[&str]| {
        let _ = std::fs::remove_file(&out);
        let mut args = vec!["sample", name, "--indices", &indices, "--out", out.to_str().expect("utf-8")];
        args.extend_from_slice(flags);
        let run = lake(&root, &args);
        (run, std::fs::read(&out).ok())
    };
    let (run, decoded) = sample(&["--frame-table", "off"]);
    assert_eq!(run.code, 0, "{run:#?}");
    let decoded = decoded.expect("samples");
    for storage in ["plain", "zstd"] {
        let cached = lake(&root, &["cache", name, "--storage", storage]);
        assert_eq!(cached.code, 0, "{cached:#?}");
        let (run, from_table) = sample(&[]);
        assert!(run.code == 0 && from_table.as_ref() == Some(&decoded), "{storage}: samples from the table are the decoded ones: {run:#?}");
        flip_middle_of_largest(&root, "/frames.lance/data/");
        // Plain frames are read with positioned reads, or all at once through io_uring.
        for io in ["pread", "uring"] {
            let (run, written) = sample(&["--io", io]);
            assert!(run.code == 0 && written.as_ref() == Some(&decoded), "{storage}, {io}: the recorded frames: {run:#?}");
            let damaged = "the frame table's frame is not the one `lake cache` stored (CRC-32 ";
            assert!(run.stderr.contains(damaged) && run.stderr.contains(&format!("run `lake cache {name}` again")), "{storage}: {run:#?}");
            assert!(run.stderr.contains("the frames the table was to give are decoded from their packets instead"), "{run:#?}");
            assert!(
                run.stderr.contains(&format!("dataset {name}@1, camera observation.images.")) && run.stderr.contains(", episode "),
                "{run:#?}"
            );
            assert!(!run.stderr.contains("panicked") && !run.stderr.contains(".rs:"), "{run:#?}");
        }
        let verified = lake(&root, &["verify", name]);
        assert!(verified.code == 1 && verified.stdout.contains("the frame is not the one `lake cache` stored"), "{verified:#?}");
    }
    let cached = lake(&root, &["cache", name]);
    assert_eq!(cached.code, 0, "{cached:#?}");
    let (run, mended) = sample(&[]);
    assert!(run.code == 0 && mended.as_ref() == Some(&decoded), "`lake cache` again mends the table: {run:#?}");
    assert!(!run.stderr.contains("frame table"), "{run:#?}");

    // A table without checksums (as written before rows had them) is read without the check,
    // and `lake inspect` says how to add them.
    let table = files_under(&root)
        .into_iter()
        .find_map(|p| p.to_str().and_then(|p| p.split_once("/frames.lance/data/")).map(|(dir, _)| format!("{dir}/frames.lance")))
        .expect("the frame table");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let mut opened = lake_store::deps::lance::Dataset::open(&table).await.expect("open");
        opened.drop_columns(&[lake_loader::FRAME_CHECKSUM]).await.expect("drop the checksums");
    });
    let (run, unchecked) = sample(&[]);
    assert!(run.code == 0 && unchecked.as_ref() == Some(&decoded), "{run:#?}");
    let inspect = lake(&root, &["inspect", name]);
    assert!(inspect.stdout.contains(&format!("without checksums (run `lake cache {name}@1` again to add them)")), "{inspect:#?}");
    assert_eq!(lake(&root, &["cache", name]).code, 0);
    let inspect = lake(&root, &["inspect", name]);
    assert!(inspect.stdout.contains("recorded size: 900 frames, plain, ") && !inspect.stdout.contains("without checksums"), "{inspect:#?}");

    // A resized table's frames are made by `lake cache --size` alone: a damaged one fails the
    // samples that show it.
    assert_eq!(lake(&root, &["cache", name, "--size", "32x24"]).code, 0);
    flip_middle_of_largest(&root, "/frames-32x24.lance/data/");
    let (run, written) = sample(&["--frame-size", "32x24"]);
    assert_eq!(run.code, 2, "{run:#?}");
    assert!(run.stderr.contains("the frame table's frame is not the one `lake cache` stored (CRC-32 "), "{run:#?}");
    assert!(run.stderr.contains(&format!("run `lake cache {name} --size 32x24` again")), "{run:#?}");
    assert!(written.is_none(), "no output file on error");
}

/// Flips one byte in the middle of the largest file under `root` whose path holds `part` (a
/// frame table's data files: where its frames lie).
fn flip_middle_of_largest(root: &Path, part: &str) {
    let largest = files_under(root)
        .into_iter()
        .filter(|p| p.to_string_lossy().contains(part))
        .max_by_key(|p| std::fs::metadata(p).expect("metadata").len())
        .unwrap_or_else(|| panic!("no file under {} holds {part}", root.display()));
    let mut body = std::fs::read(&largest).expect("read");
    let middle = body.len() / 2;
    body[middle] ^= 0x10;
    std::fs::write(&largest, &body).expect("damage");
}

/// `lake ingest --frame-cache native --frame-cache WxH` ingests and stores both frame tables
/// (what `lake cache` would); a re-ingest of the same source keeps them untouched; another
/// storage asked for rewrites that table; `--frame-storage` alone is a usage error; a dataset
/// without cameras gets no table; frames that cannot be decoded leave the version ingested and
/// an error naming episode, frame and the `lake cache` commands that finish the job.
#[test]
fn ingest_stores_frame_tables_when_asked() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("lake");
    let name = "v30-av1-small";
    let source = testdata(name);
    let source = source.to_str().expect("utf-8");
    let run = ingest_ok(&root, &testdata(name), &["--frame-cache", "native", "--frame-cache", "32x24"]);
    assert!(run.stdout.contains(&format!("stored 1200 decoded frames of {name}@1 at 32x24")), "{run:#?}");
    let tables = |root: &Path| {
        let run = lake(root, &["inspect", name, "--json"]);
        let json: serde_json::Value = serde_json::from_str(&run.stdout).expect("json");
        json["frame_tables"]
            .as_array()
            .expect("frame tables")
            .iter()
            .map(|t| (t["size"].clone(), t["storage"].clone(), t["frames"].clone()))
            .collect::<Vec<_>>()
    };
    let plain = serde_json::json!("plain");
    assert_eq!(tables(&root), vec![(serde_json::Value::Null, plain.clone(), 1200.into()), ("32x24".into(), plain, 1200.into())]);
    // JSON lists every episode, or the first N with --episodes.
    let episodes = |args: &[&str]| {
        let run = lake(&root, &[&["inspect", name, "--json"][..], args].concat());
        serde_json::from_str::<serde_json::Value>(&run.stdout).expect("json")["episodes"].as_array().expect("episodes").len()
    };
    assert_eq!((episodes(&[]), episodes(&["--episodes", "2"])), (6, 2));
    let files = files_under(&root);

    let run = lake(&root, &["ingest", source, "--frame-cache", "32x24", "--frame-cache", "native", "--json"]);
    assert_eq!(run.code, 0, "{run:#?}");
    let json: serde_json::Value = serde_json::from_str(&run.stdout).expect("json");
    assert_eq!(json["outcome"], "unchanged");
    let written: Vec<_> = json["frame_tables"].as_array().expect("frame tables").iter().map(|t| t["written"].clone()).collect();
    assert_eq!(written, vec![serde_json::Value::Bool(false); 2], "{json:#}");
    assert_eq!(files_under(&root), files, "nothing rewritten");

    let run = lake(&root, &["ingest", source, "--frame-cache", "32x24", "--frame-storage", "zstd"]);
    assert_eq!(run.code, 0, "{run:#?}");
    assert_eq!(tables(&root)[1], ("32x24".into(), "zstd".into(), 1200.into()));
    let out = tmp.path().join("s.arrow");
    let run =
        lake(&root, &["sample", "--dataset", name, "--indices", "0,599", "--frame-size", "32x24", "--out", out.to_str().expect("utf-8")]);
    assert_eq!(run.code, 0, "{run:#?}");

    let run = lake(&root, &["ingest", source, "--frame-storage", "zstd"]);
    assert_eq!(run.code, 2, "{run:#?}");
    assert!(run.stderr.contains("--frame-cache"), "{run:#?}");

    // A dataset without cameras (every one left out): nothing to store, and no table.
    let cameraless = shared_dir().join("lerobot-real/so101-record-test-v30");
    let run = ingest_ok(&root, &cameraless, &["--drop-missing-cameras", "--frame-cache", "native"]);
    assert!(run.stdout.contains("so101-record-test-v30@1 has no camera frames; nothing stored"), "{run:#?}");
    assert!(
        !files_under(&root).iter().any(|p| p.to_string_lossy().contains("so101-record-test-v30") && p.to_string_lossy().contains("frames"))
    );

    // Frames that cannot be decoded (the payload of a keyframe's frame OBU overwritten, its
    // framing intact: demuxing passes). Storing frames decodes every frame before the version
    // is committed: the ingest is refused, naming camera, episode and frame. Ingested without
    // frame tables, the version is in the lake, and storing its frames later fails naming the
    // episode and frame.
    let broken = tmp.path().join("broken");
    lake_testkit::copy_dir(&testdata(name), &broken);
    let video = files_under(&broken).into_iter().find(|p| p.to_string_lossy().contains("wrist")).expect("the wrist camera's file");
    let mut bytes = std::fs::read(&video).expect("read");
    let (pos, size) = middle_keyframe_packet(&video);
    let payload = last_obu_payload(&bytes[pos..pos + size]);
    for b in &mut bytes[pos + payload.start..pos + payload.end] {
        *b = b.wrapping_mul(7).wrapping_add(13);
    }
    std::fs::write(&video, bytes).expect("write");
    let broken_source = broken.to_str().expect("utf-8");
    let run = lake(&root, &["ingest", broken_source, "--frame-cache", "32x24", "--frame-cache", "native", "--frame-storage", "zstd"]);
    assert_eq!(run.code, 1, "{run:#?}");
    assert!(run.stderr.contains("error[corrupt-file]") && run.stderr.contains("camera observation.images.wrist, frame "), "{run:#?}");
    assert!(!lake(&root, &["ls"]).stdout.contains("broken"), "nothing is committed");
    ingest_ok(&root, &broken, &[]);
    let run = lake(&root, &["cache", "broken", "--size", "32x24", "--storage", "zstd"]);
    assert_eq!(run.code, 2, "{run:#?}");
    assert!(run.stderr.contains("camera observation.images.wrist, episode ") && !run.stderr.contains("episode -1"), "{run:#?}");
    assert!(lake(&root, &["ls"]).stdout.contains("broken"), "the ingested version stays");
    assert!(!files_under(&root).iter().any(|p| p.to_string_lossy().contains("/broken/") && p.to_string_lossy().contains("frames")));
}

/// A frame table of resized frames (`lake cache --size`): samples read at that size have every
/// frame equal to the recorded frame resized (area averaging keeps each channel's mean), every
/// other column equal to the recorded samples', and the shape in the field metadata; a size
/// without its table, or with the frame table turned off, is refused with what to do. A trainer
/// that decodes makes the same frames with no table: the packets decoded and resized on the CPU
/// give the whole batch, and lake-gpu's resize (its CPU twin) gives each frame from the recorded
/// one.
#[test]
fn resized_frame_tables_serve_resized_samples() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("lake");
    let name = "v30-av1-small";
    ingest_ok(&root, &testdata(name), &[]);
    let run = lake(&root, &["inspect", name]);
    assert!(run.stdout.contains("frames    decoded from packets"), "{run:#?}");
    let run = lake(&root, &["cache", name, "--size", "64x48"]);
    assert_eq!(run.code, 0, "{run:#?}");
    let run = lake(&root, &["inspect", name]);
    assert!(run.stdout.contains("frames    64x48: 1200 frames, plain, "), "inspect lists the table: {run:#?}");
    let run = lake(&root, &["inspect", name, "--json"]);
    let json: serde_json::Value = serde_json::from_str(&run.stdout).expect("json");
    assert_eq!(json["frame_tables"][0]["size"], "64x48");
    assert_eq!(json["frame_tables"][0]["frames"], 1200);
    let sample = |extra: &[&str]| {
        let out = tmp.path().join(format!("s{}.arrow", extra.len()));
        let mut args = vec!["sample", "--dataset", name, "--indices", "0,7,300,599", "--preset", "diffusion", "--out"];
        args.push(out.to_str().expect("utf-8"));
        args.extend(extra);
        let run = lake(&root, &args);
        assert_eq!(run.code, 0, "{run:#?}");
        read_arrow(&out)
    };
    let native = sample(&[]);
    let resized = sample(&["--frame-size", "64x48"]);
    assert_eq!(native.schema().fields().len(), resized.schema().fields().len());
    let mut cameras = 0;
    for (field, column) in resized.schema().fields().iter().zip(resized.columns()) {
        let recorded = native.column_by_name(field.name()).expect("same columns");
        let Some(shape) = field.metadata().get(lake_loader::SHAPE).filter(|_| field.metadata().contains_key(lake_loader::LAYOUT)) else {
            assert_eq!(column, recorded, "{} is not a frame column and does not change", field.name());
            continue;
        };
        cameras += 1;
        assert_eq!(shape, "[2,48,64,3]", "{}", field.name());
        let shape: Vec<usize> =
            serde_json::from_str(&native.schema().field_with_name(field.name()).expect("field").metadata()[lake_loader::SHAPE])
                .expect("shape");
        let (h, w) = (shape[1], shape[2]);
        let mut resizer = lake_codec::RgbResizer::new((w as u32, h as u32), (64, 48)).expect("resizer");
        let on_gpu = lake_gpu::resize::Resize::new((w as u32, h as u32), (64, 48)).expect("the kernels resize these frames");
        let (got, want) = (column.as_fixed_size_list(), recorded.as_fixed_size_list());
        for row in 0..got.len() {
            let (got, want) = (got.value(row), want.value(row));
            let (got, want) =
                (got.as_primitive::<arrow::datatypes::UInt8Type>().values(), want.as_primitive::<arrow::datatypes::UInt8Type>().values());
            let mut twin = vec![0_u8; got.len()];
            let slots: Vec<&[u8]> = want.chunks_exact(w * h * 3).collect();
            lake_gpu::resize::resize_on_cpu(&slots, &on_gpu, lake_gpu::colour::Target::Rgb24, &mut twin).expect("twin");
            assert!(twin[..] == got[..], "{} row {row}: the kernels' twin resizes otherwise", field.name());
            for (slot, (g, n)) in got.chunks_exact(64 * 48 * 3).zip(want.chunks_exact(w * h * 3)).enumerate() {
                assert!(
                    g == &resizer.resize(n).expect("resize")[..],
                    "{} row {row} slot {slot}: not the recorded frame resized",
                    field.name()
                );
                let mean = |px: &[u8], c: usize| px.iter().skip(c).step_by(3).map(|&v| f64::from(v)).sum::<f64>() / (px.len() / 3) as f64;
                for c in 0..3 {
                    assert!((mean(g, c) - mean(n, c)).abs() < 2.0, "{} row {row}: channel {c} mean moved", field.name());
                }
            }
        }
    }
    assert_eq!(cameras, 2);
    let packets = tmp.path().join("packets.arrow");
    let args = ["sample", "--dataset", name, "--indices", "0,7,300,599", "--preset", "diffusion", "--frame-format", "packets", "--out"];
    let run = lake(&root, &[&args[..], &[packets.to_str().expect("utf-8")]].concat());
    assert_eq!(run.code, 0, "{run:#?}");
    let packets = read_arrow(&packets);
    let size = lake_loader::FrameSize { width: 64, height: 48 };
    let decoder =
        lake_loader::PacketBatchDecoder::new(lake_loader::FrameFormat::Rgb24, 2).expect("decoder").resizing_to(size).expect("rgb");
    assert_eq!(decoder.decoded_schema(&packets.schema()).expect("schema"), resized.schema());
    assert!(decoder.decode(&packets).expect("decoded") == resized, "the packets decoded and resized differ from the frame table's");
    let planes = lake_loader::PacketBatchDecoder::new(lake_loader::FrameFormat::Yuv420p, 2).expect("decoder").resizing_to(size);
    assert!(planes.expect_err("planes").to_string().contains("come at the size each camera recorded"));

    let out = tmp.path().join("x.arrow");
    let out = out.to_str().expect("utf-8");
    for (extra, says) in [
        (vec!["--frame-size", "32x32"], format!("no frame table of 32x32 frames: make one with `lake cache {name}@1 --size 32x32`")),
        (vec!["--frame-size", "64x48", "--frame-table", "off"], "come only from its frame table of that size".to_string()),
        (vec!["--frame-size", "64by48"], "expected WIDTHxHEIGHT".to_string()),
    ] {
        let mut args = vec!["sample", "--dataset", name, "--indices", "1", "--out", out];
        args.extend(extra);
        let run = lake(&root, &args);
        assert_eq!(run.code, 2, "{run:#?}");
        assert!(run.stderr.contains(&says), "expected `{says}` in {}", run.stderr);
        assert!(!Path::new(out).exists(), "no output file on error");
    }
}

/// Batches through the stream API: the same with the frame cache on and off, and with frames
/// decoded ahead for later batches (with room for all of them, and with room for two, where
/// kept frames must give way; a stream's own, and shared by two ranks); cache and kept frames
/// within the budget together, and the rows those the sampler drew.
#[test]
fn cached_and_uncached_streams_are_identical() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("lake");
    ingest_ok(&root, &testdata("v30-av1-small"), &[]);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    rt.block_on(async {
        let lake = lake_store::Lake::open(root.to_str().expect("utf-8")).expect("lake");
        let ds = LoaderDataset::open(&lake, "v30-av1-small").await.expect("open");
        let eligible = Eligible::new(ds.episodes.iter().map(|e| (e.first_row, e.len)), 0, 0);
        let order = Arc::new(Order::new(5, vec![Source { eligible, weight: 1.0 }]).expect("order"));
        let sharding = Sharding::new(16, 0, 1, true).expect("sharding");
        let front = ds.cameras.iter().map(|c| c.frame_bytes() as u64).max().expect("cameras");
        let run = |cache_bytes: u64, lookahead: u64, preset: Preset| {
            let loader = Arc::new(
                Loader::new(vec![ds.clone()], &Windows::Preset(preset), LoaderOptions { threads: 2, cache_bytes, frame_table: false })
                    .expect("loader"),
            );
            let request = StreamRequest {
                order: order.clone(),
                sharding,
                start: Cursor { epoch: 0, step: 30 },
                limit: Some(12),
                stride: 1,
                prefetch: 2,
                lookahead,
            };
            let loader2 = loader.clone();
            async move {
                let mut stream = lake_loader::stream(loader2, request);
                let mut out = Vec::new();
                while let Some(b) = stream.next().await {
                    let b = b.expect("batch");
                    let s = loader.cache_stats();
                    assert!(s.bytes + s.reserved <= cache_bytes, "cache over budget: {s:?}");
                    out.push(b);
                }
                drop(stream);
                (out, loader.cache_stats(), loader.decode_stats())
            }
        };
        let budget = 8 << 20;
        let (cached, stats, _) = run(budget, 0, Preset::Diffusion).await;
        let (uncached, off, off_decode) = run(0, 0, Preset::Diffusion).await;
        let (ahead, kept, _) = run(budget, 4096, Preset::Diffusion).await;
        let (tight, tight_stats, _) = run(2 * front + 1, 4096, Preset::Diffusion).await;
        assert_eq!([cached.len(), uncached.len(), ahead.len(), tight.len()], [12; 4], "every stream gives every batch");
        assert!(stats.hits > 0, "a diffusion window reuses frames across batches: {stats:?}");
        assert_eq!(off.hits, 0);
        // With nothing kept, a batch decodes each GOP its samples and their window slots need
        // once, from its keyframe to the last frame wanted, and fans the frames out.
        let probe = Loader::new(vec![ds.clone()], &Windows::Preset(Preset::Diffusion), LoaderOptions::default()).expect("loader");
        let (mut groups, mut packets, mut slots) = (0, 0, 0);
        for b in &uncached {
            let draws: Vec<_> = sharding.positions(order.epoch_len(), b.cursor.step).map(|p| order.draw(b.cursor.epoch, p)).collect();
            let jobs = probe.plan(&draws);
            groups += jobs.len() as u64;
            packets += jobs.iter().map(|j| j.targets.last().expect("a target") - j.start + 1).sum::<u64>();
            slots += draws.len() as u64 * 2 * 2;
        }
        assert_eq!((off_decode.groups, off_decode.packets), (groups, packets), "each GOP once per batch: {off_decode:?}");
        assert!(off_decode.frames < slots, "frames shared by window slots are decoded once: {off_decode:?}, {slots} slots");
        assert!(kept.ahead_hits > 0, "frames decoded ahead are shown: {kept:?}");
        assert!(tight_stats.ahead_hits > 0, "{tight_stats:?}");
        assert_eq!((kept.reserved, tight_stats.reserved), (0, 0), "a finished stream gives its room back");
        for ((a, b), (c, d)) in cached.iter().zip(&uncached).zip(ahead.iter().zip(&tight)) {
            assert_eq!(a.cursor, b.cursor);
            assert_eq!(a.batch, b.batch, "cache on and off give the same batch at {:?}", a.cursor);
            assert_eq!(a.batch, c.batch, "frames decoded ahead give the same batch at {:?}", a.cursor);
            assert_eq!(a.batch, d.batch, "with little room for them too, at {:?}", a.cursor);
        }
        // A batch for the caller (frames decoded straight into its columns) and a batch for a
        // transport (frames shared) are the same batch, with the cache on (hits and decodes
        // mixed in one batch) and off.
        for cache_bytes in [0, budget] {
            let loader = Loader::new(
                vec![ds.clone()],
                &Windows::Preset(Preset::Diffusion),
                LoaderOptions { threads: 2, cache_bytes, frame_table: false },
            )
            .expect("loader");
            for b in &cached[..6] {
                let ahead = lake_loader::Ahead::default();
                let shared = lake_loader::load_samples_with(&loader, &order, sharding, b.cursor, &ahead).await.expect("samples");
                assert_eq!(shared.batch.to_record_batch().expect("batch"), b.batch, "frames shared at {:?}", b.cursor);
                let columns = lake_loader::load(&loader, &order, sharding, b.cursor).await.expect("batch");
                assert_eq!(columns.batch, b.batch, "frames in place at {:?}", b.cursor);
            }
            assert_eq!(loader.cache_stats().hits > 0, cache_bytes > 0, "{:?}", loader.cache_stats());
        }
        // With one frame per camera and sample (`act`) and GOP 2, frames are shown once per
        // epoch: every hit is a frame decoded ahead, and each saves decoding its GOP again.
        let (act_cold, _, cold_decode) = run(0, 0, Preset::Act).await;
        let (act_ahead, act_stats, ahead_decode) = run(budget, 4096, Preset::Act).await;
        assert!(act_stats.ahead_hits > 0 && act_stats.ahead_hits == act_stats.hits, "{act_stats:?}");
        assert!(ahead_decode.packets < cold_decode.packets, "{ahead_decode:?} vs {cold_decode:?}");
        for (a, b) in act_cold.iter().zip(&act_ahead) {
            assert_eq!(a.batch, b.batch, "act batches at {:?}", a.cursor);
        }
        // Two ranks of one order, read in turns (one batch each): with a lookahead each, a rank
        // keeps only what its own later batches show; sharing one, a GOP one rank decodes is
        // kept for the other too. Same batches as decoding everything, fewer packets decoded.
        // Each stream makes its next batch ahead, half done while the other rank is read: a
        // batch waiting for a frame the other rank's batch decodes gets it all the same.
        let ranks = |cache_bytes: u64, shared: Option<u64>| {
            let loader = Arc::new(
                Loader::new(vec![ds.clone()], &Windows::Preset(Preset::Act), LoaderOptions { threads: 2, cache_bytes, frame_table: false })
                    .expect("loader"),
            );
            let request = |rank: u64| StreamRequest {
                order: order.clone(),
                sharding: Sharding::new(16, rank, 2, true).expect("sharding"),
                start: Cursor { epoch: 0, step: 3 },
                limit: Some(20),
                stride: 1,
                prefetch: 2,
                lookahead: 4096,
            };
            let lookahead = shared.and_then(|h| Lookahead::new(loader.clone(), order.clone(), request(0).sharding, h, cache_bytes));
            let mut streams: Vec<_> = (0..2)
                .map(|r| match &lookahead {
                    Some(l) => {
                        let member = l.join(request(r).sharding, lake_loader::cursors(&request(r)));
                        assert!(member.is_some(), "a rank of the same global batch joins");
                        lake_loader::stream_with(loader.clone(), request(r), member)
                    }
                    None => lake_loader::stream(loader.clone(), request(r)),
                })
                .collect();
            async move {
                let mut out = vec![Vec::new(), Vec::new()];
                for _ in 0..20 {
                    for (r, s) in streams.iter_mut().enumerate() {
                        out[r].push(s.next().await.expect("a batch").expect("batch").batch);
                        let c = loader.cache_stats();
                        assert!(c.bytes + c.reserved <= cache_bytes, "cache over budget: {c:?}");
                    }
                }
                assert!(streams[0].next().await.is_none(), "20 batches");
                drop(streams);
                drop(lookahead);
                (out, loader.cache_stats(), loader.decode_stats())
            }
        };
        let (cold, _, cold_decode) = ranks(0, None).await;
        let (own, own_stats, _) = ranks(budget, None).await;
        let (together, together_stats, together_decode) = ranks(budget, Some(4096)).await;
        assert_eq!((own, together), (cold.clone(), cold), "ranks' batches do not depend on what was decoded ahead");
        assert!(together_stats.ahead_hits > own_stats.ahead_hits, "shared: {together_stats:?}, each its own: {own_stats:?}");
        assert_eq!(together_stats.reserved, 0, "the room is given back when the ranks are done");
        assert!(together_decode.packets < cold_decode.packets, "{together_decode:?} vs {cold_decode:?}");
        let other = Lookahead::new(
            Arc::new(Loader::new(vec![ds.clone()], &Windows::Preset(Preset::Act), LoaderOptions::default()).expect("loader")),
            order.clone(),
            sharding,
            4096,
            budget,
        )
        .expect("a lookahead");
        assert!(
            other.join(Sharding::new(32, 0, 2, true).expect("sharding"), std::iter::empty()).is_none(),
            "a stream of another global batch reads another sequence and does not join"
        );
        assert_eq!(other.members(), 0);

        // All ranks of a step begin their batch before any of them decodes (a server's streams,
        // each batch waiting for its turn to be made): a GOP one decodes is kept for the others,
        // which take it when their turn comes, or wait for it when they run alongside.
        let (world, step, room) = (4u64, Cursor { epoch: 0, step: 2 }, 256 << 20);
        let shard = |rank: u64| Sharding::new(128, rank, world, true).expect("sharding");
        let begun_first = |cache_bytes: u64, concurrently: bool| {
            let loader = Arc::new(
                Loader::new(vec![ds.clone()], &Windows::Preset(Preset::Act), LoaderOptions { threads: 2, cache_bytes, frame_table: false })
                    .expect("loader"),
            );
            let lookahead = Lookahead::new(loader.clone(), order.clone(), shard(0), 4096, cache_bytes);
            let order = order.clone();
            async move {
                // Each rank plans this one step only.
                let members: Vec<_> = match &lookahead {
                    Some(l) => (0..world).map(|r| l.join(shard(r), std::iter::once(step))).collect(),
                    None => vec![],
                };
                let aheads: Vec<_> = (0..world as usize)
                    .map(|r| members.get(r).and_then(Option::as_ref).map(|m| m.begin(step)).unwrap_or_default())
                    .collect();
                let loads = aheads.iter().zip(0..world).map(|(ahead, r)| lake_loader::load_with(&loader, &order, shard(r), step, ahead));
                let loaded = if concurrently {
                    futures::future::join_all(loads).await
                } else {
                    let mut out = Vec::new();
                    for load in loads {
                        out.push(load.await);
                    }
                    out
                };
                drop((aheads, members));
                let kept = lookahead.as_ref().map_or(0, |l| l.kept_bytes());
                let batches: Vec<RecordBatch> = loaded.into_iter().map(|b| b.expect("batch").batch).collect();
                (batches, loader.cache_stats(), loader.decode_stats(), kept)
            }
        };
        let (cold, _, cold_decode, _) = begun_first(0, false).await;
        let (in_turn, in_turn_stats, in_turn_decode, in_turn_kept) = begun_first(room, false).await;
        let (alongside, alongside_stats, alongside_decode, alongside_kept) = begun_first(room, true).await;
        assert_eq!(in_turn, cold, "frames kept by another rank's batch are the frames it would decode");
        assert_eq!(alongside, cold, "also when the ranks' batches are made alongside each other");
        let draws: Vec<_> = (0..world).flat_map(|r| shard(r).positions(order.epoch_len(), step.step)).map(|p| order.draw(0, p)).collect();
        let probe = Loader::new(vec![ds.clone()], &Windows::Preset(Preset::Act), LoaderOptions::default()).expect("loader");
        let once: u64 = probe.plan(&draws).iter().map(|j| j.targets.last().expect("a target") - j.start + 1).sum();
        assert!(cold_decode.packets > once, "some GOPs are shown by two ranks: {cold_decode:?}, {once} packets decoding each once");
        assert_eq!(in_turn_decode.packets, once, "every GOP the step shows is decoded once: {in_turn_decode:?}");
        assert!(in_turn_stats.ahead_hits > 0 && in_turn_stats.hits == in_turn_stats.ahead_hits, "{in_turn_stats:?}");
        assert!(alongside_decode.packets < cold_decode.packets, "{alongside_decode:?} vs {cold_decode:?}");
        assert!(alongside_stats.ahead_hits > 0, "{alongside_stats:?}");
        assert_eq!((in_turn_kept, alongside_kept), (0, 0), "nothing stays kept once every batch of the plan is made");
        assert_eq!((in_turn_stats.reserved, alongside_stats.reserved), (0, 0));

        // The stream crosses into epoch 1 after step 36 (600 steps / 16 per step, last dropped).
        assert_eq!(cached.last().expect("batches").cursor, Cursor { epoch: 1, step: 4 });
        let index = ds.steps.column_by_name("index").expect("index").as_primitive::<Int64Type>().clone();
        for b in &cached {
            let got = b.batch.column_by_name("index").expect("index").as_primitive::<Int64Type>().clone();
            let want: Vec<i64> = sharding
                .positions(order.epoch_len(), b.cursor.step)
                .map(|p| index.value(order.draw(b.cursor.epoch, p).row as usize))
                .collect();
            assert_eq!(got.values().to_vec(), want);
        }
    });
}

/// Two jobs on one decoded-frame cache (a server's): each job's lookahead may hold its share of
/// the budget. A job whose stream stopped reading keeps what it held until another job needs
/// room, then gives back what it holds beyond its share.
#[test]
fn a_stopped_stream_gives_back_room_beyond_its_share() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("lake");
    ingest_ok(&root, &testdata("v30-av1-small"), &[]);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    rt.block_on(async {
        let lake = lake_store::Lake::open(root.to_str().expect("utf-8")).expect("lake");
        let ds = LoaderDataset::open(&lake, "v30-av1-small").await.expect("open");
        let front = ds.cameras.iter().map(|c| c.frame_bytes() as u64).max().expect("cameras");
        let budget = 24 * front;
        let loader = Arc::new(
            Loader::new(
                vec![ds.clone()],
                &Windows::Preset(Preset::Act),
                LoaderOptions { threads: 2, cache_bytes: budget, frame_table: false },
            )
            .expect("loader"),
        );
        let eligible = || Eligible::new(ds.episodes.iter().map(|e| (e.first_row, e.len)), 0, 0);
        let sharding = Sharding::new(16, 0, 1, true).expect("sharding");
        let job = |seed: u64| {
            let order = Arc::new(Order::new(seed, vec![Source { eligible: eligible(), weight: 1.0 }]).expect("order"));
            let request = StreamRequest {
                order: order.clone(),
                sharding,
                start: Cursor { epoch: 0, step: 0 },
                limit: Some(20),
                stride: 1,
                prefetch: 1,
                lookahead: 4096,
            };
            let lookahead = Lookahead::new(loader.clone(), order, sharding, 4096, budget).expect("a lookahead");
            let member = lookahead.join(sharding, lake_loader::cursors(&request)).expect("joins");
            (lookahead, lake_loader::stream_with(loader.clone(), request, Some(member)))
        };
        let (first, mut paused) = job(1);
        for _ in 0..8 {
            paused.next().await.expect("a batch").expect("batch");
        }
        assert!(first.kept_bytes() > budget / 2, "alone, a job may use the whole budget: {}", first.kept_bytes());
        // The first job's client stops reading; a second job starts.
        let (second, mut running) = job(2);
        let hits_before = loader.cache_stats().ahead_hits;
        let mut shown = Vec::new();
        for _ in 0..12 {
            shown.push(running.next().await.expect("a batch").expect("batch").batch);
            let c = loader.cache_stats();
            assert!(c.bytes + c.reserved <= budget, "cache over budget: {c:?}");
        }
        assert!(first.kept_bytes() <= budget / 2, "the stopped job holds at most its share: {}", first.kept_bytes());
        assert!(second.kept_bytes() > 0, "the running job keeps frames for its later batches");
        assert!(loader.cache_stats().ahead_hits > hits_before, "and shows them: {:?}", loader.cache_stats());
        // The same batches as a loader without a frame cache.
        let cold = Arc::new(
            Loader::new(vec![ds.clone()], &Windows::Preset(Preset::Act), LoaderOptions { threads: 2, cache_bytes: 0, frame_table: false })
                .expect("loader"),
        );
        let order = Arc::new(Order::new(2, vec![Source { eligible: eligible(), weight: 1.0 }]).expect("order"));
        for (step, batch) in shown.iter().enumerate() {
            let want = lake_loader::load(&cold, &order, sharding, Cursor { epoch: 0, step: step as u64 }).await.expect("batch");
            assert_eq!(&want.batch, batch, "step {step}");
        }
        drop((paused, running, first, second));
        assert_eq!(loader.cache_stats().reserved, 0, "every job gave its room back");

        // A stream whose batches begin out of order gets nothing ahead from then on, and what
        // was kept for it, for the skipped batch too, is let go.
        let wide = Sharding::new(100, 0, 1, true).expect("sharding");
        let order = Arc::new(Order::new(3, vec![Source { eligible: eligible(), weight: 1.0 }]).expect("order"));
        let request = StreamRequest {
            order: order.clone(),
            sharding: wide,
            start: Cursor { epoch: 0, step: 0 },
            limit: None,
            stride: 1,
            prefetch: 1,
            lookahead: 4096,
        };
        let lookahead = Lookahead::new(loader.clone(), order.clone(), wide, 4096, budget).expect("a lookahead");
        let member = lookahead.join(wide, lake_loader::cursors(&request)).expect("joins");
        let at = |step| Cursor { epoch: 0, step };
        let ahead = member.begin(at(0));
        lake_loader::load_with(&loader, &order, wide, at(0), &ahead).await.expect("batch");
        drop(ahead);
        assert!(lookahead.kept_bytes() > 0, "the first batch kept frames for later ones");
        let hits = loader.cache_stats().ahead_hits;
        let skipped = member.begin(at(2));
        assert_eq!(loader.cache_stats().ahead_hits, hits, "the batch begun out of order is handed no frames");
        assert_eq!(lookahead.kept_bytes(), 0, "nothing is kept for a stream that left its order");
        drop((skipped, member, lookahead));
        assert_eq!(loader.cache_stats().reserved, 0);
    });
}

/// A training proxy (`lake cache --proxy`): made only on request, served only on request, its
/// frames close to the recorded ones but not equal, labelled with their PSNR in `lake inspect`
/// and in every camera column, and the same frames whichever way they travel (decoded, or as
/// packets the trainer decodes).
#[test]
fn a_training_proxy_serves_labelled_lossy_frames_near_the_recorded_ones() {
    use lake_schemas::tables::PROXY_METADATA;
    let name = "v30-av1-small";
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("lake");
    ingest_ok(&root, &testdata(name), &[]);
    let out = |file: &str| tmp.path().join(file);
    let sample = |extra: &[&str], file: &str| {
        let path = out(file);
        let mut args = vec!["sample", "--dataset", name, "--indices", "0,57,310,599", "--preset", "diffusion"];
        args.extend(extra);
        args.extend(["--out", path.to_str().expect("utf-8")]);
        lake(&root, &args)
    };

    let run = sample(&["--proxy"], "none.arrow");
    assert_eq!(run.code, 2, "{run:#?}");
    assert!(
        run.stderr.contains("v30-av1-small@1 has no training proxy: make one with `lake cache v30-av1-small@1 --proxy h264`"),
        "{}",
        run.stderr
    );
    let run = lake(&root, &["cache", name, "--proxy", "h264", "--size", "64x48"]);
    assert_eq!(run.code, 2, "a proxy is not a frame table: {run:#?}");

    let run = lake(&root, &["cache", name, "--proxy", "h264", "--gop", "4"]);
    assert_eq!(run.code, 0, "{run:#?}");
    assert!(run.stdout.contains("stored the h264 proxy (GOP 4, CRF 18) of v30-av1-small@1: 1200 frames"), "{}", run.stdout);
    assert!(run.stdout.contains("observation.images.front: PSNR ") && run.stdout.contains("lossy"), "{}", run.stdout);

    // The table: GOPs of four frames, no reordering, every shown frame once.
    let proxy = crate::common::table(&root, name, "proxy");
    let (offsets, pts, dts) =
        (crate::common::ints(&proxy, "keyframe_offset"), crate::common::ints(&proxy, "pts"), crate::common::ints(&proxy, "dts"));
    assert_eq!(offsets.len(), 1200);
    assert_eq!(offsets.iter().max(), Some(&3), "GOPs of 4");
    assert_eq!(pts, dts, "decode order is presentation order");
    let mut sources = crate::common::ints(&proxy, "source_row");
    sources.sort_unstable();
    sources.dedup();
    assert_eq!(sources.len(), 1200, "each recorded frame re-encoded once");

    let run = lake(&root, &["inspect", name, "--json"]);
    assert_eq!(run.code, 0, "{run:#?}");
    let inspected: serde_json::Value = serde_json::from_str(&run.stdout).expect("json");
    let cameras = inspected["proxy"]["cameras"].as_array().expect("the proxy's cameras");
    assert_eq!((inspected["proxy"]["codec"].as_str(), inspected["proxy"]["lossy"].as_bool()), (Some("h264"), Some(true)));
    assert_eq!(cameras.len(), 2);
    for c in cameras {
        let (mean, worst) = (c["psnr_db"].as_f64().expect("lossy"), c["min_psnr_db"].as_f64().expect("lossy"));
        assert!(worst > 30.0 && mean >= worst && mean < 80.0, "{c}");
    }
    let run = lake(&root, &["inspect", name]);
    assert!(run.stdout.contains("proxy     h264 proxy (GOP 4, CRF 18): lossy re-encoding"), "{}", run.stdout);

    // Recorded frames unless asked; proxy frames near them, labelled.
    assert_eq!(sample(&[], "recorded.arrow").code, 0);
    let run = sample(&["--proxy"], "proxy.arrow");
    assert_eq!(run.code, 0, "{run:#?}");
    let (recorded, proxied) = (read_arrow(&out("recorded.arrow")), read_arrow(&out("proxy.arrow")));
    assert_eq!(recorded.num_rows(), proxied.num_rows());
    for (field, (a, b)) in recorded.schema().fields().iter().zip(recorded.columns().iter().zip(proxied.columns())) {
        let proxied_field = proxied.schema().field_with_name(field.name()).expect("same columns").clone();
        let Some(label) = proxied_field.metadata().get(PROXY_METADATA) else {
            assert!(a == b, "`{}` is not a camera: the same with or without the proxy", field.name());
            continue;
        };
        let label: lake_loader::proxy::ProxyLabel = serde_json::from_str(label).expect("a proxy label");
        let entry = &label.datasets["v30-av1-small@1"];
        assert_eq!((entry.settings.gop, entry.settings.crf), (4, 18));
        assert!(!field.metadata().contains_key(PROXY_METADATA), "recorded frames carry no proxy label");
        let (a, b) = (
            a.as_fixed_size_list().values().as_primitive::<arrow::datatypes::UInt8Type>(),
            b.as_fixed_size_list().values().as_primitive::<arrow::datatypes::UInt8Type>(),
        );
        let sse = lake_codec::squared_error(a.values(), b.values());
        let db = lake_codec::psnr(sse, a.len() as u64).expect("lossy: not the recorded frames");
        assert!(db > 30.0, "`{}`: {db:.1} dB from the recorded frames", field.name());
    }
    // As packets, the proxy's GOPs decode to the same frames.
    crate::common::packets_decode_to(
        &root,
        &["sample", "--dataset", name, "--indices", "0,57,310,599", "--preset", "diffusion", "--proxy"],
        &out("packets.arrow"),
        &proxied,
        None,
    );

    // HEVC from a source with B-frames (and H.264 and HEVC cameras): none in the proxy.
    let name = "v30-bframes";
    ingest_ok(&root, &testdata(name), &[]);
    let run = lake(&root, &["cache", name, "--proxy", "hevc", "--crf", "23"]);
    assert_eq!(run.code, 0, "{run:#?}");
    assert!(run.stdout.contains("stored the hevc proxy (GOP 2, CRF 23) of v30-bframes@1: 900 frames"), "{}", run.stdout);
    let proxy = crate::common::table(&root, name, "proxy");
    assert_eq!(crate::common::ints(&proxy, "pts"), crate::common::ints(&proxy, "dts"), "no B-frames");
    let args = ["sample", "--dataset", name, "--indices", "0,1,150,299", "--preset", "act", "--proxy"];
    let file = out("bframes.arrow");
    let run = lake(&root, &[&args[..], &["--out", file.to_str().expect("utf-8")]].concat());
    assert_eq!(run.code, 0, "{run:#?}");
    let hevc = read_arrow(&file);
    let label = hevc.schema().field_with_name("observation.images.wrist").expect("camera").metadata()[PROXY_METADATA].clone();
    assert!(label.contains(r#""codec":"hevc""#) && label.contains("v30-bframes@1"), "{label}");
    crate::common::packets_decode_to(&root, &args, &out("bframes-packets.arrow"), &hevc, None);
    // Made again, it replaces the one there.
    let run = lake(&root, &["cache", name, "--proxy", "h264", "--gop", "1"]);
    assert_eq!(run.code, 0, "{run:#?}");
    let run = lake(&root, &["inspect", name]);
    assert!(run.stdout.contains("proxy     h264 proxy (GOP 1, CRF 18)"), "{}", run.stdout);
}

#[test]
fn reads_through_io_uring_give_the_samples_positioned_reads_give() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("lake");
    ingest_ok(&root, &testdata("v30-bframes"), &[]);
    let cached = lake(&root, &["cache", "v30-bframes"]);
    assert_eq!(cached.code, 0, "{cached:#?}");
    let mut samples = Vec::new();
    for io in ["pread", "uring"] {
        let out = tmp.path().join(format!("{io}.arrow"));
        let args = ["--io", io, "sample", "--dataset", "v30-bframes", "--indices", "0,37,299,150", "--preset", "diffusion", "--out"];
        let run = lake(&root, &[&args[..], &[out.to_str().expect("utf-8")]].concat());
        assert_eq!(run.code, 0, "{run:#?}");
        // A kernel that refuses io_uring is said at most once; the frames are then read with
        // positioned reads.
        assert!(run.stderr.matches("io_uring is refused here").count() <= usize::from(io == "uring"), "{}", run.stderr);
        samples.push(std::fs::read(&out).expect("samples"));
    }
    assert!(samples[0] == samples[1], "the same samples, from the same frame table");
}

#[test]
fn lake_sample_takes_the_dataset_as_its_first_argument_or_as_a_flag() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("lake");
    ingest_ok(&root, &testdata("v30-images-tiny"), &[]);
    let (positional, flag) = (tmp.path().join("positional.arrow"), tmp.path().join("flag.arrow"));
    let run = lake(&root, &["sample", "v30-images-tiny", "--indices", "0,59", "--out", positional.to_str().expect("utf-8")]);
    assert_eq!(run.code, 0, "{run:#?}");
    let run = lake(&root, &["sample", "--dataset", "v30-images-tiny", "--indices", "0,59", "--out", flag.to_str().expect("utf-8")]);
    assert_eq!(run.code, 0, "{run:#?}");
    assert!(read_arrow(&positional) == read_arrow(&flag));
    let run = lake(&root, &["sample", "v30-images-tiny", "--dataset", "v30-images-tiny", "--indices", "0", "--out", "x.arrow"]);
    assert_eq!(run.code, 2, "both: {run:#?}");
    let run = lake(&root, &["sample", "--indices", "0", "--out", "x.arrow"]);
    assert!(run.code == 2 && run.stderr.contains("<DATASET>"), "neither: {run:#?}");
}
