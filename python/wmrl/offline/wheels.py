"""Wheels of a bundle: downloaded from the index with hashes checked, or rebuilt here.

* ``download`` fetches the pinned files for the target (``pip download --require-hashes``,
  binary for the target's Python and manylinux platform) into a cache folder and returns the
  file of each pin whose SHA-256 the lock lists. A package with only an sdist (bddl) is built
  into a wheel here, and refused unless that wheel is pure Python.
* ``code_wheel`` writes a code-only wheel from an installed distribution: every file whose
  suffix is in ``CODE_SUFFIXES``, each checked against the distribution's RECORD first.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections import Counter
from pathlib import Path

from wmrl.fileio import sha256_file
from wmrl.offline.requirements import Pinned, normalize

# Files a code-only wheel keeps: code and the text data it reads (MJCF, controller configs).
CODE_SUFFIXES = {".py", ".pyi", ".typed", ".xml", ".json", ".yaml", ".yml", ".txt", ".cfg"}
ZIP_DATE = (1980, 1, 1, 0, 0, 0)
PYPI = "https://pypi.org/simple"


def find_pip(repo: Path) -> list[str]:
    """A Python that has pip (the build venv made by uv has none)."""
    for py in (sys.executable, str(repo / ".venv/tools/bin/python"), shutil.which("python3")):
        if py and subprocess.run([py, "-m", "pip", "--version"], capture_output=True).returncode == 0:
            return [py, "-m", "pip"]
    raise RuntimeError("no Python with pip found (tried this interpreter, .venv/tools, python3)")


def clean_pip_env() -> dict[str, str]:
    """Plain index access: no pip config file, no PIP_* settings (local find-links, indexes)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1")
    return env


def pip_platform_args(python_version: str) -> list[str]:
    """pip matches platform tags exactly: list every manylinux tag a glibc 2.28 system accepts."""
    plats = [f"manylinux_2_{n}_x86_64" for n in range(28, 4, -1)]
    plats += ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
    nodot = python_version.replace(".", "")
    args = ["--python-version", python_version, "--implementation", "cp", "--abi", f"cp{nodot}"]
    for p in plats:
        args += ["--platform", p]
    return args


def _file_pin(filename: str) -> tuple[str, str] | None:
    """(normalized name, version) of a wheel or sdist file name."""
    if filename.endswith(".whl"):
        parts = filename[:-4].split("-")
        return (normalize(parts[0]), parts[1]) if len(parts) >= 5 else None
    m = re.match(r"^(.+)-([^-]+)\.(tar\.gz|zip)$", filename)
    return (normalize(m.group(1)), m.group(2)) if m else None


def _match(folder: Path, pin: Pinned) -> Path | None:
    for f in sorted(folder.iterdir()) if folder.is_dir() else ():
        if _file_pin(f.name) == (pin.name, pin.version) and sha256_file(f) in pin.hashes:
            return f
    return None


