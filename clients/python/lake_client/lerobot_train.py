"""`lerobot-train` with its dataset read from a lake server.

    python -m lake_client.lerobot_train --lake-server grpc://HOST:PORT --lake-http http://HOST:PORT \\
        --lake-dataset NAME [--lake-token T] <lerobot-train arguments>

Runs LeRobot's training script (`lerobot.scripts.lerobot_train.train`, LeRobot 0.4 or 0.6)
unchanged, with three names replaced for the run:

- the dataset: a `LakeLeRobotDataset` (`make_lake_dataset`), LeRobot's samples from the
  server's shuffled stream, seeded by `--seed`, `--batch_size` samples per rank and step. With
  LeRobot 0.4 it replaces `make_dataset`; with 0.6 `make_train_eval_datasets`
  (`make_lake_train_eval_datasets`): `--dataset.eval_split` holds out LeRobot's episodes, which
  `--eval_steps` evaluates as a `LakeHeldOutDataset` (in the order recorded, capped by
  `--max_eval_samples` as LeRobot caps it), and the frames come as uint8 as 0.6's dataset gives
  them (`return_uint8=True`);
- `EpisodeAwareSampler` (what LeRobot 0.4 samples with for policies that drop each episode's last
  frames, such as diffusion) gives no sampler: the server leaves those frames out
  (`drop_n_last_frames` in the request);
- `Accelerator` is accelerate's, except that a DataLoader over the lake dataset is only moved
  to the device: each rank already reads its own slice of every global batch from the server
  (and the whole held-out set at each evaluation), so accelerate neither dispatches rank 0's
  batches nor shards them again.

`--dataset.repo_id` defaults to the lake dataset's name (LeRobot's config needs one; it names the
dataset in the run's saved config). The token may also come from `LAKE_TOKEN`.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional

_LAKE_OPTIONS = ("--lake-server", "--lake-http", "--lake-dataset", "--lake-token")


def _parse(argv: List[str]):
    parser = argparse.ArgumentParser(
        prog="python -m lake_client.lerobot_train",
        description="Runs lerobot-train with its dataset read from a lake server; every argument besides "
                    "the --lake-* ones goes to lerobot-train.",
        allow_abbrev=False,
    )
    parser.add_argument("--lake-server", required=True, help="lake serve's Flight address, grpc://HOST:PORT")
    parser.add_argument("--lake-http", required=True, help="lake serve's HTTP address, http://HOST:PORT")
    parser.add_argument("--lake-dataset", required=True, help="the dataset to train on, NAME or NAME@VERSION")
    parser.add_argument("--lake-token", default=os.environ.get("LAKE_TOKEN"),
                        help="the server's bearer token (default: $LAKE_TOKEN)")
    return parser.parse_known_args(argv)


def _accelerator_class(lake_dataset_type):
    """accelerate's `Accelerator`, preparing DataLoaders over `lake_dataset_type` without
    sharding them."""
    from accelerate import Accelerator
    from accelerate.data_loader import prepare_data_loader

    class LakeAccelerator(Accelerator):
        def prepare_data_loader(self, data_loader, device_placement=None, slice_fn_for_dispatch=None):
            if not isinstance(getattr(data_loader, "dataset", None), lake_dataset_type):
                return super().prepare_data_loader(data_loader, device_placement, slice_fn_for_dispatch)
            if device_placement is None:
                device_placement = self.device_placement
            # One process's view: the server already gave this rank its slice of each batch.
            prepared = prepare_data_loader(
                data_loader,
                self.device,
                num_processes=1,
                process_index=0,
                put_on_device=device_placement,
                dispatch_batches=False,
                non_blocking=self.non_blocking,
            )
            self._dataloaders.append(prepared)
            return prepared

    return LakeAccelerator


def main(argv: Optional[List[str]] = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    lake, rest = _parse(argv)
    try:
        from lerobot.scripts import lerobot_train
        from lerobot.utils.import_utils import register_third_party_plugins
    except ImportError as e:
        raise SystemExit(f"lake_client.lerobot_train needs LeRobot (pip install lerobot): {e}") from e
    from lake_client.lerobot import LakeHeldOutDataset, LakeLeRobotDataset, make_lake_dataset, make_lake_train_eval_datasets

    if not any(a == "--dataset.repo_id" or a.startswith("--dataset.repo_id=") for a in rest):
        rest.append(f"--dataset.repo_id={lake.lake_dataset}")
    made: List[LakeLeRobotDataset] = []

    # LeRobot 0.6's script makes a training and a held-out dataset, with uint8 frames.
    newer = hasattr(lerobot_train, "make_train_eval_datasets")

    def make_dataset(cfg):
        dataset = make_lake_dataset(cfg, lake.lake_server, lake.lake_http, lake.lake_dataset, lake.lake_token,
                                    return_uint8=newer)
        made.append(dataset)
        return dataset

    def make_train_eval_datasets(cfg):
        dataset, held_out = make_lake_train_eval_datasets(cfg, lake.lake_server, lake.lake_http, lake.lake_dataset,
                                                          lake.lake_token)
        made.append(dataset)
        return dataset, held_out

    def episode_aware_sampler(*args, drop_n_last_frames: int = 0, **kwargs):
        # The server samples: its stream already leaves out each episode's last frames.
        if not made or made[-1].drop_n_last_frames != drop_n_last_frames:
            raise RuntimeError(
                f"the lake dataset drops {made[-1].drop_n_last_frames if made else None} last frames per episode, "
                f"but lerobot-train asks for {drop_n_last_frames}"
            )
        return None

    import accelerate

    accelerator = _accelerator_class((LakeLeRobotDataset, LakeHeldOutDataset))
    # (module, name, value): LeRobot 0.6's `train` imports accelerate's `Accelerator` when it runs.
    replaced = [
        (lerobot_train, "make_train_eval_datasets" if newer else "make_dataset",
         make_train_eval_datasets if newer else make_dataset),
        (lerobot_train, "EpisodeAwareSampler", episode_aware_sampler),
        (lerobot_train if hasattr(lerobot_train, "Accelerator") else accelerate, "Accelerator", accelerator),
    ]
    saved = [(module, name, getattr(module, name)) for module, name, _ in replaced]
    # LeRobot's parser reads the command line from sys.argv.
    saved_argv = sys.argv
    sys.argv = [saved_argv[0] if saved_argv else "lerobot-train"] + rest
    try:
        for module, name, value in replaced:
            setattr(module, name, value)
        register_third_party_plugins()
        lerobot_train.train()
    finally:
        for module, name, value in saved:
            setattr(module, name, value)
        sys.argv = saved_argv


if __name__ == "__main__":
    main()
