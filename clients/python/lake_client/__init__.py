"""Python client for `lake serve`.

`LakeClient` streams a sampling request's batches over Arrow Flight as `pyarrow.RecordBatch`es
and turns them into LeRobot-style dicts of numpy arrays. `LakeIterableDataset` is a
`torch.utils.data.IterableDataset` over the same stream for existing PyTorch trainers: it reads
its rank and world size from `torch.distributed` (or the `RANK` / `WORLD_SIZE` environment
variables, or those of MPI launchers and Slurm), yields dict batches (uint8 frames as tensors, or
LeRobot's float32 CHW in [0, 1] with `frame_layout="lerobot"`), has a `len()` when `epochs` bounds
it, and resumes exactly from `state_dict()`. `LocalClient` reads the same batches from
`lake serve --local PATH` on the same machine: they arrive in shared memory and are read in place
(`local=PATH` in the dataset).

    from lake_client import LakeIterableDataset
    ds = LakeIterableDataset("grpc://127.0.0.1:50051", datasets=["my_dataset"], preset="act",
                             batch_size=32, seed=0, epochs=10)
    loader = torch.utils.data.DataLoader(ds, batch_size=None)   # batches come ready-made
    for batch in tqdm(loader):                                   # len(loader): the batches of 10 epochs
        batch["action"], batch["observation.images.front"]      # float32 [32, 50, 6], uint8 [32, H, W, 3]

With `frame_format="yuv420p"` in the request, video frames travel as YUV 4:2:0 planes (half the
bytes, no colour conversion on the server) and `frames_to_rgb(batch, device="cuda")` makes the same
RGB bytes on the trainer's GPU.

For LeRobot's own trainer, `lake_client.lerobot.LakeLeRobotDataset` stands in for `LeRobotDataset`
(its metadata and samples, from the server), and `python -m lake_client.lerobot_train
--lake-server grpc://HOST:PORT --lake-http http://HOST:PORT --lake-dataset NAME <lerobot-train
arguments>` runs `lerobot-train` on it.
"""

from __future__ import annotations

import difflib
import json
import mmap
import re
import os
import select
import socket
import struct
import sys
import threading
import time
import warnings
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight

__all__ = [
    "CURSOR_KEY",
    "FRAMES_KEY",
    "FRAME_LAYOUTS",
    "LakeClient",
    "LocalClient",
    "LakeError",
    "LakeIterableDataset",
    "batch_to_numpy",
    "frames_to_rgb",
    "to_lerobot_layout",
    "yuv420p_to_rgb24",
]

DatasetSpec = Union[str, Dict[str, Any]]  # a name (`name` or `name@version`) or {"name", "weight"}


def _shape(field: pa.Field) -> Optional[List[int]]:
    meta = field.metadata or {}
    raw = meta.get(b"shape")
    return json.loads(raw) if raw is not None else None


# Key of a batch whose cameras carry YUV planes (`frame_format="yuv420p"`): camera → what
# `frames_to_rgb` needs to convert them (`height`, `width`, `yuv_to_rgb`).
FRAMES_KEY = "lake.frames"


def _yuv_cameras(schema: pa.Schema) -> Dict[str, Dict[str, Any]]:
    """The camera columns of `schema` that carry YUV 4:2:0 planes, with their frame size and
    conversion integers (the server's field metadata)."""
    out = {}
    for field in schema:
        meta = field.metadata or {}
        if meta.get(b"pixel_format") == b"yuv420p":
            height, width, _ = json.loads(meta[b"frame_shape"])
            out[field.name] = {"height": height, "width": width, "yuv_to_rgb": json.loads(meta[b"yuv_to_rgb"])}
    return out


def batch_to_numpy(batch: pa.RecordBatch) -> Dict[str, Any]:
    """A record batch as LeRobot-style columns: numbers and frames as numpy arrays shaped by the
    field's `shape` metadata (frames uint8 HWC, or THWC with a time window), strings as lists.
    Cameras sent as YUV planes (`frame_format="yuv420p"`) stay planes, one row of bytes per
    frame, and the batch names them under `FRAMES_KEY`: `frames_to_rgb` turns them into RGB."""
    out: Dict[str, Any] = {}
    yuv = _yuv_cameras(batch.schema)
    if yuv:
        out[FRAMES_KEY] = yuv
    for field, column in zip(batch.schema, batch.columns):
        if pa.types.is_string(field.type) or pa.types.is_large_string(field.type):
            out[field.name] = column.to_pylist()
            continue
        shape = _shape(field)
        if pa.types.is_fixed_size_list(field.type) or pa.types.is_list(field.type):
            values = column.flatten()
            while pa.types.is_fixed_size_list(values.type) or pa.types.is_list(values.type):
                values = values.flatten()
            array = values.to_numpy(zero_copy_only=False)
            dims = shape if shape is not None else [-1]
            out[field.name] = array.reshape([len(batch)] + list(dims))
        else:
            out[field.name] = column.to_numpy(zero_copy_only=False)
    return out


def yuv420p_to_rgb24(planes: Any, height: int, width: int, yuv_to_rgb: Dict[str, int]) -> Any:
    """Converts YUV 4:2:0 frames to RGB24 exactly as lake's server (and LeRobot's reader on
    x86-64) would have: `planes` is uint8 `[..., Y + U + V bytes]` (each plane packed), the result
    uint8 `[..., height, width, 3]`. A numpy array is converted on the CPU; a torch tensor on its
    own device (a GPU: move the planes there first, half the bytes of RGB).

    The arithmetic (`yuv_to_rgb` holds the integers, per camera in the server's metadata):
    `y = ((8·Y − y_offset) · y_gain) >> 16`, `u = 8·U − 1024`, `v = 8·V − 1024`,
    `R = y + (v·v_to_r >> 16)`, `G = y + (u·u_to_g >> 16) + (v·v_to_g >> 16)`,
    `B = y + (u·u_to_b >> 16)`, each clamped to 0..255, with U and V of pixel (x, y) at
    (x // 2, y // 2)."""
    ch, cw = (height + 1) // 2, (width + 1) // 2
    luma, chroma = height * width, ch * cw
    lead = tuple(planes.shape[:-1])
    if planes.shape[-1] != luma + 2 * chroma:
        raise ValueError(f"{planes.shape[-1]} bytes per frame, but a {width}x{height} frame's YUV 4:2:0 planes are {luma + 2 * chroma}")
    c = {k: int(yuv_to_rgb[k]) for k in ("y_offset", "y_gain", "v_to_r", "u_to_g", "v_to_g", "u_to_b")}
    is_torch = torch is not None and isinstance(planes, torch.Tensor)
    if is_torch:
        flat = planes.reshape(-1, planes.shape[-1]).to(torch.int32)
    else:
        flat = np.asarray(planes).reshape(-1, planes.shape[-1]).astype(np.int32)
    n = flat.shape[0]
    u = 8 * flat[:, luma : luma + chroma].reshape(n, ch, cw) - 1024
    v = 8 * flat[:, luma + chroma :].reshape(n, ch, cw) - 1024
    # The chroma terms at chroma resolution; each covers a 2x2 block of luma (replicated, not
    # interpolated), which an even-sized picture adds by broadcasting.
    r_c = (v * c["v_to_r"]) >> 16
    g_c = ((u * c["u_to_g"]) >> 16) + ((v * c["v_to_g"]) >> 16)
    b_c = (u * c["u_to_b"]) >> 16
    even = height % 2 == 0 and width % 2 == 0
    if even:
        y = flat[:, :luma].reshape(n, ch, 2, cw, 2)
        r_c, g_c, b_c = (t[:, :, None, :, None] for t in (r_c, g_c, b_c))
    else:
        y = flat[:, :luma].reshape(n, height, width)
        if is_torch:
            r_c, g_c, b_c = (t.repeat_interleave(2, dim=1).repeat_interleave(2, dim=2)[:, :height, :width] for t in (r_c, g_c, b_c))
        else:
            r_c, g_c, b_c = (t.repeat(2, axis=1).repeat(2, axis=2)[:, :height, :width] for t in (r_c, g_c, b_c))
    yy = ((8 * y - c["y_offset"]) * c["y_gain"]) >> 16
    if is_torch:
        rgb = torch.stack([yy + r_c, yy + g_c, yy + b_c], dim=-1).clamp_(0, 255).to(torch.uint8)
    else:
        rgb = np.clip(np.stack([yy + r_c, yy + g_c, yy + b_c], axis=-1), 0, 255).astype(np.uint8)
    return rgb.reshape(lead + (height, width, 3))


# How a batch's frames are laid out: "uint8_hwc" (the default) is the decoder's bytes, uint8
# `[..., H, W, 3]`; "lerobot" is what `LeRobotDataset` returns, float32 `[..., 3, H, W]` in [0, 1]
# (each value the uint8 divided by 255). A time window stays the first dimension of a frame
# (`[T, H, W, 3]` or `[T, 3, H, W]` per sample), as in LeRobot.
FRAME_LAYOUTS = ("uint8_hwc", "lerobot")

