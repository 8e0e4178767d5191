#!/usr/bin/env python3
"""torchvision's functional transforms, and LeRobot 0.6.1's own transforms, applied to frames that
lake's trainer tests wrote: the reference for lake's image transforms
(trainer/src/image_transforms/apply.rs).

Usage: reference_transforms.py DIR. DIR holds input.f32 (little-endian float32 frames
[n, S, 3, H, W]: in [0, 1], or uint8 levels when "uint8" is true) and cases.json: {"shape": [...],
"uint8": false, "cases": [{"name": ..., "rows": [[step, ...] for each sample]}]}. Each sample's
frames [S, 3, H, W] take its steps in order, and the results go to DIR/NAME.f32 in the input's
layout, as float in [0, 1] (uint8 results over 255, as lerobot-train 0.6.1 scales them). A step
{"kind": "lerobot", "class": C, "kwargs": {...}, "params": {...}} applies LeRobot's transform C,
made with those arguments, with the given draw (its `transform(frames, params)`); it takes uint8
frames as float in [0, 1], as lake hands them to it.
"""

import json
import sys
from pathlib import Path

import numpy as np
import torch
from torchvision.transforms.v2 import InterpolationMode
from torchvision.transforms.v2 import functional as F


def step(frames: torch.Tensor, s: dict) -> torch.Tensor:
    kind = s["kind"]
    if kind == "brightness":
        return F.adjust_brightness(frames, s["factor"])
    if kind == "contrast":
        return F.adjust_contrast(frames, s["factor"])
    if kind == "saturation":
        return F.adjust_saturation(frames, s["factor"])
    if kind == "hue":
        return F.adjust_hue(frames, s["factor"])
    if kind == "sharpness":
        return F.adjust_sharpness(frames, s["factor"])
    if kind == "affine":
        return F.affine(
            frames,
            angle=s["angle"],
            translate=s["translate"],
            scale=s["scale"],
            shear=s["shear"],
            interpolation=InterpolationMode.NEAREST if s["nearest"] else InterpolationMode.BILINEAR,
            fill=s["fill"],
            center=s["center"],
        )
    if kind == "lerobot":
        from lerobot.transforms import transforms

        frames = unit(frames)
        return getattr(transforms, s["class"])(**s["kwargs"]).transform(frames, s["params"])
    raise ValueError(f"unknown step {kind}")


def unit(frames: torch.Tensor) -> torch.Tensor:
    return frames.to(torch.float32) / 255.0 if frames.dtype == torch.uint8 else frames


def main() -> None:
    root = Path(sys.argv[1])
    spec = json.loads((root / "cases.json").read_text())
    frames = torch.from_numpy(np.fromfile(root / "input.f32", dtype="<f4").reshape(spec["shape"]))
    if spec.get("uint8"):
        frames = frames.to(torch.uint8)
    for case in spec["cases"]:
        out = []
        for sample, steps in zip(frames, case["rows"]):
            x = sample.clone()
            for s in steps:
                x = step(x, s)
            out.append(unit(x))
        torch.stack(out).numpy().astype("<f4").tofile(root / f"{case['name']}.f32")


if __name__ == "__main__":
    main()
