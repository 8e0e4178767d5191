//! Parity with LeRobot 0.4.4 (`scripts/act_parity.py`): checkpoints written by lake load in
//! LeRobot (and in the newest, 0.6.1, where its venv is here) and predict the same actions, LeRobot's load in lake, losses and optimizer steps
//! agree. Tolerance 1e-4 (max abs) on actions, as `docs/design/act.md` §9 sets.

use std::path::Path;

use lake_trainer::act::{ActPolicy, Adam, PolicyOptions};
use lake_trainer::loss::PaddedActions;
use lake_trainer::{ActConfig, DatasetFeature, FeatureType, HostTensor, NormalizationMode, OrderedMap, Stats};
use tch::Tensor;

use crate::common::*;

const TOL: f64 = 1e-4;

/// Options under which lake's loss is LeRobot 0.4.4's: padded actions count as zeros.
fn lerobot_044() -> PolicyOptions {
    PolicyOptions { padded_actions: PaddedActions::Zero, ..PolicyOptions::default() }
}

/// Compares lake's predictions and loss on `batch` with what `act_parity.py predict` wrote.
fn compare_with_lerobot(test: &str, policy: &ActPolicy, ckpt: &Path, config: &ActConfig, seed: i64, python: &Path, tmp: &Path) {
    let (batch, noise) = random_batch(config, 4, seed);
    let batch_path = tmp.join(format!("{test}.batch.safetensors"));
    let out_path = tmp.join(format!("{test}.out.safetensors"));
    write_batch(&batch_path, config, &batch, &noise);
    run_parity_script(python, &[Path::new("predict"), ckpt, &batch_path, &out_path]);
    let theirs = lake_trainer::read_safetensors(&out_path).unwrap();

    let normalized = policy.predict_action_chunk(&batch).unwrap();
    let actions = policy.predict_actions(&batch).unwrap();
    let d_norm = max_abs_diff(&normalized, &tensor(&theirs["actions_normalized"]));
    let d_raw = max_abs_diff(&actions, &tensor(&theirs["actions"]));
    eprintln!("{test}: max |Δ| normalised actions {d_norm:.3e}, unnormalised {d_raw:.3e}");
    assert!(d_norm <= TOL, "{test}: normalised actions differ by {d_norm}");
    assert!(d_raw <= TOL, "{test}: unnormalised actions differ by {d_raw}");
    // The comparison can fail: the outputs are not constant.
    assert!(normalized.std(true).double_value(&[]) > 1e-3);

    let loss = policy.forward_loss_with_noise(&batch, true, Some(&noise)).unwrap();
    let d_loss = (loss.loss.double_value(&[]) - theirs["loss"].values[0] as f64).abs();
    let d_l1 = (loss.l1.double_value(&[]) - theirs["l1_loss"].values[0] as f64).abs();
    eprintln!(
        "{test}: loss lake {:.6} LeRobot {:.6} (|Δ| {d_loss:.3e}), l1 |Δ| {d_l1:.3e}",
        loss.loss.double_value(&[]),
        theirs["loss"].values[0]
    );
    assert!(d_loss <= TOL * loss.loss.double_value(&[]).abs().max(1.0), "{test}: loss differs by {d_loss}");
    assert!(d_l1 <= TOL, "{test}: l1 differs by {d_l1}");
    match (&loss.kld, theirs.get("kld_loss")) {
        (Some(k), Some(t)) => {
            let d = (k.double_value(&[]) - t.values[0] as f64).abs();
            eprintln!("{test}: kld |Δ| {d:.3e}");
            assert!(d <= TOL, "{test}: kld differs by {d}");
        }
        (None, None) => {}
        (a, b) => panic!("{test}: kld present in lake {} LeRobot {}", a.is_some(), b.is_some()),
    }
}

#[test]
fn lake_checkpoint_loads_in_lerobot_and_predicts_the_same() {
    let _serial = crate::common::serial();
    let Some(python) = lerobot_python("lake_checkpoint_loads_in_lerobot_and_predicts_the_same") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let (mut config, stats) = tiny_config_and_stats();
    config.dropout = 0.0;
    tch::manual_seed(1000);
    let policy = ActPolicy::new(config.clone(), stats, &lerobot_044()).unwrap();
    // The small config's counts in `docs/design/act.md` (one encoder layer).
    assert_eq!(policy.num_parameters(), 11_215_414);
    assert_eq!(policy.state_dict().count(), 174 - 12);
    let ckpt = policy.save_checkpoint(tmp.path().join("checkpoints/000001"), None, None).unwrap();
    compare_with_lerobot("lake_to_lerobot", &policy, &ckpt.join("pretrained_model"), &config, 7, &python, tmp.path());
    if let Some(newest) = newest_lerobot_python("lake_checkpoint_loads_in_lerobot_and_predicts_the_same") {
        // LeRobot 0.6.1 leaves padded actions out of its L1's mean, as lake does by default.
        let policy = policy.with_padded_actions(PaddedActions::Exclude);
        compare_with_lerobot("lake_to_newest_lerobot", &policy, &ckpt.join("pretrained_model"), &config, 7, &newest, tmp.path());
    }
}

