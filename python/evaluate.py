"""Evaluate a policy in the real LIBERO-Spatial simulator (tasks x fixed initial states).

    python python/evaluate.py --policy expert --trials 5
    python python/evaluate.py --policy random --tasks 0-2 --trials 10 --out runs/eval/random
    python python/evaluate.py --ckpt 60 --run runs/default       # GRPO step 60 (make eval CKPT=60)
    python python/evaluate.py --ckpt sft/4000 --run runs/default # a supervised checkpoint (make eval CKPT=sft/4000)

Writes OUT/results.json (every episode, per-task summary, settings, simulator versions) and
prints a per-task table. Rerun the same command after an interruption to continue.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from wmrl import cli
from wmrl.cli import COMMON_FIELDS
from wmrl.config import ConfigError, EvalConfig, Profile, get_profile, override, parse_tasks


def build(argv: list[str] | None = None) -> tuple[argparse.Namespace, Profile]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--policy", choices=["expert", "random", "checkpoint"],
                   help="policy to evaluate (default: expert; checkpoint when --ckpt is given)")
    p.add_argument("--ckpt", help="policy checkpoint: N = GRPO step N (RUN/weights/policy/global_step_N), "
                                  "sft/N = supervised step N (RUN/weights/sft/global_step_N)")
    p.add_argument("--run", default="runs/default", help="run folder holding the checkpoint (with --ckpt)")
    p.add_argument("--sampler", choices=["ode", "sde"], help="checkpoint sampler (default: the checkpoint's)")
    p.add_argument("--temperature", type=float, help="SDE temperature at evaluation (default: the checkpoint's)")
    p.add_argument("--gripper-deadband", type=float,
                   help="gripper outputs below this magnitude hold (0), others give their sign (default: the "
                        "checkpoint's, 0.5; 0 turns snapping off)")
    cli.add_config_flags(p, EvalConfig, title="evaluation", skip=COMMON_FIELDS)
    cli.add_common(p)
    args = p.parse_args(argv)
    args.policy = args.policy or ("checkpoint" if args.ckpt is not None else "expert")
    if (args.policy == "checkpoint") != (args.ckpt is not None):
        raise ConfigError("--policy checkpoint goes with --ckpt N (make eval CKPT=N); expert/random take no --ckpt")
    prof = get_profile(args.profile)
    ev = override(cli.config_from_flags(args, prof.eval, skip=COMMON_FIELDS), tasks=parse_tasks(args.tasks), workers=args.workers,
                  seed=args.seed)
    sim = cli.sim_config(args, prof.sim)
    if args.ckpt is not None and args.image_size is None:  # a checkpoint is evaluated at its own image size
        from wmrl.policy import checkpoint as ck

        sim = override(sim, image_size=int(ck.read_meta(ck.resolve(args.run, args.ckpt).path).get("image_size", 0)) or None)
    prof = override(prof, sim=sim, eval=ev)
    return args, prof


def main(args: argparse.Namespace, prof: Profile) -> int:
    from wmrl.evaluation.harness import evaluate, format_table, format_throughput

    if args.policy == "checkpoint":
        return _checkpoint(args, prof)
    out = Path(args.out or f"runs/eval/{args.policy}")
    if args.dry_run:
        cli.print_plan("evaluate", {"policy": args.policy, "episodes": len(prof.eval.tasks) * prof.eval.trials,
                                    "eval": prof.eval, "sim": prof.sim, "out": out})
        return 0
    from wmrl.procs import exclusive

    with exclusive(out, "make eval"):
        result = evaluate(args.policy, sim=prof.sim, cfg=prof.eval, out_dir=out, overwrite=args.overwrite,
                          progress=not args.no_progress)
    from wmrl.sim.tasks import get_task

    print(format_table(result.summary, {t: get_task(t).instruction for t in prof.eval.tasks}))
    print(format_throughput(result.results["throughput_this_run"]))
    print(f"results: {result.results_path}")
    return 0


def _checkpoint(args: argparse.Namespace, prof: Profile) -> int:
    """A policy checkpoint: the runner is built here; the harness takes any chunk policy."""
    from wmrl.evaluation.evidence import publish
    from wmrl.evaluation.harness import evaluate, format_table, format_throughput
    from wmrl.layout import RunLayout
    from wmrl.policy import checkpoint as ck

    info = ck.resolve(args.run, args.ckpt)  # lists the checkpoints that exist when this one does not
    layout = RunLayout(args.run)
    evidence = layout.evidence(info.step, info.kind)
    meta = ck.read_meta(info.path)
    pol = ck.policy_config_from(meta.get("policy", {}), str(info.path))
    pol = override(pol, eval_sampler=args.sampler, temperature_eval=args.temperature, gripper_deadband=args.gripper_deadband)
    from wmrl.evaluation.evidence import evaluation_with, label_of, sampler_label, sampler_slug

    label = sampler_label({"sampler": pol.eval_sampler, "temperature": pol.temperature_eval})
    was = label_of(evidence)
    out = Path(args.out) if args.out else layout.eval_dir(info.step, info.kind)
    held = label_of(out / "results.json")
    if not args.out and held is not None and held != label:
        out = out / sampler_slug(label)  # the episodes of the checkpoint's other evaluation stay where they are
    if pol.chunk_size != prof.sim.chunk_size:
        raise ConfigError(f"checkpoint {info.ref} acts in chunks of {pol.chunk_size}, the simulator runs chunks of "
                          f"{prof.sim.chunk_size}: evaluate it with a profile of the same chunk size")
    if args.dry_run:
        cli.print_plan("evaluate checkpoint", {
            "checkpoint": str(info.path), "kind": info.state, "episodes": len(prof.eval.tasks) * prof.eval.trials,
            "sampler": pol.eval_sampler, "temperature": pol.temperature_eval if pol.eval_sampler == "sde" else None,
            "noise_level": pol.noise_level, "denoise_steps": pol.denoise_steps, "gripper_deadband": pol.gripper_deadband,
            "eval": prof.eval, "sim": prof.sim, "out": str(out), "evidence": str(evidence)})
        return 0
    same = evaluation_with(evidence, label) or (evidence if evidence.exists() and was is None else None)
    if same and not args.overwrite:
        raise FileExistsError(f"{same} exists ({label_of(same) or 'unreadable'}); pass --overwrite (OVERWRITE=1) to "
                              f"evaluate checkpoint {info.ref} with that sampler again, or --sampler / --temperature "
                              "for another")
    from wmrl.evaluation.evidence import replacement_note

    note = replacement_note(evidence, {"sampler": pol.eval_sampler, "temperature": pol.temperature_eval})
    if note:
        print(note, flush=True)
    from wmrl.policy.runner import PolicyRunner

    runner = PolicyRunner(info.path, sampler=args.sampler, temperature=args.temperature,
                          gripper_deadband=args.gripper_deadband, seed=prof.eval.seed)
    if runner.image_size and runner.image_size != prof.sim.image_size:
        raise ck.CheckpointError(f"checkpoint {info.ref} was trained on {runner.image_size} px images; evaluate with "
                                 f"--image-size {runner.image_size} (the simulator is set to {prof.sim.image_size} px)")
    from wmrl.procs import exclusive

    with exclusive(out, "make eval"):
        result = evaluate(runner, sim=prof.sim, cfg=prof.eval, out_dir=out, policy_id=runner.policy_id,
                          overwrite=args.overwrite, progress=not args.no_progress, extra_settings=runner.settings())
        evidence = publish(args.run, info, result.results, harness_results=result.results_path)
    from wmrl.sim.tasks import get_task

    print(format_table(result.summary, {t: get_task(t).instruction for t in prof.eval.tasks}))
    print(format_throughput(result.results["throughput_this_run"]))
    print(f"evidence: {evidence}")
    return 0


if __name__ == "__main__":
    cli.run(lambda: main(*build()))
