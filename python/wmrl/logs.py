"""``MetricsLog``: the one JSONL log (plus TensorBoard, where installed) of every trainer.

One JSON record per line, each with ``step``; numbers also go to TensorBoard under
``<tag>/<key>``. On resume, records past the step the run continues from are dropped first
(``start_step``), so a log never shows the same step twice. Only one process writes
(``enabled=False`` on the other ranks).
"""

from __future__ import annotations

import json
import os
from pathlib import Path


class MetricsLog:
    def __init__(self, path: str | os.PathLike, *, tag: str, tensorboard: str | os.PathLike | None = None,
                 start_step: int | None = None, enabled: bool = True, say=print):
        self.path, self.tag, self.enabled = Path(path), tag, enabled
        self._file = self._writer = None
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if start_step is not None:
            self.truncate(start_step)
        if tensorboard is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._writer = SummaryWriter(str(tensorboard), purge_step=(start_step or 0) + 1)
            except ImportError as e:
                say(f"[{tag}] note: TensorBoard unavailable ({e}); logging to {self.path} only")
        self._file = open(self.path, "a")

    def truncate(self, step: int) -> None:
        """Drop records past ``step`` (a resumed run writes them again)."""
        if not self.path.exists():
            return
        keep = []
        for line in self.path.read_text().splitlines():
            try:
                if json.loads(line).get("step", 0) <= step:
                    keep.append(line)
            except ValueError:
                continue  # a line cut short by a kill
        from wmrl.fileio import atomic_path

        with atomic_path(self.path) as tmp:
            tmp.write_text("".join(line + "\n" for line in keep))

    def write(self, rec: dict) -> None:
        if self._file is None:
            return
        self._file.write(json.dumps(rec) + "\n")
        self._file.flush()
        if self._writer is not None:
            for k, v in rec.items():
                if k not in ("step", "time") and isinstance(v, (int, float)) and not isinstance(v, bool):
                    self._writer.add_scalar(f"{self.tag}/{k}", v, rec["step"])

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def read_log(path: str | os.PathLike) -> list[dict]:
    """Every complete record of a JSONL log (a line cut short by a kill is skipped)."""
    out = []
    p = Path(path)
    if p.exists():
        for line in p.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out
