//! Gradients and parameters over ranks, a bucket of values at a time, on any [`Collective`].

use tch::Tensor;

use crate::{Error, Result};

/// Gradients are reduced in buckets of about this many bytes of f32: one collective per bucket
/// rather than per tensor (ACT has ~160), without a copy of every gradient at once.
pub const BUCKET_BYTES: usize = 25 << 20;

/// Values a collective works on: a policy's f32 tensors, or f64 ones, in host memory; or a
/// contiguous bucket in GPU memory, for engines that work there ([`Collective::device`]).
#[derive(Debug)]
pub enum Values<'a> {
    /// Single precision.
    F32(&'a mut [f32]),
    /// Double precision.
    F64(&'a mut [f64]),
    /// A contiguous one-dimensional f32 or f64 tensor on the engine's GPU, changed in place.
    Device(&'a Tensor),
}

/// The operations data-parallel training needs from a collective engine.
pub trait Collective {
    /// This process's rank.
    fn rank(&self) -> u64;
    /// Number of ranks.
    fn size(&self) -> u64;
    /// Sums `values` element-wise over every rank, in place, on every rank.
    ///
    /// # Errors
    /// [`Error::Ranks`] when the ranks cannot complete it (one went away, a timeout).
    fn all_reduce_sum(&self, values: Values<'_>) -> Result<()>;
    /// Replaces `values` with rank 0's, on every rank.
    ///
    /// # Errors
    /// As [`Collective::all_reduce_sum`].
    fn broadcast(&self, values: Values<'_>) -> Result<()>;
    /// Where the engine takes its values: host memory (MPI, Gloo), or a GPU's (NCCL), where
    /// buckets are then gathered without a trip through the host.
    fn device(&self) -> tch::Device {
        tch::Device::Cpu
    }
}

/// Sums host values over every rank in place, through the engine's device when it works on a
/// GPU (a run's loss terms, the held-out totals).
///
/// # Errors
/// As [`Collective::all_reduce_sum`].
pub fn all_reduce_host(collective: &dyn Collective, values: &mut [f64]) -> Result<()> {
    let device = collective.device();
    if !device.is_cuda() {
        return collective.all_reduce_sum(Values::F64(values));
    }
    let on_device = Tensor::from_slice(values).to_device(device);
    collective.all_reduce_sum(Values::Device(&on_device))?;
    let summed = Vec::<f64>::try_from(&on_device.to_device(tch::Device::Cpu)).map_err(Error::Torch)?;
    values.copy_from_slice(&summed);
    Ok(())
}

/// Every tensor's values flattened into buckets of at most [`BUCKET_BYTES`] (f64 for double
/// tensors, else f32), in host memory or, when `device` is a GPU, in its memory; `apply` runs on
/// each bucket, whose values are then copied back.
fn bucketed(tensors: &[Tensor], device: tch::Device, mut apply: impl FnMut(Values<'_>) -> Result<()>) -> Result<()> {
    let double = |t: &Tensor| t.kind() == tch::Kind::Double;
    let mut start = 0;
    while start < tensors.len() {
        let wide = double(&tensors[start]);
        let per_bucket = BUCKET_BYTES / if wide { 8 } else { 4 };
        let (mut end, mut len) = (start, 0);
        while end < tensors.len() && double(&tensors[end]) == wide && (end == start || len + tensors[end].numel() <= per_bucket) {
            len += tensors[end].numel();
            end += 1;
        }
        let bucket = &tensors[start..end];
        let host = |t: &Tensor, kind| t.to_device(tch::Device::Cpu).to_kind(kind).contiguous().flatten(0, -1);
        let back = |values: Tensor| -> () {
            let mut at = 0;
            for t in bucket {
                let n = t.numel() as i64;
                let part = values.narrow(0, at, n).to_kind(t.kind()).to_device(t.device()).view(t.size().as_slice());
                tch::no_grad(|| t.shallow_clone().copy_(&part));
                at += n;
            }
        };
        if device.is_cuda() {
            let kind = if wide { tch::Kind::Double } else { tch::Kind::Float };
            let flat: Vec<Tensor> = bucket.iter().map(|t| t.to_device(device).to_kind(kind).flatten(0, -1)).collect();
            let values = Tensor::cat(&flat, 0).contiguous();
            apply(Values::Device(&values))?;
            back(values);
        } else if wide {
            let mut values = Vec::with_capacity(len);
            for t in bucket {
                values.extend(Vec::<f64>::try_from(&host(t, tch::Kind::Double)).map_err(Error::Torch)?);
            }
            apply(Values::F64(&mut values))?;
            back(Tensor::from_slice(&values));
        } else {
            let mut values = Vec::with_capacity(len);
            for t in bucket {
                values.extend(Vec::<f32>::try_from(&host(t, tch::Kind::Float)).map_err(Error::Torch)?);
            }
            apply(Values::F32(&mut values))?;
            back(Tensor::from_slice(&values));
        }
        start = end;
    }
    Ok(())
}

/// Averages the gradients of `params` over every rank. Every rank runs the same model, so a
/// parameter without a gradient has none on any rank; it is left out.
///
/// # Errors
/// [`Error::Torch`] when a gradient cannot be read, [`Error::Ranks`] when the ranks cannot sum
/// them.
pub fn average_gradients(collective: &dyn Collective, params: &[Tensor]) -> Result<()> {
    if collective.size() == 1 {
        return Ok(());
    }
    let grads: Vec<Tensor> = params.iter().map(Tensor::grad).filter(Tensor::defined).collect();
    let size = collective.size();
    bucketed(&grads, collective.device(), |values| match values {
        Values::Device(t) => {
            collective.all_reduce_sum(Values::Device(t))?;
            let _ = tch::no_grad(|| t.shallow_clone().f_div_scalar_(size as f64)).map_err(Error::Torch)?;
            Ok(())
        }
        Values::F32(v) => {
            collective.all_reduce_sum(Values::F32(v))?;
            v.iter_mut().for_each(|x| *x /= size as f32);
            Ok(())
        }
        Values::F64(v) => {
            collective.all_reduce_sum(Values::F64(v))?;
            v.iter_mut().for_each(|x| *x /= size as f64);
            Ok(())
        }
    })?;
    Ok(())
}

/// Makes every rank's `tensors` rank 0's.
///
/// # Errors
/// [`Error::Torch`] when a tensor cannot be read, [`Error::Ranks`] when the ranks cannot agree.
pub fn broadcast(collective: &dyn Collective, tensors: &[Tensor]) -> Result<()> {
    if collective.size() == 1 {
        return Ok(());
    }
    bucketed(tensors, collective.device(), |values| collective.broadcast(values))
}

/// The ranks whose `tensors` are not rank 0's, bit for bit (empty when every rank holds the
/// same values). Each rank hashes its values' bytes; the hashes meet in one small sum, in which
/// every rank fills its own slots and leaves the others zero, so the sum is exact.
///
/// # Errors
/// [`Error::Torch`] when a tensor cannot be read, [`Error::Ranks`] when the ranks cannot sum.
pub fn ranks_apart(collective: &dyn Collective, tensors: &[Tensor]) -> Result<Vec<u64>> {
    use std::hash::Hasher;

    if collective.size() == 1 {
        return Ok(Vec::new());
    }
    // The same keys in every process of one binary: the ranks' hashes compare.
    let mut hasher = std::hash::DefaultHasher::new();
    let mut bytes = Vec::new();
    for t in tensors {
        let host = t.to_device(tch::Device::Cpu).contiguous();
        let numel = host.numel();
        bytes.resize(numel * host.kind().elt_size_in_bytes(), 0);
        host.f_copy_data_u8(&mut bytes, numel).map_err(Error::Torch)?;
        hasher.write(&bytes);
    }
    let hash = hasher.finish();
    // Two 32-bit halves a slot: an f64 holds each exactly.
    let (rank, size) = (collective.rank() as usize, collective.size() as usize);
    let mut slots = vec![0f64; 2 * size];
    slots[2 * rank] = (hash >> 32) as f64;
    slots[2 * rank + 1] = (hash & 0xFFFF_FFFF) as f64;
    all_reduce_host(collective, &mut slots)?;
    let apart = slots.chunks(2).enumerate().filter(|(_, pair)| *pair != &slots[..2]).map(|(r, _)| r as u64);
    Ok(apart.collect())
}

/// The error of an engine that works on host memory given GPU memory.
pub(super) fn host_only(engine: &str) -> Error {
    Error::Ranks(format!("{engine} sums values in host memory, and was given a GPU buffer"))
}
