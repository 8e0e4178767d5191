//! Parity with LeRobot 0.4.4's Diffusion policy (`scripts/diffusion_parity.py`): LeRobot reads
//! the `config.json` lake writes and builds the same network (every state-dict key and shape,
//! the same parameter count); with LeRobot's weights loaded, lake's training loss and its
//! sampled actions equal LeRobot's on the same batch and the same random draws.

use std::collections::HashMap;
use std::path::Path;

use lake_trainer::diffusion::{DiffusionBatch, DiffusionInput, DiffusionNet, DiffusionPolicy, Draws};
use lake_trainer::loss::PaddedActions;
use lake_trainer::optim::{Adam, cosine_with_warmup};
use lake_trainer::{DatasetFeature, DiffusionConfig, FeatureType, HostTensor, Stats};
use tch::{Device, Kind, Tensor};

use crate::common::*;

/// Actions after the whole reverse process: LeRobot's tolerance for ACT's actions
/// (`docs/design/act.md` §9), which these meet with room to spare.
const TOL: f64 = 1e-4;

fn small(features: &[DatasetFeature]) -> DiffusionConfig {
    DiffusionConfig {
        horizon: 8,
        n_action_steps: 4,
        crop_shape: Some([32, 40]),
        down_dims: vec![32, 64],
        diffusion_step_embed_dim: 32,
        spatial_softmax_num_keypoints: 8,
        num_inference_steps: Some(10),
        ..DiffusionConfig::with_features(features)
    }
}

/// Compares lake's network with LeRobot's for `config`, both starting from the weights LeRobot
/// makes.
fn compare(test: &str, config: &DiffusionConfig, python: &Path) {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("config");
    std::fs::create_dir_all(&cfg).unwrap();
    std::fs::write(cfg.join("config.json"), config.to_json()).unwrap();
    let ckpt = tmp.path().join("lerobot");
    run_script(python, "diffusion_parity.py", &[Path::new("make"), &cfg.join("config.json"), Path::new("7"), &ckpt]);

    let net = DiffusionNet::new(config, Device::Cpu, Kind::Float).unwrap().with_padded_actions(PaddedActions::Zero);
    // Every key and shape LeRobot has, and no other: the load refuses any difference.
    net.load_model_file(ckpt.join("model.safetensors")).unwrap();
    // Written back, the weights make LeRobot's file byte for byte (BatchNorm's counters int64).
    let again = tmp.path().join("again.safetensors");
    net.save_model_file(&again).unwrap();
    assert!(std::fs::read(&again).unwrap() == std::fs::read(ckpt.join("model.safetensors")).unwrap(), "{test}: lake's model.safetensors");
    let theirs: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(ckpt.join("parameters.json")).unwrap()).unwrap();
    assert_eq!(net.num_parameters(), theirs["parameters"].as_i64().unwrap(), "{test}: parameters");
    let keys: Vec<&str> = net.named_parameters().iter().map(|(k, _)| k.as_str()).collect();
    // Their state dict's keys, less its buffers: the spatial softmax's grid, BatchNorm's statistics.
    let buffer = |k: &str| ["pos_grid", "running_mean", "running_var", "num_batches_tracked"].iter().any(|b| k.ends_with(b));
    let their_keys: Vec<&str> = theirs["keys"].as_array().unwrap().iter().map(|k| k.as_str().unwrap()).filter(|k| !buffer(k)).collect();
    assert_eq!(keys, their_keys, "{test}: the parameters in LeRobot's order");
    // LeRobot's processors normalise to roughly [-1, 1] (MIN_MAX) and around 0 (MEAN_STD).
    let d = Drawn::new(config, false);
    let theirs = d.run_lerobot(python, &ckpt, tmp.path());

    let input = DiffusionInput {
        state: d.state.shallow_clone(),
        images: (!d.images.is_empty()).then(|| Tensor::stack(&d.images, 2)),
        env_state: d.env.as_ref().map(Tensor::shallow_clone),
    };
    let loss = net.loss_with(&input, &d.action, Some(&d.pad), true, &d.draws()).unwrap();
    let actions = net.predict_with(&input, &d.start, &d.steps_noise).unwrap();
    agree(test, config, &loss, &actions, &theirs, "actions");

    // The newest LeRobot loads the same weights and leaves padded actions out of the mean, as
    // lake does by default.
    if let Some(newest) = newest_lerobot_python(test) {
        let theirs = d.run_lerobot(&newest, &ckpt, tmp.path());
        let net = net.with_padded_actions(PaddedActions::Exclude);
        let loss = net.loss_with(&input, &d.action, Some(&d.pad), true, &d.draws()).unwrap();
        agree(&format!("{test}, the newest LeRobot"), config, &loss, &actions, &theirs, "actions");
    }
}

