"""``make bimanual-bundle``: scripted ALOHA episodes (+ optional LIBERO trajectories) -> bundle.

Episodes are generated one by one into ``<out>.partial/`` and kept there, so an interrupted
build continues where it stopped when rerun with the same settings. Episode IDs are derived
from (task, seed), so the same settings always produce the same bundle content.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import numpy as np

from wmrl.bimanual import aloha
from wmrl.bimanual.bundle import BundleWriter, SourceSpec
from wmrl.config import BundleConfig


def plan_episodes(cfg: BundleConfig) -> list[tuple[str, int, bool]]:
    """(task, seed, perturbed) for every ALOHA episode; failures spread evenly."""
    out = []
    n_fail = int(round(cfg.episodes_per_task * cfg.fail_fraction))
    for ti, task in enumerate(cfg.tasks):
        fail_at = set(np.linspace(0, cfg.episodes_per_task - 1, n_fail).round().astype(int).tolist()) if n_fail else set()
        for k in range(cfg.episodes_per_task):
            out.append((task, cfg.seed * 100_000 + ti * 10_000 + k, k in fail_at))
    return out


def build_bundle(cfg: BundleConfig, out: str | os.PathLike, *, libero: str | None = None, overwrite: bool = False,
                 progress: bool = True) -> Path:
    from tqdm import tqdm

    from wmrl.bimanual import libero as libero_conv
    from wmrl.bimanual.aloha import WELD_SOLIMP

    sources = [SourceSpec("aloha_sim", "aloha_sim", cfg.aloha_weight)]
    lib_files = []
    if libero:
        from wmrl.data.trajectory import find_trajectory_files

        lib_files = find_trajectory_files(libero)
        sources.append(SourceSpec("libero", "libero_panda", cfg.libero_weight))
    settings = {"bundle_config": dataclasses.asdict(cfg), "aloha": {"weld_solimp": list(WELD_SOLIMP), "camera": "top",
                "control_hz": 50}, "libero": {"files": [str(f) for f in lib_files], "semantics": libero_conv.SEMANTICS}}
    writer = BundleWriter(out, sources, window=cfg.window, stride=cfg.window_stride, val_fraction=cfg.val_fraction,
                          seed=cfg.seed, overwrite=overwrite, settings=settings)
    todo = [(t, s, p) for t, s, p in plan_episodes(cfg) if not writer.has(f"aloha_{t}_{s:06d}")]
    sims: dict[str, aloha.AlohaSim] = {}
    bar = tqdm(todo, desc="aloha episodes", disable=not progress, file=sys.stderr)
    ok = 0
    for task, seed, perturb in bar:
        sim = sims.get(task) or sims.setdefault(task, aloha.AlohaSim(task, cfg.image_size))
        ep = aloha.run_episode(sim, seed, perturb=perturb, frame_stride=cfg.frame_stride, max_steps=cfg.max_steps)
        writer.add("aloha_sim", f"aloha_{task}_{seed:06d}", ep)
        ok += ep.success
        bar.set_postfix(success=ok)
    if lib_files:
        from wmrl.data.trajectory import iter_episodes

        n = 0
        for f in lib_files:
            for i, traj in enumerate(iter_episodes(f)):
                if cfg.libero_episodes and n >= cfg.libero_episodes:
                    break
                eid = f"libero_{f.stem}_{i:04d}"
                if not writer.has(eid):
                    writer.add("libero", eid, libero_conv.convert(traj, cfg.image_size))
                n += 1
    return writer.finalize()
