//! Where a run's batches and its dataset facts come from.
//!
//! Batches come from the in-process loader, or from a running `lake serve` over Arrow Flight or
//! shared memory: the same sampling request gives the same batches on every path. The dataset
//! facts a policy is built from (fps, features, normalisation statistics) are read from the lake
//! itself in every case, so a trainer fed by a server also reads the lake's catalog.

use std::{path::PathBuf, pin::Pin, sync::Arc};

use arrow::{array::RecordBatch, datatypes::SchemaRef};
use futures::{Stream, TryStreamExt};
use lake_client::SampleRequest;
use lake_loader::{Cursor, Loader, LoaderOptions, Order, Sharding, StreamRequest, Windows, views};
use lake_store::Lake;
use serde_json::Value;

use crate::{DatasetFeature, Error, Result, Stats};

/// Where batches come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchSource {
    /// The loader, in this process.
    InProcess,
    /// `lake serve` over Arrow Flight (`http://HOST:PORT`; `grpc://` is read as `http://`), or
    /// several servers over one lake, comma-separated: the run's stream moves to another when
    /// its server becomes unavailable and resumes where it stopped.
    Flight {
        /// The servers' Flight addresses, comma-separated.
        url: String,
        /// Bearer token, when the server asks for one.
        token: Option<String>,
        /// How long the stream waits for a server to take it again once every server is
        /// unavailable ([`lake_client::ServerPool::with_resume_wait`]).
        resume_wait: std::time::Duration,
    },
    /// `lake serve --local PATH`: shared memory on this machine. The run's stream waits out
    /// the server's restarts and resumes where it stopped.
    Local {
        /// The server's Unix socket.
        path: PathBuf,
        /// Bearer token, when the server asks for one.
        token: Option<String>,
        /// How long the stream waits for the server to take it again
        /// ([`lake_client::LocalLoader::with_resume_wait`]).
        resume_wait: std::time::Duration,
    },
}

/// Record batches, one row per sample, in the order of the request.
pub type Batches = Pin<Box<dyn Stream<Item = Result<RecordBatch>> + Send>>;

/// A request's batches with the shape of its epochs.
pub struct Feed {
    /// The batches' schema.
    pub schema: SchemaRef,
    /// Global steps in an epoch: a run's step `k` is step `k % steps_per_epoch` of epoch
    /// `k / steps_per_epoch`.
    pub steps_per_epoch: u64,
    /// The batches, from the request's `(epoch, start_step)` on, across epochs.
    pub batches: Batches,
}

impl std::fmt::Debug for Feed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Feed").field("steps_per_epoch", &self.steps_per_epoch).finish_non_exhaustive()
    }
}

fn data(e: impl std::fmt::Display) -> Error {
    Error::Data(e.to_string())
}

/// The windows of a request: its `delta_timestamps`, or none.
fn windows(request: &SampleRequest) -> Result<Windows> {
    match &request.delta_timestamps {
        Some(v) => Windows::from_json(v).map_err(data),
        None => Ok(Windows::Preset(lake_loader::Preset::None)),
    }
}

fn spec(request: &SampleRequest) -> views::SamplingSpec {
    views::SamplingSpec {
        datasets: request
            .datasets
            .iter()
            .map(|d| match d {
                lake_client::DatasetRef::Name(n) => n.clone(),
                lake_client::DatasetRef::Weighted { name, weight } => format!("{name}={weight}"),
            })
            .collect(),
        episodes: request.episodes.clone(),
        drop_n_first_frames: request.drop_n_first_frames,
        drop_n_last_frames: request.drop_n_last_frames,
        frame_size: request.frame_size,
        frame_format: request.frame_format,
        proxy: request.proxy,
    }
}

impl Feed {
    /// This feed with its packet batches (`frame_format: packets`) decoded by `decoder`, off the
    /// async threads: the batches the frame path would have sent, and their schema.
    ///
    /// # Errors
    /// [`Error::Data`] when the feed's schema is not one of packet batches the decoder reads.
    pub fn decoded(self, decoder: Arc<lake_loader::PacketBatchDecoder>) -> Result<Self> {
        let decoded_already = self.schema.fields().iter().find(|f| {
            f.metadata().contains_key(lake_loader::LAYOUT) && f.metadata().get(lake_loader::PIXEL_FORMAT).is_none_or(|p| p != "packets")
        });
        if let Some(camera) = decoded_already {
            return Err(Error::Data(format!(
                "camera `{}` arrives decoded ({}), and this run decodes packets: the source ignored `frame_format: packets`",
                camera.name(),
                camera.metadata().get(lake_loader::PIXEL_FORMAT).map_or("rgb24", String::as_str)
            )));
        }
        let schema = decoder.decoded_schema(&self.schema).map_err(data)?;
        let batches = self.batches.and_then(move |batch| {
            let decoder = decoder.clone();
            async move {
                tokio::task::spawn_blocking(move || decoder.decode(&batch).map_err(data))
                    .await
                    .map_err(|e| Error::Data(format!("the packet decoder stopped: {e}")))?
            }
        });
        Ok(Self { schema, steps_per_epoch: self.steps_per_epoch, batches: Box::pin(batches) })
    }
}

