//! The Diffusion network (LeRobot's `DiffusionModel`, attribute `diffusion` of the policy): the
//! RGB encoder (ResNet-18 with GroupNorm, spatial softmax), the conditional 1-D U-Net with FiLM,
//! and the loss and sampling of `docs/design/diffusion.md`, over normalised inputs.

use tch::{Kind, Tensor};

use super::scheduler::Ddpm;
use crate::{
    DiffusionConfig,
    layers::{Linear, Registry, ResNet18, ResNetKeys, ResNetNorm},
};

/// `nn.Conv1d` with PyTorch's default init: weight and bias uniform in ±1/√(in·k).
struct Conv1d {
    w: Tensor,
    b: Tensor,
    stride: i64,
    padding: i64,
}

impl Conv1d {
    fn new(r: &mut Registry, prefix: &str, in_c: i64, out_c: i64, k: i64, stride: i64, padding: i64) -> Self {
        let bound = 1.0 / ((in_c * k) as f64).sqrt();
        let w = r.uniform(&[out_c, in_c, k], bound);
        let w = r.param(&format!("{prefix}.weight"), w);
        let b = r.uniform(&[out_c], bound);
        Conv1d { w, b: r.param(&format!("{prefix}.bias"), b), stride, padding }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        x.conv1d(&self.w, Some(&self.b), [self.stride], [self.padding], [1], 1)
    }
}

/// `nn.ConvTranspose1d(c, c, 4, 2, 1)`: doubles the horizon. Its weight is `[in, out, k]`, so
/// PyTorch's default init bounds it by 1/√(out·k).
struct Upsample {
    w: Tensor,
    b: Tensor,
}

impl Upsample {
    fn new(r: &mut Registry, prefix: &str, c: i64) -> Self {
        let bound = 1.0 / ((c * 4) as f64).sqrt();
        let w = r.uniform(&[c, c, 4], bound);
        let w = r.param(&format!("{prefix}.weight"), w);
        let b = r.uniform(&[c], bound);
        Upsample { w, b: r.param(&format!("{prefix}.bias"), b) }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        x.conv_transpose1d(&self.w, Some(&self.b), [2], [1], [0], 1, [1])
    }
}

/// `Conv1d → GroupNorm → Mish` (`DiffusionConv1dBlock`, keys `block.0` and `block.1`).
struct ConvBlock {
    conv: Conv1d,
    norm_w: Tensor,
    norm_b: Tensor,
    groups: i64,
}

impl ConvBlock {
    fn new(r: &mut Registry, prefix: &str, in_c: i64, out_c: i64, k: i64, groups: i64) -> Self {
        let conv = Conv1d::new(r, &format!("{prefix}.block.0"), in_c, out_c, k, 1, k / 2);
        let (w, b) = (r.ones(&[out_c]), r.zeros(&[out_c]));
        let norm_w = r.param(&format!("{prefix}.block.1.weight"), w);
        let norm_b = r.param(&format!("{prefix}.block.1.bias"), b);
        ConvBlock { conv, norm_w, norm_b, groups }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        self.conv.forward(x).group_norm(self.groups, Some(&self.norm_w), Some(&self.norm_b), 1e-5, true).mish()
    }
}

/// `DiffusionConditionalResidualBlock1d`: two conv blocks with the condition's FiLM between
/// them, plus the input (through a 1×1 convolution when the channels change).
struct ResidualBlock {
    conv1: ConvBlock,
    cond: Linear,
    conv2: ConvBlock,
    residual: Option<Conv1d>,
    out_c: i64,
    film_scale: bool,
}

impl ResidualBlock {
    fn new(r: &mut Registry, prefix: &str, in_c: i64, out_c: i64, cond_dim: i64, c: &DiffusionConfig) -> Self {
        let (k, groups) = (c.kernel_size as i64, c.n_groups as i64);
        let conv1 = ConvBlock::new(r, &format!("{prefix}.conv1"), in_c, out_c, k, groups);
        let cond_c = if c.use_film_scale_modulation { 2 * out_c } else { out_c };
        let cond = r.linear(&format!("{prefix}.cond_encoder.1"), cond_dim, cond_c, false);
        let conv2 = ConvBlock::new(r, &format!("{prefix}.conv2"), out_c, out_c, k, groups);
        let residual = (in_c != out_c).then(|| Conv1d::new(r, &format!("{prefix}.residual_conv"), in_c, out_c, 1, 1, 0));
        ResidualBlock { conv1, cond, conv2, residual, out_c, film_scale: c.use_film_scale_modulation }
    }

