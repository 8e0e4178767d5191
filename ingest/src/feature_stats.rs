//! Exact statistics of every numeric feature, over every step, per episode and for the whole
//! dataset, in memory bounded whatever the number of steps.
//!
//! LeRobot stores per-episode quantiles estimated with histograms and, at dataset level, only an
//! envelope of them. lake computes the real order statistics: quantiles interpolated linearly
//! between the nearest ranks (numpy's default method), means and deviations with compensated
//! sums.
//!
//! The written `steps` table is streamed one feature at a time (up to [`Limits::dims`] of its
//! dimensions per pass):
//! - each episode's values are held until its last step has been read, then summarised; an
//!   episode's steps come from one data file, so this is at most one data file's values;
//! - a column whose values fit [`Limits::in_memory`] is kept and sorted;
//! - a larger one has its quantiles selected by radix: the first pass counts the values by the
//!   top 16 bits of an order-preserving key, which names the 1/65536th of the key range holding
//!   each wanted rank; the next pass collects that range's values (or counts their next 16 bits
//!   when the range holds more than [`Limits::collect`]) until every rank's value is known:
//!   two passes for usual data; more when values crowd into a tiny part of the key range (up
//!   to five), or when a pass's dimensions want more ranges than one pass's limits hold.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use arrow::{
    array::{Array, ArrayRef, AsArray, Float64Builder, Int32Builder, Int64Builder, RecordBatch, StringBuilder},
    compute::cast,
    datatypes::{DataType, Field, Float64Type, Int64Type, Schema},
};
use futures::TryStreamExt;
use lake_schemas::tables::{self, FEATURE_STATS, QUANTILES};

use crate::{Error, Result};

/// Statistics of one dimension over some steps.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// Non-null values.
    pub count: i64,
    /// Smallest value.
    pub min: f64,
    /// Largest value.
    pub max: f64,
    /// Arithmetic mean.
    pub mean: f64,
    /// Population standard deviation.
    pub std: f64,
    /// The values at [`QUANTILES`], in that order.
    pub quantiles: [f64; QUANTILES.len()],
}

impl Summary {
    /// Every statistic NaN, as numpy's when a value is NaN.
    fn nan(count: u64) -> Self {
        let nan = f64::NAN;
        Self { count: count as i64, min: nan, max: nan, mean: nan, std: nan, quantiles: [nan; QUANTILES.len()] }
    }
}

/// The quantile `p` of ascending `sorted` values, interpolated linearly between the two nearest
/// ranks (numpy's default `linear` method, also SQL's `percentile_cont`), with numpy's
/// arithmetic: from the lower rank below the midpoint, from the upper one above it (so an
/// infinite neighbour gives what numpy gives, an infinity or NaN).
pub fn quantile(sorted: &[f64], p: f64) -> f64 {
    let (lo, hi, t) = ranks(sorted.len() as u64, p);
    lerp(sorted[lo as usize], sorted[hi as usize], t)
}

/// The two ranks (of `n` values) quantile `p` interpolates between, and how far between.
fn ranks(n: u64, p: f64) -> (u64, u64, f64) {
    let h = (n - 1) as f64 * p;
    let lo = h.floor() as u64;
    (lo, (lo + 1).min(n - 1), h - lo as f64)
}

/// `a + t (b - a)` as numpy's quantiles compute it: from `b` when `t >= 0.5`.
pub fn lerp(a: f64, b: f64, t: f64) -> f64 {
    let diff = b - a;
    if t >= 0.5 { b - diff * (1.0 - t) } else { a + diff * t }
}

/// A compensated (Neumaier) sum: exact to about one rounding whatever the order and count of
/// the terms.
#[derive(Debug, Clone, Copy, Default)]
struct Sum {
    sum: f64,
    compensation: f64,
}

impl Sum {
    fn add(&mut self, x: f64) {
        let t = self.sum + x;
        self.compensation += if self.sum.abs() >= x.abs() { (self.sum - t) + x } else { (x - t) + self.sum };
        self.sum = t;
    }

    fn total(self) -> f64 {
        if self.sum.is_finite() { self.sum + self.compensation } else { self.sum }
    }
}

/// Count, extremes and mean of values seen one at a time.
#[derive(Debug, Clone, Copy)]
struct Moments {
    count: u64,
    nan: bool,
    infinities: (bool, bool),
    finite: Sum,
    min: f64,
    max: f64,
}

impl Default for Moments {
    fn default() -> Self {
        Self { count: 0, nan: false, infinities: (false, false), finite: Sum::default(), min: f64::NAN, max: f64::NAN }
    }
}

