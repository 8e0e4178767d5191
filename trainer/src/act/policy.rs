//! The policy: its variables under LeRobot's names, normalisation, loss and inference.

use std::path::{Path, PathBuf};

use tch::{Device, Kind, Tensor, nn};

use super::model::{Model, ModelInput};
use crate::layers::{Norm, Registry, ResNetKeys, apply, load_resnet18};
use crate::loss::{PaddedActions, padded_mean};
use crate::{ActConfig, Error, FeatureType, Processors, Result, Stats};

/// Where and how a policy is built.
#[derive(Debug, Clone)]
pub struct PolicyOptions {
    /// The device of the parameters; batches are moved there.
    pub device: Device,
    /// Parameter dtype: `Float` (LeRobot's) or `Double`. Checkpoints are always f32.
    pub kind: Kind,
    /// A local file of torchvision ResNet-18 weights (torchvision's `.pth`, or safetensors with
    /// its names: `conv1.weight`, `layer1.0.bn1.running_mean`, …; `fc.*` and
    /// `num_batches_tracked` are ignored) to start the backbone from. Nothing is ever
    /// downloaded; without it the backbone starts from torchvision's random init, whatever the
    /// config names (`lake train` refuses that; see `train::train`).
    pub backbone_weights: Option<PathBuf>,
    /// How the loss counts the actions of a chunk that ran past its episode's end.
    pub padded_actions: PaddedActions,
}

impl Default for PolicyOptions {
    fn default() -> Self {
        PolicyOptions { device: Device::Cpu, kind: Kind::Float, backbone_weights: None, padded_actions: PaddedActions::default() }
    }
}

/// One training or inference batch of **raw** (unnormalised) values; the policy normalises
/// them with its checkpoint's statistics.
#[derive(Debug)]
pub struct ActBatch {
    /// `observation.state`, `[B, S]` (needed when the config has a robot state).
    pub state: Option<Tensor>,
    /// One `[B, 3, H, W]` tensor per camera, in the config's camera order: float in [0, 1], or
    /// uint8 (divided by 255 on the policy's device).
    pub images: Vec<Tensor>,
    /// `observation.environment_state`, `[B, E]` (needed when the config has one).
    pub env_state: Option<Tensor>,
    /// `action`, `[B, chunk_size, A]` (needed for the loss).
    pub action: Option<Tensor>,
    /// `action_is_pad`, bool `[B, chunk_size]`: `true` where the chunk ran past its episode's
    /// end. All `false` when absent.
    pub action_is_pad: Option<Tensor>,
}

impl ActBatch {
    /// The batch on `device` with its dtypes kept (uint8 frames travel as uint8 and become
    /// floats on the device). To a GPU, each tensor is copied from pinned memory without
    /// blocking the calling thread, so the copy overlaps the step that runs meanwhile.
    ///
    /// # Errors
    /// [`Error::Torch`] when a tensor cannot be pinned or copied.
    pub fn to_device(self, device: Device) -> Result<ActBatch> {
        if device == Device::Cpu {
            return Ok(self);
        }
        let moved = |t: Tensor| -> Result<Tensor> {
            if t.device() == device {
                return Ok(t);
            }
            Ok(t.f_pin_memory(device)?.f_to_device_(device, t.kind(), true, false)?)
        };
        let maybe = |t: Option<Tensor>| t.map(moved).transpose();
        Ok(ActBatch {
            state: maybe(self.state)?,
            images: self.images.into_iter().map(moved).collect::<Result<_>>()?,
            env_state: maybe(self.env_state)?,
            action: maybe(self.action)?,
            action_is_pad: maybe(self.action_is_pad)?,
        })
    }
}

/// The training objective of one batch (scalars).
#[derive(Debug)]
pub struct ActLoss {
    /// `l1 + kl_weight · kld` (or `l1` without the VAE); call `backward` on it.
    pub loss: Tensor,
    /// The L1 error of the chunk's actions, the padded ones counted as
    /// [`PolicyOptions::padded_actions`] says.
    pub l1: Tensor,
    /// Mean over the batch of the KL divergence summed over the latent, when the VAE ran.
    pub kld: Option<Tensor>,
}

struct Norms {
    state: Option<Norm>,
    env: Option<Norm>,
    images: Vec<Option<Norm>>,
    action: Option<Norm>,
    action_out: Option<Norm>,
}

