//! Arguments several commands share: sample windows, loader resources, and value parsers.

use lake_loader::{LoaderOptions, Windows};

/// How samples are windowed, shared by `sample` and `bench`.
#[derive(Debug, clap::Args)]
pub struct WindowArgs {
    /// Window preset: act (50 future actions), diffusion (2 observation steps, 16 actions) or
    /// none.
    #[arg(long, default_value = "none", conflicts_with = "delta_timestamps")]
    pub(crate) preset: String,
    /// LeRobot `delta_timestamps` as JSON, e.g. '{"action": [0.0, 0.0333]}', or `@FILE` for
    /// JSON read from FILE.
    #[arg(long, value_parser = json_or_file)]
    pub(crate) delta_timestamps: Option<String>,
}

/// JSON given on the command line, or read from the file of `@FILE` (for JSON too long for one).
pub(crate) fn json_or_file(text: &str) -> Result<String, String> {
    match text.strip_prefix('@') {
        Some(path) => std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}")),
        None => Ok(text.to_string()),
    }
}

impl WindowArgs {
    pub(crate) fn windows(&self) -> anyhow::Result<Windows> {
        Ok(match &self.delta_timestamps {
            Some(json) => Windows::parse_delta_timestamps(json)?,
            None => Windows::Preset(self.preset.parse()?),
        })
    }
}

/// Loader settings, shared by `sample` and `bench`.
#[derive(Debug, clap::Args)]
pub struct LoaderArgs {
    /// Decode threads, 1 to 256 [default: number of cores].
    #[arg(long, value_parser = threads_in_range)]
    pub(crate) threads: Option<usize>,
    /// Decoded-frame cache: on or off.
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    pub(crate) cache: String,
    /// Decoded-frame cache budget in MiB.
    #[arg(long, default_value_t = lake_loader::DEFAULT_CACHE_MIB, value_parser = mebibytes)]
    pub(crate) cache_mb: u64,
    /// Read frames from the dataset's stored frame table (`lake cache`) when it has one: on or
    /// off (decode from packets). Frame tables hold RGB: yuv420p frames come from the packets.
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    pub(crate) frame_table: String,
    /// Every camera's frames at WIDTHxHEIGHT, read from the dataset's frame table of that size
    /// (`lake cache NAME --size WxH`) instead of at their recorded size.
    #[arg(long, value_name = "WxH")]
    pub(crate) frame_size: Option<lake_loader::FrameSize>,
    /// How camera frames travel: rgb24 (LeRobot's frames); yuv420p (the decoder's planes, half
    /// the bytes, for the trainer to convert to the same RGB on its GPU) for the video cameras
    /// whose frames are 8-bit 4:2:0, the others staying RGB; or packets (every camera's
    /// compressed GOPs, for the trainer to decode into the same frames).
    #[arg(long, default_value = "rgb24", value_name = "FORMAT")]
    pub(crate) frame_format: lake_loader::FrameFormat,
    /// Every camera's frames from the dataset's training proxy (`lake cache NAME --proxy
    /// h264`): re-encoded for random access, lossy, not LeRobot's frames.
    #[arg(long)]
    pub(crate) proxy: bool,
}

/// A count that must be 1 or more (`--batch-size`, `--batches`, `--memory-mb`).
pub fn at_least_one(text: &str) -> Result<u64, String> {
    match text.parse::<u64>() {
        Ok(n @ 1..) => Ok(n),
        Ok(_) => Err("must be at least 1".into()),
        Err(_) => Err(format!("`{text}` is not a whole number")),
    }
}

/// The most MiB a memory setting takes: 16 TiB (far beyond any machine's, and clear of
/// overflowing as bytes).
pub(crate) const MAX_MIB: u64 = 1 << 24;

