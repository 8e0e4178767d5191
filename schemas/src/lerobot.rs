//! LeRobot dataset metadata: `meta/info.json` and its feature schema.

use std::{fmt, str::FromStr};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::{Error, PathTemplate, Result};

/// LeRobot's default `tolerance_s`: the largest distance between a query time and a frame's
/// presentation time for the frame to count as "the frame at that time".
pub const DEFAULT_TOLERANCE_S: f64 = 1e-4;

/// The LeRobot dataset format versions lake reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum CodebaseVersion {
    /// v2.0: one parquet and one mp4 per episode, stats in `meta/stats.json`.
    #[serde(rename = "v2.0")]
    V20,
    /// v2.1: as v2.0, with per-episode stats in `meta/episodes_stats.jsonl`.
    #[serde(rename = "v2.1")]
    V21,
    /// v3.0: many episodes per parquet and per mp4, metadata in parquet shards.
    #[serde(rename = "v3.0")]
    V30,
}

impl CodebaseVersion {
    /// Whether the dataset uses v2.x's one-file-per-episode layout.
    pub fn is_v2(self) -> bool {
        matches!(self, Self::V20 | Self::V21)
    }

    /// The version string as LeRobot writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::V20 => "v2.0",
            Self::V21 => "v2.1",
            Self::V30 => "v3.0",
        }
    }
}

impl fmt::Display for CodebaseVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for CodebaseVersion {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim() {
            "v2.0" | "2.0" => Ok(Self::V20),
            "v2.1" | "2.1" => Ok(Self::V21),
            "v3.0" | "3.0" => Ok(Self::V30),
            other => Err(Error::metadata(
                "meta/info.json: codebase_version",
                format!("`{other}` is not a LeRobot version lake reads (v2.0, v2.1, v3.0)"),
            )),
        }
    }
}

/// `meta/info.json`. Unknown keys are kept in `extra` so the document round-trips.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InfoJson {
    /// LeRobot's format version, e.g. `v3.0`.
    pub codebase_version: String,
    /// Frames per second of every stream; LeRobot supports integer rates only.
    pub fps: f64,
    /// Feature name → description, in the order the file lists them.
    pub features: Map<String, Value>,
    /// Declared number of episodes.
    #[serde(default)]
    pub total_episodes: Option<i64>,
    /// Declared number of frames (steps) over all episodes.
    #[serde(default)]
    pub total_frames: Option<i64>,
    /// Declared number of tasks.
    #[serde(default)]
    pub total_tasks: Option<i64>,
    /// Files (v3) or episodes (v2) per chunk directory.
    #[serde(default)]
    pub chunks_size: Option<i64>,
    /// Template of the data parquet paths.
    pub data_path: String,
    /// Template of the video paths; `null` for datasets without video features.
    #[serde(default)]
    pub video_path: Option<String>,
    /// Robot type, free text.
    #[serde(default)]
    pub robot_type: Option<String>,
    /// Every other key, kept verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl InfoJson {
    /// Parses `meta/info.json`.
    ///
    /// # Errors
    /// When the JSON is malformed or required keys are missing or of the wrong type.
    pub fn parse(text: &str) -> Result<Self> {
        serde_json::from_str(text).map_err(|e| Error::metadata("meta/info.json", e))
    }

    /// The codebase version, parsed.
    ///
    /// # Errors
    /// When the version is not one lake reads.
    pub fn version(&self) -> Result<CodebaseVersion> {
        self.codebase_version.parse()
    }

    /// The frame rate as an integer, as LeRobot requires.
    ///
    /// # Errors
    /// When `fps` is not a positive integer.
    pub fn fps_int(&self) -> Result<u32> {
        if self.fps > 0.0 && self.fps.fract() == 0.0 && self.fps <= f64::from(u32::MAX) {
            Ok(self.fps as u32)
        } else {
            Err(Error::metadata("meta/info.json: fps", format!("{} is not a positive integer", self.fps)))
        }
    }

    /// The data path template.
    pub fn data_template(&self) -> PathTemplate {
        PathTemplate::new(&self.data_path)
    }

    /// The video path template, when the dataset has one.
    pub fn video_template(&self) -> Option<PathTemplate> {
        self.video_path.as_deref().map(PathTemplate::new)
    }

    /// Every feature, parsed, in declaration order.
    ///
    /// # Errors
    /// When a feature entry does not have LeRobot's shape.
    pub fn parsed_features(&self) -> Result<Vec<Feature>> {
        self.features.iter().map(|(name, value)| Feature::parse(name, value)).collect()
    }
}

