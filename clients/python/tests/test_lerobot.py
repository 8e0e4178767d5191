"""LeRobot's own trainer on a lake server: `lake_client.lerobot` and `lake_client.lerobot_train`.

The tests start their own `lake serve` on loopback (with a token) over a lake holding the bundled
sample testdata/lerobot/v30-images-tiny, with the lake binary at `$LAKE_BIN` (default: the debug
build, `${CARGO_TARGET_DIR:-~/.cache/lake/target}/debug/lake`), and compare with LeRobot's
`LeRobotDataset` over the same sample, offline:

- the dataset's metadata (fps, features, robot type, cameras, episodes, tasks, stats keys,
  shapes and dtypes, and their values where LeRobot's are exact) equals LeRobot's;
- every sample of an epoch, with diffusion's windows, equals `LeRobotDataset[index]`, each
  tensor bit for bit, and the epoch holds each eligible sample once;
- DataLoader workers yield the batches of a single process, and two ranks split each global
  batch;
- under LeRobot 0.6, the held-out episodes of `eval_split` are LeRobot's, and their evaluation
  passes (whole, and capped by `max_eval_samples`) are LeRobot's batches, tensor for tensor;
- `python -m lake_client.lerobot_train` trains ACT and diffusion for three steps on the CPU,
  logs finite losses and writes a checkpoint, and a resumed run's stream starts at the
  checkpoint's step; under torchrun (two CPU ranks) each rank reads its own stream; under 0.6
  ACT logs finite held-out losses.

Skipped, saying why, without LeRobot (or torch) in this interpreter or without the lake binary.
Run: `python tests/test_lerobot.py` from clients/python (or pytest).
"""

import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

import numpy as np

CLIENT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE = os.path.join(os.path.dirname(os.path.dirname(CLIENT_DIR)), "testdata", "lerobot", "v30-images-tiny")
TOKEN = "lerobot-test-token"
NAME = "tiny"
# Three H.264 cameras: video frames, which LeRobot 0.6's training dataset gives as uint8.
VIDEO_SAMPLE = os.path.join(os.path.dirname(SAMPLE), "v30-h264-multifile")
VIDEO_NAME = "multi"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# The package from this source tree when it is not installed (lake's test runner sets PYTHONPATH).
try:
    import lake_client  # noqa: F401
except ImportError:
    sys.path.insert(0, CLIENT_DIR)

try:
    import torch
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    SKIP = None
except ImportError as e:
    SKIP = f"lerobot is not importable in {sys.executable} ({e})"

from lake_binary import Server, lake, missing

if SKIP is None:
    SKIP = missing()
if SKIP is not None:
    print(f"test_lerobot skipped: {SKIP}", file=sys.stderr)

# The server every test here reads: set by setUpModule.
SERVER = {}


def setUpModule():
    if SKIP is not None:
        raise unittest.SkipTest(SKIP)
    tmp = tempfile.mkdtemp(prefix="lake-lerobot-test-")
    root = os.path.join(tmp, "lake")
    lake(root, "ingest", SAMPLE, "--name", NAME)
    lake(root, "ingest", VIDEO_SAMPLE, "--name", VIDEO_NAME)
    server = Server(root, os.path.join(tmp, "serve.log"), "--threads", "2", "--shutdown-wait", "1",
                    env={**os.environ, "LAKE_TOKENS": TOKEN})
    SERVER.update(tmp=tmp, server=server, log_path=server.log_path, flight=server.flight, http=server.http)


def tearDownModule():
    if "server" in SERVER:
        SERVER["server"].stop()
        shutil.rmtree(SERVER["tmp"], ignore_errors=True)


def lerobot_reference(delta_timestamps=None):
    return LeRobotDataset("x", root=SAMPLE, delta_timestamps=delta_timestamps)


