//! `train::train` on a lake: the loss goes down, and a run resumed from its checkpoint ends
//! where the uninterrupted run ends, bit for bit.

use std::path::Path;

use lake_trainer::data::BatchSource;
use lake_trainer::loss::PaddedActions;
use lake_trainer::train::{EvalBatches, EvalOptions, LOG_FILE, StepRecord, TrainOptions, train};
use lake_trainer::{ActConfig, TransformFrames};

use crate::common::fixture_dir;

/// A lake holding the tiny image fixture, ingested under its directory name.
pub(crate) fn lake_with_fixture(dir: &Path) -> lake_store::Lake {
    lake_with(dir, &fixture_dir())
}

/// A lake holding the dataset at `source`, ingested under its directory name.
fn lake_with(dir: &Path, source: &Path) -> lake_store::Lake {
    let lake = lake_store::Lake::create(dir.join("lake").to_str().expect("utf-8")).expect("lake");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime
        .block_on(lake_ingest::ingest(&lake, source.to_str().expect("utf-8"), &Default::default(), &lake_ingest::Progress::default()))
        .expect("ingest");
    lake
}

pub(crate) fn options(lake: &lake_store::Lake, out: &Path, steps: u64) -> TrainOptions {
    TrainOptions {
        lake: Some(lake.clone()),
        datasets: vec!["v30-images-tiny".into()],
        source: BatchSource::InProcess,
        config: lake_trainer::policy::PolicyConfig::Act(Box::new(ActConfig::small())),
        steps,
        batch_size: 8,
        seed: 7,
        device: tch::Device::Cpu,
        kind: tch::Kind::Float,
        bf16: false,
        out: out.to_path_buf(),
        resume: false,
        save_every: 0,
        init_from: None,
        backbone_weights: None,
        padded_actions: Default::default(),
        loader: Default::default(),
        collective: None,
        eval: None,
        frames: Default::default(),
        decode: Default::default(),
        proxy: false,
        frame_size: None,
        image_transforms: None,
        transform_frames: Default::default(),
    }
}

pub(crate) fn run(options: TrainOptions) -> (lake_trainer::train::Summary, Vec<StepRecord>) {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let mut steps = Vec::new();
    let summary = runtime.block_on(train(options, |s| steps.push(s.clone()), |_| ())).expect("training");
    (summary, steps)
}

