//! Frames decoded ahead: streams keep the frames their later batches will show.
//!
//! The sample order is a pure function of `(seed, epoch)`, so a stream knows every batch it will
//! make. With LeRobot's default encoding (GOP 2) a uniformly drawn step whose frame is not a
//! keyframe costs two decodes, the keyframe's and its own, and the keyframe's picture is thrown
//! away; the step showing that keyframe comes later in the same epoch and decodes it again. A
//! [`Lookahead`] plans the next batches of the streams that joined it (up to a horizon of draws
//! shared between them). When a batch decodes a GOP, the frames of that GOP that a planned batch
//! will show are converted too (decoding on to them where they come after the batch's own) and
//! kept, in room reserved in the frame cache, until that batch takes them: a GOP whose frames
//! are drawn close together is decoded once. When the room is full the frames needed soonest are
//! kept (Belady's rule, exact here because the future is known). Frames are byte-identical
//! however they were made, so batches are too.
//!
//! The streams of one lookahead are ranks reading one order with one global batch (a server's
//! clients of one training job): a frame one rank decoded is kept for the rank that shows it
//! next. Batches are numbered by global step, so the ranks' plans share one clock.
//!
//! A batch that has begun but not yet decoded (made ahead, or waiting for a turn to be made)
//! still counts as needing the frames it was not handed: another batch that decodes the GOP
//! first keeps them for it, and a batch whose frame another batch is decoding waits for that
//! decode instead of decoding the GOP again. With many streams many batches are begun at once,
//! and without this each GOP shared by two of them was decoded twice.

use std::{
    collections::{BTreeSet, HashMap, VecDeque},
    sync::{Arc, Mutex},
};

use crate::{
    cache::{Frame, FrameCache, Tenant},
    sampler::{Cursor, Order, Sharding},
};

/// A frame of a stream: `(source, packets row)`.
pub type FrameRef = (usize, u64);

/// Draws the streams of a lookahead plan ahead together by default.
pub const DEFAULT_HORIZON: u64 = 8192;

/// The most draws a lookahead plans ahead (a plan holds a few hundred bytes per draw, and the
/// frames it keeps must fit the frame cache long before this many draws pay off).
pub const MAX_HORIZON: u64 = 1 << 17;

/// What a lookahead plans with: the loader whose cache holds the frames decoded ahead, and
/// which frames of a draw it decodes (the [`Loader`](crate::Loader)).
pub trait FrameSource: Send + Sync {
    /// The cache frames decoded ahead are kept in.
    fn cache(&self) -> &FrameCache;
    /// Whether any of the loader's datasets has frames it decodes (not read from a frame table).
    fn decodes_any(&self) -> bool;
    /// The frames `draws` show that the loader decodes, by (source, packet row).
    fn decoded_frames(&self, draws: &[crate::Draw]) -> Vec<FrameRef>;
    /// The stream of packet row `row` of source `source`, and the row its GOP starts at.
    fn gop_of(&self, source: usize, row: u64) -> (u32, u64);
}

/// The plans of the streams that joined, and the frames decoded for them.
pub struct Lookahead {
    loader: Arc<dyn FrameSource>,
    order: Arc<Order>,
    /// Global batch and steps per epoch every member shares.
    global_batch: u64,
    steps_per_epoch: u64,
    /// Draws planned ahead by all members together.
    horizon: u64,
    /// Bytes of frames kept (reserved in the loader's cache as they are kept).
    cap: u64,
    state: Mutex<State>,
    /// Woken when a promise is settled.
    settled: tokio::sync::Notify,
}

impl std::fmt::Debug for Lookahead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lookahead").field("cap", &self.cap).field("horizon", &self.horizon).finish_non_exhaustive()
    }
}

/// One member's plan.
struct Plan {
    sharding: Sharding,
    /// Cursors not planned yet.
    ahead: Box<dyn Iterator<Item = Cursor> + Send>,
    /// Planned batches, the next to begin first: cursor, ordinal and the frames it shows.
    planned: VecDeque<(Cursor, u64, Vec<FrameRef>)>,
}

/// A batch that will show a frame: `(ordinal, member)`.
type Need = (u64, u64);

