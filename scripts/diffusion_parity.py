"""Runs LeRobot's Diffusion policy on networks and batches that lake's trainer exchanges with it, so
that lake's tests can compare the two implementations (lake-trainer's `tests/it/parity.rs`).

Run with a LeRobot 0.4.4 venv's python (`LAKE_LEROBOT_PYTHON`). Tensors go through safetensors
files (float32). A batch file holds normalised `observation.state` `[B, S, D]`, each camera
`observation.images.<cam>` `[B, S, 3, H, W]`, optionally `observation.environment_state`,
`action` `[B, horizon, A]`, `action_is_pad` (0/1), and the draws LeRobot would make: `noise`
(`[B, horizon, A]`), `timesteps` (`[B]`), `crop` (`[top, left]`), `start` (the sampling's first
noise) and `steps_noise` (`[steps - 1, B, horizon, A]`, the reverse steps' draws in order).

    python scripts/diffusion_parity.py make CONFIG SEED OUT
        Builds a DiffusionPolicy from a config.json lake wrote (after torch.manual_seed(SEED)) and
        saves it to OUT with LeRobot's own writer; writes OUT/parameters.json with its parameter
        count.

    python scripts/diffusion_parity.py run CKPT BATCH OUT
        Loads CKPT with DiffusionPolicy.from_pretrained and writes `loss` (forward in training
        mode with the batch's draws) and `actions` (generate_actions in eval mode from `start`,
        each reverse step adding the next of `steps_noise`). When CKPT holds processor files (a
        checkpoint lake wrote), the batch is in the dataset's units: LeRobot's preprocessor
        (make_pre_post_processors) normalises it first, and `actions_unnormalized` is what its
        postprocessor makes of the actions.

    python scripts/diffusion_parity.py train CKPT BATCH STEPS TOTAL OUT
        STEPS training steps on the batch (in the dataset's units, CKPT holding processor files)
        as lerobot-train's update_policy takes them: the Adam preset, clipping at its
        grad_clip_norm, the cosine scheduler preset over TOTAL steps; step k's draws are row k of
        the batch's `noise`, `timesteps` and `crop`. Writes `loss_<k>`, `grad_norm_<k>`, `lr_<k>`
        and every tensor of the state dict after the last step.
"""

import json
import sys
from pathlib import Path

import torch
import torchvision
from safetensors.torch import load_file, save_file

import diffusers.schedulers.scheduling_ddpm as ddpm
from lerobot.configs.policies import PreTrainedConfig
from lerobot.policies.diffusion.modeling_diffusion import DiffusionPolicy
from lerobot.policies.factory import make_pre_post_processors


def make(config_path, seed, out):
    config = PreTrainedConfig.from_pretrained(str(Path(config_path).parent))
    torch.manual_seed(int(seed))
    policy = DiffusionPolicy(config)
    policy.save_pretrained(out)
    count = sum(p.numel() for p in policy.parameters())
    Path(out, "parameters.json").write_text(json.dumps({"parameters": count, "keys": list(policy.state_dict())}))


def run(ckpt, batch_path, out):
    policy = DiffusionPolicy.from_pretrained(ckpt)
    raw = load_file(batch_path)
    cameras = list(policy.config.image_features)
    batch = {k: v for k, v in raw.items() if k.startswith("observation.") or k == "action"}
    batch["action_is_pad"] = raw["action_is_pad"] > 0.5
    processed = Path(ckpt, "policy_preprocessor.json").exists()
    if processed:
        pre, post = make_pre_post_processors(policy.config, pretrained_path=ckpt)
        batch = pre(batch)

    # The draws of the training forward: the crop (RandomCrop.get_params), then the noise
    # (torch.randn) and the steps (torch.randint), as compute_loss makes them.
    top, left = (int(v) for v in raw["crop"].tolist())
    torchvision.transforms.RandomCrop.get_params = staticmethod(lambda img, size: (top, left, size[0], size[1]))
    real_randn, real_randint = torch.randn, torch.randint
    torch.randn = lambda *a, **k: raw["noise"].clone()
    torch.randint = lambda *a, **k: raw["timesteps"].long()
    policy.train()
    try:
        loss, _ = policy.forward(dict(batch))
    finally:
        torch.randn, torch.randint = real_randn, real_randint

    # Sampling from the given start, every reverse step's draw given in turn.
    draws = iter(raw["steps_noise"].unbind(0))
    ddpm.randn_tensor = lambda shape, **k: next(draws).clone()
    policy.eval()
    observations = {k: v for k, v in batch.items() if k.startswith("observation.") and k not in cameras}
    if cameras:
        observations["observation.images"] = torch.stack([batch[c] for c in cameras], dim=-4)
    with torch.no_grad():
        actions = policy.diffusion.generate_actions(observations, noise=raw["start"].clone())
    result = {"loss": loss.detach().reshape(1), "actions": actions.contiguous()}
    if processed:
        result["actions_unnormalized"] = post(actions).contiguous()
    save_file(result, out)


def train(ckpt, batch_path, steps, total, out):
    policy = DiffusionPolicy.from_pretrained(ckpt)
    pre, _ = make_pre_post_processors(policy.config, pretrained_path=ckpt)
    raw = load_file(batch_path)
    batch = {k: v for k, v in raw.items() if k.startswith("observation.") or k == "action"}
    batch["action_is_pad"] = raw["action_is_pad"] > 0.5
    optimizer_config = policy.config.get_optimizer_preset()
    optimizer = optimizer_config.build(policy.get_optim_params())
    scheduler = policy.config.get_scheduler_preset().build(optimizer, int(total))
    real_randn, real_randint = torch.randn, torch.randint
    result = {}
    policy.train()
    try:
        for k in range(int(steps)):
            top, left = (int(v) for v in raw["crop"][k].tolist())
            torchvision.transforms.RandomCrop.get_params = staticmethod(lambda img, size, t=top, l=left: (t, l, size[0], size[1]))
            torch.randn = lambda *a, k=k, **kw: raw["noise"][k].clone()
            torch.randint = lambda *a, k=k, **kw: raw["timesteps"][k].long()
            result[f"lr_{k}"] = torch.tensor([optimizer.param_groups[0]["lr"]], dtype=torch.float64).float()
            loss, _ = policy.forward(pre(dict(batch)))
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), optimizer_config.grad_clip_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            result[f"loss_{k}"] = loss.detach().reshape(1)
            result[f"grad_norm_{k}"] = norm.detach().reshape(1)
    finally:
        torch.randn, torch.randint = real_randn, real_randint
    for key, value in policy.state_dict().items():
        result[key] = value.detach().contiguous()
    save_file(result, out)


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    {"make": make, "run": run, "train": train}[command](*args)
