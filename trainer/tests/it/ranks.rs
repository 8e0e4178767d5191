//! Data-parallel runs: two ranks of batch B, started by `mpirun` (feature `mpi`) or by
//! torchrun (libtorch's Gloo), take the steps one rank of batch 2B takes; Diffusion trains on
//! two ranks that hold one model at every checkpoint; a rank that dies ends the run on every
//! rank.

use std::path::Path;
use std::process::Command;

use lake_trainer::ActConfig;
use lake_trainer::collective::Collective;
use lake_trainer::loss::PaddedActions;
use lake_trainer::train::{EVAL_FILE, EvalBatches, EvalOptions, EvalRecord, LOG_FILE, TrainOptions};

use crate::run::{lake_with_fixture, options, run};

/// Steps of the data-parallel comparison.
const STEPS: u64 = 20;

/// The small config without dropout or the VAE's noise: a step's gradient is then a function of
/// its samples alone, however they are split over ranks.
fn without_noise() -> ActConfig {
    ActConfig { dropout: 0.0, use_vae: false, ..ActConfig::small() }
}

/// How the test starts its two ranks.
#[derive(Clone, Copy, Debug)]
enum Launcher {
    /// Open MPI's `mpirun`.
    #[cfg(feature = "mpi")]
    Mpirun,
    /// PyTorch's `torchrun`, from the torch that lake's trainer links.
    Torchrun,
}

/// The policy the ranks of [`rank`] train.
#[derive(Clone, Copy, Debug)]
enum Trained {
    /// ACT [`without_noise`], in double precision.
    Act,
    /// The small Diffusion config of the single-process runs with a BatchNorm backbone,
    /// checkpointed every 5 steps.
    Diffusion,
}

/// The launcher's command that starts two ranks of [`rank`] in `dir`, training ACT for `steps`
/// steps.
fn launch(launcher: Launcher, dir: &Path, steps: u64) -> Command {
    launch_training(launcher, dir, steps, Trained::Act)
}

/// As [`launch`], training `trained`.
fn launch_training(launcher: Launcher, dir: &Path, steps: u64, trained: Trained) -> Command {
    let mut command = match launcher {
        #[cfg(feature = "mpi")]
        Launcher::Mpirun => {
            let mut command = Command::new("mpirun");
            command.args(["-np", "2", "--oversubscribe"]).env("OMPI_ALLOW_RUN_AS_ROOT", "1").env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
            command
        }
        Launcher::Torchrun => {
            let mut command = Command::new(torchrun());
            command.args(["--standalone", "--nnodes", "1", "--nproc-per-node", "2", "--no-python"]);
            command
        }
    };
    command
        .arg(std::env::current_exe().expect("test path"))
        .args(["--exact", "ranks::rank", "--ignored", "--test-threads", "1"])
        .env("LAKE_TEST_RANKS_RUN", dir)
        .env("LAKE_TEST_RANKS_STEPS", steps.to_string())
        .env("LAKE_TEST_RANKS_POLICY", format!("{trained:?}"));
    command
}

/// torchrun beside the python whose torch the trainer links (`VIRTUAL_ENV`, as the build
/// environment sets it), else the one on `PATH`.
fn torchrun() -> std::path::PathBuf {
    std::env::var_os("VIRTUAL_ENV")
        .map(|venv| Path::new(&venv).join("bin/torchrun"))
        .filter(|path| path.is_file())
        .unwrap_or_else(|| "torchrun".into())
}

