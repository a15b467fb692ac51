"""The reward's threshold calibrated closed loop (``wmrl.evaluation.closed_loop``).

    python python/wm_calibrate.py --run runs/c1 --policy sft/4000@T=1     # the policy that recorded the episodes
    make wm-calibrate RUN=runs/c1 POLICY=sft/4000@T=1 [PAIR=d MANIFEST=f TRIALS=n]

The policy acts in the pair (RUN/model_pair) from keyframes of the manifest's held-out episodes
that it recorded itself (same checkpoint, sampler and temperature: its policy id), --trials
rollouts each, imagined to the last chunk; the threshold at which imagined success best tells the
episodes that succeeded from those that failed is written to PAIR/closed_loop.json with the whole
sweep. GRPO takes it with --reward-threshold closed-loop (make grpo ... REWARD_THRESHOLD=closed-loop).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from wmrl import cli
from wmrl.config import ConfigError
from wmrl.layout import RunLayout


def build(argv: list[str] | None = None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", default="runs/default", help="run folder (checkpoints, RUN/model_pair, RUN/manifest.json)")
    p.add_argument("--pair", help="model pair folder (default RUN/model_pair)")
    p.add_argument("--manifest", help="held-out keyframes from this manifest's validation split (default RUN/manifest.json)")
    p.add_argument("--policy", required=True, help="the checkpoint that recorded the held-out episodes (sft/N, a GRPO "
                                                   "step N or a folder) with its sampler: @T=<temperature> as recorded")
    p.add_argument("--trials", type=int, default=8, help="imagined rollouts per held-out keyframe")
    p.add_argument("--keyframes-per-task", type=int, default=20)
    p.add_argument("--max-chunk", type=int, default=8, help="keyframes up to this chunk of an episode (GRPO's starts: 8)")
    p.add_argument("--success-chunks", type=int, default=1, help="GRPO's grpo.success_chunks (chunks in a row at the threshold)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--no-bf16", action="store_true", help="imagine in float32 on the GPU")
    p.add_argument("--overwrite", action="store_true", help="replace PAIR/closed_loop.json")
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    args = p.parse_args(argv)
    args.pair = Path(args.pair or RunLayout(args.run).model_pair)
    args.manifest = Path(args.manifest or RunLayout(args.run).manifest)
    for path, how in ((args.pair / "pair.json", "make package"), (args.manifest, "make manifest")):
        if not path.is_file():
            raise ConfigError(f"{path} not found: make it first ({how} RUN={args.run})")
    if args.trials < 1 or args.keyframes_per_task < 1 or args.max_chunk < 0 or not 1 <= args.success_chunks <= 10:
        raise ConfigError("--trials >= 1, --keyframes-per-task >= 1, --max-chunk >= 0, --success-chunks 1..10")
    from wmrl.evaluation.closed_loop import CLOSED_LOOP_FILE
    from wmrl.evaluation.ranking import parse_policy

    args.spec = parse_policy(args.policy, args.run)  # an unknown checkpoint is said now
    if args.spec.checkpoint is None:
        raise ConfigError(f"--policy {args.policy}: a control records no episodes; give the checkpoint that recorded them")
    args.out = args.pair / CLOSED_LOOP_FILE
    if args.out.exists() and not args.overwrite and not args.dry_run:
        raise FileExistsError(f"{args.out} exists; pass --overwrite (OVERWRITE=1) to calibrate again")
    return args


def main(args) -> int:
    if args.dry_run:
        cli.print_plan("closed-loop threshold", {
            "pair": args.pair, "manifest": args.manifest, "policy": f"{args.spec.name} -> {args.spec.checkpoint}",
            "imagined": f"{args.trials} rollouts per held-out keyframe it recorded (chunks 0..{args.max_chunk}, "
                        f"{args.keyframes_per_task} per task), each to the last chunk; the controls hold and random "
                        "from the same keyframes", "out": args.out})
        return 0
    from wmrl.evaluation.closed_loop import calibrate
    from wmrl.fileio import write_json

    result = calibrate(args.pair, args.manifest, args.spec, trials=args.trials, max_chunk=args.max_chunk,
                       keyframes_per_task=args.keyframes_per_task, seed=args.seed, success_chunks=args.success_chunks,
                       device=args.device, bf16=not args.no_bf16)
    write_json(args.out, result)
    for row in result["sweep"]:
        ba = row["balanced_accuracy"]
        print(f"[wm-calibrate] {row['threshold']:.2f}: imagined {100 * row['imagined_success']:.0f}% "
              f"(recorded {100 * row['recorded_success']:.0f}%), balanced {'-' if ba is None else f'{ba:.3f}'}")
    for row in result["by_task"]:
        print(f"[wm-calibrate] task {row['task']} at {result['threshold']:.2f}: imagined "
              f"{100 * row['imagined_success']:.0f}%, recorded {100 * row['recorded_success']:.0f}% ({row['rollouts']} rollouts)")
    for name, ctl in result["controls"].items():
        print(f"[wm-calibrate] control {name}: imagined {100 * ctl['at_threshold']:.0f}% at {result['threshold']:.2f}, "
              f"{100 * ctl['at_calibrated']:.0f}% at {result['calibrated_threshold']:.2f} ({ctl['rollouts']} rollouts; "
              "in the simulator ~0%)")
    best, old = result["at_threshold"], result["at_calibrated"]
    print(f"[wm-calibrate] threshold {result['threshold']:.2f} (open-loop calibration {result['calibrated_threshold']:.2f}): "
          f"balanced {best['balanced_accuracy']:.3f} vs {old['balanced_accuracy'] or 0:.3f}, imagined success "
          f"{100 * best['imagined_success']:.0f}% vs {100 * old['imagined_success']:.0f}% (recorded "
          f"{100 * best['recorded_success']:.0f}%; {best['rollouts']} rollouts, {result['seconds']:.0f} s): {args.out}")
    return 0


if __name__ == "__main__":
    cli.run(lambda: main(build()))
