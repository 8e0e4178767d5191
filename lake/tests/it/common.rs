//! Driving the `lake` binary and reading what it wrote.

use std::{
    path::Path,
    process::{Command, Stdio},
};

use arrow::{
    array::{Array, AsArray, RecordBatch},
    compute::cast,
    datatypes::{DataType, Float64Type, Int64Type},
};

/// Ingests, as `recoloured`, the h264 fixture whose side camera (300 frames at 30 fps, one
/// file) is made of parts of whole seconds, as equal as that allows (`bt709[i]` for each) that leave the colour description unspecified
/// (BT.601 to libswscale) or say BT.709, as a recording concatenated from several encoders
/// would. Ingest records the first part's; a frame of a part that names none converts as the
/// stream's recorded colour space (as a freshly opened decoder gives it), one of a BT.709 part
/// as BT.709. The YUV planes of a BT.709 part of a stream recorded unspecified are not the ones
/// its schema promises.
pub fn ingest_recoloured(root: &Path, work: &Path, bt709: &[bool]) {
    let src = work.join("recoloured");
    lake_testkit::copy_dir(&lake_testkit::testdata("v30-h264-multifile"), &src);
    let side = src.join("videos/observation.images.side/chunk-000/file-000.mp4");
    let s = |p: &Path| p.to_str().expect("utf-8").to_string();
    let encode = ["-c:v", "libx264", "-g", "10", "-bf", "0", "-pix_fmt", "yuv420p", "-x264-params", "repeat-headers=1"];
    let tail = ["-video_track_timescale", "15360", "-an"];
    let tag = ["-colorspace", "bt709", "-color_primaries", "bt709", "-color_trc", "bt709"];
    // (Parts of whole seconds: the concat demuxer times each part by its duration in
    // microseconds, and a part of 100 frames would shift the next by 0.65 ms.)
    let bound = |i: usize| i * 10 / bt709.len() * 30;
    let mut list = String::new();
    for (i, tagged) in bt709.iter().enumerate() {
        let part = work.join(format!("part-{i}.mp4"));
        let select = format!("select=between(n\\,{}\\,{}),setpts=PTS-STARTPTS", bound(i), bound(i + 1) - 1);
        let tags: &[&str] = if *tagged { &tag } else { &[] };
        lake_testkit::ffmpeg(
            &[&["-i", &s(&side), "-vf", &select, "-fps_mode", "passthrough"][..], &encode, tags, &tail, &[&s(&part)]].concat(),
        );
        list.push_str(&format!("file '{}'\n", s(&part)));
    }
    let list_file = work.join("parts.txt");
    std::fs::write(&list_file, list).expect("list");
    lake_testkit::ffmpeg(&["-f", "concat", "-safe", "0", "-i", &s(&list_file), "-c", "copy", "-video_track_timescale", "15360", &s(&side)]);
    ingest_ok(root, &src, &["--name", "recoloured"]);
}

/// The `lake` binary with `--lake root`.
pub fn lake_cmd(root: &Path) -> Command {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lake"));
    cmd.arg("--lake").arg(root).stdin(Stdio::null());
    // lake's settings come from the test, never from the environment it runs in.
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(|n| n.starts_with("LAKE_")) {
            cmd.env_remove(name);
        }
    }
    // Ctrl-C reaches lake as at a terminal, also when the tests run where SIGINT is ignored (a
    // background job of a script), which lake would keep ignoring.
    // SAFETY: between fork and exec this only resets a signal's action (async-signal-safe).
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            Ok(())
        });
    }
    cmd
}

/// The result of one run.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `lake --lake root ARGS…` to completion.
pub fn lake(root: &Path, args: &[&str]) -> Run {
    let out = lake_cmd(root).args(args).output().expect("run lake");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into(),
        stderr: String::from_utf8_lossy(&out.stderr).into(),
    }
}

/// Runs an ingest that must succeed.
pub fn ingest_ok(root: &Path, source: &Path, extra: &[&str]) -> Run {
    let mut args = vec!["ingest", source.to_str().expect("utf-8 path")];
    args.extend_from_slice(extra);
    let run = lake(root, &args);
    assert_eq!(run.code, 0, "ingest of {} failed: {run:#?}", source.display());
    run
}

/// A table of the latest version of `dataset`.
pub fn table(root: &Path, dataset: &str, table: &str) -> Vec<RecordBatch> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let lake = lake_store::Lake::open(root.to_str().expect("utf-8")).expect("open lake");
        let record = lake.resolve(dataset).await.expect("dataset exists");
        lake_store::read_table(&lake, &record, table).await.expect("read table")
    })
}

/// A column as i64 values (nulls as -1).
pub fn ints(batches: &[RecordBatch], name: &str) -> Vec<i64> {
    batches
        .iter()
        .flat_map(|b| {
            let c = cast(b.column_by_name(name).unwrap_or_else(|| panic!("no column {name}")), &DataType::Int64).expect("int");
            c.as_primitive::<Int64Type>().iter().map(|v| v.unwrap_or(-1)).collect::<Vec<_>>()
        })
        .collect()
}

/// A column as f64 values.
pub fn floats(batches: &[RecordBatch], name: &str) -> Vec<f64> {
    batches
        .iter()
        .flat_map(|b| {
            let c = cast(b.column_by_name(name).unwrap_or_else(|| panic!("no column {name}")), &DataType::Float64).expect("float");
            c.as_primitive::<Float64Type>().values().to_vec()
        })
        .collect()
}

