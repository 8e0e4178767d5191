//! `ACTConfig` as LeRobot 0.4.4 reads and writes it (`config.json`), the dataset-feature rules
//! that fill its `input_features`/`output_features`, and the `delta_timestamps` a data feed
//! needs.

use std::fmt;
use std::path::Path;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::{Error, Result};

/// A feature's role, LeRobot's `FeatureType` (serialised as its upper-case name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum FeatureType {
    /// A proprioceptive vector (`observation.state`, `observation.velocity`, …).
    State,
    /// A camera, channel-first `[3, H, W]`.
    Visual,
    /// `observation.environment_state`.
    Env,
    /// The action vector.
    Action,
    /// A reward (ACT does not read it).
    Reward,
    /// A language instruction (ACT does not read it).
    Language,
}

/// How a feature type is normalised, LeRobot's `NormalizationMode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum NormalizationMode {
    /// `2·(x − min)/(max − min) − 1`.
    #[serde(rename = "MIN_MAX")]
    MinMax,
    /// `(x − mean)/(std + eps)`.
    #[serde(rename = "MEAN_STD")]
    MeanStd,
    /// Unchanged.
    #[serde(rename = "IDENTITY")]
    Identity,
    /// Like `MIN_MAX` with the 1st and 99th percentiles.
    #[serde(rename = "QUANTILES")]
    Quantiles,
    /// Like `MIN_MAX` with the 10th and 90th percentiles.
    #[serde(rename = "QUANTILE10")]
    Quantile10,
}

/// A feature as a policy sees it: LeRobot's `PolicyFeature` (`{"type": .., "shape": [..]}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyFeature {
    /// The feature's role.
    #[serde(rename = "type")]
    pub kind: FeatureType,
    /// Its shape per sample; cameras channel-first.
    pub shape: Vec<usize>,
}

/// A JSON object whose key order is kept, as LeRobot's dicts keep theirs (the order of
/// `input_features` is the camera order, hence the token order).
#[derive(Debug, Clone, PartialEq)]
pub struct OrderedMap<K, V>(pub Vec<(K, V)>);

impl<K, V> Default for OrderedMap<K, V> {
    fn default() -> Self {
        OrderedMap(Vec::new())
    }
}

impl<K: PartialEq, V> OrderedMap<K, V> {
    /// The value of `key`.
    pub fn get(&self, key: &K) -> Option<&V> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// Sets `key`, keeping its place when present and appending it otherwise.
    pub fn insert(&mut self, key: K, value: V) {
        match self.0.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => self.0.push((key, value)),
        }
    }

    /// Entries in order.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.0.iter().map(|(k, v)| (k, v))
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are no entries.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<K: Serialize, V: Serialize> Serialize for OrderedMap<K, V> {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

impl<'de, K: Deserialize<'de> + PartialEq, V: Deserialize<'de>> Deserialize<'de> for OrderedMap<K, V> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        struct V2<K, V>(std::marker::PhantomData<(K, V)>);
        impl<'de, K: Deserialize<'de> + PartialEq, V: Deserialize<'de>> Visitor<'de> for V2<K, V> {
            type Value = OrderedMap<K, V>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> std::result::Result<Self::Value, A::Error> {
                let mut out = OrderedMap(Vec::new());
                while let Some((k, v)) = access.next_entry::<K, V>()? {
                    out.insert(k, v);
                }
                Ok(out)
            }
        }
        deserializer.deserialize_map(V2(std::marker::PhantomData))
    }
}

/// Features by name, in order.
pub type Features = OrderedMap<String, PolicyFeature>;

