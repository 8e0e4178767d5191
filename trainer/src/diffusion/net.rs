//! The network with its checks, draws and variables: [`DiffusionNet`].

use std::path::Path;

use tch::{Device, Kind, Tensor, nn};

use super::model::{Model, ModelInput};
use crate::{
    DiffusionConfig, Error, Result,
    layers::{Registry, ResNetKeys, load_resnet18},
    loss::{PaddedActions, padded_mean},
};

/// The observations of a batch, normalised, each a window of `n_obs_steps` steps.
#[derive(Debug)]
pub struct DiffusionInput {
    /// `observation.state`, `[B, S, D]`.
    pub state: Tensor,
    /// The cameras, `[B, S, N, 3, H, W]` in config order (`None` without cameras).
    pub images: Option<Tensor>,
    /// `observation.environment_state`, `[B, S, E]`, when the config has one.
    pub env_state: Option<Tensor>,
}

/// What a loss computation would otherwise draw from libtorch's generator, given instead (to
/// compare with another implementation).
#[derive(Debug, Default)]
pub struct Draws<'a> {
    /// The noise added to the actions, `[B, horizon, A]`.
    pub noise: Option<&'a Tensor>,
    /// The diffusion step of each sample, `[B]` int64.
    pub timesteps: Option<&'a Tensor>,
    /// Where the training crop starts, `(top, left)`.
    pub crop: Option<(i64, i64)>,
}

/// LeRobot's `DiffusionModel`: the variables (in a `VarStore` whose paths are the state-dict
/// keys) and the network.
pub struct DiffusionNet {
    config: DiffusionConfig,
    device: Device,
    kind: Kind,
    _vs: nn::VarStore,
    params: Vec<(String, Tensor)>,
    buffers: Vec<(String, Tensor)>,
    model: Model,
    padded: PaddedActions,
}

impl std::fmt::Debug for DiffusionNet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiffusionNet").field("device", &self.device).field("parameters", &self.params.len()).finish()
    }
}

impl DiffusionNet {
    /// A freshly initialised network for `config` (validated), PyTorch's and torchvision's
    /// initialisations drawn from libtorch's global generator (seed it with `tch::manual_seed`).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`]/[`Error::Features`] for a config lake refuses.
    pub fn new(config: &DiffusionConfig, device: Device, kind: Kind) -> Result<Self> {
        config.validate()?;
        if !matches!(kind, Kind::Float | Kind::Double) {
            return Err(Error::config("kind", format!("{kind:?} parameters are not supported (Float or Double)")));
        }
        let vs = nn::VarStore::new(device);
        let (model, params, buffers) = {
            let mut r = Registry::new(&vs, kind);
            let model = tch::no_grad(|| Model::new(&mut r, config));
            (model, r.params, r.buffers)
        };
        Ok(DiffusionNet { config: config.clone(), device, kind, _vs: vs, params, buffers, model, padded: PaddedActions::default() })
    }

    /// The same network, its loss counting the padded actions of a chunk as `padded` says
    /// (when the config masks them: `do_mask_loss_for_padding`); [`PaddedActions::Exclude`]
    /// unless set.
    pub fn with_padded_actions(self, padded: PaddedActions) -> Self {
        DiffusionNet { padded, ..self }
    }

    /// Starts every camera's backbone from torchvision ResNet-18 weights in a safetensors file
    /// (torchvision's names; `fc.*` ignored), as LeRobot's `pretrained_backbone_weights` does.
    ///
    /// # Errors
    /// [`Error::Mismatch`] naming a tensor missing, unknown or of another shape.
    pub fn load_backbone(&self, path: impl AsRef<Path>) -> Result<()> {
        let cameras = self.config.image_features().len();
        let prefixes: Vec<String> = match (cameras, self.config.use_separate_rgb_encoder_per_camera) {
            (0, _) => return Err(Error::config("--backbone-weights", "the policy has no camera, so no backbone to start")),
            (n, true) => (0..n).map(|i| format!("diffusion.rgb_encoder.{i}.backbone")).collect(),
            (_, false) => vec!["diffusion.rgb_encoder.backbone".into()],
        };
        prefixes.iter().try_for_each(|prefix| load_resnet18(self.state_dict(), prefix, ResNetKeys::Sequential, path.as_ref()))
    }

