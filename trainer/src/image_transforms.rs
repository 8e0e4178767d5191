//! LeRobot's image transforms for training (`ImageTransformsConfig`, lerobot-train's
//! `--dataset.image_transforms.*`): each sample's frames of each camera get a random subset of
//! colour and geometry jitters, and of LeRobot 0.6.1's transforms for a robot's cameras (`scene`:
//! noise, motion blur, JPEG, uneven light, shadows, occlusions, exposure, colour temperature), as
//! the sample enters a training step.
//!
//! - [`ImageTransformsConfig`]: LeRobot's fields, names and defaults (up to 3 of brightness,
//!   contrast, saturation, hue, sharpness and a small affine per camera frame), read from JSON.
//! - [`ImageTransforms`]: the config checked as torchvision (and LeRobot, for its own
//!   transforms) checks each transform's arguments.
//! - [`ImageTransforms::draw`]: the transforms and factors of one sample's camera, a pure
//!   function of the run's seed, the step, the sample's place in the step's global batch and the
//!   camera. A resumed run, and a run with another number of ranks, draws the same
//!   (docs/decisions/0032-image-transforms-drawn-by-sample.md).
//! - `apply` (feature `torch`): the draws applied to a camera's frames on their device with
//!   torchvision's arithmetic, on uint8 frames as lerobot-train 0.6.1's dataset hands them over,
//!   or on float frames in [0, 1] as LeRobot 0.4.4's does ([`TransformFrames`]).
//!
//! A window of frames (Diffusion's observation steps) gets one draw for all its frames, as a
//! `[S, C, H, W]` tensor gets one from torchvision.

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use self::args::{Args, Given};
use self::scene::Scene;
pub use self::scene::{Hole, Patch, SCENE_TRANSFORMS, SceneDraw};
use crate::{Error, OrderedMap, Result, seeds::Stream};

#[cfg(feature = "torch")]
pub(crate) mod apply;
mod args;
pub(crate) mod scene;

/// LeRobot's `ImageTransformsConfig`: every field with its name and default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ImageTransformsConfig {
    /// Whether the transforms run (LeRobot's default: no).
    pub enable: bool,
    /// How many of the transforms each camera frame gets (fewer when fewer have a weight).
    pub max_num_transforms: usize,
    /// Apply a frame's transforms in the order they were drawn, not in the order of `tfs`.
    pub random_order: bool,
    /// The transforms by name, in order.
    pub tfs: OrderedMap<String, TransformConfig>,
}

/// One transform of [`ImageTransformsConfig::tfs`]: LeRobot's `ImageTransformConfig`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TransformConfig {
    /// Its weight in the draw of a frame's transforms (0 or less: never drawn).
    pub weight: f64,
    /// The torchvision class (`ColorJitter`, `RandomAffine`, `Identity`) or LeRobot's own
    /// (`SharpnessJitter`, and 0.6.1's `GaussianNoise`, `MotionBlur`, `JPEGCompression`,
    /// `GaussianPatchBrightness`, `RandomShadow`, `CoarseDropout`, `GammaCorrection`,
    /// `PlanckianJitter`).
    #[serde(rename = "type")]
    pub kind: String,
    /// The class's arguments: the ranges its factors are drawn from.
    pub kwargs: serde_json::Map<String, Value>,
}

impl Default for TransformConfig {
    fn default() -> Self {
        TransformConfig { weight: 1.0, kind: "Identity".into(), kwargs: serde_json::Map::new() }
    }
}

