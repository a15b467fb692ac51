"""Scripted-expert demonstrations in the real simulator -> one HDF5 file per task.

    python python/collect_demos.py --tasks 0 --episodes 2 --out runs/demos
    python python/collect_demos.py                       # 10 tasks x 50 successful demos

Starts from seeded random placements (mode=train), keeps only successful episodes (with
``--keep-failures`` every episode: a noisy expert's mistakes too, with ``--action-noise``), and
can be interrupted: rerun the same command to continue.

    python python/collect_demos.py --tasks 2 --episodes 40 --action-noise 0.5 --keep-failures --out runs/noisy
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from wmrl import cli
from wmrl.cli import COMMON_FIELDS
from wmrl.config import DemoConfig, Profile, get_profile, override, parse_tasks


def build(argv: list[str] | None = None) -> tuple[argparse.Namespace, Profile]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_config_flags(p, DemoConfig, title="demonstrations", skip=COMMON_FIELDS)
    cli.add_common(p)
    args = p.parse_args(argv)
    prof = get_profile(args.profile)
    demos = override(cli.config_from_flags(args, prof.demos, skip=COMMON_FIELDS), tasks=parse_tasks(args.tasks), workers=args.workers,
                     seed=args.seed)
    return args, override(prof, sim=cli.sim_config(args, prof.sim), demos=demos)


def main(args: argparse.Namespace, prof: Profile) -> int:
    from wmrl.sim.demos import collect_demos, task_file

    out = Path(args.out or "runs/demos")
    if args.dry_run:
        cli.print_plan("collect demonstrations", {
            "tasks": prof.demos.tasks, "episodes_per_task": prof.demos.episodes, "reset": "seeded random placement (mode=train)",
            "frame_interval": prof.demos.frame_interval, "action_noise": prof.demos.action_noise,
            "post_success_steps": prof.demos.post_success_steps,
            "kept": "every episode" if prof.demos.keep_failures else "successes only",
            "files": [str(task_file(out, t)) for t in prof.demos.tasks], "sim": prof.sim})
        return 0
    from wmrl.procs import exclusive

    with exclusive(out, "make demos"):
        summary = collect_demos(prof.demos, prof.sim, out, overwrite=args.overwrite, progress=not args.no_progress)
    print(json.dumps(summary, indent=2))
    if summary["incomplete"]:
        print(f"error: tasks {summary['incomplete']} did not reach {prof.demos.episodes} successful demonstrations "
              f"within {prof.demos.max_attempts_factor}x attempts; their partial files are kept")
        return 1
    return 0


if __name__ == "__main__":
    cli.run(lambda: main(*build()))
