import shutil

import h5py

from wmrl.config import DemoConfig, SimConfig
from wmrl.data.trajectory import iter_episodes
from wmrl.data.validate import validate_file
from wmrl.sim.demos import collect_demos, reset_seed, task_file

SIM = SimConfig(image_size=64)


def test_demos_are_valid_successful_train_mode_episodes(tmp_path):
    cfg = DemoConfig(tasks=(0,), episodes=1, workers=1, seed=3)
    summary = collect_demos(cfg, SIM, tmp_path, progress=False)
    assert summary["incomplete"] == []
    path = task_file(tmp_path, 0)
    report = validate_file(path)
    assert report.ok, report.problems
    (ep,) = list(iter_episodes(path))
    assert ep.attrs["success"] and ep.attrs["init_mode"] == "train" and ep.attrs["init_index"] == -1
    assert ep.attrs["policy_id"] == "scripted-expert-v1"
    assert ep.attrs["seed"] == reset_seed(3, 0, ep.attrs["seed"] - reset_seed(3, 0, 0))
    assert ep.rewards[-1] == 1.0  # the goal holds at the last frame

    # A rerun of a finished task does nothing and keeps the file.
    before = path.read_bytes()
    again = collect_demos(cfg, SIM, tmp_path, progress=False)
    assert again["tasks"]["0"]["kept"] == 1 and path.read_bytes() == before

    # An interrupted larger run continues from its partial file without repeating an attempt.
    partial = path.with_name(path.name + ".partial")
    shutil.copy(path, partial)
    path.unlink()
    first_seed = ep.attrs["seed"]
    summary = collect_demos(DemoConfig(tasks=(0,), episodes=2, workers=1, seed=3), SIM, tmp_path, progress=False)
    assert summary["tasks"]["0"]["kept"] == 2
    seeds = [e.attrs["seed"] for e in iter_episodes(path)]
    assert seeds[0] == first_seed and len(set(seeds)) == 2
    with h5py.File(path) as f:
        assert len(f.attrs["done_attempts"]) >= 2

    # post_success_steps: the same episode recorded two chunks past its success, identical up to it
    post = collect_demos(DemoConfig(tasks=(0,), episodes=1, workers=1, seed=3, post_success_steps=16),
                         SIM, tmp_path / "post", progress=False)
    assert post["incomplete"] == []
    (longer,) = list(iter_episodes(task_file(tmp_path / "post", 0)))
    assert longer.attrs["seed"] == first_seed and longer.attrs["success"]
    assert 0 < longer.attrs["success_step"] <= ep.attrs["steps"] and longer.attrs["post_success_steps"] == 16
    assert longer.attrs["steps"] == min(ep.attrs["steps"] + 16, SIM.max_steps)
    n = len(ep.main)  # the first recording's frames (one per step) are the longer one's first frames
    assert (longer.main[:n] == ep.main[:n]).all() and len(longer.main) == n + longer.attrs["steps"] - ep.attrs["steps"]
    assert longer.rewards[n - 1] == 1.0


def test_a_noisy_expert_keeps_its_failures_when_asked(tmp_path):
    """keep_failures: every attempt is kept, failures too (data with mistakes in it before any
    policy exists); 16 steps are too few for the expert to succeed, so the one episode fails."""
    sim = SimConfig(image_size=64, max_steps=16)
    cfg = DemoConfig(tasks=(0,), episodes=1, workers=1, action_noise=0.5, keep_failures=True, frame_interval=0)
    summary = collect_demos(cfg, sim, tmp_path, progress=False)
    assert summary["incomplete"] == [] and summary["tasks"]["0"]["failures"] == 1
    path = task_file(tmp_path, 0)
    assert validate_file(path).ok
    (ep,) = list(iter_episodes(path))
    assert not ep.attrs["success"] and ep.attrs["steps"] == 16 and ep.attrs["policy_id"].endswith("+dart0.5")
    # without it, the same failure is not kept and the task stays incomplete
    again = collect_demos(DemoConfig(tasks=(0,), episodes=1, workers=1, max_attempts_factor=1, action_noise=0.5),
                          sim, tmp_path / "strict", progress=False)
    assert again["incomplete"] == [0]
