//! Normalisation statistics and LeRobot's processor files: `policy_preprocessor.json`,
//! `policy_postprocessor.json` and their normaliser state files.
//!
//! The model sees normalised values; a checkpoint's processor state files are the only source
//! of the statistics (the policy applies them itself, see `ActPolicy`).

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Value, json};

use crate::DiffusionConfig;
use crate::config::{ActConfig, FeatureType, Features, NormalizationMode, OrderedMap};
use crate::tensors::{HostTensor, read_safetensors, write_safetensors};
use crate::{Error, Result};

/// LeRobot's normalisation epsilon (added to `std`, or replacing a zero range).
pub const EPS: f64 = 1e-8;
/// ImageNet per-channel mean, LeRobot's default camera `mean` (`use_imagenet_stats`).
pub const IMAGENET_MEAN: [f32; 3] = [0.485, 0.456, 0.406];
/// ImageNet per-channel standard deviation, LeRobot's default camera `std`.
pub const IMAGENET_STD: [f32; 3] = [0.229, 0.224, 0.225];

/// The preprocessor pipeline's file name.
pub const PREPROCESSOR_FILE: &str = "policy_preprocessor.json";
/// The postprocessor pipeline's file name.
pub const POSTPROCESSOR_FILE: &str = "policy_postprocessor.json";
/// The preprocessor's normaliser state (step 3).
pub const PREPROCESSOR_STATE_FILE: &str = "policy_preprocessor_step_3_normalizer_processor.safetensors";
/// The postprocessor's unnormaliser state (step 0).
pub const POSTPROCESSOR_STATE_FILE: &str = "policy_postprocessor_step_0_unnormalizer_processor.safetensors";

/// Statistics by feature, then by stat name (`mean`, `std`, `min`, `max`, `count`, `q01`, …),
/// as LeRobot's `dataset_stats` holds them. Cameras' stats have shape `[3, 1, 1]`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stats(pub BTreeMap<String, BTreeMap<String, HostTensor>>);

impl Stats {
    /// No statistics.
    pub fn new() -> Self {
        Stats::default()
    }

    /// Sets one statistic of a feature.
    pub fn insert(&mut self, feature: impl Into<String>, stat: impl Into<String>, value: HostTensor) {
        self.0.entry(feature.into()).or_default().insert(stat.into(), value);
    }

    /// One statistic of a feature.
    pub fn get(&self, feature: &str, stat: &str) -> Option<&HostTensor> {
        self.0.get(feature).and_then(|s| s.get(stat))
    }

    /// Sets `mean` and `std` of a vector feature.
    pub fn set_mean_std(&mut self, feature: &str, mean: &[f32], std: &[f32]) {
        self.insert(feature, "mean", HostTensor::vector(mean));
        self.insert(feature, "std", HostTensor::vector(std));
    }

    /// Sets `min` and `max` of a vector feature.
    pub fn set_min_max(&mut self, feature: &str, min: &[f32], max: &[f32]) {
        self.insert(feature, "min", HostTensor::vector(min));
        self.insert(feature, "max", HostTensor::vector(max));
    }

    /// Overwrites a camera's `mean` and `std` with ImageNet's, shape `[3, 1, 1]`, as
    /// lerobot-train does by default; its other stats stay.
    pub fn set_imagenet(&mut self, camera: &str) {
        self.insert(camera, "mean", HostTensor::new([3, 1, 1], IMAGENET_MEAN));
        self.insert(camera, "std", HostTensor::new([3, 1, 1], IMAGENET_STD));
    }

