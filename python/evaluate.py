"""Evaluate a policy in the real LIBERO-Spatial simulator (tasks x fixed initial states).

    python python/evaluate.py --policy expert --trials 5
    python python/evaluate.py --policy random --tasks 0-2 --trials 10 --out runs/eval/random

Writes OUT/results.json (every episode, per-task summary, settings, simulator versions) and
prints a per-task table. Rerun the same command after an interruption to continue.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from wmrl import cli
from wmrl.config import EvalConfig, Profile, get_profile, override, parse_tasks


def build(argv: list[str] | None = None) -> tuple[argparse.Namespace, Profile]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--policy", default="expert", choices=["expert", "random"], help="policy to evaluate")
    p.add_argument("--trials", type=int, help="trials per task (fixed initial states 0..N-1; default 50)")
    p.add_argument("--videos", type=int, help="episodes per task to save as MP4 (main | wrist)")
    cli.add_common(p)
    args = p.parse_args(argv)
    prof = get_profile(args.profile)
    ev = override(prof.eval, tasks=parse_tasks(args.tasks), trials=args.trials, workers=args.workers,
                  seed=args.seed, videos=args.videos)
    prof = Profile(prof.name, cli.sim_config(args, prof.sim), ev, prof.demos)
    return args, prof


def main(args: argparse.Namespace, prof: Profile) -> int:
    from wmrl.evaluation.harness import evaluate, format_table

    out = Path(args.out or f"runs/eval/{args.policy}")
    if args.dry_run:
        cli.print_plan("evaluate", {"policy": args.policy, "episodes": len(prof.eval.tasks) * prof.eval.trials,
                                    "eval": prof.eval, "sim": prof.sim, "out": out})
        return 0
    result = evaluate(args.policy, sim=prof.sim, cfg=prof.eval, out_dir=out, overwrite=args.overwrite,
                      progress=not args.no_progress)
    from wmrl.sim.tasks import get_task

    print(format_table(result.summary, {t: get_task(t).instruction for t in prof.eval.tasks}))
    print(f"results: {result.results_path}")
    return 0


if __name__ == "__main__":
    cli.run(lambda: main(*build()))
