//! `DiffusionConfig` as LeRobot 0.4.4 reads and writes it (`config.json`), and the windows a
//! data feed gives its samples (`docs/design/diffusion.md`).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::{
    ACTION, DatasetFeature, FeatureType, Features, NormalizationMode, OBS_STATE, OrderedMap, PolicyFeature, Result,
    config::{env_state_feature, image_features, json_text},
    error::Error,
};

/// LeRobot 0.4.4's `DiffusionConfig`: every field of its `config.json`, with the same names,
/// order and defaults (the defaults are PushT's: one camera and the robot state).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DiffusionConfig {
    /// Observation steps per sample: the current one and those before it.
    pub n_obs_steps: usize,
    /// Inputs by name, in dataset order (cameras in this order).
    pub input_features: Features,
    /// Outputs: `{"action": ACTION [A]}`.
    pub output_features: Features,
    /// `"cpu"`, `"cuda"`, … (LeRobot falls back to an available device).
    pub device: Option<String>,
    /// Autocast.
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
    /// Actions the network denoises per sample, from the first observation step on; a
    /// multiple of `2^len(down_dims)`.
    pub horizon: usize,
    /// Actions executed per inference call.
    pub n_action_steps: usize,
    /// Normalisation mode by feature type; a type absent here is not normalised.
    pub normalization_mapping: OrderedMap<FeatureType, NormalizationMode>,
    /// The last steps of every episode that are never sampled.
    pub drop_n_last_frames: usize,
    /// Must be `resnet18` for lake.
    pub vision_backbone: String,
    /// `[H, W]` every camera is resized to first (lake does not resize inside the policy yet;
    /// its frame tables serve frames at a size: `frame_size`).
    pub resize_shape: Option<[usize; 2]>,
    /// Derives `crop_shape` from `resize_shape` when below 1.
    pub crop_ratio: f64,
    /// `[H, W]` of the crop taken from every camera (random in training, centred otherwise).
    pub crop_shape: Option<[usize; 2]>,
    /// Whether the crop is random in training.
    pub crop_is_random: bool,
    /// torchvision weights; refused with `use_group_norm`, which would ruin them. Nothing is
    /// downloaded: `lake train` reads them from `--backbone-weights` or torchvision's cache.
    pub pretrained_backbone_weights: Option<String>,
    /// GroupNorm (`C / 16` groups) in the backbone instead of BatchNorm.
    pub use_group_norm: bool,
    /// Keypoints of the spatial softmax (features per camera: twice this).
    pub spatial_softmax_num_keypoints: usize,
    /// One encoder per camera instead of one shared.
    pub use_separate_rgb_encoder_per_camera: bool,
    /// Channels of the U-Net's stages.
    pub down_dims: Vec<usize>,
    /// Kernel of the U-Net's convolutions (odd).
    pub kernel_size: usize,
    /// Groups of the U-Net's GroupNorms.
    pub n_groups: usize,
    /// Size of the diffusion step's embedding.
    pub diffusion_step_embed_dim: usize,
    /// FiLM scales as well as biases.
    pub use_film_scale_modulation: bool,
    /// `DDPM` or `DDIM`.
    pub noise_scheduler_type: String,
    /// Diffusion steps of the forward process.
    pub num_train_timesteps: usize,
    /// `squaredcos_cap_v2`, `linear` or `scaled_linear`.
    pub beta_schedule: String,
    /// First beta of the linear schedules.
    pub beta_start: f64,
    /// Last beta of the linear schedules.
    pub beta_end: f64,
    /// `epsilon` (the noise) or `sample` (the actions).
    pub prediction_type: String,
    /// Clip the predicted actions at every denoising step.
    pub clip_sample: bool,
    /// The clip's bound.
    pub clip_sample_range: f64,
    /// Denoising steps at inference (`None`: `num_train_timesteps`).
    pub num_inference_steps: Option<usize>,
    /// `torch.compile` (LeRobot only).
    pub compile_model: bool,
    /// `torch.compile`'s mode (LeRobot only).
    pub compile_mode: String,
    /// Leave padded actions out of the loss.
    pub do_mask_loss_for_padding: bool,
    /// Adam's learning rate.
    pub optimizer_lr: f64,
    /// Adam's betas.
    pub optimizer_betas: [f64; 2],
    /// Adam's epsilon.
    pub optimizer_eps: f64,
    /// Adam's weight decay (L2, added to the gradient).
    pub optimizer_weight_decay: f64,
    /// The learning-rate schedule (diffusers' names).
    pub scheduler_name: String,
    /// Its warm-up steps.
    pub scheduler_warmup_steps: usize,
}

