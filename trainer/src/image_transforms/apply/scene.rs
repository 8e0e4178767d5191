//! LeRobot 0.6.1's transforms for a robot's cameras on `[n, S, 3, H, W]` float frames, each of
//! the `n` samples with its own draw, in one set of launches for all of them. The arithmetic is
//! LeRobot's in float32: host factors are made float32 as libtorch makes a Python number, so a
//! sample alone (the CPU's way) gets LeRobot's values bit for bit where LeRobot's own operations
//! allow it.

use std::ffi::{c_char, c_int};

use tch::{Device, Kind, Tensor};

use super::common::{mismatch, per_row, times, upload};
use crate::image_transforms::scene::{Scene, SceneDraw, hole_rects, motion_kernel, planckian_scale, shadow_band};

/// `x` with each row's draw of `scene` applied.
pub(crate) fn apply(scene: &Scene, x: &Tensor, draws: &[&SceneDraw]) -> Tensor {
    match scene {
        Scene::Noise { .. } => {
            let params = draws.iter().map(|d| if let SceneDraw::Noise { std, seed } = d { (*std, *seed) } else { mismatch(d) });
            noise(x, &params.collect::<Vec<_>>())
        }
        Scene::MotionBlur { .. } => {
            let params = draws.iter().map(|d| if let SceneDraw::MotionBlur { size, angle } = d { (*size, *angle) } else { mismatch(d) });
            motion_blur(x, &params.collect::<Vec<_>>())
        }
        Scene::Jpeg { .. } => {
            let qualities = draws.iter().map(|d| if let SceneDraw::Jpeg(q) = d { *q } else { mismatch(d) });
            jpeg(x, &qualities.collect::<Vec<_>>())
        }
        Scene::Patches { .. } => {
            let patches = draws.iter().map(|d| if let SceneDraw::Patches(p) = d { p.as_slice() } else { mismatch(d) });
            patch_brightness(x, &patches.collect::<Vec<_>>())
        }
        Scene::Shadow { .. } => shadow(x, draws),
        Scene::Dropout { fill, .. } => dropout(x, draws, *fill),
        Scene::Gamma { .. } => {
            let gammas: Vec<f64> = draws.iter().map(|d| if let SceneDraw::Gamma(g) = d { *g } else { mismatch(d) }).collect();
            let y = match gammas[..] {
                [g] => x.pow_tensor_scalar(g),
                _ => x.pow(&per_row(&gammas, x)),
            };
            y.clamp(0.0, 1.0)
        }
        Scene::Planckian { .. } => {
            let scales: Vec<f32> =
                draws.iter().flat_map(|d| if let SceneDraw::Planckian(k) = d { planckian_scale(*k) } else { mismatch(d) }).collect();
            let scale = upload(Tensor::from_slice(&scales), x.device()).view([draws.len() as i64, 1, 3, 1, 1]);
            (x * scale).clamp(0.0, 1.0)
        }
    }
}

/// `[n, S, 3, H, W]`.
fn dims(x: &Tensor) -> (i64, i64, i64, i64, i64) {
    let s = x.size();
    (s[0], s[1], s[2], s[3], s[4])
}

/// `GaussianNoise`: each row plus normal noise of its standard deviation (in levels of 255), the
/// noise `torch.randn` makes for the row's frames with a generator of their device seeded with
/// the row's seed, as LeRobot's transform makes it. A sample gets the same noise alone or among
/// others.
fn noise(x: &Tensor, params: &[(f64, u64)]) -> Tensor {
    let normal = Tensor::empty(x.size(), (Kind::Float, x.device()));
    for (row, (_, seed)) in params.iter().enumerate() {
        randn_seeded(&normal.get(row as i64), *seed);
    }
    let stds: Vec<f64> = params.iter().map(|p| p.0 / 255.0).collect();
    (x + times(&normal, &stds)).clamp(0.0, 1.0)
}

unsafe extern "C" {
    /// `csrc/random.cpp`.
    fn lake_randn_seeded(data: *mut f32, count: i64, cuda_index: c_int, seed: u64, err: *mut c_char, err_len: usize) -> c_int;
}

