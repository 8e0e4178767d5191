#!/usr/bin/env bash
# The trainer's GPU checks (docs/gpu-checks.md), in two halves:
#
#   scripts/gpu-check-train.sh build [DIR]  # here, from nothing: the static FFmpeg
#                                           # (scripts/build-static-ffmpeg.sh), the release lake
#                                           # with the trainer against it and the torch venv's
#                                           # libtorch (scripts/torch-env.sh), then `pack`
#   scripts/gpu-check-train.sh pack [DIR]   # here: DIR (.gpu-check/train) gets a stripped lake
#                                           # built with the trainer and the shared libraries it
#                                           # needs besides libtorch
#   scripts/gpu-check-train.sh run [DIR]    # on the GPU machine (torch 2.11 installed, no
#                                           # FFmpeg, no network): ingests the bundled samples
#                                           # v30-av1-small (as `bench`), v30-h264-multifile and
#                                           # v30-bframes, runs the checks, a report on stdout
#
# `run` checks, each with the lake binary's own commands:
#  0. `lake gpu`: the driver, NVRTC, NCCL and NVDEC found, what NVDEC decodes (H.264, HEVC and
#     AV1 at 8 and 10 bits: engines, sizes, and whether 128x96, 640x480 and 1920x1080 decode), and
#     lake's colour kernel on the GPU against its CPU twin (64 frames of 640x480, byte for byte,
#     and its time a batch), and the resize kernels against theirs (the same frames to 224x224);
#  0b. `lake gpu --dataset`: frames decoded on NVDEC (made RGB by lake's kernel) against the
#     loader's, byte for byte, with NVDEC's and the CPU's frames/s: the AV1 sample (where NVDEC
#     has AV1), the bundled H.264 sample, and the bundled H.264/HEVC sample with B-frames (its
#     widths are not multiples of 32: lake's kernel does not convert them, which it says);
#  1. one ACT step on CUDA against the same step on the CPU (fp32, same weights and batch): the
#     loss of each, and the largest difference between the two checkpoints' parameters;
#  2. bf16 mixed precision trains on CUDA (the loss over 40 steps);
#  3. steps/s, samples/s and the data-wait share of ACT's default config on the AV1 sample's
#     480x640 and 96x128 cameras, batch 8 and 64, and the data path alone (--policy none) at
#     both batch sizes;
#  4. NCCL with world size 1: torchrun starts one rank that sums its gradients through NCCL
#     (--backend nccl), against the same steps without a collective;
#  5. --decode gpu (NVDEC where the stream allows, the CPU into planes elsewhere, lake's kernel)
#     against --decode server: the same 4 steps must end with the same weights, on the H.264
#     sample and the AV1 sample, and the data path alone at batch 64 with each;
#  6. --decode gpu --frame-size 64x48 (frames resized by lake's kernels) against --decode cpu
#     --frame-size 64x48 (resized by libswscale, as frame tables are): the same weights expected;
#  7. Diffusion on the AV1 sample's cameras at 128x96 (--frame-size, decoded and resized by the
#     trainer's CPU: LeRobot's Diffusion takes cameras of one size): one step on CUDA against the CPU's (fp32), then steps/s and the
#     data-wait share at the last batch size of LeRobot 0.4.4's defaults (GroupNorm) and of LeRobot 0.6.1's
#     shape (BatchNorm, an encoder a camera, horizon 64);
#  8. LeRobot's image transforms (--image-transforms): one ACT step on CUDA against the same step
#     on the CPU, the same draws (loss and parameters as in check 1), with LeRobot's default set
#     and with LeRobot 0.6.1's transforms for a robot's cameras on every frame (all but
#     GaussianNoise, whose CUDA normals are not the CPU's); and the data path alone at the last
#     batch size with and without each set, all eight of 0.6.1's (the transforms' cost on the
#     device).
# LAKE_GPU_CHECK_DEVICE=cpu runs the same checks on the CPU, to try the script without a GPU;
# LAKE_GPU_CHECK_STEPS (40) and LAKE_GPU_CHECK_BATCHES ("8 64") make such a trial short.
#
# pack needs LAKE_BIN (a release lake built with --features torch and static-ffmpeg) and xz; the
# packed directory is .gpu-check/train.tar.xz (the device tool carries ignored paths), which
# `run` unpacks with Python's tarfile (the GPU machine has Python). The samples travel with the
# working tree: the device tool carries 64 MiB in all, the tree's tracked files included.
set -euo pipefail