/// A string column.
pub fn strings(batches: &[RecordBatch], name: &str) -> Vec<Option<String>> {
    batches
        .iter()
        .flat_map(|b| {
            let c = cast(b.column_by_name(name).unwrap_or_else(|| panic!("no column {name}")), &DataType::Utf8).expect("string");
            let s = c.as_string::<i32>();
            (0..s.len()).map(|i| (!s.is_null(i)).then(|| s.value(i).to_string())).collect::<Vec<_>>()
        })
        .collect()
}

/// A binary column.
pub fn binaries(batches: &[RecordBatch], name: &str) -> Vec<Option<Vec<u8>>> {
    batches
        .iter()
        .flat_map(|b| {
            let c = b.column_by_name(name).unwrap_or_else(|| panic!("no column {name}"));
            let c = cast(c, &DataType::LargeBinary).expect("binary");
            let s = c.as_binary::<i64>();
            (0..s.len()).map(|i| (!s.is_null(i)).then(|| s.value(i).to_vec())).collect::<Vec<_>>()
        })
        .collect()
}

/// Every `packet_row` field of the steps table, as (camera, rows).
pub fn packet_rows(steps: &[RecordBatch]) -> Vec<(String, Vec<u64>)> {
    let Some(first) = steps.first() else { return Vec::new() };
    let Some(col) = first.column_by_name("packet_row") else { return Vec::new() };
    let DataType::Struct(fields) = col.data_type() else { panic!("packet_row is a struct") };
    fields
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let rows = steps
                .iter()
                .flat_map(|b| {
                    let s = b.column_by_name("packet_row").expect("packet_row").as_struct();
                    s.column(i).as_primitive::<arrow::datatypes::UInt64Type>().values().to_vec()
                })
                .collect();
            (lake_schemas::tables::lerobot_name(f).to_string(), rows)
        })
        .collect()
}

/// Every row of an Arrow IPC file, as one batch.
pub fn read_arrow(path: &Path) -> RecordBatch {
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let reader = arrow::ipc::reader::FileReader::try_new(file, None).expect("arrow file");
    let schema = reader.schema();
    let batches: Vec<RecordBatch> = reader.map(|b| b.expect("batch")).collect();
    arrow::compute::concat_batches(&schema, &batches).expect("concat")
}

/// Runs `lake sql --format json QUERY`, which must succeed, and returns its rows.
pub fn sql_rows(root: &Path, query: &str) -> Vec<serde_json::Map<String, serde_json::Value>> {
    let run = lake(root, &["sql", "--format", "json", query]);
    assert_eq!(run.code, 0, "lake sql {query:?} failed: {run:#?}");
    serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("lake sql {query:?} printed no JSON rows ({e}): {}", run.stdout))
}

/// A number from a JSON row (a missing or null value fails the test).
pub fn num(row: &serde_json::Map<String, serde_json::Value>, key: &str) -> f64 {
    row.get(key).and_then(serde_json::Value::as_f64).unwrap_or_else(|| panic!("row {row:?} has no number `{key}`"))
}

/// Every file under `dir` (none when it does not exist), sorted.
pub fn files_under(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(files_under(&path));
        } else {
            out.push(path);
        }
    }
    out.sort();
    out
}

/// `lake sample ARGS --frame-format packets --out OUT`: the packet batch, decoded as a trainer
/// decodes it (lake-loader's `PacketBatchDecoder`), must equal `rgb`, the frame path's batch of
/// the same samples, whole: schema, metadata and every byte. Decoded to planes it must equal
/// `yuv` (the `yuv420p` batch) when given. Returns the IPC bytes of the packet batch and of the
/// frame batch.
pub fn packets_decode_to(root: &Path, args: &[&str], out: &Path, rgb: &RecordBatch, yuv: Option<&RecordBatch>) -> (usize, usize) {
    use lake_loader::{FrameFormat, PacketBatchDecoder};
    let out_arg = out.to_str().expect("utf-8");
    let run = lake(root, &[args, &["--frame-format", "packets", "--out", out_arg]].concat());
    assert_eq!(run.code, 0, "{run:#?}");
    let packets = read_arrow(out);
    let to_rgb = PacketBatchDecoder::new(FrameFormat::Rgb24, 2).expect("decoder");
    assert_eq!(to_rgb.decoded_schema(&packets.schema()).expect("schema"), rgb.schema(), "{args:?}: the decoded schema");
    let decoded = to_rgb.decode(&packets).expect("packets decode");
    assert_eq!(decoded.schema(), rgb.schema(), "{args:?}: the schema of the decoded batch");
    for (field, (got, want)) in rgb.schema().fields().iter().zip(decoded.columns().iter().zip(rgb.columns())) {
        assert!(got == want, "{args:?}: column {} of the decoded packets differs from the frame path's", field.name());
    }
    if let Some(yuv) = yuv {
        let planes = PacketBatchDecoder::new(FrameFormat::Yuv420p, 2).expect("decoder").decode(&packets).expect("packets decode");
        assert!(&planes == yuv, "{args:?}: the packets decoded to planes differ from the yuv420p batch");
    }
    (ipc_bytes(&packets), ipc_bytes(rgb))
}

/// The bytes of `batch` as an Arrow IPC stream (what Flight and HTTP send, uncompressed).
pub fn ipc_bytes(batch: &RecordBatch) -> usize {
    let mut writer = arrow::ipc::writer::StreamWriter::try_new(Vec::new(), &batch.schema()).expect("writer");
    writer.write(batch).expect("write");
    writer.into_inner().expect("finish").len()
}
