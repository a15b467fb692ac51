"""Connection to the Docker Engine and the checks every command makes before using it."""

from __future__ import annotations

import os

from wmrl.containers.errors import ContainerError, one_line
from wmrl.containers.images import LABEL_LOCK_FILE, LABEL_LOCK_SHA, ImageSpec

# Environment variable that lets a run use an image built from other lock files (debugging).
SKIP_LOCK_CHECK = "WMRL_SKIP_LOCK_CHECK"


def _docker():
    try:
        import docker
    except ImportError:
        raise ContainerError("the Python package `docker` is missing: `make setup RUNTIME=docker` installs it "
                             "into .venv/driver (or pip install docker)") from None
    return docker


def daemon_address() -> str:
    return os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"


def connect(timeout: int | None = 600):
    """A docker-py client that has answered a ping, or a one-line error saying how to get one."""
    docker = _docker()
    try:
        client = docker.from_env(timeout=timeout)
        client.ping()
        return client
    except docker.errors.DockerException as e:
        reason = one_line(e, 160)
        hint = "start it (`sudo systemctl start docker`) or point DOCKER_HOST at a running daemon"
        if "Permission denied" in reason or "PermissionError" in reason:
            hint = "your user may not use its socket: add it to the `docker` group (then log in again) or use sudo"
        raise ContainerError(f"cannot reach the Docker daemon at {daemon_address()}: {hint}; "
                             f"RUNTIME=local runs without Docker ({reason})") from None


def get_image(client, spec: ImageSpec):
    """The image of ``spec``, refused if missing or built from another lock file."""
    docker = _docker()
    try:
        image = client.images.get(spec.tag)
    except docker.errors.ImageNotFound:
        raise ContainerError(f"image {spec.tag} not found: run `make build` (after `make wheelhouse`; "
                             f"IMAGES={spec.name} builds only this one)") from None
    labels = image.labels or {}
    want, have = spec.lock_sha256(), labels.get(LABEL_LOCK_SHA, "")
    if have != want and os.environ.get(SKIP_LOCK_CHECK) not in ("1", "yes", "true"):
        built_from = labels.get(LABEL_LOCK_FILE, "an unlabelled lock")
        raise ContainerError(
            f"image {spec.tag} was built from other lock files ({built_from} sha256 {have[:12] or '?'}, the "
            f"checkout's {spec.lock} is {want[:12]}): run `make build` to rebuild it ({SKIP_LOCK_CHECK}=1 runs it anyway)")
    return image


def is_missing_gpu_runtime(err: Exception) -> bool:
    """The daemon cannot honour a GPU DeviceRequest: no NVIDIA container toolkit configured."""
    text = str(err)
    return "could not select device driver" in text or "unknown or invalid runtime name: nvidia" in text