mode="${1:-}"
dir="${2:-.gpu-check/train}"
log() { echo "[gpu-check] $*" >&2; }

# The static FFmpeg and the self-contained release build `pack` takes (docs/guide/setup.md), then
# the packing: what a session lent a GPU runs first on a machine that has neither.
build() {
  local repo prefix began=$SECONDS
  repo="$(cd "$(dirname "$0")/.." && pwd)"
  "$repo/scripts/setup.sh"
  # What scripts/build-static-ffmpeg.sh builds with, besides the setup's packages.
  local need=() p sudo=""
  for p in dpkg-dev nasm meson ninja-build; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
  done
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  if ((${#need[@]})); then DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${need[@]}"; fi
  prefix="$("$repo/scripts/build-static-ffmpeg.sh")"
  log "static FFmpeg in $prefix ($((SECONDS - began)) s)"
  export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/lake/target}"
  eval "$("$repo/scripts/torch-env.sh" --exports)"
  (cd "$repo" && PKG_CONFIG_PATH="$prefix/lib/pkgconfig" TURBOJPEG_SOURCE=explicit TURBOJPEG_STATIC=1 \
    TURBOJPEG_LIB_DIR="$prefix/lib" TURBOJPEG_INCLUDE_DIR="$prefix/include" \
    cargo build --release -p lake --features torch,static-ffmpeg --locked)
  log "release build done ($((SECONDS - began)) s)"
  LAKE_BIN="$CARGO_TARGET_DIR/release/lake" pack
  log "built and packed in $((SECONDS - began)) s"
}

pack() {
  local bin="${LAKE_BIN:?LAKE_BIN: a release lake built with --features torch,static-ffmpeg}"
  rm -rf "$dir"
  mkdir -p "$dir/lib" "$dir/bin"
  strip -o "$dir/bin/lake" "$bin"
  # Every library the binary loads that is not libc's, the C++ runtime's or libtorch's (the
  # GPU machine's torch brings those).
  ldd "$bin" | awk '$3 ~ /^\// { print $3 }' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so* | libm.so* | libdl.so* | librt.so* | libpthread.so* | ld-linux* | libstdc++* | libgcc_s* | libgomp*) ;;
      libtorch* | libc10* | libcu* | libnv* | libshm*) ;;
      *) cp -L "$lib" "$dir/lib/" ;;
    esac
  done
  # xz's strongest preset: the stripped binary (225 MB) is 43.7 MB with it against 48.5 MB with
  # zstd --ultra -22 --long=28, which keeps it and the working tree under the 64 MiB a device call carries.
  tar -C "$(dirname "$dir")" -cf - "$(basename "$dir")" | xz -9e -T0 >"$dir.tar.xz"
  local bytes
  bytes="$(stat -c %s "$dir.tar.xz")"
  log "packed $((bytes >> 20)) MiB: $dir.tar.xz ($(ls "$dir/lib" | wc -l) libraries)"
  # The device tool carries at most 64 MiB a call, the working tree (tracked and untracked files
  # git does not ignore) and the archive together. A lake linking Debian's shared FFmpeg brings
  # its whole codec closure (about 77 MiB compressed), which does not fit: build the lake
  # against a static, minimal FFmpeg first.
  local tree
  tree="$(cd "$(dirname "$0")/.." && { git ls-files -z; git ls-files -z -o --exclude-standard; } | xargs -0 stat -c %s 2>/dev/null | awk '{ n += $1 } END { print n + 0 }')" || true
  log "with the working tree ($((tree >> 20)) MiB): $(((bytes + tree) >> 20)) MiB a device call carries"
  if [ $((bytes + tree)) -gt $((64 << 20)) ]; then
    echo "$dir.tar.xz and the working tree are $(((bytes + tree) >> 20)) MiB, over the 64 MiB a device call carries; libraries packed: $(ls "$dir/lib" | tr '\n' ' ')" >&2
    exit 1
  fi
}

