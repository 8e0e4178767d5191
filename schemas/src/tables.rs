//! Names and Arrow schemas of the tables in a lake dataset version.
//!
//! | table | one row per | key columns |
//! |---|---|---|
//! | `steps` | step (parquet row) | `index`, `episode_index`, `frame_index`, `timestamp`, `task_index`, `task`, every feature, `packet_row` |
//! | `packets` | compressed frame, per stream in decode order | `stream`, `camera`, `episode_index`, `frame_index`, `pts`, `keyframe`, `keyframe_offset`, `data` |
//! | `streams` | camera source file | codec facts from the container and as declared |
//! | `episodes` | episode | length, tasks, index range, per-camera stream and time range |
//! | `tasks` | task, in `tasks.parquet` row order | `task_index`, `task` |
//! | `stats` | (episode or dataset, feature, statistic) | values as stored by LeRobot |
//! | `feature_stats` | (episode or dataset, numeric feature, dimension) | exact count, min, max, mean, std, quantiles |
//! | `findings` | validation finding | severity, kind, file, episode, camera, frame |

use std::sync::Arc;

use arrow_schema::{DataType, Field, Fields, Schema, SchemaRef};

/// The steps table.
pub const STEPS: &str = "steps";
/// The packets table.
pub const PACKETS: &str = "packets";
/// The streams table.
pub const STREAMS: &str = "streams";
/// The `kind` of a `streams` row whose file none of the ingested episodes shows (every episode
/// it holds was left out by `--skip-bad-episodes`): listed, never served.
pub const SKIPPED_STREAM: &str = "skipped";
/// The episodes table.
pub const EPISODES: &str = "episodes";
/// The tasks table.
pub const TASKS: &str = "tasks";
/// The stats table.
pub const STATS: &str = "stats";
/// The findings table.
pub const FINDINGS: &str = "findings";
/// The exact statistics table, computed by lake over every step.
pub const FEATURE_STATS: &str = "feature_stats";
/// Per-channel camera statistics over a frame subsample, added beside a version by `lake stats
/// --images` (same columns as `feature_stats`; `feature` is the camera, `dim` the RGB channel).
pub const IMAGE_STATS: &str = "image_stats";
/// Schema metadata key of a small table written beside a committed version (`image_stats`): the
/// `blake3:<hex>` digest of its rows, written in the same commit as they are, which `lake
/// verify` checks.
pub const CONTENT_DIGEST: &str = "lake:content_digest";
/// Every table of a version, in the order ingest writes them.
pub const ALL: [&str; 8] = [PACKETS, STEPS, STREAMS, EPISODES, TASKS, STATS, FEATURE_STATS, FINDINGS];

/// The quantiles `feature_stats` holds, as (column name, probability).
pub const QUANTILES: [(&str, f64); 5] = [("q01", 0.01), ("q10", 0.10), ("q50", 0.50), ("q90", 0.90), ("q99", 0.99)];

/// Steps column holding, per camera, the `packets` row that shows this step's frame.
pub const PACKET_ROW: &str = "packet_row";
/// Steps column with the task string resolved by LeRobot's rule (row `task_index` of `tasks`).
pub const TASK: &str = "task";
/// Field metadata key with a feature's declared shape as JSON (e.g. `[2, 3]`).
pub const SHAPE_METADATA: &str = "lake:shape";
/// Field metadata key with a feature's LeRobot dtype (e.g. `float32`, `video`).
pub const DTYPE_METADATA: &str = "lake:dtype";

/// Field metadata key with the LeRobot key of a column whose stored name differs from it.
pub const NAME_METADATA: &str = "lake:name";

/// The stored column name of a LeRobot key. Lance reserves `.` in top-level names for nested
/// fields, so `observation.state` is stored as `observation/state`; the key itself is kept in
/// the field's `lake:name` metadata, and readers present columns under that key.
pub fn storage_name(key: &str) -> String {
    key.replace('.', "/")
}