impl Default for ImageTransformsConfig {
    fn default() -> Self {
        let tf = |kind: &str, kwargs: Value| TransformConfig {
            weight: 1.0,
            kind: kind.into(),
            kwargs: kwargs.as_object().cloned().expect("an object"),
        };
        let tfs = [
            ("brightness", tf("ColorJitter", serde_json::json!({"brightness": [0.8, 1.2]}))),
            ("contrast", tf("ColorJitter", serde_json::json!({"contrast": [0.8, 1.2]}))),
            ("saturation", tf("ColorJitter", serde_json::json!({"saturation": [0.5, 1.5]}))),
            ("hue", tf("ColorJitter", serde_json::json!({"hue": [-0.05, 0.05]}))),
            ("sharpness", tf("SharpnessJitter", serde_json::json!({"sharpness": [0.5, 1.5]}))),
            ("affine", tf("RandomAffine", serde_json::json!({"degrees": [-5.0, 5.0], "translate": [0.05, 0.05]}))),
        ];
        ImageTransformsConfig {
            enable: false,
            max_num_transforms: 3,
            random_order: false,
            tfs: OrderedMap(tfs.into_iter().map(|(n, t)| (n.to_string(), t)).collect()),
        }
    }
}

impl ImageTransformsConfig {
    /// LeRobot's defaults, switched on.
    pub fn enabled() -> Self {
        ImageTransformsConfig { enable: true, ..Default::default() }
    }

    /// The config in `text`: LeRobot's `ImageTransformsConfig` as JSON (all or some of its
    /// fields, over LeRobot's defaults; `tfs`, when given, is the whole set), or a
    /// `train_config.json` that holds one as `dataset.image_transforms`. A file given to a
    /// training run asks for the transforms: `enable` is true where the file leaves it out.
    ///
    /// # Errors
    /// [`Error::Transforms`] for text that is not such JSON, or that sets `enable` to false.
    pub fn from_json(text: &str) -> Result<Self> {
        let value: Value = serde_json::from_str(text).map_err(|e| Error::Transforms(format!("not JSON: {e}")))?;
        let mut value = match value.pointer("/dataset/image_transforms") {
            Some(inner) => inner.clone(),
            None => value,
        };
        let Some(fields) = value.as_object_mut() else {
            return Err(Error::Transforms("expected a JSON object (LeRobot's ImageTransformsConfig)".into()));
        };
        match fields.get("enable") {
            None => {
                fields.insert("enable".into(), Value::Bool(true));
            }
            Some(Value::Bool(false)) => {
                return Err(Error::Transforms(
                    "the config sets `enable` to false, which asks for no transforms: set it to true, or train without them".into(),
                ));
            }
            Some(_) => {}
        }
        serde_json::from_value(value).map_err(|e| Error::Transforms(e.to_string()))
    }

    /// The config in the file at `path`, as [`ImageTransformsConfig::from_json`] reads it.
    ///
    /// # Errors
    /// [`Error::Io`] when the file cannot be read; as [`ImageTransformsConfig::from_json`],
    /// with the file named.
    pub fn read(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(Error::io(path))?;
        Self::from_json(&text).map_err(|e| match e {
            Error::Transforms(m) => Error::Transforms(format!("{}: {m}", path.display())),
            other => other,
        })
    }
}

/// A range `[lo, hi]` a factor is drawn from.
pub(crate) type Range = (f64, f64);

/// A transform, its arguments checked.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Transform {
    /// torchvision's `ColorJitter`: brightness, contrast, saturation and hue factors (those
    /// given), applied in a random order.
    Color([Option<Range>; 4]),
    /// LeRobot's `SharpnessJitter`.
    Sharpness(Range),
    /// torchvision's `RandomAffine`.
    Affine(Affine),
    /// torchvision's `Identity`.
    Identity,
    /// One of LeRobot 0.6.1's transforms for a robot's cameras ([`SCENE_TRANSFORMS`]).
    Scene(Scene),
}

/// The names of the colour factors, in `ColorJitter`'s order.
pub(crate) const COLOR_FACTORS: [&str; 4] = ["brightness", "contrast", "saturation", "hue"];