# uint8 `v` → float32 `v / 255`, correctly rounded: what LeRobot's `frames.type(torch.float32) / 255`
# gives on the CPU (IEEE division, as numpy's). Frames on another device are looked up in this
# table rather than divided there: CUDA divides a tensor by a Python number as a multiplication by
# its reciprocal, 1 ulp off for 126 of the 256 values.
_UNIT = np.arange(256, dtype=np.float32) / np.float32(255)
# `_UNIT` as a tensor on each device it was needed on.
_UNIT_ON: Dict[str, Any] = {}


def _frame_layout(layout: Optional[str]) -> str:
    """`layout` checked against `FRAME_LAYOUTS`; None is the default."""
    if layout is None:
        return FRAME_LAYOUTS[0]
    if layout not in FRAME_LAYOUTS:
        close = difflib.get_close_matches(str(layout), FRAME_LAYOUTS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"frame_layout {layout!r} is not one of {', '.join(map(repr, FRAME_LAYOUTS))}{hint}")
    return layout


def to_lerobot_layout(frames: Any) -> Any:
    """uint8 RGB frames `[..., H, W, 3]` in LeRobot's layout: float32 `[..., 3, H, W]` in [0, 1],
    each value exactly the uint8 divided by 255, as `LeRobotDataset` returns them (a window's time
    dimension, and any other leading one, stays where it is). A numpy array is converted on the
    CPU; a torch tensor on its own device (a GPU: move the uint8 frames there first, a quarter of
    the bytes of float32). The result is contiguous."""
    if frames.shape[-1:] != (3,) or len(frames.shape) < 3:
        raise ValueError(f"frames of shape {tuple(frames.shape)} are not RGB [..., H, W, 3]")
    if torch is not None and isinstance(frames, torch.Tensor):
        if frames.dtype != torch.uint8:
            raise TypeError(f"to_lerobot_layout takes uint8 frames, not {frames.dtype}")
        if frames.device.type == "cpu":
            return torch.from_numpy(_unit_chw(frames.numpy()))
        return _unit_lookup(frames)
    frames = np.asarray(frames)
    if frames.dtype != np.uint8:
        raise TypeError(f"to_lerobot_layout takes uint8 frames, not {frames.dtype}")
    return _unit_chw(frames)


def _unit_lookup(frames: Any) -> Any:
    """uint8 tensor `[..., H, W, 3]` as float32 `[..., 3, H, W]` / 255 on its own device, by
    looking the values up in `_UNIT` there (exact on any device), contiguous."""
    table = _UNIT_ON.get(str(frames.device))
    if table is None:
        table = _UNIT_ON[str(frames.device)] = torch.from_numpy(_UNIT).to(frames.device)
    n = frames.dim()
    chw = frames.permute(*range(n - 3), n - 1, n - 3, n - 2).contiguous()
    return torch.index_select(table, 0, chw.reshape(-1).to(torch.int32)).reshape(chw.shape)


def _unit_chw(frames: np.ndarray) -> np.ndarray:
    """uint8 `[..., H, W, 3]` as float32 `[..., 3, H, W]` / 255 on the CPU, C-contiguous."""
    out = np.ascontiguousarray(np.moveaxis(frames, -1, -3)).astype(np.float32)
    return np.divide(out, np.float32(255), out=out)


def frames_to_rgb(batch: Dict[str, Any], device: Any = None, frame_layout: Optional[str] = None) -> Dict[str, Any]:
    """Turns the YUV planes of a batch's cameras (`frame_format="yuv420p"`, named under
    `FRAMES_KEY`) into uint8 RGB frames `[B, H, W, 3]` (`[B, T, H, W, 3]` with a window), the
    bytes LeRobot's frames would have; returns the batch (changed in place), without
    `FRAMES_KEY`. Torch tensors are converted on `device` (e.g. `"cuda"`: the planes move there,
    half the bytes of RGB, and the RGB is made there), or on their own device when it is None;
    numpy arrays on the CPU. A batch without planes is returned as it is.

    With `frame_layout="lerobot"` (see `FRAME_LAYOUTS`), or when the batch comes from a
    `LakeIterableDataset(frame_layout="lerobot")`, which records it with the planes, the RGB
    frames are then made LeRobot's float32 `[B, 3, H, W]` (`[B, T, 3, H, W]`) in [0, 1] on the same
    device (`to_lerobot_layout`)."""
    cameras = batch.pop(FRAMES_KEY, None) or {}
    asked = None if frame_layout is None else _frame_layout(frame_layout)
    for key, facts in cameras.items():
        planes = batch[key]
        if device is not None and torch is not None and isinstance(planes, torch.Tensor):
            planes = planes.to(device, non_blocking=True)
        rgb = yuv420p_to_rgb24(planes, int(facts["height"]), int(facts["width"]), facts["yuv_to_rgb"])
        if (asked or facts.get("frame_layout")) == "lerobot":
            rgb = to_lerobot_layout(rgb)
        batch[key] = rgb
    return batch


def _datasets(datasets: Union[DatasetSpec, Sequence[DatasetSpec]]) -> List[DatasetSpec]:
    """A request's `datasets`: one name, or a list of names and `{"name", "weight"}` dicts."""
    if isinstance(datasets, str):
        return [datasets]
    if isinstance(datasets, dict):
        if "name" in datasets:
            return [datasets]
        raise TypeError(
            "`datasets` takes dataset names or {\"name\": ..., \"weight\": ...} entries, not a whole "
            "sampling request: pass its fields as keyword arguments"
        )
    out = list(datasets)
    for entry in out:
        if not isinstance(entry, (str, dict)):
            raise TypeError(f"a `datasets` entry is a name or a {{\"name\", \"weight\"}} dict, not {type(entry).__name__}")
    if not out:
        raise ValueError("`datasets` names no dataset")
    return out


# The process that made a Flight (gRPC) client, if any: gRPC does not survive a fork, so a
# DataLoader worker forked from it may hang on its first call.
_FLIGHT_PID: Optional[int] = None


# gRPC pings the server every 20 s on a quiet connection and gives up on it when a ping goes
# unanswered for 20 s: a stream from a server that froze, or whose host went away, ends in a
# `LakeError("unavailable")` instead of waiting for ever. Pings go on while a stream only
# receives (`max_pings_without_data` 0), which is all a sampling stream does.
_GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", -1),
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 20_000),
    ("grpc.http2.max_pings_without_data", 0),
]


def _sent(request: Dict[str, Any]) -> Dict[str, Any]:
    """A request as sent: a field set to None is left out, so the server takes its default,
    except `delta_timestamps`, whose `null` the server reads as "no windows" (it replaces the
    preset)."""
    return {k: v for k, v in request.items() if v is not None or k == "delta_timestamps"}


def _limit(request: Dict[str, Any]) -> Optional[int]:
    """The batches a request's stream sends: its `limit_batches` (one batch per step, a rank
    whose slice of an epoch's short last step is empty getting a batch of 0 rows there), None
    without one (endless)."""
    limit = request.get("limit_batches")
    return None if limit is None else int(limit)


class _Counted:
    """`len()` of a stream of batches: those still to come, when its request has a limit."""

    _left: Optional[int] = None

    def __len__(self) -> int:
        if self._left is None:
            raise TypeError(
                "len() of an endless stream: its request has no `limit_batches`, so it goes on across epochs for "
                "ever; set `limit_batches` to bound it (info(request)[\"steps_per_epoch\"] batches are one epoch)"
            )
        return self._left

    def __bool__(self) -> bool:
        return True

    def _took_one(self) -> None:
        if self._left is not None:
            self._left = max(0, self._left - 1)


class _Batches(_Counted):
    """A local stream's batches (a generator), with `len()` and `close()`."""

    def __init__(self, batches: Iterator[pa.RecordBatch], limit: Optional[int]):
        self._batches, self._left = batches, limit

    def __iter__(self) -> "_Batches":
        return self

    def __next__(self) -> pa.RecordBatch:
        batch = next(self._batches)
        self._took_one()
        return batch

    def close(self) -> None:
        """Stops reading and closes the stream."""
        self._batches.close()


