//! Named training sets: the episodes a SQL query selects, stored in the lake and accepted
//! wherever a dataset name is (`lake sample`, `lake bench`, the serving layer).
//!
//! A view's query returns an `episode_index` column, a `dataset` column (optional when the lake
//! holds one dataset) and optionally a `weight` column (one value per dataset: its mixture
//! weight). The selection is resolved when the view is made and pinned to the dataset versions
//! current then (or to the version a `dataset` value names, `NAME@VERSION`), so later ingests,
//! of other datasets or of new versions of the same ones, never change what a view draws.

use std::collections::{BTreeSet, HashMap};

use arrow::{
    array::{Array, AsArray},
    compute::cast,
    datatypes::{DataType, Float64Type, Int64Type},
};
use lake_schemas::{FeatureMap, ViewDataset, ViewRecord};
use lake_store::Lake;

use crate::{Error, Result, sql::LakeSql};

fn invalid(name: &str, message: impl std::fmt::Display) -> Error {
    Error::Invalid(format!("view `{name}`: {message}"))
}

/// One rule of a view's feature mapping, for one dataset of the view or (without `dataset`) for
/// every dataset of it that has the feature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MappingRule {
    /// The dataset it applies to (by name); `None` for every dataset with the feature.
    pub dataset: Option<String>,
    /// What it does.
    pub action: Mapping,
}

/// What a [`MappingRule`] does to a feature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mapping {
    /// Samples carry stored key `from` as `to`.
    Rename {
        /// The stored LeRobot key.
        from: String,
        /// The key samples carry.
        to: String,
    },
    /// Samples carry only these dimensions (in this order) of the one-dimensional feature they
    /// carry as `key` (after renaming).
    Dims {
        /// The key as samples carry it.
        key: String,
        /// The dimensions kept.
        dims: Vec<usize>,
    },
    /// Samples leave out stored key `key`.
    Drop {
        /// The stored LeRobot key.
        key: String,
    },
}

impl MappingRule {
    /// Parses one flag's value: `rename` takes `[DATASET:]FROM=TO`, `dims` takes
    /// `[DATASET:]KEY=DIMS` (DIMS like `0:6` for 0 to 5, or `0,1,2,7`), `drop` takes
    /// `[DATASET:]KEY`.
    ///
    /// # Errors
    /// When the value does not have that form.
    pub fn parse(action: &str, value: &str) -> std::result::Result<Self, String> {
        let (dataset, rest) = match value.split_once(':').filter(|(d, _)| !d.is_empty() && !d.contains('=')) {
            Some((d, rest)) => (Some(d.to_string()), rest),
            None => (None, value),
        };
        let pair = || {
            rest.split_once('=')
                .filter(|(a, b)| !a.is_empty() && !b.is_empty())
                .ok_or_else(|| format!("`{value}` is not [DATASET:]KEY=VALUE"))
        };
        let action = match action {
            "rename" => {
                let (from, to) = pair()?;
                Mapping::Rename { from: from.into(), to: to.into() }
            }
            "dims" => {
                let (key, spec) = pair()?;
                Mapping::Dims { key: key.into(), dims: parse_dims(spec).map_err(|e| format!("`{value}`: {e}"))? }
            }
            "drop" if !rest.is_empty() && !rest.contains('=') => Mapping::Drop { key: rest.into() },
            "drop" => return Err(format!("`{value}` is not [DATASET:]KEY")),
            other => return Err(format!("unknown mapping `{other}`")),
        };
        Ok(Self { dataset, action })
    }
}

/// `0:6` (0 to 5), `3` or `0,1,2,7` (and mixes: `0:3,7`).
fn parse_dims(spec: &str) -> std::result::Result<Vec<usize>, String> {
    let mut dims = Vec::new();
    for part in spec.split(',') {
        let number = |n: &str| n.trim().parse::<usize>().map_err(|_| format!("`{n}` is not a dimension (0, 1, …)"));
        match part.split_once(':') {
            Some((a, b)) => {
                let (a, b) = (number(a)?, number(b)?);
                if a >= b {
                    return Err(format!("`{part}` keeps no dimension (START:END keeps START to END - 1)"));
                }
                dims.extend(a..b);
            }
            None => dims.push(number(part)?),
        }
    }
    let mut seen = BTreeSet::new();
    if let Some(twice) = dims.iter().find(|d| !seen.insert(**d)) {
        return Err(format!("dimension {twice} is kept twice"));
    }
    Ok(dims)
}