#[test]
fn the_loss_goes_down_on_the_lakes_samples() {
    let _serial = crate::common::serial();
    let tmp = tempfile::tempdir().expect("tmp");
    let lake = lake_with_fixture(tmp.path());
    let out = tmp.path().join("run");
    let (summary, steps) = run(options(&lake, &out, 120));
    assert_eq!(steps.len(), 120);
    assert_eq!(summary.datasets, ["v30-images-tiny@1"]);
    let mean = |s: &[StepRecord]| s.iter().map(|r| r.loss).sum::<f64>() / s.len() as f64;
    let (first, last) = (mean(&steps[..10]), mean(&steps[110..]));
    eprintln!("loss: first ten steps {first:.3}, last ten {last:.3}");
    assert!(last < first / 3.0, "the loss went from {first} to {last}");
    assert_eq!((summary.loss_steps, summary.first_loss, summary.last_loss), (10, first, last));
    assert!(steps.iter().all(|s| s.loss.is_finite() && s.grad_norm.is_finite()));
    // LeRobot's layout, the newest checkpoint linked as `last`, a line per step in the log.
    let checkpoint = out.join("checkpoints/000120");
    for file in ["pretrained_model/config.json", "pretrained_model/model.safetensors", "training_state/training_step.json"] {
        assert!(checkpoint.join(file).is_file(), "{file}");
    }
    assert_eq!(std::fs::read_link(out.join("checkpoints/last")).expect("last"), Path::new("000120"));
    assert_eq!(std::fs::read_to_string(out.join(LOG_FILE)).expect("log").lines().count(), 120);
    let plot = std::fs::read_to_string(out.join(lake_trainer::train::PLOT_FILE)).expect("the run's plot");
    assert!(plot.contains("loss, steps 1 to 120") && plot.contains("waiting for data: "), "{plot}");
    // A new run into the same directory is refused rather than mixed with the old one.
    let again = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("rt").block_on(train(
        options(&lake, &out, 130),
        |_| (),
        |_| (),
    ));
    assert!(again.expect_err("refused").to_string().contains("--resume"));
    // A config that starts the backbone from torchvision's weights, with no file holding them,
    // is refused before the run writes anything.
    let imagenet = ActConfig { pretrained_backbone_weights: Some("ResNet18_Weights.IMAGENET1K_V1".into()), ..ActConfig::small() };
    let elsewhere = tmp.path().join("imagenet");
    let refused = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("rt").block_on(train(
        TrainOptions { config: lake_trainer::policy::PolicyConfig::Act(Box::new(imagenet)), ..options(&lake, &elsewhere, 10) },
        |_| (),
        |_| (),
    ));
    assert!(refused.expect_err("no weights").to_string().contains("--backbone-weights"));
    assert!(!elsewhere.exists());

    // Samples whose actions go by another name have no `action` for the policy: refused, naming
    // the feature left unused and the view that renames it.
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("rt");
    let record = runtime.block_on(lake.resolve("v30-images-tiny")).expect("the dataset");
    let features = lake_schemas::FeatureMap { rename: [("action".to_string(), "actions".to_string())].into(), ..Default::default() };
    let view = lake_schemas::ViewRecord {
        name: "renamed".into(),
        version: 0,
        dropped: false,
        sql: "(written by the test)".into(),
        created_at: chrono::Utc::now(),
        lake_versions: Vec::new(),
        datasets: vec![lake_schemas::ViewDataset {
            name: "v30-images-tiny".into(),
            version: record.version,
            weight: 1.0,
            episodes: (0..record.counts.episodes as i64).collect(),
            features,
        }],
        digest: None,
    };
    runtime.block_on(lake.put_view(&view, false)).expect("view stored");
    let renamed = tmp.path().join("renamed");
    let refused = runtime
        .block_on(train(TrainOptions { datasets: vec!["renamed".into()], ..options(&lake, &renamed, 10) }, |_| (), |_| ()))
        .expect_err("no action")
        .to_string();
    assert!(
        refused.contains("no `action` feature") && refused.contains("`actions`") && refused.contains("--rename FEATURE=action"),
        "{refused}"
    );
    assert!(!renamed.exists());

    // Image transforms for a policy that reads no camera (here its state as the environment's,
    // the camera dropped) would change nothing: refused before any step.
    let features = lake_schemas::FeatureMap {
        rename: [("observation.state".to_string(), "observation.environment_state".to_string())].into(),
        drop: vec!["observation.images.front".into()],
        ..Default::default()
    };
    let blind = lake_schemas::ViewRecord {
        name: "blind".into(),
        datasets: vec![lake_schemas::ViewDataset { features, ..view.datasets[0].clone() }],
        ..view
    };
    runtime.block_on(lake.put_view(&blind, false)).expect("view stored");
    let out = tmp.path().join("blind");
    let transformed = TrainOptions {
        datasets: vec!["blind".into()],
        image_transforms: Some(crate::common::every_image_transform()),
        ..options(&lake, &out, 2)
    };
    let refused = runtime.block_on(train(transformed, |_| (), |_| ())).expect_err("no camera").to_string();
    assert!(refused.contains("the policy reads no camera"), "{refused}");
    assert!(!out.exists());
}

