"""``model_pair/``: the two world models, the frozen reward model and the initial-observation
resources that GRPO imagines with, as one verified unit (the seed's ``pair.json``).

    model_pair/
      pair.json                 names, SHA-256 and size of every file, steps, configs, lineage
      main/  model.safetensors config.json      (main-view world model)
      wrist/ model.safetensors config.json      (wrist-view world model)
      reward/ model.safetensors config.json     (success classifier, calibrated threshold)
      init_observations.safetensors             real keyframes: main, wrist, proprio, task
      init_observations.json                    their episodes and instructions

Files are copied, not linked, so a pair can be moved or shipped on its own. ``load_pair``
verifies every hash before anything is used; ``--model-pair DIR`` on GRPO switches both world
models (and the reward model that judged with them) at once.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from wmrl.config import ConfigError
from wmrl.fileio import atomic_path, read_json, sha256_file, write_json

FORMAT = "wmrl-model-pair/1"
PARTS = ("main", "wrist", "reward")
INIT_FILE = "init_observations.safetensors"


class PairError(ConfigError):
    """A model pair is missing, incomplete or does not match its hashes."""


def _file_entry(path: Path, root: Path) -> dict:
    return {"path": str(path.relative_to(root)), "sha256": sha256_file(path), "bytes": path.stat().st_size}


def _copy(src_dir: Path, dst_dir: Path) -> None:
    dst_dir.mkdir(parents=True, exist_ok=True)
    for name in ("model.safetensors", "config.json"):
        src = src_dir / name
        if not src.is_file():
            raise PairError(f"{src} is missing: train that model first (make wm-update / make wm-reward)")
        with atomic_path(dst_dir / name) as tmp:
            shutil.copyfile(src, tmp)


def _init_observations(manifest: Path, out: Path, per_task: int = 50) -> dict:
    """First frames of the manifest's training episodes (up to ``per_task`` per task)."""
    import numpy as np
    import torch
    from safetensors.torch import save_file

    from wmrl.worldmodel.data import load_split

    _, train, _ = load_split(manifest, chunk=8, verify=False)  # verified by the caller's manifest check
    chosen, count = [], {}
    for e in train:
        if count.get(e.task, 0) < per_task:
            chosen.append(e)
            count[e.task] = count.get(e.task, 0) + 1
    if not chosen:
        raise PairError(f"{manifest} has no training episodes to take initial observations from")
    tensors = {"main": torch.from_numpy(np.stack([e.main[0] for e in chosen])),
               "wrist": torch.from_numpy(np.stack([e.wrist[0] for e in chosen])),
               "proprio": torch.from_numpy(np.stack([e.proprio[0] for e in chosen])),
               "task": torch.tensor([e.task for e in chosen], dtype=torch.int64)}
    with atomic_path(out / INIT_FILE) as tmp:
        save_file(tensors, str(tmp))
    info = {"episodes": [e.key for e in chosen], "instructions": {str(e.task): e.instruction for e in chosen},
            "per_task": {str(k): v for k, v in sorted(count.items())}}
    write_json(out / "init_observations.json", info)
    return info


def package_pair(run: str | os.PathLike, out: str | os.PathLike | None = None, *, overwrite: bool = False) -> Path:
    """Build RUN/model_pair from the update's selection, the reward model and the manifest."""
    from wmrl.data.manifest import load_manifest
    from wmrl.lineage import git_commit
    from wmrl.worldmodel.update import selection_path

    run = Path(run)
    out = Path(out or run / "model_pair")
    sel = read_json(selection_path(run), PairError, f"run the world-model update first (make wm-update RUN={run})")
    manifest = run / "manifest.json"
    load_manifest(manifest, verify=True)
    if (out / "pair.json").exists() and not overwrite:
        raise FileExistsError(f"{out}/pair.json exists; pass --overwrite (OVERWRITE=1) to package again")
    sources = {"main": Path(sel["main"]["weights"]), "wrist": Path(sel["wrist"]["weights"]),
               "reward": run / "worldmodels" / "reward"}
    for part, src in sources.items():
        _copy(src, out / part)
    init_info = _init_observations(manifest, out)
    files = {part: [_file_entry(out / part / n, out) for n in ("model.safetensors", "config.json")] for part in PARTS}
    files["init_observations"] = [_file_entry(out / INIT_FILE, out), _file_entry(out / "init_observations.json", out)]
    pair = {
        "format": FORMAT, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "models": {"main": {"step": sel["main"]["step"], "stopped": sel["main"]["reason"], "source": str(sources["main"])},
                   "wrist": {"step": sel["wrist"]["step"], "stopped": sel["wrist"]["reason"], "source": str(sources["wrist"])},
                   "reward": {"threshold": read_json(out / "reward" / "config.json", PairError, "")["threshold"]}},
        "init_observations": {"episodes": len(init_info["episodes"]), "per_task": init_info["per_task"]},
        "files": files,
        "lineage": {"manifest_sha256": sha256_file(manifest), "selection": str(selection_path(run)), "git_commit": git_commit()},
    }
    write_json(out / "pair.json", pair)
    return out / "pair.json"


@dataclass(frozen=True)
class ModelPair:
    root: Path
    meta: dict

    def part(self, name: str) -> Path:
        return self.root / name


def load_pair(path: str | os.PathLike) -> ModelPair:
    """Read ``pair.json`` (a folder or the file) and verify every file's size and SHA-256."""
    path = Path(path)
    root = path if path.is_dir() else path.parent
    meta = read_json(root / "pair.json", PairError, "package one with `make package RUN=...`")
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise PairError(f"{root / 'pair.json'}: not a {FORMAT} file")
    for part, entries in meta["files"].items():
        for e in entries:
            f = root / e["path"]
            if not f.is_file():
                raise PairError(f"{f} ({part}) is missing from the model pair {root}")
            if f.stat().st_size != e["bytes"] or sha256_file(f) != e["sha256"]:
                raise PairError(f"{f} ({part}) does not match its SHA-256 in {root / 'pair.json'}: "
                                "the pair was modified or damaged; package it again")
    return ModelPair(root, meta)
