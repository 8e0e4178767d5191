"""A short PyTorch training loop fed by `lake serve` through lake's Python client.

A small policy (a convolution per camera, pooled, and the robot's state, into the action) is
trained for a few epochs on one dataset with LeRobot's keys, the batches streamed over Arrow
Flight by `LakeIterableDataset`. It prints the loss of every --log-every steps and, at the end,
the steps, samples and samples per second, then saves the weights and the stream's cursor
(`state_dict()`), from which a run resumes exactly.

    python docker/trainer_loop.py --server grpc://127.0.0.1:50051 --dataset v30-images-tiny
"""

import argparse
import os
import time

import torch
from torch import nn

from lake_client import LakeClient, LakeError, LakeIterableDataset


class Policy(nn.Module):
    """Cameras (uint8 [B, H, W, 3]) and state in, one action out."""

    def __init__(self, cameras, state_dim, action_dim, width=32):
        super().__init__()
        self.cameras = list(cameras)
        self.encoders = nn.ModuleList(
            nn.Sequential(nn.Conv2d(3, width, 5, stride=2), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
            for _ in self.cameras
        )
        self.head = nn.Sequential(
            nn.Linear(width * len(self.cameras) + state_dim, 128), nn.ReLU(), nn.Linear(128, action_dim)
        )

    def forward(self, batch):
        parts = [batch["observation.state"].float()]
        for camera, encoder in zip(self.cameras, self.encoders):
            frames = batch[camera].permute(0, 3, 1, 2).float() / 255.0
            parts.append(encoder(frames))
        return self.head(torch.cat(parts, dim=1))


def wait_for(server, token, seconds):
    """Waits until the server lists its datasets (it may still be starting)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return LakeClient(server, token).datasets()
        except LakeError as e:
            if e.code != "unavailable" or time.monotonic() > deadline:
                raise
            time.sleep(1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default=os.environ.get("LAKE_SERVER", "grpc://127.0.0.1:50051"))
    parser.add_argument("--dataset", default=os.environ.get("LAKE_DATASET", "v30-images-tiny"))
    parser.add_argument("--token", default=os.environ.get("LAKE_TOKEN"))
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-every", type=int, default=5)
    parser.add_argument("--out", default=None, help="directory for the weights and the stream's state")
    parser.add_argument("--wait", type=float, default=60, help="seconds to wait for the server to answer")
    args = parser.parse_args()

    served = wait_for(args.server, args.token, args.wait)
    names = ", ".join(f"{d['name']}@{d['version']}" for d in served)
    print(f"server {args.server}: {names}", flush=True)

    torch.manual_seed(args.seed)
    ds = LakeIterableDataset(
        args.server, datasets=[args.dataset], batch_size=args.batch_size, seed=args.seed,
        epochs=args.epochs, token=args.token,
    )
    batches = len(ds)  # with `epochs`, the batches the run will get
    loader = torch.utils.data.DataLoader(ds, batch_size=None)  # batches arrive ready-made

    policy, optimizer = None, None
    steps, samples, start = 0, 0, time.monotonic()
    for batch in loader:
        if policy is None:
            cameras = sorted(k for k in batch if k.startswith("observation.images."))
            policy = Policy(cameras, batch["observation.state"].shape[1], batch["action"].shape[1])
            optimizer = torch.optim.AdamW(policy.parameters(), lr=args.lr)
            print(f"cameras {cameras}; {batches} batches of {args.batch_size} in {args.epochs} epochs", flush=True)
        loss = nn.functional.mse_loss(policy(batch), batch["action"].float())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        steps += 1
        samples += batch["action"].shape[0]
        if steps % args.log_every == 0 or steps == 1:
            print(f"step {steps}: loss {loss.item():.4f}", flush=True)
    if policy is None:
        raise SystemExit(f"no batches from {args.server} for {args.dataset}")
    elapsed = time.monotonic() - start
    print(f"done: {steps} steps, {samples} samples, {samples / elapsed:.1f} samples/s, last loss {loss.item():.4f}")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        torch.save({"policy": policy.state_dict(), "stream": ds.state_dict()}, os.path.join(args.out, "last.pt"))
        print(f"saved {os.path.join(args.out, 'last.pt')}")


if __name__ == "__main__":
    main()
