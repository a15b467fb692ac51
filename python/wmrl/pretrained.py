"""Models that save and load themselves, in the style of diffusers' ``save_pretrained``.

    model.save_pretrained(folder, meta={...}, files={"norm_stats.json": stats.save})
    Model.from_pretrained(folder, device="cuda")

A saved folder holds ``model.safetensors`` (float32 weights), any extra files the caller
writes (statistics, a language cache, a training state) and ``config.json``: the format, the
model's config dataclass under ``CONFIG_KEY``, the caller's metadata, the SHA-256 of every
other file, and ``config_sha256``, the hash of its own content. The folder is written under a hidden temporary name and renamed into place when
complete (an existing folder of the same name is replaced whole), so a killed run never
leaves half a model under a real name. Loading checks, before any weight is used: the format,
every file's hash, the config, and every tensor's name, shape and finiteness; each failure is
one line that names the file and says what to do.

The policy (``FlowPolicy``), both world models (``FrameWorldModel``) and the reward model
(``RewardModel``) share this; training, evaluation, packaging and GRPO all load through it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable, ClassVar

from wmrl.config import ConfigError
from wmrl.fileio import read_json, sha256_file, write_json

MODEL_FILE = "model.safetensors"
CONFIG_FILE = "config.json"


class PretrainedError(ConfigError):
    """A saved model is missing, damaged or does not fit; the message says what to do."""


def config_from_dict(cls, d: dict, where: str):
    """The dataclass ``cls`` from a JSON dict (lists become tuples; unknown keys ignored)."""
    names = {f.name for f in dataclasses.fields(cls)}
    try:
        return cls(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in d.items() if k in names})
    except (TypeError, ConfigError) as e:
        raise PretrainedError(f"{where}: invalid {cls.__name__} ({e})") from None


def verify_files(folder: Path, meta: dict, skip: tuple[str, ...] = ()) -> None:
    """config.json matches its own ``config_sha256``, and every file its ``files`` lists (but
    ``skip``, files the caller does not read) exists and has its recorded SHA-256."""
    check_content_hash(meta, folder / CONFIG_FILE)
    for name, digest in meta.get("files", {}).items():
        if name in skip:
            continue
        f = folder / name
        if not f.is_file():
            raise PretrainedError(f"{f}: missing (listed in {folder / CONFIG_FILE}); copy the folder again or use "
                                  "another checkpoint")
        if sha256_file(f) != digest:
            raise PretrainedError(f"{f}: changed since it was written (SHA-256 differs from {folder / CONFIG_FILE}); "
                                  "the file is damaged or was edited - copy it again or use another checkpoint")


def read_weights(path: Path, expected: dict[str, tuple]) -> dict:
    """``model.safetensors`` checked against the expected names and shapes, as float32 tensors."""
    import torch
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not path.exists():
        raise PretrainedError(f"{path}: missing")
    try:
        weights = load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise PretrainedError(f"{path}: unreadable ({e}); the file is corrupt or truncated - copy it again "
                              "or use another checkpoint") from None
    missing = sorted(set(expected) - set(weights))
    unexpected = sorted(set(weights) - set(expected))
    if missing or unexpected:
        raise PretrainedError(f"{path}: weights of another model ({len(missing)} tensors missing, e.g. "
                              f"{(missing or unexpected)[0]!r}, {len(unexpected)} unexpected); it does not fit "
                              f"the configuration in its {CONFIG_FILE}")
    for k, shape in expected.items():
        if tuple(weights[k].shape) != shape:
            raise PretrainedError(f"{path}: tensor {k!r} has shape {tuple(weights[k].shape)}, the configuration "
                                  f"needs {shape}: these weights come from another configuration")
    bad = [k for k, v in weights.items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if bad:
        raise PretrainedError(f"{path}: non-finite values in {bad[0]!r}; the training diverged or the file is damaged")
    return {k: v.float() if v.is_floating_point() else v for k, v in weights.items()}


def content_hash(meta: dict) -> str:
    """SHA-256 of a config's content (canonical JSON, without this hash): config.json guards itself."""
    import hashlib
    import json

    body = {k: v for k, v in meta.items() if k != "config_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def check_content_hash(meta: dict, where: Path) -> None:
    if "config_sha256" in meta and meta["config_sha256"] != content_hash(meta):
        raise PretrainedError(f"{where}: changed since it was written (its content no longer matches its config_sha256); "
                              "the file is damaged or was edited - copy it again or use another checkpoint")


def write_folder(final: Path, write: Callable[[Path], None], meta: dict) -> Path:
    """Write a folder atomically: ``write(tmp)`` fills it, then ``config.json`` (``meta`` plus
    every file's SHA-256 under ``files``) goes in last and the folder is renamed into place."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(final.parent)
    tmp = final.parent / f".{final.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        write(tmp)
        files = {p.name: sha256_file(p) for p in sorted(tmp.iterdir()) if p.name != CONFIG_FILE}
        # hashed as it will read back: JSON turns int keys into strings (and re-sorts them) and
        # tuples into lists, so a hash of the dict as given would not match the file
        body = json.loads(json.dumps({**meta, "files": files}))
        write_json(tmp / CONFIG_FILE, {**body, "config_sha256": content_hash(body)})
        for p in tmp.iterdir():
            os.chmod(p, 0o644)
        os.chmod(tmp, 0o755)
        old = None
        if final.exists():  # saved again (a resumed run reaching the same step)
            old = final.parent / f".{final.name}.old-{os.getpid()}"
            os.replace(final, old)
        os.replace(tmp, final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def remove_stale_temporaries(folder: Path) -> None:
    """Hidden ``.name.tmp-PID`` / ``.name.old-PID`` folders left by a killed writer."""
    if folder.is_dir():
        for p in folder.iterdir():
            if p.name.startswith(".") and (".tmp-" in p.name or ".old-" in p.name):
                pid = p.name.rsplit("-", 1)[-1]
                if pid.isdigit() and not _alive(int(pid)):
                    shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Pretrained:
    """Mixin for ``torch.nn.Module`` subclasses whose constructor takes one config dataclass
    (stored as ``self.cfg``)."""

    FORMAT: ClassVar[str]
    CONFIG_CLASS: ClassVar[type]
    CONFIG_KEY: ClassVar[str] = "config"

    def save_pretrained(self, folder: str | os.PathLike, *, meta: dict[str, Any] | None = None,
                        files: dict[str, Callable[[Path], None]] | None = None) -> Path:
        """Weights (float32), extra ``files`` (name -> writer of that path) and config.json."""
        import torch
        from safetensors.torch import save_file

        tensors = {k: (v.detach().to("cpu", torch.float32) if v.is_floating_point() else v.detach().cpu()).contiguous()
                   for k, v in self.state_dict().items()}

        def write(tmp: Path) -> None:
            save_file(tensors, str(tmp / MODEL_FILE), metadata={"format": self.FORMAT})
            for name, writer in (files or {}).items():
                writer(tmp / name)

        head = {"format": self.FORMAT, self.CONFIG_KEY: dataclasses.asdict(self.cfg),
                "parameters": int(sum(v.numel() for v in tensors.values()))}
        return write_folder(Path(folder), write, {**head, **(meta or {})})

    @classmethod
    def read_config(cls, folder: str | os.PathLike, missing: str = "not a saved model (or an interrupted copy)"):
        """(config dataclass, the whole config.json) without touching the weights."""
        folder = Path(folder)
        meta = read_json(folder / CONFIG_FILE, PretrainedError, missing)
        if not isinstance(meta, dict) or meta.get("format") != cls.FORMAT:
            raise PretrainedError(f"{folder / CONFIG_FILE}: not a {cls.FORMAT} model (format "
                                  f"{meta.get('format') if isinstance(meta, dict) else None!r})")
        return config_from_dict(cls.CONFIG_CLASS, meta.get(cls.CONFIG_KEY, {}), str(folder / CONFIG_FILE)), meta

    @classmethod
    def from_pretrained(cls, folder: str | os.PathLike, device="cpu", *, verify: bool = True):
        """Load a folder ``save_pretrained`` wrote; every file's hash is checked before the
        model is returned."""
        folder = Path(folder)
        if not folder.is_dir():
            raise PretrainedError(f"{folder}: no such folder")
        cfg, meta = cls.read_config(folder)
        model = cls(cfg)
        expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        weights = read_weights(folder / MODEL_FILE, expected)
        if verify:
            verify_files(folder, meta)
        model.load_state_dict(weights)
        model.saved_meta = meta
        return model.to(device).eval()
