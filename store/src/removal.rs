//! What `lake rm` recorded of a dataset it removed.

use chrono::{DateTime, Utc};
use serde::Serialize;

/// A dataset's removal by one `lake rm`: its versions `from_version..=through_version` went
/// then. The record's path carries the dataset and `through_version`
/// (`removed/<name>/v<through>.json`), its time is the record's; what the file holds is for
/// people, so a record damaged outside lake still counts.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Removal {
    /// Dataset name.
    pub name: String,
    /// The oldest version this removal took (the one after the previous removal's last).
    pub from_version: u64,
    /// The newest version removed; every older one is gone too.
    pub through_version: u64,
    /// When it was removed.
    pub removed_at: DateTime<Utc>,
}

impl std::fmt::Display for Removal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let versions = if self.from_version == self.through_version {
            format!("version {}", self.through_version)
        } else {
            format!("versions {} to {}", self.from_version, self.through_version)
        };
        write!(f, "`{}` was removed with `lake rm` at {} ({versions})", self.name, self.removed_at.format("%Y-%m-%d %H:%M:%S UTC"))
    }
}
