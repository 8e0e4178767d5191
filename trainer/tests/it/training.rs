//! Training, checkpoints and refusals, without LeRobot.

use lake_trainer::act::{ActBatch, ActPolicy, Adam, PolicyOptions};
use lake_trainer::{Error, HostTensor};
use tch::{Device, Kind, Tensor};

use crate::common::*;

#[test]
fn a_hundred_steps_on_a_fixed_batch_cut_the_loss() {
    let _serial = crate::common::serial();
    let (config, stats) = tiny_config_and_stats();
    tch::manual_seed(1000);
    let policy = ActPolicy::new(config.clone(), stats, &PolicyOptions::default()).unwrap();
    let mut opt = Adam::act(&policy);
    let (batch, _) = random_batch(&config, 8, 1);
    let mut losses = Vec::new();
    for step in 0..100 {
        tch::manual_seed(10_000 + step);
        let loss = policy.forward_loss(&batch, true).unwrap();
        losses.push(loss.loss.double_value(&[]));
        opt.step(&loss.loss).unwrap();
    }
    let first: f64 = losses[..5].iter().sum::<f64>() / 5.0;
    let last: f64 = losses[95..].iter().sum::<f64>() / 5.0;
    eprintln!("loss: first 5 steps {first:.4}, last 5 steps {last:.4}");
    assert!(last < first / 3.0, "loss went from {first} to {last}");
    // Eval-mode L1 on the training batch dropped too.
    let eval = policy.forward_loss(&batch, false).unwrap();
    assert!(eval.kld.is_none());
}

#[test]
fn same_seed_same_policy_and_deterministic_inference() {
    let _serial = crate::common::serial();
    let (config, stats) = tiny_config_and_stats();
    tch::manual_seed(9);
    let a = ActPolicy::new(config.clone(), stats.clone(), &PolicyOptions::default()).unwrap();
    tch::manual_seed(9);
    let b = ActPolicy::new(config.clone(), stats, &PolicyOptions::default()).unwrap();
    for ((ka, ta), (kb, tb)) in a.state_dict().zip(b.state_dict()) {
        assert_eq!(ka, kb);
        assert_eq!(max_abs_diff(ta, tb), 0.0, "{ka}");
    }
    let (batch, _) = random_batch(&config, 2, 4);
    let p1 = a.predict_action_chunk(&batch).unwrap();
    let p2 = a.predict_action_chunk(&batch).unwrap();
    assert_eq!(max_abs_diff(&p1, &p2), 0.0);
    assert_eq!(p1.size(), [2, 10, 6]);
    // Training mode draws dropout and ε: two losses differ.
    let l1 = a.forward_loss(&batch, true).unwrap().loss.double_value(&[]);
    let l2 = a.forward_loss(&batch, true).unwrap().loss.double_value(&[]);
    assert_ne!(l1, l2);
}

