//! Building blocks the policies share: variables registered under LeRobot's state-dict keys in
//! its `named_parameters` order, PyTorch's default initialisations, and torchvision's ResNet-18
//! with either normalisation LeRobot's policies give it.

use std::path::Path;

use tch::{Device, Kind, Tensor, nn};

use crate::tensors::Stored;
use crate::{Error, FeatureType, NormalizationMode, Normalizer, Result};

/// The sub-directory `from_pretrained` reads.
pub(crate) const PRETRAINED_MODEL_DIR: &str = "pretrained_model";
/// The sub-directory of optimizer and training-loop state.
pub(crate) const TRAINING_STATE_DIR: &str = "training_state";
/// The weights file.
pub(crate) const MODEL_FILE: &str = "model.safetensors";
/// The config file.
pub(crate) const CONFIG_FILE: &str = "config.json";

/// Creates variables in a `VarStore` under full dotted keys and remembers their order.
pub(crate) struct Registry<'a> {
    root: nn::Path<'a>,
    kind: Kind,
    device: Device,
    /// Trainable tensors in registration order (LeRobot's `named_parameters` order).
    pub params: Vec<(String, Tensor)>,
    /// Buffers in registration order.
    pub buffers: Vec<(String, Tensor)>,
}

impl<'a> Registry<'a> {
    pub(crate) fn new(vs: &'a nn::VarStore, kind: Kind) -> Self {
        Registry { root: vs.root(), kind, device: vs.device(), params: Vec::new(), buffers: Vec::new() }
    }

    fn add(&mut self, key: &str, value: Tensor, trainable: bool) -> Tensor {
        let mut parts: Vec<&str> = key.split('.').collect();
        let leaf = parts.pop().expect("a key has a name");
        let path = parts.iter().fold(self.root.clone(), |p, part| p.sub(*part));
        let t = path.add(leaf, value.to_kind(self.kind).to_device(self.device).detach(), trainable);
        if trainable {
            self.params.push((key.to_string(), t.shallow_clone()));
        } else {
            self.buffers.push((key.to_string(), t.shallow_clone()));
        }
        t
    }

    /// A buffer that counts (int64, a scalar at 0), kept in its own kind.
    pub(crate) fn counter(&mut self, key: &str) -> Tensor {
        let mut parts: Vec<&str> = key.split('.').collect();
        let leaf = parts.pop().expect("a key has a name");
        let path = parts.iter().fold(self.root.clone(), |p, part| p.sub(*part));
        let t = path.add(leaf, Tensor::zeros([], (Kind::Int64, self.device)), false);
        self.buffers.push((key.to_string(), t.shallow_clone()));
        t
    }

    pub(crate) fn param(&mut self, key: &str, value: Tensor) -> Tensor {
        self.add(key, value, true)
    }

    pub(crate) fn buffer(&mut self, key: &str, value: Tensor) -> Tensor {
        self.add(key, value, false)
    }

    pub(crate) fn uniform(&self, dims: &[i64], bound: f64) -> Tensor {
        let mut t = Tensor::empty(dims, (self.kind, self.device));
        let _ = t.uniform_(-bound, bound);
        t
    }

    pub(crate) fn normal(&self, dims: &[i64], std: f64) -> Tensor {
        let mut t = Tensor::empty(dims, (self.kind, self.device));
        let _ = t.normal_(0.0, std);
        t
    }

    pub(crate) fn xavier(&self, dims: &[i64]) -> Tensor {
        let (fan_out, fan_in) = fans(dims);
        self.uniform(dims, (6.0 / (fan_in + fan_out) as f64).sqrt())
    }

    pub(crate) fn zeros(&self, dims: &[i64]) -> Tensor {
        Tensor::zeros(dims, (self.kind, self.device))
    }

    pub(crate) fn ones(&self, dims: &[i64]) -> Tensor {
        Tensor::ones(dims, (self.kind, self.device))
    }

    /// `nn.Linear` with PyTorch's default init (weight and bias uniform in ±1/√fan_in), or
    /// xavier-uniform weights where ACT re-initialises them.
    pub(crate) fn linear(&mut self, prefix: &str, fan_in: i64, fan_out: i64, xavier: bool) -> Linear {
        let bound = 1.0 / (fan_in as f64).sqrt();
        let w = if xavier { self.xavier(&[fan_out, fan_in]) } else { self.uniform(&[fan_out, fan_in], bound) };
        let w = self.param(&format!("{prefix}.weight"), w);
        let b = self.uniform(&[fan_out], bound);
        let b = self.param(&format!("{prefix}.bias"), b);
        Linear { w, b }
    }

