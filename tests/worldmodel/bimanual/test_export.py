"""Export of the Stage 3 student and generation with it: EMA weights, the saved schedule, no
local paths, the same frames after a fresh-process reload, and the refusals."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tests.worldmodel.bimanual.conftest import ONE_THREAD
from tests.worldmodel.bimanual.test_train import load
from wmrl.bimanual.bundle import Bundle
from wmrl.bimanual.export import ExportError, clip_batch, export_student, read_contexts, rollout, student_from_root
from wmrl.fileio import sha256_file

ROOT = Path(__file__).resolve().parents[3]


def cli(*args):
    env = dict(os.environ, **ONE_THREAD)
    return subprocess.run([sys.executable, "python/bimanual.py", *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def strings(obj):
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from strings(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from strings(v)


@pytest.fixture(scope="module")
def exported(chain, tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "student"
    report = export_student(chain["cfg3"], chain["roots"][3], out)
    return out, report


def test_export_holds_ema_weights_schedule_metadata_and_no_paths(chain, exported, bundle_dir):
    out, report = exported
    root = chain["roots"][3]
    assert report["read_back"]["passed"] and report["read_back"]["weights_digest"] == report["weights_digest"]
    assert sorted(p.name for p in out.iterdir()) == ["export.json", "student.safetensors", "tokenizer.json"]
    assert not list(out.parent.glob(".*partial"))
    state = load_file(str(out / "student.safetensors"))
    saved = load(root, "model.pt")
    assert state.keys() == saved["net_ema"].keys()
    assert all(torch.equal(state[k], saved["net_ema"][k]) for k in state)  # the EMA ...
    assert any(not torch.equal(state[k], saved["net"][k]) for k in state)  # ... not the raw weights
    meta = json.loads((out / "export.json").read_text())
    root_meta = json.loads((root / "checkpoint.json").read_text())
    assert meta["schedule"] == root_meta["schedule"] == [1.0, 0.75, 0.5, 0.25]
    assert meta["weights"]["variant"] == "net_ema"
    manifest = Bundle(bundle_dir).manifest
    assert meta["action"]["statistics"]["offset"] == manifest["statistics"]["offset"]
    assert meta["action"]["domains"] == {"aloha_sim": 0, "libero_panda": 1}
    assert meta["action"]["contract"]["semantic_dim"] == 59 and meta["action"]["contract"]["padded_dim"] == 64
    assert meta["source"]["checkpoint_sha256"] == sha256_file(root / "checkpoint.json")
    assert meta["source"]["optimizer_steps"] == {"student": 2, "critic": 10}
    assert meta["files"]["student.safetensors"] == sha256_file(out / "student.safetensors")
    # no local absolute path anywhere: not in a value, not in any file's bytes
    assert not [s for s in strings(meta) if s.startswith(("/", "~"))]
    for f in out.iterdir():
        data = f.read_bytes()
        for local in (str(root), str(bundle_dir), str(out), str(ROOT), str(Path.home())):
            assert local.encode() not in data, (f.name, local)
    # no training-only weights: the real score and the critic differ from what was exported
    critic = load(root, "critic.pt")["net"]
    assert any(not torch.equal(state[k], critic[k]) for k in state)
    # the run's own config.json reads back as the config it was trained with (STAGE3_CONFIG's default)
    from wmrl.bimanual.config import load_stage_config

    again = load_stage_config(chain["cfg3"].run_dir / "config.json").to_dict()
    assert {k: v for k, v in again.items() if k != "source"} == {k: v for k, v in chain["cfg3"].to_dict().items() if k != "source"}
    # a rerun is a no-op; another folder with the same name is never overwritten
    assert export_student(chain["cfg3"], root, out)["already"]
    other = out.parent / "occupied"
    other.mkdir()
    with pytest.raises(FileExistsError, match="choose another STUDENT_EXPORT"):
        export_student(chain["cfg3"], root, other)


def test_exported_student_reloads_in_a_fresh_process_and_generates_the_same_frames(chain, exported, bundle_dir, tmp_path):
    out, _ = exported
    moved = tmp_path / "moved_student"  # portable: it works from anywhere
    shutil.copytree(out, moved)
    before = student_from_root(chain["cfg3"], chain["roots"][3])
    eid = next(e for e, m in Bundle(bundle_dir).episodes.items() if m["split"] == "val")
    clip = read_contexts([f"{bundle_dir}:{eid}"], before.domains)[0]
    batch = clip_batch(before, clip, context_frames=1, length=None)
    frames, _, _ = rollout(before.net, batch, context_frames=1, schedule=before.schedule, seed=7)
    other, _, _ = rollout(before.net, batch, context_frames=1, schedule=before.schedule, seed=8)
    assert not np.array_equal(frames, other)  # the comparison below can fail
    r = cli("generate", "--student", moved, "--context", f"{bundle_dir}:{eid}", "--out", tmp_path / "clip.mp4", "--seed", 7,
            "--teacher", chain["roots"][1])
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["schedule"] == [1.0, 0.75, 0.5, 0.25] and rep["teacher"]["stage"] == 1 and rep["teacher"]["steps"] == 2
    arrays = np.load(tmp_path / "clip.npz")
    np.testing.assert_array_equal(arrays["generated"], frames)
    np.testing.assert_array_equal(arrays["generated"][0], arrays["real"][0])  # the context frame is the real one
    assert arrays["teacher"].shape == frames.shape
    c = rep["clips"][0]
    assert c["panels"] == ["real", "student", "teacher"] and Path(c["video"]).stat().st_size > 0
    assert np.isfinite(c["student"]["psnr_db"]) and c["student"]["frames_per_s"] > 0 and c["teacher"]["frames_per_s"] > 0
    assert -1 <= c["student"]["ssim"] <= 1 and -1 <= c["teacher"]["ssim"] <= 1
    summ = rep["summary"]
    assert summ["clips"] == 1 and summ["student_psnr_db"] == pytest.approx(c["student"]["psnr_db"], abs=1e-3)
    assert summ["speedup"] == pytest.approx(c["student"]["frames_per_s"] / c["teacher"]["frames_per_s"], rel=0.01)
    # the baseline beside them: the context frame held still (as good as a model that predicts no motion)
    held = np.repeat(arrays["real"][:1], len(arrays["real"]), 0).astype(np.float64) / 255
    mse = ((held - arrays["real"].astype(np.float64) / 255) ** 2)[1:].reshape(len(held) - 1, -1).mean(1)
    assert c["hold"]["psnr_db"] == pytest.approx(float(np.mean(10 * np.log10(1 / np.maximum(mse, 1e-10)))), abs=0.05)
    assert summ["hold_psnr_db"] == pytest.approx(c["hold"]["psnr_db"], abs=1e-3)
    # frame by frame, where an open loop falls off: one value per generated frame, the mean of them the PSNR
    assert c["hold"]["psnr_db_by_frame"] == pytest.approx(list(10 * np.log10(1 / np.maximum(mse, 1e-10))), abs=0.05)
    assert len(c["student"]["psnr_db_by_frame"]) == len(frames) - 1
    assert np.mean(c["student"]["psnr_db_by_frame"]) == pytest.approx(c["student"]["psnr_db"], abs=1e-2)
    assert summ["teacher_psnr_db_by_frame"] == pytest.approx(c["teacher"]["psnr_db_by_frame"], abs=1e-3)
    # the teacher at other Euler steps (its full sampling steps where its profile's are fewer)
    r = cli("generate", "--student", moved, "--context", f"{bundle_dir}:{eid}", "--out", tmp_path / "clip3.mp4",
            "--teacher", chain["roots"][1], "--teacher-steps", 3)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["teacher"]["steps"] == 3
    r = cli("generate", "--student", moved, "--context", f"{bundle_dir}:{eid}", "--out", tmp_path / "x.mp4",
            "--teacher-steps", 3)
    assert r.returncode == 2 and "--teacher" in r.stderr and not (tmp_path / "x.mp4").exists()


def test_batch_generation_from_a_bundle_and_a_clip_file(exported, bundle_dir, tmp_path):
    out, _ = exported
    b = Bundle(bundle_dir)
    eid = next(iter(b.episodes))
    acts, mask = b.read_actions(eid)
    np.savez(tmp_path / "mine.npz", frames=b.read_frames(eid)[:1], actions=acts[:3], mask=mask, domain="aloha_sim",
             caption="move the arms")
    with pytest.raises(ExportError, match="actions and mask must be"):
        read_contexts([str(tmp_path / "mine.npz")], {"aloha_sim": 0})
    np.savez(tmp_path / "mine.npz", frames=b.read_frames(eid)[:1], actions=acts[:3], mask=mask[:3], domain="aloha_sim",
             caption="move the arms")
    from wmrl.bimanual.export import generate

    rep = generate(out, [str(bundle_dir), str(tmp_path / "mine.npz")], tmp_path / "batch", seed=0)
    vals = [e for e, m in b.episodes.items() if m["split"] == "val"]
    assert [c["name"] for c in rep["clips"]] == [*vals, "mine"]
    mine = rep["clips"][-1]
    assert mine["frames"] == 4 and mine["panels"] == ["student"] and "psnr_db" not in mine["student"]
    assert (tmp_path / "batch" / "generate.json").is_file() and (tmp_path / "batch" / "mine.npz").is_file()
    with pytest.raises(ExportError, match="one video but there are"):
        generate(out, [str(bundle_dir)], tmp_path / "one.mp4")


def test_export_refuses_unfinished_stages_other_stages_and_non_finite_weights(chain, stage_cfg, tmp_path):
    from wmrl.bimanual.train import train

    roots = chain["roots"]
    cfg = stage_cfg(3, "job.name=unfinished", "checkpoint.save_iter=6", f"checkpoint.load_path={roots[2]}",
                    f"checkpoint.reference={roots[0]}")
    s = train(cfg, progress=False, stop_after=6)
    half = Path(s["checkpoint"])
    r = cli("export", "--checkpoint", half, "--config", "data/configs/stage3_sfdmd.toml", "--profile", "tiny",
            "--out", tmp_path / "x", f"data.bundle={cfg.data.bundle}")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("error: ") and "Stage 3 is unfinished (iteration 6 of 12)" in r.stderr
    with pytest.raises(ExportError, match="is a Stage 2 root; export takes the last iteration root of a finished Stage 3"):
        export_student(cfg, roots[2], tmp_path / "y")
    # non-finite EMA weights (a diverged run) are refused, and nothing is written
    bad = tmp_path / "diverged"
    shutil.copytree(roots[3], bad)
    state = torch.load(bad / "model.pt", weights_only=True)
    state["net_ema"]["out.weight"][0, 0] = float("nan")
    torch.save(state, bad / "model.pt")
    meta = json.loads((bad / "checkpoint.json").read_text())
    meta["files"]["model.pt"] = sha256_file(bad / "model.pt")
    (bad / "checkpoint.json").write_text(json.dumps(meta))
    with pytest.raises(ExportError, match="out.weight holds non-finite values"):
        export_student(chain["cfg3"], bad, tmp_path / "z")
    assert not (tmp_path / "z").exists() and not list(tmp_path.glob(".z*"))
