//! Corrupt inputs: each gives a clear error naming the file (and episode and frame where they
//! apply), a non-zero exit, and a lake that is byte for byte what it was.

use std::path::Path;

use arrow::{
    array::{ArrayRef, AsArray, Float32Array, RecordBatch},
    datatypes::{Float32Type, Int64Type},
};
use lake_testkit::{copy_dir, ffmpeg, read_parquet, snapshot, testdata, write_parquet};

use crate::common::{ingest_ok, lake};

/// A lake that already holds one dataset, and a writable copy of `fixture` to break.
fn setup(fixture: &str) -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("lake");
    ingest_ok(&root, &testdata("v30-images-tiny"), &[]);
    let src = tmp.path().join(fixture);
    copy_dir(&testdata(fixture), &src);
    (tmp, root, src)
}

/// Rewrites the copy's `meta/info.json` through `edit`.
fn edit_info(src: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let info = src.join("meta/info.json");
    let mut meta: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&info).expect("info")).expect("json");
    edit(&mut meta);
    std::fs::write(&info, serde_json::to_vec_pretty(&meta).expect("json")).expect("write");
}

/// Rewrites the copy's only data file with column `name` replaced by `make(old column)`.
fn replace_column(src: &Path, name: &str, make: impl FnOnce(&ArrayRef) -> ArrayRef) {
    let data = src.join("data/chunk-000/file-000.parquet");
    let batches = read_parquet(&data);
    let all = arrow::compute::concat_batches(&batches[0].schema(), &batches).expect("concat");
    let i = all.schema().index_of(name).expect("column");
    let mut cols = all.columns().to_vec();
    cols[i] = make(&cols[i]);
    write_parquet(&data, &[RecordBatch::try_new(all.schema(), cols).expect("batch")]);
}

/// Runs the ingest of the broken copy and checks the error and the untouched lake.
fn refused(root: &Path, src: &Path, expect_code: i32, must_mention: &[&str]) -> String {
    let before = snapshot(root, &[]);
    let run = lake(root, &["ingest", src.to_str().expect("utf-8")]);
    assert_eq!(run.code, expect_code, "{run:#?}");
    for m in must_mention {
        assert!(run.stderr.contains(m), "error does not mention {m:?}:\n{}", run.stderr);
    }
    assert_eq!(snapshot(root, &[]), before, "the lake changed");
    // The error path is not an exception of strict mode: skipping must not touch the lake
    // either when nothing can be ingested, and the lake must still list only the first dataset.
    let ls = lake(root, &["ls"]);
    assert!(ls.stdout.contains("v30-images-tiny@1") && ls.stdout.lines().count() == 2, "{ls:#?}");
    run.stderr
}

#[test]
fn truncated_mp4() {
    let (_t, root, src) = setup("v30-av1-small");
    let video = src.join("videos/observation.images.front/chunk-000/file-000.mp4");
    let len = std::fs::metadata(&video).expect("video").len();
    let f = std::fs::OpenOptions::new().write(true).open(&video).expect("open");
    f.set_len(len * 6 / 10).expect("truncate");
    let err = refused(
        &root,
        &src,
        1,
        &[
            "videos/observation.images.front/chunk-000/file-000.mp4",
            "corrupt-file",
            "episode 5",
            "truncated",
            "frames from 0 on are missing",
        ],
    );
    assert!(!err.contains("episode 0,"), "episode 0 lies before the break: {err}");
    // One file at a time, the first with errors stops the check, and the refusal says so.
    let run = lake(&root, &["ingest", src.to_str().expect("utf-8"), "--threads", "1"]);
    assert!(run.code == 1 && run.stderr.contains("1 of 2 camera files were not read to the end"), "{run:#?}");
    // The frames before the break are sound: with --skip-bad-episodes their episodes go in.
    let run = lake(&root, &["ingest", src.to_str().expect("utf-8"), "--skip-bad-episodes", "--json"]);
    assert_eq!(run.code, 0, "{run:#?}");
    let out: serde_json::Value = serde_json::from_str(&run.stdout).expect("json");
    let skipped = out["report"]["skipped"].as_object().expect("skipped episodes");
    assert!(!skipped.contains_key("0") && skipped.contains_key("5"), "{skipped:?}");
    assert_eq!(out["record"]["counts"]["episodes"].as_u64(), Some(6 - skipped.len() as u64));
}

/// Bytes zeroed inside a file (its index intact): the packets whose NAL units no longer add up
/// are named, with every episode whose frames decode through them; `--skip-bad-episodes` keeps
/// the others, and `lake cache` stores the version and its proxy, passing over the damage no step
/// needs.
#[test]
fn damaged_packets_inside_a_file() {
    let (t, root, src) = setup("v30-h264-multifile");
    let video = "videos/observation.images.side/chunk-000/file-000.mp4";
    let mut bytes = std::fs::read(src.join(video)).expect("video");
    bytes[20_000..28_000].fill(0);
    std::fs::write(src.join(video), bytes).expect("write");
    let err = refused(&root, &src, 1, &[video, "corrupt-file", "episode 1", "episode 2", "is damaged (a NAL unit of length 0"]);
    assert!(!err.contains("episode 0,") && !err.contains("episode 3,"), "{err}");
    let run = lake(&root, &["ingest", src.to_str().expect("utf-8"), "--skip-bad-episodes", "--name", "damaged"]);
    assert_eq!(run.code, 0, "{run:#?}");
    let run = lake(&root, &["cache", "damaged"]);
    assert_eq!(run.code, 0, "{run:#?}");
    let run = lake(&root, &["cache", "damaged", "--proxy", "h264"]);
    assert_eq!(run.code, 0, "the proxy passes over the damage too: {run:#?}");
    let sample = |frame_table: &str| {
        let out = t.path().join(format!("damaged-{frame_table}.arrow"));
        let args = [
            "sample",
            "--dataset",
            "damaged",
            "--indices",
            "0,87,189,299",
            "--frame-table",
            frame_table,
            "--out",
            out.to_str().expect("utf-8"),
        ];
        let run = lake(&root, &args);
        assert_eq!(run.code, 0, "{run:#?}");
        crate::common::read_arrow(&out)
    };
    assert_eq!(sample("on"), sample("off"), "the stored frames of the kept episodes are the decoded ones");
}

