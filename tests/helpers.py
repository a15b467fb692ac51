"""Small builders shared by tests (schema-valid trajectories without running the simulator)."""

import json
import os
from pathlib import Path

import numpy as np

from wmrl.data.trajectory import Trajectory


def synthetic_trajectory(frames: int = 4, chunk: int = 8, size: int = 16, seed: int = 0, **attrs) -> Trajectory:
    rng = np.random.default_rng(seed)
    steps = (frames - 1) * chunk
    base = {"task_index": 0, "instruction": "pick up the black bowl", "init_mode": "train", "init_index": -1,
            "seed": seed, "success": True, "steps": steps, "policy_id": "test", "chunk_size": chunk,
            "image_size": size, "kit_version": "0.0.0", "sim_settings": json.dumps({"image_size": size})}
    base.update(attrs)
    return Trajectory(
        main=rng.integers(0, 255, (frames, size, size, 3), dtype=np.uint8),
        wrist=rng.integers(0, 255, (frames, size, size, 3), dtype=np.uint8),
        proprio=rng.normal(size=(frames, 8)).astype(np.float32),
        states=rng.normal(size=(frames, 12)),
        frame_step=np.arange(frames, dtype=np.int32) * chunk,
        rewards=np.zeros(frames, np.float32),
        actions=rng.uniform(-1, 1, (steps, 7)).astype(np.float32),
        attrs=base,
    )


def child_env(**extra) -> dict:
    """The environment for a kit script run as a child of this pytest: on the CPU, the kit on
    the path, and none of the process-group variables an in-process group of this pytest set
    (its port is still held: a child that inherits it fails with EADDRINUSE)."""
    env = dict(os.environ, DS_ACCELERATOR="cpu", CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=str(Path(__file__).resolve().parents[1] / "python"), **extra)
    for k in ("MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE"):
        env.pop(k, None)
    return env


def load_script(rel_path: str):
    """A script of the repository (``bench/x.py``) as a module, for tests of its functions."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / rel_path
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
