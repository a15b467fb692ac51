"""Policy checkpoints in the release layout of the original system.

    RUN/weights/policy/global_step_N/   GRPO step N (step 0: the supervised policy GRPO started from)
    RUN/weights/sft/global_step_N/      supervised step N
        model.safetensors           the policy's weights (the EMA weights when SFT's EMA is on)
        config.json                 format, step, kind, PolicyConfig, image size, SHA-256 of each file
        norm_stats.json             action/proprio statistics (``normalize``)
        language_cache.safetensors  instruction embeddings (``language``)
        train_state.pt              full checkpoints only: optimizer, scheduler, RNG states of
                                    python/numpy/torch(+CUDA), data position, step (SFT: EMA/raw weights)
    RUN/latest_policy.json          newest checkpoint of either kind, newest full one, its evaluation,
                                    how to resume

A *weights-only* checkpoint (no ``train_state.pt``) initialises or is evaluated; it is never
resumed. Checkpoints are written and read through ``FlowPolicy.save_pretrained`` /
``wmrl.pretrained`` (hidden temporary folder renamed into place; every file's SHA-256 checked on
load, before anything is used): a damaged or edited file, a model of another configuration
(names or shapes) or statistics of the wrong dimension each give a one-line reason, and
nothing is written.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from wmrl import __version__
from wmrl.config import PolicyConfig
from wmrl.fileio import write_json
from wmrl.layout import POLICY_KINDS, POLICY_STATE_FILE, RunLayout
from wmrl.policy.language import CACHE_FILE, LanguageCache, LanguageError
from wmrl.policy.normalize import NormStats, NormStatsError
from wmrl.pretrained import CONFIG_FILE, MODEL_FILE, PretrainedError, config_from_dict, read_weights, verify_files

NORM_FILE = "norm_stats.json"
STATE_FILE = POLICY_STATE_FILE
# Sampling/training settings: may differ between a checkpoint and the run that loads it.
NON_ARCH_FIELDS = ("denoise_steps", "noise_level", "eval_sampler", "temperature_eval", "time_beta", "augment_shift",
                   "gripper_deadband")

CheckpointError = PretrainedError  # a checkpoint is missing, unreadable or does not fit


def policy_dir(run: str | os.PathLike, kind: str = "policy") -> Path:
    return RunLayout(run).checkpoints(kind)


def step_dir(run: str | os.PathLike, step: int, kind: str = "policy") -> Path:
    return RunLayout(run).checkpoint(step, kind)


def evidence_path(run: str | os.PathLike, step: int, kind: str = "policy") -> Path:
    return RunLayout(run).evidence(step, kind)


@dataclass(frozen=True)
class CheckpointInfo:
    step: int
    path: Path
    full: bool
    kind: str = "policy"  # policy (GRPO steps) or sft

    @property
    def state(self) -> str:
        return "full" if self.full else "weights-only"

    @property
    def ref(self) -> str:
        """How ``make eval CKPT=...`` names it: ``N`` for GRPO steps, ``sft/N`` for supervised ones."""
        return str(self.step) if self.kind == "policy" else f"{self.kind}/{self.step}"


def list_checkpoints(run: str | os.PathLike, kind: str = "policy") -> list[CheckpointInfo]:
    layout = RunLayout(run)
    return [CheckpointInfo(s, layout.checkpoint(s, kind), (layout.checkpoint(s, kind) / STATE_FILE).exists(), kind)
            for s in layout.policy_steps(kind)]


def describe_available(run: str | os.PathLike, kind: str = "policy") -> str:
    cks = list_checkpoints(run, kind)
    if not cks:
        how = "make sft" if kind == "sft" else "make grpo"
        return f"there are none in {policy_dir(run, kind)} (run `{how} RUN={run}` first)"
    return f"available in {policy_dir(run, kind)}: " + ", ".join(f"{c.step} ({c.state})" for c in cks)


def parse_ref(ref: str | int) -> tuple[str, int]:
    """``60`` -> ("policy", 60); ``sft/4000`` -> ("sft", 4000)."""
    text = str(ref)
    kind, _, num = text.rpartition("/")
    kind = kind or "policy"
    if kind not in POLICY_KINDS or not num.isdigit():
        raise CheckpointError(f"checkpoint {text!r}: give a GRPO step (CKPT=60) or a supervised one (CKPT=sft/4000)")
    return kind, int(num)


def resolve(run: str | os.PathLike, step: int | str, kind: str | None = None) -> CheckpointInfo:
    """The checkpoint ``step`` (a number, or a reference like ``sft/4000``) of ``run``."""
    if kind is None:
        kind, step = parse_ref(step)
    for c in list_checkpoints(run, kind):
        if c.step == int(step):
            return c
    hint = ""
    if kind == "policy" and any(c.step == int(step) for c in list_checkpoints(run, "sft")):
        hint = f"; supervised checkpoint {step} exists: name it sft/{step} (make eval CKPT=sft/{step})"
    raise CheckpointError(f"no policy checkpoint global_step_{step}; {describe_available(run, kind)}{hint}")


def arch_dict(cfg: PolicyConfig) -> dict:
    return {k: v for k, v in asdict(cfg).items() if k not in NON_ARCH_FIELDS}


def policy_config_from(d: dict, where: str) -> PolicyConfig:
    return config_from_dict(PolicyConfig, d, where)


# ----------------------------------------------------------------------------------- saving
def save_checkpoint(path: str | os.PathLike, model, *, step: int, image_size: int, norm: NormStats,
                    lang: LanguageCache, train_state: dict | None = None, extra: dict[str, Any] | None = None) -> Path:
    """Write checkpoint folder ``path`` atomically (a full checkpoint when ``train_state`` is given)."""
    import torch

    files = {NORM_FILE: norm.save, CACHE_FILE: lang.save}
    if train_state is not None:
        files[STATE_FILE] = lambda p: torch.save(train_state, p)
    meta = {"step": int(step), "kind": "full" if train_state is not None else "weights-only",
            "image_size": int(image_size), "language_encoder": lang.encoder, "instructions": lang.instructions,
            "kit_version": __version__, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **(extra or {})}
    return model.save_pretrained(path, meta=meta, files=files)


# ----------------------------------------------------------------------------------- loading
@dataclass
class LoadedCheckpoint:
    step: int
    path: Path
    cfg: PolicyConfig
    image_size: int
    weights: dict  # name -> float32 CPU tensor, already checked against the model's shapes
    norm: NormStats
    lang: LanguageCache
    meta: dict
    train_state: dict | None = None

    @property
    def full(self) -> bool:
        return self.meta.get("kind") == "full"

    def build_model(self, device="cpu"):
        from wmrl.policy.model import FlowPolicy

        model = FlowPolicy(self.cfg)
        model.load_state_dict(self.weights)
        return model.to(device)


def read_meta(path: Path) -> dict:
    from wmrl.policy.model import FlowPolicy

    return FlowPolicy.read_config(path, "missing; not a policy checkpoint (or an interrupted copy)")[1]


def check_weights(weights_path: Path, cfg: PolicyConfig) -> dict:
    """Read ``model.safetensors`` and check every name and shape against ``FlowPolicy(cfg)``."""
    from wmrl.policy.model import FlowPolicy

    return read_weights(weights_path, {k: tuple(v.shape) for k, v in FlowPolicy(cfg).state_dict().items()})


def load_checkpoint(path: str | os.PathLike, *, expect: PolicyConfig | None = None, need_full: bool = False,
                    verify_hashes: bool = True) -> LoadedCheckpoint:
    """Load and check a checkpoint folder. ``expect``: the architecture it must have (a
    resume or an initialisation); ``need_full``: refuse weights-only (``--resume``). Every
    file read is checked against its SHA-256 in config.json (``verify_hashes``) before the
    checkpoint is returned."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such checkpoint folder")
    meta = read_meta(path)
    if need_full and not (path / STATE_FILE).exists():
        raise CheckpointError(f"{path} is a weights-only checkpoint (no {STATE_FILE}): it can initialise training "
                              "(--init) or be evaluated, but not be resumed; resume from a full checkpoint or start a "
                              "new RUN with --init")
    cfg = policy_config_from(meta.get("policy", {}), str(path / CONFIG_FILE))
    if expect is not None and arch_dict(expect) != arch_dict(cfg):
        diffs = [f"{k}={v!r} (here {arch_dict(expect)[k]!r})" for k, v in arch_dict(cfg).items() if arch_dict(expect)[k] != v]
        raise CheckpointError(f"{path} was trained with another policy configuration: {', '.join(diffs)}; use the "
                              "matching PROFILE, or another RUN")
    try:
        norm = NormStats.load(path / NORM_FILE, action_dim=cfg.action_dim, proprio_dim=cfg.proprio_dim)
    except NormStatsError as e:
        raise CheckpointError(f"checkpoint {path.name}: {e}") from None
    try:
        lang = LanguageCache.load(path / CACHE_FILE)
    except LanguageError as e:
        raise CheckpointError(f"checkpoint {path.name}: {e}") from None
    weights = check_weights(path / MODEL_FILE, cfg)
    if verify_hashes:  # after the checks that say more precisely what is wrong; the state only where read
        verify_files(path, meta, skip=() if need_full else (STATE_FILE,))
    state = None
    if need_full:
        import pickle

        import torch

        try:
            state = torch.load(path / STATE_FILE, map_location="cpu", weights_only=True)
        except (RuntimeError, OSError, EOFError, ValueError, pickle.UnpicklingError) as e:
            raise CheckpointError(f"{path / STATE_FILE}: unreadable ({str(e).splitlines()[0]}); resume from an "
                                  "earlier full checkpoint (delete this one) or start afresh") from None
    return LoadedCheckpoint(int(meta.get("step", -1)), path, cfg, int(meta.get("image_size", 0)), weights, norm, lang,
                            meta, state)


