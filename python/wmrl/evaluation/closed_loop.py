"""The reward's threshold calibrated closed loop: the policy acting in the pair, not replays.

``make wm-reward`` calibrates the reward's threshold on replays of recorded actions (open loop).
GRPO then lets the policy act on the pair's frames, and there its imagined completions read lower:
in an H100 pair's one-step students (calibrated at 0.74) a third to a half of the rollouts that
failed from starts whose recorded episode succeeded peaked between 0.2 and 0.74 (bench/RESULTS.md,
"256 groups a step in the one-step students"). Here the policy that recorded the manifest's
held-out episodes acts again from their keyframes in the pair, every rollout imagined to the last
chunk with the reward's probability kept, and the threshold is the one at which the pair's
imagined success best tells the episodes that succeeded from those that failed (balanced
accuracy, BA: an imagined rollout carries about (2 BA - 1)^2 of a real one's policy-gradient
signal, bench/grpo_snr.py, so the best BA is the most signal per rollout; the recorded outcome is
one draw of the policy from that start, so no threshold reaches 1). ``make wm-calibrate``
writes it to PAIR/closed_loop.json; ``make grpo ... REWARD_THRESHOLD=closed-loop`` uses it.

A lower threshold also lets more of what never succeeds through: the two controls (``hold``,
``random``) act from the same keyframes, and their imagined success at the chosen and at the
open-loop threshold is recorded beside the policy's (an H100 pair's students chose 0.10 where
replays said 0.40; bench/RESULTS.md "GRPO in the one-step students with the closed-loop threshold").
"""

from __future__ import annotations

import time
from pathlib import Path

from wmrl.release.pair import CLOSED_LOOP_FILE  # noqa: F401  (the file this module writes and GRPO reads)

GRID = tuple(round(0.05 * i, 2) for i in range(1, 20))  # 0.05 .. 0.95
ONE_OUTCOME = ("the held-out episodes all had the same outcome: closed-loop calibration needs successes and "
               "failures (collect more episodes, then make manifest again)")


def threshold_sweep(rows: list[dict], thresholds, hits=lambda row, th: row["peak"] >= th) -> list[dict]:
    """Per threshold: imagined success of ``rows`` (dicts with ``recorded``: the episode's real
    outcome, and what ``hits(row, threshold)`` reads: by default ``peak``, the highest reward
    probability before the rollout stopped), the same given a recorded success and given a
    recorded failure, and their balanced accuracy (None where one side has no rollout)."""
    won, lost = [r for r in rows if r["recorded"]], [r for r in rows if not r["recorded"]]
    out = []
    for th in thresholds:
        def rate(rs):
            return sum(bool(hits(r, th)) for r in rs) / len(rs) if rs else None

        s, f = rate(won), rate(lost)
        out.append({"threshold": th, "rollouts": len(rows), "recorded_success": len(won) / len(rows) if rows else None,
                    "imagined_success": rate(rows), "given_recorded_success": s, "given_recorded_failure": f,
                    "balanced_accuracy": None if s is None or f is None else (s + 1 - f) / 2})
    return out


def best_threshold(sweep: list[dict], calibrated: float) -> dict:
    """The sweep's row of the highest balanced accuracy; among equals the one nearest the
    open-loop calibration (a flat optimum then moves the threshold no further than it must)."""
    from wmrl.config import ConfigError

    rows = [r for r in sweep if r["balanced_accuracy"] is not None]
    if not rows:
        raise ConfigError(ONE_OUTCOME)
    return max(rows, key=lambda r: (round(r["balanced_accuracy"], 6), -abs(r["threshold"] - calibrated)))


