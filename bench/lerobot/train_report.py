"""The table of bench/compare_train.sh, from the files its contenders left in its work directory.

Training runs: steps/s, samples/s and the share of step time spent waiting for data over the
timed steps (the steps after the warm-up), and the CPU seconds of the whole run. lerobot-train
logs `updt_s` and `data_s` per step at `--log_freq=1`; lake train logs `step_s` and
`data_wait_s` per step in `train_log.jsonl`.

Data path alone: samples/s, CPU ms per sample, samples per CPU-second, and the cores that feed
a GPU taking 1000 samples a second; LeRobot's loader as lerobot-train 0.4.4 runs it, and where
the run measured them, as 0.6.1 runs it and LeRobot + Lance. Without training runs
(`--data-only`), the data path's table alone.

Prints a table; with --json-out, also writes every number as JSON.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
from pathlib import Path

LEROBOT_STEP = re.compile(r"step:(\d+) smpl:\S+ .*?updt_s:(\S+) data_s:(\S+)")
LAKE_FEED_CPU = re.compile(r"([0-9.]+) CPU ms per sample in this process")


def read_time(work: Path, name: str) -> dict:
    user, system, wall = (float(x) for x in (work / f"{name}.time").read_text().split()[-3:])
    server = float((work / f"{name}.server").read_text())
    return {"cpu_s": user + system, "server_cpu_s": server, "wall_s": wall}


def steps_summary(name: str, steps: list[tuple[int, float, float]], warmup: int, batch: int) -> dict:
    """Steps given as (step, seconds, data-wait seconds); those after `warmup` are timed."""
    timed = [s for s in steps if s[0] > warmup]
    if not timed:
        raise SystemExit(f"{name}: no step after the first {warmup} was logged")
    seconds = sum(s[1] for s in timed)
    waited = sum(s[2] for s in timed)
    return {
        "timed_steps": len(timed),
        "steps_per_s": len(timed) / seconds,
        "samples_per_s": len(timed) * batch / seconds,
        "data_wait_pct": 100.0 * waited / seconds,
        "step_ms": 1e3 * seconds / len(timed),
    }


def lerobot_train(work: Path, name: str, warmup: int, batch: int) -> dict:
    text = (work / f"{name}.out").read_text()
    steps = [(int(m[1]), float(m[2]) + float(m[3]), float(m[3])) for m in LEROBOT_STEP.finditer(text)]
    return {**steps_summary(name, steps, warmup, batch), **read_time(work, name)}


def lake_train(work: Path, name: str, warmup: int, batch: int) -> dict:
    lines = (work / f"run-{name}" / "train_log.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    steps = [(r["step"], r["step_s"], r["data_wait_s"]) for r in records]
    return {**steps_summary(name, steps, warmup, batch), **read_time(work, name)}


def lake_feed(work: Path, name: str, batch: int) -> dict:
    lines = (work / f"run-{name}" / "feed_log.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    timed = [r for r in records if r["step"] > 1]
    samples = sum(r["samples"] for r in timed)
    seconds = sum(r["step_s"] for r in timed)
    cpu = LAKE_FEED_CPU.search((work / f"{name}.out").read_text())
    if not cpu:
        raise SystemExit(f"{name}: no CPU figure in its output")
    times = read_time(work, name)
    # The trainer's CPU over its steps, plus the server's over the run (per sample it sent).
    all_samples = sum(r["samples"] for r in records)
    cpu_ms = float(cpu[1]) + 1e3 * times["server_cpu_s"] / max(all_samples, 1)
    return {"samples_per_s": samples / seconds, "cpu_ms_per_sample": cpu_ms, **times}


def row(cells: list[str], widths: list[int]) -> str:
    return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))


def table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    out = [row(header, widths), row(["-" * w for w in widths], widths)]
    out += [row(r, widths) for r in rows]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--warmup", type=int, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--batch-size", type=int, required=True)
    ap.add_argument("--workers", type=int, required=True)
    ap.add_argument("--frames", type=int, required=True)
    ap.add_argument("--fixture", required=True)
    ap.add_argument("--policy", default="act", choices=["act", "diffusion"])
    ap.add_argument("--lake-version", required=True)
    ap.add_argument("--json-out", type=Path, default=None)
    ap.add_argument("--image-transforms", nargs="?", const=True, default=False,
                    help="the runs applied LeRobot's image transforms (its defaults, or the config in this file)")
    args = ap.parse_args()
    w, b = args.work, args.batch_size

    training = {}
    if (w / "lerobot-train.out").exists():
        training["lerobot-train 0.4.4, LeRobot's loader"] = lerobot_train(w, "lerobot-train", args.warmup, b)
        if (w / "lerobot-train-061.out").exists():
            training["lerobot-train 0.6.1, LeRobot's loader"] = lerobot_train(w, "lerobot-train-061", args.warmup, b)
        training |= {
            "lerobot-train 0.4.4, lake bridge (Flight)": lerobot_train(w, "lerobot-train-bridge", args.warmup, b),
            "lake train, in process": lake_train(w, "lake-train", args.warmup, b),
            "lake train, lake serve --local": lake_train(w, "lake-train-local", args.warmup, b),
        }
    data = {}
    for name, label in [("lerobot-loader", "LeRobot 0.4.4 loader (DataLoader)"),
                        ("lerobot-loader-061", "LeRobot 0.6.1 loader (DataLoader)"),
                        ("lance-loader", "LeRobot 0.6.1 + Lance (lerobot-lancedb 0.3.1)")]:
        if (w / f"{name}.json").exists():
            loader = json.loads((w / f"{name}.json").read_text())
            data[label] = {"samples_per_s": loader["samples_per_s"], "cpu_ms_per_sample": loader["cpu_ms_per_sample"]}
    data |= {
        "lake train --policy none, in process": lake_feed(w, "lake-feed", b),
        "lake train --policy none, lake serve --local": lake_feed(w, "lake-feed-local", b),
    }
    for d in data.values():
        d["samples_per_cpu_s"] = 1e3 / d["cpu_ms_per_sample"]
        d["cores_per_1000_samples_per_s"] = 1000.0 / d["samples_per_cpu_s"]

    name = {"act": "ACT", "diffusion": "Diffusion Policy"}[args.policy]
    applied = ""
    if args.image_transforms is True:
        applied = " with LeRobot's image transforms"
    elif args.image_transforms:
        applied = f" with the image transforms of {Path(args.image_transforms).name} (LeRobot 0.6.1's loaders on float32 frames)"
    if training:
        print(f"{name}{applied} (LeRobot 0.4.4's defaults, backbone from scratch), batch {b}, CPU; {args.steps} steps timed after "
              f"{args.warmup}; {args.frames}-frame dataset {Path(args.fixture).name}; {args.workers} workers/threads; "
              f"{args.lake_version}")
        print(table(
            ["training run", "steps/s", "samples/s", "step ms", "data wait %", "CPU s (run)", "server CPU s"],
            [[k, f"{v['steps_per_s']:.3f}", f"{v['samples_per_s']:.2f}", f"{v['step_ms']:.0f}", f"{v['data_wait_pct']:.1f}",
              f"{v['cpu_s']:.1f}", f"{v['server_cpu_s']:.1f}" if "serve" in k or "bridge" in k else "-"]
             for k, v in training.items()],
        ))
        print()
    else:
        print(f"{name}'s windows{applied}, batch {b}, CPU; {args.frames}-frame dataset {Path(args.fixture).name}; "
              f"{args.workers} workers/threads; {args.lake_version}")
    print(table(
        ["data path alone", "samples/s", "CPU ms/sample", "samples/CPU-s", "cores per 1000 samples/s"],
        [[k, f"{v['samples_per_s']:.1f}", f"{v['cpu_ms_per_sample']:.2f}", f"{v['samples_per_cpu_s']:.0f}",
          f"{v['cores_per_1000_samples_per_s']:.1f}"] for k, v in data.items()],
    ))
    if args.json_out:
        transforms = args.image_transforms if args.image_transforms is True else json.loads(Path(args.image_transforms).read_text()) if args.image_transforms else False
        meta = {"policy": args.policy, "image_transforms": transforms, "batch_size": b, "steps": args.steps, "warmup": args.warmup, "workers": args.workers,
                "frames": args.frames, "fixture": args.fixture, "lake_version": args.lake_version,
                "machine": platform.platform()}
        args.json_out.write_text(json.dumps({"meta": meta, "training": training, "data_path": data}, indent=2) + "\n")


if __name__ == "__main__":
    main()
