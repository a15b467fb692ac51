"""Shared command-line plumbing for the entry scripts in ``python/``.

Entry scripts are thin: parse flags into a typed config (validated before anything heavy is
imported), then call a ``main(cfg)`` that tests call directly. Known failures become a
one-line ``error: ...`` that says what to do, and exit code 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import re
import sys
from typing import Any, Callable

from wmrl.config import ConfigError, SimConfig, override, parse_tasks, profile_names

EXPECTED_ERRORS: tuple[type[BaseException], ...] = (ConfigError, FileExistsError, FileNotFoundError)


def expected_errors() -> tuple[type[BaseException], ...]:
    out = EXPECTED_ERRORS
    try:  # the standard-library-only callers (the cycle's controller) have none of these
        from wmrl.data.trajectory import TrajectoryError
        from wmrl.evaluation.harness import EvaluationError
        from wmrl.gl import RendererError

        out += (TrajectoryError, EvaluationError, RendererError)
    except ImportError:
        pass
    return out


# what to do about an OS error, by errno: said after the OS's own words
_OS_HINTS = {17: "use OVERWRITE=1 or another OUT", 13: "choose a folder you can write", 30: "choose a writable folder",
             20: "a file stands where a folder is needed: choose another RUN/OUT", 21: "a folder stands where a file "
             "is needed", 28: "free some disk space (stages resume where they stopped)", 2: "check the path"}


def os_error_line(e: OSError) -> str:
    """One line for an OS error: the path, the OS's words, what to do."""
    if e.errno is None or e.strerror is None:  # raised by the kit with its own message
        return str(e.args[0]) if e.args else type(e).__name__
    where = f"{e.filename}: " if e.filename else ""
    hint = _OS_HINTS.get(e.errno)
    return f"{where}{e.strerror}" + (f" ({hint})" if hint else "")


COMMON_FIELDS = ("tasks", "workers", "seed")  # config fields whose flags ``add_common`` makes


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
    add_start_flags(g)


def add_start_flags(group) -> None:
    """How random placements start (the fixed evaluation states hold their own start)."""
    group.add_argument("--robot-init-noise", type=float,
                       help="random placements: sd (rad) of the arm's start around its rest pose, per joint (0.02: as "
                            "LIBERO's fixed initial states hold it; 0: always the rest pose)")
    group.add_argument("--max-settle-shift", type=float,
                       help="random placements: draw again when an object slides further (m) while the scene settles "
                            "(0.1; 0: keep every draw, as before this check)")


def sim_config(args: argparse.Namespace, base: SimConfig) -> SimConfig:
    return override(base, image_size=args.image_size, max_steps=args.max_steps, renderer=args.renderer,
                    robot_init_noise=args.robot_init_noise, max_settle_shift=args.max_settle_shift)


# ----------------------------------------------------------------------- flags from configs
_SCALARS = {"int": int, "float": float, "str": str}


def _field_comments(cls) -> dict[str, str]:
    """Each field's help text: its trailing ``# comment``, else the comment lines just above it."""
    out: dict[str, str] = {}
    try:
        lines = inspect.getsource(cls).splitlines()
    except (OSError, TypeError):
        return out
    above: list[str] = []
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("#"):
            above.append(stripped.lstrip("# "))
            continue
        m = re.match(r"\s+(\w+): [^=]+=(.*)$", line)
        if m:
            trailing = re.search(r"#\s*(.+)$", m.group(2))
            text = trailing.group(1) if trailing else " ".join(above)
            if text:
                out[m.group(1)] = text.strip()
        above = []
    return out


