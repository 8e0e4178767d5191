#!/usr/bin/env python3
"""The damage probe: damaged datasets and damaged lakes, and whether lake says so without crashing.

Usage: damage_probe.py LAKE_BINARY [--sources N] [--lakes N] [--frame-tables N] [--first SEED] [--real DIR]

--sources N (default 40): N copies of the bundled samples (testdata/lerobot), each with one file
damaged: bytes flipped, zeroed or inserted, the file cut short, or a value of its JSON changed
(also a line of a v2.1 dataset's JSONL). Each is ingested into a lake holding one dataset. The
ingest must exit 0, 1 or 2 without a panic or a hang, and leave the lake byte for byte as it
was when it exits non-zero; a dataset it accepts is then cached, benched, queried and sampled,
each exiting 0, 1 or 2 without a panic. With --real DIR, the datasets of DIR (the real datasets
of ../shared/lerobot-real) are damaged too, ingested with the flags that let their gaps through.

--lakes N (default 12): N copies of a lake (two samples ingested, one cached, one with a training
proxy and image statistics, a view) with one of
its files damaged (a table's data file, manifest, transaction or version hint, a commit record,
a view): every reading command, and an ingest into it, must exit 0, 1 or 2 without a panic; then
`lake serve` on it is asked for each dataset's samples, listings and SQL over HTTP, and must
answer each (a 500 that names the damage is an answer, and so is a sample stream or SQL answer
that fails after its first batch and breaks off, when the server logs the failure), stay up and
print no panic. When the
damaged file is a commit record, a view record or belongs to a table a commit record lists,
`lake verify --every-version` must exit 1 and name it.

--frame-tables N (default 12): N copies of that lake with one file of its frame table damaged
(mostly its data file): `lake sample` of every step of the cached dataset must exit 0 without a
panic and write exactly the samples of the undamaged lake (a frame the table cannot give is
decoded from its packets, and the log says so).

Cases are numbered by seed (SEED, SEED+1, …), from which the damage follows: which file, where
and how. Files are taken in an order that leaves out what differs between runs (commit times, the
random names of Lance's files), so that a seed is the same case on every run. Exits 1 when any
case fails, listing them.
"""

import argparse
import hashlib
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from http.client import IncompleteRead
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "testdata" / "lerobot"
# The dataset the probe's lake caches, and its steps.
CACHED, CACHED_STEPS = "v30-h264-multifile", 300
FIXTURES = ["v30-bframes", "v30-images-jpeg", "v30-h264-multifile", "v30-images-tiny"]
# The real datasets' gaps (videos left out of their snapshots), and the flags that ingest the rest.
REAL_FLAGS = {
    "g1-pick-bottle-v21": ["--skip-bad-episodes"],
    "lingzu-open50-v30": ["--skip-bad-episodes"],
    "reachy2-apple-storage-v30": ["--missing-video", "keep-rows"],
    "so101-record-test-v30": ["--drop-missing-cameras"],
}
EXITS = {0, 1, 2}
# A panic printed by Rust's hook (an error that quotes one is not).
PANIC = re.compile(r"thread '[^']*' \(\d+\) panicked at|thread '[^']*' panicked at")
ODD_VALUES = [0, -1, 1, 2**31, 2**63 - 1, -(2**63), 2**64, 1e308, -1e308, 0.5, "x", "", None, [], {},
              [0], [-1], [2**40], [1, 2, 3, 4, 5, 6, 7, 8], True, "NaN", 1e-300]


def run(lake, args, timeout=180):
    """(exit code or "hang", stderr) of one lake command."""
    try:
        done = subprocess.run([lake] + args, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "RUST_BACKTRACE": "0"})
        return done.returncode, done.stderr
    except subprocess.TimeoutExpired:
        return "hang", ""


def tree(root):
    out = []
    for d, _, files in sorted(os.walk(root)):
        for f in sorted(files):
            p = os.path.join(d, f)
            out.append((os.path.relpath(p, root), hashlib.sha1(Path(p).read_bytes()).hexdigest()))
    return out


