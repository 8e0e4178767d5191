//! The sample order: a pure function of `(seed, epoch)`.
//!
//! Each epoch is a permutation of every eligible step (a Feistel network over the next power of
//! four, with cycle walking), so a position maps to a step in O(1) memory and time, on any rank,
//! with no shared state. Eligible steps are the selected episodes with `drop_n_first_frames` /
//! `drop_n_last_frames` cut off, as in LeRobot's `EpisodeAwareSampler`.
//!
//! Global step `s` covers positions `[s·G, (s+1)·G)` of an epoch (`G` = global batch), and rank
//! `r` of `w` takes `[s·G + r·G/w, s·G + (r+1)·G/w)`; so resuming from `(seed, epoch, step)` is
//! exact, also with another world size.
//!
//! Weighted mixtures of several datasets split each block of [`MIX_BLOCK`] positions among the
//! sources by weight (largest remainder) and shuffle the block; the k-th draw from a source is
//! position `k mod N` of that source's own permutation for epoch `k / N`.
//!
//! An unshuffled order ([`Order::in_sequence`], for evaluation passes and readers that want
//! the steps as recorded) reads each source's eligible steps once per epoch in row order, the
//! sources one after another: the same every epoch, weights playing no part.

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// Positions per mixture block: the weights hold exactly within every block of this size.
pub const MIX_BLOCK: u64 = 4096;

/// A bijection of `[0, n)`, keyed by a seed: a four-round Feistel network over the smallest
/// power of four ≥ `n`, walking cycles until the value falls back into range.
#[derive(Debug, Clone)]
pub struct Permutation {
    n: u64,
    half_bits: u32,
    keys: [u64; 4],
}

impl Permutation {
    /// The permutation of `[0, n)` for `key`.
    pub fn new(n: u64, key: u64) -> Self {
        let bits = if n <= 1 { 2 } else { 64 - (n - 1).leading_zeros() };
        let half_bits = bits.div_ceil(2).max(1);
        let mut state = key;
        let keys = [splitmix(&mut state), splitmix(&mut state), splitmix(&mut state), splitmix(&mut state)];
        Self { n, half_bits, keys }
    }

    /// The size of the permuted range.
    pub fn len(&self) -> u64 {
        self.n
    }

    /// Whether the range is empty.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// The image of `x` (`x < n`).
    pub fn apply(&self, x: u64) -> u64 {
        debug_assert!(x < self.n);
        let mut y = x;
        loop {
            y = self.round_trip(y);
            if y < self.n {
                return y;
            }
        }
    }

    fn round_trip(&self, x: u64) -> u64 {
        let mask = (1u64 << self.half_bits) - 1;
        let (mut left, mut right) = (x >> self.half_bits, x & mask);
        for key in self.keys {
            let f = mix(right ^ key) & mask;
            (left, right) = (right, left ^ f);
        }
        (left << self.half_bits) | right
    }
}

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    mix(*state)
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn key_of(parts: &[u64]) -> u64 {
    parts.iter().fold(0x6C61_6B65_u64, |acc, p| mix(acc ^ mix(*p)))
}

/// The steps a sampler may draw from one dataset: contiguous row ranges (one per episode).
#[derive(Debug, Clone, Default)]
pub struct Eligible {
    starts: Vec<u64>,
    cumulative: Vec<u64>,
}

impl Eligible {
    /// From `(first_row, rows)` per episode, trimming `drop_first` / `drop_last` rows of each.
    pub fn new(episodes: impl IntoIterator<Item = (u64, u64)>, drop_first: u64, drop_last: u64) -> Self {
        let mut out = Self::default();
        let mut total = 0;
        for (start, len) in episodes {
            let keep = len.saturating_sub(drop_first.saturating_add(drop_last));
            if keep > 0 {
                out.starts.push(start + drop_first);
                total += keep;
                out.cumulative.push(total);
            }
        }
        out
    }

    /// Number of eligible steps.
    pub fn len(&self) -> u64 {
        self.cumulative.last().copied().unwrap_or(0)
    }

    /// Whether no step is eligible.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The row of the `i`-th eligible step (`i < len`).
    pub fn row(&self, i: u64) -> u64 {
        let e = self.cumulative.partition_point(|&c| c <= i);
        let before = if e == 0 { 0 } else { self.cumulative[e - 1] };
        self.starts[e] + (i - before)
    }
}

