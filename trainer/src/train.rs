//! `lake train`: LeRobot's ACT or Diffusion Policy trained on a lake's samples, with
//! lerobot-train's update step and checkpoints in its layout.
//!
//! A run is a function of its options: the sample order is the lake's (seed, epoch, step), and
//! libtorch's generator is seeded from `(seed, step)` before every step, so dropout, the VAE's
//! ε and Diffusion's noise, steps and crop at step `k` do not depend on what ran before. The
//! image transforms' draws are a function of `(seed, step)` and each sample's place in the
//! step's batch over all ranks ([`crate::ImageTransforms::draw`]). A run resumed from a
//! checkpoint therefore repeats the uninterrupted run's steps bit for bit (on the CPU).
//!
//! Files under the run's directory:
//! - `checkpoints/STEP/{pretrained_model, training_state}` as lerobot-train writes them, plus
//!   `training_state/lake_run.json` (the run's seed, batch, datasets and the next step);
//!   `checkpoints/last` links the newest;
//! - `train_log.jsonl`: one line per step (loss, L1, KL, gradient norm, data wait, step time);
//! - `train_log.svg`: the loss and the share of each step spent waiting for data, redrawn at
//!   every checkpoint;
//! - `events.out.tfevents.*`: the same scalars for TensorBoard, one file per process
//!   ([`crate::events`]).
//!
//! Batches are read, made into tensors and copied to the device by a task of their own, one
//! batch ahead of the step that takes it ([`Prefetch`]), image transforms included.
//! [`feed_only`] runs the same data path
//! without a model: its steps only take their batches, which measures what the data side can
//! give a device.

use std::{
    io::Write as _,
    path::{Path, PathBuf},
    sync::Arc,
    time::Instant,
};

use arrow::{
    array::{Array, ArrayRef, AsArray, RecordBatch},
    datatypes::{DataType, Float32Type, Float64Type, Int64Type, UInt8Type},
};
use futures::StreamExt;
use lake_client::SampleRequest;
use lake_loader::LoaderOptions;
use lake_store::Lake;
use serde_json::{Value, json};
use tch::{Device, Kind, Tensor};

use crate::{
    ActConfig, Error, FeatureType, ImageTransforms, ImageTransformsConfig, OBS_ENV_STATE, OBS_STATE, Result, TransformFrames,
    act::{ActBatch, PolicyOptions, bf16_autocast},
    collective::{Collective, all_reduce_host, average_gradients, broadcast, ranks_apart},
    data::{BatchSource, DatasetFacts, Feed, dataset_facts, open_feed, policy_stats},
    loss::PaddedActions,
    optim::Adam,
    policy::{Batch, Policy, PolicyConfig, diffusion_batch},
};

/// The file in a checkpoint's `training_state/` that holds what lake needs to resume.
pub const RUN_FILE: &str = "lake_run.json";
pub use crate::run_log::{EVAL_FILE, EvalRecord, FEED_LOG_FILE, FeedRecord, LOG_FILE, PLOT_FILE, StepRecord};

/// What to train, from what, for how long, and where to write.
pub struct TrainOptions {
    /// The lake: batches in process and with local streams, and the datasets' facts but with
    /// `--server`, whose server gives them (a trainer on another machine needs no lake).
    pub lake: Option<Lake>,
    /// Datasets or views, `NAME[=WEIGHT]`.
    pub datasets: Vec<String>,
    /// Where batches come from.
    pub source: BatchSource,
    /// The policy's config; its features are the datasets'.
    pub config: PolicyConfig,
    /// Steps to have run when the run ends (a resumed run counts the steps before it).
    pub steps: u64,
    /// Samples per step.
    pub batch_size: u64,
    /// Seed of the sample order and of libtorch's generator.
    pub seed: u64,
    /// Device of the model.
    pub device: Device,
    /// The parameters' dtype: `Float` (LeRobot's), or `Double` (checkpoints stay f32).
    pub kind: Kind,
    /// bfloat16 mixed precision: the forward passes run under autocast (as lerobot-train's
    /// `bf16`), while parameters, optimizer state and checkpoints stay in `kind`.
    pub bf16: bool,
    /// The run's directory.
    pub out: PathBuf,
    /// Continue from `out/checkpoints/last`.
    pub resume: bool,
    /// A checkpoint every this many steps (0: only at the end).
    pub save_every: u64,
    /// Start from this checkpoint's weights (LeRobot's or lake's), keeping the lake's statistics.
    pub init_from: Option<PathBuf>,
    /// ResNet-18 weights (torchvision's `.pth`, or safetensors with its names) to start the
    /// backbone from; torchvision's cached download of the weights the config names otherwise.
    pub backbone_weights: Option<PathBuf>,
    /// How the loss counts the actions of a chunk that ran past its episode's end.
    pub padded_actions: PaddedActions,
    /// The in-process loader's threads and frame cache.
    pub loader: LoaderOptions,
    /// The ranks of a data-parallel run (`batch_size` is each rank's); `None` for one process.
    pub collective: Option<Box<dyn Collective>>,
    /// Held-out evaluations during the run; `None` for none.
    pub eval: Option<EvalOptions>,
    /// How camera frames travel and where they become RGB.
    pub frames: Frames,
    /// Where camera frames are decoded.
    pub decode: Decode,
    /// Every camera's frames from each dataset's training proxy (`lake cache NAME --proxy
    /// CODEC`), not the recorded ones.
    pub proxy: bool,
    /// Every camera's frames at this size, resized as lake's frame tables resize them, and the
    /// policy's camera features of this size; `None` for the recorded size. Where the data side
    /// decodes ([`Decode::Server`]) they come from a frame table of the size (`lake cache NAME
    /// --size WxH`); where this process decodes, they are resized here after decoding, to the
    /// same bytes: by the packet decoder on the CPU, by lake-gpu's kernel on the GPU.
    pub frame_size: Option<lake_loader::FrameSize>,
    /// LeRobot's image transforms on each sample's camera frames as it enters a step (not in
    /// held-out evaluations); `None`, or a config that is not enabled, for none.
    pub image_transforms: Option<ImageTransformsConfig>,
    /// The frames the image transforms are handed, as LeRobot 0.6.1 (uint8) or 0.4.4 (float)
    /// hands them over.
    pub transform_frames: TransformFrames,
}

/// How a run's camera frames travel and where they become RGB. Both give the policy the same
/// bytes: the conversion of the planes is the loader's, to the bit.
#[derive(Debug, Clone, Default)]
pub enum Frames {
    /// RGB24, converted on the data side (the loader, or the server).
    #[default]
    Rgb24,
    /// The decoder's YUV 4:2:0 planes where a camera allows them (8-bit 4:2:0 video; half the
    /// bytes of RGB), converted here: by lake-gpu's kernel on `gpu`, straight into the batch's
    /// tensor on the device, or by its CPU twin when `gpu` is `None`.
    Yuv420p {
        /// The GPU that converts; `None` for the CPU.
        gpu: Option<std::sync::Arc<lake_gpu::Gpu>>,
    },
}

/// Where a run's camera frames are decoded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Decode {
    /// By the data side (the in-process loader, or the server): frames travel decoded, as
    /// [`Frames`] says.
    #[default]
    Server,
    /// Here, on the CPU: each camera's compressed packets travel (a small part of the frames'
    /// bytes, and the server only reads them), and `threads` decode them (0: one per core) into
    /// the frames the server would have sent, RGB or, with [`Frames::Yuv420p`], planes.
    Cpu {
        /// Decode threads (0: one per core).
        threads: usize,
    },
    /// On the GPU that converts the run's frames ([`Frames::Yuv420p`] with a GPU): each
    /// camera's packets travel, NVDEC decodes them where the stream allows and the CPU into
    /// planes elsewhere, and lake-gpu's kernel makes the RGB in the batch's tensor
    /// ([`crate::gpu_decode`]).
    Gpu,
}

