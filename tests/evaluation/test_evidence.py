"""How evaluations are labelled and compared (the replacement note runs through make eval: tests/policy/test_eval.py)."""

import math

import pytest

from wmrl.evaluation.evidence import paired_change, sampler_label


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
    assert c["samplers"] == ["sde T=1", "sde T=1"]
    assert paired_change({"episodes": episodes(before)}, {"episodes": episodes(after)[:499]}) is None  # other states
    assert paired_change({"summary": {}}, {"episodes": episodes(after)}) is None  # no episodes kept
