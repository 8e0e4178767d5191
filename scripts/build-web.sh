#!/usr/bin/env bash
# Builds lake's web app (web/: plain ES modules and uPlot, bundled by esbuild) into
# serve/assets/: index.html, app.js and app.css, the three files `lake serve --http` embeds and
# serves at /, /app/app.js and /app/app.css. Installs web/'s pinned packages first (npm ci, into
# web/node_modules; their install scripts are not run). Needs node 18 or later and npm.
#
# scripts/build-web.sh --check builds into a temporary directory instead and fails, naming the
# file, unless the result equals the committed serve/assets/ byte for byte (CI runs it).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
assets="$repo/serve/assets"
files=(index.html app.js app.css)

check=false
case "${1:-}" in
  "") ;;
  --check) check=true ;;
  *) echo "usage: scripts/build-web.sh [--check]" >&2; exit 2 ;;
esac

command -v node >/dev/null || { echo "build-web: node not found (apt install nodejs npm)" >&2; exit 1; }
command -v npm >/dev/null || { echo "build-web: npm not found (apt install npm)" >&2; exit 1; }
major="$(node -p 'process.versions.node.split(".")[0]')"
[ "$major" -ge 18 ] || { echo "build-web: node $(node --version) is too old (esbuild needs 18 or later)" >&2; exit 1; }

(cd "$repo/web" && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error >&2)

if ! $check; then
  mkdir -p "$assets"
  node "$repo/web/build.mjs" "$assets"
  for f in "${files[@]}"; do
    printf '%8d  serve/assets/%s\n' "$(wc -c < "$assets/$f")" "$f"
  done
  exit 0
fi

out="$(mktemp -d "${TMPDIR:-/tmp}/lake-web-check.XXXXXX")"
trap 'rm -rf "$out"' EXIT
node "$repo/web/build.mjs" "$out"
failed=false
for f in "${files[@]}"; do
  if [ ! -f "$assets/$f" ]; then
    echo "build-web: serve/assets/$f is missing: run scripts/build-web.sh" >&2
    failed=true
  elif ! cmp -s "$out/$f" "$assets/$f"; then
    echo "build-web: serve/assets/$f differs from what web/ builds: run scripts/build-web.sh" >&2
    failed=true
  fi
done
for f in "$assets"/*; do
  [ -e "$f" ] || continue
  name="$(basename "$f")"
  case " ${files[*]} " in
    *" $name "*) ;;
    *) echo "build-web: serve/assets/$name is not built from web/: remove it" >&2; failed=true ;;
  esac
done
if $failed; then exit 1; fi
echo "build-web: serve/assets/ is what web/ builds" >&2