/// Held-out evaluation: every `every` steps and at the end, the policy's loss in eval mode (no
/// dropout, no VAE sampling: ACT's L1 alone) over the samples of `datasets` that `batches`
/// says, the same at every evaluation.
#[derive(Debug, Clone, PartialEq)]
pub struct EvalOptions {
    /// Datasets or views held out from training, `NAME[=WEIGHT]`.
    pub datasets: Vec<String>,
    /// Steps between evaluations (0: only at the end).
    pub every: u64,
    /// The samples each evaluation covers.
    pub batches: EvalBatches,
}

/// The samples a held-out evaluation covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvalBatches {
    /// The first `n` batches (of the run's batch size, per rank) of the datasets' shuffle with
    /// the run's seed, weights mixing them as in training.
    First(u64),
    /// Every eligible step once, in the order recorded, the last batch short: the loss of the
    /// whole held-out set. Weights have no part in it and are refused.
    All,
}

impl std::str::FromStr for EvalBatches {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "all" => Ok(EvalBatches::All),
            _ => match s.parse::<u64>() {
                Ok(n) if n > 0 => Ok(EvalBatches::First(n)),
                _ => Err(format!(
                    "{s:?} is not a count of held-out batches: a whole number above 0, or `all` for every held-out sample once"
                )),
            },
        }
    }
}

impl std::fmt::Debug for TrainOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrainOptions")
            .field("datasets", &self.datasets)
            .field("source", &self.source)
            .field("steps", &self.steps)
            .field("batch_size", &self.batch_size)
            .field("seed", &self.seed)
            .field("padded_actions", &self.padded_actions)
            .field("out", &self.out)
            .field("resume", &self.resume)
            .field("ranks", &self.collective.as_ref().map_or(1, |c| c.size()))
            .field("frames", &self.frames)
            .field("decode", &self.decode)
            .field("proxy", &self.proxy)
            .field("image_transforms", &self.image_transforms.as_ref().is_some_and(|t| t.enable))
            .field("transform_frames", &self.transform_frames)
            .finish_non_exhaustive()
    }
}

/// What a run did.
#[derive(Debug, Clone)]
pub struct Summary {
    /// The step the run started after (0 for a new run).
    pub started_after: u64,
    /// The last step run.
    pub last_step: u64,
    /// Mean loss of the first [`Summary::loss_steps`] steps of this process.
    pub first_loss: f64,
    /// Mean loss of the last [`Summary::loss_steps`] steps of this process.
    pub last_loss: f64,
    /// Steps in each of those means: ten, or half the steps run when fewer than twenty ran,
    /// so that the two never share a step (one when a single step ran).
    pub loss_steps: usize,
    /// Share of the step time spent waiting for batches.
    pub data_wait: f64,
    /// Samples per second over the run, every rank's.
    pub samples_per_s: f64,
    /// The last checkpoint written.
    pub checkpoint: PathBuf,
    /// The datasets sampled, `NAME@VERSION`.
    pub datasets: Vec<String>,
    /// This process's held-out evaluations.
    pub evals: Vec<EvalRecord>,
    /// CPU seconds this process spent over the steps, every thread's: the model's and, in
    /// process, the loader's.
    pub cpu_s: f64,
    /// The file the camera backbones started from: `--backbone-weights`, or torchvision's
    /// cached download of the weights the config names.
    pub backbone_weights: Option<PathBuf>,
}

/// What a checkpoint records for a resume, besides LeRobot's files.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct RunState {
    datasets: Vec<String>,
    sampled: Vec<String>,
    seed: u64,
    /// Samples per step over every rank: a resume may change the world size, not this.
    global_batch: u64,
    steps_per_epoch: u64,
    next_step: u64,
    /// Absent from the checkpoints of runs that counted them as zero, before the choice.
    #[serde(default = "counted_as_zero")]
    padded_actions: PaddedActions,
    /// The file the camera backbones started from, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    backbone_weights: Option<PathBuf>,
    /// The image transforms of the run's steps, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    image_transforms: Option<ImageTransformsConfig>,
    /// The frames the image transforms were handed, with transforms. Absent from the checkpoints
    /// of runs that handed them float frames, before the choice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    transform_frames: Option<TransformFrames>,
}

impl RunState {
    /// The frames this run's image transforms were handed; `None` without transforms.
    fn transformed_frames(&self) -> Option<TransformFrames> {
        self.image_transforms.as_ref().map(|_| self.transform_frames.unwrap_or(TransformFrames::Float))
    }
}

/// How runs counted padded actions before [`TrainOptions::padded_actions`].
fn counted_as_zero() -> PaddedActions {
    PaddedActions::Zero
}

/// The generator's seed for step `step` of a run seeded `seed` (SplitMix64 of both).
fn step_seed(seed: u64, step: u64) -> i64 {
    crate::seeds::mix64(seed ^ step.wrapping_mul(crate::seeds::GOLDEN)) as i64 & i64::MAX
}

/// The generator's seed for step `step` on rank `rank`: rank 0 draws as a single process does,
/// and the other ranks draw apart from it.
fn rank_step_seed(seed: u64, rank: u64, step: u64) -> i64 {
    step_seed(seed ^ rank.wrapping_mul(0xD1B5_4A32_D192_ED03), step)
}

/// A checkpoint's directory name: the step, zero-padded as lerobot-train pads it.
pub fn step_name(step: u64, total: u64) -> String {
    let width = total.to_string().len().max(6);
    format!("{step:0width$}")
}

/// This rank and the number of ranks.
fn ranks(options: &TrainOptions) -> (u64, u64) {
    options.collective.as_ref().map_or((0, 1), |c| (c.rank(), c.size()))
}

/// The run's sampling request for this rank, before its windows are known, and the facts of the
/// datasets it samples.
async fn plan(options: &TrainOptions) -> Result<(SampleRequest, DatasetFacts)> {
    let (rank, world) = ranks(options);
    let mut request = SampleRequest::new(options.datasets.iter().cloned());
    (request.seed, request.batch_size, request.rank, request.world_size) = (options.seed, options.batch_size, rank, world);
    request.proxy = options.proxy;
    let mut facts = dataset_facts(options.lake.as_ref(), &request, &options.source).await?;
    if let Some(size) = options.frame_size {
        for camera in facts.features.iter_mut().filter(|f| f.kind == FeatureType::Visual) {
            camera.shape = vec![3, size.height as usize, size.width as usize];
        }
    }
    Ok((request, facts))
}

/// The windows a policy of `config` reads, with frames as `options` say.
fn ask_for(request: &mut SampleRequest, config: &PolicyConfig, fps: f64, options: &TrainOptions) {
    request.delta_timestamps = Some(delta_timestamps_json(config, fps));
    request.drop_n_last_frames = config.drop_n_last_frames();
    // Frames at another size come from a frame table where the data side decodes; where this
    // process decodes, the packets come at the recorded size and are resized here.
    request.frame_size = options.frame_size.filter(|_| options.decode == Decode::Server);
    request.frame_format = match (options.decode, &options.frames) {
        (Decode::Cpu { .. } | Decode::Gpu, _) => lake_client::FrameFormat::Packets,
        (Decode::Server, Frames::Rgb24) => lake_client::FrameFormat::Rgb24,
        (Decode::Server, Frames::Yuv420p { .. }) => lake_client::FrameFormat::Yuv420p,
    };
}

