#!/usr/bin/env bash
# Side by side: LeRobot's own loader (the pinned release, 0.4.4, and the newest, 0.6.1), LeRobot
# + Lance (lerobot-lancedb's loader, the strongest CPU peer) and `lake bench` on the same LeRobot
# dataset, on this machine, in one run.
#
#   bench/compare_lerobot.sh                     # ~10 000-frame fixture, 30 LeRobot batches, a lake epoch
#   bench/compare_lerobot.sh --frames 1500       # a small fixture, for a quick check
#   LAKE_BIN=/path/to/lake bench/compare_lerobot.sh --json results.json
#   LAKE_BIN=/path/to/lake bench/compare_lerobot.sh --peers lerobot   # LeRobot 0.4.4 and lake only
#
# What it does:
#  1. Makes (or reuses) a Python venv with the pinned LeRobot release from
#     bench/lerobot/requirements.txt; it reinstalls only when that file changes (a stamp file
#     in the venv holds its hash). PyPI's torch wheel brings NVIDIA's CUDA libraries with it:
#     the venv takes about 8 GB and a few minutes to install.
#     Unless --peers lerobot, two more venvs layered over it (each reuses the one below through a
#     .pth file; made once, remade only when what they are made from changes; a stamp file in
#     each holds its hash): LeRobot 0.6.1, installed for Python 3.11 by the shared tool
#     install-lerobot-0.6.1.sh (about 90 MB, half a minute), and over that lerobot-lancedb 0.3.1
#     with lancedb 0.40.0 from PyPI (about 180 MB, ten seconds).
#  2. Writes (once; cached by frame count, seed and generator version) a LeRobot v3.0 dataset
#     with LeRobot's own writer (bench/lerobot/make_fixture.py): cameras
#     observation.images.front 480x640 and observation.images.wrist 96x128, AV1 by LeRobot's
#     default encoder settings (libsvtav1, GOP 2, crf 30), 6-d state and action, 30 fps,
#     about 200 frames per episode. LeRobot stages every frame as a PNG and encodes each
#     episode, so this takes about 150 CPU ms per frame (10 000 frames: ~15 min on 2 cores).
#     Unless --peers lerobot, converts it (once; cached next to it, keyed by the fixture and the
#     lancedb pins) to Lance's layout with lerobot-lancedb's `lerobot-lance-convert`.
#  3. Ingests it into a fresh lake with `lake ingest`.
#  4. Times, on the same data, one after the other:
#     - LeRobot: LeRobotDataset(delta_timestamps = ACT's 50 future actions, video_backend
#       torchcodec) behind torch's DataLoader (batch 32, 2 worker processes, shuffled with a
#       fixed seed), counting the CPU time of the parent and of every worker process
#       (bench/lerobot/run_lerobot.py);
#     - unless --peers lerobot, LeRobot 0.6.1 the way its `lerobot-train` feeds the trainer
#       (frames as uint8, converted to float in the main process; EpisodeAwareSampler seeded with
#       --seed; prefetch 4, persistent workers, spawn), the same batches, batch size and workers
#       (the shared tool bench-lerobot-loader.py);
#     - unless --peers lerobot, LeRobot + Lance: lerobot-lancedb's LanceDBDataset on the Lance
#       copy, as its README builds the DataLoader (forkserver workers, the same sampler), the
#       same batches, batch size and workers (the shared tool bench-lancedb-loader.py);
#     - lake: `lake bench --preset act` with frames decoded from packets, in-memory frame cache
#       off (the cold path), the cold path again with frames sent as the decoder's YUV planes
#       (`--frame-format yuv420p`: the trainer converts them to LeRobot's RGB on its GPU), packets
#       for the trainer to decode (`--frame-format packets`: the server's side, and the CPU a
#       consumer spends decoding them), the cache on, then, when the binary has `lake cache`,
#       frames read from the stored frame table.
#  5. Prints one table (bench/lerobot/report.py): samples/s, CPU ms per sample, samples per
#     CPU-second, the ratio to LeRobot 0.4.4 of both, peak RSS, lake's decode-bound limit and
#     copy floor, and the bytes of a sample (lake's on the wire). With --json FILE (or LAKE_BENCH_JSON) it also writes every number as JSON
#     (the shared tools' whole reports for the newer peers).
#
# Options (environment variable in brackets):
#   --frames N            fixture size in frames [LAKE_BENCH_FRAMES, 10000]
#   --lerobot-batches N   LeRobot batches timed after the first [LAKE_BENCH_LEROBOT_BATCHES, 30]
#   --lake-batches N      lake batches timed after the first [LAKE_BENCH_LAKE_BATCHES, the rest
#                         of the epoch: a stream's frames decoded ahead pay off over an epoch]
#   --batch-size N        samples per batch [32]
#   --workers N           LeRobot DataLoader workers, and lake decode threads [2, whatever
#                         the number of cores (1 on one core): the published comparison]
#   --seed N              fixture and sampler seed [0]
#   --json FILE           write the results as JSON [LAKE_BENCH_JSON]
#   --keep-lake           keep the lake (with its frame table, several GB) after the run
#   --peers lerobot|all   all: LeRobot 0.4.4, LeRobot 0.6.1, LeRobot + Lance and lake; lerobot:
#                         LeRobot 0.4.4 and lake only, as before the newer peers (no shared tools
#                         needed; for a quick before/after of two lake binaries) [LAKE_BENCH_PEERS,
#                         all]
# Environment:
#   LAKE_BIN              the lake binary [built here: cargo build --release -p lake, then
#                         $CARGO_TARGET_DIR (default ~/.cache/lake/target)/release/lake]
#   LAKE_LEROBOT_VENV     the venv [~/.cache/lake/lerobot-venv]
#   LAKE_LEROBOT061_VENV  the LeRobot 0.6.1 venv, layered over LAKE_LEROBOT_VENV
#                         [~/.cache/lake/lerobot061-venv]
#   LAKE_LANCEDB_VENV     the LeRobot + Lance venv, layered over LAKE_LEROBOT061_VENV
#                         [~/.cache/lake/lerobot-lancedb-venv]
#   LAKE_SHARED_TOOLS     the shared benchmark tools kept outside the repo
#                         (install-lerobot-0.6.1.sh, bench-lerobot-loader.py,
#                         bench-lancedb-loader.py), needed unless --peers lerobot
#                         [the repo's ../shared/tools]
#   LAKE_BENCH_DIR        fixtures, lake and Hugging Face caches [~/.cache/lake/bench]
#   PYTHON                Python 3.11 used to create the venv [python3]
#
# Wall-clock figures depend on whatever else the machine runs; CPU per sample is the steadier
# figure. The run after the fixture exists takes a few minutes (the newer peers add about
# half a minute each at the default 30 batches on 2 cores).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
py_dir="$here/lerobot"