impl Default for DiffusionConfig {
    fn default() -> Self {
        DiffusionConfig {
            n_obs_steps: 2,
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
            horizon: 16,
            n_action_steps: 8,
            normalization_mapping: OrderedMap(vec![
                (FeatureType::Visual, NormalizationMode::MeanStd),
                (FeatureType::State, NormalizationMode::MinMax),
                (FeatureType::Action, NormalizationMode::MinMax),
            ]),
            drop_n_last_frames: 7,
            vision_backbone: "resnet18".into(),
            resize_shape: None,
            crop_ratio: 1.0,
            crop_shape: None,
            crop_is_random: true,
            pretrained_backbone_weights: None,
            use_group_norm: true,
            spatial_softmax_num_keypoints: 32,
            use_separate_rgb_encoder_per_camera: false,
            down_dims: vec![512, 1024, 2048],
            kernel_size: 5,
            n_groups: 8,
            diffusion_step_embed_dim: 128,
            use_film_scale_modulation: true,
            noise_scheduler_type: "DDPM".into(),
            num_train_timesteps: 100,
            beta_schedule: "squaredcos_cap_v2".into(),
            beta_start: 1e-4,
            beta_end: 0.02,
            prediction_type: "epsilon".into(),
            clip_sample: true,
            clip_sample_range: 1.0,
            num_inference_steps: None,
            compile_model: false,
            compile_mode: "reduce-overhead".into(),
            do_mask_loss_for_padding: false,
            optimizer_lr: 1e-4,
            optimizer_betas: [0.95, 0.999],
            optimizer_eps: 1e-8,
            optimizer_weight_decay: 1e-6,
            scheduler_name: "cosine".into(),
            scheduler_warmup_steps: 500,
        }
    }
}

impl DiffusionConfig {
    /// LeRobot's defaults with the features of a dataset: ACTION entries become
    /// `output_features`, all others `input_features`, both in the given order.
    pub fn with_features(features: &[DatasetFeature]) -> Self {
        let mut config = DiffusionConfig::default();
        for f in features {
            let pf = PolicyFeature { kind: f.kind, shape: f.shape.clone() };
            if f.kind == FeatureType::Action {
                config.output_features.insert(f.name.clone(), pf);
            } else {
                config.input_features.insert(f.name.clone(), pf);
            }
        }
        config
    }

    /// The `observation.state` input, when it is a STATE feature.
    pub fn robot_state_feature(&self) -> Option<&PolicyFeature> {
        self.input_features.get(&OBS_STATE.to_string()).filter(|f| f.kind == FeatureType::State)
    }

    /// The first ENV input.
    pub fn env_state_feature(&self) -> Option<(&str, &PolicyFeature)> {
        env_state_feature(&self.input_features)
    }

    /// The cameras, in order.
    pub fn image_features(&self) -> Vec<(&str, &PolicyFeature)> {
        image_features(&self.input_features)
    }

    /// The `action` output.
    pub fn action_feature(&self) -> Option<&PolicyFeature> {
        self.output_features.get(&ACTION.to_string())
    }

    /// The frame offsets of the observations: the `n_obs_steps` steps up to the current one.
    pub fn observation_delta_indices(&self) -> Vec<i64> {
        (1 - self.n_obs_steps as i64..=0).collect()
    }

    /// The frame offsets of the actions: `horizon` steps from the first observation step on.
    pub fn action_delta_indices(&self) -> Vec<i64> {
        let first = 1 - self.n_obs_steps as i64;
        (first..first + self.horizon as i64).collect()
    }