/// One rank, started by [`launch`] (it does nothing when run otherwise): the engine is MPI's
/// under mpirun, libtorch's Gloo under torchrun.
#[test]
#[ignore = "a rank started by mpirun or torchrun from the tests below"]
fn rank() {
    let Some(dir) = std::env::var_os("LAKE_TEST_RANKS_RUN").map(std::path::PathBuf::from) else { return };
    let lake = lake_store::Lake::open(dir.join("lake").to_str().expect("utf-8")).expect("lake");
    let collective: Box<dyn Collective> = match lake_trainer::collective::Launch::from_env().expect("torchrun's variables") {
        Some(launch) => Box::new(lake_trainer::collective::Gloo::connect(&launch).expect("libtorch's Gloo group")),
        None => mpi_world(),
    };
    // Where the test that started the ranks finds them.
    std::fs::write(dir.join(format!("rank-{}.pid", collective.rank())), std::process::id().to_string()).expect("pid file");
    let steps = std::env::var("LAKE_TEST_RANKS_STEPS").ok().and_then(|s| s.parse().ok()).unwrap_or(STEPS);
    let options = TrainOptions { batch_size: 4, collective: Some(collective), ..options(&lake, &dir.join("ranks"), steps) };
    let options = match std::env::var("LAKE_TEST_RANKS_POLICY").as_deref() {
        Ok("Diffusion") => {
            // BatchNorm, whose running statistics each rank's forward moves: rank 0's go to
            // every rank before each step.
            let lake_trainer::policy::PolicyConfig::Diffusion(mut config) = crate::diffusion::run_config() else { unreachable!() };
            config.use_group_norm = false;
            TrainOptions { config: lake_trainer::policy::PolicyConfig::Diffusion(config), save_every: 5, ..options }
        }
        _ => TrainOptions {
            config: lake_trainer::policy::PolicyConfig::Act(Box::new(without_noise())),
            kind: tch::Kind::Double,
            padded_actions: PaddedActions::Zero,
            image_transforms: Some(crate::common::every_image_transform()),
            eval: Some(every_sample_held_out()),
            ..options
        },
    };
    run(options);
}

#[cfg(feature = "mpi")]
fn mpi_world() -> Box<dyn Collective> {
    Box::new(lake_trainer::collective::Mpi::init().expect("MPI"))
}

#[cfg(not(feature = "mpi"))]
fn mpi_world() -> Box<dyn Collective> {
    panic!("started without torchrun's variables, in a build without MPI")
}

/// An evaluation at the end of every sample of the fixture once: 60 steps in global batches of
/// 8, so that the second of two ranks has nothing of the last.
fn every_sample_held_out() -> EvalOptions {
    EvalOptions { datasets: vec!["v30-images-tiny".into()], every: 0, batches: EvalBatches::All }
}

/// One rank of batch 8 and two of batch 4 (started by `launcher`) end [`STEPS`] steps with the
/// same parameters, up to the order of float additions, image transforms included, and evaluate
/// every held-out sample to the same loss.
fn two_ranks_take_the_steps_one_rank_takes(launcher: Launcher) {
    let _serial = crate::common::serial();
    let tmp = tempfile::tempdir().expect("tmp");
    let lake = lake_with_fixture(tmp.path());
    // Padded actions counted as zeros: every rank's loss is then a mean over as many actions, and
    // the mean of the ranks' gradients is the gradient of the whole batch's mean. (Left out,
    // each rank's mean is over its own count, as under LeRobot 0.6.1 with DDP.)
    let (summary, single) = run(TrainOptions {
        batch_size: 8,
        eval: Some(every_sample_held_out()),
        config: lake_trainer::policy::PolicyConfig::Act(Box::new(without_noise())),
        kind: tch::Kind::Double,
        padded_actions: PaddedActions::Zero,
        bf16: false,
        // Each sample's frames draw by its place in the step's global batch, whatever the ranks.
        image_transforms: Some(crate::common::every_image_transform()),
        ..options(&lake, &tmp.path().join("single"), STEPS)
    });
    let status = launch(launcher, tmp.path(), STEPS).status().unwrap_or_else(|e| panic!("{launcher:?}: {e}"));
    assert!(status.success(), "{launcher:?}: {status}");
    let log = std::fs::read_to_string(tmp.path().join("ranks").join(LOG_FILE)).expect("rank 0's log");
    let ranks: Vec<serde_json::Value> = log.lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect();
    assert_eq!(ranks.len(), STEPS as usize);
    let losses = single.iter().zip(&ranks).map(|(one, two)| (one.loss - two["loss"].as_f64().expect("loss")).abs() / one.loss.abs());
    let losses: Vec<f64> = losses.collect();
    let worst_loss = losses.iter().copied().fold(0f64, f64::max);
    // The parameters after the last step, as one vector: ‖two ranks − one rank‖ / ‖one rank‖.
    let weights = |dir: &str| {
        let path = tmp.path().join(dir).join(format!("checkpoints/0000{STEPS}/pretrained_model/model.safetensors"));
        lake_trainer::read_safetensors(path).expect("weights")
    };
    let (one, two) = (weights("single"), weights("ranks"));
    let (mut diff, mut norm) = (0f64, 0f64);
    for (key, a) in &one {
        for (x, y) in a.values.iter().zip(&two[key].values) {
            diff += f64::from(x - y).powi(2);
            norm += f64::from(*x).powi(2);
        }
    }
    let relative = (diff / norm).sqrt();
    eprintln!(
        "{launcher:?}: one rank of batch 8 against two of 4, {STEPS} steps: parameters differ by {relative:.2e} relative, losses by at most {worst_loss:.2e}"
    );
    assert!(relative <= 1e-5, "the parameters differ by {relative} relative");
    assert!(worst_loss <= 1e-4, "a step's loss differs by {worst_loss} relative");
    let evals = std::fs::read_to_string(tmp.path().join("ranks").join(EVAL_FILE)).expect("rank 0's eval log");
    let evals: Vec<EvalRecord> = evals.lines().map(|l| serde_json::from_str(l).expect("an eval record")).collect();
    let (one, two) = (&summary.evals[..], &evals[..]);
    assert!(one.len() == 1 && two.len() == 1 && one[0].samples == 60 && two[0].samples == 60, "{one:?} {two:?}");
    let held_out = (one[0].loss - two[0].loss).abs() / one[0].loss;
    assert!(held_out <= 1e-4, "the held-out losses differ by {held_out} relative: {one:?} {two:?}");
}

