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


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path in the same folder; rename it onto ``path`` on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


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
