"""Where an imagined GRPO run's policy falls behind its recorded episodes: every rollout of the
run, by the policy that recorded its start keyframe and the keyframe's chunk in that episode,
imagined success beside the recorded episode's real success.

    python bench/closed_loop_gap.py runs/h200/grpo/seed0 runs/h200/grpo/seed1 [--steps 1] [--json out.json]

Where the policy in the loop is the one that recorded the episodes (GRPO's first step from the
collecting checkpoint, at the same temperature), imagined and recorded success should match. A
gap that shrinks for later keyframes (fewer chunks left to imagine) is error that compounds over
the policy's own imagined chunks; a gap alike at every chunk is something else (the reward, the
start frames). Each rollout's keyframe is found again from the run's keyframe index with the
rule ImaginedEnv.starts follows (not from its name: runs packaged before episode keys named
their folder gave two collections' ``task_00.hdf5:demo_3`` the same name)."""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))


def run_rows(run: Path, steps: set[int] | None) -> dict:
    """{(recording policy, keyframe chunk): [imagined successes, recorded successes, rollouts]}."""
    from wmrl.layout import RunLayout
    from wmrl.rl.envs import group_tasks, keyframe_choice

    layout = RunLayout(run)
    index_files = sorted(layout.grpo.glob("keyframes-*.json"))
    if len(index_files) != 1:
        sys.exit(f"error: {layout.grpo} holds {len(index_files)} keyframe indexes; give a GRPO run in imagination "
                 "(python/grpo.py --env wm) that used one pair")
    index = json.loads(index_files[0].read_text())
    keyframes, seed = index["keyframes"], int(index["seed"])
    tasks = sorted({k["task"] for k in keyframes})
    by_task = {t: [i for i, k in enumerate(keyframes) if k["task"] == t] for t in tasks}
    step_tasks = {}
    for line in layout.log("grpo").read_text().splitlines():  # the tasks of the run (a step's record)
        rec = json.loads(line)
        step_tasks[rec["step"]] = tuple(rec["tasks"])
    rows: dict = defaultdict(lambda: [0, 0, 0])
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
            row = rows[(k["episode_policy"], int(k["chunk"]))]
            row[0] += bool(o["success"])
            row[1] += bool(k["episode_success"])
            row[2] += 1
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", type=Path, help="GRPO run folders (python/grpo.py --env wm)")
    p.add_argument("--steps", help="only these GRPO steps, e.g. 1 (the policy that recorded the episodes) or 1-3")
    p.add_argument("--json", type=Path, help="write the table here too")
    args = p.parse_args(argv)
    steps = None
    if args.steps:
        lo, _, hi = args.steps.partition("-")
        steps = set(range(int(lo), int(hi or lo) + 1))
    table = {}
    for run in args.runs:
        if not (run / "grpo" / "rollouts.jsonl").exists():
            sys.exit(f"error: {run}/grpo/rollouts.jsonl not found: give the folder of a GRPO run (its --run)")
        rows = run_rows(run, steps)
        print(f"{run}: imagined / recorded success by recording policy and keyframe chunk (rollouts)")
        for policy in sorted({pol for pol, _ in rows}):
            cells = [(c, *rows[(policy, c)]) for c in sorted(c for pol, c in rows if pol == policy)]
            total = [sum(x[i] for x in cells) for i in (1, 2, 3)]
            print(f"  {policy}: " + "  ".join(f"c{c} {100 * i / n:.0f}/{100 * r / n:.0f}% ({n})" for c, i, r, n in cells)
                  + f"  | all {100 * total[0] / total[2]:.0f}/{100 * total[1] / total[2]:.0f}% ({total[2]})")
        table[str(run)] = [{"policy": pol, "chunk": c, "imagined_successes": i, "recorded_successes": r, "rollouts": n}
                           for (pol, c), (i, r, n) in sorted(rows.items())]
    if args.json:
        from wmrl.fileio import write_json

        write_json(args.json, {"steps": args.steps, "runs": table})
    return 0


if __name__ == "__main__":
    sys.exit(main())