/// Diffusion (a BatchNorm backbone) on two ranks of batch 4: its draws (noise, timesteps, crops)
/// are each rank's own,
/// so no single process takes the same steps; the ranks must still hold one model, which the
/// trainer checks, bit for bit, at every checkpoint (steps 5, 10 and 15) before rank 0 writes
/// it. The run ends, its log holds the mean loss over both ranks, and the checkpoint loads.
fn diffusion_trains_on_two_ranks(launcher: Launcher) {
    let _serial = crate::common::serial();
    let tmp = tempfile::tempdir().expect("tmp");
    let _lake = lake_with_fixture(tmp.path());
    let steps = 15;
    let output = launch_training(launcher, tmp.path(), steps, Trained::Diffusion).output().unwrap_or_else(|e| panic!("{launcher:?}: {e}"));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{launcher:?}: {}\n{stderr}", output.status);
    let out = tmp.path().join("ranks");
    let log = std::fs::read_to_string(out.join(LOG_FILE)).expect("rank 0's log");
    let losses: Vec<f64> =
        log.lines().map(|l| serde_json::from_str::<serde_json::Value>(l).expect("a JSON line")["loss"].as_f64().expect("loss")).collect();
    assert_eq!(losses.len(), steps as usize);
    assert!(losses.iter().all(|l| l.is_finite() && *l > 0.0), "{losses:?}");
    for step in [5, 10, 15] {
        let dir = out.join(format!("checkpoints/0000{step:02}/pretrained_model"));
        let policy = lake_trainer::diffusion::DiffusionPolicy::from_pretrained(&dir, tch::Device::Cpu, tch::Kind::Float);
        policy.unwrap_or_else(|e| panic!("step {step}'s checkpoint: {e}"));
    }
    eprintln!("{launcher:?}: Diffusion on two ranks, {steps} steps: loss {:.3} -> {:.3}", losses[0], losses[steps as usize - 1]);
}

