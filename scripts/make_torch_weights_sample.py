"""Writes testdata/torch/: small state dicts as `torch.save` writes them, the fixtures of
`lake_trainer::read_weights` (trainer/src/tensors.rs). Run with a Python that has torch (the
LeRobot venv): python scripts/make_torch_weights_sample.py testdata/torch

Every tensor's values are fixed by its name: arange(n) scaled, so the reader's test knows
them without reading anything else. `t` is stored as a transposed view of a larger storage, and
the dict nests one level (`block.*`), as checkpoints that wrap a state dict do."""
import collections
import sys
from pathlib import Path

import torch


def state_dict():
    sd = collections.OrderedDict()
    sd["conv.weight"] = torch.arange(6, dtype=torch.float32).reshape(2, 3) / 4
    sd["bn.running_var"] = torch.arange(3, dtype=torch.float64) + 0.5
    sd["bn.num_batches_tracked"] = torch.tensor(7, dtype=torch.int64)
    sd["half"] = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float16)
    sd["brain"] = torch.tensor([1.0, -2.0, 0.25], dtype=torch.bfloat16)
    sd["count32"] = torch.tensor([3, -4], dtype=torch.int32)
    # A view of a wider storage: rows of a (3, 4) matrix's first two columns, transposed.
    sd["t"] = (torch.arange(12, dtype=torch.float32).reshape(3, 4)[:, :2]).t()
    return {"block": sd}


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    sd = state_dict()
    torch.save(sd, out / "nested.pth")
    torch.save(sd, out / "nested-legacy.pth", _use_new_zipfile_serialization=False)
    print({k: v.tolist() for k, v in sd["block"].items()})


if __name__ == "__main__":
    main()