# ----------------------------------------------------------------------------------- latest
def newest_policy(run: str | os.PathLike) -> CheckpointInfo | None:
    """The newest policy of either kind: the newest GRPO step if GRPO ran, else the newest
    supervised checkpoint."""
    return (list_checkpoints(run, "policy") or list_checkpoints(run, "sft") or [None])[-1]


def update_latest(run: str | os.PathLike, *, resume_command: str | None = None,
                  evaluation: dict | None = None) -> Path | None:
    """Rewrite ``RUN/latest_policy.json`` from what is on disk: the newest policy of either
    kind, the newest full checkpoint of that kind, how to resume it, and the evaluations
    reported so far (``evaluation``: one more, ``{"ref": "sft/10", ...summary}``, from the
    evaluation's evidence writer); ``evaluation`` at the top names the newest policy's."""
    layout = RunLayout(run)
    newest = newest_policy(run)
    if newest is None:
        return None
    old: dict = {}
    if layout.latest_policy.exists():
        try:
            old = json.loads(layout.latest_policy.read_text())
        except ValueError:
            old = {}
    evaluations = dict(old.get("evaluations") or {})
    if evaluation is not None:
        evaluations[evaluation["ref"]] = {k: v for k, v in evaluation.items() if k != "ref"}
    cks = list_checkpoints(run, newest.kind)
    full = [c for c in cks if c.full]
    rel = lambda p: str(p.relative_to(layout.root))  # noqa: E731
    rec = {
        "step": newest.step, "ref": newest.ref, "source": "grpo" if newest.kind == "policy" else "sft",
        "path": rel(newest.path), "kind": newest.state,
        "latest_full": ({"step": full[-1].step, "ref": full[-1].ref, "path": rel(full[-1].path)} if full else None),
        "checkpoints": [{"step": c.step, "kind": c.state} for c in cks],
        "evaluation": evaluations.get(newest.ref),
        "evaluations": evaluations,
        "resume_command": resume_command or old.get("resume_command"),
        "updated": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    write_json(layout.latest_policy, rec)
    return layout.latest_policy
