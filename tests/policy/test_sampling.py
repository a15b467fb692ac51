"""Flow-ODE and flow-SDE sampling: shapes, exact log-probabilities, gradients, the ODE limit."""

import math

import pytest
import torch

from wmrl.config import get_profile, override
from wmrl.policy.model import FlowPolicy, flow_matching_loss, sample_time
from wmrl.policy.sampling import (chain_log_prob, ode_sample, sde_sample, sde_sigmas, sde_step_stats,
                                  timesteps)

CFG = get_profile("tiny").policy
K = CFG.denoise_steps


@pytest.fixture(scope="module")
def model_and_prefix():
    torch.manual_seed(0)
    model = FlowPolicy(CFG)
    # adaLN-Zero starts with zero gates: give the expert non-trivial weights, as after training
    with torch.no_grad():
        for blk in model.expert:
            blk.mod.weight.normal_(0, 0.05)
            blk.mod.bias.normal_(0, 0.05)
        model.out_mod.weight.normal_(0, 0.05)
    b = 3
    img = torch.rand(b, 3, 64, 64) * 2 - 1
    prefix = model.encode(img, img.flip(2), torch.randn(b, 384), torch.randn(b, 8)).detach()
    return model, prefix


def test_schedule_and_sigmas_follow_rlinf():
    t = timesteps(4)
    assert torch.allclose(t, torch.tensor([1.0, 0.75, 0.5, 0.25, 0.0]))
    s = sde_sigmas(4, 0.5)
    assert s.shape == (4,) and torch.isfinite(s).all()
    # t = 1 uses 1 - t_1 in the denominator (RLinf's clip); later steps noise_level * sqrt(t / (1 - t))
    assert s[0] == pytest.approx(0.5 * math.sqrt(1 / 0.25))
    assert s[2] == pytest.approx(0.5 * math.sqrt(0.5 / 0.5))


def test_sde_step_equals_flow_grpo_form():
    """mean = x + [v + sigma^2/(2t) (x + (1-t) v)] dt with dt = -delta (Flow-GRPO)."""
    torch.manual_seed(1)
    x, v = torch.randn(2, 8, 7), torch.randn(2, 8, 7)
    t, delta, sigma = torch.tensor(0.6), 0.2, torch.tensor(0.4)
    mean, std = sde_step_stats(x, v, t, sigma, delta)
    dt = -delta
    grpo = x + (v + sigma**2 / (2 * t) * (x + (1 - t) * v)) * dt
    assert torch.allclose(mean, grpo, atol=1e-6)
    assert float(std) == pytest.approx(0.4 * math.sqrt(0.2))
    # noise_level 0: the Euler ODE step
    mean0, std0 = sde_step_stats(x, v, t, torch.tensor(0.0), delta)
    assert torch.allclose(mean0, x - delta * v, atol=1e-6) and float(std0) == 0


def test_sde_log_prob_equals_recomputed_and_is_finite(model_and_prefix):
    model, prefix = model_and_prefix
    torch.manual_seed(2)
    out = sde_sample(model, prefix, K, 0.5)
    assert out.actions.shape == (3, 8, 7) and out.chain.shape == (3, K + 1, 8, 7)
    assert torch.equal(out.chain[:, -1], out.actions)
    assert torch.isfinite(out.log_prob).all() and out.step_log_probs.shape == (3, K)
    again, steps = chain_log_prob(model, prefix, out.chain, 0.5, return_steps=True)
    assert torch.allclose(again, out.log_prob, rtol=1e-4, atol=1e-3)
    assert torch.allclose(steps, out.step_log_probs, rtol=1e-4, atol=1e-3)
    # the same with a temperature: log-probs are those of the tempered transitions
    hot = sde_sample(model, prefix, K, 0.5, temperature=1.6)
    assert torch.allclose(chain_log_prob(model, prefix, hot.chain, 0.5, temperature=1.6), hot.log_prob,
                          rtol=1e-4, atol=1e-3)
    # another chain is less likely under the first one's transitions
    assert not torch.allclose(chain_log_prob(model, prefix, hot.chain, 0.5), hot.log_prob)


