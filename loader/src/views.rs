//! Views as the loader reads them: what a dataset or view name resolves to (the dataset
//! versions, episodes and weights a view pinned when it was made), and the sampling spec the
//! CLI and the serving layer open (`lake view create`, which runs SQL, is `lake-query`'s).

use lake_schemas::{FeatureMap, ViewRecord};
use lake_store::Lake;

use crate::{Error, Result};

/// One dataset version to sample from, with the episodes to draw (all when `None`) and its
/// mixture weight.
#[derive(Debug, Clone, PartialEq)]
pub struct Selection {
    /// `NAME@VERSION` (or the spec as given for a plain dataset).
    pub dataset: String,
    /// Episodes to draw from; `None` for all.
    pub episodes: Option<Vec<i64>>,
    /// Mixture weight.
    pub weight: f64,
    /// How samples present its features (a view's mapping; empty for a plain dataset).
    pub features: FeatureMap,
}

/// Resolves a dataset spec (`NAME`, `NAME@VERSION`) or a view (`VIEW`, `VIEW@VERSION`) to
/// what to sample.
///
/// # Errors
/// When neither a dataset nor a view has that name (the message lists both), or a view has
/// no such version (the message lists its versions).
pub async fn resolve(lake: &Lake, spec: &str) -> Result<Vec<Selection>> {
    let (name, version) = match spec.rsplit_once('@') {
        Some((name, v)) => (name, Some(v)),
        None => (spec, None),
    };
    if name.contains('@') {
        return Err(Error::Request(format!("`{spec}` is not NAME or NAME@VERSION (a number)")));
    }
    let valid = lake_store::validate_name(name).is_ok();
    // A dataset has the name when it has a version (readable or not: opening says which).
    if valid && lake.version_count(name).await? > 0 {
        // Opening it resolves the version, or refuses with the dataset's versions.
        return Ok(vec![Selection { dataset: spec.to_string(), episodes: None, weight: 1.0, features: FeatureMap::default() }]);
    }
    if valid && let Some(view) = view(lake, name, version).await? {
        // A dataset version `lake rm --force` removed from under the view: named with the view.
        for (d, removal) in view.datasets.iter().zip(removals(lake, &view).await) {
            if let Some(removal) = removal {
                return Err(Error::NotFound(format!(
                    "no dataset `{}@{}` in the lake (view `{}@{}` selects it); {removal}",
                    d.name, d.version, view.name, view.version
                )));
            }
        }
        return Ok(view
            .datasets
            .into_iter()
            .map(|d| Selection {
                dataset: format!("{}@{}", d.name, d.version),
                episodes: Some(d.episodes),
                weight: d.weight,
                features: d.features,
            })
            .collect());
    }
    Err(not_found(lake, spec).await?)
}

/// The error for a name that is neither a dataset nor a view: the lake's datasets and views,
/// and a view of that name that was dropped (whose versions stay readable).
///
/// # Errors
/// When the catalog cannot be read.
pub async fn not_found(lake: &Lake, spec: &str) -> Result<Error> {
    let name = spec.split('@').next().unwrap_or(spec);
    let datasets: Vec<String> = lake.datasets().await?.into_iter().map(|r| r.name).collect();
    let views: Vec<String> = lake.views().await?.into_iter().map(|v| v.name).collect();
    let list = |v: &[String]| if v.is_empty() { "none".to_string() } else { v.join(", ") };
    let dropped = match lake_store::validate_name(name) {
        Ok(()) => lake.view_versions(name).await.unwrap_or_default(),
        Err(_) => Vec::new(),
    };
    let dropped = match dropped.iter().map(|v| v.version.to_string()).collect::<Vec<_>>().as_slice() {
        [] => String::new(),
        versions => format!("; view `{name}` was dropped, its versions stay readable as `{name}@N` ({})", versions.join(", ")),
    };
    let removed = match lake_store::validate_name(name) {
        Ok(()) => {
            let version = spec.rsplit_once('@').and_then(|(_, v)| lake_store::parse_version(v));
            lake_store::removed_hint(lake.removal_of(name, version).await.ok().flatten().as_ref())
        }
        Err(_) => String::new(),
    };
    Ok(Error::NotFound(format!(
        "no dataset or view `{}` in the lake (datasets: {}; views: {}){dropped}{removed}",
        lake_store::abbreviated(spec),
        list(&datasets),
        list(&views)
    )))
}

