"""Collect real trajectories with the current policy: success and failure kept.

    python python/collect.py --run runs/a                        # the newest policy -> RUN/collect/T1/, T3/task_XX.hdf5
    python python/collect.py --run runs/a --ckpt sft/4000 --episodes 20 --tasks 0-4
    make collect RUN=runs/a [CKPT=60] [EPISODES=50] [TASKS=...]

The cycle's first stage (seed 000: 10 tasks x 50 episodes, at most 240 steps, chunks of 8, both
cameras, actions, simulator state and proprio at the same frame index). Episodes start from
seeded random placements (mode=train), never from the fixed evaluation states; the policy
samples with the flow-SDE at temperature 1 (``collect.sampler``/``temperature``), so the data
shows its mistakes, and shares the episodes with temperature 3 (``--extra-temperatures``, each
temperature in OUT/T<t>/; '' for none), whose worse mistakes teach the world models what wrong
actions do. Frames are stored every step (``--frame-interval 1``: every phase of the episode for
the world models) or at chunk boundaries only (``--frame-interval 0``, 8x smaller files).
A rerun continues each task's file where it stopped.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from wmrl import cli
from wmrl.cli import COMMON_FIELDS
from wmrl.config import CollectConfig, ConfigError, DemoConfig, get_profile, override


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
    check_layout(collect, out, overwrite=args.overwrite)
    return args, collect, sim, info, out


def check_layout(collect: CollectConfig, out: Path, overwrite: bool) -> None:
    """One layout per OUT: the manifest reads every .hdf5 below it, so a collection at several
    temperatures (OUT/T<t>/) beside one at a single temperature (OUT/task_XX.hdf5) would mix them."""
    if overwrite or not out.is_dir():
        return
    flat = sorted(p.name for p in out.glob("task_*.hdf5"))
    nested = sorted(p.parent.name for p in out.glob("T*/task_*.hdf5"))
    several = len(collect.temperatures) > 1
    if several and flat:
        raise ConfigError(f"{out} holds a collection at one temperature ({flat[0]} ...): continue it with "
                          "--extra-temperatures '' (EXTRA_TEMPERATURES=), or collect into another OUT")
    wanted = {p.name for p in temperature_dirs(collect, out).values()} if several else set()
    if nested and set(nested) - wanted:
        raise ConfigError(f"{out} holds a collection at temperatures {sorted(set(nested))} (its T<t>/ folders): continue "
                          f"it with the same --temperature and --extra-temperatures, or collect into another OUT")


def temperature_dirs(collect: CollectConfig, out: Path) -> dict[float, Path]:
    """Where each temperature's episodes go: OUT itself for one temperature, OUT/T<t>/ for several."""
    temps = collect.temperatures
    return {t: out if len(temps) == 1 else out / f"T{t:g}" for t in temps}


def main(args, collect: CollectConfig, sim, info, out: Path) -> int:
    from wmrl.sim.demos import collect_demos, task_file

    dirs, counts = temperature_dirs(collect, out), collect.episodes_at()
    if args.dry_run:
        cli.print_plan("collect with the policy", {
            "policy": str(info.path), "ref": info.ref, "tasks": collect.tasks, "episodes_per_task": collect.episodes,
            "reset": "seeded random placement (mode=train)", "sampler": collect.sampler,
            "temperatures": {f"{t:g}": f"{counts[t]} episodes per task, reset seeds from {collect.seed_at(t)} -> {d}"
                             for t, d in dirs.items()},
            "kept": "success and failure",
            "frames": f"every {collect.frame_interval} steps" if collect.frame_interval else "chunk boundaries",
            "files": [str(task_file(d, t)) for d in dirs.values() for t in collect.tasks], "sim": sim})
        return 0
    from wmrl.policy.runner import PolicyRunner
    from wmrl.procs import exclusive

    kept = wins = 0
    with exclusive(out, "make collect"):
        for temperature, folder in dirs.items():
            seed = collect.seed_at(temperature)  # placements of its own at each temperature
            runner = PolicyRunner(info.path, sampler=collect.sampler, temperature=temperature, seed=seed)
            # the demonstrations' machinery with every episode kept
            cfg = DemoConfig(tasks=collect.tasks, episodes=counts[temperature], workers=collect.workers,
                             seed=seed, frame_interval=collect.frame_interval,
                             post_success_steps=collect.post_success_steps)
            summary = collect_demos(cfg, sim, folder, overwrite=args.overwrite, progress=not args.no_progress,
                                    policy=runner)
            n = sum(v["kept"] for v in summary["tasks"].values())
            w = n - sum(v["failures"] for v in summary["tasks"].values())
            kept, wins = kept + n, wins + w
            summary["policy"] = {"ref": info.ref, "path": str(info.path), "policy_id": runner.policy_id}
            print(json.dumps(summary, indent=2))
            print(f"[collect] {n} episodes ({w} successful) at temperature {temperature:g} in {folder}", flush=True)
    if len(dirs) > 1:
        print(f"[collect] {kept} episodes ({wins} successful) in {out}")
    return 0


if __name__ == "__main__":
    cli.run(lambda: main(*build()))