/// Each selected dataset's feature mapping from `rules`, checked against its `info.json`
/// features: a rule for a named dataset must name one of the view and a feature it has; one for
/// every dataset must apply to some dataset.
fn feature_maps(view: &str, rules: &[MappingRule], records: &[lake_schemas::CommitRecord]) -> Result<Vec<FeatureMap>> {
    let mut maps = vec![FeatureMap::default(); records.len()];
    for rule in rules {
        if let Some(d) = &rule.dataset
            && !records.iter().any(|r| &r.name == d)
        {
            let names: Vec<&str> = records.iter().map(|r| r.name.as_str()).collect();
            return Err(invalid(view, format!("the mapping names dataset `{d}`, which the view does not select ({})", names.join(", "))));
        }
        let mut applied = false;
        for (record, map) in records.iter().zip(&mut maps) {
            if rule.dataset.as_ref().is_some_and(|d| d != &record.name) {
                continue;
            }
            let features = &record.info["features"];
            let label = format!("{}@{}", record.name, record.version);
            let has = |key: &str| features.get(key).is_some();
            match &rule.action {
                Mapping::Rename { from, to } if has(from) => {
                    map.rename.insert(from.clone(), to.clone());
                }
                Mapping::Drop { key } if has(key) => map.drop.push(key.clone()),
                Mapping::Dims { key, dims } => {
                    // The stored feature samples carry as `key`.
                    let stored = map.rename.iter().find(|(_, to)| *to == key).map_or(key.as_str(), |(from, _)| from.as_str());
                    let Some(feature) = features.get(stored) else { continue };
                    let width = match feature["shape"].as_array().map(Vec::as_slice) {
                        Some([n]) => n.as_u64().unwrap_or(0) as usize,
                        _ => {
                            return Err(invalid(view, format!("{label}: `{key}` is not a one-dimensional feature ({})", feature["shape"])));
                        }
                    };
                    if let Some(past) = dims.iter().find(|&&d| d >= width) {
                        return Err(invalid(view, format!("{label}: `{key}` has {width} dimensions, the mapping keeps dimension {past}")));
                    }
                    map.dims.insert(key.clone(), dims.clone());
                }
                _ if rule.dataset.is_some() => {
                    let key = match &rule.action {
                        Mapping::Rename { from, .. } => from,
                        Mapping::Drop { key } | Mapping::Dims { key, .. } => key,
                    };
                    let have: Vec<&str> = features.as_object().map(|o| o.keys().map(String::as_str).collect()).unwrap_or_default();
                    return Err(invalid(view, format!("{label} has no feature `{key}` (it has {})", have.join(", "))));
                }
                _ => continue,
            }
            applied = true;
        }
        if !applied {
            return Err(invalid(view, format!("the mapping {rule:?} applies to none of the view's datasets")));
        }
    }
    Ok(maps)
}

/// Runs `query` and stores its selection as the view `name` (replacing one of that name when
/// `replace`), each dataset's features presented as `mapping` says.
///
/// # Errors
/// As [`create_from`], and when the query cannot be planned.
pub async fn create(lake: &Lake, name: &str, query: &str, replace: bool, mapping: &[MappingRule]) -> Result<Created> {
    let sql = LakeSql::open(lake).await?.read_only();
    let rows = sql.stream(query).await?;
    create_from(lake, &sql, rows, name, query, replace, mapping).await
}

