"""``PolicyRunner``: a policy checkpoint as a chunk policy for the evaluation harness.

The harness's simulator workers hand the parent the observations that are ready; ``act`` runs
them through the policy in batched forward passes (GPU if available) and returns a (B, 8, 7)
chunk of actions in the controller's range [-1, 1].

Sampler (recorded with every result through ``settings()``):

* ``sde`` (default, the original's stochastic evaluation): flow-SDE with ``noise_level``;
  ``temperature`` multiplies the std of every SDE transition (the initial noise stays N(0, I)).
* ``ode``: deterministic Euler from the initial noise; ``temperature`` does not apply.

Randomness is drawn per observation from a generator seeded by (seed, task, step, simulator
state), and every forward pass has the same number of rows (``batch_rows``: the observations
that are ready, padded or split), so an episode depends only on its spec, the seed and the
device - not on how many workers ran or which observations shared a batch. Without the fixed
shape a matrix product's rounding follows the batch size (~1e-7 on the CPU), and 240 closed-loop
steps of contact physics amplify it: two evaluations of the same weights on one H100 flipped 88 of
500 fixed states (bench/RESULTS.md, "Run 17").
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from wmrl.config import ConfigError, override, policy_id
from wmrl.device import pick_device
from wmrl.fileio import sha256_file
from wmrl.policy.checkpoint import MODEL_FILE, load_checkpoint


def to_controller(actions, gripper_deadband: float):
    """Raw actions (..., A) -> the controller's range: arm dimensions clipped to [-1, 1]; the
    gripper (last dimension) snapped to -1 / 0 / +1 with ``gripper_deadband`` (0: only clipped).
    robosuite moves the gripper by sign(g) every step, so a near-zero "hold" must stay 0."""
    out = actions.clamp(-1.0, 1.0)
    if gripper_deadband > 0:
        g = out[..., -1]
        out[..., -1] = (g.abs() >= gripper_deadband).to(g.dtype) * g.sign()
    return out


def default_batch_rows(device_type: str) -> int:
    """Rows per forward pass: 32 on a GPU (a 16-core host's workers hold up to 32 episodes in
    flight: one pass serves them all), 1 on the CPU, where every padded row costs its compute (one
    row at a time: ~1.7x the policy's time of batches of four, measured with one thread)."""
    return 32 if device_type == "cuda" else 1


class PolicyRunner:
    """A policy as a chunk policy: from a checkpoint folder (``PolicyRunner(path)``) or from a
    model in memory (``PolicyRunner.from_model``, GRPO's evaluations of the policy it trains)."""

    def __init__(self, checkpoint: str | os.PathLike, *, device: str = "auto", sampler: str | None = None,
                 temperature: float | None = None, noise_level: float | None = None,
                 denoise_steps: int | None = None, gripper_deadband: float | None = None, seed: int = 0,
                 batch_rows: int | None = None):
        loaded = load_checkpoint(checkpoint)
        self._setup(loaded.build_model(), loaded.norm, loaded.lang, loaded.cfg, step=loaded.step,
                    image_size=loaded.image_size, path=Path(checkpoint), device=device, seed=seed, batch_rows=batch_rows,
                    model_sha256=sha256_file(Path(checkpoint) / MODEL_FILE),
                    overrides=dict(eval_sampler=sampler, temperature_eval=temperature, noise_level=noise_level,
                                   denoise_steps=denoise_steps, gripper_deadband=gripper_deadband))

    @classmethod
    def from_model(cls, model, norm, lang, *, step: int, image_size: int, path: str | os.PathLike | None = None,
                   device: str = "auto", seed: int = 0, model_sha256: str | None = None, batch_rows: int | None = None,
                   **overrides) -> "PolicyRunner":
        """Wrap a ``FlowPolicy`` in memory (its weights are used as they are, not copied)."""
        self = cls.__new__(cls)
        self._setup(model, norm, lang, model.cfg, step=step, image_size=image_size,
                    path=Path(path) if path else None, device=device, seed=seed, model_sha256=model_sha256,
                    batch_rows=batch_rows, overrides=overrides)
        return self

    def _setup(self, model, norm, lang, cfg, *, step, image_size, path, device, seed, model_sha256, batch_rows,
               overrides) -> None:
        self.path, self.step, self.image_size = path, step, image_size
        self.cfg = override(cfg, **overrides)
        self.device = pick_device(device)
        if batch_rows is not None and batch_rows < 1:
            raise ConfigError(f"batch_rows={batch_rows}: use >= 1 rows per forward pass (or None: the device's default)")
        self.batch_rows = batch_rows or default_batch_rows(self.device.type)
        if self.device.type == "cuda":
            import torch

            # The simulator workers own the CPU cores; the parent's CPU work here is tiny.
            torch.set_num_threads(1)
        self.model = model.to(self.device).eval()
        self.norm = norm.tensors(self.device)
        self.lang = lang
        self.seed = int(seed)
        self.model_sha256 = model_sha256
        c = self.cfg
        self.policy_id = policy_id(self.step, c.eval_sampler, c.denoise_steps, c.temperature_eval)

    def settings(self) -> dict:
        """Everything that changes the actions: recorded with every evaluation result."""
        c = self.cfg
        return {
            "checkpoint": {"step": self.step, "path": str(self.path) if self.path else None,
                           "model_sha256": self.model_sha256},
            "sampler": c.eval_sampler,
            "denoise_steps": c.denoise_steps,
            "noise_level": c.noise_level if c.eval_sampler == "sde" else 0.0,
            "temperature": c.temperature_eval if c.eval_sampler == "sde" else None,
            "temperature_applies_to": "std of every flow-SDE transition (initial noise stays N(0, I))"
                                      if c.eval_sampler == "sde" else "not used by the ODE sampler",
            "gripper_deadband": c.gripper_deadband,
            "policy_seed": self.seed,
            "policy_device": str(self.device),
            "batch_rows": self.batch_rows,
        }

    def _noise(self, observations) -> tuple:
        import torch

        c = self.cfg
        x0, eps = [], []
        for o in observations:
            h = hashlib.blake2b(digest_size=8)
            h.update(np.asarray([self.seed, o.task_index, o.step], np.int64).tobytes())
            state = getattr(o, "state", None)
            if state is not None:
                h.update(np.ascontiguousarray(state, np.float64).tobytes())
            g = torch.Generator().manual_seed(int.from_bytes(h.digest(), "little") & (2**63 - 1))
            x0.append(torch.randn((c.chunk_size, c.action_dim), generator=g))
            eps.append(torch.randn((c.denoise_steps, c.chunk_size, c.action_dim), generator=g))
        return torch.stack(x0).to(self.device), torch.stack(eps).to(self.device)

    def prefix(self, observations):
        """Prefix tokens for a list of observations (images uint8 HxWx3, proprio, instruction)."""
        import torch

        from wmrl.policy.model import images_to_input

        for o in observations:
            if o.main.shape[:2] != (self.image_size, self.image_size) or o.wrist.shape[:2] != (self.image_size, self.image_size):
                raise ConfigError(f"the checkpoint was trained on {self.image_size} px images, the simulator renders "
                                  f"{o.main.shape[0]} px; evaluate with --image-size {self.image_size}")
        dev = self.device
        main = images_to_input(torch.from_numpy(np.stack([o.main for o in observations])).to(dev))
        wrist = images_to_input(torch.from_numpy(np.stack([o.wrist for o in observations])).to(dev))
        lang = torch.from_numpy(self.lang.lookup([o.instruction for o in observations])).to(dev)
        proprio = torch.from_numpy(np.stack([np.asarray(o.proprio, np.float32) for o in observations])).to(dev)
        proprio = (proprio - self.norm["p_m"]) / self.norm["p_s"]
        return self.model.encode(main, wrist, lang, proprio)

    def unnormalize(self, x):
        """Normalised policy output -> the controller's command (see ``to_controller``)."""
        return to_controller(x * self.norm["a_s"] + self.norm["a_c"], self.cfg.gripper_deadband)

    def act(self, observations: list) -> np.ndarray:
        """(B, chunk, 7) actions for B observations, in forward passes of exactly ``batch_rows``
        rows (the last padded with copies of its last observation; their actions are dropped)."""
        if not observations:
            return np.zeros((0, self.cfg.chunk_size, self.cfg.action_dim), np.float32)
        rows, out = self.batch_rows, []
        for i in range(0, len(observations), rows):
            part = observations[i:i + rows]
            out.append(self.act_batch(part + [part[-1]] * (rows - len(part)))[:len(part)])
        return np.concatenate(out)

    def act_batch(self, observations: list) -> np.ndarray:
        """One forward pass over exactly these observations, whatever their number: for callers
        whose batches are large and fixed by design (the policy acting in imagination)."""
        import torch

        from wmrl.policy.sampling import ode_sample, sde_sample

        if not observations:
            return np.zeros((0, self.cfg.chunk_size, self.cfg.action_dim), np.float32)
        c = self.cfg
        with torch.no_grad():
            prefix = self.prefix(observations)
            x0, eps = self._noise(observations)
            if c.eval_sampler == "ode":
                x = ode_sample(self.model, prefix, c.denoise_steps, noise=x0)
            else:
                x = sde_sample(self.model, prefix, c.denoise_steps, c.noise_level, temperature=c.temperature_eval,
                               noise=x0, step_noise=eps).actions
            return self.unnormalize(x).float().cpu().numpy()
