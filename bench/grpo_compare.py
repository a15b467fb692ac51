"""GRPO runs side by side, from their logs alone (no weights, no GPU): what an A/B of two settings
needs, e.g. the two arms of ``grpo.world_noise`` brought back from the lent machine as tarballs.

    python bench/grpo_compare.py runs/h200/grpo/seed0 runs/h200/grpo/seed1 runs/h200/grpo_b/seed0 ...

One row per run: rollout success per step, the groups that carried an advantage (members whose
outcomes differ; the rest are skipped), the gradient cosine of the two halves of the groups where
it was measured, the mean rollout and update seconds, and the newest real evaluation. Then, per
setting that differs between the runs (the ``grpo`` and environment settings in each run's newest
policy checkpoint), the pooled
share of groups with mixed outcomes, and in imagination the pair's closed-loop check
(``ImaginedEnv.diagnostics``: imagined against real success from the same recorded episodes' starts).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from wmrl.layout import RunLayout, parse_step_name  # noqa: E402
from wmrl.report import closed_loop_rows  # noqa: E402


def steps(run: Path) -> list[dict]:
    log = run / "logs" / "grpo.jsonl"
    if not log.is_file():
        sys.exit(f"error: {log} not found: give GRPO run folders (each with logs/grpo.jsonl)")
    rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    return [r for r in rows if "rollout_success" in r]


def settings(run: Path) -> dict:
    """The GRPO settings the run's newest policy checkpoint was trained with, and its
    environment's plain settings as ``env.<name>`` (e.g. ``env.pair``: which pair it imagined in)."""
    layout = RunLayout(run)
    steps = layout.policy_steps()
    if not steps:
        return {}
    cfg = json.loads((layout.checkpoint(steps[-1]) / "config.json").read_text())
    env = {f"env.{k}": v for k, v in cfg.get("env", {}).items()
           if not isinstance(v, (dict, list)) and k != "keyframe_index"}  # (the index lives in each run: always differs)
    return {**cfg.get("grpo", {}), **env}


def newest_eval(run: Path) -> str:
    layout = RunLayout(run)
    folder = layout.evidence_dir()
    steps = sorted(s for s in (parse_step_name(f.stem) for f in folder.glob("*.json")) if s is not None) \
        if folder.is_dir() else []
    if not steps:
        return "-"
    d = json.loads(layout.evidence(steps[-1]).read_text()).get("summary", {})
    s, n = d.get("successes"), d.get("trials")
    return f"step {steps[-1]}: {s} / {n}" if s is not None and n else f"step {steps[-1]}"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", type=Path, help="GRPO run folders")
    a = p.parse_args(argv)
    runs = {r: (steps(r), settings(r)) for r in a.runs}
    keys = sorted({k for _, cfg in runs.values() for k in cfg})
    differ = [k for k in keys if len({json.dumps(cfg.get(k)) for _, cfg in runs.values()}) > 1 and k != "seed"]
    print("| run | " + " | ".join(differ) + (" | " if differ else "") + "rollout success per step | "
          "groups with mixed outcomes per step | gradient cosine of halves | rollout / update s | env steps/s | "
          "newest real evaluation |")
    print("|---" * (len(differ) + 7) + "|")
    pooled: dict[str, list[int]] = {}
    for run, (rows, cfg) in runs.items():
        mixed = [r["groups"] - r["skipped_groups"] for r in rows]
        cos = [f"{r['grad_cos_halves']:+.2f}" for r in rows if isinstance(r.get("grad_cos_halves"), float)
               and r["grad_cos_halves"] == r["grad_cos_halves"]]  # NaN where not measured that step
        mean = lambda k: sum(r[k] for r in rows) / max(len(rows), 1)  # noqa: E731
        rate = [r["env_steps_per_s"] for r in rows if "env_steps_per_s" in r]  # with the policy in the loop
        tag = ", ".join(f"{k}={cfg.get(k)}" for k in differ) or "all"
        got = pooled.setdefault(tag, [0, 0])
        got[0] += sum(mixed)
        got[1] += sum(r["groups"] for r in rows)
        print(f"| {run} | " + " | ".join(str(cfg.get(k)) for k in differ) + (" | " if differ else "")
              + ", ".join(f"{100 * r['rollout_success']:.1f}" for r in rows) + "% | "
              + ", ".join(f"{m}/{r['groups']}" for m, r in zip(mixed, rows)) + f" | {', '.join(cos) or '-'} | "
              + f"{mean('rollout_s'):.1f} / {mean('update_s'):.1f} | "
              + (f"{min(rate):,.0f}-{max(rate):,.0f}" if rate else "-") + f" | {newest_eval(run)} |")
    print()
    for tag, (m, n) in pooled.items():
        print(f"{tag}: {m} of {n} group-steps had mixed outcomes ({100 * m / max(n, 1):.0f}%)")
    for run, (rows, _) in runs.items():  # imagination: the pair's closed-loop check at the first step that has it
        first = next((r for r in rows if r.get("from_episode_starts")), None)
        if first:
            print(f"{run}, step {first['step']}, from the first keyframe of recorded episodes: "
                  + closed_loop_rows(first["from_episode_starts"]))


if __name__ == "__main__":
    main()