impl Moments {
    fn add(&mut self, v: f64) {
        if self.count == 0 || v.total_cmp(&self.min).is_lt() {
            self.min = v;
        }
        if self.count == 0 || v.total_cmp(&self.max).is_gt() {
            self.max = v;
        }
        self.count += 1;
        match v {
            _ if v.is_nan() => self.nan = true,
            f64::INFINITY => self.infinities.1 = true,
            f64::NEG_INFINITY => self.infinities.0 = true,
            _ => self.finite.add(v),
        }
    }

    /// numpy's mean: NaN with a NaN or both infinities, an infinity with one.
    fn mean(&self) -> f64 {
        match self.infinities {
            _ if self.nan => f64::NAN,
            (true, true) => f64::NAN,
            (false, true) => f64::INFINITY,
            (true, false) => f64::NEG_INFINITY,
            (false, false) => self.finite.total() / self.count as f64,
        }
    }

    /// The population standard deviation from the squared deviations from [`Self::mean`], as
    /// numpy's: NaN with a NaN or an infinity among the values (`inf - inf`), infinite when
    /// only their sum overflows.
    fn std(&self, squared_deviations: Sum) -> f64 {
        match self.mean() {
            _ if self.nan || self.infinities != (false, false) => f64::NAN,
            mean if !mean.is_finite() => f64::INFINITY,
            _ => (squared_deviations.total() / self.count as f64).sqrt(),
        }
    }
}

/// Summarises `values` (sorting them in place); `None` when there are none. The mean and
/// deviation are summed in the order given.
pub fn summarise(values: &mut [f64]) -> Option<Summary> {
    if values.is_empty() {
        return None;
    }
    let mut moments = Moments::default();
    values.iter().for_each(|v| moments.add(*v));
    if moments.nan {
        // As numpy's: a NaN makes every statistic NaN (a sort would put it at one end).
        return Some(Summary::nan(moments.count));
    }
    let mean = moments.mean();
    let mut deviations = Sum::default();
    if mean.is_finite() {
        values.iter().for_each(|v| deviations.add((v - mean) * (v - mean)));
    }
    values.sort_unstable_by(f64::total_cmp);
    Some(Summary {
        count: moments.count as i64,
        min: moments.min,
        max: moments.max,
        mean,
        std: moments.std(deviations),
        quantiles: QUANTILES.map(|(_, p)| quantile(values, p)),
    })
}

/// What computing statistics may hold in memory at once.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Values of a column (times the dimensions of a pass) kept and sorted in memory; a larger
    /// column has its quantiles selected by radix.
    pub in_memory: u64,
    /// Values collected at once from the narrowed key ranges of a radix selection.
    pub collect: u64,
    /// Dimensions per pass, each with a histogram of 2^16 counts (512 KiB).
    pub dims: usize,
}

impl Default for Limits {
    fn default() -> Self {
        // About 32 MiB of values each, and 32 MiB of histograms.
        Self { in_memory: 4 << 20, collect: 4 << 20, dims: 64 }
    }
}

/// Which steps statistics are computed over.
#[derive(Debug, Clone, Copy)]
pub enum Over<'a> {
    /// Every step: the dataset's rows (null `episode_index`) and each episode's.
    Dataset,
    /// The steps of these episodes, as one dataset row per dimension.
    Episodes(&'a BTreeSet<i64>),
}

impl Over<'_> {
    fn includes(&self, episode: i64) -> bool {
        match self {
            Over::Dataset => true,
            Over::Episodes(set) => set.contains(&episode),
        }
    }
}

/// Whether a steps column is a numeric feature with statistics (numbers, booleans, and
/// fixed-size vectors of them).
pub fn is_numeric(field: &Field) -> bool {
    let scalar = |dt: &DataType| dt.is_numeric() || *dt == DataType::Boolean;
    match field.data_type() {
        DataType::FixedSizeList(item, _) => scalar(item.data_type()),
        dt => scalar(dt),
    }
}

/// Per-row values of one column as `dims` flattened `f64` per row (`None` for a null row).
fn flatten(col: &ArrayRef, table: &'static str) -> Result<(usize, Vec<Option<f64>>)> {
    let (dims, values, row_valid): (usize, ArrayRef, Vec<bool>) = match col.data_type() {
        DataType::FixedSizeList(_, n) => {
            let list = col.as_fixed_size_list();
            let valid = (0..list.len()).map(|i| list.is_valid(i)).collect();
            (*n as usize, list.values().slice(list.offset() * *n as usize, list.len() * *n as usize), valid)
        }
        _ => (1, col.clone(), (0..col.len()).map(|i| col.is_valid(i)).collect()),
    };
    let values = cast(&values, &DataType::Float64).map_err(Error::arrow(table))?;
    let values = values.as_primitive::<Float64Type>();
    let flat = (0..values.len()).map(|i| (row_valid[i / dims] && values.is_valid(i)).then(|| values.value(i))).collect();
    Ok((dims, flat))
}

