"""Evidence of a checkpoint's evaluation: where it goes, and what ``latest_policy.json`` says.

The harness writes its resumable episode log and ``results.json`` in the evaluation's own
folder (``RUN/eval/[sft/]global_step_N/``). Once every episode is in, the full results - every
episode, the per-task summary and all settings (sampler, temperature, noise level, K,
simulator versions, renderer) - plus which checkpoint was evaluated are published as
``RUN/evidence/evaluations/[sft/]global_step_N.json``, the seed's evidence layout, and
``RUN/latest_policy.json`` learns the result.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from wmrl.fileio import write_json
from wmrl.layout import RunLayout


def sampler_label(settings: dict) -> str:
    """An evaluation's sampler as a reader compares them: "ode", or "sde T=1.6" (the SDE's success
    moves with its temperature: ~10 points between 1 and 1.6 on the same weights)."""
    sampler, temperature = settings.get("sampler", ""), settings.get("temperature")
    return f"{sampler} T={temperature:g}" if sampler == "sde" and temperature is not None else sampler


def replacement_note(evidence: Path, settings: dict) -> str | None:
    """A line for an evaluation about to replace ``evidence`` made with another sampler or
    temperature than ``settings``: the run's curves and report keep one evaluation per checkpoint,
    the newest, so the old figure leaves them (its own results file stays where it was written)."""
    try:
        old = json.loads(evidence.read_text())
        was, rate = sampler_label(old.get("settings", {})), old["summary"]["success_rate"]
    except (OSError, ValueError, KeyError):
        return None
    now = sampler_label(settings)
    if was == now:
        return None
    kept = (old.get("checkpoint") or {}).get("harness_results")
    return (f"note: {evidence} holds an evaluation with {was} ({100 * rate:.1f}%); this one ({now}) replaces it "
            f"there, in the run's curves and in its report" + (f" (its results stay in {kept})" if kept else ""))


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
    write_json(evidence, data)
    ck.update_latest(run, evaluation={"ref": info.ref, **summary_record(results, evidence, layout.root)})
    return evidence
