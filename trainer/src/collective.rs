//! Data-parallel training's collectives: gradients summed over ranks in buckets, parameters
//! broadcast from rank 0, on an existing engine (MPI through rsmpi, feature `mpi`).
//!
//! A rank computes its loss on its slice of the global batch; the gradients are then summed
//! over ranks and divided by the world size, so every rank takes the same step as one rank
//! given the whole global batch (up to the order of the float additions).

use tch::Tensor;

use crate::{Error, Result};

/// Gradients are reduced in buckets of about this many bytes of f32: one collective per bucket
/// rather than per tensor (ACT has ~160), without a copy of every gradient at once.
pub const BUCKET_BYTES: usize = 25 << 20;

/// Values a collective works on: a policy's f32 tensors, or f64 ones.
#[derive(Debug)]
pub enum Values<'a> {
    /// Single precision.
    F32(&'a mut [f32]),
    /// Double precision.
    F64(&'a mut [f64]),
}

/// The operations data-parallel training needs from a collective engine.
pub trait Collective {
    /// This process's rank.
    fn rank(&self) -> u64;
    /// Number of ranks.
    fn size(&self) -> u64;
    /// Sums `values` element-wise over every rank, in place, on every rank.
    fn all_reduce_sum(&self, values: Values<'_>);
    /// Replaces `values` with rank 0's, on every rank.
    fn broadcast(&self, values: Values<'_>);
}

/// Every tensor's values flattened into buckets of at most [`BUCKET_BYTES`] (f64 for double
/// tensors, else f32); `apply` runs on each bucket, whose values are then copied back.
fn bucketed(tensors: &[Tensor], mut apply: impl FnMut(Values<'_>)) -> Result<()> {
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
        if wide {
            let mut values = Vec::with_capacity(len);
            for t in bucket {
                values.extend(Vec::<f64>::try_from(&host(t, tch::Kind::Double)).map_err(Error::Torch)?);
            }
            apply(Values::F64(&mut values));
            back(Tensor::from_slice(&values));
        } else {
            let mut values = Vec::with_capacity(len);
            for t in bucket {
                values.extend(Vec::<f32>::try_from(&host(t, tch::Kind::Float)).map_err(Error::Torch)?);
            }
            apply(Values::F32(&mut values));
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
/// [`Error::Torch`] when a gradient cannot be read.
pub fn average_gradients(collective: &dyn Collective, params: &[Tensor]) -> Result<()> {
    if collective.size() == 1 {
        return Ok(());
    }
    let grads: Vec<Tensor> = params.iter().map(Tensor::grad).filter(Tensor::defined).collect();
    let size = collective.size();
    bucketed(&grads, |values| match values {
        Values::F32(v) => {
            collective.all_reduce_sum(Values::F32(v));
            v.iter_mut().for_each(|x| *x /= size as f32);
        }
        Values::F64(v) => {
            collective.all_reduce_sum(Values::F64(v));
            v.iter_mut().for_each(|x| *x /= size as f64);
        }
    })?;
    Ok(())
}

/// Makes every rank's `tensors` rank 0's.
///
/// # Errors
/// [`Error::Torch`] when a tensor cannot be read.
pub fn broadcast(collective: &dyn Collective, tensors: &[Tensor]) -> Result<()> {
    if collective.size() == 1 {
        return Ok(());
    }
    bucketed(tensors, |values| collective.broadcast(values))
}

/// MPI's world communicator (`mpirun`, `srun` with PMI): the ranks of the launch.
#[cfg(feature = "mpi")]
pub struct Mpi {
    _universe: mpi::environment::Universe,
    world: mpi::topology::SimpleCommunicator,
}

#[cfg(feature = "mpi")]
impl Mpi {
    /// Initialises MPI once per process; `None` when it was initialised already.
    pub fn init() -> Option<Self> {
        use mpi::traits::Communicator as _;
        let universe = mpi::initialize()?;
        let world = universe.world();
        let _ = world.size();
        Some(Mpi { _universe: universe, world })
    }

    /// Whether this process was started by an MPI launcher (the variables Open MPI, MPICH and
    /// Slurm's PMI set).
    pub fn launched() -> bool {
        ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"].iter().any(|v| std::env::var_os(v).is_some())
    }
}

#[cfg(feature = "mpi")]
impl std::fmt::Debug for Mpi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mpi").field("rank", &self.rank()).field("size", &self.size()).finish()
    }
}

#[cfg(feature = "mpi")]
impl Collective for Mpi {
    fn rank(&self) -> u64 {
        use mpi::traits::Communicator as _;
        self.world.rank() as u64
    }

    fn size(&self) -> u64 {
        use mpi::traits::Communicator as _;
        self.world.size() as u64
    }

    fn all_reduce_sum(&self, values: Values<'_>) {
        use mpi::traits::CommunicatorCollectives as _;
        let sum = mpi::collective::SystemOperation::sum();
        match values {
            Values::F32(v) => self.world.all_reduce_into(&v.to_vec()[..], v, sum),
            Values::F64(v) => self.world.all_reduce_into(&v.to_vec()[..], v, sum),
        }
    }

    fn broadcast(&self, values: Values<'_>) {
        use mpi::traits::{Communicator as _, Root as _};
        let root = self.world.process_at_rank(0);
        match values {
            Values::F32(v) => root.broadcast_into(v),
            Values::F64(v) => root.broadcast_into(v),
        }
    }
}