/// torchvision's `RandomAffine` arguments.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Affine {
    /// Rotation in degrees.
    pub degrees: Range,
    /// Largest shifts as fractions of the width and the height.
    pub translate: Option<(f64, f64)>,
    /// Scale.
    pub scale: Option<Range>,
    /// Shear in degrees along x, and along y when there are four values.
    pub shear: Option<Vec<f64>>,
    /// Nearest-neighbour sampling (torchvision's default), else bilinear.
    pub nearest: bool,
    /// The value of pixels from outside the frame: one for every channel, or one per channel.
    pub fill: Vec<f64>,
    /// The centre of rotation in pixels; the frame's centre when `None`.
    pub center: Option<(f64, f64)>,
}

/// The factors of one transform for one sample's frames.
#[derive(Debug, Clone, PartialEq)]
pub enum Draw {
    /// `ColorJitter`: the order of its four adjustments, and the factor of each one given.
    Color {
        /// Indices into brightness, contrast, saturation, hue.
        order: [usize; 4],
        /// The factors; `None` for an adjustment the transform does not make.
        factors: [Option<f64>; 4],
    },
    /// `SharpnessJitter`'s factor.
    Sharpness(f64),
    /// `RandomAffine`'s parameters.
    Affine {
        /// Rotation in degrees.
        angle: f64,
        /// Shift in whole pixels, x and y.
        translate: (f64, f64),
        /// Scale.
        scale: f64,
        /// Shear in degrees, x and y.
        shear: (f64, f64),
    },
    /// Nothing to do.
    Identity,
    /// One of LeRobot 0.6.1's transforms for a robot's cameras.
    Scene(SceneDraw),
}

/// Where a draw comes from: the run, the step, the sample and the camera.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrawKey {
    /// The run's seed.
    pub seed: u64,
    /// The training step (1 for the first).
    pub step: u64,
    /// The sample's place in the step's batch over all ranks: `rank × batch size + row`.
    pub position: u64,
    /// The camera's place among the policy's cameras.
    pub camera: u64,
}

/// The frames torchvision's transforms are handed, which decides their arithmetic.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TransformFrames {
    /// uint8, as lerobot-train 0.6.1's dataset hands them over (`return_uint8=True`): each
    /// transform's result is cast back to uint8 as torchvision casts it (truncated; the affine's
    /// rounded), and the policy gets the levels over 255. LeRobot 0.6.1's transforms for a
    /// robot's cameras, which pass uint8 frames through unchanged, get the frames as float in
    /// [0, 1] instead, and the transforms after them float frames.
    #[default]
    Uint8,
    /// float in [0, 1], as LeRobot 0.4.4's dataset hands them over.
    Float,
}

impl TransformFrames {
    /// The name `lake train --transform-frames` takes.
    pub fn name(self) -> &'static str {
        match self {
            TransformFrames::Uint8 => "uint8",
            TransformFrames::Float => "float",
        }
    }
}

impl std::str::FromStr for TransformFrames {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "uint8" => Ok(TransformFrames::Uint8),
            "float" => Ok(TransformFrames::Float),
            _ => Err(format!("{s:?} is not a kind of frames for the image transforms: uint8 (LeRobot 0.6.1) or float (LeRobot 0.4.4)")),
        }
    }
}

/// The transforms of an enabled [`ImageTransformsConfig`], checked.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageTransforms {
    names: Vec<String>,
    transforms: Vec<Transform>,
    weights: Vec<f64>,
    per_frame: usize,
    random_order: bool,
    frames: TransformFrames,
}

impl ImageTransforms {
    /// The transforms `config` asks for: `None` when it is not enabled, or when no transform has
    /// a weight above 0 or `max_num_transforms` is 0 (as LeRobot's `ImageTransforms` is then
    /// the identity).
    ///
    /// # Errors
    /// [`Error::Transforms`] for a transform lake does not apply or arguments torchvision
    /// refuses, naming the transform.
    pub fn new(config: &ImageTransformsConfig) -> Result<Option<Self>> {
        if !config.enable {
            return Ok(None);
        }
        let (mut names, mut transforms, mut weights) = (Vec::new(), Vec::new(), Vec::new());
        for (name, tf) in config.tfs.iter() {
            if tf.weight.is_nan() {
                return Err(Error::Transforms(format!("transform `{name}`: a weight that is not a number")));
            }
            if tf.weight <= 0.0 {
                continue;
            }
            let transform = Transform::from_config(tf).map_err(|m| Error::Transforms(format!("transform `{name}` ({}): {m}", tf.kind)))?;
            names.push(name.clone());
            transforms.push(transform);
            weights.push(tf.weight);
        }
        let per_frame = transforms.len().min(config.max_num_transforms);
        if per_frame == 0 {
            return Ok(None);
        }
        let frames = TransformFrames::default();
        Ok(Some(ImageTransforms { names, transforms, weights, per_frame, random_order: config.random_order, frames }))
    }

