//! Adam and AdamW exactly as `torch.optim.Adam`/`AdamW` (single-tensor path, `amsgrad=False`)
//! update, in the parameter groups of LeRobot's optimizer presets (ACT: AdamW in two groups;
//! Diffusion: Adam in one), with gradient clipping, and the state in the layout of
//! lerobot-train's `training_state/`.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Value, json};
use tch::Tensor;

use crate::act::ActPolicy;
use crate::diffusion::DiffusionPolicy;
use crate::layers::{copy_into, host};
use crate::tensors::HostTensor;
use crate::{Error, Result};

/// LeRobot's `grad_clip_norm` default.
pub const GRAD_CLIP_NORM: f64 = 10.0;

/// One parameter's AdamW state.
struct Slot {
    name: String,
    param: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    step: f64,
}

/// A parameter group: its learning rate and the indices of its parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamGroup {
    /// Learning rate.
    pub lr: f64,
    /// Decoupled weight decay.
    pub weight_decay: f64,
    /// Optimizer-global parameter indices.
    pub params: Vec<usize>,
}

/// Adam over a policy's parameters in groups. Parameter `i` of the optimizer is group 0's
/// parameters, then group 1's, each in `named_parameters` order, as in torch's `state_dict`.
pub struct Adam {
    slots: Vec<Slot>,
    groups: Vec<ParamGroup>,
    betas: (f64, f64),
    eps: f64,
    /// AdamW's decoupled weight decay (the parameter shrinks), else Adam's L2 term (added to the
    /// gradient).
    decoupled: bool,
    /// Gradient clipping norm applied by [`Adam::step`] (LeRobot's 10.0); ≤ 0 disables the
    /// clipping (the norm is still computed).
    pub grad_clip_norm: f64,
}

impl std::fmt::Debug for Adam {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct(if self.decoupled { "AdamW" } else { "Adam" })
            .field("groups", &self.groups)
            .field("betas", &self.betas)
            .field("eps", &self.eps)
            .finish()
    }
}

impl Adam {
    /// ACT's preset: AdamW in LeRobot's two groups, group 0 every parameter outside
    /// `model.backbone` at `optimizer_lr`, group 1 the backbone at `optimizer_lr_backbone`; both
    /// with `optimizer_weight_decay`, betas (0.9, 0.999), eps 1e-8.
    pub fn act(policy: &ActPolicy) -> Self {
        let c = policy.config();
        let (backbone, rest): (Vec<_>, Vec<_>) = policy.named_parameters().iter().partition(|(k, _)| k.starts_with("model.backbone"));
        Self::with_groups([(rest, c.optimizer_lr), (backbone, c.optimizer_lr_backbone)], c.optimizer_weight_decay, (0.9, 0.999), 1e-8, true)
    }

    /// Diffusion's preset: Adam in one group of every parameter at `optimizer_lr`, with
    /// `optimizer_betas`, `optimizer_eps` and `optimizer_weight_decay` as an L2 term.
    pub fn diffusion(policy: &DiffusionPolicy) -> Self {
        let c = policy.net().config();
        let all: Vec<&(String, Tensor)> = policy.net().named_parameters().iter().collect();
        let betas = (c.optimizer_betas[0], c.optimizer_betas[1]);
        Self::with_groups([(all, c.optimizer_lr)], c.optimizer_weight_decay, betas, c.optimizer_eps, false)
    }

    fn with_groups<const N: usize>(
        members: [(Vec<&(String, Tensor)>, f64); N],
        weight_decay: f64,
        betas: (f64, f64),
        eps: f64,
        decoupled: bool,
    ) -> Self {
        let mut slots = Vec::new();
        let mut groups = Vec::new();
        for (members, lr) in members {
            let start = slots.len();
            for (name, p) in members {
                slots.push(Slot {
                    name: name.clone(),
                    param: p.shallow_clone(),
                    exp_avg: p.zeros_like(),
                    exp_avg_sq: p.zeros_like(),
                    step: 0.0,
                });
            }
            groups.push(ParamGroup { lr, weight_decay, params: (start..slots.len()).collect() });
        }
        Adam { slots, groups, betas, eps, decoupled, grad_clip_norm: GRAD_CLIP_NORM }
    }

    /// The parameter groups.
    pub fn groups(&self) -> &[ParamGroup] {
        &self.groups
    }

    /// Sets a group's learning rate (ACT's group 0: the transformer and heads, 1: the backbone).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a group that does not exist.
    pub fn set_lr(&mut self, group: usize, lr: f64) -> Result<()> {
        let n = self.groups.len();
        self.groups.get_mut(group).ok_or_else(|| Error::config("param_groups", format!("no group {group} (there are {n})")))?.lr = lr;
        Ok(())
    }

    /// Parameter names in optimizer index order.
    pub fn param_names(&self) -> impl Iterator<Item = &str> {
        self.slots.iter().map(|s| s.name.as_str())
    }

    /// Clears every parameter's gradient.
    pub fn zero_grad(&mut self) {
        for s in &mut self.slots {
            s.param.zero_grad();
        }
    }

