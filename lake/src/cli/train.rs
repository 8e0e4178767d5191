//! `lake train`: LeRobot's ACT or Diffusion Policy trained on the lake's samples
//! (lake-trainer), fed by the in-process loader or by a running `lake serve`.

use std::{path::PathBuf, process::ExitCode};

/// Arguments of `lake train`.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("serving").args(["server", "local"])))]
pub struct TrainArgs {
    /// A dataset or view to sample, `NAME[=WEIGHT]`; repeat for a mixture.
    #[arg(long = "dataset", value_name = "NAME[=WEIGHT]", required = true)]
    datasets: Vec<String>,
    /// The policy: `act` (LeRobot's ACT), `diffusion` (LeRobot's Diffusion Policy), or `none`: no
    /// model, each step only takes its batch onto the device, which measures the data path alone
    /// (writes feed_log.jsonl), with ACT's windows or those of the policy whose `type` and fields
    /// --policy-config gives.
    #[arg(long, default_value = "act")]
    policy: String,
    /// The policy's LeRobot config fields as JSON (a `config.json`, or some of its fields), over
    /// LeRobot's defaults; the features are the dataset's.
    #[arg(long, value_name = "FILE.json")]
    policy_config: Option<PathBuf>,
    /// Steps to have run when the run ends (a resumed run counts those before it).
    #[arg(long)]
    steps: u64,
    /// Samples per step.
    #[arg(long, default_value_t = 8, value_parser = crate::args::at_least_one)]
    batch_size: u64,
    /// Learning rate (the config's `optimizer_lr` otherwise).
    #[arg(long)]
    lr: Option<f64>,
    /// ACT: learning rate of the vision backbone (the config's `optimizer_lr_backbone` otherwise).
    #[arg(long)]
    lr_backbone: Option<f64>,
    /// `cpu`, or `cuda` (the GPU of the rank's local rank: the first GPU for one process).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// How the ranks of a data-parallel run sum their gradients: `auto` (MPI under mpirun or
    /// srun; under torchrun, NCCL on GPUs where libnccl loads and libtorch's Gloo otherwise),
    /// `nccl`, `gloo` or `mpi`. A backend named outright joins even a single rank, to check it.
    #[arg(long, default_value = "auto")]
    backend: String,
    /// How camera frames travel: `rgb24` (converted by the loader or server), `yuv420p` (the
    /// decoder's planes, half the bytes, converted here to the same RGB: on a GPU by lake's
    /// kernel, on the CPU by its twin), or `auto` (yuv420p on a GPU that runs lake's kernel,
    /// rgb24 otherwise).
    #[arg(long, default_value = "auto")]
    frames: String,
    /// Where camera frames are decoded: `server` (by the loader or server; frames travel as
    /// --frames says), `cpu` (each camera's compressed packets travel, a small part of the
    /// frames' bytes, and this process decodes them into the same frames on --decode-threads),
    /// `gpu` (with --device cuda: the packets decode on the GPU's NVDEC where the stream
    /// allows, on the CPU into planes elsewhere, and lake's kernel makes the RGB in the batch's
    /// tensor), or `auto` (gpu on a cuda run whose GPU runs lake's kernel, server otherwise).
    #[arg(long, default_value = "server", value_parser = ["server", "cpu", "gpu", "auto"])]
    decode: String,
    /// Train on every camera's frames from each dataset's training proxy (`lake cache NAME
    /// --proxy h264`): re-encoded for random access (and for GPUs without the recorded codec's
    /// NVDEC), lossy, not LeRobot's frames.
    #[arg(long)]
    proxy: bool,
    /// Train on every camera's frames at WIDTHxHEIGHT, resized as `lake cache NAME --size WxH`
    /// resizes them (the policy's camera features take that size): read from that frame table
    /// with --decode server; with --decode cpu or gpu, resized here after decoding to the same
    /// bytes (on the GPU by lake's kernel), with no frame table.
    #[arg(long, value_name = "WxH")]
    frame_size: Option<lake_loader::FrameSize>,
    /// LeRobot's image transforms on each sample's camera frames as it enters a step
    /// (lerobot-train's `--dataset.image_transforms.enable=true`): up to 3 of brightness,
    /// contrast, saturation, hue, sharpness and a small affine per frame, drawn from the run's
    /// seed, so a resumed run draws the same. With FILE: LeRobot's `ImageTransformsConfig` as
    /// JSON (some or all of its fields over its defaults), or a `train_config.json` holding one;
    /// its `tfs` may also name LeRobot 0.6.1's transforms for a robot's cameras (GaussianNoise,
    /// MotionBlur, JPEGCompression, GaussianPatchBrightness, RandomShadow, CoarseDropout,
    /// GammaCorrection, PlanckianJitter). Held-out evaluations see the frames as recorded.
    #[arg(long, value_name = "FILE.json", num_args = 0..=1)]
    image_transforms: Option<Option<PathBuf>>,
    /// The frames the image transforms are handed, and so their arithmetic: `uint8`, as
    /// lerobot-train 0.6.1 hands them over (each transform's result cast back to uint8 as
    /// torchvision casts it; LeRobot 0.6.1's own transforms, which pass uint8 frames through
    /// unchanged there, get float frames); `float` in [0, 1], as LeRobot 0.4.4 hands them over.
    #[arg(long, default_value = "uint8", value_parser = ["uint8", "float"], requires = "image_transforms")]
    transform_frames: String,
    /// Threads that decode packets with --decode cpu (0: one per core).
    #[arg(long, default_value_t = 0, value_name = "N")]
    decode_threads: usize,
    /// Precision: `fp32` (LeRobot's default), `bf16` (mixed precision: the forward passes under
    /// bfloat16 autocast, the parameters and optimizer in fp32), or `fp64` (to compare runs
    /// without float rounding). Checkpoints are f32 in every case.
    #[arg(long, default_value = "fp32")]
    dtype: String,
    /// Seed of the sample order, the initialisation, dropout and the VAE's noise.
    #[arg(long, default_value_t = 1000)]
    seed: u64,
    /// The run's directory: checkpoints/ in LeRobot's layout, train_log.jsonl and its plot
    /// train_log.svg.
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Continue the run in --out from its last checkpoint (same datasets, seed and batch size).
    #[arg(long)]
    resume: bool,
    /// Write a checkpoint every K steps (and always at the end).
    #[arg(long, value_name = "K", default_value_t = 20_000)]
    save_every: u64,
    /// Print a line every K steps.
    #[arg(long, value_name = "K", default_value_t = 100, value_parser = crate::args::at_least_one)]
    log_every: u64,
    /// Start from the weights of this checkpoint (made by lerobot-train or lake), keeping the
    /// lake's statistics; its architecture must be the config's.
    #[arg(long, value_name = "DIR")]
    init_from: Option<PathBuf>,
    /// ResNet-18 weights for the camera backbones: torchvision's `.pth`, or safetensors with its
    /// names. When the config names `pretrained_backbone_weights` (ACT's default) and this is
    /// not given, torchvision's cached download is read; nothing is downloaded.
    #[arg(long, value_name = "FILE")]
    backbone_weights: Option<PathBuf>,
    /// How the loss counts the actions of a chunk that runs past its episode's end (ACT's L1;
    /// Diffusion's error when `do_mask_loss_for_padding`): `exclude` leaves them out of the mean,
    /// as LeRobot 0.6.1 does; `zero` counts them as actions without error, as LeRobot 0.4.4 does.
    #[arg(long, default_value = "exclude", value_parser = ["exclude", "zero"])]
    padded_actions: String,
    /// Evaluate on these datasets or views (held out from --dataset, e.g. a view of other
    /// episodes): the loss in eval mode, no dropout or VAE sampling, over the same samples each
    /// time. Repeat for a mixture.
    #[arg(long, value_name = "NAME|VIEW[=WEIGHT]")]
    eval_dataset: Vec<String>,
    /// Steps between held-out evaluations (0: only at the end).
    #[arg(long, default_value_t = 0, value_name = "K", requires = "eval_dataset")]
    eval_every: u64,
    /// Batches per held-out evaluation (of --batch-size, per rank), the first of a shuffle with
    /// the run's seed; `all`: every held-out sample once, in the order recorded.
    #[arg(long, default_value = "8", value_name = "N|all")]
    eval_batches: String,
    /// Take batches from `lake serve` over Arrow Flight at this address (`grpc://HOST:PORT`),
    /// or from several servers over one lake (comma-separated): the ranks spread over them,
    /// and a stream whose server becomes unavailable resumes on the next where it stopped.
    #[arg(long, value_name = "URL[,URL…]", conflicts_with = "local")]
    server: Option<String>,
    /// With --server or --local: seconds the run waits, in one outage, for a server to take its
    /// stream again once every server is unavailable (restarting, or the lake's object store
    /// unreachable), resuming where it stopped; past it the run fails (0: at once).
    #[arg(long, value_name = "SECONDS", default_value_t = 60, requires = "serving")]
    server_wait: u64,
    /// Take batches from `lake serve --local PATH` on this machine (shared memory).
    #[arg(long, value_name = "PATH")]
    local: Option<PathBuf>,
    /// Bearer token for the server.
    #[arg(long, env = "LAKE_TOKEN", hide_env_values = true)]
    token: Option<String>,
}

