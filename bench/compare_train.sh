#!/usr/bin/env bash
# Side by side: training LeRobot's ACT or Diffusion Policy on one LeRobot dataset, on this
# machine, in one run.
#
#   bench/compare_train.sh                        # ACT, 1500-frame fixture, 10 timed steps of batch 8
#   bench/compare_train.sh --steps 20 --json train.json
#   bench/compare_train.sh --policy diffusion      # the fixture with two 480x640 cameras
#   LAKE_BIN=/path/to/lake bench/compare_train.sh # a lake built with the `torch` feature
#
# Every contender trains the same model config (LeRobot 0.4.4's defaults for the policy, the
# backbone from scratch: nothing is downloaded) on the same data (the fixture of
# bench/compare_lerobot.sh: LeRobot v3.0 by LeRobot's writer, AV1, 480x640 + 96x128 cameras,
# 30 fps, whose wrist camera is 480x640 too for Diffusion, which takes cameras of one size; or
# --dataset) with the same batch size and seed, one after the other, on the CPU:
#  1. lerobot-train (LeRobot 0.4.4, bench/lerobot/requirements.txt) with LeRobot's own loader
#     and its defaults (4 DataLoader workers; the bridge's run too); unless --peers lerobot,
#     lerobot-train of LeRobot 0.6.1 too, given 0.4.4's defaults where 0.6.1 changed them
#     (Diffusion's), so that both train the same network;
#  2. lerobot-train through lake's bridge (python -m lake_client.lerobot_train) on `lake serve`;
#  3. `lake train`, batches from the loader in its own process;
#  4. `lake train` fed by `lake serve --local` (shared memory).
# Each gives steps/s, samples/s and the share of step time spent waiting for data, over the
# steps after the first --warmup (lerobot-train's per-step updt_s and data_s at --log_freq=1;
# lake's train_log.jsonl), and the CPU seconds of the whole run (every process it started, and
# the server's share for the fed ones).
#
# Then the data path alone, at the same batch size, for --feed-steps batches:
#  5. LeRobot's loader behind torch's DataLoader as lerobot-train 0.4.4 runs it
#     (bench/lerobot/run_lerobot.py: the CPU of the main and every worker process); unless
#     --peers lerobot, also as lerobot-train 0.6.1 runs it (uint8 frames made float in the main
#     process, its sampler and worker settings), and LeRobot + Lance (lerobot-lancedb's
#     LanceDBDataset over the dataset converted by lerobot-lance-convert, once, next to the
#     fixture; not for --dataset), each with the policy's windows;
#  6. `lake train --policy none` in process (each step only takes its batch onto the device;
#     the policy's windows);
#  7. `lake train --policy none` fed by `lake serve --local` (the trainer's CPU plus the
#     server's).
# Samples per CPU-second there say how many cores feed a GPU that takes 1000 samples a second.
#
# Options (environment variable in brackets):
#   --policy P       act or diffusion [act]
#   --dataset DIR    a LeRobot dataset to train on instead of the fixture (for Diffusion, one
#                    whose cameras have one size, as LeRobot's Diffusion requires)
#   --frames N       fixture size in frames [LAKE_BENCH_FRAMES, 1500]
#   --steps N        timed training steps after the warm-up [10]
#   --warmup N       training steps before the clock starts [2]
#   --feed-steps N   batches of the data-only runs after the warm-up [40]
#   --batch-size N   samples per step [8]
#   --workers N      LeRobot DataLoader workers of the data-only run, and lake serve's
#                    threads (lake train's loader takes one per core) [2]
#   --seed N         fixture, sampler and model seed [0]
#   --json FILE      write the results as JSON [LAKE_BENCH_JSON]
#   --peers P        all: lerobot-train and the loaders of LeRobot 0.4.4 and 0.6.1, and LeRobot +
#                    Lance; lerobot: 0.4.4's only (no shared tools needed) [LAKE_BENCH_PEERS, all]
#   --data-only      the data paths alone (5 to 7), no training runs
#   --image-transforms  every contender with LeRobot's image transforms, its defaults switched
#                    on (lerobot-train's --dataset.image_transforms.enable=true, lake train's
#                    --image-transforms; LeRobot + Lance's dataset takes LeRobot's transforms)
#   --image-transforms-file FILE  with --data-only: the data paths with LeRobot's
#                    ImageTransformsConfig from FILE (lake train's --image-transforms FILE), which
#                    may name LeRobot 0.6.1's own transforms: LeRobot 0.6.1's loader and LeRobot +
#                    Lance then return float32 frames (return_uint8=False), since those transforms
#                    pass uint8 frames through unchanged; LeRobot 0.4.4's loader, which has none of
#                    them, is left out
# Environment:
#   LAKE_BIN           a lake built with `--features torch` [built here: cargo build --release
#                      -p lake --features torch against scripts/torch-env.sh's torch]
#   LAKE_LEROBOT_VENV  the LeRobot venv [~/.cache/lake/lerobot-venv]
#   LAKE_LEROBOT061_VENV  the LeRobot 0.6.1 venv, layered over LAKE_LEROBOT_VENV by the shared
#                      install-lerobot-0.6.1.sh [~/.cache/lake/lerobot061-venv]
#   LAKE_LANCEDB_VENV  the LeRobot + Lance venv (lerobot-lancedb 0.3.1, lancedb 0.40.0), layered
#                      over LAKE_LEROBOT061_VENV [~/.cache/lake/lerobot-lancedb-venv]
#   LAKE_SHARED_TOOLS  the shared benchmark tools, needed unless --peers lerobot [../shared/tools]
#   LAKE_BENCH_DIR     fixtures and lakes [~/.cache/lake/bench]
#   PYTHON             Python 3.11 used to create the venv [python3]
#
# A CPU step of ACT at these camera sizes takes seconds, so on a CPU-only machine the data path
# is a small share of any step; the data-only runs measure it on its own. On a GPU the model's
# share shrinks and the data path's rate is the ceiling (docs/gpu-checks.md).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
py_dir="$here/lerobot"

