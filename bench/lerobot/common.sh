# Sourced by bench/compare_lerobot.sh and bench/compare_train.sh: the pinned LeRobot venv and
# the LeRobot-written fixture both scripts time on, made once and reused.
#
# Reads: py_dir (this directory), venv, python, bench_dir, frames, seed, and log (a function);
# for the newer peers also shared_tools (the directory of the shared benchmark tools), venv061
# and lance_venv.
# Sets: vpy (the venv's python) and fixture (the dataset's directory); vpy061, vpy_lance and
# lance_root (the fixture converted to Lance) for the newer peers.

# The pins of the LeRobot + Lance venv (lancedb as lerobot-lancedb's README installs it, from
# PyPI). Changing them makes a new venv and a new Lance copy of the fixture.
lancedb_pins=(lerobot-lancedb==0.3.1 lancedb==0.40.0)

# Exits with a message naming the first of the shared tools ($shared_tools/NAME...) not there.
require_shared_tools() {
  local name
  for name in "$@"; do
    if [ ! -f "$shared_tools/$name" ]; then
      echo "missing $shared_tools/$name: the shared benchmark tools are not there (set LAKE_SHARED_TOOLS" \
        "to their directory, or time only LeRobot 0.4.4 and lake with --peers lerobot)" >&2
      exit 2
    fi
  done
}

