"""Are GRPO's training starts drawn like the evaluation's fixed initial states?

GRPO, the demonstrations and collection start from seeded random placements
(``env.reset(seed=...)``, LIBERO's own placement sampler); the evaluation from the 50 fixed
initial states per task that LIBERO ships. Both should be draws of one distribution. This
resets each task from its fixed states and from as many random seeds, settles the scene
as every episode does, and compares the starts coordinate by coordinate: every movable
object's x and y, the end effector's x, y and z, and the distance from the bowl to move to
the plate (two-sample Kolmogorov-Smirnov statistic and p-value, mean and spread of both sets).

    PYTHONPATH=python .venv/train/bin/python bench/start_states.py --tasks 0-9 --trials 50 --workers 2 \
        --out runs/start_states.json

Nothing is rendered but the one observation a reset returns (64 px). With scipy's KS test over
~20 coordinates a task, a p-value below 0.01 in one coordinate somewhere in ten tasks is
expected by chance about twice; a shift that matters shows in several tasks or with p far below.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from expert_success import parse_range  # noqa: E402

RANDOM_SEED_BASE = 1_000_000  # far from the demonstrations' and GRPO's seeds; any seed is a random placement


def starts(job: tuple[int, int]) -> dict:
    """Worker: the settled start of one task from each fixed state and from as many random seeds."""
    task, trials = job
    sys.path.insert(0, os.path.join(ROOT, "python"))
    from wmrl.gl import configure_renderer

    configure_renderer()
    from wmrl.config import SimConfig
    from wmrl.sim.env import SpatialEnv

    env = SpatialEnv(task, SimConfig(image_size=64))
    out: dict = {"task": task, "target": env.task.target_object, "place_on": env.task.place_on}
    try:
        for kind in ("fixed", "random"):
            rows = []
            for i in range(trials):
                obs = env.reset(init_index=i) if kind == "fixed" else env.reset(seed=RANDOM_SEED_BASE + i)
                row = {f"{name}.{axis}": float(pose[k]) for name, pose in obs.privileged.items()
                       for k, axis in enumerate("xy")}
                row.update({f"eef.{axis}": float(obs.proprio[k]) for k, axis in enumerate("xyz")})
                bowl, plate = obs.privileged[env.task.target_object], obs.privileged[env.task.place_on]
                row["bowl_to_plate"] = float(np.linalg.norm(bowl[:2] - plate[:2]))
                rows.append(row)
            out[kind] = rows
    finally:
        env.close()
    return out


def compare(result: dict) -> list[dict]:
    """One row per coordinate: both sets' mean and standard deviation, KS statistic and p-value."""
    from scipy.stats import ks_2samp

    rows = []
    for key in result["fixed"][0]:
        a = np.array([r[key] for r in result["fixed"]])
        b = np.array([r[key] for r in result["random"]])
        if a.std() < 1e-9 and b.std() < 1e-9 and abs(a.mean() - b.mean()) < 1e-9:
            continue  # a fixture that never moves
        test = ks_2samp(a, b)
        rows.append({"coordinate": key, "fixed_mean": float(a.mean()), "fixed_std": float(a.std()),
                     "random_mean": float(b.mean()), "random_std": float(b.std()),
                     "ks": float(test.statistic), "p": float(test.pvalue)})
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", default="0-9")
    ap.add_argument("--trials", type=int, default=50, help="fixed states (the first N) and random seeds per task")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    tasks = parse_range(args.tasks)
    if not 2 <= args.trials <= 50:
        sys.exit("error: --trials must be 2..50 (a task has 50 fixed states)")
    with mp.get_context("spawn").Pool(min(args.workers, len(tasks))) as pool:
        results = pool.map(starts, [(t, args.trials) for t in tasks])
    report = []
    for result in results:
        rows = compare(result)
        report.append({"task": result["task"], "target": result["target"], "coordinates": rows})
        print(f"task {result['task']} (bowl to move: {result['target']}), {args.trials} fixed vs "
              f"{args.trials} random starts:")
        print(f"  {'coordinate':34s} {'fixed mean (sd)':>20s} {'random mean (sd)':>20s} {'KS':>6s} {'p':>9s}")
        for r in sorted(rows, key=lambda r: r["p"]):
            flag = "  <-" if r["p"] < 0.01 else ""
            print(f"  {r['coordinate']:34s} {r['fixed_mean']:9.4f} ({r['fixed_std']:.4f}) "
                  f"{r['random_mean']:9.4f} ({r['random_std']:.4f}) {r['ks']:6.2f} {r['p']:9.2g}{flag}")
    low = sum(r["p"] < 0.01 for t in report for r in t["coordinates"])
    total = sum(len(t["coordinates"]) for t in report)
    print(f"coordinates with p < 0.01: {low} of {total} (about {0.01 * total:.1f} expected by chance)")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"trials": args.trials, "random_seed_base": RANDOM_SEED_BASE, "tasks": report,
                       "raw": results}, f, indent=1)
        os.replace(tmp, args.out)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
