"""Shared command-line plumbing for the entry scripts in ``python/``.

Entry scripts are thin: parse flags into a typed config (validated before anything heavy is
imported), then call a ``main(cfg)`` that tests call directly. Known failures become a
one-line ``error: ...`` that says what to do, and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable

from wmrl.config import ConfigError, SimConfig, override, profile_names

EXPECTED_ERRORS: tuple[type[BaseException], ...] = (ConfigError, FileExistsError, FileNotFoundError)


def expected_errors() -> tuple[type[BaseException], ...]:
    from wmrl.data.trajectory import TrajectoryError
    from wmrl.evaluation.harness import EvaluationError
    from wmrl.sim.render import RendererError

    return EXPECTED_ERRORS + (TrajectoryError, EvaluationError, RendererError)


def add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", default="default", choices=profile_names(), help="named settings (tiny: CPU toy scale)")
    p.add_argument("--tasks", help="task indices: 0,3,5 or 0-4 or all (default: the profile's)")
    p.add_argument("--workers", type=int, help="simulator processes (default: one per core)")
    p.add_argument("--seed", type=int, help="base seed")
    p.add_argument("--out", help="output folder")
    p.add_argument("--overwrite", action="store_true", help="replace existing output instead of refusing")
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (logs only)")
    g = p.add_argument_group("simulator")
    g.add_argument("--image-size", type=int, help="camera image size (square)")
    g.add_argument("--max-steps", type=int, help="policy steps per episode (240; 220 is the other convention)")
    g.add_argument("--renderer", help="auto | osmesa | egl (MUJOCO_GL overrides)")


def sim_config(args: argparse.Namespace, base: SimConfig) -> SimConfig:
    return override(base, image_size=args.image_size, max_steps=args.max_steps, renderer=args.renderer)


def print_plan(title: str, plan: dict[str, Any]) -> None:
    print(f"plan: {title}")
    print(json.dumps(plan, indent=2, default=str))


def run(main: Callable[[], int | None],
        extra_errors: Callable[[], tuple[type[BaseException], ...]] = tuple) -> None:
    """Call ``main``; turn the errors a user can fix (``expected_errors()`` and those
    ``extra_errors()`` names, looked up only when something fails) into one line, exit code 2."""
    try:
        code = main()
    except expected_errors() + extra_errors() as e:
        msg = e.args[0] if isinstance(e, (FileExistsError, FileNotFoundError)) and e.args else str(e)
        print(f"error: {msg}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted: rerun the same command to continue where it stopped", file=sys.stderr)
        sys.exit(130)
    sys.exit(code or 0)
