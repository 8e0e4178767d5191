//! The sampling request: what a trainer asks `lake serve` (or the in-process loader) for.

use lake_schemas::{FrameFormat, FrameSize};
use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// A dataset in a request: a name, or a name with a mixture weight.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum DatasetRef {
    /// A dataset (`NAME`, `NAME@VERSION`) or view.
    Name(String),
    /// A dataset or view with its mixture weight.
    Weighted {
        /// The name.
        name: String,
        /// Relative weight (positive).
        weight: f64,
    },
}

impl<'de> Deserialize<'de> for DatasetRef {
    /// A string (`NAME`, `NAME@VERSION`, `NAME=WEIGHT`), or exactly `{"name": …, "weight": …}`;
    /// anything else is refused saying which.
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        use serde::de::Error as _;
        const EXPECTED: &str = r#"a dataset entry is a name ("NAME", "NAME@VERSION", "NAME=WEIGHT") or {"name": NAME, "weight": WEIGHT}"#;
        match serde_json::Value::deserialize(deserializer)? {
            serde_json::Value::String(name) => Ok(Self::Name(name)),
            serde_json::Value::Object(entry) => {
                if let Some(other) = entry.keys().find(|k| !matches!(k.as_str(), "name" | "weight")) {
                    return Err(D::Error::custom(format!("unknown field `{other}` in a dataset entry; {EXPECTED}")));
                }
                let name = match entry.get("name") {
                    Some(serde_json::Value::String(n)) => n.clone(),
                    Some(_) => return Err(D::Error::custom(format!("`name` must be a string; {EXPECTED}"))),
                    None => return Err(D::Error::custom(format!("`name` is missing; {EXPECTED}"))),
                };
                let weight = match entry.get("weight") {
                    Some(w) => w.as_f64().ok_or_else(|| D::Error::custom(format!("dataset `{name}`: `weight` must be a number")))?,
                    None => return Err(D::Error::custom(format!("dataset `{name}`: `weight` is missing; {EXPECTED}"))),
                };
                Ok(Self::Weighted { name, weight })
            }
            other => Err(D::Error::custom(format!("{other} is not a dataset entry; {EXPECTED}"))),
        }
    }
}

/// A whole number of a request, at least `MIN`: JSON's integers, and numbers written with a
/// fraction of zero (`32.0`, as Python's `json` writes a float; JSON Schema's `integer` takes
/// them too).
fn whole<'de, const MIN: u64, D: serde::Deserializer<'de>>(deserializer: D) -> std::result::Result<u64, D::Error> {
    struct Whole<const MIN: u64>;
    impl<const MIN: u64> serde::de::Visitor<'_> for Whole<MIN> {
        type Value = u64;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            write!(f, "a whole number, {MIN} or more")
        }
        fn visit_u64<E: serde::de::Error>(self, v: u64) -> std::result::Result<u64, E> {
            Ok(v)
        }
        fn visit_i64<E: serde::de::Error>(self, v: i64) -> std::result::Result<u64, E> {
            u64::try_from(v).map_err(|_| E::invalid_value(serde::de::Unexpected::Signed(v), &self))
        }
        fn visit_f64<E: serde::de::Error>(self, v: f64) -> std::result::Result<u64, E> {
            // 2^64 and above are too large (as a float, u64::MAX rounds up to 2^64).
            if v.fract() == 0.0 && v > -1.0 && v < 18_446_744_073_709_551_616.0 {
                Ok(v as u64)
            } else if v.fract() == 0.0 && v > 0.0 {
                Err(E::custom(format!("too large: expected a whole number from 0 to {}", u64::MAX)))
            } else {
                Err(E::invalid_type(serde::de::Unexpected::Float(v), &self))
            }
        }
    }
    let v = deserializer.deserialize_any(Whole::<MIN>)?;
    if v < MIN {
        return Err(serde::de::Error::custom(format!("{v} is too small: expected a whole number, {MIN} or more")));
    }
    Ok(v)
}

/// [`whole`] or `null`.
fn whole_or_null<'de, D: serde::Deserializer<'de>>(deserializer: D) -> std::result::Result<Option<u64>, D::Error> {
    struct Maybe;
    impl<'de> serde::de::Visitor<'de> for Maybe {
        type Value = Option<u64>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a whole number, 0 or more, or null")
        }
        fn visit_none<E: serde::de::Error>(self) -> std::result::Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E: serde::de::Error>(self) -> std::result::Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> std::result::Result<Self::Value, D::Error> {
            whole::<0, D>(d).map(Some)
        }
    }
    deserializer.deserialize_option(Maybe)
}

