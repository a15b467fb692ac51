"""The one HDF5 trajectory format every stage reads and writes.

Layout (robomimic/LIBERO-like, one group per episode)::

    /                     attrs: schema, schema_version, kit_version
    /data                 attrs: env, num_episodes
    /data/demo_0          attrs: see EPISODE_ATTRS
        obs/agentview_rgb    (F, H, W, 3) uint8   main camera, upright
        obs/eye_in_hand_rgb  (F, H, W, 3) uint8   wrist camera, upright
        obs/proprio          (F, 8)       float32 eef pos, eef axis-angle, gripper fingers
        states               (F, S)       float64 flattened MuJoCo state
        frame_step           (F,)         int32   policy step index of each frame
        rewards              (F,)         float32 1.0 where the goal holds at that frame
        dones                (F,)         uint8   1 at the last frame
        actions              (T, 7)       float32 every executed action, T = frame_step[-1]
        action_labels        (T, 7)       float32 optional: what the expert meant, where the
                                                  executed action was perturbed (DART demos)

Frame k is the observation after ``frame_step[k]`` policy steps, and the actions between
frame k and k+1 are ``actions[frame_step[k]:frame_step[k+1]]``. Rollouts record the chunk
boundaries only (images are rendered only there); demonstrations may record every step
(``DemoConfig.frame_interval``), and every chunk boundary is always among the frames. Main
camera, wrist camera, proprio and simulator state share a frame index.
Images are gzip-compressed and chunked one frame per HDF5 chunk, so reading one frame reads
one chunk.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from wmrl import __version__

SCHEMA = "wmrl-trajectories"
SCHEMA_VERSION = 1
MAIN_KEY = "agentview_rgb"
WRIST_KEY = "eye_in_hand_rgb"
PROPRIO_KEY = "proprio"

# Episode attributes: name -> type. Every writer sets all of them; the validator checks them.
EPISODE_ATTRS: dict[str, type] = {
    "task_index": int,
    "instruction": str,
    "init_mode": str,  # "eval": a fixed initial state; "train": a seeded random placement
    "init_index": int,  # fixed initial state index, -1 for mode=train
    "seed": int,  # reset seed (mode=train) and policy seed
    "success": bool,  # success-once
    "steps": int,  # policy steps executed
    "policy_id": str,
    "chunk_size": int,
    "image_size": int,
    "kit_version": str,
    "sim_settings": str,  # JSON: SimConfig fields and simulator versions
}
# Written when a writer sets them (recordings made by the simulator pool do)
OPTIONAL_EPISODE_ATTRS: dict[str, type] = {
    "success_step": int,  # the step at which the goal first held, -1 if never
    "post_success_steps": int,  # steps the recording was to go on after it (DemoConfig.post_success_steps)
}


class TrajectoryError(ValueError):
    """A trajectory file is unreadable or does not follow the schema."""


@dataclass
class Trajectory:
    main: np.ndarray  # (F, H, W, 3) uint8
    wrist: np.ndarray  # (F, H, W, 3) uint8
    proprio: np.ndarray  # (F, 8) float32
    states: np.ndarray  # (F, S) float64
    frame_step: np.ndarray  # (F,) int32
    rewards: np.ndarray  # (F,) float32
    actions: np.ndarray  # (T, 7) float32
    attrs: dict[str, Any] = field(default_factory=dict)
    action_labels: np.ndarray | None = None  # (T, 7): the expert's unperturbed actions, if perturbed

    @property
    def num_frames(self) -> int:
        return len(self.frame_step)

    @property
    def dones(self) -> np.ndarray:
        d = np.zeros(self.num_frames, dtype=np.uint8)
        d[-1] = 1
        return d

    def chunk_actions(self, k: int) -> np.ndarray:
        """Actions executed between frame k and frame k+1."""
        return self.actions[self.frame_step[k] : self.frame_step[k + 1]]


class TrajectoryRecorder:
    """Collects one episode frame by frame (used inside simulator workers)."""

    def __init__(self) -> None:
        self._frames: dict[str, list] = {k: [] for k in ("main", "wrist", "proprio", "states", "frame_step", "rewards")}
        self._actions: list[np.ndarray] = []
        self._labels: list[np.ndarray] = []

    def add_frame(self, *, main, wrist, proprio, state, step: int, goal_holds: bool) -> None:
        self._frames["main"].append(np.asarray(main, dtype=np.uint8))
        self._frames["wrist"].append(np.asarray(wrist, dtype=np.uint8))
        self._frames["proprio"].append(np.asarray(proprio, dtype=np.float32))
        self._frames["states"].append(np.asarray(state, dtype=np.float64))
        self._frames["frame_step"].append(int(step))
        self._frames["rewards"].append(1.0 if goal_holds else 0.0)

    def add_action(self, action, label=None) -> None:
        """An executed action; ``label``: the expert's own action when ``action`` was perturbed."""
        self._actions.append(np.asarray(action, dtype=np.float32).reshape(7))
        if label is not None:
            self._labels.append(np.asarray(label, dtype=np.float32).reshape(7))

    def finish(self, attrs: dict[str, Any]) -> Trajectory:
        f = self._frames
        return Trajectory(
            main=np.stack(f["main"]),
            wrist=np.stack(f["wrist"]),
            proprio=np.stack(f["proprio"]),
            states=np.stack(f["states"]),
            frame_step=np.asarray(f["frame_step"], dtype=np.int32),
            rewards=np.asarray(f["rewards"], dtype=np.float32),
            actions=np.stack(self._actions) if self._actions else np.zeros((0, 7), np.float32),
            attrs=dict(attrs),
            action_labels=np.stack(self._labels) if self._labels else None,
        )