    /// A conv weight with kaiming-normal init (fan_out, ReLU gain), torchvision's ResNet init.
    pub(crate) fn conv(&mut self, key: &str, out_c: i64, in_c: i64, k: i64) -> Tensor {
        let t = self.normal(&[out_c, in_c, k, k], (2.0 / (out_c * k * k) as f64).sqrt());
        self.param(key, t)
    }
}

pub(crate) fn fans(dims: &[i64]) -> (i64, i64) {
    let receptive: i64 = dims[2..].iter().product();
    (dims[0] * receptive, dims[1] * receptive)
}

pub(crate) struct Linear {
    w: Tensor,
    b: Tensor,
}

impl Linear {
    pub(crate) fn forward(&self, x: &Tensor) -> Tensor {
        x.linear(&self.w, Some(&self.b))
    }
}

/// How ResNet-18's normalisation layers are built: torchvision's `FrozenBatchNorm2d` (ACT: four
/// buffers each, identity at start); `nn.BatchNorm2d` (Diffusion's option: trainable weight and
/// bias, the running statistics and their count as buffers, updated by every training forward
/// with momentum 0.1); or `nn.GroupNorm` with `C / 16` groups in their place (Diffusion's
/// default: trainable weight and bias, ones and zeros at start).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ResNetNorm {
    FrozenBatch,
    Batch,
    Group,
}

/// How the backbone's tensors are named below its prefix: torchvision's attributes (`conv1`,
/// `bn1`, `layer1` … `layer4`), or the positions of `nn.Sequential(*children[:-2])` (`0`, `1`,
/// `4` … `7`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ResNetKeys {
    Named,
    Sequential,
}

pub(crate) enum Norm2d {
    Frozen { w: Tensor, b: Tensor, mean: Tensor, var: Tensor },
    Batch { w: Tensor, b: Tensor, mean: Tensor, var: Tensor, count: Tensor },
    Group { w: Tensor, b: Tensor, groups: i64 },
}

impl Norm2d {
    fn new(r: &mut Registry, prefix: &str, c: i64, kind: ResNetNorm) -> Self {
        match kind {
            ResNetNorm::FrozenBatch => {
                let (w, b, m, v) = (r.ones(&[c]), r.zeros(&[c]), r.zeros(&[c]), r.ones(&[c]));
                Norm2d::Frozen {
                    w: r.buffer(&format!("{prefix}.weight"), w),
                    b: r.buffer(&format!("{prefix}.bias"), b),
                    mean: r.buffer(&format!("{prefix}.running_mean"), m),
                    var: r.buffer(&format!("{prefix}.running_var"), v),
                }
            }
            ResNetNorm::Batch => {
                let (w, b, m, v) = (r.ones(&[c]), r.zeros(&[c]), r.zeros(&[c]), r.ones(&[c]));
                Norm2d::Batch {
                    w: r.param(&format!("{prefix}.weight"), w),
                    b: r.param(&format!("{prefix}.bias"), b),
                    mean: r.buffer(&format!("{prefix}.running_mean"), m),
                    var: r.buffer(&format!("{prefix}.running_var"), v),
                    count: r.counter(&format!("{prefix}.num_batches_tracked")),
                }
            }
            ResNetNorm::Group => {
                let (w, b) = (r.ones(&[c]), r.zeros(&[c]));
                Norm2d::Group { w: r.param(&format!("{prefix}.weight"), w), b: r.param(&format!("{prefix}.bias"), b), groups: c / 16 }
            }
        }
    }

