//! The ACT network: parameters under LeRobot's state-dict names, registered in its
//! `named_parameters` order, and the forward pass of `docs/design/act.md` §2.

use std::f64::consts::PI;

use tch::{Device, Kind, Tensor};

use crate::{
    ActConfig,
    layers::{Linear, Registry, ResNet18, ResNetKeys, ResNetNorm},
};

impl Registry<'_> {
    fn layer_norm(&mut self, prefix: &str, d: i64) -> LayerNorm {
        let (w, b) = (self.ones(&[d]), self.zeros(&[d]));
        LayerNorm { w: self.param(&format!("{prefix}.weight"), w), b: self.param(&format!("{prefix}.bias"), b) }
    }

    fn embedding(&mut self, key: &str, n: i64, d: i64) -> Tensor {
        let t = self.normal(&[n, d], 1.0);
        self.param(key, t)
    }

    /// `nn.MultiheadAttention`: `in_proj_weight` xavier-uniform, biases zero, `out_proj.weight`
    /// the Linear default (or xavier where ACT re-initialises it).
    fn attention(&mut self, prefix: &str, d: i64, xavier_out: bool) -> Attention {
        let in_w = self.xavier(&[3 * d, d]);
        let in_w = self.param(&format!("{prefix}.in_proj_weight"), in_w);
        let in_b = self.zeros(&[3 * d]);
        let in_b = self.param(&format!("{prefix}.in_proj_bias"), in_b);
        let out_w = if xavier_out { self.xavier(&[d, d]) } else { self.uniform(&[d, d], 1.0 / (d as f64).sqrt()) };
        let out_w = self.param(&format!("{prefix}.out_proj.weight"), out_w);
        let out_b = self.zeros(&[d]);
        let out_b = self.param(&format!("{prefix}.out_proj.bias"), out_b);
        Attention { in_w, in_b, out_w, out_b }
    }
}

struct LayerNorm {
    w: Tensor,
    b: Tensor,
}

impl LayerNorm {
    fn forward(&self, x: &Tensor) -> Tensor {
        let d = self.w.size()[0];
        x.layer_norm([d], Some(&self.w), Some(&self.b), 1e-5, true)
    }
}

struct Attention {
    in_w: Tensor,
    in_b: Tensor,
    out_w: Tensor,
    out_b: Tensor,
}

impl Attention {
    /// Sequence-first multi-head attention as `torch.nn.functional.multi_head_attention_forward`
    /// computes it with `need_weights=True`; `key_padding_mask` is `[B, S]`, `true` = ignore.
    fn forward(&self, q: &Tensor, k: &Tensor, v: &Tensor, key_padding_mask: Option<&Tensor>, s: LayerSpec, train: bool) -> Tensor {
        let (heads, p) = (s.heads, s.dropout);
        let (tq, b, d) = q.size3().expect("queries are (S, B, D)");
        let tk = k.size()[0];
        let hd = d / heads;
        let w = self.in_w.chunk(3, 0);
        let bias = self.in_b.chunk(3, 0);
        let q = q.linear(&w[0], Some(&bias[0]));
        let k = k.linear(&w[1], Some(&bias[1]));
        let v = v.linear(&w[2], Some(&bias[2]));
        let q = q.contiguous().view([tq, b * heads, hd]).transpose(0, 1);
        let k = k.contiguous().view([tk, b * heads, hd]).transpose(0, 1);
        let v = v.contiguous().view([tk, b * heads, hd]).transpose(0, 1);
        let q = q * (1.0 / hd as f64).sqrt();
        let kt = k.transpose(-2, -1);
        let scores = match key_padding_mask {
            Some(mask) => {
                let m = Tensor::zeros([b, tk], (q.kind(), q.device())).masked_fill(mask, f64::NEG_INFINITY);
                let m = m.view([b, 1, 1, tk]).expand([b, heads, 1, tk], false).reshape([b * heads, 1, tk]);
                m.baddbmm(&q, &kt, 1.0, 1.0)
            }
            None => q.bmm(&kt),
        };
        let attn = scores.softmax(-1, None::<Kind>);
        let attn = if train && p > 0.0 { attn.dropout(p, true) } else { attn };
        let out = attn.bmm(&v).transpose(0, 1).contiguous().view([tq * b, d]);
        out.linear(&self.out_w, Some(&self.out_b)).view([tq, b, d])
    }
}