def calibrate(pair: Path, manifest: Path, spec, *, trials: int, max_chunk: int, keyframes_per_task: int, seed: int,
              success_chunks: int = 1, device: str = "auto", bf16: bool = True) -> dict:
    """``spec`` (``ranking.PolicySpec``: a checkpoint with its sampler and temperature) from the
    keyframes of the held-out episodes that this very policy recorded, ``trials`` rollouts each,
    every one imagined to the end; the sweep over ``GRID`` (and the calibrated threshold) and the best."""
    from wmrl.device import pick_device
    from wmrl.evaluation.ranking import CONTROLS, ControlPolicy, held_out_env, imagined_success
    from wmrl.fileio import sha256_file
    from wmrl.policy.runner import PolicyRunner
    from wmrl.rl.envs import first_success

    dev = pick_device(device)
    runner = PolicyRunner(spec.checkpoint, device=str(dev), sampler=spec.sampler, temperature=spec.temperature,
                          seed=seed)
    env, contract, keyframes = held_out_env(pair, manifest, image_size=None, chunk_size=None, max_chunks=30, tasks=None,
                                            max_chunk=max_chunk, keyframes_per_task=keyframes_per_task, seed=seed,
                                            device=dev, bf16=bf16, success_chunks=success_chunks, policy=runner.policy_id)
    recorded = {name: real for name, (_, real, _) in env.keyframe_sources.items()}
    if len({bool(real) for real in recorded.values()}) < 2:  # said before any rollout: nothing to tell apart
        from wmrl.config import ConfigError

        raise ConfigError(ONE_OUTCOME)
    t0 = time.perf_counter()
    result = imagined_success(env, runner, trials, traces=True)
    task_of = dict(zip(env.keyframe_names, env.keyframe_tasks))
    rows = [{"recorded": bool(recorded[start]), "trace": trace, "task": task_of[start]}
            for start, trace in zip(result["trace_keyframes"], result["traces"])]
    calibrated = env.threshold
    thresholds = sorted({*GRID, round(calibrated, 4)})
    sweep = threshold_sweep(rows, thresholds, hits=lambda r, th: first_success(r["trace"], th, success_chunks) is not None)
    best = best_threshold(sweep, calibrated)
    hit = lambda r: first_success(r["trace"], best["threshold"], success_chunks) is not None  # noqa: E731
    # task by task at the chosen threshold: where the pair renders the policy's successes and
    # where it does not at any threshold (an H100 pair: tasks 2, 4, 9 at 1-9% against 0-68% recorded)
    by_task = []
    for task in sorted({r["task"] for r in rows}):
        rs = [r for r in rows if r["task"] == task]
        by_task.append({"task": task, "rollouts": len(rs), "imagined_success": sum(map(hit, rs)) / len(rs),
                        "recorded_success": sum(r["recorded"] for r in rs) / len(rs)})
    # the controls from the same keyframes, judged at both thresholds: a threshold low enough to
    # let a still arm or random actions succeed would reward GRPO for what never succeeds for real
    controls = {}
    for name in CONTROLS:
        ctl = imagined_success(env, ControlPolicy(name, env.chunk_size, contract["action_dim"], seed=seed), trials,
                               traces=True)
        traces = ctl["traces"]
        controls[name] = {"rollouts": len(traces), **{
            key: sum(first_success(t, th, success_chunks) is not None for t in traces) / len(traces)
            for key, th in (("at_threshold", best["threshold"]), ("at_calibrated", calibrated))}}
    return {"pair": str(pair), "pair_json_sha256": sha256_file(Path(pair) / "pair.json"), "manifest": str(manifest),
            "policy": spec.name, "policy_id": runner.policy_id, "keyframes": keyframes, "trials_per_keyframe": trials,
            "max_chunk": max_chunk, "success_chunks": success_chunks, "seed": seed,
            "threshold": best["threshold"], "calibrated_threshold": calibrated,
            "at_threshold": best, "at_calibrated": next(r for r in sweep if r["threshold"] == round(calibrated, 4)),
            "sweep": sweep, "by_task": by_task, "controls": controls, "seconds": round(time.perf_counter() - t0, 2),
            "device": str(dev)}


def grpo_threshold(setting: str, pair: Path, success_chunks: int, min_agreement: float = 0.0) -> float:
    """``GRPOConfig.reward_threshold`` for the env: 0.0 (the pair's own), the number, or the
    closed-loop calibration of this very pair.json (refused in one line where there is none, or
    one made for another pair or another success rule, or, with ``min_agreement`` (GRPO's gate),
    where a control succeeds too often at that threshold: ``check_controls``' rule, which wm-eval's
    figures pass at the replay threshold only)."""
    import json

    from wmrl.fileio import sha256_file
    from wmrl.release.pair import ModelPair, PairError, check_controls

    if setting == "pair":
        return 0.0
    if setting != "closed-loop":
        return float(setting)
    path = Path(pair) / CLOSED_LOOP_FILE
    if not path.is_file():
        raise PairError(f"{path} not found: calibrate the threshold closed loop first (make wm-calibrate RUN=... "
                        f"PAIR={pair} POLICY=<the checkpoint that recorded the episodes>@T=1)")
    cal = json.loads(path.read_text())
    if cal.get("pair_json_sha256") != sha256_file(Path(pair) / "pair.json"):
        raise PairError(f"{path} was calibrated for another pair.json: make wm-calibrate ... OVERWRITE=1 again")
    if cal.get("success_chunks") != success_chunks:
        raise PairError(f"{path} was calibrated for success_chunks={cal.get('success_chunks')}, GRPO asks "
                        f"{success_chunks}: make wm-calibrate ... SUCCESS_CHUNKS={success_chunks} OVERWRITE=1")
    if min_agreement > 0:  # (files written before the controls were rolled have none to check)
        counts = {name: {"rollouts": c["rollouts"], "successes": round(c["at_threshold"] * c["rollouts"])}
                  for name, c in (cal.get("controls") or {}).items()}
        check_controls(ModelPair(Path(pair), {}), counts, min_agreement,
                       source=f"{CLOSED_LOOP_FILE}, at its threshold {cal['threshold']}")
    return float(cal["threshold"])
