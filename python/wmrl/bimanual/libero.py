"""Converter: the kit's LIBERO HDF5 trajectories (one Panda arm) -> contract episodes.

One contract transition is one chunk (usually 8 policy steps at 20 Hz): files that render
only at chunk boundaries map frame k -> k+1 directly; files with a frame every step are
thinned to the chunk boundaries first. The arm is written into the
*left* arm's slots; the right arm, the shared two-arm slots and the joint slots are masked.
Domain ``libero_panda`` (its own domain ID): its world frame is robosuite's.

Semantics that differ from ALOHA are declared here and recorded in the bundle (source
settings): LIBERO's OSC_POSE commands are *relative* goal offsets, so ``eef_pos`` and
``eef_rot6d`` hold the pose measured at the end of the chunk (the controller settles within
about 1 cm of its goal), and the deltas are end minus start. The gripper command (-1 open,
+1 close) becomes a commanded width of 0.08 m (open) or 0 m (closed) from the chunk's last
command; the measured width is the separation of the two finger joints.
"""

from __future__ import annotations

import numpy as np

from wmrl.bimanual import contract
from wmrl.bimanual.bundle import Episode

CONTROL_HZ = 20  # robosuite's control frequency for LIBERO
OPEN_WIDTH = 0.08  # Panda fingers fully open, m
SEMANTICS = {
    "eef_pos": "measured at the end of the chunk (OSC_POSE commands are relative offsets)",
    "gripper_width": "0.08 m if the chunk's last gripper command opens (-1), else 0 m",
    "masked": "right arm, joint_pos, rel_pos, rel_rot6d, eef_distance",
}


def _resize(frames: np.ndarray, size: int) -> np.ndarray:
    if frames.shape[1] == size and frames.shape[2] == size:
        return frames
    from PIL import Image

    return np.stack([np.asarray(Image.fromarray(f).resize((size, size), Image.BILINEAR)) for f in frames])


def chunk_frames(frame_step: np.ndarray, chunk: int) -> np.ndarray:
    """Indices of the frames at chunk boundaries (and the last frame). Files that record a
    frame every step are thinned to one frame per chunk, so a transition always spans a
    chunk, as in files that record only at chunk boundaries."""
    keep = np.flatnonzero(frame_step % max(chunk, 1) == 0)
    if keep.size == 0 or keep[-1] != len(frame_step) - 1:
        keep = np.append(keep, len(frame_step) - 1)
    return keep


def convert(traj, image_size: int) -> Episode:
    """One ``wmrl.data.trajectory.Trajectory`` -> one contract episode (main camera)."""
    keep = chunk_frames(np.asarray(traj.frame_step), int(traj.attrs.get("chunk_size", 8) or 8))
    fs = np.asarray(traj.frame_step)[keep]
    prop = traj.proprio.astype(np.float64)[keep]
    n = len(keep) - 1
    if n < 1:
        raise ValueError("trajectory has fewer than two frames; nothing to convert")
    pos, rot = prop[:, :3], contract.rotvec_to_matrix(prop[:, 3:6])
    width = prop[:, 6] - prop[:, 7]
    last_grip = traj.actions[fs[1:] - 1, 6]  # the last gripper command of each transition
    steps = np.diff(fs).astype(np.float64)
    row = contract.ActionRow(n)
    contract.arm_fields(
        row, "left",
        target_pos=pos[1:], target_rot=rot[1:], target_width=np.where(last_grip < 0, OPEN_WIDTH, 0.0),
        start_pos=pos[:-1], start_rot=rot[:-1], start_width=width[:-1],
    )
    row.set("duration", steps / CONTROL_HZ)
    a = traj.attrs
    return Episode(
        frames=_resize(traj.main[keep], image_size), actions=row.values, mask=row.mask,
        caption=str(a.get("instruction", "")), success=bool(a.get("success", False)),
        meta={"task_index": int(a.get("task_index", -1)), "seed": int(a.get("seed", -1)),
              "init_mode": str(a.get("init_mode", "")), "policy_id": str(a.get("policy_id", "")),
              "camera": "agentview", "chunk_size": int(a.get("chunk_size", 0))},
    )