# --------------------------------------------------------------------------------- writing
CHECKSUMS = "fletcher32"  # every non-empty dataset carries HDF5's Fletcher-32 checksum


def _write_episode(group, traj: Trajectory) -> None:
    h, w = traj.main.shape[1:3]

    def put(where, key: str, arr: np.ndarray, **opts) -> None:
        # fletcher32: HDF5 checks every chunk on read, so a flipped bit fails loudly (make validate)
        where.create_dataset(key, data=arr, **({"fletcher32": True} if arr.size else {}), **opts)

    img_opts = dict(chunks=(1, h, w, 3), compression="gzip", compression_opts=4, shuffle=False)
    obs = group.create_group("obs")
    put(obs, MAIN_KEY, traj.main, **img_opts)
    put(obs, WRIST_KEY, traj.wrist, **img_opts)
    put(obs, PROPRIO_KEY, traj.proprio.astype(np.float32))
    put(group, "states", traj.states.astype(np.float64), compression="gzip")
    put(group, "frame_step", traj.frame_step.astype(np.int32))
    put(group, "rewards", traj.rewards.astype(np.float32))
    put(group, "dones", np.asarray(traj.dones))
    put(group, "actions", traj.actions.astype(np.float32))
    if traj.action_labels is not None:
        put(group, "action_labels", traj.action_labels.astype(np.float32))
    for key, typ in EPISODE_ATTRS.items():
        if key not in traj.attrs:
            raise TrajectoryError(f"episode attribute {key!r} missing; every writer must set {sorted(EPISODE_ATTRS)}")
        value = traj.attrs[key]
        group.attrs[key] = json.dumps(value) if (typ is str and not isinstance(value, str)) else typ(value)
    for key, typ in OPTIONAL_EPISODE_ATTRS.items():
        if key in traj.attrs:
            group.attrs[key] = typ(traj.attrs[key])


