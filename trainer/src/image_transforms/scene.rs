//! LeRobot 0.6.1's own transforms for the conditions a robot's cameras meet (its
//! `lerobot.transforms`): sensor noise, motion blur, JPEG artifacts, uneven light, cast shadows,
//! occlusions, exposure and colour temperature. Their arguments are checked as LeRobot checks
//! them; their draws come from lake's keyed streams, and what each draw does to the frames is
//! LeRobot's arithmetic on float frames in [0, 1].

use super::args::{Args, Given};
use crate::seeds::Stream;

/// LeRobot 0.6.1's transforms for a robot's cameras, by the names configs give them.
pub const SCENE_TRANSFORMS: [&str; 8] = [
    "GaussianNoise",
    "MotionBlur",
    "JPEGCompression",
    "GaussianPatchBrightness",
    "RandomShadow",
    "CoarseDropout",
    "GammaCorrection",
    "PlanckianJitter",
];

/// A transform of [`SCENE_TRANSFORMS`], its arguments checked.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Scene {
    /// `GaussianNoise`: the range of the noise's standard deviation, in levels of 255.
    Noise { std: (f64, f64) },
    /// `MotionBlur`: the smallest and largest odd kernel sizes.
    MotionBlur { sizes: (usize, usize) },
    /// `JPEGCompression`: the range of the quality.
    Jpeg { quality: (u8, u8) },
    /// `GaussianPatchBrightness`: how many patches, their sigma as a fraction of the frame and
    /// their brightness factor.
    Patches { count: (usize, usize), sigma: (f64, f64), factor: (f64, f64) },
    /// `RandomShadow`: the range of the band's opacity.
    Shadow { opacity: (f64, f64) },
    /// `CoarseDropout`: up to `max_holes` rectangles of at most the given fractions of the
    /// frame, set to `fill`.
    Dropout { max_holes: usize, max_height: f64, max_width: f64, fill: f64 },
    /// `GammaCorrection`: the range of the exponent.
    Gamma { gamma: (f64, f64) },
    /// `PlanckianJitter`: the range of the colour temperature, in kelvin.
    Planckian { temperature: (u32, u32) },
}

/// The factors one sample's frames get from one of LeRobot 0.6.1's transforms for a robot's cameras.
#[derive(Debug, Clone, PartialEq)]
pub enum SceneDraw {
    /// Noise of standard deviation `std` (in levels of 255), from a generator seeded with `seed`.
    Noise {
        /// The standard deviation, in levels of 255.
        std: f64,
        /// The seed of the noise's generator, below 2⁶³ (as `torch.randint` draws LeRobot's).
        seed: u64,
    },
    /// A blur along a line of `size` pixels at `angle` degrees.
    MotionBlur {
        /// The kernel's size, odd.
        size: usize,
        /// The line's angle in degrees.
        angle: f64,
    },
    /// A JPEG round trip at this quality.
    Jpeg(u8),
    /// Brightness patches.
    Patches(Vec<Patch>),
    /// A vertical band brightened (`direction` 1) or darkened (-1) by `opacity`.
    Shadow {
        /// How much the band changes.
        opacity: f64,
        /// Where the band starts, as a fraction of the room left of it.
        start: f64,
        /// The band's width as a fraction of the frame's.
        width: f64,
        /// 1 to brighten, -1 to darken.
        direction: f64,
    },
    /// Rectangles set to the transform's fill.
    Dropout(Vec<Hole>),
    /// The exponent.
    Gamma(f64),
    /// The colour temperature in kelvin.
    Planckian(u32),
}

/// A patch of [`SceneDraw::Patches`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Patch {
    /// Its centre, y then x, as fractions of the frame.
    pub centre: (f64, f64),
    /// Its sigma, as a fraction of the frame.
    pub sigma: f64,
    /// Its brightness factor at the centre.
    pub factor: f64,
}

/// A rectangle of [`SceneDraw::Dropout`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Hole {
    /// Its height and width as fractions of the frame's.
    pub size: (f64, f64),
    /// Where it lies, y then x, as fractions of the room the frame leaves around it.
    pub place: (f64, f64),
}