frames="${LAKE_BENCH_FRAMES:-1500}"
steps=10
warmup=2
feed_steps=40
batch_size=8
workers=2
seed=0
json_out="${LAKE_BENCH_JSON:-}"
venv="${LAKE_LEROBOT_VENV:-$HOME/.cache/lake/lerobot-venv}"
venv061="${LAKE_LEROBOT061_VENV:-$HOME/.cache/lake/lerobot061-venv}"
lance_venv="${LAKE_LANCEDB_VENV:-$HOME/.cache/lake/lerobot-lancedb-venv}"
data_only=0
transforms=0
transforms_file=""
shared_tools="${LAKE_SHARED_TOOLS:-$repo/../shared/tools}"
peers="${LAKE_BENCH_PEERS:-all}"
bench_dir="${LAKE_BENCH_DIR:-$HOME/.cache/lake/bench}"
python="${PYTHON:-python3}"
policy=act
fixture_wrist=""
dataset=""

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --policy) policy="$2"; shift 2 ;;
    --dataset) dataset="$2"; shift 2 ;;
    --frames) frames="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --warmup) warmup="$2"; shift 2 ;;
    --feed-steps) feed_steps="$2"; shift 2 ;;
    --batch-size) batch_size="$2"; shift 2 ;;
    --workers) workers="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    --json) json_out="$2"; shift 2 ;;
    --peers) peers="$2"; shift 2 ;;
    --data-only) data_only=1; shift ;;
    --image-transforms) transforms=1; shift ;;
    --image-transforms-file) transforms=1; transforms_file="$(realpath "$2")"; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done
log() { echo "[compare-train] $*" >&2; }
if [ -n "$transforms_file" ] && [ "$data_only" = 0 ]; then
  echo "--image-transforms-file times the data paths alone: add --data-only" >&2
  exit 2
fi
total=$((warmup + steps))
case "$policy" in
  act) ;;
  diffusion) fixture_wrist=480x640 ;;
  *) echo "--policy: act or diffusion, not $policy" >&2; exit 2 ;;
esac
case "$peers" in
  lerobot | all) ;;
  *) echo "--peers takes lerobot or all, not $peers" >&2; exit 2 ;;
esac

. "$py_dir/common.sh"
[ "$peers" = lerobot ] || require_shared_tools install-lerobot-0.6.1.sh
lerobot_venv
if [ "$peers" = all ]; then
  lerobot061_venv
  lancedb_venv
fi

# The lake binary, with the trainer.
if [ -z "${LAKE_BIN:-}" ]; then
  export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/lake/target}"
  torch_exports="$("$repo/scripts/torch-env.sh" --exports)"
  log "building lake with the trainer (release)"
  (cd "$repo" && eval "$torch_exports" && cargo build --release -p lake --features torch --locked)
  LAKE_BIN="$CARGO_TARGET_DIR/release/lake"
  # Only libtorch's libraries: the peers' pythons keep their own PATH.
  LD_LIBRARY_PATH="$(eval "$torch_exports" && echo "$LD_LIBRARY_PATH")"
  export LD_LIBRARY_PATH