/// Computes the `feature_stats` rows of the steps table at `steps_uri` (schema `schema`) over
/// the steps `over` names, as one batch.
///
/// # Errors
/// When the table cannot be read or a column's values cannot be read as numbers.
pub async fn compute(steps_uri: &str, schema: &Schema, over: Over<'_>, limits: Limits) -> Result<RecordBatch> {
    let mut batches = Vec::new();
    compute_into(steps_uri, schema, over, limits, |batch| {
        batches.push(batch);
        std::future::ready(Ok(()))
    })
    .await?;
    arrow::compute::concat_batches(&tables::feature_stats_schema(), &batches).map_err(Error::arrow(FEATURE_STATS))
}

/// Computes the `feature_stats` rows as [`compute`] does, handing `sink` the rows of one pass
/// (some dimensions of one column: the dataset's row and each episode's, per dimension) at a
/// time, so that memory holds one pass's rows whatever the number of columns.
///
/// # Errors
/// When the table cannot be read, a column's values cannot be read as numbers, or `sink` fails.
pub async fn compute_into<F>(
    steps_uri: &str,
    schema: &Schema,
    over: Over<'_>,
    limits: Limits,
    mut sink: impl FnMut(RecordBatch) -> F,
) -> Result<()>
where
    F: Future<Output = Result<()>>,
{
    // Steps per episode: an episode is summarised when its last step has been read.
    let mut steps_of: HashMap<i64, u64> = HashMap::new();
    let mut batches = lake_store::stream_columns_at(steps_uri, &["episode_index"]).await?;
    while let Some(batch) = batches.try_next().await? {
        for e in episode_column(&batch)?.into_iter().filter(|e| over.includes(*e)) {
            *steps_of.entry(e).or_default() += 1;
        }
    }
    for field in schema.fields().iter().filter(|f| is_numeric(f)) {
        let dims = match field.data_type() {
            DataType::FixedSizeList(_, n) => *n as usize,
            _ => 1,
        };
        let feature = tables::lerobot_name(field);
        let per_pass = limits.dims.max(1);
        for first in (0..dims).step_by(per_pass) {
            let chunk = Chunk { uri: steps_uri, column: field.name(), dims: first..(first + per_pass).min(dims), over, limits };
            let (dataset, episodes) = chunk.summarise(&steps_of).await?;
            let mut out = Rows::default();
            for (i, dim) in chunk.dims.clone().enumerate() {
                out.push(None, feature, dim, dataset[i].clone());
                for (episode, summaries) in &episodes {
                    out.push(Some(*episode), feature, dim, summaries[i].clone());
                }
            }
            drop(episodes);
            sink(out.finish()?).await?;
        }
    }
    Ok(())
}

/// `episode_index` of each row of a batch (-1 for a null).
fn episode_column(batch: &RecordBatch) -> Result<Vec<i64>> {
    let column = batch.column_by_name("episode_index").ok_or_else(|| Error::Internal("steps without episode_index".into()))?;
    let column = cast(column, &DataType::Int64).map_err(Error::arrow(FEATURE_STATS))?;
    Ok(column.as_primitive::<Int64Type>().iter().map(|e| e.unwrap_or(-1)).collect())
}

/// Some dimensions of one column, summarised over the steps of `over`.
#[derive(Clone)]
struct Chunk<'a> {
    uri: &'a str,
    column: &'a str,
    dims: std::ops::Range<usize>,
    over: Over<'a>,
    limits: Limits,
}

/// Per-dimension summaries (of the dimensions of a chunk).
type Summaries = Vec<Option<Summary>>;

/// One rank of one dimension being selected: the high `bits` of its key are `prefix`, and
/// `rank_in` values with that prefix come before it (of `bucket` with the prefix).
#[derive(Debug, Clone)]
struct Target {
    dim: usize,
    rank: u64,
    prefix: u64,
    bits: u32,
    rank_in: u64,
    bucket: u64,
    value: Option<f64>,
}

/// What a selection pass does with the values under one prefix of one dimension.
enum Look {
    Collect(Vec<f64>),
    /// A histogram of the next 16 bits, and the smallest and largest key seen.
    Count(Vec<u64>, u64, u64),
}

struct Group {
    dim: usize,
    prefix: u64,
    bits: u32,
    look: Look,
}

