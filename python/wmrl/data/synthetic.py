"""Synthetic episodes whose answer is known: a world model can learn them in minutes on a CPU.
Used by the tests and by bench/sf_toy_data.py (distillation checks on a CPU)."""

from __future__ import annotations

import numpy as np

from wmrl.data.trajectory import Trajectory, TrajectoryWriter


def moving_square_episode(rng, n_chunks: int, size: int = 64, chunk: int = 8, dense: bool = False) -> Trajectory:
    """A synthetic episode whose frames follow the actions: a bright square moves by the
    chunk's summed x/y actions (a world model can learn it), the wrist view mirrors it.
    Written through the kit's real HDF5 writer; the simulator is not needed for this."""
    steps = n_chunks * chunk
    actions = rng.uniform(-1, 1, (steps, 7)).astype(np.float32)
    pos = np.clip(np.cumsum(actions[:, :2], axis=0) * 1.5 + size / 2, 6, size - 7)
    pos = np.vstack([[size / 2, size / 2], pos])
    frame_steps = np.arange(0, steps + 1) if dense else np.arange(0, steps + 1, chunk)
    main = np.zeros((len(frame_steps), size, size, 3), np.uint8)
    main[..., 2] = 40
    for i, s in enumerate(frame_steps):
        x, y = pos[s].astype(int)
        main[i, y - 5:y + 5, x - 5:x + 5] = (230, 200, 30)
    proprio = np.zeros((len(frame_steps), 8), np.float32)
    proprio[:, :2] = pos[frame_steps] / size
    rewards = np.zeros(len(frame_steps), np.float32)
    rewards[-1] = 1.0
    return Trajectory(main=main, wrist=main[:, :, ::-1].copy(), proprio=proprio,
                      states=np.zeros((len(frame_steps), 4)), frame_step=frame_steps.astype(np.int32),
                      rewards=rewards, actions=actions,
                      attrs={"task_index": 0, "instruction": "move the square", "init_mode": "train", "init_index": -1,
                             "seed": 0, "success": True, "steps": steps, "policy_id": "synthetic", "chunk_size": chunk,
                             "image_size": size, "kit_version": "test", "sim_settings": "{}"})


def write_file(path, episodes: list[Trajectory]):
    """``episodes`` into one HDF5 file through the kit's writer; returns the finished file's path."""
    w = TrajectoryWriter(path)
    for e in episodes:
        w.append(e)
    return w.finalize()