    /// These transforms handed `frames` ([`TransformFrames::Uint8`] unless said).
    #[must_use]
    pub fn on(self, frames: TransformFrames) -> Self {
        ImageTransforms { frames, ..self }
    }

    /// The frames the transforms are handed.
    pub fn frames(&self) -> TransformFrames {
        self.frames
    }

    /// The names of the transforms that can be drawn, in order.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// How many transforms each camera frame gets.
    pub fn per_frame(&self) -> usize {
        self.per_frame
    }

    /// The transform at `index` of [`ImageTransforms::names`].
    #[cfg(any(feature = "torch", test))]
    pub(crate) fn transform(&self, index: usize) -> &Transform {
        &self.transforms[index]
    }

    /// The transforms (indices into [`ImageTransforms::names`]) and factors of the frames of
    /// `key`'s sample and camera, `height` × `width` pixels, in the order they apply.
    ///
    /// The transforms are drawn without replacement with probabilities proportional to their
    /// weights (as `torch.multinomial` draws LeRobot's), then each draws its factors uniformly
    /// from its ranges as torchvision's transform does.
    pub fn draw(&self, key: DrawKey, height: usize, width: usize) -> Vec<(usize, Draw)> {
        let mut stream = Stream::new(&[key.seed, key.step, key.position, key.camera]);
        let mut left: Vec<usize> = (0..self.transforms.len()).collect();
        let mut chosen = Vec::with_capacity(self.per_frame);
        for _ in 0..self.per_frame {
            let total: f64 = left.iter().map(|&i| self.weights[i]).sum();
            let mut u = stream.unit() * total;
            let mut pick = left.len() - 1;
            for (k, &i) in left.iter().enumerate() {
                if u < self.weights[i] {
                    pick = k;
                    break;
                }
                u -= self.weights[i];
            }
            chosen.push(left.remove(pick));
        }
        if !self.random_order {
            chosen.sort_unstable();
        }
        chosen.into_iter().map(|i| (i, self.transforms[i].draw(&mut stream, height, width))).collect()
    }
}

impl Transform {
    fn from_config(tf: &TransformConfig) -> std::result::Result<Self, String> {
        let args = Args(&tf.kwargs);
        let transform = match tf.kind.as_str() {
            "ColorJitter" => {
                args.only(&COLOR_FACTORS)?;
                let factor = |name: &str| args.factor_range(name, 1.0, (0.0, f64::INFINITY), true);
                let ranges =
                    [factor("brightness")?, factor("contrast")?, factor("saturation")?, args.factor_range("hue", 0.0, (-0.5, 0.5), false)?];
                Transform::Color(ranges)
            }
            "SharpnessJitter" => {
                args.only(&["sharpness"])?;
                let range = args.number_or_range("sharpness")?.ok_or("`sharpness` is required")?;
                let range = match range {
                    Given::Number(v) if v < 0.0 => return Err(format!("sharpness {v}: a single number must not be negative")),
                    Given::Number(v) => ((1.0 - v).max(0.0), 1.0 + v),
                    Given::Range(r) => r,
                };
                if !(0.0 <= range.0 && range.0 <= range.1) {
                    return Err(format!("sharpness {range:?}: expected 0 <= min <= max"));
                }
                Transform::Sharpness(range)
            }
            "RandomAffine" => Transform::Affine(Affine::from_args(&args)?),
            "Identity" => {
                args.only(&[])?;
                Transform::Identity
            }
            other => match Scene::from_args(other, &args) {
                Some(scene) => Transform::Scene(scene?),
                None => {
                    return Err(format!(
                        "`{other}` is not a transform lake train applies; it applies ColorJitter, SharpnessJitter, RandomAffine and Identity (LeRobot's default set), and {}",
                        SCENE_TRANSFORMS.join(", ")
                    ));
                }
            },
        };
        Ok(transform)
    }