/// Asserts that lake's loss and actions are LeRobot's (`theirs[actions_key]`).
fn agree(test: &str, config: &DiffusionConfig, loss: &Tensor, actions: &Tensor, theirs: &HashMap<String, HostTensor>, actions_key: &str) {
    let loss = loss.double_value(&[]);
    let their_loss = f64::from(theirs["loss"].values[0]);
    let d_loss = (loss - their_loss).abs();
    let d_actions = max_abs_diff(actions, &tensor(&theirs[actions_key]));
    eprintln!("{test}: loss lake {loss:.7} LeRobot {their_loss:.7} (|Δ| {d_loss:.2e}); {actions_key} max |Δ| {d_actions:.2e}");
    assert!(d_loss <= 1e-5 * loss.abs().max(1.0), "{test}: loss differs by {d_loss}");
    let a = config.action_feature().unwrap().shape[0] as i64;
    assert_eq!(actions.size()[1..], [config.n_action_steps as i64, a]);
    assert!(d_actions <= TOL, "{test}: {actions_key} differ by {d_actions}");
    // The comparison can fail: the actions are not constant.
    assert!(actions.std(true).double_value(&[]) > 1e-3);
}

/// A batch and every random draw of a loss and a sampling, written where LeRobot reads them.
struct Drawn {
    state: Tensor,
    images: Vec<Tensor>,
    env: Option<Tensor>,
    action: Tensor,
    pad: Tensor,
    noise: Tensor,
    timesteps: Tensor,
    crop: (i64, i64),
    start: Tensor,
    steps_noise: Tensor,
}

impl Drawn {
    /// Normalised values, or (`raw`) values in a dataset's units: states and actions within
    /// [`stats`]'s ranges, frames in [0, 1].
    fn new(config: &DiffusionConfig, raw: bool) -> Self {
        tch::manual_seed(11);
        let (b, s) = (3i64, config.n_obs_steps as i64);
        let f = (Kind::Float, Device::Cpu);
        let state_dim = config.robot_state_feature().unwrap().shape[0] as i64;
        let a = config.action_feature().unwrap().shape[0] as i64;
        let h = config.horizon as i64;
        // In the units of `stats` ([-2, 3]) or normalised ([-1, 1]).
        let ranged = |shape: &[i64]| if raw { Tensor::rand(shape, f) * 5.0 - 2.0 } else { Tensor::rand(shape, f) * 2.0 - 1.0 };
        let frames = |shape: &[i64]| if raw { Tensor::rand(shape, f) } else { Tensor::randn(shape, f) };
        let images = config.image_features().iter().map(|(_, c)| frames(&[b, s, 3, c.shape[1] as i64, c.shape[2] as i64])).collect();
        let pad = Tensor::zeros([b, h], (Kind::Bool, Device::Cpu));
        let _ = pad.narrow(0, b - 1, 1).narrow(1, h - 3, 3).fill_(1);
        let steps = config.num_inference_steps.unwrap() as i64;
        Drawn {
            state: ranged(&[b, s, state_dim]),
            images,
            env: config.env_state_feature().map(|(_, e)| ranged(&[b, s, e.shape[0] as i64])),
            action: ranged(&[b, h, a]),
            pad,
            noise: Tensor::randn([b, h, a], f),
            timesteps: Tensor::from_slice(&[3i64, 57, 99]),
            crop: (2, 5),
            start: Tensor::randn([b, h, a], f),
            steps_noise: Tensor::randn([steps - 1, b, h, a], f),
        }
    }

