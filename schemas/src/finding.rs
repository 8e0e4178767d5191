//! Validation findings: what ingest noticed about a dataset, with where it noticed it.

use std::fmt;

use serde::{Deserialize, Serialize};

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// The data cannot be served correctly; strict ingest refuses the dataset.
    Error,
    /// The data is served correctly but differs from what its metadata says.
    Warning,
    /// Worth knowing (e.g. a skipped episode, a dropped camera).
    Info,
}

impl Severity {
    /// Lower-case name, as stored in the `findings` table.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Error => "error",
            Self::Warning => "warning",
            Self::Info => "info",
        }
    }
}

/// What a finding is about. The kebab-case name is stored in the `findings` table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FindingKind {
    /// A file the metadata points at does not exist.
    MissingFile,
    /// A file exists but cannot be read (bad parquet, truncated or undecodable mp4).
    CorruptFile,
    /// Metadata is missing, malformed or contradicts itself.
    BadMetadata,
    /// A parquet column does not have the type `info.json` declares.
    SchemaMismatch,
    /// A feature's values do not have the declared shape.
    ShapeMismatch,
    /// An episode's rows disagree with its metadata (length, index range, frame indices).
    LengthMismatch,
    /// A step's `task_index` has no row in the task table.
    UnknownTask,
    /// The parquet `timestamp` differs from `frame_index / fps` by more than the tolerance.
    TimestampDrift,
    /// No video frame lies within the tolerance of a step's query time.
    FrameUnresolved,
    /// The video holds a different number of frames than the episode has steps.
    FrameCountMismatch,
    /// The container's codec differs from the declared `video.codec`.
    CodecMismatch,
    /// The container's resolution or pixel format differs from the declared one.
    FormatMismatch,
    /// `info.json` totals differ from the data.
    TotalsMismatch,
    /// The container's keyframe flags disagree with the bitstream.
    KeyframeFlags,
    /// A parquet column that `info.json` does not declare.
    UndeclaredColumn,
    /// An episode left out by `--skip-bad-episodes`.
    EpisodeSkipped,
    /// A camera left out by `--drop-missing-cameras`.
    CameraDropped,
    /// A numeric feature holds NaN or infinite values.
    NonFinite,
    /// A check that the source does not allow (a dataset served over HTTP cannot be listed, so
    /// files its metadata does not name are not looked for).
    NotChecked,
}

impl FindingKind {
    /// Kebab-case name, as stored in the `findings` table.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MissingFile => "missing-file",
            Self::CorruptFile => "corrupt-file",
            Self::BadMetadata => "bad-metadata",
            Self::SchemaMismatch => "schema-mismatch",
            Self::ShapeMismatch => "shape-mismatch",
            Self::LengthMismatch => "length-mismatch",
            Self::UnknownTask => "unknown-task",
            Self::TimestampDrift => "timestamp-drift",
            Self::FrameUnresolved => "frame-unresolved",
            Self::FrameCountMismatch => "frame-count-mismatch",
            Self::CodecMismatch => "codec-mismatch",
            Self::FormatMismatch => "format-mismatch",
            Self::TotalsMismatch => "totals-mismatch",
            Self::KeyframeFlags => "keyframe-flags",
            Self::UndeclaredColumn => "undeclared-column",
            Self::EpisodeSkipped => "episode-skipped",
            Self::CameraDropped => "camera-dropped",
            Self::NonFinite => "non-finite",
            Self::NotChecked => "not-checked",
        }
    }
}

/// One thing validation found, located by file, episode, camera and frame where they apply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    /// How bad it is.
    pub severity: Severity,
    /// What it is about.
    pub kind: FindingKind,
    /// The file, relative to the dataset root.
    pub file: Option<String>,
    /// The episode.
    pub episode: Option<i64>,
    /// The camera (feature key).
    pub camera: Option<String>,
    /// The frame index inside the episode.
    pub frame: Option<i64>,
    /// What was found, in words.
    pub message: String,
}

impl Finding {
    /// A finding with no location yet; add one with the `with_*` methods.
    pub fn new(severity: Severity, kind: FindingKind, message: impl Into<String>) -> Self {
        Self { severity, kind, file: None, episode: None, camera: None, frame: None, message: message.into() }
    }

    /// An error finding.
    pub fn error(kind: FindingKind, message: impl Into<String>) -> Self {
        Self::new(Severity::Error, kind, message)
    }

    /// A warning finding.
    pub fn warning(kind: FindingKind, message: impl Into<String>) -> Self {
        Self::new(Severity::Warning, kind, message)
    }

    /// Sets the file.
    pub fn with_file(mut self, file: impl Into<String>) -> Self {
        self.file = Some(file.into());
        self
    }

    /// Sets the episode.
    pub fn with_episode(mut self, episode: i64) -> Self {
        self.episode = Some(episode);
        self
    }

    /// Sets the camera.
    pub fn with_camera(mut self, camera: impl Into<String>) -> Self {
        self.camera = Some(camera.into());
        self
    }

    /// Sets the frame index.
    pub fn with_frame(mut self, frame: i64) -> Self {
        self.frame = Some(frame);
        self
    }

    /// Whether this finding makes strict ingest refuse the dataset.
    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[{}]", self.severity.as_str(), self.kind.as_str())?;
        let mut sep = " ";
        if let Some(file) = &self.file {
            write!(f, "{sep}{file}")?;
            sep = ", ";
        }
        if let Some(e) = self.episode {
            write!(f, "{sep}episode {e}")?;
            sep = ", ";
        }
        if let Some(c) = &self.camera {
            write!(f, "{sep}camera {c}")?;
            sep = ", ";
        }
        if let Some(fr) = self.frame {
            write!(f, "{sep}frame {fr}")?;
        }
        write!(f, ": {}", self.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_every_location() {
        let f = Finding::error(FindingKind::FrameUnresolved, "no frame within 0.1 ms of 3.4 s")
            .with_file("videos/front/chunk-000/file-000.mp4")
            .with_episode(3)
            .with_camera("observation.images.front")
            .with_frame(17);
        assert_eq!(
            f.to_string(),
            "error[frame-unresolved] videos/front/chunk-000/file-000.mp4, episode 3, camera observation.images.front, frame 17: no frame within 0.1 ms of 3.4 s"
        );
        let json = serde_json::to_string(&f).unwrap();
        assert!(json.contains("\"frame-unresolved\""));
        assert_eq!(serde_json::from_str::<Finding>(&json).unwrap(), f);
    }
}
