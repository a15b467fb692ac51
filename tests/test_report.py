"""The report's table of real evaluations: every sampler a checkpoint was evaluated with, and
each GRPO step's change against step 0 read state by state."""

import json

from wmrl.evaluation.evidence import kept_path
from wmrl.layout import RunLayout
from wmrl.report import blocks


def write(path, sampler, temperature, outcomes):
    path.parent.mkdir(parents=True, exist_ok=True)
    episodes = [{"task": 0, "trial": i, "success": ok} for i, ok in enumerate(outcomes)]
    n = sum(outcomes)
    path.write_text(json.dumps({"settings": {"sampler": sampler, "temperature": temperature}, "episodes": episodes,
                                "summary": {"successes": n, "trials": len(outcomes), "success_rate": n / len(outcomes)}}))


def test_the_evaluations_table_pairs_each_grpo_step_with_step_0_of_the_same_sampler(tmp_path):
    layout = RunLayout(tmp_path)
    write(layout.evidence(0), "ode", 1.6, [True, False, False, True])
    write(layout.evidence(4), "sde", 1.0, [True, True, False, False])  # no T = 1 evaluation of step 0: no pair
    write(kept_path(layout.evidence(4), "ode"), "ode", 1.6, [True, True, True, False])  # 2 up, 1 down
    table = next(b for b in blocks(tmp_path) if b[0] == "table" and "against GRPO step 0" in b[1])
    rows = {(r[0], r[3]): r[4] for r in table[2]}
    assert rows == {("0", "ode"): "-", ("4", "sde T=1"): "-", ("4", "ode (earlier evaluation)"): "+25.0 +- 47.9 (2 up, 1 down)"}