    /// `FrozenBatchNorm2d` (eps 1e-5): `x·s + (b − mean·s)`, `s = w·rsqrt(var + eps)`;
    /// `BatchNorm2d` (eps 1e-5, momentum 0.1): the batch's statistics when `train`, which also
    /// move the running ones and count the batch, the running ones otherwise; or `GroupNorm`
    /// (eps 1e-5).
    pub(crate) fn forward(&self, x: &Tensor, train: bool) -> Tensor {
        match self {
            Norm2d::Frozen { w, b, mean, var } => {
                let shape = [1, -1, 1, 1];
                let scale = w.reshape(shape) * (var.reshape(shape) + 1e-5).rsqrt();
                let bias = b.reshape(shape) - mean.reshape(shape) * &scale;
                x * scale + bias
            }
            Norm2d::Batch { w, b, mean, var, count } => {
                if train {
                    let mut count = count.shallow_clone();
                    tch::no_grad(|| count += 1);
                }
                x.batch_norm(Some(w), Some(b), Some(mean), Some(var), train, 0.1, 1e-5, true)
            }
            Norm2d::Group { w, b, groups } => x.group_norm(*groups, Some(w), Some(b), 1e-5, true),
        }
    }
}

struct BasicBlock {
    conv1: Tensor,
    bn1: Norm2d,
    conv2: Tensor,
    bn2: Norm2d,
    downsample: Option<(Tensor, Norm2d)>,
    stride: i64,
}

impl BasicBlock {
    fn forward(&self, x: &Tensor, train: bool) -> Tensor {
        let out = self.bn1.forward(&x.conv2d(&self.conv1, None::<Tensor>, [self.stride], [1], [1], 1), train).relu();
        let out = self.bn2.forward(&out.conv2d(&self.conv2, None::<Tensor>, [1], [1], [1], 1), train);
        let identity = match &self.downsample {
            Some((w, bn)) => bn.forward(&x.conv2d(w, None::<Tensor>, [self.stride], [0], [1], 1), train),
            None => x.shallow_clone(),
        };
        (out + identity).relu()
    }
}

/// torchvision's ResNet-18 up to `layer4` (512 channels at 1/32 of the input's size, rounded
/// up), registered under `prefix`.
pub(crate) struct ResNet18 {
    conv1: Tensor,
    bn1: Norm2d,
    layers: Vec<Vec<BasicBlock>>,
}

impl ResNet18 {
    pub(crate) fn new(r: &mut Registry, prefix: &str, keys: ResNetKeys, norm: ResNetNorm) -> Self {
        let (conv1_key, bn1_key) = match keys {
            ResNetKeys::Named => ("conv1", "bn1"),
            ResNetKeys::Sequential => ("0", "1"),
        };
        let conv1 = r.conv(&format!("{prefix}.{conv1_key}.weight"), 64, 3, 7);
        let bn1 = Norm2d::new(r, &format!("{prefix}.{bn1_key}"), 64, norm);
        let mut layers = Vec::new();
        let mut in_c = 64;
        for (li, out_c) in [64i64, 128, 256, 512].into_iter().enumerate() {
            let layer = match keys {
                ResNetKeys::Named => format!("layer{}", li + 1),
                ResNetKeys::Sequential => (li + 4).to_string(),
            };
            let mut blocks = Vec::new();
            for bi in 0..2 {
                let stride = if li > 0 && bi == 0 { 2 } else { 1 };
                let bp = format!("{prefix}.{layer}.{bi}");
                let conv1 = r.conv(&format!("{bp}.conv1.weight"), out_c, in_c, 3);
                let bn1 = Norm2d::new(r, &format!("{bp}.bn1"), out_c, norm);
                let conv2 = r.conv(&format!("{bp}.conv2.weight"), out_c, out_c, 3);
                let bn2 = Norm2d::new(r, &format!("{bp}.bn2"), out_c, norm);
                let downsample = (stride != 1 || in_c != out_c).then(|| {
                    let w = r.conv(&format!("{bp}.downsample.0.weight"), out_c, in_c, 1);
                    (w, Norm2d::new(r, &format!("{bp}.downsample.1"), out_c, norm))
                });
                blocks.push(BasicBlock { conv1, bn1, conv2, bn2, downsample, stride });
                in_c = out_c;
            }
            layers.push(blocks);
        }
        ResNet18 { conv1, bn1, layers }
    }

    /// The features of `x`; `train` as a module's training mode (which only BatchNorm heeds).
    pub(crate) fn forward(&self, x: &Tensor, train: bool) -> Tensor {
        let x = self.bn1.forward(&x.conv2d(&self.conv1, None::<Tensor>, [2], [3], [1], 1), train).relu();
        let mut x = x.max_pool2d([3, 3], [2, 2], [1, 1], [1, 1], false);
        for layer in &self.layers {
            for block in layer {
                x = block.forward(&x, train);
            }
        }
        x
    }

