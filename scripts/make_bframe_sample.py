"""Makes `testdata/lerobot/v30-bframes`, a twin of `v30-h264-multifile` whose videos have
B-frames and widths that are no multiple of 32, and the samples LeRobot's own reader returns
for it.

Recordings re-encoded by other tools often carry B-frames (decode order differs from
presentation order) and sizes such as 424x240. This copies `v30-h264-multifile` (several files
per camera, per-camera `from_timestamp`s) and re-encodes every mp4 with Debian's `ffmpeg`, file
by file, so that every frame keeps its time:

- `front`: HEVC, `I B I B` (x265, GOP 2, one B-frame): each B-frame is decoded after the next
  keyframe, the case LeRobot's approximate seeking fails on about half the time;
- `wrist`: H.264 with up to 3 B-frames in a pyramid, GOP 12, 120 wide;
- `side`: H.264 with 2 B-frames, GOP 6, 64x64 (a width of 32s).

`front` becomes 152 wide and `wrist` 120: FFmpeg's (and so torchcodec's) conversion to RGB
takes another path for widths that are no multiple of 32 (a filter graph), and lake must give
the same bytes there too.

Then it loads the result with `LeRobotDataset` (torchcodec, as lerobot-train does) and writes,
for 120 steps (the first and last two of every episode, the rest drawn with numpy's generator,
seed 0) and the presets `diffusion` and `none`, what `__getitem__` returns, in the layout of
the reference dumps in `shared/fixtures/reference/` (see its README): every value, the SHA-256 of
every frame as HWC uint8 bytes, `lerobot_error` where stock LeRobot raised (its approximate
seeking returns a frame of another time) with the frames of exact seeking, which finds the
frame whose time is the query's. lake's tests compare its samples with those files.

Run it with the LeRobot venv (`bench/compare_lerobot.sh` makes one):

    HF_HUB_OFFLINE=1 ~/.cache/lake/lerobot-venv/bin/python scripts/make_bframe_sample.py
"""

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa

REPO = Path(__file__).resolve().parent.parent
SOURCE = REPO / "testdata/lerobot/v30-h264-multifile"
NAME = "v30-bframes"
TARGET = REPO / "testdata/lerobot" / NAME
REFERENCE = REPO / "testdata/reference"
ROWS = 120
# camera → (codec in info.json, width, ffmpeg encoder arguments)
ENCODINGS = {
    "observation.images.front": (
        "hevc",
        152,
        ["-c:v", "libx265", "-x265-params", "keyint=2:min-keyint=2:bframes=1:scenecut=0:log-level=error"],
    ),
    "observation.images.wrist": (
        "h264",
        120,
        ["-c:v", "libx264", "-x264-params", "keyint=12:min-keyint=12:bframes=3:b-pyramid=normal:scenecut=0"],
    ),
    "observation.images.side": ("h264", 64, ["-c:v", "libx264", "-x264-params", "keyint=6:min-keyint=6:bframes=2:scenecut=0"]),
}


def reencode(source: Path, target: Path, width: int, height: int, encoder: list[str]) -> None:
    subprocess.run(
        ["ffmpeg", "-nostdin", "-v", "error", "-y", "-i", str(source), "-vf", f"scale={width}:{height}:flags=bicubic"]
        + encoder
        + ["-pix_fmt", "yuv420p", "-fps_mode", "passthrough", "-an", "-map_metadata", "-1", str(target)],
        check=True,
    )


def frame_count(video: Path) -> int:
    out = subprocess.run(
        ["ffprobe", "-v", "error", "-count_packets", "-select_streams", "v:0", "-show_entries", "stream=nb_read_packets", "-of", "csv=p=0", str(video)],
        check=True,
        capture_output=True,
        text=True,
    )
    return int(out.stdout.strip())


def write_dataset() -> None:
    if TARGET.exists():
        shutil.rmtree(TARGET)
    shutil.copytree(SOURCE, TARGET)
    info_path = TARGET / "meta/info.json"
    info = json.loads(info_path.read_text())
    with tempfile.TemporaryDirectory() as tmp:
        for camera, (codec, width, encoder) in ENCODINGS.items():
            feature = info["features"][camera]
            height = feature["shape"][0]
            for video in sorted((TARGET / "videos" / camera).rglob("*.mp4")):
                original = Path(tmp) / "in.mp4"
                shutil.move(video, original)
                reencode(original, video, width, height, encoder)
                if frame_count(video) != frame_count(original):
                    sys.exit(f"{video}: re-encoding changed the number of frames")
            feature["shape"] = [height, width, 3]
            feature["info"]["video.width"] = width
            feature["info"]["video.codec"] = codec
    info_path.write_text(json.dumps(info, indent=4) + "\n")


def rows(ds) -> list[int]:
    """Positions: the first and last two steps of every episode, then uniform draws."""
    chosen = []
    for start, end in zip(ds.meta.episodes["dataset_from_index"], ds.meta.episodes["dataset_to_index"]):
        chosen += [start, start + 1, end - 2, end - 1]
    rest = sorted(set(range(len(ds))) - set(chosen))
    chosen += [int(i) for i in np.random.default_rng(0).choice(rest, ROWS - len(chosen), replace=False)]
    return chosen


