"""What each image is: Dockerfile, lock, Python, tag, wheelhouse, and the labels it must carry."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

from wmrl.containers.errors import ContainerError
from wmrl.fileio import sha256_file
from wmrl.lineage import git_commit

REPO = Path(__file__).resolve().parents[3]
IMAGE_NAMES = ("train", "wm")
BUILD_LOCK = "docker/build.lock"  # pip/setuptools/wheel, installed first in both images

# Labels written by the Dockerfiles (from build arguments) and read back by the driver.
LABEL_IMAGE = "org.wmrl.image"
LABEL_LOCK_SHA = "org.wmrl.lock.sha256"
LABEL_LOCK_FILE = "org.wmrl.lock.file"
LABEL_BUILD_LOCK_SHA = "org.wmrl.build-lock.sha256"
LABEL_PYTHON = "org.wmrl.python"
LABEL_VERSION = "org.opencontainers.image.version"
LABEL_REVISION = "org.opencontainers.image.revision"


@dataclass(frozen=True)
class ImageSpec:
    """One image. ``lock`` and ``wheelhouse`` are relative to ``repo``; ``tag`` is the local name."""

    name: str  # train | wm
    dockerfile: str
    lock: str
    python_version: str
    tag: str
    wheelhouse: str
    repo: Path = REPO

    def __post_init__(self) -> None:
        if self.name not in IMAGE_NAMES:
            raise ContainerError(f"unknown image {self.name!r}: choose one of {', '.join(IMAGE_NAMES)}")

    @property
    def lock_path(self) -> Path:
        return self.repo / self.lock

    @property
    def wheelhouse_path(self) -> Path:
        return self.repo / self.wheelhouse

    def lock_sha256(self) -> str:
        if not self.lock_path.is_file():
            raise ContainerError(f"{self.lock} not found: run `make lock` (or give an existing --lock)")
        return sha256_file(self.lock_path)


PYTHON_VERSIONS = {"train": "3.11", "wm": "3.10"}


def image_spec(name: str, lock: str | None = None, tag: str | None = None, repo: Path = REPO) -> ImageSpec:
    """The image ``name`` (train | wm); ``lock``/``tag`` give a variant (e.g. the CPU test images).

    Defaults: ``$WMRL_LOCK_<NAME>`` or ``docker/<name>.lock``, and ``$WMRL_IMAGE_<NAME>`` or
    ``wmrl-<name>:latest`` (the variables let ``RUNTIME=docker make ...`` use a variant). A
    variant's wheelhouse is named after its lock, so variants never share a folder.
    """
    if name not in IMAGE_NAMES:
        raise ContainerError(f"unknown image {name!r}: choose one of {', '.join(IMAGE_NAMES)}")
    lock = lock or os.environ.get(f"WMRL_LOCK_{name.upper()}") or f"docker/{name}.lock"
    if os.path.isabs(lock):
        try:
            lock = str(Path(lock).resolve().relative_to(repo.resolve()))
        except ValueError:
            raise ContainerError(f"--lock {lock}: the lock file must be inside the repository ({repo})") from None
    stem = Path(lock).name.removesuffix(".lock")
    return ImageSpec(
        name=name,
        dockerfile=f"Dockerfile.{name}",
        lock=lock,
        python_version=PYTHON_VERSIONS[name],
        tag=tag or os.environ.get(f"WMRL_IMAGE_{name.upper()}") or f"wmrl-{name}:latest",
        wheelhouse=f"wheelhouse/{stem}",
        repo=repo,
    )


def with_tag(spec: ImageSpec, tag: str) -> ImageSpec:
    return dataclasses.replace(spec, tag=tag)


def kit_version() -> str:
    from wmrl import __version__

    return __version__


def build_args(spec: ImageSpec) -> dict[str, str]:
    """Build arguments of the Dockerfiles that make the labels and pick the lock and wheelhouse."""
    return {
        "PYTHON_VERSION": spec.python_version,
        "LOCK": spec.lock,
        "BUILD_LOCK": BUILD_LOCK,
        "WHEELHOUSE": spec.wheelhouse,
        "LOCK_SHA256": spec.lock_sha256(),
        "BUILD_LOCK_SHA256": sha256_file(spec.repo / BUILD_LOCK),
        "KIT_VERSION": kit_version(),
        "GIT_COMMIT": git_commit(spec.repo),
    }