/// Opens the batches of `request` (checked first) from `source`; `lake` serves the in-process
/// loader.
///
/// # Errors
/// [`Error::Data`]: the request refused (by the loader or the server, with its message), the
/// server unreachable, the lake unreadable.
pub async fn open_feed(lake: Option<&Lake>, request: &SampleRequest, source: &BatchSource, options: LoaderOptions) -> Result<Feed> {
    request.check().map_err(data)?;
    match source {
        BatchSource::InProcess => {
            let lake = lake.ok_or_else(|| Error::Run("batches in process are read from the lake, and there is none here".into()))?;
            let sampling = views::open_sampling(lake, &spec(request)).await.map_err(data)?;
            let loader = Arc::new(Loader::new(sampling.datasets, &windows(request)?, options).map_err(data)?);
            let order = if request.shuffle { Order::new(request.seed, sampling.sources) } else { Order::in_sequence(sampling.sources) };
            let order = Arc::new(order.map_err(data)?);
            let sharding = Sharding::new(request.batch_size * request.world_size, request.rank, request.world_size, request.drop_last)
                .map_err(data)?;
            let steps_per_epoch = sharding.steps_per_epoch(order.epoch_len());
            if steps_per_epoch == 0 {
                return Err(Error::Data(format!(
                    "the global batch of {} is larger than the {} samples of an epoch",
                    request.batch_size * request.world_size,
                    order.epoch_len()
                )));
            }
            let stream = StreamRequest {
                order,
                sharding,
                start: Cursor { epoch: request.epoch, step: request.start_step },
                limit: request.limit_batches,
                stride: request.step_stride,
                prefetch: 2,
                lookahead: lake_loader::DEFAULT_HORIZON,
            };
            let schema = loader.schema();
            let batches = lake_loader::stream(loader, stream).map_ok(|b| b.batch).map_err(data);
            Ok(Feed { schema, steps_per_epoch, batches: Box::pin(batches) })
        }
        BatchSource::Flight { url, token, resume_wait } => {
            let servers = pool(url, token)?.with_resume_wait(*resume_wait);
            let plan = servers.describe(request).await.map_err(data)?;
            let batches = servers.stream(request).await.map_err(data)?.map_err(data);
            Ok(Feed { schema: plan.schema, steps_per_epoch: plan.steps_per_epoch, batches: Box::pin(batches) })
        }
        BatchSource::Local { path, token, resume_wait } => {
            let client = lake_client::LocalLoader::new(path, token.clone()).with_resume_wait(*resume_wait);
            let plan = client.describe(request).await.map_err(data)?;
            let batches = client.stream(request).await.map_err(data)?.map_err(data);
            Ok(Feed { schema: plan.schema, steps_per_epoch: plan.steps_per_epoch, batches: Box::pin(batches) })
        }
    }
}

/// What a policy is built from: the datasets' frame rate, features and statistics.
#[derive(Debug, Clone)]
pub struct DatasetFacts {
    /// Frames per second (every dataset's; a mixture of rates is refused).
    pub fps: f64,
    /// The first dataset's features, as LeRobot's `dataset_to_policy_features` sees them,
    /// cameras that ingest left out removed.
    pub features: Vec<DatasetFeature>,
    /// The first dataset's other features, which no policy sees (LeRobot's names decide:
    /// `action`, `observation.*`, and cameras), less the bookkeeping columns.
    pub unused: Vec<String>,
    /// Statistics over the steps sampled, in LeRobot's `stats.json` layout (a mixture's
    /// combined as LeRobot's `aggregate_stats` combines them).
    pub stats: Value,
    /// The sampled datasets, `NAME@VERSION`.
    pub datasets: Vec<String>,
}

/// The facts of the datasets a request samples: from the server that serves the batches
/// (`--server`: the trainer need not read the lake), else read from the lake.
///
/// # Errors
/// [`Error::Data`] for a dataset that is not there, unreadable statistics or a server that
/// refused; [`Error::Features`] for a mixture whose features or rates differ; [`Error::Run`]
/// without a lake where the facts must be read from one.
pub async fn dataset_facts(lake: Option<&Lake>, request: &SampleRequest, source: &BatchSource) -> Result<DatasetFacts> {
    let facts = match (source, lake) {
        (BatchSource::Flight { url, token, .. }, _) => {
            let json = pool(url, token)?.sampling_facts(request).await.map_err(data)?;
            serde_json::from_value::<lake_stats::SamplingFacts>(json)
                .map_err(|e| Error::Data(format!("{url}: facts that do not parse: {e}")))?
        }
        (_, Some(lake)) => lake_stats::sampling_facts(lake, &spec(request)).await.map_err(|e| match e {
            lake_stats::Error::Invalid(m) => Error::Features(m),
            other => data(other),
        })?,
        (_, None) => return Err(Error::Run("the datasets' facts are read from the lake, and there is none here".into())),
    };
    let features = DatasetFeature::from_info_json(&serde_json::json!({ "features": facts.features }))?;
    const BOOKKEEPING: [&str; 5] = ["timestamp", "frame_index", "episode_index", "index", "task_index"];
    let unused = facts
        .features
        .as_object()
        .into_iter()
        .flat_map(|all| all.keys())
        .filter(|name| !BOOKKEEPING.contains(&name.as_str()) && !features.iter().any(|f| &f.name == *name))
        .cloned()
        .collect();
    Ok(DatasetFacts { fps: facts.fps, features, unused, stats: facts.stats, datasets: facts.datasets })
}

