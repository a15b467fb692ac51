"""Two evaluations of the same fixed states compared state by state: how many states went from
failure to success and back, the change with its paired standard error, McNemar's chi-square
(``wmrl.evaluation.evidence.paired_change``; ``make cycle``'s report shows the same per cycle).
Each argument is an evaluation's results.json or its evidence file (both keep every episode):

    python bench/paired_change.py runs/a/eval/sft/global_step_4000/results.json \
        runs/a/grpo/seed3/eval/global_step_4/results.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from wmrl.evaluation.evidence import build_warning, paired_change  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("before", type=Path)
    p.add_argument("after", type=Path)
    a = p.parse_args(argv)
    for f in (a.before, a.after):
        if not f.is_file():
            sys.exit(f"error: {f} not found: give two evaluations' results.json (or evidence) files")
    before, after = (json.loads(f.read_text()) for f in (a.before, a.after))
    c = paired_change(before, after)
    if c is None:
        sys.exit("error: the two did not evaluate the same states (task, trial), or one kept no episodes")
    print(f"{c['states']} states: {c['up']} up, {c['down']} down; change {100 * c['change']:+.1f} points, paired "
          f"standard error {100 * c['paired_se']:.1f}; McNemar chi2 {c['mcnemar_chi2']:.1f}; samplers "
          f"{' -> '.join(c['samplers'])}; simulators {' -> '.join(s or 'unrecorded' for s in c['simulators'])}")
    if warning := build_warning(c):
        print(f"warning: {warning} (bench/RESULTS.md, \"Run 19\": one policy read 11.8 points apart "
              "in mujoco 2.3.7 and 3.3.7)")
    return c


if __name__ == "__main__":
    main()