/// The dataset versions a view selects from, as `NAME@VERSION`, each marked when `lake rm`
/// removed it (the view then fails to load).
pub async fn sources(lake: &Lake, view: &ViewRecord) -> Vec<String> {
    let removed = removals(lake, view).await;
    view.datasets
        .iter()
        .zip(removed)
        .map(|(d, r)| format!("{}@{}{}", d.name, d.version, if r.is_some() { " (removed with lake rm)" } else { "" }))
        .collect()
}

/// For each dataset version a view selects from, the `lake rm` that removed it, if one did
/// (`None` too where the removal records cannot be read).
pub async fn removals(lake: &Lake, view: &ViewRecord) -> Vec<Option<lake_store::Removal>> {
    removals_of_all(lake, std::slice::from_ref(view)).await.pop().unwrap_or_default()
}

/// [`removals`] of each of `views`, listing each dataset's removal records once.
pub async fn removals_of_all(lake: &Lake, views: &[ViewRecord]) -> Vec<Vec<Option<lake_store::Removal>>> {
    let mut listed: std::collections::HashMap<&str, Vec<lake_store::Removal>> = Default::default();
    let mut out = Vec::with_capacity(views.len());
    for view in views {
        let mut each = Vec::with_capacity(view.datasets.len());
        for d in &view.datasets {
            if !listed.contains_key(d.name.as_str()) {
                listed.insert(&d.name, lake.removals(&d.name).await.unwrap_or_default());
            }
            each.push(listed[d.name.as_str()].iter().find(|r| (r.from_version..=r.through_version).contains(&d.version)).cloned());
        }
        out.push(each);
    }
    out
}

/// A view as JSON readers see it (`lake ls --json`): its record, with each selected dataset
/// version that `lake rm` removed carrying that removal (from [`removals`]) as `removed`.
pub fn view_json(view: &ViewRecord, removed: Vec<Option<lake_store::Removal>>) -> serde_json::Value {
    let mut json = serde_json::to_value(view).expect("a view record serialises");
    for (entry, removal) in json["datasets"].as_array_mut().into_iter().flatten().zip(removed) {
        if let Some(removal) = removal {
            entry["removed"] = serde_json::to_value(removal).expect("a removal serialises");
        }
    }
    json
}

/// The view `name` at `version` (`None`: its current version), or `None` when no view has the
/// name at all.
///
/// # Errors
/// When the view exists but not in that version (the message lists its versions), or the
/// version is not a number.
pub async fn view(lake: &Lake, name: &str, version: Option<&str>) -> Result<Option<ViewRecord>> {
    let Some(version) = version else {
        return Ok(lake.view(name).await?);
    };
    let versions = lake.view_versions(name).await?;
    if versions.is_empty() {
        return Ok(None);
    }
    let wanted = lake_store::parse_version(version);
    match versions.iter().find(|v| Some(v.version) == wanted) {
        Some(v) => Ok(Some(v.clone())),
        None => Err(Error::NotFound(format!(
            "view `{name}` has no version {version} (versions: {})",
            versions.iter().map(|v| v.version.to_string()).collect::<Vec<_>>().join(", ")
        ))),
    }
}

