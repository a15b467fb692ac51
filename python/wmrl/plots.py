"""Figures a person reads faster than JSON: the SFT loss curve, success per task, GRPO curves.

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


def _square(ax, title: str, xlabel: str, ylabel: str, top: float) -> None:
    """Title, labels, both axes from 0 to ``top`` with a 2% margin, a light grid: the plots of one
    rate against another (imagined vs real success, an ROC curve)."""
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_xlim(-0.02 * top, 1.02 * top)
    ax.set_ylim(-0.02 * top, 1.02 * top)
    ax.grid(alpha=0.3)


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


def _binomial_se_pct(rate: float, trials: int) -> float:
    """The binomial standard error of a success rate over ``trials``, in percentage points."""
    return 100 * (rate * (1 - rate) / max(trials, 1)) ** 0.5


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


def grpo_curves(log_jsonl: str | os.PathLike, out: str | os.PathLike,
                evaluations: list[tuple[int, float, int, str]] | None = None) -> Path | None:
    """GRPO at a glance, from ``grpo.jsonl``: rollout success and the real-simulator success per
    evaluated step (``evaluations``: (step, success rate, trials, sampler), with the binomial
    standard error, one line per sampler); the KL each step caused
    beside the adaptive lr it set; clip fraction and skipped groups; time per step. A dashed
    line marks each step that began with fresh Adam moments (a resume from a portable state)."""
    from wmrl.logs import read_log

    recs = [r for r in read_log(log_jsonl) if "rollout_success" in r]
    if not recs and not evaluations:
        return None
    plt = _pyplot()
    if plt is None:
        return None
    from matplotlib.ticker import FormatStrFormatter

    fig, axes = plt.subplots(1, 4, figsize=(17, 3.6))
    steps = [r["step"] for r in recs]
    for r in recs:
        r["skipped_share"] = r.get("skipped_groups", 0) / max(1, r.get("groups", 1))

    ax = axes[0]
    if recs:
        ax.plot(steps, [100 * r["rollout_success"] for r in recs], "-", alpha=0.6, label="rollouts (training env)")
    if evaluations:
        by_sampler: dict[str, list] = {}  # one line per sampler: their success rates differ by ~20 points
        for step, rate, n, sampler in sorted(evaluations):
            by_sampler.setdefault(sampler, []).append((step, 100 * rate, n))
        for (sampler, ev), color in zip(sorted(by_sampler.items()), ("tab:red", "tab:purple", "tab:brown")):
            se = [_binomial_se_pct(pct / 100, n) for _, pct, n in ev]
            ax.errorbar([s for s, _, _ in ev], [pct for _, pct, _ in ev], yerr=se, fmt="o-", color=color, capsize=3,
                        label=f"real simulator, fixed states ({sampler or '?'})")
            for s, pct, n in ev:
                ax.annotate(f"{pct:.1f}% ({n})", (s, pct), fontsize=7, textcoords="offset points", xytext=(3, 6))
    ax.set_ylabel("success (%)")
    ax.set_ylim(0, 105)
    ax.set_title("success", fontsize=9)

    ax = axes[1]  # how far each step moved the policy, and the lr that the KL sets next
    if recs:
        ax.plot(steps, [r.get("approx_kl_final", 0.0) for r in recs], color="tab:orange", label="KL after the step")
    ax.set_ylabel("approx. KL per element")
    ax.set_title("step size", fontsize=9)
    if any("lr" in r for r in recs):
        lr_ax = ax.twinx()
        lrs = [r.get("lr", float("nan")) for r in recs]
        lr_ax.plot(steps, lrs, ":", color="black", label="lr (right)")
        lr_ax.set_ylim(0, 1.3 * max((x for x in lrs if x == x), default=1.0))  # room above for the legends
        lr_ax.yaxis.set_major_formatter(FormatStrFormatter("%.1e"))
        lr_ax.tick_params(labelsize=7)
        lr_ax.legend(fontsize=7, loc="upper right")

    for ax, lines, title in ((axes[2], (("clip_fraction", "clip fraction"), ("skipped_share", "groups skipped"),
                                        ("grad_cos_halves", "gradient cosine, even vs odd groups")), "signal"),
                             (axes[3], (("rollout_s", "rollouts"), ("update_s", "update")), "seconds per step")):
        for key, label in lines:
            pts = [(s, r[key]) for s, r in zip(steps, recs) if key in r]  # runs logged before it existed: none
            if pts:  # a figure logged every few steps (the gradient cosine) is drawn through its points
                ax.plot(*zip(*pts), marker="." if len(pts) < len(recs) else None, label=label)
        ax.set_title(title, fontsize=9)
    joins = [r["step"] for r in recs if r.get("moments_restarted")]
    for ax in axes:
        ax.set_xlabel("GRPO step")
        ax.grid(alpha=0.3)
        for i, s in enumerate(joins):
            ax.axvline(s - 0.5, ls="--", lw=0.8, color="gray", label=None if i else "Adam moments restart")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return _save(fig, plt, Path(out))


def success_curve(points: list[tuple[int, float, int]], out: str | os.PathLike, marks: list[int] | None = None) -> Path | None:
    """Real success rate against the GRPO step ((step, rate, trials) per evaluation; error bars
    are the binomial standard error), with vertical lines where cycles begin (``marks``)."""
    if not points:
        return None
    plt = _pyplot()
    if plt is None:
        return None
    points = sorted(points)
    steps = [p[0] for p in points]
    rates = [100 * p[1] for p in points]
    err = [_binomial_se_pct(p[1], p[2]) for p in points]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.errorbar(steps, rates, yerr=err, fmt="o-", capsize=3)
    for s, r, (_, _, n) in zip(steps, rates, points):
        ax.annotate(f"n={n}", (s, r), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7)
    for m in marks or []:
        ax.axvline(m, color="grey", alpha=0.4, linestyle="--")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("GRPO step (0: the supervised policy)")
    ax.set_ylabel("real success (%)")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    return _save(fig, plt, Path(out))


def ranking_scatter(ranking: dict, out: str | os.PathLike) -> Path | None:
    """Imagined against real success, one labelled point per policy (policies on the same point
    share one label), one series per action-guidance scale where several were imagined, the
    diagonal and Spearman's rho in the title (``wmrl.evaluation.ranking``'s result)."""
    rows = ranking.get("policies") or []
    if not rows:
        return None
    plt = _pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(4.5, 4.2))
    real = [100 * r["real"]["success_rate"] for r in rows]
    ax.plot([0, 100], [0, 100], ":", color="grey")
    scales = list(rows[0].get("imagined_by_guidance") or {})
    rhos = ranking.get("spearman_by_guidance") or {}
    for i, w in enumerate(scales or [None]):
        imag = [100 * (r["imagined_by_guidance"][w] if w else r["imagined"])["success_rate"] for r in rows]
        ax.scatter(real, imag, label=f"guidance {w}: Spearman {rhos.get(w)}" if w else None)
        if i == 0:  # the headline's points carry the names
            labels: dict[tuple[float, float], list[str]] = {}
            for r, x, y in zip(rows, real, imag):
                labels.setdefault((x, y), []).append(r["name"])
            for (x, y), names in labels.items():
                ax.annotate(", ".join(names), (x, y), fontsize=7, textcoords="offset points", xytext=(4, 4))
    if scales:
        ax.legend(fontsize=7, loc="upper left")
    rho = ranking.get("spearman")
    _square(ax, f"policy ranking: Spearman {'n/a' if rho is None else f'{rho:.2f}'}",
            "real success (%), fixed initial states", "imagined success (%), held-out keyframes", 100)
    return _save(fig, plt, Path(out))


def sensitivity_scatter(result: dict, out: str | os.PathLike, horizon: str = "1") -> Path | None:
    """The policy's action gap against the corrupted frame's PSNR, one labelled point per
    corruption (``bench/view_sensitivity.py``'s result): how far PSNR orders the errors as the
    policy does. ``result["marks"]``: extra labelled points, e.g. a world model's own frames."""
    rows = [r for r in result.get("rows", []) if r["corruption"] != "none" and horizon in r["horizons"]]
    if not rows:
        return None
    plt = _pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(5, 4))
    key = "psnr_db" if result.get("view") != "proprio" else "eef_error_mm"
    for r in rows:
        x, y = r[key], r["horizons"][horizon]["action_gap"]
        ax.scatter([x], [y], color="tab:blue")
        ax.annotate(r["corruption"], (x, y), fontsize=7, textcoords="offset points", xytext=(4, 3))
    for m in result.get("marks", []):
        ax.scatter([m[key]], [m["action_gap"]], color="tab:red", marker="s")
        ax.annotate(m["label"], (m[key], m["action_gap"]), fontsize=7, color="tab:red",
                    textcoords="offset points", xytext=(4, -9))
    ax.set_xlabel(f"PSNR of the corrupted {result.get('view', '')} frame to the real one (dB)" if key == "psnr_db"
                  else "end-effector position error of the corrupted proprio (mm)")
    ax.set_ylabel(f"action gap {horizon} chunk(s) ahead")
    ax.set_title(f"what in the {result.get('view', '')} view moves the policy ({result.get('episodes')} episodes)",
                 fontsize=9)
    ax.grid(alpha=0.3)
    return _save(fig, plt, Path(out))