    /// Statistics from LeRobot's `meta/stats.json` layout: `{feature: {stat: nested lists}}`,
    /// the nesting giving the shape (a camera's `[[[r]], [[g]], [[b]]]` is `[3, 1, 1]`).
    ///
    /// # Errors
    /// [`Error::Stats`] for a value that is not a number or a rectangular nested list.
    pub fn from_stats_json(stats: &Value) -> Result<Self> {
        let features = stats.as_object().ok_or_else(|| Error::Stats("stats.json is not an object".into()))?;
        let mut out = Stats::new();
        for (feature, by_stat) in features {
            let by_stat = by_stat.as_object().ok_or_else(|| Error::Stats(format!("{feature}: not an object")))?;
            for (stat, value) in by_stat {
                let mut shape = Vec::new();
                let mut probe = value;
                while let Value::Array(a) = probe {
                    shape.push(a.len());
                    match a.first() {
                        Some(first) => probe = first,
                        None => break,
                    }
                }
                let mut values = Vec::new();
                flatten(value, &mut values).ok_or_else(|| Error::Stats(format!("{feature}.{stat}: not numbers")))?;
                if shape.is_empty() {
                    shape.push(1);
                }
                if shape.iter().product::<usize>() != values.len() {
                    return Err(Error::Stats(format!("{feature}.{stat}: not a rectangular list")));
                }
                out.insert(feature, stat, HostTensor { shape, values });
            }
        }
        Ok(out)
    }

    /// The flat `"<feature>.<stat>"` dict of the processors' state files.
    pub fn to_flat(&self) -> BTreeMap<String, HostTensor> {
        self.0.iter().flat_map(|(f, s)| s.iter().map(move |(k, v)| (format!("{f}.{k}"), v.clone()))).collect()
    }

    /// The inverse of [`Stats::to_flat`]: each key is split at its last `.`.
    ///
    /// # Errors
    /// [`Error::Format`] for a key without a `.`.
    pub fn from_flat(flat: BTreeMap<String, HostTensor>, path: &Path) -> Result<Self> {
        let mut out = Stats::new();
        for (key, value) in flat {
            let (feature, stat) =
                key.rsplit_once('.').ok_or_else(|| Error::format(path, format!("state key {key:?} is not <feature>.<stat>")))?;
            out.insert(feature, stat, value);
        }
        Ok(out)
    }
}

fn flatten(v: &Value, out: &mut Vec<f32>) -> Option<()> {
    match v {
        Value::Number(n) => out.push(n.as_f64()? as f32),
        Value::Array(a) => a.iter().try_for_each(|x| flatten(x, out))?,
        _ => return None,
    }
    Some(())
}

/// What a policy's processors normalise: its features and the mode of each feature type.
pub trait PolicyFeatures {
    /// `input_features`.
    fn inputs(&self) -> &Features;
    /// `output_features`.
    fn outputs(&self) -> &Features;
    /// `normalization_mapping`.
    fn modes(&self) -> &OrderedMap<FeatureType, NormalizationMode>;
}

/// Both configs name their features and modes as LeRobot does.
macro_rules! policy_features {
    ($($config:ty),*) => {$(
        impl PolicyFeatures for $config {
            fn inputs(&self) -> &Features {
                &self.input_features
            }
            fn outputs(&self) -> &Features {
                &self.output_features
            }
            fn modes(&self) -> &OrderedMap<FeatureType, NormalizationMode> {
                &self.normalization_mapping
            }
        }
    )*};
}

policy_features!(ActConfig, DiffusionConfig);

/// One normaliser step: which features it touches, the mode per feature type, and the stats
/// (LeRobot's `NormalizerProcessorStep` / `UnnormalizerProcessorStep`).
#[derive(Debug, Clone, PartialEq)]
pub struct Normalizer {
    /// Features by name.
    pub features: Features,
    /// Mode by feature type (a type not listed is IDENTITY).
    pub norm_map: OrderedMap<FeatureType, NormalizationMode>,
    /// Epsilon of the formulas, 1e-8.
    pub eps: f64,
    /// The statistics.
    pub stats: Stats,
}

impl Normalizer {
    /// The preprocessor's normaliser of `config`: its input then output features.
    pub fn for_inputs(config: &impl PolicyFeatures, stats: Stats) -> Self {
        let mut features = config.inputs().clone();
        for (k, v) in config.outputs().iter() {
            features.insert(k.clone(), v.clone());
        }
        Normalizer { features, norm_map: config.modes().clone(), eps: EPS, stats }
    }

    /// The postprocessor's unnormaliser of `config`: its output features.
    pub fn for_outputs(config: &impl PolicyFeatures, stats: Stats) -> Self {
        Normalizer { features: config.outputs().clone(), norm_map: config.modes().clone(), eps: EPS, stats }
    }

