"""GRPO's rollouts in the real simulator: environment steps per second and env builds per step
under two task schedules (no policy network: random action chunks, so it runs on any CPU).

    python bench/grpo_rollouts.py                                   # one worker per core
    python bench/grpo_rollouts.py --workers 8 --groups 4 --group-size 8 --steps 10 --json out.json
    python bench/grpo_rollouts.py --schedules sliding --train-physics split,lean   # the physics loops

A GRPO step hands the worker pool ``groups`` x ``group_size`` episodes over ``groups`` tasks.
Every worker keeps an env for its ``envs_per_worker`` most recent tasks, because building one
costs 4-6 s against well under a second for a reset. Which tasks consecutive steps share decides how often
the workers build:

* ``blocks``: step s takes the next ``groups`` tasks in turn (s * groups + g): with 4 groups
  over 10 tasks, consecutive steps share no task, so nearly every worker builds every step;
* ``sliding``: step s takes tasks s, s + 1, ..., s + groups - 1: consecutive steps share all but
  one task, and every task still comes ``groups`` times in any 10 consecutive steps.

Episodes end at the simulator's success or after ``--max-chunks`` chunks; actions are uniform
random, so nearly all run to the limit. ``--train-physics`` compares the control-step loops of
training episodes (``SimConfig.train_physics``). Prints the machine it ran on.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))


def schedule_tasks(kind: str, tasks: tuple[int, ...], step: int, groups: int) -> list[int]:
    if kind == "blocks":
        return [tasks[(step * groups + g) % len(tasks)] for g in range(groups)]
    from wmrl.rl.envs import group_tasks

    return group_tasks(tasks, step, groups)


def measure(kind: str, physics: str, a) -> dict:
    import torch
    from wmrl.config import SimConfig
    from wmrl.rl.envs import SimEnv, Start, derived_seed

    sim = SimConfig(image_size=a.image_size, train_physics=physics)
    env = SimEnv(sim, tasks=tuple(range(10)), groups=a.groups, seed=0, workers=a.workers, max_chunks=a.max_chunks,
                 envs_per_worker=a.envs_per_worker)
    g = torch.Generator().manual_seed(0)

    def act(obs):  # random chunks in the controller's range
        return torch.rand((len(obs.rollout), sim.chunk_size, 7), generator=g) * 2 - 1

    rows = []
    try:
        for step in range(1, a.steps + 1):
            starts = [Start(step, i, t, seed=derived_seed(0, step, i, 0x5EED) % (2**31))
                      for i, t in enumerate(schedule_tasks(kind, tuple(range(10)), step, a.groups))]
            t0 = time.perf_counter()
            out = env.run(starts, a.group_size, act)
            secs = time.perf_counter() - t0
            rows.append({"step": step, "seconds": round(secs, 2), "env_steps": sum(o.steps for o in out),
                         "env_builds": sum(o.env_built for o in out)})
            print(f"[{kind}, {physics}] step {step}: {rows[-1]}", flush=True)
    finally:
        env.close()
    steady = rows[1:] or rows  # the first step builds every worker's first envs under both schedules
    secs, steps = sum(r["seconds"] for r in steady), sum(r["env_steps"] for r in steady)
    return {"schedule": kind, "train_physics": physics, "steps": rows, "steady_env_steps_per_s": round(steps / secs, 1),
            "steady_builds_per_step": round(sum(r["env_builds"] for r in steady) / len(steady), 2)}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=os.cpu_count())
    p.add_argument("--groups", type=int, default=4)
    p.add_argument("--group-size", type=int, default=2)
    p.add_argument("--steps", type=int, default=6, help="GRPO steps per schedule")
    p.add_argument("--max-chunks", type=int, default=20)
    p.add_argument("--envs-per-worker", type=int, default=3)
    p.add_argument("--image-size", type=int, default=128)
    p.add_argument("--schedules", default="blocks,sliding")
    p.add_argument("--train-physics", default="split", help="control-step loops to compare, e.g. split,lean")
    p.add_argument("--json", help="write the figures here too")
    a = p.parse_args(argv)
    from wmrl.gl import configure_renderer

    renderer = configure_renderer()
    result = {"machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                          "python": platform.python_version(), "renderer": renderer},
              "settings": vars(a), "schedules": [measure(k, ph, a) for k in a.schedules.split(",")
                                                        for ph in a.train_physics.split(",")]}
    for r in result["schedules"]:
        print(f"{r['schedule']:>8}, {r['train_physics']:>5}: {r['steady_env_steps_per_s']} env steps/s, "
              f"{r['steady_builds_per_step']} env builds "
              f"per step (steps 2-{a.steps}; {a.workers} workers, {a.groups} x {a.group_size} episodes per step)")
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
