//! Frames decoded ahead: a stream keeps the frames its own later batches will show.
//!
//! The sample order is a pure function of `(seed, epoch)`, so a stream knows every batch it will
//! make. With LeRobot's default encoding (GOP 2) a uniformly drawn step whose frame is not a
//! keyframe costs two decodes, the keyframe's and its own, and the keyframe's picture is thrown
//! away; the step showing that keyframe comes later in the same epoch and decodes it again. A
//! [`Lookahead`] plans the stream's next batches (up to a horizon of draws). When a batch decodes
//! a GOP, the frames of that GOP that a planned batch will show are converted too (decoding on to
//! them where they come after the batch's own) and kept, in room reserved in the frame cache,
//! until that batch takes them: a GOP whose frames are drawn close together is decoded once. When
//! the room is full the frames needed soonest are kept (Belady's rule, exact here because the
//! future is known). Frames are byte-identical however they were made, so batches are too.

use std::{
    collections::{BTreeSet, HashMap, VecDeque},
    sync::{Arc, Mutex},
};

use crate::{
    batch::Loader,
    cache::Frame,
    sampler::{Cursor, Order, Sharding},
};

/// A frame of a stream: `(source, packets row)`.
pub type FrameRef = (usize, u64);

/// Draws a stream plans ahead by default.
pub const DEFAULT_HORIZON: u64 = 8192;

/// What one stream knows about its next batches, and the frames it decoded for them.
pub struct Lookahead {
    loader: Arc<Loader>,
    order: Arc<Order>,
    sharding: Sharding,
    /// Bytes of frames this stream may keep (reserved in the loader's cache as they are kept).
    cap: u64,
    horizon_batches: usize,
    state: Mutex<State>,
}

impl std::fmt::Debug for Lookahead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lookahead").field("cap", &self.cap).field("horizon_batches", &self.horizon_batches).finish_non_exhaustive()
    }
}

struct State {
    /// Cursors not planned yet.
    ahead: Box<dyn Iterator<Item = Cursor> + Send>,
    /// Planned batches, the next to begin first, with the frames each shows.
    planned: VecDeque<(Cursor, Vec<FrameRef>)>,
    /// Ordinal of the next batch to begin (`planned[i]` is `next + i`).
    next: u64,
    /// For every frame a planned batch shows: the ordinals of those batches, ascending.
    needs: HashMap<FrameRef, VecDeque<u64>>,
    /// Frames with needs, by GOP `(source, stream, keyframe row)`.
    gops: HashMap<(usize, u32, u64), BTreeSet<u64>>,
    /// Kept frames and the ordinal of the batch they are kept for.
    kept: HashMap<FrameRef, (Frame, u64)>,
    by_due: BTreeSet<(u64, FrameRef)>,
    /// Bytes reserved in the cache for `kept`.
    reserved: u64,
}

/// The frames kept for one batch, taken when the batch began.
#[derive(Debug, Default)]
pub struct Ahead {
    pub(crate) lookahead: Option<Arc<Lookahead>>,
    pub(crate) ordinal: u64,
    pub(crate) frames: HashMap<FrameRef, Frame>,
}

impl Lookahead {
    /// A lookahead over the batches `cursors` will visit (the stream's own, in order), planning
    /// `horizon` draws ahead and keeping at most `cap` bytes of frames; `None` when either is
    /// zero or the loader has no cache to reserve room in.
    pub fn new(
        loader: Arc<Loader>,
        order: Arc<Order>,
        sharding: Sharding,
        cursors: impl Iterator<Item = Cursor> + Send + 'static,
        horizon: u64,
        cap: u64,
    ) -> Option<Arc<Self>> {
        if horizon == 0 || cap == 0 || !loader.cache().enabled() || !loader.decodes_any() {
            return None;
        }
        let horizon_batches = (horizon / sharding.per_rank().max(1)).max(1) as usize;
        let state = State {
            ahead: Box::new(cursors),
            planned: VecDeque::new(),
            next: 0,
            needs: HashMap::new(),
            gops: HashMap::new(),
            kept: HashMap::new(),
            by_due: BTreeSet::new(),
            reserved: 0,
        };
        let cap = cap.min(loader.cache().budget());
        Some(Arc::new(Self { loader, order, sharding, cap, horizon_batches, state: Mutex::new(state) }))
    }

    /// Begins the batch at `cursor` (call in the stream's order, once per batch): plans further
    /// ahead and hands over the frames kept for this batch.
    pub fn begin(self: &Arc<Self>, cursor: Cursor) -> Ahead {
        let mut st = self.lock();
        self.plan(&mut st);
        let Some((planned, shown)) = st.planned.pop_front() else { return Ahead::default() };
        if planned != cursor {
            // Not the order this lookahead was made for: plan nothing more, keep nothing.
            debug_assert_eq!(planned, cursor, "a lookahead's batches begin in its stream's order");
            st.planned.clear();
            st.ahead = Box::new(std::iter::empty());
            self.forget_all(&mut st);
            return Ahead::default();
        }
        let ordinal = st.next;
        st.next += 1;
        for &key in &shown {
            self.fulfil(&mut st, key, ordinal);
        }
        let mut frames = HashMap::new();
        for key in shown {
            if let Some((frame, due)) = st.kept.remove(&key) {
                st.by_due.remove(&(due, key));
                match st.needs.get(&key).and_then(|n| n.front().copied()) {
                    Some(later) => {
                        st.by_due.insert((later, key));
                        st.kept.insert(key, (frame.clone(), later));
                    }
                    None => self.unreserve(&mut st, frame.len() as u64),
                }
                frames.insert(key, frame);
            }
        }
        // Frames kept for a batch that began before they were decoded (batches are made
        // concurrently): kept on for a later batch that shows them, or let go.
        while let Some(&(due, key)) = st.by_due.first()
            && due <= ordinal
        {
            st.by_due.remove(&(due, key));
            let (frame, _) = st.kept.remove(&key).expect("by_due and kept agree");
            match st.needs.get(&key).and_then(|n| n.front().copied()) {
                Some(later) => {
                    st.by_due.insert((later, key));
                    st.kept.insert(key, (frame, later));
                }
                None => self.unreserve(&mut st, frame.len() as u64),
            }
        }
        drop(st);
        self.loader.cache().count_ahead_hits(frames.len() as u64);
        Ahead { lookahead: Some(self.clone()), ordinal, frames }
    }