/// What every transformer layer needs to know.
#[derive(Clone, Copy)]
struct LayerSpec {
    heads: i64,
    dropout: f64,
    pre_norm: bool,
    gelu: bool,
}

impl LayerSpec {
    fn act(&self, x: &Tensor) -> Tensor {
        if self.gelu { x.gelu("none") } else { x.relu() }
    }

    fn drop(&self, x: Tensor, train: bool) -> Tensor {
        if train && self.dropout > 0.0 { x.dropout(self.dropout, true) } else { x }
    }

    /// The position-wise feed-forward block: `linear2(drop(act(linear1(y))))`.
    fn feed_forward(&self, linear1: &Linear, linear2: &Linear, y: &Tensor, train: bool) -> Tensor {
        linear2.forward(&self.drop(self.act(&linear1.forward(y)), train))
    }

    /// One residual sub-layer as PyTorch's transformer layers have it: `x + f(norm(x))` before
    /// the sub-layer with `pre_norm`, `norm(x + f(x))` after it without.
    fn residual(&self, x: Tensor, norm: &LayerNorm, train: bool, f: impl FnOnce(&Tensor) -> Tensor) -> Tensor {
        if self.pre_norm {
            let y = norm.forward(&x);
            x + self.drop(f(&y), train)
        } else {
            let out = f(&x);
            norm.forward(&(x + self.drop(out, train)))
        }
    }
}

struct EncoderLayer {
    self_attn: Attention,
    linear1: Linear,
    linear2: Linear,
    norm1: LayerNorm,
    norm2: LayerNorm,
}

impl EncoderLayer {
    fn new(r: &mut Registry, prefix: &str, c: &ActConfig, xavier: bool) -> Self {
        let (d, f) = (c.dim_model as i64, c.dim_feedforward as i64);
        EncoderLayer {
            self_attn: r.attention(&format!("{prefix}.self_attn"), d, xavier),
            linear1: r.linear(&format!("{prefix}.linear1"), d, f, xavier),
            linear2: r.linear(&format!("{prefix}.linear2"), f, d, xavier),
            norm1: r.layer_norm(&format!("{prefix}.norm1"), d),
            norm2: r.layer_norm(&format!("{prefix}.norm2"), d),
        }
    }

    fn forward(&self, x: &Tensor, pos: &Tensor, mask: Option<&Tensor>, s: LayerSpec, train: bool) -> Tensor {
        let x = s.residual(x.shallow_clone(), &self.norm1, train, |y| {
            let qk = y + pos;
            self.self_attn.forward(&qk, &qk, y, mask, s, train)
        });
        s.residual(x, &self.norm2, train, |y| s.feed_forward(&self.linear1, &self.linear2, y, train))
    }
}

struct Encoder {
    layers: Vec<EncoderLayer>,
    norm: Option<LayerNorm>,
}

impl Encoder {
    fn new(r: &mut Registry, prefix: &str, n: usize, c: &ActConfig, xavier: bool) -> Self {
        let layers = (0..n).map(|i| EncoderLayer::new(r, &format!("{prefix}.layers.{i}"), c, xavier)).collect();
        let norm = c.pre_norm.then(|| r.layer_norm(&format!("{prefix}.norm"), c.dim_model as i64));
        Encoder { layers, norm }
    }

    fn forward(&self, x: &Tensor, pos: &Tensor, mask: Option<&Tensor>, s: LayerSpec, train: bool) -> Tensor {
        let mut x = x.shallow_clone();
        for l in &self.layers {
            x = l.forward(&x, pos, mask, s, train);
        }
        match &self.norm {
            Some(n) => n.forward(&x),
            None => x,
        }
    }
}

struct DecoderLayer {
    self_attn: Attention,
    cross_attn: Attention,
    linear1: Linear,
    linear2: Linear,
    norm1: LayerNorm,
    norm2: LayerNorm,
    norm3: LayerNorm,
}

impl DecoderLayer {
    fn new(r: &mut Registry, prefix: &str, c: &ActConfig) -> Self {
        let (d, f) = (c.dim_model as i64, c.dim_feedforward as i64);
        DecoderLayer {
            self_attn: r.attention(&format!("{prefix}.self_attn"), d, true),
            cross_attn: r.attention(&format!("{prefix}.multihead_attn"), d, true),
            linear1: r.linear(&format!("{prefix}.linear1"), d, f, true),
            linear2: r.linear(&format!("{prefix}.linear2"), f, d, true),
            norm1: r.layer_norm(&format!("{prefix}.norm1"), d),
            norm2: r.layer_norm(&format!("{prefix}.norm2"), d),
            norm3: r.layer_norm(&format!("{prefix}.norm3"), d),
        }
    }

