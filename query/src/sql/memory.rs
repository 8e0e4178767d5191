//! The memory SQL may take: a pool that sorts, joins, aggregations and window functions draw
//! from, spilling to temporary files when it runs dry, and failing with "resources exhausted"
//! where an operator cannot spill. Every session given the same [`SqlMemory`] shares it (a
//! server's queries share one, carved out of its `--memory-mb`).
//!
//! What the pool does not see, values a scalar function builds in one call, is bounded by
//! [`super::capped`].

use std::{num::NonZeroUsize, sync::Arc};

use datafusion::execution::{
    memory_pool::{FairSpillPool, MemoryPool, TrackConsumersPool},
    runtime_env::{RuntimeEnv, RuntimeEnvBuilder},
};

use crate::{Error, Result};

/// The memory SQL sessions draw from (see the module's documentation).
#[derive(Clone)]
pub struct SqlMemory {
    runtime: Arc<RuntimeEnv>,
    bytes: u64,
}

impl std::fmt::Debug for SqlMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlMemory").field("bytes", &self.bytes).field("reserved", &self.reserved()).finish()
    }
}

impl SqlMemory {
    /// A pool of `bytes`, whose operators spill to files in the system's temporary directory.
    ///
    /// # Errors
    /// When the runtime cannot be made (the temporary directory is unusable).
    pub fn new(bytes: u64) -> Result<Self> {
        let size = usize::try_from(bytes).unwrap_or(usize::MAX);
        // The five largest consumers are named in a refusal, so that it says what took the room.
        let top = NonZeroUsize::new(5).expect("5 is not zero");
        let pool: Arc<dyn MemoryPool> = Arc::new(TrackConsumersPool::new(FairSpillPool::new(size), top));
        let runtime = RuntimeEnvBuilder::new()
            .with_memory_pool(pool)
            .build_arc()
            .map_err(|e| Error::Internal(format!("cannot set up SQL's memory pool: {e}")))?;
        Ok(Self { runtime, bytes })
    }

    /// Half the machine's memory: what `lake sql` takes unless told otherwise.
    #[must_use]
    pub fn default_bytes() -> u64 {
        // SAFETY: sysconf only reads system constants.
        let (pages, page) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
        match (u64::try_from(pages), u64::try_from(page)) {
            (Ok(pages), Ok(page)) if pages > 0 && page > 0 => pages.saturating_mul(page) / 2,
            _ => 4 << 30,
        }
    }

    /// The pool's size in bytes.
    #[must_use]
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Bytes the running queries hold now.
    #[must_use]
    pub fn reserved(&self) -> usize {
        self.runtime.memory_pool.reserved()
    }

    /// The runtime sessions run with.
    pub(crate) fn runtime(&self) -> Arc<RuntimeEnv> {
        self.runtime.clone()
    }
}