    /// `delta_timestamps` for a dataset at `fps`, as lerobot-train builds them (`i / fps`
    /// seconds): the observation offsets for every `observation.*` input, the action offsets
    /// for `action`.
    pub fn delta_timestamps(&self, fps: f64) -> Vec<(String, Vec<f64>)> {
        let seconds = |indices: Vec<i64>| indices.into_iter().map(|i| i as f64 / fps).collect::<Vec<_>>();
        let mut out: Vec<(String, Vec<f64>)> = self
            .input_features
            .iter()
            .filter(|(name, _)| name.starts_with("observation"))
            .map(|(name, _)| (name.clone(), seconds(self.observation_delta_indices())))
            .collect();
        out.push((ACTION.to_string(), seconds(self.action_delta_indices())));
        out
    }

    /// The `[H, W]` cameras reach the backbone at: the crop, else the resize, else the camera's.
    pub fn backbone_input_shape(&self) -> Option<[usize; 2]> {
        self.crop_shape.or(self.resize_shape).or_else(|| self.image_features().first().map(|(_, f)| [f.shape[1], f.shape[2]]))
    }

    /// Checks what LeRobot's `DiffusionConfig.__post_init__` and `validate_features` check,
    /// plus what lake's implementation needs (ResNet-18 with GroupNorm, DDPM, no resize).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the field, or [`Error::Features`].
    pub fn validate(&self) -> Result<()> {
        if self.n_obs_steps == 0 {
            return Err(Error::config("n_obs_steps", "must be at least 1"));
        }
        if self.down_dims.is_empty() || self.down_dims.contains(&0) {
            return Err(Error::config("down_dims", "needs at least one stage, each of some channels"));
        }
        let factor = 1usize << self.down_dims.len();
        if self.horizon == 0 || !self.horizon.is_multiple_of(factor) {
            return Err(Error::config(
                "horizon",
                format!("{} must be a multiple of {factor}, the U-Net's downsampling with {} stages", self.horizon, self.down_dims.len()),
            ));
        }
        if self.n_action_steps == 0 || self.n_action_steps > self.horizon + 1 - self.n_obs_steps {
            return Err(Error::config(
                "n_action_steps",
                format!(
                    "{} must be between 1 and horizon − n_obs_steps + 1 = {}",
                    self.n_action_steps,
                    self.horizon + 1 - self.n_obs_steps
                ),
            ));
        }
        if self.vision_backbone != "resnet18" {
            return Err(Error::config("vision_backbone", format!("lake implements resnet18 only, got {:?}", self.vision_backbone)));
        }
        if self.use_group_norm && self.pretrained_backbone_weights.is_some() {
            return Err(Error::config(
                "pretrained_backbone_weights",
                "GroupNorm in place of BatchNorm would ruin pretrained weights: set use_group_norm to false, as LeRobot 0.6.1's defaults do",
            ));
        }
        if !(self.crop_ratio > 0.0 && self.crop_ratio <= 1.0) {
            return Err(Error::config("crop_ratio", format!("{} is not in (0, 1]", self.crop_ratio)));
        }
        if self.resize_shape.is_some() {
            return Err(Error::config(
                "resize_shape",
                "lake serves frames at a size instead (frame_size, or a frame table): leave it null",
            ));
        }
        if self.crop_shape.is_some_and(|[h, w]| h == 0 || w == 0) {
            return Err(Error::config("crop_shape", "must have positive dimensions"));
        }
        if self.kernel_size.is_multiple_of(2) {
            return Err(Error::config("kernel_size", format!("{} must be odd, so that convolutions keep the horizon", self.kernel_size)));
        }
        if self.n_groups == 0 || self.down_dims.iter().any(|d| !d.is_multiple_of(self.n_groups)) {
            return Err(Error::config(
                "n_groups",
                format!("every stage of down_dims {:?} must be a multiple of {}", self.down_dims, self.n_groups),
            ));
        }
        if !self.down_dims[0].is_multiple_of(8) {
            return Err(Error::config(
                "down_dims",
                format!("its first stage ({}) must be a multiple of 8, the groups of the U-Net's last block", self.down_dims[0]),
            ));
        }
        if self.diffusion_step_embed_dim < 4 || !self.diffusion_step_embed_dim.is_multiple_of(2) {
            return Err(Error::config("diffusion_step_embed_dim", "must be even and at least 4"));
        }
        if self.spatial_softmax_num_keypoints == 0 {
            return Err(Error::config("spatial_softmax_num_keypoints", "must be at least 1"));
        }
        if self.noise_scheduler_type != "DDPM" {
            return Err(Error::config("noise_scheduler_type", format!("lake implements DDPM, got {:?}", self.noise_scheduler_type)));
        }
        if !matches!(self.beta_schedule.as_str(), "squaredcos_cap_v2" | "linear" | "scaled_linear") {
            return Err(Error::config(
                "beta_schedule",
                format!("{:?} is not squaredcos_cap_v2, linear or scaled_linear", self.beta_schedule),
            ));
        }
        if self.num_train_timesteps == 0 {
            return Err(Error::config("num_train_timesteps", "must be at least 1"));
        }
        if self.num_inference_steps.is_some_and(|n| n == 0 || n > self.num_train_timesteps) {
            return Err(Error::config(
                "num_inference_steps",
                format!("must be between 1 and num_train_timesteps {}", self.num_train_timesteps),
            ));
        }
        if !matches!(self.prediction_type.as_str(), "epsilon" | "sample") {
            return Err(Error::config("prediction_type", format!("{:?} is not epsilon or sample", self.prediction_type)));
        }
        if self.use_peft {
            return Err(Error::config("use_peft", "PEFT adapters are not supported"));
        }
        self.validate_features()
    }

