"""Small file helpers shared by every stage: atomic writes and checksums.

Every file a stage produces is written to a temporary name next to its final path and
renamed into place only when complete, so a killed run never leaves a half-written file
under a name a later stage would trust.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator


_UMASK = os.umask(0)
os.umask(_UMASK)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = ".tmp") -> Iterator[Path]:
    """Yield a temporary path in the same folder; rename it onto ``path`` on success.
    ``suffix``: for writers that pick the format from the file name (``.mp4``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    os.fchmod(fd, 0o666 & ~_UMASK)  # what open() would give, not mkstemp's private 0600
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def mp4_available() -> bool:
    """Whether imageio can encode MP4 (its ffmpeg plugin, ``imageio-ffmpeg``, is installed)."""
    try:
        import imageio_ffmpeg

        imageio_ffmpeg.get_ffmpeg_exe()
        return True
    except (ImportError, RuntimeError):
        return False


def write_video(path: str | os.PathLike, frames, fps: int) -> Path:
    """Frames (T, H, W, 3) uint8 as an MP4, atomically; returns the path written. Where no MP4
    encoder is installed (the GPU server's offline bundle leaves imageio-ffmpeg out for size)
    the same clip becomes an animated GIF next to it (Pillow), rather than failing a long run."""
    path = Path(path)
    if mp4_available():
        import imageio.v2 as imageio

        with atomic_path(path, suffix=path.suffix) as tmp:
            imageio.mimwrite(tmp, list(frames), fps=fps, macro_block_size=1)
        return path
    from PIL import Image

    path = path.with_suffix(".gif")
    images = [Image.fromarray(f) for f in frames]
    with atomic_path(path, suffix=".gif") as tmp:
        images[0].save(tmp, format="GIF", save_all=True, append_images=images[1:], duration=round(1000 / fps), loop=0)
    return path


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write ``obj`` as indented JSON, atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n")


def read_json(path: str | os.PathLike, error: type[Exception], missing: str) -> Any:
    """Parse a JSON file, raising ``error`` with ``missing`` (what to do) if it is absent
    and a clear message if it is damaged."""
    path = Path(path)
    if not path.is_file():
        raise error(f"{path}: {missing}")
    try:
        return json.loads(path.read_text())
    except ValueError as e:
        raise error(f"{path}: not valid JSON ({e}); the file is damaged") from None


def sha256_file(path: str | os.PathLike, block: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()


def hash_tree(folder: str | os.PathLike, skip=lambda p: False) -> dict[str, str]:
    """{path relative to ``folder``: SHA-256} of every file below it (sorted; ``skip(path)``
    leaves a file out)."""
    folder = Path(folder)
    return {str(p.relative_to(folder)): sha256_file(p) for p in sorted(folder.rglob("*")) if p.is_file() and not skip(p)}