/// Stores the selection `rows` (the answer to `query` in `sql`) as the view `name` (replacing
/// one of that name when `replace`), each dataset's features presented as `mapping` says. The
/// rows are checked as they arrive, so that what is held stays within the lake's own episodes
/// however many rows the query returns: a dataset the lake lacks, or an episode its version
/// lacks, ends the reading at once. (A server hands in a query bounded by its own limits.)
///
/// # Errors
/// When the name is taken or not valid, the query fails, lacks the columns above, names a
/// dataset or episode the lake does not have, gives one dataset two weights, selects nothing,
/// or the mapping names what the datasets lack, or the mapped samples could not stack.
pub async fn create_from(
    lake: &Lake,
    sql: &LakeSql,
    mut rows: datafusion::execution::SendableRecordBatchStream,
    name: &str,
    query: &str,
    replace: bool,
    mapping: &[MappingRule],
) -> Result<Created> {
    use futures::StreamExt;
    // A view named before its name was reserved may still be replaced.
    let taken = lake_store::validate_name(name).is_ok() && !lake.view_versions(name).await?.is_empty();
    let check = if taken { lake_store::validate_name } else { lake_store::validate_new_name };
    if let Err(lake_store::Error::BadName { message, .. }) = check(name) {
        return Err(invalid(name, format!("not a valid view name: {message}")));
    }
    if lake.version_count(name).await? > 0 {
        return Err(invalid(name, "a dataset has this name; choose another"));
    }
    if !replace && lake.view(name).await?.is_some() {
        return Err(invalid(name, "already exists (use --replace to overwrite it)"));
    }
    let schema = rows.schema();
    let has = |c: &str| schema.column_with_name(c).is_some();
    if !has("episode_index") {
        return Err(invalid(
            name,
            "the query must return an `episode_index` column (e.g. SELECT dataset, episode_index FROM episodes WHERE …)",
        ));
    }
    let datasets = sql.datasets();
    if !has("dataset") && datasets.len() != 1 {
        return Err(invalid(name, format!("the lake holds {} datasets; the query must also return a `dataset` column", datasets.len())));
    }
    let mut selection = Selection { lake, view: name, datasets, spelt: HashMap::new(), picked: Vec::new() };
    while let Some(batch) = rows.next().await {
        let batch = batch.map_err(|e| crate::sql::sql_error(&e))?;
        // Only a lossless cast: a string where a number belongs is the query's mistake, and a
        // lenient cast would turn it into a null (or parse it) without a word.
        let column = |c: &str, dt: &DataType, kind: &str, fits: fn(&DataType) -> bool| {
            batch
                .column_by_name(c)
                .map(|a| {
                    if !fits(a.data_type()) {
                        return Err(invalid(name, format!("column `{c}` must be {kind}, the query returns {}", a.data_type())));
                    }
                    cast(a, dt).map_err(|e| invalid(name, format!("column `{c}`: {e}")))
                })
                .transpose()
        };
        let episode = column("episode_index", &DataType::Int64, "an integer", DataType::is_integer)?.expect("checked above");
        let dataset =
            column("dataset", &DataType::Utf8, "a string", |t| matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View))?;
        let weight = column("weight", &DataType::Float64, "a number", DataType::is_numeric)?;
        for row in 0..batch.num_rows() {
            if episode.is_null(row) {
                return Err(invalid(name, "the query returned a null `episode_index`"));
            }
            let spelling = match &dataset {
                Some(d) if d.is_null(row) => return Err(invalid(name, "the query returned a null `dataset`")),
                Some(d) => d.as_string::<i32>().value(row),
                None => datasets[0].name.as_str(),
            };
            let weight = match &weight {
                Some(w) if w.is_null(row) => {
                    return Err(invalid(name, format!("dataset `{spelling}`: the query returned a null `weight`")));
                }
                Some(w) => Some(w.as_primitive::<Float64Type>().value(row)),
                None => None,
            };
            selection.add(spelling, episode.as_primitive::<Int64Type>().value(row), weight).await?;
        }
    }
    drop(rows);
    // In the datasets' order, whichever rows came first.
    selection.picked.sort_by(|a, b| a.record.name.cmp(&b.record.name));
    if selection.picked.is_empty() {
        return Err(invalid(name, "the query selects no episodes"));
    }
    let mut selected: Vec<ViewDataset> = Vec::new();
    let mut records: Vec<lake_schemas::CommitRecord> = Vec::new();
    for picked in selection.picked {
        selected.push(ViewDataset {
            name: picked.record.name.clone(),
            version: picked.record.version,
            weight: picked.weight.map_or(1.0, |(_, w)| w),
            episodes: picked.wanted.into_iter().collect(),
            features: Default::default(),
        });
        records.push(picked.record);
    }
    let maps = feature_maps(name, mapping, &records)?;
    for (selected, map) in selected.iter_mut().zip(&maps) {
        selected.features = map.clone();
    }
    let records: Vec<(&lake_schemas::CommitRecord, &FeatureMap)> = records.iter().zip(&maps).collect();
    if let Some(why) = sample_shape_mismatch(lake, &records).await? {
        return Err(invalid(name, format!("its samples could not stack: {why}; select from datasets that match, one view each otherwise")));
    }
    let mut view = ViewRecord {
        name: name.to_string(),
        version: 0,
        dropped: false,
        sql: query.to_string(),
        created_at: chrono::Utc::now(),
        lake_versions: datasets.iter().map(|r| format!("{}@{}", r.name, r.version)).collect(),
        datasets: selected,
        digest: None,
    };
    view.version = lake.put_view(&view, replace).await?;
    // A query that read another version of a dataset than the one its `dataset` column pinned.
    let read = sql.versions_read(query);
    let notes = view
        .datasets
        .iter()
        .filter_map(|d| {
            let other = read.get(&d.name)?.iter().find(|&&v| v != d.version)?;
            Some(format!(
                "the query reads {name}@{other}, but the view draws {name}@{}, from its `dataset` column; \
                 `'{name}@{other}' AS dataset` pins that one",
                d.version,
                name = d.name
            ))
        })
        .collect();
    Ok(Created { view, notes })
}

