"""`make eval CKPT=N`: a tiny checkpoint through the real harness, the evidence it leaves,
and the runner that the harness calls."""

import json
import subprocess

import numpy as np
import pytest
from wmrl.config import ConfigError
from wmrl.policy import checkpoint as ck
from wmrl.sim.env import Observation

from tests.policy.conftest import TASK0


def _obs(seed: int, task: int = 0, step: int = 0, size: int = 64) -> Observation:
    rng = np.random.default_rng(seed)
    return Observation(main=rng.integers(0, 255, (size, size, 3), dtype=np.uint8),
                       wrist=rng.integers(0, 255, (size, size, 3), dtype=np.uint8),
                       proprio=rng.normal(size=8).astype(np.float32), instruction=TASK0, task_index=task,
                       state=rng.normal(size=12), step=step)


def test_runner_is_batched_bounded_and_batch_independent(trained_run):
    from wmrl.policy.runner import PolicyRunner

    runner = PolicyRunner(ck.step_dir(trained_run, 10, "sft"), device="cpu", seed=3)
    a, b = _obs(1), _obs(2, step=8)
    both = runner.act([a, b])
    assert both.shape == (2, 8, 7) and both.dtype == np.float32
    assert np.all(np.abs(both) <= 1.0)
    assert np.allclose(runner.act([b])[0], both[1], atol=1e-5)  # same observation, same actions
    assert not np.allclose(both[0], both[1])
    s = runner.settings()
    assert (s["sampler"], s["temperature"], s["noise_level"], s["denoise_steps"]) == ("sde", 1.6, 0.5, 4)
    ode = PolicyRunner(ck.step_dir(trained_run, 10, "sft"), device="cpu", sampler="ode")
    assert ode.settings()["temperature"] is None and "ode" in ode.policy_id
    assert np.allclose(ode.act([a]), ode.act([a]))
    with pytest.raises(ConfigError, match="--image-size 64"):
        runner.act([_obs(1, size=32)])


def test_an_observations_actions_do_not_depend_on_its_batch(trained_run):
    """Every forward pass has batch_rows rows, so the actions of an observation are bit for bit
    the same alone, beside others, at another position or in a second pass: an evaluation does not
    depend on which episodes the workers had ready together."""
    from wmrl.policy.runner import PolicyRunner

    runner = PolicyRunner(ck.step_dir(trained_run, 10, "sft"), device="cpu", sampler="ode", batch_rows=4)
    obs = [_obs(i, step=8 * i) for i in range(1, 7)]
    alone = np.concatenate([runner.act([o]) for o in obs])
    assert np.array_equal(runner.act(obs), alone)  # 6 rows: a full pass and a padded one
    assert np.array_equal(runner.act(obs[::-1]), alone[::-1])
    assert np.array_equal(runner.act([obs[4], obs[0]])[1], alone[0])
    assert runner.settings()["batch_rows"] == 4
    assert PolicyRunner(ck.step_dir(trained_run, 10, "sft"), device="cpu").batch_rows == 1  # the CPU's default
    with pytest.raises(ConfigError, match="batch_rows=0"):
        PolicyRunner(ck.step_dir(trained_run, 10, "sft"), device="cpu", batch_rows=0)


def test_gripper_output_snaps_to_the_controllers_three_commands(trained_run):
    """robosuite moves the gripper by sign(g) every step and the expert holds it with exactly 0:
    a near-zero output must stay 0, not open or close the gripper by chance."""
    import torch
    from wmrl.policy.runner import PolicyRunner, to_controller

    raw = torch.tensor([[0.3, -2.0, 0.2], [0.1, 0.5, -0.7], [0.0, 0.0, 0.49], [0.0, 0.0, 3.0]])
    snapped = to_controller(raw, 0.5)
    assert snapped[:, -1].tolist() == [0.0, -1.0, 0.0, 1.0]
    assert snapped[:, :-1].tolist() == raw[:, :-1].clamp(-1, 1).tolist()  # the arm is only clipped
    assert to_controller(raw, 0.0)[:, -1].tolist() == pytest.approx([0.2, -0.7, 0.49, 1.0])
    runner = PolicyRunner(ck.step_dir(trained_run, 10, "sft"), device="cpu", seed=3)
    acts = runner.act([_obs(s) for s in range(4)])
    assert set(np.unique(acts[..., -1])) <= {-1.0, 0.0, 1.0} and runner.settings()["gripper_deadband"] == 0.5
    off = PolicyRunner(ck.step_dir(trained_run, 10, "sft"), device="cpu", seed=3, gripper_deadband=0.0)
    assert off.settings()["gripper_deadband"] == 0.0
    assert np.allclose(off.act([_obs(0)])[..., :-1], acts[:1, ..., :-1], atol=1e-5)  # only the gripper differs


def test_videos_are_mp4_or_gif_where_no_mp4_encoder_is_installed(run_copy, monkeypatch):
    """The GPU server's offline bundle has no imageio-ffmpeg: the episode videos become GIFs."""
    import sys

    import evaluate
    from PIL import Image

    argv = ["--profile", "tiny", "--ckpt", "sft/10", "--run", str(run_copy), "--tasks", "0", "--trials", "1",
            "--max-steps", "24", "--workers", "1", "--no-progress", "--videos", "1"]
    assert evaluate.main(*evaluate.build(argv)) == 0
    videos = run_copy / "eval" / "sft" / "global_step_10" / "videos"
    assert [p.suffix for p in videos.iterdir()] == [".mp4"]
    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)
    assert evaluate.main(*evaluate.build([*argv, "--overwrite"])) == 0
    gif = sorted(videos.glob("*.gif"))
    assert len(gif) == 1 and not list(videos.glob(".*"))  # no temporary file left behind
    with Image.open(gif[0]) as im:
        assert im.n_frames == 4 and im.size == (128, 64)  # 24 steps / chunk 8 + the first frame; main | wrist


