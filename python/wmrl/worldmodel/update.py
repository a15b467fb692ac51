"""The world-model update controller: both views at once, the seed's stop rule, the selection.

The main-view and wrist-view models train at the same time on separate GPU groups
(``WM_GPUS_MAIN`` / ``WM_GPUS_WRIST``, default: the visible GPUs split half and half, both
on the one GPU of a one-GPU machine; one CPU process each without GPUs), each through the
DeepSpeed launcher (``--hostfile`` for several hosts). The stop rule of the seed: the wrist
model trains to its target step; then the main model is asked to save after its next
complete optimizer update and stop (it need not reach the target). The controller then
writes ``RUN/train/selected_world_models.json`` naming the two weight folders that the pair
is packaged from.

A time limit (``--max-minutes``, for a job slot or a lent machine) asks the wrist model to
stop as well, after its next complete update; the main model then follows by the same rule,
and the selection records that the limit, not the target, ended the update.

Rerunning after an interruption continues both trainings from their checkpoints; a finished
update (the selection exists) is left alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field

from wmrl.config import ConfigError
from wmrl.fileio import read_json, write_json
from wmrl.layout import RunLayout
from wmrl.procs import die_with_parent
from wmrl.worldmodel.train import STOP_FILE


class UpdateError(ConfigError):
    """A view's training failed; the message names its log."""


def parse_gpus(text: str | None) -> list[int]:
    if not text:
        return []
    try:
        return [int(g) for g in text.replace(" ", "").split(",") if g != ""]
    except ValueError:
        raise ConfigError(f"GPU list {text!r}: give indices like 0,1,2,3") from None


def gpu_groups(visible: int, main: str | None, wrist: str | None) -> tuple[list[int], list[int]]:
    """GPU indices for (main, wrist): the given lists, or the visible GPUs split in half."""
    m, w = parse_gpus(main), parse_gpus(wrist)
    if not m and not w:
        if visible == 0:
            return [], []
        if visible == 1:  # both views share it (measured on an H200: 156 samples/s each, 215 alone)
            return [0], [0]
        half = visible // 2
        return list(range(half)), list(range(half, visible))
    if not m or not w:
        raise ConfigError("set both WM_GPUS_MAIN and WM_GPUS_WRIST (e.g. 0,1,2,3 and 4,5,6,7), or neither")
    bad = [g for g in m + w if g >= visible]
    if bad:
        raise ConfigError(f"GPU(s) {bad} requested, {visible} visible")
    return m, w


@dataclass
class ViewLaunch:
    view: str
    gpus: list[int]
    port: int
    args: list[str] = field(default_factory=list)  # passed on to the script
    script: str = ""  # the entry script that trains one view (`--view V` is added): the caller's

    def command(self, hostfile: str | None = None) -> list[str]:
        script = [self.script, "--view", self.view, *self.args]
        if not self.gpus:
            return [sys.executable, *script, "--device", "cpu"]
        launcher = [sys.executable, "-m", "deepspeed.launcher.runner", "--master_port", str(self.port)]
        if hostfile:
            launcher += ["--hostfile", hostfile]
        else:
            launcher += ["--include", "localhost:" + ",".join(map(str, self.gpus))]
        return [*launcher, *script, "--device", "cuda"]

    def env(self) -> dict:
        env = dict(os.environ)
        env["MASTER_PORT"] = str(self.port)
        if not self.gpus:
            env["DS_ACCELERATOR"] = "cpu"
            env["CUDA_VISIBLE_DEVICES"] = ""
        return env


def failure(view: str, code: int, log_path: str) -> str:
    """The view's own one-line reason (its last ``error:`` line) with where the full log is."""
    try:
        lines = [ln for ln in open(log_path, errors="replace").read().splitlines() if ln.startswith("error: ")]
    except OSError:
        lines = []
    reason = f": {lines[-1][len('error: '):]}" if lines else ""
    return f"the {view}-view training failed (exit {code}){reason}; full log {log_path}"


def run_update(run: str | os.PathLike, main: ViewLaunch, wrist: ViewLaunch, *, hostfile: str | None = None,
               max_s: float | None = None, poll_s: float = 2.0, more: bool = False, log=print) -> dict:
    """Train both views concurrently with the stop rule; returns (and writes) the selection.
    ``max_s``: after this many seconds the wrist model is asked to stop too (a time limit).
    ``more``: a finished update trains further (each view resumes its newest checkpoint); its
    selection is replaced only when the views stop again, so a killed run leaves it naming the
    weights it chose, and the same command continues."""
    layout = RunLayout(run)
    sel = layout.selection
    view_dir = layout.wm_view
    if more and sel.exists():
        done = read_json(sel, ConfigError, "")
        log(f"[wm-update] training further from main step {done['main']['step']}, wrist step {done['wrist']['step']}")
    elif sel.exists():
        log(f"[wm-update] {sel} exists: this update is finished (make wm-update MORE=1 trains it further)")
        return read_json(sel, ConfigError, "")
    for v in (main, wrist):
        (view_dir(v.view) / STOP_FILE).unlink(missing_ok=True)  # a stop from an interrupted run
        view_dir(v.view).mkdir(parents=True, exist_ok=True)
    layout.logs.mkdir(parents=True, exist_ok=True)
    logs = {v.view: open(layout.logs / f"wm_{v.view}.out", "a") for v in (main, wrist)}
    procs = {}
    t0 = time.perf_counter()
    try:
        for v in (main, wrist):
            cmd = v.command(hostfile)
            log(f"[wm-update] {v.view}: {' '.join(cmd)}  (GPUs {v.gpus or 'none: CPU'}; log {logs[v.view].name})")
            # a view trainer dies with this controller: a killed update never leaves writers behind
            procs[v.view] = subprocess.Popen(cmd, env=v.env(), stdout=logs[v.view], stderr=subprocess.STDOUT,
                                             preexec_fn=die_with_parent)
        # the wrist model decides: when it finishes, the main model stops after its next update
        timed_out = False
        while procs["wrist"].poll() is None:
            if procs["main"].poll() not in (None, 0):
                raise UpdateError(failure("main", procs["main"].returncode, logs["main"].name))
            if max_s is not None and not timed_out and time.perf_counter() - t0 >= max_s:
                timed_out = True
                log(f"[wm-update] time limit of {max_s:.0f} s: asking wrist to stop after its next update")
                (view_dir("wrist") / STOP_FILE).touch()
            time.sleep(poll_s)
        if procs["wrist"].returncode != 0:
            raise UpdateError(failure("wrist", procs["wrist"].returncode, logs["wrist"].name))
        ended = "stopped at the time limit" if timed_out else "reached its target"
        log(f"[wm-update] wrist {ended} after {time.perf_counter() - t0:.0f} s; asking main to stop")
        (view_dir("main") / STOP_FILE).touch()
        if procs["main"].wait() != 0:
            raise UpdateError(failure("main", procs["main"].returncode, logs["main"].name))
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.terminate()
                p.wait(timeout=60)
        for f in logs.values():
            f.close()
    status = {v: read_json(view_dir(v) / "status.json", ConfigError, "the training wrote no status")
              for v in ("main", "wrist")}
    selection = {"format": "wmrl-selection/1",
                 "rule": "wrist trains to its target; main saves after its next complete update and stops",
                 "main": status["main"], "wrist": status["wrist"], "time_limit_s": max_s,
                 "wall_s": round(time.perf_counter() - t0, 1)}
    write_json(sel, selection)
    log(f"[wm-update] selected main step {status['main']['step']} ({status['main']['reason']}), "
        f"wrist step {status['wrist']['step']}: {sel}")
    return selection
