#!/usr/bin/env bash
# A static, minimal FFmpeg for a self-contained `lake`: one that needs only glibc (and, for the
# trainer, libtorch) on the machine it runs on, such as a GPU machine without FFmpeg.
#
#   scripts/build-static-ffmpeg.sh                      # into ~/.cache/lake/ffmpeg-static
#   LAKE_STATIC_FFMPEG=DIR scripts/build-static-ffmpeg.sh
#   # then, with what it prints:
#   PKG_CONFIG_PATH=DIR/lib/pkgconfig TURBOJPEG_SOURCE=explicit TURBOJPEG_STATIC=1 \
#     TURBOJPEG_LIB_DIR=DIR/lib TURBOJPEG_INCLUDE_DIR=DIR/include \
#     cargo build --release -p lake --features static-ffmpeg
#
# The sources are Debian 12's own source packages (`apt-get source ffmpeg dav1d`, the versions
# of the shared libraries the default build links, with Debian's patches), so a static lake
# decodes with the same code as the default one. Only what lake uses is built:
#  - decoders h264, hevc, mpeg4, vp9, av1 and libdav1d (Debian's FFmpeg decodes AV1 with dav1d
#    too), png and mjpeg; the parsers of those codecs;
#  - demuxer mov (mp4), muxer mp4 (`lake export`), protocol file;
#  - libswscale, and libavfilter with buffer, buffersink, scale and format (the filter graph
#    that converts frames as LeRobot's reader does);
#  - NVDEC for h264, hevc and av1 (FFmpeg's CUDA hwaccel: the driver's libraries are loaded at
#    run time, so the binary still runs without them), from Debian's MIT ffnvcodec headers
#    (libffmpeg-nvenc-dev);
#  - zlib (PNG) from the system (static libz.a, zlib1g-dev), dav1d built static here;
#  - TurboJPEG: Debian's static libturbojpeg.a and its header, copied into the prefix (lake's
#    JPEG decoder; turbojpeg-sys links it with TURBOJPEG_SOURCE=explicit).
# After a rebuild, `cargo clean -p ffmpeg-sys-next --release` in the target: that crate bundles the
# static libraries into its own build, and cargo does not see them change.
# Needs: dpkg-dev (apt-get source), nasm, meson and ninja-build (apt); about 5 minutes on 2
# cores. The result holds include/, lib/*.a and lib/pkgconfig/; a stamp names what built it, and
# an unchanged run does nothing.
set -euo pipefail

prefix="${LAKE_STATIC_FFMPEG:-$HOME/.cache/lake/ffmpeg-static}"
jobs="$(nproc)"
log() { echo "[static-ffmpeg] $*" >&2; }

ffmpeg_version="$(dpkg-query -W -f '${Version}' libavcodec-dev 2>/dev/null || true)"
dav1d_version="$(dpkg-query -W -f '${Version}' libdav1d-dev 2>/dev/null || dpkg-query -W -f '${Version}' libdav1d6)"
[ -n "$ffmpeg_version" ] || { echo "libavcodec-dev is not installed: scripts/setup.sh installs it" >&2; exit 1; }
# The recipe's version: raise it when the configure flags below change.
recipe=2
stamp="ffmpeg $ffmpeg_version dav1d $dav1d_version recipe $recipe"

# TurboJPEG's static library and header, next to FFmpeg's.
copy_turbojpeg() {
  local lib=/usr/lib/x86_64-linux-gnu/libturbojpeg.a header=/usr/include/turbojpeg.h
  [ -f "$lib" ] && [ -f "$header" ] || { echo "missing $lib or $header (apt-get install libturbojpeg0-dev)" >&2; exit 1; }
  mkdir -p "$prefix/lib" "$prefix/include"
  cp "$lib" "$prefix/lib/" && cp "$header" "$prefix/include/"
}

if [ "$(cat "$prefix/.lake-stamp" 2>/dev/null)" = "$stamp" ]; then
  copy_turbojpeg
  log "up to date: $prefix ($stamp)"
  echo "$prefix"
  exit 0
