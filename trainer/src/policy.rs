//! The policies `lake train` trains behind one face: their configs, batches, losses, optimizers,
//! learning-rate schedules and checkpoints (ACT, and LeRobot's Diffusion Policy).

use std::path::Path;

use arrow::array::RecordBatch;
use tch::{Device, Kind, Tensor};

use crate::{
    ActConfig, DatasetFeature, DiffusionConfig, Error, Features, OBS_STATE, PolicyFeature, Result, Stats,
    act::{ActBatch, ActPolicy, PolicyOptions, StagedCheckpoint},
    diffusion::{DiffusionBatch, DiffusionPolicy, Draws},
    layers::{CONFIG_FILE, PRETRAINED_MODEL_DIR},
    optim::{Adam, cosine_with_warmup},
};

/// A policy's configuration, as `config.json` names its type.
#[derive(Debug, Clone, PartialEq)]
pub enum PolicyConfig {
    /// LeRobot's ACT.
    Act(Box<ActConfig>),
    /// LeRobot's Diffusion Policy.
    Diffusion(Box<DiffusionConfig>),
}

impl PolicyConfig {
    /// LeRobot's name of the policy type (`config.json`'s `type`).
    pub fn type_name(&self) -> &'static str {
        match self {
            PolicyConfig::Act(_) => "act",
            PolicyConfig::Diffusion(_) => "diffusion",
        }
    }

    /// Reads a `config.json` of either type.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for another type or fields the type refuses.
    pub fn from_json(text: &str) -> Result<Self> {
        let value: serde_json::Value = serde_json::from_str(text).map_err(|e| Error::config("config.json", e.to_string()))?;
        match value.get("type").and_then(serde_json::Value::as_str) {
            Some("diffusion") => Ok(PolicyConfig::Diffusion(Box::new(DiffusionConfig::from_json(text)?))),
            _ => Ok(PolicyConfig::Act(Box::new(ActConfig::from_json(text)?))),
        }
    }

    /// `config.json` text.
    pub fn to_json(&self) -> String {
        match self {
            PolicyConfig::Act(c) => c.to_json(),
            PolicyConfig::Diffusion(c) => c.to_json(),
        }
    }

    /// Replaces the input and output features by a dataset's (actions out, the rest in).
    pub fn set_features(&mut self, features: &[DatasetFeature]) {
        match self {
            PolicyConfig::Act(c) => c.set_features(features),
            PolicyConfig::Diffusion(c) => {
                let fresh = DiffusionConfig::with_features(features);
                (c.input_features, c.output_features) = (fresh.input_features, fresh.output_features);
            }
        }
    }

    /// Checks the config as LeRobot and lake's implementation do.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the field, or [`Error::Features`].
    pub fn validate(&self) -> Result<()> {
        match self {
            PolicyConfig::Act(c) => c.validate(),
            PolicyConfig::Diffusion(c) => c.validate(),
        }
    }

    /// The windows a sample needs, in seconds, as lerobot-train derives them.
    pub fn delta_timestamps(&self, fps: f64) -> Vec<(String, Vec<f64>)> {
        match self {
            PolicyConfig::Act(c) => c.delta_timestamps(fps),
            PolicyConfig::Diffusion(c) => c.delta_timestamps(fps),
        }
    }

    /// The torchvision weights the config starts its camera backbones from
    /// (`pretrained_backbone_weights`), if any.
    pub fn pretrained_backbone_weights(&self) -> Option<&str> {
        match self {
            PolicyConfig::Act(c) => c.pretrained_backbone_weights.as_deref(),
            PolicyConfig::Diffusion(c) => c.pretrained_backbone_weights.as_deref(),
        }
    }

    /// The last steps of every episode that are never sampled (lerobot-train's sampler).
    pub fn drop_n_last_frames(&self) -> u64 {
        match self {
            PolicyConfig::Act(_) => 0,
            PolicyConfig::Diffusion(c) => c.drop_n_last_frames as u64,
        }
    }

    /// `input_features`.
    pub fn input_features(&self) -> &Features {
        match self {
            PolicyConfig::Act(c) => &c.input_features,
            PolicyConfig::Diffusion(c) => &c.input_features,
        }
    }

    /// `output_features`.
    pub fn output_features(&self) -> &Features {
        match self {
            PolicyConfig::Act(c) => &c.output_features,
            PolicyConfig::Diffusion(c) => &c.output_features,
        }
    }

    /// The cameras, in the policy's order.
    pub fn image_features(&self) -> Vec<(&str, &PolicyFeature)> {
        crate::config::image_features(self.input_features())
    }

    /// Sets the base learning rate (and ACT's backbone one) where given, and the device the
    /// checkpoint names.
    pub fn set_optimizer_and_device(&mut self, lr: Option<f64>, lr_backbone: Option<f64>, device: &str) {
        match self {
            PolicyConfig::Act(c) => {
                c.optimizer_lr = lr.unwrap_or(c.optimizer_lr);
                c.optimizer_lr_backbone = lr_backbone.unwrap_or(c.optimizer_lr_backbone);
                c.device = Some(device.to_string());
            }
            PolicyConfig::Diffusion(c) => {
                c.optimizer_lr = lr.unwrap_or(c.optimizer_lr);
                c.device = Some(device.to_string());
            }
        }
    }
}