class LakeClient:
    """A connection to `lake serve`'s Flight endpoint, or to several servers over one lake.

    With several locations, each stream goes to one of them (spread by the request's rank and
    start step, so the ranks of a job share the servers), and when that server becomes
    unavailable (it went away, or is shutting down) the stream moves to the next one and
    resumes exactly after the last batch received: the same batches, in the same order, as one
    server would have sent. Requests are pinned to the dataset versions the first server read,
    so every server reads the same ones.

    `resume_wait_s` (default 0) is how long a stream waits, in one outage, once every server
    is unavailable (restarting, or the lake's object store unreachable): it asks again after
    pauses of 0.5 s growing to 5 s, warning once (`RuntimeWarning`), and resumes after the last
    batch received when a server takes it; past that wait it raises `LakeError("unavailable")`.
    With 0 the stream raises at once. Only a stream that has begun waits: a request the servers
    cannot plan is refused at once.

    gRPC, which Flight runs on, is not fork-safe: in a process forked after this one made a
    client (the default start of `torch.utils.data.DataLoader` workers on Linux), a call can
    hang. Start such workers with `multiprocessing_context="spawn"` (or `"forkserver"`), or read
    a local socket (`LocalClient`), which is."""

    def __init__(
        self,
        location: Union[str, Sequence[str]] = "grpc://127.0.0.1:50051",
        token: Optional[str] = None,
        resume_wait_s: float = 0.0,
    ):
        global _FLIGHT_PID
        if not resume_wait_s >= 0:
            raise ValueError(f"resume_wait_s must be 0 or more seconds, not {resume_wait_s!r}")
        self.resume_wait_s = float(resume_wait_s)
        _FLIGHT_PID = os.getpid()
        self.locations = [location] if isinstance(location, str) else list(location)
        if not self.locations:
            raise LakeError("bad_request", "no server location given")
        self.location = self.locations[0]
        self._clients = []
        for where in self.locations:
            try:
                self._clients.append(flight.FlightClient(where, generic_options=_GRPC_OPTIONS))
            except (pa.ArrowException, ValueError, TypeError) as e:
                raise LakeError("bad_request", f"{where!r} is not a Flight location (grpc://HOST:PORT): {e}") from e
        self._client = self._clients[0]
        headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
        self._options = flight.FlightCallOptions(headers=headers)

    def _on_any(self, call, first: int = 0):
        """`call(client)` on the servers in turn from `first`, until one is available."""
        last = None
        for k in range(len(self._clients)):
            try:
                return call(self._clients[(first + k) % len(self._clients)])
            except pa.ArrowException as e:
                last = _lake_error(e)
                if last.code != "unavailable":
                    raise last from e
        raise last

    def datasets(self) -> List[Dict[str, Any]]:
        """The datasets the server offers: name, latest version and step count."""

        def listed(client):
            out = []
            for info in client.list_flights(options=self._options):
                request = json.loads(info.descriptor.command)
                name, _, version = request["datasets"][0].partition("@")
                out.append({"name": name, "version": int(version) if version else None, "steps": info.total_records})
            return out

        return self._on_any(listed)

    def info(self, request: Dict[str, Any]) -> Dict[str, Any]:
        """Schema and epoch shape (`epoch_len`, `steps_per_epoch`) of a sampling request, and
        its `datasets` pinned to the versions the server reads (`name@version`): a request
        that carries them reads the same versions whatever is ingested later. A field set to
        None is left out (the server's default), except `delta_timestamps`, whose None the
        server reads as no windows."""
        return self._info(request, self._first(request))

    def _info(self, request: Dict[str, Any], first: int) -> Dict[str, Any]:
        descriptor = flight.FlightDescriptor.for_command(json.dumps(_sent(request)).encode())
        info = self._on_any(lambda client: client.get_flight_info(descriptor, self._options), first)
        shape = json.loads(info.app_metadata or b"{}")
        return {"schema": info.schema, "ticket": info.endpoints[0].ticket, **shape}

    def _first(self, request: Dict[str, Any]) -> int:
        """The server a request's stream starts on: the readers of a job (ranks, and the
        readers of one rank that take turns by `step_stride`) spread over the servers."""
        stride = max(1, int(request.get("step_stride") or 1))
        reader = int(request.get("rank") or 0) * stride + int(request.get("start_step") or 0) % stride
        return reader % len(self._clients)

    def batches(self, request: Dict[str, Any]) -> Iterator[pa.RecordBatch]:
        """The request's batches, in order (one record batch per training batch). Closing the
        iterator early (or dropping it) cancels the stream, so the server stops preparing it.
        With `limit_batches` in the request, `len()` of the iterator is the batches still to
        come (one per step, a batch of 0 rows where a rank's slice of an epoch's short last
        step is empty); without it the stream is endless and `len()` raises `TypeError`. None
        fields are left out, as in `info`. With several servers, a stream whose server becomes
        unavailable resumes on the next one after the last batch received; with
        `resume_wait_s`, on a server that answers again within that time, the same one too.

        The stream is read on a thread of its own, one batch ahead of the caller: a read
        blocked in gRPC does not see Ctrl-C, a wait on that thread does."""
        request = _sent(request)
        if len(self._clients) == 1 and self.resume_wait_s == 0:
            return self._stream(0, request)
        first = self._first(request)
        return _Failover(request, self._info(request, first), first, len(self._clients), self._stream, self.resume_wait_s)

    def _stream(self, server: int, request: Dict[str, Any]) -> "_Prefetch":
        """The request's stream from server `server`, ending at its first failure."""
        ticket = flight.Ticket(json.dumps(request).encode())
        client = self._clients[server]
        return _Prefetch(lambda: client.do_get(ticket, self._options), _limit(request))


class _Failover(_Counted):
    """A stream that outlives its server: on `unavailable` it moves to the next of `servers`
    (Flight servers over one lake, or the one local socket) and asks for the batches after the
    last one received (the cursor advanced by `step_stride` steps a batch, epochs wrapping every
    `steps_per_epoch` steps of the plan `info`). Once every server has failed twice in a row it
    waits for one, up to `patience` seconds (`resume_wait_s`), with pauses from `_FIRST_PAUSE_S`
    doubling up to `_LONGEST_PAUSE_S`; `moves` counts the times the stream was asked for again.
    `open_on(server, request)` is the request's stream from one server, ending at its first
    failure."""

    def __init__(self, request: Dict[str, Any], info: Dict[str, Any], first: int, servers: int, open_on, patience: float):
        # Every server reads the versions the first plan pinned.
        self._request = {**request, "datasets": info.get("datasets") or request["datasets"]}
        self._steps_per_epoch = int(info["steps_per_epoch"])
        self._server, self._servers, self._open_on, self._patience = first, servers, open_on, patience
        self._left = _limit(request)
        self._stream = None
        self._done = False
        self.moves = 0

    def _open(self) -> None:
        request = dict(self._request)
        if self._left is not None:
            request["limit_batches"] = self._left
        self._stream = self._open_on(self._server, request)

    def __iter__(self) -> "_Failover":
        return self

    def __next__(self) -> pa.RecordBatch:
        if self._done or self._left == 0:
            raise StopIteration
        tried, waited, pause = 0, 0.0, _FIRST_PAUSE_S
        servers, patience = self._servers, self._patience
        while True:
            try:
                if self._stream is None:
                    self._open()
                batch = next(self._stream)
            except LakeError as e:
                if self._stream is not None:
                    self._stream.close()
                self._stream = None
                if e.code != "unavailable":
                    self._done = True
                    raise
                tried += 1
                self._server = (self._server + 1) % servers
                if tried >= 2 * servers:
                    # Every server failed twice in a row: wait for one, as long as allowed.
                    if waited + pause > patience:
                        self._done = True
                        if patience == 0:
                            raise
                        raise LakeError("unavailable", f"{e.message}; no server of the lake took the stream "
                                        f"again within {patience:g} s (resume_wait_s)") from e
                    if waited == 0:
                        warnings.warn(f"lake: every server of the lake is unavailable ({e.message}); the stream "
                                      f"resumes when one answers, within {patience:g} s", RuntimeWarning, stacklevel=2)
                    time.sleep(pause)
                    waited, pause, tried = waited + pause, min(2 * pause, _LONGEST_PAUSE_S), 0
                self.moves += 1
                continue
            except StopIteration:
                self._done = True
                raise
            self._advance()
            self._took_one()
            return batch

    def _advance(self) -> None:
        """The request's cursor moved past the batch just received."""
        stride = max(1, int(self._request.get("step_stride") or 1))
        at = int(self._request.get("epoch") or 0) * self._steps_per_epoch + int(self._request.get("start_step") or 0) + stride
        self._request["epoch"], self._request["start_step"] = divmod(at, self._steps_per_epoch)

    def close(self) -> None:
        """Stops reading and cancels the stream, if it is still open."""
        self._done = True
        if self._stream is not None:
            self._stream.close()

    def __del__(self) -> None:
        self.close()


# The first pause of a stream waiting for an unavailable lake, and the longest: pauses double.
_FIRST_PAUSE_S = 0.5
_LONGEST_PAUSE_S = 5.0


class _Prefetch(_Counted):
    """A Flight stream's batches, read by a daemon thread into a one-batch queue. Closing it
    (or dropping it, or an exception in the caller such as Ctrl-C) cancels the stream. The
    thread holds only the shared `_PrefetchState`, never this object, so dropping it is seen."""

    def __init__(self, open_stream, limit: Optional[int] = None):
        self._state = _PrefetchState()
        self._done = False
        self._left = limit
        threading.Thread(target=self._state.run, args=(open_stream,), name="lake-flight-stream", daemon=True).start()

    def __iter__(self) -> "_Prefetch":
        return self

    def __next__(self) -> pa.RecordBatch:
        if self._done:
            raise StopIteration
        try:
            item = self._state.queue.get()
        except BaseException:
            self.close()
            raise
        if item is _PrefetchState.END:
            self._done = True
            raise StopIteration
        if isinstance(item, BaseException):
            self.close()
            if isinstance(item, _ArrowException):
                raise _lake_error(item) from item
            raise item
        self._took_one()
        return item

    def close(self) -> None:
        """Stops reading and cancels the stream, if it is still open."""
        if not self._done:
            self._done = True
            self._state.close()

    def __del__(self) -> None:
        self.close()