    fn forward(&self, x: &Tensor, cond: &Tensor) -> Tensor {
        let out = self.conv1.forward(x);
        let embed = self.cond.forward(&cond.mish()).unsqueeze(-1);
        let out = if self.film_scale {
            let scale = embed.narrow(1, 0, self.out_c);
            let bias = embed.narrow(1, self.out_c, self.out_c);
            scale * out + bias
        } else {
            out + embed
        };
        let out = self.conv2.forward(&out);
        let skip = match &self.residual {
            Some(conv) => conv.forward(x),
            None => x.shallow_clone(),
        };
        out + skip
    }
}

/// `DiffusionConditionalUnet1d`.
struct Unet {
    step_dim: i64,
    step_in: Linear,
    step_out: Linear,
    down: Vec<(ResidualBlock, ResidualBlock, Option<Conv1d>)>,
    mid: Vec<ResidualBlock>,
    up: Vec<(ResidualBlock, ResidualBlock, Upsample)>,
    final_block: ConvBlock,
    final_conv: Conv1d,
}

impl Unet {
    fn new(r: &mut Registry, c: &DiffusionConfig, global_cond_dim: i64) -> Self {
        let p = "diffusion.unet";
        let e = c.diffusion_step_embed_dim as i64;
        let step_in = r.linear(&format!("{p}.diffusion_step_encoder.1"), e, 4 * e, false);
        let step_out = r.linear(&format!("{p}.diffusion_step_encoder.3"), 4 * e, e, false);
        let cond_dim = e + global_cond_dim;
        let dims: Vec<i64> = c.down_dims.iter().map(|&d| d as i64).collect();
        let action_dim = c.action_feature().expect("validated").shape[0] as i64;
        let in_out: Vec<(i64, i64)> = std::iter::once((action_dim, dims[0])).chain(dims.windows(2).map(|w| (w[0], w[1]))).collect();
        let mut down = Vec::new();
        for (i, &(d_in, d_out)) in in_out.iter().enumerate() {
            let last = i + 1 >= in_out.len();
            let q = format!("{p}.down_modules.{i}");
            down.push((
                ResidualBlock::new(r, &format!("{q}.0"), d_in, d_out, cond_dim, c),
                ResidualBlock::new(r, &format!("{q}.1"), d_out, d_out, cond_dim, c),
                (!last).then(|| Conv1d::new(r, &format!("{q}.2"), d_out, d_out, 3, 2, 1)),
            ));
        }
        let deepest = *dims.last().expect("validated");
        let mid = (0..2).map(|i| ResidualBlock::new(r, &format!("{p}.mid_modules.{i}"), deepest, deepest, cond_dim, c)).collect();
        // Every stage on the way up doubles the horizon: LeRobot's `is_last` is never true there.
        let mut up = Vec::new();
        for (i, &(d_out, d_in)) in in_out[1..].iter().rev().enumerate() {
            let q = format!("{p}.up_modules.{i}");
            up.push((
                ResidualBlock::new(r, &format!("{q}.0"), d_in * 2, d_out, cond_dim, c),
                ResidualBlock::new(r, &format!("{q}.1"), d_out, d_out, cond_dim, c),
                Upsample::new(r, &format!("{q}.2"), d_out),
            ));
        }
        // LeRobot builds the last block with the default 8 groups, whatever `n_groups` is.
        let final_block = ConvBlock::new(r, &format!("{p}.final_conv.0"), dims[0], dims[0], c.kernel_size as i64, 8);
        let final_conv = Conv1d::new(r, &format!("{p}.final_conv.1"), dims[0], action_dim, 1, 1, 0);
        Unet { step_dim: e, step_in, step_out, down, mid, up, final_block, final_conv }
    }