/// With LeRobot's image transforms on, whose draws follow the step and not the process.
#[test]
fn a_resumed_run_ends_where_the_uninterrupted_run_ends() {
    let _serial = crate::common::serial();
    let tmp = tempfile::tempdir().expect("tmp");
    let lake = lake_with_fixture(tmp.path());
    let transformed = |out: &Path, steps| TrainOptions {
        save_every: 4,
        image_transforms: Some(crate::common::every_image_transform()),
        ..options(&lake, out, steps)
    };
    let whole = tmp.path().join("whole");
    let (_, straight) = run(transformed(&whole, 12));
    // The transforms change what the policy sees: the first step's loss differs without them.
    let (_, plain) = run(options(&lake, &tmp.path().join("plain"), 1));
    assert_ne!(plain[0].loss, straight[0].loss);
    let parts = tmp.path().join("parts");
    run(transformed(&parts, 8));
    // Changed options are refused on resume, before any step.
    let resume =
        |options| tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("rt").block_on(train(options, |_| (), |_| ()));
    let refused = resume(TrainOptions { resume: true, seed: 8, ..transformed(&parts, 12) });
    assert!(refused.expect_err("another seed").to_string().contains("seed 7"));
    let refused = resume(TrainOptions { resume: true, padded_actions: PaddedActions::Zero, ..transformed(&parts, 12) });
    let refused = refused.expect_err("another loss").to_string();
    assert!(refused.contains("counted padded actions as exclude; this one asks for --padded-actions zero"), "{refused}");
    let refused = resume(TrainOptions { resume: true, ..options(&lake, &parts, 12) }).expect_err("no transforms").to_string();
    assert!(refused.ends_with("was made by a run with image transforms; this one asks for none"), "{refused}");
    let refused = resume(TrainOptions { resume: true, transform_frames: TransformFrames::Float, ..transformed(&parts, 12) });
    let refused = refused.expect_err("other frames").to_string();
    assert!(refused.ends_with("were handed uint8 frames; this one asks for --transform-frames float"), "{refused}");
    // A checkpoint without the choice was made by a run that handed its transforms float frames.
    let state = parts.join("checkpoints/last/training_state/lake_run.json");
    let bytes = std::fs::read(&state).expect("run state");
    let mut before: serde_json::Value = serde_json::from_slice(&bytes).expect("JSON");
    assert_eq!(before["transform_frames"], "uint8");
    before.as_object_mut().expect("object").remove("transform_frames");
    std::fs::write(&state, before.to_string()).expect("run state written");
    let refused = resume(TrainOptions { resume: true, ..transformed(&parts, 12) }).expect_err("float frames").to_string();
    assert!(refused.ends_with("were handed float frames; this one asks for --transform-frames uint8"), "{refused}");
    std::fs::write(&state, bytes).expect("run state written");
    let (summary, resumed) = run(TrainOptions { resume: true, ..transformed(&parts, 12) });
    assert_eq!(summary.started_after, 8);
    assert_eq!(resumed.iter().map(|s| s.step).collect::<Vec<_>>(), [9, 10, 11, 12]);
    for (a, b) in straight[8..].iter().zip(&resumed) {
        assert_eq!((a.loss.to_bits(), a.grad_norm.to_bits()), (b.loss.to_bits(), b.grad_norm.to_bits()), "step {}", a.step);
    }
    for file in ["pretrained_model/model.safetensors", "training_state/optimizer_state.safetensors"] {
        let a = std::fs::read(whole.join("checkpoints/000012").join(file)).expect("uninterrupted");
        let b = std::fs::read(parts.join("checkpoints/000012").join(file)).expect("resumed");
        assert!(a == b, "{file} differs after the resume");
    }
}