/// LeRobot 0.4.4's `ACTConfig`: every field of its `config.json`, with the same names, order
/// and defaults. [`ActConfig::from_json`] also reads 0.6.1's files; [`ActConfig::to_json`]
/// writes 0.4.4's fields only, which both versions read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ActConfig {
    /// Observation steps per sample; ACT accepts only 1.
    pub n_obs_steps: usize,
    /// Inputs by name, in dataset order (cameras in token order).
    pub input_features: Features,
    /// Outputs: `{"action": ACTION [A]}`.
    pub output_features: Features,
    /// `"cpu"`, `"cuda"`, … (LeRobot falls back to an available device).
    pub device: Option<String>,
    /// Autocast; lake's implementation trains in f32 and refuses `true`.
    pub use_amp: bool,
    /// PEFT adapters; refused by lake.
    pub use_peft: bool,
    /// Hub upload by LeRobot after training.
    pub push_to_hub: bool,
    /// Hub repository.
    pub repo_id: Option<String>,
    /// Hub visibility.
    pub private: Option<bool>,
    /// Hub tags.
    pub tags: Option<Vec<String>>,
    /// Hub licence.
    pub license: Option<String>,
    /// Where the weights were loaded from.
    pub pretrained_path: Option<String>,
    /// Actions predicted per forward pass.
    pub chunk_size: usize,
    /// Actions executed per inference call (≤ `chunk_size`).
    pub n_action_steps: usize,
    /// Normalisation mode by feature type; a type absent here is not normalised.
    pub normalization_mapping: OrderedMap<FeatureType, NormalizationMode>,
    /// Must be `resnet18` for lake.
    pub vision_backbone: String,
    /// torchvision weights enum name; lake never downloads them: `lake train` reads them from
    /// `--backbone-weights` or torchvision's cache (see [`crate::ActConfig::for_checkpoint`]).
    pub pretrained_backbone_weights: Option<String>,
    /// Dilation in ResNet's last stage; ResNet-18 supports only `false`. Read as `0`/`1` too.
    #[serde(deserialize_with = "bool_or_int")]
    pub replace_final_stride_with_dilation: bool,
    /// Pre-norm transformer layers (adds final encoder norms).
    pub pre_norm: bool,
    /// Transformer width.
    pub dim_model: usize,
    /// Attention heads.
    pub n_heads: usize,
    /// Feed-forward width.
    pub dim_feedforward: usize,
    /// `"relu"` or `"gelu"`.
    pub feedforward_activation: String,
    /// Main encoder layers.
    pub n_encoder_layers: usize,
    /// Decoder layers (all of them run).
    pub n_decoder_layers: usize,
    /// Train with the CVAE encoder.
    pub use_vae: bool,
    /// Latent size.
    pub latent_dim: usize,
    /// CVAE encoder layers.
    pub n_vae_encoder_layers: usize,
    /// Temporal ensembling coefficient at inference.
    pub temporal_ensemble_coeff: Option<f64>,
    /// Dropout probability.
    pub dropout: f64,
    /// Weight of the KL term.
    pub kl_weight: f64,
    /// Adam learning rate.
    pub optimizer_lr: f64,
    /// Adam weight decay (decoupled, on every parameter).
    pub optimizer_weight_decay: f64,
    /// Learning rate of the backbone's parameter group.
    pub optimizer_lr_backbone: f64,
}

fn bool_or_int<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<bool, D::Error> {
    match Value::deserialize(d)? {
        Value::Bool(b) => Ok(b),
        Value::Number(n) if n.as_u64() == Some(0) => Ok(false),
        Value::Number(n) if n.as_u64() == Some(1) => Ok(true),
        other => Err(de::Error::custom(format!("expected false, true, 0 or 1, found {other}"))),
    }
}

impl Default for ActConfig {
    fn default() -> Self {
        ActConfig {
            n_obs_steps: 1,
            input_features: OrderedMap::default(),
            output_features: OrderedMap::default(),
            device: None,
            use_amp: false,
            use_peft: false,
            push_to_hub: true,
            repo_id: None,
            private: None,
            tags: None,
            license: None,
            pretrained_path: None,
            chunk_size: 100,
            n_action_steps: 100,
            normalization_mapping: OrderedMap(vec![
                (FeatureType::Visual, NormalizationMode::MeanStd),
                (FeatureType::State, NormalizationMode::MeanStd),
                (FeatureType::Action, NormalizationMode::MeanStd),
            ]),
            vision_backbone: "resnet18".into(),
            pretrained_backbone_weights: Some("ResNet18_Weights.IMAGENET1K_V1".into()),
            replace_final_stride_with_dilation: false,
            pre_norm: false,
            dim_model: 512,
            n_heads: 8,
            dim_feedforward: 3200,
            feedforward_activation: "relu".into(),
            n_encoder_layers: 4,
            n_decoder_layers: 1,
            use_vae: true,
            latent_dim: 32,
            n_vae_encoder_layers: 4,
            temporal_ensemble_coeff: None,
            dropout: 0.1,
            kl_weight: 10.0,
            optimizer_lr: 1e-5,
            optimizer_weight_decay: 1e-4,
            optimizer_lr_backbone: 1e-5,
        }
    }
}