impl Chunk<'_> {
    /// Streams the chunk's values: `row(episode, values)` for each step `over` includes, with
    /// one value per dimension (`None` for a null).
    async fn pass(&self, mut row: impl FnMut(i64, &[Option<f64>])) -> Result<()> {
        let columns: &[&str] = if self.column == "episode_index" { &["episode_index"] } else { &["episode_index", self.column] };
        let mut batches = lake_store::stream_columns_at(self.uri, columns).await?;
        let width = self.dims.len();
        let mut values = Vec::with_capacity(width);
        while let Some(batch) = batches.try_next().await? {
            let episodes = episode_column(&batch)?;
            let col = batch.column_by_name(self.column).ok_or_else(|| Error::Internal(format!("steps without {}", self.column)))?;
            let (dims, flat) = flatten(col, FEATURE_STATS)?;
            for (r, e) in episodes.iter().enumerate().filter(|(_, e)| self.over.includes(**e)) {
                values.clear();
                values.extend(self.dims.clone().map(|d| flat[r * dims + d]));
                row(*e, &values);
            }
        }
        Ok(())
    }

    /// The summaries over every step `over` includes, and (for [`Over::Dataset`]) each
    /// episode's; `steps_of` counts the steps of each episode.
    async fn summarise(&self, steps_of: &HashMap<i64, u64>) -> Result<(Summaries, BTreeMap<i64, Summaries>)> {
        let width = self.dims.len();
        let steps: u64 = steps_of.values().sum();
        let in_memory = steps.saturating_mul(width as u64) <= self.limits.in_memory;
        let per_episode = matches!(self.over, Over::Dataset);
        let mut moments = vec![Moments::default(); width];
        let mut kept: Vec<Vec<f64>> = vec![Vec::new(); if in_memory { width } else { 0 }];
        let mut histograms: Vec<Vec<u64>> = vec![vec![0; 1 << 16]; if in_memory { 0 } else { width }];
        let mut open: HashMap<i64, (u64, Vec<Vec<f64>>)> = HashMap::new();
        let mut episodes: BTreeMap<i64, Summaries> = BTreeMap::new();
        self.pass(|episode, values| {
            for (i, v) in values.iter().enumerate() {
                let Some(v) = *v else { continue };
                moments[i].add(v);
                match kept.get_mut(i) {
                    Some(kept) => kept.push(v),
                    None => histograms[i][(key(v) >> 48) as usize] += 1,
                }
            }
            if per_episode {
                let (seen, held) = open.entry(episode).or_insert_with(|| (0, vec![Vec::new(); width]));
                *seen += 1;
                for (held, v) in held.iter_mut().zip(values) {
                    held.extend(*v);
                }
                if *seen == steps_of.get(&episode).copied().unwrap_or(0) {
                    let (_, held) = open.remove(&episode).expect("open episode");
                    episodes.insert(episode, held.into_iter().map(|mut v| summarise(&mut v)).collect());
                }
            }
        })
        .await?;
        if let Some(episode) = open.keys().next() {
            return Err(Error::Internal(format!("episode {episode} of the steps table changed while its statistics were computed")));
        }
        if in_memory {
            return Ok((kept.iter_mut().map(|v| summarise(v)).collect(), episodes));
        }

        // Radix selection of the ranks each dimension's quantiles interpolate between.
        let mut targets: Vec<Target> = Vec::new();
        for (dim, m) in moments.iter().enumerate().filter(|(_, m)| m.count > 0 && !m.nan) {
            let wanted: BTreeSet<u64> = QUANTILES.iter().map(|(_, p)| ranks(m.count, *p)).flat_map(|(lo, hi, _)| [lo, hi]).collect();
            for rank in wanted {
                let (bucket, before, count) = narrow(&histograms[dim], rank);
                targets.push(Target { dim, rank, prefix: bucket, bits: 16, rank_in: rank - before, bucket: count, value: None });
            }
        }
        drop(histograms);
        let means: Vec<f64> = moments.iter().map(Moments::mean).collect();
        // The squared deviations are summed in the first pass that follows (none is needed
        // when no dimension has a finite mean).
        let mut deviations: Option<Vec<Sum>> = means.iter().all(|m| !m.is_finite()).then(|| vec![Sum::default(); width]);
        while deviations.is_none() || targets.iter().any(|t| t.value.is_none()) {
            let mut groups = self.plan_pass(&targets);
            let mut by_dim: Vec<Vec<usize>> = vec![Vec::new(); width];
            for (g, group) in groups.iter().enumerate() {
                by_dim[group.dim].push(g);
            }
            let mut sums = vec![Sum::default(); width];
            let first = deviations.is_none();
            self.pass(|_, values| {
                for (i, v) in values.iter().enumerate() {
                    let Some(v) = *v else { continue };
                    if first && means[i].is_finite() {
                        sums[i].add((v - means[i]) * (v - means[i]));
                    }
                    let k = key(v);
                    for &g in &by_dim[i] {
                        let group = &mut groups[g];
                        if k >> (64 - group.bits) != group.prefix {
                            continue;
                        }
                        match &mut group.look {
                            Look::Collect(values) => values.push(v),
                            Look::Count(histogram, lo, hi) => {
                                histogram[((k >> (48 - group.bits)) & 0xffff) as usize] += 1;
                                (*lo, *hi) = ((*lo).min(k), (*hi).max(k));
                            }
                        }
                    }
                }
            })
            .await?;
            if first {
                deviations = Some(sums);
            }
            for group in &mut groups {
                if let Look::Collect(values) = &mut group.look {
                    values.sort_unstable_by(f64::total_cmp);
                }
                let mine = targets.iter_mut().filter(|t| (t.dim, t.prefix, t.bits) == (group.dim, group.prefix, group.bits));
                for t in mine.filter(|t| t.value.is_none()) {
                    match &group.look {
                        Look::Collect(values) => {
                            t.value = Some(*values.get(t.rank_in as usize).ok_or_else(|| {
                                Error::Internal(format!("{}: the steps table changed while its statistics were computed", self.column))
                            })?);
                        }
                        Look::Count(_, lo, hi) if lo == hi => t.value = Some(from_key(*lo)),
                        Look::Count(histogram, ..) => {
                            let (bucket, before, count) = narrow(histogram, t.rank_in);
                            (t.prefix, t.bits, t.rank_in, t.bucket) = (t.prefix << 16 | bucket, t.bits + 16, t.rank_in - before, count);
                            if t.bits == 64 {
                                t.value = Some(from_key(t.prefix));
                            }
                        }
                    }
                }
            }
        }
        let deviations = deviations.unwrap_or_default();
        let dataset = moments
            .iter()
            .enumerate()
            .map(|(dim, m)| {
                if m.count == 0 {
                    return None;
                }
                if m.nan {
                    return Some(Summary::nan(m.count));
                }
                let at = |rank: u64| targets.iter().find(|t| t.dim == dim && t.rank == rank).and_then(|t| t.value).unwrap_or(f64::NAN);
                Some(Summary {
                    count: m.count as i64,
                    min: m.min,
                    max: m.max,
                    mean: m.mean(),
                    std: m.std(deviations[dim]),
                    quantiles: QUANTILES.map(|(_, p)| {
                        let (lo, hi, t) = ranks(m.count, p);
                        lerp(at(lo), at(hi), t)
                    }),
                })
            })
            .collect();
        Ok((dataset, episodes))
    }

    /// What the next selection pass looks at: the values under each unresolved prefix are
    /// collected when they fit what is left of [`Limits::collect`], counted by their next 16
    /// bits while fewer than [`Limits::dims`] histograms are in use, and left for a later pass
    /// otherwise (the first prefix always gets one or the other).
    fn plan_pass(&self, targets: &[Target]) -> Vec<Group> {
        let mut groups: Vec<Group> = Vec::new();
        let (mut collect_left, mut histograms_left) = (self.limits.collect, self.limits.dims.max(1));
        for t in targets.iter().filter(|t| t.value.is_none()) {
            if groups.iter().any(|g| (g.dim, g.prefix, g.bits) == (t.dim, t.prefix, t.bits)) {
                continue;
            }
            let look = if t.bucket <= collect_left {
                collect_left -= t.bucket;
                Look::Collect(Vec::with_capacity(t.bucket as usize))
            } else if histograms_left > 0 {
                histograms_left -= 1;
                Look::Count(vec![0; 1 << 16], u64::MAX, 0)
            } else {
                continue;
            };
            groups.push(Group { dim: t.dim, prefix: t.prefix, bits: t.bits, look });
        }
        groups
    }
}