/// Encoded images whose damage shows without decoding (bytes cut short, a header of garbage)
/// and an image of another format than the rest of its camera's are each named with episode
/// and frame.
#[test]
fn damaged_and_mixed_images_in_parquet() {
    let (t, root, src) = setup("v30-images-tiny");
    let jpeg_file = t.path().join("frame.jpg");
    ffmpeg(&["-v", "error", "-f", "lavfi", "-i", "testsrc=s=48x36:d=1", "-frames:v", "1", jpeg_file.to_str().expect("utf-8")]);
    let jpeg = std::fs::read(&jpeg_file).expect("jpeg");
    replace_column(&src, "observation.images.front", |col| {
        let images = col.as_struct();
        let mut bytes: Vec<Vec<u8>> = images.column(0).as_binary::<i32>().iter().map(|b| b.expect("bytes").to_vec()).collect();
        bytes[0] = jpeg.clone(); // episode 0, frame 0
        let half = bytes[25].len() / 2;
        bytes[25].truncate(half); // episode 1, frame 6
        bytes[45][16..29].fill(0xAB); // episode 2, frame 5: the header's size and depth
        let bytes: ArrayRef = std::sync::Arc::new(arrow::array::BinaryArray::from_iter_values(bytes));
        std::sync::Arc::new(arrow::array::StructArray::new(images.fields().clone(), vec![bytes, images.column(1).clone()], None))
    });
    let data = "data/chunk-000/file-000.parquet, episode";
    let err = refused(&root, &src, 1, &[data, "format-mismatch", "corrupt-file"]);
    for says in [
        "episode 0, frame 0: column `observation.images.front`: image is JPEG where the column's others are PNG",
        "episode 1, frame 6: column `observation.images.front`: the PNG image is cut short",
        "episode 2, frame 5: column `observation.images.front`: its PNG header chunk (IHDR) fails its checksum",
    ] {
        assert!(err.contains(says), "expected `{says}` in {err}");
    }
}

/// Bytes after a PNG's IEND chunk (writers may pad) are no damage: the dataset ingests whole.
/// Pictures that are not RGB (greyscale, with alpha) ingest with a warning saying how what
/// LeRobot returns for them differs.
#[test]
fn padding_after_an_image_is_taken_and_pictures_that_are_not_rgb_are_named() {
    let (t, root, src) = setup("v30-images-tiny");
    let picture = |pix_fmt: &str| {
        let file = t.path().join(format!("{pix_fmt}.png"));
        let out = file.to_str().expect("utf-8");
        ffmpeg(&["-v", "error", "-f", "lavfi", "-i", "testsrc=s=48x36:d=1", "-frames:v", "1", "-pix_fmt", pix_fmt, out]);
        std::fs::read(&file).expect("png")
    };
    let (grey, rgba) = (picture("gray"), picture("rgba"));
    replace_column(&src, "observation.images.front", |col| {
        let images = col.as_struct();
        let mut bytes: Vec<Vec<u8>> = images.column(0).as_binary::<i32>().iter().map(|b| b.expect("bytes").to_vec()).collect();
        bytes[24].extend(std::iter::repeat_n(0u8, 8192));
        (bytes[3], bytes[4], bytes[5]) = (grey.clone(), grey.clone(), rgba.clone());
        let bytes: ArrayRef = std::sync::Arc::new(arrow::array::BinaryArray::from_iter_values(bytes));
        std::sync::Arc::new(arrow::array::StructArray::new(images.fields().clone(), vec![bytes, images.column(1).clone()], None))
    });
    let run = ingest_ok(&root, &src, &["--name", "padded"]);
    assert!(run.stdout.contains("3 of 3 episodes"), "{run:#?}");
    for says in [
        "column `observation.images.front` holds PNG pictures that are greyscale: LeRobot returns 1 channel",
        "column `observation.images.front` holds PNG pictures that are RGBA: LeRobot returns 4 channels",
    ] {
        assert_eq!(run.stdout.matches(says).count(), 1, "once: `{says}` in {run:#?}");
    }
}

