"""Sampling action chunks: deterministic Euler ODE, and the flow-SDE with exact log-probs.

Convention (openpi / RLinf): ``x_t = t * noise + (1 - t) * action``; the network predicts
``v = noise - action``. Sampling walks K equal steps from t = 1 (noise) to t = 0 (action):
``t_i = 1 - i / K``, ``delta = 1 / K``. The *denoising trajectory* (``chain``) is
``x_0 .. x_K`` in sampling order: ``chain[:, 0]`` is the initial noise (t = 1) and
``chain[:, K]`` the action chunk (t = 0), both in normalised action space.

ODE (Euler)::

    x_{i+1} = x_i - delta * v(x_i, t_i)

Flow-SDE (RLinf ``noise_method="flow_sde"``, the Flow-GRPO SDE; ``noise_level`` = 0.5)::

    sigma_i  = noise_level * sqrt(t_i / (1 - t_i))       (at t_0 = 1 the denominator uses 1 - t_1)
    x0_hat   = x_i - t_i v                                (predicted action)
    x1_hat   = x_i + (1 - t_i) v                          (predicted noise)
    mean_i   = (1 - (t_i - delta)) x0_hat + (t_i - delta - sigma_i^2 delta / (2 t_i)) x1_hat
    std_i    = temperature * sigma_i * sqrt(delta)
    x_{i+1}  = mean_i + std_i * eps,   eps ~ N(0, I)

which is algebraically Flow-GRPO's ``sde_step_with_logprob`` with dt = -delta:
``mean = x + [v + sigma^2 / (2 t) (x + (1 - t) v)] dt``. With ``noise_level = 0`` it is the
Euler ODE step. Sources: RLinf ``rlinf/models/embodiment/openpi/openpi_action_model.py``
(``sample_mean_var_val``, ``get_logprob_norm``) and Flow-GRPO ``sde_step_with_logprob``.

The log-probability of a sampled chunk is that of its whole trajectory given x_0:
``log p = sum_i sum_dims log N(x_{i+1}; mean_i, std_i^2)`` - exact for the sampler (the
marginal density of x_K alone is intractable; the PPO ratio of the chain is what Flow-GRPO
and RLinf optimise). ``chain_log_prob`` recomputes it, differentiably, for stored chains.

One noisy transition (RLinf's ``joint_logprob=False``, its recommended flow-SDE setting):
``noisy`` (B,) names, per sample, the one transition that is stochastic; every other one is
the Euler ODE step (the flow-SDE step with sigma = 0) and has no density. The chunk then stays
close to the deterministic policy's, and the PPO ratio is that one transition's density
(``transition_log_prob``: one velocity evaluation per chunk instead of K).

``temperature`` multiplies every SDE transition std (mean unchanged; the initial noise stays
N(0, I)); it is 1 for training rollouts and ``PolicyConfig.temperature_eval`` (1.6, the
original's) for stochastic evaluation. Log-probs are those of the tempered transitions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

LOG_2PI = math.log(2 * math.pi)


def timesteps(k: int, device=None) -> torch.Tensor:
    """t_0 .. t_K: 1, 1 - 1/K, ..., 0 (float32)."""
    return torch.linspace(1.0, 0.0, k + 1, device=device, dtype=torch.float32)


def sde_sigmas(k: int, noise_level: float, device=None) -> torch.Tensor:
    """sigma_0 .. sigma_{K-1}: noise_level * sqrt(t / (1 - t)), with the singularity at t = 1
    clipped as RLinf does (1 - t_0 replaced by 1 - t_1)."""
    t = timesteps(k, device)
    one_minus = 1 - torch.where(t == 1, t[1] if k > 1 else t.new_zeros(()), t)
    return (noise_level * torch.sqrt(t / one_minus))[:-1]


def sde_step_stats(x: torch.Tensor, v: torch.Tensor, t: torch.Tensor, sigma: torch.Tensor, delta: float,
                   temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and std of the flow-SDE transition from x (at time t) to time t - delta.
    ``t`` and ``sigma`` broadcast against x (scalars or (B, 1, 1))."""
    x0_hat = x - v * t
    x1_hat = x + v * (1 - t)
    mean = x0_hat * (1 - (t - delta)) + x1_hat * (t - delta - sigma**2 * delta / (2 * t))
    std = temperature * sigma * math.sqrt(delta)
    return mean, std