def test_eval_ckpt_writes_the_evidence_through_the_real_harness(run_copy, capsys):
    import evaluate

    argv = ["--profile", "tiny", "--ckpt", "sft/10", "--run", str(run_copy), "--tasks", "0", "--trials", "1",
            "--max-steps", "16", "--workers", "1", "--no-progress"]
    args, prof = evaluate.build(argv)
    assert prof.sim.image_size == 64 and args.policy == "checkpoint"
    assert evaluate.main(args, prof) == 0
    ev = ck.evidence_path(run_copy, 10, "sft")
    data = json.loads(ev.read_text())
    assert [(e["task"], e["trial"], e["steps"]) for e in data["episodes"]] == [(0, 0, 16)]
    s = data["settings"]
    assert s["sampler"] == "sde" and s["temperature"] == 1.6 and s["noise_level"] == 0.5 and s["denoise_steps"] == 4
    assert s["checkpoint"]["step"] == 10 and s["policy_id"].startswith("flow-policy@step10")
    assert s["sim"]["max_steps"] == 16 and data["checkpoint"]["kind"] == "full"
    latest = json.loads((run_copy / "latest_policy.json").read_text())
    assert latest["step"] == 10 and latest["evaluation"]["trials"] == 1
    assert latest["evaluation"]["evidence"] == "evidence/evaluations/sft/global_step_10.json"
    assert "evidence:" in capsys.readouterr().out
    assert (run_copy / "eval" / "sft" / "global_step_10" / "success_by_task.png").stat().st_size > 0
    # a second evaluation of the same checkpoint is refused without --overwrite; nothing changes
    before = ev.read_bytes()
    with pytest.raises(FileExistsError, match="--overwrite"):
        evaluate.main(*evaluate.build(argv))
    assert ev.read_bytes() == before
    # another sampler needs no --overwrite: it becomes the checkpoint's evaluation, the first is kept beside it,
    # and its episodes go to their own folder (the first's stay)
    assert evaluate.main(*evaluate.build([*argv, "--sampler", "ode"])) == 0
    kept = ev.parent / "samplers" / "global_step_10.sde_T1.6.json"
    out = capsys.readouterr().out
    assert f"{ev} holds an evaluation with sde T=1.6" in out and "this one (ode) becomes" in out and str(kept) in out
    assert json.loads(ev.read_text())["settings"]["sampler"] == "ode" and kept.read_bytes() == before
    first = run_copy / "eval" / "sft" / "global_step_10"
    assert json.loads((first / "results.json").read_text())["settings"]["sampler"] == "sde"
    assert json.loads((first / "ode" / "results.json").read_text())["settings"]["sampler"] == "ode"
    # either sampler again is refused without --overwrite, the kept one too
    for again in (["--sampler", "ode"], []):
        with pytest.raises(FileExistsError, match="--overwrite"):
            evaluate.main(*evaluate.build([*argv, *again]))
    # the first sampler again, with --overwrite: it is the newest once more, the ode evaluation is kept
    assert evaluate.main(*evaluate.build([*argv, "--overwrite"])) == 0
    assert "this one (sde T=1.6) becomes" in capsys.readouterr().out
    assert json.loads(ev.read_text())["settings"]["sampler"] == "sde" and not kept.exists()
    assert json.loads((ev.parent / "samplers" / "global_step_10.ode.json").read_text())["settings"]["sampler"] == "ode"
    from wmrl.report import evaluations

    rows = [(e["ref"], e["sampler"], e["kept"]) for e in evaluations(run_copy, kept=True)]
    assert rows == [("sft/10", "sde", False), ("sft/10", "ode", True)]
    assert [e["sampler"] for e in evaluations(run_copy)] == ["sde"]


def test_missing_checkpoint_lists_the_existing_ones(trained_run, root):
    import evaluate

    with pytest.raises(ck.CheckpointError, match=r"global_step_7; available in .*: 5 \(full\), 10 \(full\)"):
        evaluate.build(["--profile", "tiny", "--ckpt", "sft/7", "--run", str(trained_run)])
    res = subprocess.run([".venv/train/bin/python", "python/evaluate.py", "--ckpt", "sft/7", "--run", str(trained_run)],
                         cwd=root, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "error: no policy checkpoint global_step_7" in res.stderr
    assert "5 (full), 10 (full)" in res.stderr
    assert not ck.evidence_path(trained_run, 7, "sft").exists()


def test_make_eval_passes_ckpt_and_run(root):
    out = subprocess.run(["make", "-n", "eval", "CKPT=12", "RUN=runs/x", "PROFILE=tiny"], cwd=root,
                         capture_output=True, text=True, timeout=60).stdout
    line = [l for l in out.splitlines() if "evaluate.py" in l][0]  # noqa: E741
    assert "--ckpt 12 --run runs/x" in line and "--policy" not in line and "--sampler" not in line
    out = subprocess.run(["make", "-n", "eval", "CKPT=12", "RUN=runs/x", "SAMPLER=sde", "TEMPERATURE=1", "OVERWRITE=1"],
                         cwd=root, capture_output=True, text=True, timeout=60).stdout
    line = " ".join(out.replace("\\\n", " ").split())  # the recipe's continuation lines joined
    assert "--overwrite" in line and "--sampler sde --temperature 1" in line
    out = subprocess.run(["make", "-n", "sft", "RUN=runs/x", "GPUS=0,1"], cwd=root, capture_output=True, text=True,
                         timeout=60).stdout
    assert "--nproc_per_node=2 python/sft.py --profile default --run-dir runs/x --data runs/x/demos" in out
