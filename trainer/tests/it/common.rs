//! Helpers shared by the integration tests.

use std::path::{Path, PathBuf};
use std::process::Command;

use lake_trainer::act::ActBatch;
use lake_trainer::{ActConfig, DatasetFeature, HostTensor, Stats};
use tch::{Device, Kind, Tensor};

/// The checked-in copy of the tiny image fixture.
pub fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/lerobot/v30-images-tiny")
}

/// The small CPU config on the tiny fixture's features, with the fixture's statistics
/// (ImageNet on the camera, as lerobot-train does).
pub fn tiny_config_and_stats() -> (ActConfig, Stats) {
    let dir = fixture_dir();
    let info: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("meta/info.json")).unwrap()).unwrap();
    let features = DatasetFeature::from_info_json(&info).unwrap();
    let mut config = ActConfig::small();
    config.set_features(&features);
    config.device = Some("cpu".into());
    config.push_to_hub = false;
    let stats_json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("meta/stats.json")).unwrap()).unwrap();
    let mut stats = Stats::from_stats_json(&stats_json).unwrap();
    for (cam, _) in config.image_features() {
        stats.set_imagenet(cam);
    }
    (config, stats)
}

/// The LeRobot venv's python, or `None` after saying why the test is skipped.
pub fn lerobot_python(test: &str) -> Option<PathBuf> {
    let candidate = match std::env::var_os("LAKE_LEROBOT_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/lake/lerobot-venv/bin/python"),
    };
    if candidate.exists() {
        Some(candidate)
    } else {
        eprintln!(
            "SKIPPED {test}: no LeRobot python at {} (set LAKE_LEROBOT_PYTHON to a LeRobot 0.4.4 venv's python)",
            candidate.display()
        );
        None
    }
}

/// The newest LeRobot's python (LAKE_LEROBOT061_PYTHON, else ~/.cache/lake/lerobot061-venv,
/// which `../shared/tools/install-lerobot-0.6.1.sh` makes), or `None` after saying that the
/// check against it is skipped: checkpoints lake writes load there too.
pub fn newest_lerobot_python(test: &str) -> Option<PathBuf> {
    let candidate = match std::env::var_os("LAKE_LEROBOT061_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/lake/lerobot061-venv/bin/python"),
    };
    if candidate.exists() {
        return Some(candidate);
    }
    eprintln!(
        "SKIPPED the newest LeRobot's half of {test}: no python at {} (set LAKE_LEROBOT061_PYTHON to a LeRobot 0.6.1 venv's python)",
        candidate.display()
    );
    None
}

/// Runs `scripts/act_parity.py` with `args`, failing the test with its output on error.
pub fn run_parity_script(python: &Path, args: &[&Path]) {
    run_script(python, "act_parity.py", args);
}

