"""Does the model pair rank policies as the real simulator does? (``wmrl.evaluation.ranking``)

    python python/wm_rank.py --run runs/c1 --policy sft/1000 --policy sft/2000 --policy sft/4000 \
        --policy sft/4000@T=3 --policy hold         # 5 policies: imagined vs real success, Spearman
    make wm-rank RUN=runs/c1 POLICIES="sft/1000 sft/2000 sft/4000 sft/4000@T=3"

Each policy rolls closed-loop in the pair (RUN/model_pair) from held-out keyframes (the
manifest's validation episodes; --trials per keyframe) and in the real simulator on the fixed
initial states (--real-trials per task), with the same sampler. Written to PAIR/ranking.json
and PAIR/ranking.png; the real evaluations' results under PAIR/ranking/.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from wmrl import cli
from wmrl.config import ConfigError, default_workers, get_profile, parse_tasks
from wmrl.layout import RunLayout


def build(argv: list[str] | None = None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", default="runs/default", help="run folder (checkpoints, RUN/model_pair, RUN/manifest.json)")
    p.add_argument("--pair", help="model pair folder (default RUN/model_pair)")
    p.add_argument("--manifest", help="held-out keyframes from this manifest's validation split (default RUN/manifest.json)")
    p.add_argument("--policy", action="append", default=[], required=True,
                   help="a checkpoint (sft/N, a GRPO step N, or a folder), optionally @ode or @T=<temperature>, "
                        "or a control: hold (zero actions) or random (uniform); repeat it, 4 or more policies")
    p.add_argument("--trials", type=int, default=4, help="imagined rollouts per held-out keyframe")
    p.add_argument("--real-trials", type=int, default=10, help="fixed initial states per task in the real simulator")
    p.add_argument("--keyframes-per-task", type=int, default=5)
    p.add_argument("--max-chunk", type=int, default=0, help="keyframes up to this chunk of an episode (0: starts only)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--traces", action="store_true",
                   help="imagine every rollout to the last chunk and keep the reward's probability per chunk in "
                        "ranking.json (to judge other success rules offline; success decided as always)")
    p.add_argument("--guidance", default="", help="imagine at these action-guidance scales, e.g. 1,2 (a pair trained "
                   "with --action-dropout; the first is the headline; the real runs serve all). Default: the pair's own")
    p.add_argument("--success-chunks", type=int, default=1,
                   help="chunks in a row at the reward's threshold that make an imagined success (GRPO's "
                        "grpo.success_chunks; with --traces rules 1-3 are all read from the same rollouts)")
    p.add_argument("--no-bf16", action="store_true", help="imagine in float32 on the GPU")
    cli.add_common(p)
    args = p.parse_args(argv)
    prof = get_profile(args.profile)
    args.pair = Path(args.pair or RunLayout(args.run).model_pair)
    args.manifest = Path(args.manifest or RunLayout(args.run).manifest)
    for path, how in ((args.pair / "pair.json", "make package"), (args.manifest, "make manifest")):
        if not path.is_file():
            raise ConfigError(f"{path} not found: make it first ({how} RUN={args.run})")
    if args.trials < 1 or not 1 <= args.real_trials <= 50 or args.keyframes_per_task < 1 or args.max_chunk < 0:
        raise ConfigError("--trials >= 1, --real-trials 1..50, --keyframes-per-task >= 1, --max-chunk >= 0")
    if not 1 <= args.success_chunks <= 10:
        raise ConfigError(f"--success-chunks {args.success_chunks}: 1 (the first chunk at the threshold) to 10")
    from wmrl.evaluation.ranking import check_distinct, parse_policy

    args.guidance = cli.parse_guidance(args.guidance)
    args.specs = [parse_policy(t, args.run) for t in args.policy]  # unknown checkpoints said now
    if len(args.specs) < 2:
        raise ConfigError("give at least 2 policies (--policy A --policy B ...; 4 or more for a meaningful ranking)")
    check_distinct(args.specs)  # the same policy under two names would count twice
    args.sim = cli.sim_config(args, prof.sim)
    args.tasks = parse_tasks(args.tasks) or prof.eval.tasks
    args.out = Path(args.out or args.pair)
    return args


def main(args) -> int:
    if args.dry_run:
        cli.print_plan("policy ranking", {"pair": args.pair, "manifest": args.manifest,
                                          "policies": [f"{s.name} -> {s.checkpoint or 'control, no checkpoint'}"
                                                       for s in args.specs],
                                          "imagined": f"{args.trials} rollouts per held-out keyframe "
                                                      f"({args.keyframes_per_task} per task)",
                                          "real": f"{args.real_trials} fixed states x {len(args.tasks)} tasks",
                                          "out": args.out / "ranking.json"})
        return 0
    from wmrl.fileio import write_json
    from wmrl.plots import ranking_scatter
    from wmrl.evaluation.ranking import rank_policies

    result = rank_policies(args.specs, pair=args.pair, manifest=args.manifest, sim=args.sim, tasks=args.tasks,
                           trials=args.trials, real_trials=args.real_trials, keyframes_per_task=args.keyframes_per_task,
                           max_chunk=args.max_chunk, seed=args.seed or 0, workers=args.workers or default_workers(),
                           out_dir=args.out / "ranking", device=args.device, bf16=not args.no_bf16,
                           progress=not args.no_progress, traces=args.traces,
                           guidance=args.guidance, success_chunks=args.success_chunks)
    write_json(args.out / "ranking.json", result)
    png = ranking_scatter(result, args.out / "ranking.png")
    print(json.dumps({k: result[k] for k in ("spearman", "spearman_by_guidance", "spearman_by_success_chunks", "cost")
                      if k in result}, indent=1))
    print(f"[wm-rank] {args.out / 'ranking.json'}" + (f", {png}" if png else ""))
    return 0


if __name__ == "__main__":
    cli.run(lambda: main(build()))
