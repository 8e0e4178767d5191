//! Checkpoints in lerobot-train's layout: `<dir>/pretrained_model/` (what
//! `ACTPolicy.from_pretrained` and `make_pre_post_processors` read) and
//! `<dir>/training_state/`, written to a temporary directory beside `<dir>`, synced, then
//! renamed into place.

use std::path::{Path, PathBuf};

use super::policy::{ActPolicy, PolicyOptions};
use crate::checkpoint::{StagedCheckpoint, pretrained_dir};
use crate::layers::{CONFIG_FILE, MODEL_FILE};
use crate::optim::Adam;
use crate::{ActConfig, Error, Processors, Result};

impl ActPolicy {
    /// Writes `config.json` (0.4.4 fields, `pretrained_backbone_weights: null`),
    /// `model.safetensors` (every parameter and buffer, f32) and the processor files into
    /// `dir` (created if missing), as LeRobot's `save_pretrained` plus the processors'.
    ///
    /// # Errors
    /// [`Error::Io`] or [`Error::SafeTensors`].
    pub fn save_pretrained(&self, dir: impl AsRef<Path>) -> Result<()> {
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir).map_err(Error::io(dir))?;
        let config = self.config.for_checkpoint();
        let path = dir.join(CONFIG_FILE);
        std::fs::write(&path, config.to_json()).map_err(Error::io(&path))?;
        self.save_model_file(dir.join(MODEL_FILE))?;
        self.processors.write(dir, config.device.as_deref().unwrap_or("cpu"))
    }

    /// Writes a checkpoint for `dest` into a temporary directory beside it:
    /// `pretrained_model/` always, `training_state/` with the optimizer's
    /// `optimizer_state.safetensors` and `optimizer_param_groups.json` when given one, and
    /// `training_step.json` (`{"step": n}`) when given the step. Commit it to move it into
    /// place.
    ///
    /// # Errors
    /// [`Error::Io`] or [`Error::SafeTensors`].
    pub fn stage_checkpoint(&self, dest: impl AsRef<Path>, optimizer: Option<&Adam>, step: Option<u64>) -> Result<StagedCheckpoint> {
        crate::checkpoint::stage(dest.as_ref(), |dir| self.save_pretrained(dir), optimizer, step)
    }

    /// [`ActPolicy::stage_checkpoint`] then commit: the checkpoint is complete at `dest` or
    /// not there at all.
    ///
    /// # Errors
    /// As [`ActPolicy::stage_checkpoint`] and [`StagedCheckpoint::commit`].
    pub fn save_checkpoint(&self, dest: impl AsRef<Path>, optimizer: Option<&Adam>, step: Option<u64>) -> Result<PathBuf> {
        self.stage_checkpoint(dest, optimizer, step)?.commit()
    }

    /// Loads a policy saved by LeRobot (0.4.4 or 0.6.1) or lake: `dir` is a `pretrained_model`
    /// directory or a checkpoint directory holding one. Its config, processor statistics and
    /// every tensor of `model.safetensors` are used; a missing, extra or differently shaped
    /// tensor is refused (LeRobot only warns about the first two).
    ///
    /// # Errors
    /// [`Error::Io`]/[`Error::Format`] for missing or malformed files, [`Error::Mismatch`]
    /// naming the tensor.
    pub fn from_pretrained(dir: impl AsRef<Path>, options: &PolicyOptions) -> Result<Self> {
        let dir = pretrained_dir(dir.as_ref());
        let config = ActConfig::from_file(dir.join(CONFIG_FILE))?;
        let processors = Processors::read(&dir)?;
        let policy = Self::build(config, processors, options)?;
        policy.load_model_file(dir.join(MODEL_FILE))?;
        Ok(policy)
    }

    /// Starts this policy from another checkpoint's weights (`--init-from`), keeping this
    /// policy's statistics: the checkpoint's config must describe the same architecture.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the first differing field, else as
    /// [`ActPolicy::load_model_file`].
    pub fn init_from(&self, dir: impl AsRef<Path>) -> Result<()> {
        let dir = pretrained_dir(dir.as_ref());
        let other = ActConfig::from_file(dir.join(CONFIG_FILE))?;
        self.config.check_same_architecture(&other)?;
        self.load_model_file(dir.join(MODEL_FILE))
    }

    /// Copies every tensor of a `model.safetensors` into this policy, refusing a file that
    /// lacks one of its keys, has a key it lacks, or a shape that differs.
    ///
    /// # Errors
    /// [`Error::Mismatch`] naming the key and both shapes.
    pub fn load_model_file(&self, path: impl AsRef<Path>) -> Result<()> {
        crate::layers::load_state_file(self.state_dict(), path.as_ref())
    }

    /// Writes every parameter and buffer as `model.safetensors`, in the dtypes and layout
    /// LeRobot's `save_pretrained` gives the same weights.
    ///
    /// # Errors
    /// [`Error::Io`] or [`Error::SafeTensors`].
    pub fn save_model_file(&self, path: impl AsRef<Path>) -> Result<()> {
        crate::layers::write_state_file(path.as_ref(), self.state_dict())
    }
}
