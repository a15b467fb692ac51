"""Simulator throughput: policy steps per second, per worker and in aggregate.

    python bench/sim_throughput.py                    # one worker per core, 64/128/256 px
    python bench/sim_throughput.py --workers 16 --sizes 128 --steps 240 --json out.json

Each worker builds one LIBERO-Spatial env (construction is not timed), then runs episodes
of random actions: once physics only, once rendering both cameras at every chunk boundary
(every 8 steps, as collection and evaluation do). Prints the machine it ran on.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))


_BARRIER = None


def _init(barrier) -> None:
    global _BARRIER
    _BARRIER = barrier


def _worker(args):
    size, steps, render, task, seed, profile, physics = args
    import numpy as np
    from wmrl.config import SimConfig
    from wmrl.gl import configure_renderer
    from wmrl.sim.env import SpatialEnv

    configure_renderer()
    cfg = SimConfig(image_size=size, max_steps=steps, render_profile=profile, physics=physics)
    env = SpatialEnv(task, cfg)
    rng = np.random.default_rng(seed)
    env.reset(init_index=seed % 50)
    _BARRIER.wait()  # every worker has built its env: building must not overlap stepping
    t0 = time.perf_counter()
    done = 0
    while done < steps:
        for _ in range(cfg.chunk_size):
            env.step(rng.uniform(-1, 1, 7))
            done += 1
        if render:
            env.observe()
    wall = time.perf_counter() - t0
    env.close()
    return done, wall


def machine() -> dict:
    model = "unknown"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    from wmrl.gl import choose_backend
    from wmrl.sim.env import simulator_versions

    return {"host": platform.node(), "cores": os.cpu_count(), "cpu": model, "renderer": choose_backend(),
            "python": platform.python_version(), **simulator_versions()}


def main() -> None:
    from wmrl.config import default_workers

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=default_workers())
    p.add_argument("--sizes", default="64,128,256")
    p.add_argument("--steps", type=int, default=240, help="steps per worker per measurement")
    p.add_argument("--render-profile", default="fast", choices=["fast", "stock"])
    p.add_argument("--physics", default="split", choices=["split", "stock"])
    p.add_argument("--json", help="also write the figures here")
    args = p.parse_args()
    from wmrl.gl import configure_renderer

    configure_renderer()
    info = machine()
    print("machine: " + ", ".join(f"{k}={v}" for k, v in info.items()))
    print(f"workers={args.workers} steps/worker={args.steps} render_profile={args.render_profile} physics={args.physics}")
    print(f"{'size':>5} {'mode':>16} {'steps/s/worker':>15} {'aggregate steps/s':>18}")
    rows = []
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(args.workers)
    with ctx.Pool(args.workers, initializer=_init, initargs=(barrier,)) as pool:
        for size in [int(s) for s in args.sizes.split(",")]:
            for render in (False, True):
                jobs = [(size, args.steps, render, w % 10, w, args.render_profile, args.physics) for w in range(args.workers)]
                t0 = time.perf_counter()
                out = pool.map(_worker, jobs, chunksize=1)
                per_worker = sum(s / w for s, w in out) / len(out)
                # aggregate: all steps over the slowest worker's stepping time (construction excluded)
                aggregate = sum(s for s, _ in out) / max(w for _, w in out)
                mode = "cameras@chunk" if render else "physics only"
                print(f"{size:>5} {mode:>16} {per_worker:>15.1f} {aggregate:>18.1f}   ({time.perf_counter() - t0:.0f} s incl. env build)")
                rows.append({"size": size, "mode": mode, "steps_per_s_per_worker": round(per_worker, 1),
                             "aggregate_steps_per_s": round(aggregate, 1)})
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": info, "args": vars(args), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