# The LeRobot venv with bench/lerobot/requirements.txt; reinstalled only when that file changes
# (a stamp file in the venv holds its hash).
lerobot_venv() {
  local req="$py_dir/requirements.txt" want stamp
  want="$(sha256sum "$req" | cut -d' ' -f1)"
  stamp="$venv/.lake-requirements.sha256"
  if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    log "installing $req into $venv (about 8 GB: PyPI's torch brings CUDA libraries)"
    [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
    "$venv/bin/pip" install --quiet -r "$req"
    echo "$want" >"$stamp"
  fi
  vpy="$venv/bin/python"
}

# LeRobot 0.6.1 in a Python 3.11 venv layered over the LeRobot venv above (its torch, torchcodec,
# av, ... are reused through a .pth file, not copied), made by the shared installer
# install-lerobot-0.6.1.sh; made again only when the installer, the base venv or its requirements
# change (a stamp file in the venv holds their hash). Call after lerobot_venv.
lerobot061_venv() {
  local installer="$shared_tools/install-lerobot-0.6.1.sh" want stamp began
  want="$({ sha256sum <"$installer"; echo "$venv"; sha256sum <"$py_dir/requirements.txt"; } | sha256sum | cut -d' ' -f1)"
  stamp="$venv061/.lake-install.sha256"
  if [ ! -x "$venv061/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    log "installing LeRobot 0.6.1 into $venv061 over $venv (once; about 90 MB of its own)"
    mkdir -p "$(dirname "$venv061")"
    began=$SECONDS
    if ! nice -n 10 bash "$installer" "$venv061" "$venv" >"${venv061%/}.install.log" 2>&1; then
      tail -30 "${venv061%/}.install.log" >&2
      echo "installing LeRobot 0.6.1 failed; the whole log: ${venv061%/}.install.log" >&2
      exit 1
    fi
    echo "$want" >"$stamp"
    log "LeRobot 0.6.1 installed (wall $((SECONDS - began)) s)"
  fi
  vpy061="$venv061/bin/python"
}

# LeRobot + Lance: lerobot-lancedb and lancedb (pinned above) in a venv layered over the LeRobot
# 0.6.1 venv the way install-lerobot-0.6.1.sh layers that one over the LeRobot venv (a .pth file
# adds its site-packages after the venv's own, whose .pth adds the LeRobot venv's in turn; pip is
# that venv's); made again only when the pins or the 0.6.1 venv change. Call after lerobot061_venv.
lancedb_venv() {
  local want stamp sp base_sp began log_file="${lance_venv%/}.install.log"
  want="$({ printf '%s\n' "${lancedb_pins[@]}"; echo "$venv061"; cat "$venv061/.lake-install.sha256"; } | sha256sum | cut -d' ' -f1)"
  stamp="$lance_venv/.lake-install.sha256"
  vpy_lance="$lance_venv/bin/python"
  if [ ! -x "$vpy_lance" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    log "installing ${lancedb_pins[*]} into $lance_venv over $venv061 (once)"
    began=$SECONDS
    mkdir -p "$(dirname "$lance_venv")"
    if [ ! -f "$lance_venv/pyvenv.cfg" ]; then
      "$("$venv061/bin/python" -c 'import sys; print(sys._base_executable)')" -m venv --without-pip "$lance_venv"
    fi
    sp="$("$vpy_lance" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    base_sp="$("$venv061/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    "$venv061/bin/python" -c 'import sys; print("import site; site.addsitedir(%r)" % sys.argv[1])' "$base_sp" >"$sp/_lake_base_venv.pth"
    # PYTHONDONTWRITEBYTECODE: pip runs from the base venvs; write nothing next to their sources.
    if ! PYTHONDONTWRITEBYTECODE=1 PIP_DISABLE_PIP_VERSION_CHECK=1 nice -n 10 \
      "$vpy_lance" -m pip install --no-compile "${lancedb_pins[@]}" >"$log_file" 2>&1 ||
      ! "$vpy_lance" -c 'import lerobot, lerobot_lancedb, lancedb, sys
assert lerobot.__version__ == "0.6.1", lerobot.__version__
assert lerobot_lancedb.__file__.startswith(sys.argv[1]), lerobot_lancedb.__file__
print("lerobot", lerobot.__version__, "lancedb", lancedb.__version__)' "$sp" >>"$log_file" 2>&1; then
      tail -30 "$log_file" >&2
      echo "installing ${lancedb_pins[*]} failed; the whole log: $log_file" >&2
      exit 1
    fi
    echo "$want" >"$stamp"
    log "LeRobot + Lance installed (wall $((SECONDS - began)) s)"
  fi
}

# The fixture, written once by LeRobot's writer (cached by frame count, seed and the generator).
lerobot_fixture() {
  export HF_HUB_OFFLINE=1 HF_HOME="$bench_dir/hf"
  local gen_id began
  gen_id="$(cat "$py_dir/make_fixture.py" "$py_dir/requirements.txt" | sha256sum | cut -c1-10)"
  # fixture_wrist (HxW), when set, sizes the wrist camera (96x128 otherwise).
  fixture="$bench_dir/fixtures/lerobot-av1-${frames}f-seed${seed}${fixture_wrist:+-wrist$fixture_wrist}-${gen_id}"
  if [ ! -f "$fixture.done" ]; then
    rm -rf "$fixture"
    mkdir -p "$(dirname "$fixture")"
    log "writing a $frames-frame LeRobot v3.0 dataset with LeRobot's writer (once): $fixture"
    began=$SECONDS
    if ! nice -n 10 "$vpy" "$py_dir/make_fixture.py" --out "$fixture" --frames "$frames" --seed "$seed" \
      ${fixture_wrist:+--wrist-size "$fixture_wrist"} >"$fixture.log" 2>&1; then
      tail -30 "$fixture.log" >&2
      exit 1
    fi
    log "$(tail -1 "$fixture.log") (wall $((SECONDS - began)) s)"
    touch "$fixture.done"
  fi
}

# The fixture converted to Lance by lerobot-lance-convert (once, next to the fixture; keyed by
# the fixture and the lancedb pins). The .done file holds the conversion's wall seconds.
lance_fixture() {
  local began
  lance_root="$fixture-lance-$(printf '%s\n' "${lancedb_pins[@]}" | sha256sum | cut -c1-10)"
  if [ ! -f "$lance_root.done" ]; then
    rm -rf "$lance_root"
    log "converting the fixture to Lance with lerobot-lance-convert (once): $lance_root"
    began="$EPOCHREALTIME"
    if ! HF_HUB_OFFLINE=1 HF_HOME="$bench_dir/hf" nice -n 10 "$lance_venv/bin/lerobot-lance-convert" \
      --root "$fixture" --out "$lance_root" >"$lance_root.log" 2>&1; then
      tail -30 "$lance_root.log" >&2
      exit 1
    fi
    awk "BEGIN { print $EPOCHREALTIME - $began }" >"$lance_root.done"
    log "converted in $(cut -d. -f1 "$lance_root.done") s"
  fi
}
