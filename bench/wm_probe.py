"""How fast does a world model of a given size learn? One view, a plain PyTorch loop, one-chunk
PSNR on held-out transitions against copying the last frame.

    python bench/wm_probe.py --manifest runs/x/manifest.json --view wrist --size 64 \
        --channels 32,64,128 --blocks 1 --steps 500 --batch 16 --lr 3e-4

Frames are area-downsampled to ``--size`` (so one 128 px collection serves several sizes).
The prediction is teacher-forced (real context frames), as in ``wm_eval``'s first chunk; the
baseline repeats the current frame. For sweeping model size and learning rate before a long
DeepSpeed run; the numbers it prints are in bench/RESULTS.md where quoted.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from wmrl.config import WorldModelConfig  # noqa: E402
from wmrl.worldmodel.data import Transitions, load_split, proprio_stats  # noqa: E402
from wmrl.worldmodel.fidelity import psnr  # noqa: E402
from wmrl.worldmodel.model import FrameWorldModel  # noqa: E402


def shrink(episodes, size: int):
    for e in episodes:
        for v in ("main", "wrist"):
            x = torch.from_numpy(getattr(e, v)).permute(0, 3, 1, 2).float()
            setattr(e, v, F.interpolate(x, size=size, mode="area").round().byte().permute(0, 2, 3, 1).numpy())
    return episodes


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--manifest", required=True)
    p.add_argument("--view", choices=["main", "wrist"], default="wrist")
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--channels", default="32,64,128")
    p.add_argument("--blocks", type=int, default=1)
    p.add_argument("--cond-dim", type=int, default=128)
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = p.parse_args()
    torch.manual_seed(0)
    _, train, val = load_split(a.manifest, 8)
    if not val:
        sys.exit(f"{a.manifest} has no validation episodes: build it with --val-ratio > 0")
    cfg = WorldModelConfig(view=a.view, image_size=a.size, channels=tuple(int(c) for c in a.channels.split(",")),
                           blocks_per_level=a.blocks, cond_dim=a.cond_dim, condition_on_main=a.view == "wrist")
    tr = Transitions(shrink(train, a.size), cfg.context, a.device)
    va = Transitions(shrink(val, a.size), cfg.context, a.device)
    norm = proprio_stats(tr)
    norm = {k: v.to(a.device) for k, v in norm.items()}
    model = FrameWorldModel(cfg).to(a.device)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=1e-2)
    print(f"{tr.size} training / {va.size} held-out transitions, {sum(p.numel() for p in model.parameters()):,} "
          f"parameters, {a.device}", flush=True)
    held = va.batch(torch.arange(va.size, device=a.device), a.view, cfg.condition_on_main, norm)
    copy_last = float(psnr(held["frames"][:, cfg.context - 1], held["target"]).mean())
    t0 = time.perf_counter()
    for step in range(1, a.steps + 1):
        b = tr.batch(torch.randint(0, tr.size, (a.batch,), device=a.device), a.view, cfg.condition_on_main, norm)
        for group in opt.param_groups:
            group["lr"] = a.lr * min(1.0, step / 100)  # linear warm-up
        loss, _ = model.loss(**b)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % a.eval_every == 0 or step == a.steps:
            model.eval()
            g = torch.Generator(device=a.device).manual_seed(0)
            x, _ = model.generate(held["frames"], held["actions"], held["proprio"], generator=g)
            model.train()
            print(f"update {step}: loss {loss.item():.4f}, one-chunk PSNR {float(psnr(x, held['target']).mean()):.2f} dB "
                  f"(copy-last {copy_last:.2f} dB), {time.perf_counter() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
