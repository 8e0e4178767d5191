"""A LeRobot-compatible dataset backed by `lake serve`, for LeRobot's own trainer.

`LakeLeRobotDataset` stands where `lerobot.datasets.lerobot_dataset.LeRobotDataset` stands in
`lerobot-train`: its `meta` has what LeRobot's training script, `make_policy` and
`make_pre_post_processors` read (`fps`, `features`, `stats`, `camera_keys`, `episodes`, `tasks`,
`robot_type`, …), taken from the server's HTTP port (`GET /v1/datasets/{name}` and SQL over
`POST /v1/sql`), and iterating it yields single samples exactly as `LeRobotDataset.__getitem__`
gives them: float32 CHW frames in [0, 1], float32 state and action (with a time dimension and
`{key}_is_pad` for the keys in `delta_timestamps`), `timestamp`, `frame_index`,
`episode_index`, `index`, `task_index` and `task`. The samples come from the server's shuffled
stream (`LakeIterableDataset`): the order is a pure function of `seed`, each rank reads its own
slice of every global batch, and DataLoader workers take turns by batch, so a `DataLoader` with
`batch_size` equal to the dataset's `batch_size` yields exactly one server batch per batch.

`make_lake_dataset(cfg, ...)` is `lerobot.datasets.factory.make_dataset` for a lake server, and
`make_lake_train_eval_datasets(cfg, ...)` LeRobot 0.6's `make_train_eval_datasets` (the held-out
episodes of `--dataset.eval_split` as a `LakeHeldOutDataset`): `python -m lake_client.lerobot_train`
runs `lerobot-train` with them.

It needs torch; `make_lake_dataset` needs LeRobot (0.4 or 0.6).
"""

from __future__ import annotations

import json
import math
import urllib.parse
import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from lake_client import CURSOR_KEY, LakeClient, LakeError, LakeIterableDataset, to_lerobot_layout
from lake_client._http import http_json

__all__ = ["LakeDatasetMetadata", "LakeHeldOutDataset", "LakeLeRobotDataset", "held_out_episodes", "make_lake_dataset",
           "make_lake_train_eval_datasets"]


def _sql(http: str, query: str, token: Optional[str]) -> List[Dict[str, Any]]:
    """Rows of a SQL query over the server's HTTP port, as dicts."""
    return http_json(http, "POST", "/v1/sql", token, query.encode(),
                     {"Content-Type": "text/plain", "Accept": "application/json"})


def _ident(name: str) -> str:
    """A SQL identifier (a dataset's schema) quoted."""
    return '"' + name.replace('"', '""') + '"'


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


