#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine, builds lake, and runs its main job on the bundled sample
# datasets (AV1, multi-file H.264, B-frames, PNG and JPEG in parquet): ingests them into
# ./lake-demo, lists them and inspects one, streams ACT's training samples through the loader
# (`lake bench`), writes three of them, LeRobot's keys and values, to ./lake-demo-samples.arrow
# (`lake sample`), and trains a small ACT on one for 200 steps (`lake train`) into
# ./lake-demo-run: the loss and data-wait plot (train_log.svg) and checkpoints LeRobot loads.
#
# Training links libtorch from PyPI's torch 2.11.0, which scripts/torch-env.sh installs once into
# ~/.cache/lake/torch-venv (about 4.7 GB). --no-train leaves the trainer out of the build and
# the run. --release builds optimised (much slower to build, much faster to run).
set -euo pipefail
cd "$(dirname "$0")/.."
profile=(); dir=debug; train=1
for arg in "$@"; do
  case "$arg" in
    --release) profile=(--release); dir=release ;;
    --no-train) train=0 ;;
    *) echo "usage: scripts/demo.sh [--release] [--no-train]" >&2; exit 2 ;;
  esac
done
scripts/setup.sh
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/lake/target}"
features=()
if [ "$train" = 1 ]; then
  eval "$(scripts/torch-env.sh --exports)"
  features=(--features torch)
fi
cargo build "${profile[@]}" -p lake "${features[@]}" --locked
lake="$CARGO_TARGET_DIR/$dir/lake"
for d in testdata/lerobot/*/; do
  "$lake" --lake ./lake-demo ingest "$d"
  echo
done
"$lake" --lake ./lake-demo ls
echo
"$lake" --lake ./lake-demo inspect v30-av1-small
echo
"$lake" --lake ./lake-demo bench --dataset v30-av1-small --preset act --batches 20
echo
"$lake" --lake ./lake-demo sample v30-av1-small --indices 0,17,599 --preset act --out ./lake-demo-samples.arrow
if [ "$train" = 1 ]; then
  echo
  # ./lake-demo-run is the demo's own: each demo trains it afresh.
  rm -rf ./lake-demo-run
  "$lake" --lake ./lake-demo train --dataset v30-images-tiny --policy-config trainer/configs/act-small.json \
    --steps 200 --batch-size 8 --save-every 100 --log-every 50 --out ./lake-demo-run
fi