    fn draws(&self) -> Draws<'_> {
        Draws { noise: Some(&self.noise), timesteps: Some(&self.timesteps), crop: Some(self.crop) }
    }

    /// `diffusion_parity.py run` on this batch with the checkpoint `ckpt`.
    fn run_lerobot(&self, python: &Path, ckpt: &Path, tmp: &Path) -> HashMap<String, HostTensor> {
        let config = DiffusionConfig::from_json(&std::fs::read_to_string(ckpt.join("config.json")).unwrap()).unwrap();
        let mut file: Vec<(String, HostTensor)> = vec![
            (lake_trainer::OBS_STATE.into(), host(&self.state)),
            (lake_trainer::ACTION.into(), host(&self.action)),
            ("action_is_pad".into(), host(&self.pad.to_kind(Kind::Float))),
            ("noise".into(), host(&self.noise)),
            ("timesteps".into(), host(&self.timesteps)),
            ("crop".into(), host(&Tensor::from_slice(&[self.crop.0, self.crop.1]))),
            ("start".into(), host(&self.start)),
            ("steps_noise".into(), host(&self.steps_noise)),
        ];
        for ((name, _), img) in config.image_features().iter().zip(&self.images) {
            file.push((name.to_string(), host(img)));
        }
        if let (Some((name, _)), Some(env)) = (config.env_state_feature(), &self.env) {
            file.push((name.to_string(), host(env)));
        }
        let batch = tmp.join("batch.safetensors");
        lake_trainer::write_safetensors(&batch, file.iter().map(|(k, v)| (k.as_str(), v))).unwrap();
        let out = tmp.join("out.safetensors");
        run_script(python, "diffusion_parity.py", &[Path::new("run"), ckpt, &batch, &out]);
        lake_trainer::read_safetensors(&out).unwrap().into_iter().collect()
    }

    fn batch(&self) -> DiffusionBatch {
        DiffusionBatch {
            state: self.state.shallow_clone(),
            images: self.images.iter().map(Tensor::shallow_clone).collect(),
            env_state: self.env.as_ref().map(Tensor::shallow_clone),
            action: Some(self.action.shallow_clone()),
            action_is_pad: Some(self.pad.shallow_clone()),
        }
    }
}

/// Statistics for `config` in the units [`Drawn::new`] draws raw values in.
fn stats(config: &DiffusionConfig) -> Stats {
    let mut stats = Stats::new();
    for (name, f) in config.input_features.iter().chain(config.output_features.iter()) {
        match f.kind {
            FeatureType::Visual => stats.set_imagenet(name),
            _ => {
                let n = f.shape[0];
                let lo: Vec<f32> = (0..n).map(|i| -2.0 + 0.1 * i as f32).collect();
                let hi: Vec<f32> = (0..n).map(|i| 3.0 - 0.2 * i as f32).collect();
                stats.set_min_max(name, &lo, &hi);
            }
        }
    }
    stats
}

