"""Stages 2 (TF-dCM) and 3 (SF-DMD): start points, the update cycle, finite losses, resume."""

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from tests.worldmodel.bimanual.test_cli import cli
from tests.worldmodel.bimanual.test_train import assert_states_equal, load
from wmrl.bimanual.train import TrainError, resolve, train
from wmrl.config import ConfigError
from wmrl.fileio import sha256_file


def root_meta(root: Path) -> dict:
    return json.loads((root / "checkpoint.json").read_text())


def opt_steps(opt_state: dict) -> set[int]:
    return {int(s["step"]) for s in opt_state["state"].values()}


def test_stage2_starts_from_the_exact_stage1_root_with_a_fresh_optimizer(chain, stage_cfg):
    root1 = chain["roots"][1]
    cfg = stage_cfg(2, "job.name=s2", "trainer.max_iter=1", "checkpoint.save_iter=1", f"checkpoint.load_path={root1}")
    plan = resolve(cfg)
    assert plan["load"]["parent_stage"] == 1 and plan["load"]["optimizer"] == "fresh"
    assert plan["distill"]["schedule"] == [1.0, 0.75, 0.5, 0.25]
    s = train(cfg, progress=False)
    root = Path(s["checkpoint"])
    start = load(root1, "model.pt")["net_ema"]
    # the frozen teacher is Stage 1's EMA, bit for bit
    assert_states_equal(load(root, "teacher.pt")["net"], start, "teacher")
    # the student started from the same weights: EMA = beta * start + (1 - beta) * after one update
    out = load(root, "model.pt")
    k = "blocks.0.qkv.weight"
    assert not torch.equal(out["net"][k], start[k])
    torch.testing.assert_close(out["net_ema"][k], cfg.ema.beta * start[k] + (1 - cfg.ema.beta) * out["net"][k])
    # a new optimizer: one step (Stage 1's ran four), a new schedule
    optim = load(root, "optim.pt")
    assert opt_steps(optim["optimizer"]) == {1} and optim["scheduler"]["last_epoch"] == 1
    meta = root_meta(root)
    assert meta["parent"] == str(root1.resolve()) and meta["parent_checkpoint_sha256"] == sha256_file(root1 / "checkpoint.json")
    assert meta["schedule"] == [1.0, 0.75, 0.5, 0.25] and meta["optimizer_steps"] == {"student": 1}
    assert sorted(meta["files"]) == ["model.pt", "optim.pt", "teacher.pt", "trainer_state.pt"]
    # a Stage 0 root or another architecture is refused before any weights load
    with pytest.raises(TrainError, match="must start from a completed Stage 1 iteration root; .* is a Stage 0 root"):
        resolve(stage_cfg(2, "job.name=x", f"checkpoint.load_path={chain['roots'][0]}"))
    with pytest.raises(TrainError, match=r"\[model\] differs .*width 32 vs 64"):
        resolve(stage_cfg(2, "job.name=x", "model.width=32", f"checkpoint.load_path={root1}"))
    with pytest.raises(ConfigError, match="denoise_steps=2 but distill.schedule has 4 levels"):
        stage_cfg(2, "model.denoise_steps=2")
    with pytest.raises(ConfigError, match="start at 1.0"):
        stage_cfg(2, "distill.schedule=[0.75,0.5]", "model.denoise_steps=2")


def test_stage3_update_cycle_and_finite_losses(chain):
    """12 iterations: critic x5, student, critic x5, student; both optimizers counted."""
    roots, s = chain["roots"], chain["summary3"]
    root = roots[3]
    assert s["finished"] and s["final_iteration"] == 12 and s["finite"]
    assert s["optimizer_steps"] == {"student": 2, "critic": 10}
    assert math.isfinite(s["student_loss_last"]) and math.isfinite(s["critic_loss_last"]) and s["critic_loss_last"] > 0
    log = [json.loads(x) for x in (chain["cfg3"].run_dir / "log.jsonl").read_text().splitlines()]
    assert [r["update"] for r in log] == (["critic"] * 5 + ["student"]) * 2
    assert [r["student_steps"] for r in log] == [0] * 5 + [1] * 6 + [2]
    assert [r["critic_steps"] for r in log] == [1, 2, 3, 4, 5, 5, 6, 7, 8, 9, 10, 10]
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in log)
    meta = root_meta(root)
    assert meta["optimizer_steps"] == {"student": 2, "critic": 10}
    assert meta["update_cycle"] == {"student_every": 6, "student_updates_per_cycle": 1, "critic_updates_per_cycle": 5}
    assert meta["reference"] == str(roots[0].resolve()) and meta["schedule"] == root_meta(roots[2])["schedule"]
    optim = load(root, "optim.pt")  # the optimizers' own counts, not the iteration's
    assert opt_steps(optim["optimizer"]) == {2} and opt_steps(optim["critic_optimizer"]) == {10}
    # real score frozen at Stage 0's EMA; critic started there and trained; student started at Stage 2's EMA
    ref = load(roots[0], "model.pt")["net_ema"]
    assert_states_equal(load(root, "teacher.pt")["net"], ref, "real score")
    critic = load(root, "critic.pt")["net"]
    assert any(not torch.equal(critic[k], ref[k]) for k in ref)
    student = load(root, "model.pt")
    s2 = load(roots[2], "model.pt")["net_ema"]
    assert any(not torch.equal(student["net"][k], s2[k]) for k in s2)
    assert all(torch.isfinite(v).all() for v in [*student["net"].values(), *critic.values()])