/// The LeRobot key of a stored field: its `lake:name` metadata, else its name.
pub fn lerobot_name(field: &Field) -> &str {
    field.metadata().get(NAME_METADATA).map_or(field.name().as_str(), String::as_str)
}

/// LeRobot's index columns, present in every data parquet.
pub const INDEX_COLUMNS: [&str; 5] = ["timestamp", "frame_index", "episode_index", "index", "task_index"];

fn nullable(name: &str, dt: DataType) -> Field {
    Field::new(name, dt, true)
}

fn required(name: &str, dt: DataType) -> Field {
    Field::new(name, dt, false)
}

fn list_of(dt: DataType) -> DataType {
    DataType::List(Arc::new(Field::new("item", dt, true)))
}

/// Schema of `packets`. Rows are grouped by stream and in decode order inside a stream, so the
/// packets needed to reconstruct the frame of row `r` are rows `r - keyframe_offset ..= r`
/// (decode them, flush the decoder, and keep the frame whose pts is the row's `pts`).
pub fn packets_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        required("stream", DataType::UInt32),
        required("camera", DataType::Utf8),
        nullable("episode_index", DataType::Int64),
        nullable("frame_index", DataType::Int64),
        required("pts", DataType::Int64),
        required("dts", DataType::Int64),
        required("duration", DataType::Int64),
        required("keyframe", DataType::Boolean),
        required("container_keyframe", DataType::Boolean),
        required("keyframe_offset", DataType::UInt32),
        required("data", DataType::LargeBinary),
        required(PACKET_CHECKSUM, DataType::UInt32),
    ]))
}

/// The `packets` column holding the CRC-32 (IEEE) of each packet's `data`, taken at ingest and
/// checked whenever the packet is read: damage to the lake's files after ingest fails the frame
/// instead of decoding to other pixels. Lakes ingested before it have no such column.
pub const PACKET_CHECKSUM: &str = "data_crc32";

/// A version's training proxy (`lake cache NAME --proxy CODEC`): the frames some step shows,
/// re-encoded per stream for random access. Not one of the tables ingest writes: it lies beside
/// them, like the frame tables.
pub const PROXY: &str = "proxy";

/// Schema metadata key of the proxy table: how it was encoded, its streams' decoder
/// parameters, and how far each camera's frames are from the recorded ones (JSON).
pub const PROXY_METADATA: &str = "lake:proxy";

/// Schema of the proxy table. As in `packets`, rows are grouped by stream and in decode order
/// (which is presentation order: proxies have no B-frames); `source_row` is the `packets` row
/// of the recorded frame each one re-encodes.
pub fn proxy_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        required("stream", DataType::UInt32),
        required("pts", DataType::Int64),
        required("dts", DataType::Int64),
        required("keyframe", DataType::Boolean),
        required("container_keyframe", DataType::Boolean),
        required("keyframe_offset", DataType::UInt32),
        required("data", DataType::LargeBinary),
        required(PACKET_CHECKSUM, DataType::UInt32),
        required("source_row", DataType::UInt64),
    ]))
}

/// Schema of `streams`: codec facts read from the container, next to what `info.json` declares.
pub fn streams_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        required("stream", DataType::UInt32),
        required("camera", DataType::Utf8),
        required("kind", DataType::Utf8),
        nullable("file", DataType::Utf8),
        required("codec", DataType::Utf8),
        nullable("declared_codec", DataType::Utf8),
        nullable("profile", DataType::Utf8),
        nullable("extradata", DataType::Binary),
        required("width", DataType::UInt32),
        required("height", DataType::UInt32),
        nullable("declared_width", DataType::UInt32),
        nullable("declared_height", DataType::UInt32),
        nullable("pix_fmt", DataType::Utf8),
        nullable("declared_pix_fmt", DataType::Utf8),
        nullable("color_range", DataType::Utf8),
        nullable("color_space", DataType::Utf8),
        nullable("color_primaries", DataType::Utf8),
        nullable("color_trc", DataType::Utf8),
        nullable("chroma_location", DataType::Utf8),
        required("time_base_num", DataType::Int32),
        required("time_base_den", DataType::Int32),
        nullable("avg_frame_rate", DataType::Float64),
        required("first_row", DataType::UInt64),
        required("packets", DataType::UInt64),
        required("keyframes", DataType::UInt64),
        required("max_gop", DataType::UInt64),
        required("reordered", DataType::Boolean),
        required("bytes", DataType::UInt64),
        nullable("duration_s", DataType::Float64),
    ]))
}