#[test]
fn a_diffusion_policy_lake_saved_loads_in_lerobot_and_gives_the_same_loss_and_actions() {
    let _serial = serial();
    let Some(python) = lerobot_python("a_diffusion_policy_lake_saved_loads_in_lerobot_and_gives_the_same_loss_and_actions") else {
        return;
    };
    let features = [
        DatasetFeature::new("observation.images.front", FeatureType::Visual, [3, 36, 48]),
        DatasetFeature::new(lake_trainer::OBS_STATE, FeatureType::State, [6]),
        DatasetFeature::new(lake_trainer::OBS_ENV_STATE, FeatureType::Env, [4]),
        DatasetFeature::new(lake_trainer::ACTION, FeatureType::Action, [6]),
    ];
    let config = small(&features);
    tch::manual_seed(3);
    let policy = DiffusionPolicy::new(&config, stats(&config), Device::Cpu, Kind::Float).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("pretrained_model");
    policy.save_pretrained(&dir).unwrap();

    // LeRobot's preprocessor normalises the raw batch, its postprocessor unnormalises.
    let d = Drawn::new(&config, true);
    let theirs = d.run_lerobot(&python, &dir, tmp.path());
    let batch = d.batch();
    let loss = policy.loss_with(&batch, true, &d.draws()).unwrap();
    let normalized = policy.net().predict_with(&policy.normalize(&batch).unwrap(), &d.start, &d.steps_noise).unwrap();
    agree("lake to LeRobot", &config, &loss, &normalized, &theirs, "actions");
    let actions = policy.predict_actions_with(&batch, &d.start, &d.steps_noise).unwrap();
    agree("lake to LeRobot", &config, &loss, &actions, &theirs, "actions_unnormalized");

    // And back: the files give lake the same policy.
    let again = DiffusionPolicy::from_pretrained(&dir, Device::Cpu, Kind::Float).unwrap();
    assert_eq!(again.processors(), policy.processors());
    let same = again.predict_actions_with(&batch, &d.start, &d.steps_noise).unwrap();
    assert_eq!(max_abs_diff(&same, &actions), 0.0);
}

#[test]
fn lerobot_builds_lakes_diffusion_config_and_both_compute_the_same_loss_and_actions() {
    let _serial = serial();
    let Some(python) = lerobot_python("lerobot_builds_lakes_diffusion_config_and_both_compute_the_same_loss_and_actions") else {
        return;
    };
    let one_camera = [
        DatasetFeature::new("observation.images.front", FeatureType::Visual, [3, 36, 48]),
        DatasetFeature::new(lake_trainer::OBS_STATE, FeatureType::State, [6]),
        DatasetFeature::new(lake_trainer::ACTION, FeatureType::Action, [6]),
    ];
    compare("one camera", &small(&one_camera), &python);

    // Two cameras with an encoder each, an environment state, the actions predicted instead of
    // the noise, FiLM biases only, padded actions left out of the loss, no clipping.
    let two_cameras = [
        DatasetFeature::new("observation.images.left", FeatureType::Visual, [3, 36, 48]),
        DatasetFeature::new("observation.images.right", FeatureType::Visual, [3, 36, 48]),
        DatasetFeature::new(lake_trainer::OBS_STATE, FeatureType::State, [4]),
        DatasetFeature::new(lake_trainer::OBS_ENV_STATE, FeatureType::Env, [5]),
        DatasetFeature::new(lake_trainer::ACTION, FeatureType::Action, [3]),
    ];
    let config = DiffusionConfig {
        use_separate_rgb_encoder_per_camera: true,
        prediction_type: "sample".into(),
        use_film_scale_modulation: false,
        do_mask_loss_for_padding: true,
        clip_sample: false,
        n_obs_steps: 3,
        n_groups: 4,
        ..small(&two_cameras)
    };
    compare("two cameras", &config, &python);

    // BatchNorm in the backbone (LeRobot 0.6.1's default): the training forward moves its
    // running statistics, which the sampling after it reads.
    compare("BatchNorm", &DiffusionConfig { use_group_norm: false, ..small(&one_camera) }, &python);
    compare("BatchNorm, an encoder a camera", &DiffusionConfig { use_group_norm: false, ..config }, &python);
}