/// What a feature is, decided by its `dtype`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FeatureKind {
    /// A camera stored as mp4 files (no parquet column).
    Video,
    /// A camera stored as encoded images (PNG/JPEG) inside the parquet.
    Image,
    /// Numbers or booleans: scalars for shape `[1]`, vectors or arrays otherwise.
    Numeric,
    /// Strings.
    String,
    /// Anything else (e.g. language annotation structs); carried through unchanged.
    Other,
}

/// One entry of `info.json["features"]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Feature {
    /// The key, e.g. `observation.state`.
    pub name: String,
    /// LeRobot's dtype string: `float32`, `int64`, `video`, `image`, …
    pub dtype: String,
    /// Declared shape.
    pub shape: Vec<usize>,
    /// Declared names (free JSON: list, nested list, dict or null).
    pub names: Value,
    /// Video/image details (`info`, or the legacy `video_info`).
    pub info: Option<Map<String, Value>>,
}

impl Feature {
    /// Parses a feature entry.
    ///
    /// # Errors
    /// When `dtype` or `shape` is missing or malformed.
    pub fn parse(name: &str, value: &Value) -> Result<Self> {
        let what = || format!("meta/info.json: features.{name}");
        let obj = value.as_object().ok_or_else(|| Error::metadata(what(), "is not an object"))?;
        let dtype = obj.get("dtype").and_then(Value::as_str).ok_or_else(|| Error::metadata(what(), "has no string `dtype`"))?.to_string();
        let shape = match obj.get("shape") {
            Some(Value::Array(dims)) => {
                dims.iter().map(|d| d.as_u64().map(|d| d as usize)).collect::<Option<Vec<_>>>().ok_or_else(|| {
                    Error::metadata(what(), format!("shape {} is not a list of non-negative integers", Value::Array(dims.clone())))
                })?
            }
            Some(other) => return Err(Error::metadata(what(), format!("shape {other} is not a list"))),
            None => return Err(Error::metadata(what(), "has no `shape`")),
        };
        let info = obj.get("info").or_else(|| obj.get("video_info")).and_then(Value::as_object).cloned();
        Ok(Self { name: name.to_string(), dtype, shape, names: obj.get("names").cloned().unwrap_or(Value::Null), info })
    }

    /// The feature's kind.
    pub fn kind(&self) -> FeatureKind {
        match self.dtype.as_str() {
            "video" => FeatureKind::Video,
            "image" => FeatureKind::Image,
            "string" => FeatureKind::String,
            d if numeric_dtype(d) => FeatureKind::Numeric,
            _ => FeatureKind::Other,
        }
    }

    /// Whether this feature is a camera (video or image).
    pub fn is_camera(&self) -> bool {
        matches!(self.kind(), FeatureKind::Video | FeatureKind::Image)
    }

    /// Number of values per step (product of the shape; 1 for an empty shape).
    pub fn numel(&self) -> usize {
        self.shape.iter().product::<usize>().max(usize::from(self.shape.is_empty()))
    }

    /// Whether LeRobot stores the feature as a scalar parquet column (shape `[1]` or `[]`).
    pub fn is_scalar(&self) -> bool {
        self.shape.is_empty() || self.shape == [1]
    }

