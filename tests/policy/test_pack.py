"""A policy packed in half precision and unpacked again: same architecture and statistics,
weights within half precision's rounding, a normal hash-checked checkpoint; damaged or
foreign packs refused with a reason."""

import tarfile

import pytest
import torch

from wmrl.layout import RunLayout
from wmrl.policy.checkpoint import CheckpointError, load_checkpoint
from wmrl.policy.pack import pack_checkpoint, unpack_checkpoint


def test_pack_unpack_round_trip(trained_run, tmp_path):
    src = load_checkpoint(RunLayout(trained_run).checkpoint(10, "sft"))
    pack = tmp_path / "p.tar.xz"
    meta = pack_checkpoint(src.path, pack)
    assert meta["dtype"] == "float16" and meta["source_model_sha256"] == src.meta["files"]["model.safetensors"]
    dest = unpack_checkpoint(pack, tmp_path / "run")
    assert dest == RunLayout(tmp_path / "run").checkpoint(10, "sft")
    out = load_checkpoint(dest)  # hashes verified
    assert out.cfg == src.cfg and out.image_size == src.image_size and not out.full
    assert out.lang.instructions == src.lang.instructions
    assert out.norm.to_dict() == src.norm.to_dict()
    for k, v in src.weights.items():
        if v.is_floating_point():
            assert torch.allclose(out.weights[k], v, rtol=1e-3, atol=1e-7), k
            assert torch.equal(out.weights[k], v.half().float()), k
    assert any(not torch.equal(out.weights[k], v) for k, v in src.weights.items())  # really rounded
    assert unpack_checkpoint(pack, tmp_path / "run") == dest  # the same pack again: nothing to do


def test_bfloat16_and_refusals(trained_run, tmp_path):
    src = RunLayout(trained_run).checkpoint(5, "sft")
    pack = tmp_path / "b.tar.xz"
    pack_checkpoint(src, pack, dtype="bfloat16")
    other = tmp_path / "other.tar.xz"
    pack_checkpoint(RunLayout(trained_run).checkpoint(10, "sft"), other)
    run = tmp_path / "run"
    unpack_checkpoint(pack, run, step=10)
    with pytest.raises(CheckpointError, match="not this pack"):
        unpack_checkpoint(other, run)  # step 10 is there, from another pack
    with pytest.raises(CheckpointError, match="choose one of"):
        pack_checkpoint(src, tmp_path / "x.tar.xz", dtype="int8")
    with pytest.raises(CheckpointError, match="no such policy pack"):
        unpack_checkpoint(tmp_path / "missing.tar.xz", run)
    damaged = tmp_path / "damaged.tar.xz"
    damaged.write_bytes(pack.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match="copy it again"):
        unpack_checkpoint(damaged, tmp_path / "run2")
    foreign = tmp_path / "foreign.tar.xz"
    with tarfile.open(foreign, "w:xz") as tar:
        tar.add(__file__, arcname="weights.safetensors")
    with pytest.raises(CheckpointError, match="missing"):
        unpack_checkpoint(foreign, tmp_path / "run3")