/// A policy being trained.
#[derive(Debug)]
pub enum Policy {
    /// ACT.
    Act(ActPolicy),
    /// Diffusion.
    Diffusion(DiffusionPolicy),
}

/// A batch as a policy takes it (raw values; the policy normalises them).
#[derive(Debug)]
pub enum Batch {
    /// ACT's: single observations, an action chunk.
    Act(ActBatch),
    /// Diffusion's: windows of observations, the actions from the first of them on.
    Diffusion(DiffusionBatch),
}

/// The objective of one batch (scalars): the loss to back-propagate, and ACT's terms.
#[derive(Debug)]
pub struct Loss {
    /// The loss.
    pub loss: Tensor,
    /// ACT's masked L1.
    pub l1: Option<Tensor>,
    /// ACT's KL divergence, when its VAE ran.
    pub kld: Option<Tensor>,
}

impl Policy {
    /// A fresh policy of `config` normalising with `stats`, drawing its initialisation from
    /// libtorch's generator.
    ///
    /// # Errors
    /// The config's refusals, missing statistics; backbone weights for a Diffusion policy (its
    /// GroupNorm would ruin them).
    pub fn new(config: PolicyConfig, stats: Stats, options: &PolicyOptions) -> Result<Self> {
        match config {
            PolicyConfig::Act(c) => Ok(Policy::Act(ActPolicy::new(*c, stats, options)?)),
            PolicyConfig::Diffusion(c) => {
                if options.backbone_weights.is_some() && c.use_group_norm {
                    return Err(Error::config(
                        "--backbone-weights",
                        "the config's backbone has GroupNorm, which would ruin pretrained weights: set use_group_norm to false",
                    ));
                }
                let policy = DiffusionPolicy::new(&c, stats, options.device, options.kind)?;
                if let Some(path) = &options.backbone_weights {
                    policy.net().load_backbone(path)?;
                }
                Ok(Policy::Diffusion(policy.with_padded_actions(options.padded_actions)))
            }
        }
    }

    /// Loads a checkpoint directory (or its `pretrained_model/`) of either type.
    ///
    /// # Errors
    /// As the policy's `from_pretrained`.
    pub fn from_pretrained(dir: &Path, options: &PolicyOptions) -> Result<Self> {
        let pretrained = if dir.join(CONFIG_FILE).exists() { dir.to_path_buf() } else { dir.join(PRETRAINED_MODEL_DIR) };
        let path = pretrained.join(CONFIG_FILE);
        let text = std::fs::read_to_string(&path).map_err(Error::io(&path))?;
        match PolicyConfig::from_json(&text).map_err(|e| Error::format(&path, e.to_string()))? {
            PolicyConfig::Act(_) => Ok(Policy::Act(ActPolicy::from_pretrained(dir, options)?)),
            PolicyConfig::Diffusion(_) => {
                let policy = DiffusionPolicy::from_pretrained(&pretrained, options.device, options.kind)?;
                Ok(Policy::Diffusion(policy.with_padded_actions(options.padded_actions)))
            }
        }
    }

