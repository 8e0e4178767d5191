//! Exact statistics of every numeric feature, over every step, per episode and for the whole
//! dataset.
//!
//! LeRobot stores per-episode quantiles estimated with histograms and, at dataset level, only an
//! envelope of them. lake computes the real order statistics: each dimension's values are sorted
//! and the quantiles interpolated linearly between the nearest ranks (numpy's default method).
//! Columns are read back from the written `steps` table one feature at a time, so memory is one
//! feature's values, never the whole table.

use arrow::{
    array::{Array, ArrayRef, AsArray, Float64Builder, Int32Builder, Int64Builder, RecordBatch, StringBuilder},
    compute::{cast, concat},
    datatypes::{DataType, Field, Float64Type, Int64Type},
};
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

/// The quantile `p` of ascending `sorted` values, interpolated linearly between the two nearest
/// ranks (numpy's default `linear` method, also SQL's `percentile_cont`), with numpy's
/// arithmetic: from the lower rank below the midpoint, from the upper one above it (so an
/// infinite neighbour gives what numpy gives, an infinity or NaN).
pub fn quantile(sorted: &[f64], p: f64) -> f64 {
    let h = (sorted.len() - 1) as f64 * p;
    let lo = h.floor() as usize;
    let hi = (lo + 1).min(sorted.len() - 1);
    lerp(sorted[lo], sorted[hi], h - lo as f64)
}

/// `a + t (b - a)` as numpy's quantiles compute it: from `b` when `t >= 0.5`.
pub fn lerp(a: f64, b: f64, t: f64) -> f64 {
    let diff = b - a;
    if t >= 0.5 { b - diff * (1.0 - t) } else { a + diff * t }
}

/// Summarises `values` (sorting them in place); `None` when there are none.
pub fn summarise(values: &mut [f64]) -> Option<Summary> {
    if values.is_empty() {
        return None;
    }
    if values.iter().any(|v| v.is_nan()) {
        // As numpy's: a NaN makes every statistic NaN (a sort would put it at one end).
        let nan = f64::NAN;
        return Some(Summary { count: values.len() as i64, min: nan, max: nan, mean: nan, std: nan, quantiles: [nan; QUANTILES.len()] });
    }
    values.sort_unstable_by(f64::total_cmp);
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let var = values.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
    Some(Summary {
        count: values.len() as i64,
        min: values[0],
        max: values[values.len() - 1],
        mean,
        std: var.sqrt(),
        quantiles: QUANTILES.map(|(_, p)| quantile(values, p)),
    })
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

/// Summaries, per dimension, of a steps column (numbers, booleans, fixed-size vectors of them)
/// over the rows `rows`: what the dataset-level `feature_stats` rows hold, for a subset of steps.
///
/// # Errors
/// When the column's values cannot be read as numbers.
pub fn summarise_rows(col: &ArrayRef, rows: &[usize]) -> Result<Vec<Option<Summary>>> {
    let (dims, flat) = flatten(col, FEATURE_STATS)?;
    let mut scratch = Vec::with_capacity(rows.len());
    Ok((0..dims)
        .map(|dim| {
            scratch.clear();
            scratch.extend(rows.iter().filter_map(|&row| flat[row * dims + dim]));
            summarise(&mut scratch)
        })
        .collect())
}

/// Computes the `feature_stats` rows of the steps table at `steps_uri` (schema `schema`).
///
/// # Errors
/// When the table cannot be read.
pub async fn compute(steps_uri: &str, schema: &arrow::datatypes::Schema) -> Result<RecordBatch> {
    let episodes = read_column(steps_uri, "episode_index").await?;
    let episodes: Vec<i64> = cast(&episodes, &DataType::Int64)
        .map_err(Error::arrow(FEATURE_STATS))?
        .as_primitive::<Int64Type>()
        .iter()
        .map(|e| e.unwrap_or(-1))
        .collect();
    // Step positions grouped by episode (stable, so each group keeps table order).
    let mut order: Vec<usize> = (0..episodes.len()).collect();
    order.sort_by_key(|&i| episodes[i]);
    let mut groups: Vec<(i64, std::ops::Range<usize>)> = Vec::new();
    for (pos, &i) in order.iter().enumerate() {
        match groups.last_mut() {
            Some((e, range)) if *e == episodes[i] => range.end = pos + 1,
            _ => groups.push((episodes[i], pos..pos + 1)),
        }
    }

    let mut out = Rows::default();
    for field in schema.fields().iter().filter(|f| is_numeric(f)) {
        let col = read_column(steps_uri, field.name()).await?;
        let (dims, flat) = flatten(&col, FEATURE_STATS)?;
        let feature = tables::lerobot_name(field);
        let mut scratch = Vec::with_capacity(episodes.len());
        for dim in 0..dims {
            scratch.clear();
            scratch.extend(flat.iter().skip(dim).step_by(dims).flatten());
            out.push(None, feature, dim, summarise(&mut scratch));
            for (episode, range) in &groups {
                scratch.clear();
                scratch.extend(order[range.clone()].iter().filter_map(|&row| flat[row * dims + dim]));
                out.push(Some(*episode), feature, dim, summarise(&mut scratch));
            }
        }
    }
    out.finish()
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

async fn read_column(uri: &str, name: &str) -> Result<ArrayRef> {
    let batches = lake_store::read_columns_at(uri, &[name]).await?;
    let columns: Vec<&dyn Array> = batches.iter().map(|b| b.column(0).as_ref()).collect();
    if columns.is_empty() {
        return Ok(arrow::array::new_empty_array(&DataType::Int64));
    }
    concat(&columns).map_err(Error::arrow(FEATURE_STATS))
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
