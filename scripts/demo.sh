#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine, builds lake, and ingests the bundled sample datasets
# (AV1, multi-file H.264, PNG-in-parquet) into ./lake-demo, lists them and inspects one, then
# streams ACT's training samples from it through the loader (`lake bench`) and writes three of
# them, LeRobot's keys and values, to ./lake-demo-samples.arrow (`lake sample`).
# Pass --release for an optimised build (much slower to build, much faster to run).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/lake/target}"
profile=(); dir=debug
if [ "${1:-}" = "--release" ]; then profile=(--release); dir=release; fi
cargo build "${profile[@]}" -p lake --locked
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
