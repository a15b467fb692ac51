"""Fixtures: one tiny two-source bundle per session (ALOHA + converted LIBERO trajectories)
and one tiny Stage 0 -> 1 -> 2 -> 3 chain on it.

Single-threaded, as the policy and RL tests: on the test machine's two shared cores the tiny
models' small matrix products are many times slower with two threads than with one."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[3]
os.environ.setdefault("TQDM_DISABLE", "1")
torch.set_num_threads(1)
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # for the fresh processes tests start
CONFIGS = {0: "stage0_bidir.toml", 1: "stage1_tf.toml", 2: "stage2_tfdcm.toml", 3: "stage3_sfdmd.toml"}

# Short ALOHA episodes (160 control steps, a frame every 16): the full planners need 400.
TEST_BUNDLE = dict(episodes_per_task=2, fail_fraction=0.5, image_size=32, frame_stride=16, max_steps=160,
                   window=4, window_stride=2, val_fraction=0.25, libero_episodes=3)


@pytest.fixture(scope="session")
def libero_file(tmp_path_factory) -> Path:
    sys.path.insert(0, str(ROOT))
    from wmrl.data.trajectory import TrajectoryWriter

    from tests.helpers import synthetic_trajectory

    path = tmp_path_factory.mktemp("libero") / "task_00.hdf5"
    w = TrajectoryWriter(path)
    for s in range(3):
        t = synthetic_trajectory(frames=6, chunk=8, size=32, seed=s, instruction="pick up the black bowl and place it on the plate")
        t.proprio[:, 6], t.proprio[:, 7] = 0.03, -0.03  # finger joints: 6 cm apart
        w.append(t)
    w.finalize()
    return path


def in_subprocess(code: str, timeout: int = 300) -> str:
    """Run Python code in a fresh process. Rendering (OSMesa's LLVM) and Triton (loaded when
    torch builds an optimizer) crash in one process, so simulator work never runs in pytest's."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "python"), str(ROOT)]))
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


@pytest.fixture(scope="session")
def bundle_dir(tmp_path_factory, libero_file) -> Path:
    out = tmp_path_factory.mktemp("bundles") / "tiny"
    in_subprocess(
        "from wmrl.bimanual.build import build_bundle\n"
        "from wmrl.config import BundleConfig\n"
        f"build_bundle(BundleConfig(**{TEST_BUNDLE!r}), {str(out)!r}, libero={str(libero_file)!r}, progress=False)\n"
    )
    return out


@pytest.fixture
def bundle_copy(bundle_dir, tmp_path) -> Path:
    dst = tmp_path / "bundle"
    shutil.copytree(bundle_dir, dst)
    return dst


def config_maker(bundle_dir, output_root):
    """Load a kit TOML at tiny scale with the given bundle and output root."""
    from wmrl.bimanual.config import load_stage_config

    def make(stage: int = 0, *overrides: str):
        over = [f"data.bundle={bundle_dir}", f"job.output_root={output_root}", *overrides]
        if stage > 0 and not any(o.startswith("checkpoint.load_path=") for o in over):
            over.append("checkpoint.load_path=/nonexistent")
        if stage == 3 and not any(o.startswith("checkpoint.reference=") for o in over):
            over.append("checkpoint.reference=/nonexistent")
        return load_stage_config(ROOT / "data" / "configs" / CONFIGS[stage], profile="tiny", overrides=over)

    return make


@pytest.fixture
def stage_cfg(bundle_dir, tmp_path):
    return config_maker(bundle_dir, tmp_path / "runs")


@pytest.fixture(scope="session")
def chain(bundle_dir, tmp_path_factory):
    """Finished tiny runs of all four stages, each from the previous one's exact root (Stage 3's
    reference: Stage 0's). Tests read these roots; runs of their own go to their tmp_path."""
    from wmrl.bimanual.train import train

    make = config_maker(bundle_dir, tmp_path_factory.mktemp("chain"))
    roots = {}
    roots[0] = Path(train(make(0, "job.name=c0", "trainer.max_iter=4", "checkpoint.save_iter=4"), progress=False)["checkpoint"])
    roots[1] = Path(train(make(1, "job.name=c1", "trainer.max_iter=4", "checkpoint.save_iter=4",
                               f"checkpoint.load_path={roots[0]}"), progress=False)["checkpoint"])
    roots[2] = Path(train(make(2, "job.name=c2", "trainer.max_iter=4", "checkpoint.save_iter=4",
                               f"checkpoint.load_path={roots[1]}"), progress=False)["checkpoint"])
    cfg3 = make(3, "job.name=c3", "trainer.log_iter=1", f"checkpoint.load_path={roots[2]}", f"checkpoint.reference={roots[0]}")
    s3 = train(cfg3, progress=False)
    roots[3] = Path(s3["checkpoint"])
    return {"roots": roots, "cfg3": cfg3, "summary3": s3, "make": make}
