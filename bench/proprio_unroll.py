"""Does training the world model's proprio head over several chunks of its own predictions
keep the imagined end effector closer to the real one open loop?

The proprio head (``FrameWorldModel.proprio_head``, an MLP from the chunk's actions and the pose
to the chunk's motion) is trained one chunk ahead from the real pose; in imagination it reads its
own previous prediction, and its errors add up (the H100 pairs: 7 mm one chunk ahead, 21-38 mm at
5-10 chunks, bench/RESULTS.md). Here the head alone is trained on recorded episodes, one chunk
ahead against K chunks unrolled on its own poses (the loss on every unrolled chunk, the motion
from the imagined pose to the real one), and scored open loop from every held-out episode's
start at 1 / 5 / 10 / 20 chunks, as ``make wm-eval`` scores the pair:

    python python/collect_demos.py --tasks all --episodes 10 --action-noise 0.3 --keep-failures \\
        --image-size 64 --frame-interval 8 --out X                      # any recorded episodes
    python bench/proprio_unroll.py --data X --unroll 1,4 --seeds 0,1

Only the proprio head learns (the frames play no part in it), so a CPU answers in minutes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
from wmrl.config import ConfigError, WorldModelConfig  # noqa: E402
from wmrl.worldmodel.data import Transitions, episodes_under, proprio_stats  # noqa: E402
from wmrl.worldmodel.fidelity import HORIZONS, eef_distance_mm  # noqa: E402
from wmrl.worldmodel.model import FrameWorldModel  # noqa: E402


def windows(t: Transitions, k: int) -> torch.Tensor:
    """(W, k) transition indices of every run of k consecutive chunks inside one episode."""
    following = torch.full_like(t.previous, -1)
    has_prev = t.previous >= 0
    following[t.previous[has_prev]] = torch.nonzero(has_prev).flatten()
    rows = [torch.arange(t.size)]
    for _ in range(k - 1):
        nxt = following[rows[-1].clamp_min(0)]
        rows.append(torch.where(rows[-1] >= 0, nxt, rows[-1]))
    idx = torch.stack(rows, dim=1)
    return idx[(idx >= 0).all(dim=1)]


def unrolled_loss(model: FrameWorldModel, t: Transitions, win: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """The motion loss at every chunk of the windows ``win`` (B, k), each chunk starting from
    the pose the head imagined for it (the first from the real one); ``p``: normalised proprio."""
    pose = p[t.context[win[:, 0], -1]]
    loss = 0.0
    for j in range(win.shape[1]):
        actions = t.actions_of(win[:, j])
        real_next = p[t.next[win[:, j]]]
        loss = loss + torch.nn.functional.mse_loss(model.proprio_motion(actions, pose)[0],
                                                   model.motion_target(pose, real_next))
        pose = model.next_proprio(actions, pose)
    return loss / win.shape[1]


@torch.no_grad()
def open_loop_error(model: FrameWorldModel, episodes, history: int) -> dict[str, float]:
    """Mean end-effector error (mm) at each horizon, the head rolled from each episode's start."""
    errs: dict[int, list[float]] = {h: [] for h in HORIZONS}
    for ep in episodes:
        raw = torch.from_numpy(ep.proprio).float()
        pose = model.normalize_proprio(raw[:1])
        chunks = Transitions([ep], model.cfg.context, action_history=history)  # its chunks in order, with their history
        for k in range(chunks.size):
            pose = model.next_proprio(chunks.actions_of(torch.tensor([k])), pose)
            if k + 1 in errs:
                errs[k + 1].append(float(eef_distance_mm(model.unnormalize_proprio(pose), raw[k + 1:k + 2])))
    return {str(h): round(sum(v) / len(v), 1) for h, v in errs.items() if v}


def train(t: Transitions, cfg: WorldModelConfig, k: int, steps: int, batch: int, lr: float, seed: int) -> FrameWorldModel:
    torch.manual_seed(seed)
    model = FrameWorldModel(cfg)
    model.set_proprio_stats(proprio_stats(t))
    p = model.normalize_proprio(t.proprio.float())
    win = windows(t, k)
    opt = torch.optim.AdamW(model.proprio_head.parameters(), lr=lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        loss = unrolled_loss(model, t, win[torch.randint(len(win), (batch,), generator=g)], p)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.proprio_head.parameters(), 1.0)
        opt.step()
        sched.step()
    return model.eval()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="a folder of recorded HDF5 episodes (make collect, collect_demos.py)")
    ap.add_argument("--unroll", default="1,4", help="chunks unrolled in training, one run each (1: today's loss)")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--hidden", type=int, default=256, help="proprio_hidden (the default profile's: 256)")
    ap.add_argument("--history", type=int, default=1, help="action_history (the default profile's: 1)")
    ap.add_argument("--val-ratio", type=float, default=0.3)
    ap.add_argument("--json", help="also write the table here")
    args = ap.parse_args(argv)
    unrolls = [int(k) for k in args.unroll.split(",")]
    if min(unrolls) < 1 or not 0 < args.val_ratio < 1 or args.steps < 1:
        ap.error("--unroll takes chunk counts of 1 or more, --val-ratio a fraction in (0, 1), --steps 1 or more")
    try:
        episodes = episodes_under(Path(args.data), 8, 10**9)
    except ConfigError as e:
        ap.error(str(e))
    if len(episodes) < 2:
        ap.error(f"{args.data} holds {len(episodes)} episode(s): record more (some to train on, some to hold out)")
    cut = max(1, round(len(episodes) * args.val_ratio))
    val, train_eps = episodes[:cut], episodes[cut:]  # episodes_under interleaves tasks: each half has every task
    cfg = WorldModelConfig(image_size=int(train_eps[0].main.shape[1]), channels=(8, 16), cond_dim=32, patch=1, refine=0,
                           proprio_hidden=args.hidden, proprio_motion=True, action_history=args.history)
    t = Transitions(train_eps, cfg.context, action_history=args.history)
    print(f"{len(train_eps)} training episodes ({t.size} transitions), {len(val)} held out; "
          f"{args.steps} updates of batch {args.batch}", flush=True)
    held: dict[int, list[float]] = {}  # the start's end effector held: the reference wm_eval prints beside
    for ep in val:
        raw = torch.from_numpy(ep.proprio).float()
        for h in HORIZONS:
            if h < len(raw):
                held.setdefault(h, []).append(float(eef_distance_mm(raw[:1], raw[h:h + 1])))
    rows = [{"unroll": "start held", "seed": "-", "eef_error_mm": {str(h): round(sum(v) / len(v), 1) for h, v in held.items()}}]
    for k in unrolls:
        for seed in map(int, args.seeds.split(",")):
            t0 = time.perf_counter()
            model = train(t, cfg, k, args.steps, args.batch, args.lr, seed)
            row = {"unroll": k, "seed": seed, "eef_error_mm": open_loop_error(model, val, args.history),
                   "train_s": round(time.perf_counter() - t0, 1)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    print("\n| chunks unrolled in training | seed | " + " | ".join(f"{h} chunks (mm)" for h in rows[0]["eef_error_mm"]) + " |")
    print("|---|---|" + "---|" * len(rows[0]["eef_error_mm"]))
    for r in rows:
        print(f"| {r['unroll']} | {r['seed']} | " + " | ".join(str(v) for v in r["eef_error_mm"].values()) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
