"""Fixtures of the GRPO tests: a tiny supervised run and a tiny model pair.

The pair is real in every file and hash but its models are untrained (random weights saved
with ``save_pretrained``): the GRPO machinery, not the world models' quality, is under test
here, and the pair is built in the policy environment without DeepSpeed."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from wmrl.config import get_profile
from wmrl.data.trajectory import TrajectoryWriter

from tests.helpers import synthetic_trajectory
from tests.policy.conftest import TASK0, tiny_job, write_demos

torch.set_num_threads(1)
TINY = get_profile("tiny")


@pytest.fixture(scope="session")
def sft_run(tmp_path_factory) -> Path:
    """A tiny run with supervised checkpoints at steps 5 and 10 (copy before changing it)."""
    from wmrl.policy import train

    run = tmp_path_factory.mktemp("grpo_run")
    write_demos(run / "demos" / "task_00.hdf5")
    train.main(tiny_job(run, run / "demos", steps=10, save_interval=5, full_interval=5, eval_interval=5))
    return run


def add_pair(run: Path, *, threshold: float = 0.5, episodes: int = 4, init_mode: str = "train",
             reward_views: tuple[str, ...] = ("main", "wrist"), action_dropout: float = 0.0,
             policy_id: str = "test", failures: tuple[int, ...] = (), val_ratio: float = 0.25) -> Path:
    """RUN/manifest.json over synthetic 64 px trajectories (recorded by ``policy_id``; those of
    ``failures`` failed, the others succeeded), untrained tiny world models and a reward model
    reading ``reward_views``, the update's selection, then the real ``package_pair``
    (``action_dropout`` > 0: world models with null actions, that action guidance can use)."""
    from wmrl.data.manifest import build_manifest
    from wmrl.layout import RunLayout
    from wmrl.release.pair import package_pair
    from wmrl.worldmodel.model import FrameWorldModel
    from wmrl.config import override
    from wmrl.worldmodel.reward import RewardModel

    layout = RunLayout(run)
    w = TrajectoryWriter(layout.collect / "task_00.hdf5", overwrite=True)
    for s in range(episodes):
        t = synthetic_trajectory(frames=5, size=64, seed=100 + s, instruction=TASK0, init_mode=init_mode,
                                 policy_id=policy_id, success=s not in failures)
        if s not in failures:
            t.rewards[-1] = 1.0  # the goal holds at the last frame
        w.append(t)
    w.finalize()
    build_manifest(layout.manifest, [str(layout.collect)], [], val_ratio=val_ratio, seed=0)
    sel = {}
    torch.manual_seed(0)
    for view in ("main", "wrist"):
        m = FrameWorldModel(override(TINY.wm.model(view), action_dropout=action_dropout))
        m.set_proprio_stats({"mean": torch.zeros(8), "std": torch.ones(8)})
        path = m.save_pretrained(layout.wm_view(view) / "global_step_1", meta={"step": 1})
        sel[view] = {"view": view, "step": 1, "reason": "target", "weights": str(path)}
    r = RewardModel(override(TINY.reward, views=reward_views))
    r.threshold.fill_(threshold)
    r.save_pretrained(layout.reward, meta={"threshold": threshold})
    layout.selection.parent.mkdir(parents=True, exist_ok=True)
    layout.selection.write_text(json.dumps(sel))
    return package_pair(run, keyframe_max_chunk=2, keyframes_per_task=4, overwrite=True).parent


@pytest.fixture(scope="session")
def pair_run(sft_run, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("pair_run") / "run"
    shutil.copytree(sft_run, run)
    add_pair(run)
    return run


@pytest.fixture
def run_with_pair(pair_run, tmp_path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(pair_run, dst)
    return dst


def tiny_grpo_job(run: Path, *, target: int, env: str = "wm", resume=None, **changes):
    from wmrl.config import override
    from wmrl.rl.grpo import GRPOJob

    sim = override(TINY.sim, max_steps=changes.pop("max_steps", 24))
    eval_first = changes.pop("eval_first", False)
    cfg = override(TINY.grpo, env=env, **changes)
    return GRPOJob(run=run, cfg=cfg, sim=sim, target=target, resume=resume, eval_tasks=(0,), eval_first=eval_first,
                   workers=1, envs_per_worker=1, device="cpu", profile="tiny", progress=False, tensorboard=False,
                   command="test")