def test_recomputed_log_prob_has_parameter_gradients(model_and_prefix):
    model, prefix = model_and_prefix
    out = sde_sample(model, prefix, K, 0.5)
    model.zero_grad()
    chain_log_prob(model, prefix, out.chain, 0.5).sum().backward()
    grads = {n: p.grad for n, p in model.named_parameters() if n.startswith(("expert", "action_", "time_mlp", "out_mod"))}
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads.values())
    assert sum(float(g.abs().sum()) for g in grads.values()) > 0
    model.zero_grad()


def test_sde_samples_approach_ode_samples_as_noise_vanishes(model_and_prefix):
    model, prefix = model_and_prefix
    torch.manual_seed(3)
    x0, eps = torch.randn(3, 8, 7), torch.randn(3, K, 8, 7)
    ode = ode_sample(model, prefix, K, noise=x0)
    gaps = [float((sde_sample(model, prefix, K, nl, noise=x0, step_noise=eps).actions - ode).abs().max())
            for nl in (0.5, 0.05, 1e-4)]
    assert gaps[0] > gaps[1] > gaps[2]
    assert gaps[2] < 1e-3
    zero = sde_sample(model, prefix, K, 0.0, noise=x0, step_noise=eps)
    assert torch.allclose(zero.actions, ode, atol=1e-5)


def test_flow_matching_time_and_loss():
    torch.manual_seed(4)
    t = sample_time(20000, CFG)
    assert float(t.min()) >= 0.001 and float(t.max()) <= 1.0
    assert float(t.mean()) == pytest.approx(0.6, abs=0.01)  # Beta(1.5, 1) has mean 0.6: noisy times weigh more
    model = FlowPolicy(override(CFG, expert_layers=1))
    prefix = torch.randn(2, 2 * CFG.grid**2 + 2, CFG.width)
    a = torch.randn(2, 8, 7)
    mask = torch.ones(2, 8)
    mask[1, 4:] = 0
    loss = flow_matching_loss(model, prefix, a, mask)
    assert loss.ndim == 0 and torch.isfinite(loss)


def test_one_noisy_transition_is_the_ode_elsewhere(model_and_prefix):
    """sde_sample(noisy=j): every transition but j is the Euler ODE step (density 0); with no
    noise drawn at j the chunk is the ODE's, and the one density matches transition_log_prob."""
    from wmrl.policy.sampling import transition_log_prob

    model, prefix = model_and_prefix
    b = prefix.shape[0]
    g = torch.Generator().manual_seed(3)
    x0 = torch.randn(b, model.cfg.chunk_size, model.cfg.action_dim, generator=g)
    eps = torch.randn(b, K, model.cfg.chunk_size, model.cfg.action_dim, generator=g)
    noisy = torch.arange(b) % K
    out = sde_sample(model, prefix, K, 0.5, noise=x0, step_noise=eps, noisy=noisy)
    per_step = out.element_log_probs.abs().sum(dim=(2, 3))
    assert torch.all(per_step[torch.arange(b), noisy] > 0)
    assert float(per_step.sum() - per_step[torch.arange(b), noisy].sum()) == 0.0
    ts = timesteps(K)
    with torch.no_grad():
        for i in range(K):  # every transition but the noisy one is the Euler step
            euler = out.chain[:, i] - model.velocity(prefix, out.chain[:, i], ts[i]).float() / K
            same = (out.chain[:, i + 1] - euler).abs().amax(dim=(1, 2)) < 1e-5
            assert torch.equal(same, noisy != i)
    with torch.no_grad():
        lp = transition_log_prob(model, prefix, out.chain, noisy, 0.5)
    torch.testing.assert_close(lp, out.element_log_probs[torch.arange(b), noisy], rtol=0, atol=1e-4)