/// One source of a sampling order: a dataset's eligible steps and its mixture weight.
#[derive(Debug, Clone)]
pub struct Source {
    /// The eligible steps.
    pub eligible: Eligible,
    /// Relative weight (any positive number; normalised over the sources).
    pub weight: f64,
}

/// Which sample a position of the order is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Draw {
    /// Index of the source.
    pub source: usize,
    /// Row in that source's steps.
    pub row: u64,
}

/// The deterministic order over one or several sources.
#[derive(Debug, Clone)]
pub struct Order {
    seed: u64,
    sources: Vec<Source>,
    /// Positions of each block given to each source (mixtures only).
    quotas: Vec<u64>,
    epoch_len: u64,
    /// Unshuffled: the position of each source's first step in an epoch; `None` when shuffled.
    in_sequence: Option<Vec<u64>>,
}

impl Order {
    /// The order over `sources` for `seed`.
    ///
    /// # Errors
    /// When there is no source, a weight is not positive, or a source has no eligible step.
    pub fn new(seed: u64, sources: Vec<Source>) -> Result<Self> {
        check_sources(&sources)?;
        if sources.len() == 1 {
            let epoch_len = sources[0].eligible.len();
            return Ok(Self { seed, sources, quotas: vec![], epoch_len, in_sequence: None });
        }
        // Weights whose total overflows (two of 1e308) are taken relative to the largest first;
        // any other mixture keeps the arithmetic (and so the order) it always had.
        let mut relative: Vec<f64> = sources.iter().map(|s| s.weight).collect();
        if !relative.iter().sum::<f64>().is_finite() {
            let largest = relative.iter().copied().fold(0.0, f64::max);
            relative.iter_mut().for_each(|w| *w /= largest);
        }
        let total_weight: f64 = relative.iter().sum();
        let exact: Vec<f64> = relative.iter().map(|w| w / total_weight * MIX_BLOCK as f64).collect();
        let mut quotas: Vec<u64> = exact.iter().map(|x| x.floor() as u64).collect();
        // Rounding may leave the floors a unit over the block; the largest quota gives it back.
        while quotas.iter().sum::<u64>() > MIX_BLOCK {
            let top = (0..quotas.len()).max_by_key(|&i| quotas[i]).expect("a source");
            quotas[top] -= 1;
        }
        let mut short = MIX_BLOCK - quotas.iter().sum::<u64>();
        let mut by_remainder: Vec<usize> = (0..sources.len()).collect();
        by_remainder.sort_by(|&a, &b| (exact[b] - exact[b].floor()).total_cmp(&(exact[a] - exact[a].floor())).then(a.cmp(&b)));
        for i in by_remainder {
            if short == 0 {
                break;
            }
            quotas[i] += 1;
            short -= 1;
        }
        let total_steps: u64 = sources.iter().map(|s| s.eligible.len()).sum();
        let epoch_len = total_steps.div_ceil(MIX_BLOCK) * MIX_BLOCK;
        Ok(Self { seed, sources, quotas, epoch_len, in_sequence: None })
    }

    /// The unshuffled order over `sources`: every epoch reads each source's eligible steps once,
    /// in row order, the sources one after another as given. Weights play no part.
    ///
    /// # Errors
    /// As [`Order::new`].
    pub fn in_sequence(sources: Vec<Source>) -> Result<Self> {
        check_sources(&sources)?;
        let starts: Vec<u64> = sources
            .iter()
            .scan(0u64, |next, s| {
                let start = *next;
                *next += s.eligible.len();
                Some(start)
            })
            .collect();
        let epoch_len = sources.iter().map(|s| s.eligible.len()).sum();
        Ok(Self { seed: 0, sources, quotas: vec![], epoch_len, in_sequence: Some(starts) })
    }

    /// Whether each epoch is a shuffle ([`Order::new`]) rather than the steps in sequence.
    pub fn shuffled(&self) -> bool {
        self.in_sequence.is_none()
    }

    /// Positions in one epoch: the eligible steps of a single source, or the sum over all
    /// sources, rounded up to whole mixture blocks when shuffled.
    pub fn epoch_len(&self) -> u64 {
        self.epoch_len
    }

    /// The sources.
    pub fn sources(&self) -> &[Source] {
        &self.sources
    }

