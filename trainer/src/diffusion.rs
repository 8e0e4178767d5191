//! LeRobot's Diffusion Policy on libtorch (`docs/design/diffusion.md`): [`DiffusionNet`], the
//! network under LeRobot's state-dict names (`diffusion.rgb_encoder.backbone.4.0.conv1.weight`,
//! `diffusion.unet.down_modules.0.0.conv1.block.0.weight`, …) with its DDPM loss and sampling,
//! over inputs already normalised as LeRobot's preprocessor normalises them; and
//! [`DiffusionPolicy`], the network with that normalisation, reading and writing the
//! `pretrained_model` files LeRobot loads.
//!
//! ```no_run
//! use lake_trainer::diffusion::{DiffusionInput, DiffusionNet};
//! use lake_trainer::{DatasetFeature, DiffusionConfig, FeatureType};
//! use tch::{Device, Kind, Tensor};
//!
//! let features = [
//!     DatasetFeature::new("observation.image", FeatureType::Visual, [3, 96, 96]),
//!     DatasetFeature::new("observation.state", FeatureType::State, [2]),
//!     DatasetFeature::new("action", FeatureType::Action, [2]),
//! ];
//! let config = DiffusionConfig { crop_shape: Some([84, 84]), ..DiffusionConfig::with_features(&features) };
//! tch::manual_seed(0);
//! let net = DiffusionNet::new(&config, Device::Cpu, Kind::Float)?;
//! let f = (Kind::Float, Device::Cpu);
//! let input = DiffusionInput {
//!     state: Tensor::randn([8, 2, 2], f),
//!     images: Some(Tensor::rand([8, 2, 1, 3, 96, 96], f)),
//!     env_state: None,
//! };
//! let loss = net.loss(&input, &Tensor::randn([8, 16, 2], f), None, true)?;
//! let actions = net.predict(&input)?; // [8, 8, 2]
//! # Ok::<(), lake_trainer::Error>(())
//! ```

mod model;
mod net;
mod policy;
mod scheduler;

pub use self::{
    net::{DiffusionInput, DiffusionNet, Draws},
    policy::{DiffusionBatch, DiffusionPolicy},
};
