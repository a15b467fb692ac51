"""The entry script: JSON reports, exit codes and one-line errors."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def cli(*args, env=None):
    e = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "python/bimanual.py", *map(str, args)], cwd=ROOT, env=e,
                          capture_output=True, text=True, timeout=120)


def test_validate_and_materialize_print_json(bundle_dir, tmp_path):
    r = cli("validate", bundle_dir, "--out", tmp_path / "v")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["passed"] is True and rep["problems"] == []
    assert (tmp_path / "v" / "episodes.png").is_file() and list((tmp_path / "v").glob("*.mp4"))
    r = cli("materialize", bundle_dir, "--out", tmp_path / "m", "--batch-size", "2")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["passed"] is True and rep["materialized"] is True
    assert rep["tensors"]["actions"]["shape"][-1] == 64 and rep["batch"]["samples"] == 2
    slots = json.loads((tmp_path / "m" / "actions_sample0_step0.json").read_text())["slots"]
    assert len(slots) == 64 and slots[0]["name"] == "left.eef_pos[0]" and slots[0]["unit"] == "m"


def test_bad_inputs_fail_with_one_line(tmp_path, bundle_dir):
    (tmp_path / "x.jsonl").write_text("{}\n")
    r = cli("validate", tmp_path / "x.jsonl")
    assert r.returncode == 2 and r.stderr.startswith("error: ") and "not a training bundle" in r.stderr
    r = cli("train", "--stage", "1", "--config", "data/configs/stage0_bidir.toml", "--dry-run",
            env={"BIMANUAL_BUNDLE": str(bundle_dir)})
    assert r.returncode == 2 and "Stage 0 config" in r.stderr
    r = cli("train", "--stage", "1", "--config", "data/configs/stage1_tf.toml", "--dry-run",
            env={"BIMANUAL_BUNDLE": str(bundle_dir), "BIMANUAL_STAGE0_CHECKPOINT": str(tmp_path)})
    assert r.returncode == 2 and "not an iteration root" in r.stderr
    r = cli("train", "--stage", "2", "--config", "data/configs/stage2_tfdcm.toml", "--dry-run",
            env={"BIMANUAL_BUNDLE": str(bundle_dir), "BIMANUAL_STAGE1_CHECKPOINT": str(tmp_path)})
    assert r.returncode == 2 and "not an iteration root" in r.stderr
    r = cli("train", "--stage", "3", "--config", "data/configs/stage3_sfdmd.toml", "--dry-run",
            env={"BIMANUAL_BUNDLE": str(bundle_dir), "BIMANUAL_STAGE2_CHECKPOINT": str(tmp_path)})
    assert r.returncode == 2 and "stage 3 needs checkpoint.reference" in r.stderr


def test_evaluate_reads_a_root_with_the_model_it_was_trained_as(stage_cfg, bundle_dir, tmp_path):
    """A root trained with action tokens and a time shift evaluates from the stage TOML alone:
    its recorded [model] fills what the command line leaves out."""
    from wmrl.bimanual.train import train

    arch = ("model.action_tokens=true", "model.time_shift=3")
    s0 = train(stage_cfg(0, "job.name=t0", "trainer.max_iter=2", "checkpoint.save_iter=2", *arch), progress=False)
    s1 = train(stage_cfg(1, "job.name=t1", "trainer.max_iter=2", "checkpoint.save_iter=2",
                         f"checkpoint.load_path={s0['checkpoint']}", *arch), progress=False)
    r = cli("evaluate", "--config", "data/configs/stage1_tf.toml", "--profile", "tiny", "--checkpoint", s1["checkpoint"],
            f"data.bundle={bundle_dir}", "--max-windows", "2", "--steps", "2", "--out", tmp_path / "ev.json")
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "ev.json").read_text())["frames"] > 0
