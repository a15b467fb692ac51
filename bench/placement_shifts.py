"""How far objects slide while a start settles: LIBERO's fixed initial states against its
random placements, and how often ``SimConfig.max_settle_shift`` draws a placement again.

Every episode starts with ``settle_steps`` no-op steps while the objects fall the last few
millimetres onto the table. LIBERO's placement sampler can put a bowl into the plate beside
it; the contact then throws the bowl across the table or off it, a start the fixed states
never show. Per task this resets from the fixed states and from as many random seeds with the
check off (``max_settle_shift=0``), measures each object's horizontal slide over the settle
steps, and then resets the same seeds with the check on (the default) and counts the redraws.

    PYTHONPATH=python .venv/train/bin/python bench/placement_shifts.py --tasks 0-9 --fixed 50 \
        --random 100 --workers 2 --out runs/placement_shifts.json

Nothing is rendered but the observations a reset returns (64 px).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing as mp
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from expert_success import parse_range  # noqa: E402
from start_states import RANDOM_SEED_BASE  # noqa: E402

TABLE_TOP_Z = 0.85  # an object whose centre ends below this has left the table (its top is at ~0.9 m)


def shifts(job: tuple[int, int, int]) -> dict:
    """Worker: per start, the largest horizontal slide of any object while settling, which
    object, and whether it ended off the table; then the redraws of the same seeds with the check."""
    task, n_fixed, n_random = job
    sys.path.insert(0, os.path.join(ROOT, "python"))
    from wmrl.gl import configure_renderer

    configure_renderer()
    from wmrl.config import SimConfig
    from wmrl.sim.env import NOOP_ACTION, SpatialEnv

    checked = SimConfig(image_size=64)
    # settle_steps=0: the reset returns the placement itself, the settle steps are taken here
    unsettled = dataclasses.replace(checked, settle_steps=0, max_settle_shift=0.0)
    env = SpatialEnv(task, unsettled)
    out: dict = {"task": task, "max_settle_shift": checked.max_settle_shift, "fixed": [], "random": []}
    try:
        for kind, count in (("fixed", n_fixed), ("random", n_random)):
            for i in range(count):
                env.reset(init_index=i) if kind == "fixed" else env.reset(seed=RANDOM_SEED_BASE + i)
                placed = env.object_poses()
                for _ in range(checked.settle_steps):
                    env._physics_step(NOOP_ACTION)
                settled = env.object_poses()
                slide = {name: float(np.linalg.norm(settled[name][:2] - placed[name][:2])) for name in placed}
                worst = max(slide, key=slide.get)
                out[kind].append({"start": i, "object": worst, "slide_m": slide[worst],
                                  "off_table": bool(settled[worst][2] < TABLE_TOP_Z)})
        env.cfg = checked
        for row in out["random"]:
            env.reset(seed=RANDOM_SEED_BASE + row["start"])
            row["redraws"] = env.placement_redraws
    finally:
        env.close()
    return out


def summary(rows: list[dict]) -> dict:
    slide = np.array([r["slide_m"] for r in rows])
    return {"starts": len(rows), "median_mm": float(1000 * np.median(slide)), "max_mm": float(1000 * slide.max()),
            "over_20mm": int((slide > 0.02).sum()), "over_100mm": int((slide > 0.1).sum()),
            "off_table": int(sum(r["off_table"] for r in rows)),
            "objects_over_20mm": sorted({r["object"] for r in rows if r["slide_m"] > 0.02})}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", default="0-9")
    ap.add_argument("--fixed", type=int, default=50, help="fixed states per task (the first N, at most 50)")
    ap.add_argument("--random", type=int, default=100, help="random seeds per task")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    tasks = parse_range(args.tasks)
    if not 1 <= args.fixed <= 50 or args.random < 1:
        sys.exit("error: --fixed must be 1..50 (a task has 50 fixed states) and --random at least 1")
    with mp.get_context("spawn").Pool(min(args.workers, len(tasks))) as pool:
        results = pool.map(shifts, [(t, args.fixed, args.random) for t in tasks])
    print(f"{'task':>4s} {'kind':>6s} {'starts':>6s} {'median mm':>9s} {'max mm':>7s} {'>20 mm':>6s} "
          f"{'>100 mm':>7s} {'off table':>9s} {'redrawn':>7s}  objects that slid > 20 mm")
    for result in results:
        for kind in ("fixed", "random"):
            s = result[kind + "_summary"] = summary(result[kind])
            redrawn = sum(r.get("redraws", 0) > 0 for r in result[kind]) if kind == "random" else "-"
            print(f"{result['task']:4d} {kind:>6s} {s['starts']:6d} {s['median_mm']:9.1f} {s['max_mm']:7.0f} "
                  f"{s['over_20mm']:6d} {s['over_100mm']:7d} {s['off_table']:9d} {redrawn!s:>7s}  "
                  f"{', '.join(s['objects_over_20mm'])}")
    after = [r for res in results for r in res["random"]]
    print(f"random placements redrawn with max_settle_shift={results[0]['max_settle_shift']}: "
          f"{sum(r['redraws'] > 0 for r in after)} of {len(after)} (most redraws of one seed: "
          f"{max(r['redraws'] for r in after)})")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"random_seed_base": RANDOM_SEED_BASE, "tasks": results}, f, indent=1)
        os.replace(tmp, args.out)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