#[test]
fn without_the_vae_lake_and_lerobot_agree() {
    let _serial = crate::common::serial();
    let Some(python) = lerobot_python("without_the_vae_lake_and_lerobot_agree") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let (mut config, stats) = tiny_config_and_stats();
    config.use_vae = false;
    config.dropout = 0.0;
    tch::manual_seed(3);
    let policy = ActPolicy::new(config.clone(), stats, &lerobot_044()).unwrap();
    assert!(policy.state_dict().all(|(k, _)| !k.starts_with("model.vae_encoder")));
    let dir = tmp.path().join("pretrained_model");
    policy.save_pretrained(&dir).unwrap();
    compare_with_lerobot("no_vae", &policy, &dir, &config, 11, &python, tmp.path());
}

/// Three mixed-size cameras, an environment state, pre-norm layers, GELU, two decoder layers
/// and every normalisation mode.
#[test]
fn multi_camera_env_state_pre_norm_agree() {
    let _serial = crate::common::serial();
    let Some(python) = lerobot_python("multi_camera_env_state_pre_norm_agree") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let features = [
        DatasetFeature::new("observation.images.top", FeatureType::Visual, [3, 120, 160]),
        DatasetFeature::new("observation.state", FeatureType::State, [5]),
        DatasetFeature::new("observation.images.wrist", FeatureType::Visual, [3, 64, 64]),
        DatasetFeature::new("observation.environment_state", FeatureType::Env, [4]),
        DatasetFeature::new("observation.images.side", FeatureType::Visual, [3, 96, 128]),
        DatasetFeature::new("action", FeatureType::Action, [3]),
    ];
    let mut config = ActConfig::small();
    config.set_features(&features);
    config.pre_norm = true;
    config.feedforward_activation = "gelu".into();
    config.n_decoder_layers = 2;
    config.n_encoder_layers = 2;
    config.dropout = 0.0;
    config.normalization_mapping = OrderedMap(vec![
        (FeatureType::Visual, NormalizationMode::MeanStd),
        (FeatureType::State, NormalizationMode::Quantile10),
        (FeatureType::Env, NormalizationMode::MinMax),
        (FeatureType::Action, NormalizationMode::Quantiles),
    ]);
    let mut stats = Stats::new();
    for cam in ["observation.images.top", "observation.images.wrist", "observation.images.side"] {
        stats.insert(cam, "mean", HostTensor::new([3, 1, 1], [0.4f32, 0.5, 0.6]));
        stats.insert(cam, "std", HostTensor::new([3, 1, 1], [0.2f32, 0.25, 0.3]));
    }
    stats.insert("observation.state", "q10", HostTensor::vector([-1.0f32, -0.5, 0.0, -2.0, -1.0]));
    stats.insert("observation.state", "q90", HostTensor::vector([1.0f32, 0.5, 2.0, -2.0, 1.5]));
    stats.set_min_max("observation.environment_state", &[-1.0, -2.0, 0.0, 0.5], &[1.0, 2.0, 1.0, 0.5]);
    stats.insert("action", "q01", HostTensor::vector([-2.0f32, -1.0, 0.0]));
    stats.insert("action", "q99", HostTensor::vector([2.0f32, 3.0, 1.0]));
    tch::manual_seed(5);
    let policy = ActPolicy::new(config.clone(), stats, &lerobot_044()).unwrap();
    assert!(policy.state_dict().any(|(k, _)| k == "model.encoder.norm.weight"));
    assert!(policy.state_dict().any(|(k, _)| k == "model.vae_encoder.norm.bias"));
    let pos = policy.state_dict().find(|(k, _)| *k == "model.encoder_1d_feature_pos_embed.weight").unwrap().1;
    assert_eq!(pos.size(), [3, 32]);
    let dir = tmp.path().join("pretrained_model");
    policy.save_pretrained(&dir).unwrap();
    compare_with_lerobot("multi_camera", &policy, &dir, &config, 13, &python, tmp.path());
}

