"""Real-simulator evaluation: tasks x fixed initial states, success-once.

Trial i of a task starts from LIBERO's fixed initial state i (``mode=eval``), so every
policy is scored on the same 10 x 50 starts. Each finished episode is appended to
``episodes.jsonl`` in the output folder as it completes; rerunning the same command skips
those and continues. The final ``results.json`` (all episodes, per-task summary, settings
and simulator versions) is written atomically once every episode is in.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wmrl import __version__
from wmrl.config import TRAINING_START_FIELDS, EvalConfig, SimConfig, as_dict, default_workers
from wmrl.fileio import write_json
from wmrl.sim.vector import EpisodeResult, EpisodeSpec, FixedEpisodes, SimulatorPool

EPISODES_LOG = "episodes.jsonl"
RESULTS = "results.json"


class EvaluationError(RuntimeError):
    pass


def episode_seed(base_seed: int, task: int, trial: int) -> int:
    """The policy's seed for one trial: fixed by (seed, task, trial), whatever the worker."""
    return base_seed * 1_000_003 + task * 1_000 + trial


def plan(cfg: EvalConfig) -> list[EpisodeSpec]:
    return [EpisodeSpec(t, init_index=i, seed=episode_seed(cfg.seed, t, i), tag=i)
            for t in cfg.tasks for i in range(cfg.trials)]


def settings_of(policy_id: str, sim: SimConfig, cfg: EvalConfig, extra: dict[str, Any] | None = None) -> dict:
    from wmrl.gl import choose_backend
    from wmrl.sim.env import simulator_versions

    return {
        "policy_id": policy_id,
        "sim": as_dict(sim),
        "renderer": choose_backend(sim.renderer),
        "eval_seed": cfg.seed,
        "init_states": "LIBERO-Spatial fixed initial states (mode=eval), trial i = state i",
        "success": "success-once (goal held after any step)",
        "versions": simulator_versions(),
        "kit_version": __version__,
        **(extra or {}),
    }


def _fingerprint(settings: dict) -> str:
    """What makes two evaluations the same: every setting but the library versions (recorded,
    not compared) and the simulator's training-start fields, which no fixed initial state sees."""
    stable = {k: v for k, v in settings.items() if k != "versions"}
    stable["sim"] = {k: v for k, v in stable["sim"].items() if k not in TRAINING_START_FIELDS}
    return hashlib.sha256(json.dumps(stable, sort_keys=True).encode()).hexdigest()[:16]


def _load_done(log: Path, fingerprint: str) -> dict[tuple[int, int], dict]:
    done: dict[tuple[int, int], dict] = {}
    if not log.exists():
        return done
    for line in log.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a line cut short by a kill: that episode simply runs again
        if rec.get("settings_fingerprint") != fingerprint:
            raise EvaluationError(
                f"{log} holds episodes of an evaluation with other settings; "
                "choose another OUT, or pass --overwrite to start this one afresh")
        done[(rec["task"], rec["trial"])] = rec
    return done


def summarize(episodes: list[dict], tasks: tuple[int, ...]) -> dict:
    per_task = {}
    for t in tasks:
        eps = [e for e in episodes if e["task"] == t]
        wins = sum(e["success"] for e in eps)
        per_task[str(t)] = {"successes": wins, "trials": len(eps), "success_rate": wins / max(1, len(eps)),
                            "mean_steps": sum(e["steps"] for e in eps) / max(1, len(eps))}
    total = sum(v["trials"] for v in per_task.values())
    wins = sum(v["successes"] for v in per_task.values())
    return {"per_task": per_task, "successes": wins, "trials": total, "success_rate": wins / max(1, total)}


def format_table(summary: dict, instructions: dict[int, str] | None = None) -> str:
    lines = [f"{'task':>4}  {'success':>9}  {'rate':>6}  {'steps':>6}  instruction"]
    for t, v in summary["per_task"].items():
        instr = (instructions or {}).get(int(t), "")
        lines.append(f"{t:>4}  {v['successes']:>4}/{v['trials']:<4}  {v['success_rate']:>6.1%}  {v['mean_steps']:>6.1f}  {instr}")
    lines.append(f"{'all':>4}  {summary['successes']:>4}/{summary['trials']:<4}  {summary['success_rate']:>6.1%}")
    return "\n".join(lines)


@dataclass
class EvalOutput:
    results_path: Path
    summary: dict
    results: dict  # what results_path holds: every episode, the summary, all settings