def download(pins: list[Pinned], python_version: str, cache: Path, repo: Path, index_url: str = PYPI,
             cert: str | None = None) -> dict[str, Path]:
    """The verified file of every pin (wheels; pure sdists built into wheels)."""
    dl = cache / f"download-cp{python_version.replace('.', '')}"
    built = cache / "built-from-sdist"
    dl.mkdir(parents=True, exist_ok=True)
    built.mkdir(parents=True, exist_ok=True)
    todo = [p for p in pins if _match(dl, p) is None]
    if todo:
        req = dl / "requirements.partial"
        req.write_text("".join(p.requirement_line() + "\n" for p in todo))
        cmd = find_pip(repo) + ["download", "--no-deps", "--prefer-binary", "--require-hashes", "--progress-bar", "off",
                                "--index-url", index_url, "-d", str(dl), "-r", str(req)] + pip_platform_args(python_version)
        cert = cert or next((c for c in ("/etc/ssl/certs/ca-certificates.crt",) if os.path.isfile(c)), None)
        if cert:
            cmd += ["--cert", cert]
        print(f"[wheels] downloading {len(todo)} file(s) for Python {python_version} from {index_url}", flush=True)
        proc = subprocess.run(cmd, env=clean_pip_env(), capture_output=True, text=True)
        req.unlink()
        if proc.returncode != 0:
            raise RuntimeError(f"pip download failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    out = {}
    for pin in pins:
        f = _match(dl, pin)
        if f is None:
            raise RuntimeError(f"{pin.name}=={pin.version}: no downloaded file matches the lock's hashes")
        if not f.name.endswith(".whl"):
            f = _wheel_from_sdist(f, built, repo)
        out[pin.name] = f
    return out


def _wheel_from_sdist(sdist: Path, built: Path, repo: Path) -> Path:
    """Build a hash-verified sdist into a wheel here; only pure-Python wheels are portable."""
    folder = built / sha256_file(sdist)[:16]
    wheels = sorted(folder.glob("*.whl")) if folder.is_dir() else []
    if not wheels:
        folder.mkdir(parents=True, exist_ok=True)
        print(f"[wheels] building {sdist.name} into a wheel (no wheel on the index)", flush=True)
        cmd = find_pip(repo) + ["wheel", "--no-deps", "--no-binary", ":all:", "--progress-bar", "off",
                                "-w", str(folder), str(sdist)]
        cert = "/etc/ssl/certs/ca-certificates.crt"
        if os.path.isfile(cert):
            cmd += ["--cert", cert]
        proc = subprocess.run(cmd, env=clean_pip_env(), capture_output=True, text=True)
        wheels = sorted(folder.glob("*.whl"))
        if proc.returncode != 0 or len(wheels) != 1:
            raise RuntimeError(f"building a wheel from {sdist.name} failed:\n{proc.stderr[-3000:]}")
    tag = "-".join(wheels[0].name[:-4].split("-")[-3:])
    if not re.fullmatch(r"py[23.py]*-none-any", tag):
        raise RuntimeError(f"{sdist.name} builds a platform wheel ({wheels[0].name}) here, which the target "
                           "cannot use: find a wheel for the target or build it there")
    return wheels[0]


# ------------------------------------------------------------------------------ rebuilt wheels
def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def write_wheel(out_dir: Path, name: str, version: str, files: dict[str, Path], metadata: str,
                extra_dist_info: dict[str, bytes] | None = None) -> Path:
    """A deterministic ``py3-none-any`` wheel of ``files`` (archive path -> source file)."""
    stem = f"{re.sub(r'[-_.]+', '_', name)}-{version}"
    dist_info = f"{stem}.dist-info"
    wheel_meta = "Wheel-Version: 1.0\nGenerator: wmrl-offline\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    entries: dict[str, bytes] = {arc: Path(src).read_bytes() for arc, src in files.items()}
    entries[f"{dist_info}/METADATA"] = metadata.encode()
    entries[f"{dist_info}/WHEEL"] = wheel_meta.encode()
    for rel, data in (extra_dist_info or {}).items():
        entries[f"{dist_info}/{rel}"] = data
    record = "".join(f"{arc},{_record_hash(data)},{len(data)}\n" for arc, data in sorted(entries.items()))
    record += f"{dist_info}/RECORD,,\n"
    path = out_dir / f"{stem}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        for arc in sorted(entries) + [f"{dist_info}/RECORD"]:
            info = zipfile.ZipInfo(arc, ZIP_DATE)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, record.encode() if arc.endswith("/RECORD") else entries[arc])
    return path


def installed_files(dist_name: str, prefixes: tuple[str, ...]) -> tuple[dict[str, Path], Counter]:
    """RECORD-verified files of an installed distribution under ``prefixes`` that a code wheel
    keeps (``CODE_SUFFIXES``), and a count by suffix of those it leaves out."""
    from importlib.metadata import distribution

    from wmrl.offline.assets import _record_digest

    dist = distribution(dist_name)
    kept, dropped = {}, Counter()
    for f in dist.files or ():
        rel = str(f)
        if not rel.startswith(prefixes) or "__pycache__" in rel:
            continue
        path = Path(dist.locate_file(f))
        suffix = path.suffix.lower()
        if suffix not in CODE_SUFFIXES:
            dropped[suffix or "(none)"] += 1
            continue
        if f.hash is None or sha256_file(path) != _record_digest(f"{f.hash.mode}={f.hash.value}"):
            raise RuntimeError(f"{path}: differs from what {dist_name} installed (RECORD hash mismatch)")
        kept[rel] = path
    return kept, dropped


def metadata_with_version(dist_name: str, version: str) -> str:
    """The installed METADATA with its Version replaced (the long description dropped)."""
    from importlib.metadata import distribution

    text = distribution(dist_name).read_text("METADATA") or ""
    head = text.split("\n\n", 1)[0]
    return re.sub(r"(?m)^Version: .*$", f"Version: {version}", head) + "\n"