    fn draw(&self, stream: &mut Stream, height: usize, width: usize) -> Draw {
        match self {
            Transform::Color(ranges) => {
                let mut order = [0, 1, 2, 3];
                for i in (1..4).rev() {
                    order.swap(i, stream.below(i + 1));
                }
                let mut factors = [None; 4];
                for (factor, range) in factors.iter_mut().zip(ranges) {
                    *factor = range.map(|r| stream.uniform(r));
                }
                Draw::Color { order, factors }
            }
            Transform::Sharpness(range) => Draw::Sharpness(stream.uniform(*range)),
            Transform::Affine(a) => {
                let angle = stream.uniform(a.degrees);
                let translate = match a.translate {
                    Some((fx, fy)) => {
                        let (dx, dy) = (fx * width as f64, fy * height as f64);
                        let tx = stream.uniform((-dx, dx)).round_ties_even();
                        (tx, stream.uniform((-dy, dy)).round_ties_even())
                    }
                    None => (0.0, 0.0),
                };
                let scale = a.scale.map_or(1.0, |r| stream.uniform(r));
                let shear = match a.shear.as_deref() {
                    Some([x0, x1]) => (stream.uniform((*x0, *x1)), 0.0),
                    Some([x0, x1, y0, y1]) => {
                        let x = stream.uniform((*x0, *x1));
                        (x, stream.uniform((*y0, *y1)))
                    }
                    _ => (0.0, 0.0),
                };
                Draw::Affine { angle, translate, scale, shear }
            }
            Transform::Identity => Draw::Identity,
            Transform::Scene(scene) => Draw::Scene(scene.draw(stream)),
        }
    }
}