    /// The feature checks of [`DiffusionConfig::validate`].
    ///
    /// # Errors
    /// [`Error::Features`] naming the problem.
    pub fn validate_features(&self) -> Result<()> {
        let images = self.image_features();
        if images.is_empty() && self.env_state_feature().is_none() {
            return Err(Error::Features("at least one camera or an observation.environment_state input is required".into()));
        }
        if self.robot_state_feature().is_none_or(|f| f.shape.len() != 1 || f.shape[0] == 0) {
            return Err(Error::Features("Diffusion needs an observation.state input of shape [N]".into()));
        }
        let action = self.action_feature().ok_or_else(|| Error::Features("no `action` output feature".into()))?;
        if action.shape.len() != 1 || action.shape[0] == 0 {
            return Err(Error::Features(format!("action must have shape [A], got {:?}", action.shape)));
        }
        for (name, f) in &images {
            if f.shape.len() != 3 || f.shape[0] != 3 || f.shape[1] == 0 || f.shape[2] == 0 {
                return Err(Error::Features(format!("camera {name} must have shape [3, H, W], got {:?}", f.shape)));
            }
            if f.shape != images[0].1.shape {
                return Err(Error::Features(format!(
                    "every camera must have the same shape: {} has {:?}, {} {:?}",
                    images[0].0, images[0].1.shape, name, f.shape
                )));
            }
            if let Some([h, w]) = self.crop_shape
                && (h > f.shape[1] || w > f.shape[2])
            {
                return Err(Error::Features(format!("crop_shape [{h}, {w}] does not fit camera {name} of {:?}", f.shape)));
            }
        }
        Ok(())
    }

    /// Parses a `config.json` written by LeRobot 0.4.4 or 0.6.1 (or lake): `"type"` must be
    /// `"diffusion"`, 0.6.1's `pretrained_revision` (and `gradient_checkpointing` when false) is
    /// ignored, any other unknown key is refused
    /// (as 0.4.4 refuses it), missing keys take their defaults.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a wrong `type`, an unknown field or a wrong value type.
    pub fn from_json(text: &str) -> Result<Self> {
        let mut map: Map<String, Value> = serde_json::from_str(text).map_err(|e| Error::config("config.json", e.to_string()))?;
        match map.remove("type") {
            Some(Value::String(t)) if t == "diffusion" => {}
            Some(other) => return Err(Error::config("type", format!("expected \"diffusion\", found {other}"))),
            None => return Err(Error::config("type", "missing (LeRobot requires it)")),
        }
        map.remove("pretrained_revision");
        // 0.6.1's: lake has no gradient checkpointing, and without it trains the same network.
        match map.remove("gradient_checkpointing") {
            None | Some(Value::Bool(false)) => {}
            Some(other) => return Err(Error::config("gradient_checkpointing", format!("{other}: lake does not checkpoint activations"))),
        }
        serde_json::from_value(Value::Object(map)).map_err(|e| Error::config("config.json", e.to_string()))
    }