/// The name LeRobot gives the robot-state input.
pub const OBS_STATE: &str = "observation.state";
/// The name LeRobot gives the environment-state input.
pub const OBS_ENV_STATE: &str = "observation.environment_state";
/// The name of the action output.
pub const ACTION: &str = "action";

/// One feature of a dataset (an entry of `meta/info.json`'s `features`) as a policy sees it:
/// its name, role and per-sample shape (cameras channel-first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatasetFeature {
    /// Column name, e.g. `observation.images.front`.
    pub name: String,
    /// Its role.
    pub kind: FeatureType,
    /// Shape per sample; `[3, H, W]` for cameras.
    pub shape: Vec<usize>,
}

impl DatasetFeature {
    /// A feature with an explicit role.
    pub fn new(name: impl Into<String>, kind: FeatureType, shape: impl Into<Vec<usize>>) -> Self {
        DatasetFeature { name: name.into(), kind, shape: shape.into() }
    }

    /// Classifies an `info.json` feature as LeRobot's `dataset_to_policy_features` does:
    /// `image`/`video` dtypes are cameras (an `[H, W, C]` shape whose third name is
    /// `channel(s)` becomes `[C, H, W]`), `observation.environment_state` is ENV, other
    /// `observation*` keys are STATE, `action*` keys are ACTION, and anything else
    /// (`timestamp`, `index`, …) is not a policy feature (`None`).
    pub fn classify(name: &str, dtype: &str, shape: &[usize], names: Option<&[String]>) -> Option<DatasetFeature> {
        let kind = if dtype == "image" || dtype == "video" {
            FeatureType::Visual
        } else if name == OBS_ENV_STATE {
            FeatureType::Env
        } else if name.starts_with("observation") {
            FeatureType::State
        } else if name.starts_with("action") {
            FeatureType::Action
        } else {
            return None;
        };
        let mut shape = shape.to_vec();
        if kind == FeatureType::Visual
            && shape.len() == 3
            && names.and_then(|n| n.get(2)).is_some_and(|n| n == "channel" || n == "channels")
        {
            shape = vec![shape[2], shape[0], shape[1]];
        }
        Some(DatasetFeature { name: name.to_string(), kind, shape })
    }

    /// The policy features of a LeRobot `meta/info.json` document, in file order.
    ///
    /// # Errors
    /// [`Error::Features`] when `features` is missing or an entry lacks `dtype` or `shape`.
    pub fn from_info_json(info: &Value) -> Result<Vec<DatasetFeature>> {
        let features =
            info.get("features").and_then(Value::as_object).ok_or_else(|| Error::Features("info.json has no `features` object".into()))?;
        let mut out = Vec::new();
        for (name, f) in features {
            let dtype = f.get("dtype").and_then(Value::as_str).ok_or_else(|| Error::Features(format!("{name}: no dtype")))?;
            let shape = f
                .get("shape")
                .and_then(Value::as_array)
                .and_then(|a| a.iter().map(|v| v.as_u64().map(|n| n as usize)).collect::<Option<Vec<_>>>())
                .ok_or_else(|| Error::Features(format!("{name}: no shape of non-negative integers")))?;
            let names: Option<Vec<String>> =
                f.get("names").and_then(Value::as_array).map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect());
            out.extend(Self::classify(name, dtype, &shape, names.as_deref()));
        }
        Ok(out)
    }
}

impl ActConfig {
    /// LeRobot's defaults with the features of a dataset: ACTION entries become
    /// `output_features`, all others `input_features`, both in the given order.
    pub fn with_features(features: &[DatasetFeature]) -> Self {
        let mut config = ActConfig::default();
        config.set_features(features);
        config
    }

    /// Replaces `input_features` and `output_features` by `features` (see
    /// [`ActConfig::with_features`]).
    pub fn set_features(&mut self, features: &[DatasetFeature]) {
        self.input_features = OrderedMap::default();
        self.output_features = OrderedMap::default();
        for f in features {
            let pf = PolicyFeature { kind: f.kind, shape: f.shape.clone() };
            if f.kind == FeatureType::Action {
                self.output_features.insert(f.name.clone(), pf);
            } else {
                self.input_features.insert(f.name.clone(), pf);
            }
        }
    }

