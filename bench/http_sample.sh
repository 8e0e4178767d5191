#!/usr/bin/env bash
# One sampling stream over HTTP: starts `lake serve` on a free loopback port, reads BATCHES
# batches of 32 `act` samples with curl into /dev/null, and prints the server's CPU time per
# sample and the samples per second delivered (first batch included).
#
#   bench/http_sample.sh LAKE_ROOT DATASET [BATCHES] [SEED]
#   LAKE_BIN=path/to/lake bench/http_sample.sh ...      # another build (default: the release build)
set -euo pipefail
root=${1:?usage: bench/http_sample.sh LAKE_ROOT DATASET [BATCHES] [SEED]}
dataset=${2:?usage: bench/http_sample.sh LAKE_ROOT DATASET [BATCHES] [SEED]}
batches=${3:-100}
seed=${4:-0}
bin=${LAKE_BIN:-${CARGO_TARGET_DIR:-$HOME/.cache/lake/target}/release/lake}
[ -x "$bin" ] || { echo "no lake binary at $bin (cargo build --release -p lake, or set LAKE_BIN)" >&2; exit 2; }
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
log=$(mktemp)
"$bin" --lake "$root" serve --http "127.0.0.1:$port" --flight 127.0.0.1:0 >"$log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null; rm -f "$log"' EXIT
for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$port/healthz" >/dev/null && break
    kill -0 $server 2>/dev/null || { cat "$log" >&2; exit 1; }
    sleep 0.1
done
ticks=$(getconf CLK_TCK)
cpu() { awk '{print $14 + $15}' "/proc/$server/stat"; }
request="{\"datasets\": [\"$dataset\"], \"preset\": \"act\", \"batch_size\": 32, \"limit_batches\": $batches, \"seed\": $seed}"
c0=$(cpu); t0=$(date +%s.%N)
bytes=$(curl -sf -XPOST "http://127.0.0.1:$port/v1/sample" -H 'Content-Type: application/json' -d "$request" -o /dev/null -w '%{size_download}')
t1=$(date +%s.%N); c1=$(cpu)
python3 - "$bytes" "$batches" "$t0" "$t1" "$c0" "$c1" "$ticks" <<'PY'
import sys
size, batches, t0, t1, c0, c1, ticks = sys.argv[1:]
samples, wall, cpu = int(batches) * 32, float(t1) - float(t0), (float(c1) - float(c0)) / float(ticks)
print(f"http: {samples} samples, {int(size) / 1e6:.0f} MB in {wall:.2f} s: {samples / wall:.1f} samples/s, "
      f"server {cpu:.2f} CPU s ({1000 * cpu / samples:.3f} ms/sample)")
PY
