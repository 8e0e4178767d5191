"""`lake train`'s TensorBoard events, read by TensorBoard's own reader (its EventAccumulator).

A lake built with the trainer (`$LAKE_BIN`, else the debug build; scripts/test.sh's torch stage
builds one) trains a small ACT on the bundled sample testdata/lerobot/v30-images-tiny for 6 steps,
with checkpoints at 3 and 6:

- TensorBoard finds the run's scalars under lerobot-train's names (`train/loss`, `train/l1_loss`,
  `train/kld_loss`, `train/grad_norm`, `train/lr`, `train/dataloading_s`, `train/update_s`),
  one point per step, each the step log's (`train_log.jsonl`) value as a 32-bit float;
- a run resumed from its step-3 checkpoint (as if the process had died after step 6 without
  saving it) writes a second events file, and TensorBoard shows each step once, steps 4 to 6 as
  the resumed process logged them.

The packages are scripts/python-env.sh's (tensorboard pinned there); without them, or without a
lake built with the trainer, the test fails saying so.
Run: `"$(scripts/python-env.sh)" clients/python/tests/test_tensorboard.py`.
"""

import glob
import json
import os
import shutil
import struct
import subprocess
import tempfile
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SAMPLE = os.path.join(REPO, "testdata", "lerobot", "v30-images-tiny")
CONFIG = os.path.join(REPO, "trainer", "configs", "act-small.json")

try:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
except ImportError as e:
    raise SystemExit(f"test_tensorboard: {e}: run it with scripts/python-env.sh's python, which has tensorboard")

from lake_binary import LAKE_BIN, lake, missing

TAGS = ["train/loss", "train/l1_loss", "train/kld_loss", "train/grad_norm", "train/lr", "train/dataloading_s", "train/update_s"]


def f32(x):
    """`x` as TensorBoard stores a scalar: a 32-bit float."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def step_log(run):
    """Each step's record as the step log counts it: its last line."""
    records = {}
    with open(os.path.join(run, "train_log.jsonl"), encoding="utf-8") as f:
        for line in f:
            if line.strip():
                record = json.loads(line)
                records[record["step"]] = record
    return records


def logged(record, tag):
    """The step log's value for a TensorBoard tag."""
    key = {
        "train/loss": "loss", "train/l1_loss": "l1", "train/kld_loss": "kld", "train/grad_norm": "grad_norm",
        "train/lr": "lr", "train/dataloading_s": "data_wait_s",
    }.get(tag)
    if key is not None:
        return record[key]
    return record["step_s"] - record["data_wait_s"]


def scalars(run):
    """{tag: [(step, value)]} as TensorBoard reads the run's directory."""
    events = EventAccumulator(run, size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


class TensorBoardReadsRuns(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        why = missing()
        if why:
            raise RuntimeError(why)
        cls.tmp = tempfile.mkdtemp(prefix="lake-tensorboard-test-")
        cls.root = os.path.join(cls.tmp, "lake")
        cls.out = os.path.join(cls.tmp, "run")
        lake(cls.root, "ingest", SAMPLE)
        cls.train("--steps", "6", "--save-every", "3")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    @classmethod
    def train(cls, *args):
        done = subprocess.run(
            [LAKE_BIN, "--lake", cls.root, "train", "--dataset", "v30-images-tiny", "--policy-config", CONFIG,
             "--batch-size", "4", "--seed", "5", "--out", cls.out, *args],
            capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"lake train {' '.join(args)} failed ({done.returncode}); a lake built with the trainer "
                               f"is needed (scripts/test.sh's torch stage builds one):\n{done.stdout}\n{done.stderr}")

    def check_equals_the_step_log(self):
        read, log = scalars(self.out), step_log(self.out)
        self.assertEqual(sorted(log), [1, 2, 3, 4, 5, 6])
        for tag in TAGS:
            self.assertIn(tag, read, f"tags: {sorted(read)}")
            self.assertEqual([s for s, _ in read[tag]], [1, 2, 3, 4, 5, 6], tag)
            for step, value in read[tag]:
                self.assertEqual(value, f32(logged(log[step], tag)), f"{tag} at step {step}")

    def test_1_every_step_under_lerobot_train_names(self):
        self.check_equals_the_step_log()
        lrs = [v for _, v in scalars(self.out)["train/lr"]]
        self.assertEqual(lrs, [f32(1e-4)] * 6, "act-small's constant learning rate")

    def test_2_a_resumed_run_replaces_the_steps_after_its_checkpoint(self):
        checkpoints = os.path.join(self.out, "checkpoints")
        shutil.rmtree(os.path.join(checkpoints, "000006"))
        os.remove(os.path.join(checkpoints, "last"))
        os.symlink("000003", os.path.join(checkpoints, "last"))
        self.train("--steps", "6", "--save-every", "3", "--resume")
        self.assertEqual(len(glob.glob(os.path.join(self.out, "events.out.tfevents.*"))), 2)
        with open(os.path.join(self.out, "train_log.jsonl"), encoding="utf-8") as f:
            self.assertEqual(sum(1 for line in f if line.strip()), 9, "the step log holds steps 4 to 6 twice")
        self.check_equals_the_step_log()


if __name__ == "__main__":
    unittest.main(verbosity=2)