class _PrefetchState:
    """What a `_Prefetch` and its reading thread share."""

    END = object()

    def __init__(self):
        import queue

        self.queue: "queue.Queue" = queue.Queue(maxsize=1)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.reader = None

    def put(self, item) -> bool:
        """Hands `item` over, waiting for room; False once the stream was closed."""
        import queue

        while not self.stop.is_set():
            try:
                self.queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def run(self, open_stream) -> None:
        try:
            reader = open_stream()
            with self.lock:
                self.reader = reader
                stopped = self.stop.is_set()
            if stopped:
                reader.cancel()
                return
            for chunk in reader:
                if not self.put(chunk.data):
                    return
            self.put(self.END)
        except BaseException as e:  # noqa: BLE001 (handed to the caller's thread)
            if not self.stop.is_set():
                self.put(e)

    def close(self) -> None:
        self.stop.set()
        with self.lock:
            reader = self.reader
        if reader is not None:
            try:
                reader.cancel()
            except Exception:  # noqa: BLE001 (the stream may be gone already)
                pass


class LakeError(Exception):
    """A request the server refused or a stream that failed, over Flight or a local socket:
    `code` (`bad_request`, `not_found`, `busy`, `unauthorized`, `unavailable` (the server is
    shutting down, or went away or stopped answering: resume from the next step), `frame` (a
    frame the lake's data cannot give: damaged, or not in the form asked for; the message names
    it), `internal`) and the server's message. Over
    Flight, the pyarrow error it came from is its `__cause__`."""

    def __init__(self, code: str, message: Optional[str] = None):
        if message is None:
            # One argument: the text of an error raised again elsewhere (torch re-raises a
            # DataLoader worker's exception as its type called with the worker's traceback);
            # the code is the one that text ends with.
            last = [line for line in code.strip().splitlines() if line.strip()][-1:] or [""]
            found = re.search(r"\((\w+)\)\s*$", last[0])
            code, message = (found.group(1) if found else "internal"), code
            super().__init__(message)
        else:
            super().__init__(f"{message} ({code})")
        self.code = code
        self.message = message

    def __reduce__(self):
        return (LakeError, (self.code, self.message))


def _lake_error(e: Exception) -> LakeError:
    """A pyarrow Flight error as a `LakeError`: its gRPC status as lake's code, and the
    server's message without gRPC's debug context."""
    text = str(e)
    if "with message: " in text:
        text = text.split("with message: ", 1)[1]
    text = text.split(". gRPC client debug context", 1)[0].split(". Client context:", 1)[0]
    if "keepalive watchdog timeout" in text or "ping timeout" in text:
        text = f"the server stopped answering: no reply to a ping in 20 s ({text})"
    # A plain HTTP server answered as no gRPC server does (lake's HTTP port, or another
    # service): not lake's Flight. (A proxy's 502/503 in front of one is left as it is.)
    found = re.search(r"Received http2 header with status: (\d+)", text)
    if found and int(found.group(1)) in (404, 405, 415):
        return LakeError(
            "unavailable",
            f"no Flight service at this address ({text}): give lake serve's --flight address (grpc://HOST:PORT), not its --http one",
        )
    # pyarrow raises RESOURCE_EXHAUSTED as an ArrowInvalid ("gRPC returned resource exhausted
    # error"), so it is told apart by its text before the type says "bad request".
    if "resource exhausted" in str(e).lower() or "RESOURCE_EXHAUSTED" in str(e):
        code = "busy"
    elif isinstance(e, pa.ArrowInvalid):
        code = "bad_request"
    elif isinstance(e, pa.ArrowKeyError):
        code = "not_found"
    elif isinstance(e, (flight.FlightUnauthenticatedError, flight.FlightUnauthorizedError)):
        code = "unauthorized"
    elif isinstance(e, flight.FlightUnavailableError):
        code = "unavailable"
    elif "data loss" in str(e).lower():
        code = "frame"
    else:
        code = "internal"
    return LakeError(code, text)


def _tensor(value: np.ndarray, shared: bool):
    """A writable torch tensor holding `value` (Arrow's buffers are read-only). In a DataLoader
    worker it is made in shared memory at once: the worker's queue then sends a handle instead
    of copying the batch into shared memory on its feeder thread, which saves a copy and leaves
    that thread nothing to do when the worker exits (PyTorch lets a worker exit while its feeder
    still copies a batch made ahead, and the interpreter's shutdown then aborts the worker)."""
    if not shared:
        return torch.from_numpy(np.require(value, requirements=["C", "W"]))
    dtype = torch.from_numpy(np.empty(0, dtype=value.dtype)).dtype
    new_shared = getattr(torch.UntypedStorage, "_new_shared", None)
    if new_shared is not None:
        tensor = torch.empty(0, dtype=dtype).set_(new_shared(value.nbytes), 0, value.shape)
    else:
        tensor = torch.empty(value.shape, dtype=dtype).share_memory_()
    tensor.numpy()[...] = value
    return tensor


def _frame(kind: bytes, payload: bytes = b"") -> bytes:
    return struct.pack("<I", 1 + len(payload)) + kind + payload


# Seconds a local stream waits for its next batch, with every slot held by a batch still alive,
# before it warns that the trainer must drop (or copy) a batch first.
STALL_WARNING_S = 10.0
# How long a local stream waits for a server that sends nothing, not even the keepalive it sends
# every second (frozen, or too loaded to run), before it raises `unavailable`.
SERVER_TIMEOUT_S = 60.0
# How long a dataset's Flight stream waits for an unavailable lake by default (`resume_wait_s`).
RESUME_WAIT_S = 60.0

#: The key of every `LakeIterableDataset` batch that holds `[epoch, step]` of the batch after
#: it in the rank's sequence (what `state_dict(after=batch)` resumes from).
CURSOR_KEY = "lake.cursor"


class _Slot:
    """Owns one slot of a local stream while any array of its batch is alive; gives it back
    to the server when the last one goes (Arrow holds this object as the buffer's base)."""

    def __init__(self, stream: "_LocalStream", segment: int, slot: int, memory):
        self._stream, self._segment, self._slot, self._memory = stream, segment, slot, memory
        stream.hold()

    def __del__(self):
        self._stream.give_back(self._segment, self._slot)


class _LocalStream:
    """The messages of one local stream, and the descriptors that come with them."""

    MAX_MESSAGE = 16 << 20

    def __init__(self, sock: socket.socket, slots: int = 0, server_timeout_s: float = SERVER_TIMEOUT_S):
        self.sock, self.buf, self.fds = sock, bytearray(), []
        # When the server was last heard from (it sends a keepalive every second it is quiet).
        self.heard, self.server_timeout_s = time.monotonic(), server_timeout_s
        # poll, not select: a trainer may hold more than 1024 descriptors.
        self.poller = select.poll()
        self.poller.register(sock, select.POLLIN)
        # Re-entrant: a slot's finaliser may run inside another's send (a collection there).
        self.lock = threading.RLock()
        self.closed = False
        # Slots whose batches are alive, of `slots` (0: not a batch stream).
        self.slots, self.held, self.warned = slots, 0, False

    def hold(self) -> None:
        with self.lock:
            self.held += 1

    def _warn_stalled(self) -> None:
        """Warns once that the server cannot send: every slot holds a batch still alive."""
        self.warned = True
        warnings.warn(
            f"a local stream has waited {STALL_WARNING_S:g} s for its next batch while {self.held} batches hold "
            f"all {self.slots} of its slots: drop a batch (or copy it) before asking for the next, or ask for "
            "more slots (a `for` loop holds its last batch while it asks for the next: with one slot, `del` it "
            "at the end of the loop body)",
            RuntimeWarning,
            stacklevel=4,
        )

    def _message(self):
        """The next whole message in the buffer, or None."""
        if len(self.buf) < 5:
            return None
        (length,) = struct.unpack_from("<I", self.buf)
        if not 0 < length <= self.MAX_MESSAGE:
            raise LakeError("protocol", f"a message of {length} bytes from the server")
        if len(self.buf) < 4 + length:
            return None
        kind, payload = bytes(self.buf[4:5]), bytes(self.buf[5 : 4 + length])
        del self.buf[: 4 + length]
        return kind, payload

    def next(self):
        """The next message other than a keepalive. The server's silence counts from when it was
        last heard from or this was asked for, whichever is later: keepalives wait unread in the
        socket while the trainer works between batches."""
        asked = time.monotonic()
        while True:
            message = self._message()
            if message is not None:
                if message[0] == b"K":
                    continue
                return message
            now = time.monotonic()
            stalled = not self.warned and self.slots and self.held >= self.slots
            if stalled and now - asked >= STALL_WARNING_S:
                self._warn_stalled()
                stalled = False
            wait = max(self.heard, asked) + self.server_timeout_s - now
            if wait <= 0:
                raise LakeError(
                    "unavailable",
                    f"the server sent nothing for {self.server_timeout_s:g} s: it stopped answering (frozen, or too "
                    "loaded to run); resume from the next step",
                )
            if stalled:
                wait = min(wait, asked + STALL_WARNING_S - now)
            if not self.poller.poll(max(1, int(wait * 1000 + 0.999))):
                continue
            try:
                data, fds, _, _ = socket.recv_fds(self.sock, 1 << 16, 8)
            except (ConnectionResetError, BrokenPipeError):
                # A server killed with our slot give-backs unread resets the connection.
                data, fds = b"", []
            if not data:
                # Closed without an error message: the server stopped (or cut a client that
                # held every slot through a shutdown) or went away, as Flight's UNAVAILABLE.
                raise LakeError("unavailable", "the server closed the stream (it stopped or went away); resume from the next step")
            self.heard = time.monotonic()
            self.buf += data
            self.fds += fds

    def give_back(self, segment: int, slot: int) -> None:
        message = _frame(b"R", struct.pack("<II", segment, slot))
        with self.lock:
            self.held -= 1
            if self.closed:
                return
            try:
                self.sock.sendall(message)
            except OSError:
                self.closed = True

    def close(self) -> None:
        with self.lock:
            self.closed = True
            self.sock.close()


