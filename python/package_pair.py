"""Package RUN/model_pair: both world models (from the update's selection), the reward model
and keyframes of real training trajectories (GRPO's starts), with SHA-256 and lineage in pair.json.

    python python/package_pair.py --run runs/c1          # -> runs/c1/model_pair/pair.json
    python python/package_pair.py --verify runs/c1/model_pair
"""

from __future__ import annotations

import argparse
import json

from wmrl import cli
from wmrl.layout import RunLayout


def build(argv: list[str] | None = None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", default="runs/default")
    p.add_argument("--out", help="pair folder (default RUN/model_pair)")
    p.add_argument("--verify", metavar="PAIR", help="only verify an existing pair's hashes")
    p.add_argument("--profile", default="default", help="whose GRPO keyframe settings to use (default, tiny)")
    p.add_argument("--students", action="store_true", help="pack the few-step students of make wm-distill "
                   "(RUN/train/selected_students.json) instead of the update's models")
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--dry-run", action="store_true")
    return p.parse_args(argv)


def main(args) -> int:
    from wmrl.release.pair import load_pair, package_pair

    if args.verify:
        pair = load_pair(args.verify)
        n = sum(len(v) for v in pair.meta["files"].values())
        print(f"[pair] {pair.root}: {n} files match pair.json")
        return 0
    if args.dry_run:
        cli.print_plan("package model pair", {"run": args.run, "out": args.out or f"{args.run}/model_pair",
                                              "from": str(RunLayout(args.run).student_selection if args.students
                                                          else RunLayout(args.run).selection)})
        return 0
    from wmrl.config import get_profile

    g = get_profile(args.profile).grpo
    path = package_pair(args.run, args.out, overwrite=args.overwrite, keyframe_max_chunk=g.keyframe_max_chunk,
                        keyframes_per_task=g.keyframes_per_task, seed=g.seed, students=args.students)
    meta = json.loads(path.read_text())
    steps = "/".join(str(meta["models"][v]["sample_steps"]) for v in ("main", "wrist"))
    print(f"[pair] {path}: main step {meta['models']['main']['step']}, wrist step {meta['models']['wrist']['step']} "
          f"({steps} sampling steps), "
          f"{meta['init_observations']['keyframes']} keyframes from {meta['init_observations']['episodes']} episodes")
    return 0


if __name__ == "__main__":
    cli.run(lambda: main(build()))