#[test]
fn lerobot_checkpoint_loads_in_lake_and_predicts_the_same() {
    let _serial = crate::common::serial();
    let Some(python) = lerobot_python("lerobot_checkpoint_loads_in_lake_and_predicts_the_same") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let (mut config, stats) = tiny_config_and_stats();
    config.dropout = 0.0;
    let cfg_dir = tmp.path().join("config");
    std::fs::create_dir_all(&cfg_dir).unwrap();
    std::fs::write(cfg_dir.join("config.json"), config.for_checkpoint().to_json()).unwrap();
    let flat = stats.to_flat();
    let stats_path = tmp.path().join("stats.safetensors");
    lake_trainer::write_safetensors(&stats_path, flat.iter().map(|(k, v)| (k.as_str(), v))).unwrap();
    let lr = tmp.path().join("lerobot");
    run_parity_script(&python, &[Path::new("make"), &cfg_dir.join("config.json"), &stats_path, Path::new("42"), &lr]);

    let policy = ActPolicy::from_pretrained(&lr, &lerobot_044()).unwrap();
    assert_eq!(policy.config(), &ActConfig::from_file(lr.join("config.json")).unwrap());
    assert_eq!(policy.processors().normalizer.stats, stats);
    compare_with_lerobot("lerobot_to_lake", &policy, &lr, &config, 17, &python, tmp.path());

    // Saved again by lake, the checkpoint is the one LeRobot wrote.
    let again = tmp.path().join("again");
    policy.save_pretrained(&again).unwrap();
    crate::common::same_checkpoint_files(&lr, &again);
}

#[test]
fn training_steps_match_lerobots_update_policy() {
    let _serial = crate::common::serial();
    let Some(python) = lerobot_python("training_steps_match_lerobots_update_policy") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let (mut config, stats) = tiny_config_and_stats();
    config.dropout = 0.0;
    tch::manual_seed(21);
    let policy = ActPolicy::new(config.clone(), stats, &lerobot_044()).unwrap();
    let dir = tmp.path().join("pretrained_model");
    policy.save_pretrained(&dir).unwrap();
    let (batch, noise) = random_batch(&config, 4, 23);
    let batch_path = tmp.path().join("batch.safetensors");
    write_batch(&batch_path, &config, &batch, &noise);
    let out_path = tmp.path().join("trained.safetensors");
    let steps = 3;
    run_parity_script(&python, &[Path::new("train"), &dir, &batch_path, Path::new(&steps.to_string()), &out_path]);
    let theirs = lake_trainer::read_safetensors(&out_path).unwrap();

    let initial: Vec<Tensor> = policy.state_dict().map(|(_, t)| t.copy()).collect();
    let mut opt = Adam::act(&policy);
    for i in 0..steps {
        let loss = policy.forward_loss_with_noise(&batch, true, Some(&noise)).unwrap();
        let norm = opt.step(&loss.loss).unwrap();
        let (l, tl) = (loss.loss.double_value(&[]), theirs[&format!("loss_{i}")].values[0] as f64);
        let tn = theirs[&format!("grad_norm_{i}")].values[0] as f64;
        eprintln!("step {i}: loss lake {l:.6} LeRobot {tl:.6}; grad norm lake {norm:.6} LeRobot {tn:.6}");
        assert!((l - tl).abs() <= 1e-4 * tl.abs().max(1.0), "step {i}: loss {l} vs {tl}");
        assert!((norm - tn).abs() <= 1e-3 * tn.abs().max(1.0), "step {i}: grad norm {norm} vs {tn}");
    }
    // Each step moves a parameter by at most about lr = 1e-4; agreement far below that shows
    // the same update rule, groups, weight decay and clipping.
    let mut worst = (0.0f64, String::new());
    let mut moved = 0.0f64;
    for ((key, t), before) in policy.state_dict().zip(&initial) {
        let d = max_abs_diff(t, &tensor(&theirs[key]));
        if d > worst.0 {
            worst = (d, key.to_string());
        }
        moved = moved.max(max_abs_diff(t, before));
    }
    eprintln!("after {steps} steps: max |Δ| parameters {:.3e} ({}); largest move {moved:.3e}", worst.0, worst.1);
    assert!(moved > 1e-4, "the steps hardly moved the parameters ({moved})");
    assert!(worst.0 <= 2e-6, "parameters differ by {} at {}", worst.0, worst.1);
}
