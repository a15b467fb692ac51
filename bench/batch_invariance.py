"""Does an observation's action depend on the batch it shares? A policy checkpoint's actions for
random observations, one forward pass as the observations come (``act_batch``) against the
runner's fixed-shape passes (``act``: every pass ``--rows`` rows, padded), alone, in batches of
8 and 16 and in reverse order. Prints the largest difference of each comparison (0 = bit for bit)
and what the padding costs: milliseconds per call for 1, 8 and 16 observations in each form
(median of ``--repeats`` calls after one warm-up; on a GPU the evaluation's parent runs these
passes while the simulator workers step).

    PYTHONPATH=python .venv/train/bin/python bench/batch_invariance.py --ckpt runs/cpu12/weights/sft/global_step_4000
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))


def observations(n: int, size: int, proprio_dim: int, seed: int = 0) -> list:
    """``n`` random observations of task 1 (the harness's ``Observation``), chunk boundaries 0, 8, ..."""
    from wmrl.sim.env import Observation

    rng = np.random.default_rng(seed)
    return [Observation(main=rng.integers(0, 255, (size, size, 3), dtype=np.uint8),
                        wrist=rng.integers(0, 255, (size, size, 3), dtype=np.uint8),
                        proprio=rng.normal(size=proprio_dim).astype(np.float32),
                        instruction="pick up the black bowl next to the ramekin and place it on the plate",
                        task_index=1, state=None, step=8 * i) for i in range(n)]


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", type=Path, required=True, help="a policy checkpoint folder (weights/sft/global_step_N)")
    p.add_argument("--rows", type=int, default=16, help="rows of every fixed-shape pass")
    p.add_argument("--device", default="auto")
    p.add_argument("--repeats", type=int, default=20, help="timed calls per form and batch size")
    a = p.parse_args(argv)
    if not a.ckpt.is_dir():
        sys.exit(f"error: {a.ckpt} is not a checkpoint folder: give RUN/weights/sft/global_step_N")
    import torch

    from wmrl.policy.runner import PolicyRunner

    torch.set_num_threads(1)
    runner = PolicyRunner(a.ckpt, device=a.device, sampler="ode", batch_rows=a.rows)
    obs = observations(16, runner.image_size, int(runner.norm["p_m"].shape[-1]))
    out = {"device": str(runner.device)}
    forms = (("as they come", runner.act_batch), (f"fixed {a.rows} rows", runner.act))
    for name, act in forms:
        alone = np.concatenate([act([o]) for o in obs])
        diffs = {"alone vs 8": np.abs(alone[:8] - act(obs[:8])).max(),
                 "alone vs 16": np.abs(alone - act(obs)).max(),
                 "alone vs 16 reversed": np.abs(alone[::-1] - act(obs[::-1])).max()}
        out[name] = {k: float(v) for k, v in diffs.items()}
        print(f"{name:>16}: " + ", ".join(f"{k} {v:.2g}" for k, v in diffs.items()))
    for name, act in forms:
        ms = {n: milliseconds_per_call(act, obs[:n], a.repeats) for n in (1, 8, 16)}
        out[name]["ms_per_call"] = ms
        print(f"{name:>16}: " + ", ".join(f"{n} obs {v:.1f} ms" for n, v in ms.items()))
    return out


def milliseconds_per_call(act, observations: list, repeats: int) -> float:
    """Median wall time of ``act(observations)`` (it returns numpy arrays, so a GPU is synchronised)."""
    act(observations)
    times = []
    for _ in range(max(1, repeats)):
        t = time.perf_counter()
        act(observations)
        times.append(time.perf_counter() - t)
    return 1000.0 * float(np.median(times))


if __name__ == "__main__":
    main()
