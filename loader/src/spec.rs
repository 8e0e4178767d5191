//! What a sample holds around its step: LeRobot's `delta_timestamps`, from a policy preset or
//! given explicitly, validated and turned into integer frame offsets the way LeRobot does.

use std::{fmt, str::FromStr};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{Error, Result};

/// Window presets of common policies, with LeRobot's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Preset {
    /// ACT: 50 future actions (`chunk_size = 50`).
    Act,
    /// Diffusion policy: 2 observation steps (state, every camera and every other
    /// `observation.*` feature, as lerobot-train windows them), 16 actions from the previous
    /// step on (`n_obs_steps = 2`, `horizon = 16`).
    Diffusion,
    /// No windows: the step's own values only.
    None,
}

impl FromStr for Preset {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "act" => Ok(Self::Act),
            "diffusion" => Ok(Self::Diffusion),
            "none" => Ok(Self::None),
            other => Err(Error::request(format!("unknown preset `{other}` (known: act, diffusion, none)"))),
        }
    }
}

impl fmt::Display for Preset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Act => "act",
            Self::Diffusion => "diffusion",
            Self::None => "none",
        })
    }
}

/// LeRobot's `delta_timestamps`: key → offsets in seconds, in the order given.
pub type DeltaTimestamps = Vec<(String, Vec<f64>)>;

/// How samples are windowed: a preset or explicit `delta_timestamps` (key → offsets in seconds).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Windows {
    /// A policy preset, resolved against the dataset's keys and fps.
    Preset(Preset),
    /// LeRobot's `delta_timestamps`, in the order given.
    DeltaTimestamps(DeltaTimestamps),
}

impl Default for Windows {
    fn default() -> Self {
        Self::Preset(Preset::None)
    }
}

impl Windows {
    /// Parses `delta_timestamps` JSON: an object of key → list of seconds.
    ///
    /// # Errors
    /// When the text is not such an object.
    pub fn parse_delta_timestamps(text: &str) -> Result<Self> {
        let value: Value = serde_json::from_str(text).map_err(|e| Error::request(format!("delta_timestamps: not JSON: {e}")))?;
        Self::from_json(&value)
    }

    /// Reads `delta_timestamps` from a JSON value: an object of key → list of seconds, or
    /// `null` for none.
    ///
    /// # Errors
    /// When the value is not such an object.
    pub fn from_json(value: &Value) -> Result<Self> {
        // `None` in LeRobot: no windows.
        if value.is_null() {
            return Ok(Self::Preset(Preset::None));
        }
        let obj = value.as_object().ok_or_else(|| Error::request("delta_timestamps must be an object of key → list of seconds"))?;
        let mut out = Vec::with_capacity(obj.len());
        for (key, offsets) in obj {
            let list = offsets.as_array().ok_or_else(|| Error::request(format!("delta_timestamps.{key} must be a list of seconds")))?;
            let secs = list
                .iter()
                .map(Value::as_f64)
                .collect::<Option<Vec<f64>>>()
                .ok_or_else(|| Error::request(format!("delta_timestamps.{key} must hold only numbers")))?;
            if secs.is_empty() {
                return Err(Error::request(format!("delta_timestamps.{key} is empty")));
            }
            out.push((key.clone(), secs));
        }
        Ok(Self::DeltaTimestamps(out))
    }

    /// The `delta_timestamps` these windows stand for on a dataset with the given keys and fps,
    /// or `None` for no windows.
    ///
    /// # Errors
    /// When a preset needs a key the dataset does not have.
    pub fn delta_timestamps(&self, keys: &DatasetKeys<'_>) -> Result<Option<DeltaTimestamps>> {
        let fps = f64::from(keys.fps);
        let preset = match self {
            Self::DeltaTimestamps(d) => return Ok(Some(d.clone())),
            Self::Preset(p) => *p,
        };
        let pick = |candidates: &[&str], role: &str| -> Result<String> {
            candidates.iter().find(|c| keys.features.iter().any(|f| f == *c)).map(|c| (*c).to_string()).ok_or_else(|| {
                Error::request(format!(
                    "preset `{preset}` needs an {role} feature (one of {}); this dataset has {}; pass delta_timestamps instead",
                    candidates.join(", "),
                    keys.features.join(", ")
                ))
            })
        };
        match preset {
            Preset::None => Ok(None),
            Preset::Act => {
                let action = pick(&ACTION_KEYS, "action")?;
                Ok(Some(vec![(action, (0..50).map(|i| f64::from(i) / fps).collect())]))
            }
            Preset::Diffusion => {
                let state = pick(&STATE_KEYS, "state")?;
                let action = pick(&ACTION_KEYS, "action")?;
                let obs = vec![-1.0 / fps, 0.0];
                let mut out = vec![(state, obs.clone()), (action, (-1..15).map(|i| f64::from(i) / fps).collect())];
                out.extend(keys.cameras.iter().map(|c| (c.clone(), obs.clone())));
                // lerobot-train windows every `observation.*` feature (an environment state, say).
                let others: Vec<String> =
                    keys.features.iter().filter(|f| f.starts_with("observation.") && !out.iter().any(|(k, _)| k == *f)).cloned().collect();
                out.extend(others.into_iter().map(|f| (f, obs.clone())));
                Ok(Some(out))
            }
        }
    }
}

