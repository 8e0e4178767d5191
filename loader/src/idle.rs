//! Idle things (decoders) kept for reuse within a byte budget.

/// Memory a loader lets idle decoders hold, per decode thread. A dataset stored as one file per
/// episode and camera has thousands of streams; uniform sampling touches all of them, and a
/// decoder kept for each would hold its buffers outside any budget. Within this, a dataset of a
/// few dozen files keeps a decoder for each: opening one again costs more than decoding a small
/// frame (the serving bench's 34 streams: `lake bench --cache off` took 2.15-2.22 CPU ms per
/// `act` sample, against 2.33-2.43 with 8 decoders per thread, for 20-45 MB more peak RSS).
pub(crate) const IDLE_DECODER_BYTES_PER_THREAD: u64 = 32 << 20;

/// Idle things by key, each with the bytes it holds; the most recently returned kept when they
/// hold more than `cap` bytes together.
#[derive(Debug)]
pub(crate) struct IdlePool<K, T> {
    cap: u64,
    bytes: u64,
    /// Oldest first.
    idle: std::collections::VecDeque<(K, T, u64)>,
}

impl<K: PartialEq, T> IdlePool<K, T> {
    pub(crate) fn new(cap: u64) -> Self {
        Self { cap, bytes: 0, idle: std::collections::VecDeque::new() }
    }

    /// The most recently returned idle thing of `key`.
    pub(crate) fn take(&mut self, key: &K) -> Option<T> {
        let at = self.idle.iter().rposition(|(k, _, _)| k == key)?;
        let (_, thing, bytes) = self.idle.remove(at)?;
        self.bytes -= bytes;
        Some(thing)
    }

    /// Returns `thing` (holding `bytes`) to the pool, dropping the longest idle beyond the cap.
    pub(crate) fn put(&mut self, key: K, thing: T, bytes: u64) {
        self.idle.push_back((key, thing, bytes));
        self.bytes += bytes;
        while self.bytes > self.cap {
            let Some((_, _, dropped)) = self.idle.pop_front() else { break };
            self.bytes -= dropped;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::IdlePool;

    #[test]
    fn idle_decoders_are_reused_by_stream_and_bounded() {
        let mut pool = IdlePool::new(30);
        assert_eq!(pool.take(&1), None);
        pool.put(1, "a", 10);
        pool.put(2, "b", 10);
        pool.put(1, "c", 10);
        assert_eq!(pool.take(&1), Some("c"), "the most recently returned of the stream");
        pool.put(1, "c", 10);
        pool.put(3, "d", 10);
        assert_eq!((pool.idle.len(), pool.bytes), (3, 30), "beyond the cap the longest idle goes");
        assert_eq!(pool.take(&1), Some("c"));
        assert_eq!(pool.take(&1), None, "stream 1's oldest decoder was the one dropped");
        assert_eq!((pool.take(&2), pool.take(&3)), (Some("b"), Some("d")));
        assert_eq!(pool.bytes, 0);
        pool.put(4, "small", 5);
        pool.put(5, "large", 26);
        assert_eq!((pool.take(&4), pool.take(&5)), (None, Some("large")), "bytes, not decoders, are bounded");
        pool.put(6, "too large", 31);
        assert_eq!((pool.take(&6), pool.bytes), (None, 0), "a decoder larger than the cap is not kept");
    }
}