#[derive(Default)]
struct State {
    members: HashMap<u64, Plan>,
    next_member: u64,
    /// For every frame a planned batch shows: those batches, soonest first.
    needs: HashMap<FrameRef, BTreeSet<Need>>,
    /// Frames with needs, by GOP `(source, stream, keyframe row)`.
    gops: HashMap<(usize, u32, u64), BTreeSet<u64>>,
    /// Kept frames and the ordinal of the soonest batch they are kept for.
    kept: HashMap<FrameRef, (Frame, u64)>,
    by_due: BTreeSet<(u64, FrameRef)>,
    /// Bytes reserved in the cache for `kept`.
    reserved: u64,
    /// Frames a batch is decoding now and will keep if they are still needed then, with the
    /// number of such decodes.
    promised: HashMap<FrameRef, u32>,
    /// Room reserved (counted in `reserved`) for frames a batch is decoding for another.
    claims: HashMap<FrameRef, u64>,
}

/// A stream's place in a [`Lookahead`]: its batches begin through it, and its plan is dropped
/// with it.
pub struct Member {
    lookahead: Arc<Lookahead>,
    id: u64,
}

impl std::fmt::Debug for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Member").field("id", &self.id).finish_non_exhaustive()
    }
}

/// The frames kept for one batch, taken when the batch began, and the needs of the frames it
/// was not handed then (released as the batch takes or decodes them, or when it is dropped).
#[derive(Debug, Default)]
pub struct Ahead {
    pub(crate) lookahead: Option<Arc<Lookahead>>,
    pub(crate) frames: HashMap<FrameRef, Frame>,
    pending: Mutex<Vec<(FrameRef, Need)>>,
}

impl Drop for Ahead {
    fn drop(&mut self) {
        let pending = std::mem::take(self.pending.get_mut().unwrap_or_else(std::sync::PoisonError::into_inner));
        if let Some(l) = &self.lookahead
            && !pending.is_empty()
        {
            let mut st = l.lock();
            for (key, need) in pending {
                l.fulfil(&mut st, key, need);
            }
        }
    }
}

/// Frames a batch is decoding that others need ([`Lookahead::claim`]): settled when dropped, after
/// the decoded frames were offered to [`Lookahead::keep`] (or the decode failed or was
/// abandoned), waking the batches that wait for them.
pub(crate) struct Promise {
    lookahead: Arc<Lookahead>,
    keys: Vec<FrameRef>,
}

impl Drop for Promise {
    fn drop(&mut self) {
        if self.keys.is_empty() {
            return;
        }
        let mut st = self.lookahead.lock();
        for key in &self.keys {
            if let std::collections::hash_map::Entry::Occupied(mut e) = st.promised.entry(*key) {
                *e.get_mut() -= 1;
                if *e.get() == 0 {
                    e.remove();
                }
            }
            // Room claimed for a frame the decode did not offer (it failed, or was abandoned).
            if let Some(bytes) = st.claims.remove(key) {
                self.lookahead.unreserve(&mut st, bytes);
            }
        }
        drop(st);
        self.lookahead.settled.notify_waiters();
    }
}

impl Lookahead {
    /// A lookahead for streams reading `order` in global batches of `sharding` (any rank),
    /// planning `horizon` draws ahead between them (at most [`MAX_HORIZON`]) and keeping at most
    /// `cap` bytes of frames; `None` when either is zero or the loader has no cache to reserve
    /// room in.
    pub fn new(loader: Arc<dyn FrameSource>, order: Arc<Order>, sharding: Sharding, horizon: u64, cap: u64) -> Option<Arc<Self>> {
        if horizon == 0 || cap == 0 || !loader.cache().enabled() || !loader.decodes_any() {
            return None;
        }
        let cap = cap.min(loader.cache().budget());
        let steps_per_epoch = sharding.steps_per_epoch(order.epoch_len());
        let lookahead = Arc::new(Self {
            loader,
            order,
            global_batch: sharding.global_batch,
            steps_per_epoch,
            horizon: horizon.min(MAX_HORIZON),
            cap,
            state: Mutex::new(State::default()),
            settled: tokio::sync::Notify::new(),
        });
        let tenant: std::sync::Weak<dyn Tenant> = Arc::downgrade(&lookahead) as std::sync::Weak<dyn Tenant>;
        lookahead.loader.cache().add_tenant(tenant);
        Some(lookahead)
    }

    /// What this lookahead may keep now: its cap, or its share of the cache when other streams'
    /// lookaheads share it (a server's jobs).
    fn cap(&self) -> u64 {
        self.cap.min(self.loader.cache().share())
    }

