"""Collect real trajectories with the current policy: success and failure kept.

    python python/collect.py --run runs/a                        # the newest policy -> RUN/collect/task_XX.hdf5
    python python/collect.py --run runs/a --ckpt sft/4000 --episodes 20 --tasks 0-4
    make collect RUN=runs/a [CKPT=60] [EPISODES=50] [TASKS=...]

The cycle's first stage (seed 000: 10 tasks x 50 episodes, at most 240 steps, chunks of 8, both
cameras, actions, simulator state and proprio at the same frame index). Episodes start from
seeded random placements (mode=train), never from the fixed evaluation states; the policy
samples with the flow-SDE at temperature 1 (``collect.sampler``/``temperature``), so the data
shows its mistakes. Frames are stored at chunk boundaries, what the world models train on, or
every ``--frame-interval`` steps as well (every phase of the episode for the world models).
A rerun continues each task's file where it stopped.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from wmrl import cli
from wmrl.cli import COMMON_FIELDS
from wmrl.config import CollectConfig, DemoConfig, get_profile, override


def build(argv: list[str] | None = None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", default="runs/default", help="run folder: the policy comes from it, data goes to RUN/collect")
    p.add_argument("--ckpt", help="policy checkpoint: N (GRPO step) or sft/N (default: the newest of either kind)")
    cli.add_config_flags(p, CollectConfig, title="collection", skip=COMMON_FIELDS)
    cli.add_common(p)
    args = p.parse_args(argv)
    prof = get_profile(args.profile)
    collect = override(cli.config_from_flags(args, prof.collect, skip=COMMON_FIELDS), tasks=cli.parse_tasks(args.tasks),
                       workers=args.workers, seed=args.seed)
    from wmrl.layout import RunLayout
    from wmrl.policy import checkpoint as ck

    info = ck.resolve(args.run, args.ckpt) if args.ckpt else ck.newest_policy(args.run)
    if info is None:
        raise ck.CheckpointError(f"no policy in {args.run}: train one first (make demos sft RUN={args.run})")
    image_size = int(ck.read_meta(info.path).get("image_size", 0)) or None
    sim = cli.sim_config(args, override(prof.sim, image_size=image_size))
    out = Path(args.out) if args.out else RunLayout(args.run).collect
    return args, collect, sim, info, out


def main(args, collect: CollectConfig, sim, info, out: Path) -> int:
    from wmrl.sim.demos import collect_demos, task_file

    if args.dry_run:
        cli.print_plan("collect with the policy", {
            "policy": str(info.path), "ref": info.ref, "tasks": collect.tasks, "episodes_per_task": collect.episodes,
            "reset": "seeded random placement (mode=train)", "sampler": collect.sampler,
            "temperature": collect.temperature, "kept": "success and failure",
            "frames": f"every {collect.frame_interval} steps" if collect.frame_interval else "chunk boundaries",
            "files": [str(task_file(out, t)) for t in collect.tasks], "sim": sim})
        return 0
    from wmrl.policy.runner import PolicyRunner

    runner = PolicyRunner(info.path, sampler=collect.sampler, temperature=collect.temperature, seed=collect.seed)
    # the demonstrations' machinery with every episode kept
    cfg = DemoConfig(tasks=collect.tasks, episodes=collect.episodes, workers=collect.workers, seed=collect.seed,
                     frame_interval=collect.frame_interval, post_success_steps=collect.post_success_steps)
    from wmrl.procs import exclusive

    with exclusive(out, "make collect"):
        summary = collect_demos(cfg, sim, out, overwrite=args.overwrite, progress=not args.no_progress, policy=runner)
    kept = sum(v["kept"] for v in summary["tasks"].values())
    wins = kept - sum(v["failures"] for v in summary["tasks"].values())
    summary["policy"] = {"ref": info.ref, "path": str(info.path), "policy_id": runner.policy_id}
    print(json.dumps(summary, indent=2))
    print(f"[collect] {kept} episodes ({wins} successful) in {out}")
    return 0


if __name__ == "__main__":
    cli.run(lambda: main(*build()))
