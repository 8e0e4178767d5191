//! The draws of [`ImageTransforms`] applied to camera frames on their device, with the
//! arithmetic of torchvision 0.26's functional transforms for the frames they are handed
//! ([`TransformFrames`]): on a GPU one launch per transform for all the samples that drew it, on
//! the CPU a sample at a time.
//!
//! Frames are `[n, S, 3, H, W]` tensors: `n` samples of `S` frames each (1 for ACT), one draw
//! per sample. Between transforms each sample's frames are float: uint8 levels (0 to 255, whole
//! after each transform, as torchvision casts its results back to uint8) or values in [0, 1].

use tch::{Device, Kind, Tensor};

use self::common::{fused, mismatch, per_row, times, upload};
use super::{Affine, Draw, DrawKey, ImageTransforms, SceneDraw, Transform, TransformFrames};
use crate::{Error, Result, policy::Batch};

mod common;
mod scene;

/// `frames` (`[n, S, 3, H, W]`: uint8, or float in [0, 1]) as float in [0, 1] with each
/// sample's draws applied, in order.
pub(crate) fn apply(transforms: &ImageTransforms, frames: &Tensor, draws: &[Vec<(usize, Draw)>]) -> Tensor {
    if frames.device() != Device::Cpu {
        return grouped(transforms, &handed(transforms, frames), draws);
    }
    // One sample at a time on the CPU, whose caches hold a sample's intermediate tensors and not
    // a batch's.
    let out = Tensor::empty(frames.size(), (Kind::Float, Device::Cpu));
    for (row, d) in draws.iter().enumerate() {
        let sample = handed(transforms, &frames.narrow(0, row as i64, 1));
        out.narrow(0, row as i64, 1).copy_(&grouped(transforms, &sample, std::slice::from_ref(d)));
    }
    out
}

/// Frames as the transforms are handed them, contiguous float: levels for uint8 transforms
/// (float frames taken at their nearest level), values in [0, 1] for float ones.
fn handed(transforms: &ImageTransforms, frames: &Tensor) -> Tensor {
    match (transforms.frames(), frames.kind()) {
        (TransformFrames::Float, _) => unit_float(frames),
        (TransformFrames::Uint8, Kind::Uint8) => frames.contiguous().to_kind(Kind::Float),
        (TransformFrames::Uint8, _) => (frames.to_kind(Kind::Float) * 255.0).round().contiguous(),
    }
}

/// Frames as contiguous float in [0, 1]: uint8 ones divided by 255, as the policies scale them.
fn unit_float(frames: &Tensor) -> Tensor {
    match frames.kind() {
        Kind::Uint8 => {
            let mut x = frames.contiguous().to_kind(Kind::Float);
            x /= 255.0;
            x
        }
        _ => frames.to_kind(Kind::Float).contiguous(),
    }
}

/// What a sample's frames hold between transforms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scale {
    /// uint8 levels, as float.
    Levels,
    /// Values in [0, 1].
    Unit,
}

impl Scale {
    /// The largest value.
    fn bound(self) -> f64 {
        match self {
            Scale::Levels => 255.0,
            Scale::Unit => 1.0,
        }
    }

    /// A transform's result, clamped to [0, bound], as torchvision returns it: cast to uint8
    /// (truncated) for levels.
    fn clamped(self, y: &mut Tensor) {
        let _ = y.clamp_(0.0, self.bound());
        if self == Scale::Levels {
            let _ = y.trunc_();
        }
    }
}

/// [`apply`] with one launch per transform for all the samples that drew it.
fn grouped(transforms: &ImageTransforms, frames: &Tensor, draws: &[Vec<(usize, Draw)>]) -> Tensor {
    let mut x = frames.shallow_clone();
    let mut scales = vec![
        match transforms.frames() {
            TransformFrames::Uint8 => Scale::Levels,
            TransformFrames::Float => Scale::Unit,
        };
        draws.len()
    ];
    let depth = draws.iter().map(Vec::len).max().unwrap_or(0);
    for k in 0..depth {
        let at: Vec<Option<usize>> = draws.iter().map(|d| d.get(k).map(|(t, _)| *t)).collect();
        let mut indices: Vec<usize> = at.iter().flatten().copied().collect();
        indices.sort_unstable();
        indices.dedup();
        for t in indices {
            let rows: Vec<usize> = (0..draws.len()).filter(|&s| at[s] == Some(t)).collect();
            if matches!(transforms.transform(t), Transform::Scene(_)) {
                // LeRobot's own transforms are written for float frames.
                x = to_unit(&x, &mut scales, &rows);
            }
            for scale in [Scale::Levels, Scale::Unit] {
                let group: Vec<usize> = rows.iter().copied().filter(|&s| scales[s] == scale).collect();
                if group.is_empty() {
                    continue;
                }
                let params: Vec<&Draw> = group.iter().map(|&s| &draws[s][k].1).collect();
                x = on_rows(&x, &group, |sub| transform(transforms.transform(t), sub, &params, scale));
            }
        }
    }
    to_unit(&x, &mut scales, &(0..draws.len()).collect::<Vec<_>>())
}