/// The statistics an ACT policy normalises with: the numeric features' mean and std (and min
/// and max) from the lake, and ImageNet's mean and std for cameras, as lerobot-train uses by
/// default.
///
/// # Errors
/// [`Error::Stats`] for statistics that are not numbers.
pub fn policy_stats(facts: &DatasetFacts) -> Result<Stats> {
    let mut stats = Stats::from_stats_json(&facts.stats)?;
    for f in facts.features.iter().filter(|f| f.kind == crate::FeatureType::Visual) {
        stats.set_imagenet(&f.name);
    }
    Ok(stats)
}

/// The servers at `urls` (comma-separated, each `grpc://HOST:PORT` or `http://…`).
fn pool(urls: &str, token: &Option<String>) -> Result<lake_client::ServerPool> {
    let urls = urls
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(|url| url.strip_prefix("grpc://").map_or_else(|| url.to_string(), |rest| format!("http://{rest}")));
    lake_client::ServerPool::new(urls, token.clone()).map_err(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A view that maps two datasets' features (cut to 6 dimensions, cameras left out) gives
    /// the trainer the mapped features and statistics: the policy sees what the samples carry.
    #[test]
    fn a_mapped_views_facts_are_what_its_samples_carry() {
        tokio::runtime::Runtime::new().expect("runtime").block_on(async {
            let dir = tempfile::tempdir().expect("tmp");
            let lake = Lake::create(dir.path().join("lake").to_str().expect("utf-8")).expect("lake");
            let testdata = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/lerobot/");
            for name in ["v30-images-tiny", "v30-h264-multifile"] {
                let progress = lake_ingest::Progress::default();
                lake_ingest::ingest(&lake, &format!("{testdata}{name}"), &Default::default(), &progress).await.expect("ingested");
            }
            let cut = lake_schemas::FeatureMap {
                dims: [("observation.state".to_string(), vec![0, 1, 2, 3, 4, 5]), ("action".to_string(), vec![5, 4, 3, 2, 1, 0])].into(),
                drop: vec!["observation.images.front".into(), "observation.images.wrist".into(), "observation.images.side".into()],
                ..Default::default()
            };
            let drop_front = lake_schemas::FeatureMap { drop: vec!["observation.images.front".into()], ..Default::default() };
            let mut datasets = Vec::new();
            for (name, features) in [("v30-h264-multifile", cut), ("v30-images-tiny", drop_front)] {
                let record = lake.resolve(name).await.expect("a dataset");
                let episodes = (0..record.counts.episodes as i64).collect();
                datasets.push(lake_schemas::ViewDataset { name: name.into(), version: record.version, weight: 1.0, episodes, features });
            }
            let view = lake_schemas::ViewRecord {
                name: "mix".into(),
                version: 0,
                dropped: false,
                sql: "(written by the test)".into(),
                created_at: chrono::Utc::now(),
                lake_versions: Vec::new(),
                datasets,
                digest: None,
            };
            lake.put_view(&view, false).await.expect("view stored");

            let facts = dataset_facts(Some(&lake), &SampleRequest::new(["mix"]), &BatchSource::InProcess)
                .await
                .expect("facts of the mapped mixture");
            let shapes: Vec<(String, Vec<usize>)> = facts.features.iter().map(|f| (f.name.clone(), f.shape.clone())).collect();
            assert_eq!(shapes, [("observation.state".to_string(), vec![6]), ("action".to_string(), vec![6])], "{shapes:?}");
            let stats = async |name: &str| {
                let record = lake.resolve(name).await.expect("a dataset");
                lake_stats::stats_json(&lake, &record, None).await.expect("stats")
            };
            let (multifile, tiny) = (stats("v30-h264-multifile").await, stats("v30-images-tiny").await);
            let max = |stats: &Value, key: &str, d: usize| stats[key]["max"][d].as_f64().expect("a number");
            // The cut reverses the first six action dimensions: the mixture's action[0] is
            // dimension 5 of one dataset's and dimension 0 of the other's.
            assert_eq!(max(&facts.stats, "action", 0), max(&multifile, "action", 5).max(max(&tiny, "action", 0)), "{}", facts.stats);
            assert_eq!(
                max(&facts.stats, "observation.state", 2),
                max(&multifile, "observation.state", 2).max(max(&tiny, "observation.state", 2))
            );
            assert!(facts.stats.get("observation.images.front").is_none(), "{}", facts.stats);
        });
    }
}
