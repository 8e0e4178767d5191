"""Print the side-by-side table of bench/compare_lerobot.sh from the JSON each run wrote.

Reads LeRobot's report (``run_lerobot.py``), optionally those of the shared tools for LeRobot
0.6.1 (``bench-lerobot-loader.py``) and LeRobot + Lance (``bench-lancedb-loader.py``), and up
to five ``lake bench --json`` reports (frames decoded from packets with the in-memory cache off,
as RGB and as YUV planes, and on; packets sent for the consumer to decode; and frames read from
the stored frame table), prints one
table, and optionally writes everything as one JSON object. Every ratio is to the first
LeRobot report. Standard library only.

Usage::

    python report.py --lerobot L.json [--lerobot061 N.json] [--lancedb D.json] [--lance-convert V.json]
        --lake-cold A.json [--lake-cold-yuv Y.json] [--lake-packets P.json] [--lake-cache B.json]
        [--lake-frame-table C.json] [--skipped 'row: reason'] [--title TEXT] [--json-out OUT.json]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path


def load(path: Path | None) -> dict | None:
    return json.loads(path.read_text()) if path else None


def num(r: dict | None, key: str) -> float:
    v = (r or {}).get(key)
    return float(v) if isinstance(v, (int, float)) else math.nan


def samples_per_cpu_s(r: dict) -> float:
    v = num(r, "samples_per_cpu_s")
    return v if not math.isnan(v) else 1e3 / num(r, "cpu_ms_per_sample")


def shared_tool_report(r: dict) -> dict:
    """A report of bench-lerobot-loader.py or bench-lancedb-loader.py, with the table's keys added."""
    out = dict(r)
    rss = r.get("peak_rss_sum_bytes")
    if isinstance(rss, (int, float)):
        out["peak_rss_mb"] = rss / 2**20  # as run_lerobot.py's: MiB summed over the processes
    out["num_workers"] = r.get("settings", {}).get("num_workers")
    return out


