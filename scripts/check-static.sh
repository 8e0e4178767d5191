#!/usr/bin/env bash
# The self-contained build, checked: lake linked against scripts/build-static-ffmpeg.sh's static
# FFmpeg loads no FFmpeg, dav1d or TurboJPEG library, and gives the same samples, byte for byte,
# as the default build (Debian's shared FFmpeg) on every bundled sample dataset.
#
#   scripts/check-static.sh [--release]
#
# Builds the static lake into $CARGO_TARGET_DIR/static (its own directory, so the default
# build's outputs are left as they are; a cold debug build takes about 10 minutes on 2 cores)
# and the default lake as usual, ingests testdata/lerobot/ with each into a lake of its own,
# and compares `lake sample --preset act` of the same steps from both, with frames as RGB and
# as YUV planes. Prints the static binary's path. Not part of scripts/test.sh (too slow for
# every run).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
profile=debug
cargo_profile=()
if [ "${1:-}" = "--release" ]; then profile=release; cargo_profile=(--release); fi
target="${CARGO_TARGET_DIR:-$HOME/.cache/lake/target}"
log() { echo "[check-static] $*" >&2; }

prefix="$("$repo/scripts/build-static-ffmpeg.sh" | tail -1)"
log "building lake against $prefix ($profile)"
(cd "$repo" && PKG_CONFIG_PATH="$prefix/lib/pkgconfig" TURBOJPEG_SOURCE=explicit TURBOJPEG_STATIC=1 \
  TURBOJPEG_LIB_DIR="$prefix/lib" TURBOJPEG_INCLUDE_DIR="$prefix/include" CARGO_TARGET_DIR="$target/static" \
  cargo build "${cargo_profile[@]}" --locked -p lake --features static-ffmpeg)
(cd "$repo" && CARGO_TARGET_DIR="$target" cargo build "${cargo_profile[@]}" --locked -p lake)
static_bin="$target/static/$profile/lake"
shared_bin="$target/$profile/lake"

linked="$(ldd "$static_bin" | awk '{ print $1 }' | grep -E '^lib(av|sw|postproc|dav1d|turbojpeg)' || true)"
if [ -n "$linked" ]; then
  echo "the static lake still loads: $linked" >&2
  exit 1
fi
log "the static lake loads: $(ldd "$static_bin" | awk '{ print $1 }' | grep -v vdso | tr '\n' ' ')"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
for name in "$repo"/testdata/lerobot/*/; do
  name="$(basename "$name")"
  for kind in static shared; do
    [ "$kind" = static ] && bin="$static_bin" || bin="$shared_bin"
    "$bin" --lake "$work/lake-$kind" ingest "$repo/testdata/lerobot/$name" >/dev/null
  done
  steps="$("$shared_bin" --lake "$work/lake-shared" sql --format csv "SELECT count(*) FROM steps WHERE dataset = '$name'" | tail -1)"
  indices="$(seq -s, 0 7 $((steps - 1)))"
  for format in rgb24 yuv420p; do
    for kind in static shared; do
      [ "$kind" = static ] && bin="$static_bin" || bin="$shared_bin"
      "$bin" --lake "$work/lake-$kind" sample --dataset "$name" --indices "$indices" --preset act \
        --frame-format "$format" --out "$work/$name-$format-$kind.arrow" >/dev/null
    done
    if cmp -s "$work/$name-$format-static.arrow" "$work/$name-$format-shared.arrow"; then
      log "$name ($format, $(echo "$indices" | tr ',' '\n' | wc -l) samples): the same bytes"
    else
      echo "$name ($format): the static lake's samples differ from the default build's" >&2
      exit 1
    fi
  done
done
echo "$static_bin"
