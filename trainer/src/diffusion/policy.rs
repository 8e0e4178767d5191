//! LeRobot's `DiffusionPolicy` with its processors: raw batches normalised by the checkpoint's
//! statistics (MIN_MAX state and action, MEAN_STD cameras by default), actions back in the
//! dataset's units, and the `pretrained_model` files LeRobot loads.

use std::path::Path;

use tch::{Device, Kind, Tensor};

use super::net::{DiffusionInput, DiffusionNet, Draws};
use crate::{
    DiffusionConfig, Error, FeatureType, Processors, Result, Stats,
    layers::{CONFIG_FILE, MODEL_FILE, Norm, apply},
    loss::PaddedActions,
};

/// One batch in the dataset's units, each observation a window of `n_obs_steps` steps.
#[derive(Debug)]
pub struct DiffusionBatch {
    /// `observation.state`, `[B, S, D]`.
    pub state: Tensor,
    /// One `[B, S, 3, H, W]` tensor per camera, in config order: float in [0, 1], or uint8
    /// (divided by 255 on the policy's device).
    pub images: Vec<Tensor>,
    /// `observation.environment_state`, `[B, S, E]`, when the config has one.
    pub env_state: Option<Tensor>,
    /// `action`, `[B, horizon, A]` (needed for the loss).
    pub action: Option<Tensor>,
    /// `action_is_pad`, bool `[B, horizon]`.
    pub action_is_pad: Option<Tensor>,
}

/// The network with the normalisation of its processors.
pub struct DiffusionPolicy {
    net: DiffusionNet,
    processors: Processors,
    state: Option<Norm>,
    images: Vec<Option<Norm>>,
    env: Option<Norm>,
    action: Option<Norm>,
    action_out: Option<Norm>,
}

impl std::fmt::Debug for DiffusionPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiffusionPolicy").field("net", &self.net).finish()
    }
}

impl DiffusionPolicy {
    /// A freshly initialised policy for `config` normalising with `stats`, which must hold what
    /// `normalization_mapping` needs for every input and output feature.
    ///
    /// # Errors
    /// As [`DiffusionNet::new`]; [`Error::Stats`] for missing statistics.
    pub fn new(config: &DiffusionConfig, stats: Stats, device: Device, kind: Kind) -> Result<Self> {
        Self::build(DiffusionNet::new(config, device, kind)?, Processors::new(config, stats))
    }

    /// The same policy, its loss counting the padded actions of a chunk as `padded` says
    /// (when the config masks them: `do_mask_loss_for_padding`).
    pub fn with_padded_actions(self, padded: PaddedActions) -> Self {
        DiffusionPolicy { net: self.net.with_padded_actions(padded), ..self }
    }

    fn build(net: DiffusionNet, processors: Processors) -> Result<Self> {
        processors.normalizer.check()?;
        processors.unnormalizer.check()?;
        let (c, device, kind) = (net.config().clone(), net.device(), net.kind());
        let n = &processors.normalizer;
        let state = Norm::build(n, crate::OBS_STATE, FeatureType::State, device, kind)?;
        let images = c.image_features().iter().map(|(name, f)| Norm::build(n, name, f.kind, device, kind)).collect::<Result<_>>()?;
        let env = match c.env_state_feature() {
            Some((name, f)) => Norm::build(n, name, f.kind, device, kind)?,
            None => None,
        };
        let action = Norm::build(n, crate::ACTION, FeatureType::Action, device, kind)?;
        let action_out = Norm::build(&processors.unnormalizer, crate::ACTION, FeatureType::Action, device, kind)?;
        Ok(DiffusionPolicy { net, processors, state, images, env, action, action_out })
    }

    /// Loads a `pretrained_model` directory LeRobot (0.4.4 or 0.6.1) or lake wrote: its config,
    /// processor statistics and every tensor of `model.safetensors`.
    ///
    /// # Errors
    /// [`Error::Io`]/[`Error::Format`] for missing or malformed files, [`Error::Mismatch`]
    /// naming a tensor of another architecture.
    pub fn from_pretrained(dir: impl AsRef<Path>, device: Device, kind: Kind) -> Result<Self> {
        let dir = dir.as_ref();
        let path = dir.join(CONFIG_FILE);
        let text = std::fs::read_to_string(&path).map_err(Error::io(&path))?;
        let config = DiffusionConfig::from_json(&text).map_err(|e| Error::format(&path, e.to_string()))?;
        let net = DiffusionNet::new(&config, device, kind)?;
        net.load_model_file(dir.join(MODEL_FILE))?;
        Self::build(net, Processors::read(dir)?)
    }