/// What to sample, as `lake bench` and the serving layer take it.
#[derive(Debug, Clone, Default)]
pub struct SamplingSpec {
    /// Datasets (`NAME`, `NAME@VERSION`) or views, each optionally `=WEIGHT`.
    pub datasets: Vec<String>,
    /// Only these episodes (of every dataset); empty for all.
    pub episodes: Vec<i64>,
    /// Never sample the first N steps of an episode (LeRobot's `drop_n_first_frames`).
    pub drop_n_first_frames: u64,
    /// Never sample the last N steps of an episode (LeRobot's `drop_n_last_frames`).
    pub drop_n_last_frames: u64,
    /// Every camera's frames at this size, from each dataset's frame table of that size
    /// (`lake cache NAME --size WxH`); `None`: as recorded.
    pub frame_size: Option<lake_schemas::FrameSize>,
    /// Camera frames as RGB, or as YUV planes where a camera's frames allow it.
    pub frame_format: lake_schemas::FrameFormat,
    /// Every camera's frames from each dataset's training proxy (`lake cache NAME --proxy
    /// CODEC`), not the recorded ones.
    pub proxy: bool,
}

impl SamplingSpec {
    /// How the datasets' frames are served.
    pub fn frames(&self) -> crate::FrameSpec {
        crate::FrameSpec { size: self.frame_size, format: self.frame_format, proxy: self.proxy }
    }
}

/// The loader's view of a [`SamplingSpec`]: the datasets, opened, and per dataset its eligible
/// steps and weight (`sources[i]` draws from `datasets[i]`).
#[derive(Debug)]
pub struct Sampling {
    /// The dataset versions, in the order of `sources`.
    pub datasets: Vec<std::sync::Arc<crate::LoaderDataset>>,
    /// Eligible steps and weight of each.
    pub sources: Vec<crate::Source>,
}

/// Ascending episode indices as ranges (`0 to 2, 5, 7, 8`), the first 20 of them and how many
/// more.
fn episode_ranges(episodes: impl IntoIterator<Item = i64>) -> String {
    const SHOWN: usize = 20;
    let mut ranges: Vec<(i64, i64)> = Vec::new();
    for e in episodes {
        match ranges.last_mut() {
            Some(last) if last.1 + 1 == e => last.1 = e,
            _ => ranges.push((e, e)),
        }
    }
    let mut text = ranges
        .iter()
        .take(SHOWN)
        .map(|&(a, b)| match b - a {
            0 => a.to_string(),
            1 => format!("{a}, {b}"),
            _ => format!("{a} to {b}"),
        })
        .collect::<Vec<_>>()
        .join(", ");
    if ranges.len() > SHOWN {
        text += &format!(" and {} more ranges", ranges.len() - SHOWN);
    }
    text
}

/// Refuses to sample episodes ingested without a camera's video (`--missing-video keep-rows`)
/// before the first batch: every sample carries every camera, so a stream would otherwise fail
/// at the first sample of one, which may come late in a run. The refusal names them and gives
/// the view that samples the others.
fn refuse_episodes_without_video(ds: &crate::LoaderDataset, sampled: &[&crate::EpisodeSpan]) -> Result<()> {
    for camera in ds.cameras.iter().filter(|c| !c.every_step_has_a_frame()) {
        let missing: Vec<i64> = sampled.iter().filter(|s| !camera.shows_every_step_of(s)).map(|s| s.episode_index).collect();
        if missing.is_empty() {
            continue;
        }
        let name = &ds.record.name;
        let remedy = if !ds.episodes.iter().any(|s| camera.shows_every_step_of(s)) {
            format!(
                "leave the camera out with a view: lake view create {name}-without-video \"SELECT dataset, episode_index FROM episodes \
                 WHERE dataset = '{name}'\" --drop {}",
                camera.key
            )
        } else {
            format!(
                "sample the episodes that have their videos through a view: lake view create {name}-with-video \"SELECT dataset, \
                 episode_index FROM episodes WHERE dataset = '{name}' AND episode_index NOT IN (SELECT episode_index FROM findings \
                 WHERE dataset = '{name}' AND kind = 'missing-file' AND episode_index IS NOT NULL)\""
            )
        };
        let (has, episodes) = if missing.len() == 1 { ("has", "episode") } else { ("have", "episodes") };
        return Err(Error::Request(format!(
            "{}: {} of the {} episodes sampled {has} no video for camera {} ({episodes} {}): its files were missing at ingest, and \
             --missing-video keep-rows kept their rows only. Samples carry every camera; {remedy}",
            ds.label,
            missing.len(),
            sampled.len(),
            camera.key,
            episode_ranges(missing.iter().copied()),
        )));
    }
    Ok(())
}

