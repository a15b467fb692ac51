"""How well does the world model's proprio head say where the end effector goes? Two ways to learn it.

    .venv/wm/bin/python bench/proprio_head.py --data runs/x/collect
    .venv/wm/bin/python bench/proprio_head.py --data runs/x/collect --data runs/y/collect --seeds 0,1 --json out.json

The head alone (``FrameWorldModel.proprio_head``, the default profile's width and one past chunk
of actions) is trained on recorded episodes (HDF5 files under each ``--data``, the last quarter
of each folder's episodes held out), once as the models have it (the next normalised proprio as a
residual on the current one) and once with ``WorldModelConfig.proprio_motion`` (the chunk's
motion, composed with the pose). On the held-out episodes, with their real actions: the end
effector's position error (mm) and orientation error (degrees, the angle of the turn between the
predicted and the real orientation) one chunk ahead and open loop (each prediction fed back) at
5 and 10 chunks; and what the axis-angle itself is off by (its components, as the policy reads
them). CPU, about a minute per variant and seed.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from wmrl.config import ConfigError  # noqa: E402

HORIZONS = (1, 5, 10)


def transitions(episodes: list, chunk: int):
    """Per chunk of every episode: proprio before (P), actions (previous chunk, then this one:
    2 x chunk x A, zeros before the start) and proprio after. Returns three stacked tensors."""
    import torch

    before, acts, after = [], [], []
    for ep in episodes:
        a = torch.as_tensor(ep.actions, dtype=torch.float32)  # (T, chunk, A)
        past = torch.cat([torch.zeros_like(a[:1]), a[:-1]])
        p = torch.as_tensor(ep.proprio, dtype=torch.float32)
        before.append(p[:-1])
        acts.append(torch.cat([past, a], dim=1))
        after.append(p[1:])
    return torch.cat(before), torch.cat(acts), torch.cat(after)


def errors(pred, real) -> dict:
    """Mean position error (mm); orientation error (deg: mean, median, share above 20 deg, where a
    few flips would hide in a mean); the axis-angle's largest component error (rad, mean)."""
    import torch

    from wmrl.worldmodel.rotation import relative_rotation

    deg = torch.rad2deg(relative_rotation(pred[:, 3:6], real[:, 3:6]).norm(dim=-1))
    return {"position_mm": round(1000 * float((pred[:, :3] - real[:, :3]).norm(dim=-1).mean()), 1),
            "orientation_deg": round(float(deg.mean()), 2), "orientation_deg_median": round(float(deg.median()), 2),
            "over_20_deg": round(float((deg > 20).float().mean()), 3),
            "axis_angle_error": round(float((pred[:, 3:6] - real[:, 3:6]).abs().max(dim=-1).values.mean()), 3)}