/// A row whose `episode_index` is null is an error of the episode around it; a task that is
/// not UTF-8 text is named as such (not as a null).
#[test]
fn a_row_without_its_episode_and_a_task_that_is_not_text() {
    let (_t, root, src) = setup("v30-av1-small");
    replace_column(&src, "episode_index", |col| {
        let mut episodes: Vec<Option<i64>> = col.as_primitive::<Int64Type>().iter().collect();
        episodes[150] = None; // episode 1, frame 51
        std::sync::Arc::new(arrow::array::Int64Array::from(episodes))
    });
    let err = refused(&root, &src, 1, &["data/chunk-000/file-000.parquet, episode 1, frame 51: episode_index is null in this row"]);
    assert!(!err.contains("episode -1") && err.contains("1 error in 1 of 6 episodes"), "{err}");

    let (_t, root, src) = setup("v30-av1-small");
    let tasks = src.join("meta/tasks.parquet");
    let batch = read_parquet(&tasks).remove(0);
    let column = batch.schema().fields().iter().position(|f| f.name() != "task_index").expect("the task column");
    let mut columns = batch.columns().to_vec();
    let mut names: Vec<Vec<u8>> = columns[column].as_string::<i64>().iter().map(|t| t.expect("task").as_bytes().to_vec()).collect();
    names[1] = b"\xff\xfe".to_vec();
    columns[column] = std::sync::Arc::new(arrow::array::LargeBinaryArray::from_iter_values(names));
    // Named `task`, the column is found without the pandas index metadata.
    let mut fields: Vec<arrow::datatypes::Field> = batch.schema().fields().iter().map(|f| f.as_ref().clone()).collect();
    fields[column] = arrow::datatypes::Field::new("task", arrow::datatypes::DataType::LargeBinary, true);
    let schema = std::sync::Arc::new(arrow::datatypes::Schema::new(fields));
    write_parquet(&tasks, &[RecordBatch::try_new(schema, columns).expect("batch")]);
    refused(&root, &src, 2, &["meta/tasks.parquet: column `task`: row 1 is not UTF-8 text"]);
}

#[test]
fn declared_dtype_that_cannot_hold_the_values() {
    let (_t, root, src) = setup("v30-av1-small");
    edit_info(&src, |meta| meta["features"]["action"]["dtype"] = "int64".into());
    refused(
        &root,
        &src,
        1,
        &["data/chunk-000/file-000.parquet", "episode 0", "frame 0", "column `action` holds", "int64 (the dtype info.json declares)"],
    );
}

#[test]
fn unknown_dtype_and_camera_shape_are_reported() {
    let (_t, root, src) = setup("v30-av1-small");
    edit_info(&src, |meta| {
        meta["features"]["action"]["dtype"] = "complex128".into();
        meta["features"]["observation.images.wrist"]["shape"] = serde_json::json!([96, 128]);
    });
    let run = ingest_ok(&root, &src, &[]);
    for want in ["features.action: dtype `complex128` is not one LeRobot writes", "features.observation.images.wrist: shape [96, 128]"] {
        assert!(run.stdout.contains(want), "{want}: {}", run.stdout);
    }
}

#[test]
fn timestamp_pointing_into_another_episode() {
    let (_t, root, src) = setup("v30-av1-small");
    // Row 150 (episode 1, frame 51) says 3 s later: a frame exists there, in episode 2's part.
    replace_column(&src, "timestamp", |ts| {
        let ts = ts.as_primitive::<Float32Type>();
        let moved: Float32Array = (0..ts.len()).map(|i| Some(ts.value(i) + if i == 150 { 3.0 } else { 0.0 })).collect();
        std::sync::Arc::new(moved)
    });
    refused(&root, &src, 1, &["chunk-000/file-000.mp4", "episode 1", "frame 51", "outside the episode", "in episode 2's part of the file"]);
    // With episode 2 skipped (a row out of order), its part of the file still ends episode 1's:
    // the step would show another episode's frame, so episode 1 is skipped too.
    replace_column(&src, "frame_index", |fi| {
        let fi = fi.as_primitive::<Int64Type>();
        let moved: arrow::array::Int64Array = (0..fi.len()).map(|i| Some(fi.value(i) + if i == 210 { 1 } else { 0 })).collect();
        std::sync::Arc::new(moved)
    });
    let run = lake(&root, &["ingest", src.to_str().expect("utf-8"), "--skip-bad-episodes"]);
    assert_eq!(run.code, 0, "{run:#?}");
    assert!(run.stdout.contains("4 of 6 episodes") && run.stdout.contains("skipped 2 episode(s)"), "{run:#?}");
    assert!(run.stdout.contains("in the part of the file of an episode not ingested"), "{run:#?}");
}

#[test]
fn mp4_with_fewer_frames_than_the_episode() {
    let (t, root, src) = setup("v30-av1-small");
    let video = src.join("videos/observation.images.wrist/chunk-000/file-000.mp4");
    let full = t.path().join("full.mp4");
    std::fs::rename(&video, &full).expect("move");
    ffmpeg(&["-i", full.to_str().expect("utf-8"), "-c", "copy", "-frames:v", "580", video.to_str().expect("utf-8")]);
    // Episode 5 holds frames 542..600: its last 20 steps have no frame.
    refused(
        &root,
        &src,
        1,
        &["videos/observation.images.wrist/chunk-000/file-000.mp4", "episode 5", "frame 38", "frame-unresolved", "no video frame"],
    );
}

#[test]
fn garbage_parquet() {
    let (_t, root, src) = setup("v30-h264-multifile");
    std::fs::write(src.join("data/chunk-000/file-001.parquet"), b"PAR1 this is not parquet at all, just bytes").expect("write");
    refused(&root, &src, 1, &["data/chunk-000/file-001.parquet", "not a readable parquet file", "episode 1", "episode 2"]);
}