    /// The 1-D sinusoid of the diffusion steps (`DiffusionSinusoidalPosEmb`), float32.
    fn step_embedding(&self, timesteps: &Tensor) -> Tensor {
        let half = self.step_dim / 2;
        let scale = (10000f64).ln() / (half - 1) as f64;
        let freqs = (Tensor::arange(half, (Kind::Int64, timesteps.device())) * -scale).exp();
        let emb = timesteps.unsqueeze(-1) * freqs.unsqueeze(0);
        Tensor::cat(&[emb.sin(), emb.cos()], -1)
    }

    /// `x` `[B, T, A]`, `timesteps` `[B]` int64, `global_cond` `[B, G]` → `[B, T, A]`.
    fn forward(&self, x: &Tensor, timesteps: &Tensor, global_cond: &Tensor) -> Tensor {
        let mut x = x.transpose(1, 2);
        let embed = self.step_out.forward(&self.step_in.forward(&self.step_embedding(timesteps).to_kind(x.kind())).mish());
        let cond = Tensor::cat(&[embed, global_cond.shallow_clone()], -1);
        let mut skips = Vec::with_capacity(self.down.len());
        for (res1, res2, downsample) in &self.down {
            x = res2.forward(&res1.forward(&x, &cond), &cond);
            skips.push(x.shallow_clone());
            if let Some(d) = downsample {
                x = d.forward(&x);
            }
        }
        for block in &self.mid {
            x = block.forward(&x, &cond);
        }
        for (res1, res2, upsample) in &self.up {
            let skip = skips.pop().expect("one skip per stage");
            x = upsample.forward(&res2.forward(&res1.forward(&Tensor::cat(&[x, skip], 1), &cond), &cond));
        }
        self.final_conv.forward(&self.final_block.forward(&x)).transpose(1, 2)
    }
}

/// `DiffusionRgbEncoder`: crop, backbone, spatial softmax keypoints, a linear layer and ReLU.
struct RgbEncoder {
    backbone: ResNet18,
    kp_w: Tensor,
    kp_b: Tensor,
    pos_grid: Tensor,
    out: Linear,
    keypoints: i64,
}

/// The spatial softmax's grid: `x` then `y` of every feature-map cell, row by row, each from
/// −1 to 1 as numpy's `linspace` computes them in f64, stored as float32.
fn pos_grid(h: i64, w: i64) -> Vec<f32> {
    let linspace = |n: i64| -> Vec<f64> {
        if n == 1 {
            return vec![-1.0];
        }
        let step = 2.0 / (n - 1) as f64;
        (0..n).map(|i| if i == n - 1 { 1.0 } else { i as f64 * step - 1.0 }).collect()
    };
    let (xs, ys) = (linspace(w), linspace(h));
    ys.iter().flat_map(|&y| xs.iter().flat_map(move |&x| [x as f32, y as f32])).collect()
}

impl RgbEncoder {
    fn new(r: &mut Registry, prefix: &str, c: &DiffusionConfig) -> Self {
        let norm = if c.use_group_norm { ResNetNorm::Group } else { ResNetNorm::Batch };
        let backbone = ResNet18::new(r, &format!("{prefix}.backbone"), ResNetKeys::Sequential, norm);
        let [h, w] = c.backbone_input_shape().expect("validated: a camera");
        let (fh, fw) = (ResNet18::output_side(h as i64), ResNet18::output_side(w as i64));
        let k = c.spatial_softmax_num_keypoints as i64;
        let bound = 1.0 / 512f64.sqrt();
        let kp_w = r.uniform(&[k, 512, 1, 1], bound);
        let kp_w = r.param(&format!("{prefix}.pool.nets.weight"), kp_w);
        let kp_b = r.uniform(&[k], bound);
        let kp_b = r.param(&format!("{prefix}.pool.nets.bias"), kp_b);
        let grid = Tensor::from_slice(&pos_grid(fh, fw)).view([fh * fw, 2]);
        let pos_grid = r.buffer(&format!("{prefix}.pool.pos_grid"), grid);
        let out = r.linear(&format!("{prefix}.out"), 2 * k, 2 * k, false);
        RgbEncoder { backbone, kp_w, kp_b, pos_grid, out, keypoints: k }
    }

