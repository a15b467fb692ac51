import numpy as np
import pytest
import torch

from wmrl.bimanual.bundle import Bundle
from wmrl.bimanual.config import ModelConfig
from wmrl.bimanual.loader import make_bimanual_local_dataloader, materialize
from wmrl.bimanual.model import VideoWorldModel, flow_loss


def test_materialize_reports_packed_stage0_batch(bundle_dir, tmp_path):
    r = materialize(bundle_dir, batch_size=3, out=tmp_path / "prev")
    assert r["passed"] and r["materialized"], r["problems"]
    t = r["tensors"]
    assert t["video"]["shape"] == [3, 5, 3, 32, 32] and t["video"]["dtype"] == "float32"
    assert t["actions"]["shape"] == [3, 4, 64] and t["action_mask"]["dtype"] == "bool"
    assert t["caption_ids"]["dtype"] == "int64" and t["domain_id"]["shape"] == [3]
    assert r["batch"]["samples"] == 3
    assert r["batch"]["tokens"]["video_per_frame"] == 16 and r["batch"]["tokens"]["video"] == 3 * 5 * 16
    assert r["batch"]["tokens"]["caption"] > 0
    for f in r["preview"]:
        assert (tmp_path / "prev").joinpath(f).stat().st_size > 0
    assert any(f.endswith(".png") for f in r["preview"]) and any(f.endswith(".mp4") for f in r["preview"])


def test_loader_resumes_exactly_and_follows_weights(bundle_dir):
    a = make_bimanual_local_dataloader(bundle_dir, stage=0, batch_size=2, seed=3)
    wins_a = [a.next_batch()[1] for _ in range(3)]
    b = make_bimanual_local_dataloader(bundle_dir, stage=0, batch_size=2, seed=3)
    b.next_batch()
    state = b.state_dict()
    c = make_bimanual_local_dataloader(bundle_dir, stage=0, batch_size=2, seed=3)
    c.load_state_dict(state)
    batch, wins = c.next_batch()
    assert wins == wins_a[1] and c.next_batch()[1] == wins_a[2]
    assert all(w["split"] == "train" for w in wins)
    # sources drawn by their normalised weights (2/3 ALOHA, 1/3 LIBERO)
    big = make_bimanual_local_dataloader(bundle_dir, stage=0, batch_size=1, seed=0)
    srcs = [big._draw(i)["source"] for i in range(3000)]
    assert srcs.count("aloha_sim") / 3000 == pytest.approx(2 / 3, abs=0.03)


def test_short_window_is_padded_and_masked(bundle_dir):
    b = Bundle(bundle_dir)
    loader = make_bimanual_local_dataloader(b, stage=0, batch_size=1)
    w = dict(next(w for w in b.windows if w["split"] == "train"), transitions=2)
    s = loader.pack(w)
    assert s["frame_mask"].tolist() == [True, True, True, False, False]
    assert s["step_mask"].tolist() == [True, True, False, False]
    assert not s["action_mask"][2:].any() and np.all(s["actions"][2:] == 0)
    np.testing.assert_array_equal(s["video"][3], s["video"][2])


def small_model(bundle_dir, block_frames=1, residual=False, perturb=True, action_step=False, action_tokens=False,
                action_readout=False):
    torch.manual_seed(0)
    cfg = ModelConfig(patch=8, width=32, depth=2, heads=4, caption_dim=16, block_frames=block_frames, max_frames=16,
                      residual=residual, action_step=action_step, action_tokens=action_tokens,
                      action_readout=action_readout)
    m = VideoWorldModel(cfg, image_size=32, vocab_size=Bundle(bundle_dir).tokenizer().vocab_size)
    if perturb:
        with torch.no_grad():  # leave the zero-initialised gates: otherwise every output is 0
            for p in m.parameters():
                p.normal_(0, 0.05)
    return m.eval()


@pytest.fixture(scope="module")
def batch(bundle_dir):
    return make_bimanual_local_dataloader(bundle_dir, stage=0, batch_size=2).next_batch()[0]


