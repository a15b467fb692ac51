"""What each physics loop costs per control step, and how far its trajectory lands from
robosuite's own loop (one env, random actions from a fixed initial state).

    python bench/physics_passes.py [--task 0] [--steps 120]

* ``stock``: robosuite's loop, per substep ``forward`` -> controller -> ``mj_step``.
* ``split``: the kit's default, ``mj_step1`` -> controller -> ``mj_step2`` (the controller still
  calls ``forward`` itself to read the arm's state).
* ``lean`` (measured here only, not a kit setting): ``split`` with the controller's ``forward``
  skipped, since ``mj_step1`` already computed what the controller reads. In MuJoCo that
  forward pass also sets the constraint solver's warm start, so skipping it changes the
  trajectory within the solver's tolerance; the table says by how much.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))


def lean_step(env, action) -> bool:
    """``SpatialEnv._physics_step`` of ``split`` without the controller's own forward pass."""
    import mujoco

    raw = env.raw
    raw.timestep += 1
    m, d = raw.sim.model._model, raw.sim.data._data
    raw.sim.forward = lambda: None  # shadows the method on this instance only
    try:
        for i in range(env._substeps):
            mujoco.mj_step1(m, d)
            raw._pre_action(action, policy_step=(i == 0))
            mujoco.mj_step2(m, d)
    finally:
        del raw.sim.forward
    raw.cur_time += raw.control_timestep
    reward, _, _ = raw._post_action(action)
    return bool(reward > 0)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", type=int, default=0)
    p.add_argument("--steps", type=int, default=120)
    a = p.parse_args(argv)
    from wmrl.config import SimConfig
    from wmrl.gl import configure_renderer

    cfg = SimConfig(image_size=64)
    renderer = configure_renderer(cfg.renderer)
    from wmrl.sim.env import SpatialEnv

    env = SpatialEnv(a.task, cfg)
    actions = np.random.default_rng(0).uniform(-1, 1, (a.steps, 7)).astype(np.float32)
    runs = {}
    for mode in ("stock", "split", "lean"):
        env.cfg = dataclasses.replace(cfg, physics="stock" if mode == "stock" else "split")
        if mode == "lean":
            env._physics_step = lean_step.__get__(env)
        env.reset(init_index=2)
        t0 = time.perf_counter()
        qpos = []
        for act in actions:
            env.step(act)
            qpos.append(np.array(env.raw.sim.data.qpos))
        runs[mode] = (np.array(qpos), 1000 * (time.perf_counter() - t0) / a.steps)
        env.__dict__.pop("_physics_step", None)
    env.close()
    out = {"machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "renderer": renderer},
           "modes": {m: {"ms_per_step": round(ms, 2), "max_qpos_diff_vs_stock": float(np.abs(q - runs["stock"][0]).max())}
                     for m, (q, ms) in runs.items()}}
    for m, r in out["modes"].items():
        print(f"{m:>6}: {r['ms_per_step']:.2f} ms per control step, max |qpos - stock| after {a.steps} steps "
              f"{r['max_qpos_diff_vs_stock']:.1e}")
    return out


if __name__ == "__main__":
    main()
