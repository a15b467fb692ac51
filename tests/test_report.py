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


def test_a_run_that_skipped_step_0s_evaluation_is_paired_with_the_supervised_checkpoints_of_the_same_weights(tmp_path):
    sft, run = RunLayout(tmp_path / "sft_run"), RunLayout(tmp_path / "grpo_run")
    write(sft.evidence(4000, "sft"), "ode", 1.6, [False, False, True, True])
    evidence = json.loads(sft.evidence(4000, "sft").read_text())
    evidence["settings"]["checkpoint"] = {"model_sha256": "abc"}
    sft.evidence(4000, "sft").write_text(json.dumps(evidence))
    run.checkpoint(0).mkdir(parents=True)
    origin = {"sft_checkpoint": str(sft.checkpoint(4000, "sft")), "sft_model_sha256": "abc"}
    (run.checkpoint(0) / "config.json").write_text(json.dumps({"origin": origin}))
    write(run.evidence(4), "ode", 1.6, [True, True, True, True])

    def change_at_4():
        table = next(b for b in blocks(run.root) if b[0] == "table" and "against GRPO step 0" in b[1])
        return {r[0]: r[4] for r in table[2]}["4"]

    assert change_at_4() == "+50.0 +- 28.9 (2 up, 0 down)"
    (run.checkpoint(0) / "config.json").write_text(json.dumps({"origin": {**origin, "sft_model_sha256": "other"}}))
    assert change_at_4() == "-"  # the supervised evaluation was of other weights
