"""The one place that turns ``--device auto|cpu|cuda`` into a ``torch.device``."""

from __future__ import annotations

from wmrl.config import ConfigError


def pick_device(device: str = "auto", local_rank: int = 0):
    """``auto``: this process's GPU (``cuda:LOCAL_RANK``) when one is visible, else the CPU."""
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(f"device {device!r}: no CUDA device is visible; use cpu or auto")
        if device == "cuda":
            device = f"cuda:{local_rank}"
    elif device != "cpu":
        raise ConfigError(f"device {device!r}: use auto, cpu, cuda or cuda:N")
    return torch.device(device)
