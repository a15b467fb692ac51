"""Figures a person reads faster than JSON: the SFT loss curve and success per task.

PNGs through matplotlib's Agg backend (no display needed), written atomically next to the
JSON they summarise. matplotlib is part of the policy environment (the simulator needs it);
where it is missing the figure is skipped with a message, never the run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("[plots] matplotlib is not installed: no figure")
        return None
    return plt


def _save(fig, plt, path: Path) -> Path:
    from wmrl.fileio import atomic_path

    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def loss_curve(log_jsonl: str | os.PathLike, out: str | os.PathLike) -> Path | None:
    """Training and validation loss against the optimizer step, from ``sft.jsonl``."""
    records = [json.loads(line) for line in Path(log_jsonl).read_text().splitlines() if line.strip()]
    train = sorted((r["step"], r["loss"]) for r in records if "loss" in r)
    val = sorted((r["step"], r["val_loss"]) for r in records if "val_loss" in r)
    if not train and not val:
        return None
    plt = _pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for points, label, style in ((train, "train", "-"), (val, "validation", "o-")):
        if points:
            ax.plot(*zip(*points), style, label=label, markersize=3)
    ax.set_yscale("log")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("flow-matching loss")
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, plt, Path(out))


def success_by_task(summary: dict, out: str | os.PathLike, title: str = "") -> Path | None:
    """Bars of the success rate per task (with counts), a line at the overall rate."""
    plt = _pyplot()
    if plt is None:
        return None
    tasks = list(summary["per_task"])
    rates = [100 * summary["per_task"][t]["success_rate"] for t in tasks]
    fig, ax = plt.subplots(figsize=(max(4, 0.6 * len(tasks) + 2), 3.5))
    bars = ax.bar(tasks, rates, color="tab:blue")
    for bar, t in zip(bars, tasks):
        v = summary["per_task"][t]
        ax.annotate(f"{v['successes']}/{v['trials']}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=7)
    overall = 100 * summary["success_rate"]
    ax.axhline(overall, color="tab:red", linestyle="--", label=f"all: {summary['successes']}/{summary['trials']} "
                                                                   f"= {overall:.1f}%")
    ax.set_ylim(0, 105)
    ax.set_xlabel("task")
    ax.set_ylabel("success (%)")
    ax.set_title(title, fontsize=9)
    ax.legend(loc="lower right", fontsize=8)
    return _save(fig, plt, Path(out))
