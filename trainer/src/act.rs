//! ACT on libtorch: [`ActPolicy`] (network, normalisation, loss, inference, checkpoints) and
//! [`Adam`] (LeRobot's optimizer presets; ACT's is [`Adam::act`]).
//!
//! Variables live in a `tch::nn::VarStore` whose paths are LeRobot's state-dict keys
//! (`model.backbone.layer1.0.conv1.weight`, `model.encoder.layers.0.self_attn.in_proj_weight`,
//! …). The frozen BatchNorm tensors and `model.vae_encoder_pos_enc` are non-trainable
//! variables, as they are buffers in LeRobot.
//!
//! ```no_run
//! use lake_trainer::act::{ActBatch, ActPolicy, Adam, PolicyOptions};
//! use lake_trainer::{ActConfig, DatasetFeature, FeatureType, Stats};
//! use tch::{Kind, Tensor};
//!
//! let features = [
//!     DatasetFeature::new("observation.state", FeatureType::State, [6]),
//!     DatasetFeature::new("action", FeatureType::Action, [6]),
//!     DatasetFeature::new("observation.images.front", FeatureType::Visual, [3, 36, 48]),
//! ];
//! let config = ActConfig { chunk_size: 10, n_action_steps: 10, ..ActConfig::with_features(&features) };
//! let mut stats = Stats::new();
//! stats.set_mean_std("observation.state", &[0.0; 6], &[1.0; 6]);
//! stats.set_mean_std("action", &[0.0; 6], &[1.0; 6]);
//! stats.set_imagenet("observation.images.front");
//! tch::manual_seed(1000);
//! let policy = ActPolicy::new(config, stats, &PolicyOptions::default())?;
//! let mut optimizer = Adam::act(&policy);
//! let batch = ActBatch {
//!     state: Some(Tensor::randn([8, 6], (Kind::Float, tch::Device::Cpu))),
//!     images: vec![Tensor::rand([8, 3, 36, 48], (Kind::Float, tch::Device::Cpu))],
//!     env_state: None,
//!     action: Some(Tensor::randn([8, 10, 6], (Kind::Float, tch::Device::Cpu))),
//!     action_is_pad: None,
//! };
//! let loss = policy.forward_loss(&batch, true)?;
//! let grad_norm = optimizer.step(&loss.loss)?;
//! policy.save_checkpoint("out/checkpoints/000001", Some(&optimizer), Some(1))?;
//! # Ok::<(), lake_trainer::Error>(())
//! ```

mod autocast;
mod checkpoint;
mod model;
mod policy;

pub use crate::{checkpoint::StagedCheckpoint, optim::Adam};

pub use self::{
    autocast::bf16_autocast,
    policy::{ActBatch, ActLoss, ActPolicy, PolicyOptions, cuda_is_available, load_libtorch_cuda},
};