frames="${LAKE_BENCH_FRAMES:-10000}"
lerobot_batches="${LAKE_BENCH_LEROBOT_BATCHES:-30}"
lake_batches="${LAKE_BENCH_LAKE_BATCHES:-epoch}"
batch_size=32
workers="$(( $(nproc) < 2 ? $(nproc) : 2 ))"
seed=0
json_out="${LAKE_BENCH_JSON:-}"
keep_lake=0
venv="${LAKE_LEROBOT_VENV:-$HOME/.cache/lake/lerobot-venv}"
venv061="${LAKE_LEROBOT061_VENV:-$HOME/.cache/lake/lerobot061-venv}"
lance_venv="${LAKE_LANCEDB_VENV:-$HOME/.cache/lake/lerobot-lancedb-venv}"
shared_tools="${LAKE_SHARED_TOOLS:-$repo/../shared/tools}"
peers="${LAKE_BENCH_PEERS:-all}"
bench_dir="${LAKE_BENCH_DIR:-$HOME/.cache/lake/bench}"
python="${PYTHON:-python3}"

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --frames) frames="$2"; shift 2 ;;
    --lerobot-batches) lerobot_batches="$2"; shift 2 ;;
    --lake-batches) lake_batches="$2"; shift 2 ;;
    --batch-size) batch_size="$2"; shift 2 ;;
    --workers) workers="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    --json) json_out="$2"; shift 2 ;;
    --keep-lake) keep_lake=1; shift ;;
    --peers) peers="$2"; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done
log() { echo "[compare] $*" >&2; }
case "$peers" in
  lerobot | all) ;;
  *) echo "--peers takes lerobot or all, not $peers" >&2; exit 2 ;;
esac

