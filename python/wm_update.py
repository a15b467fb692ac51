"""World-model update: train the main-view and wrist-view models with DeepSpeed.

    python python/wm_update.py --run runs/c1                     # both views, the seed's stop rule
    python python/wm_update.py --profile tiny --run runs/t --steps 6
    python python/wm_update.py --view wrist --run runs/c1        # one view (what the controller launches)
    WM_GPUS_MAIN=0,1,2,3 WM_GPUS_WRIST=4,5,6,7 make wm-update RUN=runs/c1

Reads RUN/manifest.json (make manifest; every file's SHA-256 is checked first), writes
RUN/worldmodels/{main,wrist}/ (DeepSpeed checkpoints + inference weights), RUN/logs/wm_*.jsonl
and, for both views, RUN/train/selected_world_models.json. Rerun the same command after an
interruption: each view continues from its newest checkpoint. A finished update is left alone;
``--more`` (make wm-update MORE=1) trains it further, to a higher --steps or for --max-minutes more
(then train the reward again: make wm-reward OVERWRITE=1, make package OVERWRITE=1).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

from wmrl import cli
from wmrl.config import VIEWS, ConfigError, WMTrainConfig, get_profile, override, profile_names
from wmrl.layout import RunLayout


def build(argv: list[str] | None = None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", default="default", choices=profile_names())
    p.add_argument("--run", "--run-dir", dest="run", default="runs/default", help="run folder")
    p.add_argument("--manifest", help="data manifest (default: RUN/manifest.json)")
    p.add_argument("--init-pair", help="a fresh update starts both views from this model pair's weights (the "
                   "previous cycle's); a view with its own checkpoint resumes that instead")
    p.add_argument("--view", choices=VIEWS, help="train this view only (default: both, with the stop rule)")
    cli.add_config_flags(p, WMTrainConfig, title="training (--steps: the wrist model's target decides for both)",
                         skip=("ds_config_cpu", "ds_config_gpu"))
    p.add_argument("--action-dropout", type=float,
                   help="both views' WorldModelConfig.action_dropout (train for action guidance; default: the profile's)")
    p.add_argument("--action-guidance", type=float,
                   help="both views' WorldModelConfig.action_guidance, saved with the models (needs --action-dropout)")
    p.add_argument("--wrist-main-at-end", action="store_true", default=None,
                   help="the wrist model sees the main view's frame at the chunk's end (imagined first in lockstep) "
                        "instead of its start: WorldModelConfig.main_at_chunk_end (default: the profile's)")
    p.add_argument("--wrist-warp", action=argparse.BooleanOptionalAction, default=None,
                   help="the wrist model also reads its current frame warped by the camera's motion over the chunk "
                        "(WorldModelConfig.wrist_warp; default: the profile's, on; --no-wrist-warp for the A/B)")
    p.add_argument("--proprio-motion", action=argparse.BooleanOptionalAction, default=None,
                   help="both views' proprio head predicts the chunk's motion (WorldModelConfig.proprio_motion; "
                        "default: the profile's, on)")
    p.add_argument("--refine-patch", type=int,
                   help="both views' refine head on r x r pixel patches folded into channels "
                        "(WorldModelConfig.refine_patch; default: the profile's, 1: full resolution)")
    p.add_argument("--max-minutes", type=float,
                   help="(both views) time limit: then the wrist model stops after its next update and main follows")
    p.add_argument("--stop-after", type=int, help="(one view) stop at this update with a checkpoint; rerun to continue")
    p.add_argument("--more", action="store_true",
                   help="(both views) train a finished update further: each view resumes its newest checkpoint, to "
                        "--steps (above the wrist model's) or --max-minutes more, and a new selection is written")
    p.add_argument("--ds-config", help="DeepSpeed JSON (ZeRO stage, precision); default data/worldmodel/ds_{cpu,gpu}.json")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--gpus-main", default=os.environ.get("WM_GPUS_MAIN"), help="GPU group of the main model (WM_GPUS_MAIN)")
    p.add_argument("--gpus-wrist", default=os.environ.get("WM_GPUS_WRIST"), help="GPU group of the wrist model (WM_GPUS_WRIST)")
    p.add_argument("--hostfile", help="DeepSpeed hostfile for several hosts")
    p.add_argument("--local_rank", type=int, help=argparse.SUPPRESS)  # the DeepSpeed launcher adds it
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    prof = get_profile(args.profile).wm
    # both views alike (None: the profile's); WorldModelConfig checks them (guidance needs dropout)
    actions = {"action_dropout": args.action_dropout, "action_guidance": args.action_guidance,
               "proprio_motion": args.proprio_motion, "refine_patch": args.refine_patch}
    prof = dataclasses.replace(prof, main=override(prof.main, **actions),
                               wrist=override(prof.wrist, **actions, main_at_chunk_end=args.wrist_main_at_end,
                                                         wrist_warp=args.wrist_warp))
    train = cli.config_from_flags(args, prof.train)
    manifest = Path(args.manifest or RunLayout(args.run).manifest)
    if not manifest.is_file():
        raise ConfigError(f"{manifest} not found: make it first with `make manifest RUN={args.run}` "
                          "(python python/make_manifest.py --new ... --replay ...)")
    if args.max_minutes is not None and (args.max_minutes <= 0 or args.view):
        raise ConfigError("--max-minutes must be > 0 and is for both views (the controller); "
                          "a single view stops with --stop-after")
    if args.more:
        check_more(args, train)
    if args.init_pair and not (Path(args.init_pair) / "pair.json").is_file():
        raise ConfigError(f"--init-pair {args.init_pair}: no pair.json there (a folder `make package` wrote)")
    if args.ds_config and not Path(args.ds_config).is_file():
        raise ConfigError(f"--ds-config {args.ds_config}: no such file (examples in data/worldmodel/)")
    return args, prof, train, manifest


def check_more(args, train: WMTrainConfig) -> None:
    """``--more`` needs a finished update, and room above where its wrist model stopped: the wrist
    model's target decides for both views (an update stopped by its time limit has that room)."""
    from wmrl.fileio import read_json

    if args.view:
        raise ConfigError("--more is for both views (the controller): drop --view")
    sel = RunLayout(args.run).selection
    if not sel.exists():
        raise ConfigError(f"--more trains a finished update further, and {sel} is not there: run "
                          f"`make wm-update RUN={args.run}` (without MORE=1) first, or again if it was interrupted")
    reached = read_json(sel, ConfigError, "")["wrist"]["step"]
    if reached >= train.steps:
        raise ConfigError(f"--more: the wrist model stopped at update {reached}, and --steps is {train.steps}: give a "
                          f"higher target (make wm-update RUN={args.run} MORE=1 STEPS={2 * reached})")


