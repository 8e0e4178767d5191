//! Checkpoints in lerobot-train's layout, for every policy: `<dir>/pretrained_model/` (what
//! LeRobot's `from_pretrained` and `make_pre_post_processors` read) and `<dir>/training_state/`,
//! written to a temporary directory beside `<dir>`, synced, then renamed into place.

use std::fs::File;
use std::path::{Path, PathBuf};

use crate::layers::{CONFIG_FILE, PRETRAINED_MODEL_DIR, TRAINING_STATE_DIR};
use crate::optim::Adam;
use crate::{Error, Result};

/// A checkpoint written to a temporary directory and not yet in place: add files under
/// [`StagedCheckpoint::path`] (e.g. lake's sampler cursor in `training_state/`), then
/// [`StagedCheckpoint::commit`]. Dropping it uncommitted removes the temporary directory.
#[derive(Debug)]
pub struct StagedCheckpoint {
    tmp: PathBuf,
    dest: PathBuf,
    done: bool,
}

impl StagedCheckpoint {
    /// The temporary directory holding `pretrained_model/` and `training_state/`.
    pub fn path(&self) -> &Path {
        &self.tmp
    }

    /// Where [`StagedCheckpoint::commit`] puts it.
    pub fn destination(&self) -> &Path {
        &self.dest
    }

    /// Syncs every file and directory, renames the temporary directory to the destination (an
    /// existing checkpoint there is replaced), and syncs the parent directory.
    ///
    /// # Errors
    /// [`Error::Io`] naming the path that failed.
    pub fn commit(mut self) -> Result<PathBuf> {
        sync_tree(&self.tmp)?;
        let parent = self.dest.parent().unwrap_or(Path::new(".")).to_path_buf();
        let old = if self.dest.exists() {
            let old = sibling(&self.dest, "old");
            std::fs::rename(&self.dest, &old).map_err(Error::io(&self.dest))?;
            Some(old)
        } else {
            None
        };
        std::fs::rename(&self.tmp, &self.dest).map_err(Error::io(&self.dest))?;
        self.done = true;
        sync_dir(&parent)?;
        if let Some(old) = old {
            std::fs::remove_dir_all(&old).map_err(Error::io(&old))?;
        }
        Ok(self.dest.clone())
    }
}

impl Drop for StagedCheckpoint {
    fn drop(&mut self) {
        if !self.done {
            let _ = std::fs::remove_dir_all(&self.tmp);
        }
    }
}

fn sibling(dest: &Path, what: &str) -> PathBuf {
    let name = dest.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "checkpoint".into());
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    dest.with_file_name(format!(".{name}.{what}-{}-{nanos}", std::process::id()))
}

fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|f| f.sync_all()).map_err(Error::io(dir))
}

fn sync_tree(dir: &Path) -> Result<()> {
    for entry in std::fs::read_dir(dir).map_err(Error::io(dir))? {
        let path = entry.map_err(Error::io(dir))?.path();
        if path.is_dir() {
            sync_tree(&path)?;
        } else {
            File::open(&path).and_then(|f| f.sync_all()).map_err(Error::io(&path))?;
        }
    }
    sync_dir(dir)
}

/// A checkpoint directory or its `pretrained_model/` sub-directory → the one holding
/// `config.json`.
pub(crate) fn pretrained_dir(dir: &Path) -> PathBuf {
    if !dir.join(CONFIG_FILE).exists() && dir.join(PRETRAINED_MODEL_DIR).join(CONFIG_FILE).exists() {
        dir.join(PRETRAINED_MODEL_DIR)
    } else {
        dir.to_path_buf()
    }
}

/// Writes a checkpoint for `dest` into a temporary directory beside it: `pretrained_model/` by
/// `write_pretrained`, and `training_state/` with the optimizer's `optimizer_state.safetensors`
/// and `optimizer_param_groups.json` when given one, and `training_step.json` (`{"step": n}`)
/// when given the step. Commit it to move it into place.
///
/// # Errors
/// [`Error::Io`] or [`Error::SafeTensors`].
pub(crate) fn stage(
    dest: &Path,
    write_pretrained: impl FnOnce(&Path) -> Result<()>,
    optimizer: Option<&Adam>,
    step: Option<u64>,
) -> Result<StagedCheckpoint> {
    let dest = dest.to_path_buf();
    if let Some(parent) = dest.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(Error::io(parent))?;
    }
    let tmp = sibling(&dest, "tmp");
    std::fs::create_dir(&tmp).map_err(Error::io(&tmp))?;
    let staged = StagedCheckpoint { tmp, dest, done: false };
    write_pretrained(&staged.tmp.join(PRETRAINED_MODEL_DIR))?;
    if optimizer.is_some() || step.is_some() {
        let state = staged.tmp.join(TRAINING_STATE_DIR);
        std::fs::create_dir(&state).map_err(Error::io(&state))?;
        if let Some(opt) = optimizer {
            opt.save(&state)?;
        }
        if let Some(step) = step {
            let path = state.join("training_step.json");
            let text = serde_json::to_string_pretty(&serde_json::json!({"step": step})).expect("JSON to memory");
            std::fs::write(&path, text).map_err(Error::io(&path))?;
        }
    }
    Ok(staged)
}