/// torchvision's name of a tensor of a Diffusion backbone (`nn.Sequential` of ResNet-18's
/// children: 0 conv1, 1 bn1, 4 to 7 layer1 to layer4).
fn torchvision_name(rest: &str) -> String {
    let (first, tail) = rest.split_once('.').unwrap();
    let named = match first {
        "0" => "conv1".to_string(),
        "1" => "bn1".to_string(),
        n => format!("layer{}", n.parse::<usize>().unwrap() - 3),
    };
    format!("{named}.{tail}")
}

#[test]
fn backbone_weights_start_every_cameras_batchnorm_backbone() {
    use lake_trainer::act::PolicyOptions;
    use lake_trainer::policy::{Policy, PolicyConfig};

    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let features = [
        DatasetFeature::new("observation.images.left", FeatureType::Visual, [3, 36, 48]),
        DatasetFeature::new("observation.images.right", FeatureType::Visual, [3, 36, 48]),
        DatasetFeature::new(lake_trainer::OBS_STATE, FeatureType::State, [4]),
        DatasetFeature::new(lake_trainer::ACTION, FeatureType::Action, [3]),
    ];
    let config = DiffusionConfig { use_group_norm: false, ..small(&features) };
    // A donor's backbone, moved by a training forward so that its running statistics are not
    // the initial ones, written under torchvision's names with the classifier torchvision has.
    tch::manual_seed(5);
    let donor = DiffusionPolicy::new(&config, stats(&config), Device::Cpu, Kind::Float).unwrap();
    let d = Drawn::new(&config, true);
    let _moved = donor.loss_with(&d.batch(), true, &d.draws()).unwrap();
    let prefix = "diffusion.rgb_encoder.backbone.";
    let mut file: Vec<(String, HostTensor)> =
        donor.net().state_dict().filter_map(|(k, t)| Some((torchvision_name(k.strip_prefix(prefix)?), host(t)))).collect();
    assert_eq!(file.iter().filter(|(k, _)| k.ends_with("num_batches_tracked")).count(), 20);
    file.push(("fc.weight".into(), HostTensor::new([2, 512], vec![0.5; 1024])));
    let weights = tmp.path().join("resnet18.safetensors");
    lake_trainer::write_safetensors(&weights, file.iter().map(|(k, v)| (k.as_str(), v))).unwrap();

    let options = PolicyOptions { backbone_weights: Some(weights.clone()), ..PolicyOptions::default() };
    for separate in [false, true] {
        let config = DiffusionConfig { use_separate_rgb_encoder_per_camera: separate, ..config.clone() };
        tch::manual_seed(6);
        let Policy::Diffusion(policy) = Policy::new(PolicyConfig::Diffusion(Box::new(config.clone())), stats(&config), &options).unwrap()
        else {
            panic!("a Diffusion policy")
        };
        let mut started = 0;
        for (key, t) in policy.net().state_dict() {
            let Some((_, rest)) = key.split_once(".backbone.") else { continue };
            let given = file.iter().find(|(k, _)| *k == torchvision_name(rest)).map(|(_, v)| v).unwrap();
            assert_eq!(max_abs_diff(t, &tensor(given).view(t.size().as_slice())), 0.0, "{key}");
            started += 1;
        }
        // 120 tensors a backbone (60 parameters, 60 BatchNorm buffers), on each encoder.
        assert_eq!(started, if separate { 2 * 120 } else { 120 }, "separate encoders: {separate}");
    }

    // GroupNorm would ruin them; a file of another network names its tensor.
    let grouped = DiffusionConfig { use_group_norm: true, ..config.clone() };
    let refused = Policy::new(PolicyConfig::Diffusion(Box::new(grouped.clone())), stats(&grouped), &options).unwrap_err().to_string();
    assert!(refused.contains("GroupNorm"), "{refused}");
    file.push(("layer5.0.conv1.weight".into(), HostTensor::new([1], vec![0.0])));
    lake_trainer::write_safetensors(&weights, file.iter().map(|(k, v)| (k.as_str(), v))).unwrap();
    let refused = Policy::new(PolicyConfig::Diffusion(Box::new(config.clone())), stats(&config), &options).unwrap_err().to_string();
    assert!(refused.contains("layer5.0.conv1.weight"), "{refused}");
}