    /// The sample at `position` (`< epoch_len`) of `epoch`.
    pub fn draw(&self, epoch: u64, position: u64) -> Draw {
        if let Some(starts) = &self.in_sequence {
            let source = starts.partition_point(|&start| start <= position) - 1;
            return Draw { source, row: self.sources[source].eligible.row(position - starts[source]) };
        }
        if self.sources.len() == 1 {
            return Draw { source: 0, row: self.source_draw(0, epoch, position) };
        }
        let (block, within) = (position / MIX_BLOCK, position % MIX_BLOCK);
        let slot = Permutation::new(MIX_BLOCK, key_of(&[self.seed, epoch, block, 1])).apply(within);
        let mut start = 0;
        for (source, &quota) in self.quotas.iter().enumerate() {
            if slot < start + quota {
                let blocks_per_epoch = self.epoch_len / MIX_BLOCK;
                let k = (epoch * blocks_per_epoch + block) * quota + (slot - start);
                let n = self.sources[source].eligible.len();
                return Draw { source, row: self.source_draw(source, k / n, k % n) };
            }
            start += quota;
        }
        unreachable!("quotas sum to the block size")
    }

    fn source_draw(&self, source: usize, epoch: u64, i: u64) -> u64 {
        let eligible = &self.sources[source].eligible;
        let perm = Permutation::new(eligible.len(), key_of(&[self.seed, epoch, source as u64, 0]));
        eligible.row(perm.apply(i))
    }
}

/// Refuses an order with no source, a weight that is not positive, or a source with no
/// eligible step.
fn check_sources(sources: &[Source]) -> Result<()> {
    if sources.is_empty() {
        return Err(Error::request("no dataset to sample from"));
    }
    for (i, s) in sources.iter().enumerate() {
        if !(s.weight.is_finite() && s.weight > 0.0) {
            return Err(Error::request(format!("dataset #{i}: weight {} must be a positive number", s.weight)));
        }
        if s.eligible.is_empty() {
            return Err(Error::request(format!("dataset #{i}: no step is eligible (episodes too short for the frames dropped?)")));
        }
    }
    Ok(())
}

/// Where a rank is in the order: exactly what a trainer checkpoints to resume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cursor {
    /// The epoch.
    pub epoch: u64,
    /// Global step within the epoch.
    pub step: u64,
}

/// How ranks split the order into batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sharding {
    /// Samples per global step, over all ranks.
    pub global_batch: u64,
    /// This rank.
    pub rank: u64,
    /// Number of ranks.
    pub world_size: u64,
    /// Whether the last, partial global batch of an epoch is dropped (otherwise it is served
    /// short, split between ranks as far as it goes).
    pub drop_last: bool,
}

impl Sharding {
    /// Validates the sharding.
    ///
    /// # Errors
    /// When the world is empty, the rank outside it, or the global batch not a positive multiple
    /// of the world size.
    pub fn new(global_batch: u64, rank: u64, world_size: u64, drop_last: bool) -> Result<Self> {
        if world_size == 0 || rank >= world_size {
            return Err(Error::request(format!("rank {rank} is outside a world of {world_size}")));
        }
        if global_batch == 0 || !global_batch.is_multiple_of(world_size) {
            return Err(Error::request(format!(
                "the global batch ({global_batch}) must be a positive multiple of the world size ({world_size})"
            )));
        }
        Ok(Self { global_batch, rank, world_size, drop_last })
    }

    /// Samples each rank gets per step.
    pub fn per_rank(&self) -> u64 {
        self.global_batch / self.world_size
    }

    /// Global steps in an epoch of `epoch_len` positions.
    pub fn steps_per_epoch(&self, epoch_len: u64) -> u64 {
        if self.drop_last { epoch_len / self.global_batch } else { epoch_len.div_ceil(self.global_batch) }
    }

    /// The positions of this rank's batch at `step` of an epoch of `epoch_len` positions.
    pub fn positions(&self, epoch_len: u64, step: u64) -> std::ops::Range<u64> {
        let start = (step * self.global_batch + self.rank * self.per_rank()).min(epoch_len);
        let end = (start + self.per_rank()).min(epoch_len);
        start..end
    }

