#!/usr/bin/env bash
# Builds the self-contained release lake that docker/'s images hold, with the command of
# docs/guide/setup.md ("A self-contained binary"), and writes it, stripped, to OUT:
#
#   docker/build-lake.sh OUT FEATURES     # FEATURES: lake's cargo features, comma-separated,
#                                         # static-ffmpeg among them (e.g. static-ffmpeg,torch)
#
# The static FFmpeg comes from scripts/build-static-ffmpeg.sh (made once, then reused). The
# build goes to $CARGO_TARGET_DIR/static (default ~/.cache/lake/target/static), where
# scripts/check-static.sh builds and checks the same binary. Cargo does not see the static
# libraries change, so ffmpeg-sys-next is cleaned there whenever the FFmpeg the target was built
# against is not the one the script made. The binary must load no FFmpeg, dav1d or TurboJPEG
# library (the check scripts/check-static.sh makes). The environment of a `torch` build
# (LIBTORCH_USE_PYTORCH and torch's python on PATH) comes from the caller.
set -euo pipefail
out="${1:?usage: docker/build-lake.sh OUT FEATURES}"
features="${2:?usage: docker/build-lake.sh OUT FEATURES}"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target="${CARGO_TARGET_DIR:-$HOME/.cache/lake/target}/static"
log() { echo "[build-lake] $*" >&2; }

prefix="$("$repo/scripts/build-static-ffmpeg.sh" | tail -1)"
stamp="$(cat "$prefix/.lake-stamp")"
if [ -d "$target/release" ] && [ "$(cat "$target/.lake-ffmpeg-stamp" 2>/dev/null)" != "$stamp" ]; then
  log "the static FFmpeg changed: cleaning ffmpeg-sys-next in $target"
  (cd "$repo" && CARGO_TARGET_DIR="$target" cargo clean --release -p ffmpeg-sys-next)
fi
log "building lake (release, features $features) against $prefix"
(cd "$repo" && PKG_CONFIG_PATH="$prefix/lib/pkgconfig" TURBOJPEG_SOURCE=explicit TURBOJPEG_STATIC=1 \
  TURBOJPEG_LIB_DIR="$prefix/lib" TURBOJPEG_INCLUDE_DIR="$prefix/include" CARGO_TARGET_DIR="$target" \
  cargo build --release --locked -p lake --features "$features")
echo "$stamp" >"$target/.lake-ffmpeg-stamp"

bin="$target/release/lake"
linked="$(ldd "$bin" | awk '{ print $1 }' | grep -E '^lib(av|sw|postproc|dav1d|turbojpeg)' || true)"
if [ -n "$linked" ]; then
  echo "build-lake: the static lake still loads: $linked" >&2
  exit 1
fi
mkdir -p "$(dirname "$out")"
strip -o "$out" "$bin"
log "$out: $(du -h "$out" | cut -f1), loads $(ldd "$bin" | awk '{ print $1 }' | grep -v vdso | tr '\n' ' ')"
