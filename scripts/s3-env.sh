#!/usr/bin/env bash
# Creates (once) the Python environment of the S3-compatible server lake's object-store tests run
# against (scripts/s3-server.sh): ~/.cache/lake/s3-venv (or $LAKE_S3_VENV) with moto's S3 and the
# Flask app its server mode serves, every package pinned (docs/decisions/0025-s3-test-server.md).
# Prints its python. Safe to run again: it only installs when the pinned versions are missing.
set -euo pipefail
venv="${LAKE_S3_VENV:-$HOME/.cache/lake/s3-venv}"
# moto[s3] and flask, flask-cors (what moto[server] adds for S3), and what they pull, pinned.
want="moto[s3]==5.2.5 flask==3.1.3 flask-cors==6.0.5 werkzeug==3.1.9 boto3==1.44.8 botocore==1.44.8 \
s3transfer==0.19.3 jmespath==1.1.0 python-dateutil==2.9.0.post0 six==1.17.0 urllib3==2.8.0 \
requests==2.34.2 certifi==2026.10.19.post1 charset-normalizer==3.5.3 idna==3.20 responses==0.26.3 \
xmltodict==1.0.4 cryptography==50.0.2 cffi==2.1.1 pycparser==3.12 PyYAML==6.0.4 \
py-partiql-parser==0.6.3 Jinja2==3.1.6 MarkupSafe==3.0.4 itsdangerous==2.2.0 click==8.5.1 blinker==1.9.0"
if [ ! -x "$venv/bin/python" ]; then
  command -v python3 >/dev/null || { echo "s3-env: python3 not found (apt install python3 python3-venv)" >&2; exit 1; }
  python3 -m venv "$venv" >&2
fi
if [ "$(cat "$venv/.lake-pins" 2>/dev/null)" != "$want" ]; then
  read -ra pins <<< "$want"
  "$venv/bin/python" -m pip install --quiet "${pins[@]}" >&2
  echo "$want" > "$venv/.lake-pins"
fi
echo "$venv/bin/python"
