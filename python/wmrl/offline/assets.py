"""Find the files the LIBERO-Spatial scenes load, and pack them.

``scan`` builds each task's MJCF model exactly as ``SpatialEnv`` does (LIBERO's
``OffScreenRenderEnv`` on the task's BDDL file) and stops at the moment robosuite hands the
final XML to MuJoCo (``MjSim.from_xml_string``): no compile, no GL context, about 0.1 s a task.
Every attribute whose name starts with ``file`` (``file``, and ``fileright``.. of cube
textures) of that XML is a file MuJoCo reads: meshes, textures, height fields, skins. The scan
also records which distributions the simulator side imported, so the build can refuse a
bundle that misses one.

It needs LIBERO installed (``.venv/train``), so the build runs it as a subprocess:
``python -m wmrl.offline.assets --tasks 0-9 --out scan.json``.

``locate`` maps each file to the installed distribution that owns it and checks it against
that distribution's RECORD hash; ``write_pack`` writes the deterministic tar.xz.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import json
import lzma
import os
import sys
import tarfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from wmrl.fileio import sha256_file

# Modules the kit imports only when it needs them (videos, trajectory files, progress bars).
KIT_LAZY_IMPORTS = ("h5py", "imageio.v2", "tqdm")
KIT_MODULES = ("wmrl.sim.env", "wmrl.sim.vector", "wmrl.sim.expert", "wmrl.sim.policies",
               "wmrl.evaluation.harness", "wmrl.data.trajectory", "wmrl.data.validate")


class _ModelXML(Exception):
    """Carries the final MJCF out of robosuite's environment constructor."""


def files_in_xml(xml: str) -> list[str]:
    """Every ``file*`` attribute value of an MJCF document (normalized paths, sorted)."""
    root = ET.fromstring(xml)
    found = set()
    for el in root.iter():
        if el.tag == "include":
            raise ValueError("the model still has an <include>: not a final (merged) model XML")
        for key, value in el.attrib.items():
            if key.startswith("file") and value:
                found.add(os.path.normpath(value))
    return sorted(found)


def scene_xml(task_index: int) -> str:
    """The final MJCF of one task, built the way ``SpatialEnv`` builds it."""
    import robosuite.environments.base as base
    from libero.libero.envs import OffScreenRenderEnv

    from wmrl.sim.tasks import get_task

    def grab(xml, *args, **kwargs):
        raise _ModelXML(xml)

    original = base.MjSim.from_xml_string
    base.MjSim.from_xml_string = staticmethod(grab)
    try:
        OffScreenRenderEnv(bddl_file_name=get_task(task_index).bddl_file, camera_heights=64, camera_widths=64,
                           hard_reset=False)
    except _ModelXML as got:
        return got.args[0]
    finally:
        base.MjSim.from_xml_string = original
    raise RuntimeError(f"task {task_index}: robosuite built no model (MjSim.from_xml_string was never called)")


def scan(tasks: list[int]) -> dict:
    """Files per task, and the distributions imported on the way (run in a fresh process)."""
    import importlib
    from importlib.metadata import packages_distributions, version

    baseline = set(sys.modules)
    from wmrl.gl import configure_renderer

    # Nothing is rendered, but robosuite picks its GL context class at import (egl unless told).
    renderer = configure_renderer()
    per_task = {}
    for t in tasks:
        start = time.time()
        files = files_in_xml(scene_xml(t))
        missing = [f for f in files if not os.path.isfile(f)]
        if missing:
            raise FileNotFoundError(f"task {t}: the model references files that do not exist: {missing[:5]}")
        per_task[t] = files
        print(f"[scan] task {t}: {len(files)} files ({time.time() - start:.1f} s)", file=sys.stderr)
    for name in KIT_MODULES + KIT_LAZY_IMPORTS:
        importlib.import_module(name)
    owners = packages_distributions()
    top = {m.split(".")[0] for m in set(sys.modules) - baseline}
    dists = sorted({d for m in top for d in owners.get(m, ())})
    return {
        "tasks": {str(t): f for t, f in per_task.items()},
        "imported_distributions": dists,
        "versions": {d: version(d) for d in dists},
        "renderer": renderer,
        "python": sys.version.split()[0],
    }


# ------------------------------------------------------------------------------ ownership
@dataclass(frozen=True)
class AssetFile:
    source: str  # absolute path in the build environment
    relpath: str  # path relative to site-packages, as in the owner's RECORD
    owner: str  # distribution that installed it
    sha256: str
    size: int


def _record_digest(hash_field: str) -> str:
    algo, _, b64 = hash_field.partition("=")
    if algo != "sha256":
        raise ValueError(f"unsupported RECORD hash {algo!r}")
    return base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4)).hex()


def record_index(dist_names: list[str]) -> dict[str, tuple[str, str, str]]:
    """Absolute path -> (distribution, RECORD path, sha256) for the given installed dists."""
    from importlib.metadata import distribution

    index = {}
    for name in dist_names:
        dist = distribution(name)
        for f in dist.files or ():
            if f.hash is None:
                continue
            index[os.path.normpath(str(dist.locate_file(f)))] = (dist.metadata["Name"], str(f), f.hash.value)
    return index


def locate(paths: list[str], index: dict[str, tuple[str, str, str]]) -> list[AssetFile]:
    """Owner and RECORD-verified hash of each referenced file; refuses unowned or changed files."""
    out = []
    for path in sorted(set(paths)):
        key = os.path.normpath(os.path.realpath(path))
        hit = index.get(key) or index.get(os.path.normpath(path))
        if hit is None:
            raise RuntimeError(f"{path}: referenced by a scene but not installed by robosuite or LIBERO's assets")
        dist, rel, b64 = hit
        digest = sha256_file(path)
        if digest != _record_digest(f"sha256={b64}"):
            raise RuntimeError(f"{path}: differs from what {dist} installed (RECORD hash mismatch)")
        out.append(AssetFile(path, rel, dist, digest, os.path.getsize(path)))
    return out


# ------------------------------------------------------------------------------ the pack
def write_pack(files: list[AssetFile], dest: Path, preset: int = 6) -> None:
    """Deterministic tar.xz: sorted members, mode 0644, owner root, mtime 0."""
    tmp = dest.with_name(dest.name + ".partial")
    with lzma.open(tmp, "wb", preset=preset) as xz, tarfile.open(fileobj=xz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for f in sorted(files, key=lambda f: f.relpath):
            info = tarfile.TarInfo(f.relpath)
            info.size, info.mode, info.mtime = f.size, 0o644, 0
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            with open(f.source, "rb") as fh:
                data = fh.read()
            if hashlib.sha256(data).hexdigest() != f.sha256:
                raise RuntimeError(f"{f.source} changed while the pack was written")
            tar.addfile(info, io.BytesIO(data))
    tmp.replace(dest)


def _parse_tasks(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        out.extend(range(int(a), int(b or a) + 1))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Scan the LIBERO-Spatial scenes for the files MuJoCo loads.")
    ap.add_argument("--tasks", default="0-9", help="task indices, e.g. 0-9 or 0,3")
    ap.add_argument("--out", required=True, help="JSON file to write")
    args = ap.parse_args(argv)
    result = scan(_parse_tasks(args.tasks))
    Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