    /// A stream of rank `sharding` that will visit `cursors` (in order) joins; `None` when its
    /// global batch or epochs differ from this lookahead's.
    pub fn join(self: &Arc<Self>, sharding: Sharding, cursors: impl Iterator<Item = Cursor> + Send + 'static) -> Option<Member> {
        if sharding.global_batch != self.global_batch || sharding.steps_per_epoch(self.order.epoch_len()) != self.steps_per_epoch {
            return None;
        }
        let mut st = self.lock();
        let id = st.next_member;
        st.next_member += 1;
        st.members.insert(id, Plan { sharding, ahead: Box::new(cursors), planned: VecDeque::new() });
        Some(Member { lookahead: self.clone(), id })
    }

    /// Streams joined now.
    pub fn members(&self) -> usize {
        self.lock().members.len()
    }

    /// Bytes held in kept frames.
    pub fn kept_bytes(&self) -> u64 {
        self.lock().reserved
    }

    fn ordinal(&self, cursor: Cursor) -> u64 {
        cursor.epoch.saturating_mul(self.steps_per_epoch).saturating_add(cursor.step)
    }

    fn begin(self: &Arc<Self>, id: u64, cursor: Cursor) -> Ahead {
        let mut st = self.lock();
        self.plan(&mut st, id);
        let Some((planned, ordinal, shown)) = st.members.get_mut(&id).and_then(|m| m.planned.pop_front()) else {
            return Ahead::default();
        };
        if planned != cursor {
            // Not the order this member joined with: it wants none of what was planned for it
            // (this batch's frames included), and nothing more is planned for it.
            for key in shown {
                self.fulfil(&mut st, key, (ordinal, id));
            }
            self.forget(&mut st, id);
            if let Some(m) = st.members.get_mut(&id) {
                m.ahead = Box::new(std::iter::empty());
            }
            return Ahead::default();
        }
        let mut frames = HashMap::new();
        let mut pending = Vec::new();
        for key in shown {
            match st.kept.get(&key) {
                Some((frame, _)) => {
                    frames.insert(key, frame.clone());
                    self.fulfil(&mut st, key, (ordinal, id));
                }
                None => pending.push((key, (ordinal, id))),
            }
        }
        drop(st);
        self.loader.cache().count_ahead_hits(frames.len() as u64);
        Ahead { lookahead: Some(self.clone()), frames, pending: Mutex::new(pending) }
    }

    /// The frames of `rows` (of dataset `source`) that `ahead`'s batch was not handed when it
    /// began and that another batch has kept for it since; waits for batches decoding any of
    /// them now. The batch no longer needs any of `rows` afterwards: what is not returned, it
    /// decodes itself.
    pub(crate) async fn take_late(&self, ahead: &Ahead, source: usize, rows: &BTreeSet<u64>) -> HashMap<u64, Frame> {
        let mut out = HashMap::new();
        loop {
            let settled = self.settled.notified();
            tokio::pin!(settled);
            // Registered before looking, so a promise settled in between still wakes this.
            settled.as_mut().enable();
            let waiting = {
                let mut st = self.lock();
                let mut pending = ahead.pending.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                let mut waiting = false;
                pending.retain(|&(key, need)| {
                    if key.0 != source || !rows.contains(&key.1) {
                        return true;
                    }
                    if let Some((frame, _)) = st.kept.get(&key) {
                        out.insert(key.1, frame.clone());
                    } else if st.promised.contains_key(&key) {
                        waiting = true;
                        return true;
                    }
                    self.fulfil(&mut st, key, need);
                    false
                });
                waiting
            };
            if !waiting {
                break;
            }
            settled.await;
        }
        self.loader.cache().count_ahead_hits(out.len() as u64);
        out
    }