    fn forward(&self, x: &Tensor, memory: &Tensor, qpos: &Tensor, mpos: &Tensor, s: LayerSpec, train: bool) -> Tensor {
        let x = s.residual(x.shallow_clone(), &self.norm1, train, |y| {
            let qk = y + qpos;
            self.self_attn.forward(&qk, &qk, y, None, s, train)
        });
        let x = s.residual(x, &self.norm2, train, |y| self.cross_attn.forward(&(y + qpos), &(memory + mpos), memory, None, s, train));
        s.residual(x, &self.norm3, train, |y| s.feed_forward(&self.linear1, &self.linear2, y, train))
    }
}

struct Vae {
    encoder: Encoder,
    cls: Tensor,
    state_proj: Option<Linear>,
    action_proj: Linear,
    latent_out: Linear,
    pos_enc: Tensor,
}

/// The normalised inputs of one forward pass.
pub(crate) struct ModelInput {
    pub state: Option<Tensor>,
    pub env_state: Option<Tensor>,
    pub images: Vec<Tensor>,
    pub action: Option<Tensor>,
    pub action_is_pad: Option<Tensor>,
}

/// The network (LeRobot's `ACT` module, attribute `model` of the policy).
pub(crate) struct Model {
    spec: LayerSpec,
    latent_dim: i64,
    dim_model: i64,
    chunk_size: i64,
    vae: Option<Vae>,
    backbone: Option<ResNet18>,
    encoder: Encoder,
    decoder_layers: Vec<DecoderLayer>,
    decoder_norm: LayerNorm,
    enc_state_proj: Option<Linear>,
    enc_env_proj: Option<Linear>,
    enc_latent_proj: Linear,
    img_proj: Option<(Tensor, Tensor)>,
    pos_1d: Tensor,
    decoder_pos: Tensor,
    action_head: Linear,
}

/// The 1-D sinusoid of the VAE encoder, computed in f64 as LeRobot does with numpy.
pub(crate) fn sinusoid_1d(n: usize, d: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(n * d);
    for pos in 0..n {
        for j in 0..d {
            let angle = pos as f64 / 10000f64.powf((2 * (j / 2)) as f64 / d as f64);
            out.push(if j % 2 == 0 { angle.sin() } else { angle.cos() });
        }
    }
    out
}

/// ACT's 2-D sinusoid for an `h×w` feature map, `(1, D, h, w)`, computed in f32 with the
/// operations LeRobot's `ACTSinusoidalPositionEmbedding2d` uses.
fn sinusoid_2d(h: i64, w: i64, d_model: i64, device: Device) -> Tensor {
    let d = d_model / 2;
    let opts = (Kind::Float, device);
    let not_mask = Tensor::ones([1, h, w], opts);
    let y = not_mask.cumsum(1, Kind::Float);
    let x = not_mask.cumsum(2, Kind::Float);
    let y = &y / (y.narrow(1, h - 1, 1) + 1e-6) * (2.0 * PI);
    let x = &x / (x.narrow(2, w - 1, 1) + 1e-6) * (2.0 * PI);
    let exponent = Tensor::arange(d, opts).floor_divide_scalar(2) * 2.0 / d as f64;
    let inv_freq = Tensor::pow_scalar(10000.0, &exponent);
    let embed = |r: &Tensor| {
        let r = r.unsqueeze(-1) / &inv_freq;
        let sin = r.slice(3, 0, None, 2).sin();
        let cos = r.slice(3, 1, None, 2).cos();
        Tensor::stack(&[sin, cos], -1).flatten(3, -1)
    };
    Tensor::cat(&[embed(&y), embed(&x)], 3).permute([0, 3, 1, 2])
}