    /// `config.json` text: `"type": "diffusion"` then 0.4.4's fields in dataclass order, indent 4.
    pub fn to_json(&self) -> String {
        json_text("diffusion", serde_json::to_value(self).expect("DiffusionConfig serialises"))
    }

    /// The same config with `pretrained_backbone_weights` cleared, as a checkpoint must store
    /// it: LeRobot builds a fresh policy before loading weights and would otherwise try to
    /// download the torchvision weights.
    pub fn for_checkpoint(&self) -> Self {
        DiffusionConfig { pretrained_backbone_weights: None, ..self.clone() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pusht_features() -> Vec<DatasetFeature> {
        vec![
            DatasetFeature::new("observation.image", FeatureType::Visual, [3, 96, 96]),
            DatasetFeature::new(OBS_STATE, FeatureType::State, [2]),
            DatasetFeature::new(ACTION, FeatureType::Action, [2]),
        ]
    }

    #[test]
    fn defaults_round_trip_in_lerobots_key_order() {
        let config = DiffusionConfig { crop_shape: Some([84, 84]), ..DiffusionConfig::with_features(&pusht_features()) };
        config.validate().unwrap();
        let text = config.to_json();
        assert_eq!(DiffusionConfig::from_json(&text).unwrap(), config);
        let keys: Vec<String> = serde_json::from_str::<Map<String, Value>>(&text).unwrap().keys().cloned().collect();
        assert_eq!(keys[..3], ["type", "n_obs_steps", "input_features"]);
        assert_eq!(keys.last().map(String::as_str), Some("scheduler_warmup_steps"));
        assert!(text.contains("\"down_dims\": [\n        512,"), "{text}");
    }

    #[test]
    fn windows_start_at_the_first_observation_step() {
        let config = DiffusionConfig::with_features(&pusht_features());
        assert_eq!(config.observation_delta_indices(), [-1, 0]);
        assert_eq!(config.action_delta_indices(), (-1..15).collect::<Vec<_>>());
        let windows = config.delta_timestamps(10.0);
        let names: Vec<&str> = windows.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["observation.image", OBS_STATE, ACTION]);
        assert_eq!(windows[0].1, [-0.1, 0.0]);
        assert_eq!(windows[2].1.len(), 16);
    }

    #[test]
    fn what_lerobot_or_lake_refuses_is_named() {
        let base = DiffusionConfig::with_features(&pusht_features());
        let refused = |c: DiffusionConfig| c.validate().unwrap_err().to_string();
        assert!(refused(DiffusionConfig { horizon: 12, ..base.clone() }).contains("multiple of 8"));
        assert!(refused(DiffusionConfig { crop_shape: Some([100, 84]), ..base.clone() }).contains("does not fit"));
        assert!(refused(DiffusionConfig { noise_scheduler_type: "DDIM".into(), ..base.clone() }).contains("DDPM"));
        // LeRobot's rule: pretrained weights want BatchNorm, which trains from scratch too.
        let pretrained = Some("ResNet18_Weights.IMAGENET1K_V1".to_string());
        let grouped = DiffusionConfig { pretrained_backbone_weights: pretrained.clone(), ..base.clone() };
        assert!(refused(grouped).contains("set use_group_norm to false"));
        DiffusionConfig { use_group_norm: false, pretrained_backbone_weights: pretrained.clone(), ..base.clone() }.validate().unwrap();
        DiffusionConfig { use_group_norm: false, ..base.clone() }.validate().unwrap();
        let saved = DiffusionConfig { use_group_norm: false, pretrained_backbone_weights: pretrained, ..base.clone() }.for_checkpoint();
        assert_eq!(saved.pretrained_backbone_weights, None);
        assert!(refused(DiffusionConfig { n_action_steps: 16, ..base }).contains("horizon − n_obs_steps + 1 = 15"));
        assert!(DiffusionConfig::from_json(r#"{"type": "act"}"#).unwrap_err().to_string().contains("diffusion"));
        assert!(DiffusionConfig::from_json(r#"{"type": "diffusion", "horizn": 8}"#).is_err());
        let state_less =
            DiffusionConfig::with_features(&pusht_features()[..1].iter().chain(&pusht_features()[2..]).cloned().collect::<Vec<_>>());
        assert!(refused(state_less).contains("observation.state"));
    }
}