fi
[ -x "$LAKE_BIN" ] || { echo "LAKE_BIN=$LAKE_BIN is not an executable" >&2; exit 2; }

if [ -n "$dataset" ]; then
  fixture="$(cd "$dataset" && pwd)"
  [ -f "$fixture/meta/info.json" ] || { echo "--dataset $dataset: no meta/info.json, not a LeRobot dataset" >&2; exit 2; }
  frames="$("$vpy" -c 'import json, sys; print(json.load(open(sys.argv[1]))["total_frames"])' "$fixture/meta/info.json")"
else
  lerobot_fixture
fi
lance_root=""
if [ "$peers" = all ] && [ -z "$dataset" ]; then lance_fixture; fi

work="$(mktemp -d)"
probe="$("$LAKE_BIN" --lake "$work/no-lake" train --dataset x --steps 1 --out "$work/probe" 2>&1 || true)"
if [[ "$probe" == *"without libtorch"* ]]; then
  rm -rf "$work"
  echo "$LAKE_BIN was built without libtorch: build it with --features torch (see --help)" >&2
  exit 2
fi
lake="$bench_dir/lake-train"
server_pid=""
cleanup() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  rm -rf "$work" "$lake"
}
trap cleanup EXIT
rm -rf "$lake"
log "ingesting into $lake"
"$LAKE_BIN" --lake "$lake" ingest "$fixture" --name bench >"$work/ingest.txt"

# The server the fed contenders read from.
"$LAKE_BIN" --lake "$lake" serve --flight 127.0.0.1:0 --http 127.0.0.1:0 --local "$work/serve.sock" \
  --threads "$workers" >"$work/serve.out" 2>"$work/serve.err" &
server_pid=$!
for _ in $(seq 100); do grep -q "grpc://" "$work/serve.out" 2>/dev/null && break; sleep 0.1; done
flight="$(grep -o 'grpc://[^ ]*' "$work/serve.out" | head -1)"
http="$(grep -o 'http://[^ ]*' "$work/serve.out" | head -1)"
[ -n "$flight" ] && [ -n "$http" ] || { cat "$work/serve.err" >&2; echo "lake serve did not start" >&2; exit 1; }
ticks="$(getconf CLK_TCK)"
server_cpu() { awk -v t="$ticks" '{ print ($14 + $15) / t }' "/proc/$server_pid/stat"; }

# Runs a contender under /usr/bin/time: NAME, then the command. Writes NAME.out (its output),
# NAME.time (user and system CPU seconds of it and the children it waited for) and
# NAME.server (the server's CPU seconds during it).
contender() {
  local name="$1" before
  shift
  log "$name"
  before="$(server_cpu)"
  if ! /usr/bin/time -f "%U %S %e" -o "$work/$name.time" "$@" >"$work/$name.out" 2>&1; then
    tail -40 "$work/$name.out" >&2
    echo "$name failed" >&2
    exit 1
  fi
  awk -v a="$before" -v b="$(server_cpu)" 'BEGIN { print b - a }' >"$work/$name.server"
}

export HF_HUB_OFFLINE=1 WANDB_MODE=disabled PYTHONPATH="$repo/clients/python${PYTHONPATH:+:$PYTHONPATH}"
lerobot_args=("--policy.type=$policy" --policy.device=cpu --policy.push_to_hub=false --policy.pretrained_backbone_weights=null
  "--batch_size=$batch_size" "--steps=$total" --log_freq=1 --save_checkpoint=false
  --wandb.enable=false "--seed=$seed")
# LeRobot 0.4.4's L1 counts padded actions as zeros; lake's does so with --padded-actions zero.
# Both start the backbone from random weights (nothing is downloaded).
echo "{\"type\": \"$policy\", \"pretrained_backbone_weights\": null}" >"$work/random-backbone.json"
lake_args=(--dataset bench --policy "$policy" --policy-config "$work/random-backbone.json" --steps "$total"
  --batch-size "$batch_size" --seed "$seed" --log-every 1 --padded-actions zero)
lake_transforms=()
if [ "$transforms" = 1 ]; then
  lerobot_args+=(--dataset.image_transforms.enable=true)
  lake_transforms=(--image-transforms ${transforms_file:+"$transforms_file"})
  lake_args+=("${lake_transforms[@]}")