#[test]
fn checkpoints_round_trip_with_optimizer_state() {
    let _serial = crate::common::serial();
    let tmp = tempfile::tempdir().unwrap();
    let (config, stats) = tiny_config_and_stats();
    tch::manual_seed(2);
    let policy = ActPolicy::new(config.clone(), stats, &PolicyOptions::default()).unwrap();
    let mut opt = Adam::act(&policy);
    let (batch, _) = random_batch(&config, 2, 3);
    for _ in 0..2 {
        let loss = policy.forward_loss(&batch, true).unwrap();
        opt.step(&loss.loss).unwrap();
    }
    let dest = tmp.path().join("checkpoints/000002");
    let staged = policy.stage_checkpoint(&dest, Some(&opt), Some(2)).unwrap();
    assert!(!dest.exists(), "nothing is in place before commit");
    std::fs::write(staged.path().join("training_state/lake_cursor.json"), "{}").unwrap();
    staged.commit().unwrap();
    let names: Vec<String> =
        std::fs::read_dir(dest.join("pretrained_model")).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    for f in [
        "config.json",
        "model.safetensors",
        "policy_preprocessor.json",
        "policy_postprocessor.json",
        "policy_preprocessor_step_3_normalizer_processor.safetensors",
        "policy_postprocessor_step_0_unnormalizer_processor.safetensors",
    ] {
        assert!(names.iter().any(|n| n == f), "{f} missing from {names:?}");
    }
    assert_eq!(names.len(), 6);
    assert!(dest.join("training_state/lake_cursor.json").exists());
    let step: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dest.join("training_state/training_step.json")).unwrap()).unwrap();
    assert_eq!(step, serde_json::json!({"step": 2}));
    let groups: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dest.join("training_state/optimizer_param_groups.json")).unwrap()).unwrap();
    // The small config (one encoder layer): 61 parameters outside the backbone, 20 backbone convs.
    assert_eq!(groups[0]["params"].as_array().unwrap().len(), 61);
    assert_eq!(groups[1]["params"][0], 61);
    assert_eq!(groups[1]["params"].as_array().unwrap().len(), 20);
    assert_eq!(groups[1]["lr"], 1e-4);
    let state = lake_trainer::read_safetensors(dest.join("training_state/optimizer_state.safetensors")).unwrap();
    assert_eq!(state.len(), 81 * 3);
    assert_eq!(state["state/0/step"], HostTensor::new(Vec::<usize>::new(), [2.0]));
    // Replacing a checkpoint keeps exactly one directory in place.
    policy.save_checkpoint(&dest, None, None).unwrap();
    assert!(!dest.join("training_state").exists());
    assert_eq!(std::fs::read_dir(dest.parent().unwrap()).unwrap().count(), 1);
    policy.save_checkpoint(&dest, Some(&opt), Some(2)).unwrap();

    // Loading gives the same outputs, and the optimizer continues where it was.
    let back = ActPolicy::from_pretrained(&dest, &PolicyOptions::default()).unwrap();
    let d = max_abs_diff(&policy.predict_action_chunk(&batch).unwrap(), &back.predict_action_chunk(&batch).unwrap());
    assert_eq!(d, 0.0);
    let mut opt2 = Adam::act(&back);
    opt2.load(&dest.join("training_state")).unwrap();
    assert_eq!(opt2.state_tensors(), opt.state_tensors());
    tch::manual_seed(77);
    let l = policy.forward_loss(&batch, true).unwrap();
    opt.step(&l.loss).unwrap();
    tch::manual_seed(77);
    let l = back.forward_loss(&batch, true).unwrap();
    opt2.step(&l.loss).unwrap();
    for ((k, a), (_, b)) in policy.state_dict().zip(back.state_dict()) {
        assert_eq!(max_abs_diff(a, b), 0.0, "{k} after a resumed step");
    }
}

#[test]
fn architecture_mismatches_are_refused_with_the_key() {
    let _serial = crate::common::serial();
    let tmp = tempfile::tempdir().unwrap();
    let (config, stats) = tiny_config_and_stats();
    let policy = ActPolicy::new(config.clone(), stats.clone(), &PolicyOptions::default()).unwrap();
    let dir = tmp.path().join("pretrained_model");
    policy.save_pretrained(&dir).unwrap();
    let model = dir.join("model.safetensors");
    let original = lake_trainer::read_safetensors(&model).unwrap();

    let mut missing = original.clone();
    missing.remove("model.action_head.bias");
    lake_trainer::write_safetensors(&model, missing.iter().map(|(k, v)| (k.as_str(), v))).unwrap();
    let err = ActPolicy::from_pretrained(&dir, &PolicyOptions::default()).unwrap_err().to_string();
    assert!(err.contains("model.action_head.bias") && err.contains("missing"), "{err}");

    let mut reshaped = original.clone();
    reshaped.insert("model.decoder_pos_embed.weight".into(), HostTensor::new([20, 32], vec![0.0; 640]));
    lake_trainer::write_safetensors(&model, reshaped.iter().map(|(k, v)| (k.as_str(), v))).unwrap();
    let err = ActPolicy::from_pretrained(&dir, &PolicyOptions::default()).unwrap_err();
    assert!(matches!(err, Error::Mismatch { .. }));
    let err = err.to_string();
    assert!(err.contains("model.decoder_pos_embed.weight") && err.contains("[20, 32]") && err.contains("[10, 32]"), "{err}");

    let mut extra = original.clone();
    extra.insert("model.backbone.fc.weight".into(), HostTensor::vector([1.0]));
    lake_trainer::write_safetensors(&model, extra.iter().map(|(k, v)| (k.as_str(), v))).unwrap();
    let err = ActPolicy::from_pretrained(&dir, &PolicyOptions::default()).unwrap_err().to_string();
    assert!(err.contains("model.backbone.fc.weight"), "{err}");

    // --init-from into a different architecture names the field.
    lake_trainer::write_safetensors(&model, original.iter().map(|(k, v)| (k.as_str(), v))).unwrap();
    let mut other = config.clone();
    other.n_heads = 4;
    let p2 = ActPolicy::new(other, stats.clone(), &PolicyOptions::default()).unwrap();
    let err = p2.init_from(&dir).unwrap_err().to_string();
    assert!(err.contains("n_heads"), "{err}");
    let p3 = ActPolicy::new(config, stats, &PolicyOptions::default()).unwrap();
    p3.init_from(&dir).unwrap();
}

