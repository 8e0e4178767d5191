"""Makes `testdata/lerobot/v30-images-jpeg`, the JPEG twin of `v30-images-tiny`, and the frames
LeRobot's own reader returns for it.

LeRobot's writer stores `image` features as PNG, but datasets converted from other formats often
carry JPEG bytes in the parquet. This copies `v30-images-tiny` and re-encodes every picture as
JPEG with PIL (episode 0: quality 75, 4:2:0; episode 1: quality 90, 4:4:4, progressive; episode
2: quality 60, 4:2:2, stored upside down with EXIF orientation 3, which LeRobot's reader turns
upright), then loads the result with `LeRobotDataset` and writes, for every index,
the SHA-256 of the camera frame `__getitem__` returns (as HWC uint8 bytes) to
`testdata/reference/v30-images-jpeg.json`. lake's tests compare its samples with those hashes.

Run it with the LeRobot venv (`bench/compare_lerobot.sh` makes one):

    HF_HUB_OFFLINE=1 ~/.cache/lake/lerobot-venv/bin/python scripts/make_jpeg_sample.py
"""

import hashlib
import io
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

REPO = Path(__file__).resolve().parent.parent
SOURCE = REPO / "testdata/lerobot/v30-images-tiny"
TARGET = REPO / "testdata/lerobot/v30-images-jpeg"
REFERENCE = REPO / "testdata/reference/v30-images-jpeg.json"
CAMERA = "observation.images.front"
ENCODINGS = {
    0: {"quality": 75},
    1: {"quality": 90, "subsampling": 0, "progressive": True},
    2: {"quality": 60, "subsampling": 1, "orientation": 3},
}


def jpeg(png: bytes, episode: int) -> bytes:
    options = dict(ENCODINGS[episode])
    picture = Image.open(io.BytesIO(png)).convert("RGB")
    if orientation := options.pop("orientation", None):
        # Stored turned so that the orientation turns it back: the frames look as in the PNGs.
        picture = picture.transpose(Image.Transpose.ROTATE_180)
        exif = Image.Exif()
        exif[0x0112] = orientation
        options["exif"] = exif
    out = io.BytesIO()
    picture.save(out, format="JPEG", **options)
    return out.getvalue()


def write_dataset() -> None:
    if TARGET.exists():
        shutil.rmtree(TARGET)
    shutil.copytree(SOURCE, TARGET)
    data = TARGET / "data/chunk-000/file-000.parquet"
    table = pq.read_table(data)
    episodes = table.column("episode_index").to_pylist()
    images = table.column(CAMERA).to_pylist()
    rewritten = [
        {"bytes": jpeg(img["bytes"], ep), "path": img["path"].replace(".png", ".jpg")} for img, ep in zip(images, episodes)
    ]
    column = pa.array(rewritten, type=table.schema.field(CAMERA).type)
    table = table.set_column(table.schema.get_field_index(CAMERA), table.schema.field(CAMERA), column)
    pq.write_table(table, data)


def write_reference() -> None:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    ds = LeRobotDataset("lake/v30-images-jpeg", root=TARGET)
    hashes = []
    for i in range(len(ds)):
        item = ds[i]
        u8 = np.rint(item[CAMERA].numpy() * 255.0).astype(np.uint8).transpose(1, 2, 0)
        hashes.append(hashlib.sha256(np.ascontiguousarray(u8).tobytes()).hexdigest())
    REFERENCE.parent.mkdir(parents=True, exist_ok=True)
    REFERENCE.write_text(
        json.dumps(
            {
                "dataset": "v30-images-jpeg",
                "made_by": "LeRobotDataset.__getitem__ (lerobot 0.4.4), scripts/make_jpeg_sample.py",
                "camera": CAMERA,
                "frame_shape": list(u8.shape),
                "sha256_by_index": hashes,
            },
            indent=1,
        )
        + "\n"
    )
    print(f"{TARGET.relative_to(REPO)}: {len(hashes)} frames; hashes in {REFERENCE.relative_to(REPO)}", file=sys.stderr)


if __name__ == "__main__":
    write_dataset()
    write_reference()
