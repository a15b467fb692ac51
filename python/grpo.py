"""GRPO for the policy, in the real simulator (--env sim) or inside the model pair (--env wm).

    python python/grpo.py --run runs/a --target 20                    # from the newest supervised checkpoint
    python python/grpo.py --run runs/a --env wm --resume 60 --target 80 --pair runs/a/model_pair
    python python/grpo.py --profile tiny --run runs/t --target 2 --env sim --dry-run
    make grpo RUN=runs/a ENV=wm RESUME=60 TARGET=80 [PAIR=dir]

Without --resume a fresh run copies the newest supervised checkpoint (RUN/weights/sft) to GRPO
step 0 and evaluates it; a run with GRPO checkpoints continues from its newest full state.
Every 5 steps: policy weights (RUN/weights/policy/global_step_N) and a real-simulator
evaluation (RUN/evidence/evaluations/global_step_N.json); every 10 steps and at the last: the
full state. Rerun the same command after an interruption: it continues from the last full
state (evaluating it first if its evaluation was cut off). Logs: RUN/logs/grpo.jsonl, TensorBoard, RUN/logs/grpo_curves.png.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from wmrl import cli
from wmrl.config import GRPOConfig, get_profile, parse_tasks, profile_names


def parse(argv: list[str] | None = None):
    """The options and the GRPO settings they make, checked (a ConfigError says what to change);
    nothing is read from the run yet."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", default="default", choices=profile_names(), help="named settings (tiny: CPU toy scale)")
    p.add_argument("--run", "--run-dir", dest="run", default="runs/default",
                   help="run folder (checkpoints, evidence, logs); --run-dir under torchrun, which claims --run")
    p.add_argument("--target", type=int, required=True, help="train to this GRPO step (TARGET)")
    p.add_argument("--resume", type=int, help="continue the full state of GRPO step N (RESUME); default: the newest "
                                              "full state, or step 0 from the newest supervised checkpoint")
    p.add_argument("--from-run", help="take step 0 from this run's newest supervised checkpoint (default: RUN's own)")
    p.add_argument("--pair", help="model pair for --env wm (default RUN/model_pair); it switches both world models "
                                  "and the reward model")
    cli.add_config_flags(p, GRPOConfig, title="GRPO (default: the profile's)")
    g = p.add_argument_group("evaluation and machine")
    g.add_argument("--eval-tasks", help="tasks of the real evaluations (default: all ten)")
    g.add_argument("--eval-seed", type=int, default=0)
    g.add_argument("--no-eval-first", action="store_true", help="do not evaluate step 0 (the supervised policy) first")
    g.add_argument("--max-minutes", type=float, help="time limit: the step that passes it is the last (full state and the "
                                                     "full evaluation); rerun to continue")
    g.add_argument("--workers", type=int, help="simulator processes (default: one per core)")
    g.add_argument("--envs-per-worker", type=int, default=3,
                   help="LIBERO envs kept per episode in flight (each worker runs two; ~0.8 GB each)")
    g.add_argument("--image-size", type=int, help="camera image size (default: the profile's / the checkpoint's)")
    g.add_argument("--max-steps", type=int, help="simulator steps per episode (240)")
    g.add_argument("--renderer", help="auto | osmesa | egl (MUJOCO_GL overrides)")
    cli.add_start_flags(g)
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--no-tensorboard", action="store_true")
    args = p.parse_args(argv)
    prof = get_profile(args.profile)
    return args, prof, cli.config_from_flags(args, prof.grpo)


def build(argv: list[str] | None = None):
    args, prof, cfg = parse(argv)
    sim = cli.sim_config(args, prof.sim)
    if args.workers is not None and args.workers < 0:
        from wmrl.config import ConfigError

        raise ConfigError(f"--workers {args.workers}: use 0 (one per core) or a positive count")
    from wmrl.rl.grpo import GRPOJob

    job = GRPOJob(run=Path(args.run), cfg=cfg, sim=sim, target=args.target, resume=args.resume,
                  pair=Path(args.pair) if args.pair else None, init_from=Path(args.from_run) if args.from_run else None,
                  eval_tasks=parse_tasks(args.eval_tasks) or prof.eval.tasks,
                  eval_seed=args.eval_seed, eval_first=not args.no_eval_first, workers=args.workers or 0,
                  max_minutes=args.max_minutes, envs_per_worker=args.envs_per_worker, device=args.device, profile=prof.name,
                  progress=not args.no_progress, tensorboard=not args.no_tensorboard,
                  command=cli.command_line("python/grpo.py", argv))
    from wmrl.rl.grpo import find_start

    find_start(job)  # unknown or weights-only RESUME, TARGET not above it: said now, before anything loads
    return args, job


def main(args, job) -> int:
    from wmrl.rl import grpo

    from wmrl.layout import RunLayout

    return cli.plan_or_run("grpo", args.dry_run, lambda: grpo.plan(job), lambda: grpo.main(job),
                           writes=RunLayout(job.run).checkpoints("policy"))


if __name__ == "__main__":
    cli.run(lambda: main(*build()))
