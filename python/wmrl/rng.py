"""Every random generator's state (Python, numpy, torch CPU and CUDA), for exact resumes.

The state is made of plain lists, ints and tensors, so it survives ``torch.save`` /
``torch.load(weights_only=True)`` and DeepSpeed's client state alike.
"""

from __future__ import annotations

import random

import numpy as np


def capture() -> dict:
    import torch

    n = np.random.get_state()
    state = {"python": random.getstate(), "numpy": [n[0], n[1].tolist(), int(n[2]), int(n[3]), float(n[4])],
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore(state: dict) -> None:
    import torch

    random.setstate(_tuplify(state["python"]))
    n = state["numpy"]
    np.random.set_state((n[0], np.asarray(n[1], dtype=np.uint32), n[2], n[3], n[4]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])


def _tuplify(x):
    return tuple(_tuplify(v) for v in x) if isinstance(x, (list, tuple)) else x