/// `x` with those of `rows` that hold levels divided by 255, as the policies scale uint8 frames.
fn to_unit(x: &Tensor, scales: &mut [Scale], rows: &[usize]) -> Tensor {
    let levels: Vec<usize> = rows.iter().copied().filter(|&s| scales[s] == Scale::Levels).collect();
    if levels.is_empty() {
        return x.shallow_clone();
    }
    for &s in &levels {
        scales[s] = Scale::Unit;
    }
    on_rows(x, &levels, |sub| sub / 255.0)
}

/// A batch's camera frames transformed with the draws of training step `step`, its rows at
/// places `first_position..` of the step's batch over all ranks: uint8 frames become float in
/// [0, 1] (as the policy would make them) and get their draws. Other inputs are left as they are.
///
/// # Errors
/// [`Error::Transforms`] when libtorch fails in a transform (a device out of memory): tch's
/// calls panic then, and the panic becomes the run's error here.
pub(crate) fn transform_batch(transforms: &ImageTransforms, batch: Batch, seed: u64, step: u64, first_position: u64) -> Result<Batch> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| transform_frames(transforms, batch, seed, step, first_position))).map_err(
        |panic| {
            let message = panic.downcast_ref::<String>().map(String::as_str).or_else(|| panic.downcast_ref::<&str>().copied());
            Error::Transforms(format!("step {step}: {}", message.unwrap_or("libtorch failed")))
        },
    )
}

fn transform_frames(transforms: &ImageTransforms, batch: Batch, seed: u64, step: u64, first_position: u64) -> Batch {
    let frames = |images: Vec<Tensor>, windowed: bool| -> Vec<Tensor> {
        images
            .into_iter()
            .enumerate()
            .map(|(camera, img)| {
                let x = if windowed { img } else { img.unsqueeze(1) };
                let size = x.size();
                let (height, width) = (size[3] as usize, size[4] as usize);
                let draws: Vec<_> = (0..size[0] as u64)
                    .map(|row| {
                        transforms.draw(DrawKey { seed, step, position: first_position + row, camera: camera as u64 }, height, width)
                    })
                    .collect();
                let out = apply(transforms, &x, &draws);
                if windowed { out } else { out.squeeze_dim(1) }
            })
            .collect()
    };
    match batch {
        Batch::Act(mut b) => {
            b.images = frames(std::mem::take(&mut b.images), false);
            Batch::Act(b)
        }
        Batch::Diffusion(mut b) => {
            b.images = frames(std::mem::take(&mut b.images), true);
            Batch::Diffusion(b)
        }
    }
}

/// `x` with `f` applied to its rows `rows` (ascending) and the other rows as they are.
fn on_rows(x: &Tensor, rows: &[usize], f: impl FnOnce(&Tensor) -> Tensor) -> Tensor {
    if rows.len() as i64 == x.size()[0] {
        return f(x);
    }
    let index = upload(Tensor::from_slice(&rows.iter().map(|&r| r as i64).collect::<Vec<_>>()), x.device());
    x.index_copy(0, &index, &f(&x.index_select(0, &index)))
}

fn transform(t: &Transform, x: &Tensor, params: &[&Draw], scale: Scale) -> Tensor {
    match t {
        Transform::Identity => x.shallow_clone(),
        Transform::Color(_) => color(x, params, scale),
        Transform::Sharpness(_) => {
            let factors: Vec<f64> = params.iter().map(|p| if let Draw::Sharpness(f) = p { *f } else { mismatch(p) }).collect();
            sharpness(x, &factors, scale)
        }
        Transform::Affine(a) => affine(x, a, params, scale),
        Transform::Scene(scene) => {
            let draws: Vec<&SceneDraw> = params.iter().map(|p| if let Draw::Scene(d) = p { d } else { mismatch(p) }).collect();
            scene::apply(scene, x, &draws)
        }
    }
}

/// `ColorJitter`: each row's adjustments in its own order.
fn color(x: &Tensor, params: &[&Draw], scale: Scale) -> Tensor {
    let mut x = x.shallow_clone();
    for place in 0..4 {
        for adjustment in 0..4 {
            let (rows, factors): (Vec<usize>, Vec<f64>) = params
                .iter()
                .enumerate()
                .filter_map(|(row, p)| match p {
                    Draw::Color { order, factors } if order[place] == adjustment => factors[adjustment].map(|f| (row, f)),
                    Draw::Color { .. } => None,
                    other => mismatch(other),
                })
                .unzip();
            if !rows.is_empty() {
                x = on_rows(&x, &rows, |sub| adjust(adjustment, sub, &factors, scale));
            }
        }
    }
    x
}

/// Brightness, contrast, saturation or hue (`adjustment` 0 to 3) by each row's factor.
fn adjust(adjustment: usize, x: &Tensor, factors: &[f64], scale: Scale) -> Tensor {
    match adjustment {
        0 => {
            let mut y = times(x, factors);
            scale.clamped(&mut y);
            y
        }
        1 => {
            let mean = grayscale(x, scale).mean_dim([-3i64, -2, -1].as_slice(), true, None::<Kind>);
            blend(x, &mean, factors, scale)
        }
        2 => blend(x, &grayscale(x, scale), factors, scale),
        _ => match scale {
            Scale::Unit => hue(x, factors),
            // torchvision turns the hue of uint8 frames in float: levels times 1/255, and back
            // to uint8 by truncating the values times 255.999.
            Scale::Levels => {
                let mut y = hue(&(x * (1.0 / 255.0)), factors) * 255.999;
                let _ = y.trunc_();
                y
            }
        },
    }
}