    /// The small configuration for CPU tests: ResNet-18 kept, everything else shrunk, lr 1e-4,
    /// no pretrained backbone.
    pub fn small() -> Self {
        ActConfig {
            chunk_size: 10,
            n_action_steps: 10,
            dim_model: 32,
            n_heads: 2,
            dim_feedforward: 64,
            n_encoder_layers: 1,
            n_decoder_layers: 1,
            latent_dim: 8,
            n_vae_encoder_layers: 1,
            pretrained_backbone_weights: None,
            optimizer_lr: 1e-4,
            optimizer_lr_backbone: 1e-4,
            ..ActConfig::default()
        }
    }

    /// The `observation.state` input, when it is a STATE feature.
    pub fn robot_state_feature(&self) -> Option<&PolicyFeature> {
        self.input_features.get(&OBS_STATE.to_string()).filter(|f| f.kind == FeatureType::State)
    }

    /// The first ENV input.
    pub fn env_state_feature(&self) -> Option<(&str, &PolicyFeature)> {
        env_state_feature(&self.input_features)
    }

    /// The cameras, in token order.
    pub fn image_features(&self) -> Vec<(&str, &PolicyFeature)> {
        image_features(&self.input_features)
    }

    /// The `action` output.
    pub fn action_feature(&self) -> Option<&PolicyFeature> {
        self.output_features.get(&ACTION.to_string())
    }

    /// The normalisation mode of a feature type (IDENTITY when the type is not mapped).
    pub fn mode_for(&self, kind: FeatureType) -> NormalizationMode {
        self.normalization_mapping.get(&kind).copied().unwrap_or(NormalizationMode::Identity)
    }

    /// `delta_timestamps` for a dataset at `fps`, as lerobot-train builds them: the action
    /// chunk's offsets `i / fps` for `i < chunk_size` (in seconds, f64), and none for
    /// observations (the current frame only).
    pub fn delta_timestamps(&self, fps: f64) -> Vec<(String, Vec<f64>)> {
        vec![(ACTION.to_string(), (0..self.chunk_size).map(|i| i as f64 / fps).collect())]
    }

    /// The frame offsets of the action chunk, `0..chunk_size`.
    pub fn action_delta_indices(&self) -> Vec<i64> {
        (0..self.chunk_size as i64).collect()
    }

    /// The same config with `pretrained_backbone_weights` cleared, as a checkpoint must store
    /// it: LeRobot builds a fresh policy before loading weights and would otherwise try to
    /// download the torchvision weights.
    pub fn for_checkpoint(&self) -> Self {
        ActConfig { pretrained_backbone_weights: None, ..self.clone() }
    }

    /// Checks what LeRobot's `ACTConfig.__post_init__` and `validate_features` check, plus what
    /// lake's implementation needs (ResNet-18, relu or gelu, f32).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the field, or [`Error::Features`].
    pub fn validate(&self) -> Result<()> {
        if self.n_obs_steps != 1 {
            return Err(Error::config("n_obs_steps", format!("ACT handles one observation step, got {}", self.n_obs_steps)));
        }
        if self.chunk_size == 0 {
            return Err(Error::config("chunk_size", "must be at least 1"));
        }
        if self.n_action_steps > self.chunk_size {
            return Err(Error::config(
                "n_action_steps",
                format!("{} exceeds chunk_size {} (the actions predicted per call)", self.n_action_steps, self.chunk_size),
            ));
        }
        if self.temporal_ensemble_coeff.is_some() && self.n_action_steps > 1 {
            return Err(Error::config("n_action_steps", "must be 1 with temporal_ensemble_coeff (the policy is queried every step)"));
        }
        if !self.vision_backbone.starts_with("resnet") {
            return Err(Error::config("vision_backbone", format!("must be a ResNet, got {:?}", self.vision_backbone)));
        }
        if self.vision_backbone != "resnet18" {
            return Err(Error::config("vision_backbone", format!("lake implements resnet18 only, got {:?}", self.vision_backbone)));
        }
        if self.replace_final_stride_with_dilation {
            return Err(Error::config("replace_final_stride_with_dilation", "ResNet-18's BasicBlock does not support dilation"));
        }
        if self.dim_model == 0 || self.n_heads == 0 || !self.dim_model.is_multiple_of(self.n_heads) {
            return Err(Error::config(
                "n_heads",
                format!("dim_model {} must be a positive multiple of n_heads {}", self.dim_model, self.n_heads),
            ));
        }
        if !matches!(self.feedforward_activation.as_str(), "relu" | "gelu") {
            return Err(Error::config(
                "feedforward_activation",
                format!("{:?} is not supported (relu or gelu; glu does not fit linear2)", self.feedforward_activation),
            ));
        }
        if self.latent_dim == 0 || self.dim_feedforward == 0 {
            return Err(Error::config("latent_dim", "latent_dim and dim_feedforward must be positive"));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(Error::config("dropout", format!("{} is not in [0, 1)", self.dropout)));
        }
        if self.use_amp {
            return Err(Error::config("use_amp", "lake trains ACT in float32"));
        }
        if self.use_peft {
            return Err(Error::config("use_peft", "PEFT adapters are not supported"));
        }
        self.validate_features()
    }

