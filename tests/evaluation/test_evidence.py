"""How evaluations are labelled and compared (the replacement note runs through make eval: tests/policy/test_eval.py)."""

import math

import pytest

from wmrl.evaluation.evidence import change_text, paired_change, sampler_label


def test_an_evaluations_label_names_the_sdes_temperature():
    assert sampler_label({"sampler": "sde", "temperature": 1.0}) == "sde T=1"
    assert sampler_label({"sampler": "sde", "temperature": 1.6}) == "sde T=1.6"
    assert sampler_label({"sampler": "ode", "temperature": 1.6}) == "ode"  # deterministic: no temperature
    assert sampler_label({"sampler": "sde"}) == "sde"  # an evaluation that recorded none


def episodes(outcomes):
    return [{"task": i // 50, "trial": i % 50, "success": ok} for i, ok in enumerate(outcomes)]


def test_a_change_read_state_by_state_has_the_paired_spread():
    # run 14's evaluations at T = 1: 86 states up, 46 down, 156 successful in both, over 500 states
    before = [False] * 86 + [True] * 46 + [True] * 156 + [False] * 212
    after = [True] * 86 + [False] * 46 + [True] * 156 + [False] * 212
    c = paired_change({"episodes": episodes(before), "settings": {"sampler": "sde", "temperature": 1.0}},
                      {"episodes": episodes(after), "settings": {"sampler": "sde", "temperature": 1.0}})
    assert (c["states"], c["up"], c["down"]) == (500, 86, 46) and c["change"] == pytest.approx(0.08)
    diffs = [int(b) - int(a) for a, b in zip(before, after)]  # the textbook sample variance of the differences
    m = sum(diffs) / 500
    assert c["paired_se"] == pytest.approx(math.sqrt(sum((d - m) ** 2 for d in diffs) / 499 / 500))
    assert c["paired_se"] == pytest.approx(0.0227, abs=5e-4) and c["mcnemar_chi2"] == pytest.approx(1600 / 132)
    assert c["samplers"] == ["sde T=1", "sde T=1"] and c["simulators"] == [None, None]
    assert "simulators" not in change_text(c)
    assert paired_change({"episodes": episodes(before)}, {"episodes": episodes(after)[:499]}) is None  # other states
    assert paired_change({"summary": {}}, {"episodes": episodes(after)}) is None  # no episodes kept


def test_a_change_across_simulator_builds_says_so():
    before, after = [False, True, True, False], [True, True, False, True]
    build = lambda v: {"sampler": "ode", "versions": {"mujoco": v}}  # noqa: E731
    same = paired_change({"episodes": episodes(before), "settings": build("2.3.7")},
                         {"episodes": episodes(after), "settings": build("2.3.7")})
    assert same["simulators"] == ["mujoco 2.3.7"] * 2 and "simulators" not in change_text(same)
    other = paired_change({"episodes": episodes(before), "settings": build("2.3.7")},
                          {"episodes": episodes(after), "settings": build("3.3.7")})
    assert (other["up"], other["down"]) == (same["up"], same["down"])  # the figures are the same, the reading is not
    assert "simulators mujoco 2.3.7 -> mujoco 3.3.7: the change is the build's" in change_text(other)
    assert change_text(other, samplers=False).endswith("as well as the policy's)")


def test_a_newer_evaluation_with_another_sampler_keeps_the_older_beside_it(tmp_path):
    import json

    from wmrl.evaluation.evidence import evaluation_with, kept_evaluations, kept_path, publish, sampler_slug
    from wmrl.layout import RunLayout
    from wmrl.policy.checkpoint import CheckpointInfo

    info = CheckpointInfo(step=4, path=tmp_path / "weights" / "policy" / "global_step_4", full=False)
    ev = RunLayout(tmp_path).evidence(4)

    def results(sampler, temperature, rate):
        return {"settings": {"sampler": sampler, "temperature": temperature},
                "summary": {"success_rate": rate, "successes": int(500 * rate), "trials": 500}}

    assert sampler_slug("sde T=1.6") == "sde_T1.6" and kept_path(ev, "ode").name == "global_step_4.ode.json"
    publish(tmp_path, info, results("sde", 1.0, 0.656))
    assert kept_evaluations(ev) == []
    publish(tmp_path, info, results("ode", 1.6, 0.72))  # another sampler: the T = 1 one is kept
    assert json.loads(ev.read_text())["summary"]["success_rate"] == 0.72
    assert kept_evaluations(ev) == [kept_path(ev, "sde T=1")]
    assert evaluation_with(ev, "sde T=1") == kept_path(ev, "sde T=1") and evaluation_with(ev, "ode") == ev
    publish(tmp_path, info, results("ode", 1.6, 0.70))  # the same sampler again replaces its own
    assert json.loads(ev.read_text())["summary"]["success_rate"] == 0.70 and len(kept_evaluations(ev)) == 1
    publish(tmp_path, info, results("sde", 1.0, 0.66))  # T = 1 the newest again: no stale copy of it stays
    assert kept_evaluations(ev) == [kept_path(ev, "ode")] and evaluation_with(ev, "sde T=1.6") is None
    assert json.loads(kept_path(ev, "ode").read_text())["summary"]["success_rate"] == 0.70