/// The batches of `request` for a run of `options`: its packets decoded here when the run
/// decodes them.
async fn open_frames(options: &TrainOptions, request: &SampleRequest) -> Result<Feed> {
    let feed = open_feed(options.lake.as_ref(), request, &options.source, options.loader).await?;
    match options.decode {
        // Packets of a GPU run are decoded where their tensors are made (`camera_tensor`).
        Decode::Server | Decode::Gpu => Ok(feed),
        Decode::Cpu { threads } => {
            let format = match options.frames {
                Frames::Rgb24 => lake_client::FrameFormat::Rgb24,
                Frames::Yuv420p { .. } => lake_client::FrameFormat::Yuv420p,
            };
            let mut decoder = lake_loader::PacketBatchDecoder::new(format, threads).map_err(|e| Error::Data(e.to_string()))?;
            if let Some(size) = options.frame_size {
                decoder = decoder.resizing_to(size).map_err(|e| Error::Data(e.to_string()))?;
            }
            feed.decoded(std::sync::Arc::new(decoder))
        }
    }
}

/// Batches made into a policy's tensors on its device by a task of their own, ahead of the steps
/// that take them: while a step runs, the next batches are read, converted and copied (from
/// pinned memory to a GPU). One batch waits ready and [`batches_in_making`] are in the making;
/// dropping this stops the task and the feed.
pub struct Prefetch {
    ready: tokio::sync::mpsc::Receiver<Result<Batch>>,
    task: tokio::task::JoinHandle<()>,
}

/// Batches made at once for a policy on `device`: two on the CPU, where one batch's conversion
/// and image transforms leave a core idle in their serial parts
/// (docs/decisions/0039-two-batches-in-the-making-on-the-cpu.md); one on a GPU, whose launches
/// queue on its stream.
pub fn batches_in_making(device: Device) -> usize {
    if device == Device::Cpu { 2 } else { 1 }
}

/// A run's image transforms and what their draws are keyed by, besides the step.
#[derive(Debug, Clone)]
pub struct Augment {
    /// The transforms.
    pub transforms: Arc<ImageTransforms>,
    /// The run's seed.
    pub seed: u64,
    /// The place of this rank's first sample in a step's batch over all ranks.
    pub first_position: u64,
}

impl Prefetch {
    /// Starts taking `feed`'s batches for a policy of `config` on `device`, with camera frames as
    /// `frames` says and, with `augment`, transformed with the draws of their steps, the first
    /// batch's being `first_step`. The batches come in the feed's order whichever is made first.
    /// Needs a tokio runtime: the conversion runs on its blocking threads.
    pub fn start(feed: Feed, config: PolicyConfig, device: Device, frames: Frames, augment: Option<Augment>, first_step: u64) -> Self {
        let (tx, ready) = tokio::sync::mpsc::channel(1);
        let making = Arc::new((config, frames, augment));
        let mut made = feed
            .batches
            .enumerate()
            .map(move |(i, batch)| {
                let making = making.clone();
                let step = first_step + i as u64;
                async move {
                    let b = batch?;
                    let make = move || {
                        let (config, frames, augment) = &*making;
                        let batch = make_batch(&b, config, frames)?.to_device(device)?;
                        match augment {
                            Some(a) => {
                                crate::image_transforms::apply::transform_batch(&a.transforms, batch, a.seed, step, a.first_position)
                            }
                            None => Ok(batch),
                        }
                    };
                    tokio::task::spawn_blocking(make).await.map_err(|e| Error::Data(format!("making step {step}'s batch: {e}")))?
                }
            })
            .buffered(batches_in_making(device));
        let task = tokio::spawn(async move {
            while let Some(made) = made.next().await {
                let failed = made.is_err();
                if tx.send(made).await.is_err() || failed {
                    break;
                }
            }
        });
        Prefetch { ready, task }
    }

    /// The next batch; `None` once the feed has ended.
    pub async fn next(&mut self) -> Option<Result<Batch>> {
        self.ready.recv().await
    }
}

impl Drop for Prefetch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl std::fmt::Debug for Prefetch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prefetch").field("ready", &self.ready.len()).finish_non_exhaustive()
    }
}

/// The image transforms `options` ask for, checked; `None` when they do nothing.
fn run_transforms(options: &TrainOptions) -> Result<Option<ImageTransforms>> {
    let transforms = options.image_transforms.as_ref().map(ImageTransforms::new).transpose()?.flatten();
    Ok(transforms.map(|t| t.on(options.transform_frames)))
}

/// Refuses image transforms for a policy that reads no camera: they would change nothing.
fn with_cameras(transforms: Option<&ImageTransforms>, config: &PolicyConfig) -> Result<()> {
    if transforms.is_some() && config.image_features().is_empty() {
        return Err(Error::Run("image transforms: the policy reads no camera, so they would change nothing; train without them".into()));
    }
    Ok(())
}