/// LeRobot's `ACTPolicy`: the network plus the normalisation of its processors.
pub struct ActPolicy {
    pub(super) config: ActConfig,
    pub(super) processors: Processors,
    options: PolicyOptions,
    vs: nn::VarStore,
    model: Model,
    params: Vec<(String, Tensor)>,
    buffers: Vec<(String, Tensor)>,
    norms: Norms,
}

impl std::fmt::Debug for ActPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ActPolicy")
            .field("device", &self.options.device)
            .field("kind", &self.options.kind)
            .field("parameters", &self.params.len())
            .field("buffers", &self.buffers.len())
            .finish()
    }
}

impl ActPolicy {
    /// A freshly initialised policy for `config` (validated) normalising with `stats`, which
    /// must hold what `config.normalization_mapping` needs for every input and output feature.
    ///
    /// Initialisation follows LeRobot (PyTorch defaults, xavier-uniform for the transformer's
    /// matrices, kaiming-normal ResNet convs, frozen BatchNorm at identity) and draws from
    /// libtorch's global generator: seed it with `tch::manual_seed` first.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`]/[`Error::Features`] for a config ACT refuses, [`Error::Stats`]
    /// for missing statistics, [`Error::Mismatch`] for backbone weights that do not fit.
    pub fn new(config: ActConfig, stats: Stats, options: &PolicyOptions) -> Result<Self> {
        let processors = Processors::new(&config, stats);
        let policy = Self::build(config, processors, options)?;
        if let Some(path) = &options.backbone_weights {
            policy.load_backbone(path)?;
        }
        Ok(policy)
    }

    pub(super) fn build(config: ActConfig, processors: Processors, options: &PolicyOptions) -> Result<Self> {
        config.validate()?;
        if !matches!(options.kind, Kind::Float | Kind::Double) {
            return Err(Error::config("kind", format!("{:?} parameters are not supported (Float or Double)", options.kind)));
        }
        processors.normalizer.check()?;
        processors.unnormalizer.check()?;
        let vs = nn::VarStore::new(options.device);
        let (model, params, buffers) = {
            let mut r = Registry::new(&vs, options.kind);
            let model = tch::no_grad(|| Model::new(&mut r, &config));
            (model, r.params, r.buffers)
        };
        let (dev, kind) = (options.device, options.kind);
        let n = &processors.normalizer;
        let norms = Norms {
            state: match config.robot_state_feature() {
                Some(f) => Norm::build(n, crate::OBS_STATE, f.kind, dev, kind)?,
                None => None,
            },
            env: match config.env_state_feature() {
                Some((name, f)) => Norm::build(n, name, f.kind, dev, kind)?,
                None => None,
            },
            images: config.image_features().iter().map(|(name, f)| Norm::build(n, name, f.kind, dev, kind)).collect::<Result<_>>()?,
            action: Norm::build(n, crate::ACTION, FeatureType::Action, dev, kind)?,
            action_out: Norm::build(&processors.unnormalizer, crate::ACTION, FeatureType::Action, dev, kind)?,
        };
        Ok(ActPolicy { config, processors, options: options.clone(), vs, model, params, buffers, norms })
    }

    /// The same policy, its loss counting the padded actions of a chunk as `padded` says.
    pub fn with_padded_actions(self, padded: PaddedActions) -> Self {
        ActPolicy { options: PolicyOptions { padded_actions: padded, ..self.options.clone() }, ..self }
    }

    /// The configuration.
    pub fn config(&self) -> &ActConfig {
        &self.config
    }

    /// The normaliser and unnormaliser (with their statistics).
    pub fn processors(&self) -> &Processors {
        &self.processors
    }

    /// The parameters' device.
    pub fn device(&self) -> Device {
        self.options.device
    }

    /// The parameters' dtype.
    pub fn kind(&self) -> Kind {
        self.options.kind
    }

    /// The variable store holding every parameter and buffer under its state-dict key.
    pub fn var_store(&self) -> &nn::VarStore {
        &self.vs
    }

    /// Trainable tensors with their keys, in LeRobot's `named_parameters` order.
    pub fn named_parameters(&self) -> &[(String, Tensor)] {
        &self.params
    }

    /// Buffers (frozen BatchNorm, `vae_encoder_pos_enc`) with their keys.
    pub fn named_buffers(&self) -> &[(String, Tensor)] {
        &self.buffers
    }