    /// The feature checks of [`ActConfig::validate`].
    ///
    /// # Errors
    /// [`Error::Features`] naming the problem.
    pub fn validate_features(&self) -> Result<()> {
        let images = self.image_features();
        if images.is_empty() && self.env_state_feature().is_none() {
            return Err(Error::Features("at least one camera or an observation.environment_state input is required".into()));
        }
        let action = self.action_feature().ok_or_else(|| Error::Features("no `action` output feature".into()))?;
        if action.shape.len() != 1 || action.shape[0] == 0 {
            return Err(Error::Features(format!("action must have shape [A], got {:?}", action.shape)));
        }
        for (name, f) in self.input_features.iter() {
            match f.kind {
                FeatureType::Visual if f.shape.len() != 3 || f.shape[0] != 3 || f.shape[1] == 0 || f.shape[2] == 0 => {
                    return Err(Error::Features(format!("camera {name} must have shape [3, H, W], got {:?}", f.shape)));
                }
                FeatureType::State | FeatureType::Env if f.shape.len() != 1 || f.shape[0] == 0 => {
                    return Err(Error::Features(format!("{name} must have shape [N], got {:?}", f.shape)));
                }
                _ => {}
            }
        }
        if !images.is_empty() && !self.dim_model.is_multiple_of(4) {
            return Err(Error::config(
                "dim_model",
                format!("{} must be a multiple of 4 for the 2-D image position embedding", self.dim_model),
            ));
        }
        Ok(())
    }

    /// Checks that `other` (e.g. a checkpoint's config) describes the same network: the same
    /// features (names, roles, and shapes except camera resolutions, which do not change the
    /// weights) and the same architecture fields.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the first field that differs, with both values.
    pub fn check_same_architecture(&self, other: &ActConfig) -> Result<()> {
        fn key(f: &Features) -> Vec<(String, FeatureType, Vec<usize>)> {
            f.iter().map(|(k, v)| (k.clone(), v.kind, if v.kind == FeatureType::Visual { vec![] } else { v.shape.clone() })).collect()
        }
        let pairs: [(&str, String, String); 16] = [
            ("input_features", format!("{:?}", key(&self.input_features)), format!("{:?}", key(&other.input_features))),
            ("output_features", format!("{:?}", key(&self.output_features)), format!("{:?}", key(&other.output_features))),
            ("chunk_size", self.chunk_size.to_string(), other.chunk_size.to_string()),
            ("vision_backbone", self.vision_backbone.clone(), other.vision_backbone.clone()),
            (
                "replace_final_stride_with_dilation",
                self.replace_final_stride_with_dilation.to_string(),
                other.replace_final_stride_with_dilation.to_string(),
            ),
            ("pre_norm", self.pre_norm.to_string(), other.pre_norm.to_string()),
            ("dim_model", self.dim_model.to_string(), other.dim_model.to_string()),
            ("n_heads", self.n_heads.to_string(), other.n_heads.to_string()),
            ("dim_feedforward", self.dim_feedforward.to_string(), other.dim_feedforward.to_string()),
            ("feedforward_activation", self.feedforward_activation.clone(), other.feedforward_activation.clone()),
            ("n_encoder_layers", self.n_encoder_layers.to_string(), other.n_encoder_layers.to_string()),
            ("n_decoder_layers", self.n_decoder_layers.to_string(), other.n_decoder_layers.to_string()),
            ("use_vae", self.use_vae.to_string(), other.use_vae.to_string()),
            ("latent_dim", self.latent_dim.to_string(), other.latent_dim.to_string()),
            ("n_vae_encoder_layers", self.n_vae_encoder_layers.to_string(), other.n_vae_encoder_layers.to_string()),
            ("normalization_mapping", format!("{:?}", self.normalization_mapping), format!("{:?}", other.normalization_mapping)),
        ];
        for (field, mine, theirs) in pairs {
            if mine != theirs {
                return Err(Error::config(field, format!("this run has {mine}, the checkpoint has {theirs}")));
            }
        }
        Ok(())
    }

