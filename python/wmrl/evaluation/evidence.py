"""Evidence of a checkpoint's evaluation: where it goes, and what ``latest_policy.json`` says.

The harness writes its resumable episode log and ``results.json`` in the evaluation's own
folder (``RUN/eval/[sft/]global_step_N/``). Once every episode is in, the full results - every
episode, the per-task summary and all settings (sampler, temperature, noise level, K,
simulator versions, renderer) - plus which checkpoint was evaluated are published as
``RUN/evidence/evaluations/[sft/]global_step_N.json``, the seed's evidence layout, and
``RUN/latest_policy.json`` learns the result.

A checkpoint evaluated with several samplers keeps each: the newest evaluation is the
checkpoint's own file (what ``latest_policy.json``, the cycle and the report's curve read), and
an evaluation it replaced with another sampler or SDE temperature moves to
``.../samplers/global_step_N.<sampler>.json`` (e.g. ``global_step_4.sde_T1.json``), where the
GRPO curves and the report's table still read it.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from wmrl.fileio import write_json
from wmrl.layout import RunLayout


def sampler_label(settings: dict) -> str:
    """An evaluation's sampler as a reader compares them: "ode", or "sde T=1.6" (the SDE's success
    moves with its temperature: ~10 points between 1 and 1.6 on the same weights)."""
    sampler, temperature = settings.get("sampler", ""), settings.get("temperature")
    return f"{sampler} T={temperature:g}" if sampler == "sde" and temperature is not None else sampler


def sampler_slug(label: str) -> str:
    """A sampler label as a file name's part: "sde T=1.6" -> "sde_T1.6"."""
    return label.replace("=", "").replace(" ", "_")


def kept_path(evidence: Path, label: str) -> Path:
    """Where the evaluation with sampler ``label`` goes once a newer one with another sampler
    takes the checkpoint's evidence file ``evidence``."""
    return evidence.parent / "samplers" / f"{evidence.stem}.{sampler_slug(label)}.json"