#[test]
fn backbone_starts_from_a_torchvision_weights_file() {
    let _serial = crate::common::serial();
    let tmp = tempfile::tempdir().unwrap();
    let (config, stats) = tiny_config_and_stats();
    tch::manual_seed(4);
    let donor = ActPolicy::new(config.clone(), stats.clone(), &PolicyOptions::default()).unwrap();
    // torchvision names, plus the keys a full ResNet state dict has and ACT drops.
    let mut weights: Vec<(String, HostTensor)> =
        donor.state_dict().filter_map(|(k, t)| k.strip_prefix("model.backbone.").map(|n| (n.to_string(), host(t)))).collect();
    weights.push(("fc.weight".into(), HostTensor::new([1000, 512], vec![0.0; 512_000])));
    weights.push(("bn1.num_batches_tracked".into(), HostTensor::vector([0.0])));
    let path = tmp.path().join("resnet18.safetensors");
    lake_trainer::write_safetensors(&path, weights.iter().map(|(k, v)| (k.as_str(), v))).unwrap();
    tch::manual_seed(5);
    let options = PolicyOptions { backbone_weights: Some(path.clone()), ..PolicyOptions::default() };
    let policy = ActPolicy::new(config.clone(), stats.clone(), &options).unwrap();
    for ((k, a), (_, b)) in policy.state_dict().zip(donor.state_dict()) {
        let d = max_abs_diff(a, b);
        if k.starts_with("model.backbone.") {
            assert_eq!(d, 0.0, "{k}");
        } else if k.ends_with("weight") && !k.contains("norm") {
            assert!(d > 0.0, "{k} should keep its own init");
        }
    }
    weights.retain(|(k, _)| k != "layer4.1.conv2.weight");
    lake_trainer::write_safetensors(&path, weights.iter().map(|(k, v)| (k.as_str(), v))).unwrap();
    let err = ActPolicy::new(config, stats, &options).unwrap_err().to_string();
    assert!(err.contains("layer4.1.conv2.weight"), "{err}");
}

