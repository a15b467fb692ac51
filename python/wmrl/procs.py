"""Child processes that die with their parent, and one writer per output folder.

    with exclusive(run, "make cycle"):          # a second writer gets a one-line error
        rc = run_child(cmd, log=path)           # output to the console and to ``path``
        p = start_child(cmd, log=path)          # in the background (output to ``path`` only)

A child started by ``run_child`` asks the kernel (Linux ``prctl(PR_SET_PDEATHSIG)``) for
SIGTERM when its parent dies, so killing a controller never leaves a trainer writing into a
folder that the rerun is about to resume. The lock is an ``flock`` on ``FOLDER/<name>``: the
kernel drops it when its holder dies, so a stale lock file never blocks a rerun.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Iterator

from wmrl.config import ConfigError

PR_SET_PDEATHSIG = 1


class LockError(ConfigError):
    """Another writer holds the folder (said in one line, like a bad input)."""


def die_with_parent() -> None:
    """``preexec_fn``: SIGTERM to this process when its parent dies (no-op where unsupported)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def run_child(cmd: list[str], *, log: Path | None = None, env: dict | None = None, cwd=None) -> int:
    """Run ``cmd`` to its end, its output shown and (with ``log``) appended to a file; an
    interrupt of the parent stops the child first (SIGTERM, then SIGKILL after 30 s)."""
    out = open(log, "a", buffering=1) if log else None
    p = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE if out else None,
                         stderr=subprocess.STDOUT if out else None, preexec_fn=die_with_parent,
                         text=True if out else None, errors="replace" if out else None)
    try:
        if out:
            for line in p.stdout:
                sys.stdout.write(line)
                out.write(line)
            sys.stdout.flush()
        return p.wait()
    except BaseException:
        stop_child(p)
        raise
    finally:
        if out:
            out.close()


def torchrun(nproc: int) -> list[str]:
    """Arguments for the interpreter that start a script as ``nproc`` processes, one per GPU
    (``python -m torch.distributed.run``); none for one process."""
    return ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"] if nproc > 1 else []


def start_child(cmd: list[str], *, log: Path, env: dict | None = None, cwd=None) -> subprocess.Popen:
    """Start ``cmd`` in the background, its output appended to ``log`` only (it would interleave
    with the foreground's); it dies with this process like ``run_child``'s children."""
    with open(log, "a") as out:  # the child keeps its own descriptor
        return subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                preexec_fn=die_with_parent)


def stop_child(p: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after 30 s."""
    p.terminate()
    try:
        p.wait(30)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


@contextlib.contextmanager
def exclusive(folder: str | os.PathLike, what: str, name: str = ".lock") -> Iterator[None]:
    """Hold ``FOLDER/name`` for the block; refuse with who holds it when another process does."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    f = open(folder / name, "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "another process"
        f.close()
        raise LockError(f"{folder} is being written by {holder}: one writer per folder; wait for it to finish or "
                        "stop it, then rerun") from None
    f.seek(0)
    f.truncate()
    f.write(f"{what} (pid {os.getpid()}, host {socket.gethostname()})")
    f.flush()
    try:
        yield
    finally:
        fcntl.flock(f, fcntl.LOCK_UN)
        f.close()