    /// The mode applied to `feature`: by its type, IDENTITY when the type is not mapped, the
    /// feature is not listed, or it has no stats at all (LeRobot passes those through).
    pub fn mode_of(&self, feature: &str) -> NormalizationMode {
        let Some(f) = self.features.get(&feature.to_string()) else { return NormalizationMode::Identity };
        if !self.stats.0.contains_key(feature) {
            return NormalizationMode::Identity;
        }
        self.norm_map.get(&f.kind).copied().unwrap_or(NormalizationMode::Identity)
    }

    /// The stat names a mode reads.
    pub fn required_stats(mode: NormalizationMode) -> &'static [&'static str] {
        match mode {
            NormalizationMode::MeanStd => &["mean", "std"],
            NormalizationMode::MinMax => &["min", "max"],
            NormalizationMode::Quantiles => &["q01", "q99"],
            NormalizationMode::Quantile10 => &["q10", "q90"],
            NormalizationMode::Identity => &[],
        }
    }

    /// Checks that every listed feature the mode applies to has the stats it needs, sized to
    /// the feature (`[N]` for vectors, `[3, 1, 1]` or `[3]` per channel for cameras). A
    /// feature without any stats is refused too: LeRobot would silently leave it raw.
    ///
    /// # Errors
    /// [`Error::Stats`] naming the feature and stat.
    pub fn check(&self) -> Result<()> {
        for (name, f) in self.features.iter() {
            let mode = self.norm_map.get(&f.kind).copied().unwrap_or(NormalizationMode::Identity);
            if mode == NormalizationMode::Identity {
                continue;
            }
            if !self.stats.0.contains_key(name) {
                return Err(Error::Stats(format!("{name} ({mode:?}) has no stats; LeRobot would leave it unnormalised")));
            }
            for stat in Self::required_stats(mode) {
                let t = self.stats.get(name, stat).ok_or_else(|| Error::Stats(format!("{name}: {mode:?} needs `{stat}`")))?;
                let want = match f.kind {
                    FeatureType::Visual => f.shape.first().copied().unwrap_or(0),
                    _ => f.shape.iter().product(),
                };
                if t.values.len() != want {
                    return Err(Error::Stats(format!(
                        "{name}.{stat}: {} values (shape {:?}) for feature shape {:?}",
                        t.values.len(),
                        t.shape,
                        f.shape
                    )));
                }
            }
        }
        Ok(())
    }

    fn config_json(&self) -> Value {
        json!({"eps": self.eps, "features": self.features, "norm_map": self.norm_map})
    }
}

/// A checkpoint's two processor pipelines as lake reads them.
#[derive(Debug, Clone, PartialEq)]
pub struct Processors {
    /// The preprocessor's normaliser.
    pub normalizer: Normalizer,
    /// The postprocessor's unnormaliser.
    pub unnormalizer: Normalizer,
}

impl Processors {
    /// Both steps of `config` over the same stats, as lerobot-train saves them.
    pub fn new(config: &impl PolicyFeatures, stats: Stats) -> Self {
        Processors { normalizer: Normalizer::for_inputs(config, stats.clone()), unnormalizer: Normalizer::for_outputs(config, stats) }
    }

