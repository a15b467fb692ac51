"""A policy's success from the three kinds of start: the fixed evaluation states, random
placements with the arm at its rest pose, and the same placements with the arm's joints
jittered as the fixed states hold them (``SimConfig.robot_init_noise``).

GRPO trains on random placements and is judged on the fixed states; the supervised policy
succeeded on 69% of the former and 57.6% of the latter with the same sampler (bench/RESULTS.md,
runs 14 and 15). The jittered and the bare placements share every seed (objects, fixtures and
the policy's noise), so their difference is the arm's start alone, read state by state.

    PYTHONPATH=python .venv/train/bin/python bench/start_gap.py --run runs/cpu12 --ckpt sft/4000 \
        --sampler sde --temperature 1 --tasks 0-9 --episodes 10 --workers 2 --out runs/start_gap.json

Writes every episode's outcome per kind of start to ``--out`` (rerun: kinds already there are kept).
``--against other.json`` (another policy's file of the same plan) adds each kind's change from that
policy, start by start:

    ... bench/start_gap.py --run runs/ft/sft_jitter --ckpt sft/400 --sampler ode --tasks 0-9 --episodes 15 \
        --kinds random_jitter --out runs/ft/gap_jitter.json --against runs/start_gap_ode.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from expert_success import parse_range  # noqa: E402

SEED_BASE = 2_000_000  # random placements far from the demonstrations', collection's and GRPO's seeds
KINDS = ("fixed", "random_rest", "random_jitter")


def specs(kind: str, tasks: list[int], episodes: int, eval_seed: int):
    from wmrl.evaluation.harness import episode_seed
    from wmrl.sim.vector import EpisodeSpec

    if kind == "fixed":
        return [EpisodeSpec(t, init_index=i, seed=episode_seed(eval_seed, t, i), tag=i)
                for t in tasks for i in range(episodes)]
    return [EpisodeSpec(t, seed=SEED_BASE + 1000 * t + i, tag=i) for t in tasks for i in range(episodes)]


def run_kind(kind: str, runner, sim, tasks: list[int], episodes: int, eval_seed: int, workers: int,
             progress: bool = True) -> list[dict]:
    from tqdm import tqdm

    from wmrl.sim.vector import FixedEpisodes, SimulatorPool

    sim = replace(sim, robot_init_noise=0.0 if kind == "random_rest" else sim.robot_init_noise)
    todo = specs(kind, tasks, episodes, eval_seed)
    out = []
    with SimulatorPool(sim, workers, policy_id=runner.policy_id) as pool:
        bar = tqdm(total=len(todo), desc=kind, unit="ep", disable=not progress)
        for r in pool.run(FixedEpisodes(todo), runner):
            out.append({"task": r.spec.task_index, "tag": r.spec.tag, "success": bool(r.success), "steps": r.steps})
            bar.set_postfix(success=f"{sum(e['success'] for e in out)}/{len(out)}")
            bar.update(1)
        bar.close()
    return sorted(out, key=lambda e: (e["task"], e["tag"]))


def paired_text(before: list[dict], after: list[dict]) -> str:
    """The change from ``before`` to ``after``, start by start (``wmrl.evaluation.evidence``'s
    paired change, a start keyed by task and tag as a fixed state by task and trial)."""
    from wmrl.evaluation.evidence import change_text, paired_change

    def as_results(episodes: list[dict]) -> dict:
        return {"episodes": [{"task": e["task"], "trial": e["tag"], "success": e["success"]} for e in episodes]}

    c = paired_change(as_results(before), as_results(after))
    return "not the same starts" if c is None else change_text(c, samplers=False)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", required=True)
    ap.add_argument("--ckpt", default="sft/4000")
    ap.add_argument("--sampler", choices=["ode", "sde"], default="sde")
    ap.add_argument("--temperature", type=float, default=1.0, help="SDE temperature (GRPO's rollouts: 1)")
    ap.add_argument("--tasks", default="0-9")
    ap.add_argument("--episodes", type=int, default=10, help="per task and kind of start (fixed: states 0..N-1)")
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0, help="the evaluation's base seed (the fixed states' policy seeds)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--against", help="another policy's --out file of the same tasks and episodes: the change from it")
    args = ap.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    if any(k not in KINDS for k in kinds) or not 1 <= args.episodes <= 50:
        sys.exit(f"error: --kinds from {','.join(KINDS)}; --episodes 1..50")
    other = json.load(open(args.against)) if args.against and os.path.exists(args.against) else None
    if args.against and (other is None or (other.get("tasks"), other.get("episodes")) !=
                         (parse_range(args.tasks), args.episodes)):
        sys.exit(f"error: --against {args.against}: no start_gap.py output of tasks {args.tasks} and {args.episodes} "
                 "episodes there; give a file this script wrote with the same --tasks and --episodes")

    from wmrl.config import SimConfig
    from wmrl.gl import configure_renderer
    from wmrl.policy import checkpoint as ck
    from wmrl.policy.runner import PolicyRunner

    configure_renderer()
    info = ck.resolve(args.run, args.ckpt)
    runner = PolicyRunner(info.path, sampler=args.sampler, temperature=args.temperature, seed=args.seed)
    sim = SimConfig(image_size=runner.image_size or 128)
    tasks = parse_range(args.tasks)
    done = json.load(open(args.out)) if os.path.exists(args.out) else {}
    if done and (done.get("tasks"), done.get("episodes"), done.get("policy")) != (tasks, args.episodes, runner.policy_id):
        sys.exit(f"error: {args.out} holds another plan (tasks, episodes or policy); choose another --out")
    done.update(tasks=tasks, episodes=args.episodes, policy=runner.policy_id, sampler=args.sampler,
                temperature=args.temperature, robot_init_noise=sim.robot_init_noise)
    for kind in kinds:
        if kind not in done:
            done[kind] = run_kind(kind, runner, sim, tasks, args.episodes, args.seed, args.workers, not args.no_progress)
            tmp = args.out + ".tmp"
            with open(tmp, "w") as f:
                json.dump(done, f, indent=1)
            os.replace(tmp, args.out)
    n = len(tasks) * args.episodes
    for kind in kinds:
        wins = [e["success"] for e in done[kind]]
        by_task = [sum(e["success"] for e in done[kind] if e["task"] == t) for t in tasks]
        print(f"{kind:14s} {sum(wins):4d}/{n} = {100 * np.mean(wins):5.1f}%  per task (of {args.episodes}): {by_task}")
    if "random_rest" in done and "random_jitter" in done:
        print(f"jitter - rest, same placements and policy noise: {paired_text(done['random_rest'], done['random_jitter'])}")
    for kind in kinds if other else ():
        if kind in other:
            print(f"{kind}, against {other['policy']} ({args.against}): {paired_text(other[kind], done[kind])}")


if __name__ == "__main__":
    main()