/// Opens what `spec` names: views expand to their pinned datasets, episodes and weights (a
/// weight given with a view scales its datasets' weights).
///
/// # Errors
/// When a name is neither a dataset nor a view, a weight is not a positive finite number, or an
/// episode asked for does not exist.
pub async fn open_sampling(lake: &Lake, spec: &SamplingSpec) -> Result<Sampling> {
    let mut selections = Vec::new();
    for item in &spec.datasets {
        let (name, weight) = match item.rsplit_once('=') {
            Some((n, w)) => match w.parse::<f64>() {
                Ok(w) if w.is_finite() && w > 0.0 => (n, w),
                _ => return Err(Error::Request(format!("dataset `{item}`: the weight `{w}` is not a positive finite number"))),
            },
            None => (item.as_str(), 1.0),
        };
        for mut s in resolve(lake, name).await? {
            s.weight *= weight;
            selections.push(s);
        }
    }
    let mut out = Sampling { datasets: Vec::new(), sources: Vec::new() };
    // A dataset named by several entries (with other weights, or through views) is opened once.
    let mut opened: std::collections::HashMap<String, std::sync::Arc<crate::LoaderDataset>> = Default::default();
    for selection in selections {
        // One opening per dataset version and mapping.
        let key = format!("{} {}", selection.dataset, serde_json::to_string(&selection.features).unwrap_or_default());
        let ds = match opened.get(&key) {
            Some(ds) => ds.clone(),
            None => {
                let ds = crate::LoaderDataset::open_mapped(lake, &selection.dataset, spec.frames(), &selection.features).await?;
                opened.insert(key, ds.clone());
                ds
            }
        };
        if let Some(e) = spec.episodes.iter().find(|e| !ds.episodes.iter().any(|s| s.episode_index == **e)) {
            let skipped = match ds.record.counts.skipped_episodes {
                0 => String::new(),
                n => format!(
                    "; {n} episode{} of the source {} skipped at ingest, `lake inspect {}` says why",
                    if n == 1 { "" } else { "s" },
                    if n == 1 { "was" } else { "were" },
                    ds.label
                ),
            };
            return Err(Error::Request(format!(
                "{}: no episode {e} (episodes {}{skipped})",
                ds.label,
                episode_ranges(ds.episodes.iter().map(|s| s.episode_index))
            )));
        }
        if let (Some(selected), Some(e)) =
            (&selection.episodes, spec.episodes.iter().find(|e| selection.episodes.as_ref().is_some_and(|v| v.binary_search(e).is_err())))
        {
            return Err(Error::Request(format!(
                "{}: episode {e} is not in the view (it selects {} episodes of it)",
                ds.label,
                selected.len()
            )));
        }
        let wanted = |e: i64| {
            selection.episodes.as_ref().is_none_or(|v| v.binary_search(&e).is_ok())
                && (spec.episodes.is_empty() || spec.episodes.contains(&e))
        };
        let sampled: Vec<&crate::EpisodeSpan> = ds.episodes.iter().filter(|s| wanted(s.episode_index)).collect();
        refuse_episodes_without_video(&ds, &sampled)?;
        let eligible =
            crate::Eligible::new(sampled.iter().map(|s| (s.first_row, s.len)), spec.drop_n_first_frames, spec.drop_n_last_frames);
        if eligible.is_empty() {
            return Err(Error::Request(format!(
                "{}: no step is eligible (drop_n_first_frames {} and drop_n_last_frames {} leave nothing of the episodes selected)",
                ds.label, spec.drop_n_first_frames, spec.drop_n_last_frames
            )));
        }
        out.sources.push(crate::Source { eligible, weight: selection.weight });
        out.datasets.push(ds);
    }
    Ok(out)
}
