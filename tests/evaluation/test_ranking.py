"""Policy ranking: imagined (held-out keyframes of the pair) against real success, Spearman."""

import json
import subprocess
import sys

import numpy as np
import pytest
from wmrl.config import ConfigError, override
from wmrl.evaluation import ranking

from tests.rl.conftest import TINY, pair_run, run_with_pair, sft_run  # noqa: F401  (fixtures)


def test_spearman_of_known_orders():
    assert ranking.spearman([0.1, 0.4, 0.6, 0.9], [0.2, 0.3, 0.5, 0.8]) == pytest.approx(1.0)
    assert ranking.spearman([0.1, 0.4, 0.6, 0.9], [0.8, 0.5, 0.3, 0.2]) == pytest.approx(-1.0)
    # one swapped neighbour pair among four: 1 - 6 * 2 / (4 * 15) = 0.8
    assert ranking.spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    # ties share their mean rank: a pair that cannot tell two policies apart loses a little
    assert 0.9 < ranking.spearman([1, 2, 3, 4], [1, 2, 2, 4]) < 1.0
    assert ranking.spearman([1, 2, 3], [0.5, 0.5, 0.5]) is None  # a constant list has no order


def test_policy_specs_and_their_errors(sft_run):  # noqa: F811
    s = ranking.parse_policy("sft/10@T=3", sft_run)
    assert s.checkpoint.name == "global_step_10" and s.sampler == "sde" and s.temperature == 3.0
    assert ranking.parse_policy("sft/5@ode", sft_run).sampler == "ode"
    assert ranking.parse_policy(str(s.checkpoint), sft_run).sampler is None
    for bad, words in (("sft/5@T=-1", "positive"), ("sft/5@fast", "after @"), ("sft/77", "global_step_77")):
        with pytest.raises(Exception, match=words):
            ranking.parse_policy(bad, sft_run)
    assert ranking.parse_policy("hold", sft_run).checkpoint is None


def test_a_policy_named_twice_is_refused(sft_run):  # noqa: F811
    """sft/10 samples with its checkpoint's evaluation temperature: naming that temperature
    again is the same policy, which would count twice in the rank correlation."""
    t = json.loads((sft_run / "weights" / "sft" / "global_step_10" / "config.json").read_text())["policy"]
    assert t["eval_sampler"] == "sde"
    same = [ranking.parse_policy(x, sft_run) for x in ("sft/10", f"sft/10@T={t['temperature_eval']}")]
    with pytest.raises(ConfigError, match="same policy"):
        ranking.check_distinct(same)
    with pytest.raises(ConfigError, match="same policy"):
        ranking.check_distinct([ranking.parse_policy(x, sft_run) for x in ("hold", "sft/5", "hold")])
    ranking.check_distinct([ranking.parse_policy(x, sft_run)  # other sampler, temperature, step, control: fine
                            for x in ("sft/10", "sft/10@ode", "sft/10@T=3", "sft/5", "hold", "random")])


def test_control_policies_act_as_named():
    from types import SimpleNamespace

    obs = [SimpleNamespace(task_index=0, step=8 * i, state=np.asarray([i], np.float64)) for i in range(3)]
    hold = ranking.ControlPolicy("hold", chunk_size=8).act(obs)
    assert hold.shape == (3, 8, 7) and not hold.any()
    rand = ranking.ControlPolicy("random", chunk_size=8, seed=1)
    a = rand.act(obs)
    assert a.shape == (3, 8, 7) and np.abs(a).max() <= 1 and a.std() > 0.4  # uniform on [-1, 1]: std 0.58
    assert np.array_equal(rand.act(obs[1:2]), a[1:2])  # the same observation, the same actions, whatever the batch
    assert not np.array_equal(a[0], a[1])
    with pytest.raises(ConfigError, match="hold, random"):
        ranking.ControlPolicy("expert", chunk_size=8)


