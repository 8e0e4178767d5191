"""Loads a dataset with LeRobot's own `LeRobotDataset` and compares its samples with a reference
dump (`../shared/fixtures/reference/<name>.<preset>.arrow`, see that directory's README).

lake uses it to check that `lake export --format lerobot-v3` writes datasets LeRobot reads back
exactly: same steps, same tasks, frames whose uint8 HWC bytes hash to the reference's SHA-256.
The preset `none` is compared (no windows), over every row of the dump.

    python scripts/lerobot_parity.py EXPORTED_ROOT REFERENCE.arrow

Exits 0 when every row matches, 1 with the first differences otherwise.
"""

import hashlib
import sys

import numpy as np
import pyarrow.ipc as ipc
from lerobot.datasets.lerobot_dataset import LeRobotDataset


def frame_hash(tensor) -> str:
    """SHA-256 of a CHW float frame in [0, 1] as HWC uint8 bytes."""
    u8 = np.rint(tensor.numpy() * 255.0).astype(np.uint8).transpose(1, 2, 0)
    return hashlib.sha256(np.ascontiguousarray(u8).tobytes()).hexdigest()


def main() -> int:
    root, reference = sys.argv[1], sys.argv[2]
    ds = LeRobotDataset("lake/export", root=root, video_backend="torchcodec")
    ref = ipc.open_file(reference).read_all().to_pylist()
    cameras = [k for k in ds.meta.camera_keys]
    problems = []
    for row in ref:
        item = ds[row["getitem_idx"]]
        for key in ("index", "episode_index", "frame_index", "task_index"):
            if int(item[key]) != row[key]:
                problems.append(f"row {row['getitem_idx']}: {key} {int(item[key])} != {row[key]}")
        if np.float32(item["timestamp"]) != np.float32(row["timestamp"]):
            problems.append(f"row {row['getitem_idx']}: timestamp {float(item['timestamp'])} != {row['timestamp']}")
        if item["task"] != row["task"]:
            problems.append(f"row {row['getitem_idx']}: task {item['task']!r} != {row['task']!r}")
        for key in ("action", "observation.state", "actions", "state"):
            if key in row and row[key] is not None:
                got = item[key].numpy().astype(np.float32).ravel()
                want = np.asarray(row[key], dtype=np.float32).ravel()
                if got.tobytes() != want.tobytes():
                    problems.append(f"row {row['getitem_idx']}: {key} differs")
        for cam in cameras:
            want = row.get(f"{cam}.sha256")
            if want is not None and frame_hash(item[cam]) != want:
                problems.append(f"row {row['getitem_idx']}: frame of {cam} differs")
    print(f"{len(ref)} reference rows, {len(problems)} differences")
    for p in problems[:20]:
        print("  " + p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