run() {
  local device="${LAKE_GPU_CHECK_DEVICE:-cuda}" py="${PYTHON:-python3}" out
  if [ ! -d "$dir" ] && [ -f "$dir.tar.xz" ]; then
    "$py" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$dir.tar.xz" "$(dirname "$dir")"
  fi
  local steps="${LAKE_GPU_CHECK_STEPS:-40}" batches="${LAKE_GPU_CHECK_BATCHES:-8 64}"
  local torch_lib
  torch_lib="$("$py" -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')"
  # NVRTC and NCCL (libnccl.so.2) come with the torch wheel (nvidia-* packages).
  local nvidia
  nvidia="$(dirname "$torch_lib")/../nvidia"
  export LD_LIBRARY_PATH="$dir/lib:$torch_lib:$nvidia/cu13/lib:$nvidia/nccl/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  local lake=("$dir/bin/lake" --lake "$dir/lake")
  out="$(mktemp -d)"
  # ACT's default config but a backbone from random weights: the machine has no ImageNet file.
  echo '{"pretrained_backbone_weights": null}' >"$out/act.json"
  act=(--policy-config "$out/act.json")
  # AV1 640x480 + 128x96 (the cameras of bench/compare_lerobot.sh's fixture) as `bench`; H.264 at
  # widths lake's kernel converts; H.264 and HEVC with B-frames, for NVDEC.
  local repo sample
  repo="$(cd "$(dirname "$0")/.." && pwd)"
  rm -rf "$dir/lake"
  "${lake[@]}" ingest "$repo/testdata/lerobot/v30-av1-small" --name bench >"$out/ingest.txt" 2>&1 || { cat "$out/ingest.txt"; exit 1; }
  for sample in v30-h264-multifile v30-bframes; do
    "${lake[@]}" ingest "$repo/testdata/lerobot/$sample" >>"$out/ingest.txt" 2>&1 || { cat "$out/ingest.txt"; exit 1; }
  done
  echo "== machine"
  "$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU")'
  nproc
  "${lake[0]}" --version

  check 0 "lake gpu" check_probe
  check 0b "NVDEC frames against the loader's (AV1 480x640 + 96x128; H.264; HEVC and H.264 with B-frames)" check_nvdec
  check 1 "one ACT step, $device against cpu (fp32)" check_one_step
  check 2 "bf16 mixed precision on $device, $steps steps" check_bf16
  check 3 "ACT's default config, 480x640 + 96x128 cameras, on $device" check_throughput
  check 4 "NCCL, world size 1, on $device" check_nccl
  check 5 "--decode gpu against --decode server on $device (the same steps, the same weights expected)" check_decode
  check 6 "--decode gpu --frame-size 64x48 against --decode cpu --frame-size 64x48 on $device (the same weights expected)" check_resize
  check 7 "Diffusion, cameras at 128x96, on $device" check_diffusion
  check 8 "image transforms, $device against cpu, and their cost" check_transforms
  rm -rf "$out"
  echo "== done in $SECONDS s"
}

# Runs check $1 ($2 says what it checks) with the function $3: a check that fails says so and
# the next one still runs, since a GPU session may not come again soon.
check() {
  local began=$SECONDS
  echo "== $1. $2"
  "$3" || echo "(check $1 stopped: exit $?)"
  echo "(check $1: $((SECONDS - began)) s)"
}

check_probe() {
  "${lake[0]}" gpu || echo "(lake gpu exited $?)"
}

check_nvdec() {
  for dataset in bench v30-h264-multifile v30-bframes; do
    "${lake[@]}" gpu --dataset "$dataset" --steps 96 | grep '^NVDEC ' || echo "(lake gpu --dataset $dataset exited $?)"
  done
}

check_one_step() {
  for run in cpu:reference "$device:checked"; do
    local d="${run%%:*}" name="one-${run#*:}"
    "${lake[@]}" train --dataset bench "${act[@]}" --steps 1 --batch-size 8 --seed 3 --device "$d" --out "$out/$name" >"$out/$name.txt" 2>&1 ||
      { tail -20 "$out/$name.txt"; return 1; }
  done
  compare_steps "$out/one-reference" "$out/one-checked"
}

