//! Batches as a stream: a rank's slice of the deterministic order, from a cursor on, with the
//! next batches prepared while the current one is consumed, and frames that later batches show
//! kept when they are decoded anyway ([`Lookahead`]).

use std::{pin::Pin, sync::Arc};

use arrow::array::RecordBatch;
use futures::{Stream, StreamExt};

use crate::{
    Loader, Result, SampleBatch,
    lookahead::{Ahead, Lookahead, Member},
    sampler::{Cursor, Draw, Order, Sharding},
};

/// A batch with the cursor it was made at (resume from [`Sharding::next`] of it): a record
/// batch, or the [`SampleBatch`] it is made from.
#[derive(Debug, Clone)]
pub struct LoadedBatch<B = RecordBatch> {
    /// Where in the order this batch is.
    pub cursor: Cursor,
    /// The samples.
    pub batch: B,
}

/// A pinned, boxed stream of batches.
pub type BatchStream = Pin<Box<dyn Stream<Item = Result<LoadedBatch>> + Send>>;

/// What to stream.
#[derive(Debug, Clone)]
pub struct StreamRequest {
    /// The order to follow.
    pub order: Arc<Order>,
    /// How ranks split it.
    pub sharding: Sharding,
    /// Where to start.
    pub start: Cursor,
    /// How many batches (None: indefinitely, across epochs).
    pub limit: Option<u64>,
    /// Global steps from one batch to the next (1: every step; `n`: one of `n` readers taking
    /// turns, such as a rank's DataLoader workers, each from its own start).
    pub stride: u64,
    /// Batches prepared ahead of the consumer (at least 1).
    pub prefetch: usize,
    /// Draws planned ahead to keep frames later batches show (0: none; see [`Lookahead`]).
    /// Kept frames live in room reserved in the loader's frame cache, at most all of it.
    pub lookahead: u64,
}

impl StreamRequest {
    /// A lookahead of this request's own over `loader` (keeping at most `cap` bytes of frames),
    /// joined by it.
    pub fn lookahead_over(&self, loader: &Arc<Loader>, cap: u64) -> Option<Member> {
        Lookahead::new(loader.clone(), self.order.clone(), self.sharding, self.lookahead, cap)?.join(self.sharding, cursors(self))
    }
}

/// The cursors a request visits, in order. Without `drop_last`, a rank whose slice of an
/// epoch's short last batch is empty gets a batch of 0 rows there, so every rank sees the same
/// cursors.
pub fn cursors(request: &StreamRequest) -> impl Iterator<Item = Cursor> + Send + 'static {
    let (sharding, epoch_len) = (request.sharding, request.order.epoch_len());
    let mut cursor = Some(request.start);
    let (limit, stride) = (request.limit, request.stride.max(1));
    std::iter::from_fn(move || {
        let c = cursor?;
        cursor = Some((0..stride).fold(c, |c, _| sharding.next(epoch_len, c)));
        Some(c)
    })
    .take(limit.map_or(usize::MAX, |l| l as usize))
}

/// Streams `request` through `loader`, with a lookahead of its own (`request.lookahead` draws,
/// with the whole frame cache for room).
pub fn stream(loader: Arc<Loader>, request: StreamRequest) -> BatchStream {
    let lookahead = request.lookahead_over(&loader, loader.cache_stats().budget);
    stream_with(loader, request, lookahead)
}

/// Streams `request` through `loader` as `member` of a lookahead (shared with the other ranks of
/// its order, say), or without one.
pub fn stream_with(loader: Arc<Loader>, request: StreamRequest, member: Option<Member>) -> BatchStream {
    let order = request.order.clone();
    let sharding = request.sharding;
    let prefetch = request.prefetch.max(1);
    let lookahead = member;
    let batches = futures::stream::iter(cursors(&request))
        .map(move |cursor| {
            let (loader, order) = (loader.clone(), order.clone());
            let ahead = lookahead.as_ref().map(|l| l.begin(cursor)).unwrap_or_default();
            async move { load_with(&loader, &order, sharding, cursor, &ahead).await }
        })
        .buffered(prefetch);
    Box::pin(batches)
}

/// The batch at `cursor` of a rank's slice (`sharding`) of `order`.
///
/// # Errors
/// When packets cannot be read or a frame cannot be decoded.
pub async fn load(loader: &Loader, order: &Order, sharding: Sharding, cursor: Cursor) -> Result<LoadedBatch> {
    load_with(loader, order, sharding, cursor, &Ahead::default()).await
}

/// [`load`] with the frames a [`Lookahead`] kept for this batch ([`Member::begin`]).
///
/// # Errors
/// As [`load`].
pub async fn load_with(loader: &Loader, order: &Order, sharding: Sharding, cursor: Cursor, ahead: &Ahead) -> Result<LoadedBatch> {
    let batch = loader.batch_with(&draws(order, sharding, cursor), ahead).await?;
    Ok(LoadedBatch { cursor, batch })
}

/// [`load_with`] with camera columns as the frames they show, shared (for a transport that
/// sends them from where they are).
///
/// # Errors
/// As [`load`].
pub async fn load_samples_with(
    loader: &Loader,
    order: &Order,
    sharding: Sharding,
    cursor: Cursor,
    ahead: &Ahead,
) -> Result<LoadedBatch<SampleBatch>> {
    let batch = loader.samples_with(&draws(order, sharding, cursor), ahead).await?;
    Ok(LoadedBatch { cursor, batch })
}

/// The draws of the batch at `cursor` of a rank's slice (`sharding`) of `order`.
fn draws(order: &Order, sharding: Sharding, cursor: Cursor) -> Vec<Draw> {
    sharding.positions(order.epoch_len(), cursor.step).map(|p| order.draw(cursor.epoch, p)).collect()
}