def damage_bytes(rng, data):
    b = bytearray(data)
    n = max(len(b), 1)
    kind = rng.choice(["flip", "zero", "ff", "cut", "repeat", "flip-tail", "flip-head", "insert"])
    if kind == "flip":
        for _ in range(rng.randint(1, 16)):
            i = rng.randrange(n)
            if i < len(b):
                b[i] ^= 1 << rng.randrange(8)
    elif kind in ("zero", "ff"):
        i, k = rng.randrange(n), rng.randint(1, 64)
        b[i:i + k] = bytes([0 if kind == "zero" else 0xFF]) * len(b[i:i + k])
    elif kind == "cut":
        b = b[:rng.randrange(n)]
    elif kind == "repeat":
        i, k, j = rng.randrange(n), rng.randint(1, 256), rng.randrange(n)
        b[j:j] = b[i:i + k]
    elif kind in ("flip-tail", "flip-head"):  # a parquet or Lance footer, an mp4's moov
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(min(n, 4096))
            i = i if kind == "flip-head" else n - 1 - i
            if 0 <= i < len(b):
                b[i] = rng.randrange(256)
    else:
        i = rng.randrange(n)
        b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 32)))
    return bytes(b), kind


def damage_json(rng, value):
    paths = []

    def walk(v, path):
        paths.append(path)
        items = v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, list) else ()
        for k, child in items:
            walk(child, path + [k])

    walk(value, [])
    if len(paths) < 2:
        return None, ""
    path = rng.choice(paths[1:])
    parent = value
    for k in path[:-1]:
        parent = parent[k]
    if rng.random() < 0.25 and isinstance(parent, dict):
        del parent[path[-1]]
        return value, "del " + "/".join(map(str, path))
    parent[path[-1]] = rng.choice(ODD_VALUES)
    return value, "set " + "/".join(map(str, path))


def damage_file(rng, path):
    """Damages the file at `path`; says how."""
    data = path.read_bytes()
    what = None
    try:
        if path.suffix == ".json" and rng.random() < 0.7:
            value, what = damage_json(rng, json.loads(data))
            data = json.dumps(value).encode() if value is not None else data
        elif path.suffix == ".jsonl" and rng.random() < 0.7:
            lines = data.decode().splitlines()
            k = rng.randrange(len(lines))
            value, what = damage_json(rng, json.loads(lines[k]))
            lines[k] = json.dumps(value) if value is not None else lines[k]
            data, what = ("\n".join(lines) + "\n").encode(), f"line {k + 1}: {what}"
    except (ValueError, UnicodeDecodeError):
        what = None
    if not what:
        data, what = damage_bytes(rng, data)
    path.write_bytes(data)
    return what


def check(lake, root, args, failures, label):
    code, err = run(lake, ["--lake", str(root)] + args)
    if code not in EXITS or PANIC.search(err):
        failures.append(f"{label}: `lake {' '.join(args[:3])}` exited {code}: {err.strip()[-800:]}")
    return code


def source_case(lake, seed, work, base, real):
    rng = random.Random(seed)
    choices = [(SAMPLES / f, []) for f in FIXTURES] + [(real / n, flags) for n, flags in REAL_FLAGS.items() if real]
    source, flags = rng.choice(choices)
    src = work / source.name
    shutil.copytree(source, src)
    files = sorted(p for p in src.rglob("*") if p.is_file())
    # A v2.1 dataset's data files of episodes without videos are skipped anyway: damage the others.
    kept = [p for p in files if not (m := re.search(r"episode_0*(\d+)\.parquet$", p.name)) or int(m.group(1) or 0) < 6]
    target = rng.choice(kept)
    label = f"seed {seed}: {source.name}/{target.relative_to(src)} {damage_file(rng, target)}"
    root = work / "lake"
    shutil.copytree(base, root)
    before = tree(root)
    failures = []
    code = check(lake, root, ["ingest", str(src)] + flags, failures, label)
    if code in (1, 2) and tree(root) != before:
        failures.append(f"{label}: the refused ingest changed the lake")
    if code == 0:
        name = source.name
        for args in (["cache", name], ["bench", "--dataset", name, "--batches", "4", "--preset", "none"],
                     ["bench", "--dataset", name, "--batches", "4", "--preset", "act"],
                     ["sql", f'SELECT * FROM "{name}".steps'],
                     ["sample", name, "--indices", "0,1,2", "--preset", "none", "--out", str(work / "s.arrow")]):
            check(lake, root, args, failures, label)
    return label, code, failures