/// `lake serve` over `root`, started from the `lake` binary built beside this test (the
/// workspace's `cargo build` or `cargo test` makes it).
struct Server {
    child: std::process::Child,
    flight: String,
    local: std::path::PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(root: &Path) -> Server {
    use std::io::BufRead as _;
    let exe = std::env::current_exe().expect("test path");
    let bin = exe.parent().and_then(Path::parent).map(|d| d.join("lake")).expect("target dir");
    assert!(bin.exists(), "{} is missing: build the lake binary first (`cargo build -p lake`)", bin.display());
    let local = root.with_file_name("serve.sock");
    let mut child = std::process::Command::new(&bin)
        .args(["--lake", root.to_str().expect("utf-8"), "serve", "--flight", "127.0.0.1:0", "--http", "127.0.0.1:0", "--threads", "2"])
        .arg("--local")
        .arg(&local)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start lake serve");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("the server says where it listens");
    let flight = line.split_whitespace().find(|w| w.starts_with("grpc://")).unwrap_or_else(|| panic!("{line}")).to_string();
    Server { child, flight, local }
}

#[test]
fn a_run_fed_by_lake_serve_ends_as_the_in_process_run_ends() {
    let _serial = crate::common::serial();
    let tmp = tempfile::tempdir().expect("tmp");
    let lake = lake_with_fixture(tmp.path());
    let server = serve(&tmp.path().join("lake"));
    let runs = [
        ("in-process", BatchSource::InProcess),
        ("flight", BatchSource::Flight { url: server.flight.clone(), token: None, resume_wait: std::time::Duration::ZERO }),
        ("local", BatchSource::Local { path: server.local.clone(), token: None, resume_wait: std::time::Duration::ZERO }),
        // Packets over shared memory, decoded here.
        ("local-packets", BatchSource::Local { path: server.local.clone(), token: None, resume_wait: std::time::Duration::ZERO }),
    ];
    let mut weights = Vec::new();
    for (name, source) in runs {
        let out = tmp.path().join(name);
        // Over Flight the trainer reads no lake: the server gives the datasets' facts.
        let own_lake = (name != "flight").then(|| lake.clone());
        let decode = if name.ends_with("packets") { lake_trainer::train::Decode::Cpu { threads: 2 } } else { Default::default() };
        let (_, steps) = run(TrainOptions { source, lake: own_lake, decode, ..options(&lake, &out, 6) });
        assert_eq!(steps.len(), 6, "{name}");
        weights.push((name, std::fs::read(out.join("checkpoints/000006/pretrained_model/model.safetensors")).expect("weights")));
    }
    for (name, w) in &weights[1..] {
        assert!(*w == weights[0].1, "the run fed over {name} ended with other weights than the in-process run");
    }
}

/// A run at another frame size reads a frame table of that size where the data side decodes,
/// and resizes the frames itself where it decodes the packets, with no table: both end with the
/// same losses and weights, byte for byte, and the policy's cameras take the size.
#[test]
fn runs_at_a_frame_size_end_alike_from_its_frame_table_and_from_packets_resized_here() {
    use lake_trainer::train::{Decode, Frames};
    let _serial = crate::common::serial();
    let tmp = tempfile::tempdir().expect("tmp");
    let name = "v30-h264-multifile";
    let lake = lake_with(tmp.path(), &fixture_dir().with_file_name(name));
    let size = lake_loader::FrameSize { width: 40, height: 30 };
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let ds = lake_loader::LoaderDataset::open(&lake, name).await.expect("open");
        let stored = Default::default();
        lake_loader::write_frame_table(&lake, ds, 2, Default::default(), Some(size), &stored).await.expect("frame table");
    });
    let on = |run_name: &str, decode| TrainOptions {
        datasets: vec![name.into()],
        batch_size: 4,
        frames: Frames::Rgb24,
        decode,
        frame_size: Some(size),
        ..options(&lake, &tmp.path().join(run_name), 4)
    };
    let (_, table) = run(on("table", Decode::Server));
    let (_, packets) = run(on("packets", Decode::Cpu { threads: 2 }));
    let losses = |steps: &[StepRecord]| steps.iter().map(|s| s.loss).collect::<Vec<_>>();
    assert_eq!(losses(&packets), losses(&table));
    let model = |run_name: &str, file: &str| {
        std::fs::read(tmp.path().join(run_name).join("checkpoints/000004/pretrained_model").join(file)).expect("checkpoint file")
    };
    assert!(model("packets", "model.safetensors") == model("table", "model.safetensors"), "the weights differ");
    let config: serde_json::Value = serde_json::from_slice(&model("table", "config.json")).expect("config");
    for camera in ["front", "wrist", "side"] {
        assert_eq!(config["input_features"][format!("observation.images.{camera}")]["shape"], serde_json::json!([3, 30, 40]), "{camera}");
    }
}

/// Held-out evaluations run where asked, see the same samples each time, are drawn on the plot,
/// and leave training as it was: the weights equal those of the run without them.
#[test]
fn held_out_evaluations_leave_the_run_as_it_was() {
    let _serial = crate::common::serial();
    let tmp = tempfile::tempdir().expect("tmp");
    let lake = lake_with_fixture(tmp.path());
    let (plain, evaluated) = (tmp.path().join("plain"), tmp.path().join("evaluated"));
    run(options(&lake, &plain, 6));
    let eval = EvalOptions { datasets: vec!["v30-images-tiny".into()], every: 3, batches: EvalBatches::First(2) };
    let (summary, _) = run(TrainOptions { eval: Some(eval), ..options(&lake, &evaluated, 6) });
    let weights = |run: &Path| std::fs::read(run.join("checkpoints/000006/pretrained_model/model.safetensors")).expect("weights");
    assert!(weights(&plain) == weights(&evaluated), "evaluating changed what the run trained");
    let steps: Vec<u64> = summary.evals.iter().map(|e| e.step).collect();
    assert_eq!(steps, [3, 6]);
    assert!(summary.evals.iter().all(|e| e.loss.is_finite() && e.samples == 16), "{:?}", summary.evals);
    let logged = std::fs::read_to_string(evaluated.join(lake_trainer::train::EVAL_FILE)).expect("eval log");
    assert_eq!(logged.lines().count(), 2, "{logged}");
    let plot = std::fs::read_to_string(evaluated.join(lake_trainer::train::PLOT_FILE)).expect("plot");
    assert!(plot.contains("held-out loss"), "the plot draws the evaluations");
}

