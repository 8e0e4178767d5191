"""Runs LeRobot's ACT on checkpoints and batches that lake's trainer exchanges with it, so that
lake's tests can compare the two implementations (lake-trainer's `tests/it/parity.rs`).

Run with a LeRobot 0.4.4 venv's python (`LAKE_LEROBOT_PYTHON`). Every tensor goes through
safetensors files: a batch file holds raw (unnormalised) `observation.state`,
`observation.images.<cam>` (float32 in [0, 1]), `observation.environment_state`, `action`,
`action_is_pad` (float32 0/1) and optionally `noise` (the VAE's epsilon, [B, latent_dim]).

    python scripts/act_parity.py predict CKPT BATCH OUT
        Loads CKPT with ACTPolicy.from_pretrained and make_pre_post_processors and writes
        `actions_normalized` (predict_action_chunk on the preprocessed batch) and `actions`
        (postprocessed). With an action in the batch it also writes `loss`, `l1_loss` and
        `kld_loss` from a training-mode forward whose epsilon is the batch's `noise`
        (compare it with dropout 0 in the config).

    python scripts/act_parity.py make CONFIG STATS SEED OUT
        Builds a fresh ACTPolicy from a config.json (random init after torch.manual_seed(SEED)),
        with the processors made from a flat `<feature>.<stat>` stats file, and saves all of it
        to OUT with LeRobot's own writers.

    python scripts/act_parity.py train CKPT BATCH STEPS OUT
        STEPS training steps on the batch as lerobot-train's update_policy does them (AdamW
        preset, two parameter groups, grad clip 10), epsilon from the batch's `noise`; writes
        every tensor of the state dict after the last step plus `grad_norm_<i>` and `loss_<i>`.
"""

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from lerobot.configs.policies import PreTrainedConfig
from lerobot.policies.act.modeling_act import ACTPolicy
from lerobot.policies.factory import make_pre_post_processors


def load_batch(path):
    raw = load_file(path)
    noise = raw.pop("noise", None)
    if "action_is_pad" in raw:
        raw["action_is_pad"] = raw["action_is_pad"] > 0.5
    return raw, noise


def with_noise(noise):
    """Makes torch.randn_like return the given epsilon (ACT draws it with randn_like)."""
    if noise is None:
        return
    real = torch.randn_like

    def fixed(t, *args, **kwargs):
        if tuple(t.shape) == tuple(noise.shape):
            return noise.to(dtype=t.dtype, device=t.device).clone()
        return real(t, *args, **kwargs)

    torch.randn_like = fixed


def predict(ckpt, batch_path, out):
    policy = ACTPolicy.from_pretrained(ckpt)
    policy.eval()
    pre, post = make_pre_post_processors(policy.config, pretrained_path=ckpt)
    batch, noise = load_batch(batch_path)
    result = {}
    with torch.no_grad():
        nb = pre(dict(batch))
        a = policy.predict_action_chunk(nb)
        result["actions_normalized"] = a.contiguous()
        result["actions"] = post(a).contiguous()
        for key, value in nb.items():
            if isinstance(value, torch.Tensor) and value.dtype == torch.float32:
                result["normalized." + key] = value.contiguous()
    if "action" in batch:
        with_noise(noise)
        policy.train()
        nb = pre(dict(batch))
        loss, info = policy.forward(nb)
        result["loss"] = loss.detach().reshape(1)
        result["l1_loss"] = torch.tensor([info["l1_loss"]])
        if "kld_loss" in info:
            result["kld_loss"] = torch.tensor([info["kld_loss"]])
    save_file(result, out)


def make(config_path, stats_path, seed, out):
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    config_dir = Path(config_path).parent
    cfg = PreTrainedConfig.from_pretrained(config_dir)
    torch.manual_seed(int(seed))
    policy = ACTPolicy(cfg)
    flat = load_file(stats_path)
    stats = {}
    for key, value in flat.items():
        feature, stat = key.rsplit(".", 1)
        stats.setdefault(feature, {})[stat] = value
    pre, post = make_pre_post_processors(cfg, dataset_stats=stats)
    policy.save_pretrained(out)
    pre.save_pretrained(out)
    post.save_pretrained(out)


def train(ckpt, batch_path, steps, out):
    policy = ACTPolicy.from_pretrained(ckpt)
    pre, _ = make_pre_post_processors(policy.config, pretrained_path=ckpt)
    batch, noise = load_batch(batch_path)
    with_noise(noise)
    optimizer_cfg = policy.config.get_optimizer_preset()
    optimizer = optimizer_cfg.build(policy.get_optim_params())
    result = {}
    policy.train()
    for i in range(int(steps)):
        loss, _ = policy.forward(pre(dict(batch)))
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), optimizer_cfg.grad_clip_norm)
        optimizer.step()
        optimizer.zero_grad()
        result[f"loss_{i}"] = loss.detach().reshape(1)
        result[f"grad_norm_{i}"] = norm.detach().reshape(1)
    for key, value in policy.state_dict().items():
        result[key] = value.detach().contiguous()
    save_file(result, out)


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    {"predict": predict, "make": make, "train": train}[cmd](*args)
    print(json.dumps({"ok": cmd}))


if __name__ == "__main__":
    main()