/// Shifts the `index` of episodes 2 and later by `delta`, in the episode metadata and the data.
fn shift_index_from_episode_2(src: &Path, delta: i64) {
    let shift = |batches: Vec<RecordBatch>, columns: &[&str]| -> RecordBatch {
        let all = arrow::compute::concat_batches(&batches[0].schema(), &batches).expect("concat");
        let episode: Vec<i64> = all.column_by_name("episode_index").expect("episode_index").as_primitive::<Int64Type>().values().to_vec();
        let mut cols = all.columns().to_vec();
        for name in columns {
            let i = all.schema().index_of(name).expect("column");
            let values =
                cols[i].as_primitive::<Int64Type>().values().iter().zip(&episode).map(|(v, e)| if *e >= 2 { v + delta } else { *v });
            cols[i] = std::sync::Arc::new(arrow::array::Int64Array::from_iter_values(values));
        }
        RecordBatch::try_new(all.schema(), cols).expect("batch")
    };
    let episodes = src.join("meta/episodes/chunk-000/file-000.parquet");
    write_parquet(&episodes, &[shift(read_parquet(&episodes), &["dataset_from_index", "dataset_to_index"])]);
    let data = src.join("data/chunk-000/file-000.parquet");
    write_parquet(&data, &[shift(read_parquet(&data), &["index"])]);
}

/// Episodes whose index ranges overlap are refused, naming the later one (a step of the
/// earlier would be unreachable), and `--skip-bad-episodes` leaves it out; a gap between them
/// is a warning (LeRobot numbers samples by row).
#[test]
fn overlapping_and_gapped_index_ranges() {
    let (_t, root, src) = setup("v30-av1-small");
    shift_index_from_episode_2(&src, -6);
    refused(
        &root,
        &src,
        1,
        &["meta/episodes/chunk-000/file-000.parquet, episode 2", "index range [197, 331) overlaps the range [.., 203) of episode 1"],
    );
    let run = lake(&root, &["ingest", src.to_str().expect("utf-8"), "--skip-bad-episodes", "--name", "overlap"]);
    assert_eq!(run.code, 0, "{run:#?}");
    let kept = lake(&root, &["sql", "--format", "csv", "SELECT count(*) AS n, count(DISTINCT index) AS i FROM overlap.steps"]);
    assert_eq!(kept.stdout, "n,i\n466,466\n", "episode 2 left out, every index once: {kept:#?}");

    shift_index_from_episode_2(&src, 11);
    let run = lake(&root, &["ingest", src.to_str().expect("utf-8"), "--name", "gap"]);
    assert_eq!(run.code, 0, "{run:#?}");
    assert!(run.stdout.contains("starts at index 208 but episode 1 ends at 203"), "{run:#?}");

    // Rows out of `index` order (the last episode first): a warning too, for the same reason.
    let data = src.join("data/chunk-000/file-000.parquet");
    let batches = read_parquet(&data);
    let all = arrow::compute::concat_batches(&batches[0].schema(), &batches).expect("concat");
    let episode = all.column_by_name("episode_index").expect("episode_index").as_primitive::<Int64Type>();
    let last: Vec<u32> = (0..all.num_rows() as u32).filter(|&r| episode.value(r as usize) == 5).collect();
    let rest: Vec<u32> = (0..all.num_rows() as u32).filter(|&r| episode.value(r as usize) != 5).collect();
    let order = arrow::array::UInt32Array::from([last, rest].concat());
    let columns = all.columns().iter().map(|c| arrow::compute::take(c, &order, None).expect("take")).collect();
    write_parquet(&data, &[RecordBatch::try_new(all.schema(), columns).expect("batch")]);
    let run = lake(&root, &["ingest", src.to_str().expect("utf-8"), "--name", "reordered"]);
    assert_eq!(run.code, 0, "{run:#?}");
    assert!(run.stdout.contains("rows are not in `index` order (row 58 has index 0, after 604)"), "{run:#?}");

    // Episode 5 numbered 9: LeRobot, which finds an episode's metadata by its position, cannot
    // read that; a warning says so.
    for path in [src.join("meta/episodes/chunk-000/file-000.parquet"), data] {
        let batches = read_parquet(&path);
        let all = arrow::compute::concat_batches(&batches[0].schema(), &batches).expect("concat");
        let i = all.schema().index_of("episode_index").expect("column");
        let mut cols = all.columns().to_vec();
        let renumbered = cols[i].as_primitive::<Int64Type>().values().iter().map(|e| if *e == 5 { 9 } else { *e });
        cols[i] = std::sync::Arc::new(arrow::array::Int64Array::from_iter_values(renumbered));
        write_parquet(&path, &[RecordBatch::try_new(all.schema(), cols).expect("batch")]);
    }
    let run = lake(&root, &["ingest", src.to_str().expect("utf-8"), "--name", "renumbered"]);
    assert_eq!(run.code, 0, "{run:#?}");
    assert!(run.stdout.contains("episode 9: episode indices are not 0 to 5: episode 9 comes after episode 4"), "{run:#?}");
    // Episode metadata rows listed out of index order: LeRobot would take each episode's
    // bounds from the row at its index's position.
    let episodes = src.join("meta/episodes/chunk-000/file-000.parquet");
    let batches = read_parquet(&episodes);
    let all = arrow::compute::concat_batches(&batches[0].schema(), &batches).expect("concat");
    let reversed = arrow::array::UInt32Array::from_iter_values((0..all.num_rows() as u32).rev());
    write_parquet(&episodes, &[arrow::compute::take_record_batch(&all, &reversed).expect("take")]);
    let run = lake(&root, &["ingest", src.to_str().expect("utf-8"), "--name", "reversed"]);
    assert_eq!(run.code, 0, "{run:#?}");
    assert!(run.stdout.contains("episode 4: episodes are not listed in index order: episode 4 comes after episode 9"), "{run:#?}");
}