/// Refuses arguments that contradict each other, whatever the build.
fn check_args(args: &TrainArgs) -> anyhow::Result<()> {
    if args.decode == "gpu" && args.device != "cuda" {
        anyhow::bail!("--decode gpu decodes on the run's GPU: add --device cuda");
    }
    Ok(())
}

/// The `type` a --policy-config file names, if any.
#[cfg(feature = "torch")]
fn config_type(path: Option<&std::path::Path>) -> anyhow::Result<Option<String>> {
    use anyhow::Context as _;
    let Some(path) = path else { return Ok(None) };
    let text = std::fs::read_to_string(path).with_context(|| format!("--policy-config {}", path.display()))?;
    let given: serde_json::Value = serde_json::from_str(&text).with_context(|| format!("--policy-config {}: not JSON", path.display()))?;
    Ok(given.get("type").and_then(serde_json::Value::as_str).map(str::to_owned))
}

/// Runs `lake train`.
#[cfg(feature = "torch")]
pub async fn train(root: &str, args: TrainArgs) -> anyhow::Result<ExitCode> {
    use anyhow::Context as _;
    use lake_trainer::{data::BatchSource, policy::PolicyConfig, train::TrainOptions};

    let (data_only, defaults) = match args.policy.as_str() {
        "act" => (false, PolicyConfig::Act(Box::default())),
        "diffusion" => (false, PolicyConfig::Diffusion(Box::default())),
        // The windows of the policy the data would feed: ACT's, or the --policy-config's type.
        "none" => match config_type(args.policy_config.as_deref())?.as_deref() {
            Some("diffusion") => (true, PolicyConfig::Diffusion(Box::default())),
            _ => (true, PolicyConfig::Act(Box::default())),
        },
        other => {
            anyhow::bail!("unknown policy `{other}`: lake trains `act` and `diffusion`, and `none` measures the data path without a model")
        }
    };
    if args.lr_backbone.is_some() && matches!(defaults, PolicyConfig::Diffusion(_)) {
        anyhow::bail!("--lr-backbone is ACT's: Diffusion trains every parameter at --lr");
    }
    let (collective, local_rank) = ranks(&args.backend, args.device == "cuda")?;
    check_args(&args)?;
    // `auto` decodes on the GPU where lake's kernel runs there.
    let on_gpu = match args.decode.as_str() {
        "gpu" => true,
        "auto" if args.device == "cuda" => match lake_gpu::Gpu::open(usize::try_from(local_rank).unwrap_or(usize::MAX)) {
            Ok(_) => true,
            Err(e) => {
                tracing::warn!("--decode auto: frames decode on the data side: lake's colour kernel cannot run here ({e})");
                false
            }
        },
        _ => false,
    };
    if let Some(size) = args.frame_size.filter(|_| !on_gpu && args.frames == "yuv420p") {
        anyhow::bail!(
            "--frame-size {size} with --frames yuv420p: resized frames are RGB, and planes come at the recorded size; \
             use --frames rgb24, or --decode gpu"
        );
    }
    let frames = match on_gpu {
        // The packets become RGB through the kernel, on the GPU they decode on.
        true => frames("yuv420p", true, local_rank).context("--decode gpu")?,
        // Resized frames come as RGB: from a frame table, or from the packet decoder.
        false if args.frame_size.is_some() && args.frames == "auto" => lake_trainer::train::Frames::Rgb24,
        false => frames(&args.frames, args.device == "cuda", local_rank)?,
    };
    let device = match args.device.as_str() {
        "cpu" => tch::Device::Cpu,
        "cuda" if lake_trainer::act::cuda_is_available() => tch::Device::Cuda(local_rank as usize),
        "cuda" => anyhow::bail!("--device cuda: no CUDA device is visible to libtorch (driver, GPU, or a CPU-only libtorch)"),
        other => anyhow::bail!("unknown --device `{other}` (cpu or cuda)"),
    };
    let mut config = match &args.policy_config {
        Some(path) => {
            // The file's fields over LeRobot's defaults: a whole `config.json`, or some fields.
            let text = std::fs::read_to_string(path).with_context(|| format!("--policy-config {}", path.display()))?;
            let given: serde_json::Value =
                serde_json::from_str(&text).with_context(|| format!("--policy-config {}: not JSON", path.display()))?;
            let serde_json::Value::Object(fields) = given else {
                anyhow::bail!("--policy-config {}: a JSON object of {} config fields is expected", path.display(), defaults.type_name());
            };
            if let Some(other) = fields.get("type").and_then(serde_json::Value::as_str).filter(|t| *t != defaults.type_name()) {
                anyhow::bail!("--policy-config {}: a `{other}` config, for --policy {}", path.display(), defaults.type_name());
            }
            let mut merged: serde_json::Value = serde_json::from_str(&defaults.to_json())?;
            if let Some(defaults) = merged.as_object_mut() {
                defaults.extend(fields);
            }
            PolicyConfig::from_json(&merged.to_string()).context("--policy-config")?
        }
        None => defaults,
    };
    config.set_optimizer_and_device(args.lr, args.lr_backbone, &args.device);
    let resume_wait = std::time::Duration::from_secs(args.server_wait);
    let source = match (args.server, args.local) {
        (Some(url), _) => BatchSource::Flight { url, token: args.token, resume_wait },
        (None, Some(path)) => BatchSource::Local { path, token: args.token, resume_wait },
        (None, None) => BatchSource::InProcess,
    };
    let rank = collective.as_ref().map_or(0, |c| c.rank());
    // With --server, the server gives the datasets' facts: a trainer elsewhere needs no lake.
    let lake = match (&source, lake_store::Lake::open(root)) {
        (BatchSource::Flight { .. }, opened) => opened.ok(),
        (_, opened) => Some(opened?),
    };
    let (steps, log_every) = (args.steps, args.log_every);
    let image_transforms = match &args.image_transforms {
        None => None,
        Some(None) => Some(lake_trainer::ImageTransformsConfig::enabled()),
        Some(Some(path)) => Some(lake_trainer::ImageTransformsConfig::read(path)?),
    };
    let transforms = image_transforms.as_ref().map(lake_trainer::ImageTransforms::new).transpose()?.flatten();
    let options = TrainOptions {
        lake,
        datasets: args.datasets,
        source,
        config,
        steps,
        batch_size: args.batch_size,
        seed: args.seed,
        device,
        kind: match args.dtype.as_str() {
            "fp32" | "bf16" => tch::Kind::Float,
            "fp64" => tch::Kind::Double,
            other => anyhow::bail!("unknown --dtype `{other}` (fp32, bf16 or fp64)"),
        },
        bf16: args.dtype == "bf16",
        out: args.out.clone(),
        resume: args.resume,
        save_every: args.save_every,
        init_from: args.init_from,
        backbone_weights: args.backbone_weights,
        padded_actions: args.padded_actions.parse().map_err(anyhow::Error::msg)?,
        loader: Default::default(),
        collective,
        frames,
        decode: match args.decode.as_str() {
            "cpu" => lake_trainer::train::Decode::Cpu { threads: args.decode_threads },
            _ if on_gpu => lake_trainer::train::Decode::Gpu,
            _ => lake_trainer::train::Decode::Server,
        },
        proxy: args.proxy,
        frame_size: args.frame_size,
        image_transforms,
        transform_frames: args.transform_frames.parse().map_err(anyhow::Error::msg)?,
        eval: match args.eval_dataset.is_empty() {
            true => None,
            false => Some(lake_trainer::train::EvalOptions {
                datasets: args.eval_dataset.clone(),
                every: args.eval_every,
                batches: args.eval_batches.parse().map_err(anyhow::Error::msg)?,
            }),
        },
    };
    if data_only {
        return feed_only(options, rank, log_every).await;
    }
    let summary = lake_trainer::train::train(
        options,
        |s| {
            if s.step % log_every == 0 || s.step == steps {
                let l1 = s.l1.map_or(String::new(), |l| format!("  l1 {l:.4}"));
                let kld = s.kld.map_or(String::new(), |k| format!("  kld {k:.4}"));
                errln!(
                    "step {}/{steps}  loss {:.4}{l1}{kld}  grad {:.3}  data wait {:.0} ms of {:.0} ms",
                    s.step,
                    s.loss,
                    s.grad_norm,
                    s.data_wait_s * 1e3,
                    s.step_s * 1e3
                );
            }
        },
        |e| {
            errln!("step {}/{steps}  held-out loss {:.4} over {} samples", e.step, e.loss, e.samples);
        },
    )
    .await?;
    if rank != 0 {
        return Ok(ExitCode::SUCCESS);
    }
    let n = summary.loss_steps as u64;
    let steps_of = |first: u64| match n {
        0 | 1 => format!("step {first}"),
        _ => format!("mean of steps {first}-{}", first + n - 1),
    };
    outln!(
        "trained steps {}..={} on {}: loss {:.4} ({}) -> {:.4} ({}); {:.1} samples/s, {:.1} % of the time waiting for data, {:.0} CPU ms per sample in this process\ncheckpoint: {}\nplot: {}\ncurves for TensorBoard: tensorboard --logdir {}",
        summary.started_after + 1,
        summary.last_step,
        summary.datasets.join(", "),
        summary.first_loss,
        steps_of(summary.started_after + 1),
        summary.last_loss,
        steps_of((summary.last_step + 1).saturating_sub(n)),
        summary.samples_per_s,
        summary.data_wait * 100.0,
        summary.cpu_s * 1e3 / ((summary.last_step - summary.started_after) * args.batch_size).max(1) as f64,
        summary.checkpoint.display(),
        args.out.join(lake_trainer::run_log::PLOT_FILE).display(),
        args.out.display()
    )?;
    if let Some(weights) = &summary.backbone_weights {
        outln!("backbone: started from {}", weights.display())?;
    }
    if let Some(t) = &transforms {
        outln!(
            "image transforms: {} of {} on each camera frame, handed {} frames",
            t.per_frame(),
            t.names().join(", "),
            args.transform_frames
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `lake train --policy none`: the data path alone, as the run would be fed.
#[cfg(feature = "torch")]
async fn feed_only(options: lake_trainer::train::TrainOptions, rank: u64, log_every: u64) -> anyhow::Result<ExitCode> {
    let (steps, out, device) = (options.steps, options.out.clone(), options.device);
    let summary = lake_trainer::train::feed_only(options, |s| {
        if s.step % log_every == 0 || s.step == steps {
            errln!("step {}/{steps}  {} samples  data wait {:.1} ms of {:.1} ms", s.step, s.samples, s.data_wait_s * 1e3, s.step_s * 1e3);
        }
    })
    .await?;
    if rank != 0 {
        return Ok(ExitCode::SUCCESS);
    }
    outln!(
        "fed {} steps of {} to {device:?} without a model: {:.1} samples/s, {:.2} CPU ms per sample in this process, peak RSS {:.0} MB\nlog: {}",
        summary.steps,
        summary.datasets.join(", "),
        summary.samples_per_s,
        summary.cpu_s_per_sample * 1e3,
        summary.peak_rss_mb,
        out.join(lake_trainer::train::FEED_LOG_FILE).display()
    )?;
    Ok(ExitCode::SUCCESS)
}

/// Where camera frames become RGB (`--frames`): on the GPU of `local_rank` when it runs lake's
/// colour kernel, or where asked.
#[cfg(feature = "torch")]
fn frames(asked: &str, cuda: bool, local_rank: u64) -> anyhow::Result<lake_trainer::train::Frames> {
    use lake_trainer::train::Frames;

    let gpu = || lake_gpu::Gpu::open(usize::try_from(local_rank).unwrap_or(usize::MAX)).map(std::sync::Arc::new);
    Ok(match (asked, cuda) {
        ("rgb24", _) | ("auto", false) => Frames::Rgb24,
        ("yuv420p", false) => Frames::Yuv420p { gpu: None },
        ("yuv420p", true) => Frames::Yuv420p { gpu: Some(gpu().map_err(|e| anyhow::anyhow!("--frames yuv420p on cuda: {e}"))?) },
        ("auto", true) => match gpu() {
            Ok(gpu) => Frames::Yuv420p { gpu: Some(gpu) },
            Err(e) => {
                tracing::warn!("camera frames travel as RGB: lake's colour kernel cannot run here ({e})");
                Frames::Rgb24
            }
        },
        (other, _) => anyhow::bail!("unknown --frames `{other}` (auto, rgb24 or yuv420p)"),
    })
}

/// The ranks of a data-parallel run, and this rank's index on its machine (its GPU):
/// - MPI's when a launcher (`mpirun`, `srun`) started this process (feature `mpi`);
/// - when torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK) describe more than one rank, a
///   group that meets at the TCPStore on MASTER_ADDR:MASTER_PORT: NCCL for `cuda` ranks where
///   libnccl loads, libtorch's Gloo otherwise;
/// - else one process.
///
/// `backend` other than `auto` names the engine, and forms a group even of one rank.
#[cfg(feature = "torch")]
fn ranks(backend: &str, cuda: bool) -> anyhow::Result<(Option<Box<dyn lake_trainer::collective::Collective>>, u64)> {
    use lake_trainer::collective::{Gloo, Launch, Nccl};

    if !["auto", "nccl", "gloo", "mpi"].contains(&backend) {
        anyhow::bail!("unknown --backend `{backend}` (auto, nccl, gloo or mpi)");
    }
    let mpi_world: u64 = ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE"].iter().find_map(|v| std::env::var(v).ok()?.parse().ok()).unwrap_or(1);
    let mpi_launched = ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"].iter().any(|v| std::env::var_os(v).is_some());
    if matches!(backend, "auto" | "mpi") && mpi_launched {
        #[cfg(feature = "mpi")]
        {
            let mpi = lake_trainer::collective::Mpi::init().ok_or_else(|| anyhow::anyhow!("MPI could not be initialised"))?;
            let local = ["OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"]
                .iter()
                .find_map(|v| std::env::var(v).ok()?.parse().ok())
                .unwrap_or(0);
            return Ok((Some(Box::new(mpi)), local));
        }
        #[cfg(not(feature = "mpi"))]
        if mpi_world > 1 || backend == "mpi" {
            anyhow::bail!(
                "this process is one of {mpi_world} MPI ranks, but this lake was built without MPI: build it with the `mpi` \
                 feature (Debian's libopenmpi-dev), or start the ranks with torchrun"
            );
        }
    }
    if backend == "mpi" {
        anyhow::bail!("--backend mpi: this process was not started by mpirun or srun");
    }
    let _ = mpi_world;
    let Some(launch) = Launch::from_env()? else {
        if backend != "auto" {
            anyhow::bail!("--backend {backend}: no ranks to join (RANK and WORLD_SIZE are not set; start the run with torchrun)");
        }
        return Ok((None, 0));
    };
    let local = launch.local_rank;
    let collective: Box<dyn lake_trainer::collective::Collective> = match backend {
        "auto" if launch.world_size == 1 => return Ok((None, local)),
        "auto" if cuda => match Nccl::available() {
            Ok(_) => Box::new(Nccl::connect(&launch)?),
            Err(why) => {
                tracing::warn!("the ranks sum gradients with Gloo through host memory: {why}");
                Box::new(Gloo::connect(&launch)?)
            }
        },
        "nccl" if !cuda => anyhow::bail!("--backend nccl sums GPU memory: train with --device cuda, or take gloo"),
        "nccl" => Box::new(Nccl::connect(&launch)?),
        _ => Box::new(Gloo::connect(&launch)?),
    };
    Ok((Some(collective), local))
}

/// `lake train` in a build without libtorch: says how to get one.
#[cfg(not(feature = "torch"))]
pub async fn train(_root: &str, args: TrainArgs) -> anyhow::Result<ExitCode> {
    check_args(&args)?;
    anyhow::bail!(
        "this lake was built without libtorch, which `lake train` runs on. Build it with the `torch` feature against PyPI's torch 2.11.0, \
         from the repository: `eval \"$(scripts/torch-env.sh --exports)\"` then `cargo build --release -p lake --features torch` \
         (docs/guide/train.md)"
    )
}
