"""How an evaluation's evidence is labelled (the replacement note runs through make eval: tests/policy/test_eval.py)."""

from wmrl.evaluation.evidence import sampler_label


def test_an_evaluations_label_names_the_sdes_temperature():
    assert sampler_label({"sampler": "sde", "temperature": 1.0}) == "sde T=1"
    assert sampler_label({"sampler": "sde", "temperature": 1.6}) == "sde T=1.6"
    assert sampler_label({"sampler": "ode", "temperature": 1.6}) == "ode"  # deterministic: no temperature
    assert sampler_label({"sampler": "sde"}) == "sde"  # an evaluation that recorded none