    /// Plans the GOP decodes of a batch of dataset `source`: for each GOP `(stream, keyframe
    /// row, rows the batch shows, bytes of a frame)`, the rows of that GOP another batch needs
    /// that it should decode too, each with room reserved for it now (so that keeping it after
    /// the decode cannot fail for want of room, however many batches decode meanwhile). Rows
    /// another decode has promised already are left to it. The returned promise holds every
    /// row the batch decodes that another batch needs, until the decode is over.
    pub(crate) fn claim(self: &Arc<Self>, source: usize, gops: &[(u32, u64, &[u64], usize)]) -> (Vec<Vec<u64>>, Promise) {
        let mut st = self.lock();
        let mut later_rows = Vec::with_capacity(gops.len());
        let mut promise = Promise { lookahead: self.clone(), keys: Vec::new() };
        for &(stream, start, own, frame_bytes) in gops {
            let mut later = Vec::new();
            let rows: Vec<u64> = st.gops.get(&(source, stream, start)).map(|r| r.iter().copied().collect()).unwrap_or_default();
            for row in rows {
                let key = (source, row);
                if own.binary_search(&row).is_ok() || st.kept.contains_key(&key) || st.promised.contains_key(&key) {
                    continue;
                }
                let Some(&(due, _)) = st.needs.get(&key).and_then(BTreeSet::first) else { continue };
                if self.make_room(&mut st, frame_bytes as u64, due) {
                    st.claims.insert(key, frame_bytes as u64);
                    later.push(row);
                }
            }
            for &row in own.iter().chain(&later) {
                let key = (source, row);
                if st.needs.contains_key(&key) {
                    *st.promised.entry(key).or_default() += 1;
                    promise.keys.push(key);
                }
            }
            later_rows.push(later);
        }
        (later_rows, promise)
    }

    /// Keeps `frame` of `key` when a batch not begun yet shows it and there is room, or room can
    /// be made by letting go of frames needed later than it (or room was claimed for it).
    pub(crate) fn keep(&self, key: FrameRef, frame: &Frame) -> bool {
        let mut st = self.lock();
        let claimed = st.claims.remove(&key);
        if st.kept.contains_key(&key) {
            if let Some(bytes) = claimed {
                self.unreserve(&mut st, bytes);
            }
            return true;
        }
        let due = st.needs.get(&key).and_then(BTreeSet::first).map(|&(due, _)| due);
        let size = frame.len() as u64;
        let room = match (due, claimed) {
            (Some(_), Some(bytes)) if bytes == size => true,
            (_, Some(bytes)) => {
                self.unreserve(&mut st, bytes);
                false
            }
            (_, None) => false,
        };
        let Some(due) = due else { return false };
        if !room && !self.make_room(&mut st, size, due) {
            return false;
        }
        st.by_due.insert((due, key));
        st.kept.insert(key, (frame.clone(), due));
        true
    }

    /// Reserves `size` bytes for a frame needed at `due`, letting go of kept frames needed
    /// later than it when there is no other room; false (and nothing let go) when there is not
    /// enough.
    fn make_room(&self, st: &mut State, size: u64, due: u64) -> bool {
        let cap = self.cap();
        if st.reserved + size <= cap && self.loader.cache().unreserved() < size {
            // Within its share, but others hold the room: those beyond theirs give it back.
            self.loader.cache().reclaim(std::ptr::from_ref(self).cast());
        }
        if !self.room_for(st, size, due) {
            return false;
        }
        while st.reserved + size > cap || self.loader.cache().unreserved() < size {
            let Some(&(later, victim)) = st.by_due.last() else { return false };
            if later <= due {
                return false;
            }
            st.by_due.remove(&(later, victim));
            let (evicted, _) = st.kept.remove(&victim).expect("by_due and kept agree");
            self.unreserve(st, evicted.len() as u64);
        }
        if !self.loader.cache().reserve(size) {
            return false;
        }
        st.reserved += size;
        true
    }

    /// Whether `size` more bytes fit, counting frames needed later than `due` as room.
    fn room_for(&self, st: &State, size: u64, due: u64) -> bool {
        let cap = self.cap();
        if size > cap {
            return false;
        }
        // Room of its own, within what others left unreserved in the shared cache.
        let mut free = cap.saturating_sub(st.reserved).min(self.loader.cache().unreserved());
        for (later, key) in st.by_due.iter().rev() {
            if free >= size || *later <= due {
                break;
            }
            free += st.kept[key].0.len() as u64;
        }
        free >= size
    }

