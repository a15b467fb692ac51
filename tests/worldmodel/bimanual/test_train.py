import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from wmrl.bimanual.train import TrainError, evaluate, resolve, train, write_base
from wmrl.config import ConfigError

ROOT = Path(__file__).resolve().parents[3]


def load(root: Path, name: str):
    return torch.load(root / name, map_location="cpu", weights_only=False)


def assert_states_equal(a, b, path=""):
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), path
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            assert_states_equal(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_states_equal(x, y, f"{path}[{i}]")
    elif hasattr(a, "shape"):  # numpy
        assert (a == b).all(), path
    else:
        assert a == b, path


def test_dryrun_resolves_everything_and_loads_no_weights(bundle_dir, tmp_path):
    env = dict(os.environ, BIMANUAL_BUNDLE=str(bundle_dir), BIMANUAL_OUTPUT_ROOT=str(tmp_path))
    code = ("import sys, json; sys.argv=['bimanual.py','train','--stage','0','--config','data/configs/stage0_bidir.toml',"
            "'--profile','tiny','--dryrun']; sys.path.insert(0,'python'); import bimanual; bimanual.main(sys.argv[1:]);"
            "print('TORCH_LOADED', 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "TORCH_LOADED False" in out.stdout
    plan = json.loads(out.stdout[out.stdout.index("{") : out.stdout.rindex("}") + 1])
    assert plan["data"]["bundle"] == str(bundle_dir) and plan["data"]["tokenizer"].endswith("resources/tokenizer/tokenizer.json")
    assert plan["load"]["kind"] == "fresh" and plan["logging"]["wandb_mode"] == "disabled"
    assert "copy_once" in plan["ema"]["callback"] and plan["parallelism"]["backend"] == "plain"
    assert plan["config"]["trainer"]["max_iter"] == 12 and plan["config"]["checkpoint"]["save_iter"] == 6
    assert not (tmp_path / "bimanual_stage0").exists()  # nothing written


def test_kit_configs_carry_reference_budgets(stage_cfg, bundle_dir):
    from wmrl.bimanual.config import load_stage_config

    expect = {"stage0_bidir.toml": 35_000, "stage1_tf.toml": 8_000, "stage2_tfdcm.toml": 4_000, "stage3_sfdmd.toml": 1_500}
    over = [f"data.bundle={bundle_dir}", "checkpoint.load_path=x", "checkpoint.reference=x"]
    for name, iters in expect.items():
        cfg = load_stage_config(ROOT / "data/configs" / name, overrides=over)
        assert cfg.trainer.max_iter == iters
        assert load_stage_config(ROOT / "data/configs" / name, profile="tiny", overrides=over).trainer.max_iter == 12
    with pytest.raises(TrainError, match="checkpoint.load_path=x: no such folder"):
        resolve(load_stage_config(ROOT / "data/configs/stage2_tfdcm.toml", overrides=over))
    with pytest.raises(ConfigError, match="trainer.max_iter=0"):
        stage_cfg(0, "trainer.max_iter=0")
    with pytest.raises(ConfigError, match="unknown key"):
        stage_cfg(0, "trainer.max_iters=3")


def test_smoke_run_12_iterations(stage_cfg):
    cfg = stage_cfg(0, "trainer.max_iter=12", "checkpoint.save_iter=12", "job.name=smoke")
    s = train(cfg, progress=False)
    assert s["final_iteration"] == 12 and s["finite"] and s["finished"]
    root = Path(s["checkpoint"])
    assert root.name == "iter_000000012"
    meta = json.loads((root / "checkpoint.json").read_text())
    assert meta["complete"] and meta["stage"] == 0 and meta["iteration"] == 12
    assert sorted(meta["files"]) == ["model.pt", "optim.pt", "trainer_state.pt"]
    assert (root.parent / "latest.txt").read_text().strip() == root.name
    assert torch.isfinite(torch.tensor(s["grad_norm_last"])) and s["grad_norm_last"] > 0
    assert not list(root.parent.glob(".*partial"))
    log = [json.loads(x) for x in (cfg.run_dir / "log.jsonl").read_text().splitlines()]
    assert log[-1]["iteration"] == 12 and all(torch.isfinite(torch.tensor(r["loss"])) for r in log)
    # rerun of a finished run does nothing
    assert train(cfg, progress=False)["iterations_run"] == 0


def test_resume_restores_every_state(stage_cfg):
    straight = train(stage_cfg(0, "job.name=straight", "trainer.max_iter=8", "checkpoint.save_iter=4"), progress=False)
    cfg = stage_cfg(0, "job.name=killed", "trainer.max_iter=8", "checkpoint.save_iter=4")
    first = train(cfg, progress=False, stop_after=6)  # "killed" after 6 iterations; last save at 4
    assert first["final_iteration"] == 6 and first["ema_copies"] == 1
    assert resolve(cfg)["load"]["kind"] == "resume"
    # a damaged file of the root is refused before it is unpickled
    state_file = Path(resolve(cfg)["load"]["path"]) / "trainer_state.pt"
    good = state_file.read_bytes()
    state_file.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    with pytest.raises(TrainError, match="trainer_state.pt: missing or its SHA-256 differs"):
        train(cfg, progress=False)
    state_file.write_bytes(good)
    second = train(cfg, progress=False)
    assert second["resumed"] and second["start_iteration"] == 4 and second["final_iteration"] == 8
    assert second["ema_copies"] == 1  # restored, never copied a second time
    a, b = Path(straight["checkpoint"]), Path(second["checkpoint"])
    for f in ("model.pt", "optim.pt"):
        assert_states_equal(load(a, f), load(b, f), f)
    ta, tb = load(a, "trainer_state.pt"), load(b, "trainer_state.pt")
    assert ta["loader"] == tb["loader"] and ta["loader"]["position"] == 8 * 2
    assert torch.equal(ta["rng"]["torch"], tb["rng"]["torch"])
    ema = load(b, "model.pt")
    assert not all(torch.equal(ema["net"][k], ema["net_ema"][k]) for k in ema["net"])


def test_stage0_from_base_skips_action_modules_and_copies_ema_once(stage_cfg, tmp_path):
    cfg = stage_cfg(0, "job.name=from_base", "trainer.max_iter=1", "checkpoint.save_iter=1")
    base = write_base(cfg, tmp_path / "base")
    state = torch.load(base / "model.pt", weights_only=False)["net"]
    assert not any(k.startswith(("action_encoder", "domain_embedding", "action_modulation")) for k in state)
    # poison action-module and EMA entries: they must not be loaded
    poisoned = dict(state, **{"action_encoder.0.weight": torch.full((64, 128), 7.0)})
    torch.save({"net": poisoned, "net_ema": {"x": torch.zeros(1)}}, base / "model.pt")
    meta = json.loads((base / "checkpoint.json").read_text())
    meta["files"] = {}
    (base / "checkpoint.json").write_text(json.dumps(meta))
    cfg = stage_cfg(0, "job.name=from_base", "trainer.max_iter=1", "checkpoint.save_iter=1", f"checkpoint.load_path={base}")
    s = train(cfg, progress=False)
    assert s["ema_copies"] == 1
    out = load(Path(s["checkpoint"]), "model.pt")
    assert (out["net"]["action_encoder.0.weight"] != 7.0).all()
    # EMA = beta * loaded + (1 - beta) * trained after one update: it started from the base weights
    beta = cfg.ema.beta
    k = "blocks.0.qkv.weight"
    torch.testing.assert_close(out["net_ema"][k], beta * state[k] + (1 - beta) * out["net"][k])
    # strict: an unexpected regular key is an error before training
    torch.save({"net": dict(state, extra=torch.zeros(1)), "net_ema": None}, base / "model.pt")
    with pytest.raises(TrainError, match="unexpected"):
        train(stage_cfg(0, "job.name=strict", f"checkpoint.load_path={base}"), progress=False)
    missing = {k: v for k, v in state.items() if not k.startswith("blocks.1.")}
    torch.save({"net": missing, "net_ema": None}, base / "model.pt")
    with pytest.raises(TrainError, match="missing"):
        train(stage_cfg(0, "job.name=strict2", f"checkpoint.load_path={base}"), progress=False)


def test_stage1_from_stage0_and_wrong_parents(stage_cfg, tmp_path):
    s0 = train(stage_cfg(0, "job.name=s0", "trainer.max_iter=4", "checkpoint.save_iter=4"), progress=False)
    root0 = Path(s0["checkpoint"])
    cfg1 = stage_cfg(1, "job.name=s1", "trainer.max_iter=4", "checkpoint.save_iter=4", f"checkpoint.load_path={root0}")
    plan = resolve(cfg1)
    assert plan["load"]["parent_stage"] == 0 and plan["load"]["parent_iteration"] == 4 and plan["mode"] == "teacher_forcing"
    s1 = train(cfg1, progress=False)
    load(Path(s1["checkpoint"]), "model.pt")  # the root reads back
    assert s1["finite"] and s1["ema_copies"] == 1
    assert json.loads((Path(s1["checkpoint"]) / "checkpoint.json").read_text())["parent"] == str(root0.resolve())
    # wrong parents, all refused before any weights load
    with pytest.raises(TrainError, match="not an iteration root.*iter_000000004"):
        resolve(stage_cfg(1, "job.name=x", f"checkpoint.load_path={root0.parent.parent}"))
    with pytest.raises(TrainError, match="must start from a completed Stage 0"):
        resolve(stage_cfg(1, "job.name=x", f"checkpoint.load_path={s1['checkpoint']}"))
    base = write_base(stage_cfg(0, "job.name=b"), tmp_path / "base")
    with pytest.raises(TrainError, match="base checkpoint"):
        resolve(stage_cfg(1, "job.name=x", f"checkpoint.load_path={base}"))
    # same shapes, other meaning: a residual Stage 0's weights predict changes, not frames
    with pytest.raises(TrainError, match="residual False vs True"):
        resolve(stage_cfg(1, "job.name=x", f"checkpoint.load_path={root0}", "model.residual=false",
                          "model.action_readout=false"))  # the readout needs the residual anchor
    # same run name, another parent: refuse instead of mixing
    other = train(stage_cfg(0, "job.name=s0b", "trainer.max_iter=1", "checkpoint.save_iter=1"), progress=False)
    with pytest.raises(TrainError, match="started from parent"):
        resolve(stage_cfg(1, "job.name=s1", f"checkpoint.load_path={other['checkpoint']}", "trainer.max_iter=8"))
    ev = evaluate(cfg1, s1["checkpoint"], max_windows=4, steps=2)
    assert ev["frames"] > 0 and ev["psnr_copy_last_db"] > ev["psnr_model_db"] - 100
    assert set(ev) >= {"psnr_model_db", "psnr_copy_last_db", "val_windows", "psnr_model_pooled_db", "ssim_model",
                       "frames_better_than_copy_last", "psnr_model_other_actions_db"}


def test_not_a_bundle_and_other_bundle_are_refused(stage_cfg, tmp_path, bundle_copy):
    jsonl = tmp_path / "infer.jsonl"
    jsonl.write_text("{}\n")
    with pytest.raises(TrainError, match="inference-only JSONL is not a training bundle"):
        resolve(stage_cfg(0, f"data.bundle={jsonl}"))
    train(stage_cfg(0, "job.name=b1", "trainer.max_iter=2", "checkpoint.save_iter=2"), progress=False)
    m = json.loads((bundle_copy / "manifest.json").read_text())
    m["settings"]["note"] = "another bundle"
    (bundle_copy / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(TrainError, match="another bundle"):
        resolve(stage_cfg(0, "job.name=b1", f"data.bundle={bundle_copy}", "trainer.max_iter=4"))


def test_deepspeed_zero2_resume_matches_straight_run(stage_cfg):
    """The DeepSpeed path (ZeRO 2) in one CPU process: resume restores ZeRO optimizer and
    scheduler shards, EMA, RNG and loader exactly."""
    pytest.importorskip("deepspeed")
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    over = ("parallelism.backend=deepspeed", "parallelism.zero_stage=2", "trainer.max_iter=4", "checkpoint.save_iter=2")
    straight = train(stage_cfg(0, "job.name=ds_straight", *over), progress=False)
    assert straight["backend"] == "deepspeed" and straight["finite"]
    root = Path(straight["checkpoint"])
    assert (root / "deepspeed").is_dir() and (root / "model.pt").is_file()
    cfg = stage_cfg(0, "job.name=ds_killed", *over)
    train(cfg, progress=False, stop_after=3)
    second = train(cfg, progress=False)
    assert second["resumed"] and second["start_iteration"] == 2 and second["ema_copies"] == 1
    a, b = load(root, "model.pt"), load(Path(second["checkpoint"]), "model.pt")
    assert_states_equal(a, b, "model")
    # a plain rerun of a DeepSpeed run is refused (same parallelism to resume)
    with pytest.raises(TrainError, match="same parallelism"):
        train(stage_cfg(0, "job.name=ds_killed", "trainer.max_iter=6", "checkpoint.save_iter=2"), progress=False)


def test_next_frame_scores_know_the_answers():
    """Copying the last frame scores as the baseline and beats it on no frame; the real frames
    score SSIM 1 and beat it everywhere; the pooled PSNR weighs a moving frame's error as the
    mean of the errors, not of the dBs; invalid frames are left out."""
    import torch

    from wmrl.bimanual.train import next_frame_scores

    g = torch.Generator().manual_seed(0)
    real = torch.rand(2, 3, 3, 16, 16, generator=g) * 2 - 1
    copy = real.clone()
    copy[:, 0] += 0.5 * torch.randn(2, 3, 16, 16, generator=g)  # a moving frame
    copy[:, 1:] += 0.01 * torch.randn(2, 2, 3, 16, 16, generator=g)  # two nearly still ones
    valid = torch.ones(2, 3, dtype=torch.bool)
    same = next_frame_scores(copy, real, copy, valid, gen_control=copy)
    assert same["psnr_model_db"] == same["psnr_copy_last_db"] == same["psnr_model_other_actions_db"]
    assert same["frames_better_than_copy_last"] == 0.0 and same["ssim_model"] == same["ssim_copy_last"] < 1
    # the pooled PSNR is dominated by the moving frame; the per-frame mean by the still ones
    assert same["psnr_copy_last_pooled_db"] < same["psnr_copy_last_db"] - 5
    perfect = next_frame_scores(real, real, copy, valid)
    assert perfect["frames_better_than_copy_last"] == 1.0 and perfect["ssim_model"] == pytest.approx(1.0)
    assert "psnr_model_other_actions_db" not in perfect
    valid[:, 0] = False  # without the moving frame the baseline looks far better
    assert next_frame_scores(copy, real, copy, valid)["psnr_copy_last_pooled_db"] > same["psnr_copy_last_pooled_db"] + 20