/// A view just made, and what its maker should know about it.
pub struct Created {
    /// The view's record, as stored.
    pub view: ViewRecord,
    /// Notes: each dataset the query read at another version than the view draws.
    pub notes: Vec<String>,
}

/// The versions a view's rows select, gathered as the rows arrive: each version once, however
/// its `dataset` values spell it (`NAME`, `NAME@2` and `NAME@02` may be one version, whose
/// episodes are merged and whose weights must agree), with the episodes it has.
struct Selection<'a> {
    lake: &'a Lake,
    view: &'a str,
    /// The versions `NAME` alone means: the latest when the query's session opened.
    datasets: &'a [lake_schemas::CommitRecord],
    /// Each spelling seen, as (name, version asked), and its version's place in `picked`.
    spelt: HashMap<(String, Option<u64>), usize>,
    picked: Vec<Picked>,
}

/// A version a view selects from.
struct Picked {
    record: lake_schemas::CommitRecord,
    /// The episodes the version has.
    has: BTreeSet<i64>,
    /// The episodes the view selects.
    wanted: BTreeSet<i64>,
    /// Its weight, with the spelling that first gave it.
    weight: Option<(String, f64)>,
}

impl Selection<'_> {
    /// Adds the row selecting `episode` of the version `spelling` names, with `weight`.
    async fn add(&mut self, spelling: &str, episode: i64, weight: Option<f64>) -> Result<()> {
        // (A version that is no number is not looked up: resolving it says what is wrong.)
        let key = match spelling.rsplit_once('@') {
            Some((base, version)) => lake_store::parse_version(version).map(|v| (base.to_string(), Some(v))),
            None => Some((spelling.to_string(), None)),
        };
        let at = match key.as_ref().and_then(|k| self.spelt.get(k)) {
            Some(&at) => at,
            None => {
                let at = self.resolve(spelling).await?;
                self.spelt.extend(key.map(|k| (k, at)));
                at
            }
        };
        let view = self.view;
        let picked = &mut self.picked[at];
        if !picked.has.contains(&episode) {
            return Err(invalid(view, format!("dataset `{}@{}` has no episode {episode}", picked.record.name, picked.record.version)));
        }
        picked.wanted.insert(episode);
        let Some(w) = weight else { return Ok(()) };
        if !(w.is_finite() && w > 0.0) {
            return Err(invalid(view, format!("dataset `{spelling}`: weight {w} is not a positive finite number")));
        }
        match &picked.weight {
            None => picked.weight = Some((spelling.to_string(), w)),
            Some((first, earlier)) if *earlier != w => {
                let (name, version) = (&picked.record.name, picked.record.version);
                let message = if first == spelling {
                    format!("dataset `{spelling}` has two weights ({earlier} and {w}); give one per dataset")
                } else {
                    // In the spellings' order, whichever row came first.
                    let (mut a, mut b) = ((first.as_str(), *earlier), (spelling, w));
                    if b.0 < a.0 {
                        std::mem::swap(&mut a, &mut b);
                    }
                    format!(
                        "dataset `{name}@{version}` has two weights ({} as `{}` and {} as `{}`); give one per dataset",
                        a.1, a.0, b.1, b.0
                    )
                };
                return Err(invalid(view, message));
            }
            Some(_) => {}
        }
        Ok(())
    }

    /// The place in `picked` of the version `spelling` names, added (with its episodes) when
    /// new: `NAME` is the dataset's latest version, `NAME@VERSION` that version.
    async fn resolve(&mut self, spelling: &str) -> Result<usize> {
        let view = self.view;
        let record = match spelling.split_once('@') {
            Some(_) => self.lake.resolve(spelling).await.map_err(|e| invalid(view, format!("dataset `{spelling}`: {e}")))?,
            None => self.datasets.iter().find(|r| r.name == spelling).cloned().ok_or_else(|| {
                let names: Vec<&str> = self.datasets.iter().map(|r| r.name.as_str()).collect();
                invalid(view, format!("the lake has no dataset `{spelling}` (datasets: {})", names.join(", ")))
            })?,
        };
        if let Some(at) = self.picked.iter().position(|p| p.record.name == record.name) {
            let other = self.picked[at].record.version;
            if other != record.version {
                let (a, b) = (other.min(record.version), other.max(record.version));
                return Err(invalid(
                    view,
                    format!("it selects two versions of `{}` ({a} and {b}); a view takes one of each dataset", record.name),
                ));
            }
            return Ok(at);
        }
        let has = lake_store::read_columns(self.lake, &record, lake_schemas::tables::EPISODES, &["episode_index"]).await?;
        let has = has.iter().flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().iter().copied().collect::<Vec<_>>()).collect();
        self.picked.push(Picked { record, has, wanted: BTreeSet::new(), weight: None });
        Ok(self.picked.len() - 1)
    }
}