def test_ranking_in_a_tiny_pair_and_the_real_simulator(run_with_pair, tmp_path):  # noqa: F811
    """Three policies from the same held-out keyframes: every rollout accounted for, the
    keyframes only from validation episodes, the same result when run again (seeded), a real
    evaluation per policy, and the cost of both recorded."""
    from wmrl.layout import RunLayout
    from wmrl.worldmodel.data import load_split

    layout = RunLayout(run_with_pair)
    specs = [ranking.parse_policy(t, run_with_pair) for t in ("sft/5", "sft/10", "sft/10@T=4", "hold")]
    sim = override(TINY.sim, max_steps=24)
    kw = dict(pair=layout.model_pair, manifest=layout.manifest, sim=sim, tasks=(0,), trials=2, real_trials=1,
              keyframes_per_task=2, max_chunk=1, seed=0, workers=1, device="cpu", bf16=False)
    first = ranking.rank_policies(specs, out_dir=tmp_path / "a", **kw)
    _, train, val = load_split(layout.manifest, chunk=8)
    assert first["keyframes"]["origin"].startswith("keyframes of held-out")
    assert first["keyframes"]["count"] >= 1
    assert set(first["keyframes"]["episodes"]) <= {e.key for e in val}  # never a trajectory the models saw
    assert not set(first["keyframes"]["episodes"]) & {e.key for e in train}
    for row in first["policies"]:
        assert row["imagined"]["rollouts"] == 2 * first["keyframes"]["count"]
        assert row["real"]["trials"] == 1 and 0 <= row["real"]["success_rate"] <= 1
        assert row["imagined"]["seconds"] > 0 and row["imagined"]["steps_per_s"] > 0
    assert first["policies"][2]["policy_id"].endswith("T4")
    hold = first["policies"][3]
    assert hold["policy_id"] == "control-hold" and hold["checkpoint"] is None and hold["model_sha256"] is None
    for row in first["policies"]:  # when success came and how sure the reward was, per policy
        im = row["imagined"]
        assert (im["success_chunk_mean"] is None) == (im["successes"] == 0)
        assert im["reward_peak_median"] is None or 0 <= im["reward_peak_median"] <= 1
    assert first["spearman"] is None or -1 <= first["spearman"] <= 1
    assert first["cost"]["real_seconds"] > 0
    again = ranking.rank_policies(specs, out_dir=tmp_path / "b", **kw)
    assert [r["imagined"]["successes"] for r in again["policies"]] == [r["imagined"]["successes"] for r in first["policies"]]


def test_the_entry_script_refuses_bad_input_before_loading(run_with_pair, root):  # noqa: F811
    def run(*args):
        return subprocess.run([sys.executable, "python/wm_rank.py", "--run", str(run_with_pair), "--profile", "tiny",
                               *args], cwd=root, capture_output=True, text=True)

    r = run("--policy", "sft/10")
    assert r.returncode == 2 and "at least 2 policies" in r.stderr
    r = run("--policy", "sft/10", "--policy", "sft/99")
    assert r.returncode == 2 and "global_step_99" in r.stderr and "Traceback" not in r.stderr
    r = run("--policy", "sft/5", "--policy", "sft/10", "--pair", str(run_with_pair / "nowhere"))
    assert r.returncode == 2 and "make package" in r.stderr
    r = run("--policy", "sft/10", "--policy", "sft/10@T=1.6", "--policy", "sft/5")
    assert r.returncode == 2 and "same policy" in r.stderr and "Traceback" not in r.stderr
    r = run("--policy", "sft/5", "--policy", "sft/10@T=2", "--dry-run")
    assert r.returncode == 0 and "held-out keyframe" in r.stdout and "sft/10@T=2" in r.stdout
    with pytest.raises(ConfigError, match="at least 2"):
        ranking.rank_policies([ranking.parse_policy("sft/5", run_with_pair)], pair=run_with_pair, manifest=run_with_pair,
                              sim=TINY.sim, tasks=(0,), trials=1, real_trials=1, keyframes_per_task=1, max_chunk=0,
                              seed=0, workers=1, out_dir=run_with_pair)
    assert json.loads((run_with_pair / "model_pair" / "pair.json").read_text())  # nothing written over


def test_control_false_alarms_follow_the_rewards_threshold(sft_run, tmp_path):  # noqa: F811
    """Imagination's false-alarm rate for the controls: a reward whose threshold every frame
    clears calls every rollout successful at its first chunk, one no frame clears none."""
    import shutil

    from tests.rl.conftest import add_pair

    rates = {}
    for threshold in (0.0, 1.01):
        run = tmp_path / f"t{threshold}"
        shutil.copytree(sft_run, run)
        pair = add_pair(run, threshold=threshold, episodes=8)
        rates[threshold] = ranking.control_false_alarms(pair, run / "manifest.json", trials=2, max_chunks=3)
    for name in ranking.CONTROLS:
        always, never = rates[0.0][name], rates[1.01][name]
        assert always["success_rate"] == 1.0 and always["success_chunk_mean"] == 1.0
        assert never["success_rate"] == 0.0 and never["success_chunk_mean"] is None
        assert never["imagined_steps"] == never["rollouts"] * 3 * 8  # every rollout ran its 3 chunks
        assert always["rollouts"] == never["rollouts"] == 2 * rates[0.0]["keyframes"]["count"]


