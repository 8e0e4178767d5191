//! Parity with LeRobot 0.4.4's Diffusion policy (`scripts/diffusion_parity.py`): LeRobot reads
//! the `config.json` lake writes and builds the same network (every state-dict key and shape,
//! the same parameter count); with LeRobot's weights loaded, lake's training loss and its
//! sampled actions equal LeRobot's on the same batch and the same random draws.

use std::path::Path;

use lake_trainer::diffusion::{DiffusionInput, DiffusionNet, Draws};
use lake_trainer::{DatasetFeature, DiffusionConfig, FeatureType, HostTensor};
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

    let net = DiffusionNet::new(config, Device::Cpu, Kind::Float).unwrap();
    // Every key and shape LeRobot has, and no other: the load refuses any difference.
    net.load_model_file(ckpt.join("model.safetensors")).unwrap();
    let theirs: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(ckpt.join("parameters.json")).unwrap()).unwrap();
    assert_eq!(net.num_parameters(), theirs["parameters"].as_i64().unwrap(), "{test}: parameters");
    let keys: Vec<&str> = net.named_parameters().iter().map(|(k, _)| k.as_str()).collect();
    let their_keys: Vec<&str> =
        theirs["keys"].as_array().unwrap().iter().map(|k| k.as_str().unwrap()).filter(|k| !k.ends_with("pos_grid")).collect();
    assert_eq!(keys, their_keys, "{test}: the parameters in LeRobot's order");
    // LeRobot's processors normalise to roughly [-1, 1] (MIN_MAX) and around 0 (MEAN_STD).
    tch::manual_seed(11);
    let (b, s) = (3i64, config.n_obs_steps as i64);
    let f = (Kind::Float, Device::Cpu);
    let cameras = config.image_features();
    let state_dim = config.robot_state_feature().unwrap().shape[0] as i64;
    let a = config.action_feature().unwrap().shape[0] as i64;
    let h = config.horizon as i64;
    let state = Tensor::rand([b, s, state_dim], f) * 2.0 - 1.0;
    let images: Vec<Tensor> = cameras.iter().map(|(_, c)| Tensor::randn([b, s, 3, c.shape[1] as i64, c.shape[2] as i64], f)).collect();
    let env = config.env_state_feature().map(|(_, e)| Tensor::rand([b, s, e.shape[0] as i64], f) * 2.0 - 1.0);
    let action = Tensor::rand([b, h, a], f) * 2.0 - 1.0;
    let pad = Tensor::zeros([b, h], (Kind::Bool, Device::Cpu));
    let _ = pad.narrow(0, b - 1, 1).narrow(1, h - 3, 3).fill_(1);
    let noise = Tensor::randn([b, h, a], f);
    let timesteps = Tensor::from_slice(&[3i64, 57, 99]);
    let crop = (2i64, 5i64);
    let start = Tensor::randn([b, h, a], f);
    let steps = config.num_inference_steps.unwrap() as i64;
    let steps_noise = Tensor::randn([steps - 1, b, h, a], f);

    let mut file: Vec<(String, HostTensor)> = vec![
        (lake_trainer::OBS_STATE.into(), host(&state)),
        (lake_trainer::ACTION.into(), host(&action)),
        ("action_is_pad".into(), host(&pad.to_kind(Kind::Float))),
        ("noise".into(), host(&noise)),
        ("timesteps".into(), host(&timesteps)),
        ("crop".into(), host(&Tensor::from_slice(&[crop.0, crop.1]))),
        ("start".into(), host(&start)),
        ("steps_noise".into(), host(&steps_noise)),
    ];
    for ((name, _), img) in cameras.iter().zip(&images) {
        file.push((name.to_string(), host(img)));
    }
    if let (Some((name, _)), Some(env)) = (config.env_state_feature(), &env) {
        file.push((name.to_string(), host(env)));
    }
    let batch = tmp.path().join("batch.safetensors");
    lake_trainer::write_safetensors(&batch, file.iter().map(|(k, v)| (k.as_str(), v))).unwrap();
    let out = tmp.path().join("out.safetensors");
    run_script(python, "diffusion_parity.py", &[Path::new("run"), &ckpt, &batch, &out]);
    let theirs = lake_trainer::read_safetensors(&out).unwrap();

    let input = DiffusionInput { state, images: (!images.is_empty()).then(|| Tensor::stack(&images, 2)), env_state: env };
    let draws = Draws { noise: Some(&noise), timesteps: Some(&timesteps), crop: Some(crop) };
    let loss = net.loss_with(&input, &action, Some(&pad), true, &draws).unwrap().double_value(&[]);
    let their_loss = f64::from(theirs["loss"].values[0]);
    let d_loss = (loss - their_loss).abs();
    let actions = net.predict_with(&input, &start, &steps_noise).unwrap();
    let d_actions = max_abs_diff(&actions, &tensor(&theirs["actions"]));
    eprintln!("{test}: loss lake {loss:.7} LeRobot {their_loss:.7} (|Δ| {d_loss:.2e}); actions max |Δ| {d_actions:.2e}");
    assert!(d_loss <= 1e-5 * loss.abs().max(1.0), "{test}: loss differs by {d_loss}");
    assert_eq!(actions.size(), [b, config.n_action_steps as i64, a]);
    assert!(d_actions <= TOL, "{test}: actions differ by {d_actions}");
    // The comparison can fail: the actions are not constant.
    assert!(actions.std(true).double_value(&[]) > 1e-3);
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
}
