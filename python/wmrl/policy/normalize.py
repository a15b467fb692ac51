"""Normalisation statistics of actions and proprio, stored as ``norm_stats.json``.

Actions (pi0.5 convention): per dimension, the 1st and 99th percentiles of the training
actions map to -1 and +1: ``a_n = (a - c) / h`` with ``c = (q99 + q01) / 2`` and
``h = max((q99 - q01) / 2, 1e-3)`` (a constant dimension maps to 0, not to a blow-up). The
gripper (last dimension, -1 open / +1 close) is left as it is: it already lies in [-1, 1].
Policy outputs are mapped back and clipped to [-1, 1] (the controller's range).

Proprio: per-dimension mean/std (std floored at 1e-3).

Every checkpoint carries the statistics it was trained with; a file whose dimensions do not
match the model is refused with the reason.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from wmrl.config import ConfigError

FORMAT = "wmrl-norm-stats/1"
MIN_HALF_RANGE = 1e-3
MIN_STD = 1e-3


class NormStatsError(ConfigError):
    """Statistics missing, malformed or of the wrong dimension."""


@dataclass
class NormStats:
    action_center: np.ndarray  # (A,)
    action_scale: np.ndarray  # (A,) half range; 1 for the gripper
    action_q01: np.ndarray
    action_q99: np.ndarray
    action_mean: np.ndarray
    action_std: np.ndarray
    proprio_mean: np.ndarray  # (P,)
    proprio_std: np.ndarray
    num_actions: int = 0
    num_frames: int = 0

    @property
    def action_dim(self) -> int:
        return len(self.action_center)

    @property
    def proprio_dim(self) -> int:
        return len(self.proprio_mean)

    @classmethod
    def compute(cls, actions: np.ndarray, proprio: np.ndarray, gripper_dims: tuple[int, ...] = (-1,)) -> "NormStats":
        actions = np.asarray(actions, np.float64)
        proprio = np.asarray(proprio, np.float64)
        if actions.ndim != 2 or len(actions) == 0 or proprio.ndim != 2 or len(proprio) == 0:
            raise NormStatsError("cannot compute statistics from no actions or no frames: check the demonstration files")
        q01, q99 = np.quantile(actions, 0.01, axis=0), np.quantile(actions, 0.99, axis=0)
        center = (q99 + q01) / 2
        scale = np.maximum((q99 - q01) / 2, MIN_HALF_RANGE)
        for d in gripper_dims:
            center[d], scale[d] = 0.0, 1.0
        f = lambda x: np.asarray(x, np.float32)  # noqa: E731
        return cls(f(center), f(scale), f(q01), f(q99), f(actions.mean(0)), f(actions.std(0)),
                   f(proprio.mean(0)), f(np.maximum(proprio.std(0), MIN_STD)), len(actions), len(proprio))

    # ------------------------------------------------------------------------------- files
    def to_dict(self) -> dict:
        l = lambda x: [float(v) for v in x]  # noqa: E731,E741
        return {
            "format": FORMAT,
            "actions": {"mode": "quantile (q01 -> -1, q99 -> +1); gripper identity", "center": l(self.action_center),
                        "scale": l(self.action_scale), "q01": l(self.action_q01), "q99": l(self.action_q99),
                        "mean": l(self.action_mean), "std": l(self.action_std), "count": self.num_actions},
            "proprio": {"mode": "mean/std", "mean": l(self.proprio_mean), "std": l(self.proprio_std),
                        "count": self.num_frames},
        }

    @classmethod
    def from_dict(cls, d: dict, *, action_dim: int | None = None, proprio_dim: int | None = None,
                  where: str = "norm_stats") -> "NormStats":
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise NormStatsError(f"{where}: not a {FORMAT} file")
        try:
            a, p = d["actions"], d["proprio"]
            arrays = {k: np.asarray(a[k], np.float32) for k in ("center", "scale", "q01", "q99", "mean", "std")}
            pm, ps = np.asarray(p["mean"], np.float32), np.asarray(p["std"], np.float32)
        except (KeyError, TypeError, ValueError) as e:
            raise NormStatsError(f"{where}: malformed statistics ({e!r})") from None
        adim = action_dim if action_dim is not None else len(arrays["center"])
        pdim = proprio_dim if proprio_dim is not None else len(pm)
        for k, v in arrays.items():
            if v.shape != (adim,):
                raise NormStatsError(f"{where}: action {k} has {v.size} values, the policy has {adim} action "
                                     "dimensions; these statistics belong to another model or dataset")
        for k, v in (("mean", pm), ("std", ps)):
            if v.shape != (pdim,):
                raise NormStatsError(f"{where}: proprio {k} has {v.size} values, the policy has {pdim} proprio "
                                     "dimensions; these statistics belong to another model or dataset")
        allv = np.concatenate([*arrays.values(), pm, ps])
        if not np.all(np.isfinite(allv)) or np.any(arrays["scale"] <= 0) or np.any(ps <= 0):
            raise NormStatsError(f"{where}: non-finite values or non-positive scales")
        return cls(arrays["center"], arrays["scale"], arrays["q01"], arrays["q99"], arrays["mean"], arrays["std"],
                   pm, ps, int(a.get("count", 0)), int(p.get("count", 0)))

    def save(self, path: str | os.PathLike) -> None:
        from wmrl.fileio import write_json

        write_json(path, self.to_dict())
        os.chmod(path, 0o644)

    @classmethod
    def load(cls, path: str | os.PathLike, **dims) -> "NormStats":
        from wmrl.fileio import read_json

        d = read_json(path, NormStatsError, "missing; a policy checkpoint keeps its statistics next to the weights")
        return cls.from_dict(d, where=str(path), **dims)

    # ------------------------------------------------------------------------------- torch
    def tensors(self, device=None) -> dict:
        import torch

        t = lambda x: torch.as_tensor(x, dtype=torch.float32, device=device)  # noqa: E731
        return {"a_c": t(self.action_center), "a_s": t(self.action_scale),
                "p_m": t(self.proprio_mean), "p_s": t(self.proprio_std)}