    /// Writes `policy_preprocessor.json`, `policy_postprocessor.json` and both state files into
    /// `dir`, in LeRobot 0.4.4's format; `device` is the device step's (`"cpu"`, `"cuda"`).
    ///
    /// # Errors
    /// [`Error::Stats`] when [`Normalizer::check`] fails, [`Error::Io`] when a file cannot be
    /// written.
    pub fn write(&self, dir: &Path, device: &str) -> Result<()> {
        self.normalizer.check()?;
        self.unnormalizer.check()?;
        let pre = json!({
            "name": "policy_preprocessor",
            "steps": [
                {"registry_name": "rename_observations_processor", "config": {"rename_map": {}}},
                {"registry_name": "to_batch_processor", "config": {}},
                {"registry_name": "device_processor", "config": {"device": device, "float_dtype": null}},
                {"registry_name": "normalizer_processor", "config": self.normalizer.config_json(), "state_file": PREPROCESSOR_STATE_FILE},
            ]
        });
        let post = json!({
            "name": "policy_postprocessor",
            "steps": [
                {"registry_name": "unnormalizer_processor", "config": self.unnormalizer.config_json(), "state_file": POSTPROCESSOR_STATE_FILE},
                {"registry_name": "device_processor", "config": {"device": "cpu", "float_dtype": null}},
            ]
        });
        for (file, doc) in [(PREPROCESSOR_FILE, &pre), (POSTPROCESSOR_FILE, &post)] {
            let path = dir.join(file);
            let text = serde_json::to_string_pretty(doc).expect("JSON to memory");
            std::fs::write(&path, text).map_err(Error::io(&path))?;
        }
        for (file, n) in [(PREPROCESSOR_STATE_FILE, &self.normalizer), (POSTPROCESSOR_STATE_FILE, &self.unnormalizer)] {
            let flat = n.stats.to_flat();
            write_safetensors(dir.join(file), flat.iter().map(|(k, v)| (k.as_str(), v)))?;
        }
        Ok(())
    }

    /// Reads the processor files of a checkpoint directory written by LeRobot 0.4.x/0.6.x or
    /// lake: the `normalizer_processor` step of the preprocessor and the
    /// `unnormalizer_processor` step of the postprocessor, with their state files.
    ///
    /// # Errors
    /// [`Error::Io`] for a missing file, [`Error::Format`] when a pipeline lacks the step.
    pub fn read(dir: &Path) -> Result<Self> {
        Ok(Processors {
            normalizer: read_step(dir, PREPROCESSOR_FILE, "normalizer_processor")?,
            unnormalizer: read_step(dir, POSTPROCESSOR_FILE, "unnormalizer_processor")?,
        })
    }
}