/// What a version's samples are made of, in the order the loader puts them: each steps column
/// (by LeRobot key; the index columns, which the loader gives fixed types, left out) with its
/// type, then each camera with its kind (frame sizes may differ: a frame table of one size
/// unifies them, and the loader says when they do not).
async fn sample_shape(lake: &Lake, record: &lake_schemas::CommitRecord, map: &FeatureMap) -> Result<Vec<(String, String)>> {
    use lake_schemas::tables::{INDEX_COLUMNS, PACKET_ROW, STEPS, STREAMS, lerobot_name};
    let steps = lake_store::open_table(lake, record, STEPS).await?;
    let mut shape: Vec<(String, String)> = arrow::datatypes::Schema::from(steps.schema())
        .fields()
        .iter()
        .filter(|f| f.name() != PACKET_ROW && !INDEX_COLUMNS.contains(&lerobot_name(f)))
        .map(|f| {
            let kind = match f.data_type() {
                DataType::FixedSizeList(item, n) => format!("{} x {n}", item.data_type()),
                other => other.to_string(),
            };
            (lerobot_name(f).to_string(), kind)
        })
        .collect();
    let mut cameras: Vec<(String, String)> = Vec::new();
    for b in lake_store::read_columns(lake, record, STREAMS, &["camera", "kind"]).await? {
        let (camera, kind) = (b.column(0).as_string::<i32>(), b.column(1).as_string::<i32>());
        for r in 0..b.num_rows() {
            if !cameras.iter().any(|(c, _)| c == camera.value(r)) {
                cameras.push((camera.value(r).to_string(), format!("a {} camera", kind.value(r))));
            }
        }
    }
    // In the order of the steps' camera pointers, as the loader lists cameras.
    let order: Vec<String> = arrow::datatypes::Schema::from(steps.schema())
        .field_with_name(PACKET_ROW)
        .ok()
        .and_then(|f| match f.data_type() {
            DataType::Struct(fields) => Some(fields.iter().map(|c| lerobot_name(c).to_string()).collect()),
            _ => None,
        })
        .unwrap_or_default();
    cameras.sort_by_key(|(c, _)| order.iter().position(|o| o == c).unwrap_or(usize::MAX));
    shape.extend(cameras);
    // As the view's mapping presents them.
    Ok(shape
        .into_iter()
        .filter_map(|(key, kind)| {
            let key = map.key(&key)?.to_string();
            let kind = match (map.dims_of(&key), kind.split_once(" x ")) {
                (Some(dims), Some((item, _))) => format!("{item} x {}", dims.len()),
                _ => kind,
            };
            Some((key, kind))
        })
        .collect())
}