/// A FIFO where a file should be (opening it would wait for a writer forever): refused at
/// once, naming it, for a video and for `meta/info.json`.
#[test]
fn a_fifo_or_directory_in_place_of_a_file() {
    let (_t, root, src) = setup("v30-h264-multifile");
    let fifo = |path: &Path| {
        std::fs::remove_file(path).expect("remove");
        assert!(std::process::Command::new("mkfifo").arg(path).status().expect("mkfifo").success());
    };
    let video = "videos/observation.images.side/chunk-000/file-000.mp4";
    fifo(&src.join(video));
    refused(&root, &src, 2, &[video, "is a FIFO"]);
    fifo(&src.join("meta/info.json"));
    refused(&root, &src, 2, &["meta/info.json", "is a FIFO"]);
    // A directory where a file should be is no missing file (which --drop-missing-cameras
    // would take as a camera to leave out).
    std::fs::remove_file(src.join("meta/info.json")).expect("remove");
    std::fs::copy(testdata("v30-h264-multifile").join("meta/info.json"), src.join("meta/info.json")).expect("info");
    std::fs::remove_file(src.join(video)).expect("remove");
    std::fs::create_dir(src.join(video)).expect("dir");
    refused(&root, &src, 2, &[video, "is a directory"]);
}

#[test]
fn a_data_file_with_other_columns_names_them() {
    let (_t, root, src) = setup("v30-h264-multifile");
    let data = src.join("data/chunk-000/file-001.parquet");
    let batches = read_parquet(&data);
    let all = arrow::compute::concat_batches(&batches[0].schema(), &batches).expect("concat");
    let extra: ArrayRef = std::sync::Arc::new(Float32Array::from(vec![0.0; all.num_rows()]));
    let mut fields = all.schema().fields().to_vec();
    fields.push(std::sync::Arc::new(arrow::datatypes::Field::new("extra", arrow::datatypes::DataType::Float32, false)));
    let columns = [all.columns(), &[extra]].concat();
    let batch = RecordBatch::try_new(std::sync::Arc::new(arrow::datatypes::Schema::new(fields)), columns).expect("batch");
    write_parquet(&data, &[batch]);
    refused(
        &root,
        &src,
        1,
        &["data/chunk-000/file-001.parquet", "columns differ from the first data file's: it has `extra` the first lacks"],
    );
}

#[test]
fn missing_info_json() {
    let (_t, root, src) = setup("v30-av1-small");
    std::fs::remove_file(src.join("meta/info.json")).expect("remove");
    refused(&root, &src, 2, &["meta/info.json", "not found"]);
}

#[test]
fn missing_episode_metadata_shard() {
    let (_t, root, src) = setup("v30-av1-small");
    // Split the episode metadata into two shards as a large dataset has, then lose the second.
    let shard = src.join("meta/episodes/chunk-000/file-000.parquet");
    let batches = read_parquet(&shard);
    let all = arrow::compute::concat_batches(&batches[0].schema(), &batches).expect("concat");
    write_parquet(&shard, &[all.slice(0, 4)]);
    write_parquet(&src.join("meta/episodes/chunk-000/file-001.parquet"), &[all.slice(4, 2)]);
    std::fs::remove_file(src.join("meta/episodes/chunk-000/file-001.parquet")).expect("lose shard");
    refused(&root, &src, 1, &["data/chunk-000/file-000.parquet", "episode 4", "missing meta/episodes shard"]);
}

/// A lost shard whose episodes sit in data files of their own: no episode refers to those
/// files, but LeRobot reads every file of the data directory, so lake reads them too and names
/// each episode in them; a stray parquet file there is named itself.
#[test]
fn data_files_no_episode_refers_to() {
    let (_t, root, src) = setup("v30-h264-multifile");
    let shard = src.join("meta/episodes/chunk-000/file-000.parquet");
    let batches = read_parquet(&shard);
    let all = arrow::compute::concat_batches(&batches[0].schema(), &batches).expect("concat");
    // Episodes 3 and 4 are all of data/chunk-000/file-002.parquet.
    write_parquet(&shard, &[all.slice(0, 3)]);
    let err = refused(&root, &src, 1, &["data/chunk-000/file-002.parquet, episode 3, frame 0", "missing meta/episodes shard"]);
    assert!(err.contains("data/chunk-000/file-002.parquet, episode 4"), "{err}");
    // With --skip-bad-episodes the listed episodes go in and the others are recorded.
    let run = lake(&root, &["ingest", src.to_str().expect("utf-8"), "--skip-bad-episodes"]);
    assert_eq!(run.code, 0, "{run:#?}");
    assert!(run.stdout.contains("3 of 3 episodes") && run.stdout.contains("skipped 2 episode(s)"), "{run:#?}");

    let (_t, root, src) = setup("v30-h264-multifile");
    let data = read_parquet(&src.join("data/chunk-000/file-000.parquet"));
    write_parquet(&src.join("data/chunk-000/old-copy.parquet"), &[data[0].slice(0, 0)]);
    refused(&root, &src, 1, &["data/chunk-000/old-copy.parquet", "no episode of the metadata refers to this data file"]);
    // LeRobot v3.0 reads data/*/*.parquet only: a file elsewhere under data/ is not its data.
    std::fs::rename(src.join("data/chunk-000/old-copy.parquet"), src.join("data/old-copy.parquet")).expect("move");
    ingest_ok(&root, &src, &[]);
}

