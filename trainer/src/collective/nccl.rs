//! NCCL for ranks on GPUs, loaded at run time by `lake_gpu::nccl`: gradients are
//! summed where they are, in GPU memory, on the device's default stream (libtorch's too, so the
//! sums are ordered after the backward pass and before the optimizer step).
//!
//! The ranks share NCCL's unique id through the launch's rendezvous store, as
//! torch.distributed's NCCL group does.

use std::sync::Arc;

use lake_gpu::nccl::{Comm, DataType, UniqueId};

use super::buckets::{Collective, Values};
use super::c10d::{Launch, Store};
use crate::{Error, Result};

/// The store key rank 0 publishes NCCL's unique id under.
const UNIQUE_ID_KEY: &str = "nccl/unique_id";

/// An NCCL communicator over the launch's ranks, one GPU each.
pub struct Nccl {
    nccl: &'static lake_gpu::nccl::Nccl,
    comm: Comm,
    context: Arc<cudarc::driver::CudaContext>,
    rank: u64,
    size: u64,
    // The store stays open while the communicator lives, as torch.distributed keeps it.
    _store: Store,
}

// SAFETY: an NCCL communicator may be used from any thread, one call at a time, which `&self`
// methods on one training thread are.
unsafe impl Send for Nccl {}

impl Nccl {
    /// NCCL, when this machine has it and a CUDA driver; if not, why.
    pub fn available() -> std::result::Result<&'static lake_gpu::nccl::Nccl, String> {
        // SAFETY: the probe only tries to load the library.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err("no CUDA driver library (libcuda.so) on this machine".to_owned());
        }
        lake_gpu::nccl::library()
    }

    /// Joins the launch's ranks: rank 0 makes NCCL's unique id and publishes it in the
    /// rendezvous store, every rank reads it, and each opens its communicator on the GPU of its
    /// local rank.
    ///
    /// # Errors
    /// [`Error::Ranks`] when NCCL or the GPU is missing, the ranks cannot meet, or NCCL refuses.
    pub fn connect(launch: &Launch) -> Result<Nccl> {
        let nccl = Nccl::available().map_err(|why| Error::Ranks(format!("NCCL cannot sum gradients here: {why}")))?;
        let store = Store::connect(launch)?;
        let id = if launch.rank == 0 {
            let id = nccl.unique_id().map_err(nccl_error("making NCCL's unique id"))?;
            store.set(UNIQUE_ID_KEY, &id.internal.map(|c| c as u8))?;
            id
        } else {
            let mut bytes = [0_u8; 128];
            store.get_exact(UNIQUE_ID_KEY, &mut bytes)?;
            UniqueId { internal: bytes.map(|b| b as std::ffi::c_char) }
        };
        let ordinal = usize::try_from(launch.local_rank).unwrap_or(usize::MAX);
        // The primary context, current on this thread: the one libtorch's runtime uses.
        let context = cudarc::driver::CudaContext::new(ordinal)
            .map_err(|e| Error::Ranks(format!("rank {}: GPU {ordinal} (its LOCAL_RANK): {e}", launch.rank)))?;
        let (size, rank) = (launch.world_size as i32, launch.rank as i32);
        // SAFETY: the context is current on this thread; every rank holds the same id and size.
        let comm = unsafe { nccl.comm_init_rank(size, id, rank) }
            .map_err(nccl_error(&format!("rank {rank} of {size} opening its NCCL communicator on GPU {ordinal}")))?;
        Ok(Nccl { nccl, comm, context, rank: launch.rank, size: launch.world_size, _store: store })
    }

    /// The tensor's address, element count and NCCL type, once checked.
    fn buffer(&self, what: &str, values: &Values<'_>) -> Result<(*mut std::ffi::c_void, usize, DataType)> {
        let Values::Device(t) = values else {
            return Err(Error::Ranks(format!("NCCL's {what} sums GPU memory, and was given host values")));
        };
        let kind = match t.kind() {
            tch::Kind::Float => DataType::ncclFloat32,
            tch::Kind::Double => DataType::ncclFloat64,
            other => return Err(Error::Ranks(format!("NCCL's {what} was given a {other:?} bucket"))),
        };
        if t.device() != self.device() || !t.is_contiguous() {
            return Err(Error::Ranks(format!("NCCL's {what} needs a contiguous bucket on {:?}, not {:?}", self.device(), t.device())));
        }
        self.context.bind_to_thread().map_err(|e| Error::Ranks(format!("binding GPU {}: {e}", self.context.ordinal())))?;
        Ok((t.data_ptr(), t.numel(), kind))
    }
}

fn nccl_error(what: &str) -> impl FnOnce(String) -> Error + '_ {
    move |e| Error::Ranks(format!("{what}: NCCL: {e}"))
}

impl Drop for Nccl {
    fn drop(&mut self) {
        // SAFETY: the communicator came from `comm_init_rank` and is destroyed once.
        let _ = unsafe { self.nccl.comm_destroy(self.comm) };
    }
}

impl std::fmt::Debug for Nccl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nccl").field("rank", &self.rank).field("size", &self.size).field("gpu", &self.context.ordinal()).finish()
    }
}

impl Collective for Nccl {
    fn rank(&self) -> u64 {
        self.rank
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn device(&self) -> tch::Device {
        tch::Device::Cuda(self.context.ordinal())
    }

    fn all_reduce_sum(&self, values: Values<'_>) -> Result<()> {
        let (data, count, kind) = self.buffer("all-reduce", &values)?;
        // SAFETY: `data` is `count` values of `kind` on this communicator's GPU, alive until the
        // call returns; the default stream orders the sum with libtorch's work.
        unsafe { self.nccl.all_reduce_sum(data, count, kind, self.comm, std::ptr::null_mut()) }
            .map_err(nccl_error(&format!("rank {} of {}: the all-reduce", self.rank, self.size)))?;
        Ok(())
    }

    fn broadcast(&self, values: Values<'_>) -> Result<()> {
        let (data, count, kind) = self.buffer("broadcast", &values)?;
        // SAFETY: as in `all_reduce_sum`.
        unsafe { self.nccl.broadcast(data, count, kind, 0, self.comm, std::ptr::null_mut()) }
            .map_err(nccl_error(&format!("rank {} of {}: the broadcast", self.rank, self.size)))?;
        Ok(())
    }
}
