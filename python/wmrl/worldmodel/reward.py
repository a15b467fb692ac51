"""The reward model: does the goal hold in this (main-view) frame? Frozen during GRPO.

GRPO scores imagined rollouts with it, so it must judge *generated* frames: it trains on
real frames (labels: the simulator's per-frame success, ``rewards`` in the trajectory
files) made to look generated - blurred and noised at random - so that the world model's
softness does not read as failure. Success frames are rare (an episode ends soon after
success), so batches are drawn half positive, half negative. The decision threshold is
calibrated on the validation episodes (the one with the best balanced accuracy) and stored
with the weights.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from wmrl.config import RewardConfig
from wmrl.pretrained import Pretrained


class RewardModel(Pretrained, nn.Module):
    """Saved and loaded with ``save_pretrained`` / ``from_pretrained`` (``wmrl.pretrained``);
    the calibrated threshold is a buffer, so it travels with the weights."""

    FORMAT = "wmrl-reward/1"
    CONFIG_CLASS = RewardConfig

    def __init__(self, cfg: RewardConfig):
        super().__init__()
        layers, cin = [], 3
        for c in cfg.channels:
            layers += [nn.Conv2d(cin, c, 3, stride=2, padding=1), nn.GroupNorm(min(8, c), c), nn.SiLU()]
            cin = c
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(cin, 1)
        self.cfg = cfg
        self.register_buffer("threshold", torch.tensor(0.5))

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        """frames (B, 3, H, W) in [-1, 1] -> success logits (B,)."""
        return self.head(self.features(frames).mean(dim=(2, 3))).squeeze(-1)

    @torch.no_grad()
    def success(self, frames: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self(frames)) >= self.threshold


def generated_style(x: torch.Tensor, cfg: RewardConfig, g: torch.Generator) -> torch.Tensor:
    """Random blur (a 3x3 box, as a few-step generator's softness) and pixel noise."""
    blur = F.avg_pool2d(F.pad(x, (1, 1, 1, 1), mode="replicate"), 3, stride=1)
    pick = (torch.rand(x.shape[0], 1, 1, 1, generator=g, device=g.device) < cfg.blur_prob).to(x.dtype)
    x = pick * blur + (1 - pick) * x
    return (x + cfg.noise_std * torch.randn(x.shape, generator=g, device=g.device)).clamp(-1, 1)


def balanced_accuracy(pred: torch.Tensor, labels: torch.Tensor) -> float | None:
    """Mean of the recall on success frames and on the others (None without both kinds):
    success frames are rare, so plain accuracy rewards never saying "success"."""
    pred, labels = pred.bool(), labels.bool()
    if labels.all() or not labels.any():
        return None
    return sum(float((pred[labels == c] == c).float().mean()) for c in (True, False)) / 2


def calibrate(probs: torch.Tensor, labels: torch.Tensor) -> tuple[float, float]:
    """The threshold with the best balanced accuracy, and that accuracy (both kinds of frame
    must be present)."""
    best = (0.5, -1.0)
    for th in torch.linspace(0.05, 0.95, 19):
        bal = balanced_accuracy(probs >= th, labels)
        if bal > best[1]:
            best = (float(th), bal)
    return best


class RewardObjective(nn.Module):
    """Binary cross-entropy of the wrapped model, for DeepSpeed's engine (inputs cast to its dtype)."""

    def __init__(self, model: RewardModel):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        dt = next(self.model.parameters()).dtype
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=x.is_cuda):
            return F.binary_cross_entropy_with_logits(self.model(x.to(dt)).float(), y.float())


def train_reward(train_frames: torch.Tensor, train_labels: torch.Tensor, val_frames: torch.Tensor,
                 val_labels: torch.Tensor, cfg: RewardConfig, out: Path, lineage: dict, progress: bool = True,
                 ds_config_path: str | None = None) -> dict:
    """uint8 frames (N, H, W, 3) and bool labels -> ``out/model.safetensors`` + ``config.json``.
    Trained through DeepSpeed like the world models (one process; bf16 on a GPU)."""
    import deepspeed
    from tqdm import tqdm

    from wmrl.config import WMTrainConfig
    from wmrl.device import pick_device
    from wmrl.worldmodel.model import images_to_unit
    from wmrl.worldmodel.train import ds_config, init_distributed

    pos, neg = torch.nonzero(train_labels).flatten(), torch.nonzero(~train_labels).flatten()
    if len(pos) == 0 or len(neg) == 0:
        raise ValueError(f"the reward model needs success and failure frames; the training episodes have {len(pos)} "
                         f"success and {len(neg)} other frames (include successful and failed episodes)")
    torch.manual_seed(cfg.seed)
    model = RewardModel(cfg)
    device = pick_device("auto")
    on_gpu = device.type == "cuda"
    # frames, indices and the augmentation's noise all on the training device: done on the
    # host, the per-step blur and noise of a 128 px batch cost more than the model's step
    g = torch.Generator(device=device).manual_seed(cfg.seed)
    frames, labels = train_frames.to(device), train_labels.to(device)
    pos, neg = pos.to(device), neg.to(device)
    tc = WMTrainConfig(steps=cfg.steps, micro_batch=cfg.batch, grad_accum=1, lr=cfg.lr, warmup=min(50, cfg.steps // 10))
    init_distributed(on_gpu)
    engine, *_ = deepspeed.initialize(model=RewardObjective(model), model_parameters=model.parameters(),
                                      config=ds_config(ds_config_path or (tc.ds_config_gpu if on_gpu else tc.ds_config_cpu),
                                                       tc, on_gpu, world=1))
    t0 = time.perf_counter()
    for _ in tqdm(range(cfg.steps), desc="reward model", disable=not progress):
        half = cfg.batch // 2
        idx = torch.cat([pos[torch.randint(len(pos), (half,), generator=g, device=device)],
                         neg[torch.randint(len(neg), (cfg.batch - half,), generator=g, device=device)]])
        loss = engine(generated_style(images_to_unit(frames[idx]), cfg, g), labels[idx])
        engine.backward(loss)
        engine.step()
    model = engine.module.model.float().cpu().eval()
    with torch.no_grad():
        probs = torch.cat([torch.sigmoid(model(images_to_unit(val_frames[i:i + 256])))
                           for i in range(0, len(val_frames), 256)]) if len(val_frames) else torch.zeros(0)
    if len(val_frames) and val_labels.any() and (~val_labels).any():
        threshold, bal_acc = calibrate(probs, val_labels)
    else:
        threshold, bal_acc = 0.5, None  # nothing to calibrate on: say so in the config
    model.threshold.fill_(threshold)
    meta = {"threshold": threshold, "val_balanced_accuracy": bal_acc, "val_frames": len(val_frames),
            "train_frames": len(train_frames), "train_success_frames": int(len(pos)), "final_loss": float(loss.detach()),
            "wall_s": round(time.perf_counter() - t0, 1), **lineage}
    model.save_pretrained(out, meta=meta)
    return meta