    /// Declared `(height, width, channels)` of a camera, read from `names` when they say which
    /// axis is which (e.g. `["channel", "height", "width"]`), else from the usual HWC layout.
    pub fn camera_hwc(&self) -> Option<(usize, usize, usize)> {
        if self.shape.len() != 3 {
            return None;
        }
        if let Some(names) = self.names.as_array() {
            let names: Vec<&str> = names.iter().filter_map(Value::as_str).collect();
            let pos = |want: &[&str]| names.iter().position(|n| want.contains(n));
            if let (Some(h), Some(w), Some(c)) = (pos(&["height"]), pos(&["width"]), pos(&["channel", "channels"])) {
                return Some((self.shape[h], self.shape[w], self.shape[c]));
            }
        }
        let s = &self.shape;
        if matches!(s[0], 1 | 3 | 4) && !matches!(s[2], 1 | 3 | 4) { Some((s[1], s[2], s[0])) } else { Some((s[0], s[1], s[2])) }
    }

    /// A string entry of the video info, e.g. `video.codec`.
    pub fn info_str(&self, key: &str) -> Option<&str> {
        self.info.as_ref()?.get(key)?.as_str()
    }

    /// A numeric entry of the video info, e.g. `video.height`.
    pub fn info_f64(&self, key: &str) -> Option<f64> {
        self.info.as_ref()?.get(key)?.as_f64()
    }

    /// Whether the camera is a depth map (`video.is_depth_map`, also in the legacy places).
    pub fn is_depth_map(&self) -> bool {
        self.info
            .as_ref()
            .and_then(|i| i.get("video.is_depth_map").or_else(|| i.get("is_depth_map")))
            .and_then(Value::as_bool)
            .unwrap_or(false)
    }
}

/// Whether a LeRobot dtype is numeric (or boolean) data.
pub fn numeric_dtype(dtype: &str) -> bool {
    matches!(
        dtype,
        "float16" | "float32" | "float64" | "int8" | "int16" | "int32" | "int64" | "uint8" | "uint16" | "uint32" | "uint64" | "bool"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &str = r#"{
        "codebase_version": "v3.0", "fps": 30, "robot_type": "so101",
        "total_episodes": 2, "total_frames": 10, "chunks_size": 1000,
        "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
        "video_path": null, "splits": {"train": "0:2"}, "data_files_size_in_mb": 0.02,
        "features": {
            "action": {"dtype": "float32", "shape": [6], "names": ["a","b","c","d","e","f"]},
            "observation.image": {"dtype": "video", "shape": [3, 720, 960], "names": ["channel", "height", "width"],
                                  "info": {"video.codec": "h264", "video.height": 720}},
            "wrist": {"dtype": "image", "shape": [96, 128, 3], "names": null},
            "timestamp": {"dtype": "float32", "shape": [1], "names": null}
        }
    }"#;

    #[test]
    fn parses_info_and_keeps_unknown_keys() {
        let info = InfoJson::parse(INFO).unwrap();
        assert_eq!(info.version().unwrap(), CodebaseVersion::V30);
        assert_eq!(info.fps_int().unwrap(), 30);
        assert!(info.video_template().is_none());
        assert!(info.extra.contains_key("splits") && info.extra.contains_key("data_files_size_in_mb"));
        let feats = info.parsed_features().unwrap();
        let names: Vec<_> = feats.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["action", "observation.image", "wrist", "timestamp"]);
        assert_eq!(feats[0].kind(), FeatureKind::Numeric);
        assert_eq!(feats[0].numel(), 6);
        assert_eq!(feats[1].kind(), FeatureKind::Video);
        assert_eq!(feats[1].camera_hwc(), Some((720, 960, 3)));
        assert_eq!(feats[1].info_str("video.codec"), Some("h264"));
        assert_eq!(feats[2].camera_hwc(), Some((96, 128, 3)));
        assert!(feats[3].is_scalar());
    }

    #[test]
    fn rejects_bad_versions_and_fps() {
        let mut info = InfoJson::parse(INFO).unwrap();
        info.codebase_version = "v1.6".into();
        assert!(info.version().unwrap_err().to_string().contains("v1.6"));
        info.fps = 29.97;
        assert!(info.fps_int().is_err());
        let bad = Feature::parse("x", &serde_json::json!({"dtype": "float32", "shape": "6"}));
        assert!(bad.unwrap_err().to_string().contains("features.x"));
    }
}
