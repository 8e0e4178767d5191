"""Times how fast a running `lake serve` gives the web app an episode's frames: every step of one
episode, for each camera, asked for one frame a request (`/frame`) and N steps a request
(`/frames?count=N`), one request at a time, as frames per second (what playback can reach at
most with one request in flight; the app keeps four in flight).

    python bench/web_frames.py http://127.0.0.1:8080 DATASET [EPISODE] [N ...]   (default 0; 8 16)

Only the standard library; `LAKE_TOKEN` is sent as a bearer token when set. Each way runs twice
and the second run is reported: the first fills the server's frame cache the same way for all.
"""

import json
import os
import sys
import time
import urllib.parse
import urllib.request


def get(url):
    request = urllib.request.Request(url)
    if os.environ.get("LAKE_TOKEN"):
        request.add_header("Authorization", f"Bearer {os.environ['LAKE_TOKEN']}")
    with urllib.request.urlopen(request) as r:
        return r.headers, r.read()


def timed(base, dataset, camera, first, length, count):
    """Seconds to fetch the episode's frames `count` a request (None: `/frame`), and the bytes."""
    began, step, sent = time.perf_counter(), 0, 0
    quoted = urllib.parse.quote(camera)
    while step < length:
        if count is None:
            _, body = get(f"{base}/v1/datasets/{dataset}/frame?camera={quoted}&index={first + step}")
            step += 1
        else:
            headers, body = get(f"{base}/v1/datasets/{dataset}/frames?camera={quoted}&index={first + step}&count={count}")
            step += int(headers["Lake-Frame-Count"])
        sent += len(body)
    return time.perf_counter() - began, sent


def main(base, dataset, episode, counts):
    _, body = get(f"{base}/v1/datasets/{dataset}/episodes/{episode}")
    ep = json.loads(body)
    print(f"{dataset} episode {episode}: {ep['length']} steps")
    print(f"{'camera':<32} {'size':>9} {'per request':>11} {'frames/s':>9} {'kB/frame':>9}")
    for camera in ep["cameras"]:
        key = camera["camera"] if isinstance(camera, dict) else camera
        size = f"{camera.get('width', '?')}x{camera.get('height', '?')}" if isinstance(camera, dict) else ""
        for count in [None, *counts]:
            timed(base, dataset, key, ep["from_index"], ep["length"], count)
            seconds, sent = timed(base, dataset, key, ep["from_index"], ep["length"], count)
            label = "1 (/frame)" if count is None else str(count)
            print(f"{key:<32} {size:>9} {label:>11} {ep['length'] / seconds:>9.1f} {sent / ep['length'] / 1000:>9.1f}")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1].rstrip("/"), sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 0, [int(n) for n in sys.argv[4:]] or [8, 16])