def base_lake(lake, root):
    for args in (["ingest", str(SAMPLES / "v30-h264-multifile")], ["ingest", str(SAMPLES / "v30-images-jpeg")],
                 ["cache", CACHED],
                 ["cache", "v30-h264-multifile", "--proxy", "h264"],
                 ["stats", "v30-h264-multifile", "--images"],
                 ["view", "create", "some", "SELECT dataset, episode_index FROM episodes "
                  "WHERE dataset = 'v30-h264-multifile' AND episode_index < 3"]):
        code, err = run(lake, ["--lake", str(root)] + args)
        if code != 0:
            sys.exit(f"making the probe's lake failed: lake {' '.join(args)}: {err}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# What `http` answers for a 200 whose body ended before its end: how the server ends a stream
# that fails after its first batch (the status went with it) for a client that takes no trailers.
BROKEN_OFF = "broken off"
# The log's line for an answer that failed after its first batch, by path.
FAILED_LATE = {"/v1/sample": re.compile(r"lake::access: stream .*; failed: "),
               "/v1/sql": re.compile(r"SQL query failed while streaming its result: ")}


def http(base, method, path, body=None):
    """The status of one request, BROKEN_OFF, or why there was no answer."""
    data = body.encode() if body is not None else None
    r = urllib.request.Request(base + path, data=data, method=method)
    if data is not None and path != "/v1/sql":
        r.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(r, timeout=60) as answer:
            try:
                answer.read()
            except IncompleteRead:
                return BROKEN_OFF
            return answer.status
    except urllib.error.HTTPError as e:
        return e.code
    except Exception as e:  # noqa: BLE001 (no answer at all is what is counted)
        return f"no answer ({e})"


def serve_case(lake, root, work, failures, label):
    """`lake serve` on the damaged lake: every request answered, the server up, no panic."""
    port = free_port()
    log_path = work / "serve.log"
    with open(log_path, "w") as log:
        server = subprocess.Popen([lake, "--lake", str(root), "serve", "--http", f"127.0.0.1:{port}",
                                   "--flight", f"127.0.0.1:{free_port()}"], stdout=log, stderr=subprocess.STDOUT,
                                  env={**os.environ, "RUST_BACKTRACE": "0"})
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            if server.poll() is not None or http(base, "GET", "/healthz") == 200:
                break
            time.sleep(0.1)
        if server.poll() is not None:
            # A lake the server cannot open at all is refused at the start, with the reason.
            if server.returncode not in EXITS:
                failures.append(f"{label}: `lake serve` exited {server.returncode}: {log_path.read_text()[-800:]}")
            return
        requests = [("GET", "/v1/datasets", None), ("POST", "/v1/sql", "SELECT dataset, count(*) FROM steps GROUP BY 1")]
        for name in ["v30-h264-multifile", "v30-images-jpeg", "some"]:
            requests += [("GET", f"/v1/datasets/{name}", None), ("GET", f"/v1/datasets/{name}/episodes", None),
                         ("POST", "/v1/sample", json.dumps({"datasets": [name], "preset": "act", "batch_size": 4,
                                                             "limit_batches": 3}))]
        broken = {path: 0 for path in FAILED_LATE}
        for method, path, body in requests:
            status = http(base, method, path, body)
            if status == BROKEN_OFF and path in FAILED_LATE:
                broken[path] += 1
            elif not isinstance(status, int):
                failures.append(f"{label}: server, {method} {path}: {status}")
        if server.poll() is not None or http(base, "GET", "/healthz") != 200:
            failures.append(f"{label}: the server is down after the requests: {log_path.read_text()[-800:]}")
    finally:
        server.terminate()
        server.wait(30)
    log = log_path.read_text()
    if PANIC.search(log):
        failures.append(f"{label}: the server printed a panic: {log[-800:]}")
    # An answer that broke off is one that failed, with its reason in the log.
    for path, count in broken.items():
        logged = len(FAILED_LATE[path].findall(log))
        if count > logged:
            failures.append(f"{label}: {count} answers of {path} broke off, {logged} logged as failed: {log[-800:]}")


def same_json(a, b):
    """Whether `a` and `b` are the same JSON value."""
    try:
        return json.loads(a) == json.loads(b)
    except ValueError:
        return False


def committed_file(root, target):
    """Whether `target` is a commit record, a view record, or a file of a table that a commit
    record of the lake at `root` lists: what `lake verify` checks."""
    parts = target.relative_to(root).parts
    if parts[0] in ("catalog", "views"):
        return True
    if len(parts) < 5 or parts[0] != "datasets" or not parts[3].endswith(".lance"):
        return False
    for path in (root / "catalog").rglob("*.json"):
        try:
            tables = json.loads(path.read_text()).get("tables", {})
        except (ValueError, AttributeError):
            continue
        if tables.get("dir") == "/".join(parts[:3]) and parts[3][:-len(".lance")] in tables.get("tables", []):
            return True
    return False


def verify_case(lake, root, target, failures, label):
    """`lake verify` on the damaged lake: exit 0, 1 or 2 without a panic; 1, naming the file, when
    `target` (the damaged file; None when the damage left it as it was) is a commit record or in a
    committed table."""
    try:
        done = subprocess.run([lake, "--lake", str(root), "verify", "--every-version"], capture_output=True, text=True,
                              timeout=180, env={**os.environ, "RUST_BACKTRACE": "0"})
    except subprocess.TimeoutExpired:
        failures.append(f"{label}: `lake verify` hung")
        return "hang"
    if done.returncode not in EXITS or PANIC.search(done.stderr):
        failures.append(f"{label}: `lake verify` exited {done.returncode}: {done.stderr.strip()[-800:]}")
    elif target is not None and committed_file(root, target):
        named = str(target.relative_to(root)) in done.stdout
        if done.returncode != 1 or not named:
            failures.append(f"{label}: `lake verify` exited {done.returncode} and "
                            f"{'named' if named else 'did not name'} the damaged file: {done.stdout.strip()[-800:]}")
    return done.returncode


# The parts of a lake's file names that differ from one run to the next: a dataset version's
# directory (its commit time and id), and the random names Lance gives data and transaction files.
RUN_NAMES = re.compile(r"\d{8}T\d{6}-[0-9a-f]{12}|[0-9a-f-]{16,}")


def lake_files(root, keep=lambda p: True):
    """The files under `root` that `keep` keeps, in an order that is the same on every run: by
    their paths without the parts that differ between runs, then by size, so that a seed is the
    same case each time."""
    files = [p for p in root.rglob("*") if p.is_file() and keep(p)]
    return sorted(files, key=lambda p: (RUN_NAMES.sub("*", str(p.relative_to(root))), p.stat().st_size, str(p)))


def lake_case(lake, seed, work, base):
    rng = random.Random(seed)
    root = work / "lake"
    shutil.copytree(base, root)
    target = rng.choice(lake_files(root))
    original = target.read_bytes()
    label = f"seed {seed}: {target.relative_to(root)} {damage_file(rng, target)}"
    # (Damage can leave a file as it was: a byte set to the value it had, or only a JSON file's
    # white space changed.)
    changed = target.read_bytes() != original and not same_json(target.read_bytes(), original)
    failures = []
    codes = [verify_case(lake, root, target if changed else None, failures, label)]
    codes += [check(lake, root, args, failures, label) for args in (
        ["ls"], ["inspect", "v30-h264-multifile"], ["inspect", "v30-images-jpeg"],
        ["sql", "SELECT count(*), sum(index) FROM steps"], ["sql", "SELECT * FROM packets"],
        ["sql", "SELECT * FROM feature_stats"], ["stats", "v30-h264-multifile"],
        ["bench", "--dataset", "v30-h264-multifile", "--batches", "3", "--preset", "act"],
        ["bench", "--dataset", "some", "--batches", "3", "--preset", "act"],
        ["bench", "--dataset", "v30-images-jpeg", "--batches", "3", "--preset", "act"],
        ["export", "some", "--format", "lerobot-v3", str(work / "out")])]
    serve_case(lake, root, work, failures, label)
    codes.append(check(lake, root, ["ingest", str(SAMPLES / "v30-images-tiny")], failures, label))
    return label, codes, failures


# What `lake sample` logs when frames its frame table was to give are decoded from packets.
DECODED_INSTEAD = "are decoded from their packets instead"


def sample_every_step(lake, root, out):
    """(exit code, stderr) of `lake sample` of every step of the cached dataset into `out`."""
    return run(lake, ["--lake", str(root), "sample", CACHED, "--indices", ",".join(map(str, range(CACHED_STEPS))),
                      "--preset", "act", "--out", str(out)])


def frame_table_case(lake, seed, work, base, expected):
    rng = random.Random(seed)
    root = work / "lake"
    shutil.copytree(base, root)
    files = lake_files(root, lambda p: "frames.lance" in p.parts)
    # The data file holds the frames: most cases damage it, the rest the table's other files.
    data = [p for p in files if p.parent.name == "data"]
    target = rng.choice(data if rng.random() < 0.75 else files)
    label = f"seed {seed}: {target.relative_to(root)} {damage_file(rng, target)}"
    out = work / "samples.arrow"
    code, err = sample_every_step(lake, root, out)
    failures = []
    if code != 0 or PANIC.search(err):
        failures.append(f"{label}: `lake sample` exited {code}: {err.strip()[-800:]}")
    elif out.read_bytes() != expected:
        failures.append(f"{label}: `lake sample` exited 0 with samples other than the undamaged lake's")
    return label, DECODED_INSTEAD in err, failures


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("lake")
    ap.add_argument("--sources", type=int, default=40)
    ap.add_argument("--lakes", type=int, default=12)
    ap.add_argument("--frame-tables", type=int, default=12)
    ap.add_argument("--first", type=int, default=1)
    ap.add_argument("--real", type=Path)
    args = ap.parse_args()
    lake = str(Path(args.lake).resolve())
    failures, tally = [], {}
    with tempfile.TemporaryDirectory(prefix="lake-damage-") as tmp:
        tmp = Path(tmp)
        source_base, lake_base = tmp / "source-base", tmp / "lake-base"
        code, err = run(lake, ["--lake", str(source_base), "ingest", str(SAMPLES / "v30-images-tiny")])
        if code != 0:
            sys.exit(f"making the probe's lake failed: {err}")
        if args.lakes or args.frame_tables:
            base_lake(lake, lake_base)
        expected = None
        if args.frame_tables:
            code, err = sample_every_step(lake, lake_base, tmp / "expected.arrow")
            if code != 0:
                sys.exit(f"sampling the probe's lake failed: {err}")
            expected = (tmp / "expected.arrow").read_bytes()
        cases = [("source", s) for s in range(args.first, args.first + args.sources)]
        cases += [("lake", s) for s in range(args.first, args.first + args.lakes)]
        cases += [("frame table", s) for s in range(args.first, args.first + args.frame_tables)]
        for kind, seed in cases:
            work = Path(tempfile.mkdtemp(dir=tmp))
            if kind == "source":
                label, code, failed = source_case(lake, seed, work, source_base, args.real)
                tally[f"ingest exit {code}"] = tally.get(f"ingest exit {code}", 0) + 1
            elif kind == "frame table":
                label, decoded, failed = frame_table_case(lake, seed, work, lake_base, expected)
                key = "damaged frame table, frames " + ("decoded instead" if decoded else "read from it")
                tally[key] = tally.get(key, 0) + 1
            else:
                label, codes, failed = lake_case(lake, seed, work, lake_base)
                key = "damaged lake, " + ("every command exit 0" if set(codes) == {0} else "some command refused")
                tally[key] = tally.get(key, 0) + 1
            print(("FAIL " if failed else "ok   ") + f"{kind} {label}", flush=True)
            failures += failed
            shutil.rmtree(work, ignore_errors=True)
    print(f"{args.sources} damaged sources, {args.lakes} damaged lakes, {args.frame_tables} damaged frame tables: "
          + ", ".join(f"{k}: {v}" for k, v in sorted(tally.items())))
    if failures:
        print(f"failures ({len(failures)}):\n" + "\n".join(failures))
        sys.exit(1)
    print("failures: none")


if __name__ == "__main__":
    main()