#[test]
fn no_episode_metadata_at_all() {
    let (_t, root, src) = setup("v30-av1-small");
    std::fs::remove_dir_all(src.join("meta/episodes")).expect("remove");
    refused(&root, &src, 2, &["meta/episodes/", "not found"]);
}

#[test]
fn wrong_feature_shape() {
    let (_t, root, src) = setup("v30-h264-multifile");
    let info = src.join("meta/info.json");
    let text = std::fs::read_to_string(&info).expect("info");
    let text = text.replacen("\"shape\": [\n                14\n            ]", "\"shape\": [\n                15\n            ]", 1);
    assert!(text.contains("15"), "the fixture's layout changed");
    std::fs::write(&info, text).expect("write");
    refused(&root, &src, 1, &["data/chunk-000/file-000.parquet", "observation.state", "shape-mismatch", "15"]);
}

/// Rewrites the copy's `action` values (row-major, `width` per row) through `edit`.
fn edit_actions(src: &Path, edit: impl FnOnce(&mut [f32], usize)) {
    replace_column(src, "action", |column| {
        let action = column.as_fixed_size_list();
        let mut values: Vec<f32> = action.values().as_primitive::<Float32Type>().values().to_vec();
        let width = action.value_length();
        edit(&mut values, width as usize);
        let field = match column.data_type() {
            arrow::datatypes::DataType::FixedSizeList(f, _) => f.clone(),
            other => panic!("action is {other}"),
        };
        std::sync::Arc::new(arrow::array::FixedSizeListArray::new(field, width, std::sync::Arc::new(Float32Array::from(values)), None))
    });
}

/// Two episodes of one data file hold values their dtype cannot hold: the report names both,
/// and `--skip-bad-episodes` leaves both out and keeps the others.
#[test]
fn two_bad_episodes_of_one_data_file_are_both_reported_and_skipped() {
    let (_t, root, src) = setup("v30-av1-small");
    edit_info(&src, |meta| meta["features"]["action"]["dtype"] = "int64".into());
    // Whole numbers but in row 150 (episode 1, frame 51) and row 400 (episode 3, frame 63).
    edit_actions(&src, |values, width| {
        values.iter_mut().for_each(|v| *v = v.round());
        values[150 * width] = 0.5;
        values[400 * width + 1] = -2.5;
    });
    let err = refused(&root, &src, 1, &["2 errors in 2 of 6 episodes", "episode 1, frame 51", "episode 3, frame 63", "which int64"]);
    assert!(err.contains("data/chunk-000/file-000.parquet, episode 3"), "{err}");
    let run = lake(&root, &["ingest", src.to_str().expect("utf-8"), "--skip-bad-episodes", "--json"]);
    assert_eq!(run.code, 0, "{run:#?}");
    let out: serde_json::Value = serde_json::from_str(&run.stdout).expect("json");
    assert_eq!(out["record"]["counts"]["episodes"], 4);
    let skipped: Vec<&String> = out["report"]["skipped"].as_object().expect("skipped").keys().collect();
    assert_eq!(skipped, ["1", "3"]);
    // The frames of the episodes left out are no extra frames of the video files.
    assert!(!run.stdout.contains("frame-count-mismatch"), "{}", run.stdout);
}

/// Frames of a video file that no episode of the metadata covers are a warning.
#[test]
fn frames_no_episode_covers_are_a_warning() {
    let (_t, root, src) = setup("v30-av1-small");
    // The last episode (58 steps) gone from the data and the metadata, its frames kept.
    for path in [src.join("data/chunk-000/file-000.parquet"), src.join("meta/episodes/chunk-000/file-000.parquet")] {
        let batches = read_parquet(&path);
        let all = arrow::compute::concat_batches(&batches[0].schema(), &batches).expect("concat");
        let episode = all.column_by_name("episode_index").expect("episode_index").as_primitive::<Int64Type>();
        let keep: arrow::array::BooleanArray = episode.iter().map(|e| Some(e != Some(5))).collect();
        write_parquet(&path, &[arrow::compute::filter_record_batch(&all, &keep).expect("filter")]);
    }
    let run = lake(&root, &["ingest", src.to_str().expect("utf-8")]);
    assert_eq!(run.code, 0, "{run:#?}");
    for camera in ["front", "wrist"] {
        let says = format!("observation.images.{camera}/chunk-000/file-000.mp4, camera observation.images.{camera}: 58 of the file's 600");
        assert!(run.stdout.contains(&says) && run.stdout.contains("frames belong to no step"), "{says}: {run:#?}");
    }
}

