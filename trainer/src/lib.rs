//! LeRobot's ACT policy (Action Chunking Transformer) and Diffusion Policy for `lake train`, with
//! checkpoints that LeRobot 0.4.4 and 0.6.1 load unchanged (`ACTPolicy.from_pretrained` or
//! `DiffusionPolicy.from_pretrained`, `make_pre_post_processors`). The references are
//! `docs/design/act.md` and `docs/design/diffusion.md`.
//!
//! # Crate tour
//! - `config`: [`ActConfig`], LeRobot's `config.json` with its names, order and defaults;
//!   [`DatasetFeature`] turns a dataset's features into the policy's inputs and outputs;
//!   [`ActConfig::delta_timestamps`] tells a data feed which frames a sample needs.
//! - `normalize`: [`Stats`] (per-feature statistics), [`Normalizer`] and [`Processors`], the
//!   `policy_{pre,post}processor.json` files and their state files.
//! - `tensors`: safetensors reading and writing of f32 tensors without libtorch.
//! - [`run_log`]: a run's step log and its plot; [`events`]: the same scalars as TensorBoard
//!   event files.
//! - `image_transforms`: [`ImageTransformsConfig`], LeRobot's image transforms for training,
//!   and [`ImageTransforms`], their draws for each sample's camera (applied to the frames on
//!   their device with the feature `torch`).
//! - `act` (feature `torch`): `act::ActPolicy`, the network on libtorch through tch, its
//!   loss, inference and checkpoint files; `diffusion`: `diffusion::DiffusionPolicy`, the same
//!   for the Diffusion Policy; `policy`: either, as `train` runs them.
//! - `optim` (feature `torch`): Adam and AdamW as torch steps them, the learning-rate schedules;
//!   `loss`: how a loss counts padded actions; `collective`: the ranks of a data-parallel run;
//!   `train`: the training loop, its checkpoints and exact resume.
//!
//! Without the `torch` feature the crate is pure Rust and builds in seconds.
//!
//! # Building with `torch`
//! tch 0.24.0 links libtorch 2.11.0, taken from PyPI's `torch==2.11.0` in a venv
//! (`scripts/torch-env.sh` makes one and prints its python):
//! - `LIBTORCH_USE_PYTORCH=1` with that venv's python first on `PATH` (or `VIRTUAL_ENV` set),
//!   at build time;
//! - `LD_LIBRARY_PATH=<venv>/lib/python3.11/site-packages/torch/lib` at run time for this
//!   crate's tests (`scripts/torch-env.sh --exports` prints both); the `lake` binary records
//!   that directory as its run path instead (docs/decisions/0030-run-path-to-libtorch.md).
//!
//! The build script keeps `libtorch.so` on the link line (`-as-needed` off) for every binary
//! that links this crate, so that CUDA is registered when the libtorch has it.
//!
//! # Randomness
//! Initialisation, dropout and the VAE's ε all draw from libtorch's global generator: call
//! `tch::manual_seed` before building a policy and, for a resume that repeats the same draws,
//! before each step with a seed derived from the step.
//!
//! # Example
//! ```
//! use lake_trainer::{ActConfig, DatasetFeature, FeatureType};
//!
//! let features = [
//!     DatasetFeature::new("observation.state", FeatureType::State, [6]),
//!     DatasetFeature::new("action", FeatureType::Action, [6]),
//!     DatasetFeature::new("observation.images.front", FeatureType::Visual, [3, 36, 48]),
//! ];
//! let mut config = ActConfig::with_features(&features);
//! config.chunk_size = 10;
//! config.n_action_steps = 10;
//! config.validate()?;
//! // A sample needs the current observation and the next 10 actions.
//! assert_eq!(config.delta_timestamps(30.0)[0].1[..2], [0.0, 1.0 / 30.0]);
//! // config.json as LeRobot 0.4.4 writes it, and back.
//! assert_eq!(ActConfig::from_json(&config.to_json())?, config);
//! # Ok::<(), lake_trainer::Error>(())
//! ```

mod config;
pub mod data;
mod diffusion_config;
mod error;
pub mod events;
mod image_transforms;
#[cfg(feature = "torch")]
mod layers;
mod normalize;
pub mod run_log;
mod seeds;
mod tensors;

#[cfg(feature = "torch")]
pub mod act;
#[cfg(feature = "torch")]
mod checkpoint;
#[cfg(feature = "torch")]
pub mod collective;
#[cfg(feature = "torch")]
pub mod diffusion;
#[cfg(feature = "torch")]
pub mod gpu_decode;
#[cfg(feature = "torch")]
pub mod loss;
#[cfg(feature = "torch")]
pub mod optim;
#[cfg(feature = "torch")]
pub mod policy;
#[cfg(feature = "torch")]
pub mod train;

pub use crate::config::{
    ACTION, ActConfig, DatasetFeature, FeatureType, Features, NormalizationMode, OBS_ENV_STATE, OBS_STATE, OrderedMap, PolicyFeature,
};
pub use crate::diffusion_config::DiffusionConfig;
pub use crate::error::{Error, Result};
pub use crate::image_transforms::{
    Draw, DrawKey, Hole, ImageTransforms, ImageTransformsConfig, Patch, SCENE_TRANSFORMS, SceneDraw, TransformConfig, TransformFrames,
};
pub use crate::normalize::{
    EPS, IMAGENET_MEAN, IMAGENET_STD, Normalizer, POSTPROCESSOR_FILE, POSTPROCESSOR_STATE_FILE, PREPROCESSOR_FILE, PREPROCESSOR_STATE_FILE,
    PolicyFeatures, Processors, Stats,
};
#[cfg(feature = "torch")]
pub use crate::tensors::read_weights;
pub use crate::tensors::{HostTensor, from_safetensors_bytes, read_safetensors, to_safetensors_bytes, write_safetensors};