fi

missing=()
for tool in dpkg-source:dpkg-dev nasm:nasm meson:meson ninja:ninja-build; do
  command -v "${tool%%:*}" >/dev/null || missing+=("${tool#*:}")
done
[ -f /usr/lib/x86_64-linux-gnu/libz.a ] || missing+=(zlib1g-dev)
[ -f /usr/include/ffnvcodec/dynlink_cuviddec.h ] || missing+=(libffmpeg-nvenc-dev)
if [ ${#missing[@]} -gt 0 ]; then
  echo "missing: ${missing[*]} (apt-get install ${missing[*]})" >&2
  exit 1
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# Debian's source packages, through a sources list of our own (the system's stays as it is).
apt_dir="$work/apt"
mkdir -p "$apt_dir/lists/partial" "$apt_dir/sources"
suite="$(. /etc/os-release && echo "$VERSION_CODENAME")"
cat >"$apt_dir/sources/deb-src.sources" <<EOF
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: $suite $suite-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb-src
URIs: http://deb.debian.org/debian-security
Suites: $suite-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
apt_opts=(-o "Dir::Etc::SourceParts=$apt_dir/sources" -o "Dir::Etc::SourceList=/dev/null" -o "Dir::State::Lists=$apt_dir/lists")
log "fetching Debian's sources of ffmpeg $ffmpeg_version and dav1d $dav1d_version"
apt-get "${apt_opts[@]}" update -qq
(cd "$work" && apt-get "${apt_opts[@]}" source -qq "ffmpeg=$ffmpeg_version" "dav1d=$dav1d_version" >/dev/null)

rm -rf "$prefix"
mkdir -p "$prefix"

log "building dav1d (static)"
dav1d_src="$(find "$work" -maxdepth 1 -type d -name 'dav1d-*' | head -1)"
meson setup "$work/dav1d-build" "$dav1d_src" --prefix="$prefix" --libdir=lib --buildtype=release \
  --default-library=static -Denable_tools=false -Denable_tests=false -Denable_examples=false >"$work/dav1d.log"
ninja -C "$work/dav1d-build" -j "$jobs" install >>"$work/dav1d.log"

log "building FFmpeg (static, minimal)"
ffmpeg_src="$(find "$work" -maxdepth 1 -type d -name 'ffmpeg-*' | head -1)"
(
  cd "$ffmpeg_src"
  PKG_CONFIG_PATH="$prefix/lib/pkgconfig" ./configure --prefix="$prefix" \
    --enable-static --disable-shared --enable-pic --disable-programs --disable-doc --disable-debug \
    --disable-autodetect --disable-everything --disable-network --disable-avdevice --disable-swresample \
    --disable-postproc --enable-zlib --enable-libdav1d \
    --enable-ffnvcodec --enable-cuda --enable-nvdec --enable-hwaccel=h264_nvdec,hevc_nvdec,av1_nvdec \
    --enable-decoder=h264,hevc,mpeg4,vp9,av1,libdav1d,png,mjpeg \
    --enable-parser=h264,hevc,mpeg4video,vp9,av1,png,mjpeg \
    --enable-demuxer=mov --enable-muxer=mp4 --enable-protocol=file \
    --enable-avfilter --enable-filter=buffer,buffersink,scale,format \
    --pkg-config-flags=--static --extra-cflags="-I$prefix/include" --extra-ldflags="-L$prefix/lib" >"$work/ffmpeg-configure.log" 2>&1 ||
    { tail -30 "$work/ffmpeg-configure.log" >&2; tail -30 ffbuild/config.log >&2; exit 1; }
  make -j "$jobs" >"$work/ffmpeg-build.log" 2>&1 || { tail -40 "$work/ffmpeg-build.log" >&2; exit 1; }
  make install >>"$work/ffmpeg-build.log" 2>&1
)
copy_turbojpeg
echo "$stamp" >"$prefix/.lake-stamp"
log "done: $prefix"
echo "$prefix"