/// Fills `out` (contiguous float32, on the CPU or a CUDA device) with standard normals from a new
/// generator of its device seeded with `seed`.
///
/// # Panics
/// When libtorch refuses (the task's panic becomes the run's error in `transform_batch`).
fn randn_seeded(out: &Tensor, seed: u64) {
    assert!(out.kind() == Kind::Float && out.is_contiguous(), "a contiguous float32 tensor");
    let cuda_index = match out.device() {
        Device::Cpu => -1,
        Device::Cuda(index) => index as c_int,
        other => panic!("GaussianNoise on {other:?}: lake draws noise on the CPU and on CUDA devices"),
    };
    let mut err = [0 as c_char; 512];
    // SAFETY: `out` is a contiguous float32 tensor of `numel` values on the device named; the shim
    // writes only those values, and a NUL-terminated message within `err` on failure.
    let rc = unsafe { lake_randn_seeded(out.data_ptr().cast(), out.numel() as i64, cuda_index, seed, err.as_mut_ptr(), err.len()) };
    if rc != 0 {
        // SAFETY: the shim wrote a NUL-terminated message within the zeroed buffer.
        let message = unsafe { std::ffi::CStr::from_ptr(err.as_ptr()) }.to_string_lossy().into_owned();
        panic!("GaussianNoise: {message}");
    }
}

/// `MotionBlur`: each row's frames convolved with its line kernel, borders replicated.
fn motion_blur(x: &Tensor, params: &[(usize, f64)]) -> Tensor {
    let device = x.device();
    let (n, s, c, h, w) = dims(x);
    if let [(size, angle)] = params {
        // A sample alone, in LeRobot's shapes: its S frames, one kernel for every channel.
        let k = *size as i64;
        let kernel = upload(Tensor::from_slice(&motion_kernel(*size, *angle)), device).view([1, 1, k, k]).expand([c, 1, k, k], false);
        let padded = x.reshape([s, c, h, w]).pad([k / 2; 4], "replicate", None);
        return padded.conv2d(&kernel, None::<Tensor>, [1, 1], [0, 0], [1, 1], c).view([n, s, c, h, w]).clamp(0.0, 1.0);
    }
    // Rows with kernels of their own: every kernel padded to the largest with zeros, each
    // channel of each frame a group.
    let size = params.iter().map(|p| p.0).max().unwrap_or(1);
    let mut kernels = vec![0f32; params.len() * size * size];
    for (row, (k, angle)) in params.iter().enumerate() {
        let offset = (size - k) / 2;
        for (i, v) in motion_kernel(*k, *angle).into_iter().enumerate() {
            kernels[row * size * size + (i / k + offset) * size + i % k + offset] = v;
        }
    }
    let k = size as i64;
    let groups = n * s * c;
    let kernels =
        upload(Tensor::from_slice(&kernels), device).view([n, 1, 1, k, k]).expand([n, s * c, 1, k, k], false).reshape([groups, 1, k, k]);
    let padded = x.reshape([1, groups, h, w]).pad([k / 2; 4], "replicate", None);
    padded.conv2d(&kernels, None::<Tensor>, [1, 1], [0, 0], [1, 1], groups).view([n, s, c, h, w]).clamp(0.0, 1.0)
}

/// `JPEGCompression`: each frame as 8-bit RGB through libjpeg-turbo at its row's quality, on
/// the host, as torchvision's `encode_jpeg` and `decode_image` take it.
fn jpeg(x: &Tensor, qualities: &[u8]) -> Tensor {
    let (n, s, c, h, w) = dims(x);
    let bytes = (x.clamp(0.0, 1.0) * 255.0).round().to_kind(Kind::Uint8).permute([0, 1, 3, 4, 2]).to_device(Device::Cpu).contiguous();
    let pixels = Vec::<u8>::try_from(bytes.flatten(0, -1)).expect("uint8 frames");
    let frame = (h * w * c) as usize;
    let mut out = Vec::with_capacity(pixels.len());
    for (i, picture) in pixels.chunks_exact(frame).enumerate() {
        let quality = qualities[i / s as usize];
        let back = lake_codec::jpeg_round_trip(picture, (w as usize, h as usize), quality)
            .unwrap_or_else(|e| panic!("JPEGCompression at quality {quality}: {e}"));
        out.extend_from_slice(&back);
    }
    let back = upload(Tensor::from_slice(&out), x.device()).view([n, s, h, w, c]).permute([0, 1, 4, 2, 3]);
    back.to_kind(Kind::Float) / 255.0
}

