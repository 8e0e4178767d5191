//! Streams that outlive their server: when the one serving a stream becomes unavailable (killed,
//! restarting, shutting down, its object store unreachable), the stream asks the next server for
//! the batches after the last one received, and once every server has failed it, waits for one
//! to answer again. Flight pools ([`crate::ServerPool`]) and local sockets
//! ([`crate::LocalLoader::with_resume_wait`]) share it.

use std::time::Duration;

use futures::{StreamExt, future::BoxFuture};

use crate::{
    Error, Result, SampleRequest,
    stream::{RemoteBatches, StreamPlan},
};

/// The first pause of a stream waiting for an unavailable lake, and the longest: pauses double.
const FIRST_PAUSE: Duration = Duration::from_millis(500);
const LONGEST_PAUSE: Duration = Duration::from_secs(5);

/// The servers a resumable stream is read from, asked in turn.
pub(crate) trait Servers: Clone + Send + Sync + 'static {
    /// How many there are (at least one).
    fn count(&self) -> usize;
    /// Server `at`, as messages name it.
    fn name(&self, at: usize) -> String;
    /// Every server, as messages name them.
    fn names(&self) -> String {
        (0..self.count()).map(|at| self.name(at)).collect::<Vec<_>>().join(", ")
    }
    /// The batches of `request` from server `at`.
    fn open(&self, at: usize, request: SampleRequest) -> BoxFuture<'static, Result<RemoteBatches>>;
}

/// A stream of `request` as `plan` planned it (pinned to the dataset versions the plan read, so
/// that every server reads those) that starts on server `first` and resumes on the next server
/// when one becomes unavailable. It ends with [`Error::Unavailable`] once every server has
/// failed it twice in a row and `wait` has passed in pauses of 0.5 s doubling up to 5 s; zero
/// gives up at once.
pub(crate) fn resumable<S: Servers>(servers: S, first: usize, request: &SampleRequest, plan: &StreamPlan, wait: Duration) -> RemoteBatches {
    let mut request = request.clone();
    if let Ok(datasets) = serde_json::from_value(plan.datasets.clone()) {
        request.datasets = datasets;
    }
    let state = Failover {
        servers,
        wait,
        request,
        steps_per_epoch: plan.steps_per_epoch.max(1),
        server: first,
        inner: None,
        failures: 0,
        waited: Duration::ZERO,
        pause: FIRST_PAUSE,
    };
    Box::pin(futures::stream::try_unfold(state, |mut state| async move {
        loop {
            if state.request.limit_batches == Some(0) {
                return Ok(None);
            }
            if state.inner.is_none() {
                match state.servers.open(state.server, state.request.clone()).await {
                    Ok(batches) => state.inner = Some(batches),
                    Err(Error::Unavailable(why)) => {
                        state.moved(why).await?;
                        continue;
                    }
                    Err(e) => return Err(e),
                }
            }
            match state.inner.as_mut().expect("opened above").next().await {
                Some(Ok(batch)) => {
                    state.advance();
                    (state.failures, state.waited, state.pause) = (0, Duration::ZERO, FIRST_PAUSE);
                    return Ok(Some((batch, state)));
                }
                Some(Err(Error::Unavailable(why))) => {
                    state.inner = None;
                    state.moved(why).await?;
                }
                Some(Err(e)) => return Err(e),
                None => return Ok(None),
            }
        }
    }))
}

/// A resumable stream's state: the request from the next batch on, and where it is served.
struct Failover<S> {
    servers: S,
    wait: Duration,
    request: SampleRequest,
    steps_per_epoch: u64,
    server: usize,
    inner: Option<RemoteBatches>,
    /// Servers that failed the stream since its last batch, or its last pause.
    failures: usize,
    /// Time paused since its last batch, and the next pause.
    waited: Duration,
    pause: Duration,
}

impl<S: Servers> Failover<S> {
    /// The request's cursor past one more batch: `step_stride` steps on, epochs wrapping.
    fn advance(&mut self) {
        let at = self.request.epoch * self.steps_per_epoch + self.request.start_step + self.request.step_stride.max(1);
        (self.request.epoch, self.request.start_step) = (at / self.steps_per_epoch, at % self.steps_per_epoch);
        if let Some(left) = self.request.limit_batches.as_mut() {
            *left -= 1;
        }
    }

    /// Moves to the next server after `why`; once every server failed twice in a row, pauses
    /// first, or gives up when the pause would pass the resume wait.
    async fn moved(&mut self, why: String) -> Result<()> {
        self.failures += 1;
        if self.failures >= 2 * self.servers.count() {
            let servers = self.servers.names();
            if self.waited + self.pause > self.wait {
                let waited = if self.wait.is_zero() { String::new() } else { format!(", and none took it again within {:?}", self.wait) };
                return Err(Error::Unavailable(format!("every server of {servers} failed the stream{waited} (last: {why})")));
            }
            tracing::warn!(%servers, %why, pause = ?self.pause, "every server unavailable; the stream resumes when one answers");
            tokio::time::sleep(self.pause).await;
            (self.waited, self.pause, self.failures) = (self.waited + self.pause, (self.pause * 2).min(LONGEST_PAUSE), 0);
        } else if self.servers.count() > 1 {
            tracing::warn!(from = %self.servers.name(self.server), %why, "server unavailable; resuming the stream on the next one");
        }
        self.server = (self.server + 1) % self.servers.count();
        Ok(())
    }
}