def lake_dataset(name=NAME, **kwargs):
    from lake_client.lerobot import LakeLeRobotDataset

    return LakeLeRobotDataset(SERVER["flight"], SERVER["http"], name, token=TOKEN, **kwargs)


def takes_uint8():
    """Whether this LeRobot's dataset can give uint8 frames (0.6's `return_uint8`)."""
    import inspect

    return "return_uint8" in inspect.signature(LeRobotDataset.__init__).parameters


def is_newer_lerobot():
    """Whether this LeRobot's training script is 0.6's (a training and a held-out dataset)."""
    from lerobot.scripts import lerobot_train

    return hasattr(lerobot_train, "make_train_eval_datasets")


# Diffusion's windows at 30 fps: two observation steps, a 16-step action horizon.
DIFFUSION_WINDOWS = {
    "observation.state": [-1 / 30, 0.0],
    "observation.images.front": [-1 / 30, 0.0],
    "action": [i / 30 for i in range(-1, 15)],
}


class Metadata(unittest.TestCase):
    def test_metadata_equals_lerobots(self):
        from lake_client.lerobot import LakeDatasetMetadata

        lake = LakeDatasetMetadata(SERVER["http"], NAME, TOKEN)
        ref = lerobot_reference().meta
        self.assertEqual(lake.fps, ref.fps)
        self.assertEqual(lake.features, ref.features)
        self.assertEqual(lake.robot_type, ref.robot_type)
        self.assertEqual((lake.camera_keys, lake.image_keys, lake.video_keys), (ref.camera_keys, ref.image_keys, ref.video_keys))
        self.assertEqual((lake.total_episodes, lake.total_frames, lake.total_tasks), (ref.total_episodes, ref.total_frames, ref.total_tasks))
        self.assertEqual((lake.names, lake.shapes), (ref.names, ref.shapes))
        for column in ("episode_index", "length", "dataset_from_index", "dataset_to_index"):
            self.assertEqual(lake.episodes[column].tolist(), list(ref.episodes[column]), column)
        self.assertEqual(lake.episodes["tasks"], [list(t) for t in ref.episodes["tasks"]])
        self.assertTrue(lake.tasks.equals(ref.tasks), f"{lake.tasks}\n{ref.tasks}")
        self.assertEqual(sorted(lake.stats), sorted(ref.stats))
        for key, stats in ref.stats.items():
            self.assertEqual(sorted(lake.stats[key]), sorted(stats), key)
            for stat, want in stats.items():
                got = lake.stats[key][stat]
                self.assertEqual((got.shape, got.dtype), (want.shape, want.dtype), f"{key} {stat}")
                # LeRobot's quantiles are approximations (lake's are exact); its other stats
                # are exact up to float32 rounding.
                if not stat.startswith("q"):
                    np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=f"{key} {stat}")

    def test_an_unknown_dataset_is_named(self):
        from lake_client import LakeError
        from lake_client.lerobot import LakeDatasetMetadata

        with self.assertRaises(LakeError) as refused:
            LakeDatasetMetadata(SERVER["http"], "no-such-dataset", TOKEN)
        self.assertEqual(refused.exception.code, "not_found")
        with self.assertRaises(LakeError) as refused:
            LakeDatasetMetadata(SERVER["http"], NAME, None)
        self.assertEqual(refused.exception.code, "unauthorized")


