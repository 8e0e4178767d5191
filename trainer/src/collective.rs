//! Data-parallel training's collectives: gradients summed over ranks in buckets, parameters
//! broadcast from rank 0, on an existing engine:
//! - MPI through rsmpi (feature `mpi`), for ranks that `mpirun` or `srun` started;
//! - libtorch's own c10d with Gloo, for ranks that a torchrun-style launcher started (the
//!   variables RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT): [`Launch`], [`Gloo`];
//! - NCCL on GPUs, for the same ranks ([`Nccl`]), summing the gradients in GPU memory.
//!
//! A rank computes its loss on its slice of the global batch; the gradients are then summed
//! over ranks and divided by the world size, so every rank takes the same step as one rank
//! given the whole global batch (up to the order of the float additions).

mod buckets;
mod c10d;
#[cfg(feature = "mpi")]
mod mpi;
mod nccl;

pub use self::buckets::{BUCKET_BYTES, Collective, Values, all_reduce_host, average_gradients, broadcast, ranks_apart};
pub use self::c10d::{COLLECTIVE_TIMEOUT, Gloo, Launch, RENDEZVOUS_TIMEOUT, Store};
#[cfg(feature = "mpi")]
pub use self::mpi::Mpi;
pub use self::nccl::Nccl;