@pytest.mark.parametrize("block_frames,residual,extras", [(1, False, False), (2, False, False), (2, True, False),
                                                           (2, True, True)])
def test_kv_cache_reproduces_teacher_forcing(bundle_dir, batch, block_frames, residual, extras):
    m = small_model(bundle_dir, block_frames, residual, action_tokens=extras, action_readout=extras)
    x0 = batch["video"]
    f = x0.shape[1]
    t = torch.rand(2, f)
    t[:, 0] = 0
    noisy = torch.randn_like(x0)
    with torch.no_grad():
        v_tf = m.forward_teacher_forcing(x0, noisy, t, batch)
        act, am = m.frame_actions(batch["actions"], batch["action_mask"])
        cap = m.caption_vector(batch["caption_ids"], batch["caption_mask"])
        cache = m.new_cache()
        m.push_clean(cache, x0[:, :1], torch.tensor([0]), act[:, :1], am[:, :1], batch["domain_id"], cap)
        blocks = m.frame_block(torch.arange(f))
        outs = []
        for b in range(1, int(blocks.max()) + 1):
            idx = torch.nonzero(blocks == b).flatten()
            anchor = m.block_anchor(x0[:, idx[0] - 1], len(idx))  # None without residual
            outs.append(m._forward(noisy[:, idx], idx, t[:, idx], act[:, idx], am[:, idx], batch["domain_id"], cap, None, cache,
                                   anchor=anchor))
            m.push_clean(cache, x0[:, idx], idx, act[:, idx], am[:, idx], batch["domain_id"], cap)
    assert torch.allclose(v_tf, torch.cat(outs, 1), atol=1e-5)
    assert cache[0]["k"].shape[2] == (f - 1 + 1) * m.tokens_per_frame  # context + every block pushed


def test_attention_modes_causal_vs_bidirectional(bundle_dir, batch):
    m = small_model(bundle_dir)
    x0 = batch["video"]
    t = torch.full(x0.shape[:2], 0.5)
    t[:, 0] = 0
    noisy = torch.randn_like(x0)
    later = x0.clone()
    later[:, 3:] = torch.randn_like(later[:, 3:])
    noisy_later = noisy.clone()
    noisy_later[:, 3:] = torch.randn_like(noisy[:, 3:])
    with torch.no_grad():
        tf_a = m.forward_teacher_forcing(x0, noisy, t, batch)
        tf_b = m.forward_teacher_forcing(later, noisy_later, t, batch)
        bi_a = m.forward_bidirectional(noisy, t, batch)
        bi_b = m.forward_bidirectional(noisy_later, t, batch)
    # causal: outputs for frames 1, 2 ignore frames >= 3
    assert torch.allclose(tf_a[:, :2], tf_b[:, :2], atol=1e-6)
    assert not torch.allclose(tf_a[:, 2:], tf_b[:, 2:], atol=1e-4)
    # bidirectional: frame 1 sees the future
    assert not torch.allclose(bi_a[:, 1], bi_b[:, 1], atol=1e-4)


def test_actions_and_domain_condition_the_prediction(bundle_dir, batch):
    m = small_model(bundle_dir)
    x0 = batch["video"]
    t = torch.full(x0.shape[:2], 0.5)
    noisy = torch.randn_like(x0)
    other = dict(batch, actions=batch["actions"] + 0.5 * batch["action_mask"])
    dom = dict(batch, domain_id=1 - batch["domain_id"])
    with torch.no_grad():
        base = m.forward_teacher_forcing(x0, noisy, t, batch)
        assert not torch.allclose(base, m.forward_teacher_forcing(x0, noisy, t, other), atol=1e-4)
        assert not torch.allclose(base, m.forward_teacher_forcing(x0, noisy, t, dom), atol=1e-4)


