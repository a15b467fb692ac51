"""Success rate of the scripted expert on LIBERO-Spatial's fixed initial states.

    PYTHONPATH=python .venv/train/bin/python bench/expert_success.py \
        --tasks 0-9 --trials 50 --workers 2 --out runs/expert_500.json

Each worker process (multiprocessing, spawn) builds one env per task it is given and
reuses it across that task's initial states; nothing is rendered (the expert reads the
simulator state). Prints per-task success and steps (mean/max over successful episodes)
and writes every episode's result plus the simulator versions to ``--out``.

``--inits 0-4,17`` picks initial states explicitly; with ``--random-resets`` the numbers
are seeds of random placements (``env.reset(seed=...)``, the training-data resets) instead.
Runs repeat exactly on one machine (same initial states, same order); the simulation is
chaotic at contacts, so numerically different machines or libraries can flip single
episodes.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_range(text: str) -> list[int]:
    """'0-9' -> [0..9]; '4,5' -> [4, 5]; '0-2,7' -> [0, 1, 2, 7]."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-")
            out.extend(range(int(lo), int(hi) + 1))
        else:
            out.append(int(part))
    return out


def _setup_path() -> None:
    src = os.path.join(ROOT, "python")
    if src not in sys.path:
        sys.path.insert(0, src)


def run_task(job: tuple[int, list[int], int, int, bool]) -> list[dict]:
    """Worker: all requested initial states of one task with one env."""
    task, inits, seed, max_steps, random_resets = job
    _setup_path()
    from wmrl.gl import configure_renderer

    configure_renderer()
    from wmrl.config import SimConfig
    from wmrl.sim.env import SpatialEnv
    from wmrl.sim.expert import ScriptedExpert

    env = SpatialEnv(task, SimConfig(image_size=64, max_steps=max_steps))
    expert = ScriptedExpert(seed=seed)
    results = []
    try:
        for i in inits:
            t0 = time.time()
            if random_resets:
                env.reset(seed=i)
            else:
                env.reset(init_index=i)
            expert.reset(env)
            success_step = None
            while not env.done:
                env.step(expert.act(env))
                if env.success and success_step is None:
                    success_step = env.steps
            results.append(
                {
                    "task": task,
                    "init": i,
                    "success": bool(env.success),
                    "steps": int(success_step if success_step is not None else env.steps),
                    "final_phase": expert.phase,
                    "grasp_attempts": len(expert.tried),
                    "seconds": round(time.time() - t0, 2),
                }
            )
    finally:
        env.close()
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", default="0-9", help="task indices, e.g. 0-9 or 4,5")
    ap.add_argument("--trials", type=int, default=50, help="fixed initial states per task (first N)")
    ap.add_argument("--inits", default=None, help="explicit initial-state indices (overrides --trials), e.g. 0-4,17")
    ap.add_argument("--workers", type=int, default=2, help="processes (this machine has 2 cores)")
    ap.add_argument("--seed", type=int, default=0, help="expert seed")
    ap.add_argument("--max-steps", type=int, default=240)
    ap.add_argument("--chunks", type=int, default=0,
                    help="split each task's inits into this many jobs (0: enough to keep all workers busy)")
    ap.add_argument("--random-resets", action="store_true",
                    help="treat the init indices as seeds of random placements (training-mode resets)")
    ap.add_argument("--out", default=None, help="JSON file for per-episode results")
    args = ap.parse_args(argv)

    tasks = parse_range(args.tasks)
    inits = parse_range(args.inits) if args.inits else list(range(args.trials))
    # Jobs are (task, slice of inits): with fewer tasks than workers, split tasks so that all
    # workers stay busy; each job pays one env construction (~10 s).
    chunks = args.chunks or (1 if len(tasks) >= 2 * args.workers else max(1, args.workers))
    jobs = []
    for t in tasks:
        for c in range(chunks):
            part = inits[c::chunks]
            if part:
                jobs.append((t, part, args.seed, args.max_steps, args.random_resets))

    t0 = time.time()
    results: list[dict] = []
    ctx = mp.get_context("spawn")
    with ctx.Pool(args.workers) as pool:
        for res in pool.imap_unordered(run_task, jobs):
            results.extend(res)
            r0 = res[0]
            ok = sum(r["success"] for r in res)
            print(f"  job task {r0['task']}: {ok}/{len(res)} ({time.time() - t0:.0f} s)", flush=True)
    wall = time.time() - t0
    results.sort(key=lambda r: (r["task"], r["init"]))

    _setup_path()
    from wmrl.sim.env import simulator_versions

    print(f"\n{'task':>4} {'success':>9} {'rate':>6} {'steps mean':>10} {'max':>5}  failures (init:phase)")
    per_task = {}
    for t in tasks:
        rs = [r for r in results if r["task"] == t]
        ok = [r for r in rs if r["success"]]
        steps = [r["steps"] for r in ok]
        fails = [f"{r['init']}:{r['final_phase']}" for r in rs if not r["success"]]
        per_task[t] = {
            "success": len(ok),
            "episodes": len(rs),
            "rate": len(ok) / max(1, len(rs)),
            "steps_mean": float(sum(steps) / len(steps)) if steps else None,
            "steps_max": max(steps) if steps else None,
            "failures": [r["init"] for r in rs if not r["success"]],
        }
        mean = f"{per_task[t]['steps_mean']:.1f}" if steps else "-"
        worst = max(steps) if steps else "-"
        rate = per_task[t]["rate"]
        print(f"{t:>4} {len(ok):>4}/{len(rs):<4} {rate:>6.1%} {mean:>10} {worst:>5}  {' '.join(fails)}")
    ok_all = [r for r in results if r["success"]]
    steps_all = [r["steps"] for r in ok_all]
    overall = {
        "success": len(ok_all),
        "episodes": len(results),
        "rate": len(ok_all) / max(1, len(results)),
        "steps_mean": float(sum(steps_all) / len(steps_all)) if steps_all else None,
        "steps_max": max(steps_all) if steps_all else None,
        "steps_over_220": sum(s > 220 for s in steps_all),
    }
    print(
        f"\nall  {overall['success']}/{overall['episodes']} = {overall['rate']:.1%}, steps mean "
        f"{overall['steps_mean'] or 0:.1f} max {overall['steps_max']}, wall {wall:.0f} s with {args.workers} workers"
    )
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(
                {
                    "policy_id": "scripted-expert-v1",
                    "command": " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:]) if argv is None else None,
                    "config": {**vars(args), "image_size": 64},
                    "versions": simulator_versions(),
                    "wall_seconds": round(wall, 1),
                    "overall": overall,
                    "per_task": per_task,
                    "episodes": results,
                },
                f,
                indent=1,
            )
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
