"""Supervised training: the loss falls, resuming is exact, checkpoints and logs are complete."""

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from wmrl.policy import checkpoint as ck
from wmrl.policy import train
from wmrl.policy.data import DemoData, EpochSampler, chunk_targets, read_episodes, split_episodes

from tests.policy.conftest import TASK0, snapshot, tiny_job, write_demos


def test_tiny_loss_falls_over_30_steps(tmp_path, demo_dir):
    out = train.main(tiny_job(tmp_path / "run", demo_dir, steps=30, log_interval=1, eval_interval=30))
    assert out["trained_steps"] == 30
    recs = [json.loads(line) for line in (tmp_path / "run" / "logs" / "sft.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in recs if "loss" in r]
    assert len(losses) == 30 and all(np.isfinite(losses))
    first, last = np.mean(losses[:5]), np.mean(losses[-5:])
    assert last < 0.8 * first, (first, last)
    assert any("val_loss" in r for r in recs) and all(r["samples_per_s"] > 0 for r in recs if "loss" in r)


def test_targets_are_the_chunk_after_each_frame_padded_at_the_end():
    actions = np.arange(20 * 7, dtype=np.float32).reshape(20, 7)
    frame_step = np.array([0, 8, 16, 20])
    frames, targets, masks = chunk_targets(actions, frame_step, 8)
    assert list(frames) == [0, 1, 2]  # the last frame has no action after it
    assert np.array_equal(targets[1], actions[8:16])
    assert np.array_equal(targets[2, :4], actions[16:20]) and np.array_equal(targets[2, 4:], np.repeat(actions[19:], 4, 0))
    assert masks[2].tolist() == [1, 1, 1, 1, 0, 0, 0, 0] and masks[0].all()


def test_split_is_by_episode_and_per_task():
    eps = [{"task": t} for t in (0, 0, 0, 0, 1, 1, 2)]
    tr, va = split_episodes(eps, 0.25, seed=0)
    assert sorted(tr + va) == list(range(7)) and not set(tr) & set(va)
    assert len([i for i in va if eps[i]["task"] == 0]) == 1 and len([i for i in va if eps[i]["task"] == 1]) == 1
    assert not [i for i in va if eps[i]["task"] == 2]  # a task with one episode keeps it for training
    assert split_episodes(eps, 0.25, seed=0) == (tr, va)


def test_data_in_memory_and_sampler_resumes(demo_dir):
    data = DemoData(read_episodes([demo_dir / "task_00.hdf5"]), chunk=8, val_ratio=0.5, seed=0)
    assert data.main.dtype == torch.uint8 and data.image_size == 64
    assert len(data.train.episodes) == 1 and len(data.val.episodes) == 1
    assert data.train.size == 5 and data.instructions == [TASK0]
    a = EpochSampler(data.train.size, seed=0)
    first = a.next(3)
    state = a.state_dict()
    rest = torch.cat([a.next(4) for _ in range(3)])
    b = EpochSampler(data.train.size, seed=0)
    b.load_state_dict(state)
    assert torch.equal(rest, torch.cat([b.next(4) for _ in range(3)]))
    assert sorted(torch.cat([first, rest[:2]]).tolist()) == list(range(5))  # an epoch is a permutation


def test_resume_gives_identical_parameters(tmp_path, demo_dir):
    straight, split = tmp_path / "straight", tmp_path / "split"
    train.main(tiny_job(straight, demo_dir, steps=4, save_interval=2, full_interval=2, eval_interval=2))
    out = train.main(tiny_job(split, demo_dir, steps=4, save_interval=4, full_interval=4, eval_interval=2,
                              stop_after=2))
    assert out["step"] == 2 and ck.list_checkpoints(split, "sft")[-1].full
    out = train.main(tiny_job(split, demo_dir, steps=4, save_interval=4, full_interval=4, eval_interval=2))
    assert out["trained_steps"] == 2
    a = load_file(str(ck.step_dir(straight, 4, "sft") / ck.MODEL_FILE))
    b = load_file(str(ck.step_dir(split, 4, "sft") / ck.MODEL_FILE))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # EMA weights
    sa = torch.load(ck.step_dir(straight, 4, "sft") / ck.STATE_FILE, weights_only=True)
    sb = torch.load(ck.step_dir(split, 4, "sft") / ck.STATE_FILE, weights_only=True)
    assert all(torch.equal(sa["model"][k], sb["model"][k]) for k in sa["model"])  # raw weights
    assert sa["sampler"] == sb["sampler"] and torch.equal(sa["rng"]["torch"], sb["rng"]["torch"])
    exp_a = [s["exp_avg"] for s in sa["optimizer"]["state"].values()]
    exp_b = [s["exp_avg"] for s in sb["optimizer"]["state"].values()]
    assert all(torch.equal(x, y) for x, y in zip(exp_a, exp_b))
    # the log holds each step once
    steps = [json.loads(line)["step"] for line in (split / "logs" / "sft.jsonl").read_text().splitlines()
             if "loss" in json.loads(line)]
    assert steps == sorted(set(steps))
    # rerunning a finished run does nothing
    assert train.main(tiny_job(split, demo_dir, steps=4))["trained_steps"] == 0


def test_checkpoint_layout_and_latest_policy(trained_run):
    cks = ck.list_checkpoints(trained_run, "sft")
    assert [(c.step, c.full) for c in cks] == [(5, True), (10, True)]
    d = ck.step_dir(trained_run, 10, "sft")
    names = {p.name for p in d.iterdir()}
    assert names == {"model.safetensors", "config.json", "norm_stats.json", "language_cache.safetensors", "train_state.pt"}
    meta = json.loads((d / "config.json").read_text())
    assert meta["kind"] == "full" and meta["step"] == 10 and meta["image_size"] == 64
    assert meta["policy"]["chunk_size"] == 8 and meta["policy"]["noise_level"] == 0.5
    assert TASK0 in meta["instructions"] and set(meta["files"]) == names - {"config.json"}
    assert meta["data"]["files"][0]["sha256"] and meta["ema"] is True
    norm = json.loads((d / "norm_stats.json").read_text())
    assert norm["actions"]["center"][-1] == 0.0 and norm["actions"]["scale"][-1] == 1.0  # gripper untouched
    latest = json.loads((trained_run / "latest_policy.json").read_text())
    assert latest["step"] == 10 and latest["latest_full"]["step"] == 10 and latest["resume_command"] == "test"
    assert not list(ck.policy_dir(trained_run, "sft").glob(".*"))  # no temporary folders left
    loaded = ck.load_checkpoint(d, verify_hashes=True)
    assert loaded.build_model().num_parameters == meta["parameters"]
    assert (trained_run / "logs" / "sft_loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # the loss curve


def test_weights_only_checkpoint_is_refused_for_resume(run_copy, demo_dir):
    for c in ck.list_checkpoints(run_copy, "sft"):
        (c.path / ck.STATE_FILE).unlink()
    before = snapshot(run_copy)
    with pytest.raises(ck.CheckpointError, match="weights-only"):
        train.main(tiny_job(run_copy, demo_dir, steps=20))
    with pytest.raises(ck.CheckpointError, match="weights-only"):
        train.main(tiny_job(run_copy, demo_dir, steps=20, resume="10"))
    assert snapshot(run_copy) == before
    # ... but it initialises a new run
    out = train.main(tiny_job(run_copy.parent / "new", demo_dir, steps=2, init=str(ck.step_dir(run_copy, 10, "sft"))))
    assert out["trained_steps"] == 2


def test_resume_uses_newest_full_checkpoint(run_copy, demo_dir):
    (ck.step_dir(run_copy, 10, "sft") / ck.STATE_FILE).unlink()  # newest is weights-only now
    assert train.find_resume(tiny_job(run_copy, demo_dir, steps=20)).step == 5


def test_corrupt_weights_are_refused_and_nothing_is_written(run_copy, demo_dir):
    f = ck.step_dir(run_copy, 10, "sft") / ck.MODEL_FILE
    f.write_bytes(f.read_bytes()[: len(f.read_bytes()) // 2])
    before = snapshot(run_copy)
    with pytest.raises(ck.CheckpointError, match="corrupt or truncated"):
        train.main(tiny_job(run_copy, demo_dir, steps=20))
    with pytest.raises(ck.CheckpointError, match="corrupt or truncated"):
        ck.load_checkpoint(ck.step_dir(run_copy, 10, "sft"))
    assert snapshot(run_copy) == before


def test_checkpoint_of_another_config_is_refused(run_copy, demo_dir):
    from wmrl.config import get_profile, override

    wider = override(get_profile("tiny").policy, width=64)
    before = snapshot(run_copy)
    with pytest.raises(ck.CheckpointError, match="another policy configuration: width=32"):
        train.main(tiny_job(run_copy, demo_dir, steps=20, policy=wider))
    # a config.json that does not match its weights: the shapes tell
    cfg = ck.step_dir(run_copy, 5, "sft") / ck.CONFIG_FILE
    meta = json.loads(cfg.read_text())
    meta["policy"]["width"] = 64
    cfg.write_text(json.dumps(meta))
    with pytest.raises(ck.CheckpointError, match="has shape .* needs"):
        ck.load_checkpoint(cfg.parent)
    assert snapshot(run_copy) == {**before, str(cfg.relative_to(run_copy)): cfg.read_bytes()}


def test_mismatched_norm_stats_are_refused(run_copy, demo_dir):
    f = ck.step_dir(run_copy, 10, "sft") / ck.NORM_FILE
    stats = json.loads(f.read_text())
    stats["actions"]["center"] = stats["actions"]["center"][:6]
    f.write_text(json.dumps(stats))
    before = snapshot(run_copy)
    with pytest.raises(ck.CheckpointError, match="action center has 6 values, the policy has 7"):
        train.main(tiny_job(run_copy, demo_dir, steps=20))
    assert snapshot(run_copy) == before


def test_other_image_size_data_is_refused_on_resume(run_copy, tmp_path):
    write_demos(tmp_path / "d32" / "task_00.hdf5", size=32)
    before = snapshot(run_copy)
    with pytest.raises(ck.CheckpointError, match="64 px images, the data has 32 px"):
        train.main(tiny_job(run_copy, tmp_path / "d32", steps=20, allow_new_data=True))
    assert snapshot(run_copy) == before


def test_resume_on_changed_data_is_refused_unless_allowed(run_copy, demo_dir, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(demo_dir, other)
    f = sorted(other.glob("*.hdf5"))[0]
    write_demos(f, episodes=3)  # the same file name, other content
    before = snapshot(run_copy)
    with pytest.raises(ck.CheckpointError, match=rf"resume on other data: {f} changed since .*--allow-new-data"):
        train.main(tiny_job(run_copy, other, steps=12))
    assert snapshot(run_copy) == before
    assert train.main(tiny_job(run_copy, other, steps=12, allow_new_data=True))["trained_steps"] == 2


def test_entry_script_validates_before_importing_torch(root, tmp_path, demo_dir):
    code = ("import sys; sys.path.insert(0, 'python'); import sft\n"
            "try:\n    sft.build(['--profile', 'tiny', '--lr', '5'])\nexcept Exception as e:\n    print(type(e).__name__, e)\n"
            "print('torch imported:', 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=60).stdout
    assert "ConfigError sft.lr=5.0" in out and "torch imported: False" in out
    res = subprocess.run([sys.executable, "python/sft.py", "--profile", "tiny", "--run", str(tmp_path / "r"),
                          "--data", str(demo_dir), "--dry-run"], cwd=root, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout.split("\n", 1)[1])
    assert plan["episodes"] == 2 and plan["start"] == "fresh" and plan["steps"] == 30
    assert not (tmp_path / "r").exists()
    res = subprocess.run([sys.executable, "python/sft.py", "--run", str(tmp_path / "r"), "--data", str(tmp_path / "nope")],
                         cwd=root, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and res.stderr.startswith("error: ") and "make demos" in res.stderr


def test_dart_demonstrations_train_on_the_expert_labels_not_the_executed_actions(tmp_path):
    from wmrl.data.trajectory import TrajectoryWriter

    from tests.policy.conftest import learnable_trajectory

    traj = learnable_trajectory(0)
    traj.action_labels = traj.actions.copy()
    traj.actions = np.clip(traj.actions + 0.2, -1, 1)  # what was executed
    w = TrajectoryWriter(tmp_path / "dart.hdf5")
    w.append(traj)
    ep = read_episodes([w.finalize()], workers=1)[0]
    np.testing.assert_array_equal(ep["actions"], traj.action_labels)
