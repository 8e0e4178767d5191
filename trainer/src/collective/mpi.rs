//! MPI's world communicator (`mpirun`, `srun` with PMI) through rsmpi.

use mpi::traits::{Communicator as _, CommunicatorCollectives as _, Root as _};

use super::buckets::{Collective, Values};
use crate::Result;

/// MPI's world communicator: the ranks of the launch.
pub struct Mpi {
    _universe: mpi::environment::Universe,
    world: mpi::topology::SimpleCommunicator,
}

impl Mpi {
    /// Initialises MPI once per process; `None` when it was initialised already.
    pub fn init() -> Option<Self> {
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

impl std::fmt::Debug for Mpi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mpi").field("rank", &self.rank()).field("size", &self.size()).finish()
    }
}

/// MPI's default error handler ends the job on a failed collective, so these return `Ok`.
impl Collective for Mpi {
    fn rank(&self) -> u64 {
        self.world.rank() as u64
    }

    fn size(&self) -> u64 {
        self.world.size() as u64
    }

    fn all_reduce_sum(&self, values: Values<'_>) -> Result<()> {
        let sum = mpi::collective::SystemOperation::sum();
        match values {
            Values::F32(v) => self.world.all_reduce_into(&v.to_vec()[..], v, sum),
            Values::F64(v) => self.world.all_reduce_into(&v.to_vec()[..], v, sum),
            Values::Device(_) => return Err(super::buckets::host_only("MPI")),
        }
        Ok(())
    }

    fn broadcast(&self, values: Values<'_>) -> Result<()> {
        let root = self.world.process_at_rank(0);
        match values {
            Values::F32(v) => root.broadcast_into(v),
            Values::F64(v) => root.broadcast_into(v),
            Values::Device(_) => return Err(super::buckets::host_only("MPI")),
        }
        Ok(())
    }
}