/// `--eval-batches all` evaluates every held-out sample once, the last batch short; a weight,
/// which only mixes a shuffle, is refused before the first step.
#[test]
fn an_evaluation_of_all_held_out_samples_reads_each_once() {
    let _serial = crate::common::serial();
    let tmp = tempfile::tempdir().expect("tmp");
    let lake = lake_with_fixture(tmp.path());
    let eval = EvalOptions { datasets: vec!["v30-images-tiny".into()], every: 1, batches: EvalBatches::All };
    let (summary, _) = run(TrainOptions { eval: Some(eval.clone()), ..options(&lake, &tmp.path().join("all"), 2) });
    // 60 steps in batches of 8: seven whole and one of 4.
    assert_eq!(summary.evals.iter().map(|e| (e.step, e.samples)).collect::<Vec<_>>(), [(1, 60), (2, 60)]);
    assert!(summary.evals.iter().all(|e| e.loss.is_finite()), "{:?}", summary.evals);
    let weighted = EvalOptions { datasets: vec!["v30-images-tiny=2".into()], ..eval };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let out = tmp.path().join("weighted");
    let refused = runtime.block_on(train(TrainOptions { eval: Some(weighted), ..options(&lake, &out, 2) }, |_| (), |_| ()));
    let message = refused.expect_err("a weighted evaluation of every sample").to_string();
    assert!(message.contains("--eval-dataset v30-images-tiny=2") && message.contains("--eval-batches N"), "{message}");
    assert!(!out.join(LOG_FILE).exists(), "refused before the first step");
    assert_eq!("all".parse(), Ok(EvalBatches::All));
    assert_eq!("3".parse(), Ok(EvalBatches::First(3)));
    assert!("0".parse::<EvalBatches>().is_err() && "most".parse::<EvalBatches>().is_err());
}

#[test]
fn bf16_mixed_precision_trains_and_keeps_float32_weights() {
    let _serial = crate::common::serial();
    let tmp = tempfile::tempdir().expect("tmp");
    let lake = lake_with_fixture(tmp.path());
    let (full, mixed) = (tmp.path().join("fp32"), tmp.path().join("bf16"));
    let (_, fp32) = run(options(&lake, &full, 40));
    let (_, bf16) = run(TrainOptions { bf16: true, ..options(&lake, &mixed, 40) });
    // The same initial weights and samples, the forward pass in bfloat16: the first losses are
    // close, not equal.
    let (a, b) = (fp32[0].loss, bf16[0].loss);
    assert!(a != b && ((a - b) / a).abs() < 0.05, "first loss fp32 {a}, bf16 {b}");
    let mean = |s: &[StepRecord]| s.iter().map(|r| r.loss).sum::<f64>() / s.len() as f64;
    let (first, last) = (mean(&bf16[..10]), mean(&bf16[30..]));
    let fp32_last = mean(&fp32[30..]);
    eprintln!("bf16: loss {first:.3} -> {last:.3} (fp32: {:.3} -> {fp32_last:.3})", mean(&fp32[..10]));
    assert!(last < first * 0.7, "bf16: the loss went from {first} to {last}");
    assert!(((last - fp32_last) / fp32_last).abs() < 0.25, "bf16 ends at {last}, fp32 at {fp32_last}");
    let weights = std::fs::read(mixed.join("checkpoints/000040/pretrained_model/model.safetensors")).expect("weights");
    let tensors = safetensors::SafeTensors::deserialize(&weights).expect("safetensors");
    assert!(tensors.iter().all(|(_, t)| t.dtype() == safetensors::Dtype::F32), "a bf16 run's checkpoint is float32");
}

