"""Did what GRPO gained in imagination carry over to the simulator? Task by task, for GRPO runs in
a pair: imagined success in the first and in the last steps (the rollouts log), beside real
success before (a baseline evaluation: the policy GRPO started from) and after (each run's newest
evaluation), and the rank correlation of the two changes over tasks.

    python bench/grpo_transfer.py runs/h200/grpo/seed0 runs/h200/grpo/seed1 \
        --baseline runs/h200/evidence/evaluations/sft/global_step_4000.json [--first 1 --last 2] [--json out.json]

A pair that carries GRPO answers the policy's changes as the simulator does: the tasks where
imagined success rose are those where real success rose. Where it does not, GRPO learns what
succeeds in the pair's frames (bench/RESULTS.md, "GRPO in the one-step students with the
closed-loop threshold": imagined +7 to +13 points, real -3.4 +- 3.5, the largest imagined gains on
tasks that lost real success). Imagined figures of early and late steps come from different start
keyframes of the same tasks (the starts slide with the step); real figures from the same fixed
initial states before and after, with the evaluation's own trials per task (their standard error
is sqrt(p(1-p)/trials): ~7 points at 40 trials)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))


def real_by_task(evaluation: Path) -> dict[int, tuple[int, int]]:
    """{task: (successes, trials)} of an evaluation's evidence JSON (``evaluate.py`` / GRPO's evaluations)."""
    per_task = json.loads(evaluation.read_text())["summary"]["per_task"]
    return {int(t): (int(r["successes"]), int(r["trials"])) for t, r in per_task.items()}


def newest_evaluation(run: Path) -> Path:
    from wmrl.layout import RunLayout

    found = sorted(RunLayout(run).evidence_dir().glob("global_step_*.json"), key=lambda p: int(p.stem.rpartition("_")[2]))
    if not found:
        sys.exit(f"error: {run} holds no evaluation (evidence/evaluations/global_step_N.json): run GRPO to a step "
                 "that evaluates, or `make eval` its newest step")
    return found[-1]


def transfer(runs: list[Path], baseline: Path, first: int = 1, last: int = 2) -> dict:
    """Per task, all runs together: imagined success in the runs' first ``first`` and last ``last``
    steps, real success before (``baseline``) and after (each run's newest evaluation, pooled);
    the changes' Spearman over tasks; and per run the overall figures."""
    from closed_loop_gap import run_rollouts

    from wmrl.evaluation.ranking import spearman

    before = real_by_task(baseline)
    imagined: dict[str, dict[int, list[int]]] = {"first": {}, "last": {}}  # task -> [successes, rollouts]
    after: dict[int, list[int]] = {}
    per_run = []
    for run in runs:
        steps = sorted({json.loads(line)["step"] for line in (run / "grpo" / "rollouts.jsonl").read_text().splitlines()})
        windows = {"first": set(steps[:first]), "last": set(steps[-last:])}
        row = {"run": str(run), "steps": [steps[0], steps[-1]] if steps else []}
        for name, window in windows.items():
            rollouts, _ = run_rollouts(run, window)
            for r in rollouts:
                cell = imagined[name].setdefault(r["task"], [0, 0])
                cell[0] += r["imagined"]
                cell[1] += 1
            row[f"imagined_{name}"] = sum(r["imagined"] for r in rollouts) / len(rollouts) if rollouts else None
        evaluation = newest_evaluation(run)
        real = real_by_task(evaluation)
        for task, (wins, trials) in real.items():
            cell = after.setdefault(task, [0, 0])
            cell[0] += wins
            cell[1] += trials
        row.update(evaluation=str(evaluation), real_after=sum(w for w, _ in real.values()) / sum(n for _, n in real.values()))
        per_run.append(row)
    rate = lambda cell: cell[0] / cell[1] if cell and cell[1] else None  # noqa: E731
    tasks = []
    for task in sorted(set(before) | set(after)):
        tasks.append({"task": task, "imagined_first": rate(imagined["first"].get(task)),
                      "imagined_last": rate(imagined["last"].get(task)), "real_before": rate(before.get(task)),
                      "real_after": rate(after.get(task)), "real_trials_after": after.get(task, [0, 0])[1]})
    both = [t for t in tasks if None not in (t["imagined_first"], t["imagined_last"], t["real_before"], t["real_after"])]
    rho = spearman([t["imagined_last"] - t["imagined_first"] for t in both], [t["real_after"] - t["real_before"] for t in both])
    return {"baseline": str(baseline), "real_before": sum(w for w, _ in before.values()) / sum(n for _, n in before.values()),
            "first_steps": first, "last_steps": last, "runs": per_run, "tasks": tasks, "spearman_of_changes": rho}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", type=Path, help="GRPO run folders in imagination (python/grpo.py --env wm)")
    p.add_argument("--baseline", type=Path, required=True,
                   help="the evaluation JSON of the policy GRPO started from, same sampler and fixed states")
    p.add_argument("--first", type=int, default=1, help="imagined success over the runs' first N steps (1)")
    p.add_argument("--last", type=int, default=2, help="... and over their last N steps (2)")
    p.add_argument("--json", type=Path, help="write the result here too")
    args = p.parse_args(argv)
    for run in args.runs:
        if not (run / "grpo" / "rollouts.jsonl").exists():
            sys.exit(f"error: {run}/grpo/rollouts.jsonl not found: give the folder of a GRPO run in imagination (its --run-dir)")
    if not args.baseline.is_file():
        sys.exit(f"error: {args.baseline} not found: give the evaluation JSON of the starting policy "
                 "(RUN/evidence/evaluations/[sft/]global_step_N.json)")
    if args.first < 1 or args.last < 1:
        sys.exit("error: --first and --last count steps: at least 1")
    out = transfer(args.runs, args.baseline, args.first, args.last)
    for r in out["runs"]:
        print(f"{r['run']}: imagined {_pct(r['imagined_first'])} (first {args.first} steps) -> {_pct(r['imagined_last'])} "
              f"(last {args.last}); real {_pct(out['real_before'])} -> {_pct(r['real_after'])} ({r['evaluation']})")
    print("task: imagined first -> last | real before -> after (trials after, all runs)")
    for t in out["tasks"]:
        print(f"  {t['task']}: {_pct(t['imagined_first'])} -> {_pct(t['imagined_last'])} | "
              f"{_pct(t['real_before'])} -> {_pct(t['real_after'])} ({t['real_trials_after']})")
    rho = out["spearman_of_changes"]
    print(f"Spearman of the imagined and the real change over tasks: {'-' if rho is None else f'{rho:+.2f}'} "
          "(a pair that carries GRPO: clearly positive)")
    if args.json:
        from wmrl.fileio import write_json

        write_json(args.json, out)
    return 0


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


if __name__ == "__main__":
    sys.exit(main())
