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


def before_process_group() -> None:
    """Call right before a process group is made (torch.distributed or DeepSpeed).

    ``torch._dynamo``, imported lazily by the first optimizer or ``torch.compile``, takes
    references to the default process group when one exists already. They outlive
    ``destroy_process_group``, so the group and its gloo threads live on into interpreter
    shutdown, where now and then one of them aborts the finished process ("terminate called
    without an active exception": the two-rank GRPO test, about 1 run in 30 on a loaded
    2-core machine). Imported before the group exists it takes none."""
    import torch._dynamo  # noqa: F401


def free_port(count: int = 1) -> int:
    """A local TCP port (the first of ``count`` consecutive ones) that nothing listens on now:
    for process groups, instead of fixed ports that another job may hold."""
    import socket

    for _ in range(100):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            base = sock.getsockname()[1]
        if base + count > 65535:
            continue
        try:
            for p in range(base + 1, base + count):
                with socket.socket() as other:
                    other.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
    raise OSError("no free local TCP port found")