#[test]
fn a_run_without_a_model_takes_the_batches_a_run_would_train_on() {
    let _serial = crate::common::serial();
    let tmp = tempfile::tempdir().expect("tmp");
    let lake = lake_with_fixture(tmp.path());
    let out = tmp.path().join("feed");
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let mut steps = Vec::new();
    let summary =
        runtime.block_on(lake_trainer::train::feed_only(options(&lake, &out, 5), |s| steps.push(s.clone()))).expect("the data path alone");
    assert_eq!(steps.iter().map(|s| (s.step, s.samples)).collect::<Vec<_>>(), [(1, 8), (2, 8), (3, 8), (4, 8), (5, 8)]);
    assert!(steps.iter().all(|s| s.data_wait_s <= s.step_s));
    assert!(summary.samples_per_s > 0.0 && summary.cpu_s_per_sample > 0.0 && summary.peak_rss_mb > 0.0, "{summary:?}");
    assert_eq!(summary.datasets, ["v30-images-tiny@1"]);
    let log = std::fs::read_to_string(out.join(lake_trainer::train::FEED_LOG_FILE)).expect("feed log");
    assert_eq!(log.lines().count(), 5, "{log}");
    assert!(!out.join("checkpoints").exists(), "no model, no checkpoint");
    // A dataset the policy cannot read is refused as it is by a training run.
    let refused = runtime.block_on(lake_trainer::train::feed_only(
        TrainOptions { datasets: vec!["no-such-dataset".into()], ..options(&lake, &out, 5) },
        |_| (),
    ));
    assert!(refused.expect_err("unknown dataset").to_string().contains("no-such-dataset"));
}

/// Runs fed the decoder's YUV planes, which the trainer converts (here on the CPU, by the GPU
/// kernel's twin), or the cameras' packets, which the trainer decodes (into RGB, or into planes
/// it converts), end with the weights of the run fed RGB frames, byte for byte: every path
/// gives the loader's RGB to the bit. The dataset's three H.264 cameras all travel as planes.
#[test]
fn runs_fed_yuv_planes_or_packets_end_as_the_run_fed_rgb_frames() {
    use lake_trainer::train::{Decode, Frames};
    let _serial = crate::common::serial();
    let tmp = tempfile::tempdir().expect("tmp");
    let source = fixture_dir().with_file_name("v30-h264-multifile");
    let lake = lake_with(tmp.path(), &source);
    let on = |name: &str, frames, decode| TrainOptions {
        datasets: vec!["v30-h264-multifile".into()],
        batch_size: 4,
        frames,
        decode,
        ..options(&lake, &tmp.path().join(name), 4)
    };
    let (_, rgb) = run(on("rgb", Frames::Rgb24, Decode::Server));
    let losses = |steps: &[StepRecord]| steps.iter().map(|s| s.loss).collect::<Vec<_>>();
    let weights =
        |name: &str| std::fs::read(tmp.path().join(name).join("checkpoints/000004/pretrained_model/model.safetensors")).expect("weights");
    for (name, frames, decode) in [
        ("yuv", Frames::Yuv420p { gpu: None }, Decode::Server),
        ("packets", Frames::Rgb24, Decode::Cpu { threads: 2 }),
        ("packets-yuv", Frames::Yuv420p { gpu: None }, Decode::Cpu { threads: 2 }),
    ] {
        let (_, steps) = run(on(name, frames, decode));
        assert_eq!(losses(&steps), losses(&rgb), "{name}");
        assert!(weights(name) == weights("rgb"), "{name}: the weights differ");
    }
    // The planes did travel: a sample of the same request as planes has yuv420p cameras.
    let request = lake_client::SampleRequest {
        frame_format: lake_client::FrameFormat::Yuv420p,
        batch_size: 2,
        ..lake_client::SampleRequest::new(["v30-h264-multifile".to_owned()])
    };
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let feed = runtime
        .block_on(lake_trainer::data::open_feed(Some(&lake), &request, &BatchSource::InProcess, Default::default()))
        .expect("a feed");
    let cameras = feed.schema.fields().iter().filter(|f| f.metadata().get("pixel_format").is_some_and(|p| p == "yuv420p")).count();
    assert_eq!(cameras, 3, "{:?}", feed.schema);
}