/// `GaussianPatchBrightness`: each row times its mask, the product of its patches' `1 + (factor
/// − 1)·exp(−d² / 2σ²)` over the frame's [0, 1] × [0, 1] grid. Rows with fewer patches than
/// others get patches of factor 1, which multiply by exactly 1.
fn patch_brightness(x: &Tensor, rows: &[&[crate::image_transforms::Patch]]) -> Tensor {
    let device = x.device();
    let (n, _, _, h, w) = dims(x);
    let most = rows.iter().map(|p| p.len()).max().unwrap_or(0);
    let column = |f: &dyn Fn(&crate::image_transforms::Patch) -> f64, absent: f64| {
        let values: Vec<f32> = rows.iter().flat_map(|p| (0..most).map(move |i| p.get(i).map_or(absent, f) as f32)).collect();
        upload(Tensor::from_slice(&values), device).view([n, most as i64, 1, 1])
    };
    let (cy, cx) = (column(&|p| p.centre.0, 0.0), column(&|p| p.centre.1, 0.0));
    let spread = column(&|p| 2.0 * p.sigma * p.sigma, 1.0);
    let gain = column(&|p| p.factor - 1.0, 0.0);
    let yy = Tensor::linspace(0.0, 1.0, h, (Kind::Float, device)).view([1, 1, h, 1]);
    let xx = Tensor::linspace(0.0, 1.0, w, (Kind::Float, device)).view([1, 1, 1, w]);
    let distance = (yy - cy).square() + (xx - cx).square();
    let terms = (distance.neg() / spread).exp() * gain + 1.0;
    let mut mask = Tensor::ones([n, 1, h, w], (Kind::Float, device));
    for i in 0..most as i64 {
        mask *= terms.narrow(1, i, 1);
    }
    (x * mask.view([n, 1, 1, h, w])).clamp(0.0, 1.0)
}

/// `RandomShadow`: each row times its band's mask, smoothed by an average over 8 × 8 blocks
/// stretched back bilinearly.
fn shadow(x: &Tensor, draws: &[&SceneDraw]) -> Tensor {
    let device = x.device();
    let (n, _, _, h, w) = dims(x);
    let mut columns = vec![1f32; draws.len() * w as usize];
    for (row, d) in draws.iter().enumerate() {
        let SceneDraw::Shadow { opacity, start, width, direction } = d else { mismatch(d) };
        let (first, end, value) = shadow_band(*opacity, *start, *width, *direction, w as usize);
        columns[row * w as usize..][first..end].fill(value);
    }
    let mut mask = upload(Tensor::from_slice(&columns), device).view([n, 1, 1, w]).expand([n, 1, h, w], false).contiguous();
    let block = h.min(w).min(8);
    if block > 1 {
        let small = mask.avg_pool2d([block, block], [block, block], [0, 0], false, true, None);
        mask = small.upsample_bilinear2d([h, w], false, None, None);
    }
    (x * mask.view([n, 1, 1, h, w])).clamp(0.0, 1.0)
}

/// `CoarseDropout`: each row's rectangles set to `fill` in all its frames and channels.
fn dropout(x: &Tensor, draws: &[&SceneDraw], fill: f64) -> Tensor {
    let device = x.device();
    let (n, _, _, h, w) = dims(x);
    let rects: Vec<Vec<[usize; 4]>> = draws
        .iter()
        .map(|d| if let SceneDraw::Dropout(holes) = d { hole_rects(holes, h as usize, w as usize) } else { mismatch(d) })
        .collect();
    let most = rects.iter().map(Vec::len).max().unwrap_or(0);
    // Top, bottom, left and right of each row's rectangles; rows with fewer get empty ones.
    let mut bounds = vec![0i64; draws.len() * most * 4];
    for (row, r) in rects.iter().enumerate() {
        for (i, [top, left, height, width]) in r.iter().enumerate() {
            let at = (row * most + i) * 4;
            bounds[at..at + 4].copy_from_slice(&[*top as i64, (top + height) as i64, *left as i64, (left + width) as i64]);
        }
    }
    let bounds = upload(Tensor::from_slice(&bounds), device).view([n, most as i64, 4, 1, 1]);
    let bound = |i: i64| bounds.select(2, i);
    let ys = Tensor::arange(h, (Kind::Int64, device)).view([1, 1, h, 1]);
    let xs = Tensor::arange(w, (Kind::Int64, device)).view([1, 1, 1, w]);
    let rows = ys.ge_tensor(&bound(0)).logical_and(&ys.lt_tensor(&bound(1)));
    let cols = xs.ge_tensor(&bound(2)).logical_and(&xs.lt_tensor(&bound(3)));
    let holes = rows.logical_and(&cols).any_dim(1, false);
    x.masked_fill(&holes.view([n, 1, 1, h, w]), fill)
}
