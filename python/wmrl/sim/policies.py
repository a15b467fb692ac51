"""Policies that run inside a simulator worker, one action per physics step.

The scripted expert reads privileged simulator state, so it must live next to the
simulator; the random policy lives here because it needs nothing. Learned policies do not:
they receive batches of observations in the parent process (``ChunkPolicy``) so that one
forward pass serves every worker.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np


class StepPolicy(Protocol):
    policy_id: str

    def reset(self, env) -> None: ...

    def act(self, env) -> np.ndarray: ...


class ChunkPolicy(Protocol):
    """A batched policy: observations of several environments -> one action chunk each."""

    policy_id: str

    def act(self, observations: list) -> np.ndarray:  # (B, chunk, 7) in [-1, 1]
        ...


class RandomPolicy:
    """Uniform actions in [-1, 1]^7: the floor any learned policy must beat."""

    policy_id = "random-uniform"

    def __init__(self, seed: int = 0):
        self._rng = np.random.default_rng(seed)

    def reset(self, env) -> None:
        pass

    def act(self, env) -> np.ndarray:
        return self._rng.uniform(-1.0, 1.0, size=7).astype(np.float32)


def make_step_policy(name: str, seed: int) -> StepPolicy:
    if name == "random":
        return RandomPolicy(seed)
    if name == "expert":
        from wmrl.sim.expert import ScriptedExpert

        return ScriptedExpert(seed)
    raise ValueError(f"unknown in-simulator policy {name!r}; choose 'expert' or 'random'")


STEP_POLICIES = ("expert", "random")