def gaussian_log_prob(y: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """Elementwise log N(y; mean, std^2); std > 0."""
    return -0.5 * ((y - mean) / std) ** 2 - torch.log(std) - 0.5 * LOG_2PI


@dataclass
class SDESample:
    actions: torch.Tensor  # (B, chunk, A) normalised = chain[:, -1]
    chain: torch.Tensor  # (B, K + 1, chunk, A): x_0 (noise) .. x_K (actions)
    log_prob: torch.Tensor  # (B,) sum over the K transitions and all chunk x A dims
    step_log_probs: torch.Tensor  # (B, K)
    element_log_probs: torch.Tensor  # (B, K, chunk, A): every transition's log-density per action element


def _initial(shape, noise, device, dtype):
    if noise is None:
        return torch.randn(shape, device=device, dtype=dtype)
    return noise.to(device=device, dtype=dtype)


@torch.no_grad()
def ode_sample(model, prefix: torch.Tensor, k: int, noise: torch.Tensor | None = None) -> torch.Tensor:
    """Deterministic Euler sampling: (B, chunk, A) normalised actions."""
    cfg = model.cfg
    x = _initial((prefix.shape[0], cfg.chunk_size, cfg.action_dim), noise, prefix.device, torch.float32)
    ts = timesteps(k, prefix.device)
    for i in range(k):
        v = model.velocity(prefix, x, ts[i]).float()
        x = x - v / k
    return x


@torch.no_grad()
def sde_sample(model, prefix: torch.Tensor, k: int, noise_level: float, *, temperature: float = 1.0,
               noise: torch.Tensor | None = None, step_noise: torch.Tensor | None = None,
               noisy: torch.Tensor | None = None) -> SDESample:
    """Flow-SDE sampling with the trajectory and its exact log-probability.

    ``noise`` (B, chunk, A) is x_0 and ``step_noise`` (B, K, chunk, A) the per-transition
    eps; both default to fresh draws from torch's global generator. ``noisy`` (B,): the one
    stochastic transition of each sample (the others are ODE steps, log-density 0); None:
    all K are stochastic."""
    cfg = model.cfg
    b, dev = prefix.shape[0], prefix.device
    shape = (b, cfg.chunk_size, cfg.action_dim)
    x = _initial(shape, noise, dev, torch.float32)
    eps = _initial((b, k) + shape[1:], step_noise, dev, torch.float32)
    ts, sig = timesteps(k, dev), sde_sigmas(k, noise_level, dev)
    delta = 1.0 / k
    chain, logps = [x], []
    for i in range(k):
        v = model.velocity(prefix, x, ts[i]).float()
        s_i = sig[i] if noisy is None else sig[i] * (noisy.to(dev) == i).float()[:, None, None]
        mean, std = sde_step_stats(x, v, ts[i], s_i, delta, temperature)
        std = torch.as_tensor(std, device=dev).expand_as(x)
        x = mean + std * eps[:, i]
        stochastic = std > 0
        logps.append(torch.where(stochastic, gaussian_log_prob(x, mean, torch.where(stochastic, std, 1.0)), 0.0))
        chain.append(x)
    elem = torch.stack(logps, dim=1)
    step = elem.sum(dim=(2, 3))
    return SDESample(x, torch.stack(chain, dim=1), step.sum(1), step, elem)


def transition_densities(model, prefix: torch.Tensor, x: torch.Tensor, y: torch.Tensor, index: torch.Tensor, k: int,
                         noise_level: float, temperature: float = 1.0) -> torch.Tensor:
    """Elementwise log-density (N, chunk, A) of N stored flow-SDE transitions ``x -> y``, the
    i-th being transition ``index[i]`` of K and conditioned on ``prefix[i]``, under the current
    parameters (differentiable); one batched velocity evaluation."""
    if noise_level * temperature <= 0:
        raise ValueError("the flow-SDE log-density needs noise_level > 0 and temperature > 0 (the ODE has none)")
    ts, sig = timesteps(k, x.device), sde_sigmas(k, noise_level, x.device)
    t = ts[index]
    v = model.velocity(prefix, x, t).float()
    mean, std = sde_step_stats(x, v, t[:, None, None], sig[index][:, None, None], 1.0 / k, temperature)
    return gaussian_log_prob(y, mean, std.expand_as(y))


def chain_log_prob(model, prefix: torch.Tensor, chain: torch.Tensor, noise_level: float, *,
                   temperature: float = 1.0, dims_mask: torch.Tensor | None = None,
                   return_steps: bool = False, elementwise: bool = False):
    """Log-probability of stored chains (B, K+1, chunk, A) under the current parameters:
    differentiable w.r.t. the model (the PPO ratio's numerator). All K transitions are
    evaluated in one batched pass. ``dims_mask`` (B, chunk, A), if given, restricts the sum
    (e.g. to the actions actually executed). ``elementwise``: the unsummed (B, K, chunk, A)
    log-densities instead (GRPO's per-element ratios)."""
    b, k1 = chain.shape[:2]
    k = k1 - 1
    x = chain[:, :-1].reshape(b * k, *chain.shape[2:]).float()
    y = chain[:, 1:].reshape(b * k, *chain.shape[2:]).float()
    index = torch.arange(k, device=chain.device).repeat(b)  # (B*K,) in (b, i) order
    lp = transition_densities(model, prefix.repeat_interleave(k, dim=0), x, y, index, k, noise_level, temperature)
    if elementwise:
        return lp.view(b, k, *chain.shape[2:])
    if dims_mask is not None:
        lp = lp * dims_mask.repeat_interleave(k, dim=0).to(lp.dtype)
    step = lp.sum(dim=(1, 2)).view(b, k)
    return (step.sum(1), step) if return_steps else step.sum(1)


def transition_log_prob(model, prefix: torch.Tensor, chain: torch.Tensor, index: torch.Tensor, noise_level: float,
                        *, temperature: float = 1.0) -> torch.Tensor:
    """Log-density (B, chunk, A) of one stored transition per chain, ``chain[b, index[b]] ->
    chain[b, index[b] + 1]``, under the current parameters (differentiable): the ratio of
    chunks sampled with one noisy transition (``sde_sample(noisy=...)``). One velocity
    evaluation per chain."""
    b, k = chain.shape[0], chain.shape[1] - 1
    index = index.to(chain.device).long()
    if bool((index < 0).any()) or bool((index >= k).any()):
        raise ValueError(f"transition indices must lie in [0, {k - 1}] for chains of {k} transitions")
    rows = torch.arange(b, device=chain.device)
    return transition_densities(model, prefix, chain[rows, index].float(), chain[rows, index + 1].float(), index, k,
                                noise_level, temperature)