    /// `[M, 3, H, W]` (already cropped) → `[M, 2K]`; `train` as the module's mode.
    fn forward(&self, x: &Tensor, train: bool) -> Tensor {
        let f = self.backbone.forward(x, train).conv2d(&self.kp_w, Some(&self.kp_b), [1], [0], [1], 1);
        let cells = f.size()[2] * f.size()[3];
        let attention = f.reshape([-1, cells]).softmax(-1, None::<Kind>);
        let keypoints = attention.matmul(&self.pos_grid).view([-1, self.keypoints, 2]);
        self.out.forward(&keypoints.flatten(1, -1)).relu()
    }
}

/// The normalised inputs of one forward pass, a window of `n_obs_steps` observations each.
pub(crate) struct ModelInput {
    /// `[B, S, D]`.
    pub state: Tensor,
    /// `[B, S, N, 3, H, W]`, every camera in config order (none without cameras).
    pub images: Option<Tensor>,
    /// `[B, S, E]`.
    pub env_state: Option<Tensor>,
}

/// Where the crop of every camera starts, `(top, left)`: one for the whole batch, as
/// torchvision's `RandomCrop` takes one.
pub(crate) type CropAt = (i64, i64);

/// The network (LeRobot's `DiffusionModel`).
pub(crate) struct Model {
    encoders: Vec<RgbEncoder>,
    unet: Unet,
    pub(super) ddpm: Ddpm,
    crop: Option<(i64, i64)>,
    horizon: i64,
    n_obs_steps: i64,
    n_action_steps: i64,
    inference_steps: i64,
}

impl Model {
    pub(crate) fn new(r: &mut Registry, c: &DiffusionConfig) -> Self {
        let cameras = c.image_features().len();
        let encoders = match (cameras, c.use_separate_rgb_encoder_per_camera) {
            (0, _) => Vec::new(),
            (n, true) => (0..n).map(|i| RgbEncoder::new(r, &format!("diffusion.rgb_encoder.{i}"), c)).collect(),
            (_, false) => vec![RgbEncoder::new(r, "diffusion.rgb_encoder", c)],
        };
        let per_step = c.robot_state_feature().map_or(0, |f| f.shape[0])
            + cameras * 2 * c.spatial_softmax_num_keypoints
            + c.env_state_feature().map_or(0, |(_, f)| f.shape[0]);
        let unet = Unet::new(r, c, (per_step * c.n_obs_steps) as i64);
        Model {
            encoders,
            unet,
            ddpm: Ddpm::new(c),
            crop: c.crop_shape.map(|[h, w]| (h as i64, w as i64)),
            horizon: c.horizon as i64,
            n_obs_steps: c.n_obs_steps as i64,
            n_action_steps: c.n_action_steps as i64,
            inference_steps: c.num_inference_steps.unwrap_or(c.num_train_timesteps) as i64,
        }
    }

    /// Where the crop starts: centred (Python's `round`, halves to even) unless `at` is given.
    fn cropped(&self, images: &Tensor, at: Option<CropAt>) -> Tensor {
        let Some((th, tw)) = self.crop else { return images.shallow_clone() };
        let (h, w) = (images.size()[images.dim() - 2], images.size()[images.dim() - 1]);
        let (top, left) = at.unwrap_or_else(|| {
            let centre = |outer: i64, inner: i64| ((outer - inner) as f64 / 2.0).round_ties_even() as i64;
            (centre(h, th), centre(w, tw))
        });
        images.narrow(-2, top, th).narrow(-1, left, tw)
    }

    /// The crop a training step takes: drawn from libtorch's generator as torchvision's
    /// `RandomCrop.get_params` draws it (top, then left), or none when the crop is the image.
    pub(crate) fn random_crop(&self, images: &Tensor) -> Option<CropAt> {
        let (th, tw) = self.crop?;
        let (h, w) = (images.size()[images.dim() - 2], images.size()[images.dim() - 1]);
        if (h, w) == (th, tw) {
            return Some((0, 0));
        }
        let draw = |n: i64| Tensor::randint(n, [1], (Kind::Int64, tch::Device::Cpu)).int64_value(&[0]);
        let top = draw(h - th + 1);
        Some((top, draw(w - tw + 1)))
    }