/// A rank that dies (killed outright, mid-run) ends the run on every rank: the others do not
/// wait forever in a collective that can no longer complete. The launcher sees the death and
/// ends the job with a failing exit.
fn a_dead_rank_ends_the_run(launcher: Launcher) {
    let _serial = crate::common::serial();
    let tmp = tempfile::tempdir().expect("tmp");
    let _lake = lake_with_fixture(tmp.path());
    let mut job = launch(launcher, tmp.path(), 100_000)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{launcher:?}: {e}"));
    let log = tmp.path().join("ranks").join(LOG_FILE);
    let began = std::time::Instant::now();
    // Both ranks train: rank 0 has logged a few steps.
    while std::fs::read_to_string(&log).map_or(0, |l| l.lines().count()) < 3 {
        assert!(began.elapsed().as_secs() < 300, "the ranks did not start training");
        assert!(job.try_wait().expect("launcher").is_none(), "{launcher:?} ended before the ranks trained");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let pid = |rank: u32| std::fs::read_to_string(tmp.path().join(format!("rank-{rank}.pid"))).expect("the rank's pid");
    let (zero, one) = (pid(0), pid(1));
    let killed = Command::new("kill").args(["-9", &one]).status().expect("kill");
    assert!(killed.success());
    let killed_at = std::time::Instant::now();
    let status = loop {
        if let Some(status) = job.try_wait().expect("launcher") {
            break status;
        }
        if killed_at.elapsed().as_secs() > 120 {
            let _ = job.kill();
            panic!("rank 1 died and the run went on for two minutes");
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    assert!(!status.success(), "a run that lost a rank must not end as a success");
    // Running, that is: a process whose parent is gone and that nobody reaped stays a zombie.
    let running = |pid: &str| {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid.trim())).unwrap_or_default();
        stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z'))
    };
    let ended_at = std::time::Instant::now();
    while running(&zero) {
        let state = std::fs::read_to_string(format!("/proc/{}/stat", zero.trim())).unwrap_or_default();
        assert!(ended_at.elapsed().as_secs() < 30, "rank 0 still runs 30 s after the launcher ended: {state}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    eprintln!("{launcher:?}: rank 1 killed: the run ended in {:.1} s ({status})", killed_at.elapsed().as_secs_f64());
}

#[cfg(feature = "mpi")]
#[test]
fn mpirun_ranks_take_the_steps_one_rank_takes() {
    two_ranks_take_the_steps_one_rank_takes(Launcher::Mpirun);
}

#[cfg(feature = "mpi")]
#[test]
fn a_dead_mpi_rank_ends_the_run_on_every_rank() {
    a_dead_rank_ends_the_run(Launcher::Mpirun);
}

#[test]
fn torchrun_ranks_take_the_steps_one_rank_takes() {
    two_ranks_take_the_steps_one_rank_takes(Launcher::Torchrun);
}

#[test]
fn a_dead_torchrun_rank_ends_the_run_on_every_rank() {
    a_dead_rank_ends_the_run(Launcher::Torchrun);
}

#[cfg(feature = "mpi")]
#[test]
fn diffusion_trains_on_two_mpirun_ranks_that_hold_one_model() {
    diffusion_trains_on_two_ranks(Launcher::Mpirun);
}

#[test]
fn diffusion_trains_on_two_torchrun_ranks_that_hold_one_model() {
    diffusion_trains_on_two_ranks(Launcher::Torchrun);
}

/// Two ranks of libtorch's Gloo, as threads of this process, on a free port.
fn gloo_pair() -> [lake_trainer::collective::Gloo; 2] {
    use lake_trainer::collective::{Gloo, Launch};
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port").local_addr().expect("address").port();
    let launch = move |rank| Launch {
        rank,
        world_size: 2,
        local_rank: rank,
        master_addr: "127.0.0.1".into(),
        master_port: port,
        agent_store: false,
    };
    let one = std::thread::spawn(move || Gloo::connect(&launch(1)).expect("rank 1"));
    let zero = Gloo::connect(&launch(0)).expect("rank 0");
    [zero, one.join().expect("rank 1's thread")]
}

/// The replica check finds a rank whose weights differ from rank 0's by a single bit, and no
/// rank when they are equal.
#[test]
fn the_replica_check_finds_a_rank_one_bit_apart() {
    use lake_trainer::collective::ranks_apart;
    let weights = || {
        vec![
            tch::Tensor::randn([3, 5], (tch::Kind::Float, tch::Device::Cpu)),
            tch::Tensor::arange(7, (tch::Kind::Double, tch::Device::Cpu)),
        ]
    };
    tch::manual_seed(11);
    let same = weights();
    let [zero, one] = gloo_pair();
    let check = |ranks: [(lake_trainer::collective::Gloo, Vec<tch::Tensor>); 2]| {
        let [(zero, a), (one, b)] = ranks;
        let other = std::thread::spawn(move || (ranks_apart(&one, &b).expect("rank 1's check"), one));
        let at_zero = ranks_apart(&zero, &a).expect("rank 0's check");
        let (at_one, one) = other.join().expect("rank 1's thread");
        assert_eq!(at_zero, at_one, "every rank finds the same ranks apart");
        (at_zero, zero, one)
    };
    let copy = |ts: &[tch::Tensor]| ts.iter().map(tch::Tensor::copy).collect::<Vec<_>>();
    let (apart, zero, one) = check([(zero, copy(&same)), (one, copy(&same))]);
    assert_eq!(apart, Vec::<u64>::new());
    // One element one ulp away, on rank 1.
    let nudged = copy(&same);
    let first = nudged[0].double_value(&[0, 0]) as f32;
    let _ = nudged[0].get(0).get(0).fill_(f64::from(f32::from_bits(first.to_bits() + 1)));
    let (apart, _, _) = check([(zero, copy(&same)), (one, nudged)]);
    assert_eq!(apart, vec![1]);
}
