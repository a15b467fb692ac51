"""How much of a recorded episode's outcome its start and its actions decide: a ceiling on the
pair's agreement (issue 15).

The pair's agreement replays a real episode's actions from its start frame and asks whether the
imagined episode succeeds. A world model knows the scene only as well as that frame shows it (at
128 px, 6.7 mm a pixel at the objects). If a few millimetres decide a grasp, even a perfect
simulator fed the actions open loop would miss outcomes. This measures that in the real
simulator: each episode's actions replayed from its own start state, exactly (the check: every
outcome reproduced) and with every movable object shifted by D mm in a random horizontal
direction (DRAWS directions per D). A recording stops at its first success, so a replay may hold
still for GRACE steps after the last action (a step late is not another outcome). Reported per
shift: how often the outcome flips, and the agreement (balanced accuracy) of the shifted replays
with the recorded outcomes, the figure the pair's agreement is scored by.

    PYTHONPATH=python .venv/train/bin/python bench/outcome_sensitivity.py RUN/collect \
        --shifts 0,1,2,4,8,16 --draws 2 --workers 2 --out sens.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))


def free_joints(env) -> list[tuple[str, int, int]]:
    """(object name, qpos address, qvel address) of every movable object's free joint."""
    import mujoco

    m = env.raw.sim.model._model
    out = []
    for name, body in env.raw.obj_body_id.items():
        for j in range(m.body_jntadr[body], m.body_jntadr[body] + m.body_jntnum[body]):
            if m.jnt_type[j] == mujoco.mjtJoint.mjJNT_FREE:
                out.append((name, int(m.jnt_qposadr[j]), int(m.jnt_dofadr[j])))
    return out


def shift_objects(env, shift_m: float, rng: np.random.Generator) -> None:
    """Every movable object ``shift_m`` away on the table, each in its own random direction,
    at rest (what a start frame that places objects to within ``shift_m`` leaves open)."""
    import mujoco

    d, m = env.raw.sim.data._data, env.raw.sim.model._model
    for _, qpos, dof in free_joints(env):
        angle = rng.uniform(0.0, 2 * np.pi)
        d.qpos[qpos:qpos + 2] += shift_m * np.array([np.cos(angle), np.sin(angle)])
        d.qvel[dof:dof + 6] = 0.0
    mujoco.mj_forward(m, d)


def mm_per_pixel(env, image_size: int) -> float:
    """The main camera's footprint of a pixel at the movable objects (median, mm)."""
    from robosuite.utils.camera_utils import get_camera_transform_matrix, project_points_from_world_to_camera

    from wmrl.sim.env import MAIN_CAMERA

    cam = get_camera_transform_matrix(env.raw.sim, MAIN_CAMERA, image_size, image_size)
    d = env.raw.sim.data
    sizes = []
    for name, body in env.raw.obj_body_id.items():
        p = np.array(d.body_xpos[body])
        pts = np.stack([p, p + [0.01, 0, 0], p + [0, 0.01, 0]])
        px = project_points_from_world_to_camera(pts, cam, image_size, image_size).astype(float)
        # projected pixels are rounded: 1 cm steps in x and y, averaged
        per_cm = (np.linalg.norm(px[1] - px[0]) + np.linalg.norm(px[2] - px[0])) / 2
        if per_cm > 0:
            sizes.append(10.0 / per_cm)
    return float(np.median(sizes)) if sizes else float("nan")


def replay(job: tuple[str, list[int], list[float], int, int, int]) -> list[dict]:
    """Worker: the listed episodes of one file, each replayed once per (shift, draw)."""
    path, indices, shifts_mm, draws, grace, image_size = job
    from wmrl.gl import configure_renderer

    configure_renderer()
    from wmrl.config import SimConfig
    from wmrl.data.trajectory import open_trajectories, read_episode
    from wmrl.sim.env import NOOP_ACTION, SpatialEnv

    with open_trajectories(path) as f:
        episodes = [(i, read_episode(f["data"][f"demo_{i}"])) for i in indices]
    settings = json.loads(episodes[0][1].attrs["sim_settings"])
    settings.pop("versions", None)
    sim = SimConfig(**{**settings, "image_size": image_size})
    env = SpatialEnv(int(episodes[0][1].attrs["task_index"]), sim)
    rows = []
    try:
        for i, ep in episodes:
            a = ep.attrs
            if a["init_mode"] != "train":
                raise SystemExit(f"{path} episode {i}: init_mode {a['init_mode']!r}; this replays seeded placements "
                                 f"(make collect's episodes)")
            row = {"file": Path(path).name, "episode": i, "task": int(a["task_index"]), "seed": int(a["seed"]),
                   "policy_id": a["policy_id"], "success": bool(a["success"]), "steps": int(a["steps"]), "replays": {}}
            for shift in shifts_mm:
                outcomes = []
                for k in range(draws if shift > 0 else 1):
                    env.reset(seed=int(a["seed"]))
                    if shift == 0 and k == 0:  # the start the episode was recorded from
                        row["start_state_error"] = float(np.abs(env.raw.sim.get_state().flatten() - ep.states[0]).max())
                        if "mm_per_px" not in row:
                            row["mm_per_px"] = mm_per_pixel(env, image_size)
                    if shift > 0:
                        shift_objects(env, shift / 1000.0, np.random.default_rng([int(a["seed"]), i, int(shift * 100), k]))
                    for action in ep.actions:
                        env.step(action)
                        if env.success:
                            break
                    # a recording ends at its first success: a replay a step late would count as a
                    # failure, so it may hold still (gripper open) for up to GRACE steps more
                    while not env.success and env.steps < min(len(ep.actions) + grace, sim.max_steps):
                        env.step(NOOP_ACTION)
                    outcomes.append(bool(env.success))
                row["replays"][f"{shift:g}"] = outcomes
            rows.append(row)
    finally:
        env.close()
    return rows