/// The struct type of one entry of `episodes.cameras`.
pub fn episode_camera_fields() -> Fields {
    Fields::from(vec![
        required("camera", DataType::Utf8),
        required("stream", DataType::UInt32),
        nullable("file", DataType::Utf8),
        nullable("from_timestamp", DataType::Float64),
        nullable("to_timestamp", DataType::Float64),
        required("frames", DataType::UInt64),
        required("first_row", DataType::UInt64),
        required("last_row", DataType::UInt64),
    ])
}

/// Schema of `episodes`.
pub fn episodes_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        required("episode_index", DataType::Int64),
        required("length", DataType::Int64),
        required("tasks", list_of(DataType::Utf8)),
        required("dataset_from_index", DataType::Int64),
        required("dataset_to_index", DataType::Int64),
        nullable("data_file", DataType::Utf8),
        required("cameras", list_of(DataType::Struct(episode_camera_fields()))),
    ]))
}

/// Schema of `tasks`, in the row order of the source (LeRobot looks tasks up by row position).
pub fn tasks_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![required("task_index", DataType::Int64), required("task", DataType::Utf8)]))
}

/// Schema of `stats`: one row per (episode or whole dataset, feature, statistic).
pub fn stats_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        nullable("episode_index", DataType::Int64),
        required("feature", DataType::Utf8),
        required("stat", DataType::Utf8),
        required("values", list_of(DataType::Float64)),
        required("shape", list_of(DataType::Int64)),
        required("source", DataType::Utf8),
    ]))
}

/// Schema of `feature_stats`: one row per (episode, or the whole dataset when `episode_index` is
/// null; numeric feature by its LeRobot key; flattened dimension, from 0). Statistics skip nulls;
/// `std` is the population standard deviation and the quantiles are exact, interpolated linearly
/// between the two nearest ranks (numpy's default), over every step.
pub fn feature_stats_schema() -> SchemaRef {
    let mut fields = vec![
        nullable("episode_index", DataType::Int64),
        required("feature", DataType::Utf8),
        required("dim", DataType::Int32),
        required("count", DataType::Int64),
    ];
    for name in ["min", "max", "mean", "std"].into_iter().chain(QUANTILES.iter().map(|(q, _)| *q)) {
        fields.push(nullable(name, DataType::Float64));
    }
    Arc::new(Schema::new(fields))
}

/// Schema of `findings`.
pub fn findings_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        required("severity", DataType::Utf8),
        required("kind", DataType::Utf8),
        nullable("file", DataType::Utf8),
        nullable("episode_index", DataType::Int64),
        nullable("camera", DataType::Utf8),
        nullable("frame_index", DataType::Int64),
        required("message", DataType::Utf8),
    ]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dotted_keys_round_trip_through_metadata() {
        let name = storage_name("observation.images.front");
        assert_eq!(name, "observation/images/front");
        let field = Field::new(&name, DataType::UInt64, false)
            .with_metadata([(NAME_METADATA.to_string(), "observation.images.front".to_string())].into());
        assert_eq!(lerobot_name(&field), "observation.images.front");
        assert_eq!(lerobot_name(&Field::new("index", DataType::Int64, false)), "index");
    }

    #[test]
    fn schemas_have_unique_columns() {
        for schema in [
            packets_schema(),
            streams_schema(),
            episodes_schema(),
            tasks_schema(),
            stats_schema(),
            feature_stats_schema(),
            findings_schema(),
        ] {
            let mut names: Vec<_> = schema.fields().iter().map(|f| f.name().clone()).collect();
            let n = names.len();
            names.sort();
            names.dedup();
            assert_eq!(names.len(), n, "{schema:?}");
        }
    }
}
