#!/usr/bin/env bash
# Creates (once) the Python environment whose torch lake's trainer builds and runs against:
# ~/.cache/lake/torch-venv (or $LAKE_TORCH_VENV) with PyPI's torch==2.11.0, the libtorch that
# tch 0.24.0 is made for (a CUDA build with its nvidia wheels; it runs on CPU-only machines too).
# Prints its python. Safe to run again: it only installs when the pinned versions are missing.
#
# Building `lake-trainer` (or `lake`) with the `torch` feature against it:
#   py=$(scripts/torch-env.sh)
#   export LIBTORCH_USE_PYTORCH=1 PATH="$(dirname "$py"):$PATH" VIRTUAL_ENV="$(dirname "$(dirname "$py")")"
#   export LD_LIBRARY_PATH="$("$py" -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')"
#   cargo test --workspace --features lake/torch,lake-trainer/torch --lib --test trainer
# A wheel already downloaded to /tmp/torch211 is used instead of fetching it again.
set -euo pipefail
venv="${LAKE_TORCH_VENV:-$HOME/.cache/lake/torch-venv}"
want="torch==2.11.0 numpy==2.2.6"
if [ ! -x "$venv/bin/python" ]; then
  command -v python3 >/dev/null || { echo "torch-env: python3 not found (apt install python3 python3-venv)" >&2; exit 1; }
  python3 -m venv "$venv" >&2
fi
if [ "$(cat "$venv/.lake-pins" 2>/dev/null)" != "$want" ]; then
  links=()
  [ -d /tmp/torch211 ] && links=(--find-links /tmp/torch211)
  "$venv/bin/python" -m pip install --quiet "${links[@]}" $want >&2
  echo "$want" > "$venv/.lake-pins"
fi
echo "$venv/bin/python"