/// Trains as `options` say, calling `on_step` after each step and `on_eval` after each held-out
/// evaluation. A fresh run starts its camera backbones from `backbone_weights`, or from
/// torchvision's cached download of the weights the config names ([`torchvision_cache`]).
///
/// # Errors
/// [`Error::InvalidConfig`] for a config naming backbone weights that no file holds;
/// [`Error::Run`] for a resume without a checkpoint or with other options than the run's;
/// [`Error::Data`] when batches cannot be had; [`Error::Features`] for datasets ACT cannot train
/// on; [`Error::Io`] when the run's directory cannot be written.
pub async fn train(options: TrainOptions, mut on_step: impl FnMut(&StepRecord), mut on_eval: impl FnMut(&EvalRecord)) -> Result<Summary> {
    let (rank, world) = ranks(&options);
    let global_batch = options.batch_size * world;
    let (mut request, facts) = plan(&options).await?;
    // Checked before anything is read or written; recorded only when they do something.
    let transforms = run_transforms(&options)?;
    let image_transforms = transforms.as_ref().and(options.image_transforms.clone());
    let transform_frames = transforms.as_ref().map(ImageTransforms::frames);
    let policy_options =
        PolicyOptions { device: options.device, kind: options.kind, backbone_weights: None, padded_actions: options.padded_actions };
    let checkpoints = options.out.join("checkpoints");
    let (policy, mut optimizer, started_after, backbone_weights) = if options.resume {
        let last = checkpoints.join("last");
        let dir = std::fs::canonicalize(&last)
            .map_err(|_| Error::Run(format!("--resume: {} does not exist; start the run without --resume", last.display())))?;
        let run: RunState = read_json(&dir.join("training_state").join(RUN_FILE))?;
        if run.image_transforms != image_transforms {
            let json = |t: &ImageTransformsConfig| serde_json::to_string(t).expect("JSON to memory");
            let differ = match (&run.image_transforms, &image_transforms) {
                (Some(_), None) => "with image transforms; this one asks for none".to_string(),
                (None, _) => "without image transforms; this one asks for some".to_string(),
                (Some(was), Some(now)) => format!("with the image transforms {}; this one asks for {}", json(was), json(now)),
            };
            return Err(Error::Run(format!("--resume: {} was made by a run {differ}", dir.display())));
        }
        if let Some(was) = run.transformed_frames().filter(|&was| was != options.transform_frames) {
            return Err(Error::Run(format!(
                "--resume: {} was made by a run whose image transforms were handed {} frames; this one asks for --transform-frames {}",
                dir.display(),
                was.name(),
                options.transform_frames.name()
            )));
        }
        if run.padded_actions != options.padded_actions {
            return Err(Error::Run(format!(
                "--resume: {} was made by a run whose loss counted padded actions as {}; this one asks for --padded-actions {}",
                dir.display(),
                run.padded_actions.name(),
                options.padded_actions.name()
            )));
        }
        let given = RunState {
            datasets: options.datasets.clone(),
            sampled: facts.datasets.clone(),
            seed: options.seed,
            global_batch,
            steps_per_epoch: run.steps_per_epoch,
            next_step: run.next_step,
            padded_actions: run.padded_actions,
            backbone_weights: run.backbone_weights.clone(),
            image_transforms: run.image_transforms.clone(),
            transform_frames: run.transform_frames,
        };
        if given != run {
            return Err(Error::Run(format!(
                "--resume: {} was made by a run over {:?} ({:?}) with seed {} and {} samples a step over all ranks; this one asks for {:?} ({:?}), seed {}, {} samples a step ({world} × {})",
                dir.display(),
                run.datasets,
                run.sampled,
                run.seed,
                run.global_batch,
                given.datasets,
                given.sampled,
                given.seed,
                given.global_batch,
                options.batch_size
            )));
        }
        let policy = tokio::task::block_in_place(|| Policy::from_pretrained(&dir, &policy_options))?;
        if policy.config().type_name() != options.config.type_name() {
            return Err(Error::Run(format!(
                "--resume: {} holds a {} policy; this run trains {}",
                dir.display(),
                policy.config().type_name(),
                options.config.type_name()
            )));
        }
        let mut optimizer = policy.optimizer();
        optimizer.load(&dir.join("training_state"))?;
        (policy, optimizer, run.next_step - 1, run.backbone_weights)
    } else {
        if checkpoints.join("last").exists() {
            return Err(Error::Run(format!(
                "{} already holds a run's checkpoints: add --resume to continue it, or choose another --out",
                options.out.display()
            )));
        }
        let config = policy_config(&options.config, &facts)?;
        // Rank 0's weights go to every rank below, so only rank 0 reads a file.
        let backbone_weights = match rank {
            0 => {
                backbone_start(&config, options.backbone_weights.as_deref(), options.init_from.as_deref(), torchvision_cache().as_deref())?
            }
            _ => None,
        };
        let stats = policy_stats(&facts)?;
        tch::manual_seed(rank_step_seed(options.seed, 0, 0));
        let policy_options = PolicyOptions { backbone_weights: backbone_weights.clone(), ..policy_options };
        let policy = tokio::task::block_in_place(|| Policy::new(config, stats, &policy_options))?;
        if let Some(dir) = &options.init_from {
            tokio::task::block_in_place(|| policy.init_from(dir))?;
        }
        let optimizer = policy.optimizer();
        (policy, optimizer, 0, backbone_weights)
    };
    if let Some(c) = &options.collective {
        // Every rank starts from rank 0's weights (and its frozen statistics).
        let tensors = policy.state_tensors();
        tokio::task::block_in_place(|| broadcast(c.as_ref(), &tensors))?;
    }
    // Running statistics each rank's forward moves: rank 0's before every step, as
    // DistributedDataParallel gives them (its `broadcast_buffers`).
    let moving = policy.moving_buffers();
    if started_after >= options.steps {
        return Err(Error::Run(format!("the run is at step {started_after} already; ask for more --steps than that")));
    }
    let config = policy.config();
    with_cameras(transforms.as_ref(), &config)?;
    ask_for(&mut request, &config, facts.fps, &options);
    // The request's steps are the run's: a step of batch B reads the next B samples of the order.
    let probe = open_feed(options.lake.as_ref(), &request, &options.source, options.loader).await?;
    let steps_per_epoch = probe.steps_per_epoch;
    drop(probe);
    (request.epoch, request.start_step) = (started_after / steps_per_epoch, started_after % steps_per_epoch);
    request.limit_batches = Some(options.steps - started_after);
    let feed = open_frames(&options, &request).await?;
    check_schema(&feed.schema, &config, &options.frames)?;
    let augment = transforms.map(|t| Augment { transforms: Arc::new(t), seed: options.seed, first_position: rank * options.batch_size });
    let mut batches = Prefetch::start(feed, config.clone(), options.device, options.frames.clone(), augment, started_after + 1);
    let eval_request = match &options.eval {
        Some(eval) => Some(held_out_request(&options, &request, eval).await?),
        None => None,
    };

    // Rank 0 writes the run's files.
    let writes = rank == 0;
    std::fs::create_dir_all(&options.out).map_err(Error::io(&options.out))?;
    let log_path = options.out.join(LOG_FILE);
    let mut log = match writes {
        true => Some(std::fs::OpenOptions::new().create(true).append(true).open(&log_path).map_err(Error::io(&log_path))?),
        false => None,
    };
    let mut events = match writes {
        true => Some(crate::events::EventsFile::create(&options.out, (started_after > 0).then_some(started_after + 1))?),
        false => None,
    };
    let run = |next_step| RunState {
        datasets: options.datasets.clone(),
        sampled: facts.datasets.clone(),
        seed: options.seed,
        global_batch,
        steps_per_epoch,
        next_step,
        padded_actions: options.padded_actions,
        backbone_weights: backbone_weights.clone(),
        image_transforms: image_transforms.clone(),
        transform_frames,
    };
    let (started, mut waited, mut losses, mut checkpoint) = (Instant::now(), 0.0, Vec::new(), PathBuf::new());
    let cpu_at_start = lake_loader::process_usage().cpu_s;
    let (mut evals, mut checkpoint_step, mut evaluating) = (Vec::new(), 0, 0.0);
    for step in started_after + 1..=options.steps {
        let began = Instant::now();
        let batch = batches.next().await.ok_or_else(|| Error::Data(format!("the batches ended before step {step}")))??;
        let data_wait_s = began.elapsed().as_secs_f64();
        waited += data_wait_s;
        let record = tokio::task::block_in_place(|| -> Result<StepRecord> {
            tch::manual_seed(rank_step_seed(options.seed, rank, step));
            if let Some(c) = options.collective.as_ref().filter(|_| !moving.is_empty()) {
                broadcast(c.as_ref(), &moving)?;
            }
            let lr = policy.base_lr() * policy.lr_factor(step, options.steps);
            if let Policy::Diffusion(_) = &policy {
                optimizer.set_lr(0, lr)?;
            }
            let loss = bf16_autocast(options.device, options.bf16, || policy.loss(&batch, true))??;
            let grad_norm = match &options.collective {
                None => optimizer.step(&loss.loss)?,
                Some(c) => {
                    optimizer.zero_grad();
                    loss.loss.backward();
                    let params: Vec<Tensor> = policy.named_parameters().iter().map(|(_, p)| p.shallow_clone()).collect();
                    average_gradients(c.as_ref(), &params)?;
                    let norm = optimizer.clip_grad_norm(optimizer.grad_clip_norm);
                    optimizer.update();
                    norm
                }
            };
            let mut terms = [
                loss.loss.double_value(&[]),
                loss.l1.as_ref().map_or(0.0, |l| l.double_value(&[])),
                loss.kld.as_ref().map_or(0.0, |k| k.double_value(&[])),
            ];
            if let Some(c) = &options.collective {
                all_reduce_host(c.as_ref(), &mut terms)?;
                terms.iter_mut().for_each(|t| *t /= world as f64);
            }
            let [loss_mean, l1, kld] = terms;
            let single = options.collective.is_none();
            Ok(StepRecord {
                step,
                loss: if single { loss.loss.double_value(&[]) } else { loss_mean },
                l1: loss.l1.as_ref().map(|l| if single { l.double_value(&[]) } else { l1 }),
                kld: loss.kld.as_ref().map(|k| if single { k.double_value(&[]) } else { kld }),
                grad_norm,
                lr: Some(lr),
                data_wait_s,
                step_s: began.elapsed().as_secs_f64(),
            })
        })?;
        losses.push(record.loss);
        if let Some(log) = &mut log {
            let line = serde_json::to_string(&record).expect("a step record is plain data");
            writeln!(log, "{line}").map_err(Error::io(&log_path))?;
            on_step(&record);
        }
        if let Some(events) = &mut events {
            events.scalars(step, &record.scalars())?;
        }
        let saves = step == options.steps || (options.save_every > 0 && step % options.save_every == 0);
        if saves && let Some(c) = &options.collective {
            // A checkpoint is the run's model only while every rank holds the same parameters
            // (running statistics are rank 0's, given to every rank at each step).
            let params: Vec<Tensor> = policy.named_parameters().iter().map(|(_, p)| p.shallow_clone()).collect();
            let apart = tokio::task::block_in_place(|| ranks_apart(c.as_ref(), &params))?;
            if !apart.is_empty() {
                let ranks: Vec<String> = apart.iter().map(u64::to_string).collect();
                return Err(Error::Ranks(format!(
                    "after step {step} rank {} of {world} holds other parameters than rank 0: the ranks no longer train one model \
                     (a gradient left out of the sum, or a device that updates differently), so the run stops without a checkpoint",
                    ranks.join(", ")
                )));
            }
        }
        if writes && saves {
            checkpoint_step = step;
            let dest = checkpoints.join(step_name(step, options.steps));
            checkpoint = tokio::task::block_in_place(|| save(&policy, &optimizer, &dest, (step, options.steps), &run(step + 1)))?;
            if let Some(log) = &mut log {
                log.flush().map_err(Error::io(&log_path))?;
            }
        }
        if let (Some(eval), Some(held_out)) = (&options.eval, &eval_request)
            && (step == options.steps || (eval.every > 0 && step % eval.every == 0))
        {
            let began = Instant::now();
            let (loss, samples) = evaluate(&options, held_out, &policy).await?;
            evaluating += began.elapsed().as_secs_f64();
            let record = EvalRecord { step, loss, samples };
            if writes {
                let path = options.out.join(EVAL_FILE);
                let line = serde_json::to_string(&record).expect("an eval record is plain data") + "\n";
                let mut file = std::fs::OpenOptions::new().create(true).append(true).open(&path).map_err(Error::io(&path))?;
                file.write_all(line.as_bytes()).map_err(Error::io(&path))?;
            }
            if let Some(events) = &mut events {
                events.scalars(step, &[("eval/loss", loss)])?;
            }
            on_eval(&record);
            evals.push(record);
        }
        if writes && step == checkpoint_step {
            let evals_path = options.out.join(EVAL_FILE);
            let evals = if evals_path.exists() { crate::run_log::read_log(&evals_path)? } else { Vec::new() };
            let plot = options.out.join(PLOT_FILE);
            tokio::task::block_in_place(|| crate::run_log::plot(&crate::run_log::read_log(&log_path)?, &evals, &plot))?;
        }
    }
    // Training time: the held-out evaluations' aside.
    let elapsed = started.elapsed().as_secs_f64() - evaluating;
    let cpu_s = lake_loader::process_usage().cpu_s - cpu_at_start;
    let mean = |xs: &[f64]| xs.iter().sum::<f64>() / xs.len().max(1) as f64;
    let ran = options.steps - started_after;
    let loss_steps = (losses.len() / 2).clamp(1, 10).min(losses.len());
    Ok(Summary {
        started_after,
        last_step: options.steps,
        first_loss: mean(&losses[..loss_steps]),
        last_loss: mean(&losses[losses.len() - loss_steps..]),
        loss_steps,
        data_wait: waited / elapsed.max(f64::MIN_POSITIVE),
        samples_per_s: (ran * global_batch) as f64 / elapsed.max(f64::MIN_POSITIVE),
        checkpoint,
        datasets: facts.datasets,
        evals,
        cpu_s,
        backbone_weights,
    })
}

