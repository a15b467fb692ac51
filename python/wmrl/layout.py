"""``RunLayout``: every path inside a run folder, named once.

All stages of one lineage write into one run folder (``RUN``); no other module spells these
paths. The layout follows the original system's release (seed 000):

    RUN/
      demos/task_XX.hdf5                     scripted-expert demonstrations
      collect/task_XX.hdf5                   trajectories of the current policy (success and failure)
      manifest.json                          world-model data: files, hashes, split, new-data ratio
      weights/sft/global_step_N/             supervised checkpoints (their own numbering)
      weights/policy/global_step_N/          GRPO steps; step 0 is the supervised policy GRPO started from
      latest_policy.json                     the newest policy of either kind and how to resume it
      eval/[sft/]global_step_N/              an evaluation's resumable episode log and results
      evidence/evaluations/[sft/]global_step_N.json   every finished evaluation, kept as evidence (the newest)
      evidence/evaluations/[sft/]samplers/   a checkpoint's evaluations with other samplers that a newer replaced
      worldmodels/{main,wrist}/              DeepSpeed checkpoints and inference weights per view
      worldmodels/reward/                    the reward model
      worldmodels/reward_students/           the reward model trained on the students' frames (STUDENTS=1)
      train/selected_world_models.json       the update's stop-rule selection
      worldmodels/{main,wrist}_student/      few-step students (make wm-distill): weights, state.pt
      train/selected_students.json           the students' newest weights (make package STUDENTS=1)
      model_pair/pair.json                   the packaged pair (world models, reward, keyframes)
      model_pair_students/pair.json          the students' pair (make package STUDENTS=1; make cycle STUDENTS=1)
      grpo/                                  GRPO's keyframe index, rollout log and curves
      logs/                                  JSONL logs, TensorBoard events, figures
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

STEP_PREFIX = "global_step_"  # the one checkpoint naming scheme: global_step_N
POLICY_KINDS = ("policy", "sft")  # weights/policy: GRPO steps; weights/sft: supervised steps
POLICY_STATE_FILE = "train_state.pt"  # in a policy checkpoint: optimizer, RNG, position (a *full* checkpoint)


def step_name(step: int) -> str:
    return f"{STEP_PREFIX}{int(step)}"


def parse_step_name(name: str) -> int | None:
    rest = name[len(STEP_PREFIX):] if name.startswith(STEP_PREFIX) else ""
    return int(rest) if rest.isdigit() else None


@dataclass(frozen=True)
class RunLayout:
    root: Path

    def __init__(self, root: str | os.PathLike):
        object.__setattr__(self, "root", Path(root))

    # ---- data
    @property
    def demos(self) -> Path:
        return self.root / "demos"

    @property
    def collect(self) -> Path:
        return self.root / "collect"

    @property
    def manifest(self) -> Path:
        return self.root / "manifest.json"

    # ---- policy checkpoints, evaluations, evidence
    def checkpoints(self, kind: str = "policy") -> Path:
        if kind not in POLICY_KINDS:
            raise ValueError(f"checkpoint kind {kind!r}: one of {POLICY_KINDS}")
        return self.root / "weights" / kind

    def checkpoint(self, step: int, kind: str = "policy") -> Path:
        return self.checkpoints(kind) / step_name(step)

    def policy_steps(self, kind: str = "policy", *, full: bool = False) -> list[int]:
        """The checkpoint steps of ``kind`` on disk, ascending (``full``: those with a training state)."""
        root = self.checkpoints(kind)
        steps = [parse_step_name(p.name) for p in root.iterdir() if p.is_dir()] if root.is_dir() else []
        return sorted(s for s in steps if s is not None and (not full or (self.checkpoint(s, kind) / POLICY_STATE_FILE).exists()))

    @property
    def latest_policy(self) -> Path:
        return self.root / "latest_policy.json"

    def _kinded(self, base: Path, kind: str) -> Path:
        return base if kind == "policy" else base / kind

    def eval_dir(self, step: int, kind: str = "policy") -> Path:
        return self._kinded(self.root / "eval", kind) / step_name(step)

    def evidence(self, step: int, kind: str = "policy") -> Path:
        return self.evidence_dir(kind) / f"{step_name(step)}.json"

    def evidence_dir(self, kind: str = "policy") -> Path:
        return self._kinded(self.root / "evidence" / "evaluations", kind)

    # ---- world models
    @property
    def worldmodels(self) -> Path:
        return self.root / "worldmodels"

    def wm_view(self, view: str) -> Path:
        return self.worldmodels / view

    @property
    def reward(self) -> Path:
        return self.worldmodels / "reward"

    @property
    def student_reward(self) -> Path:
        """``worldmodels/reward_students``: the reward trained on the few-step students' frames."""
        return self.worldmodels / "reward_students"

    @property
    def selection(self) -> Path:
        return self.root / "train" / "selected_world_models.json"

    def wm_student(self, view: str) -> Path:
        """``worldmodels/VIEW_student``: the view's few-step student (make wm-distill)."""
        return self.worldmodels / f"{view}_student"

    @property
    def student_selection(self) -> Path:
        return self.root / "train" / "selected_students.json"

    @property
    def model_pair(self) -> Path:
        return self.root / "model_pair"

    @property
    def student_pair(self) -> Path:
        """``model_pair_students``: the few-step students packed as a pair with their own reward."""
        return self.root / "model_pair_students"

    # ---- GRPO
    @property
    def grpo(self) -> Path:
        return self.root / "grpo"

    @property
    def keyframes(self) -> Path:
        return self.grpo / "keyframes.json"

    # ---- the cycle (make cycle) and its report
    def cycle(self, n: int) -> Path:
        """``cycles/cycle_N``: one cycle's data, world models and pair (a run folder of its own)."""
        return self.root / "cycles" / f"cycle_{int(n)}"

    @property
    def cycle_record(self) -> Path:
        return self.root / "cycle.json"

    @property
    def report_html(self) -> Path:
        return self.root / "report.html"

    @property
    def report_md(self) -> Path:
        return self.root / "report.md"

    @property
    def report_figures(self) -> Path:
        return self.root / "report"

    # ---- logs
    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def log(self, name: str) -> Path:
        """``logs/NAME.jsonl``"""
        return self.logs / f"{name}.jsonl"

    def tensorboard(self, name: str) -> Path:
        return self.logs / "tensorboard" / name
