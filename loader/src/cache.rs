//! The decoded-frame cache: frames (RGB, or YUV planes of a dataset opened for them, which has
//! a cache id of its own) keyed by `(dataset version, packet row)`, least recently
//! used out first, bounded in bytes (never above its budget, whatever the frame sizes). Loaders
//! may share one (a server's loaders do), so the budget holds for all of them together.
//!
//! Part of the budget can be reserved: a stream that knows which frames it will show later
//! ([`Lookahead`](crate::Lookahead)) keeps them in room it reserved here, so those frames and
//! the cache's own never hold more than the budget together.

use std::sync::{
    Mutex, Weak,
    atomic::{AtomicU64, Ordering},
};

use lru::LruCache;

/// A frame: packed RGB24 bytes (or YUV planes) shared by every sample that shows it (cheap to clone; frames
/// read from an uncompressed frame table are slices of what Lance read, not copies).
pub type Frame = bytes::Bytes;

/// Cache key: the dataset version's [`cache_id`](crate::LoaderDataset::cache_id) and the
/// `packets` row of the frame.
pub type FrameKey = (u64, u64);

/// Something that holds reserved room and can give back what it holds beyond its share.
pub(crate) trait Tenant: Send + Sync {
    /// Lets go of what it holds beyond [`FrameCache::share`], if it is not busy now.
    fn shrink_to_share(&self);
}

/// A byte-bounded LRU of decoded frames, safe to share between threads.
pub struct FrameCache {
    budget: u64,
    inner: Mutex<Inner>,
    /// Those reserving room (streams' lookaheads), each entitled to an equal share of it.
    tenants: Mutex<Vec<Weak<dyn Tenant>>>,
    hits: AtomicU64,
    misses: AtomicU64,
    ahead_hits: AtomicU64,
}

#[derive(Debug)]
struct Inner {
    frames: LruCache<FrameKey, Frame>,
    bytes: u64,
    reserved: u64,
}

/// Counters of a cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Lookups that found the frame.
    pub hits: u64,
    /// Lookups that did not.
    pub misses: u64,
    /// Bytes held now.
    pub bytes: u64,
    /// Frames held now.
    pub frames: u64,
    /// The budget.
    pub budget: u64,
    /// Bytes reserved by streams for frames they decoded ahead (part of the budget).
    pub reserved: u64,
    /// Frames shown from what a stream decoded ahead for them (counted in `hits` too).
    pub ahead_hits: u64,
}

impl CacheStats {
    /// Hits over lookups (0 when there were none).
    pub fn hit_rate(&self) -> f64 {
        let total = self.hits + self.misses;
        if total == 0 { 0.0 } else { self.hits as f64 / total as f64 }
    }
}

impl std::fmt::Debug for FrameCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrameCache").field("budget", &self.budget).field("stats", &self.stats()).finish_non_exhaustive()
    }
}

impl FrameCache {
    /// A cache holding at most `budget` bytes of frames (0 disables it).
    pub fn new(budget: u64) -> Self {
        Self {
            budget,
            tenants: Mutex::new(Vec::new()),
            inner: Mutex::new(Inner { frames: LruCache::unbounded(), bytes: 0, reserved: 0 }),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            ahead_hits: AtomicU64::new(0),
        }
    }

    /// The budget in bytes.
    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// Reserves `bytes` of the budget, evicting cached frames to make room; false (and nothing
    /// evicted) when the reservations would exceed the budget.
    pub fn reserve(&self, bytes: u64) -> bool {
        let mut inner = self.lock();
        if inner.reserved + bytes > self.budget {
            return false;
        }
        inner.reserved += bytes;
        while inner.bytes + inner.reserved > self.budget {
            let Some((_, evicted)) = inner.frames.pop_lru() else { break };
            inner.bytes -= evicted.len() as u64;
        }
        true
    }

    /// Bytes of the budget no one has reserved.
    pub fn unreserved(&self) -> u64 {
        self.budget.saturating_sub(self.lock().reserved)
    }

    /// Registers a tenant: from now on the budget is shared between it and the others alive.
    pub(crate) fn add_tenant(&self, tenant: Weak<dyn Tenant>) {
        let mut tenants = self.tenants.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        tenants.retain(|t| t.strong_count() > 0);
        tenants.push(tenant);
    }

    /// What each tenant alive may reserve: the budget divided between them.
    pub(crate) fn share(&self) -> u64 {
        let tenants = self.tenants.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let alive = tenants.iter().filter(|t| t.strong_count() > 0).count().max(1) as u64;
        self.budget / alive
    }

    /// Asks every tenant but `asking` to give back what it holds beyond its share (those busy
    /// at the moment are skipped: they shrink themselves when they next reserve). A tenant that
    /// stopped (its stream paused) would otherwise keep room the others need.
    pub(crate) fn reclaim(&self, asking: *const ()) {
        let tenants: Vec<_> =
            self.tenants.lock().unwrap_or_else(std::sync::PoisonError::into_inner).iter().filter_map(Weak::upgrade).collect();
        for t in tenants {
            if !std::ptr::eq(std::sync::Arc::as_ptr(&t).cast::<()>(), asking) {
                t.shrink_to_share();
            }
        }
    }

