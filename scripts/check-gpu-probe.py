#!/usr/bin/env python3
"""Checks `lake gpu --json` of a binary built with the trainer, run with no LD_LIBRARY_PATH:
it started (libtorch found), and found the torch wheel's NVRTC and NCCL by its run path.

    check-gpu-probe.py FILE   (the command's standard output)
"""
import json
import sys

path = sys.argv[1]
text = open(path, encoding="utf-8").read()
try:
    probe = json.loads(text)
except json.JSONDecodeError:
    sys.exit(f"check-gpu-probe: `lake gpu --json` printed no JSON (did the binary start?): {text[:500]!r}")
missing = [name for name in ("nvrtc", "nccl") if not probe.get(name)]
if missing:
    sys.exit(f"check-gpu-probe: the binary found no {' and no '.join(missing)} by its run path: "
             f"nccl_error={probe.get('nccl_error')!r}")
print(f"lake gpu, no LD_LIBRARY_PATH: NVRTC {probe['nvrtc']}, NCCL {probe['nccl']}")