def fmt(v: float, spec: str, width: int) -> str:
    return f"{'-':>{width}}" if math.isnan(v) else f"{v:>{width}{spec}}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lerobot", type=Path, required=True)
    ap.add_argument("--lerobot061", type=Path, help="bench-lerobot-loader.py's report (LeRobot 0.6.1)")
    ap.add_argument("--lancedb", type=Path, help="bench-lancedb-loader.py's report (LeRobot + Lance)")
    ap.add_argument("--lance-convert", type=Path, help="JSON with lance_root and the seconds lerobot-lance-convert took")
    ap.add_argument("--lake-cold", type=Path, required=True)
    ap.add_argument("--lake-cold-yuv", type=Path, help="the cold path with frames as YUV planes")
    ap.add_argument("--lake-packets", type=Path, help="packets sent for the consumer to decode (frame_format packets)")
    ap.add_argument("--lake-cache", type=Path)
    ap.add_argument("--lake-frame-table", type=Path)
    ap.add_argument("--frame-table-build", type=Path, help="JSON with seconds and the output of `lake cache`")
    ap.add_argument("--skipped", action="append", default=[], help="'row: reason' for a row not run")
    ap.add_argument("--title", default="")
    ap.add_argument("--meta", type=Path, help="JSON object of run settings to include in --json-out")
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args()

    lr = load(args.lerobot)
    lr_ver = lr.get("versions", {}).get("lerobot", "?")
    rows = [(f"LeRobot {lr_ver} ({lr['num_workers']} workers)", "lerobot", lr)]
    peers = []
    if args.lerobot061:
        r = shared_tool_report(load(args.lerobot061))
        ver = r.get("versions", {}).get("lerobot") or r.get("lerobot_version", "?")
        peers.append((f"LeRobot {ver} ({r['num_workers']} workers)", "lerobot061", r))
    if args.lancedb:
        r = shared_tool_report(load(args.lancedb))
        ver = r.get("versions", {}).get("lerobot", "?")
        peers.append((f"LeRobot {ver} + Lance ({r['num_workers']} workers)", "lerobot_lancedb", r))
    rows += peers
    first_lake = len(rows)
    for label, key, path in (
        ("lake, cold (packets)", "lake_cold", args.lake_cold),
        ("lake, cold, YUV planes", "lake_cold_yuv", args.lake_cold_yuv),
        ("lake, packets (server side)", "lake_packets", args.lake_packets),
        ("lake, cache on (ahead)", "lake_cache_on", args.lake_cache),
        ("lake, frame table", "lake_frame_table", args.lake_frame_table),
    ):
        if path:
            r = load(path)
            # Newer binaries say whether frames came from the stored frame table.
            used = r.get("frame_table")
            if used is not None and used != (key == "lake_frame_table"):
                label += " (frame table on)" if used else " (NO frame table)"
            rows.append((label, key, r))

    base_cpu, base_wall = samples_per_cpu_s(lr), num(lr, "samples_per_s")
    if args.title:
        print(args.title)
    width = max(28, *(len(label) for label, _, _ in rows))
    head = (
        f"{'loader':<{width}} {'samples/s':>9} {'CPU ms/sample':>13} {'samples/CPU-s':>13} {'x CPU':>6} "
        f"{'x wall':>6} {'peak RSS MB':>11} {'bound ms/s.':>11} {'% of bound':>10} {'copy ms/s.':>10} {'first ms':>8} "
        f"{'MB/sample':>9}"
    )
    print(head)
    results = {}
    for label, key, r in rows:
        spcs = samples_per_cpu_s(r)
        x_cpu, x_wall = spcs / base_cpu, num(r, "samples_per_s") / base_wall
        bound = num(r, "bound_cpu_ms_per_sample")
        frac = num(r, "bound_fraction") * 100
        print(
            f"{label:<{width}} {fmt(num(r, 'samples_per_s'), '.1f', 9)} {fmt(num(r, 'cpu_ms_per_sample'), '.2f', 13)} "
            f"{fmt(spcs, '.1f', 13)} {fmt(x_cpu, '.1f', 5)}x {fmt(x_wall, '.1f', 5)}x "
            f"{fmt(num(r, 'peak_rss_mb'), '.0f', 11)} {fmt(bound, '.2f', 11)} {fmt(frac, '.0f', 9)}% "
            f"{fmt(num(r, 'copy_ms_per_sample'), '.4f', 10)} {fmt(num(r, 'first_batch_ms'), '.0f', 8)} "
            f"{fmt(num(r, 'wire_bytes_per_sample') / 1e6 if 'wire_bytes_per_sample' in r else num(r, 'sample_bytes') / 1e6, '.3f', 9)}"
        )
        results[key] = {**r, "x_lerobot_samples_per_cpu_s": x_cpu, "x_lerobot_samples_per_s": x_wall}
    for label, key, r in peers:
        st = r.get("settings", {})
        tool = "bench-lancedb-loader.py" if key == "lerobot_lancedb" else "bench-lerobot-loader.py"
        print(
            f"  {label.rsplit(' (', 1)[0]}: the shared tool {tool}; sampler {st.get('sampler')}, "
            f"{st.get('mp_context') or 'default'} workers, prefetch {st.get('prefetch_factor')}, "
            f"uint8 frames {'on' if st.get('return_uint8') else 'off'} (to float32 in the main process: "
            f"{'yes' if st.get('float_convert_in_main') else 'no'}); CPU ms/sample attributed per batch "
            f"{fmt(num(r, 'cpu_ms_per_sample_attributed'), '.2f', 1)} (without each worker's first batch "
            f"{fmt(num(r, 'cpu_ms_per_sample_attributed_warm'), '.2f', 1)}); first batch after "
            f"{fmt(num(r, 'first_batch_ms') / 1e3, '.1f', 1)} s"
        )
    convert = load(args.lance_convert)
    if convert:
        print(f"  Lance copy made once by lerobot-lance-convert in {convert['seconds']:.1f} s: {convert['lance_root']}")
    if args.lake_cold_yuv:
        print(
            "  YUV planes: the video frames as the decoder gives them, half the bytes, which the trainer converts to "
            "LeRobot's exact RGB on its GPU (lake_client.frames_to_rgb; docs/gpu-checks.md: about 1.1 ms of GPU time "
            "per 32 frames of 640x480 on an H100); their bound is the decoders plus the plane copy."
        )
    if args.lake_packets:
        pk = load(args.lake_packets)
        print(
            "  packets: each camera's compressed GOPs, for the trainer to decode into the same frames (lake train "
            "--decode cpu); the row is the server's side. The consumer's decode of the same batches into RGB took "
            f"{fmt(num(pk, 'consumer_decode_ms_per_sample'), '.2f', 1)} CPU ms per sample on one thread."
        )
    print(
        "  MB/sample: lake's, as an Arrow IPC stream sends a sample (Flight, HTTP; uncompressed); LeRobot's, the "
        "tensors its DataLoader hands the trainer."
    )
    for s in args.skipped:
        print(f"  not run: {s}")
    build = load(args.frame_table_build)
    if build:
        print(f"  frame table built by `lake cache` in {build['seconds']:.1f} s: {build['output'].strip()}")
    print(
        f"  LeRobot's samples: {lr['sample_bytes'] / 1e6:.2f} MB each (float32 CHW frames); lake's: "
        f"{num(rows[first_lake][2], 'sample_bytes') / 1e6:.2f} MB (uint8 HWC frames). LeRobot's peak RSS is the sum over "
        f"its {lr['processes']} processes (PSS at the end: {lr['pss_mb_end']:.0f} MB)."
    )
    if args.json_out:
        out = {
            "meta": load(args.meta) or {},
            "results": results,
            "skipped": args.skipped,
            "frame_table_build": build,
        }
        if convert:
            out["lance_convert"] = convert
        args.json_out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