/// An order-preserving key of a float: keys compare as [`f64::total_cmp`] compares the values.
fn key(v: f64) -> u64 {
    let bits = v.to_bits();
    if bits >> 63 == 1 { !bits } else { bits | 1 << 63 }
}

/// The float whose [`key`] this is.
fn from_key(k: u64) -> f64 {
    f64::from_bits(if k >> 63 == 1 { k & !(1 << 63) } else { !k })
}

/// The bucket of `histogram` holding the value of rank `rank` (counted from 0), the count of
/// values in the buckets before it, and its own count.
fn narrow(histogram: &[u64], rank: u64) -> (u64, u64, u64) {
    let mut before = 0;
    for (bucket, &count) in histogram.iter().enumerate() {
        if rank < before + count {
            return (bucket as u64, before, count);
        }
        before += count;
    }
    // Unreachable for a rank below the histogram's total; the last bucket otherwise.
    (histogram.len() as u64 - 1, before, 0)
}

/// Builds a `feature_stats`-shaped batch from `(episode, feature, dimension, summary)` rows
/// (also used for per-channel camera statistics).
///
/// # Errors
/// Never for well-formed rows; an Arrow error otherwise.
pub fn rows_batch(rows: Vec<(Option<i64>, String, usize, Option<Summary>)>) -> Result<RecordBatch> {
    let mut out = Rows::default();
    for (episode, feature, dim, summary) in rows {
        out.push(episode, &feature, dim, summary);
    }
    out.finish()
}