impl Scene {
    /// The transform `kind` with its arguments, or `None` for a kind not of this module.
    pub fn from_args(kind: &str, args: &Args) -> Option<Result<Self, String>> {
        let scene = match kind {
            "GaussianNoise" => noise(args),
            "MotionBlur" => motion_blur(args),
            "JPEGCompression" => jpeg(args),
            "GaussianPatchBrightness" => patches(args),
            "RandomShadow" => shadow(args),
            "CoarseDropout" => dropout(args),
            "GammaCorrection" => gamma(args),
            "PlanckianJitter" => planckian(args),
            _ => return None,
        };
        Some(scene)
    }

    /// The transform's factors for one sample's frames, from `stream`.
    pub fn draw(&self, stream: &mut Stream) -> SceneDraw {
        match *self {
            Scene::Noise { std } => SceneDraw::Noise { std: stream.uniform(std), seed: stream.next_u64() >> 1 },
            Scene::MotionBlur { sizes: (first, last) } => {
                let size = first + 2 * stream.below((last - first) / 2 + 1);
                SceneDraw::MotionBlur { size, angle: stream.uniform((0.0, 360.0)) }
            }
            Scene::Jpeg { quality: (lo, hi) } => SceneDraw::Jpeg(lo + stream.below(usize::from(hi - lo) + 1) as u8),
            Scene::Patches { count, sigma, factor } => {
                let n = count.0 + stream.below(count.1 - count.0 + 1);
                let patches = (0..n)
                    .map(|_| {
                        let centre = (stream.unit(), stream.unit());
                        Patch { centre, sigma: stream.uniform(sigma), factor: stream.uniform(factor) }
                    })
                    .collect();
                SceneDraw::Patches(patches)
            }
            Scene::Shadow { opacity } => SceneDraw::Shadow {
                opacity: stream.uniform(opacity),
                start: stream.unit(),
                width: stream.uniform((1.0 / 3.0, 2.0 / 3.0)),
                direction: if stream.unit() < 0.5 { -1.0 } else { 1.0 },
            },
            Scene::Dropout { max_holes, max_height, max_width, .. } => {
                let n = 1 + stream.below(max_holes);
                let holes = (0..n)
                    .map(|_| {
                        let size = (stream.unit() * max_height, stream.unit() * max_width);
                        Hole { size, place: (stream.unit(), stream.unit()) }
                    })
                    .collect();
                SceneDraw::Dropout(holes)
            }
            Scene::Gamma { gamma: (lo, hi) } => SceneDraw::Gamma(stream.uniform((lo.ln(), hi.ln())).exp()),
            Scene::Planckian { temperature: (lo, hi) } => SceneDraw::Planckian(lo + stream.below((hi - lo) as usize + 1) as u32),
        }
    }
}

fn noise(args: &Args) -> Result<Scene, String> {
    args.only(&["std"])?;
    let std = match args.number_or_range("std")? {
        None => (5.0, 25.0),
        Some(Given::Number(v)) => (0.0, v),
        Some(Given::Range(r)) => r,
    };
    if !(0.0 <= std.0 && std.0 <= std.1) {
        return Err(format!("std {std:?}: expected 0 <= min <= max"));
    }
    Ok(Scene::Noise { std })
}

fn motion_blur(args: &Args) -> Result<Scene, String> {
    args.only(&["kernel_size"])?;
    let (lo, hi) = args.integers_or("kernel_size", (3, 11))?;
    if !(1 <= lo && lo <= hi) {
        return Err(format!("kernel_size ({lo}, {hi}): expected 1 <= min <= max"));
    }
    let first = lo + (lo + 1) % 2;
    if first > hi {
        return Err(format!("kernel_size ({lo}, {hi}): the range holds no odd size"));
    }
    if hi > 4097 {
        return Err(format!("kernel_size ({lo}, {hi}): a kernel of more than 4097 pixels"));
    }
    Ok(Scene::MotionBlur { sizes: (first as usize, hi as usize - (hi - first) as usize % 2) })
}

fn jpeg(args: &Args) -> Result<Scene, String> {
    args.only(&["quality"])?;
    let (lo, hi) = args.integers_or("quality", (15, 75))?;
    if !(1 <= lo && lo <= hi && hi <= 100) {
        return Err(format!("quality ({lo}, {hi}): expected 1 <= min <= max <= 100"));
    }
    Ok(Scene::Jpeg { quality: (lo as u8, hi as u8) })
}