    /// The configuration.
    pub fn config(&self) -> &DiffusionConfig {
        &self.config
    }

    /// The parameters' device.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The parameters' dtype.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// Trainable tensors with their keys, in LeRobot's `named_parameters` order.
    pub fn named_parameters(&self) -> &[(String, Tensor)] {
        &self.params
    }

    /// Every tensor of `model.safetensors`: parameters, then buffers (the keypoint grids).
    pub fn state_dict(&self) -> impl Iterator<Item = (&str, &Tensor)> + Clone {
        self.params.iter().chain(&self.buffers).map(|(k, t)| (k.as_str(), t))
    }

    /// The number of trainable scalars.
    pub fn num_parameters(&self) -> i64 {
        self.params.iter().map(|(_, t)| t.numel() as i64).sum()
    }

    /// Copies every tensor of a `model.safetensors` (one LeRobot wrote, for instance) into the
    /// network, refusing one of another architecture.
    ///
    /// # Errors
    /// [`Error::Mismatch`] naming the key and both shapes.
    pub fn load_model_file(&self, path: impl AsRef<Path>) -> Result<()> {
        crate::layers::load_state_file(self.state_dict(), path.as_ref())
    }

    /// Writes every tensor as `model.safetensors`, in the dtypes and layout LeRobot's
    /// `save_pretrained` gives the same weights.
    ///
    /// # Errors
    /// [`Error::Io`] or [`Error::SafeTensors`].
    pub fn save_model_file(&self, path: impl AsRef<Path>) -> Result<()> {
        crate::layers::write_state_file(path.as_ref(), self.state_dict())
    }

    fn prepare(&self, input: &DiffusionInput) -> Result<ModelInput> {
        let c = &self.config;
        let s = c.n_obs_steps as i64;
        let b = input.state.size().first().copied().unwrap_or(0);
        let on_device = |t: &Tensor| t.to_device(self.device).to_kind(self.kind);
        let check = |name: &str, t: &Tensor, want: &[i64]| -> Result<()> {
            if t.size() != want {
                return Err(Error::Batch(format!("{name}: shape {:?}, expected {want:?}", t.size())));
            }
            Ok(())
        };
        let state_dim = c.robot_state_feature().expect("validated").shape[0] as i64;
        check(crate::OBS_STATE, &input.state, &[b, s, state_dim])?;
        let cameras = c.image_features();
        let images = match (&input.images, cameras.first()) {
            (Some(t), Some((_, f))) => {
                check("cameras", t, &[b, s, cameras.len() as i64, 3, f.shape[1] as i64, f.shape[2] as i64])?;
                Some(on_device(t))
            }
            (None, None) => None,
            (Some(_), None) => return Err(Error::Batch("camera frames for a config without cameras".into())),
            (None, Some(_)) => return Err(Error::Batch("the cameras are missing".into())),
        };
        let env_state = match (&input.env_state, c.env_state_feature()) {
            (Some(t), Some((name, f))) => {
                check(name, t, &[b, s, f.shape[0] as i64])?;
                Some(on_device(t))
            }
            (None, None) => None,
            (Some(_), None) => return Err(Error::Batch("an environment state for a config without one".into())),
            (None, Some((name, _))) => return Err(Error::Batch(format!("{name} is missing"))),
        };
        Ok(ModelInput { state: on_device(&input.state), images, env_state })
    }

    /// The training loss of normalised `actions` (`[B, horizon, A]`): noise and diffusion steps
    /// drawn from libtorch's generator (after the crop, when `train` crops at random), padded
    /// actions (`pad`, bool `[B, horizon]`) left out when the config says so.
    ///
    /// # Errors
    /// [`Error::Batch`] when the inputs do not fit the config.
    pub fn loss(&self, input: &DiffusionInput, actions: &Tensor, pad: Option<&Tensor>, train: bool) -> Result<Tensor> {
        self.loss_with(input, actions, pad, train, &Draws::default())
    }

