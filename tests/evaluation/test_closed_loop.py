"""The reward's threshold calibrated closed loop (wmrl.evaluation.closed_loop, python/wm_calibrate.py)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from wmrl.config import ConfigError, GRPOConfig
from wmrl.evaluation import closed_loop, ranking
from wmrl.release.pair import PairError

from tests.rl.conftest import add_pair, sft_run  # noqa: F401  (fixture)


def rows(success_peaks, failure_peaks):
    return [{"recorded": True, "peak": p} for p in success_peaks] + [{"recorded": False, "peak": p} for p in failure_peaks]


def test_the_sweep_and_its_best_threshold_in_a_known_case():
    """Successes peak at 0.9, 0.5 and 0.42, failures at 0.1-0.3: the calibrated 0.74 keeps one
    success (balanced 2/3); 0.35 and 0.4 tell all apart, and of the two the nearer one wins."""
    sweep = closed_loop.threshold_sweep(rows([0.9, 0.5, 0.42], [0.1, 0.2, 0.3]), [0.2, 0.35, 0.4, 0.74])
    by = {r["threshold"]: r for r in sweep}
    assert by[0.74]["balanced_accuracy"] == pytest.approx(2 / 3) and by[0.74]["imagined_success"] == pytest.approx(1 / 6)
    assert by[0.2]["given_recorded_failure"] == pytest.approx(2 / 3) and by[0.2]["given_recorded_success"] == 1.0
    assert by[0.35]["balanced_accuracy"] == by[0.4]["balanced_accuracy"] == 1.0
    assert closed_loop.best_threshold(sweep, calibrated=0.74)["threshold"] == 0.4
    assert closed_loop.best_threshold(sweep, calibrated=0.3)["threshold"] == 0.35
    with pytest.raises(ConfigError, match="same outcome"):  # no failure: nothing to tell apart
        closed_loop.best_threshold(closed_loop.threshold_sweep(rows([0.9], []), [0.5]), calibrated=0.5)


def test_calibration_by_the_policy_that_recorded_the_held_out_episodes(sft_run, tmp_path):  # noqa: F811
    """The recording policy acts from the held-out keyframes to the last chunk; the threshold
    chosen is the sweep's best; GRPO reads it back for this pair.json only, for its success rule
    only; a policy that recorded none of the episodes is refused."""
    from wmrl.fileio import write_json
    from wmrl.policy.runner import PolicyRunner

    run = tmp_path / "run"
    shutil.copytree(sft_run, run)
    spec = ranking.parse_policy("sft/10@T=1", run)
    pid = PolicyRunner(spec.checkpoint, device="cpu", sampler="sde", temperature=1.0).policy_id
    pair = add_pair(run, episodes=8, policy_id=pid, failures=(1, 3, 5, 7), val_ratio=0.5)
    out = closed_loop.calibrate(pair, run / "manifest.json", spec, trials=2, max_chunk=2, keyframes_per_task=20, seed=0,
                                device="cpu", bf16=False)
    assert out["policy_id"] == pid and out["calibrated_threshold"] == pytest.approx(0.5)
    assert [r["threshold"] for r in out["sweep"]] == sorted({*closed_loop.GRID, 0.5})
    assert out["at_threshold"]["balanced_accuracy"] == max(r["balanced_accuracy"] for r in out["sweep"])
    assert 0 < out["at_threshold"]["recorded_success"] < 1  # both outcomes among the held-out episodes
    assert out["at_threshold"]["rollouts"] == 2 * out["keyframes"]["count"]
    [task0] = out["by_task"]  # the tiny pair's one task: the whole sweep's row at the chosen threshold
    assert task0["task"] == 0 and task0["imagined_success"] == out["at_threshold"]["imagined_success"]
    for name in ("hold", "random"):  # the controls from the same keyframes, at both thresholds
        ctl = out["controls"][name]
        assert ctl["rollouts"] == out["at_threshold"]["rollouts"] and 0 <= ctl["at_threshold"] <= 1
        lower, higher = sorted([(out["threshold"], ctl["at_threshold"]), (0.5, ctl["at_calibrated"])])
        assert lower[1] >= higher[1]  # a lower bar lets every success through that a higher one does

    cli = subprocess.run([sys.executable, "python/wm_calibrate.py", "--run", str(run), "--policy", "sft/10@T=1",
                          "--trials", "2", "--max-chunk", "2", "--device", "cpu"], capture_output=True, text=True,
                         cwd=Path(__file__).parents[2])
    assert cli.returncode == 0, cli.stderr[-2000:]
    written = json.loads((pair / closed_loop.CLOSED_LOOP_FILE).read_text())
    assert written["threshold"] in closed_loop.GRID + (0.5,) and f"threshold {written['threshold']:.2f}" in cli.stdout
    assert "control hold: imagined" in cli.stdout and set(written["controls"]) == {"hold", "random"}
    write_json(pair / closed_loop.CLOSED_LOOP_FILE, out)
    assert closed_loop.grpo_threshold("closed-loop", pair, 1) == out["threshold"]
    assert closed_loop.grpo_threshold("pair", pair, 1) == 0.0 and closed_loop.grpo_threshold("0.3", pair, 1) == 0.3
    with pytest.raises(PairError, match="success_chunks=1"):
        closed_loop.grpo_threshold("closed-loop", pair, 2)
    # GRPO's gate: a control that succeeds too often at the chosen threshold refuses it, only with the gate on
    write_json(pair / closed_loop.CLOSED_LOOP_FILE, {**out, "controls": {
        "hold": {"rollouts": 40, "at_threshold": 1.0, "at_calibrated": 0.0}}})
    with pytest.raises(PairError, match=r"40 of 40 rollouts of the control 'hold'.*closed_loop.json, at its threshold"):
        closed_loop.grpo_threshold("closed-loop", pair, 1, min_agreement=0.6)
    assert closed_loop.grpo_threshold("closed-loop", pair, 1, min_agreement=0.0) == out["threshold"]
    write_json(pair / closed_loop.CLOSED_LOOP_FILE, out)
    write_json(pair / closed_loop.CLOSED_LOOP_FILE, {**out, "pair_json_sha256": "0" * 64})
    with pytest.raises(PairError, match="another pair.json"):
        closed_loop.grpo_threshold("closed-loop", pair, 1)
    (pair / closed_loop.CLOSED_LOOP_FILE).unlink()
    with pytest.raises(PairError, match="make wm-calibrate"):
        closed_loop.grpo_threshold("closed-loop", pair, 1)
    for bad in ("0", "1.5", "open-loop"):
        with pytest.raises(ConfigError, match="reward_threshold"):
            GRPOConfig(reward_threshold=bad)
    with pytest.raises(PairError, match="none by"):  # sft/5 recorded none of them
        closed_loop.calibrate(pair, run / "manifest.json", ranking.parse_policy("sft/5@T=1", run), trials=1,
                              max_chunk=0, keyframes_per_task=1, seed=0, device="cpu", bf16=False)


def test_the_entry_script_plans_and_refuses_before_loading(sft_run, tmp_path, root):  # noqa: F811
    run = tmp_path / "run"
    shutil.copytree(sft_run, run)

    def cli(*extra):
        return subprocess.run([sys.executable, str(root / "python/wm_calibrate.py"), "--run", str(run), *extra],
                              capture_output=True, text=True, cwd=root)

    missing = cli("--policy", "sft/10@T=1")
    assert missing.returncode != 0 and "make package" in missing.stderr + missing.stdout
    add_pair(run, episodes=4)
    plan = cli("--policy", "sft/10@T=1", "--dry-run")
    assert plan.returncode == 0 and "closed_loop.json" in plan.stdout
    control = cli("--policy", "hold")
    assert control.returncode != 0 and "records no episodes" in control.stderr + control.stdout
    (run / "model_pair" / closed_loop.CLOSED_LOOP_FILE).write_text(json.dumps({}))
    again = cli("--policy", "sft/10@T=1")
    assert again.returncode != 0 and "--overwrite" in again.stderr + again.stdout