#[test]
fn diffusion_training_steps_match_lerobots_update_policy() {
    let _serial = serial();
    let Some(python) = lerobot_python("diffusion_training_steps_match_lerobots_update_policy") else { return };
    let features = [
        DatasetFeature::new("observation.images.front", FeatureType::Visual, [3, 36, 48]),
        DatasetFeature::new(lake_trainer::OBS_STATE, FeatureType::State, [6]),
        DatasetFeature::new(lake_trainer::ACTION, FeatureType::Action, [6]),
    ];
    // Both backbones LeRobot builds: GroupNorm (0.4.4's default) and BatchNorm (0.6.1's), whose
    // running statistics each training forward moves, compared with the parameters.
    for norm in ["GroupNorm", "BatchNorm"] {
        // A large learning rate and a short warm-up, so that the steps move the parameters far
        // and the schedule's both parts are taken; L2 weight decay large enough to count.
        let config = DiffusionConfig {
            optimizer_lr: 1e-3,
            optimizer_weight_decay: 1e-2,
            scheduler_warmup_steps: 2,
            do_mask_loss_for_padding: true,
            use_group_norm: norm == "GroupNorm",
            ..small(&features)
        };
        let (steps, total) = (4u64, 6u64);
        tch::manual_seed(21);
        let policy =
            DiffusionPolicy::new(&config, stats(&config), Device::Cpu, Kind::Float).unwrap().with_padded_actions(PaddedActions::Zero);
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("pretrained_model");
        policy.save_pretrained(&dir).unwrap();
        let d = Drawn::new(&config, true);
        // Each step's own draws.
        let (b, h, a) = (d.action.size()[0], config.horizon as i64, 6);
        let noise = Tensor::randn([steps as i64, b, h, a], (Kind::Float, Device::Cpu));
        let timesteps = Tensor::randint(100, [steps as i64, b], (Kind::Int64, Device::Cpu));
        let crops: Vec<(i64, i64)> = (0..steps as i64).map(|k| (k % 5, (3 * k) % 9)).collect();
        let flat_crops: Vec<i64> = crops.iter().flat_map(|&(t, l)| [t, l]).collect();
        let file: Vec<(String, HostTensor)> = vec![
            (lake_trainer::OBS_STATE.into(), host(&d.state)),
            ("observation.images.front".into(), host(&d.images[0])),
            (lake_trainer::ACTION.into(), host(&d.action)),
            ("action_is_pad".into(), host(&d.pad.to_kind(Kind::Float))),
            ("noise".into(), host(&noise)),
            ("timesteps".into(), host(&timesteps)),
            ("crop".into(), host(&Tensor::from_slice(&flat_crops).view([steps as i64, 2]))),
        ];
        let batch_path = tmp.path().join("batch.safetensors");
        lake_trainer::write_safetensors(&batch_path, file.iter().map(|(k, v)| (k.as_str(), v))).unwrap();
        let out = tmp.path().join("trained.safetensors");
        let (steps_arg, total_arg) = (steps.to_string(), total.to_string());
        run_script(
            &python,
            "diffusion_parity.py",
            &[Path::new("train"), &dir, &batch_path, Path::new(&steps_arg), Path::new(&total_arg), &out],
        );
        let theirs = lake_trainer::read_safetensors(&out).unwrap();

        let initial: Vec<Tensor> = policy.net().state_dict().map(|(_, t)| t.copy()).collect();
        let mut opt = Adam::diffusion(&policy);
        let batch = d.batch();
        for k in 0..steps {
            let lr = config.optimizer_lr * cosine_with_warmup(k, config.scheduler_warmup_steps as u64, total);
            opt.set_lr(0, lr).unwrap();
            let draws =
                Draws { noise: Some(&noise.get(k as i64)), timesteps: Some(&timesteps.get(k as i64)), crop: Some(crops[k as usize]) };
            let loss = policy.loss_with(&batch, true, &draws).unwrap();
            let norm = opt.step(&loss).unwrap();
            let (l, tl) = (loss.double_value(&[]), f64::from(theirs[&format!("loss_{k}")].values[0]));
            let tn = f64::from(theirs[&format!("grad_norm_{k}")].values[0]);
            let tlr = f64::from(theirs[&format!("lr_{k}")].values[0]);
            eprintln!(
                "{norm}, step {k}: lr lake {lr:.3e} LeRobot {tlr:.3e}; loss lake {l:.6} LeRobot {tl:.6}; grad norm lake {norm:.6} LeRobot {tn:.6}"
            );
            assert!((lr - tlr).abs() <= 1e-6 * lr.max(1e-12), "step {k}: lr {lr} vs {tlr}");
            assert!((l - tl).abs() <= 1e-4 * tl.abs().max(1.0), "step {k}: loss {l} vs {tl}");
            assert!((norm - tn).abs() <= 1e-3 * tn.abs().max(1.0), "step {k}: grad norm {norm} vs {tn}");
        }
        // Adam divides by the root of the second moment: an element whose gradient is rounding noise
        // (the spatial softmax is nearly blind to some biases before it) takes a step of about the
        // learning rate in the noise's direction. Every other element agrees to a few ulps.
        let steps_lr: f64 =
            (0..steps).map(|k| config.optimizer_lr * cosine_with_warmup(k, config.scheduler_warmup_steps as u64, total)).sum();
        let (mut worst, mut moved, mut apart, mut elements) = (0.0f64, 0.0f64, 0i64, 0i64);
        for ((key, t), before) in policy.net().state_dict().zip(&initial) {
            let diff = (t - tensor(&theirs[key])).abs();
            worst = worst.max(diff.max().double_value(&[]));
            apart += diff.gt(1e-6).sum(Kind::Int64).int64_value(&[]);
            elements += t.numel() as i64;
            if !key.ends_with("num_batches_tracked") {
                moved = moved.max(max_abs_diff(t, before));
            }
        }
        eprintln!(
            "{norm}, after {steps} steps: {apart} of {elements} parameters differ by over 1e-6, the most by {worst:.3e}; largest move {moved:.3e}"
        );
        assert!(moved > 1e-3, "the steps hardly moved the parameters ({moved})");
        assert!(apart <= 64, "{apart} parameters differ by over 1e-6");
        assert!(worst <= steps_lr, "parameters differ by {worst}, more than the steps' learning rates ({steps_lr})");
    }
}