#[derive(Default)]
struct Rows {
    episode: Int64Builder,
    feature: StringBuilder,
    dim: Int32Builder,
    count: Int64Builder,
    values: [Float64Builder; 4 + QUANTILES.len()],
}

impl Rows {
    fn push(&mut self, episode: Option<i64>, feature: &str, dim: usize, summary: Option<Summary>) {
        self.episode.append_option(episode);
        self.feature.append_value(feature);
        self.dim.append_value(dim as i32);
        self.count.append_value(summary.as_ref().map_or(0, |s| s.count));
        let values: Vec<Option<f64>> = match summary {
            Some(s) => [s.min, s.max, s.mean, s.std].into_iter().chain(s.quantiles).map(Some).collect(),
            None => vec![None; self.values.len()],
        };
        for (builder, v) in self.values.iter_mut().zip(values) {
            builder.append_option(v);
        }
    }

    fn finish(mut self) -> Result<RecordBatch> {
        let mut columns: Vec<ArrayRef> = vec![
            std::sync::Arc::new(self.episode.finish()),
            std::sync::Arc::new(self.feature.finish()),
            std::sync::Arc::new(self.dim.finish()),
            std::sync::Arc::new(self.count.finish()),
        ];
        columns.extend(self.values.iter_mut().map(|b| std::sync::Arc::new(b.finish()) as ArrayRef));
        RecordBatch::try_new(tables::feature_stats_schema(), columns).map_err(Error::arrow(FEATURE_STATS))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate_between_ranks_like_numpy() {
        // numpy.quantile([1, 2, 3, 4], [0.01, 0.1, 0.5, 0.9, 0.99]) = 1.03, 1.3, 2.5, 3.7, 3.97
        let s = summarise(&mut [4.0, 1.0, 3.0, 2.0]).expect("values");
        let want = [1.03, 1.3, 2.5, 3.7, 3.97];
        for (got, want) in s.quantiles.iter().zip(want) {
            assert!((got - want).abs() < 1e-12, "{got} vs {want}");
        }
        assert_eq!((s.count, s.min, s.max, s.mean), (4, 1.0, 4.0, 2.5));
        assert!((s.std - 1.25f64.sqrt()).abs() < 1e-12);
        let s = summarise(&mut [1.0, f64::NAN, 3.0]).expect("values");
        assert_eq!(s.count, 3);
        assert!(s.min.is_nan() && s.max.is_nan() && s.mean.is_nan() && s.quantiles.iter().all(|q| q.is_nan()), "{s:?}");
        assert_eq!(summarise(&mut [7.0]).expect("one value").quantiles, [7.0; 5]);
        // Infinities as numpy's: numpy.quantile(60 values, -inf first and inf last) gives -inf
        // at 0.01 (above the midpoint, from the finite upper rank) and inf at 0.99.
        let mut values: Vec<f64> = (1..=58).map(f64::from).collect();
        values.extend([f64::NEG_INFINITY, f64::INFINITY]);
        let s = summarise(&mut values).expect("values");
        assert_eq!((s.quantiles[0], s.quantiles[4]), (f64::NEG_INFINITY, f64::INFINITY), "{s:?}");
        assert_eq!((s.min, s.max), (f64::NEG_INFINITY, f64::INFINITY));
        assert!(s.mean.is_nan() && s.std.is_nan(), "{s:?}");
        // numpy.quantile([1, 2, inf], [0.5, 0.6, 0.8]): nan, inf, nan.
        let s = [1.0, 2.0, f64::INFINITY];
        assert!(quantile(&s, 0.5).is_nan() && quantile(&s, 0.8).is_nan(), "inf times 0 and inf - inf");
        assert_eq!(quantile(&s, 0.6), f64::INFINITY);
        assert!(summarise(&mut []).is_none());
    }

    /// A steps-shaped table: `episode_index`, a 3-dimension `action` (uniform values; a
    /// constant most rows share, with signed zeros; infinities and null rows) and a scalar with
    /// a NaN. Episodes 2 and 3 interleave.
    async fn steps_table(dir: &std::path::Path) -> (String, std::sync::Arc<Schema>) {
        use arrow::array::{FixedSizeListArray, Float32Array, Float64Array, Int64Array};
        use std::sync::Arc;
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut uniform = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        let rows = 6000;
        let mut episodes = Vec::new();
        let (mut action, mut valid, mut scalar) = (Vec::new(), Vec::new(), Vec::new());
        for r in 0..rows {
            episodes.push(match r {
                0..1000 => 0,
                1000..2500 => 1,
                2500..4500 => 2 + (r % 2) as i64,
                _ => 4 + (r / 700) as i64,
            });
            let u = uniform();
            let heavy = match (u * 100.0) as u32 {
                0..5 => 0.0,
                5..10 => -0.0,
                10..90 => 0.25,
                _ => uniform() as f32 * 2.0 - 1.0,
            };
            let edge = match r {
                17 => f32::INFINITY,
                4321 => f32::NEG_INFINITY,
                _ => (uniform() * 1e6 - 3e5) as f32,
            };
            action.extend([(uniform() * 2.0 - 1.0) as f32, heavy, edge]);
            valid.push(r % 97 != 5);
            scalar.push(if r == 3000 { f64::NAN } else { uniform().powi(3) * 1e-3 });
        }
        let item = Arc::new(Field::new("item", DataType::Float32, true));
        let schema = Arc::new(Schema::new(vec![
            Field::new("episode_index", DataType::Int64, false),
            Field::new("action", DataType::FixedSizeList(item.clone(), 3), true),
            Field::new("reward", DataType::Float64, true),
        ]));
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(episodes)),
            Arc::new(FixedSizeListArray::new(item, 3, Arc::new(Float32Array::from(action)), Some(valid.into()))),
            Arc::new(Float64Array::from(scalar)),
        ];
        let batch = RecordBatch::try_new(schema.clone(), columns).expect("batch");
        let uri = dir.join("steps").to_str().expect("utf-8").to_string();
        let batches = (0..rows).step_by(1000).map(|at| batch.slice(at, 1000)).collect();
        lake_store::write_table(&uri, schema.clone(), batches).await.expect("write");
        (uri, schema)
    }

    /// Every value of a statistics batch, as bits (NaN equal to NaN).
    fn bits(batch: &RecordBatch) -> Vec<Vec<Option<u64>>> {
        batch
            .columns()
            .iter()
            .map(|c| match c.data_type() {
                DataType::Float64 => c.as_primitive::<Float64Type>().iter().map(|v| v.map(f64::to_bits)).collect(),
                DataType::Utf8 => c.as_string::<i32>().iter().map(|v| v.map(|s| s.len() as u64)).collect(),
                _ => cast(c, &DataType::Int64).expect("integers").as_primitive::<Int64Type>().iter().map(|v| v.map(|v| v as u64)).collect(),
            })
            .collect()
    }

    #[tokio::test]
    async fn radix_selection_gives_what_sorting_in_memory_gives() {
        let dir = tempfile::tempdir().expect("tmp");
        let (uri, schema) = steps_table(dir.path()).await;
        let sorted = compute(&uri, &schema, Over::Dataset, Limits::default()).await.expect("in memory");
        // 5 dimensions (episode_index's own too), 7 episodes (each with its own row per
        // dimension) and the dataset.
        assert_eq!(sorted.num_rows(), 5 * (7 + 1));
        let limits = [
            // Collects small ranges, counts large ones, two dimensions and histograms per pass.
            Limits { in_memory: 0, collect: 64, dims: 2 },
            // Never collects: every rank found by counting down to one key.
            Limits { in_memory: 0, collect: 0, dims: 1 },
            // Collects whole first-pass buckets.
            Limits { in_memory: 100, collect: 1 << 20, dims: 8 },
        ];
        for limits in limits {
            let selected = compute(&uri, &schema, Over::Dataset, limits).await.expect("radix");
            assert_eq!(bits(&selected), bits(&sorted), "{limits:?}");
        }
        // The dataset rows against the values sorted here.
        let feature = sorted.column_by_name("feature").expect("feature").as_string::<i32>();
        let episode = sorted.column_by_name("episode_index").expect("episode");
        let stat = |name: &str, row: usize| sorted.column_by_name(name).expect("stat").as_primitive::<Float64Type>().value(row);
        let batches = lake_store::read_columns_at(&uri, &["action"]).await.expect("read");
        for (row, dim) in (0..sorted.num_rows()).filter(|r| episode.is_null(*r) && feature.value(*r) == "action").zip(0..) {
            let mut values: Vec<f64> = Vec::new();
            for b in &batches {
                let (dims, flat) = flatten(b.column(0), "t").expect("flat");
                values.extend(flat.iter().skip(dim).step_by(dims).flatten());
            }
            values.sort_by(f64::total_cmp);
            assert_eq!((stat("min", row), stat("max", row)), (values[0], values[values.len() - 1]));
            for (i, (q, p)) in QUANTILES.iter().enumerate() {
                let got = stat(q, row);
                assert_eq!(got.to_bits(), quantile(&values, *p).to_bits(), "action[{dim}] {q}: {i}");
            }
        }
        // Episodes 2 and 3 interleave: each one's rows hold its own values only.
        let episodes = lake_store::read_columns_at(&uri, &["episode_index", "action"]).await.expect("read");
        for e in [2, 3] {
            let mut values: Vec<f64> = Vec::new();
            for b in &episodes {
                let (dims, flat) = flatten(b.column(1), "t").expect("flat");
                let of = b.column(0).as_primitive::<Int64Type>();
                values.extend((0..b.num_rows()).filter(|r| of.value(*r) == e).filter_map(|r| flat[r * dims]));
            }
            let mean = values.iter().sum::<f64>() / values.len() as f64;
            values.sort_by(f64::total_cmp);
            let row = (0..sorted.num_rows())
                .find(|r| episode.is_valid(*r) && episode.as_primitive::<Int64Type>().value(*r) == e && feature.value(*r) == "action")
                .expect("the episode's first action row");
            assert_eq!(sorted.column_by_name("count").expect("count").as_primitive::<Int64Type>().value(row), values.len() as i64);
            assert_eq!(stat("q50", row), quantile(&values, 0.5), "episode {e}");
            assert!((stat("mean", row) - mean).abs() < 1e-12, "episode {e}: {} vs {mean}", stat("mean", row));
        }
        // The reward holds a NaN: every statistic of it is NaN.
        let reward = (0..sorted.num_rows()).find(|r| episode.is_null(*r) && feature.value(*r) == "reward").expect("reward row");
        assert!(stat("q50", reward).is_nan() && stat("mean", reward).is_nan());
    }

    #[tokio::test]
    async fn a_subset_of_episodes_is_summarised_as_one() {
        let dir = tempfile::tempdir().expect("tmp");
        let (uri, schema) = steps_table(dir.path()).await;
        let subset: BTreeSet<i64> = [1, 3].into();
        let sorted = compute(&uri, &schema, Over::Episodes(&subset), Limits::default()).await.expect("in memory");
        assert_eq!(sorted.num_rows(), 5, "one row per dimension");
        assert_eq!(sorted.column_by_name("episode_index").expect("episode").null_count(), 5);
        let counts = sorted.column_by_name("count").expect("count").as_primitive::<Int64Type>();
        // 1500 steps of episode 1 and 1000 of episode 3, less the null rows among them.
        let batches = lake_store::read_columns_at(&uri, &["episode_index", "action"]).await.expect("read");
        let mut valid = 0;
        for b in &batches {
            let e = b.column(0).as_primitive::<Int64Type>();
            valid += (0..b.num_rows()).filter(|r| subset.contains(&e.value(*r)) && b.column(1).is_valid(*r)).count() as i64;
        }
        assert_eq!(counts.value(1), valid);
        let selected = compute(&uri, &schema, Over::Episodes(&subset), Limits { in_memory: 0, collect: 16, dims: 1 }).await.expect("radix");
        assert_eq!(bits(&selected), bits(&sorted));
    }

    #[test]
    fn keys_order_as_total_cmp_and_sums_are_compensated() {
        let values = [f64::NEG_INFINITY, -1e300, -1.5, -0.0, 0.0, 1e-310, 2.0, f64::INFINITY];
        for w in values.windows(2) {
            assert!(key(w[0]) < key(w[1]), "{} < {}", w[0], w[1]);
        }
        for v in values {
            assert_eq!(from_key(key(v)).to_bits(), v.to_bits());
        }
        // 1 + 1e-16 (a million times) is 1 + 1e-10, not 1.
        let mut sum = Sum::default();
        sum.add(1.0);
        for _ in 0..1_000_000 {
            sum.add(1e-16);
        }
        assert!((sum.total() - (1.0 + 1e-10)).abs() < 1e-15, "{}", sum.total());
    }

    #[test]
    fn vectors_flatten_by_dimension_and_null_rows_are_skipped() {
        use arrow::array::{FixedSizeListArray, Float32Array};
        let item = std::sync::Arc::new(Field::new("item", DataType::Float32, true));
        let values = Float32Array::from(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let list = FixedSizeListArray::new(item, 2, std::sync::Arc::new(values), Some(vec![true, false, true].into()));
        let (dims, flat) = flatten(&(std::sync::Arc::new(list) as ArrayRef), "t").expect("flattens");
        assert_eq!(dims, 2);
        assert_eq!(flat, vec![Some(1.0), Some(2.0), None, None, Some(5.0), Some(6.0)]);
    }
}