/// torchvision's own `.pth` (the file lerobot-train reads from torchvision's cache) starts the
/// backbone with the values torchvision gives LeRobot's ACT backbone from it.
#[test]
fn backbone_starts_from_torchvisions_cached_pth_as_lerobots_does() {
    let Some(python) = lerobot_python("backbone_starts_from_torchvisions_cached_pth_as_lerobots_does") else { return };
    let _serial = crate::common::serial();
    let tmp = tempfile::tempdir().unwrap();
    let (home, dump) = (tmp.path().join("torch-home"), tmp.path().join("lerobot-backbone.safetensors"));
    // A ResNet-18 saved as torchvision saves its downloads, then loaded as LeRobot's ACT loads
    // its backbone: by name, from the cache, with FrozenBatchNorm2d.
    let script = r#"
import os, sys, torch, torchvision
from safetensors.torch import save_file
from torchvision.ops.misc import FrozenBatchNorm2d
home, dump = sys.argv[1], sys.argv[2]
os.makedirs(os.path.join(home, "hub", "checkpoints"))
torch.manual_seed(3)
torch.save(torchvision.models.resnet18().state_dict(), os.path.join(home, "hub", "checkpoints", "resnet18-f37072fd.pth"))
os.environ["TORCH_HOME"] = home
net = torchvision.models.resnet18(weights="ResNet18_Weights.IMAGENET1K_V1", norm_layer=FrozenBatchNorm2d)
save_file({k: v.contiguous() for k, v in net.state_dict().items() if not k.startswith("fc.")}, dump)
"#;
    let out = std::process::Command::new(&python).arg("-c").arg(script).arg(&home).arg(&dump).output().expect("python");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (config, stats) = tiny_config_and_stats();
    let pth = home.join("hub/checkpoints/resnet18-f37072fd.pth");
    let options = PolicyOptions { backbone_weights: Some(pth), ..PolicyOptions::default() };
    let policy = ActPolicy::new(config, stats, &options).unwrap();
    let lerobot = lake_trainer::read_safetensors(&dump).unwrap();
    let mut compared = 0;
    for (key, t) in policy.state_dict() {
        let Some(name) = key.strip_prefix("model.backbone.") else { continue };
        assert_eq!(host(t), lerobot[name], "{name}");
        compared += 1;
    }
    assert_eq!(compared, lerobot.len(), "every tensor of LeRobot's backbone");
}

#[test]
fn bad_batches_are_refused() {
    let _serial = crate::common::serial();
    let (config, stats) = tiny_config_and_stats();
    let policy = ActPolicy::new(config.clone(), stats, &PolicyOptions::default()).unwrap();
    let opts = (Kind::Float, Device::Cpu);
    let good = || random_batch(&config, 2, 1).0;
    let err = policy.predict_action_chunk(&ActBatch { images: vec![], ..good() }).unwrap_err().to_string();
    assert!(err.contains("0 camera tensors for 1"), "{err}");
    let err = policy.predict_action_chunk(&ActBatch { state: Some(Tensor::zeros([3, 6], opts)), ..good() }).unwrap_err().to_string();
    assert!(err.contains("batch size 3"), "{err}");
    let err = policy.forward_loss(&ActBatch { action: Some(Tensor::zeros([2, 9, 6], opts)), ..good() }, true).unwrap_err().to_string();
    assert!(err.contains("action") && err.contains("[2, 10, 6]"), "{err}");
    let err = policy.forward_loss(&ActBatch { action: None, ..good() }, true).unwrap_err().to_string();
    assert!(err.contains("action is missing"), "{err}");
    // uint8 frames are divided by 255 on the device: the same result as float frames.
    let b = good();
    let u8_images: Vec<Tensor> = b.images.iter().map(|i| (i * 255.0).round().to_kind(Kind::Uint8)).collect();
    let f_images: Vec<Tensor> = u8_images.iter().map(|i| i.to_kind(Kind::Float) / 255.0).collect();
    let a = policy.predict_action_chunk(&ActBatch { images: u8_images, ..good() }).unwrap();
    let c = policy.predict_action_chunk(&ActBatch { images: f_images, ..good() }).unwrap();
    assert_eq!(max_abs_diff(&a, &c), 0.0);
}

#[test]
fn libtorch_cuda_is_loaded_without_a_gpu() {
    let _serial = crate::common::serial();
    // The wheel's libtorch is a CUDA build; with libtorch.so kept on the link line its
    // libtorch_cuda.so is loaded at start, so CUDA registers when a GPU is there.
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    assert!(maps.contains("libtorch_cuda.so"), "libtorch_cuda.so was dropped at link time");
    assert!(lake_trainer::act::load_libtorch_cuda());
}