/// What a run without a model measured (`--policy none`).
#[derive(Debug, Clone)]
pub struct FeedSummary {
    /// Steps taken.
    pub steps: u64,
    /// Samples per second over the run, every rank's.
    pub samples_per_s: f64,
    /// CPU seconds this process spent per sample it took: in process, the whole data path's;
    /// fed by a server, the receiving side's only.
    pub cpu_s_per_sample: f64,
    /// Peak resident set size of this process, MiB.
    pub peak_rss_mb: f64,
    /// The datasets sampled, `NAME@VERSION`.
    pub datasets: Vec<String>,
}

/// `config` with the datasets' features, checked. A dataset with no `action` is refused
/// naming the features no policy sees and how a view renames one.
///
/// # Errors
/// [`Error::Features`] or [`Error::InvalidConfig`].
fn policy_config(config: &PolicyConfig, facts: &DatasetFacts) -> Result<PolicyConfig> {
    if !facts.features.iter().any(|f| f.name == crate::ACTION) {
        // LeRobot takes any key starting with `action` for an action; its policies predict `action`.
        let misnamed = facts.features.iter().filter(|f| f.kind == FeatureType::Action).map(|f| f.name.as_str());
        let others: Vec<String> = misnamed.chain(facts.unused.iter().map(String::as_str)).map(|n| format!("`{n}`")).collect();
        let others = if others.is_empty() { "none".to_owned() } else { others.join(", ") };
        return Err(Error::Features(format!(
            "{}: no `action` feature, which the policy predicts (policies read `action`, `observation.*` and cameras; \
             the samples' other features: {others}). A view renames them: \
             `lake view create NAME \"SELECT dataset, episode_index FROM episodes WHERE dataset = '…'\" --rename FEATURE=action`, \
             then train on NAME",
            facts.datasets.join(", ")
        )));
    }
    let mut config = config.clone();
    config.set_features(&facts.features);
    config.validate()?;
    Ok(config)
}

/// The data path alone: the batches a run of `options` would train on, each made into the
/// policy's tensors and copied to the device, and nothing else. Its rate is the most samples a
/// second this data path gives one device; with its CPU time per sample, it says how many cores
/// keep a device fed. Writes `feed_log.jsonl` in the run's directory (rank 0); the model in
/// `options` is only read for the windows it needs.
///
/// # Errors
/// As [`train`], for the data side.
pub async fn feed_only(options: TrainOptions, mut on_step: impl FnMut(&FeedRecord)) -> Result<FeedSummary> {
    let (rank, world) = ranks(&options);
    let (mut request, facts) = plan(&options).await?;
    let config = policy_config(&options.config, &facts)?;
    let transforms = run_transforms(&options)?;
    with_cameras(transforms.as_ref(), &config)?;
    let augment = transforms.map(|t| Augment { transforms: Arc::new(t), seed: options.seed, first_position: rank * options.batch_size });
    ask_for(&mut request, &config, facts.fps, &options);
    request.limit_batches = Some(options.steps);
    let feed = open_frames(&options, &request).await?;
    check_schema(&feed.schema, &config, &options.frames)?;
    let mut batches = Prefetch::start(feed, config, options.device, options.frames.clone(), augment, 1);
    std::fs::create_dir_all(&options.out).map_err(Error::io(&options.out))?;
    let log_path = options.out.join(FEED_LOG_FILE);
    let mut log = match rank {
        0 => Some(std::fs::File::create(&log_path).map_err(Error::io(&log_path))?),
        _ => None,
    };
    let (started, cpu_at_start) = (Instant::now(), lake_loader::process_usage().cpu_s);
    let mut samples = 0;
    for step in 1..=options.steps {
        let began = Instant::now();
        let batch = batches.next().await.ok_or_else(|| Error::Data(format!("the batches ended before step {step}")))??;
        let data_wait_s = began.elapsed().as_secs_f64();
        if let Device::Cuda(index) = options.device {
            tokio::task::block_in_place(|| tch::Cuda::synchronize(index as i64));
        }
        let rows = match &batch {
            Batch::Act(b) => b.action.as_ref().map_or(0, |a| a.size()[0] as u64),
            Batch::Diffusion(b) => b.state.size()[0] as u64,
        };
        samples += rows;
        drop(batch);
        let record = FeedRecord { step, samples: rows, data_wait_s, step_s: began.elapsed().as_secs_f64() };
        if let Some(log) = &mut log {
            let line = serde_json::to_string(&record).expect("a feed record is plain data");
            writeln!(log, "{line}").map_err(Error::io(&log_path))?;
            on_step(&record);
        }
    }
    let elapsed = started.elapsed().as_secs_f64().max(f64::MIN_POSITIVE);
    let usage = lake_loader::process_usage();
    Ok(FeedSummary {
        steps: options.steps,
        samples_per_s: (samples * world) as f64 / elapsed,
        cpu_s_per_sample: (usage.cpu_s - cpu_at_start) / samples.max(1) as f64,
        peak_rss_mb: usage.peak_rss_mb,
        datasets: facts.datasets,
    })
}

