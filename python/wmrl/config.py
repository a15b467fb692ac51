"""Typed configuration with a named registry of profiles.

A profile bundles the settings of every stage. ``default`` is the full-scale setting of the
original system (10 tasks x 50 episodes, 128 px, 240 steps); ``tiny`` is the same code at toy
scale for CPU tests and ``make demo``. Command-line flags override single fields of the
chosen profile (see ``override``); every override is validated by ``__post_init__``.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

NUM_SPATIAL_TASKS = 10
TRIALS_PER_TASK = 50  # LIBERO ships 50 fixed initial states per task
ACTION_DIM = 7  # OSC_POSE delta: xyz, axis-angle, gripper (-1 open, +1 close)
RENDERERS = ("auto", "osmesa", "egl", "glfw")


class ConfigError(ValueError):
    """A setting is invalid; the message says how to fix it."""


def _check_tasks(tasks: tuple[int, ...], where: str) -> None:
    if not tasks:
        raise ConfigError(f"{where}: no tasks selected; pass e.g. TASKS=0,1 (valid: 0..9)")
    bad = [t for t in tasks if not 0 <= t < NUM_SPATIAL_TASKS]
    if bad:
        raise ConfigError(
            f"{where}: unknown LIBERO-Spatial task index {bad[0]}; valid indices are 0..9"
        )


@dataclass(frozen=True)
class SimConfig:
    """How the real simulator is run. Training data and evaluation must agree on these."""

    image_size: int = 128  # square, both cameras
    chunk_size: int = 8  # actions executed per policy call; images rendered only between chunks
    max_steps: int = 240  # policy steps per episode (220 is the other common convention)
    settle_steps: int = 10  # no-op steps after reset while objects fall onto the table; not counted
    renderer: str = "auto"  # auto: egl with an NVIDIA GPU, osmesa without
    # "fast": no table reflection, no multisampling, buffer sized to the image (about 3x faster
    # on software rendering, pixels differ by ~4/255 from "stock"). Recorded with every result.
    render_profile: str = "fast"
    # "split": MuJoCo's mj_step1/mj_step2 per substep instead of robosuite's forward+step
    # (same trajectories, ~1.5x faster physics). "stock" keeps robosuite's loop.
    physics: str = "split"

    def __post_init__(self) -> None:
        if self.image_size < 16 or self.image_size > 1024:
            raise ConfigError(f"image_size={self.image_size}: use a square size in 16..1024 (128 default, 64 for tests)")
        if self.chunk_size < 1:
            raise ConfigError(f"chunk_size={self.chunk_size}: must be >= 1 (8 is the original's)")
        if self.max_steps < 1:
            raise ConfigError(f"max_steps={self.max_steps}: must be >= 1 (240 default, 220 convention)")
        if self.settle_steps < 0:
            raise ConfigError(f"settle_steps={self.settle_steps}: must be >= 0")
        if self.renderer not in RENDERERS:
            raise ConfigError(f"renderer={self.renderer!r}: choose one of {', '.join(RENDERERS)}")
        if self.render_profile not in ("fast", "stock"):
            raise ConfigError(f"render_profile={self.render_profile!r}: choose 'fast' or 'stock'")
        if self.physics not in ("split", "stock"):
            raise ConfigError(f"physics={self.physics!r}: choose 'split' or 'stock'")

    @property
    def max_chunks(self) -> int:
        return -(-self.max_steps // self.chunk_size)


def default_workers() -> int:
    """One simulator process per core (the parent mostly waits)."""
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


@dataclass(frozen=True)
class EvalConfig:
    """Real-simulator evaluation on the fixed initial states (``mode=eval``)."""

    tasks: tuple[int, ...] = tuple(range(NUM_SPATIAL_TASKS))
    trials: int = TRIALS_PER_TASK  # per task; trial i uses fixed initial state i
    workers: int = 0  # 0: one per core
    seed: int = 0  # seeds stochastic policies; the initial states are fixed
    videos: int = 0  # episodes per task saved as MP4 (main | wrist side by side)

    def __post_init__(self) -> None:
        _check_tasks(self.tasks, "evaluation")
        if not 1 <= self.trials <= TRIALS_PER_TASK:
            raise ConfigError(f"trials={self.trials}: LIBERO has {TRIALS_PER_TASK} fixed initial states per task; use 1..50")
        if self.workers < 0:
            raise ConfigError(f"workers={self.workers}: use 0 (one per core) or a positive count")
        if self.videos < 0:
            raise ConfigError(f"videos={self.videos}: must be >= 0")


@dataclass(frozen=True)
class DemoConfig:
    """Scripted-expert demonstrations from seeded random resets (``mode=train``)."""

    tasks: tuple[int, ...] = tuple(range(NUM_SPATIAL_TASKS))
    episodes: int = 50  # successful demonstrations kept per task
    workers: int = 0
    seed: int = 0
    max_attempts_factor: int = 3  # give up on a task after episodes * factor attempts

    def __post_init__(self) -> None:
        _check_tasks(self.tasks, "demonstrations")
        if self.episodes < 1:
            raise ConfigError(f"episodes={self.episodes}: must be >= 1")
        if self.workers < 0:
            raise ConfigError(f"workers={self.workers}: use 0 (one per core) or a positive count")
        if self.max_attempts_factor < 1:
            raise ConfigError("max_attempts_factor must be >= 1")


@dataclass(frozen=True)
class Profile:
    name: str
    sim: SimConfig = field(default_factory=SimConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    demos: DemoConfig = field(default_factory=DemoConfig)


_PROFILES: dict[str, Profile] = {
    "default": Profile(name="default"),
    "tiny": Profile(
        name="tiny",
        sim=SimConfig(image_size=64),
        eval=EvalConfig(tasks=(0, 1), trials=2, videos=0),
        demos=DemoConfig(tasks=(0,), episodes=2),
    ),
}


def get_profile(name: str) -> Profile:
    try:
        return _PROFILES[name]
    except KeyError:
        raise ConfigError(f"unknown profile {name!r}; choose one of: {', '.join(sorted(_PROFILES))}") from None


def profile_names() -> list[str]:
    return sorted(_PROFILES)


def override(cfg: Any, **changes: Any) -> Any:
    """Return ``cfg`` with the non-None ``changes`` applied (validated by ``__post_init__``)."""
    changes = {k: v for k, v in changes.items() if v is not None}
    return dataclasses.replace(cfg, **changes) if changes else cfg


def parse_tasks(text: str | None) -> tuple[int, ...] | None:
    """Parse ``TASKS`` as given on the command line: ``0,3,5`` or ``0-4`` or ``all``."""
    if text is None or text == "":
        return None
    if text == "all":
        return tuple(range(NUM_SPATIAL_TASKS))
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        try:
            if "-" in part:
                lo, hi = part.split("-")
                out.extend(range(int(lo), int(hi) + 1))
            else:
                out.append(int(part))
        except ValueError:
            raise ConfigError(f"TASKS={text!r}: use indices like 0,3,5 or a range 0-4 or 'all'") from None
    _check_tasks(tuple(out), "TASKS")
    return tuple(dict.fromkeys(out))


def as_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)