class LakeDatasetMetadata:
    """The part of `LeRobotDatasetMetadata` a trainer reads, for one dataset version of a lake
    server: `repo_id` (the lake's name), `version`, `fps`, `features` (LeRobot's `info.json`
    features; a camera left out at ingest is not among them, since the server cannot serve it),
    `stats` (LeRobot's `stats.json` layout as numpy arrays: int64 where LeRobot writes integers,
    float64 otherwise; image stats `[3, 1, 1]`; lake computes them exactly over every frame),
    `episodes` (`episode_index`, `length`, `dataset_from_index`, `dataset_to_index`, each a numpy
    array, and `tasks`, a list of each episode's tasks, in episode order), `tasks` (a pandas DataFrame indexed by task, with `task_index`, as
    LeRobot's; a dict task → index without pandas), `robot_type`, `info`, and the derived
    `camera_keys`, `video_keys`, `image_keys`, `names`, `shapes`, `total_episodes`,
    `total_frames`, `total_tasks`."""

    def __init__(self, http: str, name: str, token: Optional[str] = None):
        described = http_json(http, "GET", "/v1/datasets/" + urllib.parse.quote(name, safe="@"), token)
        if "features" not in described:
            raise LakeError("bad_request", f"{name!r} is a view, not a dataset: train on a dataset")
        self.repo_id = described["name"]
        self.version = int(described["version"])
        self.fps = int(described["fps"])
        # Shapes as tuples, as LeRobot's `load_info` makes them.
        self.features: Dict[str, Dict[str, Any]] = {
            key: {k: (tuple(v) if k == "shape" else v) for k, v in feature.items() if k != "ingested"}
            for key, feature in described["features"].items()
            if feature.get("ingested", True)
        }
        self.stats: Dict[str, Dict[str, np.ndarray]] = {
            key: {stat: np.array(value) for stat, value in values.items()}
            for key, values in described.get("stats", {}).items()
            if key in self.features
        }
        self.http, self.token = http, token
        schema = self.schema
        rows = _sql(http, f"SELECT episode_index, length, dataset_from_index, dataset_to_index, tasks FROM {schema}.episodes "
                          "ORDER BY episode_index", token)
        self.episodes: Dict[str, Any] = {
            column: np.array([row[column] for row in rows], dtype=np.int64)
            for column in ("episode_index", "length", "dataset_from_index", "dataset_to_index")
        }
        self.episodes["tasks"] = [list(row["tasks"] or []) for row in rows]
        tasks = _sql(http, f"SELECT task_index, task FROM {schema}.tasks ORDER BY task_index", token)
        try:
            import pandas as pd

            self.tasks: Any = pd.DataFrame({"task_index": [t["task_index"] for t in tasks]},
                                           index=pd.Index([t["task"] for t in tasks], name="task"))
        except ImportError:
            self.tasks = {t["task"]: t["task_index"] for t in tasks}
        found = _sql(http, f"SELECT robot_type FROM datasets WHERE dataset = {_literal(self.repo_id)} "
                           f"AND version = {self.version}", token)
        self.robot_type: Optional[str] = found[0]["robot_type"] if found else None
        self.info: Dict[str, Any] = {
            "robot_type": self.robot_type,
            "fps": self.fps,
            "features": self.features,
            "total_episodes": len(self.episodes["episode_index"]),
            "total_frames": int(self.episodes["length"].sum()),
            "total_tasks": len(tasks),
            "codebase_version": (described.get("source") or {}).get("codebase_version"),
        }

    @property
    def schema(self) -> str:
        """The SQL schema of this dataset version's tables, quoted."""
        return _ident(f"{self.repo_id}@{self.version}")

    def sql(self, query: str) -> List[Dict[str, Any]]:
        """Rows of a SQL query over the server's HTTP port, as dicts."""
        return _sql(self.http, query, self.token)

    @property
    def video_keys(self) -> List[str]:
        return [key for key, ft in self.features.items() if ft["dtype"] == "video"]

    @property
    def image_keys(self) -> List[str]:
        return [key for key, ft in self.features.items() if ft["dtype"] == "image"]

    @property
    def camera_keys(self) -> List[str]:
        return [key for key, ft in self.features.items() if ft["dtype"] in ("video", "image")]

    @property
    def names(self) -> Dict[str, Any]:
        return {key: ft["names"] for key, ft in self.features.items()}

    @property
    def shapes(self) -> Dict[str, tuple]:
        return {key: tuple(ft["shape"]) for key, ft in self.features.items()}

    @property
    def total_episodes(self) -> int:
        return self.info["total_episodes"]

    @property
    def total_frames(self) -> int:
        return self.info["total_frames"]

    @property
    def total_tasks(self) -> int:
        return self.info["total_tasks"]

    @property
    def has_language_columns(self) -> bool:
        """Whether the dataset has LeRobot 0.6's language columns (lerobot-train 0.6 then
        collates with its own function)."""
        return any(column in self.features for column in ("language_persistent", "language_events"))

    def __repr__(self) -> str:
        return (f"LakeDatasetMetadata(repo_id={self.repo_id!r}, version={self.version}, fps={self.fps}, "
                f"episodes={self.total_episodes}, frames={self.total_frames}, features={list(self.features)})")


class _WithMetadata:
    """A dataset's `fps` and `features`, as `LeRobotDataset` has them, from its `meta`."""

    meta: LakeDatasetMetadata

    @property
    def fps(self) -> int:
        return self.meta.fps

    @property
    def features(self) -> Dict[str, Dict[str, Any]]:
        return self.meta.features