    /// `clip_grad_norm_`: the L2 norm over all gradients (returned, before clipping), and
    /// every gradient multiplied by `min(1, max_norm / (norm + 1e-6))` when `max_norm > 0`.
    pub fn clip_grad_norm(&mut self, max_norm: f64) -> f64 {
        tch::no_grad(|| {
            let grads: Vec<Tensor> = self.slots.iter().map(|s| s.param.grad()).filter(|g| g.defined()).collect();
            if grads.is_empty() {
                return 0.0;
            }
            let norms: Vec<Tensor> = grads.iter().map(|g| g.norm()).collect();
            let total = Tensor::stack(&norms, 0).norm();
            if max_norm > 0.0 {
                let coef = Tensor::full_like(&total, max_norm) / (&total + 1e-6);
                let coef = coef.clamp_max(1.0);
                for mut g in grads {
                    let _ = g.g_mul_(&coef);
                }
            }
            total.double_value(&[])
        })
    }

    /// The update from the current gradients (parameters without a gradient are skipped, as
    /// torch skips them).
    pub fn update(&mut self) {
        let (beta1, beta2) = self.betas;
        let eps = self.eps;
        tch::no_grad(|| {
            for g in &self.groups {
                for &i in &g.params {
                    let s = &mut self.slots[i];
                    let grad = s.param.grad();
                    if !grad.defined() {
                        continue;
                    }
                    s.step += 1.0;
                    let grad = match g.weight_decay {
                        0.0 => grad,
                        wd if self.decoupled => {
                            let _ = s.param.g_mul_scalar_(1.0 - g.lr * wd);
                            grad
                        }
                        wd => grad + &s.param * wd,
                    };
                    let _ = s.exp_avg.lerp_(&grad, 1.0 - beta1);
                    let _ = s.exp_avg_sq.g_mul_scalar_(beta2);
                    let _ = s.exp_avg_sq.g_add_(&(&grad * (1.0 - beta2) * &grad));
                    let bias_correction1 = 1.0 - beta1.powf(s.step);
                    let bias_correction2 = 1.0 - beta2.powf(s.step);
                    let step_size = g.lr / bias_correction1;
                    let denom = s.exp_avg_sq.sqrt() / bias_correction2.sqrt() + eps;
                    let _ = s.param.g_add_(&(&s.exp_avg * -step_size / denom));
                }
            }
        })
    }

    /// One training step as lerobot-train's `update_policy` does it: zero the gradients,
    /// back-propagate `loss`, clip to [`Adam::grad_clip_norm`], update. Returns the gradient
    /// norm before clipping.
    ///
    /// # Errors
    /// [`Error::Batch`] when `loss` is not a scalar that requires a gradient.
    pub fn step(&mut self, loss: &Tensor) -> Result<f64> {
        if loss.numel() != 1 || !loss.requires_grad() {
            return Err(Error::Batch(format!(
                "loss must be a scalar with a gradient, got {:?} (requires_grad {})",
                loss.size(),
                loss.requires_grad()
            )));
        }
        self.zero_grad();
        loss.backward();
        let norm = self.clip_grad_norm(self.grad_clip_norm);
        self.update();
        Ok(norm)
    }

    /// The state as lerobot-train's `optimizer_state.safetensors` holds it:
    /// `state/<i>/step` (shape `[]`), `state/<i>/exp_avg`, `state/<i>/exp_avg_sq`, f32, for
    /// the parameters that have taken a step.
    pub fn state_tensors(&self) -> BTreeMap<String, HostTensor> {
        let mut out = BTreeMap::new();
        for (i, s) in self.slots.iter().enumerate() {
            if s.step == 0.0 {
                continue;
            }
            out.insert(format!("state/{i}/step"), HostTensor::new(Vec::<usize>::new(), [s.step as f32]));
            out.insert(format!("state/{i}/exp_avg"), host(&s.exp_avg));
            out.insert(format!("state/{i}/exp_avg_sq"), host(&s.exp_avg_sq));
        }
        out
    }

    /// Restores the state of [`Adam::state_tensors`] (a LeRobot or lake
    /// `optimizer_state.safetensors`).
    ///
    /// # Errors
    /// [`Error::Mismatch`] naming the tensor when an index or shape does not fit.
    pub fn load_state_tensors(&mut self, state: &BTreeMap<String, HostTensor>, path: &Path) -> Result<()> {
        for key in state.keys() {
            let parts: Vec<&str> = key.split('/').collect();
            let ok = matches!(parts.as_slice(), ["state", i, "step" | "exp_avg" | "exp_avg_sq"] if i.parse::<usize>().is_ok_and(|i| i < self.slots.len()));
            if !ok {
                return Err(Error::Mismatch {
                    path: path.into(),
                    key: key.clone(),
                    reason: format!("not a state of this optimizer ({} parameters)", self.slots.len()),
                });
            }
        }
        for (i, s) in self.slots.iter_mut().enumerate() {
            let Some(step) = state.get(&format!("state/{i}/step")) else {
                s.step = 0.0;
                let _ = s.exp_avg.zero_();
                let _ = s.exp_avg_sq.zero_();
                continue;
            };
            s.step = step.values.first().copied().unwrap_or(0.0) as f64;
            for (name, dst) in [("exp_avg", &s.exp_avg), ("exp_avg_sq", &s.exp_avg_sq)] {
                let key = format!("state/{i}/{name}");
                let src =
                    state.get(&key).ok_or_else(|| Error::Mismatch { path: path.into(), key: key.clone(), reason: "missing".into() })?;
                copy_into(dst, src, path, &format!("{key} ({})", s.name))?;
            }
        }
        Ok(())
    }