    /// Writes `config.json` (every 0.4.4 field, so that a newer LeRobot does not fill in its
    /// own defaults), `model.safetensors` (every parameter and buffer, f32; BatchNorm's counters
    /// int64) and the processor files into `dir`, as LeRobot's `save_pretrained` plus the
    /// processors'.
    ///
    /// # Errors
    /// [`Error::Io`] or [`Error::SafeTensors`].
    pub fn save_pretrained(&self, dir: impl AsRef<Path>) -> Result<()> {
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir).map_err(Error::io(dir))?;
        let config = self.net.config();
        let path = dir.join(CONFIG_FILE);
        std::fs::write(&path, config.for_checkpoint().to_json()).map_err(Error::io(&path))?;
        self.net.save_model_file(dir.join(MODEL_FILE))?;
        self.processors.write(dir, config.device.as_deref().unwrap_or("cpu"))
    }

    /// The network.
    pub fn net(&self) -> &DiffusionNet {
        &self.net
    }

    /// The normaliser and unnormaliser (with their statistics).
    pub fn processors(&self) -> &Processors {
        &self.processors
    }

    fn on_device(&self, t: &Tensor, what: &str) -> Result<Tensor> {
        let t = t.to_device(self.net.device());
        match t.kind() {
            Kind::Uint8 if what.starts_with("camera") => Ok(t.to_kind(Kind::Float).to_kind(self.net.kind()) / 255.0),
            Kind::Float | Kind::Double | Kind::Half | Kind::BFloat16 => Ok(t.to_kind(self.net.kind())),
            k => Err(Error::Batch(format!("{what}: dtype {k:?} (expected float)"))),
        }
    }

    /// The batch's observations as the network takes them: normalised, cameras stacked.
    ///
    /// # Errors
    /// [`Error::Batch`] for a camera count or dtype that does not fit.
    pub fn normalize(&self, batch: &DiffusionBatch) -> Result<DiffusionInput> {
        let cameras = self.net.config().image_features();
        if batch.images.len() != cameras.len() {
            return Err(Error::Batch(format!("{} camera tensors for {} cameras", batch.images.len(), cameras.len())));
        }
        let images = cameras
            .iter()
            .zip(batch.images.iter().zip(&self.images))
            .map(|((name, _), (img, norm))| Ok(apply(norm, self.on_device(img, &format!("camera {name}"))?)))
            .collect::<Result<Vec<_>>>()?;
        let env_state = match &batch.env_state {
            Some(t) => Some(apply(&self.env, self.on_device(t, crate::OBS_ENV_STATE)?)),
            None => None,
        };
        Ok(DiffusionInput {
            state: apply(&self.state, self.on_device(&batch.state, crate::OBS_STATE)?),
            images: (!images.is_empty()).then(|| Tensor::stack(&images, 2)),
            env_state,
        })
    }

    /// The training loss of a batch (normalised as LeRobot's preprocessor does first), its draws
    /// from libtorch's generator unless given.
    ///
    /// # Errors
    /// [`Error::Batch`] when the batch does not fit the config, or has no action.
    pub fn loss_with(&self, batch: &DiffusionBatch, train: bool, draws: &Draws) -> Result<Tensor> {
        let input = self.normalize(batch)?;
        let action = batch.action.as_ref().ok_or_else(|| Error::Batch("action is missing (the loss needs it)".into()))?;
        let action = apply(&self.action, self.on_device(action, crate::ACTION)?);
        self.net.loss_with(&input, &action, batch.action_is_pad.as_ref(), train, draws)
    }

    /// Normalised actions back in the dataset's units (the postprocessor's unnormaliser).
    pub fn unnormalize_action(&self, actions: &Tensor) -> Tensor {
        match &self.action_out {
            Some(n) => n.unnormalize(actions),
            None => actions.shallow_clone(),
        }
    }

    /// The actions `[B, n_action_steps, A]` in the dataset's units, sampled from the given
    /// starting noise and reverse-step draws ([`DiffusionNet::predict_with`]).
    ///
    /// # Errors
    /// As [`DiffusionNet::predict_with`].
    pub fn predict_actions_with(&self, batch: &DiffusionBatch, start: &Tensor, steps_noise: &Tensor) -> Result<Tensor> {
        let actions = self.net.predict_with(&self.normalize(batch)?, start, steps_noise)?;
        Ok(tch::no_grad(|| self.unnormalize_action(&actions)))
    }

    /// [`DiffusionPolicy::predict_actions_with`] with the noise drawn from libtorch's generator.
    ///
    /// # Errors
    /// As [`DiffusionNet::predict`].
    pub fn predict_actions(&self, batch: &DiffusionBatch) -> Result<Tensor> {
        let actions = self.net.predict(&self.normalize(batch)?)?;
        Ok(tch::no_grad(|| self.unnormalize_action(&actions)))
    }
}
