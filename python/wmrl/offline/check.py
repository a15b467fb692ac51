"""The installed simulator works: every task builds, steps and renders both cameras.

``python -m wmrl.offline.check --tasks all --jobs 4`` runs each task in its own process (a
crash, e.g. in the GL driver, fails that task only) and prints one line per task and the
simulator versions. Exit 0 when every task passed. Needs the simulator installed and the kit's
``python/`` folder on ``PYTHONPATH``; the parent process imports nothing but the standard
library.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

NUM_TASKS = 10


def one_task(task: int, image_size: int, renderer: str) -> dict:
    """Build task ``task`` the way the kit does, reset, step one chunk, render both cameras."""
    t0 = time.time()
    from wmrl.gl import configure_renderer

    backend = configure_renderer(renderer)
    import numpy as np

    from wmrl.config import SimConfig
    from wmrl.sim.env import SpatialEnv, simulator_versions

    env = SpatialEnv(task, SimConfig(image_size=image_size, renderer=renderer))
    built = time.time() - t0
    try:
        obs = env.reset(init_index=0)
        chunk = np.zeros((env.cfg.chunk_size, 7), dtype=np.float32)
        chunk[:, 6] = -1.0  # gripper open: hold still
        after, _ = env.step_chunk(chunk)
        images = {"main": after.main, "wrist": after.wrist}
        problems = [f"{k} {v.shape} {v.dtype}" for k, v in images.items()
                    if v.shape != (image_size, image_size, 3) or v.dtype != np.uint8]
        problems += [f"{k} image is blank (std {v.std():.2f})" for k, v in images.items() if v.std() < 1.0]
        if not np.all(np.isfinite(after.proprio)):
            problems.append("non-finite proprio")
        moved = float(np.abs(after.state - obs.state).max())
        return {
            "task": task, "ok": not problems, "problems": problems, "build_s": round(built, 1),
            "total_s": round(time.time() - t0, 1), "renderer": backend, "steps": env.steps,
            "main_mean": round(float(after.main.mean()), 1), "wrist_mean": round(float(after.wrist.mean()), 1),
            "state_change": round(moved, 6), "instruction": env.task.instruction, "versions": simulator_versions(),
        }
    finally:
        env.close()


def parse_tasks(text: str) -> list[int]:
    if text in ("all", ""):
        return list(range(NUM_TASKS))
    out: list[int] = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        out.extend(range(int(a), int(b or a) + 1))
    bad = [t for t in out if not 0 <= t < NUM_TASKS]
    if bad:
        raise SystemExit(f"unknown task index {bad[0]}: valid are 0..9")
    return out


def default_jobs() -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(NUM_TASKS, cores // 2))


def run_all(tasks: list[int], jobs: int, image_size: int, renderer: str, timeout: float = 900) -> int:
    t0 = time.time()
    print(f"[check] {len(tasks)} task(s), {image_size} px, renderer {renderer}, {jobs} at a time", flush=True)
    pending = list(tasks)
    running: dict[int, tuple[subprocess.Popen, float]] = {}
    results: dict[int, dict] = {}
    while pending or running:
        while pending and len(running) < jobs:
            t = pending.pop(0)
            cmd = [sys.executable, "-m", "wmrl.offline.check", "--one", str(t), "--image-size", str(image_size),
                   "--renderer", renderer]
            running[t] = (subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), time.time())
        for t, (proc, start) in list(running.items()):
            if proc.poll() is None and time.time() - start < timeout:
                continue
            if proc.poll() is None:
                proc.kill()
            out, err = proc.communicate()
            line = next((x for x in reversed(out.splitlines()) if x.startswith("{")), None)
            res = json.loads(line) if line else {"task": t, "ok": False,
                                                 "problems": [f"exit {proc.returncode}: " + (err.strip().splitlines() or ["no output"])[-1]]}
            results[t] = res
            del running[t]
            if res["ok"]:
                print(f"[check] task {t} OK    build {res['build_s']:5.1f} s, {res['steps']} steps, main/wrist "
                      f"{image_size}x{image_size} (mean {res['main_mean']}/{res['wrist_mean']}), {res['renderer']}: "
                      f"{res['instruction']}", flush=True)
            else:
                print(f"[check] task {t} FAIL  {'; '.join(res['problems'])}", flush=True)
                if err.strip():
                    print("\n".join("    " + x for x in err.strip().splitlines()[-15:]), flush=True)
        time.sleep(0.2)
    versions = next((r["versions"] for r in results.values() if r.get("versions")), None)
    if versions:
        print("[check] simulator: " + ", ".join(f"{k} {v}" for k, v in versions.items())
              + f"; Python {sys.version.split()[0]}", flush=True)
    failed = sorted(t for t, r in results.items() if not r["ok"])
    print(f"[check] {len(tasks) - len(failed)}/{len(tasks)} tasks OK in {time.time() - t0:.0f} s"
          + (f"; failed: {failed}" if failed else ""), flush=True)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", default="all", help="all, or e.g. 0-4 or 0,5")
    ap.add_argument("--jobs", type=int, default=None, help="tasks checked at once (default: half the cores, <= 10)")
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--renderer", default="auto", help="auto (egl with an NVIDIA GPU, osmesa without), egl, osmesa")
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one is not None:
        print(json.dumps(one_task(args.one, args.image_size, args.renderer)), flush=True)
        return 0
    return run_all(parse_tasks(args.tasks), args.jobs or default_jobs(), args.image_size, args.renderer)


if __name__ == "__main__":
    sys.exit(main())