    /// Gives back `bytes` reserved with [`FrameCache::reserve`].
    pub fn release(&self, bytes: u64) {
        let mut inner = self.lock();
        inner.reserved = inner.reserved.saturating_sub(bytes);
    }

    /// Counts a lookup answered from frames a stream decoded ahead.
    pub(crate) fn count_ahead_hits(&self, n: u64) {
        self.hits.fetch_add(n, Ordering::Relaxed);
        self.ahead_hits.fetch_add(n, Ordering::Relaxed);
    }

    /// The frame, if cached (and marks it recently used).
    pub fn get(&self, key: FrameKey) -> Option<Frame> {
        let found = self.lock().frames.get(&key).cloned();
        let counter = if found.is_some() { &self.hits } else { &self.misses };
        counter.fetch_add(1, Ordering::Relaxed);
        found
    }

    /// Caches a frame, evicting the least recently used ones to stay within the budget. A
    /// frame larger than the whole budget is not cached.
    pub fn insert(&self, key: FrameKey, frame: Frame) {
        let size = frame.len() as u64;
        let mut inner = self.lock();
        if size + inner.reserved > self.budget {
            return;
        }
        if let Some(old) = inner.frames.pop(&key) {
            inner.bytes -= old.len() as u64;
        }
        while inner.bytes + inner.reserved + size > self.budget {
            let Some((_, evicted)) = inner.frames.pop_lru() else { break };
            inner.bytes -= evicted.len() as u64;
        }
        inner.bytes += size;
        inner.frames.put(key, frame);
    }

    /// Whether it caches anything (a budget above zero).
    pub fn enabled(&self) -> bool {
        self.budget > 0
    }

    /// The counters.
    pub fn stats(&self) -> CacheStats {
        let inner = self.lock();
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            bytes: inner.bytes,
            frames: inner.frames.len() as u64,
            budget: self.budget,
            reserved: inner.reserved,
            ahead_hits: self.ahead_hits.load(Ordering::Relaxed),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves consistent data (every update is a few plain
        // assignments), so a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_is_never_exceeded_and_lru_goes_first() {
        let cache = FrameCache::new(1000);
        let frame = |n: usize| Frame::from(vec![0u8; n]);
        let mut sizes = [300usize, 450, 120, 999, 1, 700, 260, 333, 1000, 50].iter().cycle();
        for i in 0..200u64 {
            cache.insert((0, i), frame(*sizes.next().unwrap()));
            let s = cache.stats();
            assert!(s.bytes <= 1000, "{s:?}");
            if i % 3 == 0 {
                let _ = cache.get((0, i / 2));
            }
        }
        let cache = FrameCache::new(1000);
        cache.insert((0, 1), frame(400));
        cache.insert((0, 2), frame(400));
        assert!(cache.get((0, 1)).is_some()); // 1 is now more recent than 2
        cache.insert((0, 3), frame(400));
        assert!(cache.get((0, 2)).is_none(), "least recently used goes first");
        assert!(cache.get((0, 1)).is_some() && cache.get((0, 3)).is_some());
        cache.insert((0, 4), frame(1001));
        assert!(cache.get((0, 4)).is_none(), "larger than the budget: not cached");
        let s = cache.stats();
        assert_eq!((s.hits, s.misses, s.frames, s.bytes), (3, 2, 2, 800));
        assert!(FrameCache::new(0).get((0, 0)).is_none());
    }

    #[test]
    fn reservations_and_cached_frames_share_the_budget() {
        let cache = FrameCache::new(1000);
        let frame = |n: usize| Frame::from(vec![0u8; n]);
        for i in 0..3 {
            cache.insert((0, i), frame(300));
        }
        assert!(cache.reserve(500), "room is made by evicting cached frames");
        let s = cache.stats();
        assert_eq!((s.frames, s.bytes, s.reserved), (1, 300, 500));
        assert!(cache.get((0, 2)).is_some(), "the most recent frame stays");
        assert!(!cache.reserve(501), "reservations alone may not exceed the budget");
        assert_eq!(cache.stats().frames, 1, "a refused reservation evicts nothing");
        cache.insert((0, 9), frame(400));
        let s = cache.stats();
        assert!(s.bytes + s.reserved <= 1000, "{s:?}");
        cache.insert((0, 10), frame(600));
        assert!(cache.get((0, 10)).is_none(), "larger than the unreserved budget: not cached");
        cache.release(500);
        assert!(cache.reserve(1000) && !cache.reserve(1));
        assert_eq!(cache.stats().bytes, 0);
        cache.release(1000);
        assert_eq!(cache.stats().reserved, 0);
    }
}
