"""Time LeRobot's own loader on a local LeRobot dataset, the way a training run feeds it.

``--like`` picks whose ``lerobot-train`` DataLoader is reproduced (default: the installed
LeRobot's release):

- ``0.4.4``: ``LeRobotDataset(repo_id, root=..., delta_timestamps=<preset>, tolerance_s=1e-4,
  video_backend=...)`` (float32 frames); a policy with ``drop_n_last_frames`` (Diffusion: 7) is
  sampled by ``EpisodeAwareSampler(shuffle=True)`` on the seeded global generator, ACT by a
  shuffled DataLoader; ``prefetch_factor=2``, no persistent workers, fork.
- ``0.6.1``: the same dataset with ``return_uint8=True``, ``EpisodeAwareSampler`` for every policy
  (``seed``, ``drop_n_last_frames`` as the policy's, 0 for ACT), ``prefetch_factor=4``, persistent
  workers, spawn; the main process turns each camera's uint8 into float32 / 255, as
  lerobot-train 0.6.1's loop does, inside the timed window.

``--lance-root`` reads instead with lerobot-lancedb's ``LanceDBDataset`` (a dataset
``lerobot-lance-convert`` converted; ``return_uint8=True``, ``EpisodeAwareSampler`` as 0.6.1's,
``prefetch_factor=2``, no persistent workers, ``lerobot_lancedb.lance_mp_context()``): LeRobot + Lance,
the strongest CPU peer, with any preset's windows.

``--image-transforms`` gives the dataset LeRobot's image transforms with its defaults switched on
(``ImageTransforms(ImageTransformsConfig(enable=True))``), applied in the workers as lerobot-train
applies them: to float32 frames with ``0.4.4``, to uint8 ones with ``0.6.1`` and ``--lance-root``.
``--image-transforms-file FILE`` takes the ``ImageTransformsConfig`` from a JSON file instead (its
fields over the defaults, ``enable`` true unless it says otherwise; ``tfs`` may name LeRobot
0.6.1's own transforms). ``--float-frames`` makes ``0.6.1`` and ``--lance-root`` datasets return
float32 frames (``return_uint8=False``, ``LeRobotDataset``'s default), so that 0.6.1's own
transforms, which pass uint8 frames through unchanged, apply.

``num_workers`` worker processes; the first ``--warmup`` batches start the workers and open the
decoders; the next ``--batches`` batches are timed.

CPU time is that of the whole process tree over the timed batches: this process plus every
worker process, read from ``/proc`` (through psutil) while the workers are still alive, so the
decoding done in the workers is counted. Peak RSS is the sum of every process's high-water
mark (``VmHWM``); pages the forked workers share with the parent are counted once per process,
so it is an upper bound. PSS (shared pages split between the processes) at the end of the
timed batches is reported too.

Prints one JSON object (also written to ``--json-out``).

Usage::

    python run_lerobot.py --root DATASET_DIR [--batches 30] [--batch-size 32] [--num-workers 2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

# A local dataset only: never ask the Hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import psutil  # noqa: E402


def delta_timestamps(preset: str, fps: int, info: dict) -> dict[str, list[float]] | None:
    """LeRobot ``delta_timestamps`` of a policy preset (keys as in lake's presets)."""
    if preset == "act":
        return {"action": [i / fps for i in range(50)]}
    if preset == "diffusion":
        cams = [k for k, f in info["features"].items() if f["dtype"] in ("video", "image")]
        window = {"observation.state": [-1 / fps, 0.0], "action": [i / fps for i in range(-1, 15)]}
        return {**window, **{c: [-1 / fps, 0.0] for c in cams}}
    if preset == "none":
        return None
    raise SystemExit(f"unknown preset {preset!r} (act, diffusion, none)")


def drop_n_last_frames(preset: str) -> int | None:
    """The policy's ``drop_n_last_frames`` (None: the policy has no such field)."""
    return 7 if preset == "diffusion" else None


def tree() -> list[psutil.Process]:
    me = psutil.Process()
    return [me, *me.children(recursive=True)]


def cpu_seconds(procs: list[psutil.Process]) -> dict[int, float]:
    """User + system CPU seconds of each live process (all its threads), by pid."""
    out = {}
    for p in procs:
        try:
            t = p.cpu_times()
            out[p.pid] = t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return out


def vm_hwm_mb(pid: int) -> float:
    """Peak resident set size of a process in MB (``VmHWM``), 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def pss_mb(procs: list[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        try:
            total += p.memory_full_info().pss / 2**20
        except (psutil.NoSuchProcess, psutil.AccessDenied, AttributeError):
            pass
    return total


def batch_bytes(batch) -> int:
    import torch

    return sum(v.numel() * v.element_size() for v in batch.values() if isinstance(v, torch.Tensor))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, required=True, help="LeRobot dataset root (with meta/info.json)")
    ap.add_argument("--repo-id", default=None, help="repo_id to give LeRobotDataset [the root's name]")
    ap.add_argument("--preset", default="act", help="delta_timestamps preset: act, diffusion or none [act]")
    ap.add_argument("--backend", default="torchcodec", help="LeRobot video_backend: torchcodec or pyav [torchcodec]")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--batches", type=int, default=30, help="batches to time after the warm-up [30]")
    ap.add_argument("--warmup", type=int, default=1, help="batches before the clock starts [1]")
    ap.add_argument("--num-workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0, help="shuffle seed [0]")
    ap.add_argument("--json-out", type=Path, default=None, help="also write the JSON here")
    ap.add_argument("--like", choices=["0.4.4", "0.6.1"], default=None,
                    help="whose lerobot-train DataLoader to reproduce [the installed LeRobot's release]")
    ap.add_argument("--lance-root", type=Path, default=None,
                    help="read with lerobot-lancedb's LanceDBDataset from this converted dataset")
    ap.add_argument("--image-transforms", action="store_true",
                    help="LeRobot's image transforms, its defaults switched on, as lerobot-train applies them")
    ap.add_argument("--image-transforms-file", type=Path, default=None,
                    help="LeRobot's ImageTransformsConfig from this JSON file (fields over the defaults)")
    ap.add_argument("--float-frames", action="store_true",
                    help="0.6.1 and --lance-root: float32 frames (return_uint8=False), for 0.6.1's own transforms")
    args = ap.parse_args()

    import lerobot
    import torch
    import torchcodec
    from lerobot.datasets.lerobot_dataset import LeRobotDataset
    from lerobot.datasets.sampler import EpisodeAwareSampler

    like = args.like or ("0.6.1" if lerobot.__version__.startswith("0.6") else "0.4.4")
    info = json.loads((args.root / "meta" / "info.json").read_text())
    fps = int(info["fps"])
    dts = delta_timestamps(args.preset, fps, info)
    drop = drop_n_last_frames(args.preset)

    transforms = None
    if args.image_transforms or args.image_transforms_file:
        try:  # where LeRobot 0.6.1 keeps them
            from lerobot.transforms.transforms import ImageTransformConfig, ImageTransforms, ImageTransformsConfig
        except ImportError:  # LeRobot 0.4.4
            from lerobot.datasets.transforms import ImageTransformConfig, ImageTransforms, ImageTransformsConfig
        fields = {"enable": True}
        if args.image_transforms_file:
            fields.update(json.loads(args.image_transforms_file.read_text()))
            if "tfs" in fields:
                fields["tfs"] = {name: ImageTransformConfig(**tf) for name, tf in fields["tfs"].items()}
        transforms = ImageTransforms(ImageTransformsConfig(**fields))
    uint8 = not args.float_frames

    began = time.perf_counter()
    if args.lance_root is not None:
        import lerobot_lancedb

        ds = lerobot_lancedb.LanceDBDataset(root=args.lance_root, delta_timestamps=dts, tolerance_s=1e-4, return_uint8=uint8,
                                            image_transforms=transforms)
        context, prefetch, persistent = lerobot_lancedb.lance_mp_context(), 2, False
    elif like == "0.6.1":
        ds = LeRobotDataset(args.repo_id or f"local/{args.root.name}", root=args.root, delta_timestamps=dts,
                            tolerance_s=1e-4, video_backend=args.backend, return_uint8=uint8, image_transforms=transforms)
        context, prefetch, persistent = "spawn", 4, True
    else:
        ds = LeRobotDataset(args.repo_id or f"local/{args.root.name}", root=args.root, delta_timestamps=dts,
                            tolerance_s=1e-4, video_backend=args.backend, image_transforms=transforms)
        context, prefetch, persistent = None, 2, False
    open_s = time.perf_counter() - began

    torch.manual_seed(args.seed)
    sampler, shuffle, generator = None, True, torch.Generator().manual_seed(args.seed)
    if args.lance_root is not None or like == "0.6.1":
        sampler = EpisodeAwareSampler(ds.meta.episodes["dataset_from_index"], ds.meta.episodes["dataset_to_index"],
                                      episode_indices_to_use=ds.episodes, drop_n_last_frames=drop or 0, shuffle=True,
                                      seed=args.seed, absolute_to_relative_idx=ds.absolute_to_relative_idx)
    elif drop is not None:
        sampler = EpisodeAwareSampler(ds.meta.episodes["dataset_from_index"], ds.meta.episodes["dataset_to_index"],
                                      episode_indices_to_use=ds.episodes, drop_n_last_frames=drop, shuffle=True)
    if sampler is not None:
        shuffle, generator = False, None
    needed = args.warmup + args.batches
    sampled = len(sampler) if sampler is not None else len(ds)
    if sampled < needed * args.batch_size:
        raise SystemExit(f"{sampled} samples hold fewer than {needed} batches of {args.batch_size}; use fewer batches")
    workers = args.num_workers > 0
    loader = torch.utils.data.DataLoader(
        ds,
        batch_size=args.batch_size,
        shuffle=shuffle,
        sampler=sampler,
        generator=generator,
        num_workers=args.num_workers,
        persistent_workers=persistent and workers,
        prefetch_factor=prefetch if workers else None,
        multiprocessing_context=context if workers else None,
        pin_memory=False,
        drop_last=False,
    )
    # Frames that arrive as uint8 become float32 in [0, 1] in the training loop's process.
    cameras = list(ds.meta.camera_keys) if (args.lance_root is not None or like == "0.6.1") else []

    def to_float(batch):
        for key in cameras:
            if key in batch and batch[key].dtype == torch.uint8:
                batch[key] = batch[key].to(dtype=torch.float32) / 255.0
        return batch

    began = time.perf_counter()
    batches = iter(loader)
    first = None
    for _ in range(args.warmup):
        first = to_float(next(batches))
    first_ms = (time.perf_counter() - began) * 1e3

    procs = tree()
    cpu0 = cpu_seconds(procs)
    t0 = time.perf_counter()
    samples = 0
    out_bytes = 0
    for _ in range(args.batches):
        batch = to_float(next(batches))
        samples += len(batch["index"])
        out_bytes += batch_bytes(batch)
    seconds = time.perf_counter() - t0
    cpu1 = cpu_seconds(procs)
    gone = [pid for pid in cpu0 if pid not in cpu1]
    if gone:
        print(f"warning: processes {gone} exited during the timed batches; their CPU is not counted", file=sys.stderr)
    cpu_by_pid = {pid: cpu1[pid] - cpu0.get(pid, 0.0) for pid in cpu1}
    me = os.getpid()
    cpu = sum(cpu_by_pid.values())
    worker_pids = [p.pid for p in procs if p.pid != me]
    hwm = {p.pid: vm_hwm_mb(p.pid) for p in procs}
    pss = pss_mb(procs)
    del batches  # shuts the workers down

    shapes = {k: "x".join(map(str, v.shape)) for k, v in first.items() if isinstance(v, torch.Tensor)}
    dtypes = {k: str(v.dtype).removeprefix("torch.") for k, v in first.items() if isinstance(v, torch.Tensor)}
    report = {
        "loader": "lerobot-lancedb" if args.lance_root is not None else "lerobot",
        "like": like,
        "lance_root": str(args.lance_root) if args.lance_root is not None else None,
        "dataset_root": str(args.root),
        "preset": args.preset,
        "delta_timestamps": json.dumps(dts),
        "video_backend": args.backend,
        "batch_size": args.batch_size,
        "batches": args.batches,
        "warmup_batches": args.warmup,
        "num_workers": args.num_workers,
        "processes": len(procs),
        "samples": samples,
        "seconds": seconds,
        "samples_per_s": samples / seconds,
        "cpu_seconds": cpu,
        "cpu_ms_per_sample": cpu * 1e3 / samples,
        "samples_per_cpu_s": samples / cpu,
        "cpu_seconds_main": cpu_by_pid.get(me, 0.0),
        "cpu_seconds_workers": cpu - cpu_by_pid.get(me, 0.0),
        "first_batch_ms": first_ms,
        "dataset_open_s": open_s,
        "peak_rss_mb": sum(hwm.values()),
        "peak_rss_mb_main": hwm.get(me, 0.0),
        "peak_rss_mb_workers": [hwm[p] for p in worker_pids],
        "pss_mb_end": pss,
        "sample_bytes": out_bytes // max(samples, 1),
        "mb_per_s": out_bytes / 1e6 / seconds,
        "shapes": shapes,
        "dtypes": dtypes,
        "dataset_samples": len(ds),
        "versions": {
            "python": platform.python_version(),
            "lerobot": getattr(lerobot, "__version__", "?"),
            "torch": torch.__version__,
            "torchcodec": getattr(torchcodec, "__version__", "?"),
        },
    }
    text = json.dumps(report, indent=2)
    if args.json_out:
        args.json_out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