    /// The configuration.
    pub fn config(&self) -> PolicyConfig {
        match self {
            Policy::Act(p) => PolicyConfig::Act(Box::new(p.config().clone())),
            Policy::Diffusion(p) => PolicyConfig::Diffusion(Box::new(p.net().config().clone())),
        }
    }

    /// Starts from another checkpoint's weights (LeRobot's or lake's) of the same architecture.
    ///
    /// # Errors
    /// The first field or tensor that differs.
    pub fn init_from(&self, dir: &Path) -> Result<()> {
        match self {
            Policy::Act(p) => p.init_from(dir),
            Policy::Diffusion(p) => {
                let pretrained = if dir.join(CONFIG_FILE).exists() { dir.to_path_buf() } else { dir.join(PRETRAINED_MODEL_DIR) };
                p.net().load_model_file(pretrained.join(crate::layers::MODEL_FILE))
            }
        }
    }

    /// LeRobot's optimizer preset for the policy.
    pub fn optimizer(&self) -> Adam {
        match self {
            Policy::Act(p) => Adam::act(p),
            Policy::Diffusion(p) => Adam::diffusion(p),
        }
    }

    /// The base learning rate's factor at update `step` (1-based) of a run of `total` steps:
    /// ACT's is constant, Diffusion's follows diffusers' warm-up cosine schedule.
    pub fn lr_factor(&self, step: u64, total: u64) -> f64 {
        match self {
            Policy::Act(_) => 1.0,
            Policy::Diffusion(p) => cosine_with_warmup(step.saturating_sub(1), p.net().config().scheduler_warmup_steps as u64, total),
        }
    }

    /// The base learning rate of the optimizer's first group.
    pub fn base_lr(&self) -> f64 {
        match self {
            Policy::Act(p) => p.config().optimizer_lr,
            Policy::Diffusion(p) => p.net().config().optimizer_lr,
        }
    }

    /// The loss of a batch: in training mode (dropout, the VAE, a random crop) when `train`.
    ///
    /// # Errors
    /// [`Error::Batch`] when the batch is not of the policy's kind or does not fit it.
    pub fn loss(&self, batch: &Batch, train: bool) -> Result<Loss> {
        match (self, batch) {
            (Policy::Act(p), Batch::Act(b)) => {
                let l = p.forward_loss(b, train)?;
                Ok(Loss { loss: l.loss, l1: Some(l.l1), kld: l.kld })
            }
            (Policy::Diffusion(p), Batch::Diffusion(b)) => {
                Ok(Loss { loss: p.loss_with(b, train, &Draws::default())?, l1: None, kld: None })
            }
            _ => Err(Error::Batch("a batch made for another policy".into())),
        }
    }

    /// Trainable tensors with their keys, in LeRobot's order.
    pub fn named_parameters(&self) -> &[(String, Tensor)] {
        match self {
            Policy::Act(p) => p.named_parameters(),
            Policy::Diffusion(p) => p.net().named_parameters(),
        }
    }

    /// The buffers a training forward moves: a BatchNorm backbone's running statistics and
    /// their counts (none for ACT, whose BatchNorm is frozen, or a GroupNorm backbone).
    pub fn moving_buffers(&self) -> Vec<Tensor> {
        let moving = |key: &str| key.ends_with(".running_mean") || key.ends_with(".running_var") || key.ends_with(".num_batches_tracked");
        match self {
            Policy::Act(_) => Vec::new(),
            Policy::Diffusion(p) => p.net().state_dict().filter(|(k, _)| moving(k)).map(|(_, t)| t.shallow_clone()).collect(),
        }
    }

    /// Every tensor of `model.safetensors`.
    pub fn state_tensors(&self) -> Vec<Tensor> {
        match self {
            Policy::Act(p) => p.state_dict().map(|(_, t)| t.shallow_clone()).collect(),
            Policy::Diffusion(p) => p.net().state_dict().map(|(_, t)| t.shallow_clone()).collect(),
        }
    }

