#!/usr/bin/env bash
# Scale-out on loopback: 1 against 2 `lake serve` processes over one lake, each pinned to a core
# of its own with taskset, serving the 4 ranks of one job (the Python client, every rank given
# both servers' addresses: ranks spread over them). Prints, per setup, the aggregate samples/s
# of the 4 ranks and each server's CPU seconds: whether samples/s adds up with servers.
#
#   bench/scale_out.sh LAKE_ROOT DATASET [BATCHES_PER_RANK] [PRESET]
#   LAKE_BIN=path/to/lake LAKE_PYTHON=path/to/python bench/scale_out.sh ...
#
# LAKE_ROOT may be a local lake or an object-store one (s3://…, with its AWS_* variables set).
# The frame cache is off and every rank reads other steps, so servers decode what they send.
set -euo pipefail
root=${1:?usage: bench/scale_out.sh LAKE_ROOT DATASET [BATCHES_PER_RANK] [PRESET]}
dataset=${2:?usage: bench/scale_out.sh LAKE_ROOT DATASET [BATCHES_PER_RANK] [PRESET]}
batches=${3:-40}
preset=${4:-act}
here="$(cd "$(dirname "$0")/.." && pwd)"
bin=${LAKE_BIN:-${CARGO_TARGET_DIR:-$HOME/.cache/lake/target}/release/lake}
python=${LAKE_PYTHON:-$("$here/scripts/python-env.sh")}
[ -x "$bin" ] || { echo "no lake binary at $bin (cargo build --release -p lake, or set LAKE_BIN)" >&2; exit 2; }
cores=$(nproc)
[ "$cores" -ge 2 ] || { echo "scale_out: needs 2 cores to pin 2 servers, this machine has $cores" >&2; exit 2; }
ticks=$(getconf CLK_TCK)
pids=()
logs=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; rm -f "${logs[@]}"; }
trap cleanup EXIT

# Starts a server pinned to core $1; sets $addr and appends its pid.
start() {
    local log
    log=$(mktemp)
    logs+=("$log")
    taskset -c "$1" "$bin" --lake "$root" serve --flight 127.0.0.1:0 --http 127.0.0.1:0 --threads 1 --cache-mb 0 --lookahead 0 >"$log" 2>/dev/null &
    pids+=($!)
    for _ in $(seq 200); do
        addr=$(grep -o 'grpc://[0-9.:]*' "$log" | head -1 || true)
        [ -n "$addr" ] && return 0
        sleep 0.05
    done
    echo "scale_out: the server on core $1 did not start" >&2
    exit 1
}

cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# Runs 4 ranks against the comma-separated servers $1; prints samples/s.
ranks() {
    "$python" - "$1" "$dataset" "$batches" "$preset" <<'PY'
import sys, time, threading
sys.path.insert(0, __import__("os").path.join(__import__("os").getcwd(), "clients/python"))
import lake_client
locations, dataset, batches, preset = sys.argv[1].split(","), sys.argv[2], int(sys.argv[3]), sys.argv[4]
counts = [0] * 4
def rank(r):
    request = {"datasets": [dataset], "preset": preset, "batch_size": 8, "rank": r, "world_size": 4, "limit_batches": batches, "seed": 11}
    for b in lake_client.LakeClient(locations).batches(request):
        counts[r] += b.num_rows
began = time.monotonic()
threads = [threading.Thread(target=rank, args=(r,)) for r in range(4)]
for t in threads: t.start()
for t in threads: t.join()
wall = time.monotonic() - began
print(f"{sum(counts)} {wall:.3f}")
PY
}

cd "$here"
echo "dataset $dataset, preset $preset, 4 ranks x $batches batches of 8, servers with 1 decode thread each, frame cache off"
start 0
one=$addr
c0=$(cpu "${pids[0]}")
read -r samples wall < <(ranks "$one")
c1=$(cpu "${pids[0]}")
python3 -c "import sys; s,w,c=int(sys.argv[1]),float(sys.argv[2]),(float(sys.argv[3])-float(sys.argv[4]))/float(sys.argv[5]); print(f'1 server  (core 0):    {s} samples in {w:.2f} s: {s/w:.0f} samples/s; server {c:.2f} CPU s')" "$samples" "$wall" "$c1" "$c0" "$ticks"
start 1
two=$addr
a0=$(cpu "${pids[0]}"); b0=$(cpu "${pids[1]}")
read -r samples wall < <(ranks "$one,$two")
a1=$(cpu "${pids[0]}"); b1=$(cpu "${pids[1]}")
python3 -c "import sys; s,w=int(sys.argv[1]),float(sys.argv[2]); a=(float(sys.argv[3])-float(sys.argv[4]))/float(sys.argv[7]); b=(float(sys.argv[5])-float(sys.argv[6]))/float(sys.argv[7]); print(f'2 servers (cores 0, 1): {s} samples in {w:.2f} s: {s/w:.0f} samples/s; servers {a:.2f} + {b:.2f} CPU s')" "$samples" "$wall" "$a1" "$a0" "$b1" "$b0" "$ticks"