fi

if [ "$data_only" = 0 ]; then
  # No evaluation in an environment: 0.4.4 calls it eval_freq, 0.6.1 env_eval_freq.
  contender lerobot-train "$venv/bin/lerobot-train" --dataset.repo_id=local/bench "--dataset.root=$fixture" \
    "${lerobot_args[@]}" --eval_freq=0 "--output_dir=$work/run-lerobot-train"
  if [ "$peers" = all ]; then
    # LeRobot 0.6.1's Diffusion defaults differ from 0.4.4's; these restore them (ACT's did not change).
    newest_args=()
    if [ "$policy" = diffusion ]; then
      newest_args=(--policy.horizon=16 --policy.n_action_steps=8 --policy.use_group_norm=true
        --policy.use_separate_rgb_encoder_per_camera=false)
    fi
    contender lerobot-train-061 "$venv061/bin/lerobot-train" --dataset.repo_id=local/bench "--dataset.root=$fixture" \
      "${lerobot_args[@]}" "${newest_args[@]}" --env_eval_freq=0 "--output_dir=$work/run-lerobot-train-061"
  fi
  contender lerobot-train-bridge "$vpy" -m lake_client.lerobot_train --lake-server "$flight" --lake-http "$http" \
    --lake-dataset bench "${lerobot_args[@]}" --eval_freq=0 "--output_dir=$work/run-lerobot-train-bridge"
  contender lake-train "$LAKE_BIN" --lake "$lake" train "${lake_args[@]}" --out "$work/run-lake-train"
  contender lake-train-local "$LAKE_BIN" --lake "$lake" train "${lake_args[@]}" --local "$work/serve.sock" \
    --out "$work/run-lake-train-local"
fi

feed_total=$((feed_steps + 1))
# The data path alone with the policy's windows: ACT's are lake's default, Diffusion's come with its type.
echo "{\"type\": \"$policy\"}" >"$work/windows.json"
loader_args=(--root "$fixture" --repo-id local/bench --preset "$policy" --backend torchcodec --batch-size "$batch_size"
  --batches "$feed_steps" --num-workers "$workers" --seed "$seed")
if [ -n "$transforms_file" ]; then
  loader_args+=(--image-transforms-file "$transforms_file" --float-frames)
  log "LeRobot 0.4.4's loader left out: it has none of LeRobot 0.6.1's own transforms"
elif [ "$transforms" = 1 ]; then
  loader_args+=(--image-transforms)
fi
if [ -z "$transforms_file" ]; then
  contender lerobot-loader "$vpy" "$py_dir/run_lerobot.py" "${loader_args[@]}" --like 0.4.4 --json-out "$work/lerobot-loader.json"
fi
if [ "$peers" = all ]; then
  contender lerobot-loader-061 "$vpy061" "$py_dir/run_lerobot.py" "${loader_args[@]}" --like 0.6.1 \
    --json-out "$work/lerobot-loader-061.json"
  if [ -n "$lance_root" ]; then
    contender lance-loader "$vpy_lance" "$py_dir/run_lerobot.py" "${loader_args[@]}" --lance-root "$lance_root" \
      --json-out "$work/lance-loader.json"
  else
    log "LeRobot + Lance left out: --dataset is not converted to Lance"
  fi
fi
contender lake-feed "$LAKE_BIN" --lake "$lake" train --dataset bench --policy none --policy-config "$work/windows.json" --steps "$feed_total" \
  --batch-size "$batch_size" --seed "$seed" --log-every "$feed_total" "${lake_transforms[@]}" --out "$work/run-lake-feed"
contender lake-feed-local "$LAKE_BIN" --lake "$lake" train --dataset bench --policy none --policy-config "$work/windows.json" --steps "$feed_total" \
  --batch-size "$batch_size" --seed "$seed" --log-every "$feed_total" "${lake_transforms[@]}" --local "$work/serve.sock" \
  --out "$work/run-lake-feed-local"

json_args=()
if [ -n "$json_out" ]; then json_args=(--json-out "$json_out"); fi
if [ "$transforms" = 1 ]; then json_args+=(--image-transforms ${transforms_file:+"$transforms_file"}); fi
"$vpy" "$py_dir/train_report.py" --work "$work" --warmup "$warmup" --steps "$steps" --batch-size "$batch_size" \
  --workers "$workers" --frames "$frames" --fixture "$fixture" --policy "$policy" --lake-version "$("$LAKE_BIN" --version)" "${json_args[@]}"