    /// A checkpoint after update `step` of `total` for `dest`, in a temporary directory beside
    /// it (see [`StagedCheckpoint`]); Diffusion's `training_state/` holds the learning-rate
    /// schedule's state too (`scheduler_state.json`, as torch's `LambdaLR` saves it), which
    /// lerobot-train reads on `--resume`.
    ///
    /// # Errors
    /// [`Error::Io`] or [`Error::SafeTensors`].
    pub fn stage_checkpoint(&self, dest: &Path, optimizer: &Adam, step: u64, total: u64) -> Result<StagedCheckpoint> {
        match self {
            Policy::Act(p) => p.stage_checkpoint(dest, Some(optimizer), Some(step)),
            Policy::Diffusion(p) => {
                let staged = crate::checkpoint::stage(dest, |dir| p.save_pretrained(dir), Some(optimizer), Some(step))?;
                let base = self.base_lr();
                let state = serde_json::json!({
                    "base_lrs": [base], "last_epoch": step, "_step_count": step + 1, "_is_initial": false,
                    "_get_lr_called_within_step": false, "_last_lr": [base * self.lr_factor(step + 1, total)], "lr_lambdas": [null],
                });
                let path = staged.path().join(crate::layers::TRAINING_STATE_DIR).join("scheduler_state.json");
                let text = serde_json::to_string_pretty(&state).expect("JSON to memory");
                std::fs::write(&path, text).map_err(Error::io(&path))?;
                Ok(staged)
            }
        }
    }
}

impl Batch {
    /// The batch on `device`, copied from pinned memory without blocking (see
    /// [`ActBatch::to_device`]).
    ///
    /// # Errors
    /// [`Error::Torch`] when a tensor cannot be pinned or copied.
    pub fn to_device(self, device: Device) -> Result<Batch> {
        match self {
            Batch::Act(b) => Ok(Batch::Act(b.to_device(device)?)),
            Batch::Diffusion(b) if device == Device::Cpu => Ok(Batch::Diffusion(b)),
            Batch::Diffusion(b) => {
                let moved = |t: Tensor| -> Result<Tensor> {
                    if t.device() == device {
                        return Ok(t);
                    }
                    Ok(t.f_pin_memory(device)?.f_to_device_(device, t.kind(), true, false)?)
                };
                let maybe = |t: Option<Tensor>| t.map(moved).transpose();
                Ok(Batch::Diffusion(DiffusionBatch {
                    state: moved(b.state)?,
                    images: b.images.into_iter().map(moved).collect::<Result<_>>()?,
                    env_state: maybe(b.env_state)?,
                    action: maybe(b.action)?,
                    action_is_pad: maybe(b.action_is_pad)?,
                }))
            }
        }
    }
}

/// A Diffusion batch from a record batch sampled with the config's windows: `[B, S, …]`
/// observations (cameras `[B, S, 3, H, W]` uint8, from the `[B, S, H, W, 3]` columns made by
/// `camera`), the actions `[B, horizon, A]` and their padding.
///
/// # Errors
/// [`Error::Batch`] for a column that is missing or not windowed as the config says.
pub(crate) fn diffusion_batch(
    batch: &RecordBatch,
    config: &DiffusionConfig,
    mut camera: impl FnMut(&str, [u32; 2]) -> Result<Tensor>,
    column: impl Fn(&str) -> Result<Tensor>,
) -> Result<DiffusionBatch> {
    let (b, s) = (batch.num_rows() as i64, config.n_obs_steps as i64);
    let windowed = |name: &str, t: Tensor, rest: usize| -> Result<Tensor> {
        let size = t.size();
        if size.len() != 2 + rest || size[0] != b || size[1] != s {
            return Err(Error::Batch(format!("`{name}`: shape {size:?}, expected a window of {s} steps per sample")));
        }
        Ok(t)
    };
    let mut images = Vec::new();
    for (name, feature) in config.image_features() {
        let size = [feature.shape[1] as u32, feature.shape[2] as u32];
        let frames = windowed(name, camera(name, size)?, 3)?;
        images.push(frames.permute([0, 1, 4, 2, 3]));
    }
    let env_state = match config.env_state_feature() {
        Some((name, _)) => Some(windowed(name, column(name)?, 1)?),
        None => None,
    };
    Ok(DiffusionBatch {
        state: windowed(OBS_STATE, column(OBS_STATE)?, 1)?,
        images,
        env_state,
        action: Some(column(crate::ACTION)?),
        action_is_pad: Some(column(&format!("{}_is_pad", crate::ACTION))?.to_kind(Kind::Bool)),
    })
}