def test_stage3_reference_must_be_a_stage0_root(chain, stage_cfg, bundle_dir, tmp_path):
    roots = chain["roots"]
    r = cli("train", "--stage", "3", "--config", "data/configs/stage3_sfdmd.toml", "--profile", "tiny", "--dry-run",
            env={"BIMANUAL_BUNDLE": str(bundle_dir), "BIMANUAL_OUTPUT_ROOT": str(tmp_path),
                 "BIMANUAL_STAGE2_CHECKPOINT": str(roots[2]), "BIMANUAL_STAGE0_CHECKPOINT": str(roots[1])})
    assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"error: checkpoint.reference={roots[1]} is a Stage 1 root;")
    with pytest.raises(TrainError, match=r"^checkpoint.reference=\S+ is a Stage 1 root; Stage 3's real score and critic start "
                                         r"from the EMA of a completed Stage 0 iteration root$"):
        resolve(stage_cfg(3, "job.name=x", f"checkpoint.load_path={roots[2]}", f"checkpoint.reference={roots[1]}"))
    with pytest.raises(TrainError, match="checkpoint.reference=.* is not an iteration root"):
        resolve(stage_cfg(3, "job.name=x", f"checkpoint.load_path={roots[2]}", f"checkpoint.reference={roots[0].parent}"))
    with pytest.raises(TrainError, match=r"keeps its parent's schedule: set distill.schedule = \[1.0, 0.75, 0.5, 0.25\]"):
        resolve(stage_cfg(3, "job.name=x", "distill.schedule=[1.0,0.6,0.3,0.1]", f"checkpoint.load_path={roots[2]}",
                          f"checkpoint.reference={roots[0]}"))
    with pytest.raises(ConfigError, match="stage 3 needs checkpoint.reference"):
        stage_cfg(3, "checkpoint.reference=")


@pytest.mark.parametrize("stage", [2, 3])
def test_distill_resume_is_bit_identical(chain, stage_cfg, stage, tmp_path):
    roots = chain["roots"]
    start = [f"checkpoint.load_path={roots[stage - 1]}"] + ([f"checkpoint.reference={roots[0]}"] if stage == 3 else [])
    over = (*start, "trainer.max_iter=12", "checkpoint.save_iter=6") if stage == 3 else \
        (*start, "trainer.max_iter=6", "checkpoint.save_iter=3")
    straight = train(stage_cfg(stage, "job.name=straight", *over), progress=False)
    cfg = stage_cfg(stage, "job.name=killed", *over)
    first = train(cfg, progress=False, stop_after=8 if stage == 3 else 4)  # killed past the middle save
    assert not first["finished"]
    assert resolve(cfg)["load"]["kind"] == "resume" and "teacher" in resolve(cfg)["load"]["restores"]
    second = train(cfg, progress=False)
    assert second["resumed"] and second["start_iteration"] == (6 if stage == 3 else 3) and second["finished"]
    assert second["ema_copies"] == 1 and second["optimizer_steps"] == straight["optimizer_steps"]
    a, b = Path(straight["checkpoint"]), Path(second["checkpoint"])
    names = ["model.pt", "optim.pt", "teacher.pt"] + (["critic.pt"] if stage == 3 else [])
    for f in names:
        assert_states_equal(load(a, f), load(b, f), f)
    ta, tb = load(a, "trainer_state.pt"), load(b, "trainer_state.pt")
    assert ta["loader"] == tb["loader"] and torch.equal(ta["rng"]["torch"], tb["rng"]["torch"])
    assert root_meta(a)["optimizer_steps"] == root_meta(b)["optimizer_steps"]
    assert root_meta(a)["last_losses"] == root_meta(b)["last_losses"] and second["loss_last"] == straight["loss_last"]
    if stage == 3:  # the same run name with another reference is refused instead of mixed
        other = tmp_path / "other_stage0_root"
        shutil.copytree(roots[0], other)
        with pytest.raises(TrainError, match="started from reference"):
            resolve(stage_cfg(3, "job.name=killed", f"checkpoint.load_path={roots[2]}", f"checkpoint.reference={other}"))


def test_the_consistency_grid_follows_the_teachers_shifted_euler_steps():
    from wmrl.bimanual.distill import consistency_grid

    schedule = [1.0, 0.75, 0.5, 0.25]
    assert consistency_grid(schedule, 4) == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert consistency_grid(schedule, 4, shift=3.0) == [0.0, 0.25, 0.5, 0.75, 0.9, 1.0]  # 3t / (1 + 2t) at 1/4, 1/2, 3/4