impl Model {
    /// Registers every tensor in LeRobot's order with its init (§2.7).
    pub fn new(r: &mut Registry, c: &ActConfig) -> Self {
        let d = c.dim_model as i64;
        let a = c.action_feature().expect("validated: action feature").shape[0] as i64;
        let state = c.robot_state_feature().map(|f| f.shape[0] as i64);
        let env = c.env_state_feature().map(|(_, f)| f.shape[0] as i64);
        let has_images = !c.image_features().is_empty();
        let vae = c.use_vae.then(|| {
            let encoder = Encoder::new(r, "model.vae_encoder", c.n_vae_encoder_layers, c, false);
            let cls = r.embedding("model.vae_encoder_cls_embed.weight", 1, d);
            let state_proj = state.map(|s| r.linear("model.vae_encoder_robot_state_input_proj", s, d, false));
            let action_proj = r.linear("model.vae_encoder_action_input_proj", a, d, false);
            let latent_out = r.linear("model.vae_encoder_latent_output_proj", d, 2 * c.latent_dim as i64, false);
            let n = 1 + c.chunk_size + usize::from(state.is_some());
            let table: Vec<f32> = sinusoid_1d(n, c.dim_model).into_iter().map(|v| v as f32).collect();
            let pos_enc = r.buffer("model.vae_encoder_pos_enc", Tensor::from_slice(&table).view([1, n as i64, d]));
            Vae { encoder, cls, state_proj, action_proj, latent_out, pos_enc }
        });
        let backbone = has_images.then(|| ResNet18::new(r, "model.backbone", ResNetKeys::Named, ResNetNorm::FrozenBatch));
        let encoder = Encoder::new(r, "model.encoder", c.n_encoder_layers, c, true);
        let decoder_layers = (0..c.n_decoder_layers).map(|i| DecoderLayer::new(r, &format!("model.decoder.layers.{i}"), c)).collect();
        let decoder_norm = r.layer_norm("model.decoder.norm", d);
        let enc_state_proj = state.map(|s| r.linear("model.encoder_robot_state_input_proj", s, d, false));
        let enc_env_proj = env.map(|e| r.linear("model.encoder_env_state_input_proj", e, d, false));
        let enc_latent_proj = r.linear("model.encoder_latent_input_proj", c.latent_dim as i64, d, false);
        let img_proj = has_images.then(|| {
            let bound = 1.0 / 512f64.sqrt();
            let w = r.uniform(&[d, 512, 1, 1], bound);
            let w = r.param("model.encoder_img_feat_input_proj.weight", w);
            let b = r.uniform(&[d], bound);
            (w, r.param("model.encoder_img_feat_input_proj.bias", b))
        });
        let n1d = 1 + i64::from(state.is_some()) + i64::from(env.is_some());
        let pos_1d = r.embedding("model.encoder_1d_feature_pos_embed.weight", n1d, d);
        let decoder_pos = r.embedding("model.decoder_pos_embed.weight", c.chunk_size as i64, d);
        let action_head = r.linear("model.action_head", d, a, false);
        Model {
            spec: LayerSpec { heads: c.n_heads as i64, dropout: c.dropout, pre_norm: c.pre_norm, gelu: c.feedforward_activation == "gelu" },
            latent_dim: c.latent_dim as i64,
            dim_model: d,
            chunk_size: c.chunk_size as i64,
            vae,
            backbone,
            encoder,
            decoder_layers,
            decoder_norm,
            enc_state_proj,
            enc_env_proj,
            enc_latent_proj,
            img_proj,
            pos_1d,
            decoder_pos,
            action_head,
        }
    }