class LakeLeRobotDataset(_WithMetadata, torch.utils.data.IterableDataset):
    """A lake dataset as `LeRobotDataset` gives it to a training loop, read from `lake serve`:
    `location` is its Flight address (`grpc://HOST:PORT`), `http` its HTTP one (`HOST:PORT` or
    `http://HOST:PORT`), `name` the dataset (`NAME` or `NAME@VERSION`; the metadata's version is
    the one read).

    Iterating yields one sample at a time, as `LeRobotDataset.__getitem__` returns it, in the
    server's shuffled order (a pure function of `seed`); batch them with
    `DataLoader(ds, batch_size=batch_size)` (shuffle off: the order is the server's), which then
    yields exactly the server's batches of `batch_size` samples for this rank (global batch
    `batch_size * world_size`; rank and world size from `torch.distributed` unless given), also
    under DataLoader workers, which take turns by batch. `delta_timestamps` (LeRobot's, seconds
    per key) gives windows with their `{key}_is_pad`; `episodes` selects episodes;
    `drop_n_last_frames` leaves out samples that close to each episode's end, as LeRobot's
    `EpisodeAwareSampler` does; `image_transforms` is applied to each sample's frames, as
    `LeRobotDataset` applies it. `return_uint8` gives video frames as uint8 CHW, as LeRobot 0.6's
    `LeRobotDataset(return_uint8=True)` gives them to lerobot-train 0.6 (the transforms then take
    uint8 frames, and the training loop divides the batch by 255); image features stay float, as
    there. `meta`, when given, is the metadata already fetched for `name`. `start_batch` starts
    the stream that many global steps in (a resumed run's step). Without `epochs` the stream is
    endless. `shuffle=False` gives the samples in the order recorded instead, and
    `drop_last=False` keeps each epoch's short last batch (both as the server's request fields). Over Flight, a process that
    made a Flight client before forking its DataLoader workers should start them with
    `multiprocessing_context="spawn"`; this dataset itself contacts Flight only when iterated.
    """

    def __init__(
        self,
        location: str,
        http: str,
        name: str,
        *,
        token: Optional[str] = None,
        delta_timestamps: Optional[Dict[str, List[float]]] = None,
        batch_size: int = 32,
        seed: int = 0,
        episodes: Optional[Sequence[int]] = None,
        drop_n_last_frames: int = 0,
        image_transforms: Any = None,
        return_uint8: bool = False,
        epochs: Optional[int] = None,
        start_batch: int = 0,
        shuffle: bool = True,
        drop_last: bool = True,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        meta: Optional[LakeDatasetMetadata] = None,
    ):
        super().__init__()
        self.meta = LakeDatasetMetadata(http, name, token) if meta is None else meta
        self.repo_id = self.meta.repo_id
        self.delta_timestamps = delta_timestamps
        self.episodes = None if episodes is None else sorted(int(e) for e in episodes)
        self.drop_n_last_frames = int(drop_n_last_frames)
        self.image_transforms = image_transforms
        self.return_uint8 = bool(return_uint8)
        self.batch_size = batch_size
        self.start_batch = int(start_batch)
        if self.episodes is not None:
            known = set(self.meta.episodes["episode_index"].tolist())
            unknown = [e for e in self.episodes if e not in known]
            if unknown:
                raise ValueError(f"episodes {unknown} are not in {self.repo_id}@{self.meta.version}")
        self._stream = LakeIterableDataset(
            location,
            datasets=[f"{self.repo_id}@{self.meta.version}"],
            preset="none",
            delta_timestamps=delta_timestamps,
            batch_size=batch_size,
            seed=seed,
            epochs=epochs,
            token=token,
            rank=rank,
            world_size=world_size,
            frame_layout="uint8_hwc" if self.return_uint8 else "lerobot",
            episodes=self.episodes,
            drop_n_last_frames=self.drop_n_last_frames or None,
            shuffle=None if shuffle else False,
            drop_last=None if drop_last else False,
        )
        self._started = False

    @property
    def rank(self) -> int:
        return self._stream.rank

    @property
    def world_size(self) -> int:
        return self._stream.world_size

    @property
    def num_episodes(self) -> int:
        """The episodes sampled (LeRobot's `num_episodes`)."""
        return self.meta.total_episodes if self.episodes is None else len(self.episodes)

    @property
    def num_frames(self) -> int:
        """The frames of the episodes sampled (LeRobot's `num_frames`)."""
        if self.episodes is None:
            return self.meta.total_frames
        chosen = np.isin(self.meta.episodes["episode_index"], self.episodes)
        return int(self.meta.episodes["length"][chosen].sum())

    def _skip_to_start(self) -> None:
        """Moves the stream's cursor `start_batch` global steps in, once, where it is iterated
        (the epoch's length comes from the server)."""
        if self._started:
            return
        self._started = True
        if self.start_batch:
            stream = self._stream
            steps = LakeClient(stream.location, stream.token).info(stream._plan_request())["steps_per_epoch"]
            stream.epoch, stream.step = divmod(self.start_batch, steps)

    def __iter__(self):
        self._skip_to_start()
        cameras = set(self.meta.camera_keys)
        # With `return_uint8`, LeRobot 0.6 gives a video's frames as uint8 and still an image
        # feature's as float.
        videos, images = set(self.meta.video_keys), set(self.meta.image_keys)
        with warnings.catch_warnings():
            # Each DataLoader worker keeps its own cursor; a run resumes from its step count
            # (`start_batch`), never from the dataset's state_dict.
            warnings.filterwarnings("ignore", message="LakeIterableDataset runs in")
            for batch in self._stream:
                batch.pop(CURSOR_KEY, None)
                rows = len(batch["index"])
                for i in range(rows):
                    sample = {key: value[i] for key, value in batch.items()}
                    if self.return_uint8:
                        for key in videos & sample.keys():
                            sample[key] = sample[key].movedim(-1, -3).contiguous()
                        for key in images & sample.keys():
                            sample[key] = to_lerobot_layout(sample[key])
                    if self.image_transforms is not None:
                        for key in cameras & sample.keys():
                            sample[key] = self.image_transforms(sample[key])
                    yield sample

    def __repr__(self) -> str:
        return (f"LakeLeRobotDataset({self.repo_id}@{self.meta.version}, episodes={self.num_episodes}, "
                f"frames={self.num_frames}, batch_size={self.batch_size}, rank={self.rank}/{self.world_size})")


