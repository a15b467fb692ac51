"""``make wheelhouse``: every file a lock pins, downloaded on the host with its hash checked.

The images install with ``pip --no-index --require-hashes`` from ``wheelhouse/<lock>/``, which
holds exactly the files of ``docker/<lock>.lock`` plus ``docker/build.lock`` (hard links into a
shared download cache, so the two images and repeated runs do not download twice). The
download itself is the offline bundler's (``wmrl.offline.wheels``): ``pip download --no-deps
--require-hashes`` for the target Python and manylinux platform, from PyPI with the system's
certificate store. Packages published only as source stay sources here; the image builds them
with the hash-checked build tools of ``docker/build.lock``.

``find_links`` folders are searched first (by hash) for files the index does not serve, such as
torch's CPU wheel for the CPU test images.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from wmrl.containers.errors import ContainerError
from wmrl.containers.images import BUILD_LOCK, ImageSpec
from wmrl.offline.requirements import Pinned, parse_lock
from wmrl.offline.wheels import PYPI, _match, clean_pip_env, find_pip, pip_platform_args

INFO_NAME = "wheelhouse.json"
TARGET_ENV = {"sys_platform": "linux", "platform_system": "Linux", "os_name": "posix", "platform_machine": "x86_64",
              "implementation_name": "cpython", "platform_python_implementation": "CPython"}


@dataclass
class WheelhouseReport:
    folder: Path
    files: int
    bytes: int
    downloaded: int
    seconds: float
    sources: list[str] = field(default_factory=list)  # file names that are sources (built in the image)

    def line(self) -> str:
        src = f", {len(self.sources)} source-only ({', '.join(self.sources)})" if self.sources else ""
        return (f"{self.folder}: {self.files} files, {self.bytes / 2**20:.0f} MiB, {self.downloaded} downloaded "
                f"in {self.seconds:.0f} s{src}")


def applies(pin: Pinned, python_version: str) -> bool:
    """Whether a pin's environment marker holds on the image (Linux x86_64, CPython X.Y)."""
    if not pin.marker:
        return True
    from packaging.markers import Marker

    env = dict(TARGET_ENV, python_version=python_version, python_full_version=f"{python_version}.0")
    return Marker(pin.marker).evaluate(env)


def pins_of(spec: ImageSpec) -> list[Pinned]:
    pins: dict[str, Pinned] = {}
    for lock in (spec.repo / BUILD_LOCK, spec.lock_path):
        if not lock.is_file():
            raise ContainerError(f"{lock.relative_to(spec.repo)} not found: run `make lock`")
        for name, pin in parse_lock(lock.read_text()).items():
            if applies(pin, spec.python_version):
                pins[f"{name}=={pin.version}"] = pin
    return list(pins.values())


def _link(src: Path, dst: Path) -> None:
    if dst.exists():
        dst.unlink()
    try:
        os.link(src, dst)
    except OSError:  # another filesystem
        shutil.copy2(src, dst)


def _seed_from(find_links: list[Path], pins: list[Pinned], cache: Path) -> None:
    for pin in pins:
        if _match(cache, pin) is not None:
            continue
        for folder in find_links:
            f = _match(folder, pin)
            if f is not None:
                _link(f, cache / f.name)
                break


def _download(pins: list[Pinned], python_version: str, cache: Path, repo: Path, index_url: str) -> int:
    todo = [p for p in pins if _match(cache, p) is None]
    if not todo:
        return 0
    req = cache / "requirements.partial"
    req.write_text("".join(p.requirement_line() + "\n" for p in todo))
    cmd = find_pip(repo) + ["download", "--no-deps", "--prefer-binary", "--require-hashes", "--progress-bar", "off",
                            "--index-url", index_url, "-d", str(cache), "-r", str(req)] + pip_platform_args(python_version)
    if os.path.isfile("/etc/ssl/certs/ca-certificates.crt"):  # networks that re-sign TLS with a local CA
        cmd += ["--cert", "/etc/ssl/certs/ca-certificates.crt"]
    names = ", ".join(f"{p.name}=={p.version}" for p in todo[:6]) + (" ..." if len(todo) > 6 else "")
    print(f"[wheelhouse] downloading {len(todo)} file(s) for Python {python_version}: {names}", flush=True)
    proc = subprocess.run(cmd, env=clean_pip_env(), capture_output=True, text=True)
    req.unlink(missing_ok=True)
    if proc.returncode != 0:
        tail = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:] or ["(no output)"]
        raise ContainerError(f"pip download failed for {spec_hint(todo)}: {tail[0]} (a package index must be "
                             "reachable for `make wheelhouse`; copy wheelhouse/ from a machine where it is)")
    return len(todo)


def spec_hint(pins: list[Pinned]) -> str:
    return ", ".join(f"{p.name}=={p.version}" for p in pins[:3]) + (" ..." if len(pins) > 3 else "")


def fill(spec: ImageSpec, find_links: list[Path] | None = None, index_url: str = PYPI) -> WheelhouseReport:
    """Make ``spec.wheelhouse_path`` hold exactly the files of the image's locks, hash-checked."""
    start = time.monotonic()
    pins = pins_of(spec)
    cache = spec.repo / "wheelhouse" / ".download" / f"cp{spec.python_version.replace('.', '')}"
    cache.mkdir(parents=True, exist_ok=True)
    _seed_from([Path(f) for f in find_links or [] if Path(f).is_dir()], pins, cache)
    downloaded = _download(pins, spec.python_version, cache, spec.repo, index_url)
    dest = spec.wheelhouse_path
    dest.mkdir(parents=True, exist_ok=True)
    keep: dict[str, Path] = {}
    for pin in pins:
        f = _match(cache, pin)
        if f is None:
            raise ContainerError(f"{pin.name}=={pin.version}: no downloaded file has a hash the lock lists "
                                 "(the index served another file): run `make lock` and `make wheelhouse` again")
        keep[f.name] = f
    for old in dest.iterdir():  # files of an older lock would only bloat the build context
        if old.name not in keep and old.name != INFO_NAME:
            old.unlink()
    for name, f in keep.items():
        if not (dest / name).exists() or not os.path.samefile(f, dest / name):
            _link(f, dest / name)
    size = sum(f.stat().st_size for f in keep.values())
    sources = sorted(n for n in keep if not n.endswith(".whl"))
    (dest / INFO_NAME).write_text(json.dumps({
        "lock": spec.lock, "lock_sha256": spec.lock_sha256(), "build_lock": BUILD_LOCK,
        "python_version": spec.python_version, "files": sorted(keep), "bytes": size}, indent=1) + "\n")
    return WheelhouseReport(dest, len(keep), size, downloaded, time.monotonic() - start, sources)


def check_current(spec: ImageSpec) -> None:
    """Refuse to build from a wheelhouse that was made for another lock."""
    info = spec.wheelhouse_path / INFO_NAME
    if not info.is_file():
        raise ContainerError(f"{spec.wheelhouse}/ is missing: run `make wheelhouse` first (it downloads the "
                             f"files of {spec.lock}; a package index must be reachable)")
    data = json.loads(info.read_text())
    if data.get("lock_sha256") != spec.lock_sha256():
        raise ContainerError(f"{spec.wheelhouse}/ was made for another version of {spec.lock}: run `make wheelhouse`")
