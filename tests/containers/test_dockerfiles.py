"""Static checks of Dockerfile.train / Dockerfile.wm (no engine): pinned bases, Python versions,
hash-checked offline installs, non-root user, rendering settings, labels, build context."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from wmrl.containers.images import PYTHON_VERSIONS, image_spec

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = {name: ROOT / f"Dockerfile.{name}" for name in ("train", "wm")}
PINNED = re.compile(r"^[\w.\-/]+:[\w.\-]+@sha256:[0-9a-f]{64}$")


def parse(path: Path) -> list[dict]:
    from dockerfile_parse import DockerfileParser

    with open(path, "rb") as f:
        return DockerfileParser(fileobj=f).structure


def stages(structure: list[dict]) -> list[list[dict]]:
    out: list[list[dict]] = [[]]
    for ins in structure:
        if ins["instruction"] == "FROM":
            out.append([])
        out[-1].append(ins)
    return out  # out[0]: instructions before the first FROM (global ARGs)


@pytest.mark.parametrize("name", DOCKERFILES)
def test_every_from_is_a_stage_or_a_base_pinned_by_tag_and_digest(name):
    structure = parse(DOCKERFILES[name])
    global_args = {m.group(1): m.group(2) for ins in stages(structure)[0] if ins["instruction"] == "ARG"
                   for m in [re.match(r"(\w+)=(\S+)", ins["value"])] if m}
    aliases: set[str] = set()
    for ins in structure:
        if ins["instruction"] != "FROM":
            continue
        parts = ins["value"].split()
        image = parts[0]
        if len(parts) == 3 and parts[1].upper() == "AS":
            aliases.add(parts[2])
        if image in aliases:
            continue
        m = re.fullmatch(r"\$\{?(\w+)\}?", image)
        resolved = global_args.get(m.group(1), "") if m else image
        assert PINNED.match(resolved), f"{name}: FROM {image} -> {resolved!r} is not pinned as name:tag@sha256:digest"
        assert "nvidia/cuda" in resolved and "ubuntu22.04" in resolved, resolved


@pytest.mark.parametrize("name", DOCKERFILES)
def test_python_version_in_every_stage(name):
    for stage in stages(parse(DOCKERFILES[name]))[1:]:
        args = [ins["value"] for ins in stage if ins["instruction"] == "ARG" and ins["value"].startswith("PYTHON_VERSION")]
        assert args == [f"PYTHON_VERSION={PYTHON_VERSIONS[name]}"], (name, args)
    assert PYTHON_VERSIONS == {"train": "3.11", "wm": "3.10"}


@pytest.mark.parametrize("name", DOCKERFILES)
def test_installs_are_offline_and_hash_checked(name):
    runs = [ins["value"] for ins in parse(DOCKERFILES[name]) if ins["instruction"] == "RUN"]
    pip = [cmd for r in runs for cmd in re.split(r"&&|;", r) if re.search(r"pip\s+install", cmd)]
    assert len(pip) == 2, pip  # build tools, then the lock
    for cmd in pip:
        for flag in ("--no-index", "--require-hashes", "--find-links /tmp/wheelhouse"):
            assert flag in cmd, f"{name}: `{cmd.strip()}` lacks {flag}"
        assert re.search(r"-r /tmp/(requirements|build)\.lock", cmd)
    assert not any(re.search(r"\b(curl|wget)\b|pip\s+download|--index-url|--extra-index-url", r) for r in runs)
    text = DOCKERFILES[name].read_text()
    assert f"ARG LOCK=docker/{name}.lock" in text and f"ARG WHEELHOUSE=wheelhouse/{name}" in text
    # the lock hash in the labels is verified against the file installed
    assert 'sha256sum --check' in text


@pytest.mark.parametrize("name", DOCKERFILES)
def test_runs_as_a_non_root_user(name):
    structure = parse(DOCKERFILES[name])
    final = stages(structure)[-1]
    users = [ins["value"].strip() for ins in final if ins["instruction"] == "USER"]
    assert users and users[-1] not in ("root", "0", "0:0") and not users[-1].startswith("0:"), users
    uid = re.search(r"ARG USER_UID=(\d+)", DOCKERFILES[name].read_text())
    assert uid and int(uid.group(1)) > 0
    assert any("useradd" in ins["value"] for ins in structure if ins["instruction"] == "RUN")


@pytest.mark.parametrize("name", DOCKERFILES)
def test_rendering_gpu_and_labels(name):
    final = stages(parse(DOCKERFILES[name]))[-1]
    env = " ".join(ins["value"] for ins in final if ins["instruction"] == "ENV")
    assert "MUJOCO_GL=egl" in env
    caps = re.search(r"NVIDIA_DRIVER_CAPABILITIES=(\S+)", env).group(1).split(",")
    assert {"compute", "utility", "graphics"} <= set(caps)
    labels = " ".join(ins["value"] for ins in final if ins["instruction"] == "LABEL")
    for key in ("org.opencontainers.image.version=\"${KIT_VERSION}\"", "org.opencontainers.image.revision=\"${GIT_COMMIT}\"",
                "org.wmrl.lock.sha256=\"${LOCK_SHA256}\"", f'org.wmrl.image="{name}"'):
        assert key in labels, key
    system = DOCKERFILES[name].read_text()
    for pkg in ("libegl1", "libosmesa6", "ffmpeg", "gcc", "python${PYTHON_VERSION}-dev"):
        assert pkg in system, pkg
    assert "rm -rf /var/lib/apt/lists/*" in system and "PIP_NO_CACHE_DIR=1" in system


def test_the_two_dockerfiles_differ_only_in_what_makes_them_train_or_wm():
    def canonical(name: str) -> str:
        text = DOCKERFILES[name].read_text()
        text = re.sub(r"PYTHON_VERSION=3\.1[01]", "PYTHON_VERSION=X", text)
        text = text.replace(f"docker/{name}.lock", "docker/X.lock").replace(f"wheelhouse/{name}", "wheelhouse/X")
        text = re.sub(rf'\b{name}\b', "X", text)
        # the header comments and the one-line image description are free text
        return "\n".join(line for line in text.splitlines()
                         if not line.startswith("#") and "image.description" not in line)

    assert canonical("train") == canonical("wm")


def test_dockerignore_keeps_the_context_small():
    lines = [l.strip() for l in (ROOT / ".dockerignore").read_text().splitlines() if l.strip() and not l.startswith("#")]
    assert lines[0] == "*", "start from nothing, then allow what the images copy"
    assert {"!docker/", "!python/", "!wheelhouse/"} <= set(lines)


def test_build_context_holds_only_what_the_image_needs(tmp_path):
    from wmrl.containers.build import context_files

    spec = image_spec("wm", "docker/test-cpu-wm.lock", "x:y")
    house = spec.wheelhouse_path
    created = not house.exists()
    house.mkdir(parents=True, exist_ok=True)
    try:
        names = set(context_files(spec))
    finally:
        if created:
            shutil.rmtree(house)
    assert {"Dockerfile.wm", "docker/test-cpu-wm.lock", "docker/build.lock", "docker/entrypoint.sh", "python/check.py"} <= names
    assert not [n for n in names if n.startswith((".venv", "runs/", ".git", "wheelhouse/train", "tests/")) or "__pycache__" in n]


def test_hadolint_when_available():
    import sys

    exe = shutil.which("hadolint", path=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    if not exe:
        pytest.skip("hadolint is not installed (optional linter; `hadolint` on PATH enables this test)")
    for path in DOCKERFILES.values():
        proc = subprocess.run([exe, "--no-color", "--failure-threshold", "info", str(path)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr
