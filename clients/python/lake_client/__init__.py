"""Python client for `lake serve`.

`LakeClient` streams a sampling request's batches over Arrow Flight as `pyarrow.RecordBatch`es
and turns them into LeRobot-style dicts of numpy arrays. `LakeIterableDataset` is a
`torch.utils.data.IterableDataset` over the same stream for existing PyTorch trainers: it reads
its rank and world size from `torch.distributed` (or the `RANK` / `WORLD_SIZE` environment
variables), yields dict batches (uint8 frames as tensors), and resumes exactly from
`state_dict()`.

    from lake_client import LakeIterableDataset
    ds = LakeIterableDataset("grpc://127.0.0.1:50051", datasets=["my_dataset"], preset="act",
                             batch_size=32, seed=0)
    loader = torch.utils.data.DataLoader(ds, batch_size=None)   # batches come ready-made
    for batch in loader:
        batch["action"], batch["observation.images.front"]      # float32 [32, 50, 6], uint8 [32, H, W, 3]
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight

__all__ = ["LakeClient", "LakeIterableDataset", "batch_to_numpy"]

DatasetSpec = Union[str, Dict[str, Any]]


def _shape(field: pa.Field) -> Optional[List[int]]:
    meta = field.metadata or {}
    raw = meta.get(b"shape")
    return json.loads(raw) if raw is not None else None


def batch_to_numpy(batch: pa.RecordBatch) -> Dict[str, Any]:
    """A record batch as LeRobot-style columns: numbers and frames as numpy arrays shaped by the
    field's `shape` metadata (frames uint8 HWC, or THWC with a time window), strings as lists."""
    out: Dict[str, Any] = {}
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


class LakeClient:
    """A connection to `lake serve`'s Flight endpoint."""

    def __init__(self, location: str = "grpc://127.0.0.1:50051", token: Optional[str] = None):
        self.location = location
        self._client = flight.FlightClient(location, generic_options=[("grpc.max_receive_message_length", -1)])
        headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
        self._options = flight.FlightCallOptions(headers=headers)

    def datasets(self) -> List[Dict[str, Any]]:
        """The datasets the server offers: name and step count."""
        out = []
        for info in self._client.list_flights(options=self._options):
            request = json.loads(info.descriptor.command)
            out.append({"name": request["datasets"][0], "steps": info.total_records})
        return out

    def info(self, request: Dict[str, Any]) -> Dict[str, Any]:
        """Schema and epoch shape (`epoch_len`, `steps_per_epoch`) of a sampling request."""
        descriptor = flight.FlightDescriptor.for_command(json.dumps(request).encode())
        info = self._client.get_flight_info(descriptor, self._options)
        shape = json.loads(info.app_metadata or b"{}")
        return {"schema": info.schema, "ticket": info.endpoints[0].ticket, **shape}

    def batches(self, request: Dict[str, Any]) -> Iterator[pa.RecordBatch]:
        """The request's batches, in order (one record batch per training batch)."""
        ticket = flight.Ticket(json.dumps(request).encode())
        reader = self._client.do_get(ticket, self._options)
        for chunk in reader:
            yield chunk.data


def _rank_and_world() -> tuple:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except ImportError:
        pass
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


try:
    import torch
    from torch.utils.data import IterableDataset as _IterableDataset
except ImportError:  # the numpy client works without torch
    torch = None
    _IterableDataset = object


class LakeIterableDataset(_IterableDataset):  # type: ignore[misc]
    """Batches from `lake serve` as a PyTorch `IterableDataset` of ready-made dict batches.

    Use it with `DataLoader(ds, batch_size=None)` (or iterate it directly). Every rank gets its
    disjoint slice of each global batch of `batch_size * world_size` samples; `state_dict()`
    records `(epoch, step)` after the last batch handed out and `load_state_dict()` resumes
    exactly there, also with a different world size when the global batch stays the same.
    """

    def __init__(
        self,
        location: str,
        datasets: Sequence[DatasetSpec],
        preset: str = "none",
        delta_timestamps: Optional[Dict[str, List[float]]] = None,
        batch_size: int = 32,
        seed: int = 0,
        epochs: Optional[int] = None,
        token: Optional[str] = None,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        **request: Any,
    ):
        if torch is None:
            raise ImportError("LakeIterableDataset needs torch; LakeClient works without it")
        super().__init__()
        self.location, self.token = location, token
        detected = _rank_and_world()
        self.rank = detected[0] if rank is None else rank
        self.world_size = detected[1] if world_size is None else world_size
        self.request = {"datasets": list(datasets), "preset": preset, "batch_size": batch_size, "seed": seed, **request}
        if delta_timestamps is not None:
            self.request["delta_timestamps"] = delta_timestamps
        self.epochs = epochs
        self.epoch, self.step = 0, 0

    def _full_request(self) -> Dict[str, Any]:
        return {**self.request, "rank": self.rank, "world_size": self.world_size, "epoch": self.epoch, "start_step": self.step}

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        client = LakeClient(self.location, self.token)
        request = self._full_request()
        steps_per_epoch = client.info(request)["steps_per_epoch"]
        if self.epochs is not None:
            remaining = (self.epochs - self.epoch) * steps_per_epoch - self.step
            if remaining <= 0:
                return
            request["limit_batches"] = remaining
        for batch in client.batches(request):
            self.step += 1
            if self.step >= steps_per_epoch:
                self.epoch, self.step = self.epoch + 1, 0
            out = {}
            for key, value in batch_to_numpy(batch).items():
                # Arrow's buffers are read-only; torch wants writable memory.
                out[key] = value if isinstance(value, list) else torch.from_numpy(np.require(value, requirements=["C", "W"]))
            yield out

    def state_dict(self) -> Dict[str, Any]:
        """Where the stream stands: the next batch is global step `step` of `epoch`."""
        return {"epoch": self.epoch, "step": self.step, "seed": self.request["seed"],
                "global_batch": self.request["batch_size"] * self.world_size}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Resumes at `state`'s cursor; the global batch must match (resizing the world keeps
        the sample sequence only when `batch_size * world_size` is unchanged)."""
        if state["global_batch"] != self.request["batch_size"] * self.world_size:
            raise ValueError(f"global batch {self.request['batch_size'] * self.world_size} differs from the saved {state['global_batch']}")
        if state["seed"] != self.request["seed"]:
            raise ValueError(f"seed {self.request['seed']} differs from the saved {state['seed']}")
        self.epoch, self.step = state["epoch"], state["step"]
