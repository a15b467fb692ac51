"""The ten LIBERO-Spatial tasks, read from the installed LIBERO package.

Every task is "pick up the black bowl <where> and place it on the plate". Two black bowls
stand in every scene; the one to move is the object named in the task's BDDL goal
``(On <bowl> plate_1)``.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import re
from dataclasses import dataclass

from wmrl.config import NUM_SPATIAL_TASKS, ConfigError

SUITE = "libero_spatial"


@dataclass(frozen=True)
class SpatialTask:
    index: int
    name: str
    instruction: str
    bddl_file: str
    target_object: str  # the bowl named in the goal, e.g. "akita_black_bowl_1"
    place_on: str  # the receptacle named in the goal, "plate_1"


def _goal_from_bddl(path: str) -> tuple[str, str]:
    text = open(path).read()
    goal = re.search(r"\(:goal\s*\(And\s*\(On\s+(\S+)\s+(\S+?)\)", text, re.IGNORECASE)
    if goal is None:
        raise RuntimeError(f"could not parse the (:goal (And (On a b))) clause of {path}")
    return goal.group(1), goal.group(2)


@functools.lru_cache(maxsize=1)
def _suite():
    from libero.libero import benchmark

    # The package prints "[info] Applying task order index 0 ..." for every suite it builds: once
    # per simulator worker, 16 identical lines per evaluation in a log. Its other lines (warnings,
    # errors) still reach stdout.
    with contextlib.redirect_stdout(io.StringIO()) as said:
        suite = benchmark.get_benchmark_dict()[SUITE]()
    for line in said.getvalue().splitlines():
        if not line.startswith("[info] Applying task order"):
            print(line)
    return suite


def get_task(index: int) -> SpatialTask:
    if not 0 <= index < NUM_SPATIAL_TASKS:
        raise ConfigError(f"unknown LIBERO-Spatial task index {index}; valid indices are 0..9")
    from libero.libero import get_libero_path

    task = _suite().get_task(index)
    bddl = os.path.join(get_libero_path("bddl_files"), task.problem_folder, task.bddl_file)
    target, place_on = _goal_from_bddl(bddl)
    return SpatialTask(index, task.name, task.language, bddl, target, place_on)


def init_states(index: int):
    """The 50 fixed initial states of a task (float64, shape (50, state_dim)); eval only."""
    get_task(index)  # validates the index
    return _suite().get_task_init_states(index)