def test_losses_backpropagate_and_rollout_shapes(bundle_dir, batch):
    m = small_model(bundle_dir).train()
    for mode in ("bidirectional", "teacher_forcing"):
        m.zero_grad()
        loss, _ = flow_loss(m, batch, mode)
        loss.backward()
        assert torch.isfinite(loss)
        assert m.action_encoder[0].weight.grad.abs().sum() > 0
    out = m.eval().rollout(batch, steps=2, generator=torch.Generator().manual_seed(0))
    assert out.shape == batch["video"].shape and torch.equal(out[:, 0], batch["video"][:, 0])
    assert out.abs().max() <= 1


@pytest.mark.parametrize("block_frames", [1, 2])
def test_an_untrained_residual_model_copies_the_last_frame_before_each_block(bundle_dir, batch, block_frames):
    """model.residual: the prediction is the last clean frame before the block plus the
    network's output, which starts at zero, so training starts from the copy-last baseline
    in every mode: teacher forcing, the cached rollout, few-step sampling."""
    m = small_model(bundle_dir, block_frames, residual=True, perturb=False)
    x0 = batch["video"]
    f = x0.shape[1]
    last = (torch.arange(1, f) - 1) // block_frames * block_frames  # frame j's block starts after this one
    t = torch.rand(2, f)
    t[:, 0] = 0
    with torch.no_grad():
        assert torch.equal(m.forward_teacher_forcing(x0, torch.randn_like(x0), t, batch), x0[:, last])
        assert torch.equal(m.forward_bidirectional(torch.randn_like(x0).index_copy(1, torch.tensor([0]), x0[:, :1]), t,
                                                   batch)[:, 1:], x0[:, :1].expand(-1, f - 1, -1, -1, -1))
    g = torch.Generator().manual_seed(0)
    for kw in ({"steps": 2}, {"schedule": [1.0, 0.5]}):
        out = m.rollout(batch, generator=g, **kw)
        torch.testing.assert_close(out[:, 1:], x0[:, last], atol=1e-5, rtol=0)  # Euler's last step lands on x0
    with pytest.raises(ValueError, match="anchor"):
        m.denoise_block(m.new_cache(), torch.tensor([1]), *m.frame_actions(batch["actions"], batch["action_mask"]),
                        batch["domain_id"], m.caption_vector(batch["caption_ids"], batch["caption_mask"]), 2)


def test_the_action_step_is_each_command_minus_the_last_and_reaches_the_kv_cache_rollout(bundle_dir, batch):
    """model.action_step: frame f sees transition f-1's command and that command minus transition
    f-2's; frames 0 and 1 have no step (masked), nor do padded transitions; the cached rollout
    reproduces teacher forcing with it as without."""
    m = small_model(bundle_dir, action_step=True)
    act, am = m.frame_actions(batch["actions"], batch["action_mask"])
    d = batch["actions"].shape[-1]
    assert act.shape[-1] == am.shape[-1] == 2 * d
    torch.testing.assert_close(act[:, 3, d:], (batch["actions"][:, 2] - batch["actions"][:, 1]) * am[:, 3, d:])
    assert not am[:, :2, d:].any() and torch.equal(am[:, 2:, d:], am[:, 2:, :d] & am[:, 1:-1, :d])
    x0 = batch["video"]
    t = torch.rand(2, x0.shape[1])
    t[:, 0] = 0
    noisy = torch.randn_like(x0)
    with torch.no_grad():
        v_tf = m.forward_teacher_forcing(x0, noisy, t, batch)
        cap = m.caption_vector(batch["caption_ids"], batch["caption_mask"])
        cache = m.new_cache()
        m.push_clean(cache, x0[:, :1], torch.tensor([0]), act[:, :1], am[:, :1], batch["domain_id"], cap)
        outs = []
        for f in range(1, x0.shape[1]):
            idx = torch.tensor([f])
            outs.append(m._forward(noisy[:, idx], idx, t[:, idx], act[:, idx], am[:, idx], batch["domain_id"], cap, None,
                                   cache))
            m.push_clean(cache, x0[:, idx], idx, act[:, idx], am[:, idx], batch["domain_id"], cap)
    assert torch.allclose(v_tf, torch.cat(outs, 1), atol=1e-5)


