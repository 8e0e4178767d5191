//! The validation report and ingest summary.

use std::{collections::BTreeMap, fmt::Write as _};

use lake_schemas::{Finding, Severity};
use serde::Serialize;

/// One camera, summarised.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CameraSummary {
    /// Camera key.
    pub name: String,
    /// `video` or `image`.
    pub kind: String,
    /// Codec of its packets (from the container or image header).
    pub codec: String,
    /// Codec declared in `info.json`, when any.
    pub declared_codec: Option<String>,
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// Source files.
    pub streams: u64,
    /// Packets stored.
    pub packets: u64,
    /// Longest keyframe distance.
    pub max_gop: u64,
}

/// What an ingest found and did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    /// Dataset name in the lake.
    pub dataset: String,
    /// Source location.
    pub source: String,
    /// LeRobot version of the source.
    pub codebase_version: String,
    /// Everything validation found.
    pub findings: Vec<Finding>,
    /// Episodes left out by `--skip-bad-episodes`, with the reason.
    pub skipped: BTreeMap<i64, String>,
    /// Episodes in the source metadata.
    pub episodes_total: u64,
    /// Episodes ingested.
    pub episodes: u64,
    /// Steps ingested.
    pub steps: u64,
    /// Cameras.
    pub cameras: Vec<CameraSummary>,
    /// Packets stored.
    pub packets: u64,
    /// Bytes of packet data stored.
    pub packet_bytes: u64,
    /// Bytes read from the source.
    pub bytes_read: u64,
    /// Wall-clock seconds.
    pub seconds: f64,
    /// Seconds of recording ingested (steps / fps).
    pub recorded_seconds: f64,
    /// Suggestions for getting a refused dataset in.
    pub hints: Vec<String>,
}

impl Report {
    /// Findings of `severity`.
    pub fn count(&self, severity: Severity) -> usize {
        self.findings.iter().filter(|f| f.severity == severity).count()
    }

    /// The message of a refused ingest: how many problems, where, and the first of them.
    pub fn refusal(&self) -> String {
        let errors: Vec<&Finding> = self.findings.iter().filter(|f| f.is_error()).collect();
        let episodes: std::collections::BTreeSet<i64> = errors.iter().filter_map(|f| f.episode).collect();
        let mut out = format!(
            "refusing to ingest {}: {} error{} in {} of {} episodes; the lake is unchanged",
            self.source,
            errors.len(),
            if errors.len() == 1 { "" } else { "s" },
            episodes.len(),
            self.episodes_total,
        );
        const SHOWN: usize = 20;
        for f in errors.iter().take(SHOWN) {
            let _ = write!(out, "\n  {f}");
        }
        if errors.len() > SHOWN {
            let _ = write!(out, "\n  … and {} more", errors.len() - SHOWN);
        }
        for hint in &self.hints {
            let _ = write!(out, "\nhint: {hint}");
        }
        if !episodes.is_empty() && episodes.len() < self.episodes_total as usize {
            out.push_str("\nhint: --skip-bad-episodes ingests the other episodes and records each skipped one with its reason");
        }
        out
    }
}
