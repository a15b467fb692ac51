"""``make build``: an image from its Dockerfile with a context of exactly the files it needs.

The context is assembled here rather than from the whole checkout: the Dockerfile, the two lock
files, the entry point, ``python/`` (the kit, copied into the image so it also runs without a
mounted checkout) and the image's own wheelhouse. That keeps the other image's wheels, run
folders and virtual environments out of it, whatever ``.dockerignore`` says.
"""

from __future__ import annotations

import os
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from wmrl.containers import wheelhouse
from wmrl.containers.engine import connect
from wmrl.containers.errors import ContainerError, one_line
from wmrl.containers.images import BUILD_LOCK, ImageSpec, build_args


@dataclass(frozen=True)
class BuildConfig:
    spec: ImageSpec
    base_image: str | None = None  # None: the Dockerfile's pinned default
    network: str | None = None  # build network (e.g. host; only apt needs one, the pip step is offline)
    no_cache: bool = False
    extra_args: dict[str, str] = field(default_factory=dict)  # further --build-arg values
    quiet: bool = False  # print only step lines, not every line of the steps' output


def context_files(spec: ImageSpec) -> dict[str, Path]:
    """Archive name -> file on disk."""
    repo = spec.repo
    files = {spec.dockerfile: repo / spec.dockerfile, spec.lock: spec.lock_path, BUILD_LOCK: repo / BUILD_LOCK,
             "docker/entrypoint.sh": repo / "docker/entrypoint.sh"}
    for f in sorted((repo / "python").rglob("*")):
        if f.is_file() and "__pycache__" not in f.parts and f.suffix != ".pyc":
            files[str(f.relative_to(repo))] = f
    for f in sorted(spec.wheelhouse_path.iterdir()):
        if f.is_file():
            files[f"{spec.wheelhouse}/{f.name}"] = f
    missing = [n for n, p in files.items() if not p.is_file()]
    if missing:
        raise ContainerError(f"build context incomplete, missing: {', '.join(missing)}")
    return files


def write_context(files: dict[str, Path], out) -> int:
    """An uncompressed tar (the daemon is local; gzip would only cost CPU). Returns its size."""
    def norm(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        return info

    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, path in files.items():
            tar.add(str(path), arcname=name, recursive=False, filter=norm)
    return out.tell()


class Progress:
    """Readable build output: ``[build train  0:42] Step 5/14 : RUN ...``, step output indented."""

    def __init__(self, name: str, quiet: bool, stream=sys.stdout):
        self.name, self.quiet, self.stream = name, quiet, stream
        self.start = time.monotonic()
        self.last_step = ""
        self.tail: list[str] = []

    def prefix(self) -> str:
        s = int(time.monotonic() - self.start)
        return f"[build {self.name} {s // 60}:{s % 60:02d}]"

    def feed(self, chunk: dict) -> None:
        if "error" in chunk:
            detail = chunk.get("errorDetail", {}).get("message") or chunk["error"]
            raise ContainerError(f"building the {self.name} image failed at {self.last_step or 'the start'}: "
                                 f"{one_line(detail, 400)} (full output above)")
        text = chunk.get("stream")
        if text is None:
            status = chunk.get("status")
            if status and "progress" not in chunk:
                self.emit(f"{self.prefix()} {status}")
            return
        for line in text.splitlines():
            line = line.rstrip()
            if not line:
                continue
            self.tail = (self.tail + [line])[-20:]
            if line.startswith("Step "):
                self.last_step = one_line(line, 120)
                self.emit(f"{self.prefix()} {self.last_step}")
            elif line.startswith("Successfully"):
                self.emit(f"{self.prefix()} {line}")
            elif not self.quiet and not line.startswith((" ---> ", "Removing intermediate container")):
                self.emit(f"    {line}")

    def emit(self, line: str) -> None:
        print(line, file=self.stream, flush=True)


def build(cfg: BuildConfig, client=None) -> dict:
    """Build ``cfg.spec``; returns the image's id, tag, size and build seconds."""
    spec = cfg.spec
    wheelhouse.check_current(spec)
    files = context_files(spec)
    args = build_args(spec)
    if cfg.base_image:
        args["BASE_IMAGE"] = cfg.base_image
    args.update(cfg.extra_args)
    client = client or connect(timeout=3600)
    progress = Progress(spec.name, cfg.quiet)
    with tempfile.TemporaryFile(prefix="wmrl-context-", dir=os.environ.get("TMPDIR")) as ctx:
        size = write_context(files, ctx)
        ctx.seek(0)
        progress.emit(f"{progress.prefix()} {spec.tag} from {spec.dockerfile} ({spec.lock}, Python {spec.python_version}, "
                      f"base {args.get('BASE_IMAGE', 'pinned default')}); context {len(files)} files, {size / 2**20:.0f} MiB")
        stream = client.api.build(fileobj=ctx, custom_context=True, dockerfile=spec.dockerfile, tag=spec.tag,
                                  buildargs=args, rm=True, forcerm=True, pull=False, nocache=cfg.no_cache,
                                  network_mode=cfg.network, decode=True)
        for chunk in stream:
            progress.feed(chunk)
    image = client.images.get(spec.tag)
    seconds = time.monotonic() - progress.start
    info = {"tag": spec.tag, "id": image.id, "size_bytes": image.attrs.get("Size"), "seconds": round(seconds, 1),
            "labels": image.labels}
    progress.emit(f"{progress.prefix()} built {spec.tag} ({image.short_id}, {(info['size_bytes'] or 0) / 2**30:.2f} GiB) "
                  f"in {seconds:.0f} s")
    return info
