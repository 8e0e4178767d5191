#!/usr/bin/env bash
# Creates (once) the Python environment lake's tests use for the Python client:
# ~/.cache/lake/py-venv (or $LAKE_PY_VENV) with pyarrow and numpy from PyPI, setuptools and build
# to build the client's wheel without reaching PyPI (its test does), and pylance, duckdb and polars
# for clients/python/tests/test_engines.py (a lake's tables read by other engines), and selenium for
# clients/python/tests/test_web.py (the web app in Chromium), and tensorboard for
# clients/python/tests/test_tensorboard.py (`lake train`'s event files). pylance stays at
# the release of the Rust lance crate in Cargo.lock: a reader older than the writer may fail to
# decode its tables. Prints its python.
# Safe to run again: it only installs when the pinned versions are missing.
set -euo pipefail
venv="${LAKE_PY_VENV:-$HOME/.cache/lake/py-venv}"
want="pyarrow==21.0.0 numpy==2.2.6 setuptools==84.2.1 build==1.6.1 pylance==14.0.2 duckdb==2.0.1 polars==2.1.0 selenium==4.51.0 tensorboard==2.21.0"
if [ ! -x "$venv/bin/python" ]; then
  command -v python3 >/dev/null || { echo "python-env: python3 not found (apt install python3 python3-venv)" >&2; exit 1; }
  python3 -m venv "$venv" >&2
fi
if [ "$(cat "$venv/.lake-pins" 2>/dev/null)" != "$want" ]; then
  "$venv/bin/python" -m pip install --quiet $want >&2
  echo "$want" > "$venv/.lake-pins"
fi
echo "$venv/bin/python"
