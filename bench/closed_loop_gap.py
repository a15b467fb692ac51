"""Where an imagined GRPO run's policy falls behind its recorded episodes: every rollout of the
run, by the policy that recorded its start keyframe and the keyframe's chunk in that episode,
imagined success beside the recorded episode's real success.

    python bench/closed_loop_gap.py runs/h200/grpo/seed0 runs/h200/grpo/seed1 [--steps 1] [--json out.json]
    python bench/closed_loop_gap.py runs/h200/grpo/seed0 --steps 1 --thresholds 0.74,0.5,0.3,0.2,0.1
    python bench/closed_loop_gap.py runs/h200/grpo/seed0 runs/h200/grpo/seed1 --steps 1 --by-task --thresholds 0.3

Where the policy in the loop is the one that recorded the episodes (GRPO's first step from the
collecting checkpoint, at the same temperature), imagined and recorded success should match. A
gap that shrinks for later keyframes (fewer chunks left to imagine) is error that compounds over
the policy's own imagined chunks; a gap alike at every chunk is something else (the reward, the
start frames). Each rollout's keyframe is found again from the run's keyframe index with the
rule ImaginedEnv.starts follows (not from its name: runs packaged before episode keys named
their folder gave two collections' ``task_00.hdf5:demo_3`` the same name).

``--thresholds``: what the reward's threshold would have made of the same rollouts. A rollout
succeeds at the first chunk whose probability reaches the threshold, so at any threshold up to
the run's own, success is its logged peak reaching it: exact, no imagining again. Per recording
policy: the imagined success, the same given a recorded success and given a recorded failure,
and their balanced accuracy (how well the pair, closed loop, tells the episodes that succeeded
from those that failed). The recorded outcome is one draw of the policy from that start, so
even a perfect pair would not reach 1. GRPO takes a threshold with ``--reward-threshold``."""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))


def run_rollouts(run: Path, steps: set[int] | None) -> tuple[list[dict], float | None]:
    """Every rollout of ``steps`` (None: all) whose start keyframe knows its episode's outcome:
    recording policy, keyframe chunk, recorded and imagined success, reward peak; and the
    threshold the run's rewards were decided at."""
    from wmrl.layout import RunLayout
    from wmrl.rl.envs import group_tasks, keyframe_choice, start_keyframes

    layout = RunLayout(run)
    index_files = sorted(layout.grpo.glob("keyframes-*.json"))
    if len(index_files) != 1:
        sys.exit(f"error: {layout.grpo} holds {len(index_files)} keyframe indexes; give a GRPO run in imagination "
                 "(python/grpo.py --env wm) that used one pair")
    index = json.loads(index_files[0].read_text())
    keyframes, seed = index["keyframes"], int(index["seed"])
    # the starts' candidates: a run with grpo.start_recorded_by kept only some policies' keyframes
    by_task = start_keyframes(keyframes, sorted({int(k["task"]) for k in keyframes}), index.get("recorded_by", "*"))
    step_tasks = {}
    for line in layout.log("grpo").read_text().splitlines():  # the tasks of the run (a step's record)
        rec = json.loads(line)
        step_tasks[rec["step"]] = tuple(rec["tasks"])
    out = []
    for line in (layout.grpo / "rollouts.jsonl").read_text().splitlines():
        rec = json.loads(line)
        step = rec["step"]
        if steps and step not in steps:
            continue
        groups = 1 + max(o["group"] for o in rec["outcomes"])
        window = group_tasks(step_tasks[step], step, groups)
        for o in rec["outcomes"]:
            ids = by_task[window[o["group"]]]
            k = keyframes[ids[keyframe_choice(seed, step, o["group"], len(ids))]]
            if o["start"] != f"keyframe:{k['episode']}:{k['chunk']}":
                sys.exit(f"error: {run} step {step} group {o['group']} started from {o['start']}, the index's rule gives "
                         f"{k['episode']}:{k['chunk']}: the run's keyframe index and its rollouts do not belong together")
            if k.get("episode_success") is None or not k.get("episode_policy"):
                continue  # a pair packaged before keyframes carried their episode's outcome
            out.append({"policy": k["episode_policy"], "chunk": int(k["chunk"]), "task": int(k["task"]),
                        "recorded": bool(k["episode_success"]),
                        "imagined": bool(o["success"]), "peak": o.get("reward_peak")})
    saved = layout.policy_steps("policy")
    threshold = (json.loads((layout.checkpoint(saved[-1]) / "config.json").read_text()).get("env", {})
                 .get("reward_threshold") if saved else None)
    return out, threshold


def chunk_rows(rollouts: list[dict]) -> dict:
    """{(recording policy, keyframe chunk): [imagined successes, recorded successes, rollouts]}."""
    rows: dict = defaultdict(lambda: [0, 0, 0])
    for r in rollouts:
        row = rows[(r["policy"], r["chunk"])]
        row[0] += r["imagined"]
        row[1] += r["recorded"]
        row[2] += 1
    return rows


