"""Environment check: Python, lock file, GPUs, renderer and system limits, as one JSON report.

    python python/check.py                 # this environment (train or wm, from the Python version)
    python python/check.py --env wm --require-gpu
    make check                             # both environments; RUNTIME=docker: both images

Exit 0 when every check passes, 1 when one fails (the JSON's "failed" names them).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # plain `python python/check.py` in any env

from wmrl import cli  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    from wmrl.containers.envcheck import CheckConfig, main as run_checks

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="auto", choices=["auto", "train", "wm"], help="which environment this should be")
    p.add_argument("--lock", help="lock file to compare with (default: the image's, else docker/<env>.lock)")
    p.add_argument("--no-render", action="store_true", help="skip the MuJoCo offscreen render")
    p.add_argument("--require-gpu", action="store_true", help="fail when no GPU is visible")
    p.add_argument("--out", help="also write the JSON report to this file")
    a = p.parse_args(argv)
    return run_checks(CheckConfig(env=a.env, lock=a.lock, render=not a.no_render, require_gpu=a.require_gpu, out=a.out))


if __name__ == "__main__":
    cli.run(main)
