"""Is a pair's low agreement its reward's ranking or its threshold? One row per ``fidelity.json``.

``make wm-eval`` scores episode agreement at the reward's calibrated threshold. This reads the
reward traces the same evaluation stores (every held-out episode's reward probability per chunk)
and asks, whatever the threshold: how well does each episode's peak probability rank the
simulator's successes above its failures (AUC), and what would the best single threshold on these
episodes reach (optimistic: chosen where it is scored)? An AUC well below 0.85 says no threshold
can reach issue 15's bar; a best threshold far above the calibrated agreement says the calibration
(a few dozen validation episodes) costs the rest. The honest version of that best: the threshold
chosen on a random half of the episodes (``calibrate_episodes``, as ``make wm-reward`` chooses
it) and scored on the other half, averaged over many halves. Works on any ``fidelity.json`` with
``reward_traces``, older ones included:

    python bench/reward_ranking.py runs/h200/model_pair/fidelity.json runs/h200/model_pair_students/fidelity.json
    python bench/reward_ranking.py ... --plot bench/figures/reward_roc.png   # and their ROC curves
    python bench/reward_ranking.py A.json B.json --mean-of A.json,B.json    # and the two rewards averaged
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))


def split_half(traces: dict, splits: int = 300, seed: int = 0) -> float | None:
    """Mean balanced accuracy of episode success when the threshold is calibrated on one random
    half of the episodes and applied to the other (halves without both outcomes skipped);
    None where no half has both."""
    import torch

    from wmrl.worldmodel.fidelity import episode_peaks_from_traces
    from wmrl.worldmodel.reward import balanced_accuracy, calibrate_episodes

    peak, real = episode_peaks_from_traces(traces), torch.tensor(traces["outcome"], dtype=torch.bool)
    rng, order, scores = random.Random(seed), list(range(len(peak))), []
    for _ in range(splits):
        rng.shuffle(order)
        fit, held = (torch.tensor(part, dtype=torch.long) for part in (order[: len(order) // 2], order[len(order) // 2:]))
        chosen = calibrate_episodes(peak[fit], real[fit])  # None unless this half shows both outcomes
        if chosen is not None and real[held].any() and not real[held].all():
            scores.append(balanced_accuracy(peak[held] >= chosen[0], real[held]))
    return sum(scores) / len(scores) if scores else None


def load(path: Path) -> dict:
    d = json.loads(path.read_text())
    if "reward_traces" not in d:
        raise SystemExit(f"error: {path} has no reward_traces: run make wm-eval again with this kit's version")
    return d


def mean_of(paths: list[Path]) -> dict:
    """Rewards of the same imagined episodes as one: their probabilities averaged chunk by chunk
    (an ensemble, e.g. two reward seeds on one pair: ``make wm-eval`` replays the same episodes
    with the same noise). Refused where the files' episodes, outcomes or chunks differ."""
    ds = [load(p) for p in paths]
    t0 = ds[0]["reward_traces"]
    for p, d in zip(paths[1:], ds[1:]):
        t = d["reward_traces"]
        same = (t["outcome"] == t0["outcome"] and t.get("labels") == t0.get("labels")
                and d.get("seed") == ds[0].get("seed") and d.get("manifest") == ds[0].get("manifest")
                and [[x is None for x in e] for e in t["imagined"]] == [[x is None for x in e] for e in t0["imagined"]])
        if not same:
            raise SystemExit(f"error: {p} and {paths[0]} did not score the same episodes (outcomes, chunks, manifest "
                             "or seed differ): average only rewards evaluated by make wm-eval on one pair's replays")

    def average(frames: str) -> list:
        return [[None if xs[0] is None else round(sum(xs) / len(xs), 4) for xs in zip(*eps)]
                for eps in zip(*(d["reward_traces"][frames] for d in ds))]

    return {"agreement": {"episodes": len(t0["outcome"]), "real_successes": sum(map(bool, t0["outcome"]))},
            "reward_traces": {**t0, "imagined": average("imagined"), "real": average("real")}}


def pair_name(path: Path) -> str:
    """A pair's own file by its folder; a kept copy (bench/gpu.py reward: fidelity_<variant>_s<seed>.json) by its name."""
    return str(path.parent) if path.name == "fidelity.json" else path.stem


def row(path: Path, d: dict | None = None, name: str | None = None) -> list[str]:
    """One table row for ``path``'s fidelity.json (or ``d``, e.g. ``mean_of``'s, named ``name``)."""
    from wmrl.worldmodel.fidelity import peak_ranking

    d = load(path) if d is None else d
    a = d.get("agreement") or {}
    cells = [name or pair_name(path), str(a.get("episodes", "?")), str(a.get("real_successes", "?")),
             str(a.get("balanced_accuracy", "-"))]
    for frames in ("imagined", "real"):
        r = peak_ranking(d["reward_traces"], frames)
        cells += [f"{r['auc']:.2f}", f"{r['best_balanced_accuracy']:.2f} at {r['best_threshold']:.2f}"] if r else ["-", "-"]
        if frames == "imagined":
            honest = split_half(d["reward_traces"])
            cells.append("-" if honest is None else f"{honest:.2f}")
    return cells


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("fidelity", nargs="+", type=Path, help="fidelity.json files written by make wm-eval")
    ap.add_argument("--plot", type=Path, help="a PNG of each pair's ROC curves: imagined frames solid, real ones dashed")
    ap.add_argument("--labels", help="comma-separated names for the pairs in the plot (default: their folders)")
    ap.add_argument("--mean-of", action="append", default=[], metavar="A,B",
                    help="also a row for these files' rewards averaged (an ensemble of reward seeds on one pair); repeatable")
    args = ap.parse_args(argv)
    groups = [[Path(x) for x in g.split(",")] for g in args.mean_of]
    missing = [str(p) for p in [*args.fidelity, *(x for g in groups for x in g)] if not p.is_file()]
    if missing:
        raise SystemExit(f"error: no such file: {', '.join(missing)} (make wm-eval writes PAIR/fidelity.json)")
    head = ["pair", "episodes", "real successes", "agreement (calibrated threshold)", "AUC imagined",
            "best threshold, imagined (optimistic)", "threshold from the other half, imagined",
            "AUC real frames", "best threshold, real frames"]
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for p in args.fidelity:
        print("| " + " | ".join(row(p)) + " |")
    for g in groups:  # the calibrated agreement has no meaning for an average: "-"
        print("| " + " | ".join(row(g[0], mean_of(g), "mean of " + " + ".join(x.stem for x in g))) + " |")
    if args.plot:
        labels = args.labels.split(",") if args.labels else [pair_name(p) for p in args.fidelity]
        if len(labels) != len(args.fidelity):
            raise SystemExit(f"error: --labels names {len(labels)} pairs, {len(args.fidelity)} files given")
        print(f"[reward-ranking] {roc_plot(args.fidelity, labels, args.plot)}")


def roc_plot(files: list[Path], labels: list[str], out: Path) -> Path | None:
    """Every pair's ROC curve of the episodes' peak reward, imagined (solid) and real (dashed)."""
    from wmrl.plots import roc_curves
    from wmrl.worldmodel.fidelity import episode_peaks_from_traces

    pairs = []
    for path, label in zip(files, labels):
        traces = json.loads(path.read_text())["reward_traces"]
        pairs.append((label, *(episode_peaks_from_traces(traces, f).tolist() for f in ("imagined", "real")),
                      [bool(o) for o in traces["outcome"]]))
    return roc_curves(pairs, out, "the reward's peak per held-out episode against the simulator's outcome")


if __name__ == "__main__":
    main()
