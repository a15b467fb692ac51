"""Check trajectory files against the schema in ``wmrl.data.trajectory``.

Every dataset is read in full, so a truncated or corrupted file is caught here rather than
in the middle of training. Problems are collected (not raised) so one run reports them all.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import numpy as np

from wmrl.data.trajectory import (
    CHECKSUMS,
    EPISODE_ATTRS,
    MAIN_KEY,
    PROPRIO_KEY,
    SCHEMA_VERSION,
    WRIST_KEY,
    TrajectoryError,
    open_trajectories,
)


PROPRIO_DIM = 8
ACTION_DIM = 7


@dataclass
class FileReport:
    path: str
    episodes: int = 0
    successes: int = 0
    frames: int = 0
    steps: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict:
        return {"path": self.path, "ok": self.ok, "episodes": self.episodes, "successes": self.successes,
                "frames": self.frames, "steps": self.steps, "problems": self.problems}


def _check_episode(name: str, g, problems: list[str], checksums: bool = False) -> tuple[int, int, bool]:
    def bad(msg: str) -> None:
        problems.append(f"{name}: {msg}")

    required = [f"obs/{MAIN_KEY}", f"obs/{WRIST_KEY}", f"obs/{PROPRIO_KEY}", "states", "frame_step", "rewards", "dones", "actions"]
    missing = [k for k in required if k not in g]
    if missing:
        bad(f"missing dataset(s) {', '.join(missing)}")
        return 0, 0, False
    for key, typ in EPISODE_ATTRS.items():
        if key not in g.attrs:
            bad(f"missing attribute {key!r}")
    if checksums:  # the file promises a checksum on every dataset
        unsealed = [k for k in required + ["action_labels"] if k in g and g[k].size and not g[k].fletcher32]
        if unsealed:
            bad(f"dataset(s) {', '.join(unsealed)} carry no checksum although the file says they do")
    try:
        arrays = {k: g[k][()] for k in required}
        if "action_labels" in g:
            g["action_labels"][()]  # read to check it
    except Exception as e:  # a failed checksum or decompression: the file is damaged
        bad(f"damaged data: a checksum or decompression failed ({type(e).__name__}: {e}); collect it again or "
            "restore the file from a copy")
        return 0, 0, False

    main, wrist, proprio = arrays[f"obs/{MAIN_KEY}"], arrays[f"obs/{WRIST_KEY}"], arrays[f"obs/{PROPRIO_KEY}"]
    fs, actions = arrays["frame_step"], arrays["actions"]
    frames = len(fs)
    if frames < 2:
        bad(f"needs at least 2 frames (initial observation + one chunk), has {frames}")
    for key, arr in (("obs/" + MAIN_KEY, main), ("obs/" + WRIST_KEY, wrist)):
        if arr.dtype != np.uint8 or arr.ndim != 4 or arr.shape[-1] != 3:
            bad(f"{key} must be uint8 (F, H, W, 3), got {arr.dtype} {arr.shape}")
        elif "image_size" in g.attrs and arr.shape[1:3] != (int(g.attrs["image_size"]),) * 2:
            bad(f"{key} is {arr.shape[1]}x{arr.shape[2]}, attribute image_size says {int(g.attrs['image_size'])}")
    if proprio.dtype != np.float32 or proprio.shape[1:] != (PROPRIO_DIM,):
        bad(f"obs/{PROPRIO_KEY} must be float32 (F, {PROPRIO_DIM}), got {proprio.dtype} {proprio.shape}")
    if actions.dtype != np.float32 or actions.ndim != 2 or actions.shape[1:] != (ACTION_DIM,):
        bad(f"actions must be float32 (T, {ACTION_DIM}), got {actions.dtype} {actions.shape}")
    if arrays["states"].ndim != 2:
        bad(f"states must be 2-D (F, S), got {arrays['states'].shape}")
    for key in (f"obs/{MAIN_KEY}", f"obs/{WRIST_KEY}", f"obs/{PROPRIO_KEY}", "states", "rewards", "dones"):
        if len(arrays[key]) != frames:
            bad(f"{key} has {len(arrays[key])} frames, frame_step has {frames}")
    for key in ("actions", f"obs/{PROPRIO_KEY}", "states", "rewards"):
        arr = arrays[key]
        if arr.dtype.kind == "f" and not np.all(np.isfinite(arr)):
            bad(f"{key} holds NaN or infinite values")
    if actions.size and np.isfinite(actions).all() and np.abs(actions).max() > 1.0 + 1e-6:
        bad(f"actions outside [-1, 1] (max |a| = {np.abs(actions).max():.3f})")
    if "action_labels" in g:
        labels = g["action_labels"][()]
        if labels.shape != actions.shape or labels.dtype != np.float32 or not np.all(np.isfinite(labels)):
            bad(f"action_labels must be finite float32 of the actions' shape {actions.shape}, got {labels.dtype} {labels.shape}")
    if frames:
        if fs[0] != 0 or np.any(np.diff(fs) <= 0):
            bad("frame_step must start at 0 and increase strictly")
        if len(actions) != fs[-1]:
            bad(f"actions has {len(actions)} steps but the last frame is at step {fs[-1]}")
        if "steps" in g.attrs and int(g.attrs["steps"]) != fs[-1]:
            bad(f"attribute steps={int(g.attrs['steps'])} but the last frame is at step {fs[-1]}")
        dones = arrays["dones"]
        if len(dones) == frames and (dones[-1] != 1 or dones[:-1].any()):
            bad("dones must be 1 at the last frame only")
    if not np.isin(arrays["rewards"], (0.0, 1.0)).all():
        bad("rewards must be 0 or 1 (goal holds at the frame)")
    mode = g.attrs.get("init_mode")
    if mode not in ("eval", "train"):
        bad(f"init_mode must be 'eval' or 'train', got {mode!r}")
    elif mode == "eval" and int(g.attrs.get("init_index", -1)) < 0:
        bad("init_mode='eval' needs init_index >= 0")
    if "sim_settings" in g.attrs:
        try:
            json.loads(g.attrs["sim_settings"])
        except (TypeError, ValueError):
            bad("sim_settings is not valid JSON")
    return frames, int(fs[-1]) if frames else 0, bool(g.attrs.get("success", False))


def validate_file(path: str | os.PathLike) -> FileReport:
    report = FileReport(path=str(path))
    try:
        f = open_trajectories(path)
    except TrajectoryError as e:
        report.problems.append(str(e))
        return report
    with f:
        if int(f.attrs.get("schema_version", -1)) != SCHEMA_VERSION:
            report.problems.append(f"schema_version {f.attrs.get('schema_version')} != {SCHEMA_VERSION}")
        if "data" not in f:
            report.problems.append("missing /data group")
            return report
        data = f["data"]
        n = int(data.attrs.get("num_episodes", -1))
        names = sorted((k for k in data.keys() if k.startswith("demo_")), key=lambda k: int(k.split("_")[1]))
        if n != len(names):
            report.problems.append(f"/data says num_episodes={n} but holds {len(names)} episode groups")
        for name in names:
            frames, steps, success = _check_episode(name, data[name], report.problems,
                                                    checksums=f.attrs.get("checksums") == CHECKSUMS)
            report.episodes += 1
            report.frames += frames
            report.steps += steps
            report.successes += int(success)
    return report