def label_of(evidence: Path) -> str | None:
    """The sampler label of an evidence file, or None where there is none (or it cannot be read)."""
    try:
        return sampler_label(json.loads(evidence.read_text())["settings"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def kept_evaluations(evidence: Path) -> list[Path]:
    """The checkpoint's evaluations with other samplers than its newest, ``kept_path``'s files."""
    folder = evidence.parent / "samplers"
    return sorted(folder.glob(f"{evidence.stem}.*.json")) if folder.is_dir() else []


def evaluation_with(evidence: Path, label: str) -> Path | None:
    """The checkpoint's evaluation with sampler ``label``: its newest, or a kept one."""
    return next((p for p in [evidence, *kept_evaluations(evidence)] if label_of(p) == label), None)


def replacement_note(evidence: Path, settings: dict) -> str | None:
    """A line for an evaluation about to replace ``evidence`` made with another sampler or
    temperature than ``settings``: the new one becomes the checkpoint's evaluation (latest policy,
    the cycle, the report's curve), the old one is kept beside it (``kept_path``)."""
    try:
        old = json.loads(evidence.read_text())
        was, rate = sampler_label(old.get("settings", {})), old["summary"]["success_rate"]
    except (OSError, ValueError, KeyError):
        return None
    now = sampler_label(settings)
    if was == now:
        return None
    return (f"note: {evidence} holds an evaluation with {was} ({100 * rate:.1f}%); this one ({now}) becomes the "
            f"checkpoint's evaluation, and that one moves to {kept_path(evidence, was)} (the run's curves and "
            "report still show it)")


def simulator_label(settings: dict) -> str | None:
    """The simulator build an evaluation ran in ("mujoco 2.3.7"), None where it recorded none.
    Builds matter: one GRPO policy read 78.8% in mujoco 3.3.7 and 67.0% in 2.3.7 on the same machine
    (bench/RESULTS.md, "Run 19")."""
    version = (settings.get("versions") or {}).get("mujoco")
    return f"mujoco {version}" if version else None


def paired_change(before: dict, after: dict) -> dict | None:
    """The change in success between two evaluations of the same fixed states, read state by
    state (``results["episodes"]``, keyed by task and trial): how many states went from failure to
    success (``up``) and back (``down``), the change, its paired standard error and McNemar's
    chi-square. Pairing removes what the states themselves decide (which placements are hard), so
    its standard error is smaller than two rates' (run 14: 2.3 against 3.1 points). None when the
    two did not evaluate the same states, or either kept no episodes."""
    def by_state(results: dict) -> dict:
        return {(e["task"], e["trial"]): bool(e["success"]) for e in results.get("episodes") or []}

    a, b = by_state(before), by_state(after)
    if not a or a.keys() != b.keys():
        return None
    n = len(a)
    up = sum(1 for k in a if b[k] and not a[k])
    down = sum(1 for k in a if a[k] and not b[k])
    change = (up - down) / n
    # the per-state differences are +1 (up), -1 (down) or 0: their sample variance over n
    var = (up + down - n * change ** 2) / (n - 1) if n > 1 else 0.0
    return {"states": n, "up": up, "down": down, "change": change, "paired_se": math.sqrt(max(var, 0.0) / n),
            "mcnemar_chi2": (up - down) ** 2 / (up + down) if up + down else 0.0,
            "samplers": [sampler_label(before.get("settings", {})), sampler_label(after.get("settings", {}))],
            "simulators": [simulator_label(before.get("settings", {})), simulator_label(after.get("settings", {}))]}


def build_warning(c: dict) -> str | None:
    """Where a ``paired_change``'s two evaluations ran in different simulator builds, the words that
    say so; None where they ran in the same build or either recorded none."""
    sims = c.get("simulators") or [None, None]
    if None in sims or sims[0] == sims[1]:
        return None
    return f"simulators {sims[0]} -> {sims[1]}: the change is the build's as well as the policy's"


def change_text(c: dict, samplers: bool = True) -> str:
    """A ``paired_change`` as read: the change, its paired standard error, the states that moved
    (and with ``samplers`` the sampler, or "before -> after" where they differ), and a warning where
    the two ran in different simulator builds."""
    which = c["samplers"][0] if c["samplers"][0] == c["samplers"][1] else " -> ".join(c["samplers"])
    warning = build_warning(c)
    builds = f"; {warning}" if warning else ""
    return (f"{100 * c['change']:+.1f} points +- {100 * c['paired_se']:.1f} (paired standard error; "
            f"{c['up']} of {c['states']} states up, {c['down']} down" + (f"; {which}" if samplers else "") + builds + ")")


def supervised_origin(step0: Path) -> tuple[Path, str | None] | None:
    """GRPO step 0 is a copy of a supervised checkpoint (its ``config.json`` says which): that
    checkpoint's evidence file in the run that trained it, and the SHA-256 of the weights copied;
    None where step 0 records no such origin."""
    from wmrl.layout import parse_step_name

    try:
        origin = json.loads((step0 / "config.json").read_text()).get("origin") or {}
    except (OSError, ValueError, AttributeError):
        return None
    src = Path(origin.get("sft_checkpoint", ""))
    step = parse_step_name(src.name)
    if step is None or len(src.parents) < 3:
        return None
    return RunLayout(src.parents[2]).evidence(step, "sft"), origin.get("sft_model_sha256")


def summary_record(results: dict, evidence: Path, run: Path) -> dict:
    """What ``latest_policy.json`` keeps of one evaluation."""
    s, summ = results.get("settings", {}), results["summary"]
    return {"evidence": str(evidence.relative_to(run)), "success_rate": summ["success_rate"],
            "successes": summ["successes"], "trials": summ["trials"], "sampler": s.get("sampler"),
            "temperature": s.get("temperature"), "noise_level": s.get("noise_level"),
            "denoise_steps": s.get("denoise_steps")}


def publish(run: str | os.PathLike, info, results: dict, *, harness_results: Path | None = None) -> Path:
    """Write the evidence of checkpoint ``info`` (a ``CheckpointInfo``) and update
    ``latest_policy.json``; returns the evidence path."""
    from wmrl.policy import checkpoint as ck

    layout = RunLayout(run)
    evidence = layout.evidence(info.step, info.kind)
    data = {**results, "checkpoint": {"step": info.step, "ref": info.ref, "path": str(info.path), "kind": info.state,
                                      "run": str(layout.root),
                                      "harness_results": str(harness_results) if harness_results else None}}
    label, was = sampler_label(results.get("settings", {})), label_of(evidence)
    if was is not None and was != label:  # another sampler's evaluation: kept beside, not lost
        kept = kept_path(evidence, was)
        kept.parent.mkdir(parents=True, exist_ok=True)
        os.replace(evidence, kept)
    write_json(evidence, data)
    kept_path(evidence, label).unlink(missing_ok=True)  # this sampler's older evaluation, now superseded
    ck.update_latest(run, evaluation={"ref": info.ref, **summary_record(results, evidence, layout.root)})
    return evidence