def _encapsulated(metadata: bytes) -> bytes:
    """An IPC message (metadata only) as the stream format frames it."""
    padded = (8 + len(metadata) + 63) // 64 * 64
    return b"\xff\xff\xff\xff" + struct.pack("<i", padded - 8) + metadata + bytes(padded - 8 - len(metadata))


class LocalClient:
    """Local streams of `lake serve --local PATH`, for trainers on the server's machine.

    The same requests, tokens and batches as `LakeClient.batches`, but each batch is written once
    into shared memory (a slot the server maps to this process) and its arrays are read in
    place. A slot goes back to the server when the last array of its batch is garbage; a stream
    has `slots` (default 2) and waits while all are held, so keep at most that many batches (or
    copy them, as `batch_to_numpy(...)` + `np.array` does); after `STALL_WARNING_S` (10 s) of
    waiting so it warns (`RuntimeWarning`). A `for` loop holds its last batch while it asks for
    the next, so with `slots=1` it must `del` the batch at the end of its body. The server sends a
    keepalive every second it has nothing else to send; a server that sends nothing for
    `server_timeout_s` (default 60 s: frozen, or too loaded to run) ends the stream with
    `LakeError` `unavailable`, as Flight's keepalive pings do.

    `resume_wait_s` (default 0), as `LakeClient`'s: how long a stream waits, in one outage, for
    the server to answer again (restarting, or its lake's object store unreachable), asking again
    after pauses of 0.5 s growing to 5 s and warning once, before it resumes after the last batch
    received; past that wait, or with 0 at once, it raises `LakeError("unavailable")`.
    """

    def __init__(
        self,
        path: str,
        token: Optional[str] = None,
        slots: int = 2,
        server_timeout_s: float = SERVER_TIMEOUT_S,
        resume_wait_s: float = 0.0,
    ):
        if not 1 <= slots <= 16:
            raise ValueError(f"a stream has 1 to 16 slots, not {slots}")
        if not server_timeout_s > 0:
            raise ValueError(f"server_timeout_s must be a positive number of seconds, not {server_timeout_s}")
        if not resume_wait_s >= 0:
            raise ValueError(f"resume_wait_s must be 0 or more seconds, not {resume_wait_s!r}")
        self.path, self.token, self.slots, self.server_timeout_s = path, token, slots, server_timeout_s
        self.resume_wait_s = float(resume_wait_s)

    def info(self, request: Dict[str, Any]) -> Dict[str, Any]:
        """Schema, epoch shape (`epoch_len`, `steps_per_epoch`) and pinned `datasets` of a
        sampling request, as `LakeClient.info` gives them over Flight; raises `LakeError` when
        the server refuses it."""
        stream = self._connect()
        try:
            schema = self._open(stream, b"Q", b"", request)
            kind, payload = stream.next()
            if kind == b"E":
                raise self._refused(payload)
            if kind != b"P":
                raise LakeError("protocol", f"an unexpected message {kind!r} instead of the plan")
            return {"schema": schema, **json.loads(payload)}
        finally:
            stream.close()

    def _connect(self, slots: int = 0) -> _LocalStream:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(self.path)
        except OSError as e:
            sock.close()
            # No server there (never started, or gone leaving its socket file): as Flight says
            # of an address nothing answers at.
            raise LakeError(
                "unavailable", f"no lake server at {self.path} ({e.strerror or e}): start `lake serve --local {self.path}`, or retry"
            ) from e
        return _LocalStream(sock, slots, self.server_timeout_s)

    def _open(self, stream: _LocalStream, kind: bytes, prefix: bytes, request: Dict[str, Any]) -> pa.Schema:
        """Sends the opening message (`H` hello or `Q` describe) and reads the schema back."""
        token = (self.token or "").encode()
        sent = json.dumps(_sent(request)).encode()
        try:
            stream.sock.sendall(_frame(kind, prefix + struct.pack("<I", len(token)) + token + sent))
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server went: reading says so (`unavailable`)
        kind, payload = stream.next()
        if kind == b"E":
            raise self._refused(payload)
        if kind != b"S":
            raise LakeError("protocol", f"an unexpected message {kind!r} before the schema")
        return pa.ipc.read_schema(pa.py_buffer(_encapsulated(payload)))

    def batches(self, request: Dict[str, Any]) -> Iterator[pa.RecordBatch]:
        """The request's batches, in order; raises `LakeError` when the server refuses it. As
        `LakeClient.batches`: None fields are left out, and with `limit_batches` `len()` is the
        batches still to come (without it the stream is endless and `len()` raises
        `TypeError`). With `resume_wait_s`, the stream waits out the server's outages."""
        request = _sent(request)
        if self.resume_wait_s == 0:
            return self._stream(0, request)
        return _Failover(request, self.info(request), 0, 1, self._stream, self.resume_wait_s)

    def _stream(self, _server: int, request: Dict[str, Any]) -> _Batches:
        """The request's stream, ending at its first failure."""
        return _Batches(self._batches(request), _limit(request))

    def _batches(self, request: Dict[str, Any]) -> Iterator[pa.RecordBatch]:
        stream = self._connect(self.slots)
        try:
            schema = self._open(stream, b"H", struct.pack("<I", self.slots), request)
            segment = None
            while True:
                kind, payload = stream.next()
                if kind == b"M":
                    ident, slots, slot_bytes = struct.unpack("<IIQ", payload)
                    if not stream.fds:
                        raise LakeError("protocol", "a segment without its descriptor")
                    fd = stream.fds.pop(0)
                    try:
                        memory = mmap.mmap(fd, slots * slot_bytes, prot=mmap.PROT_READ)
                    finally:
                        os.close(fd)
                    # Batches still alive in an older segment keep it mapped through their slots.
                    segment = (ident, slot_bytes, pa.py_buffer(memory))
                elif kind == b"B":
                    ident, slot, length = struct.unpack("<IIQ", payload)
                    if segment is None or segment[0] != ident or (slot + 1) * segment[1] > segment[2].size or length > segment[1]:
                        raise LakeError("protocol", f"a batch in slot {slot} of segment {ident}, which it did not send")
                    owner = _Slot(stream, ident, slot, segment[2])
                    message = pa.ipc.read_message(pa.foreign_buffer(segment[2].address + slot * segment[1], length, base=owner))
                    del owner
                    batch = pa.ipc.read_record_batch(message, schema)
                    del message
                    yield batch
                    del batch
                elif kind == b"D":
                    return
                elif kind == b"E":
                    raise self._refused(payload)
                else:
                    raise LakeError("protocol", f"an unexpected message {kind!r}")
        finally:
            stream.close()

    @staticmethod
    def _refused(payload: bytes) -> LakeError:
        error = json.loads(payload or b"{}")
        return LakeError(error.get("code", "unknown"), error.get("message", "no message"))


def _rank_and_world() -> tuple:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except ImportError:
        pass
    # torchrun's variables, then those of the MPI launchers (Open MPI, MPICH / Intel MPI) and
    # of Slurm's srun (its step's tasks: a batch script outside srun sees the allocation's
    # SLURM_NTASKS, not a world it belongs to): the first pair set.
    for rank_var, world_var in _RANK_VARIABLES:
        if rank_var in os.environ and world_var in os.environ:
            rank, world = (_whole_env(v) for v in (rank_var, world_var))
            if not 0 <= rank < world:
                raise ValueError(f"{rank_var}={rank} is not a rank of {world_var}={world}")
            return rank, world
    return 0, 1


_RANK_VARIABLES = [("RANK", "WORLD_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE"),
                   ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS")]


def _whole_env(name: str) -> int:
    text = os.environ[name]
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"the environment variable {name}={text!r} is not a whole number") from None


def _agreed(datasets: List[Any]) -> List[Any]:
    """Rank 0's pinned datasets on every rank when `torch.distributed` is initialised (and this
    is not a DataLoader worker), so that a version ingested while the ranks start cannot split
    them; the ranks' own pins otherwise."""
    try:
        import torch.distributed as dist
        from torch.utils.data import get_worker_info
    except ImportError:
        return datasets
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1 or get_worker_info() is not None:
        return datasets
    box = [datasets]
    dist.broadcast_object_list(box, src=0)
    return box[0]