/// ITU-R 601-2 luma, as torchvision weighs the channels: `[…, 1, H, W]`, floored for levels.
fn grayscale(x: &Tensor, scale: Scale) -> Tensor {
    let c = x.unbind(-3);
    let mut luma = fused(&fused(&(&c[0] * 0.2989), &c[1], &[0.587]), &c[2], &[0.114]);
    if scale == Scale::Levels {
        let _ = luma.floor_();
    }
    luma.unsqueeze(-3)
}

/// `a·r + b·(1 − r)` per row, clamped to [0, bound].
fn blend(a: &Tensor, b: &Tensor, ratios: &[f64], scale: Scale) -> Tensor {
    let rest: Vec<f64> = ratios.iter().map(|r| 1.0 - r).collect();
    let mut y = fused(&times(a, ratios), b, &rest);
    scale.clamped(&mut y);
    y
}

/// The hue turned by each row's factor (a fraction of the colour circle), through HSV.
fn hue(x: &Tensor, shifts: &[f64]) -> Tensor {
    let hsv = rgb_to_hsv(x).unbind(-3);
    let h = match shifts {
        [shift] => &hsv[0] + *shift,
        _ => &hsv[0] + per_row(shifts, &hsv[0]),
    }
    .remainder(1.0);
    hsv_to_rgb(&h, &hsv[1], &hsv[2])
}

fn rgb_to_hsv(x: &Tensor) -> Tensor {
    let c = x.unbind(-3);
    let (maxc, minc) = {
        let (lo, hi) = x.aminmax(-3, false);
        (hi, lo)
    };
    // Grey pixels (max = min) have no hue or saturation; their divisors become 1, which leaves
    // both at 0 without a division by zero.
    let grey = maxc.eq_tensor(&minc);
    let range = &maxc - &minc;
    let ones = maxc.ones_like();
    let s = &range / ones.where_self(&grey, &maxc);
    let divisor = ones.where_self(&grey, &range).unsqueeze(-3);
    let scaled = ((maxc.unsqueeze(-3) - x) / divisor).unbind(-3);
    let (rc, gc, bc) = (&scaled[0], &scaled[1], &scaled[2]);
    let not_r = maxc.ne_tensor(&c[0]);
    let is_g = maxc.eq_tensor(&c[1]);
    let hg = (rc + 2.0 - bc) * is_g.logical_and(&not_r);
    let hr = (bc - gc) * not_r.logical_not();
    let hb = (gc + 4.0 - rc) * not_r.logical_and(&is_g.logical_not());
    let h = ((hr + hg + hb) * (1.0 / 6.0) + 1.0).fmod(1.0);
    Tensor::stack(&[h, s, maxc], -3)
}

fn hsv_to_rgb(h: &Tensor, s: &Tensor, v: &Tensor) -> Tensor {
    let h6 = h * 6.0;
    let sector = h6.floor();
    let f = &h6 - &sector;
    let sector = sector.to_kind(Kind::Int64).remainder(6);
    let sf = s * &f;
    let one_minus_s = 1.0f64 - s;
    let q = ((1.0f64 - &sf) * v).clamp(0.0, 1.0);
    let t = ((&sf + &one_minus_s) * v).clamp(0.0, 1.0);
    let p = (&one_minus_s * v).clamp(0.0, 1.0);
    let vpqt = Tensor::stack(&[v.shallow_clone(), p, q, t], -3);
    // Which of v, p, q, t each channel takes in each of the six sectors.
    let select = upload(Tensor::from_slice(&[0i64, 2, 1, 1, 3, 0, 3, 0, 0, 2, 1, 1, 1, 1, 3, 0, 0, 2]), h.device()).view([3, 6]);
    let mut shape = vec![3];
    shape.extend(sector.size());
    let picked = select.index_select(1, &sector.flatten(0, -1)).view(shape.as_slice()).movedim([0i64].as_slice(), [-3i64].as_slice());
    vpqt.gather(-3, &picked, false)
}

/// LeRobot's `SharpnessJitter` (torchvision's `adjust_sharpness`): each row blended with its
/// 3×3 blur (weights 1, centre 5, over 13; rounded for levels), borders kept.
fn sharpness(x: &Tensor, factors: &[f64], scale: Scale) -> Tensor {
    let size = x.size();
    let (n, s, c, h, w) = (size[0], size[1], size[2], size[3], size[4]);
    if h <= 2 || w <= 2 {
        return x.shallow_clone();
    }
    let (edge, centre) = (1.0f32 / 13.0, 5.0f32 / 13.0);
    let kernel = upload(Tensor::from_slice(&[edge, edge, edge, edge, centre, edge, edge, edge, edge]), x.device())
        .view([1, 1, 3, 3])
        .expand([c, 1, 3, 3], false);
    let mut out = x.reshape([n * s, c, h, w]).copy();
    let mut blurred = out.conv2d(&kernel, None::<Tensor>, [1, 1], [0, 0], [1, 1], c);
    if scale == Scale::Levels {
        let _ = blurred.round_();
    }
    let weights: Vec<f64> = factors.iter().flat_map(|f| std::iter::repeat_n(1.0 - f, s as usize)).collect();
    let mut inner = out.narrow(2, 1, h - 2).narrow(3, 1, w - 2);
    let sharpened = fused(&inner, &(blurred - &inner), &weights);
    inner.copy_(&sharpened);
    scale.clamped(&mut out);
    out.view(size.as_slice())
}

