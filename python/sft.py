"""Supervised training of the flow-matching policy on demonstrations.

    python python/sft.py --run runs/default                    # data: RUN/demos (task_XX.hdf5)
    python python/sft.py --profile tiny --run runs/try --data runs/try/demos --steps 50
    torchrun --standalone --nproc_per_node=2 python/sft.py --run-dir runs/a  # GPUs (make sft GPUS=0,1)

Writes RUN/weights/policy/global_step_N/ (model.safetensors, config.json, norm_stats.json,
language_cache.safetensors; full checkpoints add train_state.pt), RUN/latest_policy.json,
RUN/logs/sft.jsonl and TensorBoard events in RUN/logs/tensorboard/sft. Rerun the same
command after an interruption: it continues from the newest full checkpoint.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from wmrl import cli
from wmrl.config import SFTConfig, get_profile, override, parse_tasks, profile_names
from wmrl.layout import RunLayout


def build(argv: list[str] | None = None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", default="default", choices=profile_names(), help="named settings (tiny: CPU toy scale)")
    p.add_argument("--run", "--run-dir", dest="run", default="runs/default",
                   help="run folder (checkpoints, logs); --run-dir under torchrun, which claims --run")
    p.add_argument("--data", nargs="+", help="demonstration files or folders (default: RUN/demos)")
    p.add_argument("--tasks", help="train on these task indices only: 0,3,5 or 0-4 or all (default: every episode)")
    cli.add_config_flags(p, SFTConfig, title="training")
    g = p.add_argument_group("policy sampler (recorded in the checkpoint; used by make eval)")
    g.add_argument("--denoise-steps", type=int, help="K flow steps")
    g.add_argument("--noise-level", type=float, help="flow-SDE noise level (0.5)")
    g = p.add_argument_group("start and stop")
    g.add_argument("--resume", default="auto", help="auto (newest full checkpoint, if any) or a step number")
    g.add_argument("--init", help="start a fresh run from these weights (a checkpoint folder; weights-only is fine)")
    g.add_argument("--allow-new-data", action="store_true", help="resume even though the data files changed")
    g.add_argument("--stop-after", type=int, help="stop at this step with a full checkpoint (the schedule still targets --steps)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--no-tensorboard", action="store_true")
    args = p.parse_args(argv)

    prof = get_profile(args.profile)
    sft = cli.config_from_flags(args, prof.sft)
    policy = override(prof.policy, denoise_steps=args.denoise_steps, noise_level=args.noise_level)
    if args.stop_after is not None and args.stop_after < 1:
        from wmrl.config import ConfigError

        raise ConfigError(f"--stop-after {args.stop_after}: must be >= 1")
    from wmrl.policy.train import SFTJob

    run = Path(args.run)
    job = SFTJob(run=run, data=args.data or [str(RunLayout(run).demos)], policy=policy, sft=sft, profile=prof.name,
                 tasks=parse_tasks(args.tasks), init=args.init, resume=args.resume, stop_after=args.stop_after,
                 allow_new_data=args.allow_new_data,
                 device=args.device, progress=not args.no_progress, tensorboard=not args.no_tensorboard,
                 command=cli.command_line("python/sft.py", argv))
    return args, job


def main(args, job) -> int:
    from wmrl.policy import train

    return cli.plan_or_run("sft", args.dry_run, lambda: train.plan(job), lambda: train.main(job),
                           writes=RunLayout(job.run).checkpoints("sft"))


if __name__ == "__main__":
    cli.run(lambda: main(*build()))
