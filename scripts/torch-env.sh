#!/usr/bin/env bash
# Creates (once) the Python environment whose torch lake's trainer builds and runs against:
# ~/.cache/lake/torch-venv (or $LAKE_TORCH_VENV) with PyPI's torch==2.11.0, the libtorch that
# tch 0.24.0 is made for (a CUDA build with its nvidia wheels; it runs on CPU-only machines too),
# and the torchvision built for it, the reference the trainer's image transforms are tested
# against, with LeRobot 0.6.1 (its code alone, for its own transforms: `lerobot.transforms`
# needs only torch and torchvision, and LeRobot declares Python 3.12, which its transforms do not
# need).
# Prints its python. Safe to run again: it only installs when the pinned versions are missing.
#
# With --exports it prints instead the shell lines that build and run lake's `torch` feature
# against it: libtorch taken from that torch (LIBTORCH_USE_PYTORCH, its python first on PATH)
# and its libraries, NVRTC's and NCCL's included, on LD_LIBRARY_PATH:
#   eval "$(scripts/torch-env.sh --exports)"
#   cargo build -p lake --features torch
# A wheel already downloaded to /tmp/torch211 is used instead of fetching it again.
set -euo pipefail
venv="${LAKE_TORCH_VENV:-$HOME/.cache/lake/torch-venv}"
want="torch==2.11.0 torchvision==0.26.0 numpy==2.2.6"
code_only="lerobot==0.6.1"
if [ ! -x "$venv/bin/python" ]; then
  command -v python3 >/dev/null || { echo "torch-env: python3 not found (apt install python3 python3-venv)" >&2; exit 1; }
  python3 -m venv "$venv" >&2
fi
if [ "$(cat "$venv/.lake-pins" 2>/dev/null)" != "$want $code_only" ]; then
  links=()
  [ -d /tmp/torch211 ] && links=(--find-links /tmp/torch211)
  "$venv/bin/python" -m pip install --quiet "${links[@]}" $want >&2
  "$venv/bin/python" -m pip install --quiet --no-deps --ignore-requires-python $code_only >&2
  echo "$want $code_only" > "$venv/.lake-pins"
fi
if [ "${1:-}" != --exports ]; then
  echo "$venv/bin/python"
  exit 0
fi
torch_lib="$("$venv/bin/python" -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')"
# The wheel's CUDA libraries hold NVRTC, which compiles lake-gpu's kernels, GPU or not; its NCCL
# (libnccl.so.2) sums the ranks' gradients on GPUs.
nvrtc_lib="$(dirname "$torch_lib")/../nvidia/cu13/lib"
nccl_lib="$(dirname "$torch_lib")/../nvidia/nccl/lib"
echo 'export LIBTORCH_USE_PYTORCH=1'
printf 'export PATH=%q"${PATH:+:$PATH}"\n' "$venv/bin"
printf 'export LD_LIBRARY_PATH=%q"${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"\n' "$torch_lib:$nvrtc_lib:$nccl_lib"
