"""What the substeps' arm control without robosuite's wrappers (``wmrl.sim.arm_control``) saves
per control step, and that it leaves the physics bit for bit robosuite's.

For each task and physics loop (``split``: evaluations; ``lean``: training episodes), one env
plays the same episode twice from fixed initial state 0 (seeded random arm actions, the
gripper switching every few steps so that it closes on things): once with robosuite's own
controller in every substep, once with ``ArmControl`` in the substeps after the first. The
MuJoCo state is compared at every chunk boundary; the per-step times are the median of
``--repeats`` alternating runs.

    PYTHONPATH=python .venv/train/bin/python bench/arm_control.py [--tasks 0-9] [--steps 240] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))


def actions(steps: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = rng.uniform(-1, 1, (steps, 7)) * np.array([0.5] * 6 + [1.0])
    out[:, 6] = np.where((np.arange(steps) // 12) % 2 == 0, -1.0, 1.0)  # open 12 steps, close 12 steps
    return out


def play(env, acts: np.ndarray, *, robosuite_only: bool) -> tuple[list[np.ndarray], float]:
    env.reset(init_index=0)
    if robosuite_only:  # as if ArmControl had declined this setup: robosuite's own _pre_action throughout
        env._arm, env._arm_controller = None, env.raw.robots[0].controller
    states, t0 = [], time.perf_counter()
    for i, a in enumerate(acts):
        env.step(a)
        if (i + 1) % env.cfg.chunk_size == 0:
            states.append(env.raw.sim.get_state().flatten().copy())
    return states, (time.perf_counter() - t0) / len(acts) * 1e3


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", default="0-9", help="e.g. 0-9 or 0,3")
    p.add_argument("--steps", type=int, default=240)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", type=Path)
    a = p.parse_args(argv)

    from wmrl.config import SimConfig, parse_tasks
    from wmrl.gl import configure_renderer
    from wmrl.sim.env import SpatialEnv, simulator_versions

    renderer = configure_renderer()
    rows = []
    for task in parse_tasks(a.tasks):
        for physics in ("split", "lean"):
            env = SpatialEnv(task, SimConfig(image_size=64, max_steps=a.steps, physics=physics))
            try:
                acts = actions(a.steps, seed=task)
                times = {False: [], True: []}
                states = {}
                for _ in range(a.repeats):
                    for robosuite_only in (True, False):
                        s, ms = play(env, acts, robosuite_only=robosuite_only)
                        times[robosuite_only].append(ms)
                        states[robosuite_only] = s
            finally:
                env.close()
            diff = max(float(np.max(np.abs(x - y))) for x, y in zip(states[True], states[False]))
            row = {"task": task, "physics": physics, "ms_robosuite": statistics.median(times[True]),
                   "ms_arm_control": statistics.median(times[False]), "max_abs_state_diff": diff,
                   "identical": all(np.array_equal(x, y) for x, y in zip(states[True], states[False]))}
            row["speedup"] = row["ms_robosuite"] / row["ms_arm_control"]
            rows.append(row)
            print(f"task {task} {physics:5s}: robosuite {row['ms_robosuite']:.2f} ms/step, arm control "
                  f"{row['ms_arm_control']:.2f} ms/step ({row['speedup']:.2f}x); "
                  f"{'identical, bit for bit' if row['identical'] else f'DIFFERENT (max {diff:.3g})'}", flush=True)
    summary = {}
    for physics in ("split", "lean"):
        r = [x for x in rows if x["physics"] == physics]
        summary[physics] = {"speedup_median": statistics.median(x["speedup"] for x in r),
                            "identical": all(x["identical"] for x in r)}
        print(f"{physics}: median speedup {summary[physics]['speedup_median']:.2f}x over {len(r)} tasks, "
              f"{'all identical' if summary[physics]['identical'] else 'NOT all identical'}")
    result = {"machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                          "renderer": renderer}, "versions": simulator_versions(), "steps": a.steps,
              "rows": rows, "summary": summary}
    if a.json is not None:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        tmp = a.json.with_name(a.json.name + ".tmp")
        tmp.write_text(json.dumps(result, indent=2))
        tmp.replace(a.json)
    return result


if __name__ == "__main__":
    main()
