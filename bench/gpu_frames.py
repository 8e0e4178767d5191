"""YUV planes turned into RGB on a GPU, checked against the RGB lake's loader sends, and timed.

Takes pairs of Arrow files written by `lake sample` for the same indices, one with
`--frame-format yuv420p` and one without (RGB), as `PLANES.arrow:RGB.arrow` arguments. For every
camera sent as planes it converts them with the Python client's `frames_to_rgb` on the GPU and on
the CPU (numpy), and requires both to equal the RGB frames byte for byte. Then it times, per batch
of the given size (default 32), what a trainer pays to get the frames onto the GPU: the RGB
frames copied from pinned memory, against the planes copied and converted there.

    PYTHONPATH=clients/python python3 bench/gpu_frames.py [--batch 32] planes.arrow:rgb.arrow ...
"""

import argparse
import sys
import time

import numpy as np
import pyarrow.ipc as ipc
import torch

from lake_client import FRAMES_KEY, batch_to_numpy, frames_to_rgb


def read(path):
    table = ipc.open_file(path).read_all().combine_chunks()
    return table.to_batches()[0]


def timed(fn, repeats=50):
    """Median milliseconds of `fn` (which ends with the GPU idle)."""
    for _ in range(5):
        fn()
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        fn()
        times.append((time.perf_counter() - began) * 1e3)
    return float(np.median(times))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("pairs", nargs="+")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("no CUDA device: this check needs a GPU")
    device = torch.device("cuda")
    print(f"device: {torch.cuda.get_device_name(device)}; torch {torch.__version__}")
    failures = 0
    rows = []
    for pair in args.pairs:
        planes_path, rgb_path = pair.split(":")
        planes, rgb = batch_to_numpy(read(planes_path)), batch_to_numpy(read(rgb_path))
        cameras = planes.get(FRAMES_KEY, {})
        if not cameras:
            sys.exit(f"{planes_path}: no camera sent as planes")
        on_gpu = frames_to_rgb({**planes, FRAMES_KEY: dict(cameras), **{k: torch.from_numpy(np.array(planes[k])) for k in cameras}}, device=device)
        on_cpu = frames_to_rgb({**planes, FRAMES_KEY: dict(cameras)})
        for camera, facts in cameras.items():
            want = rgb[camera]
            gpu = on_gpu[camera].cpu().numpy()
            frames = want.reshape(-1, facts["height"], facts["width"], 3).shape[0]
            same_gpu = np.array_equal(gpu, want)
            same_cpu = np.array_equal(on_cpu[camera], want)
            worst = int(np.abs(gpu.astype(np.int16) - want.astype(np.int16)).max())
            print(f"{planes_path} {camera}: {frames} frames {facts['width']}x{facts['height']}: "
                  f"GPU {'equal' if same_gpu else 'DIFFERENT'} (largest difference {worst}), CPU {'equal' if same_cpu else 'DIFFERENT'}")
            failures += (not same_gpu) + (not same_cpu)
            # Timing: a batch of `--batch` frames of this camera, from pinned host memory.
            n = args.batch
            picks = np.arange(n) % frames
            p = torch.from_numpy(np.ascontiguousarray(planes[camera].reshape(frames, -1)[picks])).pin_memory()
            r = torch.from_numpy(np.ascontiguousarray(want.reshape(frames, -1)[picks])).pin_memory()

            def rgb_upload():
                r.to(device, non_blocking=True)
                torch.cuda.synchronize()

            def planes_upload_and_convert():
                on = frames_to_rgb({camera: p, FRAMES_KEY: {camera: facts}}, device=device)
                assert on[camera].is_cuda
                torch.cuda.synchronize()

            rows.append((camera, facts["width"], facts["height"], n, r.numel() / 2**20, p.numel() / 2**20,
                         timed(rgb_upload), timed(planes_upload_and_convert)))
    print()
    print(f"{'camera':32} {'size':>9} {'batch':>5} {'RGB MiB':>8} {'YUV MiB':>8} {'RGB copy ms':>12} {'YUV copy+convert ms':>20}")
    for camera, w, h, n, rgb_mib, yuv_mib, t_rgb, t_yuv in rows:
        print(f"{camera:32} {f'{w}x{h}':>9} {n:>5} {rgb_mib:>8.2f} {yuv_mib:>8.2f} {t_rgb:>12.3f} {t_yuv:>20.3f}")
    if failures:
        sys.exit(f"{failures} conversions differ from the loader's RGB")
    print("every converted frame equals the loader's RGB, byte for byte")


if __name__ == "__main__":
    main()
