"""Policy checkpoints in the release layout of the original system.

    RUN/weights/policy/global_step_N/
        model.safetensors           the policy's weights (the EMA weights when EMA is on)
        config.json                 format, step, kind, PolicyConfig, image size, SHA-256 of each file
        norm_stats.json             action/proprio statistics (``normalize``)
        language_cache.safetensors  instruction embeddings (``language``)
        train_state.pt              full checkpoints only: optimizer, scheduler, RNG states of
                                    python/numpy/torch(+CUDA), sampler position, step, EMA/raw weights
    RUN/latest_policy.json          newest checkpoint, newest full one, its evaluation, how to resume

A *weights-only* checkpoint (no ``train_state.pt``) initialises or is evaluated; it is never
resumed. A checkpoint is written into a hidden temporary folder beside its final name and
renamed into place when complete, so a killed run leaves no half checkpoint under a real name.
Every load is checked before anything is used: unreadable files, a model of another
configuration (names or shapes), statistics of the wrong dimension each give a one-line
reason, and nothing is written.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from wmrl import __version__
from wmrl.config import ConfigError, PolicyConfig
from wmrl.fileio import read_json, sha256_file, write_json
from wmrl.policy.language import CACHE_FILE, LanguageCache, LanguageError
from wmrl.policy.normalize import NormStats, NormStatsError

FORMAT = "wmrl-policy-checkpoint/1"
MODEL_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
NORM_FILE = "norm_stats.json"
STATE_FILE = "train_state.pt"
LATEST = "latest_policy.json"
PREFIX = "global_step_"
# Sampling/training settings: may differ between a checkpoint and the run that loads it.
NON_ARCH_FIELDS = ("denoise_steps", "noise_level", "eval_sampler", "temperature_eval", "time_beta", "augment_shift",
                   "gripper_deadband")


class CheckpointError(ConfigError):
    """A checkpoint is missing, unreadable or does not fit; the message says what to do."""


def policy_dir(run: str | os.PathLike) -> Path:
    return Path(run) / "weights" / "policy"


def step_dir(run: str | os.PathLike, step: int) -> Path:
    return policy_dir(run) / f"{PREFIX}{int(step)}"


def evidence_path(run: str | os.PathLike, step: int) -> Path:
    return Path(run) / "evidence" / "evaluations" / f"{PREFIX}{int(step)}.json"


@dataclass(frozen=True)
class CheckpointInfo:
    step: int
    path: Path
    full: bool

    @property
    def kind(self) -> str:
        return "full" if self.full else "weights-only"


def list_checkpoints(run: str | os.PathLike) -> list[CheckpointInfo]:
    root = policy_dir(run)
    out = []
    if root.is_dir():
        for p in root.iterdir():
            if p.is_dir() and p.name.startswith(PREFIX) and p.name[len(PREFIX):].isdigit():
                out.append(CheckpointInfo(int(p.name[len(PREFIX):]), p, (p / STATE_FILE).exists()))
    return sorted(out, key=lambda c: c.step)


def describe_available(run: str | os.PathLike) -> str:
    cks = list_checkpoints(run)
    if not cks:
        return f"there are none in {policy_dir(run)} (run `make sft RUN={run}` first)"
    return f"available in {policy_dir(run)}: " + ", ".join(f"{c.step} ({c.kind})" for c in cks)


def resolve(run: str | os.PathLike, step: int) -> CheckpointInfo:
    for c in list_checkpoints(run):
        if c.step == int(step):
            return c
    raise CheckpointError(f"no policy checkpoint global_step_{step}; {describe_available(run)}")


def arch_dict(cfg: PolicyConfig) -> dict:
    return {k: v for k, v in asdict(cfg).items() if k not in NON_ARCH_FIELDS}


def policy_config_from(d: dict, where: str) -> PolicyConfig:
    names = {f.name for f in fields(PolicyConfig)}
    try:
        kw = {k: (tuple(v) if isinstance(v, list) else v) for k, v in d.items() if k in names}
        return PolicyConfig(**kw)
    except (TypeError, ConfigError) as e:
        raise CheckpointError(f"{where}: invalid policy configuration ({e})") from None


# ----------------------------------------------------------------------------------- saving
def save_checkpoint(run: str | os.PathLike, step: int, *, weights: dict, cfg: PolicyConfig, image_size: int,
                    norm: NormStats, lang: LanguageCache, train_state: dict | None = None,
                    extra: dict[str, Any] | None = None) -> Path:
    """Write ``global_step_<step>`` atomically (a full checkpoint when ``train_state`` is given)."""
    import torch
    from safetensors.torch import save_file

    final = step_dir(run, step)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        tensors = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in weights.items()}
        save_file(tensors, str(tmp / MODEL_FILE), metadata={"format": FORMAT, "step": str(step)})
        norm.save(tmp / NORM_FILE)
        lang.save(tmp / CACHE_FILE)
        if train_state is not None:
            torch.save(train_state, tmp / STATE_FILE)
        files = {p.name: sha256_file(p) for p in sorted(tmp.iterdir())}
        meta = {"format": FORMAT, "step": int(step), "kind": "full" if train_state is not None else "weights-only",
                "policy": asdict(cfg), "image_size": int(image_size),
                "parameters": int(sum(v.numel() for v in tensors.values())),
                "language_encoder": lang.encoder, "instructions": lang.instructions,
                "kit_version": __version__, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                **(extra or {}), "files": files}
        write_json(tmp / CONFIG_FILE, meta)
        for p in tmp.iterdir():
            os.chmod(p, 0o644)
        os.chmod(tmp, 0o755)
        old = None
        if final.exists():  # a step saved again (after a resume from an earlier full checkpoint)
            old = final.parent / f".{final.name}.old-{os.getpid()}"
            os.replace(final, old)
        os.replace(tmp, final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


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
    f = path / CONFIG_FILE
    meta = read_json(f, CheckpointError, "missing; not a policy checkpoint (or an interrupted copy)")
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{f}: not a {FORMAT} checkpoint")
    return meta


def check_weights(weights_path: Path, cfg: PolicyConfig) -> dict:
    """Read ``model.safetensors`` and check every name and shape against ``FlowPolicy(cfg)``."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from wmrl.policy.model import FlowPolicy

    if not weights_path.exists():
        raise CheckpointError(f"{weights_path}: missing")
    try:
        weights = load_file(str(weights_path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"{weights_path}: unreadable ({e}); the file is corrupt or truncated - copy it again "
                              "or use another checkpoint") from None
    expected = {k: tuple(v.shape) for k, v in FlowPolicy(cfg).state_dict().items()}
    missing = sorted(set(expected) - set(weights))
    unexpected = sorted(set(weights) - set(expected))
    if missing or unexpected:
        raise CheckpointError(f"{weights_path}: weights of another model ({len(missing)} tensors missing, e.g. "
                              f"{(missing or unexpected)[0]!r}, {len(unexpected)} unexpected); it does not fit "
                              "the policy configuration in its config.json")
    for k, shape in expected.items():
        if tuple(weights[k].shape) != shape:
            raise CheckpointError(f"{weights_path}: tensor {k!r} has shape {tuple(weights[k].shape)}, the policy "
                                  f"configuration needs {shape}: these weights come from another configuration")
    import torch

    bad = [k for k, v in weights.items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if bad:
        raise CheckpointError(f"{weights_path}: non-finite values in {bad[0]!r}; the training diverged or the file is damaged")
    return {k: v.float() for k, v in weights.items()}


def load_checkpoint(path: str | os.PathLike, *, expect: PolicyConfig | None = None, need_full: bool = False,
                    verify_hashes: bool = False) -> LoadedCheckpoint:
    """Load and check a checkpoint folder. ``expect``: the architecture it must have (a
    resume or an initialisation); ``need_full``: refuse weights-only (``--resume``)."""
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
    if verify_hashes:
        for name, digest in meta.get("files", {}).items():
            if not (path / name).exists() or sha256_file(path / name) != digest:
                raise CheckpointError(f"{path / name}: missing or changed since it was written (SHA-256 differs)")
    try:
        norm = NormStats.load(path / NORM_FILE, action_dim=cfg.action_dim, proprio_dim=cfg.proprio_dim)
    except NormStatsError as e:
        raise CheckpointError(f"checkpoint {path.name}: {e}") from None
    try:
        lang = LanguageCache.load(path / CACHE_FILE)
    except LanguageError as e:
        raise CheckpointError(f"checkpoint {path.name}: {e}") from None
    weights = check_weights(path / MODEL_FILE, cfg)
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
def update_latest(run: str | os.PathLike, *, resume_command: str | None = None) -> Path | None:
    """Rewrite ``RUN/latest_policy.json`` from what is on disk: the newest checkpoint, the
    newest full one, the newest checkpoint's evaluation (if any), how to resume."""
    run = Path(run)
    cks = list_checkpoints(run)
    if not cks:
        return None
    path = run / LATEST
    old: dict = {}
    if path.exists():
        try:
            old = json.loads(path.read_text())
        except ValueError:
            old = {}
    newest = cks[-1]
    full = [c for c in cks if c.full]
    evaluation = None
    ev = evidence_path(run, newest.step)
    if ev.exists():
        try:
            res = json.loads(ev.read_text())
            s = res.get("settings", {})
            evaluation = {"evidence": str(ev.relative_to(run)), **{k: res["summary"][k] for k in ("success_rate", "successes", "trials")},
                          "sampler": s.get("sampler"), "temperature": s.get("temperature"),
                          "noise_level": s.get("noise_level"), "denoise_steps": s.get("denoise_steps")}
        except (ValueError, KeyError):
            evaluation = {"evidence": str(ev.relative_to(run)), "error": "unreadable evidence file"}
    rec = {
        "step": newest.step, "path": str(newest.path.relative_to(run)), "kind": newest.kind,
        "latest_full": ({"step": full[-1].step, "path": str(full[-1].path.relative_to(run))} if full else None),
        "checkpoints": [{"step": c.step, "kind": c.kind} for c in cks],
        "evaluation": evaluation,
        "resume_command": resume_command or old.get("resume_command"),
        "updated": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    write_json(path, rec)
    return path