/// Why samples of `records` could not be stacked into one batch (different features, feature
/// types or camera kinds), naming the first difference; `None` when they can.
async fn sample_shape_mismatch(lake: &Lake, records: &[(&lake_schemas::CommitRecord, &FeatureMap)]) -> Result<Option<String>> {
    let Some(((first, first_map), rest)) = records.split_first() else { return Ok(None) };
    let shape = sample_shape(lake, first, first_map).await?;
    for (other, map) in rest {
        let theirs = sample_shape(lake, other, map).await?;
        let (a, b) = (format!("{}@{}", first.name, first.version), format!("{}@{}", other.name, other.version));
        let only = |x: &[(String, String)], y: &[(String, String)]| -> Vec<String> {
            x.iter().filter(|(k, _)| !y.iter().any(|(o, _)| o == k)).map(|(k, _)| k.clone()).collect()
        };
        let (only_a, only_b) = (only(&shape, &theirs), only(&theirs, &shape));
        if !only_b.is_empty() {
            return Ok(Some(format!("{b} has {} that {a} lacks", list(&only_b))));
        }
        if !only_a.is_empty() {
            return Ok(Some(format!("{a} has {} that {b} lacks", list(&only_a))));
        }
        // The loader puts the same features in another order in the first dataset's.
        for (key, kind) in &shape {
            let Some((_, their_kind)) = theirs.iter().find(|(k, _)| k == key) else { continue };
            if kind != their_kind {
                return Ok(Some(format!("`{key}` is {kind} in {a} and {their_kind} in {b}")));
            }
        }
    }
    Ok(None)
}

fn list(keys: &[String]) -> String {
    keys.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::{Mapping, MappingRule, parse_dims};

    #[test]
    fn mapping_flags_parse_with_and_without_a_dataset() {
        assert_eq!(parse_dims("0:3,7"), Ok(vec![0, 1, 2, 7]));
        assert_eq!(parse_dims("5"), Ok(vec![5]));
        assert!(parse_dims("3:3").expect_err("empty").contains("keeps no dimension"));
        assert!(parse_dims("1,1").expect_err("twice").contains("kept twice"));
        assert!(parse_dims("x").expect_err("not a number").contains("`x` is not a dimension"));
        let rule = MappingRule::parse("rename", "aloha:actions=action").expect("valid");
        assert_eq!(rule.dataset.as_deref(), Some("aloha"));
        assert_eq!(rule.action, Mapping::Rename { from: "actions".into(), to: "action".into() });
        let rule = MappingRule::parse("dims", "observation.state=0:2").expect("valid");
        assert_eq!((rule.dataset, rule.action), (None, Mapping::Dims { key: "observation.state".into(), dims: vec![0, 1] }));
        assert_eq!(
            MappingRule::parse("drop", "observation.images.wrist").expect("valid").action,
            Mapping::Drop { key: "observation.images.wrist".into() }
        );
        assert!(MappingRule::parse("rename", "actions").is_err());
        assert!(MappingRule::parse("drop", "a=b").is_err());
    }
}
