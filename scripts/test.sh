#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine and runs every check CI runs: formatting, the crate layers
# and file imports (scripts/check-layering.py), the web app's build, clippy with warnings denied,
# a build of every target, the whole test suite (doctests included), the API docs with warnings
# denied, and the Python tests (the client, other engines, the web app in Chromium).
# LAKE_ATTACK_FULL=1 runs the attack suite at the attack run's own sizes (docs/reliability.md).
#
# Builds go to $CARGO_TARGET_DIR (default ~/.cache/lake/target) so that repeated runs, and
# fresh clones on the same machine, reuse them.
#
# Tests that read the real third-party datasets look for them in $LAKE_SHARED_DIR (default:
# ../shared next to the repository).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# The Python client's tests run against a real server with this interpreter: the LeRobot
# environment where bench/compare_lerobot.sh made it (it has torch, so the IterableDataset is
# tested too), else pyarrow and numpy from scripts/python-env.sh.
lerobot_python="$HOME/.cache/lake/lerobot-venv/bin/python"
if [ -z "${LAKE_PYTHON:-}" ] && [ -x "$lerobot_python" ] && "$lerobot_python" -c 'import torch, pyarrow, numpy' 2>/dev/null; then
  LAKE_PYTHON="$lerobot_python"
fi
LAKE_PYTHON="${LAKE_PYTHON:-$(scripts/python-env.sh)}"
export LAKE_PYTHON
# The S3-compatible server the object-store tests start on loopback (lake/tests/it/object_store.rs:
# moto, pinned, docs/decisions/0025-s3-test-server.md).
LAKE_S3_PYTHON="${LAKE_S3_PYTHON:-$(scripts/s3-env.sh)}"
export LAKE_S3_PYTHON
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/lake/target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

cargo fmt --all --check
# The web app lake serve embeds (serve/assets/) is what web/'s sources build, byte for byte.
scripts/build-web.sh --check
# docker/ linted without an engine: hadolint, shellcheck, and dclint against the compose spec.
scripts/lint-docker.sh
# No crate imports one above it, and no files import each other in a loop.
python3 scripts/check-layering.py
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo build --workspace --all-targets --locked
cargo test --workspace --locked
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked

# A lake's tables read by other engines (docs/guide/engines.md): pylance opens the tables the
# commit record names, and per-episode aggregates from DuckDB and Polars over them equal `lake
# sql`'s; with scripts/python-env.sh's python, which pins pylance, duckdb and polars.
LAKE_BIN="$CARGO_TARGET_DIR/debug/lake" "$(scripts/python-env.sh)" clients/python/tests/test_engines.py

# The attack probe: about 250 hostile requests over HTTP and Flight to a real server; it fails
# if the server dies, answers 500, or refuses in words a client cannot read.
"$(scripts/python-env.sh)" scripts/attack_probe.py "$CARGO_TARGET_DIR/debug/lake"

# The damage probe: 40 damaged copies of the bundled samples ingested, 12 lakes with one file
# damaged read by every command, and 12 damaged frame tables sampled; it fails on a panic, a hang,
# another exit than 0, 1 or 2, a refused ingest that changed the lake, or samples of a damaged
# frame table that differ from the undamaged lake's with exit 0.
python3 scripts/damage_probe.py "$CARGO_TARGET_DIR/debug/lake" --sources 40 --lakes 12 --frame-tables 12

# The web app in Debian's headless Chromium through its WebDriver (clients/python/tests/test_web.py:
# login, datasets, an episode's frames equal to the loader's, the plot cursor, the SQL console);
# with scripts/python-env.sh's python, which pins selenium.
LAKE_BIN="$CARGO_TARGET_DIR/debug/lake" "$(scripts/python-env.sh)" clients/python/tests/test_web.py

# LeRobot's own trainer on a lake server (clients/python/tests/test_lerobot.py: lerobot-train runs
# ACT and diffusion through lake_client.lerobot), with each LeRobot python at hand: 0.4.4
# (LAKE_LEROBOT_PYTHON, else ~/.cache/lake/lerobot-venv) and 0.6.1 (LAKE_LEROBOT061_PYTHON, else
# ~/.cache/lake/lerobot061-venv); without one it says it is skipped.
for lerobot_train_python in "${LAKE_LEROBOT_PYTHON:-$HOME/.cache/lake/lerobot-venv/bin/python}" \
  "${LAKE_LEROBOT061_PYTHON:-$HOME/.cache/lake/lerobot061-venv/bin/python}"; do
  if [ -x "$lerobot_train_python" ]; then
    LAKE_BIN="$CARGO_TARGET_DIR/debug/lake" "$lerobot_train_python" clients/python/tests/test_lerobot.py
  else
    echo "test.sh: the LeRobot bridge tests are skipped for $lerobot_train_python: no such python (bench/compare_lerobot.sh makes both)"
  fi
done

# `lake train` on libtorch: the trainer's tests (training runs, exact resume, checkpoints, two MPI
# ranks against one; parity with LeRobot where LAKE_LEROBOT_PYTHON names a LeRobot 0.4.4 python)
# and the `torch` and `mpi` build of the binary, against PyPI's torch 2.11.0 in scripts/torch-env.sh's venv. LAKE_TORCH=0 skips it
# (a machine that cannot fetch the wheel); CI runs it.
if [ "${LAKE_TORCH:-1}" != 0 ]; then
  torch_exports="$(scripts/torch-env.sh --exports)"
  (
    eval "$torch_exports"
    # NVRTC and NCCL come with the wheel: lake-gpu's kernels are compiled here, GPU or not, and
    # NCCL loads and makes unique ids without a device.
    export LAKE_REQUIRE_NVRTC=1 LAKE_REQUIRE_NCCL=1
    # The whole workspace is named so that dependencies keep the features of the builds above.
    cargo clippy --workspace --all-targets --features lake/mpi,lake-trainer/mpi --locked -- -D warnings
    cargo test --workspace --features lake/mpi,lake-trainer/mpi --locked --lib --test trainer
    # The binary with the trainer starts with no LD_LIBRARY_PATH and finds the wheel's libtorch,
    # NVRTC and NCCL by its run path (docs/decisions/0030-run-path-to-libtorch.md, 0031).
    cargo build --workspace --features lake/mpi,lake-trainer/mpi --locked --bins
    env -u LD_LIBRARY_PATH "$CARGO_TARGET_DIR/debug/lake" gpu --json >"$CARGO_TARGET_DIR/lake-gpu.json" || true
    python3 scripts/check-gpu-probe.py "$CARGO_TARGET_DIR/lake-gpu.json"
    # That binary's training runs read by TensorBoard (scripts/python-env.sh's python has it).
    LAKE_BIN="$CARGO_TARGET_DIR/debug/lake" "$(scripts/python-env.sh)" clients/python/tests/test_tensorboard.py
  )
fi