/// The request of each held-out evaluation: `training`'s windows, frames and ranks over the
/// held-out datasets, from their first step, for the batches `eval` asks for. Opened once here,
/// so that a held-out set that cannot be sampled ends the run before its first step.
///
/// # Errors
/// [`Error::Run`] for a weight with [`EvalBatches::All`]; [`Error::Data`] when the held-out
/// datasets cannot be sampled as asked.
async fn held_out_request(options: &TrainOptions, training: &SampleRequest, eval: &EvalOptions) -> Result<SampleRequest> {
    let mut held_out = SampleRequest { datasets: SampleRequest::new(eval.datasets.iter().cloned()).datasets, ..training.clone() };
    (held_out.epoch, held_out.start_step) = (0, 0);
    if eval.batches == EvalBatches::All {
        if let Some(weighted) = eval.datasets.iter().find(|d| d.contains('=')) {
            return Err(Error::Run(format!(
                "--eval-dataset {weighted}: an evaluation of every held-out sample reads each once, so a weight has no part in it; \
                 leave the weight out, or evaluate the first N batches of a weighted shuffle with --eval-batches N"
            )));
        }
        (held_out.shuffle, held_out.drop_last) = (false, false);
    }
    held_out.limit_batches = None;
    let probe = open_feed(options.lake.as_ref(), &held_out, &options.source, options.loader)
        .await
        .map_err(|e| Error::Data(format!("the held-out datasets ({}): {e}", eval.datasets.join(", "))))?;
    held_out.limit_batches = Some(match eval.batches {
        EvalBatches::First(n) => n,
        EvalBatches::All => probe.steps_per_epoch,
    });
    Ok(held_out)
}

/// The held-out loss of `policy` over the batches of `request` (each rank its own, the mean over
/// all), and the samples it covers. A rank's empty slice of a short last batch adds nothing.
async fn evaluate(options: &TrainOptions, request: &SampleRequest, policy: &Policy) -> Result<(f64, u64)> {
    let mut feed = open_frames(options, request).await?;
    let config = policy.config();
    check_schema(&feed.schema, &config, &options.frames)?;
    // Diffusion's held-out loss draws its noise and steps: the same at every evaluation. (The
    // steps after reseed the generator themselves.)
    tch::manual_seed(rank_step_seed(options.seed, ranks(options).0, u64::MAX));
    let mut totals = [0.0, 0.0];
    while let Some(batch) = feed.batches.next().await {
        let batch = batch?;
        if batch.num_rows() == 0 {
            continue;
        }
        let samples = batch.num_rows() as f64;
        let loss = tokio::task::block_in_place(|| -> Result<f64> {
            let batch = make_batch(&batch, &config, &options.frames)?;
            let loss = bf16_autocast(options.device, options.bf16, || tch::no_grad(|| policy.loss(&batch, false)))??;
            Ok(loss.loss.double_value(&[]))
        })?;
        totals[0] += loss * samples;
        totals[1] += samples;
    }
    if let Some(c) = &options.collective {
        all_reduce_host(c.as_ref(), &mut totals)?;
    }
    if totals[1] == 0.0 {
        return Err(Error::Data(format!("the held-out datasets ({}) gave no samples", request.datasets.len())));
    }
    Ok((totals[0] / totals[1], totals[1] as u64))
}

/// The file a fresh run starts its camera backbones from: `--backbone-weights` when given;
/// else, when the config names torchvision's pretrained weights, torchvision's cached download
/// of them in `cache` (as lerobot-train would read it; lake downloads nothing). Nothing when
/// the config names no weights, has no camera, or `--init-from` replaces every weight.
///
/// # Errors
/// [`Error::InvalidConfig`] when the config names weights that no file holds: a backbone left
/// at random would train another policy than lerobot-train does from the same config
/// (docs/decisions/0029-backbone-weights-from-a-file.md).
fn backbone_start(config: &PolicyConfig, given: Option<&Path>, init_from: Option<&Path>, cache: Option<&Path>) -> Result<Option<PathBuf>> {
    if let Some(path) = given {
        return Ok(Some(path.to_path_buf()));
    }
    let Some(name) = config.pretrained_backbone_weights() else { return Ok(None) };
    if init_from.is_some() || config.image_features().is_empty() {
        return Ok(None);
    }
    let Some(file) = torchvision_weights_file(name) else {
        return Err(Error::config(
            "pretrained_backbone_weights",
            format!(
                "{name:?} names no ResNet-18 weights torchvision has (ResNet18_Weights.IMAGENET1K_V1); give the file with --backbone-weights"
            ),
        ));
    };
    let cached = cache.map(|dir| dir.join(file));
    if let Some(found) = cached.iter().find(|p| p.is_file()) {
        return Ok(Some(found.clone()));
    }
    Err(Error::config(
        "pretrained_backbone_weights",
        format!(
            "the {} config starts its camera backbones from torchvision's {name:?}, which are not in torchvision's cache ({}), \
             and lake downloads nothing: give them with --backbone-weights FILE (torchvision's .pth or safetensors; \
             docs/guide/train.md#backbone-weights), or set \"pretrained_backbone_weights\": null in --policy-config to start from random weights",
            config.type_name(),
            cached.map_or_else(|| "no home directory".to_string(), |p| p.display().to_string())
        ),
    ))
}

/// torchvision's file of the ResNet-18 weights `name` names (`ResNet18_Weights.IMAGENET1K_V1`,
/// its alias `DEFAULT`, or the member alone), as its downloads name it.
pub fn torchvision_weights_file(name: &str) -> Option<&'static str> {
    let member = name.strip_prefix("ResNet18_Weights.").unwrap_or(name);
    matches!(member, "IMAGENET1K_V1" | "DEFAULT").then_some("resnet18-f37072fd.pth")
}

/// Where torchvision keeps its downloads, as torch.hub finds it: `$TORCH_HOME/hub/checkpoints`,
/// `$TORCH_HOME` being `$XDG_CACHE_HOME/torch`, or `~/.cache/torch`, when unset.
pub fn torchvision_cache() -> Option<PathBuf> {
    let var = |name| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    let expand = |p: PathBuf| match (p.strip_prefix("~"), var("HOME")) {
        (Ok(rest), Some(home)) => home.join(rest),
        _ => p,
    };
    let home = match var("TORCH_HOME") {
        Some(home) => expand(home),
        None => expand(var("XDG_CACHE_HOME").unwrap_or_else(|| PathBuf::from("~/.cache"))).join("torch"),
    };
    (!home.starts_with("~")).then(|| home.join("hub").join("checkpoints"))
}