fn patches(args: &Args) -> Result<Scene, String> {
    args.only(&["num_patches", "sigma_range", "factor_range"])?;
    let (lo, hi) = args.integers_or("num_patches", (1, 4))?;
    if !(1 <= lo && lo <= hi && hi <= 4096) {
        return Err(format!("num_patches ({lo}, {hi}): expected 1 <= min <= max (at most 4096)"));
    }
    let sigma = args.pair_or("sigma_range", (0.05, 0.25))?;
    if !(0.0 < sigma.0 && sigma.0 <= sigma.1) {
        return Err(format!("sigma_range {sigma:?}: expected 0 < min <= max"));
    }
    let factor = args.pair_or("factor_range", (0.4, 1.6))?;
    if !(0.0 <= factor.0 && factor.0 <= factor.1) {
        return Err(format!("factor_range {factor:?}: expected 0 <= min <= max"));
    }
    Ok(Scene::Patches { count: (lo as usize, hi as usize), sigma, factor })
}

fn shadow(args: &Args) -> Result<Scene, String> {
    args.only(&["opacity"])?;
    let opacity = match args.number_or_range("opacity")? {
        None => (0.3, 0.6),
        Some(Given::Number(v)) => (v, v),
        Some(Given::Range(r)) => r,
    };
    if !(0.0 <= opacity.0 && opacity.0 <= opacity.1 && opacity.1 <= 1.0) {
        return Err(format!("opacity {opacity:?}: expected 0 <= min <= max <= 1"));
    }
    Ok(Scene::Shadow { opacity })
}

fn dropout(args: &Args) -> Result<Scene, String> {
    args.only(&["max_holes", "max_height_frac", "max_width_frac", "fill_value"])?;
    let max_holes = args.integer_or("max_holes", 8)?;
    if !(1..=4096).contains(&max_holes) {
        return Err(format!("max_holes {max_holes}: expected at least 1 (and at most 4096)"));
    }
    let (max_height, max_width) = (args.number_or("max_height_frac", 0.07)?, args.number_or("max_width_frac", 0.07)?);
    for (name, v) in [("max_height_frac", max_height), ("max_width_frac", max_width)] {
        if !(0.0 < v && v <= 1.0) {
            return Err(format!("{name} {v}: expected a fraction in (0, 1]"));
        }
    }
    let fill = args.number_or("fill_value", 0.0)?;
    if !(0.0..=1.0).contains(&fill) {
        return Err(format!("fill_value {fill}: expected a value in [0, 1]"));
    }
    Ok(Scene::Dropout { max_holes: max_holes as usize, max_height, max_width, fill })
}

fn gamma(args: &Args) -> Result<Scene, String> {
    args.only(&["gamma"])?;
    let gamma = match args.number_or_range("gamma")? {
        None => (0.5, 2.0),
        Some(Given::Number(g)) if g <= 0.0 => return Err(format!("gamma {g}: must be positive")),
        Some(Given::Number(g)) => (g.min(1.0 / g), g.max(1.0 / g)),
        Some(Given::Range(r)) => r,
    };
    if !(0.0 < gamma.0 && gamma.0 <= gamma.1) {
        return Err(format!("gamma {gamma:?}: expected 0 < min <= max"));
    }
    Ok(Scene::Gamma { gamma })
}

fn planckian(args: &Args) -> Result<Scene, String> {
    args.only(&["temperature"])?;
    let (lo, hi) = args.integers_or("temperature", (3000, 15000))?;
    if !(PLANCKIAN_KELVIN.0 as i64 <= lo && lo <= hi && hi <= PLANCKIAN_KELVIN.1 as i64) {
        return Err(format!("temperature ({lo}, {hi}): expected {} <= min <= max <= {}", PLANCKIAN_KELVIN.0, PLANCKIAN_KELVIN.1));
    }
    Ok(Scene::Planckian { temperature: (lo as u32, hi as u32) })
}