    /// Rows of the GOP `(source, stream, start)` that a later batch than `ordinal` shows, that
    /// are not among `targets` and that would be kept if decoded now.
    pub(crate) fn wanted_with(
        &self,
        ordinal: u64,
        source: usize,
        stream: u32,
        start: u64,
        targets: &[u64],
        frame_bytes: usize,
    ) -> Vec<u64> {
        let st = self.lock();
        let Some(rows) = st.gops.get(&(source, stream, start)) else { return vec![] };
        let mut out = Vec::new();
        let mut taken = 0u64;
        for &row in rows {
            if targets.binary_search(&row).is_ok() || st.kept.contains_key(&(source, row)) {
                continue;
            }
            let Some(&due) = st.needs.get(&(source, row)).and_then(|n| n.iter().find(|&&o| o > ordinal)) else { continue };
            if self.room_for(&st, frame_bytes as u64 + taken, due) {
                taken += frame_bytes as u64;
                out.push(row);
            }
        }
        out
    }

    /// Keeps `frame` of `key` (decoded by batch `ordinal`) when a later batch shows it and there
    /// is room, or room can be made by letting go of frames needed later than it.
    pub(crate) fn keep(&self, ordinal: u64, key: FrameRef, frame: &Frame) -> bool {
        let mut st = self.lock();
        if st.kept.contains_key(&key) {
            return true;
        }
        let Some(&due) = st.needs.get(&key).and_then(|n| n.iter().find(|&&o| o > ordinal)) else { return false };
        let size = frame.len() as u64;
        if !self.room_for(&st, size, due) {
            return false;
        }
        while st.reserved + size > self.cap || self.loader.cache().unreserved() < size {
            let Some(&(later, victim)) = st.by_due.last() else { return false };
            if later <= due {
                return false;
            }
            st.by_due.remove(&(later, victim));
            let (evicted, _) = st.kept.remove(&victim).expect("by_due and kept agree");
            self.unreserve(&mut st, evicted.len() as u64);
        }
        if !self.loader.cache().reserve(size) {
            return false;
        }
        st.reserved += size;
        st.by_due.insert((due, key));
        st.kept.insert(key, (frame.clone(), due));
        true
    }

    /// Bytes held in kept frames.
    pub fn kept_bytes(&self) -> u64 {
        self.lock().reserved
    }

    /// Whether `size` more bytes fit, counting frames needed later than `due` as room.
    fn room_for(&self, st: &State, size: u64, due: u64) -> bool {
        if size > self.cap {
            return false;
        }
        // Room of its own, within what other streams left unreserved in the shared cache.
        let mut free = (self.cap - st.reserved).min(self.loader.cache().unreserved());
        for (later, key) in st.by_due.iter().rev() {
            if free >= size || *later <= due {
                break;
            }
            free += st.kept[key].0.len() as u64;
        }
        free >= size
    }

    fn plan(&self, st: &mut State) {
        while st.planned.len() < self.horizon_batches {
            let Some(cursor) = st.ahead.next() else { break };
            let ordinal = st.next + st.planned.len() as u64;
            let draws: Vec<_> =
                self.sharding.positions(self.order.epoch_len(), cursor.step).map(|p| self.order.draw(cursor.epoch, p)).collect();
            let shown = self.loader.decoded_frames(&draws);
            for &(source, row) in &shown {
                let needs = st.needs.entry((source, row)).or_default();
                needs.push_back(ordinal);
                if needs.len() == 1 {
                    let gop = self.loader.gop_of(source, row);
                    st.gops.entry((source, gop.0, gop.1)).or_default().insert(row);
                }
            }
            st.planned.push_back((cursor, shown));
        }
    }

    /// Batch `ordinal` shows `key`: it no longer needs it.
    fn fulfil(&self, st: &mut State, key: FrameRef, ordinal: u64) {
        let Some(needs) = st.needs.get_mut(&key) else { return };
        needs.retain(|&o| o > ordinal);
        if needs.is_empty() {
            st.needs.remove(&key);
            let (stream, start) = self.loader.gop_of(key.0, key.1);
            if let Some(rows) = st.gops.get_mut(&(key.0, stream, start)) {
                rows.remove(&key.1);
                if rows.is_empty() {
                    st.gops.remove(&(key.0, stream, start));
                }
            }
        }
    }

    fn unreserve(&self, st: &mut State, bytes: u64) {
        st.reserved -= bytes;
        self.loader.cache().release(bytes);
    }

    fn forget_all(&self, st: &mut State) {
        st.kept.clear();
        st.by_due.clear();
        st.needs.clear();
        st.gops.clear();
        let reserved = std::mem::take(&mut st.reserved);
        self.loader.cache().release(reserved);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Every update leaves the maps consistent before it can panic, so a poisoned lock is
        // still usable.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Drop for Lookahead {
    fn drop(&mut self) {
        let reserved = self.lock().reserved;
        self.loader.cache().release(reserved);
    }
}