def test_action_tokens_carry_the_actions_to_the_patches(bundle_dir, batch):
    """model.action_tokens: one more token per frame; with the adaLN path cut (action_modulation
    zero, as at initialisation), the prediction still changes with the actions, and only through
    that token."""
    for tokens in (False, True):
        m = small_model(bundle_dir, residual=True, action_tokens=tokens)
        assert m.tokens_per_frame == m.patches_per_frame + tokens
        with torch.no_grad():
            m.action_modulation.weight.zero_()
            m.action_modulation.bias.zero_()
        x0 = batch["video"]
        t = torch.full(x0.shape[:2], 0.5)
        t[:, 0] = 0
        noisy = torch.randn_like(x0)
        other = dict(batch, actions=batch["actions"].flip(0))
        with torch.no_grad():
            moved = (m.forward_teacher_forcing(x0, noisy, t, batch) - m.forward_teacher_forcing(x0, noisy, t, other)).abs().max()
        assert (moved > 0) == tokens  # exactly unchanged without the token


def test_the_action_readout_starts_at_zero_and_moves_the_anchor_by_the_actions(bundle_dir, batch):
    """model.action_readout: zero-initialised, so the model starts as without it; once trained it
    adds a linear function of the frame's actions to its residual anchor."""
    plain, ro = small_model(bundle_dir, residual=True), small_model(bundle_dir, residual=True, action_readout=True)
    ro.load_state_dict(plain.state_dict(), strict=False)
    for m in (plain, ro):  # the readout's zero start; adaLN's action path cut, so the readout is the only one
        for p in (*m.action_modulation.parameters(), *(m.action_readout.parameters() if m.action_readout else ())):
            torch.nn.init.zeros_(p)
    x0 = batch["video"]
    t = torch.full(x0.shape[:2], 0.5)
    t[:, 0] = 0
    noisy = torch.randn_like(x0)
    with torch.no_grad():
        torch.testing.assert_close(ro.forward_teacher_forcing(x0, noisy, t, batch),
                                   plain.forward_teacher_forcing(x0, noisy, t, batch))
        ro.action_readout.weight.normal_(0, 0.05)
        other = dict(batch, actions=batch["actions"].flip(0))
        moved = ro.forward_teacher_forcing(x0, noisy, t, batch) - ro.forward_teacher_forcing(x0, noisy, t, other)
        readout = ro.action_readout  # the whole difference is the readout's
        act, am = ro.frame_actions(batch["actions"], batch["action_mask"])
        act2, am2 = ro.frame_actions(other["actions"], other["action_mask"])
        want = readout(torch.cat([act * am, am.float()], -1)) - readout(torch.cat([act2 * am2, am2.float()], -1))
    assert moved.abs().max() > 1e-3
    torch.testing.assert_close(moved.flatten(2), want[:, 1:], atol=1e-4, rtol=0)
    from wmrl.bimanual.config import ConfigError
    with pytest.raises(ConfigError, match="residual"):
        ModelConfig(action_readout=True, residual=False)


def test_time_shift_moves_training_and_sampling_noise_towards_one():
    from wmrl.bimanual.config import ConfigError
    from wmrl.bimanual.model import sample_t, shift_t

    t = torch.tensor([0.0, 0.25, 0.5, 1.0])
    torch.testing.assert_close(shift_t(t, 3.0), torch.tensor([0.0, 0.5, 0.75, 1.0]))
    assert shift_t(t, 1.0) is t
    g = torch.Generator().manual_seed(0)
    plain, shifted = sample_t((20_000,), g), sample_t((20_000,), torch.Generator().manual_seed(0), shift=3.0)
    assert plain.median() == pytest.approx(0.5, abs=0.02) and shifted.median() == pytest.approx(0.75, abs=0.02)
    with pytest.raises(ConfigError, match="time_shift"):
        ModelConfig(time_shift=0)