    /// The cursor after `cursor`.
    pub fn next(&self, epoch_len: u64, cursor: Cursor) -> Cursor {
        if cursor.step + 1 >= self.steps_per_epoch(epoch_len) {
            Cursor { epoch: cursor.epoch + 1, step: 0 }
        } else {
            Cursor { step: cursor.step + 1, ..cursor }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeSet, HashMap};

    use super::*;

    fn single(n_episodes: u64, len: u64) -> Order {
        let eligible = Eligible::new((0..n_episodes).map(|e| (e * len, len)), 0, 0);
        Order::new(7, vec![Source { eligible, weight: 1.0 }]).unwrap()
    }

    #[test]
    fn permutations_are_bijections_for_awkward_sizes() {
        for n in [1u64, 2, 3, 5, 17, 64, 100, 1000, 4097] {
            for key in [0, 1, 99] {
                let p = Permutation::new(n, key);
                let seen: BTreeSet<u64> = (0..n).map(|x| p.apply(x)).collect();
                assert_eq!(seen.len() as u64, n, "n={n} key={key}");
                assert!(seen.iter().all(|&y| y < n));
            }
        }
        let (a, b) = (Permutation::new(1000, 1), Permutation::new(1000, 2));
        assert!((0..1000).filter(|&x| a.apply(x) != b.apply(x)).count() > 900, "keys give different orders");
    }

    #[test]
    fn each_epoch_is_a_permutation_of_the_eligible_steps() {
        let eligible = Eligible::new([(0, 10), (10, 3), (13, 20)], 1, 2);
        assert_eq!(eligible.len(), 7 + 17); // the 3-step episode is dropped entirely
        let order = Order::new(3, vec![Source { eligible, weight: 1.0 }]).unwrap();
        let expected: BTreeSet<u64> = (1..8).chain(14..31).collect();
        let mut epochs = Vec::new();
        for epoch in 0..3 {
            let rows: Vec<u64> = (0..order.epoch_len()).map(|p| order.draw(epoch, p).row).collect();
            assert_eq!(rows.iter().copied().collect::<BTreeSet<_>>(), expected, "epoch {epoch}");
            assert_eq!(rows.len(), expected.len());
            epochs.push(rows);
        }
        assert_ne!(epochs[0], epochs[1], "epochs are shuffled differently");
    }

    #[test]
    fn an_order_in_sequence_reads_the_steps_as_recorded_every_epoch() {
        let a = Eligible::new([(0, 10), (10, 3), (13, 20)], 1, 2);
        let b = Eligible::new([(100, 5)], 0, 0);
        let order = Order::in_sequence(vec![Source { eligible: a, weight: 1.0 }, Source { eligible: b, weight: 9.0 }]).unwrap();
        assert!(!order.shuffled());
        assert_eq!(order.epoch_len(), 24 + 5, "no block rounding, weights ignored");
        let expected: Vec<Draw> =
            (1..8).chain(14..31).map(|row| Draw { source: 0, row }).chain((100..105).map(|row| Draw { source: 1, row })).collect();
        for epoch in [0, 1, 7] {
            let draws: Vec<Draw> = (0..order.epoch_len()).map(|p| order.draw(epoch, p)).collect();
            assert_eq!(draws, expected, "epoch {epoch}");
        }
        // Two ranks without drop_last: each its slice of every global batch, the last short.
        let s = Sharding::new(8, 1, 2, false).unwrap();
        assert_eq!(s.steps_per_epoch(order.epoch_len()), 4);
        let rank1: Vec<u64> = (0..4).flat_map(|step| s.positions(order.epoch_len(), step)).collect();
        assert_eq!(rank1, [4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28]);
        assert!(Order::in_sequence(vec![]).is_err());
        assert!(Order::in_sequence(vec![Source { eligible: Eligible::new([(0, 5)], 3, 3), weight: 1.0 }]).is_err());
        assert!(single(2, 5).shuffled());
    }

    #[test]
    fn ranks_are_disjoint_and_cover_the_global_order() {
        let order = single(10, 37);
        let n = order.epoch_len();
        for world in [1u64, 2, 3, 4] {
            let s = Sharding::new(12, 0, world, true).unwrap();
            let mut union = Vec::new();
            for step in 0..s.steps_per_epoch(n) {
                for rank in 0..world {
                    let r = Sharding { rank, ..s };
                    union.extend(r.positions(n, step).map(|p| order.draw(0, p).row));
                }
            }
            let global: Vec<u64> = (0..s.steps_per_epoch(n) * 12).map(|p| order.draw(0, p).row).collect();
            assert_eq!(union, global, "world {world}: ranks in order are the global order");
            assert_eq!(union.iter().collect::<BTreeSet<_>>().len(), union.len(), "disjoint");
        }
    }

    #[test]
    fn world_sizes_with_the_same_global_batch_consume_the_same_sequence() {
        let order = single(4, 50);
        let n = order.epoch_len();
        let sequence = |world: u64| {
            let mut cursor = Cursor { epoch: 0, step: 0 };
            let mut out = Vec::new();
            for _ in 0..40 {
                for rank in 0..world {
                    let s = Sharding::new(6, rank, world, true).unwrap();
                    out.extend(s.positions(n, cursor.step).map(|p| order.draw(cursor.epoch, p)));
                }
                cursor = Sharding::new(6, 0, world, true).unwrap().next(n, cursor);
            }
            out
        };
        assert_eq!(sequence(1), sequence(2));
        assert_eq!(sequence(1), sequence(3));
        assert!(Sharding::new(6, 0, 4, true).is_err(), "6 does not split over 4 ranks");
        assert!(Sharding::new(6, 2, 2, true).is_err());
    }

    #[test]
    fn resume_replays_exactly() {
        let order = single(3, 41);
        let s = Sharding::new(8, 1, 2, false).unwrap();
        let n = order.epoch_len();
        let mut cursor = Cursor { epoch: 0, step: 0 };
        let mut run = Vec::new();
        let mut saved = None;
        for i in 0..50 {
            if i == 23 {
                saved = Some(cursor);
            }
            run.push(s.positions(n, cursor.step).map(|p| order.draw(cursor.epoch, p)).collect::<Vec<_>>());
            cursor = s.next(n, cursor);
        }
        let mut cursor = saved.unwrap();
        let fresh = single(3, 41);
        for expected in &run[23..] {
            assert_eq!(&s.positions(n, cursor.step).map(|p| fresh.draw(cursor.epoch, p)).collect::<Vec<_>>(), expected);
            cursor = s.next(n, cursor);
        }
        // Without drop_last the last batch of the epoch is short: 123 steps, 8 per step.
        assert_eq!(s.steps_per_epoch(n), 16);
        assert_eq!(s.positions(n, 15), 123..123);
        assert_eq!(Sharding { rank: 0, ..s }.positions(n, 15), 120..123);
    }

    #[test]
    fn weights_only_matter_relative_to_each_other_even_near_the_largest_float() {
        let make = |weights: [f64; 2]| {
            let sources = weights.map(|weight| Source { eligible: Eligible::new([(0, 100)], 0, 0), weight });
            Order::new(5, sources.into()).unwrap()
        };
        let (huge, plain) = (make([1e308, 1e308]), make([1.0, 1.0]));
        assert!((0..2).all(|epoch| (0..plain.epoch_len()).all(|p| huge.draw(epoch, p) == plain.draw(epoch, p))));
        let tiny = make([1e-300, 3e-300]);
        assert_eq!(tiny.quotas, make([1.0, 3.0]).quotas);
    }

    #[test]
    fn mixture_weights_hold() {
        let a = Eligible::new([(0, 1000)], 0, 0);
        let b = Eligible::new([(0, 300)], 0, 0);
        let c = Eligible::new([(0, 50)], 0, 0);
        let order = Order::new(
            11,
            vec![Source { eligible: a, weight: 0.6 }, Source { eligible: b, weight: 0.3 }, Source { eligible: c, weight: 0.1 }],
        )
        .unwrap();
        let mut counts: HashMap<usize, u64> = HashMap::new();
        let mut per_source: HashMap<usize, Vec<u64>> = HashMap::new();
        let total = order.epoch_len() * 3;
        for p in 0..total {
            let d = order.draw(p / order.epoch_len(), p % order.epoch_len());
            *counts.entry(d.source).or_default() += 1;
            per_source.entry(d.source).or_default().push(d.row);
        }
        for (source, weight) in [(0, 0.6), (1, 0.3), (2, 0.1)] {
            let share = counts[&source] as f64 / total as f64;
            assert!((share - weight).abs() < 0.002, "source {source}: {share} vs {weight}");
        }
        // Every source cycles through its own permutations: no step is drawn twice more often
        // than another.
        for rows in per_source.values() {
            let mut times: HashMap<u64, u64> = HashMap::new();
            for r in rows {
                *times.entry(*r).or_default() += 1;
            }
            let (lo, hi) = (times.values().min().unwrap(), times.values().max().unwrap());
            assert!(hi - lo <= 1, "{lo}..{hi}");
        }
        assert!(Order::new(1, vec![Source { eligible: Eligible::new([(0, 5)], 0, 0), weight: 0.0 }]).is_err());
        assert!(Order::new(1, vec![Source { eligible: Eligible::new([(0, 5)], 3, 3), weight: 1.0 }]).is_err());
    }
}
