"""The cycle: collect -> manifest -> world-model update -> reward -> pair -> GRPO -> evaluation.

    python python/cycle.py --run runs/a                       # one cycle from RUN's newest policy
    python python/cycle.py --run runs/a --cycles 3            # until three cycles are finished
    python python/cycle.py --profile tiny --run runs/demo --dry-run
    make cycle RUN=runs/a [CYCLES=3] [GRPO_STEPS=20] [EPISODES=50] [STEPS=...] [MAX_MINUTES=...] [GPUS=0,1] [SEED=0]

RUN must hold a policy (make demos sft RUN=...). Each cycle's data, world models and pair go
to RUN/cycles/cycle_N/, the policy's GRPO steps to RUN/weights/policy/; RUN/cycle.json records
every finished stage with its output hashes and each cycle's lineage; RUN/report.html and
RUN/report.md are rebuilt after every stage. Kill it anywhere and rerun the same command:
finished stages are skipped, the interrupted one resumes. --dry-run prints every stage with
its outputs and command and starts nothing. The stages' interpreters are --train-py / --wm-py
(Make passes the venvs' or, with RUNTIME=docker, the images').
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the driver may run with any python3 (standard library only)

from wmrl import cli  # noqa: E402
from wmrl.config import CycleConfig, get_profile, profile_names  # noqa: E402


def build(argv: list[str] | None = None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", default="default", choices=profile_names(), help="named settings (tiny: CPU toy scale)")
    p.add_argument("--run", default="runs/default", help="run folder holding the policy (make sft)")
    p.add_argument("--cycles", type=int, default=1, help="finish this many cycles in RUN (CYCLES)")
    cli.add_config_flags(p, CycleConfig, title="cycle (default: the profile's)", skip=("wm_max_minutes",))
    p.add_argument("--episodes", type=int, help="collection episodes per task (default: the profile's, 50)")
    p.add_argument("--tasks", help="collection tasks (default: all ten)")
    p.add_argument("--wm-steps", type=int, help="world-model updates per cycle (default: the profile's)")
    p.add_argument("--max-minutes", type=float, help="time limit of the world-model update (the stop rule; default: "
                   "the profile's cycle.wm_max_minutes)")
    p.add_argument("--seed", type=int, default=0, help="GRPO and manifest seed")
    p.add_argument("--gpus", help="GPUs of every stage (CUDA_VISIBLE_DEVICES), checked before each GPU stage")
    p.add_argument("--workers", type=int, help="simulator processes (default: one per core)")
    p.add_argument("--train-py", help="command that runs the policy side's Python (default: .venv/train/bin/python)")
    p.add_argument("--wm-py", help="command that runs the world-model side's Python (default: .venv/wm/bin/python)")
    p.add_argument("--no-report", action="store_true", help="do not rebuild RUN/report.html after each stage")
    p.add_argument("--dry-run", action="store_true", help="print every stage and its command; start nothing")
    args = p.parse_args(argv)
    if args.cycles < 1:
        raise cli.ConfigError(f"--cycles {args.cycles}: must be >= 1 (CYCLES=1)")
    for flag in ("episodes", "wm_steps", "workers"):
        if getattr(args, flag) is not None and getattr(args, flag) < (0 if flag == "workers" else 1):
            raise cli.ConfigError(f"--{flag.replace('_', '-')} {getattr(args, flag)}: must be positive")
    if args.max_minutes is not None and args.max_minutes <= 0:
        raise cli.ConfigError(f"--max-minutes {args.max_minutes}: must be > 0")
    from wmrl.cycle import CycleJob

    job = CycleJob(run=Path(args.run).resolve(), cfg=cli.config_from_flags(args, get_profile(args.profile).cycle),
                   cycles=args.cycles, profile=args.profile, episodes=args.episodes, tasks=args.tasks,
                   wm_steps=args.wm_steps, max_minutes=args.max_minutes, seed=args.seed, gpus=args.gpus,
                   workers=args.workers, report=not args.no_report)
    if args.train_py:
        job.train_py = shlex.split(args.train_py)
    if args.wm_py:
        job.wm_py = shlex.split(args.wm_py)
    return args, job


def main(args, job) -> int:
    from wmrl import cycle

    if args.dry_run:
        steps = cycle.plan(job)
        for s in steps:
            print(f"[cycle {s['cycle']}] {s['stage']} ({s['side']}{', GPU' if s['gpu'] else ''}; {s['status']})\n"
                  f"    outputs: {', '.join(s['outputs'])}\n    command: {s['command']}")
        if not steps:
            print(f"[cycle] {args.cycles} cycle(s) already finished in {job.run}: nothing to do")
        return 0
    cycle.main(job)
    print(f"[cycle] report: {job.run / 'report.html'} (and report.md); record: {job.run / 'cycle.json'}")
    return 0


if __name__ == "__main__":
    cli.run(lambda: main(*build()))  # a held lock (LockError) is a ConfigError: one line
