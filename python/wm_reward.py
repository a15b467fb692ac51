"""Train the frozen reward model (success classifier on the frames of its views) from the manifest.

    python python/wm_reward.py --run runs/c1                  # RUN/manifest.json -> RUN/worldmodels/reward/
    python python/wm_reward.py --profile tiny --run runs/t
    python python/wm_reward.py --run runs/c1 --students      # on the students' frames -> worldmodels/reward_students/

Labels are the simulator's per-frame success in the trajectory files; the threshold is
calibrated on the first half of the manifest's validation episodes (``held_out_halves``: the
other half is where ``make wm-eval`` measures agreement) and stored with the weights. A finished
reward model is left alone (pass --overwrite to train it again). ``--students``: the generated
frames come from the few-step students of ``make wm-distill``, whose pair needs a reward of its own
(the teacher's reward reads the students' frames at chance; bench/RESULTS.md).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from wmrl import cli
from wmrl.config import ConfigError, get_profile, override, profile_names
from wmrl.layout import RunLayout


def build(argv: list[str] | None = None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", default="default", choices=profile_names())
    p.add_argument("--run", default="runs/default")
    p.add_argument("--manifest", help="default: RUN/manifest.json")
    p.add_argument("--steps", type=int)
    p.add_argument("--control-negatives", metavar="NAMES",
                   help="hold,random (or one): the pair's rollouts under these controls join training as failures "
                        "(RewardConfig.control_negatives; 'none': off; default: the profile's)")
    p.add_argument("--generated-share", type=float, metavar="F",
                   help="the pair's frames' share of each batch's positives and negatives (RewardConfig.generated_share; "
                        "default: the profile's, 0: every frame alike)")
    p.add_argument("--generated-samples", type=int, metavar="K",
                   help="open-loop replays of each training episode, each with its own noise "
                        "(RewardConfig.generated_samples; default: the profile's, 1)")
    p.add_argument("--seed", type=int, help="the reward's seed: its initial weights, batches and replays' noise "
                                            "(RewardConfig.seed; default: the profile's, 0)")
    p.add_argument("--students", action="store_true",
                   help="train on the few-step students' frames (make wm-distill), for their pair: "
                        "RUN/worldmodels/reward_students")
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    manifest = Path(args.manifest or RunLayout(args.run).manifest)
    if not manifest.is_file():
        raise ConfigError(f"{manifest} not found: make it first with `make manifest RUN={args.run}`")
    if args.students and not RunLayout(args.run).student_selection.is_file():
        raise ConfigError(f"{RunLayout(args.run).student_selection} not found: distil the world models first "
                          f"(make wm-distill RUN={args.run})")
    return args, manifest


def imagine(run: str, cfg, train, val, lineage: dict, students: bool = False) -> dict | None:
    """The update's world models (RUN/train/selected_world_models.json; ``students``: the
    few-step students, RUN/train/selected_students.json) replay every episode open loop:
    generated frames with real labels (None before any update, or horizon 0)."""
    layout = RunLayout(run)
    selection = layout.student_selection if students else layout.selection
    if cfg.generated_horizon == 0 or not selection.exists():
        print("[reward] real frames only (" + ("generated_horizon=0" if cfg.generated_horizon == 0 else
              f"no world-model update in {run} yet") + ")")
        return None
    import time

    import torch

    from wmrl.device import pick_device
    from wmrl.fileio import read_json
    from wmrl.worldmodel.model import FrameWorldModel
    from wmrl.worldmodel.reward import control_frames, imagined_frames, no_frames

    sel = read_json(selection, ConfigError, "run the world-model update first")
    device = pick_device("auto")
    main_m = FrameWorldModel.from_pretrained(sel["main"]["weights"], device)
    wrist_m = FrameWorldModel.from_pretrained(sel["wrist"]["weights"], device)
    t0 = time.perf_counter()
    out = {}
    for k, (name, eps) in enumerate((("train", train), ("val", val))):
        # generated_samples replays of each training episode, each with its own noise (1,000 seeds
        # apart: a replay's batches take seed + their offset); the validation episodes once
        replays = [imagined_frames(main_m, wrist_m, eps, cfg.generated_horizon, views=cfg.views,
                                   batch=cfg.generated_batch, seed=cfg.seed + k + 1000 * s, device=device)
                   for s in range(cfg.generated_samples if name == "train" else 1)] if eps else [no_frames()]
        out[name] = tuple(torch.cat(parts) for parts in zip(*replays))
    if cfg.control_negatives:  # known failures: the pair's drift under actions that cannot succeed
        out["controls"] = control_frames(main_m, wrist_m, train, cfg.generated_horizon, controls=cfg.control_negatives,
                                         views=cfg.views, batch=cfg.generated_batch, seed=cfg.seed, device=device)
    lineage["generated_by"] = {v: sel[v]["weights"] for v in ("main", "wrist")}
    controls = f", {len(out['controls'][0])} of controls ({'+'.join(cfg.control_negatives)})" if "controls" in out else ""
    print(f"[reward] {len(out['train'][0])} + {len(out['val'][0])} frames generated by the world models{controls} "
          f"({time.perf_counter() - t0:.1f} s)")
    return out


def main(args, manifest: Path) -> int:
    controls = None if args.control_negatives is None else tuple(
        c for c in args.control_negatives.split(",") if c and c != "none")
    cfg = override(get_profile(args.profile).reward, steps=args.steps, control_negatives=controls,
                   generated_share=args.generated_share, generated_samples=args.generated_samples, seed=args.seed)
    out = RunLayout(args.run).student_reward if args.students else RunLayout(args.run).reward
    if args.dry_run:
        cli.print_plan("reward model", {"manifest": manifest, "config": cfg, "out": out})
        return 0
    if (out / "config.json").exists() and not args.overwrite:
        print(f"[reward] {out} exists (pass --overwrite to train again)")
        return 0
    from wmrl.fileio import sha256_file
    from wmrl.lineage import git_commit
    from wmrl.worldmodel.data import held_out_halves, load_split
    from wmrl.worldmodel.reward import episode_frames, episode_index, simulator_outcomes, train_reward

    from wmrl.config import CHUNK_SIZE

    _, train, val = load_split(manifest, chunk=CHUNK_SIZE, phases=cfg.all_phases)  # validation: phase 0
    val, _ = held_out_halves(val)  # the calibration half; wm-eval scores agreement on the other

    lineage = {"manifest": str(manifest), "manifest_sha256": sha256_file(manifest), "git_commit": git_commit()}
    generated = imagine(args.run, cfg, [e for e in train if e.phase == 0], val, lineage, students=args.students)
    meta = train_reward(*episode_frames(train, cfg.views), *episode_frames(val, cfg.views), cfg, out, lineage,
                        progress=not args.no_progress, generated=generated, val_episode=episode_index(val),
                        val_outcomes=simulator_outcomes(val))
    print(json.dumps({k: meta[k] for k in ("threshold", "calibrated_on", "frame_threshold", "val_generated_episodes",
                                           "val_real_episodes",
                                           "val_frame_balanced_accuracy", "val_balanced_accuracy_real",
                                           "val_balanced_accuracy_generated", "train_frames", "train_generated_frames",
                                           "train_success_frames")}))
    return 0


if __name__ == "__main__":
    cli.run(lambda: main(*build()))
