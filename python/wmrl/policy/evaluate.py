"""``make eval CKPT=N``: evaluate policy checkpoint N in the real simulator.

The harness runs in ``RUN/eval/global_step_N/`` (resumable episode log, ``results.json``);
the finished ``results.json`` - every episode, the per-task summary and all settings,
including sampler, temperature, noise level and K - is copied to
``RUN/evidence/evaluations/global_step_N.json``, and ``RUN/latest_policy.json`` is refreshed
(it shows the evaluation when N is the newest checkpoint).
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

from wmrl.config import EvalConfig, PolicyConfig, SimConfig
from wmrl.fileio import write_json
from wmrl.policy import checkpoint as ck


def checkpoint_image_size(run: str | os.PathLike, step: int) -> int:
    """The image size a checkpoint was trained on (cheap; lists the checkpoints if missing)."""
    info = ck.resolve(run, step)
    return int(ck.read_meta(info.path).get("image_size", 0))


def default_out(run: str | os.PathLike, step: int) -> Path:
    return Path(run) / "eval" / f"{ck.PREFIX}{int(step)}"


def plan(run, step: int, sim: SimConfig, cfg: EvalConfig, out_dir=None, **sampler) -> dict:
    info = ck.resolve(run, step)
    meta = ck.read_meta(info.path)
    pol = meta.get("policy", {})
    return {"checkpoint": str(info.path), "kind": info.kind, "episodes": len(cfg.tasks) * cfg.trials,
            "sampler": sampler.get("sampler") or pol.get("eval_sampler"),
            "temperature": sampler.get("temperature") if sampler.get("temperature") is not None else pol.get("temperature_eval"),
            "noise_level": pol.get("noise_level"), "denoise_steps": pol.get("denoise_steps"),
            "gripper_deadband": sampler.get("gripper_deadband") if sampler.get("gripper_deadband") is not None
            else pol.get("gripper_deadband", PolicyConfig.gripper_deadband),
            "eval": cfg, "sim": sim, "out": str(out_dir or default_out(run, step)),
            "evidence": str(ck.evidence_path(run, step))}


def evaluate_checkpoint(run: str | os.PathLike, step: int, *, sim: SimConfig, cfg: EvalConfig,
                        out_dir: str | os.PathLike | None = None, overwrite: bool = False, progress: bool = True,
                        sampler: str | None = None, temperature: float | None = None,
                        gripper_deadband: float | None = None, device: str = "auto"):
    """Evaluate checkpoint ``step`` of ``run``; returns (harness output, evidence path)."""
    from wmrl.evaluation.harness import evaluate
    from wmrl.policy.runner import PolicyRunner

    run = Path(run)
    info = ck.resolve(run, step)  # lists the checkpoints that exist when this one does not
    evidence = ck.evidence_path(run, step)
    if evidence.exists() and not overwrite:
        raise FileExistsError(f"{evidence} exists; pass --overwrite (OVERWRITE=1) to evaluate checkpoint {step} again")
    runner = PolicyRunner(info.path, device=device, sampler=sampler, temperature=temperature,
                          gripper_deadband=gripper_deadband, seed=cfg.seed)
    if runner.image_size and runner.image_size != sim.image_size:
        raise ck.CheckpointError(f"checkpoint {step} was trained on {runner.image_size} px images; evaluate with "
                                 f"--image-size {runner.image_size} (the simulator is set to {sim.image_size} px)")
    if sim.chunk_size != runner.cfg.chunk_size:
        sim = replace(sim, chunk_size=runner.cfg.chunk_size)
    out = Path(out_dir) if out_dir else default_out(run, step)
    result = evaluate(runner, sim=sim, cfg=cfg, out_dir=out, policy_id=runner.policy_id, overwrite=overwrite,
                      progress=progress, extra_settings=runner.settings())
    data = json.loads(result.results_path.read_text())
    data["checkpoint"] = {"step": step, "path": str(info.path), "kind": info.kind, "run": str(run),
                          "harness_results": str(result.results_path)}
    write_json(evidence, data)
    ck.update_latest(run)
    return result, evidence