fn default_batch_size() -> u64 {
    32
}
fn default_world_size() -> u64 {
    1
}
fn default_true() -> bool {
    true
}
fn default_stride() -> u64 {
    1
}
fn is_true(b: &bool) -> bool {
    *b
}
fn is_one(n: &u64) -> bool {
    *n == 1
}

/// A field's value whenever it is present, `null` included (absent fields take the default).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Option<serde_json::Value>, D::Error> {
    serde_json::Value::deserialize(d).map(Some)
}

fn default_preset() -> String {
    "none".into()
}

/// Most samples per rank's batch a request may ask for.
pub const MAX_BATCH_SIZE: u64 = 1 << 20;

/// Most entries of a request's `datasets` (each is planned and opened apart: a mixture of
/// thousands would cost seconds of server CPU to plan).
pub const MAX_DATASETS: usize = 256;

/// Largest sampling request (JSON), on every transport: an HTTP body, a Flight descriptor's
/// command. A ticket may be up to twice as large (it is the request with its defaults and
/// dataset versions filled in).
pub const MAX_REQUEST_BYTES: usize = 2 << 20;

/// Largest Flight ticket: twice the largest request, as a ticket is a request with its
/// defaults and dataset versions filled in.
pub const MAX_TICKET_BYTES: usize = 2 * MAX_REQUEST_BYTES;
/// Most ranks a request may name.
pub const MAX_WORLD_SIZE: u64 = 1 << 16;

/// A sampling request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SampleRequest {
    /// Datasets or views to sample from.
    pub datasets: Vec<DatasetRef>,
    /// Window preset (`act`, `diffusion`, `none`); ignored when `delta_timestamps` is given.
    #[serde(default = "default_preset")]
    pub preset: String,
    /// LeRobot `delta_timestamps`: given (`null` for no windows), it replaces the preset.
    /// Absent is `None`; a present `null` is `Some(Null)` (and is written back as `null`).
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub delta_timestamps: Option<serde_json::Value>,
    /// Samples per batch for each rank.
    #[serde(default = "default_batch_size", deserialize_with = "whole::<1, _>")]
    pub batch_size: u64,
    /// Sampler seed.
    #[serde(default, deserialize_with = "whole::<0, _>")]
    pub seed: u64,
    /// Each epoch a shuffle of the eligible steps, a pure function of `seed` and the epoch
    /// (the default); `false`: the eligible steps in the order recorded, each dataset's after
    /// the one before as the request names them, the same every epoch (an evaluation pass).
    /// Weights mix datasets in a shuffle, so an unshuffled request gives none.
    #[serde(default = "default_true", skip_serializing_if = "is_true")]
    pub shuffle: bool,
    /// Epoch to start in.
    #[serde(default, deserialize_with = "whole::<0, _>")]
    pub epoch: u64,
    /// Global step to start at within `epoch`.
    #[serde(default, deserialize_with = "whole::<0, _>")]
    pub start_step: u64,
    /// This trainer's rank.
    #[serde(default, deserialize_with = "whole::<0, _>")]
    pub rank: u64,
    /// Number of ranks.
    #[serde(default = "default_world_size", deserialize_with = "whole::<1, _>")]
    pub world_size: u64,
    /// Batches to send (none: indefinitely, across epochs).
    #[serde(default, deserialize_with = "whole_or_null")]
    pub limit_batches: Option<u64>,
    /// Global steps from one batch to the next: 1 sends every step from `start_step` on; `n`
    /// sends every `n`-th, so that `n` readers of one rank (a DataLoader's workers) starting at
    /// consecutive steps take turns.
    #[serde(default = "default_stride", skip_serializing_if = "is_one", deserialize_with = "whole::<1, _>")]
    pub step_stride: u64,
    /// Drop each epoch's short last global batch.
    #[serde(default = "default_true")]
    pub drop_last: bool,
    /// Only these episodes (of every dataset); left out, every episode. An empty list selects
    /// nothing and is refused.
    #[serde(default, deserialize_with = "some_episodes", skip_serializing_if = "Vec::is_empty")]
    pub episodes: Vec<i64>,
    /// Never sample the first N steps of an episode.
    #[serde(default, deserialize_with = "whole::<0, _>")]
    pub drop_n_first_frames: u64,
    /// Never sample the last N steps of an episode.
    #[serde(default, deserialize_with = "whole::<0, _>")]
    pub drop_n_last_frames: u64,
    /// Every camera's frames at `"WxH"`, from each dataset's frame table of that size (`lake
    /// cache NAME --size WxH`); absent: as recorded.
    #[serde(default)]
    pub frame_size: Option<FrameSize>,
    /// `rgb24` (LeRobot's frames); `yuv420p`: the video cameras whose frames are 8-bit 4:2:0
    /// as the decoder's planes, for the trainer to convert (see the camera columns' metadata);
    /// `packets`: every camera's compressed GOPs, for the trainer to decode (lake-loader's
    /// `PacketBatchDecoder`). `null` is the default, as for `frame_size`.
    #[serde(default, skip_serializing_if = "is_rgb", deserialize_with = "format_or_null")]
    pub frame_format: FrameFormat,
    /// Every camera's frames from each dataset's training proxy (`lake cache NAME --proxy
    /// h264`): re-encoded for random access, lossy, not LeRobot's frames; the camera columns'
    /// `lake:proxy` metadata says how far they are from them.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub proxy: bool,
}

