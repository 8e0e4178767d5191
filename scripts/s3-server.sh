#!/usr/bin/env bash
# Starts an S3-compatible server on 127.0.0.1 and a free port, in the background, for lake's
# object-store tests: moto's S3 through scripts/s3_server.py, which makes conditional writes atomic
# (docs/decisions/0025-s3-test-server.md). Waits until it answers, then prints, one per line:
#
#   AWS_ENDPOINT_URL=http://127.0.0.1:PORT
#   AWS_ALLOW_HTTP=true
#   AWS_REGION=us-east-1
#   AWS_ACCESS_KEY_ID=lake
#   AWS_SECRET_ACCESS_KEY=lake-secret
#   LAKE_S3_PID=PID          (kill it to stop the server)
#   LAKE_S3_LOG=FILE         (the server's output)
#
# The server holds the buckets LAKE_S3_BUCKETS names (default: `lake`), keeps objects in memory,
# accepts any credentials, and exits by itself once process LAKE_S3_WATCH_PID (default: this
# script's parent, e.g. the test that ran it) is gone. In a shell:
#   set -a; eval "$(scripts/s3-server.sh)"; set +a
#
# It needs the venv scripts/s3-env.sh makes (or a python with the same packages in
# LAKE_S3_PYTHON) and installs nothing itself. LAKE_S3_START_TIMEOUT (seconds, default 60) bounds
# the wait for the server to answer. LAKE_S3_FAIL_EVERY=N answers every N-th request with 503
# SlowDown and LAKE_S3_DELAY_MS=MS holds each request (faults for tests of retries);
# LAKE_S3_DENY_WRITES="BUCKET/PREFIX ..." answers writes under each with 403 AccessDenied (as S3
# answers read-only credentials); LAKE_S3_VERBOSE=1 logs every request. The port file and the log go to LAKE_S3_DIR (a test's own
# temporary directory, say), else to a new directory under $TMPDIR that is left for a look.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${LAKE_S3_VENV:-$HOME/.cache/lake/s3-venv}"
python="${LAKE_S3_PYTHON:-$venv/bin/python}"
hint="run scripts/s3-env.sh once: it installs the pinned moto from PyPI"
if [ ! -x "$python" ]; then
  echo "s3-server: no S3 server environment: $python does not exist ($hint)" >&2
  exit 1
fi
watch_pid="${LAKE_S3_WATCH_PID:-$PPID}"
timeout="${LAKE_S3_START_TIMEOUT:-60}"
if [ -n "${LAKE_S3_DIR:-}" ]; then
  dir="$LAKE_S3_DIR"
  mkdir -p "$dir"
  rm -f "$dir/port"
else
  dir="$(mktemp -d "${TMPDIR:-/tmp}/lake-s3.XXXXXX")"
fi
args=(--host 127.0.0.1 --port 0 --port-file "$dir/port" --watch-pid "$watch_pid")
for bucket in ${LAKE_S3_BUCKETS:-lake}; do
  args+=(--bucket "$bucket")
done
# Faults for tests of retries: every N-th request answered 503, every request held MS ms.
[ -n "${LAKE_S3_FAIL_EVERY:-}" ] && args+=(--fail-every "$LAKE_S3_FAIL_EVERY")
[ -n "${LAKE_S3_DELAY_MS:-}" ] && args+=(--delay-ms "$LAKE_S3_DELAY_MS")
for prefix in ${LAKE_S3_DENY_WRITES:-}; do
  args+=(--deny-writes "$prefix")
done
# Every request logged (LAKE_S3_LOG), for tests that count what a client asked.
[ "${LAKE_S3_VERBOSE:-0}" = 1 ] && args+=(--verbose)
# The server's output goes to a file, never to this script's stdout or stderr: a caller that
# reads those to their end would otherwise wait for the server to exit.
"$python" "$here/s3_server.py" "${args[@]}" </dev/null >"$dir/server.log" 2>&1 &
pid=$!
deadline=$((SECONDS + timeout))
while [ ! -s "$dir/port" ]; do
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "s3-server: the server exited before answering ($python; if moto is missing, $hint); its output:" >&2
    cat "$dir/server.log" >&2
    exit 1
  fi
  if [ "$SECONDS" -ge "$deadline" ]; then
    kill "$pid" 2>/dev/null || true
    echo "s3-server: no answer within ${timeout}s; its output:" >&2
    cat "$dir/server.log" >&2
    exit 1
  fi
  sleep 0.05
done
# s3_server.py writes the port only after its buckets were made through the S3 API: it answers.
echo "AWS_ENDPOINT_URL=http://127.0.0.1:$(cat "$dir/port")"
echo "AWS_ALLOW_HTTP=true"
echo "AWS_REGION=us-east-1"
echo "AWS_ACCESS_KEY_ID=lake"
echo "AWS_SECRET_ACCESS_KEY=lake-secret"
echo "LAKE_S3_PID=$pid"
echo "LAKE_S3_LOG=$dir/server.log"