    /// `[B, S·(D + N·2K + E)]`: each observation step's state, camera features and environment
    /// state, steps one after another; `train` as the module's mode (a BatchNorm backbone's).
    pub(crate) fn global_cond(&self, x: &ModelInput, crop: Option<CropAt>, train: bool) -> Tensor {
        let (b, s) = (x.state.size()[0], x.state.size()[1]);
        let mut parts = vec![x.state.shallow_clone()];
        if let Some(images) = &x.images {
            let images = self.cropped(images, crop);
            let size = images.size();
            let n = size[2];
            let features = if self.encoders.len() == 1 {
                let flat = images.reshape([b * s * n, size[3], size[4], size[5]]);
                self.encoders[0].forward(&flat, train).reshape([b, s, -1])
            } else {
                let per_camera: Vec<Tensor> = (0..n)
                    .map(|i| {
                        self.encoders[i as usize]
                            .forward(&images.select(2, i).reshape([b * s, size[3], size[4], size[5]]), train)
                            .reshape([b, s, -1])
                    })
                    .collect();
                Tensor::cat(&per_camera, -1)
            };
            parts.push(features);
        }
        if let Some(env) = &x.env_state {
            parts.push(env.shallow_clone());
        }
        Tensor::cat(&parts, -1).flatten(1, -1)
    }

    /// The squared errors (`[B, horizon, A]`) of `actions` (normalised) given the observations:
    /// the actions noised at `timesteps` (`[B]`) with `noise`, the network's prediction of the
    /// noise (or of the actions) against it; `train` as the module's mode.
    pub(crate) fn squared_errors(
        &self,
        x: &ModelInput,
        actions: &Tensor,
        noise: &Tensor,
        timesteps: &Tensor,
        crop: Option<CropAt>,
        train: bool,
    ) -> Tensor {
        let cond = self.global_cond(x, crop, train);
        let noisy = self.ddpm.add_noise(actions, noise, timesteps);
        let prediction = self.unet.forward(&noisy, timesteps, &cond);
        let target = if self.ddpm.predicts_noise() { noise } else { actions };
        (prediction - target).square()
    }

    /// The denoised actions `[B, n_action_steps, A]` from the current observation step on:
    /// `start` (`[B, horizon, A]`) denoised over the inference's steps, each step but the last
    /// adding `noise(k)` (the k-th draw, `[B, horizon, A]`).
    pub(crate) fn sample(&self, x: &ModelInput, start: Tensor, mut noise: impl FnMut(usize) -> Tensor) -> Tensor {
        let cond = self.global_cond(x, None, false);
        let b = start.size()[0];
        let mut sample = start;
        for (k, t) in self.ddpm.inference_steps(self.inference_steps).into_iter().enumerate() {
            let steps = Tensor::full([b], t, (Kind::Int64, sample.device()));
            let output = self.unet.forward(&sample, &steps, &cond);
            let draw = if t > 0 { noise(k) } else { Tensor::zeros_like(&sample) };
            sample = self.ddpm.step(&output, t, self.inference_steps, &sample, &draw);
        }
        sample.narrow(1, self.n_obs_steps - 1, self.n_action_steps)
    }

    /// Actions the network denoises per sample.
    pub(crate) fn horizon(&self) -> i64 {
        self.horizon
    }

    /// Denoising steps of an inference.
    pub(crate) fn inference_steps(&self) -> i64 {
        self.inference_steps
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_keypoint_grid_runs_x_fastest_from_minus_one_to_one() {
        let g = pos_grid(2, 3);
        assert_eq!(g, [-1.0, -1.0, 0.0, -1.0, 1.0, -1.0, -1.0, 1.0, 0.0, 1.0, 1.0, 1.0]);
        assert_eq!(pos_grid(1, 1), [-1.0, -1.0]);
    }
}