def held_out_episodes(meta: LakeDatasetMetadata, episodes: Optional[Sequence[int]],
                      eval_split: float) -> Tuple[List[int], List[int]]:
    """LeRobot 0.6's split of `episodes` (every episode when None) into training and held-out
    episodes (`make_train_eval_datasets`): episodes grouped by their first task, in the order the
    tasks first come, and the last `ceil(n * eval_split)` of each group's `n` held out. Raises
    `ValueError` when no training episode is left."""
    base = [int(e) for e in episodes] if episodes is not None else meta.episodes["episode_index"].tolist()
    tasks_of = dict(zip(meta.episodes["episode_index"].tolist(), meta.episodes["tasks"]))
    unknown = [e for e in base if e not in tasks_of]
    if unknown:
        raise ValueError(f"episodes {unknown} are not in {meta.repo_id}@{meta.version}")
    by_task: Dict[str, List[int]] = {}
    for e in base:
        by_task.setdefault(tasks_of[e][0] if tasks_of[e] else "", []).append(e)
    train: List[int] = []
    held_out: List[int] = []
    for group in by_task.values():
        n = math.ceil(len(group) * eval_split)
        train.extend(group[:len(group) - n])
        held_out.extend(group[len(group) - n:])
    if not train:
        raise ValueError(f"eval_split={eval_split} leaves 0 training episodes from {len(base)} total.")
    return train, held_out