try:
    import torch
    from torch.utils.data import IterableDataset as _IterableDataset
except ImportError:  # the numpy client works without torch
    torch = None
    _IterableDataset = object


def worker_cursor(
    epoch: int, step: int, worker: int, workers: int, steps_per_epoch: int, epochs: Optional[int] = None
) -> tuple:
    """Where DataLoader worker `worker` of `workers` starts and how many batches it asks for.

    `(epoch, step)` is the next global step of the rank's sequence (the dataset's cursor); the
    worker starts `worker` steps after it (epochs wrap every `steps_per_epoch` steps) and takes
    every `workers`-th step from there, so the DataLoader's round robin over the workers yields
    the single-process sequence. Returns `(epoch, step, limit_batches)`: the limit is `None`
    without `epochs`, else this worker's share of the steps left before epoch `epochs`
    (0: nothing left for it). A worker resuming from its own cursor passes `worker=0`.
    """
    if workers < 1 or not 0 <= worker < workers:
        raise ValueError(f"worker {worker} of {workers}")
    if steps_per_epoch <= 0:
        return epoch, step, 0
    start = epoch * steps_per_epoch + step + worker
    start_epoch, start_step = divmod(start, steps_per_epoch)
    if epochs is None:
        return start_epoch, start_step, None
    remaining = epochs * steps_per_epoch - start
    return start_epoch, start_step, max(0, -(-remaining // workers))


def _under_stateful_dataloader() -> bool:
    """Whether this call comes from torchdata's `StatefulDataLoader` (its worker loop or
    iterator is on the stack): it saves and restores each worker's state itself."""
    frame = sys._getframe(1)
    while frame is not None:
        if str(frame.f_globals.get("__name__", "")).startswith("torchdata.stateful_dataloader"):
            return True
        frame = frame.f_back
    return False


# Whether this process has warned that its DataLoader workers' progress is not in the main
# process's state_dict(), and that it was forked after a Flight client was made.
# Kept for `except` clauses that run while the interpreter exits (a generator closed then), when
# the module's globals may already be gone.
_ArrowException = pa.ArrowException

_WARNED_WORKER_STATE = False
_WARNED_FORKED_FLIGHT = False


# The fields of a sampling request that `LakeIterableDataset` takes as keyword arguments besides
# its named parameters (the server's `SampleRequest`, less the fields the dataset sets itself).
_REQUEST_KEYWORDS = ("shuffle", "epoch", "start_step", "drop_last", "episodes", "drop_n_first_frames",
                     "drop_n_last_frames", "frame_size", "frame_format", "proxy")
# Fields the dataset sets itself, refused with the reason.
_OWNED_KEYWORDS = ("limit_batches", "step_stride")
# Keyword arguments people give a dataset by habit, with what to do instead.
_KEYWORD_HINTS = {
    "num_workers": "that is torch.utils.data.DataLoader's argument",
    "pin_memory": "that is torch.utils.data.DataLoader's argument",
    "prefetch_factor": "that is torch.utils.data.DataLoader's argument",
    "persistent_workers": "that is torch.utils.data.DataLoader's argument",
    "collate_fn": "that is torch.utils.data.DataLoader's argument (batches come ready-made: batch_size=None there)",
    "root": "the server reads its lake; name the dataset in `datasets`",
    "repo_id": "name the lake's dataset in `datasets`",
}


def _refuse_unknown(owner: str, given: Sequence[str], valid: Sequence[str], refused: Sequence[str] = ()) -> None:
    """Raises `TypeError` naming the keyword arguments of `given` neither in `valid` nor in
    `refused` (known, and refused later with their reason), with the closest valid one (or a
    hint) for each and the list of valid ones."""
    unknown = [k for k in given if k not in valid and k not in refused]
    if not unknown:
        return
    said = []
    for name in unknown:
        hint = _KEYWORD_HINTS.get(name)
        if hint is None:
            close = difflib.get_close_matches(name, valid, n=1)
            hint = f"did you mean {close[0]!r}?" if close else None
        said.append(f"{name!r}" + (f" ({hint})" if hint else ""))
    many = "s" if len(unknown) > 1 else ""
    raise TypeError(
        f"{owner} got an unexpected keyword argument{many} {', '.join(said)}; its keyword arguments are "
        f"{', '.join(sorted(valid))}"
    )


def _rgb_cameras(schema: pa.Schema) -> set:
    """The camera columns of `schema` that carry RGB frames (not YUV planes, nor packets' frame
    numbers)."""
    metadata = [(f.name, f.metadata or {}) for f in schema]
    return {name for name, meta in metadata if meta.get(b"layout") and meta.get(b"pixel_format", b"rgb24") == b"rgb24"}


def _worker() -> tuple:
    """`(id, num_workers)` of this DataLoader worker, `(0, 1)` outside one."""
    info = torch.utils.data.get_worker_info() if torch is not None else None
    return (0, 1) if info is None else (info.id, info.num_workers)


# `LakeIterableDataset`'s named parameters (each also a keyword argument).
_NAMED_KEYWORDS = ("location", "datasets", "preset", "delta_timestamps", "batch_size", "seed", "epochs", "token", "rank",
                   "world_size", "local", "server_timeout_s", "frame_layout", "resume_wait_s")


class LakeIterableDataset(_IterableDataset):  # type: ignore[misc]
    """Batches from `lake serve` as a PyTorch `IterableDataset` of ready-made dict batches.

    With `frame_format="yuv420p"` the server sends the video cameras whose frames are 8-bit 4:2:0
    as the decoder's YUV planes (half the bytes, and no colour conversion on the server's CPU);
    `frames_to_rgb(batch, device="cuda")` in the training loop turns them into the RGB frames
    LeRobot would give, byte for byte, on the GPU.

    Use it with `DataLoader(ds, batch_size=None)` (or iterate it directly). With `local=PATH`
    (the server's `--local` socket, same machine) the batches arrive in shared memory and
    `location` (Flight) may be `None`; `server_timeout_s` (default 60) is how long a local
    stream waits for a server that sends nothing (see `LocalClient`). A stream rides out an
    outage (every server of `location`, or the local one, restarting, or the lake's object store
    unreachable) of up to `resume_wait_s` (default 60) and resumes after the last batch it
    received (see `LakeClient`); 0 raises `LakeError("unavailable")` at once. Every rank gets its
    disjoint slice of each global batch of `batch_size * world_size` samples; `state_dict()`
    records `(epoch, step)` after the last batch handed out and `load_state_dict()` resumes
    exactly there, also with a different world size when the global batch stays the same.
    Other request fields are keyword arguments (`shuffle`: `False` gives the eligible steps in
    the order recorded, every epoch the same, for an evaluation pass; `episodes`, `drop_last`,
    `drop_n_first_frames`, `drop_n_last_frames`, `frame_size`, `frame_format`, `proxy`: the
    frames of each dataset's training proxy, lossy, labelled `lake:proxy`); `epoch` and
    `start_step` among them start the cursor there. A keyword argument that is neither is refused when the dataset is
    made (`TypeError`, naming it, the closest valid one and all of them). None is unset: the
    server's default (`episodes=None` samples every episode, `preset=None` is `"none"`);
    `batch_size` and `seed` take no None. `epochs` bounds a run (the stream ends before epoch
    `epochs`), and `len(ds)` is then the batches it yields (see `__len__`); without it the
    stream is endless and `len()` raises `TypeError`. The dataset sets `step_stride` and
    `limit_batches` itself and refuses them.

    Frames come as uint8 `[B, H, W, 3]` (`[B, T, H, W, 3]` with a window of frames), the
    decoder's bytes. With `frame_layout="lerobot"` they come as `LeRobotDataset` returns them:
    float32 `[B, 3, H, W]` (`[B, T, 3, H, W]`) in [0, 1], each value exactly the uint8 / 255,
    converted where the dataset runs (a DataLoader worker, or the CPU); with
    `frame_format="yuv420p"` too, `frames_to_rgb(batch, device=...)` converts the planes to
    RGB and then to that layout, on the device. To convert RGB frames on the GPU instead (a
    quarter of the bytes to move), keep the default layout and call
    `to_lerobot_layout(frames.to("cuda"))`.

    DataLoader workers (`num_workers=W`) share the rank's sequence: worker `w` reads global
    steps `cursor + w`, `cursor + w + W`, … (the request's `step_stride`), so the DataLoader's
    round robin yields exactly the batches, in the order, that `num_workers=0` yields, and
    `epochs` still bounds the whole. Each worker keeps its own cursor, in its own process:

    - With a plain `torch.utils.data.DataLoader` and workers, the main process's copy of the
      dataset does not see the workers' progress, so checkpoint with `state_dict(after=batch)`:
      every batch carries `"lake.cursor"` (`[epoch, step]` of the batch after it), and the
      DataLoader hands batches out in the rank's order, so the state after the last batch
      trained on resumes exactly (call `pin()` before making the DataLoader, so the state names
      the versions the workers read). Plain `state_dict()` there stays where iteration started,
      and iterating the loader again starts from there again (unless `persistent_workers=True`).
      torchdata's `StatefulDataLoader` instead calls `state_dict()` / `load_state_dict()` in
      each worker. Worker 0 warns once about this (except under `StatefulDataLoader`).
    - In a worker, `state_dict()` is that worker's own next step plus `"worker"` and
      `"workers"`; `load_state_dict()` of it in the same worker (of as many workers) resumes
      that worker's stride exactly. A state saved without workers (or before a worker started)
      starts worker `w` at its cursor + `w`, so a single-process checkpoint resumes under
      workers too.
    - Over Flight, start the workers with `multiprocessing_context="spawn"` (or `"forkserver"`)
      when this process has made a Flight client (iterated a dataset, called `LakeClient`):
      gRPC is not fork-safe, and a forked worker's first call can hang (it warns). Local
      streams (`local=PATH`) are plain sockets and fork safely.
    """

    def __init__(
        self,
        location: Optional[str],
        datasets: Sequence[DatasetSpec],
        preset: Optional[str] = "none",
        delta_timestamps: Optional[Dict[str, List[float]]] = None,
        batch_size: int = 32,
        seed: int = 0,
        epochs: Optional[int] = None,
        token: Optional[str] = None,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        local: Optional[str] = None,
        server_timeout_s: float = SERVER_TIMEOUT_S,
        frame_layout: Optional[str] = None,
        resume_wait_s: float = RESUME_WAIT_S,
        **request: Any,
    ):
        if torch is None:
            raise ImportError("LakeIterableDataset needs torch; LakeClient works without it")
        _refuse_unknown("LakeIterableDataset", list(request), _REQUEST_KEYWORDS + _NAMED_KEYWORDS, _OWNED_KEYWORDS)
        # None is unset: the server's default (every episode, drop_last true, …).
        request = {k: v for k, v in request.items() if v is not None}
        if location is None and local is None:
            raise ValueError("give the server's Flight `location`, its `local` socket, or both")
        for name, value, why in (("batch_size", batch_size, "the samples in each rank's batch (batches come ready-made: "
                                  "give the DataLoader batch_size=None)"),
                                 ("seed", seed, "the sample order is a pure function of seed and epoch, the same on "
                                  "every rank: None is no random seed here")):
            if value is None:
                raise TypeError(f"{name} must be a whole number, not None: {why}")
        if epochs is not None and (isinstance(epochs, bool) or int(epochs) != epochs or epochs < 0):
            raise ValueError(f"epochs must be a whole number, 0 or more (None: endless), not {epochs!r}")
        if hasattr(request.get("episodes"), "__len__") and len(request["episodes"]) == 0:
            raise ValueError("episodes=[] selects no episode: leave it out (or None) to sample every episode")
        if request.get("frame_format") == "packets":
            raise ValueError(
                'frame_format="packets" sends compressed GOPs for a trainer that decodes them (lake train '
                '--decode cpu); a dataset yields frames: ask for "rgb24" or "yuv420p" (LakeClient.batches passes '
                "packet batches through as they are)"
            )
        super().__init__()
        self.location, self.token, self.local = location, token, local
        self.server_timeout_s = server_timeout_s
        if not resume_wait_s >= 0:
            raise ValueError(f"resume_wait_s must be 0 or more seconds, not {resume_wait_s!r}")
        self.resume_wait_s = resume_wait_s
        self.frame_layout = _frame_layout(frame_layout)
        detected = _rank_and_world()
        self.rank = detected[0] if rank is None else rank
        self.world_size = detected[1] if world_size is None else world_size
        owned = sorted(set(request) & set(_OWNED_KEYWORDS))
        if owned:
            raise ValueError(
                f"LakeIterableDataset sets {' and '.join(owned)} itself (the stride from DataLoader workers, the "
                "limit from `epochs`): bound a run with `epochs`, or stop iterating after the batches you want"
            )
        # `epoch` / `start_step` in the request are where the cursor starts.
        start = (int(request.pop("epoch", 0)), int(request.pop("start_step", 0)))
        if min(start) < 0:
            raise ValueError(f"the cursor starts at epoch {start[0]}, step {start[1]}: neither may be negative")
        self.request = {"datasets": _datasets(datasets), "preset": "none" if preset is None else preset,
                        "batch_size": batch_size, "seed": seed, **request}
        if delta_timestamps is not None:
            self.request["delta_timestamps"] = delta_timestamps
        self.epochs = epochs
        self.epoch, self.step = start
        # `(worker, workers)` once `(epoch, step)` is that DataLoader worker's own next step
        # (every `workers`-th); None while it is the rank's cursor, shared by all workers.
        self._own: Optional[tuple] = None
        self._pinned = False
        # `(request, steps_per_epoch)` of the pinned request's plan, once asked for.
        self._plan_steps: Optional[tuple] = None

    def _source(self):
        if self.local:
            return LocalClient(self.local, self.token, server_timeout_s=self.server_timeout_s, resume_wait_s=self.resume_wait_s)
        return LakeClient(self.location, self.token, resume_wait_s=self.resume_wait_s)

    def _pin(self, source, info: Dict[str, Any]) -> Dict[str, Any]:
        """From now on (later epochs, a resume from state_dict) the versions `info` planned, the
        same on every rank (a server that does not pin sends none); returns the plan for them."""
        request = self._plan_request()
        pinned = _agreed(info.get("datasets", request["datasets"]))
        if pinned != info.get("datasets", request["datasets"]):
            info = source.info({**request, "datasets": pinned})
        self.request["datasets"] = pinned
        self._pinned = True
        self._plan_steps = (self._plan_key(), info["steps_per_epoch"])
        return info

    def pin(self) -> List[Any]:
        """Pins the dataset versions now (the server's latest, or rank 0's under
        `torch.distributed`) and returns them (`name@version`). Without it each process pins on
        its first batch, so DataLoader workers started while a new version is ingested could
        read different versions; call it before making the DataLoader to give every worker the
        same ones. It asks the server: with a Flight `location`, start the workers with
        `multiprocessing_context="spawn"` afterwards (gRPC is not fork-safe); a `local` socket
        forks safely. Does nothing once pinned (a loaded state pins too)."""
        if not self._pinned:
            source = self._source()
            self._pin(source, source.info(self._plan_request()))
        return list(self.request["datasets"])

    def _order(self) -> Dict[str, Any]:
        """The request's fields, besides datasets, seed and global batch, that the sample order
        depends on, with the server's defaults."""
        r = self.request
        return {"shuffle": r.get("shuffle", True),
                "episodes": sorted(set(r.get("episodes") or [])) or None, "drop_last": r.get("drop_last", True),
                "drop_n_first_frames": r.get("drop_n_first_frames", 0), "drop_n_last_frames": r.get("drop_n_last_frames", 0)}

    def _full_request(self) -> Dict[str, Any]:
        return {**self.request, "rank": self.rank, "world_size": self.world_size, "epoch": self.epoch, "start_step": self.step}

    def _plan_request(self) -> Dict[str, Any]:
        """The request whose plan (schema, epoch shape, versions) is asked for: from the
        epoch's first step, so that a cursor past the epoch is told apart here, by what it is."""
        return {**self._full_request(), "start_step": 0}

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        worker, workers = _worker()
        if torch.utils.data.get_worker_info() is not None and worker == 0:
            global _WARNED_WORKER_STATE
            if not _WARNED_WORKER_STATE and not _under_stateful_dataloader():
                _WARNED_WORKER_STATE = True
                warnings.warn(
                    f"LakeIterableDataset runs in {workers} DataLoader worker process(es): each keeps its own "
                    "cursor, so the dataset's state_dict() in the main process does not move. Checkpoint with "
                    "state_dict(after=batch) (the last batch trained on), or use torchdata's StatefulDataLoader, "
                    "which saves and restores each worker's state.",
                    UserWarning,
                    stacklevel=2,
                )
        global _WARNED_FORKED_FLIGHT
        if not self.local and _FLIGHT_PID not in (None, os.getpid()) and not _WARNED_FORKED_FLIGHT:
            _WARNED_FORKED_FLIGHT = True
            warnings.warn(
                "LakeIterableDataset reads Flight in a process forked after its parent made a Flight (gRPC) "
                "client; gRPC is not fork-safe and its calls here may hang. Start DataLoader workers with "
                "multiprocessing_context='spawn' (or 'forkserver'), or read the server's local socket (local=PATH).",
                RuntimeWarning,
                stacklevel=2,
            )
        if torch.utils.data.get_worker_info() is not None and getattr(self, "_unfinished", False):
            raise RuntimeError(
                "this DataLoader worker's stream was iterated before and left unfinished: a DataLoader with "
                "persistent workers drops the batches its workers had made ahead when it is iterated again, so the "
                "stream would skip them. Iterate it once (epochs=N covers several epochs), or continue with a new "
                "dataset loaded from state_dict(after=<the last batch trained on>)"
            )
        if self._own is not None and self._own != (worker, workers):
            raise ValueError(
                f"this dataset holds the state of DataLoader worker {self._own[0]} of {self._own[1]}, but runs as "
                f"worker {worker} of {workers}: resume with as many workers"
            )
        source = self._source()
        request = self._full_request()
        info = source.info(self._plan_request())
        if not self._pinned:
            info = self._pin(source, info)
            request["datasets"] = self.request["datasets"]
        steps_per_epoch = info["steps_per_epoch"]
        self._plan_steps = (self._plan_key(), steps_per_epoch)
        epoch, step, limit = self._share(steps_per_epoch, worker, workers)
        if limit == 0:
            return
        if workers > 1:
            # This worker's stride of the rank's sequence: from the shared cursor, its own
            # first step is `worker` steps on; from its own cursor, that cursor.
            self.epoch, self.step, self._own = epoch, step, (worker, workers)
            request.update(epoch=epoch, start_step=step, step_stride=workers)
        if limit is not None:
            request["limit_batches"] = limit
        in_worker = torch.utils.data.get_worker_info() is not None
        self._unfinished = in_worker
        lerobot = self.frame_layout == "lerobot"
        for batch in source.batches(request):
            made_at = self.epoch * steps_per_epoch + self.step
            # This worker's next step, and the rank's next after this batch (its `lake.cursor`).
            self.epoch, self.step = divmod(made_at + workers, steps_per_epoch)
            columns = batch_to_numpy(batch)
            # In LeRobot's layout, RGB cameras are converted here; YUV planes after their
            # conversion to RGB, on the trainer's device (`frames_to_rgb`).
            rgb = _rgb_cameras(batch.schema) if lerobot else ()
            for facts in columns.get(FRAMES_KEY, {}).values() if lerobot else ():
                facts["frame_layout"] = "lerobot"
            out = {}
            for key, value in columns.items():
                if isinstance(value, (list, dict)):
                    out[key] = value
                else:
                    out[key] = _tensor(to_lerobot_layout(value) if key in rgb else value, shared=in_worker)
            out[CURSOR_KEY] = _tensor(np.array(divmod(made_at + 1, steps_per_epoch), dtype=np.int64), shared=in_worker)
            yield out
        self._unfinished = False

    def _share(self, steps_per_epoch: int, worker: int, workers: int) -> tuple:
        """`(epoch, step, limit_batches)` of the stream this process reads from the cursor:
        the rank's, or DataLoader worker `worker`'s stride of it (see `worker_cursor`); the
        limit is None without `epochs`, else the batches it yields (0: none)."""
        if self.step >= steps_per_epoch > 0:
            raise ValueError(
                f"the cursor is at step {self.step} of epoch {self.epoch}, but an epoch of this request has "
                f"{steps_per_epoch} steps: a state saved for other datasets, episodes or batch size?"
            )
        if workers == 1:
            if self.epochs is None:
                return self.epoch, self.step, None
            return self.epoch, self.step, max(0, (self.epochs - self.epoch) * steps_per_epoch - self.step)
        offset = 0 if self._own is not None else worker
        return worker_cursor(self.epoch, self.step, offset, workers, steps_per_epoch, self.epochs)

    def _plan_key(self) -> str:
        """What the epoch's shape depends on: the request, with its datasets' versions, as this
        rank sends it."""
        return json.dumps([self.request, self.rank, self.world_size], sort_keys=True, default=str)

    def __len__(self) -> int:
        """The batches that iterating this dataset yields from its cursor when `epochs` bounds it:
        the rank's global steps left before epoch `epochs` (a batch each, as the server sends
        them: the epoch's steps are its eligible samples over `batch_size * world_size`, rounded
        down with `drop_last`, up without it, when the last step's batch may be short or, for
        a rank whose slice of it is empty, of 0 rows). In a DataLoader worker, that worker's
        share; a `DataLoader(ds, batch_size=None)` has the same length, so `tqdm` shows it.

        The epoch's shape comes from the server (asked once the versions are pinned, on every
        call before: the latest versions' shape). Over Flight that makes a gRPC client, so start
        DataLoader workers with `multiprocessing_context="spawn"` afterwards, as after `pin()`.
        Without `epochs` the stream is endless and `len()` raises `TypeError`."""
        if self.epochs is None:
            raise TypeError(
                "len() of an endless LakeIterableDataset: without `epochs` its stream goes on across epochs for ever. "
                "Give epochs=N to bound it (len() is then the batches left before epoch N), or stop iterating after "
                "the batches you want"
            )
        worker, workers = _worker()
        if self.epoch >= self.epochs:
            return 0
        if self._pinned and self._plan_steps is not None and self._plan_steps[0] == self._plan_key():
            steps_per_epoch = self._plan_steps[1]
        else:
            steps_per_epoch = self._source().info(self._plan_request())["steps_per_epoch"]
            if self._pinned:
                self._plan_steps = (self._plan_key(), steps_per_epoch)
        return self._share(steps_per_epoch, worker, workers)[2]

    def __bool__(self) -> bool:
        # A dataset is there even when it is endless or has nothing left (no `len()` asked).
        return True

    def state_dict(self, after: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        """Where the stream stands: the next batch is global step `step` of `epoch`, of the
        dataset versions in `datasets` (pinned once the stream has started). In a DataLoader
        worker that has started (of two or more), the worker's own next step, with `worker`
        and `workers`.

        With `after` (a batch this dataset yielded), the state right after that batch: what a
        plain DataLoader with workers checkpoints with in the main process (see the class
        docs); it warns when the versions are not pinned there (`pin()`), since a resume then
        reads the latest ones."""
        state = {"epoch": self.epoch, "step": self.step, "seed": self.request["seed"],
                 "global_batch": self.request["batch_size"] * self.world_size,
                 "datasets": self.request["datasets"], "order": self._order()}
        if after is not None:
            if CURSOR_KEY not in after:
                raise ValueError(f"state_dict(after=batch) takes a batch of this dataset (one with {CURSOR_KEY!r})")
            state["epoch"], state["step"] = (int(v) for v in after[CURSOR_KEY])
            if not self._pinned:
                warnings.warn(
                    "state_dict(after=batch) of a dataset whose versions are not pinned in this process: a resume "
                    "reads the latest versions, which may not be those the workers read. Call pin() before making "
                    "the DataLoader.",
                    UserWarning,
                    stacklevel=2,
                )
        elif self._own is not None:
            state["worker"], state["workers"] = self._own
        return state

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Resumes at `state`'s cursor, on the dataset versions (and mixture weights) it read, so
        a version ingested since is not mixed in; the global batch must match (resizing the world
        keeps the sample sequence only when `batch_size * world_size` is unchanged), and the
        datasets must be the same names. A worker's state (with `worker` and `workers`) loads
        only in that worker of as many workers (as `StatefulDataLoader` does it); a state
        without them starts each worker `w` at its cursor + `w`."""
        if state["global_batch"] != self.request["batch_size"] * self.world_size:
            raise ValueError(f"global batch {self.request['batch_size'] * self.world_size} differs from the saved {state['global_batch']}")
        if state["seed"] != self.request["seed"]:
            raise ValueError(f"seed {self.request['seed']} differs from the saved {state['seed']}")
        own = None
        if state.get("workers", 1) > 1:
            own = (state["worker"], state["workers"])
            here = _worker()
            if here != own:
                where = "outside DataLoader workers" if torch.utils.data.get_worker_info() is None else f"in worker {here[0]} of {here[1]}"
                raise ValueError(
                    f"the state of DataLoader worker {own[0]} of {own[1]} loaded {where}: a worker's state resumes "
                    "only in that worker of as many workers (torchdata's StatefulDataLoader loads each worker's own)"
                )
        # The other fields the sample order depends on (states saved before they were recorded
        # have none to compare).
        for key, value in state.get("order", {}).items():
            if key not in self._order():
                raise ValueError(f"the saved state's order has {key!r}, which this lake_client does not know: saved by a newer one?")
            if self._order()[key] != value:
                raise ValueError(
                    f"{key} {_shown(self._order()[key])} differs from the saved {_shown(value)}: the saved cursor is a "
                    "position in another sample order"
                )
        saved = state.get("datasets")
        if saved is not None:
            if _dataset_names(saved) != _dataset_names(self.request["datasets"]):
                raise ValueError(f"datasets {self.request['datasets']} differ from the saved {saved}")
            # The saved entries, versions and mixture weights both: the sequence resumed is the
            # one saved. Entries without a version (a state saved before the stream pinned) are
            # pinned on the first batch, as a fresh dataset's are.
            self.request["datasets"] = saved
            self._pinned = all("@" in _entry_name(d) for d in saved)
        self.epoch, self.step, self._own = state["epoch"], state["step"], own


def _shown(value: Any) -> str:
    return "all" if value is None else repr(value)


def _entry_name(entry: DatasetSpec) -> str:
    """A request's dataset entry as written: `name`, `name@version`, perhaps with a weight."""
    return entry["name"] if isinstance(entry, dict) else entry


def _dataset_names(datasets: Sequence[DatasetSpec]) -> List[str]:
    """The names of a request's datasets, without versions and weights."""
    return [_entry_name(d).split("@", 1)[0].split("=", 1)[0] for d in datasets]