    /// The side of its output for an input side `n`: five halvings, each rounded up.
    pub(crate) fn output_side(n: i64) -> i64 {
        (0..5).fold(n, |n, _| (n + 1) / 2)
    }
}

/// Starts a ResNet-18 registered under `prefix` (its tensors among `state`, named as `keys`
/// says) from torchvision's weights in a file [`crate::read_weights`] reads (safetensors, or
/// torchvision's own `.pth`): every tensor it has is in the file
/// (a BatchNorm's `num_batches_tracked` may be absent), and the file has no tensor but
/// ResNet-18's (`fc.*` is ignored).
///
/// # Errors
/// [`Error::Mismatch`] naming the tensor missing, unknown or of another shape.
pub(crate) fn load_resnet18<'a>(
    state: impl Iterator<Item = (&'a str, &'a Tensor)> + Clone,
    prefix: &str,
    keys: ResNetKeys,
    path: &Path,
) -> Result<()> {
    let file = crate::read_weights(path)?;
    // torchvision's name of a tensor below `prefix`.
    let torchvision = |key: &str| -> Option<String> {
        let rest = key.strip_prefix(prefix)?.strip_prefix('.')?;
        Some(match keys {
            ResNetKeys::Named => rest.to_string(),
            ResNetKeys::Sequential => {
                let (first, tail) = rest.split_once('.')?;
                let named = match first {
                    "0" => "conv1".to_string(),
                    "1" => "bn1".to_string(),
                    n => format!("layer{}", n.parse::<usize>().ok()?.checked_sub(3)?),
                };
                format!("{named}.{tail}")
            }
        })
    };
    let mut known = std::collections::BTreeSet::new();
    for (key, t) in state {
        let Some(name) = torchvision(key) else { continue };
        match file.get(&name) {
            Some(src) => copy_into(t, src, path, &name)?,
            None if name.ends_with("num_batches_tracked") => {}
            None => return Err(Error::Mismatch { path: path.into(), key: name, reason: "missing from the ResNet-18 weights".into() }),
        }
        known.insert(name);
    }
    for name in file.keys() {
        if !(name.starts_with("fc.") || name.ends_with("num_batches_tracked") || known.contains(name)) {
            return Err(Error::Mismatch { path: path.into(), key: name.clone(), reason: "not a ResNet-18 tensor".into() });
        }
    }
    Ok(())
}

/// Copies host values into a variable after checking the shape.
pub(crate) fn copy_into(dst: &Tensor, src: &crate::HostTensor, path: &Path, key: &str) -> Result<()> {
    check_shape(dst, &src.shape, path, key)?;
    copy_values(dst, Tensor::from_slice(&src.values));
    Ok(())
}

fn check_shape(dst: &Tensor, shape: &[usize], path: &Path, key: &str) -> Result<()> {
    let want: Vec<usize> = dst.size().iter().map(|&d| d as usize).collect();
    if want != shape {
        return Err(Error::Mismatch {
            path: path.into(),
            key: key.into(),
            reason: format!("shape {shape:?} in the file, {want:?} in the model"),
        });
    }
    Ok(())
}

fn copy_values(dst: &Tensor, flat: Tensor) {
    let value = flat.view(dst.size().as_slice()).to_kind(dst.kind()).to_device(dst.device());
    tch::no_grad(|| dst.shallow_clone().copy_(&value));
}

/// Copies every tensor of a `model.safetensors` into `state` (a model's keys and variables),
/// refusing a file that lacks one of its keys, has a key it lacks, or a shape that differs.
/// Integer counters are read exactly.
///
/// # Errors
/// [`Error::Mismatch`] naming the key and both shapes.
pub(crate) fn load_state_file<'a>(state: impl Iterator<Item = (&'a str, &'a Tensor)> + Clone, path: &Path) -> Result<()> {
    let file = crate::tensors::read_stored(path)?;
    for key in file.keys() {
        if !state.clone().any(|(k, _)| k == key) {
            return Err(Error::Mismatch { path: path.into(), key: key.clone(), reason: "not in this architecture".into() });
        }
    }
    for (key, t) in state {
        let src =
            file.get(key).ok_or_else(|| Error::Mismatch { path: path.into(), key: key.into(), reason: "missing from the file".into() })?;
        check_shape(t, src.shape(), path, key)?;
        copy_values(
            t,
            match src {
                Stored::F32(host) => Tensor::from_slice(&host.values),
                Stored::I64 { values, .. } => Tensor::from_slice(values),
            },
        );
    }
    Ok(())
}