/// The small Diffusion config `lake train` runs on the fixture: a short warm-up, so that the
/// few steps of a test learn.
pub(crate) fn run_config() -> lake_trainer::policy::PolicyConfig {
    lake_trainer::policy::PolicyConfig::Diffusion(Box::new(DiffusionConfig { optimizer_lr: 1e-3, scheduler_warmup_steps: 5, ..small(&[]) }))
}

#[test]
fn lake_train_trains_diffusion_resumes_exactly_and_writes_what_lerobot_loads() {
    use crate::run::{lake_with_fixture, options, run};
    use lake_trainer::train::TrainOptions;

    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let lake = lake_with_fixture(tmp.path());
    let out = tmp.path().join("run");
    let total = 150;
    let (summary, steps) = run(TrainOptions { config: run_config(), save_every: 50, ..options(&lake, &out, total) });
    assert_eq!(steps.len(), total as usize);
    assert!(steps.iter().all(|s| s.loss.is_finite() && s.grad_norm.is_finite() && s.l1.is_none() && s.kld.is_none()));
    let mean = |s: &[lake_trainer::train::StepRecord]| s.iter().map(|r| r.loss).sum::<f64>() / s.len() as f64;
    let (first, last) = (mean(&steps[..10]), mean(&steps[steps.len() - 10..]));
    eprintln!("diffusion loss: first ten steps {first:.3}, last ten {last:.3}");
    assert!(last < first * 0.8, "the loss went from {first} to {last}");
    assert_eq!(summary.datasets, ["v30-images-tiny@1"]);
    // The schedule's state as torch's LambdaLR saves it: 100 updates done, the next one's rate.
    let scheduler: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("checkpoints/000100/training_state/scheduler_state.json")).unwrap())
            .unwrap();
    let next = 1e-3 * cosine_with_warmup(100, 5, total);
    assert_eq!((scheduler["last_epoch"].as_u64(), scheduler["_last_lr"][0].as_f64()), (Some(100), Some(next)), "{scheduler}");

    // A run stopped after its checkpoint at step 100 and resumed repeats the uninterrupted one,
    // bit for bit: the schedule, the draws and the optimizer pick up at the step.
    let parts = tmp.path().join("parts");
    copy_tree(&out.join("checkpoints/000100"), &parts.join("checkpoints/000100"));
    std::os::unix::fs::symlink("000100", parts.join("checkpoints/last")).unwrap();
    let (resumed_summary, resumed) =
        run(TrainOptions { config: run_config(), resume: true, save_every: 50, ..options(&lake, &parts, total) });
    assert_eq!(resumed_summary.started_after, 100);
    for (a, b) in steps[100..].iter().zip(&resumed) {
        assert_eq!((a.loss.to_bits(), a.grad_norm.to_bits()), (b.loss.to_bits(), b.grad_norm.to_bits()), "step {}", a.step);
    }
    for file in ["pretrained_model/model.safetensors", "training_state/optimizer_state.safetensors"] {
        let a = std::fs::read(out.join("checkpoints/000150").join(file)).unwrap();
        let b = std::fs::read(parts.join("checkpoints/000150").join(file)).unwrap();
        assert!(a == b, "{file} differs after the resume");
    }
    // An ACT run cannot resume it.
    let refused = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap().block_on(lake_trainer::train::train(
        TrainOptions { resume: true, ..options(&lake, &parts, 200) },
        |_| (),
        |_| (),
    ));
    assert!(refused.expect_err("another policy").to_string().contains("holds a diffusion policy"));

    // LeRobot loads the run's checkpoint and computes what lake computes with it.
    let Some(python) = lerobot_python("lake_train_trains_diffusion_resumes_exactly_and_writes_what_lerobot_loads") else { return };
    let dir = out.join("checkpoints/000150/pretrained_model");
    let policy = DiffusionPolicy::from_pretrained(&dir, Device::Cpu, Kind::Float).unwrap();
    let config = policy.net().config().clone();
    assert_eq!(config.image_features().len(), 1, "the fixture's camera");
    let d = Drawn::new(&config, true);
    let theirs = d.run_lerobot(&python, &dir, tmp.path());
    let batch = d.batch();
    let loss = policy.loss_with(&batch, true, &d.draws()).unwrap();
    let actions = policy.predict_actions_with(&batch, &d.start, &d.steps_noise).unwrap();
    agree("lake train's checkpoint", &config, &loss, &actions, &theirs, "actions_unnormalized");
    if let Some(newest) = newest_lerobot_python("lake_train_trains_diffusion_resumes_exactly_and_writes_what_lerobot_loads") {
        let theirs = d.run_lerobot(&newest, &dir, tmp.path());
        agree("lake train's checkpoint in the newest LeRobot", &config, &loss, &actions, &theirs, "actions_unnormalized");
    }
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let dest = to.join(path.file_name().unwrap());
        if path.is_dir() {
            copy_tree(&path, &dest);
        } else {
            std::fs::copy(&path, &dest).unwrap();
        }
    }
}
