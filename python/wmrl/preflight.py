"""GPU pre-flight: before a GPU stage starts, refuse GPUs that other work occupies.

    check_gpus("0,1", margin_gib=3.5)     # raises GPUBusy naming the GPU and its processes

Reads ``nvidia-smi`` (no CUDA initialisation in this process). A machine without
``nvidia-smi`` has no GPU to check: the stage runs on the CPU and the check passes. A
selected GPU is refused when any compute process runs on it, or when more than ``margin_gib``
of its memory is in use (the original keeps 3.5 GiB per device for what the driver and other
tenants hold).
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

from wmrl.config import ConfigError


class GPUBusy(ConfigError):
    """A selected GPU is occupied."""


@dataclass(frozen=True)
class GPU:
    index: int
    uuid: str
    name: str
    total_mib: float
    used_mib: float


def _query(args: list[str]) -> list[list[str]]:
    r = subprocess.run(["nvidia-smi", *args, "--format=csv,noheader,nounits"], capture_output=True, text=True,
                       timeout=60)
    if r.returncode != 0:
        raise GPUBusy(f"nvidia-smi failed ({r.stderr.strip() or r.returncode}): fix the driver or run on the CPU "
                      "with GPUS= unset on a machine without GPUs")
    return [[c.strip() for c in line.split(",")] for line in r.stdout.splitlines() if line.strip()]


def list_gpus() -> tuple[list[GPU], dict[str, list[str]]]:
    """The GPUs and, per GPU uuid, its compute processes as 'pid name (N MiB)'."""
    gpus = [GPU(int(i), u, n, float(t), float(used))
            for i, u, n, t, used in _query(["--query-gpu=index,uuid,name,memory.total,memory.used"])]
    apps: dict[str, list[str]] = {}
    for row in _query(["--query-compute-apps=gpu_uuid,pid,process_name,used_memory"]):
        if len(row) >= 4:
            apps.setdefault(row[0], []).append(f"pid {row[1]} {row[2]} ({row[3]} MiB)")
    return gpus, apps


def check_gpus(selected: str | None, margin_gib: float) -> list[int]:
    """Check the GPUs of ``selected`` ("0,1"; None or "": all); returns the indices checked."""
    if shutil.which("nvidia-smi") is None:
        if selected:
            raise GPUBusy(f"GPUS={selected} but this machine has no nvidia-smi (no NVIDIA GPU): leave GPUS unset")
        return []
    gpus, apps = list_gpus()
    by_index = {g.index: g for g in gpus}
    want = [int(x) for x in selected.split(",") if x.strip()] if selected else sorted(by_index)
    missing = [i for i in want if i not in by_index]
    if missing:
        raise GPUBusy(f"GPUS={selected}: no GPU {missing[0]} here (this machine has {sorted(by_index) or 'none'})")
    problems = []
    for i in want:
        g = by_index[i]
        if apps.get(g.uuid):
            problems.append(f"GPU {i} ({g.name}) runs other processes: {'; '.join(apps[g.uuid])}")
        elif g.used_mib > margin_gib * 1024:
            problems.append(f"GPU {i} ({g.name}) has {g.used_mib / 1024:.1f} GiB in use (more than the "
                            f"{margin_gib} GiB margin)")
    if problems:
        raise GPUBusy("; ".join(problems) + ": stop that work or choose other GPUs with GPUS=...")
    return want
