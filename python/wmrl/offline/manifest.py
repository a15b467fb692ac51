"""MANIFEST.json of a bundle: every file with its SHA-256 and size. Standard library only."""

from __future__ import annotations

import json
import os
from pathlib import Path

from wmrl.fileio import read_json, sha256_file  # stdlib only, as the installer must be
from wmrl.offline import MANIFEST_NAME, WHEELS_DIR


class VerificationError(RuntimeError):
    """The bundle differs from its manifest; the message names every file concerned."""


def bundle_files(root: Path) -> list[str]:
    """Every regular file under ``root`` (relative, '/'-separated, sorted), manifest excluded."""
    out = []
    for dirpath, _, names in os.walk(root):
        for name in names:
            rel = Path(dirpath, name).relative_to(root).as_posix()
            if rel != MANIFEST_NAME:
                out.append(rel)
    return sorted(out)


def file_table(root: Path) -> dict[str, dict[str, int | str]]:
    return {rel: {"sha256": sha256_file(root / rel), "size": (root / rel).stat().st_size}
            for rel in bundle_files(root)}


def part_sizes(files: dict[str, dict]) -> dict[str, int]:
    """Bytes per part: wheels, the asset pack, everything else, and the total."""
    sizes = {"wheels": 0, "asset_pack": 0, "other": 0}
    for rel, entry in files.items():
        part = "wheels" if rel.startswith(WHEELS_DIR + "/") else "asset_pack" if rel.endswith(".tar.xz") else "other"
        sizes[part] += int(entry["size"])
    sizes["total"] = sum(sizes.values())
    return sizes


def write_manifest(root: Path, info: dict) -> dict:
    """Hash every file under ``root`` and write MANIFEST.json (``info`` is stored beside)."""
    files = file_table(root)
    manifest = {**info, "files": files, "sizes": part_sizes(files)}
    (root / MANIFEST_NAME).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest


def load_manifest(root: Path) -> dict:
    path = root / MANIFEST_NAME
    manifest = read_json(path, VerificationError,
                         f"no {MANIFEST_NAME}; is {root} a bundle made by `offline_bundle.py build`?")
    if not isinstance(manifest.get("files"), dict) or not manifest["files"]:
        raise VerificationError(f"{path}: lists no files")
    return manifest


def verify(root: Path, manifest: dict | None = None) -> dict:
    """Check every file against the manifest. Raises ``VerificationError`` naming each missing,
    changed or unlisted file; returns the manifest when all match."""
    manifest = manifest if manifest is not None else load_manifest(root)
    problems = []
    for rel, entry in sorted(manifest["files"].items()):
        if Path(rel).is_absolute() or ".." in Path(rel).parts:
            problems.append(f"{rel}: unsafe path in the manifest")
            continue
        path = root / rel
        if not path.is_file():
            problems.append(f"{rel}: missing")
            continue
        size = path.stat().st_size
        if size != entry["size"]:
            problems.append(f"{rel}: size {size} bytes, manifest says {entry['size']}")
            continue
        digest = sha256_file(path)
        if digest != entry["sha256"]:
            problems.append(f"{rel}: SHA-256 {digest} does not match the manifest's {entry['sha256']}")
    for rel in bundle_files(root):
        if rel not in manifest["files"]:
            problems.append(f"{rel}: not in the manifest")
    if problems:
        raise VerificationError(f"bundle {root} failed verification ({len(problems)} problem(s)):\n  "
                                + "\n  ".join(problems))
    return manifest
