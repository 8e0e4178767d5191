# Sourced by bench/compare_lerobot.sh and bench/compare_train.sh: the pinned LeRobot venv and
# the LeRobot-written fixture both scripts time on, made once and reused.
#
# Reads: py_dir (this directory), venv, python, bench_dir, frames, seed, and log (a function).
# Sets: vpy (the venv's python) and fixture (the dataset's directory).

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

# The fixture, written once by LeRobot's writer (cached by frame count, seed and the generator).
lerobot_fixture() {
  export HF_HUB_OFFLINE=1 HF_HOME="$bench_dir/hf"
  local gen_id began
  gen_id="$(cat "$py_dir/make_fixture.py" "$py_dir/requirements.txt" | sha256sum | cut -c1-10)"
  fixture="$bench_dir/fixtures/lerobot-av1-${frames}f-seed${seed}-${gen_id}"
  if [ ! -f "$fixture.done" ]; then
    rm -rf "$fixture"
    mkdir -p "$(dirname "$fixture")"
    log "writing a $frames-frame LeRobot v3.0 dataset with LeRobot's writer (once): $fixture"
    began=$SECONDS
    if ! nice -n 10 "$vpy" "$py_dir/make_fixture.py" --out "$fixture" --frames "$frames" --seed "$seed" >"$fixture.log" 2>&1; then
      tail -30 "$fixture.log" >&2
      exit 1
    fi
    log "$(tail -1 "$fixture.log") (wall $((SECONDS - began)) s)"
    touch "$fixture.done"
  fi
}