/// A frame format by its name, `null` for the default.
fn format_or_null<'de, D: serde::Deserializer<'de>>(deserializer: D) -> std::result::Result<FrameFormat, D::Error> {
    struct Format;
    impl serde::de::Visitor<'_> for Format {
        type Value = FrameFormat;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("`rgb24`, `yuv420p` or `packets`, or null")
        }
        fn visit_unit<E: serde::de::Error>(self) -> std::result::Result<Self::Value, E> {
            Ok(FrameFormat::default())
        }
        fn visit_str<E: serde::de::Error>(self, name: &str) -> std::result::Result<Self::Value, E> {
            name.parse().map_err(E::custom)
        }
    }
    deserializer.deserialize_any(Format)
}

/// The default frame format, left out of tickets and keys (as requests before it had).
fn is_rgb(format: &FrameFormat) -> bool {
    *format == FrameFormat::Rgb24
}

/// `episodes`, refused when it is an empty list (which would otherwise read as "every episode").
fn some_episodes<'de, D: serde::Deserializer<'de>>(deserializer: D) -> std::result::Result<Vec<i64>, D::Error> {
    /// An episode index: a whole number like every other of the request (`3.0` too).
    struct Episode(i64);
    impl<'de> Deserialize<'de> for Episode {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
            let e = whole::<0, D>(d)?;
            i64::try_from(e)
                .map(Episode)
                .map_err(|_| serde::de::Error::custom(format!("too large: expected a whole number from 0 to {}", i64::MAX)))
        }
    }
    let episodes = <Vec<Episode> as serde::Deserialize>::deserialize(deserializer)?;
    if episodes.is_empty() {
        return Err(serde::de::Error::custom("`episodes` is empty: it selects no episode (leave it out to sample every episode)"));
    }
    Ok(episodes.into_iter().map(|Episode(e)| e).collect())
}

impl SampleRequest {
    /// Parses a request from JSON bytes.
    ///
    /// # Errors
    /// [`Error::Invalid`] with serde's message (field and position).
    pub fn from_json(bytes: &[u8]) -> Result<Self> {
        let mut json = serde_json::Deserializer::from_slice(bytes);
        let request: Self = serde_path_to_error::deserialize(&mut json).map_err(|e| {
            let not_object = matches!(serde_json::from_slice::<serde_json::Value>(bytes), Ok(v) if !v.is_object());
            if not_object {
                return Error::Invalid("bad sampling request: it must be a JSON object (`{\"datasets\": [...], ...}`)".into());
            }
            // The field, and JSON's words for the types rather than Rust's.
            let inner = e.inner().to_string();
            // serde_json reads a whole number past 64 bits as a float and says "floating point".
            let too_big = inner
                .strip_prefix("invalid type: floating point `")
                .and_then(|rest| rest.split_once('`'))
                .and_then(|(number, rest)| Some((number.parse::<f64>().ok()?, rest)))
                .filter(|(number, _)| number.fract() == 0.0 && number.abs() >= 9.2e18);
            let inner = match too_big {
                Some((_, rest)) if rest.contains("expected u64") => format!("too large: expected a whole number from 0 to {}", u64::MAX),
                Some((_, rest)) if rest.contains("expected i64") => {
                    format!("out of range: expected a whole number from {} to {}", i64::MIN, i64::MAX)
                }
                _ => inner,
            };
            let why = inner
                .replace("expected u64", "expected a whole number, 0 or more")
                .replace("expected i64", "expected a whole number")
                .replace("expected f64", "expected a number");
            match e.path().to_string().as_str() {
                // `?`: where the text broke off or stopped being JSON, in no field yet.
                "." | "" | "?" => Error::Invalid(format!("bad sampling request: {why}")),
                field => Error::Invalid(format!("bad sampling request: `{field}`: {why}")),
            }
        })?;
        // One request, nothing after it but whitespace (a second object, or the rest of a
        // broken one, would otherwise be dropped without a word).
        json.end()
            .map_err(|e| Error::Invalid(format!("bad sampling request: more after the request's JSON object ({e}); send one object")))?;
        Ok(request)
    }

