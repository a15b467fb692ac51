"""``manifest.json``: which trajectory files a world-model update trains on, and how.

The seed's recipe: the new collection plus replay sources (demonstrations, earlier cycles),
validation ratio 0.2 split *by episode*, sampling ratio of new data 0.5, and a SHA-256 of
every file, verified before training starts. The manifest records all of that, so a run can
be audited and repeated::

    {"format": "wmrl-manifest/1", "val_ratio": 0.2, "new_ratio": 0.5, "seed": 0,
     "files": [{"path": "...", "source": "new", "sha256": "...", "bytes": 123, "episodes": 50,
                "val_episodes": [3, 17, ...]}, ...]}

Paths are stored relative to the manifest's folder, so a run folder can be moved as a whole
together with its data.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from wmrl.data.trajectory import TrajectoryError, count_episodes, find_trajectory_files
from wmrl.fileio import read_json, sha256_file, write_json

FORMAT = "wmrl-manifest/1"
SOURCES = ("new", "replay")


class ManifestError(TrajectoryError):
    """A manifest is missing, malformed, or a file it names changed."""


@dataclass(frozen=True)
class ManifestFile:
    path: Path  # absolute
    source: str
    sha256: str
    bytes: int
    episodes: int
    val_episodes: tuple[int, ...]


def _split(n_total: int, val_ratio: float, rng: np.random.Generator) -> set[int]:
    if val_ratio <= 0 or n_total < 2:
        return set()
    n_val = min(n_total - 1, max(1, int(round(val_ratio * n_total))))
    return set(rng.permutation(n_total)[:n_val].tolist())


def build_manifest(out: str | os.PathLike, new: list, replay: list, *, val_ratio: float = 0.2,
                   new_ratio: float = 0.5, seed: int = 0) -> dict:
    """Hash every file, split episodes (per source, seeded) and write ``out`` atomically."""
    if not 0 <= val_ratio < 1 or not 0 <= new_ratio <= 1:
        raise ManifestError(f"val_ratio={val_ratio} must be in [0, 1) and new_ratio={new_ratio} in [0, 1]")
    out = Path(out)
    rng = np.random.default_rng(seed)
    files = []
    for source, inputs in (("new", new), ("replay", replay)):
        if not inputs:
            continue
        paths = find_trajectory_files(inputs)
        counts = [count_episodes(p) for p in paths]
        val = sorted(_split(sum(counts), val_ratio, rng))  # over the source's episodes, then per file
        start = 0
        for p, n in zip(paths, counts):
            mine = [i - start for i in val if start <= i < start + n]
            start += n
            files.append({"path": _relative(p, out.parent), "source": source, "sha256": sha256_file(p),
                          "bytes": p.stat().st_size, "episodes": n, "val_episodes": mine})
    if not files:
        raise ManifestError("no trajectory files given: pass --new (this cycle's collection) and/or --replay")
    manifest = {"format": FORMAT, "val_ratio": val_ratio, "new_ratio": new_ratio, "seed": seed, "files": files}
    write_json(out, manifest)
    return manifest


def _relative(p: Path, base: Path) -> str:
    p = p.resolve()
    try:
        return os.path.relpath(p, base.resolve())
    except ValueError:  # another drive
        return str(p)


def load_manifest(path: str | os.PathLike, *, verify: bool = True) -> tuple[dict, list[ManifestFile]]:
    """Read a manifest; with ``verify``, check every file's size and SHA-256 first."""
    path = Path(path)
    m = read_json(path, ManifestError, "make it with `make manifest` (python python/make_manifest.py)")
    if not isinstance(m, dict) or m.get("format") != FORMAT or not isinstance(m.get("files"), list):
        raise ManifestError(f"{path}: not a {FORMAT} manifest")
    out = []
    for f in m["files"]:
        try:
            p = Path(f["path"])
            p = p if p.is_absolute() else (path.parent / p)
            mf = ManifestFile(p.resolve(), f["source"], f["sha256"], int(f["bytes"]), int(f["episodes"]),
                              tuple(int(i) for i in f["val_episodes"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ManifestError(f"{path}: malformed file entry {f!r} ({e!r})") from None
        if mf.source not in SOURCES:
            raise ManifestError(f"{path}: source {mf.source!r} of {mf.path} must be one of {SOURCES}")
        if verify:
            if not mf.path.is_file():
                raise ManifestError(f"{mf.path} (named in {path}) is missing; restore it or rebuild the manifest")
            if mf.path.stat().st_size != mf.bytes or sha256_file(mf.path) != mf.sha256:
                raise ManifestError(f"{mf.path} changed since {path} was written (SHA-256 mismatch); "
                                    "rebuild the manifest if the change is intended")
        out.append(mf)
    return m, out