#[test]
fn double_precision_policy_predicts_like_float() {
    let _serial = crate::common::serial();
    let tmp = tempfile::tempdir().unwrap();
    let (config, stats) = tiny_config_and_stats();
    tch::manual_seed(8);
    let policy = ActPolicy::new(config.clone(), stats, &PolicyOptions::default()).unwrap();
    policy.save_pretrained(tmp.path()).unwrap();
    let f64_policy = ActPolicy::from_pretrained(tmp.path(), &PolicyOptions { kind: Kind::Double, ..PolicyOptions::default() }).unwrap();
    assert!(f64_policy.state_dict().all(|(_, t)| t.kind() == Kind::Double));
    let (batch, noise) = random_batch(&config, 2, 6);
    let a = policy.predict_actions(&batch).unwrap();
    let b = f64_policy.predict_actions(&batch).unwrap();
    assert_eq!(b.kind(), Kind::Double);
    let d = max_abs_diff(&a, &b);
    eprintln!("f32 vs f64 unnormalised actions: max |Δ| {d:.3e}");
    assert!(d < 1e-3 && d > 0.0, "{d}");
    let la = policy.forward_loss_with_noise(&batch, false, Some(&noise)).unwrap().loss.double_value(&[]);
    let lb = f64_policy.forward_loss_with_noise(&batch, false, Some(&noise)).unwrap().loss.double_value(&[]);
    assert!((la - lb).abs() < 1e-4 * la.abs().max(1.0), "{la} vs {lb}");
    // Checkpoints stay float32 whatever the parameters' dtype.
    f64_policy.save_pretrained(tmp.path().join("again")).unwrap();
    let st = std::fs::read(tmp.path().join("again/model.safetensors")).unwrap();
    let n = u64::from_le_bytes(st[..8].try_into().unwrap()) as usize;
    let header = std::str::from_utf8(&st[8..8 + n]).unwrap();
    assert!(header.contains("\"F32\"") && !header.contains("\"F64\""));
    let err =
        ActPolicy::from_pretrained(tmp.path(), &PolicyOptions { kind: Kind::Int, ..PolicyOptions::default() }).unwrap_err().to_string();
    assert!(err.contains("Int"), "{err}");
}

/// Runs where a CUDA device is present (skipped, saying so, elsewhere): the same checkpoint
/// predicts on the GPU as on the CPU, within what TF32 convolutions allow, and trains there.
#[test]
fn cuda_predicts_like_cpu_and_trains() {
    let _serial = crate::common::serial();
    if !lake_trainer::act::cuda_is_available() {
        eprintln!("SKIPPED cuda_predicts_like_cpu_and_trains: no CUDA device");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (config, stats) = tiny_config_and_stats();
    tch::manual_seed(12);
    let cpu = ActPolicy::new(config.clone(), stats, &PolicyOptions::default()).unwrap();
    cpu.save_pretrained(tmp.path()).unwrap();
    let gpu = ActPolicy::from_pretrained(tmp.path(), &PolicyOptions { device: Device::Cuda(0), ..PolicyOptions::default() }).unwrap();
    let (batch, _) = random_batch(&config, 4, 13);
    let a = cpu.predict_actions(&batch).unwrap();
    let b = gpu.predict_actions(&batch).unwrap();
    assert_eq!(b.device(), Device::Cuda(0));
    let d = max_abs_diff(&a, &b.to_device(Device::Cpu));
    eprintln!("CPU vs CUDA unnormalised actions: max |Δ| {d:.3e}");
    assert!(d < 2e-2, "{d}");
    let mut opt = Adam::act(&gpu);
    let first = gpu.forward_loss(&batch, false).unwrap().loss.double_value(&[]);
    for _ in 0..30 {
        let loss = gpu.forward_loss(&batch, true).unwrap();
        opt.step(&loss.loss).unwrap();
    }
    let last = gpu.forward_loss(&batch, false).unwrap().loss.double_value(&[]);
    eprintln!("CUDA: eval L1 {first:.4} before, {last:.4} after 30 steps");
    assert!(last < first * 0.9, "{first} -> {last}");
}