    /// A request for `datasets` (names, `NAME@VERSION`, `NAME=WEIGHT`, or views) with every other
    /// field at its default: no windows, 32 samples a batch, seed 0 from the start, one rank,
    /// endless.
    pub fn new<S: Into<String>>(datasets: impl IntoIterator<Item = S>) -> Self {
        Self {
            datasets: datasets.into_iter().map(|d| DatasetRef::Name(d.into())).collect(),
            preset: default_preset(),
            delta_timestamps: None,
            batch_size: default_batch_size(),
            seed: 0,
            shuffle: true,
            epoch: 0,
            start_step: 0,
            rank: 0,
            world_size: default_world_size(),
            limit_batches: None,
            step_stride: default_stride(),
            drop_last: true,
            episodes: Vec::new(),
            drop_n_first_frames: 0,
            drop_n_last_frames: 0,
            frame_size: None,
            frame_format: FrameFormat::default(),
            proxy: false,
        }
    }

    /// The request as JSON, as every transport carries it.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a request is plain JSON data")
    }

    /// Checks what a server checks before it plans a request: datasets named, weights positive,
    /// sizes within their limits, the rank inside the world.
    ///
    /// # Errors
    /// [`Error::Invalid`] saying which field and why.
    pub fn check(&self) -> Result<()> {
        if self.datasets.is_empty() {
            return Err(Error::Invalid("the request names no dataset".into()));
        }
        if self.datasets.len() > MAX_DATASETS {
            return Err(Error::Invalid(format!(
                "the request names {} datasets; a mixture may have at most {MAX_DATASETS} (a view selects episodes of many)",
                self.datasets.len()
            )));
        }
        for d in &self.datasets {
            let (name, weight) = match d {
                DatasetRef::Name(entry) => match entry.rsplit_once('=') {
                    Some((name, w)) => (name, Some(w.to_string())),
                    None => (entry.as_str(), None),
                },
                DatasetRef::Weighted { name, weight } => (name.as_str(), Some(weight.to_string())),
            };
            if name.split('@').next().is_none_or(|base| base.trim().is_empty()) {
                let entry = serde_json::to_string(d).unwrap_or_default();
                return Err(Error::Invalid(format!("the dataset entry {entry} names no dataset")));
            }
            if let Some(w) = weight {
                if !w.parse::<f64>().is_ok_and(|w| w.is_finite() && w > 0.0) {
                    return Err(Error::Invalid(format!("dataset `{name}`: the weight {w} is not a positive finite number")));
                }
                if !self.shuffle {
                    return Err(Error::Invalid(format!(
                        "dataset `{name}`: a weight ({w}) mixes datasets in a shuffle; with `shuffle: false` each dataset's \
                         steps are read once, in the order named: leave the weight out"
                    )));
                }
            }
        }
        let at_most = |field: &str, value: u64, max: u64| {
            if value > max { Err(Error::Invalid(format!("{field} is {value}; it may be at most {max}"))) } else { Ok(()) }
        };
        if self.batch_size == 0 {
            return Err(Error::Invalid("batch_size must be at least 1".into()));
        }
        at_most("batch_size", self.batch_size, MAX_BATCH_SIZE)?;
        if self.world_size == 0 {
            return Err(Error::Invalid("world_size must be at least 1".into()));
        }
        at_most("world_size", self.world_size, MAX_WORLD_SIZE)?;
        if self.rank >= self.world_size {
            return Err(Error::Invalid(format!(
                "rank {} is outside a world of {} (ranks 0 to {})",
                self.rank,
                self.world_size,
                self.world_size - 1
            )));
        }
        if self.step_stride == 0 {
            return Err(Error::Invalid("step_stride must be at least 1".into()));
        }
        at_most("step_stride", self.step_stride, MAX_WORLD_SIZE)?;
        at_most("epoch", self.epoch, u64::from(u32::MAX))?;
        at_most("drop_n_first_frames", self.drop_n_first_frames, u64::from(u32::MAX))?;
        at_most("drop_n_last_frames", self.drop_n_last_frames, u64::from(u32::MAX))?;
        Ok(())
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_request_has_the_defaults_json_gives() {
        let parsed = SampleRequest::from_json(br#"{"datasets": ["a", "b=0.5"]}"#).expect("valid");
        assert_eq!(SampleRequest::new(["a", "b=0.5"]), parsed);
        assert_eq!(SampleRequest::from_json(parsed.to_json().as_bytes()).expect("its own JSON"), parsed);
    }

    #[test]
    fn an_unshuffled_request_is_written_out_and_takes_no_weight() {
        let parsed = SampleRequest::from_json(br#"{"datasets": ["a", "b"], "shuffle": false}"#).expect("valid");
        assert!(!parsed.shuffle);
        assert!(parsed.to_json().contains(r#""shuffle":false"#));
        assert!(!SampleRequest::new(["a"]).to_json().contains("shuffle"), "the default stays out of tickets and keys");
        parsed.check().expect("no weight given");
        let weighted = SampleRequest { shuffle: false, ..SampleRequest::new(["a", "b=0.5"]) };
        let refused = weighted.check().expect_err("a weight without the shuffle").to_string();
        assert!(refused.contains("dataset `b`: a weight (0.5) mixes datasets in a shuffle"), "{refused}");
        SampleRequest::new(["a", "b=0.5"]).check().expect("shuffled, weights mix");
    }

    #[test]
    fn a_frame_format_is_a_known_name_or_null() {
        let format = |json: &str| SampleRequest::from_json(json.as_bytes()).map(|r| r.frame_format).map_err(|e| e.to_string());
        assert_eq!(format(r#"{"datasets": ["a"], "frame_format": null}"#), Ok(FrameFormat::Rgb24));
        assert_eq!(format(r#"{"datasets": ["a"], "frame_format": "yuv420p"}"#), Ok(FrameFormat::Yuv420p));
        for (bad, says) in [
            (
                r#"{"datasets": ["a"], "frame_format": 3}"#,
                "`frame_format`: invalid type: integer `3`, expected `rgb24`, `yuv420p` or `packets`, or null",
            ),
            (
                r#"{"datasets": ["a"], "frame_format": "bgr"}"#,
                "`frame_format`: unknown frame format `bgr` (known: rgb24, yuv420p, packets)",
            ),
        ] {
            let e = format(bad).expect_err(bad);
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn numbers_out_of_range_say_the_range() {
        let refusal = |json: &str| SampleRequest::from_json(json.as_bytes()).expect_err(json).to_string();
        let too_big = refusal(r#"{"datasets": ["a"], "seed": 18446744073709551616}"#);
        assert!(too_big.contains("`seed`: too large: expected a whole number from 0 to 18446744073709551615"), "{too_big}");
        let fraction = refusal(r#"{"datasets": ["a"], "seed": 1.5}"#);
        assert!(fraction.contains("`seed`: invalid type: floating point `1.5`, expected a whole number, 0 or more"), "{fraction}");
        let episode = refusal(r#"{"datasets": ["a"], "episodes": [1e19]}"#);
        assert!(episode.contains("`episodes[0]`: too large: expected a whole number from 0 to 9223372036854775807"), "{episode}");
        assert!(SampleRequest::from_json(br#"{"datasets": ["a"], "seed": 18446744073709551615}"#).is_ok());
        // Whole numbers written with a zero fraction (Python's json writes floats so) are whole.
        let floats =
            SampleRequest::from_json(br#"{"datasets": ["a"], "batch_size": 4.0, "rank": -0, "world_size": 2.0, "limit_batches": 3.0}"#)
                .expect("whole numbers");
        assert_eq!((floats.batch_size, floats.rank, floats.world_size, floats.limit_batches), (4, 0, 2, Some(3)));
        let zero = refusal(r#"{"datasets": ["a"], "batch_size": 0}"#);
        assert!(zero.contains("`batch_size`: 0 is too small: expected a whole number, 1 or more"), "{zero}");
        let negative = refusal(r#"{"datasets": ["a"], "batch_size": -1}"#);
        assert!(negative.contains("`batch_size`: invalid value: integer `-1`, expected a whole number"), "{negative}");
        let text = refusal(r#"{"datasets": ["a"], "limit_batches": "4"}"#);
        assert!(text.contains("`limit_batches`: invalid type: string \"4\", expected a whole number"), "{text}");
        assert_eq!(SampleRequest::from_json(br#"{"datasets": ["a"], "limit_batches": null}"#).expect("null").limit_batches, None);
        let unnamed = SampleRequest::from_json(br#"{"datasets": ["=1"]}"#).expect("parses").check().expect_err("no name").to_string();
        assert!(unnamed.contains("names no dataset"), "{unnamed}");
    }
}