class Samples(unittest.TestCase):
    def assert_sample_is_lerobots(self, batch, row, want):
        """Row `row` of a lake batch is LeRobot's sample `want`: the same keys, each tensor bit for bit."""
        self.assertEqual(set(batch), set(want), "the keys of LeRobot's sample")
        index = int(want["index"])
        for key, value in want.items():
            got = batch[key][row]
            if isinstance(value, str):
                self.assertEqual(got, value, key)
            else:
                self.assertEqual((got.dtype, got.shape), (value.dtype, value.shape), key)
                self.assertTrue(torch.equal(got, value), f"{key} of index {index}")

    def test_an_epoch_with_diffusions_windows_equals_lerobots_samples(self):
        ref = lerobot_reference(DIFFUSION_WINDOWS)
        ds = lake_dataset(delta_timestamps=DIFFUSION_WINDOWS, batch_size=4, seed=3, epochs=1, drop_n_last_frames=7)
        self.assertEqual((ds.num_frames, ds.num_episodes, ds.fps), (ref.num_frames, ref.num_episodes, ref.fps))
        loader = torch.utils.data.DataLoader(ds, batch_size=4)
        seen = []
        for batch in loader:
            self.assertEqual(batch["observation.images.front"].shape, (4, 2, 3, 36, 48))
            self.assertEqual(batch["action"].shape, (4, 16, 6))
            for row, index in enumerate(batch["index"].tolist()):
                self.assert_sample_is_lerobots(batch, row, ref[index])
                seen.append(index)
        # Every sample at least 7 frames before its episode's end, once (60 frames, 3 episodes:
        # 39 eligible, so 9 whole batches of 4).
        ends = ref.meta.episodes["dataset_to_index"]
        eligible = [i for i in range(60) if not any(i >= end - 7 and i < end for end in ends)]
        self.assertEqual(len(seen), 36)
        self.assertEqual(len(set(seen)), len(seen))
        self.assertTrue(set(seen) <= set(eligible), sorted(set(seen) - set(eligible)))
        self.assertNotEqual(seen, sorted(seen), "the server's order is a shuffle")

    def test_uint8_video_frames_equal_lerobot_06s(self):
        if not takes_uint8():
            self.skipTest("this LeRobot's dataset has no return_uint8 (0.6 has)")
        windows = {"observation.images.front": [-1 / 30, 0.0], "action": [0.0, 1 / 30]}
        ref = LeRobotDataset("x", root=VIDEO_SAMPLE, delta_timestamps=windows, return_uint8=True)
        ds = lake_dataset(VIDEO_NAME, delta_timestamps=windows, batch_size=5, seed=4, epochs=1, return_uint8=True)
        seen = 0
        for batch in torch.utils.data.DataLoader(ds, batch_size=5):
            self.assertEqual(batch["observation.images.front"].shape, (5, 2, 3, 120, 160))
            for row, index in enumerate(batch["index"].tolist()):
                want = ref[index]
                self.assert_sample_is_lerobots(batch, row, want)
                seen += 1
            if seen >= 60:
                break
        self.assertEqual(seen, 60)
        self.assertEqual(want["observation.images.wrist"].dtype, torch.uint8)

    def held_out_config(self, max_eval_samples):
        """What LeRobot 0.6's `make_train_eval_datasets` reads of a training config: the video
        sample, a third of each task's episodes held out, ACT's windows."""
        from types import SimpleNamespace

        from lerobot.configs.default import DatasetConfig
        from lerobot.policies.act.configuration_act import ACTConfig

        act = ACTConfig(chunk_size=10, n_action_steps=10, device="cpu")
        return SimpleNamespace(dataset=DatasetConfig(repo_id="x", root=VIDEO_SAMPLE, eval_split=0.34), policy=act,
                               trainable_config=act, tolerance_s=1e-4, batch_size=4, seed=3, resume=False,
                               max_eval_samples=max_eval_samples)

    def test_held_out_episodes_and_their_frames_are_lerobot_06s(self):
        if not is_newer_lerobot():
            self.skipTest("this LeRobot holds no episodes out (0.6's make_train_eval_datasets does)")
        from lerobot.datasets.factory import make_train_eval_datasets

        from lake_client.lerobot import make_lake_train_eval_datasets

        ref_train, ref_held_out = make_train_eval_datasets(self.held_out_config(0))
        train, held_out = make_lake_train_eval_datasets(self.held_out_config(0), SERVER["flight"], SERVER["http"],
                                                        VIDEO_NAME, TOKEN)
        # Five episodes, tasks cube (0, 1), drawer (2), disc (3, 4): the last of each task's held out.
        self.assertEqual((train.episodes, held_out.episodes), ([0, 3], [1, 2, 4]))
        self.assertEqual((train.episodes, held_out.episodes), (sorted(ref_train.episodes), sorted(ref_held_out.episodes)))
        self.assertEqual(train.meta.stats["observation.images.front"]["mean"].tolist(),
                         ref_train.meta.stats["observation.images.front"]["mean"].tolist(), "ImageNet's, as LeRobot's")
        self.assertEqual(len(held_out), len(ref_held_out))
        # LeRobot's evaluation DataLoader (no shuffle): the same batches, tensor for tensor, at
        # every pass.
        reference = list(torch.utils.data.DataLoader(ref_held_out, batch_size=4, shuffle=False))
        loader = torch.utils.data.DataLoader(held_out, batch_size=4, shuffle=False)
        batches = list(loader)
        self.assertEqual(len(batches), len(reference))
        for batch, want in zip(batches, reference):
            self.assertEqual(set(batch), set(want))
            for key, value in want.items():
                same = batch[key] == value if isinstance(value, list) else torch.equal(batch[key], value)
                self.assertTrue(same, f"{key} of the batch from index {int(want['index'][0])}")
        self.assertEqual(batches[-1]["index"].shape, (len(ref_held_out) % 4 or 4,), "the short last batch")
        self.assertEqual([b["index"].tolist() for b in loader], [b["index"].tolist() for b in reference], "a second pass")

        # lerobot-train's cap: per task (by index), its first max(1, 10 // 3) held-out frames.
        _, capped = make_lake_train_eval_datasets(self.held_out_config(10), SERVER["flight"], SERVER["http"],
                                                  VIDEO_NAME, TOKEN)
        task_of = {int(s["index"]): int(s["task_index"]) for s in ref_held_out.hf_dataset}
        tasks = sorted(set(task_of.values()))
        want = [i for t in tasks for i in sorted(i for i in task_of if task_of[i] == t)[:3]]
        got = [i for b in torch.utils.data.DataLoader(capped, batch_size=4) for i in b["index"].tolist()]
        self.assertEqual(got, want)
        self.assertEqual(len(capped), 9)

    def test_workers_yield_the_single_process_batches_and_ranks_split_them(self):
        def indices(loader, n):
            out = []
            for batch in loader:
                out.append(batch["index"].tolist())
                if len(out) == n:
                    break
            return out

        single = indices(torch.utils.data.DataLoader(lake_dataset(batch_size=4, seed=5), batch_size=4), 6)
        workers = indices(torch.utils.data.DataLoader(lake_dataset(batch_size=4, seed=5), batch_size=4, num_workers=2,
                                                      multiprocessing_context="spawn"), 6)
        self.assertEqual(workers, single)
        ranks = [indices(torch.utils.data.DataLoader(lake_dataset(batch_size=2, seed=5, rank=r, world_size=2), batch_size=2), 6)
                 for r in (0, 1)]
        self.assertEqual([a + b for a, b in zip(*ranks)], single)

    def test_a_start_batch_continues_the_sequence(self):
        whole = [b["index"].tolist() for b in torch.utils.data.DataLoader(lake_dataset(batch_size=4, seed=9, epochs=2), batch_size=4)]
        self.assertEqual(len(whole), 30)
        later = [b["index"].tolist() for b in torch.utils.data.DataLoader(lake_dataset(batch_size=4, seed=9, epochs=2, start_batch=17),
                                                                          batch_size=4)]
        self.assertEqual(later, whole[17:])