# The batches must fit in one pass over the dataset (LeRobot's DataLoader stops at its end).
max_batches=$((frames / batch_size - 1))
if [ "$lerobot_batches" -gt "$max_batches" ]; then
  log "$frames frames hold $max_batches batches after the first: timing $max_batches LeRobot batches"
  lerobot_batches="$max_batches"
fi
if [ "$lake_batches" = epoch ]; then
  lake_batches="$max_batches"
elif [ "$lake_batches" -gt "$max_batches" ]; then
  log "$frames frames hold $max_batches batches after the first: timing $max_batches lake batches"
  lake_batches="$max_batches"
fi

# 1. The LeRobot venvs.
. "$py_dir/common.sh"
if [ "$peers" = all ]; then
  require_shared_tools install-lerobot-0.6.1.sh bench-lerobot-loader.py bench-lancedb-loader.py
fi
lerobot_venv
if [ "$peers" = all ]; then
  lerobot061_venv
  lancedb_venv
fi

# The lake binary.
if [ -z "${LAKE_BIN:-}" ]; then
  export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/lake/target}"
  log "building lake (release)"
  (cd "$repo" && cargo build --release -p lake --locked)
  LAKE_BIN="$CARGO_TARGET_DIR/release/lake"
fi
[ -x "$LAKE_BIN" ] || { echo "LAKE_BIN=$LAKE_BIN is not an executable" >&2; exit 2; }

# 2. The fixture, written once by LeRobot's writer.
lerobot_fixture
if [ "$peers" = all ]; then lance_fixture; fi

# 3. A fresh lake.
work="$(mktemp -d)"
lake="$bench_dir/lake-compare"
cleanup() {
  rm -rf "$work"
  if [ "$keep_lake" = 0 ]; then rm -rf "$lake"; fi
}
trap cleanup EXIT
rm -rf "$lake"
log "ingesting into $lake"
"$LAKE_BIN" --lake "$lake" ingest "$fixture" --name bench >"$work/ingest.txt"
episodes="$("$vpy" -c 'import json,sys; print(json.load(open(sys.argv[1]))["total_episodes"])' "$fixture/meta/info.json")"

# 4a. LeRobot.
log "LeRobot: $lerobot_batches batches of $batch_size after the first, $workers workers"
"$vpy" "$py_dir/run_lerobot.py" --root "$fixture" --preset act --backend torchcodec \
  --batch-size "$batch_size" --batches "$lerobot_batches" --num-workers "$workers" --seed "$seed" \
  --json-out "$work/lerobot.json" >/dev/null
peer_args=()
if [ "$peers" = all ]; then
  # 4a'. LeRobot 0.6.1, as its lerobot-train runs the loader.
  log "LeRobot 0.6.1: $lerobot_batches batches of $batch_size after the first, $workers workers"
  "$vpy061" "$shared_tools/bench-lerobot-loader.py" --root "$fixture" --preset act \
    --batch-size "$batch_size" --batches "$lerobot_batches" --num-workers "$workers" --seed "$seed" \
    --out "$work/lerobot061.json" >/dev/null
  # 4a''. LeRobot + Lance.
  log "LeRobot + Lance: $lerobot_batches batches of $batch_size after the first, $workers workers"
  BENCH_LEROBOT_LOADER="$shared_tools/bench-lerobot-loader.py" "$vpy_lance" "$shared_tools/bench-lancedb-loader.py" \
    --root "$lance_root" --preset act --batch-size "$batch_size" --batches "$lerobot_batches" \
    --num-workers "$workers" --seed "$seed" --out "$work/lancedb.json" >/dev/null
  LANCE_ROOT="$lance_root" SECS="$(cat "$lance_root.done")" "$vpy" -c 'import json,os; print(json.dumps({"lance_root": os.environ["LANCE_ROOT"], "seconds": float(os.environ["SECS"])}))' >"$work/lance-convert.json"
  peer_args=(--lerobot061 "$work/lerobot061.json" --lancedb "$work/lancedb.json" --lance-convert "$work/lance-convert.json")
fi

