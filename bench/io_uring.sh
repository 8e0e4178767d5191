#!/usr/bin/env bash
# Frame-table reads from a cold page cache: `lake --io pread` against `lake --io uring`, in turns,
# the page cache dropped before every run (root only: /proc/sys/vm/drop_caches). Each run is one
# `lake bench` of about one epoch (so most frames are read from the disk once); prints each
# mode's samples/s (median and range) and CPU ms per sample (median) over the runs.
#
#   bench/io_uring.sh LAKE_ROOT DATASET [RUNS] [FRAME_SIZE]
#   LAKE_BIN=path/to/lake bench/io_uring.sh ./lake v30-av1-small 6
#
# The dataset needs a frame table (`lake cache DATASET`, or `--size WxH` and FRAME_SIZE WxH).
set -euo pipefail
usage="usage: bench/io_uring.sh LAKE_ROOT DATASET [RUNS] [FRAME_SIZE]"
root=${1:?$usage}
dataset=${2:?$usage}
runs=${3:-6}
size=${4:-}
bin=${LAKE_BIN:-${CARGO_TARGET_DIR:-$HOME/.cache/lake/target}/release/lake}
[ -x "$bin" ] || { echo "io_uring: no lake binary at $bin (cargo build --release -p lake, or set LAKE_BIN)" >&2; exit 2; }
[ -w /proc/sys/vm/drop_caches ] || { echo "io_uring: cannot drop the page cache (needs root): the runs would read from memory" >&2; exit 2; }
steps=$("$bin" --lake "$root" inspect "$dataset" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["record"]["counts"]["steps"])')
batch=32
batches=$(( (steps + batch - 1) / batch ))
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
extra=()
[ -n "$size" ] && extra=(--frame-size "$size")
for run in $(seq "$runs"); do
  for io in uring pread; do
    sync
    echo 3 > /proc/sys/vm/drop_caches
    "$bin" --lake "$root" --io "$io" bench --dataset "$dataset" --preset act --batches "$batches" --batch-size "$batch" \
      "${extra[@]}" --json > "$out/$io-$run.json"
  done
done
python3 - "$out" "$runs" <<'PY'
import json, statistics, sys
out, runs = sys.argv[1], int(sys.argv[2])
print(f"{'reads':6} {'samples/s median':>17} {'range':>13} {'CPU ms/sample':>14}")
for io in ("pread", "uring"):
    done = [json.load(open(f"{out}/{io}-{r}.json")) for r in range(1, runs + 1)]
    rate = [d["samples_per_s"] for d in done]
    cpu = [d["cpu_ms_per_sample"] for d in done]
    print(f"{io:6} {statistics.median(rate):17.0f} {min(rate):6.0f}-{max(rate):<6.0f} {statistics.median(cpu):14.3f}")
PY