#[test]
fn timestamps_drifting_beyond_tolerance() {
    let (_t, root, src) = setup("v30-av1-small");
    // Episode 2's timestamps drift by 0.5 ms per frame from where its video frames are.
    let data = src.join("data/chunk-000/file-000.parquet");
    let batches: Vec<RecordBatch> = read_parquet(&data)
        .into_iter()
        .map(|b| {
            let ep = b.column_by_name("episode_index").expect("ep").as_primitive::<Int64Type>().clone();
            let fr = b.column_by_name("frame_index").expect("fr").as_primitive::<Int64Type>().clone();
            let ts = b.column_by_name("timestamp").expect("ts").as_primitive::<Float32Type>().clone();
            let drifted: Float32Array = (0..b.num_rows())
                .map(|i| Some(if ep.value(i) == 2 { ts.value(i) + 0.0005 * fr.value(i) as f32 } else { ts.value(i) }))
                .collect();
            let cols: Vec<ArrayRef> = b
                .schema()
                .fields()
                .iter()
                .zip(b.columns())
                .map(|(f, c)| if f.name() == "timestamp" { std::sync::Arc::new(drifted.clone()) as ArrayRef } else { c.clone() })
                .collect();
            RecordBatch::try_new(b.schema(), cols).expect("batch")
        })
        .collect();
    write_parquet(&data, &batches);
    let err = refused(&root, &src, 1, &["chunk-000/file-000.mp4", "episode 2", "frame 1", "frame-unresolved", "0.500 ms away"]);
    // With --skip-bad-episodes the other five episodes go in, and episode 2 is recorded.
    let run = lake(&root, &["ingest", src.to_str().expect("utf-8"), "--skip-bad-episodes", "--json"]);
    assert_eq!(run.code, 0, "{run:#?}");
    let out: serde_json::Value = serde_json::from_str(&run.stdout).expect("json");
    assert_eq!(out["record"]["counts"]["episodes"], 5);
    assert_eq!(out["record"]["counts"]["skipped_episodes"], 1);
    assert!(out["report"]["skipped"]["2"].as_str().expect("reason").contains("frame-unresolved"));
    // The drift itself is named where it is largest: the episode's last frame.
    let drift = out["report"]["findings"].as_array().expect("findings").iter().find(|f| f["kind"] == "timestamp-drift").cloned();
    let drift = drift.unwrap_or_else(|| panic!("no timestamp-drift finding: {}", run.stdout));
    assert_eq!((drift["episode"].as_i64(), drift["frame"].as_i64()), (Some(2), Some(133)), "{drift}");
    assert!(drift["message"].as_str().expect("message").contains("drift up to 66.500 ms"), "{drift}");
    assert!(err.contains("frame 1:"), "{err}");
}

#[test]
fn nan_actions_are_a_warning_and_make_their_statistics_nan() {
    let (_t, root, src) = setup("v30-av1-small");
    // Row 150 (episode 1, frame 51): action dimension 2 becomes NaN.
    edit_actions(&src, |values, width| values[150 * width + 2] = f32::NAN);
    let run = ingest_ok(&root, &src, &[]);
    assert!(run.stdout.contains("warning[non-finite]") && run.stdout.contains("episode 1, frame 51"), "{run:#?}");
    let rows = crate::common::sql_rows(
        &root,
        "SELECT min, max, mean, q50 FROM feature_stats WHERE dataset = 'v30-av1-small' AND feature = 'action' AND dim = 2 AND episode_index IS NULL",
    );
    assert_eq!(rows.len(), 1, "{rows:?}");
    // JSON has no NaN: every statistic of the dimension is null there, none a number.
    assert!(rows[0].values().all(|v| !v.is_number()), "{rows:?}");
}

#[test]
fn declared_shape_and_fps_that_disagree_with_the_files_are_warnings() {
    let (_t, root, src) = setup("v30-av1-small");
    edit_info(&src, |meta| {
        // `video.height` / `video.width` stay right: the shape policies read is what is wrong.
        meta["features"]["observation.images.wrist"]["shape"] = serde_json::json!([100, 100, 3]);
        meta["fps"] = 15.into();
    });
    let run = lake(&root, &["ingest", src.to_str().expect("utf-8"), "--name", "declared", "--json"]);
    assert_eq!(run.code, 0, "{run:#?}");
    let out: serde_json::Value = serde_json::from_str(&run.stdout).expect("json");
    let findings = out["report"]["findings"].to_string();
    for says in [
        "info.json declares shape 100x100 (height x width), the file is 96x128",
        "info.json declares 15 fps, the file's frames come at 30.00 per second",
    ] {
        assert!(findings.contains(says), "{says}: {findings}");
    }
}

/// v3.0's `tasks.parquet` rows out of `task_index` order: a step's `task_index` names the task at
/// that row, as in LeRobot (`iloc`), the lake's task table numbers the tasks so, and a warning
/// says the file's own numbers disagree.
#[test]
fn tasks_out_of_row_order_are_looked_up_by_row_with_a_warning() {
    let (_t, root, src) = setup("v30-h264-multifile");
    let path = src.join("meta/tasks.parquet");
    let batches = read_parquet(&path);
    let all = arrow::compute::concat_batches(&batches[0].schema(), &batches).expect("concat");
    let reversed: Vec<u64> = (0..all.num_rows() as u64).rev().collect();
    let reversed = arrow::compute::take_record_batch(&all, &arrow::array::UInt64Array::from(reversed)).expect("take");
    write_parquet(&path, std::slice::from_ref(&reversed));
    let text = |c: &str| {
        let c = arrow::compute::cast(reversed.column_by_name(c)?, &arrow::datatypes::DataType::Utf8).expect("text");
        Some(c.as_string::<i32>().iter().map(|t| t.expect("task").to_string()).collect())
    };
    let by_row: Vec<String> = text("task").or_else(|| text("__index_level_0__")).expect("a task column");

    let run = lake(&root, &["ingest", src.to_str().expect("utf-8"), "--name", "reordered", "--json"]);
    assert_eq!(run.code, 0, "{run:#?}");
    let out: serde_json::Value = serde_json::from_str(&run.stdout).expect("json");
    assert!(out["report"]["findings"].to_string().contains("have a task_index other than their position"), "{}", run.stdout);
    let steps = crate::common::sql_rows(&root, "SELECT DISTINCT task_index, task FROM reordered.steps ORDER BY task_index");
    assert!(!steps.is_empty());
    for row in &steps {
        let index = row["task_index"].as_i64().expect("task_index") as usize;
        assert_eq!(row["task"].as_str(), Some(by_row[index].as_str()), "{steps:?}");
    }
    let table = crate::common::sql_rows(&root, "SELECT task_index, task FROM reordered.tasks ORDER BY task_index");
    let table: Vec<&str> = table.iter().map(|r| r["task"].as_str().expect("task")).collect();
    assert_eq!(table, by_row.iter().map(String::as_str).collect::<Vec<_>>());
}

