"""bench/pair_parts.py: a model pair carried between machines in parts, each checked on the way back."""

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.helpers import load_script


def _tool():
    return load_script("bench/pair_parts.py")


def fake_pair(root: Path, name: str) -> Path:
    """The shapes of a pair folder (the tool moves bytes; the pair's own checks run when it loads)."""
    pair = root / name
    for rel, data in {"pair.json": b'{"models": {}}', "main/model.safetensors": os.urandom(700_000),
                      "wrist/model.safetensors": os.urandom(600_000), "closed_loop.json": b"{}",
                      "videos/episode_00_real_vs_imagined.gif": os.urandom(300_000)}.items():
        (pair / rel).parent.mkdir(parents=True, exist_ok=True)
        (pair / rel).write_bytes(data)
    return pair


def test_a_pair_split_into_sets_joins_back_byte_for_byte_and_refuses_what_is_missing_or_changed(tmp_path):
    """Two pair folders in parts of 0.25 MiB, two to a set: each set is one call's files; joined
    from the sets brought back separately they are the same files. A missing set is named, a part
    changed on the way is refused, and a pair already in the target folder is never overwritten."""
    tool = _tool()
    pairs = [fake_pair(tmp_path / "run", "model_pair"), fake_pair(tmp_path / "run", "model_pair_students")]
    index = tool.split(pairs, tmp_path / "parts", part_mib=0.25, per_set=2)
    sets = sorted((tmp_path / "parts").glob("set*"))
    assert len(sets) == index["sets"] >= 3 and len(index["parts"]) >= 5
    assert all(len(list(s.glob("pair.*"))) <= 2 for s in sets) and (sets[0] / "parts.json").exists()
    with pytest.raises(SystemExit, match="holds a split already"):
        tool.split(pairs, tmp_path / "parts")

    brought = tmp_path / "brought"  # each set came back in its own call
    for s in sets:
        shutil.copytree(s, brought / "calls" / s.name)
    joined = tool.join([brought], tmp_path / "run2")
    assert [p.name for p in joined] == ["model_pair", "model_pair_students"]
    for pair in pairs:
        for f in pair.rglob("*"):
            if f.is_file() and f.parent.name != "videos":
                assert (tmp_path / "run2" / pair.name / f.relative_to(pair)).read_bytes() == f.read_bytes()
        assert not (tmp_path / "run2" / pair.name / "videos").exists()  # the videos stayed behind
    assert not list((tmp_path / "run2").glob(".pair_parts.*"))  # the staging folder is gone
    with pytest.raises(SystemExit, match="exists: remove it first"):
        tool.join([brought], tmp_path / "run2")

    shutil.rmtree(brought / "calls" / sets[1].name)  # one call's files never came back
    with pytest.raises(SystemExit, match=r"set\(s\) \[1\] are missing"):
        tool.join([brought], tmp_path / "run3")
    shutil.copytree(sets[1], brought / "calls" / sets[1].name)
    part = next((brought / "calls" / sets[1].name).glob("pair.*"))
    part.write_bytes(part.read_bytes()[:-1] + b"x")
    with pytest.raises(SystemExit, match="differs from the index"):
        tool.join([brought], tmp_path / "run3")
    assert not (tmp_path / "run3" / "model_pair").exists()
    assert json.loads((sets[0] / "parts.json").read_text())["folders"] == ["model_pair", "model_pair_students"]
    with pytest.raises(SystemExit, match="not a model pair"):
        tool.split([tmp_path / "run"], tmp_path / "other")