def evaluate(policy, *, sim: SimConfig, cfg: EvalConfig, out_dir: str | os.PathLike,
             policy_id: str | None = None, overwrite: bool = False, progress: bool = True,
             extra_settings: dict[str, Any] | None = None, pool: SimulatorPool | None = None) -> EvalOutput:
    """Evaluate ``policy``: a step-policy name (``"expert"``, ``"random"``) or any ``ChunkPolicy``
    (an object with ``act(list[Observation]) -> (B, chunk, 7)`` and optionally ``policy_id``):
    a checkpoint's ``PolicyRunner``, GRPO's policy in training, anything else. Its chunk must
    be the simulator's. Resumes from ``out_dir/episodes.jsonl``. ``pool``: run on these
    simulator workers (a caller that keeps a pool, like GRPO) instead of starting new ones."""
    from tqdm import tqdm

    from wmrl.gl import configure_renderer

    configure_renderer(sim.renderer)  # a missing GL library fails here, before any work
    out_dir = Path(out_dir)
    step_policy = policy if isinstance(policy, str) else None
    policy_id = policy_id or (f"{policy}" if step_policy else getattr(policy, "policy_id", "external"))
    settings = settings_of(policy_id, sim, cfg, extra_settings)
    fingerprint = _fingerprint(settings)
    log = out_dir / EPISODES_LOG
    if overwrite:
        for name in (EPISODES_LOG, RESULTS):
            (out_dir / name).unlink(missing_ok=True)
    elif (out_dir / RESULTS).exists():
        raise EvaluationError(f"{out_dir / RESULTS} exists; pass --overwrite to evaluate again (or choose another OUT)")
    out_dir.mkdir(parents=True, exist_ok=True)
    done = _load_done(log, fingerprint)
    todo = [s for s in plan(cfg) if (s.task_index, s.tag) not in done]
    workers = min(cfg.workers or default_workers(), max(1, len(todo)))
    record_videos = cfg.videos > 0

    t0 = time.perf_counter()
    ran: list[dict] = []  # the episodes this call runs (a resumed evaluation has others already)
    if todo:
        bar = tqdm(total=len(todo), desc=f"eval {policy_id}", unit="ep", disable=not progress,
                   initial=0, postfix={"success": "-"})
        wins = sum(r["success"] for r in done.values())
        if pool is not None and pool.cfg != sim:
            raise EvaluationError("the simulator pool given runs other settings than this evaluation")
        own = pool is None
        if own:
            pool = SimulatorPool(sim, workers, step_policy=step_policy, policy_id=policy_id, record=record_videos)
        else:
            workers = pool.num_workers
        try:
            with open(log, "a") as f:
                for result in pool.run(FixedEpisodes(todo), None if step_policy else policy):
                    rec = _episode_record(result, fingerprint)
                    ran.append(rec)
                    f.write(json.dumps(rec) + "\n")
                    f.flush()
                    done[(rec["task"], rec["trial"])] = rec
                    wins += rec["success"]
                    bar.set_postfix(success=f"{wins}/{len(done)}")
                    bar.update(1)
                    if record_videos and result.spec.tag < cfg.videos:
                        write_video(result, out_dir / "videos")
        finally:
            if own:
                pool.close()
        bar.close()
    wall = time.perf_counter() - t0

    episodes = sorted(done.values(), key=lambda e: (e["task"], e["trial"]))
    summary = summarize(episodes, cfg.tasks)
    results = {"settings": settings, "eval_config": as_dict(cfg), "summary": summary,
               "wall_s_this_run": round(wall, 2), "workers": workers,
               "throughput_this_run": throughput(ran, wall, workers), "episodes": episodes}
    path = out_dir / RESULTS
    write_json(path, results)
    from wmrl.plots import success_by_task

    success_by_task(summary, out_dir / "success_by_task.png", title=policy_id)
    return EvalOutput(path, summary, results)


def throughput(episodes: list[dict], wall: float, workers: int) -> dict:
    """Environment steps per second of the episodes this call ran, and how busy the worker
    processes were: ``worker_utilisation`` is the share of their time spent computing (env
    builds, resets, physics, cameras); the rest they waited for the policy's actions. Well
    below 1 says the policy, not the physics, sets the pace. (``worker_busy_share``, computing
    time over episode time, is ~1/2 at best when each worker holds two episodes in flight.)"""
    steps, busy, ep_wall = (sum(e.get(k, 0) for e in episodes) for k in ("steps", "busy_s", "wall_s"))
    return {"episodes": len(episodes), "env_steps": steps, "steps_per_s": round(steps / max(wall, 1e-9), 1),
            "worker_utilisation": round(busy / max(wall * workers, 1e-9), 3),
            "worker_busy_share": round(busy / ep_wall, 3) if ep_wall else None,
            "worker_occupancy": round(ep_wall / max(wall * workers, 1e-9), 3)}


def format_throughput(tp: dict) -> str:
    """One line for people: steps per second and how busy the workers were."""
    if not tp.get("episodes"):
        return "throughput: no episode ran in this call (all were done earlier)"
    return (f"throughput: {tp['env_steps']} env steps of {tp['episodes']} episodes at {tp['steps_per_s']} steps/s; "
            f"workers computing {tp['worker_utilisation']:.0%} of the time (the rest they waited for the policy)")


def _episode_record(result: EpisodeResult, fingerprint: str) -> dict:
    s = result.spec
    return {"task": s.task_index, "trial": s.tag, "init_index": s.init_index, "seed": s.seed,
            "success": bool(result.success), "steps": int(result.steps), "wall_s": round(result.wall_s, 3),
            "busy_s": round(result.busy_s, 3), "settings_fingerprint": fingerprint}


def write_video(result: EpisodeResult, folder: Path) -> Path | None:
    """MP4 (GIF without an MP4 encoder) of one episode, main and wrist camera side by side
    (one frame per chunk)."""
    import numpy as np

    from wmrl.fileio import write_video as write_clip

    traj = result.trajectory
    if traj is None:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    s = result.spec
    name = folder / f"task{s.task_index:02d}_trial{s.tag:02d}_{'success' if result.success else 'failure'}.mp4"
    return write_clip(name, np.concatenate([traj.main, traj.wrist], axis=2), fps=4)
