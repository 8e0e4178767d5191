//! Datasets derived from a sample: repeated copies (for benchmarks and long-running ingests)
//! and parquet round trips (for corrupting copies in tests).

use std::{fs::File, path::Path, sync::Arc};

use arrow::{
    array::{ArrayRef, AsArray, Int64Array, RecordBatch},
    compute::cast,
    datatypes::{DataType, Int64Type},
};
use lake_schemas::{InfoJson, PathTemplate, TemplateValue};
use parquet::arrow::{ArrowWriter, arrow_reader::ParquetRecordBatchReaderBuilder};

/// Reads every row of a parquet file.
///
/// # Panics
/// When the file is not readable parquet.
pub fn read_parquet(path: &Path) -> Vec<RecordBatch> {
    let file = File::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let reader = ParquetRecordBatchReaderBuilder::try_new(file).expect("parquet").build().expect("reader");
    reader.map(|b| b.expect("batch")).collect()
}

/// Writes batches as one parquet file (one row group per batch), keeping the schema metadata.
///
/// # Panics
/// On I/O errors.
pub fn write_parquet(path: &Path, batches: &[RecordBatch]) {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).expect("mkdir");
    }
    let file = File::create(path).unwrap_or_else(|e| panic!("create {}: {e}", path.display()));
    let mut writer = ArrowWriter::try_new(file, batches[0].schema(), None).expect("writer");
    for b in batches {
        writer.write(b).expect("write");
        writer.flush().expect("row group");
    }
    writer.close().expect("close");
}

fn add(col: &ArrayRef, delta: i64) -> ArrayRef {
    let v = cast(col, &DataType::Int64).expect("int column");
    let out: Int64Array = v.as_primitive::<Int64Type>().iter().map(|x| x.map(|x| x + delta)).collect();
    cast(&(Arc::new(out) as ArrayRef), col.data_type()).expect("cast back")
}

fn with_columns(batch: &RecordBatch, f: impl Fn(&str, &ArrayRef) -> Option<ArrayRef>) -> RecordBatch {
    let columns: Vec<ArrayRef> =
        batch.schema().fields().iter().zip(batch.columns()).map(|(field, c)| f(field.name(), c).unwrap_or_else(|| c.clone())).collect();
    RecordBatch::try_new(batch.schema(), columns).expect("same schema")
}

/// Writes a LeRobot v3.0 dataset made of `times` copies of the v3.0 dataset at `src`: copy `k`
/// shifts episode and frame indices and uses its own data and video files (file indices
/// shifted), so the result has `times` × the episodes, steps and camera files of `src`.
///
/// # Panics
/// On I/O errors, or when `src` is not v3.0.
pub fn repeat_dataset(src: &Path, dst: &Path, times: usize) {
    let info_text = std::fs::read_to_string(src.join("meta/info.json")).expect("info.json");
    let info = InfoJson::parse(&info_text).expect("info.json parses");
    assert_eq!(info.codebase_version, "v3.0", "repeat_dataset needs a v3.0 dataset");
    let episode_shards: Vec<_> = {
        let mut v: Vec<_> = walk(&src.join("meta/episodes"));
        v.sort();
        v
    };
    let episodes: Vec<RecordBatch> = episode_shards.iter().flat_map(|p| read_parquet(p)).collect();
    let n_episodes: i64 = episodes.iter().map(|b| b.num_rows() as i64).sum();
    let n_frames: i64 = episodes
        .iter()
        .map(|b| b.column_by_name("length").expect("length").as_primitive::<Int64Type>().iter().flatten().sum::<i64>())
        .sum();
    let max_of = |name: &str| -> i64 {
        episodes
            .iter()
            .filter_map(|b| b.column_by_name(name))
            .map(|c| cast(c, &DataType::Int64).expect("int").as_primitive::<Int64Type>().iter().flatten().max().unwrap_or(0))
            .max()
            .unwrap_or(0)
    };
    let data_files = max_of("data/file_index") + 1;
    let cameras: Vec<String> =
        info.parsed_features().expect("features").into_iter().filter(|f| f.dtype == "video").map(|f| f.name).collect();

    std::fs::create_dir_all(dst.join("meta/episodes/chunk-000")).expect("mkdir");
    for name in ["tasks.parquet", "stats.json"] {
        if src.join("meta").join(name).exists() {
            std::fs::copy(src.join("meta").join(name), dst.join("meta").join(name)).expect("copy meta");
        }
    }
    let mut info_json: serde_json::Value = serde_json::from_str(&info_text).expect("json");
    info_json["total_episodes"] = (n_episodes * times as i64).into();
    info_json["total_frames"] = (n_frames * times as i64).into();
    info_json["splits"] = serde_json::json!({"train": format!("0:{}", n_episodes * times as i64)});
    std::fs::write(dst.join("meta/info.json"), serde_json::to_string_pretty(&info_json).expect("json")).expect("write info");

    let data_t = PathTemplate::new(&info.data_path);
    let video_t = info.video_path.as_deref().map(PathTemplate::new);
    let file_path = |t: &PathTemplate, chunk: i64, file: i64, key: Option<&str>| {
        let mut v = vec![("chunk_index", TemplateValue::Int(chunk)), ("file_index", TemplateValue::Int(file))];
        if let Some(k) = key {
            v.push(("video_key", TemplateValue::Str(k.to_string())));
        }
        t.format(&v).expect("template")
    };
    let mut out_episodes = Vec::new();
    for k in 0..times as i64 {
        for b in &episodes {
            out_episodes.push(with_columns(b, |name, c| match name {
                "episode_index" => Some(add(c, k * n_episodes)),
                "dataset_from_index" | "dataset_to_index" => Some(add(c, k * n_frames)),
                "data/file_index" => Some(add(c, k * data_files)),
                n if n.starts_with("videos/") && n.ends_with("/file_index") => {
                    let cam = &n["videos/".len()..n.len() - "/file_index".len()];
                    Some(add(c, k * (max_of(&format!("videos/{cam}/file_index")) + 1)))
                }
                _ => None,
            }));
        }
        for f in 0..data_files {
            let from = src.join(file_path(&data_t, 0, f, None));
            let batches: Vec<RecordBatch> = read_parquet(&from)
                .iter()
                .map(|b| {
                    with_columns(b, |name, c| match name {
                        "episode_index" => Some(add(c, k * n_episodes)),
                        "index" => Some(add(c, k * n_frames)),
                        _ => None,
                    })
                })
                .collect();
            write_parquet(&dst.join(file_path(&data_t, 0, f + k * data_files, None)), &batches);
        }
        if let Some(vt) = &video_t {
            for cam in &cameras {
                let files = max_of(&format!("videos/{cam}/file_index")) + 1;
                for f in 0..files {
                    let to = dst.join(file_path(vt, 0, f + k * files, Some(cam)));
                    std::fs::create_dir_all(to.parent().expect("parent")).expect("mkdir");
                    std::fs::copy(src.join(file_path(vt, 0, f, Some(cam))), &to).expect("copy video");
                }
            }
        }
    }
    write_parquet(&dst.join("meta/episodes/chunk-000/file-000.parquet"), &out_episodes);
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.path().is_dir() {
            out.extend(walk(&e.path()));
        } else {
            out.push(e.path());
        }
    }
    out
}
