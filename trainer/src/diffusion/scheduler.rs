//! The DDPM noise schedule as diffusers 0.35's `DDPMScheduler` computes it for LeRobot's
//! Diffusion policy (`docs/design/diffusion.md`): float32 betas, their cumulative products, the
//! forward process (`add_noise`) and one reverse step (`step`, variance `fixed_small`).

use tch::{Device, Kind, Tensor};

use crate::DiffusionConfig;

/// `alpha_bar(t) = cos²((t + 0.008) / 1.008 · π/2)`, the cosine schedule's signal level.
fn alpha_bar(t: f64) -> f64 {
    ((t + 0.008) / 1.008 * std::f64::consts::PI / 2.0).cos().powi(2)
}

/// The schedule of one config, on the CPU in float32 as diffusers keeps it.
pub(crate) struct Ddpm {
    train_steps: i64,
    alphas_cumprod: Tensor,
    clip: Option<f64>,
    epsilon: bool,
}

impl Ddpm {
    pub(crate) fn new(c: &DiffusionConfig) -> Self {
        let n = c.num_train_timesteps as i64;
        let opts = (Kind::Float, Device::Cpu);
        let betas = match c.beta_schedule.as_str() {
            // Computed in f64 and then stored as float32, as diffusers' `betas_for_alpha_bar`.
            "squaredcos_cap_v2" => {
                let betas: Vec<f64> = (0..n)
                    .map(|i| {
                        let (t1, t2) = (i as f64 / n as f64, (i + 1) as f64 / n as f64);
                        (1.0 - alpha_bar(t2) / alpha_bar(t1)).min(0.999)
                    })
                    .collect();
                Tensor::from_slice(&betas).to_kind(Kind::Float)
            }
            "linear" => Tensor::linspace(c.beta_start, c.beta_end, n, opts),
            _ => Tensor::linspace(c.beta_start.sqrt(), c.beta_end.sqrt(), n, opts).pow_tensor_scalar(2),
        };
        let alphas = betas.neg() + 1.0;
        Ddpm {
            train_steps: n,
            alphas_cumprod: alphas.cumprod(0, None::<Kind>),
            clip: c.clip_sample.then_some(c.clip_sample_range),
            epsilon: c.prediction_type == "epsilon",
        }
    }

    /// Whether the network predicts the noise (`epsilon`) rather than the actions (`sample`).
    pub(crate) fn predicts_noise(&self) -> bool {
        self.epsilon
    }

    /// Diffusion steps of the forward process.
    pub(crate) fn train_steps(&self) -> i64 {
        self.train_steps
    }

    /// `x_t = √ᾱ_t · x_0 + √(1 − ᾱ_t) · ε` for each sample's step `t` (`[B]`, int64).
    pub(crate) fn add_noise(&self, original: &Tensor, noise: &Tensor, timesteps: &Tensor) -> Tensor {
        let ac = self.alphas_cumprod.to_device(original.device()).to_kind(original.kind());
        let at = ac.index_select(0, &timesteps.to_device(original.device()));
        let shape: Vec<i64> = std::iter::once(-1).chain(std::iter::repeat_n(1, original.dim() - 1)).collect();
        let signal = at.pow_tensor_scalar(0.5).flatten(0, -1).view(shape.as_slice());
        let noise_level = (at.neg() + 1.0).pow_tensor_scalar(0.5).flatten(0, -1).view(shape.as_slice());
        signal * original + noise_level * noise
    }

    /// The steps of an inference with `n` of them (diffusers' "leading" spacing), from the
    /// noisiest.
    pub(crate) fn inference_steps(&self, n: i64) -> Vec<i64> {
        let ratio = self.train_steps / n;
        (0..n).rev().map(|i| i * ratio).collect()
    }

    /// One reverse step from `sample` at step `t` of an inference with `n` steps, given the
    /// network's `output`; `noise` (as `sample`) is the variance's draw, used when `t > 0`.
    pub(crate) fn step(&self, output: &Tensor, t: i64, n: i64, sample: &Tensor, noise: &Tensor) -> Tensor {
        let (kind, device) = (sample.kind(), sample.device());
        let prev_t = t - self.train_steps / n;
        let at = |i: i64| self.alphas_cumprod.get(i);
        let alpha_prod_t = at(t);
        let alpha_prod_prev = if prev_t >= 0 { at(prev_t) } else { Tensor::from(1.0f32) };
        let beta_prod_t = alpha_prod_t.neg() + 1.0;
        let beta_prod_prev = alpha_prod_prev.neg() + 1.0;
        let current_alpha = &alpha_prod_t / &alpha_prod_prev;
        let current_beta = current_alpha.neg() + 1.0;
        let scalar = |x: &Tensor| x.to_kind(kind).to_device(device);
        let original = if self.epsilon {
            (sample - scalar(&beta_prod_t.pow_tensor_scalar(0.5)) * output) / scalar(&alpha_prod_t.pow_tensor_scalar(0.5))
        } else {
            output.shallow_clone()
        };
        let original = match self.clip {
            Some(r) => original.clamp(-r, r),
            None => original,
        };
        let original_coeff = alpha_prod_prev.pow_tensor_scalar(0.5) * &current_beta / &beta_prod_t;
        let sample_coeff = current_alpha.pow_tensor_scalar(0.5) * &beta_prod_prev / &beta_prod_t;
        let prev = scalar(&original_coeff) * original + scalar(&sample_coeff) * sample;
        if t == 0 {
            return prev;
        }
        let variance = ((alpha_prod_prev.neg() + 1.0) / (alpha_prod_t.neg() + 1.0) * &current_beta).clamp_min(1e-20);
        prev + scalar(&variance.pow_tensor_scalar(0.5)) * noise
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cosine_schedule_ends_near_pure_noise_and_leading_steps_count_down() {
        let ddpm = Ddpm::new(&DiffusionConfig::default());
        let ac: Vec<f32> = Vec::try_from(&ddpm.alphas_cumprod).unwrap();
        assert_eq!(ac.len(), 100);
        assert!(ac[0] > 0.999 && ac[0] < 1.0 && ac[99] < 1e-3, "{} {}", ac[0], ac[99]);
        assert!(ac.windows(2).all(|w| w[1] < w[0]));
        assert_eq!(ddpm.inference_steps(10), [90, 80, 70, 60, 50, 40, 30, 20, 10, 0]);
        assert_eq!(ddpm.inference_steps(100).len(), 100);
    }

    #[test]
    fn noise_added_at_a_step_is_taken_away_by_the_clean_prediction() {
        let ddpm = Ddpm::new(&DiffusionConfig { clip_sample: false, ..DiffusionConfig::default() });
        let x0 = Tensor::randn([2, 4, 3], (Kind::Float, Device::Cpu));
        let eps = Tensor::randn([2, 4, 3], (Kind::Float, Device::Cpu));
        let t = Tensor::from_slice(&[0i64, 0]);
        let noisy = ddpm.add_noise(&x0, &eps, &t);
        // With n = T steps, the last step (t = 0) given the true noise gives back x0.
        let back = ddpm.step(&eps, 0, 100, &noisy, &Tensor::zeros_like(&eps));
        assert!((back - x0).abs().max().double_value(&[]) < 1e-5);
    }
}