    /// Every tensor of `model.safetensors`: parameters, then buffers.
    pub fn state_dict(&self) -> impl Iterator<Item = (&str, &Tensor)> + Clone {
        self.params.iter().chain(&self.buffers).map(|(k, t)| (k.as_str(), t))
    }

    /// The number of trainable scalars.
    pub fn num_parameters(&self) -> i64 {
        self.params.iter().map(|(_, t)| t.numel() as i64).sum()
    }

    fn to_device(&self, t: &Tensor, what: &str) -> Result<Tensor> {
        let t = t.to_device(self.options.device);
        match t.kind() {
            Kind::Uint8 if what.starts_with("camera") => Ok(t.to_kind(Kind::Float).to_kind(self.options.kind) / 255.0),
            Kind::Float | Kind::Double | Kind::Half | Kind::BFloat16 => Ok(t.to_kind(self.options.kind)),
            k => Err(Error::Batch(format!(
                "{what}: dtype {k:?} (expected float{})",
                if what.starts_with("camera") { " or uint8" } else { "" }
            ))),
        }
    }

    /// Checks shapes, moves to the device and normalises.
    fn prepare(&self, batch: &ActBatch, need_action: bool) -> Result<ModelInput> {
        let c = &self.config;
        let cams = c.image_features();
        if batch.images.len() != cams.len() {
            return Err(Error::Batch(format!(
                "{} camera tensors for {} cameras ({:?})",
                batch.images.len(),
                cams.len(),
                cams.iter().map(|c| c.0).collect::<Vec<_>>()
            )));
        }
        let mut b: Option<i64> = None;
        let mut same_b = |name: &str, t: &Tensor| -> Result<()> {
            let n = t.size().first().copied().unwrap_or(0);
            match b {
                Some(b) if b != n => Err(Error::Batch(format!("{name}: batch size {n}, expected {b}"))),
                _ => {
                    b = Some(n);
                    Ok(())
                }
            }
        };
        let mut images = Vec::with_capacity(cams.len());
        for ((name, _), (img, norm)) in cams.iter().zip(batch.images.iter().zip(&self.norms.images)) {
            let s = img.size();
            if s.len() != 4 || s[1] != 3 || s[2] == 0 || s[3] == 0 {
                return Err(Error::Batch(format!("camera {name}: shape {s:?}, expected [B, 3, H, W]")));
            }
            same_b(name, img)?;
            images.push(apply(norm, self.to_device(img, &format!("camera {name}"))?));
        }
        let vector = |name: &str, t: &Option<Tensor>, dim: Option<usize>, norm: &Option<Norm>| -> Result<Option<Tensor>> {
            let Some(dim) = dim else { return Ok(None) };
            let t = t.as_ref().ok_or_else(|| Error::Batch(format!("{name} is missing")))?;
            if t.size() != [t.size().first().copied().unwrap_or(0), dim as i64] {
                return Err(Error::Batch(format!("{name}: shape {:?}, expected [B, {dim}]", t.size())));
            }
            Ok(Some(apply(norm, self.to_device(t, name)?)))
        };
        let state = vector(crate::OBS_STATE, &batch.state, c.robot_state_feature().map(|f| f.shape[0]), &self.norms.state)?;
        let env_state = vector(crate::OBS_ENV_STATE, &batch.env_state, c.env_state_feature().map(|(_, f)| f.shape[0]), &self.norms.env)?;
        for (name, t) in [(crate::OBS_STATE, &state), (crate::OBS_ENV_STATE, &env_state)] {
            if let Some(t) = t {
                same_b(name, t)?;
            }
        }
        let b = b.expect("validated: a camera or an environment state");
        let (chunk, a) = (c.chunk_size as i64, c.action_feature().expect("validated").shape[0] as i64);
        let action = match &batch.action {
            Some(t) if t.size() != [b, chunk, a] => {
                return Err(Error::Batch(format!("action: shape {:?}, expected [{b}, {chunk}, {a}]", t.size())));
            }
            Some(t) => Some(apply(&self.norms.action, self.to_device(t, "action")?)),
            None if need_action => return Err(Error::Batch("action is missing (the loss needs it)".into())),
            None => None,
        };
        let action_is_pad = match &batch.action_is_pad {
            Some(p) if p.size() != [b, chunk] || p.kind() != Kind::Bool => {
                return Err(Error::Batch(format!("action_is_pad: {:?} {:?}, expected bool [{b}, {chunk}]", p.kind(), p.size())));
            }
            Some(p) => Some(p.to_device(self.options.device)),
            None => None,
        };
        Ok(ModelInput { state, env_state, images, action, action_is_pad })
    }