    /// Parses a `config.json` written by LeRobot 0.4.4 or 0.6.1 (or lake): `"type"` must be
    /// `"act"`, 0.6.1's `pretrained_revision` is ignored, any other unknown key is refused (as
    /// 0.4.4 refuses it), missing keys take their defaults.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a wrong `type`, an unknown field or a wrong value type.
    pub fn from_json(text: &str) -> Result<Self> {
        let mut map: Map<String, Value> = serde_json::from_str(text).map_err(|e| Error::config("config.json", e.to_string()))?;
        match map.remove("type") {
            Some(Value::String(t)) if t == "act" => {}
            Some(other) => return Err(Error::config("type", format!("expected \"act\", found {other}"))),
            None => return Err(Error::config("type", "missing (LeRobot requires it)")),
        }
        map.remove("pretrained_revision");
        serde_json::from_value(Value::Object(map)).map_err(|e| Error::config("config.json", e.to_string()))
    }

    /// Reads `dir/config.json` (see [`ActConfig::from_json`]).
    ///
    /// # Errors
    /// [`Error::Io`] when the file cannot be read, else as [`ActConfig::from_json`].
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(Error::io(path))?;
        Self::from_json(&text).map_err(|e| match e {
            Error::InvalidConfig { field, reason } => Error::format(path, format!("{field}: {reason}")),
            e => e,
        })
    }

    /// `config.json` text: `"type": "act"` then 0.4.4's fields in dataclass order, indent 4.
    pub fn to_json(&self) -> String {
        json_text("act", serde_json::to_value(self).expect("ActConfig serialises"))
    }
}

/// The first ENV input of `features`.
pub(crate) fn env_state_feature(features: &Features) -> Option<(&str, &PolicyFeature)> {
    features.iter().find(|(_, f)| f.kind == FeatureType::Env).map(|(k, f)| (k.as_str(), f))
}

/// The cameras of `features`, in order.
pub(crate) fn image_features(features: &Features) -> Vec<(&str, &PolicyFeature)> {
    features.iter().filter(|(_, f)| f.kind == FeatureType::Visual).map(|(k, f)| (k.as_str(), f)).collect()
}