def train_head(model, data, steps: int, batch: int, lr: float, seed: int) -> float:
    import torch

    before, acts, after = data
    norm = lambda p: model.normalize_proprio(p)  # noqa: E731
    opt = torch.optim.Adam(model.proprio_head.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        i = torch.randint(0, len(before), (batch,), generator=g)
        loss = model.proprio_loss(acts[i], norm(before[i]), norm(after[i]))
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    return float(loss.detach())


def open_loop(model, episodes: list, horizon: int) -> dict:
    """Per horizon: errors of the head's own chain of predictions (real actions) from each held-out
    episode's start, over the episodes at least that long."""
    import torch

    out = {}
    with torch.no_grad():
        for h in HORIZONS:
            eps = [e for e in episodes if len(e.actions) >= h]
            if not eps or h > horizon:
                continue
            p = torch.stack([torch.as_tensor(e.proprio[0], dtype=torch.float32) for e in eps])
            prev = torch.zeros(len(eps), *eps[0].actions.shape[1:])
            for t in range(h):
                a = torch.stack([torch.as_tensor(e.actions[t], dtype=torch.float32) for e in eps])
                nxt = model.next_proprio(torch.cat([prev, a], dim=1), model.normalize_proprio(p))
                p, prev = model.unnormalize_proprio(nxt.float()), a
            real = torch.stack([torch.as_tensor(e.proprio[h], dtype=torch.float32) for e in eps])
            out[str(h)] = {"episodes": len(eps), **errors(p, real)}
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, action="append", required=True,
                   help="a folder of recorded episodes (make collect's RUN/collect); several: one result each")
    p.add_argument("--episodes", type=int, default=200, help="per folder, at most")
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seeds", default="0", help="comma-separated: initial weights and batch order")
    p.add_argument("--json", type=Path)
    a = p.parse_args(argv)
    try:
        seeds = [int(s) for s in a.seeds.split(",")]
    except ValueError:
        raise ConfigError(f"--seeds {a.seeds!r}: integers, e.g. 0,1") from None
    if a.steps < 1 or a.batch < 1 or a.episodes < 4:
        raise ConfigError("--steps and --batch: 1 or more; --episodes: 4 or more (a quarter is held out)")

    import torch

    from wmrl.config import CHUNK_SIZE, WorldModelConfig
    from wmrl.worldmodel.data import episodes_under
    from wmrl.worldmodel.model import FrameWorldModel

    torch.set_num_threads(max(1, torch.get_num_threads()))
    results = []
    for data in a.data:
        episodes = episodes_under(data, CHUNK_SIZE, a.episodes)
        if len(episodes) < 4:
            raise ConfigError(f"{data}: {len(episodes)} episodes of two chunks or more; need 4 (a quarter is held out)")
        held = len(episodes) // 4
        train, val = episodes[:-held], episodes[-held:]
        tr, va = transitions(train, CHUNK_SIZE), transitions(val, CHUNK_SIZE)
        stats = {"mean": tr[0].mean(0), "std": tr[0].std(0).clamp_min(1e-3)}
        for seed in seeds:
            for motion in (False, True):
                torch.manual_seed(seed)
                # the head as the default profile builds it; a one-level U-Net beside it, unused here
                cfg = WorldModelConfig(view="main", image_size=8, channels=(8,), patch=1, refine=0, action_history=1,
                                       proprio_motion=motion)
                model = FrameWorldModel(cfg)
                model.set_proprio_stats(stats)
                t0 = time.perf_counter()
                loss = train_head(model, tr, a.steps, a.batch, a.lr, seed)
                with torch.no_grad():
                    pred = model.unnormalize_proprio(model.next_proprio(va[1], model.normalize_proprio(va[0])).float())
                one = errors(pred, va[2])
                row = {"data": str(data), "seed": seed, "head": "motion" if motion else "residual",
                       "train_episodes": len(train), "held_out_episodes": len(val), "final_loss": round(loss, 4),
                       "one_chunk": one, "open_loop": open_loop(model, val, max(HORIZONS)),
                       "seconds": round(time.perf_counter() - t0, 1)}
                results.append(row)
                print(f"[proprio_head] {data.name} seed {seed} {row['head']}: one chunk {one['position_mm']} mm, "
                      f"{one['orientation_deg']} deg (median {one['orientation_deg_median']}, "
                      f"{one['over_20_deg']:.0%} over 20); open loop "
                      + ", ".join(f"{h}: {v['position_mm']} mm {v['orientation_deg']} deg (median {v['orientation_deg_median']})"
                                  for h, v in row["open_loop"].items()), flush=True)
    result = {"rows": results, "steps": a.steps, "batch": a.batch, "lr": a.lr,
              "machine": {"host": platform.node(), "torch": torch.__version__}}
    if a.json:  # atomically: a killed run leaves the previous file whole
        from wmrl.fileio import write_json

        write_json(a.json, result)
    return result


if __name__ == "__main__":
    from wmrl.cli import run

    run(lambda: main() and 0)  # the kit's one-line errors (exit 2); main returns its figures, the exit code 0