    /// The loss of a batch (`ACTPolicy.forward`): dropout and the VAE encoder run when
    /// `train`; otherwise z = 0 and the loss is the L1 alone (LeRobot 0.4.4 cannot compute it
    /// in eval mode with the VAE; this is what lake reports as validation L1).
    ///
    /// # Errors
    /// [`Error::Batch`] when the batch does not fit the config.
    pub fn forward_loss(&self, batch: &ActBatch, train: bool) -> Result<ActLoss> {
        self.forward_loss_with_noise(batch, train, None)
    }

    /// [`ActPolicy::forward_loss`] with the VAE's ε given (`[B, latent_dim]`) instead of drawn
    /// from libtorch's generator, for comparisons with another implementation.
    ///
    /// # Errors
    /// [`Error::Batch`] when the batch does not fit the config or `noise` has the wrong shape.
    pub fn forward_loss_with_noise(&self, batch: &ActBatch, train: bool, noise: Option<&Tensor>) -> Result<ActLoss> {
        let x = self.prepare(batch, true)?;
        let b = x.action.as_ref().expect("prepare checked").size()[0];
        if let Some(n) = noise
            && n.size() != [b, self.config.latent_dim as i64]
        {
            return Err(Error::Batch(format!("noise: shape {:?}, expected [{b}, {}]", n.size(), self.config.latent_dim)));
        }
        let (actions_hat, dist) = self.model.forward(&x, train, noise);
        let action = x.action.as_ref().expect("prepare checked");
        let l1 = padded_mean(&(action - &actions_hat).abs(), x.action_is_pad.as_ref(), self.options.padded_actions);
        let (loss, kld) = match dist {
            Some((mu, log_sigma_x2)) => {
                let kld = ((log_sigma_x2.shallow_clone() + 1.0 - mu.pow_tensor_scalar(2) - log_sigma_x2.exp()) * -0.5)
                    .sum_dim_intlist(-1, false, None::<Kind>)
                    .mean(None::<Kind>);
                (&l1 + &kld * self.config.kl_weight, Some(kld))
            }
            None => (l1.shallow_clone(), None),
        };
        Ok(ActLoss { loss, l1, kld })
    }

    /// `predict_action_chunk`: eval mode (z = 0, no dropout), no gradients; the actions
    /// `[B, chunk_size, A]` in normalised units.
    ///
    /// # Errors
    /// [`Error::Batch`] when the batch does not fit the config.
    pub fn predict_action_chunk(&self, batch: &ActBatch) -> Result<Tensor> {
        tch::no_grad(|| {
            let x = self.prepare(batch, false)?;
            Ok(self.model.forward(&x, false, None).0)
        })
    }

    /// Normalised actions back to the dataset's units (the postprocessor's unnormaliser).
    pub fn unnormalize_action(&self, actions: &Tensor) -> Tensor {
        match &self.norms.action_out {
            Some(n) => n.unnormalize(actions),
            None => actions.shallow_clone(),
        }
    }

    /// [`ActPolicy::predict_action_chunk`] in the dataset's units.
    ///
    /// # Errors
    /// As [`ActPolicy::predict_action_chunk`].
    pub fn predict_actions(&self, batch: &ActBatch) -> Result<Tensor> {
        let a = self.predict_action_chunk(batch)?;
        Ok(tch::no_grad(|| self.unnormalize_action(&a)))
    }

    /// Starts the backbone from torchvision ResNet-18 weights in a safetensors file.
    fn load_backbone(&self, path: &Path) -> Result<()> {
        load_resnet18(self.state_dict(), "model.backbone", ResNetKeys::Named, path)
    }
}

/// Whether a CUDA device can be used, loading `libtorch_cuda.so` first when the binary was
/// linked without it (its linker dropped the library; see the crate's build script).
pub fn cuda_is_available() -> bool {
    load_libtorch_cuda();
    tch::Cuda::is_available()
}

/// Loads `libtorch_cuda.so` (from the directories `LD_LIBRARY_PATH` names) so that libtorch
/// registers CUDA; true when it is loaded (or was already).
pub fn load_libtorch_cuda() -> bool {
    let name = c"libtorch_cuda.so";
    // SAFETY: dlopen with a NUL-terminated name; the handle is intentionally kept open for the
    // life of the process, as libtorch's registrations must stay.
    let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    !handle.is_null()
}