impl Affine {
    fn from_args(args: &Args) -> std::result::Result<Self, String> {
        args.only(&["degrees", "translate", "scale", "shear", "interpolation", "fill", "center"])?;
        let degrees = match args.number_or_range("degrees")?.ok_or("`degrees` is required")? {
            Given::Number(d) if d < 0.0 => return Err(format!("degrees {d}: a single number must not be negative")),
            Given::Number(d) => (-d, d),
            Given::Range(r) => r,
        };
        let translate = args.numbers("translate")?.map(|t| match t[..] {
            [x, y] if (0.0..=1.0).contains(&x) && (0.0..=1.0).contains(&y) => Ok((x, y)),
            _ => Err(format!("translate {t:?}: expected two fractions between 0 and 1")),
        });
        let scale = args.numbers("scale")?.map(|s| match s[..] {
            [lo, hi] if lo > 0.0 && hi > 0.0 => Ok((lo, hi)),
            _ => Err(format!("scale {s:?}: expected two positive numbers")),
        });
        let shear = match args.0.get("shear") {
            None | Some(Value::Null) => None,
            Some(Value::Number(n)) => {
                let s = n.as_f64().unwrap_or(f64::NAN);
                if s.is_nan() || s < 0.0 {
                    return Err(format!("shear {s}: a single number must not be negative"));
                }
                Some(vec![-s, s])
            }
            Some(_) => {
                let s = args.numbers("shear")?.unwrap_or_default();
                if s.len() != 2 && s.len() != 4 {
                    return Err(format!("shear {s:?}: expected a number, or 2 or 4 numbers"));
                }
                Some(s)
            }
        };
        let nearest = match args.0.get("interpolation") {
            None | Some(Value::Null) => true,
            Some(Value::String(s)) if s.eq_ignore_ascii_case("nearest") || s.eq_ignore_ascii_case("InterpolationMode.NEAREST") => true,
            Some(Value::String(s)) if s.eq_ignore_ascii_case("bilinear") || s.eq_ignore_ascii_case("InterpolationMode.BILINEAR") => false,
            Some(Value::Number(n)) if n.as_u64() == Some(0) => true,
            Some(Value::Number(n)) if n.as_u64() == Some(2) => false,
            Some(other) => return Err(format!("interpolation {other}: lake applies `nearest` and `bilinear`")),
        };
        let fill = match args.0.get("fill") {
            None | Some(Value::Null) => vec![0.0],
            Some(Value::Number(n)) => vec![n.as_f64().unwrap_or(f64::NAN)],
            Some(_) => args.numbers("fill")?.unwrap_or_default(),
        };
        if !(fill.len() == 1 || fill.len() == 3) || fill.iter().any(|f| !f.is_finite()) {
            return Err(format!("fill {fill:?}: expected a number, or one per channel"));
        }
        let center = args.numbers("center")?.map(|c| match c[..] {
            [x, y] => Ok((x, y)),
            _ => Err(format!("center {c:?}: expected two numbers")),
        });
        Ok(Affine {
            degrees,
            translate: translate.transpose()?,
            scale: scale.transpose()?,
            shear,
            nearest,
            fill,
            center: center.transpose()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(step: u64, position: u64) -> DrawKey {
        DrawKey { seed: 1000, step, position, camera: 0 }
    }

    /// The defaults are LeRobot's, in its order, and a config round-trips through JSON with that
    /// order kept.
    #[test]
    fn defaults_are_lerobots() {
        let config = ImageTransformsConfig::default();
        assert!(!config.enable);
        assert_eq!((config.max_num_transforms, config.random_order), (3, false));
        let names: Vec<&str> = config.tfs.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["brightness", "contrast", "saturation", "hue", "sharpness", "affine"]);
        let json = serde_json::to_string(&ImageTransformsConfig::enabled()).expect("JSON");
        assert!(json.find("brightness") < json.find("affine"), "{json}");
        assert_eq!(ImageTransformsConfig::from_json(&json).expect("read back"), ImageTransformsConfig::enabled());
        let transforms = ImageTransforms::new(&ImageTransformsConfig::enabled()).expect("valid").expect("enabled");
        assert_eq!(transforms.per_frame(), 3);
        assert_eq!(
            transforms.transform(5),
            &Transform::Affine(Affine {
                degrees: (-5.0, 5.0),
                translate: Some((0.05, 0.05)),
                scale: None,
                shear: None,
                nearest: true,
                fill: vec![0.0],
                center: None
            })
        );
        assert_eq!(ImageTransforms::new(&ImageTransformsConfig::default()).expect("valid"), None);
    }

    /// A file gives some fields over the defaults, or a whole train_config.json; it turns the
    /// transforms on unless it says otherwise, and one that says otherwise is refused.
    #[test]
    fn files_give_fields_over_the_defaults() {
        let some = ImageTransformsConfig::from_json(r#"{"max_num_transforms": 2, "random_order": true}"#).expect("fields");
        assert_eq!(some, ImageTransformsConfig { max_num_transforms: 2, random_order: true, ..ImageTransformsConfig::enabled() });
        let train_config = r#"{"dataset": {"repo_id": "x", "image_transforms": {"enable": true, "max_num_transforms": 1,
            "tfs": {"b": {"weight": 2.0, "type": "ColorJitter", "kwargs": {"brightness": [0.5, 1.5]}}}}}, "seed": 3}"#;
        let config = ImageTransformsConfig::from_json(train_config).expect("train config");
        assert_eq!(config.max_num_transforms, 1);
        assert_eq!(config.tfs.len(), 1);
        let transforms = ImageTransforms::new(&config).expect("valid").expect("on");
        assert_eq!(transforms.names(), ["b"]);
        assert_eq!(transforms.transform(0), &Transform::Color([Some((0.5, 1.5)), None, None, None]));

        let off = ImageTransformsConfig::from_json(r#"{"enable": false}"#).unwrap_err().to_string();
        assert!(off.contains("`enable` to false"), "{off}");
        let unknown = ImageTransformsConfig::from_json(r#"{"max_transforms": 2}"#).unwrap_err().to_string();
        assert!(unknown.contains("max_transforms"), "{unknown}");
    }

    /// Arguments are read as torchvision reads them, and refused where torchvision refuses
    /// them, naming the transform.
    #[test]
    fn arguments_are_checked_as_torchvision_checks_them() {
        let compile = |kind: &str, kwargs: Value| {
            let tf = TransformConfig { weight: 1.0, kind: kind.into(), kwargs: kwargs.as_object().cloned().expect("object") };
            let config = ImageTransformsConfig { tfs: OrderedMap(vec![("t".into(), tf)]), ..ImageTransformsConfig::enabled() };
            ImageTransforms::new(&config).map(|t| t.map(|t| t.transform(0).clone()))
        };
        let ok = |kind: &str, kwargs: Value| compile(kind, kwargs).expect("valid").expect("enabled");
        let refused = |kind: &str, kwargs: Value| compile(kind, kwargs).unwrap_err().to_string();
        assert_eq!(ok("ColorJitter", serde_json::json!({"brightness": 0.3})), Transform::Color([Some((0.7, 1.3)), None, None, None]));
        assert_eq!(ok("ColorJitter", serde_json::json!({"contrast": 1.5})), Transform::Color([None, Some((0.0, 2.5)), None, None]));
        assert_eq!(ok("ColorJitter", serde_json::json!({"hue": 0.1})), Transform::Color([None, None, None, Some((-0.1, 0.1))]));
        assert_eq!(ok("ColorJitter", serde_json::json!({"brightness": [1, 1]})), Transform::Color([None; 4]));
        assert_eq!(ok("SharpnessJitter", serde_json::json!({"sharpness": 2})), Transform::Sharpness((0.0, 3.0)));
        let Transform::Affine(a) =
            ok("RandomAffine", serde_json::json!({"degrees": 10, "shear": 4, "interpolation": "bilinear", "fill": [0, 0.5, 1]}))
        else {
            panic!("an affine")
        };
        assert_eq!((a.degrees, a.shear, a.nearest, a.fill), ((-10.0, 10.0), Some(vec![-4.0, 4.0]), false, vec![0.0, 0.5, 1.0]));

        for (kind, kwargs, says) in [
            ("ColorJitter", serde_json::json!({"hue": 0.7}), "transform `t` (ColorJitter): hue (-0.7, 0.7)"),
            ("ColorJitter", serde_json::json!({"brightness": -1}), "must not be negative"),
            ("ColorJitter", serde_json::json!({"brightnes": 0.2}), "unknown argument `brightnes`"),
            ("SharpnessJitter", serde_json::json!({}), "`sharpness` is required"),
            ("RandomAffine", serde_json::json!({"degrees": 5, "translate": [0.1, 2]}), "translate [0.1, 2.0]"),
            ("RandomAffine", serde_json::json!({"degrees": 5, "interpolation": "bicubic"}), "interpolation"),
            ("GaussianBlur", serde_json::json!({"kernel_size": 3}), "`GaussianBlur` is not a transform lake train applies"),
            ("Identity", serde_json::json!({"p": 1}), "takes no arguments"),
        ] {
            let message = refused(kind, kwargs);
            assert!(message.contains(says), "{kind}: {message}");
        }
    }

    /// Draws are a function of the key alone; the transforms come in the config's order unless
    /// `random_order`; factors stay within their ranges; the affine's shifts are whole pixels
    /// within the fraction of the frame.
    #[test]
    fn draws_are_keyed_and_within_their_ranges() {
        let transforms = ImageTransforms::new(&ImageTransformsConfig::enabled()).expect("valid").expect("on");
        assert_eq!(transforms.draw(key(5, 3), 96, 128), transforms.draw(key(5, 3), 96, 128));
        let all: Vec<_> = (0..2000).map(|p| transforms.draw(key(1, p), 96, 128)).collect();
        assert_ne!(all[0], all[1]);
        for draws in &all {
            assert_eq!(draws.len(), 3);
            assert!(draws.windows(2).all(|w| w[0].0 < w[1].0), "{draws:?}");
            for (index, draw) in draws {
                match (index, draw) {
                    (0, Draw::Color { factors: [Some(f), None, None, None], .. }) => assert!((0.8..1.2).contains(f)),
                    (1, Draw::Color { factors: [None, Some(f), None, None], .. }) => assert!((0.8..1.2).contains(f)),
                    (2, Draw::Color { factors: [None, None, Some(f), None], .. }) => assert!((0.5..1.5).contains(f)),
                    (3, Draw::Color { factors: [None, None, None, Some(f)], .. }) => assert!((-0.05..0.05).contains(f)),
                    (4, Draw::Sharpness(f)) => assert!((0.5..1.5).contains(f)),
                    (5, Draw::Affine { angle, translate: (tx, ty), scale, shear }) => {
                        assert!((-5.0..5.0).contains(angle));
                        assert!(tx.fract() == 0.0 && tx.abs() <= 6.0 && ty.fract() == 0.0 && ty.abs() <= 5.0, "{tx} {ty}");
                        assert_eq!((*scale, *shear), (1.0, (0.0, 0.0)));
                    }
                    other => panic!("{other:?}"),
                }
            }
        }
        // Another camera, step or seed draws otherwise.
        let first = transforms.draw(key(1, 0), 96, 128);
        assert_ne!(first, transforms.draw(DrawKey { camera: 1, ..key(1, 0) }, 96, 128));
        assert_ne!(first, transforms.draw(key(2, 0), 96, 128));
        assert_ne!(first, transforms.draw(DrawKey { seed: 1, ..key(1, 0) }, 96, 128));

        let shuffled = ImageTransforms::new(&ImageTransformsConfig { random_order: true, ..ImageTransformsConfig::enabled() })
            .expect("valid")
            .expect("on");
        let unsorted = (0..200).filter(|&p| !shuffled.draw(key(1, p), 96, 128).windows(2).all(|w| w[0].0 < w[1].0)).count();
        // Sorted by chance in 1 of 6 orders.
        assert!((100..200).contains(&unsorted), "{unsorted} of 200 in a drawn order");
    }

    /// Transforms are drawn in proportion to their weights, without replacement; a weight of 0
    /// is never drawn.
    #[test]
    fn transforms_are_drawn_by_weight() {
        let tf = |weight: f64| TransformConfig { weight, kind: "Identity".into(), ..Default::default() };
        let config = ImageTransformsConfig {
            max_num_transforms: 1,
            tfs: OrderedMap(vec![("a".into(), tf(1.0)), ("never".into(), tf(0.0)), ("b".into(), tf(3.0))]),
            ..ImageTransformsConfig::enabled()
        };
        let transforms = ImageTransforms::new(&config).expect("valid").expect("on");
        assert_eq!(transforms.names(), ["a", "b"]);
        let b = (0..8000).filter(|&p| transforms.draw(key(1, p), 8, 8)[0].0 == 1).count();
        // 6000 expected; 5 standard deviations are ~194.
        assert!(b.abs_diff(6000) < 194, "{b} of 8000");
        let both = ImageTransforms::new(&ImageTransformsConfig { max_num_transforms: 5, ..config }).expect("valid").expect("on");
        assert_eq!(both.per_frame(), 2);
        assert!((0..100).all(|p| both.draw(key(1, p), 8, 8).iter().map(|d| d.0).collect::<Vec<_>>() == [0, 1]));
    }
}