class LakeHeldOutDataset(_WithMetadata, torch.utils.data.IterableDataset):
    """Held-out episodes as lerobot-train 0.6 evaluates them (its `eval_dataset`), read from
    `lake serve`: every iteration is one whole pass over the frames of `episodes`, in the order
    recorded (LeRobot's evaluation DataLoader does not shuffle), without image transforms and with
    no frame left out at the episodes' ends. Each rank reads the whole pass, so the held-out loss
    on every rank is the loss one process computes.

    `max_samples` (lerobot-train's `--max_eval_samples`) caps a pass as LeRobot does: for each
    task the held-out frames have (by task index), that task's first `max(1, max_samples //
    tasks)` frames, task after task. The other arguments are `LakeLeRobotDataset`'s."""

    def __init__(self, location: str, http: str, name: str, *, episodes: Sequence[int], token: Optional[str] = None,
                 delta_timestamps: Optional[Dict[str, List[float]]] = None, batch_size: int = 32,
                 return_uint8: bool = False, max_samples: int = 0, meta: Optional[LakeDatasetMetadata] = None):
        super().__init__()
        self.meta = LakeDatasetMetadata(http, name, token) if meta is None else meta
        self.repo_id = self.meta.repo_id
        self.episodes = sorted(int(e) for e in episodes)
        if not self.episodes:
            raise ValueError("a held-out dataset needs at least one episode")
        self._made = dict(location=location, http=http, name=f"{self.repo_id}@{self.meta.version}", token=token,
                          delta_timestamps=delta_timestamps, batch_size=batch_size, return_uint8=return_uint8)
        # Each pass: its episodes and the frames (`index`) it keeps, None for all of them.
        self._passes: List[Tuple[List[int], Optional[set]]] = [(self.episodes, None)]
        if max_samples > 0:
            self._passes = self._capped(int(max_samples))
        self.num_frames = (sum(len(kept) for _, kept in self._passes) if max_samples > 0 else
                           int(self.meta.episodes["length"][np.isin(self.meta.episodes["episode_index"], self.episodes)].sum()))

    def _capped(self, max_samples: int) -> List[Tuple[List[int], Optional[set]]]:
        """A pass per task with the frames LeRobot's cap keeps of it, asked of the server's SQL."""
        chosen = ", ".join(str(e) for e in self.episodes)
        tasks = self.meta.sql(f"SELECT DISTINCT task_index FROM {self.meta.schema}.steps "
                              f"WHERE episode_index IN ({chosen}) ORDER BY task_index")
        per_task = max(1, max_samples // len(tasks))
        rows = self.meta.sql(
            'SELECT "index", task_index, episode_index FROM (SELECT "index", task_index, episode_index, '
            'row_number() OVER (PARTITION BY task_index ORDER BY "index") AS n '
            f"FROM {self.meta.schema}.steps WHERE episode_index IN ({chosen})) "
            f'WHERE n <= {per_task} ORDER BY task_index, "index"')
        passes: Dict[int, Tuple[List[int], set]] = {}
        for row in rows:
            episodes, kept = passes.setdefault(int(row["task_index"]), ([], set()))
            if int(row["episode_index"]) not in episodes:
                episodes.append(int(row["episode_index"]))
            kept.add(int(row["index"]))
        return [(sorted(episodes), kept) for episodes, kept in passes.values()]

    @property
    def num_episodes(self) -> int:
        return len(self.episodes)

    def __iter__(self):
        made = self._made
        for episodes, kept in self._passes:
            frames = LakeLeRobotDataset(made["location"], made["http"], made["name"], token=made["token"],
                                        delta_timestamps=made["delta_timestamps"], batch_size=made["batch_size"],
                                        episodes=episodes, return_uint8=made["return_uint8"], epochs=1, shuffle=False,
                                        drop_last=False, rank=0, world_size=1, meta=self.meta)
            for sample in frames:
                if kept is None or int(sample["index"]) in kept:
                    yield sample

    def __len__(self) -> int:
        return self.num_frames

    def __repr__(self) -> str:
        return (f"LakeHeldOutDataset({self.repo_id}@{self.meta.version}, episodes={self.num_episodes}, "
                f"frames={self.num_frames})")


def _image_transforms(cfg: Any) -> Any:
    """LeRobot's `ImageTransforms` of `cfg.dataset`, None when not enabled."""
    try:  # LeRobot 0.6
        from lerobot.transforms import ImageTransforms
    except ImportError:  # LeRobot 0.4
        from lerobot.datasets.transforms import ImageTransforms

    return ImageTransforms(cfg.dataset.image_transforms) if cfg.dataset.image_transforms.enable else None


def _start_batch(cfg: Any) -> int:
    """The step a resumed run (`cfg.resume`) continues at; 0 for a new run."""
    if not (getattr(cfg, "resume", False) and getattr(cfg, "checkpoint_path", None) is not None):
        return 0
    from lerobot.utils.constants import TRAINING_STATE_DIR

    try:  # LeRobot 0.6
        from lerobot.common.train_utils import load_training_step
    except ImportError:  # LeRobot 0.4
        from lerobot.utils.train_utils import load_training_step

    return load_training_step(cfg.checkpoint_path / TRAINING_STATE_DIR)


def _trained_config(cfg: Any) -> Any:
    """The config whose `delta_timestamps` the samples take: LeRobot 0.6's `trainable_config`
    (the policy, or a reward model), the policy under LeRobot 0.4."""
    return getattr(cfg, "trainable_config", cfg.policy)


def make_lake_dataset(cfg: Any, location: str, http: str, name: str, token: Optional[str] = None,
                      return_uint8: bool = False, *, episodes: Optional[Sequence[int]] = None,
                      meta: Optional[LakeDatasetMetadata] = None) -> LakeLeRobotDataset:
    """`lerobot.datasets.factory.make_dataset(cfg)` for a dataset on a lake server, with LeRobot
    0.4 or 0.6: the `delta_timestamps` of `cfg.policy` (LeRobot's `resolve_delta_timestamps`),
    `cfg.dataset`'s `episodes` (`episodes`, when given, instead), `image_transforms` and
    `use_imagenet_stats`, `cfg.batch_size`, `cfg.seed` (0 when unset), the policy's
    `drop_n_last_frames` (diffusion's), and on a resumed run (`cfg.resume`) the stream continues
    at the checkpoint's step. `return_uint8` as `LakeLeRobotDataset` takes it (lerobot-train 0.6
    asks for uint8 frames); `meta`, the dataset's metadata when already fetched. Sets
    `cfg.dataset.streaming`: LeRobot's loop then makes its DataLoader without a shuffle, in the
    server's order."""
    from lerobot.datasets.factory import resolve_delta_timestamps

    meta = LakeDatasetMetadata(http, name, token) if meta is None else meta
    dataset = LakeLeRobotDataset(
        location,
        http,
        f"{meta.repo_id}@{meta.version}",
        token=token,
        delta_timestamps=resolve_delta_timestamps(_trained_config(cfg), meta),
        batch_size=cfg.batch_size,
        seed=0 if cfg.seed is None else cfg.seed,
        episodes=cfg.dataset.episodes if episodes is None else episodes,
        drop_n_last_frames=getattr(cfg.policy, "drop_n_last_frames", 0),
        image_transforms=_image_transforms(cfg),
        return_uint8=return_uint8,
        start_batch=_start_batch(cfg),
        meta=meta,
    )
    cfg.dataset.streaming = True
    _imagenet_stats(cfg, meta)
    return dataset


def _imagenet_stats(cfg: Any, meta: LakeDatasetMetadata) -> None:
    """With `cfg.dataset.use_imagenet_stats`, ImageNet's mean and std for every camera, as
    LeRobot sets them."""
    if not cfg.dataset.use_imagenet_stats:
        return
    from lerobot.datasets.factory import IMAGENET_STATS

    for key in meta.camera_keys:
        for stat, value in IMAGENET_STATS.items():
            meta.stats[key][stat] = torch.tensor(value, dtype=torch.float32)


def make_lake_train_eval_datasets(cfg: Any, location: str, http: str, name: str, token: Optional[str] = None
                                  ) -> Tuple[LakeLeRobotDataset, Optional[LakeHeldOutDataset]]:
    """LeRobot 0.6's `make_train_eval_datasets(cfg)` for a dataset on a lake server: with
    `cfg.dataset.eval_split` 0, `make_lake_dataset` and no held-out dataset; above 0, the
    training dataset over the episodes `held_out_episodes` keeps for training and a
    `LakeHeldOutDataset` over the others (capped by `cfg.max_eval_samples`), frames as uint8, as
    lerobot-train 0.6 asks for them."""
    meta = LakeDatasetMetadata(http, name, token)
    eval_split = getattr(cfg.dataset, "eval_split", 0.0)
    if not eval_split:
        return make_lake_dataset(cfg, location, http, name, token, return_uint8=True, meta=meta), None
    from lerobot.datasets.factory import resolve_delta_timestamps

    train, held_out = held_out_episodes(meta, cfg.dataset.episodes, eval_split)
    dataset = make_lake_dataset(cfg, location, http, name, token, return_uint8=True, episodes=train, meta=meta)
    evaluated = LakeHeldOutDataset(location, http, f"{meta.repo_id}@{meta.version}", episodes=held_out, token=token,
                                   delta_timestamps=resolve_delta_timestamps(_trained_config(cfg), meta),
                                   batch_size=cfg.batch_size, return_uint8=True,
                                   max_samples=getattr(cfg, "max_eval_samples", 0), meta=meta)
    return dataset, evaluated