def test_delta_pack_keeps_only_changed_tensors_and_needs_its_base(trained_run, tmp_path):
    """A policy trained on from an unpacked pack (GRPO trains part of it) packs as the tensors
    that changed; unpacked with its base it equals the full pack of the same checkpoint."""
    from wmrl.policy.checkpoint import save_checkpoint
    from wmrl.policy.model import FlowPolicy

    base = tmp_path / "base.tar.xz"
    pack_checkpoint(RunLayout(trained_run).checkpoint(10, "sft"), base)
    start = unpack_checkpoint(base, tmp_path / "start")  # what a GRPO run starts from
    src = load_checkpoint(start)
    model = FlowPolicy(src.cfg)
    model.load_state_dict(src.weights)
    changed = [k for k in src.weights if src.weights[k].is_floating_point()][:2]
    with torch.no_grad():
        for k in changed:
            model.state_dict()[k].add_(0.01)
    trained = save_checkpoint(tmp_path / "trained", model, step=6, image_size=src.image_size, norm=src.norm,
                              lang=src.lang)

    delta = tmp_path / "delta.tar.xz"
    meta = pack_checkpoint(trained, delta, base=base)
    assert meta["tensors"] == len(changed) and meta["base"]["pack"] == "base.tar.xz"
    assert delta.stat().st_size < base.stat().st_size
    full = tmp_path / "full.tar.xz"
    pack_checkpoint(trained, full)
    a = load_checkpoint(unpack_checkpoint(delta, tmp_path / "a", base=base))
    b = load_checkpoint(unpack_checkpoint(full, tmp_path / "b"))
    assert a.step == 6 and set(a.weights) == set(b.weights)
    assert all(torch.equal(a.weights[k], b.weights[k]) for k in b.weights)
    assert not torch.equal(a.weights[changed[0]], src.weights[changed[0]])

    with pytest.raises(CheckpointError, match="pass that pack as the base"):
        unpack_checkpoint(delta, tmp_path / "c")
    with pytest.raises(CheckpointError, match="not the pack"):
        unpack_checkpoint(delta, tmp_path / "c", base=full)
    with pytest.raises(CheckpointError, match="itself a delta"):
        pack_checkpoint(trained, tmp_path / "d.tar.xz", base=delta)
    with pytest.raises(CheckpointError, match="pack with dtype=float16"):
        pack_checkpoint(trained, tmp_path / "d.tar.xz", dtype="bfloat16", base=base)


def test_a_grpo_state_packs_with_its_adam_moments_in_bfloat16(trained_run, tmp_path):
    """moments=True: Adam's moments travel rounded to bfloat16 and load into a fresh optimizer as
    float32, each within bfloat16's rounding of the original; without it the pack is smaller and
    says the moments were dropped."""
    from wmrl import rng
    from wmrl.config import GRPOConfig
    from wmrl.policy.checkpoint import save_checkpoint
    from wmrl.rl.grpo import make_optimizer

    sft = load_checkpoint(RunLayout(trained_run).checkpoint(10, "sft"))
    model = sft.build_model("cpu")
    opt = make_optimizer(model, GRPOConfig())
    torch.manual_seed(0)
    for _ in range(2):  # two steps: both moments away from their first-step values
        for p in model.parameters():
            p.grad = torch.randn_like(p) * 1e-3 if p.requires_grad else None
        opt.step()
    state = {"kind": "grpo", "step": 2, "optimizer": opt.state_dict(), "rng": rng.capture(), "origin": {}, "grpo": {}}
    src = save_checkpoint(RunLayout(tmp_path / "here").checkpoint(2), model, step=2, image_size=sft.image_size,
                          norm=sft.norm, lang=sft.lang, train_state=state)
    with pytest.raises(CheckpointError, match="state=True"):
        pack_checkpoint(src, tmp_path / "x.tar.xz", moments=True)
    pack_checkpoint(src, tmp_path / "plain.tar.xz", state=True)
    pack_checkpoint(src, tmp_path / "moments.tar.xz", state=True, moments=True)
    assert (tmp_path / "moments.tar.xz").stat().st_size > (tmp_path / "plain.tar.xz").stat().st_size

    plain = load_checkpoint(unpack_checkpoint(tmp_path / "plain.tar.xz", tmp_path / "a", kind="policy"), need_full=True)
    assert plain.train_state["moments_dropped"] and "optimizer" not in plain.train_state
    carried = load_checkpoint(unpack_checkpoint(tmp_path / "moments.tar.xz", tmp_path / "b", kind="policy"), need_full=True)
    st = carried.train_state
    assert st["moments_dtype"] == "bfloat16" and "moments_dropped" not in st
    fresh = make_optimizer(carried.build_model("cpu"), GRPOConfig())
    fresh.load_state_dict(st["optimizer"])
    pairs = list(zip(opt.param_groups[0]["params"], fresh.param_groups[0]["params"]))
    assert pairs and all(p in opt.state for p, _ in pairs)
    for p, q in pairs:
        for name in ("exp_avg", "exp_avg_sq"):
            got, want = fresh.state[q][name], opt.state[p][name]
            assert got.dtype == torch.float32 and not torch.equal(got, want)  # rounded, and back in float32
            torch.testing.assert_close(got, want, rtol=1 / 128, atol=0)
        assert float(fresh.state[q]["step"]) == 2