/// Writes a model's state as `model.safetensors` in the dtypes LeRobot's `save_pretrained`
/// gives them: float32 for every float tensor (whatever the training dtype), int64 for
/// BatchNorm's `num_batches_tracked`.
///
/// # Errors
/// [`Error::Io`] or [`Error::SafeTensors`].
pub(crate) fn write_state_file<'a>(path: &Path, state: impl Iterator<Item = (&'a str, &'a Tensor)>) -> Result<()> {
    let stored: Vec<(&str, Stored)> = state
        .map(|(k, t)| {
            let value = if t.kind() == Kind::Int64 {
                let t = t.to_device(Device::Cpu).contiguous();
                let shape = t.size().iter().map(|&d| d as usize).collect();
                Stored::I64 { shape, values: Vec::<i64>::try_from(t.flatten(0, -1)).expect("an int64 tensor converts") }
            } else {
                Stored::F32(host(t))
            };
            (k, value)
        })
        .collect();
    crate::tensors::write_stored(path, stored.iter().map(|(k, t)| (*k, t)))
}

/// Per-feature normalisation on the policy's device, LeRobot's formulas exactly.
pub(crate) enum Norm {
    MeanStd { mean: Tensor, std: Tensor, eps: f64 },
    Range { lo: Tensor, denom: Tensor, quantile: bool },
}

impl Norm {
    pub(crate) fn build(n: &Normalizer, feature: &str, kind: FeatureType, device: Device, dtype: Kind) -> Result<Option<Norm>> {
        let mode = n.mode_of(feature);
        let get = |stat: &str| -> Result<Tensor> {
            let t = n.stats.get(feature, stat).ok_or_else(|| Error::Stats(format!("{feature}: {mode:?} needs `{stat}`")))?;
            let t = Tensor::from_slice(&t.values).to_kind(dtype).to_device(device);
            Ok(if kind == FeatureType::Visual { t.view([-1, 1, 1]) } else { t })
        };
        let range = |lo: &str, hi: &str, quantile: bool| -> Result<Option<Norm>> {
            let (lo, hi) = (get(lo)?, get(hi)?);
            let d = &hi - &lo;
            let denom = Tensor::full_like(&d, n.eps).where_self(&d.eq(0.0), &d);
            Ok(Some(Norm::Range { lo, denom, quantile }))
        };
        match mode {
            NormalizationMode::Identity => Ok(None),
            NormalizationMode::MeanStd => Ok(Some(Norm::MeanStd { mean: get("mean")?, std: get("std")?, eps: n.eps })),
            NormalizationMode::MinMax => range("min", "max", false),
            NormalizationMode::Quantiles => range("q01", "q99", true),
            NormalizationMode::Quantile10 => range("q10", "q90", true),
        }
    }

    pub(crate) fn normalize(&self, x: &Tensor) -> Tensor {
        match self {
            Norm::MeanStd { mean, std, eps } => (x - mean) / (std + *eps),
            Norm::Range { lo, denom, .. } => (x - lo) * 2.0 / denom - 1.0,
        }
    }

    pub(crate) fn unnormalize(&self, x: &Tensor) -> Tensor {
        match self {
            Norm::MeanStd { mean, std, .. } => x * std + mean,
            Norm::Range { lo, denom, quantile: false } => (x + 1.0) / 2.0 * denom + lo,
            Norm::Range { lo, denom, quantile: true } => (x + 1.0) * denom / 2.0 + lo,
        }
    }
}

pub(crate) fn apply(norm: &Option<Norm>, x: Tensor) -> Tensor {
    match norm {
        Some(n) => n.normalize(&x),
        None => x,
    }
}

/// A libtorch tensor's values on the host, as f32.
pub(crate) fn host(t: &Tensor) -> crate::HostTensor {
    let t = t.to_kind(Kind::Float).to_device(tch::Device::Cpu).contiguous();
    let shape: Vec<usize> = t.size().iter().map(|&d| d as usize).collect();
    let values = Vec::<f32>::try_from(t.flatten(0, -1)).expect("a float tensor converts");
    crate::HostTensor { shape, values }
}
