"""bench/outcome_sensitivity.py: recorded episodes replayed in the real simulator, exactly and
with the objects shifted (the ceiling of the pair's agreement)."""

from __future__ import annotations

import json

import pytest
from wmrl.config import DemoConfig, SimConfig

from tests.helpers import load_script


def load_bench():
    return load_script("bench/outcome_sensitivity.py")


def test_an_exact_replay_reproduces_the_recorded_outcome_and_shifts_are_reported(tmp_path, capsys):
    from wmrl.sim.demos import collect_demos

    collect_demos(DemoConfig(tasks=(0,), episodes=1, workers=1, seed=3, frame_interval=0), SimConfig(image_size=64),
                  tmp_path / "demos", progress=False)
    out = tmp_path / "sens.json"
    assert load_bench().main([str(tmp_path / "demos"), "--shifts", "0,2", "--draws", "2", "--workers", "1",
                              "--image-size", "64", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    (row,) = result["episodes"]
    assert row["success"] and row["start_state_error"] == 0.0  # the seeded start is the recorded one
    assert row["replays"]["0"] == [True]  # the recorded actions redo the recorded success
    assert len(row["replays"]["2"]) == 2
    assert 5 < row["mm_per_px"] < 40  # a 64 px main camera over a ~1 m table
    exact, shifted = result["summary"]
    assert exact["flipped"] == 0.0 and shifted["replays"] == 2
    assert "shift (mm)" in capsys.readouterr().out


def test_bad_shifts_are_refused_before_anything_loads(tmp_path, capsys):
    bench = load_bench()
    for shifts in ("1,2", "0,x", "0,-1"):
        with pytest.raises(SystemExit):
            bench.main([str(tmp_path), "--shifts", shifts])
        assert "--shifts" in capsys.readouterr().err