def roc_points(scores: list[float], truth: list[bool]) -> tuple[list[float], list[float]]:
    """The ROC curve of ``scores`` against ``truth`` (both outcomes present): false-positive and
    true-positive rates as the threshold falls through every distinct score, from (0, 0) to (1, 1)."""
    pos, neg = sum(truth), len(truth) - sum(truth)
    fpr, tpr = [0.0], [0.0]
    for th in sorted(set(scores), reverse=True):
        called = [s >= th for s in scores]
        tpr.append(sum(c and t for c, t in zip(called, truth)) / pos)
        fpr.append(sum(c and not t for c, t in zip(called, truth)) / neg)
    if fpr[-1] < 1 or tpr[-1] < 1:
        fpr.append(1.0)
        tpr.append(1.0)
    return fpr, tpr


def roc_curves(pairs: list[tuple[str, list[float], list[float], list[bool]]], out: str | os.PathLike,
               title: str = "") -> Path | None:
    """One colour per (label, imagined scores, real scores, truth): the ROC curve of the imagined
    scores solid, of the real ones dashed in the same colour, the chance diagonal dotted; e.g. the
    reward's peak per held-out episode against the simulator's outcome. Pairs without both
    outcomes are left out."""
    pairs = [q for q in pairs if any(q[3]) and not all(q[3])]
    plt = _pyplot() if pairs else None
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(4.8, 4.4))
    ax.plot([0, 1], [0, 1], ":", color="grey")
    for i, (label, imagined, real, truth) in enumerate(pairs):
        color = plt.get_cmap("tab10")(i % 10)
        ax.plot(*roc_points(imagined, truth), "-", color=color, label=label)
        ax.plot(*roc_points(real, truth), "--", color=color, alpha=0.4)
    ax.plot([], [], "--", color="grey", label="dashed: the same on real frames")
    ax.legend(fontsize=6, loc="lower right")
    _square(ax, title, "failures called successes (false-positive rate)",
            "successes called successes (true-positive rate)", 1)
    return _save(fig, plt, Path(out))