# The first logged loss of two runs of one step and the largest difference between their
# checkpoints' parameters.
compare_steps() {
  "$py" - "$1" "$2" <<'EOF'
import json, struct, sys, torch
def load(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        assert v["dtype"] == "F32", (k, v["dtype"])
        out[k] = torch.frombuffer(bytearray(data[a:b]), dtype=torch.float32).reshape(v["shape"])
    return out
runs = sys.argv[1:]
losses = [json.loads(open(f"{r}/train_log.jsonl").readline())["loss"] for r in runs]
weights = [load(f"{r}/checkpoints/000001/pretrained_model/model.safetensors") for r in runs]
diff = max((weights[0][k] - weights[1][k]).abs().max().item() for k in weights[0])
rel = abs(losses[0] - losses[1]) / abs(losses[0])
print(f"loss cpu {losses[0]:.6f}, other {losses[1]:.6f} (relative difference {rel:.2e}); "
      f"largest parameter difference after the step {diff:.2e}")
EOF
}

check_diffusion() {
  # Resized after decoding here (the sample has no frame table at that size).
  local small=(--dataset bench --policy diffusion --frame-size 128x96 --decode cpu) b="${batches##* }"
  # No warm-up, so that the one step moves the parameters.
  echo '{"scheduler_warmup_steps": 0}' >"$out/no-warmup.json"
  for run in cpu:reference "$device:checked"; do
    local d="${run%%:*}" name="diffusion-${run#*:}"
    "${lake[@]}" train "${small[@]}" --policy-config "$out/no-warmup.json" --steps 1 --batch-size 8 --seed 3 --device "$d" \
      --out "$out/$name" >"$out/$name.txt" 2>&1 ||
      { tail -20 "$out/$name.txt"; return 1; }
  done
  compare_steps "$out/diffusion-reference" "$out/diffusion-checked"
  echo '{"horizon": 64, "n_action_steps": 32, "use_group_norm": false, "use_separate_rgb_encoder_per_camera": true}' >"$out/newest.json"
  for shape in "0.4.4's defaults:" "0.6.1's shape:--policy-config $out/newest.json"; do
    echo "-- LeRobot ${shape%%:*}, batch $b, $steps steps"
    # shellcheck disable=SC2086
    "${lake[@]}" train "${small[@]}" ${shape#*:} --steps "$steps" --batch-size "$b" --device "$device" --log-every 20 \
      --out "$out/diffusion-$(echo "${shape%%:*}" | tr -dc 'a-z0-9')" 2>&1 | tail -3
  done
}

check_transforms() {
  # LeRobot 0.6.1's transforms for a robot's cameras, on every camera frame: all eight for the
  # cost; without GaussianNoise for the comparison, since a CUDA generator (Philox) makes other
  # normals than a CPU one for the same seed, in LeRobot as in lake.
  cat >"$out/scene-transforms.json" <<'JSON'
{"max_num_transforms": 7, "tfs": {
  "blur": {"type": "MotionBlur"}, "jpeg": {"type": "JPEGCompression"},
  "patches": {"type": "GaussianPatchBrightness"}, "shadow": {"type": "RandomShadow"},
  "dropout": {"type": "CoarseDropout"}, "gamma": {"type": "GammaCorrection"}, "planckian": {"type": "PlanckianJitter"}}}
JSON
  sed 's/"max_num_transforms": 7, "tfs": {/"max_num_transforms": 8, "tfs": {"noise": {"type": "GaussianNoise"},/' \
    "$out/scene-transforms.json" >"$out/scene-and-noise.json"
  local set
  for set in default:--image-transforms "scene:--image-transforms $out/scene-transforms.json"; do
    local run
    echo "-- ${set%%:*} set: one ACT step, $device against cpu"
    for run in cpu:reference "$device:checked"; do
      local d="${run%%:*}" name="transforms-${set%%:*}-${run#*:}"
      # shellcheck disable=SC2086
      "${lake[@]}" train --dataset bench "${act[@]}" ${set#*:} --steps 1 --batch-size 8 --seed 3 --device "$d" \
        --out "$out/$name" >"$out/$name.txt" 2>&1 || { tail -20 "$out/$name.txt"; return 1; }
    done
    compare_steps "$out/transforms-${set%%:*}-reference" "$out/transforms-${set%%:*}-checked"
  done
  local b="${batches##* }" flags
  for flags in "" --image-transforms "--image-transforms $out/scene-and-noise.json"; do
    echo "-- the data path alone, batch $b, $steps steps ${flags:-without transforms}"
    # shellcheck disable=SC2086
    "${lake[@]}" train --dataset bench --policy none $flags --steps "$steps" --batch-size "$b" --device "$device" \
      --log-every "$steps" --out "$out/feed-transforms" 2>&1 | tail -2
    rm -rf "$out/feed-transforms"
  done
}

check_bf16() {
  "${lake[@]}" train --dataset bench "${act[@]}" --steps "$steps" --batch-size 8 --device "$device" --dtype bf16 --log-every 10 \
    --out "$out/bf16" 2>&1 | tail -4
}

check_throughput() {
  for b in $batches; do
    echo "-- batch $b: training, $steps steps"
    "${lake[@]}" train --dataset bench "${act[@]}" --steps "$steps" --batch-size "$b" --device "$device" --log-every 20 \
      --out "$out/act-$b" 2>&1 | tail -4
    echo "-- batch $b: the data path alone (--policy none), $steps steps"
    "${lake[@]}" train --dataset bench --policy none --steps "$steps" --batch-size "$b" --device "$device" --log-every "$steps" \
      --out "$out/feed-$b" 2>&1 | tail -2
  done
}

check_nccl() {
  if [ "$device" = cuda ]; then
    "$py" -m torch.distributed.run --standalone --nproc-per-node 1 --no-python "${lake[@]}" train --dataset bench "${act[@]}" --steps 5 \
      --batch-size 8 --seed 3 --device cuda --backend nccl --out "$out/nccl" >"$out/nccl.txt" 2>&1 || tail -20 "$out/nccl.txt"
    "${lake[@]}" train --dataset bench "${act[@]}" --steps 5 --batch-size 8 --seed 3 --device cuda --out "$out/alone" >"$out/alone.txt" 2>&1 ||
      tail -5 "$out/alone.txt"
    tail -3 "$out/nccl.txt"
    "$py" - "$out/alone" "$out/nccl" <<'EOF'
import json, sys
runs = sys.argv[1:]
losses = [[json.loads(l)["loss"] for l in open(f"{r}/train_log.jsonl")] for r in runs]
print("losses without a collective:", [round(x, 6) for x in losses[0]])
print("losses through NCCL:        ", [round(x, 6) for x in losses[1]])
EOF
  else
    echo "(skipped: no GPU)"
  fi
}

check_decode() {
  if [ "$device" = cuda ]; then
    for dataset in v30-h264-multifile bench; do
      for decode in server gpu; do
        "${lake[@]}" train --dataset "$dataset" "${act[@]}" --steps 4 --batch-size 8 --seed 3 --device cuda --frames yuv420p --decode "$decode" \
          --log-every 1 --out "$out/decode-$dataset-$decode" >"$out/decode-$dataset-$decode.txt" 2>&1 ||
          tail -5 "$out/decode-$dataset-$decode.txt"
      done
      a="$out/decode-$dataset-server/checkpoints/000004/pretrained_model/model.safetensors"
      b="$out/decode-$dataset-gpu/checkpoints/000004/pretrained_model/model.safetensors"
      if cmp -s "$a" "$b"; then echo "$dataset: the same weights, byte for byte"; else echo "$dataset: the weights DIFFER"; fi
      grep -h "decodes on the CPU" "$out/decode-$dataset-gpu.txt" | sort -u | head -3
      echo "-- $dataset, the data path alone, batch 64: server, then gpu"
      for decode in server gpu; do
        "${lake[@]}" train --dataset "$dataset" --policy none --steps "$steps" --batch-size 64 --device cuda --frames yuv420p \
          --decode "$decode" --log-every "$steps" --out "$out/feed-$dataset-$decode" 2>&1 | tail -2
      done
    done
  else
    echo "(skipped: no GPU)"
  fi
}

check_resize() {
  if [ "$device" = cuda ]; then
    for run in cpu:rgb24 gpu:yuv420p; do
      local decode="${run%%:*}"
      "${lake[@]}" train --dataset v30-h264-multifile "${act[@]}" --steps 4 --batch-size 8 --seed 3 --device cuda --frame-size 64x48 \
        --frames "${run#*:}" --decode "$decode" --log-every 1 --out "$out/resized-$decode" >"$out/resized-$decode.txt" 2>&1 ||
        tail -5 "$out/resized-$decode.txt"
    done
    a="$out/resized-cpu/checkpoints/000004/pretrained_model/model.safetensors"
    b="$out/resized-gpu/checkpoints/000004/pretrained_model/model.safetensors"
    if cmp -s "$a" "$b"; then echo "the same weights, byte for byte"; else echo "the weights DIFFER"; fi
  else
    echo "(skipped: no GPU)"
  fi
}

case "$mode" in
  build) build ;;
  pack) pack ;;
  run) run ;;
  *) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