    /// `optimizer_param_groups.json` as torch 2.10's Adam or AdamW writes it for lerobot-train.
    pub fn param_groups_json(&self) -> Value {
        Value::Array(
            self.groups
                .iter()
                .map(|g| {
                    json!({"lr": g.lr, "betas": [self.betas.0, self.betas.1], "eps": self.eps, "weight_decay": g.weight_decay,
                           "amsgrad": false, "maximize": false, "foreach": null, "capturable": false, "differentiable": false,
                           "fused": null, "decoupled_weight_decay": self.decoupled, "params": g.params})
                })
                .collect(),
        )
    }

    /// Writes `optimizer_state.safetensors` and `optimizer_param_groups.json` into `dir`.
    ///
    /// # Errors
    /// [`Error::Io`] or [`Error::SafeTensors`].
    pub fn save(&self, dir: &Path) -> Result<()> {
        let state = self.state_tensors();
        crate::write_safetensors(dir.join("optimizer_state.safetensors"), state.iter().map(|(k, v)| (k.as_str(), v)))?;
        let path = dir.join("optimizer_param_groups.json");
        let text = serde_json::to_string_pretty(&self.param_groups_json()).expect("JSON to memory");
        std::fs::write(&path, text).map_err(Error::io(&path))
    }

    /// Reads what [`Adam::save`] (or lerobot-train) wrote in `dir`: the moments and steps, and
    /// each group's learning rate and weight decay.
    ///
    /// # Errors
    /// [`Error::Io`], [`Error::Format`] for a param-groups file of another shape,
    /// [`Error::Mismatch`] for state that does not fit.
    pub fn load(&mut self, dir: &Path) -> Result<()> {
        let path = dir.join("optimizer_param_groups.json");
        let text = std::fs::read_to_string(&path).map_err(Error::io(&path))?;
        let groups: Value = serde_json::from_str(&text).map_err(|e| Error::format(&path, e.to_string()))?;
        let groups = groups
            .as_array()
            .filter(|g| g.len() == self.groups.len())
            .ok_or_else(|| Error::format(&path, format!("expected {} parameter groups", self.groups.len())))?;
        for (g, saved) in self.groups.iter_mut().zip(groups) {
            let params: Option<Vec<usize>> =
                saved.get("params").and_then(Value::as_array).and_then(|a| a.iter().map(|v| v.as_u64().map(|n| n as usize)).collect());
            if params.as_ref() != Some(&g.params) {
                return Err(Error::format(&path, format!("group parameters {params:?} do not match this model's {:?}", g.params)));
            }
            g.lr = saved.get("lr").and_then(Value::as_f64).ok_or_else(|| Error::format(&path, "a group has no lr"))?;
            g.weight_decay = saved.get("weight_decay").and_then(Value::as_f64).unwrap_or(g.weight_decay);
        }
        let state_path = dir.join("optimizer_state.safetensors");
        let state = crate::read_safetensors(&state_path)?;
        self.load_state_tensors(&state, &state_path)
    }
}

/// The learning-rate factor of update `step` (0-based) under diffusers' cosine schedule with
/// warm-up (`get_cosine_schedule_with_warmup`, half a cycle), which lerobot-train's
/// `DiffuserSchedulerConfig("cosine")` builds: linear from 0 over `warmup` updates, then half a
/// cosine down to 0 at update `total`.
pub fn cosine_with_warmup(step: u64, warmup: u64, total: u64) -> f64 {
    if step < warmup {
        return step as f64 / warmup.max(1) as f64;
    }
    let progress = (step - warmup) as f64 / total.saturating_sub(warmup).max(1) as f64;
    (0.5 * (1.0 + (std::f64::consts::PI * 0.5 * 2.0 * progress).cos())).max(0.0)
}

#[cfg(test)]
mod tests {
    use super::cosine_with_warmup;

    #[test]
    fn the_cosine_schedule_warms_up_then_falls_to_zero() {
        assert_eq!(cosine_with_warmup(0, 500, 100_000), 0.0);
        assert_eq!(cosine_with_warmup(1, 500, 100_000), 1.0 / 500.0);
        assert_eq!(cosine_with_warmup(500, 500, 100_000), 1.0);
        assert!((cosine_with_warmup(50_250, 500, 100_000) - 0.5).abs() < 1e-12);
        assert!(cosine_with_warmup(100_000, 500, 100_000).abs() < 1e-12);
        assert!(cosine_with_warmup(3, 0, 0).abs() < 1e-12, "past the end it stays near 0");
    }
}