/// Data files whose rows come before the previous file's in path order (LeRobot reads the files
/// in that order as one table): a warning naming both, as for rows out of order in one file.
#[test]
fn rows_out_of_index_order_across_files_are_a_warning() {
    let (_t, root, src) = setup("v30-h264-multifile");
    let data = src.join("data/chunk-000");
    std::fs::rename(data.join("file-001.parquet"), data.join("swap.parquet")).expect("rename");
    std::fs::rename(data.join("file-002.parquet"), data.join("file-001.parquet")).expect("rename");
    std::fs::rename(data.join("swap.parquet"), data.join("file-002.parquet")).expect("rename");
    let episodes = src.join("meta/episodes/chunk-000/file-000.parquet");
    let batches = read_parquet(&episodes);
    let all = arrow::compute::concat_batches(&batches[0].schema(), &batches).expect("concat");
    let i = all.schema().index_of("data/file_index").expect("column");
    let mut cols = all.columns().to_vec();
    let swapped = cols[i].as_primitive::<Int64Type>().values().iter().map(|f| match f {
        1 => 2,
        2 => 1,
        f => *f,
    });
    cols[i] = std::sync::Arc::new(arrow::array::Int64Array::from_iter_values(swapped));
    write_parquet(&episodes, &[RecordBatch::try_new(all.schema(), cols).expect("batch")]);
    let run = lake(&root, &["ingest", src.to_str().expect("utf-8")]);
    assert_eq!(run.code, 0, "{run:#?}");
    assert!(
        run.stdout.contains("data/chunk-000/file-002.parquet: rows are not in `index` order across files")
            && run.stdout.contains("data/chunk-000/file-001.parquet, before it in path order, ends at 299"),
        "{run:#?}"
    );
}

/// A camera file whose frames are another size than the camera's: refused, naming the file and
/// each episode it holds; with --skip-bad-episodes those episodes are left out, the summary
/// gives the camera's true size, and every kept step can be sampled.
#[test]
fn a_camera_file_of_another_frame_size_is_refused_or_its_episodes_skipped() {
    let (tmp, root, src) = setup("v30-h264-multifile");
    let videos = src.join("videos");
    std::fs::copy(
        videos.join("observation.images.wrist/chunk-000/file-000.mp4"),
        videos.join("observation.images.front/chunk-000/file-000.mp4"),
    )
    .expect("copy");
    let says = |episode: i64| {
        format!(
            "videos/observation.images.front/chunk-000/file-000.mp4, episode {episode}, camera observation.images.front: frames are \
             128x96 where the camera's are 160x120 (as info.json declares)"
        )
    };
    refused(&root, &src, 1, &[&says(0), &says(1)]);

    let run = lake(&root, &["ingest", src.to_str().expect("utf-8"), "--skip-bad-episodes", "--name", "x"]);
    assert_eq!(run.code, 0, "{run:#?}");
    assert!(
        run.stdout.contains("3 of 5 episodes") && run.stdout.contains("camera observation.images.front: video h264 160x120, 2 files"),
        "{}",
        run.stdout
    );
    let kept = crate::common::sql_rows(&root, "SELECT min(index) AS first, max(index) AS last, count(*) AS n FROM x.steps");
    assert_eq!(crate::common::num(&kept[0], "n"), 164.0, "{kept:?}");
    let out = tmp.path().join("kept.arrow");
    let (first, last) = (crate::common::num(&kept[0], "first"), crate::common::num(&kept[0], "last"));
    let indices = format!("{},{}", first as i64, last as i64);
    let run = lake(&root, &["sample", "--dataset", "x", "--indices", &indices, "--out", out.to_str().expect("utf-8")]);
    assert_eq!(run.code, 0, "{run:#?}");
    let streams = crate::common::sql_rows(
        &root,
        "SELECT kind, count(*) AS n FROM x.streams WHERE camera = 'observation.images.front' GROUP BY kind ORDER BY kind",
    );
    assert_eq!(streams.len(), 2, "the skipped file is listed as such: {streams:?}");
    assert_eq!(streams[0]["kind"], "skipped");
}

/// `--drop-missing-cameras` leaves out only a camera with no file at all: asked for on a
/// dataset whose camera has some of its files (4 of 50 episodes'), the refusal says why the
/// flag did not apply and what keeps the episodes whose files are there.
#[test]
fn drop_missing_cameras_says_why_a_camera_with_some_files_stays() {
    let tmp = tempfile::tempdir().expect("tmp");
    let source = lake_testkit::shared_dir().join("lerobot-real/lingzu-open50-v30");
    let run = lake(&tmp.path().join("lake"), &["ingest", source.to_str().expect("utf-8"), "--drop-missing-cameras"]);
    assert_eq!(run.code, 1, "{run:#?}");
    assert!(
        run.stderr.contains(
            "--drop-missing-cameras leaves out only a camera with no video file at all; camera `image` has its files for 4 of 50 episodes"
        ),
        "{}",
        run.stderr
    );
}