class TrajectoryWriter:
    """Appends episodes to ``<path>.partial``; ``finalize()`` renames it to ``path``.

    A killed run leaves only the ``.partial`` file. Reopening with ``resume=True`` keeps the
    episodes it holds (each episode is flushed when appended), so a rerun continues. A
    partial file that cannot be opened (killed mid-write) is moved aside, never trusted.
    """

    def __init__(self, path: str | os.PathLike, *, overwrite: bool = False, resume: bool = True):
        import h5py

        self.path = Path(path)
        self.partial = self.path.with_name(self.path.name + ".partial")
        if self.path.exists() and not overwrite:
            raise FileExistsError(f"{self.path} exists; pass --overwrite to replace it (or choose another OUT)")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.partial.exists() and resume:
            try:
                self._file = h5py.File(self.partial, "a")
                self._file["data"]  # noqa: B018  (raises if the group is missing)
            except Exception:
                broken = self.partial.with_name(self.partial.name + ".broken")
                os.replace(self.partial, broken)
                print(f"[wmrl] {self.partial} was unreadable (killed mid-write?); moved to {broken}, starting over")
                self._file = self._new_file()
        else:
            if self.partial.exists():
                self.partial.unlink()
            self._file = self._new_file()

    def _new_file(self):
        import h5py

        f = h5py.File(self.partial, "w")
        f.attrs["schema"] = SCHEMA
        f.attrs["schema_version"] = SCHEMA_VERSION
        f.attrs["kit_version"] = __version__
        f.attrs["checksums"] = CHECKSUMS
        data = f.create_group("data")
        data.attrs["env"] = "libero_spatial"
        data.attrs["num_episodes"] = 0
        return f

    @property
    def num_episodes(self) -> int:
        return int(self._file["data"].attrs["num_episodes"])

    def episodes_attrs(self) -> list[dict[str, Any]]:
        data = self._file["data"]
        return [dict(data[f"demo_{i}"].attrs) for i in range(self.num_episodes)]

    def set_file_attr(self, key: str, value: Any) -> None:
        self._file.attrs[key] = value

    def get_file_attr(self, key: str, default: Any = None) -> Any:
        return self._file.attrs.get(key, default)

    def append(self, traj: Trajectory) -> int:
        data = self._file["data"]
        index = self.num_episodes
        name = f"demo_{index}"
        if name in data:  # left over from a write that was interrupted before the count moved
            del data[name]
        _write_episode(data.create_group(name), traj)
        data.attrs["num_episodes"] = index + 1
        self._file.flush()
        return index

    def finalize(self) -> Path:
        self._file.close()
        os.replace(self.partial, self.path)
        return self.path

    def close(self) -> None:
        """Close without finalizing (the partial file stays for a later resume)."""
        if self._file.id.valid:
            self._file.close()


# --------------------------------------------------------------------------------- reading
def open_trajectories(path: str | os.PathLike):
    """Open a trajectory file read-only, with a clear error for anything unreadable."""
    import h5py

    path = Path(path)
    if not path.exists():
        raise TrajectoryError(f"{path}: no such file")
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise TrajectoryError(f"{path}: not a readable HDF5 file ({e}); it may be truncated - regenerate it") from None
    if f.attrs.get("schema") != SCHEMA:
        f.close()
        raise TrajectoryError(f"{path}: not a {SCHEMA} file (schema attribute missing or different)")
    return f


def _read_attrs(group) -> dict[str, Any]:
    return {k: (v.item() if hasattr(v, "item") else v) for k, v in group.attrs.items()}


def read_episode(group) -> Trajectory:
    obs = group["obs"]
    return Trajectory(
        main=obs[MAIN_KEY][()],
        wrist=obs[WRIST_KEY][()],
        proprio=obs[PROPRIO_KEY][()],
        states=group["states"][()],
        frame_step=group["frame_step"][()],
        rewards=group["rewards"][()],
        actions=group["actions"][()],
        attrs=_read_attrs(group),
        action_labels=group["action_labels"][()] if "action_labels" in group else None,
    )


def iter_episodes(path: str | os.PathLike) -> Iterator[Trajectory]:
    with open_trajectories(path) as f:
        data = f["data"]
        for i in range(int(data.attrs["num_episodes"])):
            yield read_episode(data[f"demo_{i}"])


def find_trajectory_files(inputs: str | os.PathLike | list | tuple) -> list[Path]:
    """Files as given; a folder gives the ``*.hdf5`` inside it (below it too), never the
    ``.partial`` files of a run still in progress."""
    items = inputs if isinstance(inputs, (list, tuple)) else [inputs]
    files: list[Path] = []
    for item in items:
        p = Path(item)
        if p.is_dir():
            found = sorted(p.rglob("*.hdf5"))
            if not found:
                raise TrajectoryError(f"{p}: no .hdf5 trajectory files in this folder (make demos writes task_XX.hdf5)")
            files.extend(found)
        elif p.exists():
            files.append(p)
        else:
            raise TrajectoryError(f"{p}: no such file or folder; give DATA=<a .hdf5 file or a folder of them> (make demos writes task_XX.hdf5)")
    return list(dict.fromkeys(files))


def count_episodes(path: str | os.PathLike) -> int:
    with open_trajectories(path) as f:
        return int(f["data"].attrs["num_episodes"])