/// The temperatures `PlanckianJitter` takes, in kelvin.
const PLANCKIAN_KELVIN: (u32, u32) = (3000, 15000);

/// The red, green and blue of a black body from 3000 K to 15000 K in steps of 500 K: the table of
/// Zini et al., "Planckian Jitter" (CVPR 2022 workshops), which LeRobot's `PlanckianJitter` uses.
#[cfg(any(feature = "torch", test))]
const PLANCKIAN_RGB: [[f32; 3]; 25] = [
    [0.6743, 0.4029, 0.0013],
    [0.6281, 0.4241, 0.1665],
    [0.5919, 0.4372, 0.2513],
    [0.5623, 0.4457, 0.3154],
    [0.5376, 0.4515, 0.3672],
    [0.5163, 0.4555, 0.4103],
    [0.4979, 0.4584, 0.4468],
    [0.4816, 0.4604, 0.4782],
    [0.4672, 0.4619, 0.5053],
    [0.4542, 0.4630, 0.5289],
    [0.4426, 0.4638, 0.5497],
    [0.4320, 0.4644, 0.5681],
    [0.4223, 0.4648, 0.5844],
    [0.4135, 0.4651, 0.5990],
    [0.4054, 0.4653, 0.6121],
    [0.3980, 0.4654, 0.6239],
    [0.3911, 0.4655, 0.6346],
    [0.3847, 0.4656, 0.6444],
    [0.3787, 0.4656, 0.6532],
    [0.3732, 0.4656, 0.6613],
    [0.3680, 0.4655, 0.6688],
    [0.3632, 0.4655, 0.6756],
    [0.3586, 0.4655, 0.6820],
    [0.3544, 0.4654, 0.6878],
    [0.3503, 0.4653, 0.6933],
];

/// The factors of red, green and blue at `kelvin`: the table's colour, interpolated linearly
/// between its rows in float32 (as `torch.lerp` does), over its green.
#[cfg(any(feature = "torch", test))]
pub(crate) fn planckian_scale(kelvin: u32) -> [f32; 3] {
    let position = f64::from(kelvin - PLANCKIAN_KELVIN.0) / 500.0;
    let left = position.floor() as usize;
    let right = (left + 1).min(PLANCKIAN_RGB.len() - 1);
    let weight = (position - left as f64) as f32;
    let lerp = |a: f32, b: f32| if weight.abs() < 0.5 { a + weight * (b - a) } else { b - (b - a) * (1.0 - weight) };
    let [r, g, b] = [0, 1, 2].map(|c| lerp(PLANCKIAN_RGB[left][c], PLANCKIAN_RGB[right][c]));
    [r / g, 1.0, b / g]
}

/// `MotionBlur`'s kernel: `size` × `size` float32 weights, equal along a line of `size` points
/// through the centre at `angle` degrees (each point rounded to a pixel, half to even), summing
/// to 1.
#[cfg(any(feature = "torch", test))]
pub(crate) fn motion_kernel(size: usize, angle: f64) -> Vec<f32> {
    let radius = (size / 2) as i64;
    let (cos, sin) = (angle.to_radians().cos() as f32, angle.to_radians().sin() as f32);
    let mut kernel = vec![0f32; size * size];
    for p in -radius..=radius {
        let x = (p as f32 * cos).round_ties_even() as i64 + radius;
        let y = (p as f32 * sin).round_ties_even() as i64 + radius;
        kernel[y as usize * size + x as usize] = 1.0;
    }
    let sum: f32 = kernel.iter().sum();
    kernel.iter_mut().for_each(|k| *k /= sum);
    kernel
}

/// `RandomShadow`'s band over a frame `width` pixels wide: its first column, its end and the
/// value of its pixels in float32 (the others are 1).
#[cfg(any(feature = "torch", test))]
pub(crate) fn shadow_band(opacity: f64, start: f64, width: f64, direction: f64, frame_width: usize) -> (usize, usize, f32) {
    let w = frame_width as f64;
    let band = (width * w).round_ties_even().clamp(1.0, w);
    let first = (start * (w - band)).round_ties_even();
    (first as usize, (first + band) as usize, (1.0 + direction * opacity) as f32)
}