def balanced_agreement(truth: list[bool], guess: list[bool]) -> float | None:
    """The replays' outcomes against the recorded ones, scored as ``make wm-eval`` scores agreement."""
    import torch

    from wmrl.worldmodel.reward import balanced_accuracy

    return balanced_accuracy(torch.tensor(guess), torch.tensor(truth))


def summarize(rows: list[dict], shifts_mm: list[float]) -> list[dict]:
    out = []
    for shift in shifts_mm:
        truth, guess = [], []
        for r in rows:
            for o in r["replays"][f"{shift:g}"]:
                truth.append(r["success"])
                guess.append(o)
        t, g = np.array(truth), np.array(guess)
        draws = max(len(r["replays"][f"{shift:g}"]) for r in rows)
        out.append({"shift_mm": shift, "replays": len(t), "flipped": float(np.mean(t != g)),
                    "successes_lost": float(np.mean(~g[t])) if t.any() else None,
                    "failures_turned_success": float(np.mean(g[~t])) if (~t).any() else None,
                    "agreement": balanced_agreement(truth, guess),
                    # each draw of directions alone: the spread of the figure above
                    "agreement_by_draw": [balanced_agreement([r["success"] for r in rows],
                                                             [r["replays"][f"{shift:g}"][k] for r in rows])
                                          for k in range(draws)]})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("inputs", nargs="+", help="trajectory files or folders (make collect's RUN/collect)")
    ap.add_argument("--shifts", default="0,1,2,4,8", help="object shifts in mm (0: the exact start)")
    ap.add_argument("--draws", type=int, default=2, help="random directions per nonzero shift")
    ap.add_argument("--grace", type=int, default=8, help="steps a replay may hold still after the recorded actions "
                                                             "(a recording stops at its first success)")
    ap.add_argument("--max-episodes", type=int, default=0, help="per file (0: all)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--image-size", type=int, default=128, help="the camera whose pixel size is reported")
    ap.add_argument("--out", help="JSON with every replay and the summary")
    args = ap.parse_args(argv)
    try:
        shifts = [float(s) for s in args.shifts.split(",")]
    except ValueError:
        ap.error(f"--shifts {args.shifts!r}: give millimetres separated by commas, e.g. 0,1,2,4")
    if 0.0 not in shifts or min(shifts) < 0:
        ap.error("--shifts must include 0 (the exact replay, the check) and no negative shift")

    from wmrl.data.parallel import map_files
    from wmrl.data.trajectory import count_episodes, find_trajectory_files

    files = find_trajectory_files(args.inputs)
    if not files:
        ap.error(f"no trajectory files in {args.inputs}")
    jobs = []
    for path in files:
        n = count_episodes(path)
        n = min(n, args.max_episodes) if args.max_episodes else n
        if n:
            jobs.append((str(path), list(range(n)), shifts, args.draws, args.grace, args.image_size))
    t0 = time.time()
    rows = [r for part in map_files(replay, jobs, args.workers) for r in part]
    summary = summarize(rows, shifts)
    exact = summary[[s["shift_mm"] for s in summary].index(0.0)]
    print(f"{len(rows)} episodes ({sum(r['success'] for r in rows)} successful), {time.time() - t0:.0f} s; "
          f"main camera {np.nanmedian([r['mm_per_px'] for r in rows]):.1f} mm a pixel at the objects "
          f"({args.image_size} px); start states reproduced to {max(r['start_state_error'] for r in rows):.1e}")
    print("shift (mm) | replays | outcome flipped | successes lost | failures turned success | agreement (each draw)")
    for s in summary:
        fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
        print(f"{s['shift_mm']:>10g} | {s['replays']:>7} | {s['flipped']:.3f} | {fmt(s['successes_lost'])} | "
              f"{fmt(s['failures_turned_success'])} | {fmt(s['agreement'])} "
              f"({' / '.join(fmt(a) for a in s['agreement_by_draw'])})")
    if exact["flipped"] > 0:
        print(f"note: {exact['flipped']:.1%} of the exact replays changed outcome: the replay itself is not exact "
              f"(physics loop or settle differ from the recording)")
    if args.out:  # atomically (temp file + rename), as the kit writes its JSON
        from wmrl.fileio import write_json

        write_json(args.out, {"command": " ".join(sys.argv), "summary": summary, "episodes": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