/// A policy's `config.json` as LeRobot writes it: `"type"` first, then `fields` (a config
/// serialised in its dataclass order), indented by 4.
pub(crate) fn json_text(policy_type: &str, fields: Value) -> String {
    let mut map = Map::new();
    map.insert("type".into(), Value::String(policy_type.into()));
    if let Value::Object(fields) = fields {
        map.extend(fields);
    }
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, serde_json::ser::PrettyFormatter::with_indent(b"    "));
    Value::Object(map).serialize(&mut ser).expect("JSON to memory");
    String::from_utf8(out).expect("serde_json writes UTF-8")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny_features() -> Vec<DatasetFeature> {
        vec![
            DatasetFeature::new(OBS_STATE, FeatureType::State, [6]),
            DatasetFeature::new(ACTION, FeatureType::Action, [6]),
            DatasetFeature::new("observation.images.front", FeatureType::Visual, [3, 36, 48]),
        ]
    }

    #[test]
    fn defaults_are_lerobot_044s() {
        let c = ActConfig::default();
        let v: Value = serde_json::from_str(&c.to_json()).unwrap();
        let expected = serde_json::json!({
            "type": "act", "n_obs_steps": 1, "input_features": {}, "output_features": {}, "device": null,
            "use_amp": false, "use_peft": false, "push_to_hub": true, "repo_id": null, "private": null, "tags": null,
            "license": null, "pretrained_path": null, "chunk_size": 100, "n_action_steps": 100,
            "normalization_mapping": {"VISUAL": "MEAN_STD", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"},
            "vision_backbone": "resnet18", "pretrained_backbone_weights": "ResNet18_Weights.IMAGENET1K_V1",
            "replace_final_stride_with_dilation": false, "pre_norm": false, "dim_model": 512, "n_heads": 8,
            "dim_feedforward": 3200, "feedforward_activation": "relu", "n_encoder_layers": 4, "n_decoder_layers": 1,
            "use_vae": true, "latent_dim": 32, "n_vae_encoder_layers": 4, "temporal_ensemble_coeff": null,
            "dropout": 0.1, "kl_weight": 10.0, "optimizer_lr": 1e-05, "optimizer_weight_decay": 0.0001,
            "optimizer_lr_backbone": 1e-05
        });
        assert_eq!(v, expected);
        // Key order is the dataclass order, `type` first.
        let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
        let want: Vec<&String> = expected.as_object().unwrap().keys().collect();
        assert_eq!(keys, want);
        assert!(c.to_json().starts_with("{\n    \"type\": \"act\",\n    \"n_obs_steps\": 1,"));
    }

    #[test]
    fn reads_the_observed_044_file_and_a_061_one() {
        let file_044 = r#"{"type": "act", "n_obs_steps": 1,
            "input_features": {"observation.state": {"type": "STATE", "shape": [6]},
                               "observation.images.front": {"type": "VISUAL", "shape": [3, 36, 48]}},
            "output_features": {"action": {"type": "ACTION", "shape": [6]}},
            "device": "cpu", "use_amp": false, "use_peft": false, "push_to_hub": false, "repo_id": null,
            "private": null, "tags": null, "license": null, "pretrained_path": null, "chunk_size": 10,
            "n_action_steps": 10, "normalization_mapping": {"VISUAL": "MEAN_STD", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"},
            "vision_backbone": "resnet18", "pretrained_backbone_weights": null, "replace_final_stride_with_dilation": false,
            "pre_norm": false, "dim_model": 32, "n_heads": 2, "dim_feedforward": 64, "feedforward_activation": "relu",
            "n_encoder_layers": 2, "n_decoder_layers": 1, "use_vae": true, "latent_dim": 8, "n_vae_encoder_layers": 1,
            "temporal_ensemble_coeff": null, "dropout": 0.1, "kl_weight": 10.0, "optimizer_lr": 1e-05,
            "optimizer_weight_decay": 0.0001, "optimizer_lr_backbone": 1e-05}"#;
        let c = ActConfig::from_json(file_044).unwrap();
        assert_eq!(c.dim_model, 32);
        assert_eq!(c.image_features().iter().map(|(k, _)| *k).collect::<Vec<_>>(), ["observation.images.front"]);
        assert_eq!(c.robot_state_feature().unwrap().shape, [6]);
        c.validate().unwrap();
        // Round trip through lake's writer.
        assert_eq!(ActConfig::from_json(&c.to_json()).unwrap(), c);

        // 0.6.1 adds `pretrained_revision`; a round-tripped 0.4.4 file has dilation 0.
        let file_061 = file_044
            .replace(r#""pretrained_path": null,"#, r#""pretrained_path": null, "pretrained_revision": null,"#)
            .replace(r#""replace_final_stride_with_dilation": false"#, r#""replace_final_stride_with_dilation": 0"#);
        assert!(file_061.contains("pretrained_revision") && file_061.contains("dilation\": 0"));
        let c61 = ActConfig::from_json(&file_061).unwrap();
        assert_eq!(c61, c);
        assert!(!c61.to_json().contains("pretrained_revision"));
    }

    #[test]
    fn refuses_what_lerobot_refuses() {
        let err = ActConfig::from_json(r#"{"type": "act", "dim_modle": 4}"#).unwrap_err().to_string();
        assert!(err.contains("unknown field `dim_modle`"), "{err}");
        let err = ActConfig::from_json(r#"{"type": "diffusion"}"#).unwrap_err().to_string();
        assert!(err.contains("type") && err.contains("diffusion"), "{err}");
        assert!(ActConfig::from_json(r#"{"dim_model": 4}"#).unwrap_err().to_string().contains("type"));
        assert!(ActConfig::from_json(r#"{"type": "act", "replace_final_stride_with_dilation": 2}"#).is_err());
        let err = ActConfig::from_json(r#"{"type": "act", "input_features": {"x": {"type": "STATE", "shape": [1], "extra": 1}}}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("extra"), "{err}");

        let mut c = ActConfig::with_features(&tiny_features());
        c.validate().unwrap();
        c.n_action_steps = 101;
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("n_action_steps") && err.contains("101") && err.contains("100"), "{err}");
        let mut c = ActConfig::with_features(&tiny_features());
        c.n_heads = 7;
        assert!(c.validate().unwrap_err().to_string().contains("n_heads"));
        let mut c = ActConfig::with_features(&tiny_features());
        c.feedforward_activation = "glu".into();
        assert!(c.validate().unwrap_err().to_string().contains("glu"));
        let mut c = ActConfig::with_features(&tiny_features());
        c.vision_backbone = "resnet50".into();
        assert!(c.validate().unwrap_err().to_string().contains("resnet18"));
        // No camera and no environment state.
        let c = ActConfig::with_features(&tiny_features()[..2]);
        assert!(c.validate().unwrap_err().to_string().contains("camera"));
        // An environment state alone is enough.
        let mut f = tiny_features()[..2].to_vec();
        f.push(DatasetFeature::new(OBS_ENV_STATE, FeatureType::Env, [4]));
        ActConfig::with_features(&f).validate().unwrap();
    }

    #[test]
    fn features_from_info_json_follow_lerobot() {
        let info: Value = serde_json::from_str(
            r#"{"features": {
                "observation.state": {"dtype": "float32", "shape": [6], "names": ["a","b","c","d","e","f"]},
                "action": {"dtype": "float32", "shape": [6], "names": null},
                "observation.images.front": {"dtype": "image", "shape": [36, 48, 3], "names": ["height", "width", "channels"]},
                "observation.images.wrist": {"dtype": "video", "shape": [3, 64, 64], "names": ["channels", "height", "width"]},
                "observation.environment_state": {"dtype": "float32", "shape": [4]},
                "timestamp": {"dtype": "float32", "shape": [1], "names": null},
                "index": {"dtype": "int64", "shape": [1], "names": null}
            }}"#,
        )
        .unwrap();
        let f = DatasetFeature::from_info_json(&info).unwrap();
        assert_eq!(
            f,
            vec![
                DatasetFeature::new(OBS_STATE, FeatureType::State, [6]),
                DatasetFeature::new(ACTION, FeatureType::Action, [6]),
                DatasetFeature::new("observation.images.front", FeatureType::Visual, [3, 36, 48]),
                DatasetFeature::new("observation.images.wrist", FeatureType::Visual, [3, 64, 64]),
                DatasetFeature::new(OBS_ENV_STATE, FeatureType::Env, [4]),
            ]
        );
        let c = ActConfig::with_features(&f);
        assert_eq!(
            c.input_features.0.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>()[1..3],
            ["observation.images.front", "observation.images.wrist"]
        );
        assert_eq!(c.output_features.len(), 1);
        assert_eq!(c.env_state_feature().unwrap().0, OBS_ENV_STATE);
        assert_eq!(c.mode_for(FeatureType::Env), NormalizationMode::Identity);
        assert_eq!(c.mode_for(FeatureType::Visual), NormalizationMode::MeanStd);
    }

    #[test]
    fn architecture_check_names_the_field() {
        let a = ActConfig::with_features(&tiny_features());
        let mut b = a.clone();
        b.optimizer_lr = 1.0;
        b.input_features.insert("observation.images.front".into(), PolicyFeature { kind: FeatureType::Visual, shape: vec![3, 96, 128] });
        a.check_same_architecture(&b).unwrap();
        b.n_heads = 4;
        let err = a.check_same_architecture(&b).unwrap_err().to_string();
        assert!(err.contains("n_heads") && err.contains("this run has 8, the checkpoint has 4"), "{err}");
        let mut c = a.clone();
        c.output_features.insert(ACTION.into(), PolicyFeature { kind: FeatureType::Action, shape: vec![7] });
        assert!(a.check_same_architecture(&c).unwrap_err().to_string().contains("output_features"));
    }

    #[test]
    fn delta_timestamps_are_the_action_chunk() {
        let mut c = ActConfig::default();
        let d = c.delta_timestamps(30.0);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].0, "action");
        assert_eq!(d[0].1.len(), 100);
        assert_eq!(d[0].1[0], 0.0);
        // Python's `1 / 30` as f64.
        assert_eq!(d[0].1[1], 0.03333333333333333);
        assert_eq!(d[0].1[99], 99.0 / 30.0);
        c.chunk_size = 3;
        assert_eq!(c.delta_timestamps(10.0)[0].1, vec![0.0, 0.1, 0.2]);
        assert_eq!(c.action_delta_indices(), vec![0, 1, 2]);
    }
}