    /// [`DiffusionNet::loss`] with some of its random draws given.
    ///
    /// # Errors
    /// [`Error::Batch`] when the inputs or the draws do not fit the config.
    pub fn loss_with(&self, input: &DiffusionInput, actions: &Tensor, pad: Option<&Tensor>, train: bool, draws: &Draws) -> Result<Tensor> {
        let x = self.prepare(input)?;
        let b = x.state.size()[0];
        let a = self.config.action_feature().expect("validated").shape[0] as i64;
        let horizon = self.model.horizon();
        if actions.size() != [b, horizon, a] {
            return Err(Error::Batch(format!("action: shape {:?}, expected [{b}, {horizon}, {a}]", actions.size())));
        }
        let actions = actions.to_device(self.device).to_kind(self.kind);
        let crop = match (draws.crop, &x.images) {
            (Some(at), _) => Some(at),
            (None, Some(images)) if train && self.config.crop_is_random => self.model.random_crop(images),
            _ => None,
        };
        let noise = match draws.noise {
            Some(n) if n.size() != actions.size() => {
                return Err(Error::Batch(format!("noise: shape {:?}, expected {:?}", n.size(), actions.size())));
            }
            Some(n) => n.to_device(self.device).to_kind(self.kind),
            None => Tensor::randn(actions.size(), (self.kind, self.device)),
        };
        let timesteps = match draws.timesteps {
            Some(t) if t.size() != [b] => return Err(Error::Batch(format!("timesteps: shape {:?}, expected [{b}]", t.size()))),
            Some(t) => t.to_device(self.device).to_kind(Kind::Int64),
            None => Tensor::randint(self.model.ddpm.train_steps(), [b], (Kind::Int64, self.device)),
        };
        let pad = match pad {
            Some(p) if p.size() != [b, horizon] => {
                return Err(Error::Batch(format!("action_is_pad: shape {:?}, expected [{b}, {horizon}]", p.size())));
            }
            Some(p) if self.config.do_mask_loss_for_padding => Some(p.to_device(self.device)),
            _ => None,
        };
        let errors = self.model.squared_errors(&x, &actions, &noise, &timesteps, crop, train);
        Ok(padded_mean(&errors, pad.as_ref(), self.padded))
    }

    /// The normalised actions `[B, n_action_steps, A]` from the current observation step on,
    /// denoised from noise drawn from libtorch's generator; no gradients.
    ///
    /// # Errors
    /// [`Error::Batch`] when the inputs do not fit the config.
    pub fn predict(&self, input: &DiffusionInput) -> Result<Tensor> {
        let shape = self.sample_shape(input);
        let start = Tensor::randn(shape.as_slice(), (self.kind, self.device));
        let (kind, device) = (self.kind, self.device);
        self.predict_from(input, start, |_| Tensor::randn(shape.as_slice(), (kind, device)))
    }

    /// [`DiffusionNet::predict`] from the given starting noise `[B, horizon, A]` and the noise of
    /// every reverse step but the last, `[steps − 1, B, horizon, A]` in the order taken.
    ///
    /// # Errors
    /// [`Error::Batch`] when the inputs or the noise do not fit the config.
    pub fn predict_with(&self, input: &DiffusionInput, start: &Tensor, steps_noise: &Tensor) -> Result<Tensor> {
        let shape = self.sample_shape(input);
        let steps = self.model.inference_steps();
        let want: Vec<i64> = std::iter::once(steps - 1).chain(shape.iter().copied()).collect();
        if start.size() != shape || steps_noise.size() != want {
            return Err(Error::Batch(format!(
                "noise: shapes {:?} and {:?}, expected {shape:?} and {want:?}",
                start.size(),
                steps_noise.size()
            )));
        }
        let on = |t: &Tensor| t.to_device(self.device).to_kind(self.kind);
        let steps_noise = on(steps_noise);
        self.predict_from(input, on(start), |k| steps_noise.get(k as i64))
    }

    fn sample_shape(&self, input: &DiffusionInput) -> Vec<i64> {
        let a = self.config.action_feature().expect("validated").shape[0] as i64;
        vec![input.state.size().first().copied().unwrap_or(0), self.model.horizon(), a]
    }

    fn predict_from(&self, input: &DiffusionInput, start: Tensor, noise: impl FnMut(usize) -> Tensor) -> Result<Tensor> {
        tch::no_grad(|| {
            let x = self.prepare(input)?;
            Ok(self.model.sample(&x, start, noise))
        })
    }
}