/// `CoarseDropout`'s rectangles on a `height` × `width` frame: top, left, height and width in
/// pixels, each at least 1 pixel and within the frame.
#[cfg(any(feature = "torch", test))]
pub(crate) fn hole_rects(holes: &[Hole], height: usize, width: usize) -> Vec<[usize; 4]> {
    let (h, w) = (height as f64, width as f64);
    holes
        .iter()
        .map(|hole| {
            let hh = (hole.size.0 * h).round_ties_even().clamp(1.0, h);
            let hw = (hole.size.1 * w).round_ties_even().clamp(1.0, w);
            let top = (hole.place.0 * (h - hh)).round_ties_even();
            let left = (hole.place.1 * (w - hw)).round_ties_even();
            [top as usize, left as usize, hh as usize, hw as usize]
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn scene(kind: &str, kwargs: Value) -> Result<Scene, String> {
        Scene::from_args(kind, &Args(kwargs.as_object().expect("object"))).expect("a scene transform")
    }

    /// Defaults and arguments are LeRobot's, refused where LeRobot refuses them.
    #[test]
    fn arguments_are_checked_as_lerobot_checks_them() {
        assert_eq!(scene("GaussianNoise", json!({})), Ok(Scene::Noise { std: (5.0, 25.0) }));
        assert_eq!(scene("GaussianNoise", json!({"std": 9})), Ok(Scene::Noise { std: (0.0, 9.0) }));
        assert_eq!(scene("MotionBlur", json!({})), Ok(Scene::MotionBlur { sizes: (3, 11) }));
        assert_eq!(scene("MotionBlur", json!({"kernel_size": [4, 8]})), Ok(Scene::MotionBlur { sizes: (5, 7) }));
        assert_eq!(scene("MotionBlur", json!({"kernel_size": 5})), Ok(Scene::MotionBlur { sizes: (5, 5) }));
        assert_eq!(scene("JPEGCompression", json!({"quality": 40})), Ok(Scene::Jpeg { quality: (40, 40) }));
        assert_eq!(
            scene("GaussianPatchBrightness", json!({"num_patches": 2})),
            Ok(Scene::Patches { count: (2, 2), sigma: (0.05, 0.25), factor: (0.4, 1.6) })
        );
        assert_eq!(scene("RandomShadow", json!({"opacity": 0.5})), Ok(Scene::Shadow { opacity: (0.5, 0.5) }));
        assert_eq!(
            scene("CoarseDropout", json!({"max_holes": 3, "fill_value": 1})),
            Ok(Scene::Dropout { max_holes: 3, max_height: 0.07, max_width: 0.07, fill: 1.0 })
        );
        assert_eq!(scene("GammaCorrection", json!({"gamma": 4})), Ok(Scene::Gamma { gamma: (0.25, 4.0) }));
        assert_eq!(scene("PlanckianJitter", json!({})), Ok(Scene::Planckian { temperature: (3000, 15000) }));
        for (kind, kwargs, says) in [
            ("GaussianNoise", json!({"std": [3, 1]}), "std (3.0, 1.0)"),
            ("MotionBlur", json!({"kernel_size": [4, 4]}), "no odd size"),
            ("MotionBlur", json!({"kernel_size": 3.0}), "expected an integer"),
            ("JPEGCompression", json!({"quality": [0, 50]}), "quality (0, 50)"),
            ("GaussianPatchBrightness", json!({"sigma_range": 0.1}), "sigma_range: expected [min, max]"),
            ("RandomShadow", json!({"opacity": 1.5}), "opacity (1.5, 1.5)"),
            ("CoarseDropout", json!({"max_holes": 2.5}), "max_holes 2.5: expected an integer"),
            ("CoarseDropout", json!({"max_width_frac": 0}), "max_width_frac 0"),
            ("GammaCorrection", json!({"gamma": 0}), "must be positive"),
            ("PlanckianJitter", json!({"temperature": [2000, 5000]}), "3000 <= min"),
            ("GaussianNoise", json!({"sigma": 3}), "unknown argument `sigma`"),
        ] {
            let message = scene(kind, kwargs).expect_err(kind);
            assert!(message.contains(says), "{kind}: {message}");
        }
        assert!(Scene::from_args("ColorJitter", &Args(&serde_json::Map::new())).is_none());
    }

    /// Draws stay within their ranges; sizes are odd, counts and qualities whole and inclusive
    /// of both ends.
    #[test]
    fn draws_are_within_their_ranges() {
        let mut stream = Stream::new(&[4]);
        let blur = Scene::MotionBlur { sizes: (3, 11) };
        let sizes: std::collections::BTreeSet<usize> = (0..400)
            .map(|_| match blur.draw(&mut stream) {
                SceneDraw::MotionBlur { size, angle } => {
                    assert!((0.0..360.0).contains(&angle));
                    size
                }
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(sizes.into_iter().collect::<Vec<_>>(), [3, 5, 7, 9, 11]);
        let qualities: std::collections::BTreeSet<u8> = (0..400)
            .map(|_| match (Scene::Jpeg { quality: (70, 72) }).draw(&mut stream) {
                SceneDraw::Jpeg(q) => q,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(qualities.into_iter().collect::<Vec<_>>(), [70, 71, 72]);
        for _ in 0..400 {
            match (Scene::Gamma { gamma: (0.5, 2.0) }).draw(&mut stream) {
                SceneDraw::Gamma(g) => assert!((0.5..2.0 + 1e-12).contains(&g), "{g}"),
                other => panic!("{other:?}"),
            }
            match (Scene::Dropout { max_holes: 3, max_height: 0.2, max_width: 0.1, fill: 0.0 }).draw(&mut stream) {
                SceneDraw::Dropout(holes) => {
                    assert!((1..=3).contains(&holes.len()));
                    assert!(holes.iter().all(|h| h.size.0 < 0.2 && h.size.1 < 0.1));
                }
                other => panic!("{other:?}"),
            }
        }
    }

    /// The table's rows come back at their temperatures, green is 1, and halfway between two
    /// rows lies between them.
    #[test]
    fn planckian_factors_follow_the_table() {
        assert_eq!(planckian_scale(3000), [0.6743 / 0.4029, 1.0, 0.0013 / 0.4029]);
        assert_eq!(planckian_scale(15000), [0.3503 / 0.4653, 1.0, 0.6933 / 0.4653]);
        let [r, g, b] = planckian_scale(6750);
        assert_eq!(g, 1.0);
        assert!(r > 0.4672 / 0.4619 && r < 0.4816 / 0.4604 && b > 0.4782 / 0.4604 && b < 0.5053 / 0.4619, "{r} {b}");
    }

    /// The blur's kernel is a line of pixels through the centre, summing to 1.
    #[test]
    fn motion_kernels_are_lines() {
        let flat = motion_kernel(5, 0.0);
        assert_eq!(&flat[10..15], &[0.2; 5]);
        assert_eq!(flat.iter().filter(|&&k| k > 0.0).count(), 5);
        let upright = motion_kernel(3, 90.0);
        assert_eq!(upright, [0.0, 1.0 / 3.0, 0.0, 0.0, 1.0 / 3.0, 0.0, 0.0, 1.0 / 3.0, 0.0]);
        // At 45° the line's 7 points fall on 5 pixels of the diagonal.
        let diagonal = motion_kernel(7, 45.0);
        let cells: Vec<usize> = (0..49).filter(|&i| diagonal[i] > 0.0).collect();
        assert_eq!(cells, [8, 16, 24, 32, 40]);
        assert!(cells.iter().all(|&i| diagonal[i] == 0.2));
    }

    #[test]
    fn bands_and_holes_stay_within_the_frame() {
        assert_eq!(shadow_band(0.5, 0.0, 0.5, -1.0, 100), (0, 50, 0.5));
        assert_eq!(shadow_band(0.25, 1.0, 0.5, 1.0, 100), (50, 100, 1.25));
        assert_eq!(shadow_band(0.25, 0.5, 0.0, 1.0, 9), (4, 5, 1.25));
        let rects = hole_rects(&[Hole { size: (0.0, 1.0), place: (1.0, 0.3) }, Hole { size: (0.5, 0.25), place: (0.5, 0.5) }], 10, 8);
        assert_eq!(rects, [[9, 0, 1, 8], [2, 3, 5, 2]]);
    }
}
