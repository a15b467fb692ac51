"""One writer per folder, and children that die with their parent."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from wmrl.procs import LockError, exclusive

REPO = Path(__file__).resolve().parents[1]


def test_a_second_writer_is_refused_and_a_dead_holder_releases_the_lock(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; sys.path.insert(0, 'python')\n"
        "from wmrl.procs import exclusive\n"
        f"with exclusive({str(tmp_path)!r}, 'the holder'):\n"
        "    print('held', flush=True); time.sleep(60)")], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(LockError, match=rf"being written by the holder \(pid {holder.pid}, host "):
        with exclusive(tmp_path, "me"):
            pass
    holder.kill()
    holder.wait()
    with exclusive(tmp_path, "me"):  # the kernel dropped the dead holder's lock; the file stays
        assert "me" in (tmp_path / ".lock").read_text()


def test_a_child_dies_with_its_parent(tmp_path):
    pidfile = tmp_path / "child.pid"
    child_code = f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    parent_code = ("import sys; sys.path.insert(0, 'python')\n"
                   "from wmrl.procs import run_child\n"
                   f"run_child([sys.executable, '-c', {child_code!r}])")
    parent = subprocess.Popen([sys.executable, "-c", parent_code], cwd=REPO)
    deadline = time.time() + 30
    while not (pidfile.exists() and pidfile.read_text()) and time.time() < deadline:
        time.sleep(0.05)
    child = int(pidfile.read_text())
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    for _ in range(100):
        if not _alive(child):
            return
        time.sleep(0.05)
    pytest.fail("the child outlived its parent")


def _alive(pid: int) -> bool:
    """A dead orphan may stay a zombie until PID 1 reaps it: /proc says which."""
    try:
        os.kill(pid, 0)
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except (ProcessLookupError, OSError):
        return False
