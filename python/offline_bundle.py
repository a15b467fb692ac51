#!/usr/bin/env python3
"""The simulator side of the kit for a server with no package index.

  build    (here, in .venv/train, with PyPI reachable) a folder with the wheels, a trimmed
           asset pack of the 10 LIBERO-Spatial scenes and MANIFEST.json
  install  (there, with any Python >= 3.10 that has pip) verify every file, install, unpack,
           check that every task builds and renders

  make offline-bundle PYTHON_VERSION=3.12 OUT=.offline/py312
  make offline-install BUNDLE=.offline/py312 [TARGET=dir]

The install subcommand needs only the standard library and pip. See python/wmrl/offline/.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _build(args: argparse.Namespace) -> int:
    from wmrl.offline.bundle import BuildOptions, build

    python_version = ".".join(args.python_version.split(".")[:2])  # 3.12.7 -> 3.12
    opts = BuildOptions(out=Path(args.out), python_version=python_version, with_torch=args.with_torch,
                        skip=args.skip or [], xz_preset=args.xz_preset, tasks=args.tasks)
    if args.requirements:
        opts.requirements = Path(args.requirements).resolve()
    if args.cache:
        opts.cache = Path(args.cache)
    if args.index_url:
        opts.index_url = args.index_url
    try:
        build(opts)
    except RuntimeError as e:
        print(f"[build] error: {e}", file=sys.stderr)
        return 1
    return 0


def _install(args: argparse.Namespace) -> int:
    from wmrl.offline.install import install

    if not args.check_only and not args.bundle:
        print("error: give --bundle DIR (or --check-only)", file=sys.stderr)
        return 2
    return install(Path(args.bundle or "."), Path(args.target) if args.target else None, check_only=args.check_only,
                   tasks=args.tasks, jobs=args.jobs, renderer=args.renderer, image_size=args.image_size,
                   force=args.force, no_check=args.no_check)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)

    b = sub.add_parser("build", help="make a bundle (run with .venv/train/bin/python)")
    b.add_argument("--out", required=True, help="bundle folder (replaced if it holds a bundle)")
    b.add_argument("--python-version", default="3.12", help="target Python, e.g. 3.12 (default) or 3.11")
    b.add_argument("--with-torch", action="store_true", help="also ship torch (and its nvidia-*, triton wheels)")
    b.add_argument("--skip", action="append", metavar="NAMES",
                   help="packages the target already has, comma-separated (globs like nvidia-* allowed); "
                        "'gpu-server' = what the GPU server's image holds. Repeatable.")
    b.add_argument("--requirements", help="requirements file (default docker/requirements-offline.in)")
    b.add_argument("--cache", help="download and asset-pack cache (default ~/.cache/wmrl-offline)")
    b.add_argument("--index-url", help="package index (default https://pypi.org/simple)")
    b.add_argument("--xz-preset", type=int, default=6, choices=range(10), metavar="0-9",
                   help="xz compression of the asset pack (6 default; 0 is fast and ~10%% larger)")
    b.add_argument("--tasks", default="0-9", help=argparse.SUPPRESS)
    b.set_defaults(func=_build)

    i = sub.add_parser("install", help="verify and install a bundle into this Python, then check it")
    i.add_argument("--bundle", help="bundle folder")
    i.add_argument("--target", help="install into this folder (pip --target) instead of this Python's site-packages")
    i.add_argument("--check-only", action="store_true", help="only rerun the check")
    i.add_argument("--no-check", action="store_true", help="install without running the check")
    i.add_argument("--tasks", default="all", help="tasks to check: all (default), 0-4, 0,5")
    i.add_argument("--jobs", type=int, help="tasks checked at once (default: half the cores, at most 10)")
    i.add_argument("--renderer", default="auto", help="auto (egl with an NVIDIA GPU, else osmesa), egl, osmesa")
    i.add_argument("--image-size", type=int, default=64)
    i.add_argument("--force", action="store_true", help="install even if the Python version differs")
    i.set_defaults(func=_install)

    args = ap.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