    /// Plans member `id` ahead: its share of the horizon (divided between the members), at
    /// least one batch.
    fn plan(&self, st: &mut State, id: u64) {
        let members = st.members.len().max(1) as u64;
        let Some(m) = st.members.get_mut(&id) else { return };
        let batches = (self.horizon / (m.sharding.per_rank().max(1) * members)).max(1) as usize;
        let mut added = Vec::new();
        while m.planned.len() < batches {
            let Some(cursor) = m.ahead.next() else { break };
            let ordinal = self.ordinal(cursor);
            let draws: Vec<_> =
                m.sharding.positions(self.order.epoch_len(), cursor.step).map(|p| self.order.draw(cursor.epoch, p)).collect();
            let shown = self.loader.decoded_frames(&draws);
            added.push((ordinal, shown.clone()));
            m.planned.push_back((cursor, ordinal, shown));
        }
        for (ordinal, shown) in added {
            for key in shown {
                let needs = st.needs.entry(key).or_default();
                needs.insert((ordinal, id));
                if needs.len() == 1 {
                    let gop = self.loader.gop_of(key.0, key.1);
                    st.gops.entry((key.0, gop.0, gop.1)).or_default().insert(key.1);
                }
                // A kept frame now wanted sooner keeps its place by the sooner batch.
                if let Some((_, due)) = st.kept.get_mut(&key)
                    && ordinal < *due
                {
                    st.by_due.remove(&(*due, key));
                    st.by_due.insert((ordinal, key));
                    *due = ordinal;
                }
            }
        }
    }

    /// `need` no longer wants `key` (its batch began, or its member left): the frame is kept on
    /// for the next batch that shows it, or let go.
    fn fulfil(&self, st: &mut State, key: FrameRef, need: Need) {
        let Some(needs) = st.needs.get_mut(&key) else { return };
        needs.remove(&need);
        let next = needs.first().map(|&(o, _)| o);
        if next.is_none() {
            st.needs.remove(&key);
            let (stream, start) = self.loader.gop_of(key.0, key.1);
            if let Some(rows) = st.gops.get_mut(&(key.0, stream, start)) {
                rows.remove(&key.1);
                if rows.is_empty() {
                    st.gops.remove(&(key.0, stream, start));
                }
            }
        }
        let Some((_, due)) = st.kept.get(&key) else { return };
        let due = *due;
        if next == Some(due) {
            return;
        }
        st.by_due.remove(&(due, key));
        match next {
            Some(later) => {
                st.by_due.insert((later, key));
                st.kept.get_mut(&key).expect("kept").1 = later;
            }
            None => {
                let (frame, _) = st.kept.remove(&key).expect("kept");
                self.unreserve(st, frame.len() as u64);
            }
        }
    }

    /// Drops member `id`'s planned batches (it left, or its order went astray).
    fn forget(&self, st: &mut State, id: u64) {
        let planned = st.members.get_mut(&id).map(|m| std::mem::take(&mut m.planned)).unwrap_or_default();
        for (_, ordinal, shown) in planned {
            for key in shown {
                self.fulfil(st, key, (ordinal, id));
            }
        }
    }

    fn unreserve(&self, st: &mut State, bytes: u64) {
        st.reserved -= bytes;
        self.loader.cache().release(bytes);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Every update leaves the maps consistent before it can panic, so a poisoned lock is
        // still usable.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Tenant for Lookahead {
    fn shrink_to_share(&self) {
        let Ok(mut st) = self.state.try_lock() else { return };
        let cap = self.cap();
        // Frames needed last go first; room claimed for a decode under way stays.
        while st.reserved > cap {
            let Some(&(due, victim)) = st.by_due.last() else { break };
            st.by_due.remove(&(due, victim));
            let (evicted, _) = st.kept.remove(&victim).expect("by_due and kept agree");
            self.unreserve(&mut st, evicted.len() as u64);
        }
    }
}

impl Member {
    /// Begins this stream's batch at `cursor` (call in the stream's order, once per batch):
    /// plans further ahead and hands over the frames kept for this batch. A batch begun out of
    /// that order gets nothing, and nothing is kept for this member from then on.
    pub fn begin(&self, cursor: Cursor) -> Ahead {
        self.lookahead.begin(self.id, cursor)
    }

    /// The lookahead joined.
    pub fn lookahead(&self) -> &Arc<Lookahead> {
        &self.lookahead
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        let mut st = self.lookahead.lock();
        self.lookahead.forget(&mut st, self.id);
        st.members.remove(&self.id);
    }
}

impl Drop for Lookahead {
    fn drop(&mut self) {
        let reserved = self.lock().reserved;
        self.loader.cache().release(reserved);
    }
}