/// A whole number from `least` to `most` of `unit`s, refused with one message for any other
/// text (`0`, `0.5` and `ten` alike).
pub(crate) fn whole_in(text: &str, least: u64, most: u64, unit: &str, most_is: &str) -> Result<u64, String> {
    match text.trim().parse::<u64>() {
        Ok(n) if (least..=most).contains(&n) => Ok(n),
        _ => Err(format!("`{text}` is not a whole number of {unit} from {least} to {most} ({most_is})")),
    }
}

/// A size in MiB, 0 to 16 TiB.
pub fn mebibytes(text: &str) -> Result<u64, String> {
    whole_in(text, 0, MAX_MIB, "MiB", "16 TiB")
}

/// A size in MiB, 1 to 16 TiB.
pub fn mebibytes_at_least_one(text: &str) -> Result<u64, String> {
    whole_in(text, 1, MAX_MIB, "MiB", "16 TiB")
}

/// Most seconds a wait may be set to: a year (a deadline further off is none, and would
/// overflow a clock).
pub(crate) const YEAR_S: u64 = 365 * 24 * 3600;

/// A number of seconds, 0 to a year.
pub fn seconds(text: &str) -> Result<u64, String> {
    whole_in(text, 0, YEAR_S, "seconds", "a year")
}

/// [`seconds`], at least 1.
pub fn seconds_at_least_one(text: &str) -> Result<u64, String> {
    whole_in(text, 1, YEAR_S, "seconds", "a year")
}

/// `--threads`: 1 to 256 (more threads than that only contend).
pub fn threads_in_range(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n @ 1..=256) => Ok(n),
        _ => Err(format!("`{text}` is not a number of threads from 1 to 256")),
    }
}

/// Bytes in a MiB.
pub(crate) const MIB: f64 = 1_048_576.0;

/// `--prefetch`: 1 to 64 batches made ahead (each is held in memory until it is taken).
pub fn prefetch_in_range(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n @ 1..=64) => Ok(n),
        _ => Err(format!("`{text}` is not a number of batches from 1 to 64 (each made ahead is held in memory until it is taken)")),
    }
}

/// A whole number of a comma-separated list (spaces around it allowed).
pub(crate) fn whole_number(text: &str) -> Result<i64, String> {
    text.trim().parse().map_err(|_| format!("`{}` is not a whole number", text.trim()))
}

/// Comma-separated indices, each a number or `@FILE` (every index of the file, separated by
/// commas or whitespace); an argument that starts with `@` is one file, commas in its path
/// and all.
pub(crate) fn index_or_file(text: &str) -> Result<Vec<i64>, String> {
    let from_file = |path: &str| -> Result<Vec<i64>, String> {
        let contents = std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))?;
        contents
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|t| !t.is_empty())
            .map(|t| whole_number(t).map_err(|e| format!("{path}: {e}")))
            .collect()
    };
    if let Some(path) = text.trim().strip_prefix('@') {
        return from_file(path);
    }
    let mut indices = Vec::new();
    for piece in text.split(',') {
        match piece.trim().strip_prefix('@') {
            Some(path) => indices.extend(from_file(path)?),
            None => indices.push(whole_number(piece)?),
        }
    }
    Ok(indices)
}

/// A lookahead horizon: 0 (off) to [`lake_loader::MAX_HORIZON`] draws.
pub fn horizon_in_range(text: &str) -> Result<u64, String> {
    match text.parse::<u64>() {
        Ok(n) if n <= lake_loader::MAX_HORIZON => Ok(n),
        _ => Err(format!(
            "`{text}` is not a number of draws from 0 (off) to {} (a plan holds memory for each draw, and the frames it keeps must \
             fit the frame cache)",
            lake_loader::MAX_HORIZON
        )),
    }
}

impl LoaderArgs {
    pub(crate) fn options(&self) -> LoaderOptions {
        LoaderOptions {
            threads: self.threads.unwrap_or(0),
            cache_bytes: if self.cache == "on" { self.cache_mb << 20 } else { 0 },
            frame_table: self.frame_table == "on",
        }
    }
}