def u8_frames(tensor) -> np.ndarray:
    """LeRobot's float32 CHW frames in [0, 1] as uint8 HWC ([T,] H, W, 3), checked to be exact."""
    scaled = tensor.numpy() * 255.0
    u8 = np.rint(scaled)
    assert np.abs(scaled - u8).max() < 1e-3, "frame values are not multiples of 1/255"
    return np.moveaxis(u8.astype(np.uint8), -3, -1)


def items(ds, positions: list[int]) -> tuple[list[dict], list[str | None]]:
    """`__getitem__` for every position; where stock LeRobot raises, the item with exact seeking."""
    from lerobot.datasets import video_utils

    class ExactDecoders(video_utils.VideoDecoderCache):
        def get_decoder(self, video_path: str):
            from torchcodec.decoders import VideoDecoder

            with self._lock:
                if video_path not in self._cache:
                    handle = open(video_path, "rb")
                    self._cache[video_path] = (VideoDecoder(handle, seek_mode="exact"), handle)
                return self._cache[video_path][0]

    stock = video_utils._default_decoder_cache
    out, errors = [], []
    for position in positions:
        try:
            out.append(ds[position])
            errors.append(None)
        except video_utils.FrameTimestampError as e:
            errors.append(str(e).splitlines()[0])
            video_utils._default_decoder_cache = ExactDecoders()
            try:
                out.append(ds[position])
            finally:
                video_utils._default_decoder_cache = stock
    return out, errors


def write_reference(preset: str) -> None:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset, LeRobotDatasetMetadata

    meta = LeRobotDatasetMetadata(f"lake/{NAME}", root=TARGET)
    fps, cameras = meta.fps, meta.camera_keys
    delta = None
    if preset == "diffusion":
        obs = [-1 / fps, 0.0]
        delta = {"observation.state": obs, "action": [i / fps for i in range(-1, 15)], **{c: obs for c in cameras}}
    ds = LeRobotDataset(f"lake/{NAME}", root=TARGET, delta_timestamps=delta)
    positions = rows(ds)
    got, errors = items(ds, positions)
    columns, fields = {}, []
    scalars = {"index": pa.int64(), "episode_index": pa.int64(), "frame_index": pa.int64(), "task_index": pa.int64(), "timestamp": pa.float32()}
    columns["getitem_idx"] = pa.array(positions, pa.int64())
    fields.append(pa.field("getitem_idx", pa.int64()))
    for key in got[0]:
        values = [item[key] for item in got]
        if key == "task":
            columns[key] = pa.array(values, pa.string())
            fields.append(pa.field(key, pa.string()))
        elif key in cameras:
            frames = [u8_frames(v) for v in values]
            windowed = frames[0].ndim == 4
            hashes = [
                [hashlib.sha256(np.ascontiguousarray(f).tobytes()).hexdigest() for f in (frame if windowed else [frame])]
                for frame in frames
            ]
            metadata = {
                "shape": json.dumps(list(frames[0].shape)),
                "frame_shape": json.dumps(list(frames[0].shape[-3:])),
                "dtype": "uint8",
                "layout": "THWC" if windowed else "HWC",
            }
            name = f"{key}.sha256"
            columns[name] = pa.array(hashes if windowed else [h[0] for h in hashes], pa.list_(pa.string()) if windowed else pa.string())
            fields.append(pa.field(name, columns[name].type, metadata=metadata))
        elif key in scalars:
            columns[key] = pa.array([v.item() for v in values], scalars[key])
            fields.append(pa.field(key, scalars[key]))
        else:
            array = np.stack([v.numpy() for v in values])
            kind = pa.bool_() if array.dtype == np.bool_ else pa.from_numpy_dtype(array.dtype)
            columns[key] = pa.array([row.reshape(-1) for row in array], pa.list_(kind))
            metadata = {"shape": json.dumps(list(array.shape[1:])), "dtype": str(array.dtype)}
            fields.append(pa.field(key, columns[key].type, metadata=metadata))
    columns["lerobot_error"] = pa.array(errors, pa.string())
    fields.append(pa.field("lerobot_error", pa.string()))
    metadata = {
        "dataset": NAME,
        "preset": preset,
        "delta_timestamps": json.dumps(delta),
        "camera_keys": json.dumps(cameras),
        "fps": str(fps),
        "made_by": "LeRobotDataset.__getitem__ (lerobot 0.4.4, torchcodec), scripts/make_bframe_sample.py",
        "rows_with_lerobot_error": str(sum(e is not None for e in errors)),
    }
    table = pa.Table.from_arrays([columns[f.name] for f in fields], schema=pa.schema(fields, metadata=metadata))
    REFERENCE.mkdir(parents=True, exist_ok=True)
    path = REFERENCE / f"{NAME}.{preset}.arrow"
    with pa.ipc.new_file(path, table.schema, options=pa.ipc.IpcWriteOptions(compression="zstd")) as writer:
        writer.write_table(table)
    failed = sum(e is not None for e in errors)
    print(f"{path.relative_to(REPO)}: {len(positions)} steps, {failed} where stock LeRobot raised", file=sys.stderr)


if __name__ == "__main__":
    write_dataset()
    for preset in ["diffusion", "none"]:
        write_reference(preset)