/// Feature keys presets look for, in order of preference (LeRobot's own, then common variants).
const ACTION_KEYS: [&str; 2] = ["action", "actions"];
const STATE_KEYS: [&str; 2] = ["observation.state", "state"];

/// What a dataset offers to window over.
#[derive(Debug, Clone, Copy)]
pub struct DatasetKeys<'a> {
    /// Frames per second.
    pub fps: u32,
    /// Every feature key (cameras included).
    pub features: &'a [String],
    /// Camera keys, in feature order.
    pub cameras: &'a [String],
    /// LeRobot's `tolerance_s` for the dataset.
    pub tolerance_s: f64,
    /// Whether any camera is a video (LeRobot finds video frames by the step's `timestamp`).
    pub has_video: bool,
}

/// One windowed key: integer frame offsets relative to the sample's step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    /// The feature key.
    pub key: String,
    /// Frame offsets (`round(d * fps)`).
    pub offsets: Vec<i64>,
}

/// Validates `delta_timestamps` as LeRobot's `check_delta_timestamps` does and converts them to
/// frame offsets as its `get_delta_indices` does.
///
/// # Errors
/// When a key is not a feature of the dataset, an offset is not a multiple of `1 / fps` within
/// the dataset's tolerance, or the key is one LeRobot reads per step after windowing
/// (`task_index`, and `timestamp` when a camera is a video).
pub fn resolve_windows(delta: &[(String, Vec<f64>)], keys: &DatasetKeys<'_>) -> Result<Vec<Window>> {
    let fps = f64::from(keys.fps);
    let mut out = Vec::with_capacity(delta.len());
    for (key, secs) in delta {
        if !keys.features.iter().any(|f| f == key) {
            return Err(Error::request(format!(
                "delta_timestamps: `{key}` is not a feature of this dataset (it has {})",
                keys.features.join(", ")
            )));
        }
        // LeRobot reads the step's own `task_index` (its task string) and, with video cameras,
        // its own `timestamp` (where the frames are) after the windows replaced them: a window
        // there moves the task or the frames, or fails. The other index columns window as any
        // feature does.
        if key == "task_index" || (key == "timestamp" && keys.has_video) {
            let what = if key == "task_index" { "the step's task" } else { "the step's time to find its video frames" };
            return Err(Error::request(format!(
                "delta_timestamps: `{key}` cannot be windowed here: LeRobot reads it as {what}, so a window would change that too \
                 (window `index` or `frame_index` to see the neighbouring steps)"
            )));
        }
        let mut offsets = Vec::with_capacity(secs.len());
        for &d in secs {
            // Python's round() rounds halves to even; so does this.
            let frames = (d * fps).round_ties_even();
            if !d.is_finite() || ((d * fps - frames).abs() / fps) > keys.tolerance_s {
                return Err(Error::request(format!(
                    "delta_timestamps.{key}: {d} s is not a multiple of 1/{} s within the tolerance of {} s",
                    keys.fps, keys.tolerance_s
                )));
            }
            if frames.abs() > f64::from(i32::MAX) {
                return Err(Error::request(format!(
                    "delta_timestamps.{key}: {d:e} s is more than 2^31 - 1 frames from the step, the most a window offset may span"
                )));
            }
            offsets.push(frames as i64);
        }
        out.push(Window { key: key.clone(), offsets });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys<'a>(features: &'a [String], cameras: &'a [String]) -> DatasetKeys<'a> {
        DatasetKeys { fps: 30, features, cameras, tolerance_s: 1e-4, has_video: !cameras.is_empty() }
    }

    #[test]
    fn seconds_are_read_exactly_as_python_reads_them() {
        // Each is the nearest double to its text only when parsed exactly (Python's `float`);
        // a parse one ulp off lands on the other side of LeRobot's tolerance check.
        let features: Vec<String> = vec!["action".into()];
        let k = keys(&features, &[]);
        for (text, accepted) in [("100.00009999999999", true), ("99.99990000000001", true), ("0.10010000000000001", false)] {
            let windows = Windows::parse_delta_timestamps(&format!(r#"{{"action": [{text}]}}"#)).unwrap();
            let Windows::DeltaTimestamps(delta) = &windows else { panic!("delta_timestamps") };
            assert_eq!(delta[0].1[0], text.parse::<f64>().unwrap(), "{text}");
            assert_eq!(resolve_windows(delta, &k).is_ok(), accepted, "{text}");
        }
        assert!(Windows::parse_delta_timestamps("null").unwrap().delta_timestamps(&k).unwrap().is_none(), "null: no windows");
    }

    #[test]
    fn presets_resolve_to_lerobot_offsets() {
        let features: Vec<String> =
            ["observation.environment_state", "observation.state", "action", "observation.images.front", "frame_index"]
                .map(String::from)
                .to_vec();
        let cameras = vec!["observation.images.front".to_string()];
        let k = keys(&features, &cameras);
        let act = Windows::Preset(Preset::Act).delta_timestamps(&k).unwrap().unwrap();
        let w = resolve_windows(&act, &k).unwrap();
        assert_eq!(w, vec![Window { key: "action".into(), offsets: (0..50).collect() }]);

        let diffusion = Windows::Preset(Preset::Diffusion).delta_timestamps(&k).unwrap().unwrap();
        let w = resolve_windows(&diffusion, &k).unwrap();
        assert_eq!(w[0], Window { key: "observation.state".into(), offsets: vec![-1, 0] });
        assert_eq!(w[1].offsets, (-1..15).collect::<Vec<_>>());
        assert_eq!(w[2], Window { key: "observation.images.front".into(), offsets: vec![-1, 0] });
        assert_eq!(w[3], Window { key: "observation.environment_state".into(), offsets: vec![-1, 0] });
        assert_eq!(w.len(), 4, "{w:?}");
        assert!(Windows::Preset(Preset::None).delta_timestamps(&k).unwrap().is_none());
    }

    #[test]
    fn presets_find_variant_keys_or_say_what_is_missing() {
        let features: Vec<String> = ["state", "actions", "image"].map(String::from).to_vec();
        let cameras = vec!["image".to_string()];
        let k = keys(&features, &cameras);
        let act = Windows::Preset(Preset::Act).delta_timestamps(&k).unwrap().unwrap();
        assert_eq!(act[0].0, "actions");
        let bare: Vec<String> = vec!["x".into()];
        let err = Windows::Preset(Preset::Act).delta_timestamps(&keys(&bare, &[])).unwrap_err().to_string();
        assert!(err.contains("needs an action feature"), "{err}");
    }

    #[test]
    fn offsets_off_the_frame_grid_are_refused() {
        let features: Vec<String> = vec!["action".into()];
        let k = keys(&features, &[]);
        let w = Windows::parse_delta_timestamps(r#"{"action": [0.0, 0.0333333, -0.1]}"#).unwrap();
        let Windows::DeltaTimestamps(d) = w else { unreachable!() };
        assert_eq!(resolve_windows(&d, &k).unwrap()[0].offsets, vec![0, 1, -3]);
        let Windows::DeltaTimestamps(d) = Windows::parse_delta_timestamps(r#"{"action": [0.02]}"#).unwrap() else { unreachable!() };
        assert!(resolve_windows(&d, &k).unwrap_err().to_string().contains("not a multiple of 1/30"));
        let Windows::DeltaTimestamps(d) = Windows::parse_delta_timestamps(r#"{"nope": [0.0]}"#).unwrap() else { unreachable!() };
        assert!(resolve_windows(&d, &k).unwrap_err().to_string().contains("`nope` is not a feature"));
        assert!(Windows::parse_delta_timestamps("[1]").is_err());
        assert!(Windows::parse_delta_timestamps(r#"{"action": []}"#).is_err());
    }

    #[test]
    fn index_columns_window_unless_lerobot_reads_them_per_step() {
        let features: Vec<String> =
            ["index", "episode_index", "frame_index", "timestamp", "task_index", "front"].map(String::from).to_vec();
        let window = |key: &str, cameras: &[String]| {
            let Windows::DeltaTimestamps(d) = Windows::parse_delta_timestamps(&format!(r#"{{"{key}": [-0.1, 0.0]}}"#)).unwrap() else {
                unreachable!()
            };
            resolve_windows(&d, &keys(&features, cameras))
        };
        let video = vec!["front".to_string()];
        for key in ["index", "episode_index", "frame_index"] {
            assert_eq!(window(key, &video).unwrap()[0].offsets, vec![-3, 0], "{key}");
        }
        assert!(window("timestamp", &[]).is_ok(), "no video: LeRobot stacks timestamps as any feature");
        let err = window("timestamp", &video).unwrap_err().to_string();
        assert!(err.contains("to find its video frames"), "{err}");
        let err = window("task_index", &[]).unwrap_err().to_string();
        assert!(err.contains("`task_index` cannot be windowed here") && !err.contains("  "), "{err}");
    }
}
