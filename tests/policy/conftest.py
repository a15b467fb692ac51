"""Fixtures of the policy tests: a small demonstration file and a tiny trained run.

Everything is tiny (64 px, the ``tiny`` profile) and single-threaded: the test machine's two
cores are shared with simulations, and one thread is both faster and steadier there."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers import synthetic_trajectory
from wmrl.config import get_profile, override
from wmrl.data.trajectory import TrajectoryWriter

torch.set_num_threads(1)

TASK0 = json.loads((Path(__file__).resolve().parents[2] / "data" / "libero_spatial_tasks.json").read_text())["tasks"][0]["instruction"]


def learnable_trajectory(seed: int, frames: int = 6, size: int = 64):
    """A schema-valid episode whose actions follow the proprio and a smooth phase, so a
    policy can learn them (the helper's uniform-random actions carry no signal)."""
    traj = synthetic_trajectory(frames=frames, size=size, seed=seed, instruction=TASK0)
    steps = len(traj.actions)
    phase = 0.3 * seed
    t = np.arange(steps, dtype=np.float32)
    acts = np.stack([0.5 * np.sin(0.2 * t + phase), 0.5 * np.cos(0.2 * t + phase), 0.3 * np.sin(0.1 * t),
                     0.05 * np.ones_like(t), -0.05 * np.ones_like(t), 0.1 * np.cos(0.3 * t),
                     np.where(t < steps / 2, -1.0, 1.0)], axis=1).astype(np.float32)
    traj.actions = acts
    traj.proprio[:, :7] = acts[np.minimum(traj.frame_step, steps - 1)]
    return traj


def write_demos(path: Path, episodes: int = 2, **kw) -> Path:
    w = TrajectoryWriter(path, overwrite=True)
    for s in range(episodes):
        w.append(learnable_trajectory(s, **kw))
    return w.finalize()


@pytest.fixture(scope="session")
def demo_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("demos")
    write_demos(d / "task_00.hdf5")
    return d


def tiny_job(run: Path, data, **sft_changes):
    from wmrl.policy.train import SFTJob

    prof = get_profile("tiny")
    stop_after = sft_changes.pop("stop_after", None)
    resume = sft_changes.pop("resume", "auto")
    init = sft_changes.pop("init", None)
    allow_new_data = sft_changes.pop("allow_new_data", False)
    policy = sft_changes.pop("policy", prof.policy)
    return SFTJob(run=Path(run), data=[str(data)], policy=policy, sft=override(prof.sft, **sft_changes),
                  profile="tiny", progress=False, tensorboard=False, stop_after=stop_after, resume=resume,
                  init=init, command="test", allow_new_data=allow_new_data)


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory, demo_dir) -> Path:
    """A tiny run with full checkpoints at steps 5 and 10 (copy it before changing it)."""
    from wmrl.policy import train

    run = tmp_path_factory.mktemp("run")
    train.main(tiny_job(run, demo_dir, steps=10, save_interval=5, full_interval=5, eval_interval=5))
    return run


@pytest.fixture
def run_copy(trained_run, tmp_path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(trained_run, dst)
    return dst


def snapshot(folder: Path) -> dict:
    """path -> bytes of every file under ``folder`` (to show nothing was written)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
