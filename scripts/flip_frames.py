#!/usr/bin/env python3
"""Flips one byte inside the payload of random video frames of a LeRobot dataset and reports what
lake makes of each copy: refused at ingest (with --verify), or ingested, then every step sampled
and compared with the samples of the untouched dataset: failed clearly, equal, or different
(silently wrong pixels: the count that must stay 0).

Usage: scripts/flip_frames.py LAKE_BINARY DATASET_DIR CAMERA_FILE [--trials N] [--seed S] [--verify]

CAMERA_FILE is the mp4 to damage, relative to DATASET_DIR. Needs ffprobe (Debian's ffmpeg) and
pyarrow (scripts/python-env.sh)."""
import argparse, json, random, shutil, subprocess, sys, tempfile
from pathlib import Path

import pyarrow as pa


def run(*args, **kw):
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, **kw)


def frames(path):
    out = run("ffprobe", "-v", "error", "-select_streams", "v:0", "-show_entries", "packet=pos,size", "-of", "json", path)
    return [(int(p["pos"]), int(p["size"])) for p in json.loads(out.stdout)["packets"]]


def samples(lake, root, name, indices, out):
    r = run(lake, "--lake", root, "sample", "--dataset", name, "--indices", ",".join(map(str, indices)), "--out", out)
    if r.returncode != 0:
        return None, r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}"
    with pa.ipc.open_file(out) as f:
        return f.read_all(), None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("lake"); ap.add_argument("dataset"); ap.add_argument("camera_file")
    ap.add_argument("--trials", type=int, default=20); ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--verify", action="store_true", help="ingest with --verify")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    work = Path(tempfile.mkdtemp(prefix="flip-"))
    try:
        good = work / "good"
        if run(a.lake, "--lake", good, "ingest", a.dataset, "--name", "d").returncode != 0:
            sys.exit("the untouched dataset does not ingest")
        n = int(json.loads(run(a.lake, "--lake", good, "sql", "--format", "json", "SELECT count(*) AS n FROM steps").stdout)[0]["n"])
        indices = list(range(n))
        want, err = samples(a.lake, good, "d", indices, work / "good.arrow")
        if err:
            sys.exit(f"sampling the untouched dataset failed: {err}")
        counts = {"refused at ingest": 0, "samples failed clearly": 0, "steps equal": 0, "steps different": 0}
        packets = frames(Path(a.dataset) / a.camera_file)
        for trial in range(a.trials):
            src = work / f"src{trial}"
            shutil.copytree(a.dataset, src)
            pos, size = rng.choice([p for p in packets if p[1] > 16])
            offset = pos + rng.randrange(8, size)  # past the NAL length and header
            target = src / a.camera_file
            data = bytearray(target.read_bytes())
            data[offset] ^= 1 << rng.randrange(8)
            target.write_bytes(data)
            root = work / f"lake{trial}"
            args = [a.lake, "--lake", root, "ingest", src, "--name", "d"] + (["--verify"] if a.verify else [])
            r = run(*args)
            if r.returncode != 0:
                counts["refused at ingest"] += 1
                print(f"trial {trial}: byte {offset}: refused: {r.stderr.strip().splitlines()[1][:160]}")
            else:
                equal = different = failed = 0
                for i in indices:
                    got, err = samples(a.lake, root, "d", [i], work / "got.arrow")
                    if err:
                        failed += 1
                    elif got.equals(want.slice(i, 1)):
                        equal += 1
                    else:
                        different += 1
                counts["samples failed clearly"] += failed
                counts["steps equal"] += equal
                counts["steps different"] += different
                print(f"trial {trial}: byte {offset}: ingested; {failed} steps failed, {equal} equal, {different} different")
            shutil.rmtree(src); shutil.rmtree(root, ignore_errors=True)
        print(json.dumps(counts))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
