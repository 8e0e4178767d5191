#!/usr/bin/env bash
# Installs what building and testing lake needs on Debian 12: FFmpeg 5.1 development headers
# (ffmpeg-next binds them), clang (bindgen), make and gcc (jemalloc), g++ (lake-gpu's tests build
# the CUDA kernels' source for the CPU), protoc and the protobuf
# well-known types (Lance's build imports google/protobuf/empty.proto), libjpeg-turbo's
# TurboJPEG (JPEG pictures are decoded with it, as PIL decodes them), the ffmpeg tool (tests make
# media with it), python3 with venv (the Python client's tests; see scripts/python-env.sh), and
# Open MPI (data-parallel `lake train` under mpirun, feature `mpi`), Gloo's headers (ranks that
# torchrun starts meet through libtorch's own Gloo, which libtorch ships without headers),
# Chromium and its WebDriver (the web app's browser test), nginx (the web server of the HTTP
# source tests), node and npm where no node is on the path (scripts/build-web.sh builds the web
# app), and the rustfmt/clippy components. Safe to run
# again: it only installs what is missing.
set -euo pipefail

packages=(pkg-config make gcc g++ clang libclang-dev protobuf-compiler libprotobuf-dev ffmpeg python3 python3-venv
  libavcodec-dev libavformat-dev libavutil-dev libswscale-dev libswresample-dev
  libavfilter-dev libavdevice-dev libturbojpeg0-dev libopenmpi-dev openmpi-bin libgloo-dev libffmpeg-nvenc-dev
  chromium chromium-driver nginx-light)

command -v node >/dev/null && command -v npm >/dev/null || packages+=(nodejs npm)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

command -v cargo >/dev/null || { echo "setup: cargo not found; install Rust 1.95 with rustup first" >&2; exit 1; }
for c in rustfmt clippy; do
  cargo "${c/rustfmt/fmt}" --version >/dev/null 2>&1 || rustup component add "$c"
done