# A tiny ACT (docs/design/act.md §8) and a shrunken diffusion policy, no pretrained weights.
ACT_ARGS = ["--policy.type=act", "--policy.pretrained_backbone_weights=null", "--policy.dim_model=32",
            "--policy.n_heads=2", "--policy.dim_feedforward=64", "--policy.n_encoder_layers=1",
            "--policy.n_decoder_layers=1", "--policy.latent_dim=8", "--policy.chunk_size=10",
            "--policy.n_action_steps=10"]
DIFFUSION_ARGS = ["--policy.type=diffusion", "--policy.pretrained_backbone_weights=null", "--policy.down_dims=[32,64]",
                  "--policy.diffusion_step_embed_dim=32", "--policy.spatial_softmax_num_keypoints=8",
                  "--policy.num_train_timesteps=10"]


class LeRobotTrain(unittest.TestCase):
    def train(self, output_dir, *args, launcher=(), name=NAME, refused=False):
        command = [*(launcher or [sys.executable]), "-m", "lake_client.lerobot_train", "--lake-server", SERVER["flight"],
                   "--lake-http", SERVER["http"], "--lake-dataset", name, "--lake-token", TOKEN, *args]
        env = {**os.environ, "PYTHONPATH": CLIENT_DIR, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
        done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=SERVER["tmp"], timeout=600)
        report = done.stdout + done.stderr
        if refused:
            self.assertNotEqual(done.returncode, 0, f"{' '.join(command)}:\n{report[-6000:]}")
        else:
            self.assertEqual(done.returncode, 0, f"{' '.join(command)}:\n{report[-6000:]}")
        return report

    def check_run(self, report, output_dir, steps, name=NAME):
        losses = [float(x) for x in re.findall(r" loss:(\S+)", report)]
        self.assertEqual(len(losses), len(steps), report[-4000:])
        self.assertTrue(all(math.isfinite(x) for x in losses), losses)
        self.assertEqual([int(s) for s in re.findall(r"step:(\d+) smpl", report)], steps)
        checkpoint = os.path.join(output_dir, "checkpoints", f"{steps[-1]:06d}")
        self.assertTrue(os.path.isfile(os.path.join(checkpoint, "pretrained_model", "model.safetensors")), checkpoint)
        with open(os.path.join(checkpoint, "training_state", "training_step.json")) as f:
            self.assertEqual(json.load(f)["step"], steps[-1])
        with open(os.path.join(checkpoint, "pretrained_model", "train_config.json")) as f:
            self.assertEqual(json.load(f)["dataset"]["repo_id"], name)
        return losses

    def server_log(self):
        with open(SERVER["log_path"]) as f:
            return f.read()

    def assert_logged(self, pattern, timeout_s=30.0):
        """The server's log holds a line matching `pattern`. A stream's access line is written
        when the server drops the stream, which it does once it sees that the trainer's process
        has gone: just after the trainer exits, not before."""
        deadline = time.monotonic() + timeout_s
        while not re.search(pattern, self.server_log()) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.assertRegex(self.server_log(), pattern)

    def test_act_trains_and_resumes_where_its_stream_stopped(self):
        out = os.path.join(SERVER["tmp"], "act")
        report = self.train(out, *ACT_ARGS, "--policy.device=cpu", "--policy.push_to_hub=false", "--steps=3",
                            "--batch_size=4", "--save_freq=3", "--log_freq=1", "--num_workers=0", "--seed=21",
                            f"--output_dir={out}", "--wandb.enable=false")
        print(f"\nACT over lake: losses {self.check_run(report, out, [1, 2, 3])}", file=sys.stderr)
        config = os.path.join(out, "checkpoints", "last", "pretrained_model", "train_config.json")
        report = self.train(out, "--resume=true", f"--config_path={config}", "--steps=5", "--log_freq=1")
        print(f"ACT resumed: losses {self.check_run(report, out, [4, 5])}", file=sys.stderr)
        self.assert_logged(r"stream datasets=tiny@1 rank=0/1 batch_size=4 seed=21 epoch=0 start_step=3:")

    def test_act_trains_on_video_frames_with_image_transforms(self):
        # LeRobot 0.6 hands its transforms uint8 frames and divides the batch by 255 in its loop;
        # 0.4 hands them float frames.
        out = os.path.join(SERVER["tmp"], "act-video")
        report = self.train(out, *ACT_ARGS, "--policy.device=cpu", "--policy.push_to_hub=false", "--steps=2",
                            "--batch_size=4", "--save_freq=2", "--log_freq=1", "--num_workers=0", "--seed=24",
                            "--dataset.image_transforms.enable=true", f"--output_dir={out}", "--wandb.enable=false",
                            name=VIDEO_NAME)
        print(f"\nACT over lake's video frames, transformed: losses {self.check_run(report, out, [1, 2], VIDEO_NAME)}",
              file=sys.stderr)

    def test_act_evaluates_held_out_episodes(self):
        if not is_newer_lerobot():
            self.skipTest("this LeRobot's training script holds no episodes out (0.6's does)")
        out = os.path.join(SERVER["tmp"], "act-eval-split")
        report = self.train(out, *ACT_ARGS, "--policy.device=cpu", "--policy.push_to_hub=false", "--steps=4",
                            "--batch_size=4", "--save_freq=4", "--log_freq=1", "--num_workers=0", "--seed=25",
                            "--dataset.eval_split=0.34", "--eval_steps=2", "--max_eval_samples=10",
                            f"--output_dir={out}", "--wandb.enable=false", name=VIDEO_NAME)
        self.check_run(report, out, [1, 2, 3, 4], VIDEO_NAME)
        evals = [(int(step), float(loss)) for step, loss in re.findall(r"step (\d+): eval_loss=(\S+)", report)]
        self.assertEqual([step for step, _ in evals], [2, 4], report[-4000:])
        self.assertTrue(all(math.isfinite(loss) for _, loss in evals), evals)
        print(f"\nACT over lake with held-out episodes: eval losses {evals}", file=sys.stderr)

    def test_act_under_torchrun_reads_one_stream_per_rank(self):
        import socket

        with socket.socket() as free:
            free.bind(("127.0.0.1", 0))
            port = free.getsockname()[1]
        out = os.path.join(SERVER["tmp"], "act-torchrun")
        launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={port}"]
        report = self.train(out, *ACT_ARGS, "--policy.device=cpu", "--policy.push_to_hub=false", "--steps=3",
                            "--batch_size=4", "--save_freq=3", "--log_freq=1", "--num_workers=0", "--seed=23",
                            f"--output_dir={out}", "--wandb.enable=false", launcher=launcher)
        self.assertIn("Effective batch size: 4 x 2 = 8", report)
        print(f"\nACT over lake, 2 ranks: losses {self.check_run(report, out, [1, 2, 3])}", file=sys.stderr)
        for rank in (0, 1):
            self.assert_logged(rf"stream datasets=tiny@1 rank={rank}/2 batch_size=4 seed=23 epoch=0 start_step=0:")

    def test_diffusion_trains_with_dataloader_workers(self):
        out = os.path.join(SERVER["tmp"], "diffusion")
        report = self.train(out, *DIFFUSION_ARGS, "--policy.device=cpu", "--policy.push_to_hub=false", "--steps=3",
                            "--batch_size=4", "--save_freq=3", "--log_freq=1", "--num_workers=2", "--seed=22",
                            f"--output_dir={out}", "--wandb.enable=false")
        print(f"\ndiffusion over lake: losses {self.check_run(report, out, [1, 2, 3])}", file=sys.stderr)
        # The two workers take turns: one stream from global step 0, one from step 1.
        self.assert_logged(r"stream datasets=tiny@1 rank=0/1 batch_size=4 seed=22 epoch=0 start_step=0:")
        self.assert_logged(r"stream datasets=tiny@1 rank=0/1 batch_size=4 seed=22 epoch=0 start_step=1:")


if __name__ == "__main__":
    unittest.main()
