"""Write a synthetic LeRobot v3.0 dataset with LeRobot's own writer, for bench/compare_lerobot.sh.

The dataset is what a small SO-101-style recording looks like to a loader: two cameras,
``observation.images.front`` (480x640) and ``observation.images.wrist`` (96x128), encoded by
LeRobot with its default encoder settings (libsvtav1, GOP 2, crf 30, yuv420p), a 6-d float32
``observation.state`` and ``action``, one of three task strings per episode, 30 fps, and
episodes of varying length.

The images are synthetic but not degenerate, so the AV1 streams carry real motion and texture:
a textured scene that pans with a slow camera drift, a two-link arm drawn from the state, a
moving colour gradient, and per-frame sensor noise; the wrist camera sees a scrolling close-up
whose gripper bar follows the last joint.

Writing goes through ``LeRobotDataset.create`` / ``add_frame`` / ``save_episode`` /
``finalize`` (lerobot 0.4.4): frames are staged as PNGs and each episode's videos are encoded
by LeRobot's encoder into its multi-episode mp4 files. Deterministic for a given seed.

Usage::

    python make_fixture.py --out DIR --frames 10000 [--episodes 50] [--seed 0]
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

import numpy as np

FPS = 30
FRONT = (480, 640)
WRIST = (96, 128)
STATE_DIM = 6
JOINTS = ["shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "gripper"]
TASKS = [
    "Pick up the red cube and place it in the bowl.",
    "Push the blue block to the left edge of the table.",
    "Open the drawer and put the marker inside.",
]


def episode_lengths(frames: int, episodes: int, rng: np.random.Generator) -> list[int]:
    """Split ``frames`` into ``episodes`` lengths of varying size (0.5x to 1.5x the mean)."""
    weights = rng.uniform(0.5, 1.5, size=episodes)
    lengths = np.maximum(np.floor(weights / weights.sum() * frames).astype(int), 2)
    lengths[np.argmax(lengths)] += frames - int(lengths.sum())
    return [int(n) for n in lengths]


def smooth_texture(h: int, w: int, rng: np.random.Generator, cell: int) -> np.ndarray:
    """A colourful, smoothly varying HxWx3 float texture in [0, 255] (bilinear-upsampled noise)."""
    gh, gw = h // cell + 2, w // cell + 2
    grid = rng.uniform(0, 255, size=(gh, gw, 3)).astype(np.float32)
    ys = np.linspace(0, gh - 1.001, h, dtype=np.float32)
    xs = np.linspace(0, gw - 1.001, w, dtype=np.float32)
    y0, x0 = ys.astype(int), xs.astype(int)
    fy, fx = (ys - y0)[:, None, None], (xs - x0)[None, :, None]
    a = grid[y0][:, x0]
    b = grid[y0][:, x0 + 1]
    c = grid[y0 + 1][:, x0]
    d = grid[y0 + 1][:, x0 + 1]
    return (a * (1 - fy) * (1 - fx) + b * (1 - fy) * fx + c * fy * (1 - fx) + d * fy * fx).astype(np.float32)


class Scene:
    """One episode's scene: a wide background to pan over, colours, and a sensor-noise bank.

    Frames are built in uint8 arithmetic so that making them costs far less than LeRobot's own
    PNG staging and encoding of them.
    """

    NOISE_BANK = 8

    def __init__(self, rng: np.random.Generator):
        h, w = FRONT
        self.rng = rng
        # Background wider and taller than the view, so the camera can drift over it.
        coarse = smooth_texture(h + 64, w + 128, rng, cell=48)
        fine = smooth_texture(h + 64, w + 128, rng, cell=6)
        self.background = (0.75 * coarse + 0.25 * fine).astype(np.uint8)
        self.table = (smooth_texture(h - 2 * h // 3, w, rng, cell=10) * 0.5 + 60).astype(np.uint8)
        self.arm_colour = rng.integers(40, 230, size=3, dtype=np.uint8)
        self.object_colour = rng.integers(40, 230, size=3, dtype=np.uint8)
        self.wrist_texture = smooth_texture(WRIST[0] * 3, WRIST[1] * 3, rng, cell=8).astype(np.uint8)
        yy, xx = np.mgrid[0:h, 0:w]
        self.sweep = ((xx + yy // 2) % 256).astype(np.uint8)
        self.yy, self.xx = yy.astype(np.float32), xx.astype(np.float32)
        self.wy, self.wx = np.mgrid[0 : WRIST[0], 0 : WRIST[1]].astype(np.float32)
        # Sensor noise: the two low bits of every channel flipped at random (amplitude <= 3).
        self.noise = rng.integers(0, 4, size=(self.NOISE_BANK, h, w, 3), dtype=np.uint8)
        self.wrist_noise = rng.integers(0, 4, size=(self.NOISE_BANK, *WRIST, 3), dtype=np.uint8)

    def front(self, t: int, state: np.ndarray) -> np.ndarray:
        h, w = FRONT
        dy = int(32 + 30 * np.sin(t / 47.0))
        dx = int(64 + 60 * np.sin(t / 71.0))
        img = self.background[dy : dy + h, dx : dx + w].copy()
        top = 2 * h // 3
        img[top:] = (img[top:] >> 1) + (self.table >> 1)
        # A colour gradient sweeping across the frame (uint8 addition wraps around).
        img[..., 2] = (img[..., 2] >> 1) + ((self.sweep + np.uint8((4 * t) % 256)) >> 1)
        # Two-link arm from the first joints, drawn as thick segments.
        base = np.array([h * 0.85, w * 0.5], dtype=np.float32)
        a1 = float(state[0]) * 1.2  # angles from the vertical
        a2 = a1 + float(state[1]) * 1.5
        elbow = base + 150 * np.array([-np.cos(a1), np.sin(a1)], dtype=np.float32)
        tip = elbow + 110 * np.array([-np.cos(a2), np.sin(a2)], dtype=np.float32)
        self._segment(img, base, elbow, 14.0, self.arm_colour)
        self._segment(img, elbow, tip, 10.0, self.arm_colour)
        # An object that drifts on the table.
        centre = np.array([h * 0.78 + 10 * np.sin(t / 13.0), w * 0.3 + 120 * np.sin(t / 90.0)], dtype=np.float32)
        self._segment(img, centre, centre, 28.0, self.object_colour)
        img ^= self.noise[self.rng.integers(self.NOISE_BANK)]
        return img

    def _segment(self, img: np.ndarray, p: np.ndarray, q: np.ndarray, r: float, colour: np.ndarray) -> None:
        """Paint the points within ``r`` pixels of segment ``p``-``q`` (row, column) in ``colour``."""
        y0, y1 = int(max(0, min(p[0], q[0]) - r)), int(min(FRONT[0], max(p[0], q[0]) + r + 1))
        x0, x1 = int(max(0, min(p[1], q[1]) - r)), int(min(FRONT[1], max(p[1], q[1]) + r + 1))
        if y0 >= y1 or x0 >= x1:
            return
        yy, xx = self.yy[y0:y1, x0:x1], self.xx[y0:y1, x0:x1]
        d = q - p
        s = np.clip(((yy - p[0]) * d[0] + (xx - p[1]) * d[1]) / max(float(d @ d), 1e-6), 0, 1)
        dist2 = (yy - p[0] - s * d[0]) ** 2 + (xx - p[1] - s * d[1]) ** 2
        img[y0:y1, x0:x1][dist2 < r * r] = colour

    def wrist(self, t: int, state: np.ndarray) -> np.ndarray:
        h, w = WRIST
        oy = int(h + h * 0.9 * np.sin(t / 23.0 + state[3]))
        ox = int(w + w * 0.9 * np.cos(t / 31.0 + state[4]))
        img = self.wrist_texture[oy : oy + h, ox : ox + w].copy()
        opening = 10 + 30 * (0.5 + 0.5 * np.tanh(state[5]))
        for side in (-1, 1):
            cx = w / 2 + side * opening
            img[(np.abs(self.wx - cx) < 6) & (self.wy > h * 0.45)] = self.arm_colour
        img ^= self.wrist_noise[self.rng.integers(self.NOISE_BANK)]
        return img


def trajectory(n: int, rng: np.random.Generator) -> np.ndarray:
    """Smooth joint positions (n+1 steps, so actions can look one step ahead), float32."""
    t = np.arange(n + 1, dtype=np.float64)[:, None]
    freq = rng.uniform(0.01, 0.06, size=STATE_DIM)
    phase = rng.uniform(0, 2 * np.pi, size=STATE_DIM)
    amp = rng.uniform(0.3, 1.0, size=STATE_DIM)
    return (amp * np.sin(freq * t + phase)).astype(np.float32)


def features() -> dict:
    names = ["height", "width", "channels"]
    return {
        "observation.images.front": {"dtype": "video", "shape": (*FRONT, 3), "names": names},
        "observation.images.wrist": {"dtype": "video", "shape": (*WRIST, 3), "names": names},
        "observation.state": {"dtype": "float32", "shape": (STATE_DIM,), "names": JOINTS},
        "action": {"dtype": "float32", "shape": (STATE_DIM,), "names": JOINTS},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="dataset root to write (replaced if present)")
    ap.add_argument("--frames", type=int, default=10_000, help="total frames (steps) [10000]")
    ap.add_argument("--episodes", type=int, default=None, help="episodes [frames / 200, at least 2]")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repo-id", default="lake/bench-av1", help="LeRobot repo_id recorded in the dataset")
    ap.add_argument("--image-writer-threads", type=int, default=4, help="LeRobot's PNG staging threads")
    ap.add_argument("--wrist-size", default="96x128", help="the wrist camera's HxW [96x128]; 480x640 gives both "
                    "cameras one size, which LeRobot's Diffusion Policy needs")
    args = ap.parse_args()
    global WRIST
    WRIST = tuple(int(n) for n in args.wrist_size.split("x"))

    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    episodes = args.episodes or max(2, round(args.frames / 200))
    rng = np.random.default_rng(args.seed)
    lengths = episode_lengths(args.frames, episodes, rng)
    if args.out.exists():
        shutil.rmtree(args.out)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    ds = LeRobotDataset.create(
        repo_id=args.repo_id,
        fps=FPS,
        features=features(),
        root=args.out,
        robot_type="so101_follower",
        use_videos=True,
        image_writer_threads=args.image_writer_threads,
        vcodec="libsvtav1",
    )
    began = time.monotonic()
    done = 0
    for e, n in enumerate(lengths):
        scene = Scene(np.random.default_rng([args.seed, e]))
        joints = trajectory(n, np.random.default_rng([args.seed, e, 1]))
        task = TASKS[e % len(TASKS)]
        for i in range(n):
            state = joints[i]
            ds.add_frame(
                {
                    "observation.images.front": scene.front(i, state),
                    "observation.images.wrist": scene.wrist(i, state),
                    "observation.state": state,
                    "action": joints[i + 1] + np.float32(0.01) * np.sin(np.float32(i)),
                    "task": task,
                }
            )
        ds.save_episode()
        done += n
        rate = done / max(time.monotonic() - began, 1e-9)
        print(f"episode {e + 1}/{episodes}: {n} frames ({done}/{args.frames}, {rate:.0f} frames/s)", flush=True)
    ds.finalize()
    ds.stop_image_writer()
    # Staging directories LeRobot leaves behind (empty); nothing reads them.
    shutil.rmtree(args.out / "images", ignore_errors=True)
    print(f"wrote {args.out}: {episodes} episodes, {args.frames} frames in {time.monotonic() - began:.0f} s")


if __name__ == "__main__":
    main()