/// torchvision's `RandomAffine` with each row's parameters: the inverse of each row's affine
/// map sampled through `grid_sample`, pixels from outside the frame taking `fill`, rounded for
/// levels.
fn affine(x: &Tensor, a: &Affine, params: &[&Draw], scale: Scale) -> Tensor {
    let size = x.size();
    let (n, s, c, h, w) = (size[0], size[1], size[2], size[3], size[4]);
    let center = a.center.map_or((0.0, 0.0), |(cx, cy)| (cx - w as f64 * 0.5, cy - h as f64 * 0.5));
    let thetas: Vec<f64> = params
        .iter()
        .flat_map(|p| match p {
            Draw::Affine { angle, translate, scale, shear } => inverse_affine_matrix(center, *angle, *translate, *scale, *shear),
            other => mismatch(other),
        })
        .collect();
    let theta = upload(Tensor::from_slice(&thetas.iter().map(|&v| v as f32).collect::<Vec<_>>()), x.device()).view([n, 2, 3]);
    let grid = affine_grid(&theta, w, h).repeat_interleave_self_int(s, 0, None);
    let flat = x.reshape([n * s, c, h, w]);
    let inside = Tensor::ones([n * s, 1, h, w], (Kind::Float, x.device()));
    let sampled = Tensor::cat(&[flat, inside], 1).grid_sampler(&grid, if a.nearest { 1 } else { 0 }, 0, false);
    let (img, mask) = (sampled.narrow(1, 0, c), sampled.narrow(1, c, 1).expand([n * s, c, h, w], false));
    let fill =
        upload(Tensor::from_slice(&a.fill.iter().map(|&f| f as f32).collect::<Vec<_>>()), x.device()).view([1, a.fill.len() as i64, 1, 1]);
    let mut out = if a.nearest { fill.expand_as(&img).where_self(&mask.lt(0.5), &img) } else { (img - &fill) * mask + fill };
    if scale == Scale::Levels {
        // torchvision rounds a sampled uint8 frame (half to even), where its casts elsewhere truncate.
        let _ = out.round_();
    }
    out.view(size.as_slice())
}

/// The inverse of rotating by `angle` degrees about `center` (pixels from the frame's centre),
/// scaling, shearing by `shear` degrees and shifting by `translate` pixels, as a 2×3 matrix
/// taking output pixels to input pixels (torchvision's `_get_inverse_affine_matrix`).
pub(crate) fn inverse_affine_matrix(center: (f64, f64), angle: f64, translate: (f64, f64), scale: f64, shear: (f64, f64)) -> [f64; 6] {
    let (rot, sx, sy) = (angle.to_radians(), shear.0.to_radians(), shear.1.to_radians());
    let ((cx, cy), (tx, ty)) = (center, translate);
    let a = (rot - sy).cos() / sy.cos();
    let b = -(a * sx.tan() + rot.sin());
    let c = (rot - sy).sin() / sy.cos();
    let d = rot.cos() - c * sx.tan();
    let mut m = [d / scale, -b / scale, 0.0, -c / scale, a / scale, 0.0];
    m[2] += cx - m[0] * (cx + tx) - m[1] * (cy + ty);
    m[5] += cy - m[3] * (cx + tx) - m[4] * (cy + ty);
    m
}