# 4b. lake.
frame_table_off=()
if "$LAKE_BIN" bench --help | grep -q -- '--frame-table'; then frame_table_off=(--frame-table off); fi
lake_bench() {
  "$LAKE_BIN" --lake "$lake" bench --dataset bench --preset act --batch-size "$batch_size" \
    --batches "$lake_batches" --threads "$workers" --seed "$seed" --json "$@"
}
log "lake: $lake_batches batches of $batch_size after the first, $workers threads, cache off"
lake_bench --cache off "${frame_table_off[@]}" >"$work/lake-cold.json"
report_args=(--lake-cold "$work/lake-cold.json")
if "$LAKE_BIN" bench --help | grep -q -- '--frame-format'; then
  log "lake: cache off, frames as YUV planes (converted to RGB on the trainer's GPU)"
  lake_bench --cache off "${frame_table_off[@]}" --frame-format yuv420p >"$work/lake-cold-yuv.json"
  report_args+=(--lake-cold-yuv "$work/lake-cold-yuv.json")
else
  report_args+=(--skipped "lake, cold, YUV planes: $LAKE_BIN has no --frame-format")
fi
if "$LAKE_BIN" bench --help | grep -q -- 'packets'; then
  log "lake: packets (each camera's GOPs, for the trainer to decode)"
  lake_bench --cache off "${frame_table_off[@]}" --frame-format packets >"$work/lake-packets.json"
  report_args+=(--lake-packets "$work/lake-packets.json")
else
  report_args+=(--skipped "lake, packets: $LAKE_BIN has no --frame-format packets")
fi
log "lake: cache on (frames decoded ahead kept in it)"
lake_bench --cache on "${frame_table_off[@]}" >"$work/lake-cache.json"
report_args+=(--lake-cache "$work/lake-cache.json")
if "$LAKE_BIN" cache --help >/dev/null 2>&1; then
  log "lake cache: storing every decoded frame"
  began="$EPOCHREALTIME"
  out="$("$LAKE_BIN" --lake "$lake" cache bench)"
  secs="$(awk "BEGIN { print $EPOCHREALTIME - $began }")"
  SECS="$secs" OUT="$out" "$vpy" -c 'import json,os; print(json.dumps({"seconds": float(os.environ["SECS"]), "output": os.environ["OUT"]}))' >"$work/frame-table-build.json"
  log "lake: frames from the frame table"
  frame_table_on=()
  if [ ${#frame_table_off[@]} -gt 0 ]; then frame_table_on=(--frame-table on); fi
  lake_bench --cache off "${frame_table_on[@]}" >"$work/lake-frame-table.json"
  report_args+=(--lake-frame-table "$work/lake-frame-table.json" --frame-table-build "$work/frame-table-build.json")
else
  report_args+=(--skipped "lake, frame table: $LAKE_BIN has no \`lake cache\` subcommand")
fi

# 5. The table.
title="side by side: $frames steps, $episodes episodes (LeRobot v3.0 by lerobot's writer; AV1 GOP 2, 480x640 + 96x128, 30 fps); preset act; batch $batch_size; LeRobot $lerobot_batches batches, lake $lake_batches batches, after the first; $workers workers/threads; $(nproc) cores"
FRAMES="$frames" EPISODES="$episodes" FIXTURE="$fixture" LAKE_BIN="$LAKE_BIN" LAKE_VERSION="$("$LAKE_BIN" --version)" \
  BATCH="$batch_size" LR_BATCHES="$lerobot_batches" LAKE_BATCHES="$lake_batches" WORKERS="$workers" SEED="$seed" PEERS="$peers" \
  "$vpy" -c 'import json, os, platform
e = os.environ
print(json.dumps({"frames": int(e["FRAMES"]), "episodes": int(e["EPISODES"]), "fixture": e["FIXTURE"],
  "lake_bin": e["LAKE_BIN"], "lake_version": e["LAKE_VERSION"], "preset": "act", "batch_size": int(e["BATCH"]),
  "lerobot_batches": int(e["LR_BATCHES"]), "lake_batches": int(e["LAKE_BATCHES"]), "workers": int(e["WORKERS"]),
  "seed": int(e["SEED"]), "cores": os.cpu_count(), "machine": platform.platform(), "peers": e["PEERS"]}))' >"$work/meta.json"
json_args=()
if [ -n "$json_out" ]; then json_args=(--json-out "$json_out"); fi
"$vpy" "$py_dir/report.py" --title "$title" --lerobot "$work/lerobot.json" "${peer_args[@]}" "${report_args[@]}" \
  --meta "$work/meta.json" "${json_args[@]}"