def policy_sweeps(rollouts: list[dict], thresholds: list[float]) -> list[dict]:
    """``wmrl.evaluation.closed_loop.threshold_sweep`` per recording policy (success = the logged peak reaches it)."""
    from wmrl.evaluation.closed_loop import threshold_sweep

    return [{"policy": policy, **row} for policy in sorted({r["policy"] for r in rollouts})
            for row in threshold_sweep([r for r in rollouts if r["policy"] == policy and r["peak"] is not None],
                                       thresholds)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", type=Path, help="GRPO run folders (python/grpo.py --env wm)")
    p.add_argument("--steps", help="only these GRPO steps, e.g. 1 (the policy that recorded the episodes) or 1-3")
    p.add_argument("--thresholds", help="comma-separated reward thresholds, each at most the run's own: what they "
                                        "would have made of the same rollouts (e.g. 0.74,0.5,0.3,0.2)")
    p.add_argument("--by-task", action="store_true", help="also per task, all the runs together (imagined at the run's "
                                                           "threshold and at each of --thresholds, recorded)")
    p.add_argument("--json", type=Path, help="write the table here too")
    args = p.parse_args(argv)
    steps = None
    if args.steps:
        lo, _, hi = args.steps.partition("-")
        steps = set(range(int(lo), int(hi or lo) + 1))
    thresholds = [float(x) for x in args.thresholds.split(",")] if args.thresholds else []
    table, sweeps, everyone = {}, {}, []
    for run in args.runs:
        if not (run / "grpo" / "rollouts.jsonl").exists():
            sys.exit(f"error: {run}/grpo/rollouts.jsonl not found: give the folder of a GRPO run (its --run)")
        rollouts, own = run_rollouts(run, steps)
        everyone += rollouts
        rows = chunk_rows(rollouts)
        print(f"{run}: imagined / recorded success by recording policy and keyframe chunk (rollouts)")
        for policy in sorted({pol for pol, _ in rows}):
            cells = [(c, *rows[(policy, c)]) for c in sorted(c for pol, c in rows if pol == policy)]
            total = [sum(x[i] for x in cells) for i in (1, 2, 3)]
            print(f"  {policy}: " + "  ".join(f"c{c} {100 * i / n:.0f}/{100 * r / n:.0f}% ({n})" for c, i, r, n in cells)
                  + f"  | all {100 * total[0] / total[2]:.0f}/{100 * total[1] / total[2]:.0f}% ({total[2]})")
        table[str(run)] = [{"policy": pol, "chunk": c, "imagined_successes": i, "recorded_successes": r, "rollouts": n}
                           for (pol, c), (i, r, n) in sorted(rows.items())]
        if thresholds:
            above = [th for th in thresholds if own is not None and th > own + 1e-6]
            if own is None or above:
                sys.exit(f"error: --thresholds {','.join(map(str, above or thresholds))}: above the run's own threshold "
                         f"({own}) a logged peak no longer tells success (the rollout stopped at its first success); "
                         "give thresholds at most that")
            sweeps[str(run)] = policy_sweeps(rollouts, thresholds)
            print(f"  the run's threshold {own:.2f}; success had the reward's threshold been (recorded success; "
                  "imagined | given recorded success, failure; balanced accuracy):")
            for row in sweeps[str(run)]:
                print(f"    {row['policy']} at {row['threshold']:.2f}: recorded {100 * row['recorded_success']:.0f}%, "
                      f"imagined {100 * row['imagined_success']:.0f}% | {_pct(row['given_recorded_success'])}, "
                      f"{_pct(row['given_recorded_failure'])}; {_num(row['balanced_accuracy'])}")
    by_task = task_rows(everyone, thresholds) if args.by_task else []
    for policy in sorted({r["policy"] for r in by_task}):
        print(f"all runs, {policy}, by task: imagined (at {', '.join(map(str, thresholds)) or '-'}) / recorded (rollouts)")
        for r in (r for r in by_task if r["policy"] == policy):
            at = " ".join(f"{100 * x:.0f}%" for x in r["imagined_at"])
            print(f"  task {r['task']}: {100 * r['imagined']:.0f}% ({at}) / {100 * r['recorded']:.0f}% ({r['rollouts']})")
    if args.json:
        from wmrl.fileio import write_json

        write_json(args.json, {"steps": args.steps, "runs": table, "threshold_sweeps": sweeps, "by_task": by_task})
    return 0


def task_rows(rollouts: list[dict], thresholds: list[float]) -> list[dict]:
    """Per recording policy and task: imagined success as logged and at each threshold (the
    logged peak reaching it), the recorded success, the rollouts."""
    out = []
    for policy, task in sorted({(r["policy"], r["task"]) for r in rollouts}):
        rs = [r for r in rollouts if r["policy"] == policy and r["task"] == task]
        out.append({"policy": policy, "task": task, "rollouts": len(rs), "imagined": sum(r["imagined"] for r in rs) / len(rs),
                    "imagined_at": [sum(r["peak"] is not None and r["peak"] >= th for r in rs) / len(rs)
                                    for th in thresholds],
                    "recorded": sum(r["recorded"] for r in rs) / len(rs)})
    return out


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


if __name__ == "__main__":
    sys.exit(main())