/// Writes a checkpoint after update `step` of `total`, with lake's run file, then points `last`
/// at it.
fn save(policy: &Policy, optimizer: &Adam, dest: &Path, (step, total): (u64, u64), run: &RunState) -> Result<PathBuf> {
    let staged = policy.stage_checkpoint(dest, optimizer, step, total)?;
    let path = staged.path().join("training_state").join(RUN_FILE);
    std::fs::write(&path, serde_json::to_vec_pretty(run).expect("plain data")).map_err(Error::io(&path))?;
    let dest = staged.commit()?;
    let parent = dest.parent().unwrap_or(Path::new("."));
    let (link, tmp) = (parent.join("last"), parent.join(".last.tmp"));
    let _ = std::fs::remove_file(&tmp);
    let name = dest.file_name().ok_or_else(|| Error::Run(format!("{}: a checkpoint has no name", dest.display())))?;
    std::os::unix::fs::symlink(name, &tmp).map_err(Error::io(&tmp))?;
    std::fs::rename(&tmp, &link).map_err(Error::io(&link))?;
    Ok(dest)
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T> {
    let text = std::fs::read(path).map_err(Error::io(path))?;
    serde_json::from_slice(&text).map_err(|e| Error::format(path, e.to_string()))
}

/// `delta_timestamps` as a request carries them.
fn delta_timestamps_json(config: &PolicyConfig, fps: f64) -> Value {
    Value::Object(config.delta_timestamps(fps).into_iter().map(|(k, v)| (k, json!(v))).collect())
}

/// Refuses a stream whose batches lack a column the policy reads, before any step.
fn check_schema(schema: &arrow::datatypes::Schema, config: &PolicyConfig, frames: &Frames) -> Result<()> {
    let mut needed: Vec<String> = config.input_features().iter().map(|(k, _)| k.clone()).collect();
    needed.extend(config.output_features().iter().map(|(k, _)| k.clone()));
    needed.extend(config.output_features().iter().map(|(k, _)| format!("{k}_is_pad")));
    for name in needed {
        let field = schema.field_with_name(&name).map_err(|_| Error::Features(format!("the batches have no column `{name}`")))?;
        let format = field.metadata().get(lake_loader::PIXEL_FORMAT);
        let planes_read = matches!(frames, Frames::Yuv420p { .. });
        let packets_read = matches!(frames, Frames::Yuv420p { gpu: Some(_) });
        if format.is_some_and(|f| f != "rgb24" && !(planes_read && f == "yuv420p") && !(packets_read && f == "packets")) {
            return Err(Error::Features(format!(
                "camera `{name}` travels as {}; the trainer reads {}",
                format.map_or("", |f| f),
                match (planes_read, packets_read) {
                    (_, true) => "rgb24, yuv420p or packets",
                    (true, false) => "rgb24 or yuv420p",
                    (false, false) => "rgb24",
                }
            )));
        }
    }
    Ok(())
}

/// A camera column as RGB24 frames `[B, H, W, 3]`: its values, or its YUV planes converted as
/// `frames` says (on the GPU, the tensor is on that device). Packets decoded on the GPU are
/// resized there to `size` (`[H, W]`) when their frames are of another size.
fn camera_tensor(batch: &RecordBatch, name: &str, frames: &Frames, size: [u32; 2]) -> Result<Tensor> {
    use lake_gpu::colour::{Geometry, Layout, Target, convert_on_cpu};

    let schema = batch.schema();
    let field = schema.field_with_name(name).map_err(|_| Error::Batch(format!("no column `{name}`")))?;
    let format = field.metadata().get(lake_loader::PIXEL_FORMAT).map(String::as_str);
    if format.is_none_or(|f| f != "yuv420p" && f != "packets") {
        return column_tensor(batch, name);
    }
    let Frames::Yuv420p { gpu } = frames else {
        return Err(Error::Batch(format!("camera `{name}` travels as {}, and this run reads rgb24", format.unwrap_or_default())));
    };
    let metadata = |key: &str| {
        field.metadata().get(key).ok_or_else(|| {
            Error::Batch(format!(
                "camera `{name}`: {} without `{key}` (its frames do not convert with lake's kernel: decode them on the data side or the CPU)",
                format.unwrap_or_default()
            ))
        })
    };
    let bad = |key: &str, e: serde_json::Error| Error::Batch(format!("camera `{name}`: `{key}`: {e}"));
    let [height, width, _]: [u32; 3] = serde_json::from_str(metadata("frame_shape")?).map_err(|e| bad("frame_shape", e))?;
    let matrix: lake_gpu::YuvToRgb =
        serde_json::from_str(metadata(lake_loader::YUV_TO_RGB)?).map_err(|e| bad(lake_loader::YUV_TO_RGB, e))?;
    if format == Some("packets") {
        let Some(gpu) = gpu else {
            return Err(Error::Batch(format!("camera `{name}` travels as packets, which this run decodes on a GPU it does not have")));
        };
        let [out_height, out_width] = size;
        let frames = crate::gpu_decode::GpuDecoders::of(gpu)?.camera(batch, name, width, height, &matrix, (out_width, out_height))?;
        let slots = frames.size()[0];
        let rows = batch.num_rows() as i64;
        // A window's slots become its time dimension, as the RGB column's shape has it.
        return Ok(if slots == rows {
            frames
        } else {
            frames.reshape([rows, slots / rows.max(1), i64::from(out_height), i64::from(out_width), 3])
        });
    }
    let geometry = Geometry { width, height, layout: Layout::Yuv420p };
    let planes = column_tensor(batch, name)?;
    let (rows, bytes) = (planes.size()[0], geometry.frame_bytes());
    if planes.numel() != rows as usize * bytes {
        return Err(Error::Batch(format!("camera `{name}`: {} bytes of planes for {rows} frames of {width}x{height}", planes.numel())));
    }
    let shape = [rows, i64::from(height), i64::from(width), 3];
    let converted = |e: lake_gpu::Error| Error::Batch(format!("camera `{name}`: {e}"));
    match gpu {
        None => {
            let host = Vec::<u8>::try_from(planes.flatten(0, -1)).map_err(Error::Torch)?;
            let refs: Vec<&[u8]> = host.chunks_exact(bytes).collect();
            let mut rgb = vec![0_u8; Target::Rgb24.bytes(refs.len(), width, height)];
            convert_on_cpu(&refs, geometry, &matrix, Target::Rgb24, &mut rgb).map_err(converted)?;
            Ok(Tensor::from_slice(&rgb).reshape(shape))
        }
        Some(gpu) => {
            let device = Device::Cuda(gpu.ordinal());
            // From pinned memory without blocking, on the stream the kernel then runs on.
            let on_device = planes.f_pin_memory(device)?.f_to_device_(device, Kind::Uint8, true, false)?;
            let rgb = Tensor::f_empty(shape, (Kind::Uint8, device))?;
            let base = on_device.data_ptr() as u64;
            let addresses: Vec<u64> = (0..rows as u64).map(|i| base + i * bytes as u64).collect();
            // SAFETY: `on_device` holds `rows` frames of `bytes` bytes and `rgb` the RGB24 batch,
            // both on `gpu`'s device. Both live until the kernel has run: libtorch's caching
            // allocator hands their memory out again only to work queued after it on this stream.
            unsafe { gpu.convert(&addresses, geometry, &matrix, Target::Rgb24, rgb.data_ptr() as u64) }.map_err(converted)?;
            Ok(rgb)
        }
    }
}

/// The values of a batch column as a tensor `[B, ...shape]` (the `shape` field metadata).
fn column_tensor(batch: &RecordBatch, name: &str) -> Result<Tensor> {
    let field = batch.schema().field_with_name(name).map_err(|_| Error::Batch(format!("no column `{name}`")))?.clone();
    let array = batch.column_by_name(name).ok_or_else(|| Error::Batch(format!("no column `{name}`")))?;
    let shape: Vec<i64> = match field.metadata().get(lake_loader::SHAPE) {
        Some(s) => serde_json::from_str(s).map_err(|e| Error::Batch(format!("`{name}`: shape {s}: {e}")))?,
        None => Vec::new(),
    };
    let rows = batch.num_rows();
    let values: ArrayRef = match array.data_type() {
        DataType::FixedSizeList(_, size) => {
            let list = array.as_fixed_size_list();
            let size = *size as usize;
            list.values().slice(list.offset() * size, rows * size)
        }
        _ => array.clone(),
    };
    let flat = match values.data_type() {
        DataType::Float32 => Tensor::from_slice(values.as_primitive::<Float32Type>().values()),
        DataType::Float64 => Tensor::from_slice(values.as_primitive::<Float64Type>().values()).to_kind(Kind::Float),
        DataType::Int64 => Tensor::from_slice(values.as_primitive::<Int64Type>().values()).to_kind(Kind::Float),
        DataType::UInt8 => Tensor::from_slice(values.as_primitive::<UInt8Type>().values()),
        DataType::Boolean => Tensor::from_slice(&values.as_boolean().iter().map(|b| b.unwrap_or(false)).collect::<Vec<_>>()),
        other => return Err(Error::Batch(format!("`{name}`: values of type {other} cannot feed the policy"))),
    };
    let mut dims = vec![rows as i64];
    dims.extend(&shape);
    if dims.iter().product::<i64>() != values.len() as i64 {
        return Err(Error::Batch(format!("`{name}`: {} values for {rows} samples of shape {shape:?}", values.len())));
    }
    Ok(flat.reshape(dims.as_slice()))
}

/// A batch of the lake's samples as `config`'s policy takes it ([`act_batch`], or Diffusion's
/// windows).
///
/// # Errors
/// As [`act_batch`].
pub fn make_batch(batch: &RecordBatch, config: &PolicyConfig, frames: &Frames) -> Result<Batch> {
    match config {
        PolicyConfig::Act(c) => Ok(Batch::Act(act_batch(batch, c, frames)?)),
        PolicyConfig::Diffusion(c) => Ok(Batch::Diffusion(diffusion_batch(
            batch,
            c,
            |name, size| camera_tensor(batch, name, frames, size),
            |name| column_tensor(batch, name),
        )?)),
    }
}

/// A batch of the lake's samples as ACT's raw inputs: cameras `[B, 3, H, W]` uint8 (the
/// policy scales them to [0, 1]), the state vectors, the action chunk and its padding mask.
/// Cameras that travel as YUV planes become RGB as `frames` says: on its GPU (their tensors are
/// then on that device already), or on the CPU.
///
/// # Errors
/// [`Error::Batch`] for a column that is missing or of another type, or planes the run does not
/// read.
pub fn act_batch(batch: &RecordBatch, config: &ActConfig, frames: &Frames) -> Result<ActBatch> {
    let mut images = Vec::new();
    for (name, feature) in config.image_features() {
        let size = match feature.shape[..] {
            [_, h, w] => [h as u32, w as u32],
            _ => return Err(Error::Batch(format!("camera `{name}`: a policy feature of shape {:?}, not [3, H, W]", feature.shape))),
        };
        let hwc = camera_tensor(batch, name, frames, size)?;
        if hwc.dim() != 4 || hwc.size()[3] != 3 {
            return Err(Error::Batch(format!("camera `{name}`: shape {:?}, expected [B, H, W, 3]", hwc.size())));
        }
        images.push(hwc.permute([0, 3, 1, 2]));
    }
    let vector = |key: &str, present: bool| present.then(|| column_tensor(batch, key)).transpose();
    let has = |kind: FeatureType| config.input_features.iter().any(|(_, f)| f.kind == kind);
    Ok(ActBatch {
        state: vector(OBS_STATE, has(FeatureType::State))?,
        env_state: vector(OBS_ENV_STATE, has(FeatureType::Env))?,
        images,
        action: Some(column_tensor(batch, crate::ACTION)?),
        action_is_pad: Some(column_tensor(batch, &format!("{}_is_pad", crate::ACTION))?.to_kind(Kind::Bool)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_seeds_differ_by_step_and_by_seed() {
        let seeds: std::collections::BTreeSet<i64> = (0..1000).flat_map(|s| [step_seed(0, s), step_seed(1, s)]).collect();
        assert_eq!(seeds.len(), 2000);
        assert!(seeds.iter().all(|s| *s >= 0));
    }

    #[test]
    fn named_backbone_weights_need_a_file() {
        let camera = crate::DatasetFeature::new("observation.images.top", FeatureType::Visual, [3, 48, 64]);
        let features = [camera, crate::DatasetFeature::new(crate::ACTION, FeatureType::Action, [2])];
        let named = PolicyConfig::Act(Box::new(ActConfig::with_features(&features)));
        assert_eq!(named.pretrained_backbone_weights(), Some("ResNet18_Weights.IMAGENET1K_V1"));
        let tmp = std::env::temp_dir().join(format!("lake-backbone-start-{}", std::process::id()));
        std::fs::create_dir_all(&tmp).unwrap();
        let refused = backbone_start(&named, None, None, Some(&tmp)).unwrap_err().to_string();
        assert!(refused.contains("pretrained_backbone_weights") && refused.contains("--backbone-weights"), "{refused}");
        assert!(refused.contains(&tmp.join("resnet18-f37072fd.pth").display().to_string()), "{refused}");
        assert!(backbone_start(&named, None, None, None).is_err());
        // torchvision's cached download, as lerobot-train would read it.
        std::fs::write(tmp.join("resnet18-f37072fd.pth"), b"").unwrap();
        assert_eq!(backbone_start(&named, None, None, Some(&tmp)).unwrap(), Some(tmp.join("resnet18-f37072fd.pth")));
        std::fs::remove_dir_all(&tmp).unwrap();
        // A file given wins; --init-from replaces every weight.
        let given = Path::new("resnet18.safetensors");
        assert_eq!(backbone_start(&named, Some(given), None, None).unwrap().as_deref(), Some(given));
        assert_eq!(backbone_start(&named, None, Some(Path::new("runs/earlier")), None).unwrap(), None);
        // Without a camera there is no backbone to start.
        let state_only = PolicyConfig::Act(Box::new(ActConfig::with_features(&features[1..])));
        assert_eq!(backbone_start(&state_only, None, None, None).unwrap(), None);
        // LeRobot 0.4.4's Diffusion names no weights.
        let diffusion = PolicyConfig::Diffusion(Box::new(crate::DiffusionConfig::with_features(&features)));
        assert_eq!(backbone_start(&diffusion, None, None, None).unwrap(), None);
        // Names torchvision takes for the same weights; others have no file.
        for name in ["ResNet18_Weights.IMAGENET1K_V1", "ResNet18_Weights.DEFAULT", "IMAGENET1K_V1", "DEFAULT"] {
            assert_eq!(torchvision_weights_file(name), Some("resnet18-f37072fd.pth"), "{name}");
        }
        assert_eq!(torchvision_weights_file("ResNet34_Weights.IMAGENET1K_V1"), None);
    }

    #[test]
    fn checkpoints_are_named_as_lerobot_train_names_them() {
        assert_eq!(step_name(20, 100), "000020");
        assert_eq!(step_name(20, 10_000_000), "00000020");
    }
}