def test_traces_run_every_rollout_to_the_end_without_changing_the_decision(sft_run, tmp_path):  # noqa: F811
    """``traces``: a reward whose threshold every frame clears still decides success at the first
    chunk, but the rollouts go on to the last chunk and each keeps one probability per chunk."""
    from tests.rl.conftest import add_pair

    pair = add_pair(sft_run, threshold=0.0, episodes=8)
    env, contract, _ = ranking.held_out_env(pair, sft_run / "manifest.json", image_size=None, chunk_size=None,
                                            max_chunks=3, tasks=None, max_chunk=0, keyframes_per_task=5, seed=0,
                                            device="cpu", bf16=False)
    hold = ranking.ControlPolicy("hold", env.chunk_size, contract["action_dim"])
    plain, traced = ranking.imagined_success(env, hold, 2), ranking.imagined_success(env, hold, 2, traces=True)
    assert plain["success_rate"] == traced["success_rate"] == 1.0
    assert plain["success_chunk_mean"] == traced["success_chunk_mean"] == 1.0  # decided at the first chunk
    assert "traces" not in plain and plain["imagined_steps"] == plain["rollouts"] * 8  # stopped at the success
    assert traced["imagined_steps"] == traced["rollouts"] * 8  # steps count to the decision, not the imagining
    assert len(traced["traces"]) == traced["rollouts"] == len(traced["trace_keyframes"])
    assert all(len(t) == 3 and all(0 <= p <= 1 for p in t) for t in traced["traces"])  # every chunk imagined
    assert traced["success_rate_by_success_chunks"] == {"1": 1.0, "2": 1.0, "3": 1.0}  # every chunk clears
    # success_chunks = 2: the crossing and the chunk after it; the rollout acts (and counts) both
    env2, _, _ = ranking.held_out_env(pair, sft_run / "manifest.json", image_size=None, chunk_size=None, max_chunks=3,
                                      tasks=None, max_chunk=0, keyframes_per_task=5, seed=0, device="cpu", bf16=False,
                                      success_chunks=2)
    two = ranking.imagined_success(env2, hold, 2)
    assert two["success_rate"] == 1.0 and two["success_chunk_mean"] == 2.0 and two["success_chunks"] == 2
    assert two["imagined_steps"] == two["rollouts"] * 2 * 8
    with pytest.raises(ValueError, match="success_chunks"):
        ranking.held_out_env(pair, sft_run / "manifest.json", image_size=None, chunk_size=None, max_chunks=3,
                             tasks=None, max_chunk=0, keyframes_per_task=5, seed=0, device="cpu", bf16=False,
                             success_chunks=4)


def test_guidance_scales_share_the_real_runs_and_need_a_dropout_pair(sft_run, tmp_path):  # noqa: F811
    """``guidance=(1, 2)``: every policy imagined at both scales (the first the headline, each with
    its own Spearman) beside one real evaluation; a pair trained without action dropout refuses a
    scale other than 1 before any rollout, saying how to retrain."""
    import shutil

    from tests.rl.conftest import add_pair

    runs = {}
    for dropout in (0.0, 0.1):
        runs[dropout] = tmp_path / f"d{dropout}"
        shutil.copytree(sft_run, runs[dropout])
        add_pair(runs[dropout], threshold=0.5, episodes=8, action_dropout=dropout)
    specs = [ranking.parse_policy(t, sft_run) for t in ("hold", "random")]
    kw = dict(sim=override(TINY.sim, max_steps=16), tasks=(0,), trials=1, real_trials=1, keyframes_per_task=1,
              max_chunk=0, seed=0, workers=1, device="cpu", bf16=False)
    plain = runs[0.0] / "model_pair"
    with pytest.raises(ConfigError, match="--action-dropout 0.1"):
        ranking.rank_policies(specs, pair=plain, manifest=runs[0.0] / "manifest.json", out_dir=tmp_path / "no",
                              guidance=(1.0, 2.0), **kw)
    assert not (tmp_path / "no").exists()  # refused before the real simulator ran
    result = ranking.rank_policies(specs, pair=runs[0.1] / "model_pair", manifest=runs[0.1] / "manifest.json",
                                   out_dir=tmp_path / "yes", guidance=(1.0, 2.0), **kw)
    assert result["guidance"] == 1.0 and set(result["spearman_by_guidance"]) == {"1.0", "2.0"}
    for row in result["policies"]:
        assert set(row["imagined_by_guidance"]) == {"1.0", "2.0"}
        assert row["imagined"] == row["imagined_by_guidance"]["1.0"]
        assert row["imagined_by_guidance"]["2.0"]["rollouts"] == row["imagined"]["rollouts"]
        assert row["real"]["trials"] == 1  # one real evaluation for both scales
    single = ranking.rank_policies(specs, pair=plain, manifest=runs[0.0] / "manifest.json", out_dir=tmp_path / "one",
                                   **kw)
    assert single["guidance"] == 1.0 and "spearman_by_guidance" not in single
    assert all("imagined_by_guidance" not in r for r in single["policies"])