/// Runs `scripts/NAME` with LeRobot's python, offline; fails the test with its output.
pub fn run_script(python: &Path, name: &str, args: &[&Path]) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts").join(name);
    let out = Command::new(python).arg(&script).args(args).env("HF_HUB_OFFLINE", "1").output().expect("run python");
    assert!(
        out.status.success(),
        "{name} {:?} failed:\n{}\n{}",
        args,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Asserts that two `pretrained_model` directories hold the same files: each safetensors file
/// the same bytes (names, dtypes, shapes, values and layout), each JSON file the same values.
pub fn same_checkpoint_files(theirs: &Path, ours: &Path) {
    let names = |dir: &Path| {
        let mut names: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        names
    };
    assert_eq!(names(ours), names(theirs), "the files of {} and {}", ours.display(), theirs.display());
    for name in names(theirs) {
        let (a, b) = (std::fs::read(theirs.join(&name)).unwrap(), std::fs::read(ours.join(&name)).unwrap());
        if name.ends_with(".json") {
            let parse = |bytes: &[u8]| serde_json::from_slice::<serde_json::Value>(bytes).unwrap();
            let (mut ours, theirs) = (parse(&b), parse(&a));
            // LeRobot writes an int-typed field that defaults to False (ACT's
            // `replace_final_stride_with_dilation`) as `false` from its defaults and as `0` once
            // read back; both are one value to both.
            for (key, value) in ours.as_object_mut().into_iter().flatten() {
                if let (Some(flag), Some(n)) = (value.as_bool(), theirs.get(key).and_then(serde_json::Value::as_u64)) {
                    assert_eq!(u64::from(flag), n, "{name}: {key}");
                    *value = n.into();
                }
            }
            assert_eq!(ours, theirs, "{name}");
            let keys = |v: &serde_json::Value| v.as_object().map(|o| o.keys().cloned().collect::<Vec<_>>());
            assert_eq!(keys(&ours), keys(&theirs), "{name}: the keys' order");
        } else {
            assert!(
                a == b,
                "{name}: {} bytes against LeRobot's {}, first difference at byte {:?}",
                b.len(),
                a.len(),
                a.iter().zip(&b).position(|(x, y)| x != y)
            );
        }
    }
}

/// A tensor's values on the host.
pub fn host(t: &Tensor) -> HostTensor {
    let t = t.to_kind(Kind::Float).to_device(Device::Cpu).contiguous();
    HostTensor { shape: t.size().iter().map(|&d| d as usize).collect(), values: Vec::<f32>::try_from(t.flatten(0, -1)).unwrap() }
}

/// A host tensor as a libtorch tensor.
pub fn tensor(h: &HostTensor) -> Tensor {
    let shape: Vec<i64> = h.shape.iter().map(|&d| d as i64).collect();
    Tensor::from_slice(&h.values).view(shape.as_slice())
}

/// A random raw batch for `config`: states near the stats' means, images in [0, 1], actions,
/// a padded tail on the last sample, and a VAE epsilon.
pub fn random_batch(config: &ActConfig, b: i64, seed: i64) -> (ActBatch, Tensor) {
    tch::manual_seed(seed);
    let opts = (Kind::Float, Device::Cpu);
    let state = config.robot_state_feature().map(|f| Tensor::randn([b, f.shape[0] as i64], opts) * 0.5 + 0.2);
    let env_state = config.env_state_feature().map(|(_, f)| Tensor::randn([b, f.shape[0] as i64], opts));
    let images = config.image_features().iter().map(|(_, f)| Tensor::rand([b, 3, f.shape[1] as i64, f.shape[2] as i64], opts)).collect();
    let (c, a) = (config.chunk_size as i64, config.action_feature().unwrap().shape[0] as i64);
    let action = Tensor::randn([b, c, a], opts);
    let pad = Tensor::zeros([b, c], (Kind::Bool, Device::Cpu));
    let _ = pad.narrow(0, b - 1, 1).narrow(1, c - 3, 3).fill_(1);
    let noise = Tensor::randn([b, config.latent_dim as i64], opts);
    (ActBatch { state, images, env_state, action: Some(action), action_is_pad: Some(pad) }, noise)
}

/// Writes a batch (and the noise) in `act_parity.py`'s batch-file layout.
pub fn write_batch(path: &Path, config: &ActConfig, batch: &ActBatch, noise: &Tensor) {
    let mut tensors: Vec<(String, HostTensor)> = Vec::new();
    if let Some(s) = &batch.state {
        tensors.push((lake_trainer::OBS_STATE.into(), host(s)));
    }
    if let Some(e) = &batch.env_state {
        tensors.push((lake_trainer::OBS_ENV_STATE.into(), host(e)));
    }
    for ((name, _), img) in config.image_features().iter().zip(&batch.images) {
        tensors.push((name.to_string(), host(img)));
    }
    if let Some(a) = &batch.action {
        tensors.push((lake_trainer::ACTION.into(), host(a)));
    }
    if let Some(p) = &batch.action_is_pad {
        tensors.push(("action_is_pad".into(), host(&p.to_kind(Kind::Float))));
    }
    tensors.push(("noise".into(), host(noise)));
    lake_trainer::write_safetensors(path, tensors.iter().map(|(k, v)| (k.as_str(), v))).unwrap();
}

/// The largest absolute difference between two tensors of the same shape.
pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.size(), b.size(), "shapes differ");
    (a.to_kind(Kind::Double) - b.to_kind(Kind::Double)).abs().max().double_value(&[])
}

/// Held by every test for its whole run: libtorch's generator is one per process, and a test
/// that checks runs bit for bit must not have another test's draws between its own.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// LeRobot's image transforms with every transform lake applies among them: the default set and
/// LeRobot 0.6.1's eight for a robot's cameras, 4 of them on each camera frame.
pub fn every_image_transform() -> lake_trainer::ImageTransformsConfig {
    let mut config = lake_trainer::ImageTransformsConfig { max_num_transforms: 4, ..lake_trainer::ImageTransformsConfig::enabled() };
    for kind in lake_trainer::SCENE_TRANSFORMS {
        config.tfs.insert(kind.to_lowercase(), lake_trainer::TransformConfig { kind: kind.into(), ..Default::default() });
    }
    config
}
