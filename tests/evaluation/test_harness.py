import json
import time

import numpy as np
import pytest

from wmrl.config import EvalConfig, SimConfig
from wmrl.evaluation.harness import EvaluationError, evaluate, format_table, format_throughput, plan

SIM = SimConfig(image_size=64, max_steps=16)
CFG = EvalConfig(tasks=(0,), trials=2, workers=1)


def test_plan_uses_fixed_initial_states_in_order():
    specs = plan(EvalConfig(tasks=(2, 5), trials=3))
    assert [(s.task_index, s.init_index) for s in specs] == [(2, 0), (2, 1), (2, 2), (5, 0), (5, 1), (5, 2)]
    assert all(s.mode == "eval" for s in specs)
    assert len({s.seed for s in specs}) == 6


@pytest.fixture(scope="module")
def random_eval(tmp_path_factory):
    out = tmp_path_factory.mktemp("eval")
    return out, evaluate("random", sim=SIM, cfg=CFG, out_dir=out, progress=False)


def test_evidence_has_every_episode_and_the_settings(random_eval):
    out, res = random_eval
    data = json.loads(res.results_path.read_text())
    assert [(e["task"], e["trial"], e["init_index"]) for e in data["episodes"]] == [(0, 0, 0), (0, 1, 1)]
    assert all(e["steps"] == 16 and e["success"] is False for e in data["episodes"])
    s = data["settings"]
    assert s["policy_id"] == "random" and s["sim"]["max_steps"] == 16 and s["sim"]["chunk_size"] == 8
    assert s["versions"]["mujoco"] and s["renderer"] in ("osmesa", "egl", "glfw")
    assert data["summary"]["trials"] == 2 and data["summary"]["success_rate"] == 0.0
    assert "0/2" in format_table(data["summary"])


class SlowChunkPolicy:
    """A chunk policy that takes 0.2 s per call, as a slow GPU round trip would."""

    policy_id = "slow-zeros"

    def act(self, observations):
        time.sleep(0.2)
        return np.zeros((len(observations), 8, 7), np.float32)


def test_throughput_says_how_long_the_workers_waited_for_the_policy(random_eval, tmp_path):
    """A step policy acts inside the worker, which never waits; a chunk policy answers over a
    pipe, and the worker's idle time is what separates evaluation speed from physics speed."""
    _, res = random_eval
    tp = res.results["throughput_this_run"]
    assert tp["episodes"] == 2 and tp["env_steps"] == 32 and tp["steps_per_s"] > 0
    assert all(e["wall_s"] - e["busy_s"] < 0.05 for e in res.results["episodes"])
    slow = evaluate(SlowChunkPolicy(), sim=SIM, cfg=CFG, out_dir=tmp_path, progress=False)
    # 16 steps = 2 chunks: two calls per episode (after the reset, after the first chunk)
    assert all(e["wall_s"] - e["busy_s"] >= 0.4 for e in slow.results["episodes"])
    slow_tp = slow.results["throughput_this_run"]
    assert slow_tp["worker_busy_share"] < tp["worker_busy_share"]
    assert 0 < slow_tp["worker_utilisation"] <= 1 and 0 < tp["worker_utilisation"] <= 1
    assert "waited for the policy" in format_throughput(slow_tp)


def test_finished_results_are_not_overwritten(random_eval):
    out, res = random_eval
    before = res.results_path.read_text()
    with pytest.raises(EvaluationError, match="--overwrite"):
        evaluate("random", sim=SIM, cfg=CFG, out_dir=out, progress=False)
    assert res.results_path.read_text() == before


def test_an_interrupted_evaluation_continues(random_eval, tmp_path):
    out, res = random_eval
    # Simulate a kill after the first episode: the log holds one finished episode plus a cut line.
    log = (out / "episodes.jsonl").read_text().splitlines()
    (tmp_path / "episodes.jsonl").write_text(log[0] + "\n" + log[1][:10])
    first = json.loads(log[0])
    first["wall_s"] = 123.0  # marks the record so we can see it was kept, not rerun
    (tmp_path / "episodes.jsonl").write_text(json.dumps(first) + "\n" + log[1][:10])
    again = evaluate("random", sim=SIM, cfg=CFG, out_dir=tmp_path, progress=False)
    eps = json.loads(again.results_path.read_text())["episodes"]
    assert len(eps) == 2
    kept = [e for e in eps if e["wall_s"] == 123.0]
    assert len(kept) == 1 and kept[0]["trial"] == first["trial"]


def test_other_settings_in_the_same_folder_are_refused(random_eval, tmp_path):
    out, _ = random_eval
    (tmp_path / "episodes.jsonl").write_text((out / "episodes.jsonl").read_text())
    with pytest.raises(EvaluationError, match="other settings"):
        evaluate("random", sim=SimConfig(image_size=64, max_steps=24), cfg=CFG, out_dir=tmp_path, progress=False)


def test_settings_of_training_starts_alone_do_not_make_another_evaluation(random_eval, tmp_path):
    """The arm's start noise, the placement check and the training loop act on random placements
    only: an evaluation (fixed states) run with other values continues the same log."""
    out, _ = random_eval
    log = (out / "episodes.jsonl").read_text().splitlines()
    (tmp_path / "episodes.jsonl").write_text(log[0] + "\n")
    sim = SimConfig(image_size=64, max_steps=16, robot_init_noise=0.0, max_settle_shift=0.0, train_physics="lean")
    again = evaluate("random", sim=sim, cfg=CFG, out_dir=tmp_path, progress=False)
    eps = json.loads(again.results_path.read_text())["episodes"]
    assert len(eps) == 2 and json.loads(log[0]) in eps  # the first episode kept, not run again
