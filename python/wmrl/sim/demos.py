"""Training data from the real simulator, one HDF5 file per task: scripted-expert
demonstrations (N successful episodes per task) and collections of the current policy
(N episodes per task, success and failure kept: the mistakes the world models must show).

Both are training data, so they start from seeded random placements of the task's objects
(``mode=train``), never from the 50 fixed initial states that evaluation uses. Attempt k of
task t resets with seed ``base_seed * 1_000_000 + t * 10_000 + k``; each episode records its
seed, so any episode can be replayed.

Layout: ``OUT/task_00.hdf5`` ... . A task's file is written as ``task_00.hdf5.partial``,
one flushed episode at a time, and renamed when it holds all N; a rerun of the same command
skips finished tasks and continues partial ones from their attempt counter.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from wmrl.config import DemoConfig, SimConfig, default_workers
from wmrl.data.trajectory import TrajectoryWriter, count_episodes
from wmrl.sim.vector import EpisodeResult, EpisodeSpec, SimulatorPool


def task_file(out_dir: Path, task: int) -> Path:
    return Path(out_dir) / f"task_{task:02d}.hdf5"


def reset_seed(base_seed: int, task: int, attempt: int) -> int:
    return base_seed * 1_000_000 + task * 10_000 + attempt


@dataclass
class _TaskProgress:
    task: int
    writer: TrajectoryWriter | None
    kept: int = 0
    done_tags: set[int] = field(default_factory=set)  # attempts whose result came back (kept or not)
    in_flight: int = 0
    cursor: int = 0  # next attempt number to consider
    failures: int = 0
    steps: list[int] = field(default_factory=list)


class DemoSource:
    """Hands out attempts until each task has ``episodes`` kept episodes (or hits its cap);
    ``keep_failures``: every episode is kept (a policy's collection), else successes only."""

    def __init__(self, progress: dict[int, _TaskProgress], cfg: DemoConfig, keep_failures: bool = False):
        self.progress, self.cfg, self.keep_failures = progress, cfg, keep_failures

    def _open(self, p: _TaskProgress) -> bool:
        return (p.writer is not None and p.kept + p.in_flight < self.cfg.episodes
                and len(p.done_tags) + p.in_flight < self.cfg.episodes * self.cfg.max_attempts_factor)

    def next(self, preferred: tuple[int, ...] = ()) -> EpisodeSpec | None:
        open_tasks = [t for t, p in self.progress.items() if self._open(p)]
        if not open_tasks:
            return None
        task = next((t for t in preferred if t in open_tasks), None)
        if task is None:
            task = max(open_tasks, key=lambda t: (self.cfg.episodes - self.progress[t].kept, -t))
        p = self.progress[task]
        while p.cursor in p.done_tags:  # finished in an earlier run (a kill can leave gaps)
            p.cursor += 1
        spec = EpisodeSpec(task, init_index=None, seed=reset_seed(self.cfg.seed, task, p.cursor), tag=p.cursor)
        p.cursor += 1
        p.in_flight += 1
        return spec

    def on_result(self, result: EpisodeResult) -> None:
        p = self.progress[result.spec.task_index]
        p.in_flight -= 1
        p.done_tags.add(result.spec.tag)
        if p.writer is None:
            return
        keep = (result.success or self.keep_failures) and p.kept < self.cfg.episodes
        p.failures += int(not result.success)
        # Attributes first: append() flushes them together with the episode, so a kill
        # can lose an episode but never make a rerun repeat an attempt.
        p.writer.set_file_attr("done_attempts", sorted(p.done_tags))
        p.writer.set_file_attr("failures", p.failures)
        if keep:
            p.writer.append(result.trajectory)
            p.kept += 1
            p.steps.append(result.steps)
        if p.kept >= self.cfg.episodes:
            p.writer.finalize()
            p.writer = None


def collect_demos(cfg: DemoConfig, sim: SimConfig, out_dir: str | Path, *, overwrite: bool = False,
                  progress: bool = True, policy=None) -> dict:
    """Collect demonstrations (the scripted expert, successes only unless ``cfg.keep_failures``)
    or, with ``policy`` (a chunk policy, e.g. a checkpoint's ``PolicyRunner``), that policy's
    episodes with success and failure kept; returns a per-task summary (kept, attempts, failures, steps)."""
    from tqdm import tqdm

    from wmrl.gl import configure_renderer

    configure_renderer(sim.renderer)  # a missing GL library fails here, before any work
    out_dir = Path(out_dir)
    tasks: dict[int, _TaskProgress] = {}
    for t in cfg.tasks:
        final = task_file(out_dir, t)
        if final.exists() and not overwrite:
            n = count_episodes(final)
            if n >= cfg.episodes:
                tasks[t] = _TaskProgress(t, None, kept=n)  # done in an earlier run
                continue
            raise FileExistsError(f"{final} holds {n} demonstrations, fewer than the {cfg.episodes} asked for; "
                                  "pass --overwrite to collect it again, or choose another OUT")
        if final.exists():
            final.unlink()
        writer = TrajectoryWriter(final, overwrite=overwrite, resume=not overwrite)
        p = _TaskProgress(t, writer, kept=writer.num_episodes)
        p.done_tags = {int(k) for k in writer.get_file_attr("done_attempts", [])}
        p.failures = int(writer.get_file_attr("failures", 0))
        tasks[t] = p

    todo = sum(cfg.episodes - p.kept for p in tasks.values() if p.writer is not None)
    t0 = time.perf_counter()
    if todo:
        source = DemoSource(tasks, cfg, keep_failures=policy is not None or cfg.keep_failures)
        workers = min(cfg.workers or default_workers(), todo)
        bar = tqdm(total=todo, desc="demos" if policy is None else "collect", unit="ep", disable=not progress)
        try:
            with SimulatorPool(sim, workers, step_policy=None if policy is not None else "expert", record=True,
                               policy_id=getattr(policy, "policy_id", "external"), frame_interval=cfg.frame_interval,
                               action_noise=cfg.action_noise, post_success_steps=cfg.post_success_steps) as pool:
                for result in pool.run(source, policy):
                    if result.success or source.keep_failures:
                        bar.update(1)
                    bar.set_postfix(attempts=sum(len(p.done_tags) for p in tasks.values()))
        finally:
            bar.close()
            for p in tasks.values():
                if p.writer is not None:
                    p.writer.close()  # keep the partial file for a rerun
    wall = time.perf_counter() - t0
    summary = {str(t): {"kept": p.kept, "attempts": len(p.done_tags), "failures": p.failures,
                        "file": str(task_file(out_dir, t)) if p.kept >= cfg.episodes else None,
                        "mean_steps": sum(p.steps) / len(p.steps) if p.steps else None}
               for t, p in tasks.items()}
    incomplete = [t for t, p in tasks.items() if p.kept < cfg.episodes]
    return {"tasks": summary, "incomplete": incomplete, "wall_s": round(wall, 1)}