    /// `ACT.forward`: normalised actions `(B, C, A)` and, when the VAE encoder ran, `(mu,
    /// log σ²)`. The VAE runs only when training with actions; `noise` replaces the ε drawn
    /// from libtorch's generator.
    pub fn forward(&self, x: &ModelInput, train: bool, noise: Option<&Tensor>) -> (Tensor, Option<(Tensor, Tensor)>) {
        let s = self.spec;
        let (b, kind, device) = match (x.images.first(), &x.env_state) {
            (Some(img), _) => (img.size()[0], img.kind(), img.device()),
            (None, Some(env)) => (env.size()[0], env.kind(), env.device()),
            (None, None) => unreachable!("validated: a camera or an environment state"),
        };
        let mut latent = None;
        if let (Some(vae), Some(action), true) = (&self.vae, &x.action, train) {
            let mut tokens = vec![vae.cls.unsqueeze(0).repeat([b, 1, 1])];
            if let (Some(proj), Some(state)) = (&vae.state_proj, &x.state) {
                tokens.push(proj.forward(state).unsqueeze(1));
            }
            tokens.push(vae.action_proj.forward(action));
            let n_prefix = tokens.len() as i64 - 1;
            let input = Tensor::cat(&tokens, 1).permute([1, 0, 2]);
            let pos = vae.pos_enc.permute([1, 0, 2]);
            let prefix = Tensor::zeros([b, n_prefix], (Kind::Bool, device));
            let pad = match &x.action_is_pad {
                Some(p) => p.shallow_clone(),
                None => Tensor::zeros([b, self.chunk_size], (Kind::Bool, device)),
            };
            let mask = Tensor::cat(&[prefix, pad], 1);
            let cls_out = vae.encoder.forward(&input, &pos, Some(&mask), s, train).get(0);
            let params = vae.latent_out.forward(&cls_out);
            let mu = params.narrow(1, 0, self.latent_dim);
            let log_sigma_x2 = params.narrow(1, self.latent_dim, self.latent_dim);
            let eps = match noise {
                Some(n) => n.to_kind(mu.kind()).to_device(device),
                None => mu.randn_like(),
            };
            let z = &mu + (&log_sigma_x2 / 2.0).exp() * eps;
            latent = Some((z, (mu, log_sigma_x2)));
        }
        let (z, dist) = match latent {
            Some((z, dist)) => (z, Some(dist)),
            None => (Tensor::zeros([b, self.latent_dim], (kind, device)), None),
        };

        let mut tokens_1d = vec![self.enc_latent_proj.forward(&z)];
        if let (Some(proj), Some(state)) = (&self.enc_state_proj, &x.state) {
            tokens_1d.push(proj.forward(state));
        }
        if let (Some(proj), Some(env)) = (&self.enc_env_proj, &x.env_state) {
            tokens_1d.push(proj.forward(env));
        }
        let mut tokens = vec![Tensor::stack(&tokens_1d, 0)];
        let mut pos = vec![self.pos_1d.unsqueeze(1)];
        if let (Some(backbone), Some((w, bias))) = (&self.backbone, &self.img_proj) {
            for img in &x.images {
                let f = backbone.forward(img, train);
                let (h, wd) = (f.size()[2], f.size()[3]);
                let p = sinusoid_2d(h, wd, self.dim_model, device).to_kind(f.kind());
                let f = f.conv2d(w, Some(bias), [1], [0], [1], 1);
                tokens.push(f.flatten(2, -1).permute([2, 0, 1]));
                pos.push(p.flatten(2, -1).permute([2, 0, 1]));
            }
        }
        let tokens = Tensor::cat(&tokens, 0);
        let pos = Tensor::cat(&pos, 0);
        let memory = self.encoder.forward(&tokens, &pos, None, s, train);

        let mut out = Tensor::zeros([self.chunk_size, b, self.dim_model], (pos.kind(), pos.device()));
        let qpos = self.decoder_pos.unsqueeze(1);
        for layer in &self.decoder_layers {
            out = layer.forward(&out, &memory, &qpos, &pos, s, train);
        }
        let out = self.decoder_norm.forward(&out).transpose(0, 1);
        (self.action_head.forward(&out), dist)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sinusoid_1d_alternates_sin_and_cos() {
        let t = sinusoid_1d(3, 4);
        assert_eq!(&t[..4], &[0.0, 1.0, 0.0, 1.0]);
        assert_eq!(t[4], 1f64.sin());
        assert_eq!(t[5], 1f64.cos());
        assert_eq!(t[6], (1.0 / 100f64).sin());
    }

    #[test]
    fn sinusoid_2d_matches_the_formula() {
        let (h, w, d) = (2, 3, 8);
        let t = sinusoid_2d(h, w, d, Device::Cpu);
        assert_eq!(t.size(), [1, d, h, w]);
        let half = d / 2;
        for k in 0..half {
            let freq = 10000f64.powf((2 * (k / 2)) as f64 / half as f64);
            for row in 0..h {
                for col in 0..w {
                    let yv = (row + 1) as f64 / (h as f64 + 1e-6) * 2.0 * PI;
                    let xv = (col + 1) as f64 / (w as f64 + 1e-6) * 2.0 * PI;
                    let f = |v: f64| if k % 2 == 0 { (v / freq).sin() } else { (v / freq).cos() };
                    let got_y = t.double_value(&[0, k, row, col]);
                    let got_x = t.double_value(&[0, half + k, row, col]);
                    assert!((got_y - f(yv)).abs() < 1e-5, "y k={k} row={row}");
                    assert!((got_x - f(xv)).abs() < 1e-5, "x k={k} col={col}");
                }
            }
        }
    }
}
