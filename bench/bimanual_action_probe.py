"""Do a bundle's actions say how the next frame differs from the last one? A linear readout.

Ridge regression from each transition's action (the normalised, masked command, and its
step: the command minus the previous one's) to the frame change it leads to (every pixel),
fit on the training windows, scored on the validation windows as the pooled PSNR of the
last frame plus the predicted change. Against it: copying the last frame, the same readout
fed another transition's actions (its gain without them), and the previous change repeated.
A world model that reads its actions should beat this readout; one that only reaches
copy-last does not read them (``make bimanual-eval``'s action response says the same).

    python bench/bimanual_action_probe.py BUNDLE [--windows 960] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from wmrl.bimanual.bundle import Bundle  # noqa: E402
from wmrl.bimanual.loader import make_bimanual_local_dataloader  # noqa: E402

STEP_SCALE = 10.0  # steps are ~0.05 normalised units; scaled to the commands' range for the ridge


def transitions(batches) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(N, 2A+1) action features, (N, 3HW) frame change, (N, 3HW) previous change of every
    valid transition in ``batches``."""
    feats, change, prev = [], [], []
    for bt in batches:
        v, fm = bt["video"], bt["frame_mask"]
        a = bt["actions"] * bt["action_mask"]
        for f in range(1, min(v.shape[1], a.shape[1] + 1)):  # transition f-1 leads to frame f
            ok = fm[:, f] & fm[:, f - 1]
            step = a[:, f - 1] - a[:, max(f - 2, 0)]
            feats.append(torch.cat([a[:, f - 1], STEP_SCALE * step, torch.ones(len(a), 1)], -1)[ok])
            change.append((v[:, f] - v[:, f - 1])[ok].flatten(1))
            before = v[:, f - 1] - v[:, f - 2] if f >= 2 else torch.zeros_like(v[:, 0])
            prev.append(before[ok].flatten(1))
    return torch.cat(feats), torch.cat(change), torch.cat(prev)


def pooled_psnr(err: torch.Tensor) -> float:
    """PSNR of the mean squared error of images in [-1, 1] (peak 1 on the [0, 1] scale)."""
    return 10 * math.log10(1 / float(((err / 2) ** 2).mean()))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bundle")
    p.add_argument("--windows", type=int, default=960, help="training windows to fit on")
    p.add_argument("--val-windows", type=int, default=64)
    p.add_argument("--ridge", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json")
    a = p.parse_args()
    torch.manual_seed(a.seed)
    bundle = Bundle(a.bundle)
    train = make_bimanual_local_dataloader(bundle, stage=1, split="train", batch_size=8, seed=a.seed)
    val = make_bimanual_local_dataloader(bundle, stage=1, split="val", batch_size=8)
    xt, yt, _ = transitions(train.next_batch()[0] for _ in range(a.windows // 8))
    xv, yv, pv = transitions(b for b, _ in val.iter_val(limit=a.val_windows))
    w = torch.linalg.solve(xt.T @ xt + a.ridge * torch.eye(xt.shape[1]), xt.T @ yt)
    shuffled = xv[torch.randperm(len(xv))]
    alpha = float((pv * yv).sum() / (pv * pv).sum().clamp(min=1e-12))  # least squares on validation: generous
    report = {"bundle": str(a.bundle), "train_transitions": len(xt), "val_transitions": len(xv),
              "psnr_copy_last_pooled_db": pooled_psnr(yv),
              "psnr_linear_actions_pooled_db": pooled_psnr(yv - xv @ w),
              "psnr_linear_other_actions_pooled_db": pooled_psnr(yv - shuffled @ w),
              "psnr_previous_change_pooled_db": pooled_psnr(yv - alpha * pv), "previous_change_gain": alpha}
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in report.items()}, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
