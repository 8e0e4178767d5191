#!/usr/bin/env bash
# What checking frame-table checksums costs: one frame table read with its checksums and the same
# table with its checksum column dropped (read without the check), `lake bench --preset act`
# in turns on the bundled `v30-av1-small` (640x480 + 128x96, 0.96 MB a sample), the in-memory
# frame cache off so that every frame is read from the table and checked. The page cache holds
# both tables (an untimed run of each first). Prints each table's CPU ms per sample and
# samples/s (median and range) over the runs.
#
#   bench/frame_checksums.sh [RUNS] [STORAGE]       # STORAGE: plain (default) or zstd
#   LAKE_BIN=path/to/lake PYTHON=path/to/python bench/frame_checksums.sh 5
#
# PYTHON needs pylance at the release of the lance crate in Cargo.lock (scripts/python-env.sh
# makes such an environment) to drop the column.
set -euo pipefail
runs=${1:-5}
storage=${2:-plain}
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${LAKE_BIN:-${CARGO_TARGET_DIR:-$HOME/.cache/lake/target}/release/lake}
python=${PYTHON:-$HOME/.cache/lake/py-venv/bin/python}
[ -x "$bin" ] || { echo "frame_checksums: no lake binary at $bin (cargo build --release -p lake, or set LAKE_BIN)" >&2; exit 2; }
"$python" -c 'import lance' 2>/dev/null || { echo "frame_checksums: $python has no pylance (scripts/python-env.sh, or set PYTHON)" >&2; exit 2; }
dataset=v30-av1-small
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for lake in checked unchecked; do
  "$bin" --lake "$work/$lake" ingest "$here/testdata/lerobot/$dataset" > /dev/null
  "$bin" --lake "$work/$lake" cache "$dataset" --storage "$storage" > /dev/null
done
table=$(find "$work/unchecked" -type d -name frames.lance)
"$python" -c 'import lance, sys; lance.dataset(sys.argv[1]).drop_columns(["frame_crc32"])' "$table"
"$bin" --lake "$work/unchecked" inspect "$dataset" | grep -q "without checksums" || { echo "frame_checksums: the column was not dropped" >&2; exit 1; }
bench() {
  "$bin" --lake "$work/$1" bench --dataset "$dataset" --preset act --cache off --batches 150 --batch-size 32 --json
}
for lake in checked unchecked; do bench "$lake" > /dev/null; done
for run in $(seq "$runs"); do
  for lake in checked unchecked; do bench "$lake" > "$work/$lake-$run.json"; done
done
python3 - "$work" "$runs" "$storage" <<'PY'
import json, statistics, sys
work, runs, storage = sys.argv[1], int(sys.argv[2]), sys.argv[3]
print(f"{storage} frame table, {runs} runs each")
print(f"{'frames':10} {'CPU ms/sample':>14} {'range':>13} {'samples/s':>10} {'range':>13}")
for lake in ("checked", "unchecked"):
    done = [json.load(open(f"{work}/{lake}-{r}.json")) for r in range(1, runs + 1)]
    cpu = [d["cpu_ms_per_sample"] for d in done]
    rate = [d["samples_per_s"] for d in done]
    print(f"{lake:10} {statistics.median(cpu):14.3f} {min(cpu):6.3f}-{max(cpu):<6.3f} {statistics.median(rate):10.0f} {min(rate):6.0f}-{max(rate):<6.0f}")
PY