def add_config_flags(p: argparse.ArgumentParser | Any, cls, *, prefix: str = "", skip: tuple[str, ...] = (),
                     title: str | None = None) -> None:
    """One ``--flag`` per field of the dataclass ``cls`` (``lr`` -> ``--lr``, ``save_interval`` ->
    ``--save-interval``; booleans get ``--x/--no-x``; tuples of numbers take ``1,2,3``), all
    defaulting to None (= keep the profile's value). ``config_from_flags`` applies them."""
    g = p.add_argument_group(title) if title else p
    helps = _field_comments(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        flag = "--" + (prefix + f.name).replace("_", "-")
        dest = prefix + f.name
        help_ = helps.get(f.name, "").replace("%", "%%") + " (default: the profile's)"  # argparse formats help with %
        kind = str(f.type)
        if f.name == "tasks":
            g.add_argument(flag, dest=dest, type=parse_tasks, default=None, metavar="TASKS", help="task indices: 0,3,5 or "
                           "0-4 or all" + help_)
        elif kind == "bool":
            g.add_argument(flag, dest=dest, action=argparse.BooleanOptionalAction, default=None, help=help_)
        elif kind in _SCALARS:
            g.add_argument(flag, dest=dest, type=_SCALARS[kind], default=None, help=help_)
        elif kind.startswith("tuple[int") or kind.startswith("tuple[float"):
            num = int if kind.startswith("tuple[int") else float
            g.add_argument(flag, dest=dest, type=lambda s, num=num: tuple(num(x) for x in s.split(",") if x.strip()),
                           default=None, metavar="A,B,...", help=help_ + " ('' for none)")


def config_from_flags(args: argparse.Namespace, cfg, *, prefix: str = "", skip: tuple[str, ...] = ()):
    """``cfg`` with every flag that ``add_config_flags`` made (give it the same ``skip``) and the
    user gave applied."""
    changes = {f.name: getattr(args, prefix + f.name, None) for f in dataclasses.fields(cfg) if f.name not in skip}
    return override(cfg, **changes)


def parse_guidance(text: str) -> tuple[float, ...]:
    """``--guidance 1,2``: action-guidance scales to imagine at (empty: the pair's own), said wrong
    before anything loads (``wm_rank.py``, ``bench/action_gap.py``)."""
    try:
        return tuple(float(w) for w in text.split(",") if w.strip())
    except ValueError:
        raise ConfigError(f"--guidance {text!r}: scales separated by commas, e.g. 1,2") from None


def print_plan(title: str, plan: dict[str, Any]) -> None:
    print(f"plan: {title}")
    print(json.dumps(plan, indent=2, default=str))


def plan_or_run(title: str, dry_run: bool, plan: Callable[[], dict], run: Callable[[], Any], writes=None) -> int:
    """``--dry-run``: print ``plan()`` and start nothing; else ``run()``, holding the folder it
    ``writes`` (one writer per output folder; under torchrun, rank 0 holds it for all)."""
    import os

    if dry_run:
        print_plan(title, plan())
    elif writes is None or int(os.environ.get("RANK", "0")) != 0:
        run()
    else:
        from wmrl.procs import exclusive

        with exclusive(writes, f"make {title}"):
            run()
    return 0


def command_line(script: str, argv: list[str] | None = None) -> str:
    """How to rerun this stage (recorded in ``latest_policy.json``)."""
    import shlex

    argv = sys.argv[1:] if argv is None else argv
    return f"python {script} " + " ".join(shlex.quote(a) for a in argv)


def run(main: Callable[[], int | None],
        extra_errors: Callable[[], tuple[type[BaseException], ...]] = tuple) -> None:
    """Call ``main``; turn the errors a user can fix (``expected_errors()`` and those
    ``extra_errors()`` names, looked up only when something fails) into one line, exit code 2."""
    try:
        code = main()
    except expected_errors() + extra_errors() as e:
        msg = os_error_line(e) if isinstance(e, OSError) else str(e)
        print(f"error: {msg}", file=sys.stderr)
        sys.exit(2)
    except OSError as e:  # the disk, permissions, paths: one line too (WMRL_DEBUG=1 shows the traceback)
        import os

        if os.environ.get("WMRL_DEBUG") == "1":
            raise
        print(f"error: {os_error_line(e)}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted: rerun the same command to continue where it stopped", file=sys.stderr)
        sys.exit(130)
    sys.exit(code or 0)