def _passthrough(args) -> list[str]:
    """The flags each view's process gets from the controller (every training field given)."""
    out = ["--profile", args.profile, "--run", args.run, "--manifest", str(args.manifest or RunLayout(args.run).manifest)]
    for f in dataclasses.fields(WMTrainConfig):
        val = getattr(args, f.name, None)
        flag = f"--{f.name.replace('_', '-')}"
        if isinstance(val, bool):  # BooleanOptionalAction: --compile / --no-compile, no value
            out.append(flag if val else f"--no-{flag[2:]}")
        elif val is not None:
            out += [flag, str(val)]
    for name in ("action_dropout", "action_guidance", "refine_patch"):
        if getattr(args, name, None) is not None:
            out += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    if getattr(args, "wrist_main_at_end", None):
        out.append("--wrist-main-at-end")
    if getattr(args, "wrist_warp", None) is not None:
        out.append("--wrist-warp" if args.wrist_warp else "--no-wrist-warp")
    if getattr(args, "proprio_motion", None) is not None:
        out.append("--proprio-motion" if args.proprio_motion else "--no-proprio-motion")
    if args.ds_config:
        out += ["--ds-config", args.ds_config]
    if args.init_pair:
        out += ["--init-pair", str(Path(args.init_pair).resolve())]
    if args.no_progress:
        out.append("--no-progress")
    return out


def main(args, prof, train, manifest) -> int:
    if args.view:
        from wmrl.worldmodel.train import WMJob
        from wmrl.worldmodel.train import main as train_main

        job = WMJob(view=args.view, run=Path(args.run), manifest=manifest, model=prof.model(args.view), train=train,
                    profile=args.profile, device=args.device, ds_config=args.ds_config, stop_after=args.stop_after,
                    progress=not args.no_progress, init_pair=Path(args.init_pair) if args.init_pair else None)
        if args.dry_run:
            cli.print_plan(f"world model update ({args.view})", {"manifest": manifest, "model": job.model, "train": train})
            return 0
        result = train_main(job)
        if result.get("rank", 0) == 0:
            print(f"[wm {args.view}] step {result['step']} ({result['reason']}), {result['samples_per_s']} samples/s "
                  f"(all processes): {result['weights']}")
        return 0

    from wmrl.worldmodel.update import ViewLaunch, gpu_groups, run_update

    visible = 0
    if args.device != "cpu":
        import torch

        visible = torch.cuda.device_count()
        if args.device == "cuda" and visible == 0:
            raise ConfigError("--device cuda: no GPU is visible")
    g_main, g_wrist = gpu_groups(visible, args.gpus_main, args.gpus_wrist)
    from wmrl.device import free_port

    base = int(os.environ.get("MASTER_PORT") or free_port(2))  # one port per view's process group
    me = str(Path(__file__).resolve())  # each view's process runs this script with --view
    launches = [ViewLaunch("main", g_main, base, _passthrough(args), me),
                ViewLaunch("wrist", g_wrist, base + 1, _passthrough(args), me)]
    if args.dry_run:
        cli.print_plan("world model update (both views)", {
            "manifest": manifest, "train": train, "init_pair": args.init_pair,
            "stop_rule": "wrist to its target, then main after its next update",
            "time_limit_minutes": args.max_minutes,
            **{f"{v.view}_command": " ".join(v.command(args.hostfile)) for v in launches}})
        return 0
    from wmrl.procs import exclusive

    with exclusive(RunLayout(args.run).worldmodels, "make wm-update"):
        run_update(args.run, *launches, hostfile=args.hostfile, more=args.more,
                   max_s=None if args.max_minutes is None else 60 * args.max_minutes)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    cli.run(lambda: main(*build()))