/// The sampling grid of `theta` (`[n, 2, 3]`, in pixels from the frame's centre) over a `w` × `h`
/// frame, normalised to [-1, 1] after the matrix is applied (torchvision's `_affine_grid`).
fn affine_grid(theta: &Tensor, w: i64, h: i64) -> Tensor {
    let device = theta.device();
    let xs = Tensor::linspace((1.0 - w as f64) * 0.5, (w as f64 - 1.0) * 0.5, w, (Kind::Float, device));
    let ys = Tensor::linspace((1.0 - h as f64) * 0.5, (h as f64 - 1.0) * 0.5, h, (Kind::Float, device));
    let base = Tensor::stack(
        &[xs.view([1, w]).expand([h, w], false), ys.view([h, 1]).expand([h, w], false), Tensor::ones([h, w], (Kind::Float, device))],
        -1,
    );
    let half = upload(Tensor::from_slice(&[0.5 * w as f32, 0.5 * h as f32]), device);
    let n = theta.size()[0];
    let rescaled = theta.transpose(1, 2) / half;
    base.view([1, h * w, 3]).expand([n, h * w, 3], false).bmm(&rescaled).view([n, h, w, 2])
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use serde_json::{Value, json};

    use super::*;
    use crate::image_transforms::{COLOR_FACTORS, ImageTransformsConfig};

    /// Frames `[4, 2, 3, 17, 23]` with grey pixels, saturated ones and pure hues among random
    /// ones: the cases where HSV divides by zero or picks a sector.
    fn frames() -> Tensor {
        // The default generator is the process's: tests running beside each other take turns.
        static SEEDED: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _turn = SEEDED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        tch::manual_seed(3);
        let x = Tensor::rand([4, 2, 3, 17, 23], (Kind::Float, Device::Cpu));
        let grey = x.narrow(2, 0, 1).narrow(3, 0, 4);
        x.narrow(3, 0, 4).copy_(&grey.expand([4, 2, 3, 4, 23], false));
        let _ = x.narrow(3, 4, 2).fill_(1.0);
        let _ = x.narrow(2, 1, 2).narrow(3, 6, 2).fill_(0.0);
        x
    }

    fn raw(t: &Tensor) -> Vec<f32> {
        Vec::<f32>::try_from(t.contiguous().flatten(0, -1)).expect("f32 values")
    }

    fn write_f32(path: &Path, values: &[f32]) {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(path, bytes).expect("frames written");
    }

    fn read_f32(path: &Path) -> Vec<f32> {
        let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
    }

    /// [`frames`] as uint8 levels (truncated, as torchvision casts), viewed channels-first over
    /// channels-last memory as batches hold them.
    fn bytes() -> Tensor {
        let hwc = (frames().permute([0, 1, 3, 4, 2]).contiguous() * 255.0).to_kind(Kind::Uint8);
        hwc.permute([0, 1, 4, 2, 3])
    }

    /// uint8 frames handed to float transforms give what their float values over 255 give, on
    /// the CPU's way and on a GPU's.
    #[test]
    fn uint8_frames_are_scaled_as_the_policy_scales_them() {
        let transforms = ImageTransforms::new(&ImageTransformsConfig::enabled()).expect("valid").expect("on").on(TransformFrames::Float);
        let bytes = bytes();
        let draws: Vec<_> = (0..4).map(|p| transforms.draw(DrawKey { seed: 5, step: 9, position: p, camera: 0 }, 17, 23)).collect();
        let scaled = bytes.to_kind(Kind::Float) / 255.0;
        let expected = raw(&grouped(&transforms, &scaled, &draws));
        assert_eq!(raw(&apply(&transforms, &bytes, &draws)), expected);
        assert_eq!(raw(&grouped(&transforms, &unit_float(&bytes), &draws)), expected);
    }

    /// Handed uint8 frames, the transforms give levels over 255 (so at most 256 values), not the
    /// float transforms' results: the same a sample at a time as all at once.
    #[test]
    fn uint8_transforms_give_levels() {
        let transforms = ImageTransforms::new(&ImageTransformsConfig::enabled()).expect("valid").expect("on");
        assert_eq!(transforms.frames(), TransformFrames::Uint8);
        let bytes = bytes();
        let draws: Vec<_> = (0..4).map(|p| transforms.draw(DrawKey { seed: 5, step: 9, position: p, camera: 0 }, 17, 23)).collect();
        let out = apply(&transforms, &bytes, &draws);
        assert_eq!(raw(&out), raw(&grouped(&transforms, &handed(&transforms, &bytes), &draws)));
        let levels = raw(&(&out * 255.0));
        assert!(levels.iter().all(|v| (v - v.round()).abs() < 1e-4 && (0.0..=255.0).contains(v)));
        let float = transforms.on(TransformFrames::Float);
        assert_ne!(raw(&out), raw(&apply(&float, &bytes, &draws)));
    }

    /// A batch the transforms cannot take is the run's error, naming the step, not a panic of
    /// the task that makes the batches.
    #[test]
    fn a_failure_inside_the_transforms_is_an_error() {
        let transforms = ImageTransforms::new(&ImageTransformsConfig::enabled()).expect("valid").expect("on");
        let frames = |shape: &[i64]| Tensor::zeros(shape, (Kind::Uint8, Device::Cpu));
        let batch = |image| {
            Batch::Act(crate::act::ActBatch { state: None, images: vec![image], env_state: None, action: None, action_is_pad: None })
        };
        let made = transform_batch(&transforms, batch(frames(&[2, 3, 6, 5])), 1, 3, 0).expect("transformed");
        let Batch::Act(made) = made else { panic!("an ACT batch") };
        assert_eq!((made.images[0].size(), made.images[0].kind()), (vec![2, 3, 6, 5], Kind::Float));
        let refused = transform_batch(&transforms, batch(frames(&[2, 6, 5])), 1, 3, 0).expect_err("no channels").to_string();
        assert!(refused.starts_with("image transforms: step 3: "), "{refused}");
    }

    /// A draw of the transform `config` names `name` as the reference script applies it: its
    /// steps, in order.
    fn steps(transform: &Transform, draw: &Draw, config: &ImageTransformsConfig, name: &str) -> Vec<Value> {
        match (transform, draw) {
            (_, Draw::Color { order, factors }) => {
                order.iter().filter_map(|&i| factors[i].map(|f| json!({"kind": COLOR_FACTORS[i], "factor": f}))).collect()
            }
            (_, Draw::Sharpness(f)) => vec![json!({"kind": "sharpness", "factor": f})],
            (Transform::Affine(a), Draw::Affine { angle, translate, scale, shear }) => vec![json!({
                "kind": "affine", "angle": angle, "translate": [translate.0, translate.1], "scale": scale,
                "shear": [shear.0, shear.1], "nearest": a.nearest, "fill": a.fill, "center": a.center.map(|(x, y)| [x, y]),
            })],
            (_, Draw::Scene(d)) => {
                let tf = config.tfs.iter().find(|(n, _)| n.as_str() == name).map(|(_, tf)| tf).expect("the draw's transform");
                vec![json!({"kind": "lerobot", "class": tf.kind, "kwargs": tf.kwargs, "params": lerobot_params(d)})]
            }
            _ => Vec::new(),
        }
    }

    /// The cases of [`transforms_are_torchvisions`] for frames handed as `kind` (`x`: uint8
    /// frames, or float in [0, 1]): every transform with given factors, and with factors drawn
    /// from configs, applied a sample at a time and all at once. `tolerance(float, uint8)` is
    /// how far a case of each kind may be from torchvision.
    fn torchvision_cases(x: &Tensor, kind: TransformFrames) -> Vec<Case> {
        let (scale, taken) = match kind {
            TransformFrames::Uint8 => (Scale::Levels, x.to_kind(Kind::Float)),
            TransformFrames::Float => (Scale::Unit, x.shallow_clone()),
        };
        // What the policy sees of a function's result.
        let seen = |y: Tensor| if scale == Scale::Levels { y / 255.0 } else { y };
        let tolerance = |float: f32, uint8: f32| if scale == Scale::Levels { uint8 } else { float };
        let mut cases: Vec<Case> = Vec::new();

        let factors = [0.0, 0.55, 1.0, 1.7];
        for (i, name) in COLOR_FACTORS.iter().enumerate() {
            let factors: Vec<f64> = if *name == "hue" { vec![-0.5, -0.03, 0.21, 0.5] } else { factors.to_vec() };
            let rows = factors.iter().map(|f| vec![json!({"kind": name, "factor": f})]).collect();
            let allowed = if *name == "contrast" { tolerance(2.4e-7, UNFUSED_LEVEL) } else { 0.0 };
            cases.push((name.to_string(), rows, seen(adjust(i, &taken, &factors, scale)), allowed));
        }
        let rows = factors.iter().map(|f| vec![json!({"kind": "sharpness", "factor": f})]).collect();
        cases.push(("sharpness".into(), rows, seen(sharpness(&taken, &factors, scale)), 0.0));

        let params = [
            Draw::Affine { angle: -4.3, translate: (2.0, -1.0), scale: 1.0, shear: (0.0, 0.0) },
            Draw::Affine { angle: 30.0, translate: (0.0, 0.0), scale: 0.8, shear: (5.0, -3.0) },
            Draw::Affine { angle: 90.0, translate: (-3.0, 4.0), scale: 1.25, shear: (0.0, 0.0) },
            Draw::Affine { angle: 0.0, translate: (0.0, 0.0), scale: 1.0, shear: (0.0, 0.0) },
        ];
        let args = |nearest: bool, fill: Vec<f64>, center: Option<(f64, f64)>| Affine {
            degrees: (0.0, 0.0),
            translate: None,
            scale: None,
            shear: None,
            nearest,
            fill,
            center,
        };
        let fill = match scale {
            Scale::Levels => vec![51.0, 127.5, 229.5],
            Scale::Unit => vec![0.2, 0.5, 0.9],
        };
        for (name, a) in [("affine-nearest", args(true, vec![0.0], None)), ("affine-bilinear-fill", args(false, fill, Some((3.0, 5.5))))] {
            let t = Transform::Affine(a.clone());
            let rows = params.iter().map(|p| steps(&t, p, &ImageTransformsConfig::default(), "")).collect();
            cases.push((name.into(), rows, seen(affine(&taken, &a, &params.iter().collect::<Vec<_>>(), scale)), 0.0));
        }

        let jitter = |c: &mut ImageTransformsConfig, name: &str, kind: &str, kwargs: Value| {
            let kwargs = kwargs.as_object().cloned().expect("object");
            c.tfs.insert(name.into(), crate::TransformConfig { weight: 3.0, kind: kind.into(), kwargs });
        };
        let mut configs = vec![
            ("lerobot-defaults", ImageTransformsConfig::enabled()),
            ("random-order", {
                let mut c = ImageTransformsConfig { random_order: true, max_num_transforms: 4, ..ImageTransformsConfig::enabled() };
                jitter(&mut c, "jitter", "ColorJitter", json!({"brightness": 0.4, "contrast": 0.4, "saturation": 0.6, "hue": 0.2}));
                c
            }),
        ];
        // Handed uint8 frames, LeRobot 0.6.1's own transforms take them as float, and the
        // transforms after them take float frames.
        if scale == Scale::Levels {
            let mut c = ImageTransformsConfig { random_order: true, max_num_transforms: 4, ..ImageTransformsConfig::enabled() };
            jitter(&mut c, "noise", "GaussianNoise", json!({}));
            jitter(&mut c, "shadow", "RandomShadow", json!({}));
            configs.push(("with-lerobot-061s", c));
        }
        for (name, config) in configs {
            let transforms = ImageTransforms::new(&config).expect("valid").expect("on").on(kind);
            let draws: Vec<_> = (0..4).map(|p| transforms.draw(DrawKey { seed: 11, step: 2, position: p, camera: 1 }, 17, 23)).collect();
            let rows: Vec<Vec<Value>> = draws
                .iter()
                .map(|d| d.iter().flat_map(|(t, draw)| steps(transforms.transform(*t), draw, &config, &transforms.names()[*t])).collect())
                .collect();
            // A sample at a time (the CPU's way), and each transform for all its samples at once
            // (a GPU's).
            let allowed = tolerance(2.4e-7, UNFUSED_LEVEL);
            cases.push((name.into(), rows.clone(), apply(&transforms, x, &draws), allowed));
            cases.push((format!("{name}-grouped"), rows, grouped(&transforms, &handed(&transforms, x), &draws), allowed));
        }
        cases
    }

    /// How far lake's contrast of uint8 frames may be from torchvision's: one level. Their
    /// blends of a frame with its mean may differ in the last bit for a frame's last few values
    /// (libtorch computes the end of a loop apart); should two such values fall on either side
    /// of a whole level, the cast to uint8 truncates them apart. (None did here.)
    const UNFUSED_LEVEL: f32 = 1.0 / 255.0 + 1e-7;

    /// Every transform, with given factors and with factors drawn from LeRobot's defaults,
    /// equals torchvision 0.26's functional transforms applied to each sample's frames in turn
    /// (`scripts/reference_transforms.py`), handed float frames (LeRobot 0.4.4): bit for bit,
    /// but for contrast's blend of a frame with its mean, whose last few values of a frame may
    /// differ in the last bit (libtorch computes the end of a loop apart), and composed
    /// transforms carry such differences on.
    #[test]
    fn transforms_are_torchvisions() {
        let x = frames();
        let cases = torchvision_cases(&x, TransformFrames::Float);
        compare_with_reference(&x, &cases, "torchvision's");
        // The frames changed where the transforms say, and the input is left as it was.
        assert_eq!(raw(&x), raw(&frames()));
        assert!(raw(&cases[0].2) != raw(&x));
    }

    /// The same, handed uint8 frames (lerobot-train 0.6.1): torchvision's transforms of uint8
    /// frames, over 255.
    #[test]
    fn uint8_transforms_are_torchvisions() {
        let x = bytes();
        let cases = torchvision_cases(&x, TransformFrames::Uint8);
        compare_with_reference(&x, &cases, "torchvision's");
        assert_eq!(raw(&x.to_kind(Kind::Float)), raw(&bytes().to_kind(Kind::Float)));
    }

    /// A case for the reference script: its name, each sample's steps, lake's frames, and how
    /// far they may be from the reference's.
    type Case = (String, Vec<Vec<Value>>, Tensor, f32);

    /// Runs `scripts/reference_transforms.py` (with the python of `scripts/torch-env.sh`, which
    /// holds torchvision and LeRobot 0.6.1's code) on `x` for `cases`, and holds lake's frames to
    /// its within each case's tolerance.
    #[allow(clippy::print_stderr)] // its report: how far each case is from the reference
    fn compare_with_reference(x: &Tensor, cases: &[Case], reference: &str) {
        let dir = tempfile::tempdir().expect("tmp");
        write_f32(&dir.path().join("input.f32"), &raw(&x.to_kind(Kind::Float)));
        let spec = json!({
            "shape": x.size(),
            "uint8": x.kind() == Kind::Uint8,
            "cases": cases.iter().map(|(name, rows, _, _)| json!({"name": name, "rows": rows})).collect::<Vec<_>>(),
        });
        std::fs::write(dir.path().join("cases.json"), spec.to_string()).expect("cases written");
        let python = std::env::var("LAKE_TORCH_PYTHON").unwrap_or_else(|_| "python3".into());
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/reference_transforms.py");
        let out = std::process::Command::new(&python).arg(script).arg(dir.path()).output().expect("python runs");
        assert!(
            out.status.success(),
            "{python} {script}: {}\n(torchvision and LeRobot come with scripts/torch-env.sh's python: eval \"$(scripts/torch-env.sh --exports)\")",
            String::from_utf8_lossy(&out.stderr)
        );
        for (name, _, lake, tolerance) in cases {
            let expected = read_f32(&dir.path().join(format!("{name}.f32")));
            let ours = raw(lake);
            assert_eq!(ours.len(), expected.len(), "{name}");
            let worst = ours.iter().zip(&expected).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            let differ = ours.iter().zip(&expected).filter(|(a, b)| a != b).count();
            eprintln!("{name}: {differ} of {} values differ from {reference}, by at most {worst:e}", ours.len());
            assert!(worst <= *tolerance, "{name}: lake's frames differ from {reference} by {worst}");
        }
    }

    /// A config with the one transform `kind`.
    fn only(kind: &str, kwargs: &Value) -> ImageTransforms {
        let tf = crate::TransformConfig { weight: 1.0, kind: kind.into(), kwargs: kwargs.as_object().cloned().expect("object") };
        let config = ImageTransformsConfig { tfs: crate::OrderedMap(vec![("t".into(), tf)]), ..ImageTransformsConfig::enabled() };
        ImageTransforms::new(&config).expect("valid").expect("on").on(TransformFrames::Float)
    }

    /// A draw as LeRobot's transform takes it (`params` of its `transform`).
    fn lerobot_params(draw: &SceneDraw) -> Value {
        match draw {
            SceneDraw::MotionBlur { size, angle } => json!({"kernel_size": size, "angle": angle}),
            SceneDraw::Jpeg(quality) => json!({"quality": quality}),
            SceneDraw::Patches(patches) => json!({
                "centers": patches.iter().map(|p| [p.centre.0, p.centre.1]).collect::<Vec<_>>(),
                "sigmas": patches.iter().map(|p| p.sigma).collect::<Vec<_>>(),
                "factors": patches.iter().map(|p| p.factor).collect::<Vec<_>>(),
            }),
            SceneDraw::Shadow { opacity, start, width, direction } => {
                json!({"opacity": opacity, "start": start, "width": width, "direction": direction})
            }
            SceneDraw::Dropout(holes) => json!({
                "sizes": holes.iter().map(|h| [h.size.0, h.size.1]).collect::<Vec<_>>(),
                "positions": holes.iter().map(|h| [h.place.0, h.place.1]).collect::<Vec<_>>(),
            }),
            SceneDraw::Gamma(gamma) => json!({"gamma": gamma}),
            SceneDraw::Planckian(kelvin) => json!({"temperature": kelvin}),
            SceneDraw::Noise { std, seed } => json!({"std": std, "seed": seed}),
        }
    }

    /// LeRobot 0.6.1's transforms for a robot's cameras, with given draws, equal LeRobot's own
    /// `transform` of each sample's frames with those draws (the noise's seed among them): bit
    /// for bit a sample at a time (the CPU's way); all samples at once (a GPU's) within the last
    /// bits where per-sample factors become tensors (the exponent of `GammaCorrection`, the
    /// padded kernels of `MotionBlur`).
    #[test]
    fn scene_transforms_are_lerobots() {
        use crate::image_transforms::{Hole, Patch};
        let x = frames();
        let patch = |cy, cx, sigma, factor| Patch { centre: (cy, cx), sigma, factor };
        let hole = |h, w, y, x| Hole { size: (h, w), place: (y, x) };
        let shadow = |opacity, start, width, direction| SceneDraw::Shadow { opacity, start, width, direction };
        let blur = |size, angle| SceneDraw::MotionBlur { size, angle };
        let noise = |std, seed| SceneDraw::Noise { std, seed };
        let cases: Vec<(&str, Value, [SceneDraw; 4], f32)> = vec![
            ("GaussianNoise", json!({}), [noise(5.0, 0), noise(12.5, 77), noise(25.0, 1 << 40), noise(0.0, (1 << 63) - 1)], 0.0),
            ("MotionBlur", json!({}), [blur(3, 0.0), blur(5, 37.3), blur(7, 90.0), blur(11, 225.0)], 2.4e-7),
            ("JPEGCompression", json!({}), [15, 50, 75, 95].map(SceneDraw::Jpeg), 0.0),
            (
                "GaussianPatchBrightness",
                json!({}),
                [
                    SceneDraw::Patches(vec![patch(0.5, 0.5, 0.2, 1.5)]),
                    SceneDraw::Patches(vec![patch(0.1, 0.9, 0.05, 0.4), patch(0.7, 0.2, 0.25, 1.6)]),
                    SceneDraw::Patches(vec![patch(0.0, 0.0, 0.1, 0.9); 4]),
                    SceneDraw::Patches(vec![patch(0.3, 0.6, 0.13, 1.2), patch(0.9, 0.1, 0.08, 0.5), patch(0.5, 0.5, 0.24, 1.0)]),
                ],
                0.0,
            ),
            (
                "RandomShadow",
                json!({}),
                [shadow(0.3, 0.0, 0.34, -1.0), shadow(0.6, 1.0, 0.66, 1.0), shadow(0.45, 0.5, 0.5, 1.0), shadow(0.5, 0.25, 0.4, -1.0)],
                0.0,
            ),
            (
                "CoarseDropout",
                json!({"fill_value": 0.25}),
                [
                    SceneDraw::Dropout(vec![hole(0.07, 0.07, 0.5, 0.5)]),
                    SceneDraw::Dropout(vec![hole(0.0, 1.0, 1.0, 0.0), hole(0.3, 0.2, 0.0, 1.0)]),
                    SceneDraw::Dropout(vec![hole(0.5, 0.5, 0.25, 0.75); 3]),
                    SceneDraw::Dropout(vec![hole(1.0, 1.0, 0.0, 0.0)]),
                ],
                0.0,
            ),
            ("GammaCorrection", json!({}), [0.5, 0.8, 1.7, 2.0].map(SceneDraw::Gamma), 2.4e-7),
            ("PlanckianJitter", json!({}), [3000, 6750, 11234, 15000].map(SceneDraw::Planckian), 0.0),
        ];
        let mut compared = Vec::new();
        for (kind, kwargs, draws, tolerance) in cases {
            let transforms = only(kind, &kwargs);
            let rows: Vec<Vec<Value>> = draws
                .iter()
                .map(|d| vec![json!({"kind": "lerobot", "class": kind, "kwargs": kwargs, "params": lerobot_params(d)})])
                .collect();
            let draws: Vec<Vec<(usize, Draw)>> = draws.into_iter().map(|d| vec![(0, Draw::Scene(d))]).collect();
            compared.push((kind.to_string(), rows.clone(), apply(&transforms, &x, &draws), 0.0));
            compared.push((format!("{kind}-grouped"), rows, grouped(&transforms, &x, &draws), tolerance));
        }
        compare_with_reference(&x, &compared, "LeRobot 0.6.1's");
        assert_eq!(raw(&x), raw(&frames()));
        assert!(compared.iter().all(|(_, _, lake, _)| raw(lake) != raw(&x)));
    }
}
