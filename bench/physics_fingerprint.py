"""Which physics does this Python run? One LIBERO-Spatial episode, the same on every machine: fixed
initial state 0 of task 0, seeded random actions, the MuJoCo state read at every chunk boundary.
Writes the states and the versions to JSON; with ``--compare`` it prints, chunk by chunk, the
largest difference from another machine's file (0.0 everywhere: the same physics, bit for bit).

Rendering is left out (the GPU renders through its driver, the CPU through llvmpipe), so the
figure is the physics and the controller alone: built wheels (``bench/mujoco_wheel.sh``) are
checked against the official ones with it.

    PYTHONPATH=python .venv/train/bin/python bench/physics_fingerprint.py --out cpu_237.json
    python3 bench/physics_fingerprint.py --out gpu.json --compare bench/baselines/physics_fingerprint_cpu_mujoco237.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))


def episode(steps: int, seed: int) -> list[np.ndarray]:
    from wmrl.config import SimConfig
    from wmrl.gl import configure_renderer
    from wmrl.sim.env import SpatialEnv

    configure_renderer()  # the env builds its cameras even though nothing here renders
    cfg = SimConfig(image_size=64, max_steps=steps)
    env = SpatialEnv(0, cfg)
    try:
        env.reset(init_index=0)
        rng = np.random.default_rng(seed)
        states = [np.array(env.raw.sim.get_state().flatten())]
        for step in range(steps):
            env.step(rng.uniform(-1, 1, 7))
            if (step + 1) % cfg.chunk_size == 0:
                states.append(np.array(env.raw.sim.get_state().flatten()))
        return states
    finally:
        env.close()


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=80, help="control steps (a multiple of the chunk, 8)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="write the states and versions here (JSON)")
    p.add_argument("--compare", type=Path, help="another run's JSON: the largest difference per chunk")
    a = p.parse_args(argv)
    if a.compare is not None and not a.compare.is_file():
        sys.exit(f"error: {a.compare} not found: give the JSON another run of this script wrote with --out")

    from wmrl.sim.env import simulator_versions

    states = episode(a.steps, a.seed)
    result = {"versions": simulator_versions(), "steps": a.steps, "seed": a.seed,
              "sha256": hashlib.sha256(np.stack(states).astype(np.float64).tobytes()).hexdigest(),
              "states": [s.tolist() for s in states]}
    print(f"versions {result['versions']}; {len(states)} states, sha256 {result['sha256'][:16]}")
    if a.compare is not None:
        other = json.loads(a.compare.read_text())
        if (other["steps"], other["seed"]) != (a.steps, a.seed):
            sys.exit(f"error: {a.compare} ran {other['steps']} steps with seed {other['seed']}: "
                     f"rerun with --steps {other['steps']} --seed {other['seed']}")
        diffs = [float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in zip(states, other["states"])]
        result["compare"] = {"against": str(a.compare), "versions": other["versions"], "max_abs_diff": diffs,
                             "identical": result["sha256"] == other["sha256"]}
        print(f"against {a.compare} ({other['versions']}): "
              f"{'identical, bit for bit' if result['compare']['identical'] else 'different'}; "
              f"largest difference per chunk: {', '.join(f'{d:.2g}' for d in diffs)}")
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = a.out.with_name(a.out.name + ".tmp")
        tmp.write_text(json.dumps(result))
        tmp.replace(a.out)
    return result


if __name__ == "__main__":
    main()
