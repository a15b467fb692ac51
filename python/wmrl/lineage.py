"""Lineage facts recorded with every checkpoint and result: the code's git commit."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def git_commit(repo: Path = REPO) -> str:
    """The checkout's commit, with ``-dirty`` when tracked files differ from it; "unknown"
    outside a git checkout (an installed copy, a container without .git)."""
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(repo), "diff", "--quiet", "HEAD", "--"], capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head.stdout.strip() + ("-dirty" if dirty.returncode == 1 else "")
