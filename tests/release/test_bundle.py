"""Release bundles: every file hashed, restore verifies (resumably), relocates, moves."""

import json
import os
from pathlib import Path

import pytest
from wmrl.release.bundle import MANIFEST, ReleaseError, make_bundle, restore


def fake_run(root: Path) -> Path:
    """The shapes of a run's files (contents are irrelevant to the bundle)."""
    run = root / "run"
    files = {
        "weights/policy/global_step_2/model.safetensors": os.urandom(4096),
        "weights/policy/global_step_2/config.json": json.dumps({"origin": str(run / "weights/sft")}),
        "weights/policy/global_step_2/train_state.pt": os.urandom(1024),
        "cycles/cycle_1/model_pair/pair.json": json.dumps({"source": str(run / "cycles/cycle_1/worldmodels")}),
        "cycles/cycle_1/manifest.json": json.dumps({"files": ["task_00.hdf5"]}),
        "cycles/cycle_1/collect/task_00.hdf5": os.urandom(2048),
        "cycles/cycle_1/worldmodels/main/deepspeed/state.pt": os.urandom(512),  # a training state: stays behind
        "cycle.json": json.dumps({"cycles": {"1": {"dir": str(run / "cycles/cycle_1")}}}),
        "evidence/evaluations/global_step_2.json": json.dumps({"summary": {"success_rate": 0.5}}),
        "demos/task_00.hdf5": os.urandom(2048),
    }
    for rel, data in files.items():
        p = run / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data if isinstance(data, bytes) else data.encode())
    return run


def test_bundle_lists_every_file_and_restore_relocates_only_what_no_other_hash_covers(tmp_path):
    run = fake_run(tmp_path)
    b = make_bundle(run, tmp_path / "bundle", profile="tiny", progress=False)
    man = json.loads((b / MANIFEST).read_text())
    assert "cycles/cycle_1/collect/task_00.hdf5" in man["files"] and "weights/policy/global_step_2/train_state.pt" in man["files"]
    assert not any("deepspeed" in f for f in man["files"])
    assert {"config/profile.json", "config/environment.json", "source.tar.gz"} <= set(man["files"])
    assert man["relocatable"] == ["cycle.json"]  # model folders and pairs keep their recorded paths
    out = restore(b, progress=False)
    assert out["hashed"] == len(man["files"]) and out["relocated"] == 1 and out["source_unpacked"] > 0
    assert json.loads((b / "cycle.json").read_text())["cycles"]["1"]["dir"] == str(b / "cycles/cycle_1")
    assert str(run) in (b / "cycles/cycle_1/model_pair/pair.json").read_text()
    assert (b / "source/Makefile").is_file()
    assert restore(b, progress=False)["hashed"] == 0  # verified and unchanged: skipped


def test_restore_names_a_flipped_byte_and_a_missing_file_and_resumes(tmp_path):
    b = make_bundle(fake_run(tmp_path), tmp_path / "bundle", data=False, progress=False)
    assert "demos/task_00.hdf5" not in json.loads((b / MANIFEST).read_text())["files"]
    model = b / "weights/policy/global_step_2/model.safetensors"
    good = model.read_bytes()
    model.write_bytes(bytes([good[0] ^ 1]) + good[1:])
    (b / "evidence/evaluations/global_step_2.json").rename(tmp_path / "moved_away.json")
    with pytest.raises(ReleaseError, match=r"2 file\(s\) do not verify: .*evidence/evaluations/global_step_2.json: "
                                           r"missing; weights/policy/global_step_2/model.safetensors: SHA-256 differs"):
        restore(b, progress=False)
    model.write_bytes(good)
    (tmp_path / "moved_away.json").rename(b / "evidence/evaluations/global_step_2.json")
    assert restore(b, progress=False)["hashed"] == 2  # the others were verified by the failed attempt


def test_a_moved_bundle_restores_again_and_local_edits_to_source_are_kept_unless_asked(tmp_path):
    b = make_bundle(fake_run(tmp_path), tmp_path / "bundle", progress=False)
    restore(b, progress=False)
    moved = b.rename(tmp_path / "elsewhere")
    assert restore(moved, progress=False)["relocated"] == 1
    assert json.loads((moved / "cycle.json").read_text())["cycles"]["1"]["dir"] == str(moved / "cycles/cycle_1")
    (moved / "cycle.json").write_text((moved / "cycle.json").read_text().replace("cycle_1", "cycle_9"))
    with pytest.raises(ReleaseError, match="cycle.json: SHA-256 differs"):  # a relocated file is checked too
        restore(moved, progress=False)
    (moved / "cycle.json").write_text((moved / "cycle.json").read_text().replace("cycle_9", "cycle_1"))
    edited = moved / "source/Makefile"
    edited.write_text("# my change\n")
    assert restore(moved, progress=False)["source_kept"] == 1 and edited.read_text() == "# my change\n"
    assert restore(moved, refresh_source=True, progress=False)["source_unpacked"] == 1
    assert edited.read_text() != "# my change\n"


def test_bad_requests_are_refused_before_copying(tmp_path):
    with pytest.raises(ReleaseError, match="not a run folder"):
        make_bundle(tmp_path, tmp_path / "b", progress=False)
    run = fake_run(tmp_path)
    with pytest.raises(ReleaseError, match="inside RUN"):
        make_bundle(run, run / "bundle", progress=False)
    with pytest.raises(ReleaseError, match="make release"):
        restore(tmp_path, progress=False)
