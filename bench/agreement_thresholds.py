"""A pair's episode agreement with the simulator at other reward thresholds, read offline from
``make wm-eval``'s ``reward_traces`` (``PAIR/fidelity.json``): is a low agreement the calibrated
threshold's fault, or can no threshold tell the imagined successes from the failures?

    python bench/agreement_thresholds.py runs/h200/model_pair/fidelity.json [other fidelity.json ...] [--chunks 2]

An imagined episode succeeds when the reward reaches the threshold in ``--chunks`` chunks in a
row (GRPO's ``success_chunks``); the start frame is real and never judged, as in ``wm-eval``.
Balanced accuracy against the simulator's outcome, per threshold, with the best.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

THRESHOLDS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99)


def imagined_success(trace: list, threshold: float, chunks: int) -> bool:
    run = 0
    for p in trace[1:]:  # chunk 0 is the real start frame
        run = run + 1 if p is not None and p >= threshold else 0
        if run >= chunks:
            return True
    return False


def balanced(pred: list[bool], truth: list[bool]) -> float | None:
    pos = [p for p, t in zip(pred, truth) if t]
    neg = [not p for p, t in zip(pred, truth) if not t]
    if not pos or not neg:
        return None  # one outcome only: no balanced accuracy
    return (sum(pos) / len(pos) + sum(neg) / len(neg)) / 2


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("fidelity", nargs="+", type=Path, help="PAIR/fidelity.json files of make wm-eval")
    p.add_argument("--chunks", type=int, default=1, help="chunks in a row at the threshold that make a success")
    a = p.parse_args()
    for f in a.fidelity:
        fid = json.loads(f.read_text())
        traces = fid.get("reward_traces")
        if not traces:
            raise SystemExit(f"error: {f} has no reward_traces: evaluate the pair again with this kit (make wm-eval)")
        truth = [bool(x) for x in traces["outcome"]]
        used = (fid.get("controls") or {}).get("threshold")
        print(f"{f}: {len(truth)} held-out episodes, {sum(truth)} real successes; the pair's threshold "
              f"{used if used is None else round(used, 3)}, its agreement {fid['agreement']['balanced_accuracy']}")
        rows = []
        for th in THRESHOLDS:
            pred = [imagined_success(t, th, a.chunks) for t in traces["imagined"]]
            rows.append((th, balanced(pred, truth), sum(p and t for p, t in zip(pred, truth)),
                         sum(p and not t for p, t in zip(pred, truth))))
            print(f"  threshold {th:<5} agreement {rows[-1][1] if rows[-1][1] is None else round(rows[-1][1], 3):<6} "
                  f"(true successes {rows[-1][2]}, false {rows[-1][3]})")
        scored = [r for r in rows if r[1] is not None]
        if scored:
            best = max(scored, key=lambda r: r[1])
            print(f"  best: {best[1]:.3f} at {best[0]}")


if __name__ == "__main__":
    main()