fn read_step(dir: &Path, file: &str, registry_name: &str) -> Result<Normalizer> {
    let path = dir.join(file);
    let text = std::fs::read_to_string(&path).map_err(Error::io(&path))?;
    let doc: Value = serde_json::from_str(&text).map_err(|e| Error::format(&path, e.to_string()))?;
    let step = doc
        .get("steps")
        .and_then(Value::as_array)
        .and_then(|s| s.iter().find(|s| s.get("registry_name").and_then(Value::as_str) == Some(registry_name)))
        .ok_or_else(|| Error::format(&path, format!("no {registry_name} step")))?;
    let config = step.get("config").ok_or_else(|| Error::format(&path, format!("{registry_name} has no config")))?;
    let features: Features = serde_json::from_value(config.get("features").cloned().unwrap_or(json!({})))
        .map_err(|e| Error::format(&path, format!("features: {e}")))?;
    let norm_map: OrderedMap<FeatureType, NormalizationMode> = serde_json::from_value(config.get("norm_map").cloned().unwrap_or(json!({})))
        .map_err(|e| Error::format(&path, format!("norm_map: {e}")))?;
    let eps = config.get("eps").and_then(Value::as_f64).unwrap_or(EPS);
    let stats = match step.get("state_file").and_then(Value::as_str) {
        Some(state) => {
            let state_path = dir.join(state);
            Stats::from_flat(read_safetensors(&state_path)?, &state_path)?
        }
        None => Stats::new(),
    };
    Ok(Normalizer { features, norm_map, eps, stats })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ACTION, DatasetFeature, OBS_STATE};

    fn config() -> ActConfig {
        ActConfig::with_features(&[
            DatasetFeature::new(OBS_STATE, FeatureType::State, [2]),
            DatasetFeature::new(ACTION, FeatureType::Action, [2]),
            DatasetFeature::new("observation.images.front", FeatureType::Visual, [3, 36, 48]),
        ])
    }

    fn stats() -> Stats {
        let mut s = Stats::new();
        s.set_mean_std(OBS_STATE, &[0.5, -1.0], &[2.0, 0.25]);
        s.set_min_max(OBS_STATE, &[-3.0, -2.0], &[3.0, 0.0]);
        s.set_mean_std(ACTION, &[0.1, 0.2], &[1.0, 3.0]);
        s.insert(ACTION, "count", HostTensor::vector([60.0]));
        s.set_imagenet("observation.images.front");
        s.insert("timestamp", "mean", HostTensor::vector([1.0]));
        s
    }

    #[test]
    fn processor_files_round_trip_in_lerobots_layout() {
        let dir = tempfile::tempdir().unwrap();
        let p = Processors::new(&config(), stats());
        p.write(dir.path(), "cpu").unwrap();
        let pre: Value = serde_json::from_str(&std::fs::read_to_string(dir.path().join(PREPROCESSOR_FILE)).unwrap()).unwrap();
        let names: Vec<&str> = pre["steps"].as_array().unwrap().iter().map(|s| s["registry_name"].as_str().unwrap()).collect();
        assert_eq!(names, ["rename_observations_processor", "to_batch_processor", "device_processor", "normalizer_processor"]);
        assert_eq!(pre["steps"][3]["state_file"], PREPROCESSOR_STATE_FILE);
        // Inputs then outputs, in config order.
        let feats: Vec<&String> = pre["steps"][3]["config"]["features"].as_object().unwrap().keys().collect();
        assert_eq!(feats, [OBS_STATE, "observation.images.front", ACTION]);
        assert_eq!(pre["steps"][3]["config"]["norm_map"], json!({"VISUAL": "MEAN_STD", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"}));
        assert_eq!(pre["steps"][3]["config"]["eps"], 1e-8);
        let post: Value = serde_json::from_str(&std::fs::read_to_string(dir.path().join(POSTPROCESSOR_FILE)).unwrap()).unwrap();
        assert_eq!(post["steps"][0]["config"]["features"], json!({"action": {"type": "ACTION", "shape": [2]}}));
        assert_eq!(post["steps"][1]["config"]["device"], "cpu");

        let flat = read_safetensors(dir.path().join(PREPROCESSOR_STATE_FILE)).unwrap();
        assert_eq!(flat["observation.images.front.mean"].shape, [3, 1, 1]);
        assert_eq!(flat["action.count"].values, [60.0]);
        assert_eq!(flat.len(), 10);

        let back = Processors::read(dir.path()).unwrap();
        assert_eq!(back, p);
        assert_eq!(back.normalizer.mode_of(OBS_STATE), NormalizationMode::MeanStd);
        assert_eq!(back.normalizer.mode_of("timestamp"), NormalizationMode::Identity);
    }

    #[test]
    fn missing_stats_are_refused() {
        let mut s = stats();
        s.0.get_mut(ACTION).unwrap().remove("std");
        let err = Processors::new(&config(), s).write(tempfile::tempdir().unwrap().path(), "cpu").unwrap_err().to_string();
        assert!(err.contains("action") && err.contains("std"), "{err}");
        let mut s = stats();
        s.0.remove("observation.images.front");
        let err = Normalizer::for_inputs(&config(), s).check().unwrap_err().to_string();
        assert!(err.contains("observation.images.front"), "{err}");
        let mut s = stats();
        s.set_mean_std(OBS_STATE, &[0.0; 3], &[1.0; 3]);
        assert!(Normalizer::for_inputs(&config(), s).check().unwrap_err().to_string().contains("shape"));
    }

    #[test]
    fn stats_json_layout_parses() {
        let v: Value = serde_json::from_str(
            r#"{"action": {"mean": [1.0, 2.0], "count": [60]},
                "observation.images.front": {"mean": [[[0.1]], [[0.2]], [[0.3]]]}}"#,
        )
        .unwrap();
        let s = Stats::from_stats_json(&v).unwrap();
        assert_eq!(s.get("action", "mean").unwrap(), &HostTensor::vector([1.0, 2.0]));
        assert_eq!(s.get("action", "count").unwrap().shape, [1]);
        assert_eq!(s.get("observation.images.front", "mean").unwrap().shape, [3, 1, 1]);
        let flat = s.to_flat();
        assert!(flat.contains_key("observation.images.front.mean"));
        assert_eq!(Stats::from_flat(flat, Path::new("x")).unwrap(), s);
    }
}
