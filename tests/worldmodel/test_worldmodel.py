"""World models: data at chunk boundaries, the manifest, the EDM model, DeepSpeed training
(CPU, gloo) with resume and the seed's stop rule. Runs in .venv/wm."""

import dataclasses
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tests.helpers import child_env, load_script  # noqa: E402
from wmrl.config import get_profile  # noqa: E402
from wmrl.data.manifest import ManifestError, build_manifest, load_manifest  # noqa: E402
from wmrl.data.trajectory import TrajectoryError  # noqa: E402
from wmrl.fileio import sha256_file  # noqa: E402
from wmrl.worldmodel.data import MixedSampler, Transitions, boundary_frames, proprio_stats, read_episode  # noqa: E402
from wmrl.worldmodel.model import FrameWorldModel  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TINY = get_profile("tiny").wm


def _episodes(path, source):
    import h5py

    with h5py.File(path) as h:
        return [read_episode(h["data"][f"demo_{i}"], 8, source, f"demo_{i}") for i in range(h["data"].attrs["num_episodes"])]


def _new_transitions(trajectories, cfg=TINY.main):
    """The first file's episodes as transitions carrying the action history ``cfg``'s model reads."""
    return Transitions(_episodes(trajectories[0], "new"), context=cfg.context, action_history=cfg.action_history)


def test_boundary_frames_from_dense_and_sparse_recordings():
    assert boundary_frames(np.arange(0, 25, 8), 8).tolist() == [0, 1, 2, 3]
    assert boundary_frames(np.arange(0, 25), 8).tolist() == [0, 8, 16, 24]
    with pytest.raises(TrajectoryError, match="every 8 steps"):
        boundary_frames(np.array([0, 8, 24]), 8)


def test_dense_and_sparse_files_give_the_same_kind_of_transitions(trajectories):
    new, replay = trajectories
    sparse, dense = _episodes(new, "new"), _episodes(replay, "replay")
    assert sparse[0].main.shape[0] == 6 and sparse[0].actions.shape == (5, 8, 7)
    assert dense[0].main.shape[0] == 5 and dense[0].actions.shape == (4, 8, 7)  # 33 frames -> 5 boundaries
    t = Transitions(sparse[:1], context=2)
    assert t.size == 5
    assert t.context[0].tolist() == [0, 0] and t.context[3].tolist() == [2, 3]  # history repeats frame 0
    assert t.next.tolist() == [1, 2, 3, 4, 5]


def test_every_step_recordings_give_a_stream_per_phase_and_validation_keeps_phase_0(trajectories, tmp_path):
    import h5py

    from wmrl.worldmodel.data import load_split

    new, replay = trajectories
    with h5py.File(replay) as h:
        g = h["data"]["demo_0"]
        ep = read_episode(g, 8, "replay", "demo_0", phase=3)
        frames, actions = g["obs"]["agentview_rgb"][()], g["actions"][()]
    assert ep.phase == 3 and ep.main.shape[0] == 4  # steps 3, 11, 19, 27 of 32
    np.testing.assert_array_equal(ep.main, frames[[3, 11, 19, 27]])
    np.testing.assert_array_equal(ep.actions, actions[3:27].reshape(3, 8, 7))  # the chunk between frames k and k + 1
    with h5py.File(new) as h:  # frames at chunk boundaries only: no other phase
        assert read_episode(h["data"]["demo_0"], 8, "new", "demo_0", phase=3) is None

    build_manifest(tmp_path / "manifest.json", [str(new)], [str(replay)], val_ratio=0.4, seed=0)
    _, train0, val0 = load_split(tmp_path / "manifest.json", 8)
    _, train, val = load_split(tmp_path / "manifest.json", 8, phases=True)
    assert [e.key for e in val] == [e.key for e in val0] and {e.phase for e in val} == {0}
    dense0 = [e for e in train0 if e.source == "replay"]
    assert len([e for e in train if e.source == "replay"]) == 8 * len(dense0)  # every phase of a 32-step episode
    assert [e.key for e in train if e.source == "new"] == [e.key for e in train0 if e.source == "new"]
    assert {e.key.split("@")[0] for e in train} == {e.key for e in train0}  # no held-out episode leaks in


def test_episode_keys_name_the_folder_so_equal_file_names_stay_apart(trajectories, tmp_path):
    """Every collection writes task_00.hdf5 ...: two of them in one manifest are two files (the
    keyframes' names, and the closed-loop check's recorded outcomes, follow the key)."""
    import shutil

    from wmrl.worldmodel.data import load_split

    new, replay = trajectories
    for folder, src in (("collect_a", new), ("collect_b", replay)):
        (tmp_path / folder).mkdir()
        shutil.copy(src, tmp_path / folder / "task_00.hdf5")
    build_manifest(tmp_path / "manifest.json", [str(tmp_path / "collect_a")], [str(tmp_path / "collect_b")],
                   val_ratio=0.2, seed=0)
    _, train, val = load_split(tmp_path / "manifest.json", 8)
    keys = [e.key for e in train + val]
    assert len(set(keys)) == len(keys)
    assert {k.split(":")[0] for k in keys} == {"collect_a/task_00.hdf5", "collect_b/task_00.hdf5"}


def test_manifest_splits_by_episode_hashes_and_refuses_a_changed_file(trajectories, tmp_path):
    new, replay = trajectories
    m = build_manifest(tmp_path / "manifest.json", [str(new)], [str(replay)], val_ratio=0.2, seed=0)
    assert [f["source"] for f in m["files"]] == ["new", "replay"]
    assert all(len(f["val_episodes"]) == 1 for f in m["files"])  # 0.2 x 5 episodes per source
    assert m["new_ratio"] == 0.5
    _, files = load_manifest(tmp_path / "manifest.json")
    assert files[0].path == Path(new).resolve()
    copy = tmp_path / "copy.hdf5"
    copy.write_bytes(Path(new).read_bytes())
    build_manifest(tmp_path / "m2.json", [str(copy)], [], seed=0)
    data = bytearray(copy.read_bytes())
    data[len(data) // 2] ^= 0xFF
    copy.write_bytes(bytes(data))
    with pytest.raises(ManifestError, match="copy.hdf5 changed"):
        load_manifest(tmp_path / "m2.json")
    with pytest.raises(ManifestError, match="make manifest"):
        load_manifest(tmp_path / "absent.json")


def test_mixed_sampler_draws_new_data_at_the_requested_ratio():
    is_new = torch.tensor([True] * 10 + [False] * 90)
    s = MixedSampler(is_new, 0.5, seed=1)
    idx = torch.cat([s.next(64) for _ in range(20)])
    frac = float(is_new[idx].float().mean())
    assert 0.42 < frac < 0.58
    state = s.state_dict()
    a = s.next(8)
    s.load_state_dict(state)
    assert torch.equal(a, s.next(8))  # resumable


def test_model_shapes_loss_and_batched_generation(trajectories):
    torch.manual_seed(0)
    cfg = TINY.wrist  # conditions on the main view too
    model = FrameWorldModel(cfg)
    t = _new_transitions(trajectories, cfg)
    stats = proprio_stats(t)
    b = t.batch(torch.arange(6), "wrist", "start", stats)
    assert b["frames"].shape == (6, 3, 3, 64, 64) and b["target"].shape == (6, 3, 64, 64)
    loss, parts = model.loss(**b)
    assert torch.isfinite(loss) and set(parts) == {"frame_loss", "proprio_loss"}
    frame, prop = model.generate(b["frames"], b["actions"], b["proprio"], generator=torch.Generator().manual_seed(0))
    assert frame.shape == (6, 3, 64, 64) and prop.shape == (6, 8) and frame.abs().max() <= 1
    one, _ = model.generate(b["frames"][:1], b["actions"][:1], b["proprio"][:1], generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(one, frame[:1], atol=1e-5, rtol=1e-4)  # a batch is independent samples


def test_speed_options_change_neither_results_nor_parameter_names(trajectories):
    """channels_last, the fast kernels and torch.compile are for speed: the same frames (up to
    rounding) and the same state_dict keys, so checkpoints and exported weights do not depend on them."""
    from wmrl.config import override
    from wmrl.worldmodel.train import Objective, speed_up

    torch.manual_seed(0)
    cfg = TINY.main
    model = FrameWorldModel(cfg)
    t = _new_transitions(trajectories, cfg)
    b = t.batch(torch.arange(4), "main", None, proprio_stats(t))
    eager, _ = model.generate(b["frames"], b["actions"], b["proprio"], generator=torch.Generator().manual_seed(0))
    keys = list(model.state_dict())
    import torch._inductor.config as inductor

    try:
        objective = speed_up(Objective(model, 1.0), override(TINY.train, channels_last=True, compile=True,
                                                             compile_nhwc=True, fast_kernels=True))
        assert inductor.force_layout_optimization  # compile_nhwc: inductor's own NHWC choice, forced on
        assert model.channels_last and list(objective.model.state_dict()) == keys
        assert model.fast_kernels and not FrameWorldModel(cfg).fast_kernels  # off unless asked
        assert get_profile("default").wm.train.fast_kernels and not TINY.train.fast_kernels  # the GPU's profile asks
        nhwc, _ = model.generate(b["frames"], b["actions"], b["proprio"], generator=torch.Generator().manual_seed(0))
        torch.testing.assert_close(nhwc, eager, atol=1e-4, rtol=1e-4)
        assert all(p.is_contiguous() for p in model.parameters())  # DeepSpeed views parameters as flat bytes
        speed_up(Objective(FrameWorldModel(cfg), 1.0), override(TINY.train, compile=True, compile_nhwc=False))
        assert not inductor.force_layout_optimization  # one process's earlier choice does not carry over
    finally:
        inductor.force_layout_optimization = False


def test_fast_kernels_compute_the_plain_modules_function_and_gradients():
    """The refine head on padded channel counts and the U-Net's upsampling written as a broadcast
    are the same function as the plain modules: the loss and every parameter's gradient agree,
    in NCHW and NHWC (neither adds a parameter: models saved before them load as they were)."""
    import torch.nn.functional as F
    from wmrl.worldmodel.model import Upsample2x, tensor_core_conv

    x = torch.randn(2, 5, 3, 4)
    up = Upsample2x()
    for layout in (torch.contiguous_format, torch.channels_last):
        torch.testing.assert_close(up(x.contiguous(memory_format=layout)), F.interpolate(x, scale_factor=2), rtol=0, atol=0)
    conv = torch.nn.Conv2d(9, 3, 3, padding=1)
    torch.testing.assert_close(tensor_core_conv(torch.randn(2, 9, 6, 6).requires_grad_(), conv).shape, (2, 3, 6, 6))

    for refine_patch in (1, 2):  # the head at full resolution and on 2 x 2 pixel patches
        cfg = dataclasses.replace(TINY.main, patch=2, refine=8, refine_patch=refine_patch)  # both paths: head, upsampling
        batch = {"frames": torch.rand(3, cfg.input_frames, 3, 64, 64) * 2 - 1, "target": torch.rand(3, 3, 64, 64) * 2 - 1,
                 "actions": torch.rand(3, cfg.action_chunks * cfg.chunk_size, cfg.action_dim) * 2 - 1,
                 "proprio": torch.randn(3, cfg.proprio_dim), "next_proprio": torch.randn(3, cfg.proprio_dim)}
        torch.manual_seed(0)
        model = FrameWorldModel(cfg)
        for p in model.parameters():  # the zero-initialised output layers would hide a wrong path
            torch.nn.init.normal_(p, std=0.05)
        results = []
        for fast in (True, False):
            model.zero_grad()
            torch.manual_seed(1)  # the same noise levels and noise
            loss, _ = model.use_fast_kernels(fast).loss(**batch)
            loss.backward()
            results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
        (fast_loss, fast_grads), (plain_loss, plain_grads) = results
        torch.testing.assert_close(fast_loss, plain_loss, rtol=1e-5, atol=1e-6)
        for name, grad in plain_grads.items():
            torch.testing.assert_close(fast_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_the_refine_head_on_pixel_patches_starts_as_the_model_without_it():
    """WorldModelConfig.refine_patch: the head folds r x r pixels into channels (9 r^2 in, 3 r^2
    out) at the same FLOPs; zero-initialised, it adds nothing until trained, as the full-resolution
    head; trained weights touch every pixel; a size it does not divide is refused with the fix."""
    from torch.utils.flop_counter import FlopCounterMode

    from wmrl.config import ConfigError

    full, patched = (dataclasses.replace(TINY.main, patch=2, refine=8, refine_patch=r) for r in (1, 2))
    first, _, last = FrameWorldModel(patched).refine_head
    assert (first.in_channels, first.out_channels, last.out_channels) == (36, 8, 12)
    flops = []
    for cfg in (full, patched):
        head = FrameWorldModel(cfg).refine_head
        with FlopCounterMode(display=False) as fc:
            head(torch.randn(1, head[0].in_channels, 64 // cfg.refine_patch, 64 // cfg.refine_patch))
        flops.append(fc.get_total_flops())
    assert flops[0] == flops[1]  # the same work on a quarter of the positions
    args = (torch.rand(2, full.input_frames, 3, 64, 64) * 2 - 1,
            torch.rand(2, full.action_chunks * full.chunk_size, full.action_dim) * 2 - 1, torch.randn(2, full.proprio_dim))
    noisy, sigma = torch.randn(2, 3, 64, 64), torch.full((2,), 0.7)
    torch.manual_seed(0)
    with_head = FrameWorldModel(patched)
    without = FrameWorldModel(dataclasses.replace(patched, refine=0))
    without.load_state_dict({k: v for k, v in with_head.state_dict().items() if not k.startswith("refine_head")})
    with torch.no_grad():
        torch.testing.assert_close(with_head.denoise(noisy, sigma, *args), without.denoise(noisy, sigma, *args))
        torch.nn.init.normal_(with_head.refine_head[-1].weight, std=0.05)
        moved = (with_head.denoise(noisy, sigma, *args) - without.denoise(noisy, sigma, *args)).abs()
    assert bool((moved.amax(dim=(0, 1)) > 0).all())  # every pixel of the 64 x 64 frame is touched
    for bad in (0, 3):
        with pytest.raises(ConfigError, match=f"refine_patch={bad}"):
            dataclasses.replace(full, refine_patch=bad)


def test_compile_nhwc_is_the_default_and_leaves_an_eager_run_alone():
    """NHWC inside the compiled graph is on by default (measured faster on the H200); without
    compile it must not touch inductor's global option, which another compiled run would read."""
    import torch._inductor.config as inductor
    from wmrl.config import WMTrainConfig
    from wmrl.worldmodel.train import Objective, speed_up

    assert WMTrainConfig().compile_nhwc and not WMTrainConfig().compile
    before = inductor.force_layout_optimization
    objective = speed_up(Objective(FrameWorldModel(TINY.main), 1.0), TINY.train)
    assert inductor.force_layout_optimization == before and not objective.model.channels_last
    # cuDNN's algorithm search: off by default (measured no faster), set either way
    try:
        speed_up(Objective(FrameWorldModel(TINY.main), 1.0), dataclasses.replace(TINY.train, cudnn_benchmark=True))
        assert torch.backends.cudnn.benchmark
        speed_up(Objective(FrameWorldModel(TINY.main), 1.0), TINY.train)
        assert not torch.backends.cudnn.benchmark
    finally:
        torch.backends.cudnn.benchmark = False


def test_the_speed_benchs_profile_names_each_convolution_by_its_input_shape(tmp_path):
    """bench/wm_throughput.py's profile: the operator table, and the convolutions (forward and
    backward) grouped by input shape, so a kernel that runs once per update can be told apart."""
    bench = load_script("bench/wm_throughput.py")
    conv = torch.nn.Conv2d(9, 16, 3, padding=1)
    x = torch.randn(2, 9, 12, 12)
    out = bench.profile_updates(lambda: conv(x).sum().backward(), torch.device("cpu"), tmp_path / "t", updates=2)
    shapes = Path(out["conv_shapes"]).read_text()
    assert "aten::convolution " in shapes and "aten::convolution_backward" in shapes
    assert "[2, 9, 12, 12]" in shapes and "[16, 9, 3, 3]" in shapes  # the input and weight shapes
    assert "aten::sum" not in shapes and "aten::sum" in Path(out["top_ops"]).read_text()


def test_compile_mode_is_one_of_torchs_and_the_speed_bench_names_each():
    """``compile_mode`` (CUDA graphs, autotuning) is refused with the choices when unknown;
    bench/wm_throughput.py's variants map onto the training fields and refuse compile's options
    without compile, each a one-line exit before anything loads."""

    from wmrl.config import ConfigError, override

    with pytest.raises(ConfigError, match="reduce-overhead"):
        override(TINY.train, compile_mode="fast")
    bench = load_script("bench/wm_throughput.py")
    assert bench.variant_options("compile+nhwc+graphs+autotune") == {
        "channels_last": False, "compile": True, "compile_nhwc": True, "compile_mode": "max-autotune",
        "cudnn_benchmark": False, "fast_kernels": False}
    assert bench.variant_options("compile+nhwc+fast")["fast_kernels"]
    # +refine2 is a model option (the head on 2 x 2 patches), not a training field
    assert bench.variant_options("compile+nhwc+fast+refine2") == bench.variant_options("compile+nhwc+fast")
    assert bench.variant_options("compile")["compile_mode"] == "default"
    assert bench.variant_options("channels_last+cudnn")["cudnn_benchmark"]
    for variant in bench.VARIANTS:  # every listed variant is a valid training config
        override(TINY.train, **bench.variant_options(variant))
    for bad in ("nhwc", "graphs", "compile+faster"):
        with pytest.raises(SystemExit, match="unknown variant"):
            bench.variant_options(bad)


def test_own_context_puts_the_models_prediction_where_imagination_would(trajectories):
    from wmrl.worldmodel.train import own_context

    torch.manual_seed(0)
    cfg = TINY.main
    model = FrameWorldModel(cfg)
    t = _new_transitions(trajectories, cfg)
    norm = proprio_stats(t)
    idx = torch.arange(t.size)
    b = t.batch(idx, "main", None, norm)
    assert own_context(model, t, idx, b, 0.0, "main", norm) is b  # off: the real context, untouched
    torch.manual_seed(1)
    own = own_context(model, t, idx, b, 1.0, "main", norm)
    later = t.previous[idx] >= 0  # every transition but an episode's first has a predecessor
    assert 0 < later.sum() < len(idx)
    torch.testing.assert_close(own["frames"][~later], b["frames"][~later], rtol=0, atol=0)
    torch.testing.assert_close(own["frames"][:, 0], b["frames"][:, 0], rtol=0, atol=0)  # older context stays real
    torch.manual_seed(1)
    torch.rand(idx.shape)  # own_context's draw of the rows
    pb = t.batch(t.previous[idx][later], "main", None, norm)
    frame, proprio = model.generate(pb["frames"], pb["actions"], pb["proprio"])
    torch.testing.assert_close(own["frames"][later, cfg.context - 1], frame)
    torch.testing.assert_close(own["proprio"][later], proprio)
    assert not torch.equal(own["frames"][later, cfg.context - 1], b["frames"][later, cfg.context - 1])
    torch.testing.assert_close(own["target"], b["target"], rtol=0, atol=0)  # the target stays the real next frame


def _fits_one_batch(model, batch, updates: int = 15) -> bool:
    """A few Adam steps on one batch, with the same noise levels and noise every time, take its
    loss below 80% of where it started: the model can learn."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def loss_at_seed_0():
        torch.manual_seed(0)
        return model.loss(**batch)[0]

    first = loss_at_seed_0().item()
    for _ in range(updates):
        opt.zero_grad()
        loss_at_seed_0().backward()
        opt.step()
    return loss_at_seed_0().item() < 0.8 * first


def test_a_patched_model_runs_the_unet_on_fewer_wider_positions_and_learns(trajectories):
    """patch=2 folds each 2 x 2 pixel patch into channels before the U-Net and back after it:
    the U-Net sees a quarter of the positions with 4x the channels, frames keep their size,
    and a few updates on one batch lower its loss; a size the patch does not divide is refused."""
    from wmrl.config import ConfigError, override

    torch.manual_seed(0)
    cfg = override(TINY.wrist, patch=2)
    model = FrameWorldModel(cfg)
    t = _new_transitions(trajectories, cfg)
    model.set_proprio_stats(proprio_stats(t))  # as training does: the head's motion reads raw positions
    b = t.batch(torch.arange(6), "wrist", "start", model.proprio_stats)
    seen = []
    model.unet.stem.register_forward_hook(lambda m, args, out: seen.append(tuple(args[0].shape)))
    frame, _ = model.generate(b["frames"], b["actions"], b["proprio"], generator=torch.Generator().manual_seed(0))
    assert frame.shape == (6, 3, 64, 64)
    assert seen[0] == (6, 4 * (3 * (1 + cfg.input_frames) + 3 * cfg.wrist_warp), 32, 32)  # the warp: 3 more
    assert _fits_one_batch(model, b)
    with pytest.raises(ConfigError, match="patch=3"):
        override(TINY.main, patch=3)


def test_the_refine_head_starts_as_the_model_without_it_and_then_learns(trajectories):
    """refine=C adds a full-resolution head after the patches are unfolded; zero-initialised, so
    a model with it denoises exactly as the same weights without it until it trains, and its
    gradient is not zero (it can learn). A negative width is refused with the fix."""
    from wmrl.config import ConfigError, override

    t = _new_transitions(trajectories)
    b = t.batch(torch.arange(4), "wrist", "start", proprio_stats(t))
    torch.manual_seed(0)
    plain = FrameWorldModel(override(TINY.wrist, patch=2))
    refined = FrameWorldModel(override(TINY.wrist, patch=2, refine=8))
    missing, unexpected = refined.load_state_dict(plain.state_dict(), strict=False)
    assert not unexpected and missing and all(k.startswith("refine_head.") for k in missing)
    noisy, sigma = torch.randn(4, 3, 64, 64), torch.full((4,), 0.3)
    args = (noisy, sigma, b["frames"], b["actions"], b["proprio"])
    torch.testing.assert_close(refined.denoise(*args), plain.denoise(*args))
    refined.loss(**b)[0].backward()
    assert refined.refine_head[-1].weight.grad.abs().sum() > 0
    with pytest.raises(ConfigError, match="refine=-1"):
        override(TINY.main, refine=-1)


def test_a_residual_model_generates_the_change_from_the_views_current_frame(trajectories):
    """residual=True: the same weights denoise x_next - x_now instead of x_next, and the sample
    is x_now plus what they generate (the wrist model's x_now is its own frame, not the main
    view's it is conditioned on)."""
    from wmrl.config import override

    t = _new_transitions(trajectories)
    b = t.batch(torch.arange(4), "wrist", "start", proprio_stats(t))
    torch.manual_seed(0)
    wrist = override(TINY.wrist, wrist_warp=False)  # the warp's own residual: the wrist_warp test
    plain = FrameWorldModel(wrist)
    with torch.no_grad():
        for p in plain.parameters():  # zero-initialised output convolutions would hide the difference
            p.add_(0.05 * torch.randn_like(p))
    res = FrameWorldModel(override(wrist, residual=True))
    res.load_state_dict(plain.state_dict())  # no parameter of its own
    now = b["frames"][:, TINY.wrist.context - 1]
    assert not torch.equal(now, b["frames"][:, -1])  # the main view comes last
    noise = torch.randn(4, 3, 64, 64)
    args = (b["frames"], b["actions"], b["proprio"], 2)
    with torch.no_grad():
        torch.testing.assert_close(res.sample(noise, *args), plain.sample(noise, *args) + now)
        torch.manual_seed(1)
        loss_res = res.loss(**b)[0]
        torch.manual_seed(1)
        loss_plain = plain.loss(**dict(b, target=b["target"] - now))[0]
    torch.testing.assert_close(loss_res, loss_plain)


def test_action_guidance_amplifies_what_the_actions_change_and_needs_action_dropout(trajectories):
    """action_dropout trains a learned null in place of the actions; sampling at guidance w is
    D_null + w (D_actions - D_null) per step: w = 1 is the plain sample, w = 0 the null's, and
    the guided frame's change between two action chunks is about w times the plain one's."""
    from wmrl.config import ConfigError, override

    t = _new_transitions(trajectories)
    b = t.batch(torch.arange(4), "main", None, proprio_stats(t))
    torch.manual_seed(0)
    model = FrameWorldModel(override(TINY.main, action_dropout=0.2))
    with torch.no_grad():
        for p in model.parameters():  # zero-initialised layers would hide every difference
            p.add_(0.05 * torch.randn_like(p))
    noise = torch.randn(4, 3, 64, 64)

    def sample(w, actions=b["actions"], steps=1):
        model.guidance = w
        with torch.no_grad():
            return model.sample(noise, b["frames"], actions, b["proprio"], steps)

    plain = sample(1.0)
    assert not torch.allclose(plain, sample(0.0), atol=1e-4)  # the null differs from the actions
    other = -b["actions"]
    # one Euler step from sigma_max to 0 is linear in D: the actions' effect scales exactly
    torch.testing.assert_close(sample(3.0) - sample(3.0, other), 3 * (plain - sample(1.0, other)), atol=1e-4, rtol=1e-3)
    assert torch.isfinite(sample(2.0, steps=3)).all()
    model.guidance = 1.0
    loss, parts = model.loss(**b)
    loss.backward()
    assert model.null_actions.grad is not None and torch.isfinite(loss)  # the null is trained
    assert not hasattr(FrameWorldModel(TINY.main), "null_actions")  # old models keep their parameter names
    with pytest.raises(ConfigError, match="action_dropout"):
        override(TINY.main, action_guidance=2.0)


def test_the_motion_weight_weighs_only_the_pixels_that_move(trajectories):
    """motion_weight W: a pixel that changes over the chunk weighs 1 + W in the frame loss. The
    same weights and noise give a larger loss with it; where nothing moves (the target is the
    current frame) the loss is the plain one; a negative weight is refused."""
    from wmrl.config import ConfigError, override

    torch.manual_seed(0)
    plain = FrameWorldModel(TINY.main)
    weighted = FrameWorldModel(override(TINY.main, motion_weight=9))
    weighted.load_state_dict(plain.state_dict())
    t = _new_transitions(trajectories)
    b = t.batch(torch.arange(6), "main", None, proprio_stats(t))

    def frame_loss(model, batch):
        torch.manual_seed(0)  # the same noise levels and noise
        return model.loss(**batch)[1]["frame_loss"].item()

    assert frame_loss(weighted, b) > frame_loss(plain, b)
    still = {**b, "target": plain.current_frame(b["frames"])}
    assert frame_loss(weighted, still) == pytest.approx(frame_loss(plain, still), rel=1e-6)
    with pytest.raises(ConfigError, match="motion_weight"):
        override(TINY.main, motion_weight=-1)


def _extra_inputs_read_the_proprio_head_without_training_it(model, batch, extra: int) -> None:
    """A model with ``extra`` input channels drawn from its proprio head (pose maps, the wrist warp):
    the U-Net reads them, the frame loss alone leaves the head untouched, and the model learns."""
    seen = []
    model.unet.stem.register_forward_hook(lambda m, args, out: seen.append(tuple(args[0].shape)))
    model.loss(**batch, proprio_weight=0)[0].backward()  # the frame loss alone
    assert seen[0][1] == 3 * (1 + model.cfg.input_frames) + extra
    assert all(not p.grad.any() for p in model.proprio_head.parameters())
    model.zero_grad()
    assert _fits_one_batch(model, batch)


def test_pose_maps_draw_the_end_effector_now_and_where_the_actions_take_it(trajectories):
    """pose_maps: two input channels, Gaussian blobs at the end effector's projection now and
    at the proprio head's prediction for the chunk's end. The first does not depend on the
    actions, the second moves with them; the frame loss does not train the proprio head
    through them; the model learns; the wrist model is refused (its camera moves)."""
    from wmrl.config import ConfigError, override
    from wmrl.worldmodel import camera

    uv = camera.project(torch.tensor([[-0.2085, 0.0, 1.1733]]))  # the arm at rest, centred above the table
    assert 0.45 < uv[0, 0] < 0.55 and uv[0, 1] < 0.4  # upright image: the robot stands at the top
    blob = camera.blobs(uv[None], 64, 64)[0, 0]
    assert blob.max() > 0.9 and blob.min() == pytest.approx(-1, abs=1e-6)
    r, c = divmod(int(blob.argmax()), 64)
    assert abs(c + 0.5 - 64 * uv[0, 0]) <= 1 and abs(r + 0.5 - 64 * uv[0, 1]) <= 1

    torch.manual_seed(0)
    cfg = override(TINY.main, pose_maps=True)
    model = FrameWorldModel(cfg)
    t = _new_transitions(trajectories, cfg)
    norm = proprio_stats(t)
    b = t.batch(torch.arange(6), "main", None, norm)
    # the synthetic episodes' proprio is no arm pose: read it as offsets around the arm at rest
    model.set_proprio_stats({"mean": torch.tensor([-0.2085, 0.0, 1.1733, 0, 0, 0, 0, 0]), "std": torch.full((8,), 0.05)})
    with torch.no_grad():
        model.proprio_head[-1].weight.normal_(0, 1.0)  # a head that reads the actions
    maps = model.pose_maps(b["actions"], b["proprio"], 64, 64)
    other = model.pose_maps(b["actions"].flip(0), b["proprio"], 64, 64)
    assert maps.shape == (6, 2, 64, 64)
    torch.testing.assert_close(maps[:, 0], other[:, 0])  # now: from the proprio alone
    assert (maps[:, 1] - other[:, 1]).abs().amax() > 0.5  # the chunk's end: from the actions
    _extra_inputs_read_the_proprio_head_without_training_it(model, b, 2)
    with pytest.raises(ConfigError, match="pose_maps"):
        override(TINY.wrist, pose_maps=True)


def arm_at_rest_stats() -> dict:
    """Proprio statistics that read the synthetic episodes' proprio (no arm pose) as small offsets
    around the arm at rest, fingers down: what the wrist warp needs to see a plausible camera."""
    return {"mean": torch.tensor([-0.2085, 0.0, 1.1733, 3.1416, 0, 0, 0, 0]),
            "std": torch.tensor([0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.01, 0.01])}


def test_wrist_warp_feeds_the_current_frame_moved_where_the_actions_take_the_camera(trajectories):
    """wrist_warp: three input channels, the current wrist frame warped to the proprio head's end
    pose. They move with the actions; guidance's null sees the frame unwarped; the frame loss does
    not train the proprio head through them; the model learns; the main model is refused."""
    from wmrl.config import ConfigError, override

    torch.manual_seed(0)
    cfg = override(TINY.wrist, wrist_warp=True)
    model = FrameWorldModel(cfg)
    t = _new_transitions(trajectories, cfg)
    b = t.batch(torch.arange(6), "wrist", cfg.main_condition, proprio_stats(t))
    model.set_proprio_stats(arm_at_rest_stats())
    with torch.no_grad():
        model.proprio_head[-1].weight.normal_(0, 0.5)  # a head that reads the actions
    warped = model.warped_frame(b["frames"], b["actions"], b["proprio"])
    other = model.warped_frame(b["frames"], b["actions"].flip(0), b["proprio"])
    assert warped.shape == (6, 3, 64, 64)
    assert (warped - other).abs().amax() > 0.1  # the chunk's end: from the actions
    null = model.warped_frame(b["frames"], b["actions"], b["proprio"], no_actions=torch.ones(6, dtype=torch.bool))
    torch.testing.assert_close(null, model.current_frame(b["frames"]).float(), atol=1e-4, rtol=0)
    _extra_inputs_read_the_proprio_head_without_training_it(model, b, 3)
    # residual: the change is generated from the warp, in training and in sampling alike
    res = FrameWorldModel(override(cfg, residual=True))
    res.load_state_dict(model.state_dict())
    warped = model.warped_frame(b["frames"], b["actions"], b["proprio"])  # the proprio head has trained since
    torch.testing.assert_close(res.anchor(b["frames"], b["actions"], b["proprio"]), warped)
    with torch.no_grad():
        res.unet.out.weight.zero_()
        res.unet.out.bias.zero_()
    zero = torch.zeros_like(warped)  # no noise and a network that adds nothing: the warp itself comes out
    torch.testing.assert_close(res.sample(zero, b["frames"], b["actions"], b["proprio"], 3), warped)
    with pytest.raises(ConfigError, match="wrist_warp"):
        override(TINY.main, wrist_warp=True)


def test_the_sampler_draws_the_input_maps_once_and_samples_as_if_drawn_at_every_step(trajectories):
    """The warp (and the pose maps) read the conditioning alone: ``sample`` draws them once per
    frame, both guidance branches included, and its frame equals the Euler loop that draws them
    in every network call."""
    from wmrl.config import override

    torch.manual_seed(0)
    cfg = override(TINY.wrist, wrist_warp=True, action_dropout=0.1)  # a learned null: guidance
    model = FrameWorldModel(cfg)
    t = _new_transitions(trajectories, cfg)
    b = t.batch(torch.arange(4), "wrist", cfg.main_condition, proprio_stats(t))
    model.set_proprio_stats(arm_at_rest_stats())
    with torch.no_grad():
        model.proprio_head[-1].weight.normal_(0, 0.5)
        model.null_actions.normal_()
    model.guidance = 2.0
    drawn = []
    warp = model.warped_frame
    model.warped_frame = lambda *a, **k: drawn.append(1) or warp(*a, **k)
    noise = torch.randn(4, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    frames, actions, proprio = b["frames"], b["actions"], b["proprio"]
    with torch.no_grad():
        once = model.sample(noise, frames, actions, proprio, 3)
        assert len(drawn) == 1
        sig = model.sigmas(3, "cpu")
        x = noise * sig[0]
        for i in range(3):
            d = model.guided_denoise(x, sig[i].expand(4), frames, actions, proprio)
            x = d if sig[i + 1] == 0 else x + (x - d) / sig[i] * (sig[i + 1] - sig[i])
    assert len(drawn) == 4
    torch.testing.assert_close(once, x)


def test_proprio_motion_composes_the_chunks_motion_and_learns_across_the_flip():
    """proprio_motion: the head's target is the chunk's motion (no jump where the axis-angle flips
    near pi); a head that outputs exactly that motion gives the real next proprio; it learns."""
    from wmrl.config import ConfigError, override
    from wmrl.worldmodel import rotation

    torch.manual_seed(0)
    cfg = override(TINY.main, proprio_motion=True)
    model = FrameWorldModel(cfg)
    model.set_proprio_stats({"mean": torch.tensor([-0.1, 0.0, 1.1, 0.0, 0.0, 0.0, 0.02, -0.02]),
                             "std": torch.tensor([0.1, 0.1, 0.1, 2.0, 1.0, 0.3, 0.01, 0.01])})
    b = 64
    before = torch.cat([torch.randn(b, 3) * 0.1 + torch.tensor([-0.1, 0.0, 1.1]),
                        torch.tensor([[math.pi - 0.02, 0.0, 0.0]]) + 0.01 * torch.randn(b, 3), torch.full((b, 2), 0.02)], 1)
    actions = torch.rand(b, cfg.action_chunks * cfg.chunk_size, cfg.action_dim) * 2 - 1
    turn = 0.05 * actions[:, -1, 3:6]  # each sample turns by its last action: about half cross the flip
    after = torch.cat([before[:, :3] + 0.02 * actions[:, -1, :3], rotation.turn(before[:, 3:6], turn), before[:, 6:]], 1)
    assert ((after[:, 3:6] - before[:, 3:6]).abs().amax(1) > 3).sum() > 5  # the proprio's own jumps
    norm = model.normalize_proprio
    target = model.motion_target(norm(before), norm(after))
    assert target.abs().max() < 3  # the motion in the head's units: no jump
    with torch.no_grad():  # a head that says exactly the real motion gives the real next proprio
        motion, raw = model.proprio_motion(actions, norm(before))
    model.proprio_motion = lambda a, p: (target, raw)
    torch.testing.assert_close(model.unnormalize_proprio(model.next_proprio(actions, norm(before))), after,
                               atol=2e-4, rtol=0)
    del model.proprio_motion
    opt = torch.optim.Adam(model.proprio_head.parameters(), lr=3e-3)
    first = model.proprio_loss(actions, norm(before), norm(after)).item()
    for _ in range(200):
        opt.zero_grad()
        model.proprio_loss(actions, norm(before), norm(after)).backward()
        opt.step()
    assert model.proprio_loss(actions, norm(before), norm(after)).item() < 0.2 * first
    with pytest.raises(ConfigError, match="proprio_motion"):
        override(TINY.main, proprio_motion=True, proprio_dim=7)


def test_the_proprio_unroll_bench_chains_chunks_of_one_episode_and_starts_as_todays_loss(trajectories):
    """bench/proprio_unroll.py: its windows are runs of consecutive chunks inside one episode; one
    chunk unrolled is the model's own proprio loss, and longer unrolls keep the gradient; the
    open-loop error comes at the horizons wm_eval reports."""

    from wmrl.config import override
    from wmrl.worldmodel.data import proprio_stats

    bench = load_script("bench/proprio_unroll.py")
    cfg = override(TINY.main, proprio_motion=True, action_history=1)
    t = Transitions(_episodes(trajectories[0], "new"), context=cfg.context, action_history=1)
    win = bench.windows(t, 3)
    assert len(win) and len(win) < t.size
    assert (t.previous[win[:, 1]] == win[:, 0]).all() and (t.previous[win[:, 2]] == win[:, 1]).all()
    assert len(bench.windows(t, 1)) == t.size
    torch.manual_seed(0)
    model = FrameWorldModel(cfg)
    model.set_proprio_stats(proprio_stats(t))
    p = model.normalize_proprio(t.proprio.float())
    one = bench.windows(t, 1)[:16]
    idx = one[:, 0]
    want = model.proprio_loss(t.actions_of(idx), p[t.context[idx, -1]], p[t.next[idx]])
    torch.testing.assert_close(bench.unrolled_loss(model, t, one, p), want)
    assert bench.unrolled_loss(model, t, win[:16], p).requires_grad
    ep = _episodes(trajectories[0], "new")[0]
    errors = bench.open_loop_error(model, [ep], 1)
    assert set(errors) <= {"1", "5", "10", "20"} and all(e >= 0 for e in errors.values())


def test_action_history_carries_the_previous_chunks_in_training_keyframes_and_imagination(trajectories):
    """action_history=1: a transition's actions are the previous chunk's (zeros at an episode's
    start), then its own; keyframes store the chunk before them; in imagination the model reads
    the chunk it stepped before (zeros at the start, or the keyframe's). A model with it trains;
    an out-of-range value is refused."""
    from wmrl.config import ConfigError, override
    from wmrl.release.pair import keyframe_tensors
    from wmrl.worldmodel.imagine import Imagination

    episodes = _episodes(trajectories[0], "new")
    t = Transitions(episodes, context=2, action_history=1)
    chunk = TINY.main.chunk_size
    acts = t.actions_of(torch.arange(t.size))
    assert acts.shape == (t.size, 2 * chunk, 7)
    n0 = len(episodes[0].actions)
    assert not acts[0, :chunk].any() and not acts[n0, :chunk].any()  # each episode's first chunk: zeros before
    torch.testing.assert_close(acts[1, :chunk], torch.from_numpy(episodes[0].actions[0]))
    torch.testing.assert_close(acts[1, chunk:], torch.from_numpy(episodes[0].actions[1]))
    torch.testing.assert_close(Transitions(episodes, context=2).actions_of(torch.arange(3)), t.actions[:3])

    kf, info = keyframe_tensors([(episodes[0], 0), (episodes[0], 2)], context=2, action_history=1)
    assert kf["past_actions"].shape == (2, 1, chunk, 7) and info["action_history"] == 1
    assert not kf["past_actions"][0].any()
    torch.testing.assert_close(kf["past_actions"][1, 0], torch.from_numpy(episodes[0].actions[1]))
    assert "past_actions" not in keyframe_tensors([(episodes[0], 2)], context=2)[0]

    torch.manual_seed(0)
    main = FrameWorldModel(override(TINY.main, action_history=1))
    wrist = FrameWorldModel(TINY.wrist)
    stats = proprio_stats(t)
    b = t.batch(torch.arange(6), "main", None, stats)
    loss, _ = main.loss(**b)
    loss.backward()
    assert torch.isfinite(loss) and main.proprio_head[0].weight.grad[:, : chunk * 7].abs().sum() > 0  # the past is read
    main.set_proprio_stats(stats)
    wrist.set_proprio_stats(stats)
    seen = []
    main.act_emb.register_forward_hook(lambda m, args, out: seen.append(args[0][:, : 2 * chunk * 7].clone()))
    world = Imagination(main.eval(), wrist.eval())
    real = {v: torch.stack([_unit(getattr(e, v)[:1]) for e in episodes[:2]]) for v in ("main", "wrist")}
    p0 = torch.stack([torch.from_numpy(e.proprio[0]) for e in episodes[:2]])
    a1, a2 = (torch.stack([torch.from_numpy(e.actions[k]) for e in episodes[:2]]) for k in (0, 1))
    g = torch.Generator().manual_seed(0)
    world.start(real["main"], real["wrist"], p0)
    world.step(a1, generator=g)
    first = len(seen)
    world.step(a2, generator=g)
    assert not seen[0][:, : chunk * 7].any()  # the start: zeros before
    torch.testing.assert_close(seen[first][:, : chunk * 7], a1.flatten(1))
    torch.testing.assert_close(seen[first][:, chunk * 7:], a2.flatten(1))
    seen.clear()
    world.start(real["main"], real["wrist"], p0, past_actions=a2[:, None])  # a keyframe's chunk before
    world.step(a1, generator=g)
    torch.testing.assert_close(seen[0][:, : chunk * 7], a2.flatten(1))
    with pytest.raises(ConfigError, match="action_history"):
        override(TINY.main, action_history=-1)


def test_a_wrist_model_can_see_the_main_frame_of_the_chunks_end_in_training_and_imagination(trajectories):
    """main_at_chunk_end: training gives the wrist model the real main frame at the chunk's end
    (the transition's next frame) instead of its start; imagination gives it the main frame it
    has just imagined for the same chunk. It needs condition_on_main."""
    from wmrl.config import ConfigError, override
    from wmrl.worldmodel.imagine import Imagination
    from wmrl.worldmodel.model import images_to_unit

    episodes = _episodes(trajectories[0], "new")[:2]
    t = Transitions(episodes, context=2, action_history=TINY.wrist.action_history)
    stats, idx = proprio_stats(t), torch.arange(4)
    end_cfg = override(TINY.wrist, main_at_chunk_end=True)
    assert (TINY.main.main_condition, TINY.wrist.main_condition, end_cfg.main_condition) == (None, "start", "end")
    start, end = (t.batch(idx, "wrist", m, stats)["frames"][:, -1] for m in ("start", "end"))
    torch.testing.assert_close(start, images_to_unit(t.main[t.context[idx, -1]]))
    torch.testing.assert_close(end, images_to_unit(t.main[t.next[idx]]))
    with pytest.raises(ValueError, match="'start' or 'end'"):
        t.batch(idx, "wrist", "later", stats)
    with pytest.raises(ConfigError, match="set condition_on_main too"):
        override(TINY.main, main_at_chunk_end=True)

    torch.manual_seed(0)
    main, wrist = FrameWorldModel(TINY.main), FrameWorldModel(end_cfg)
    for m in (main, wrist):
        m.set_proprio_stats(stats)
        m.eval()
    seen, generate = [], wrist.generate
    wrist.generate = lambda frames, *a, **k: (seen.append(frames[:, -1].clone()), generate(frames, *a, **k))[1]
    world = Imagination(main, wrist)
    real = {v: torch.stack([_unit(getattr(e, v)[:1]) for e in episodes]) for v in ("main", "wrist")}
    world.start(real["main"], real["wrist"], torch.stack([torch.from_numpy(e.proprio[0]) for e in episodes]))
    imagined_main, _, _ = world.step(torch.stack([torch.from_numpy(e.actions[0]) for e in episodes]),
                                     generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(seen[0], imagined_main)  # the chunk's end, just imagined
    assert not torch.allclose(seen[0], real["main"][:, 0])
    loss, _ = wrist.loss(**t.batch(idx, "wrist", "end", stats))
    assert torch.isfinite(loss)


def test_keep_drops_ended_rollouts_and_the_others_continue_unchanged(trajectories):
    """Imagination.keep narrows the batch (GRPO drops rollouts that succeeded): the rollouts kept
    get the frames, proprio and action history they would have got in the full batch."""
    from wmrl.worldmodel.imagine import Imagination

    episodes = _episodes(trajectories[0], "new")[:2]
    t = Transitions(episodes, context=2)
    torch.manual_seed(0)
    main, wrist = FrameWorldModel(TINY.main), FrameWorldModel(TINY.wrist)
    for m in (main, wrist):
        m.set_proprio_stats(proprio_stats(t))
        m.eval()
    real = {v: torch.stack([_unit(getattr(e, v)[:1]) for e in episodes]) for v in ("main", "wrist")}
    p0 = torch.stack([torch.from_numpy(e.proprio[0]) for e in episodes])
    acts = [torch.stack([torch.from_numpy(e.actions[k]) for e in episodes]) for k in (0, 1)]
    size = TINY.main.image_size
    noise = [{v: torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(10 * k + i))
              for i, v in enumerate(("main", "wrist"))} for k in (0, 1)]
    full = Imagination(main, wrist)
    full.start(real["main"], real["wrist"], p0)
    full.step(acts[0], noise=noise[0])
    whole = full.step(acts[1], noise=noise[1])
    narrow = Imagination(main, wrist)
    narrow.start(real["main"], real["wrist"], p0)
    narrow.step(acts[0], noise=noise[0])
    narrow.keep(torch.tensor([1]))  # rollout 0 ended after its first chunk
    kept = narrow.step(acts[1][1:], noise={v: n[1:] for v, n in noise[1].items()})
    for a, b in zip(kept, whole):
        assert a.shape[0] == 1
        torch.testing.assert_close(a, b[1:], atol=1e-5, rtol=1e-4)


def _unit(frames):
    from wmrl.worldmodel.model import images_to_unit

    return images_to_unit(torch.from_numpy(frames))


def test_context_noise_corrupts_training_context_only_and_is_told_to_the_model(trajectories):
    """GameNGen's augmentation: the loss sees noised context frames (so it depends on the noise
    draw), the level reaches the conditioning, and generation conditions on clean frames at
    level 0; a model without it has no extra parameters (older weights keep loading)."""
    from wmrl.config import override

    t = _new_transitions(trajectories)
    b = t.batch(torch.arange(4), "main", None, proprio_stats(t))
    plain, noisy = FrameWorldModel(TINY.main), FrameWorldModel(override(TINY.main, context_noise=0.5))
    assert not any("context_noise" in k for k in plain.state_dict())
    assert {k for k in noisy.state_dict()} - {k for k in plain.state_dict()} == {
        f"context_noise_emb.{i}.{w}" for i in (0, 2) for w in ("weight", "bias")}
    x = torch.randn(4, 3, 64, 64)
    sigma = torch.full((4,), 0.5)
    args = (x, sigma, b["frames"], b["actions"], b["proprio"])
    with torch.no_grad():
        for p in noisy.parameters():  # zero-initialised output convolutions would hide the conditioning
            p.add_(0.05 * torch.randn_like(p))
        at_zero, default = noisy.denoise(*args, torch.zeros(4)), noisy.denoise(*args)
        told = noisy.denoise(*args, torch.full((4,), 0.5))
    torch.testing.assert_close(default, at_zero)  # generation's level is 0
    assert not torch.allclose(told, at_zero)  # the level is an input
    losses = []
    for seed in (0, 0, 1):
        torch.manual_seed(seed)
        losses.append(noisy.loss(**b)[0].item())
    assert losses[0] == losses[1] != losses[2]
    g = lambda: torch.Generator().manual_seed(0)  # noqa: E731
    first, _ = noisy.generate(b["frames"], b["actions"], b["proprio"], generator=g())
    again, _ = noisy.generate(b["frames"], b["actions"], b["proprio"], generator=g())
    torch.testing.assert_close(first, again)  # no augmentation at inference


def test_bf16_weights_train_and_generate_without_dtype_errors(trajectories):
    """DeepSpeed's bf16 mode casts the weights; float32 inputs must still work."""
    torch.manual_seed(0)
    model = FrameWorldModel(TINY.wrist).to(torch.bfloat16)
    t = _new_transitions(trajectories)
    b = t.batch(torch.arange(2), "wrist", "start", proprio_stats(t))
    loss, _ = model.loss(**b)
    loss.backward()
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    frame, prop = model.generate(b["frames"], b["actions"], b["proprio"])
    assert frame.dtype == torch.float32 and prop.dtype == torch.float32


def _wm(args, run, env_extra=None, check=True):
    env = child_env(**(env_extra or {}))  # each run takes a free port of its own
    r = subprocess.run([sys.executable, str(REPO / "python" / "wm_update.py"), "--profile", "tiny", "--run", str(run),
                        "--no-progress", *args], capture_output=True, text=True, env=env, timeout=600, cwd=REPO)
    if check:
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


@pytest.fixture(scope="module")
def manifest_run(trajectories, tmp_path_factory):
    base = tmp_path_factory.mktemp("wmrun")
    build_manifest(base / "manifest.json", [str(trajectories[0])], [str(trajectories[1])], seed=0)
    return base


def _clone(src: Path, dst: Path) -> Path:
    dst.mkdir()
    (dst / "manifest.json").write_text((src / "manifest.json").read_text().replace('"path": "', '"path": "../' + src.name + "/"))
    return dst


def test_deepspeed_training_resumes_exactly(manifest_run, tmp_path):
    # half of each batch on the model's own context: its random rows and noise resume too
    straight = _clone(manifest_run, manifest_run.parent / "straight")
    _wm(["--view", "main", "--steps", "6", "--self-context", "0.5"], straight)
    split = _clone(manifest_run, manifest_run.parent / "split")
    _wm(["--view", "main", "--steps", "6", "--stop-after", "3", "--self-context", "0.5"], split)
    status = json.loads((split / "worldmodels/main/status.json").read_text())
    assert status["step"] == 3 and (split / "worldmodels/main/deepspeed/global_step3").is_dir()
    # a byte flipped in the DeepSpeed checkpoint: refused before anything loads, naming the file
    tampered = manifest_run.parent / "tampered"
    shutil.copytree(split, tampered)
    (tampered / "manifest.json").write_text((split / "manifest.json").read_text())
    shard = sorted((tampered / "worldmodels/main/deepspeed/global_step3").rglob("*.pt"))[0]
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 1
    shard.write_bytes(bytes(raw))
    r = _wm(["--view", "main", "--steps", "6", "--self-context", "0.5"], tampered, check=False)
    assert r.returncode == 2 and f"{shard} is missing or changed since it was saved" in r.stderr
    _wm(["--view", "main", "--steps", "6", "--self-context", "0.5"], split)
    from safetensors.torch import load_file

    a = load_file(straight / "worldmodels/main/global_step_6/model.safetensors")
    b = load_file(split / "worldmodels/main/global_step_6/model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=k)
    # training read the proprio statistics it exports (proprio_motion's targets, the wrist warp and
    # the pose maps come from them): the DeepSpeed checkpoint's model holds those, not zeros and ones
    states = torch.load(next((split / "worldmodels/main/deepspeed/global_step3").rglob("mp_rank_00_model_states.pt")),
                        weights_only=False, map_location="cpu")["module"]
    assert not torch.equal(a["proprio_std"], torch.ones_like(a["proprio_std"]))
    for k in ("proprio_mean", "proprio_std"):
        assert states[f"model.{k}"].dtype == torch.float32
        torch.testing.assert_close(states[f"model.{k}"], a[k], rtol=0, atol=0, msg=k)
    log = [json.loads(line) for line in (straight / "logs/wm_main.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in log if "loss" in r]
    assert len(losses) == 6 and all(np.isfinite(losses))
    cfg = json.loads((straight / "worldmodels/main/global_step_6/config.json").read_text())
    assert cfg["step"] == 6 and cfg["model"]["view"] == "main" and len(cfg["manifest_sha256"]) == 64


@pytest.fixture(scope="module")
def updated_run(manifest_run):
    run = _clone(manifest_run, manifest_run.parent / "both")
    r = _wm(["--steps", "4", "--device", "cpu"], run)
    return run, r.stdout


def test_both_views_with_the_stop_rule_write_the_selection(updated_run):
    run, stdout = updated_run
    sel = json.loads((run / "train/selected_world_models.json").read_text())
    assert sel["wrist"]["step"] == 4 and sel["wrist"]["reason"] == "target"
    assert 1 <= sel["main"]["step"] <= 4
    for v in ("main", "wrist"):
        assert (Path(sel[v]["weights"]) / "model.safetensors").is_file()
    assert "wrist reached its target" in stdout
    again = _wm(["--steps", "4", "--device", "cpu"], run)
    assert "finished" in again.stdout  # a finished update is left alone


def test_a_time_limit_stops_the_wrist_model_and_main_follows(manifest_run):
    run = _clone(manifest_run, manifest_run.parent / "timed")
    # --wrist-warp and --refine-patch reach each view's process (the controller passes them on) and its saved config
    r = _wm(["--steps", "1000", "--max-minutes", "0.001", "--device", "cpu", "--wrist-warp", "--refine-patch", "2"], run)
    sel = json.loads((run / "train/selected_world_models.json").read_text())
    assert sel["wrist"]["reason"] == "stop requested" and 1 <= sel["wrist"]["step"] < 1000
    assert json.loads((Path(sel["wrist"]["weights"]) / "config.json").read_text())["model"]["wrist_warp"] is True
    assert all(json.loads((Path(sel[v]["weights"]) / "config.json").read_text())["model"]["refine_patch"] == 2
               for v in ("main", "wrist"))
    assert sel["main"]["reason"] == "stop requested" and sel["time_limit_s"] == pytest.approx(0.06)
    assert "stopped at the time limit" in r.stdout
    assert (Path(sel["wrist"]["weights"]) / "model.safetensors").is_file()
    bad = _wm(["--view", "main", "--max-minutes", "1"], run, check=False)
    assert bad.returncode == 2 and "--stop-after" in bad.stderr
    # MORE=1 trains a finished update further, only with room above where the wrist model stopped
    low = _wm(["--steps", str(sel["wrist"]["step"]), "--more", "--device", "cpu"], run, check=False)
    assert low.returncode == 2 and f"MORE=1 STEPS={2 * sel['wrist']['step']}" in low.stderr
    more = _wm(["--steps", "1000", "--max-minutes", "0.001", "--more", "--device", "cpu", "--wrist-warp",
                "--refine-patch", "2"], run)  # the saved architecture (another is refused: the architecture check)
    assert f"training further from main step {sel['main']['step']}, wrist step {sel['wrist']['step']}" in more.stdout
    after = json.loads((run / "train/selected_world_models.json").read_text())
    assert after["wrist"]["step"] > sel["wrist"]["step"] and after["main"]["step"] > sel["main"]["step"]
    fresh = _wm(["--more"], _clone(manifest_run, manifest_run.parent / "never_updated"), check=False)
    assert fresh.returncode == 2 and "without MORE=1" in fresh.stderr


def _py(script, *args, check=True):
    env = child_env()
    r = subprocess.run([sys.executable, str(REPO / "python" / script), *args], capture_output=True, text=True, env=env,
                       timeout=600, cwd=REPO)
    if check:
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


def test_reward_model_pair_packaging_and_fidelity(updated_run):
    run, _ = updated_run
    bad = _py("wm_reward.py", "--profile", "tiny", "--run", str(run), "--generated-share", "1.5", check=False)
    assert bad.returncode == 2 and "generated_share=1.5" in bad.stderr and not (run / "worldmodels/reward").exists()
    _py("wm_reward.py", "--profile", "tiny", "--run", str(run), "--no-progress", "--control-negatives", "hold,random",
        "--generated-share", "0.5", "--generated-samples", "2")
    reward = json.loads((run / "worldmodels/reward/config.json").read_text())
    assert reward["config"]["generated_share"] == 0.5 and reward["config"]["generated_samples"] == 2
    assert 0 < reward["threshold"] < 1 and reward["train_success_frames"] > 0
    # both controls imagined from every training episode's start, each frame a failure
    assert reward["config"]["control_negatives"] == ["hold", "random"] and reward["train_control_frames"] > 0
    # the updated world models replayed every episode: their frames (real labels) trained the reward,
    # and the threshold was set where GRPO judges when the generated validation frames show both outcomes
    assert reward["train_generated_frames"] > 0 and reward["val_generated_frames"] > 0
    selection = json.loads((run / "train/selected_world_models.json").read_text())
    assert reward["generated_by"] == {v: selection[v]["weights"] for v in ("main", "wrist")}
    assert reward["calibrated_on"] in ("generated episodes", "generated", "real")
    assert reward["val_generated_episodes"]["episodes"] >= 1
    # success-once calibrated on the real validation episodes too (the ceiling's threshold; None
    # where they show one outcome only)
    assert reward["val_real_episodes"]["episodes"] == 1 and "threshold_real" in reward
    # real frames from every phase of the every-step recordings (RewardConfig.all_phases), the
    # generated ones from phase 0: several times as many real frames as imagined ones
    real_frames = reward["train_frames"] - reward["train_generated_frames"]
    assert real_frames >= 2 * reward["train_generated_frames"], reward

    _py("package_pair.py", "--run", str(run))
    pair = json.loads((run / "model_pair/pair.json").read_text())
    assert set(pair["files"]) == {"main", "wrist", "reward", "init_observations"}
    assert pair["init_observations"]["episodes"] == 8  # the training episodes of both sources
    assert "match pair.json" in _py("package_pair.py", "--verify", str(run / "model_pair")).stdout

    _py("wm_eval.py", "--run", str(run), "--videos", "1", "--horizon", "5", "--device", "cpu")
    fid = json.loads((run / "model_pair/fidelity.json").read_text())
    assert fid["pair_json_sha256"] == sha256_file(run / "model_pair/pair.json")  # GRPO's gate reads it for this pair only
    assert "1" in fid["horizons"] and set(fid["horizons"]) <= {"1", "5"}  # (5 if the scored episode is that long)
    for row in fid["horizons"].values():
        assert np.isfinite(row["psnr_main"]) and -1 <= row["ssim_wrist"] <= 1
        assert np.isfinite(row["psnr_wrist_static"]) and -1 <= row["ssim_main_static"] <= 1
        assert np.isfinite(row["eef_error_mm"]) and row["eef_error_mm_static"] >= 0
    assert 0 <= fid["reward"]["accuracy_real"] <= 1 and fid["reward"]["frames"] > 0
    assert Path(fid["videos"][0]).stat().st_size > 0
    # the two validation episodes: one calibrated the reward's threshold, the other is scored
    assert reward["val_generated_episodes"]["episodes"] == 1 and fid["agreement"]["episodes"] == 1
    assert fid["episodes_disjoint_from_reward_calibration"] is True
    assert fid["agreement_on_real_frames"]["episodes"] == 1
    by_rule = fid["agreement_by_success_chunks"]  # GRPO's success_chunks 1-3 on the same replay
    assert set(by_rule) == {"1", "2", "3"} and by_rule["1"] == fid["agreement"]
    assert by_rule["3"]["imagined_successes"] <= by_rule["2"]["imagined_successes"] <= by_rule["1"]["imagined_successes"]
    traces = fid["reward_traces"]  # per scored episode, the reward's probability at every chunk
    assert len(traces["imagined"]) == len(traces["real"]) == len(traces["outcome"]) == 1
    assert len(traces["imagined"][0]) == len(traces["labels"][0]) and traces["imagined"][0][0] is not None
    # one scored episode has one outcome: nothing to rank (None), but both readings are there
    assert set(fid["reward_ranking"]) == {"imagined", "real"}
    assert all(r is None or 0 <= r["auc"] <= 1 for r in fid["reward_ranking"].values())
    for view in ("main", "wrist"):  # does each model read its actions? (None: one transition only)
        r = fid["action_response"][view]
        assert r is None or np.isfinite(r["psnr"]["gain_db"])
    ctl = fid["controls"]  # the controls' imagined success: imagination's false-alarm rate
    assert ctl["keyframes"]["origin"].startswith("keyframes of held-out") and ctl["keyframes"]["count"] >= 1
    for name in ("hold", "random"):
        assert ctl[name]["rollouts"] == 4 * ctl["keyframes"]["count"] and 0 <= ctl[name]["success_rate"] <= 1

    w = run / "model_pair/wrist/model.safetensors"
    data = bytearray(w.read_bytes())
    data[-1] ^= 0xFF
    w.write_bytes(bytes(data))
    bad = _py("package_pair.py", "--verify", str(run / "model_pair"), check=False)
    assert bad.returncode == 2 and "wrist/model.safetensors" in bad.stderr and "SHA-256" in bad.stderr


def test_the_validation_episodes_split_into_a_calibration_and_a_scoring_half():
    """The reward's threshold is chosen on one half and agreement scored on the other: disjoint,
    together all of them, alternating (so both mix sources); one episode cannot be split."""
    from wmrl.worldmodel.data import held_out_halves

    calib, test = held_out_halves(list(range(7)))
    assert calib == [0, 2, 4, 6] and test == [1, 3, 5] and not set(calib) & set(test)
    assert held_out_halves([5]) == ([5], [5]) and held_out_halves([]) == ([], [])


def test_the_threshold_is_calibrated_for_episode_success_not_single_frames():
    """A rare spike in long failed rollouts barely moves a frame-level threshold, but success-once
    over 30 chunks meets it in every failure: the episode-level threshold sits above the spikes."""
    from wmrl.worldmodel.reward import calibrate, calibrate_episodes, episode_outcomes

    probs, labels, episode = [], [], []
    for e in range(2):  # successes: the arm reaches the goal at the last of 3 chunks
        probs += [0.45, 0.9 if e == 0 else 0.45, 0.9]
        labels += [False, False, True] if e == 0 else [False, True, True]
        episode += [e] * 3
    for e in range(2, 6):  # failures: 30 chunks, one spike each
        probs += [0.05] * 29 + [0.5]
        labels += [False] * 30
        episode += [e] * 30
    probs, labels, episode = torch.tensor(probs), torch.tensor(labels), torch.tensor(episode)
    frame_th, frame_bal = calibrate(probs, labels)
    peak, real = episode_outcomes(probs, labels, episode)
    assert frame_bal > 0.9 and bool((peak >= frame_th).all())  # every episode a success: no GRPO signal
    th, bal = calibrate_episodes(peak, real)
    assert bal == 1.0 and 0.5 < th <= 0.9 and ((peak >= th) == real).all()
    assert calibrate_episodes(*episode_outcomes(probs[:6], labels[:6], episode[:6])) is None  # successes only


def test_a_reward_without_episode_skill_says_so_and_names_the_culprit():
    """Measured on the H200 after 3 minutes of world-model training: 1 imagined success of 129
    real ones over 140 episodes. GRPO in that pair skipped every group; the reward says why."""
    from wmrl.worldmodel.reward import no_signal_warning

    meta = {"val_generated_episodes": {"episodes": 140, "real_successes": 129, "imagined_successes": 1,
                                       "balanced_accuracy": 0.504},
            "val_frame_balanced_accuracy": {"real": 0.93, "generated": 0.5}}
    warning = no_signal_warning(meta)
    assert "0.50" in warning and "world models" in warning and "1 imagined" in warning
    meta["val_frame_balanced_accuracy"]["real"] = 0.55
    assert "reward model does not learn" in no_signal_warning(meta)
    meta["val_generated_episodes"]["balanced_accuracy"] = 0.8
    assert no_signal_warning(meta) is None
    assert no_signal_warning({"val_generated_episodes": None}) is None  # no generated episodes: nothing to say


def test_balanced_accuracy_weighs_the_rare_class_equally():
    from wmrl.worldmodel.reward import balanced_accuracy

    labels = torch.tensor([True] + [False] * 9)
    assert balanced_accuracy(torch.zeros(10, dtype=torch.bool), labels) == 0.5  # "never": 90% plain accuracy
    assert balanced_accuracy(labels.clone(), labels) == 1.0
    assert balanced_accuracy(torch.ones(10, dtype=torch.bool), torch.ones(10, dtype=torch.bool)) is None


def test_success_chunks_ignore_a_passing_glimpse_and_confirm_a_late_crossing_in_the_held_chunks():
    """GRPO's success_chunks rule on a constructed replay (success = a marked pixel): a failure
    whose imagined frames show success for one chunk counts at k = 1 only; a success imagined at
    the episode's last chunk is confirmed at k = 2 by the chunk imagined past the end (arm held);
    one that vanishes in that chunk is not; a run must begin within the episode."""
    from wmrl.rl.envs import first_success
    from wmrl.worldmodel.fidelity import episode_agreement, in_a_row

    f, hold = 8, 1  # chunks 0..6 real at most, one held chunk after each episode's end
    imagined = torch.full((4, f, 3, 4, 4), -1.0)
    marks = {0: (3, 4), 1: (2,), 2: (5,), 3: (2, 3)}  # chunks whose imagined frame shows success
    for ep, at in marks.items():
        for t in at:
            imagined[ep, t, :, 0, 0] = 1.0
    ends = {0: 3, 1: 6, 2: 5, 3: 6}  # episodes 0 and 2 succeed and end there; 1 and 3 fail at the horizon
    t = torch.arange(f)[None, :]
    length = torch.tensor([ends[i] for i in range(4)])[:, None]
    valid = t <= length
    success = [torch.zeros(f, dtype=torch.bool) for _ in range(4)]
    success[0][3] = success[2][5] = True
    ended = torch.tensor([True, False, True, False])[:, None]  # 1 and 3 reach the horizon: nothing held after
    roll = {"real": {"main": imagined, "wrist": imagined}, "imagined": {"main": imagined, "wrist": imagined},
            "valid": valid, "imagined_valid": valid | (ended & (t <= length + hold)), "success": success,
            "steps": 6, "hold_chunks": hold, "episodes": 4, "outcome": torch.tensor([True, False, True, False])}

    class Mark:
        cfg = SimpleNamespace(views=("main",))
        inputs = staticmethod(lambda views: views["main"])
        success = staticmethod(lambda frames: frames[:, 0, 0, 0] > 0)

    one = episode_agreement(roll, Mark)
    assert one["confusion"] == {"both_success": 2, "only_real": 0, "only_imagined": 2, "both_failure": 0}
    two = episode_agreement(roll, Mark, success_chunks=2)  # 0 confirmed by its held chunk, 2 lost, 1 dropped
    assert two["confusion"] == {"both_success": 1, "only_real": 1, "only_imagined": 1, "both_failure": 1}
    assert two["success_chunks"] == 2 and two["timing_error_chunks"] == 0.0
    with pytest.raises(ValueError, match="hold_chunks"):
        episode_agreement(roll, Mark, success_chunks=3)
    hit = torch.tensor([[True, True, False, True], [True, True, True, False]])
    assert in_a_row(hit, 2).tolist() == [[True, False, False, False], [True, True, False, False]]
    # the same rule read from one traced rollout (ImaginedEnv's Outcome.reward_trace)
    trace = [0.1, 0.9, 0.2, 0.9, 0.95, float("nan")]
    assert [first_success(trace, 0.86, k) for k in (1, 2, 3)] == [1, 3, None]


def test_static_baseline_is_the_start_frame_held():
    from wmrl.worldmodel.fidelity import metrics

    g = torch.Generator().manual_seed(0)
    real = {v: torch.rand(2, 6, 3, 16, 16, generator=g) * 2 - 1 for v in ("main", "wrist")}
    proprio = torch.zeros(2, 6, 8)
    proprio[:, :, 0] = torch.arange(6) * 0.01  # the end effector moves 1 cm a chunk along x
    imagined = proprio.clone()
    imagined[:, :, 1] += 0.003  # 3 mm off along y
    roll = {"real": real, "imagined": real, "valid": torch.ones(2, 6, dtype=torch.bool), "steps": 5, "episodes": 2,
            "proprio": {"real": proprio, "imagined": imagined}}
    row = metrics(roll)["horizons"]["5"]
    assert row["ssim_main"] == 1.0 and row["psnr_main"] > 90  # a perfect model
    assert row["psnr_main_static"] < 15 and row["ssim_wrist_static"] < 0.5  # unrelated noise frames
    assert row["eef_error_mm"] == 3.0 and row["eef_error_mm_static"] == 50.0


def test_more_replays_and_a_generated_share_put_more_of_the_pair_s_frames_in_the_reward_s_batches(updated_run):
    """RewardConfig.generated_samples: each training episode replayed K times, the first replay
    the one a single replay gives (same noise), the others with their own; generated_share: that
    share of each label's draws from the pair's frames, and at 0 the draws of before, bit for bit."""

    from wmrl.config import ConfigError, override
    from wmrl.worldmodel.data import held_out_halves, load_split
    from wmrl.worldmodel.reward import draw, real_and_generated

    run, _ = updated_run
    wm_reward = load_script("python/wm_reward.py")
    cfg = override(get_profile("tiny").reward, generated_horizon=3)
    _, train, val = load_split(run / "manifest.json", TINY.main.chunk_size)
    train, val = [e for e in train if e.phase == 0][:2], held_out_halves(val)[0]
    once = wm_reward.imagine(str(run), cfg, train, val, {})
    twice = wm_reward.imagine(str(run), override(cfg, generated_samples=2), train, val, {})
    n = len(once["train"][0])
    assert n > 0 and len(twice["train"][0]) == 2 * n and torch.equal(twice["train"][1][n:], once["train"][1])
    assert torch.equal(twice["train"][0][:n], once["train"][0])  # the first replay: the same noise
    assert not torch.equal(twice["train"][0][n:], once["train"][0])  # the second: its own
    assert torch.equal(twice["val"][0], once["val"][0])  # the calibration's replays: once, as before

    idx = torch.arange(10)  # frames 0-5 real, 6-9 the pair's
    real, gen = real_and_generated(idx, 6)
    assert real.tolist() == [0, 1, 2, 3, 4, 5] and gen.tolist() == [6, 7, 8, 9]
    g0, g1 = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    assert torch.equal(draw(idx, real, gen, 32, 0.0, g0), idx[torch.randint(10, (32,), generator=g1)])  # as before
    half = draw(idx, real, gen, 32, 0.5, g0)
    assert (half >= 6).sum() == 16 and (half < 6).sum() == 16
    assert draw(real, real, idx[:0], 8, 0.5, g0).lt(6).all()  # no generated frames of this label: every frame alike
    for bad in ({"generated_share": 1.0}, {"generated_share": -0.1}, {"generated_samples": 0}):
        with pytest.raises(ConfigError, match="generated_"):
            override(cfg, **bad)


def test_episode_agreement_of_a_copying_pair_and_of_a_reward_that_always_says_fail():
    """Constructed cases with known answers: imagined frames that copy the real ones, judged by a
    reward that reads the success mark, agree with the simulator on every episode (1.0, timing 0);
    a reward that never says success scores 0.5 balanced."""
    from wmrl.worldmodel.fidelity import episode_agreement, reward_traces

    real = torch.full((4, 7, 3, 8, 8), -1.0)
    success = [torch.zeros(7, dtype=torch.bool) for _ in range(4)]
    valid = torch.ones(4, 7, dtype=torch.bool)
    for ep, at in ((0, 3), (2, 5)):  # episodes 0 and 2 succeed (and end) there; 1 and 3 fail
        real[ep, at, :, 0, 0] = 1.0  # the mark a success frame carries
        success[ep][at] = True
        valid[ep, at + 1:] = False

    class Mark:  # success = the marked pixel of the main view
        cfg = SimpleNamespace(views=("main",))

        @staticmethod
        def inputs(views):
            return views["main"]

        @staticmethod
        def success(frames):
            return frames[:, 0, 0, 0] > 0

    roll = {"real": {"main": real, "wrist": real}, "imagined": {"main": real.clone(), "wrist": real}, "valid": valid,
            "success": success, "steps": 6, "episodes": 4}
    a = episode_agreement(roll, Mark)
    assert a["balanced_accuracy"] == 1.0 and a["timing_error_chunks"] == 0.0 and a["real_successes"] == 2
    assert a["confusion"] == {"both_success": 2, "only_real": 0, "only_imagined": 0, "both_failure": 2}
    assert a["grpo_signal_share"] == 1.0  # GRPO in it would follow the simulator's whole signal

    class Never(Mark):
        @staticmethod
        def success(frames):
            return torch.zeros(len(frames), dtype=torch.bool)

    b = episode_agreement(roll, Never)
    assert b["balanced_accuracy"] == 0.5 and b["accuracy"] == 0.5 and b["timing_error_chunks"] is None
    assert b["grpo_signal_share"] == 0.0  # and none of it
    late = {**roll, "imagined": {"main": real.roll(1, dims=1), "wrist": real}}  # success imagined one chunk late
    late["valid"] = torch.ones(4, 7, dtype=torch.bool)
    assert episode_agreement(late, Mark)["timing_error_chunks"] == 1.0
    assert episode_agreement(late, Mark, frames="real")["timing_error_chunks"] == 0.0  # the reward's ceiling

    class Strict(Mark):  # its own threshold (set on blurred imagined frames) is too high for sharp real ones
        def __call__(self, frames):
            return frames[:, 0, 0, 0] * 5  # logit +5 on the mark, -5 elsewhere

        @staticmethod
        def success(frames):
            return torch.zeros(len(frames), dtype=torch.bool)

    assert episode_agreement(roll, Strict(), frames="real")["balanced_accuracy"] == 0.5
    ceiling = episode_agreement(roll, Strict(), frames="real", threshold=0.5)  # wm-eval passes threshold_real
    assert ceiling["balanced_accuracy"] == 1.0 and ceiling["timing_error_chunks"] == 0.0
    traces = reward_traces(roll, Strict())  # the raw probabilities behind both verdicts, per chunk
    assert traces["outcome"] == [True, False, True, False] and traces["labels"][0][3] and not traces["labels"][1][3]
    assert traces["real"][0][3] > 0.99 and traces["real"][0][2] < 0.01 and traces["real"][0][4] is None  # ended at 3
    assert traces["imagined"] == traces["real"] and all(len(t) == 7 for t in traces["real"])

    # the simulator's verdict is the truth: episode 3 succeeded with the goal held only inside a
    # chunk (no success frame), so even the copying pair misses it, and the report says why
    sim = {**roll, "outcome": torch.tensor([True, False, True, True])}
    c = episode_agreement(sim, Mark)
    assert c["real_successes"] == 3 and c["successes_without_success_frame"] == 1
    assert c["confusion"]["only_real"] == 1 and abs(c["balanced_accuracy"] - (2 / 3 + 1) / 2) < 1e-4
    assert c["timing_error_chunks"] == 0.0  # timed only where a success frame exists


def test_peak_ranking_separates_the_reward_s_ranking_from_its_threshold(tmp_path):
    """Constructed traces with known answers: a reward whose peaks put every success above every
    failure ranks perfectly (AUC 1) even where its calibrated threshold misjudges the episodes;
    reversed peaks score AUC 0; the held chunks past an episode's end and its start are not
    counted; with one outcome only there is nothing to rank. bench/reward_ranking.py prints the
    same for a fidelity.json."""
    import importlib.util

    from wmrl.worldmodel.fidelity import episode_peaks_from_traces, peak_ranking

    # per episode: the start (never judged), chunks within the episode, then held chunks (real None)
    traces = {"imagined": [[0.99, 0.2, 0.7, 0.99], [0.99, 0.1, 0.4, 0.99], [0.0, 0.6, None, None], [0.0, 0.3, 0.35, None]],
              "real": [[0.0, 0.0, 1.0, None], [0.0, 0.0, 0.0, None], [0.0, 1.0, None, None], [0.0, 0.0, 0.0, None]],
              "outcome": [True, False, True, False]}
    assert episode_peaks_from_traces(traces).tolist() == pytest.approx([0.7, 0.4, 0.6, 0.35])  # start and held left out
    r = peak_ranking(traces)
    assert r["auc"] == 1.0 and r["best_balanced_accuracy"] == 1.0 and 0.4 < r["best_threshold"] <= 0.6
    assert r["episodes"] == 4 and r["real_successes"] == 2
    assert peak_ranking({**traces, "outcome": [False, True, False, True]})["auc"] == 0.0
    tie = {**traces, "imagined": [[0.0, 0.5], [0.0, 0.5], [0.0, 0.5], [0.0, 0.5]], "real": [[0.0, 0.0]] * 4}
    assert peak_ranking(tie)["auc"] == 0.5  # no order at all: chance
    assert peak_ranking({**traces, "outcome": [True] * 4}) is None
    assert peak_ranking(traces, "real")["auc"] == 1.0

    f = tmp_path / "model_pair" / "fidelity.json"
    f.parent.mkdir()
    f.write_text(json.dumps({"agreement": {"episodes": 4, "real_successes": 2, "balanced_accuracy": 0.75},
                             "reward_traces": traces}))
    bench = load_script("bench/reward_ranking.py")
    # the middle of the tied 0.41-0.60; a threshold calibrated on any half with both outcomes also
    # separates the other half here (every success above every failure)
    assert bench.row(f)[3:7] == ["0.75", "1.00", "1.00 at 0.51", "1.00"]
    assert bench.split_half({**traces, "outcome": [False, True, False, True]}) < 0.5  # reversed: below chance
    bench.main([str(f), "--plot", str(tmp_path / "roc.png"), "--labels", "tiny"])  # the table, then the curves
    # the world-model environment may lack matplotlib: then the figure is skipped, never the table
    assert (tmp_path / "roc.png").exists() == (importlib.util.find_spec("matplotlib") is not None)
    with pytest.raises(SystemExit, match="--labels names 2 pairs, 1 files"):
        bench.main([str(f), "--plot", str(tmp_path / "roc2.png"), "--labels", "a,b"])
    # two rewards of the same replays averaged chunk by chunk (an ensemble); other episodes refused
    g = tmp_path / "other.json"
    flipped = {**traces, "imagined": [[None if x is None else 1 - x for x in e] for e in traces["imagined"]]}
    g.write_text(json.dumps({"agreement": {}, "reward_traces": flipped}))
    mean = bench.mean_of([f, g])["reward_traces"]
    assert mean["imagined"][0] == [0.5, 0.5, 0.5, 0.5] and mean["imagined"][2][2] is None
    assert bench.row(f, bench.mean_of([f, f]), "twice")[:5] == ["twice", "4", "2", "-", "1.00"]
    g.write_text(json.dumps({"agreement": {}, "reward_traces": {**traces, "outcome": [True] * 4}}))
    with pytest.raises(SystemExit, match="did not score the same episodes"):
        bench.mean_of([f, g])
    one = {k: v[:1] for k, v in traces.items()}
    assert bench.split_half(one) is None and bench.row(f)[6] == "1.00"  # one episode: no halves to compare
    with pytest.raises(SystemExit, match="no reward_traces"):
        f.write_text(json.dumps({"agreement": {}}))
        bench.row(f)


def test_simulator_outcomes_and_episode_peaks_use_the_recorded_verdict():
    from wmrl.worldmodel.data import Episode
    from wmrl.worldmodel.reward import episode_peaks, simulator_outcomes

    def ep(success, outcome):
        n = len(success)
        return Episode(main=np.zeros((n, 4, 4, 3), np.uint8), wrist=np.zeros((n, 4, 4, 3), np.uint8),
                       proprio=np.zeros((n, 8), np.float32), actions=np.zeros((n - 1, 8, 7), np.float32),
                       success=np.array(success), source="new", key="k", outcome=outcome)

    eps = [ep([False, True], True), ep([False, False], True), ep([False, False], None), ep([False, True], None)]
    assert simulator_outcomes(eps).tolist() == [True, True, False, True]
    probs = torch.tensor([0.0, 0.9, 0.0, 0.2, 0.0, 0.1, 0.0, 0.8])
    labels = torch.tensor([bool(x) for e in eps for x in e.success])
    index = torch.arange(4).repeat_interleave(2)
    peak, real = episode_peaks(probs, labels, index)
    assert real.tolist() == [True, False, False, True] and torch.allclose(peak, torch.tensor([0.9, 0.2, 0.1, 0.8]))
    assert episode_peaks(probs, labels, index, simulator_outcomes(eps))[1].tolist() == [True, True, False, True]


def test_action_response_is_zero_exactly_for_a_model_blind_to_its_actions(trajectories):
    """The diagnostic behind a blurred, unmoved arm: a model whose conditioning reads the
    actions predicts another frame from another transition's chunk (same noise); with the
    actions' weights zeroed, the real chunk and the other give the same frame: gain 0 dB."""
    from wmrl.worldmodel.fidelity import action_response

    torch.manual_seed(0)
    episodes = _episodes(trajectories[0], "new")
    for cfg in (TINY.main, TINY.wrist):
        model = FrameWorldModel(cfg).eval()
        with torch.no_grad():  # the output layers start at zero, where the model ignores everything
            for w in model.parameters():
                if not w.abs().sum():
                    w.normal_(0, 0.05)
            model.act_emb[0].weight.mul_(3)
        seeing = action_response(model, episodes, seed=3)
        assert seeing["transitions"] >= 2 and 0 < seeing["moving_fraction"] < 0.2
        assert seeing["psnr_moving"]["true"] != seeing["psnr_moving"]["other"]
        with torch.no_grad():
            model.act_emb[0].weight[:, : cfg.action_chunks * cfg.chunk_size * cfg.action_dim] = 0  # proprio still conditions
        blind = action_response(model, episodes, seed=3)
        assert blind["psnr"]["gain_db"] == 0 and blind["psnr_moving"]["gain_db"] == 0
        assert blind["psnr"]["held"] == seeing["psnr"]["held"]  # the baseline does not depend on the model
    assert action_response(model, [_one_transition(episodes[0])]) is None  # nothing to swap with


def _one_transition(ep):
    from dataclasses import replace

    return replace(ep, main=ep.main[:2], wrist=ep.wrist[:2], proprio=ep.proprio[:2], actions=ep.actions[:1],
                   success=ep.success[:2])


def test_psnr_and_ssim_of_identical_and_noisy_images():
    from wmrl.worldmodel.fidelity import psnr, ssim

    g = torch.Generator().manual_seed(0)
    x = torch.rand(2, 3, 32, 32, generator=g) * 2 - 1
    noisy = (x + 0.2 * torch.randn(x.shape, generator=g)).clamp(-1, 1)
    noisier = (x + 0.6 * torch.randn(x.shape, generator=g)).clamp(-1, 1)
    assert torch.allclose(ssim(x, x), torch.ones(2))
    # uniform noise in [0, 1] (variance 1/12) plus noise of std 0.1: SSIM ~ 2 * 0.083 / (0.083 + 0.093)
    assert 0.9 < float(ssim(x, noisy).mean()) < 0.97 and float(ssim(x, noisier).mean()) < 0.7
    assert float(psnr(x, noisy).mean()) < float(psnr(x, (x + 0.01).clamp(-1, 1)).mean())


def test_missing_manifest_is_a_one_line_error(tmp_path):
    r = _wm(["--view", "main"], tmp_path, check=False)
    assert r.returncode == 2 and "make manifest" in r.stderr and "Traceback" not in r.stderr


def test_inconsistent_deepspeed_batch_sizes_and_world_size_changes_are_refused(tmp_path):
    from wmrl.worldmodel.train import WMConfigError, check_resume, ds_config

    t = TINY.train
    bad = tmp_path / "ds.json"
    bad.write_text(json.dumps({"train_batch_size": 7, "zero_optimization": {"stage": 0}}))
    with pytest.raises(WMConfigError, match="train_batch_size=7 but micro batch 4 x accumulation 2 x 1"):
        ds_config(bad, t, on_gpu=False, world=1)
    cfg = ds_config("data/worldmodel/ds_cpu.json", t, on_gpu=False, world=2)
    assert cfg["train_batch_size"] == 4 * 2 * 2 and cfg["gradient_accumulation_steps"] == 2
    with pytest.raises(WMConfigError, match="bf16"):
        ds_config("data/worldmodel/ds_gpu.json", t, on_gpu=False, world=1)
    state = tmp_path / "wmrl_state.json"
    state.write_text(json.dumps({"world_size": 4, "step": 10}))
    check_resume(state, 4, TINY.main)
    with pytest.raises(WMConfigError, match="saved by 4 process"):
        check_resume(state, 2, TINY.main)
    # a checkpoint of another architecture (the default changed since it was saved): refused
    # before DeepSpeed loads it, naming what differs
    from dataclasses import asdict

    from wmrl.config import override

    state.write_text(json.dumps({"world_size": 1, "step": 10, "model": asdict(TINY.main)}))
    check_resume(state, 1, TINY.main)
    with pytest.raises(WMConfigError, match=r"another architecture \(patch 1 -> 2\).*use a new RUN"):
        check_resume(state, 1, override(TINY.main, patch=2))
    # a record written before a field existed resumes if the field keeps its default, not otherwise
    older = {k: v for k, v in asdict(TINY.main).items() if k != "motion_weight"}
    state.write_text(json.dumps({"world_size": 1, "step": 10, "model": older}))
    check_resume(state, 1, TINY.main)
    with pytest.raises(WMConfigError, match=r"motion_weight 0.0 -> 4.0"):
        check_resume(state, 1, override(TINY.main, motion_weight=4.0))


def test_a_trajectory_file_failing_validation_stops_training_before_it_starts(trajectories, tmp_path):
    import h5py

    broken = tmp_path / "broken.hdf5"
    broken.write_bytes(Path(trajectories[0]).read_bytes())
    with h5py.File(broken, "a") as h:
        del h["data/demo_1/rewards"]
    build_manifest(tmp_path / "manifest.json", [str(broken)], [], seed=0)
    r = _wm(["--view", "main"], tmp_path, check=False)
    assert r.returncode == 2 and "fails validation" in r.stderr and "Traceback" not in r.stderr


def test_gpu_groups_and_launch_commands():
    from wmrl.config import ConfigError
    from wmrl.worldmodel.update import ViewLaunch, gpu_groups

    assert gpu_groups(0, None, None) == ([], [])
    assert gpu_groups(8, None, None) == ([0, 1, 2, 3], [4, 5, 6, 7])  # the seed's four and four
    assert gpu_groups(2, "0", "0") == ([0], [0])  # one GPU shared on purpose
    assert gpu_groups(1, None, None) == ([0], [0])  # a one-GPU machine shares it (make speedrun)
    for bad in ((8, "0,1", None), (2, "0", "5"), (2, "a", "1")):
        with pytest.raises(ConfigError):
            gpu_groups(*bad)
    cpu = ViewLaunch("wrist", [], 29601, ["--run", "r"], "wm_update.py").command()
    assert cpu[-2:] == ["--device", "cpu"] and "--view" in cpu and "deepspeed.launcher.runner" not in cpu
    gpu = ViewLaunch("main", [4, 5], 29600, script="wm_update.py").command()
    assert gpu[gpu.index("--include") + 1] == "localhost:4,5" and gpu[-2:] == ["--device", "cuda"]
    hosts = ViewLaunch("main", [0], 29600, script="wm_update.py").command(hostfile="hosts.txt")
    assert hosts[hosts.index("--hostfile") + 1] == "hosts.txt" and "--include" not in hosts
    assert ViewLaunch("wrist", [], 29601).env()["DS_ACCELERATOR"] == "cpu"


def test_two_processes_train_one_view_and_a_resume_needs_the_same_world_size(manifest_run):
    """torchrun with 2 CPU processes (gloo): RNG of every rank in the client state, the STOP
    flag reduced over ranks; resuming that checkpoint with 1 process is refused."""
    run = _clone(manifest_run, manifest_run.parent / "two")
    env = child_env()
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                        str(REPO / "python" / "wm_update.py"), "--view", "main", "--profile", "tiny", "--run-dir", str(run),
                        "--steps", "3", "--device", "cpu", "--no-progress"], capture_output=True, text=True, env=env,
                       timeout=600, cwd=REPO)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.count("[wm main] step 3") == 1  # rank 0 reports
    state = json.loads((run / "worldmodels/main/deepspeed/wmrl_state.json").read_text())
    files, model = state.pop("files"), state.pop("model")
    assert state == {"step": 3, "world_size": 2, "tag": "global_step3"} and model["view"] == "main"
    assert files and all(k.startswith("global_step3/") and len(v) == 64 for k, v in files.items())  # every shard hashed
    again = _wm(["--view", "main", "--steps", "6"], run, check=False)
    assert again.returncode == 2 and "saved by 2 process(es), this run has 1" in again.stderr


def test_a_failed_view_is_reported_with_its_own_reason(tmp_path):
    from wmrl.worldmodel.update import failure

    log = tmp_path / "wm_wrist.out"
    log.write_text("[wm wrist] loading\nTraceback ...\nerror: runs/a/worldmodels/wrist/deepspeed was trained on another "
                   "manifest; use a new RUN or remove that folder\n")
    msg = failure("wrist", 2, str(log))
    assert msg == ("the wrist-view training failed (exit 2): runs/a/worldmodels/wrist/deepspeed was trained on another "
                   f"manifest; use a new RUN or remove that folder; full log {log}")


def test_the_reward_reads_its_views_side_by_side():
    """RewardConfig.views: the cameras concatenated along the width, in the configured order,
    for imagined frames (B, 3, H, W) and for the real uint8 frames it trains on; bad view
    lists are refused with the fix."""
    from wmrl.config import ConfigError, get_config, override
    from wmrl.worldmodel.reward import RewardModel, episode_frames

    r = RewardModel(get_config("reward_tiny"))
    assert get_config("reward_tiny").views == ("main", "wrist")
    main, wrist = torch.zeros(2, 3, 64, 64), torch.ones(2, 3, 64, 64)
    x = r.inputs({"main": main, "wrist": wrist})
    assert x.shape == (2, 3, 64, 128) and bool(x[..., :64].eq(0).all()) and bool(x[..., 64:].eq(1).all())
    assert r(x).shape == (2,)
    wrist_only = RewardModel(override(get_config("reward_tiny"), views=("wrist",)))
    assert torch.equal(wrist_only.inputs({"main": main, "wrist": wrist}), wrist)
    ep = SimpleNamespace(main=np.zeros((3, 64, 64, 3), np.uint8), wrist=np.full((3, 64, 64, 3), 255, np.uint8),
                         success=np.array([False, False, True]))
    frames, labels = episode_frames([ep, ep], ("main", "wrist"))
    assert frames.shape == (6, 64, 128, 3) and bool(frames[:, :, 64:].eq(255).all()) and bool(frames[:, :, :64].eq(0).all())
    assert labels.tolist() == [False, False, True] * 2
    for bad in ((), ("main", "main"), ("side",)):
        with pytest.raises(ConfigError, match="reward.views"):
            override(get_config("reward_tiny"), views=bad)


def test_random_shift_moves_each_view_apart_and_keeps_its_content():
    """RewardConfig.shift (a fraction of the side, as pixels here): every sample's view is a window
    of that view, edges repeated, moved by at most ``pad`` pixels; the two views never mix at the seam; 0 leaves frames alone."""
    from wmrl.config import ConfigError, get_config, override
    from wmrl.worldmodel.reward import random_shift

    g = torch.Generator().manual_seed(0)
    main, wrist = torch.rand(16, 3, 8, 8), torch.rand(16, 3, 8, 8) + 2.0  # wrist values all above main's
    x = torch.cat([main, wrist], dim=-1)
    assert torch.equal(random_shift(x, 0, 2, g), x)
    y = random_shift(x, 2, 2, g)
    assert y.shape == x.shape and bool((y[..., :8] < 1.0).all()) and bool((y[..., 8:] >= 2.0).all())
    moved = 0
    for i in range(16):
        for v, src in ((0, main[i]), (1, wrist[i])):
            padded = torch.nn.functional.pad(src[None], (2, 2, 2, 2), mode="replicate")[0]
            window = y[i, :, :, 8 * v:8 * (v + 1)]
            hits = [(dy, dx) for dy in range(5) for dx in range(5) if torch.equal(padded[:, dy:dy + 8, dx:dx + 8], window)]
            assert hits, (i, v)
            moved += hits[0] != (2, 2)
    assert moved > 16  # most views moved
    for bad in (-0.1, 0.5):
        with pytest.raises(ConfigError, match="reward.shift"):
            override(get_config("reward_tiny"), shift=bad)


def test_controller_hands_switches_to_each_view_as_switches(tmp_path):
    """`--compile` reaches each view's process as `--compile`, not `--compile True` (which its
    parser refuses: the H200 update failed that way), and numbers keep their values."""
    import argparse

    script = load_script("python/wm_update.py")
    args = argparse.Namespace(profile="tiny", run=str(tmp_path), manifest=None, ds_config=None, init_pair=None,
                              no_progress=True, compile=True, all_phases=False, steps=7, self_context=0.25)
    out = script._passthrough(args)
    assert "--compile" in out and "--no-all-phases" in out and "True" not in out and "False" not in out
    assert out[out.index("--steps") + 1] == "7" and out[out.index("--self-context") + 1] == "0.25"
    assert "--action-dropout" not in out  # the profile's unless given
    guided = script._passthrough(argparse.Namespace(**vars(args), action_dropout=0.1, action_guidance=2.0))
    assert guided[guided.index("--action-dropout") + 1] == "0.1" and guided[guided.index("--action-guidance") + 1] == "2.0"
    assert "--wrist-main-at-end" in script._passthrough(argparse.Namespace(**vars(args), wrist_main_at_end=True))
    (tmp_path / "manifest.json").write_text("{}")
    for flags, end in (([], False), (["--wrist-main-at-end"], True)):
        _, prof, _, _ = script.build(["--profile", "tiny", "--run", str(tmp_path), "--view", "wrist", *flags])
        assert prof.wrist.main_at_chunk_end is end and prof.main.main_condition is None


def test_control_rollouts_are_failures_of_the_full_horizon():
    """The reward's control negatives: only starts where the goal does not hold, the control's
    actions for the whole horizon (zero for hold, uniform for random), every frame a failure."""
    import torch
    from wmrl.config import ConfigError, RewardConfig
    from wmrl.worldmodel.data import Episode
    from wmrl.worldmodel.reward import control_episodes, control_frames

    def episode(success_at_start: bool) -> Episode:
        n, px = 3, TINY.main.image_size
        img = np.full((n, px, px, 3), 120, np.uint8)
        success = np.array([success_at_start, False, True])
        return Episode(main=img, wrist=img, proprio=np.zeros((n, 8), np.float32),
                       actions=np.full((n - 1, 8, 7), 0.3, np.float32), success=success, source="new", key="f:demo_0")

    eps = [episode(False), episode(True)]
    rng = np.random.default_rng(0)
    hold, rand = control_episodes(eps, 5, "hold", rng), control_episodes(eps, 5, "random", rng)
    assert len(hold) == len(rand) == 1  # the episode whose goal holds at its start is no control's start
    assert hold[0].actions.shape == (5, 8, 7) and not hold[0].actions.any()
    assert np.abs(rand[0].actions).max() <= 1 and rand[0].actions.std() > 0.4
    assert not hold[0].success.any() and hold[0].outcome is False and eps[0].actions.max() == np.float32(0.3)

    torch.manual_seed(0)
    main_m, wrist_m = FrameWorldModel(TINY.main).eval(), FrameWorldModel(TINY.wrist).eval()
    main_m.set_proprio_stats({"mean": torch.zeros(8), "std": torch.ones(8)})
    wrist_m.set_proprio_stats({"mean": torch.zeros(8), "std": torch.ones(8)})
    frames, labels, index = control_frames(main_m, wrist_m, eps, 4, controls=("hold", "random"), views=("main", "wrist"))
    assert frames.shape == (2 * 4, TINY.main.image_size, 2 * TINY.main.image_size, 3)  # 4 imagined frames per control
    assert frames.dtype == torch.uint8 and not labels.any() and len(index) == len(frames)
    with pytest.raises(ConfigError, match="control_negatives"):
        RewardConfig(control_negatives=("hold", "fly"))
    with pytest.raises(ConfigError, match="each once"):
        RewardConfig(control_negatives=("hold", "hold"))


def test_the_agreement_interval_is_wide_on_few_episodes_and_closes_at_perfect_agreement():
    from wmrl.worldmodel.fidelity import balanced_accuracy_interval

    truth = torch.tensor([True] * 4 + [False] * 12)
    assert balanced_accuracy_interval(truth, truth) == [1.0, 1.0]
    pred = truth.clone()
    pred[4:7] = True  # three failures imagined as successes: 0.875, as the H200 cycle's pair
    lo, hi = balanced_accuracy_interval(pred, truth)
    assert lo < 0.8 < 0.875 < hi == 1.0  # 16 episodes cannot tell 0.875 from 0.85
    wide = balanced_accuracy_interval(pred.repeat(10), truth.repeat(10))  # ten times the episodes
    assert lo < wide[0] < 0.875 < wide[1] < hi
    assert balanced_accuracy_interval(truth, torch.ones(16, dtype=torch.bool)) is None  # one kind only


def test_wrist_warp_keeps_a_still_camera_and_moves_the_table_with_the_arm():
    """``camera.wrist_warp`` (the live simulator check is in tests/sim): the same pose gives the same
    frame; the camera lowered toward the table magnifies it about the centre, the gripper's rows kept."""
    from wmrl.worldmodel import camera

    g = torch.Generator().manual_seed(0)
    frames = torch.rand(1, 3, 32, 32, generator=g) * 2 - 1
    pose = torch.tensor([[0.0, 0.0, 1.2, 3.14159265, 0.0, 0.0, 0.02, -0.02]])  # fingers down (axis-angle pi about x)
    torch.testing.assert_close(camera.wrist_warp(frames, pose, pose), frames, atol=1e-5, rtol=0)
    lower = pose.clone()
    lower[0, 2] = 1.0
    warped = camera.wrist_warp(frames, pose, lower)
    keep = 32 - round(camera.WRIST_GRIPPER_ROWS * 32)
    assert torch.equal(warped[..., keep:, :], frames[..., keep:, :])
    assert (warped[..., :keep, :] - frames[..., :keep, :]).abs().mean() > 0.1
    # a zoom: a frame that is smooth in space stays smooth, and its centre value stays near the centre
    ramp = torch.linspace(-1, 1, 32).view(1, 1, 1, 32).expand(1, 3, 32, 32).contiguous()
    zoomed = camera.wrist_warp(ramp, pose, lower)
    assert zoomed[0, 0, 8, -1] < ramp[0, 0, 8, -1] and zoomed[0, 0, 8, 0] > ramp[0, 0, 8, 0]


def test_wrist_warp_bench_reads_recorded_episodes_and_refuses_bad_planes(trajectories, tmp_path):
    """bench/wrist_warp.py: held and warped PSNR per folder, the strip, one-line errors."""

    from wmrl.config import ConfigError

    bench = load_script("bench/wrist_warp.py")
    out = bench.main(["--data", str(trajectories[0].parent), "--episodes", "3", "--planes", "0.9,0.95",
                      "--strip", str(tmp_path / "s.png"), "--json", str(tmp_path / "w.json")])
    row = out["rows"][0]
    assert row["episodes"] == 3 and row["chunks"] > 3
    assert all(np.isfinite(row[k]) for k in ("held_db", "warp_0.9_db", "warp_0.95_above_gripper_db"))
    assert (tmp_path / "s.png").stat().st_size > 0 and json.loads((tmp_path / "w.json").read_text())["planes"] == [0.9, 0.95]
    with pytest.raises(ConfigError, match="--planes"):
        bench.main(["--data", str(trajectories[0].parent), "--planes", "table"])
    with pytest.raises(ConfigError, match="no .hdf5 files"):
        bench.main(["--data", str(tmp_path)])


def test_proprio_head_bench_trains_both_heads_and_refuses_bad_input(trajectories, tmp_path):
    """bench/proprio_head.py: both heads per seed, one chunk and open loop errors, one-line errors."""

    from wmrl.config import ConfigError

    bench = load_script("bench/proprio_head.py")
    out = bench.main(["--data", str(trajectories[0].parent), "--steps", "20", "--batch", "16",
                      "--json", str(tmp_path / "p.json")])
    assert [r["head"] for r in out["rows"]] == ["residual", "motion"]
    for r in out["rows"]:
        assert np.isfinite(r["one_chunk"]["position_mm"]) and r["one_chunk"]["orientation_deg"] >= 0
        assert set(r["open_loop"]) <= {"1", "5", "10"} and "1" in r["open_loop"]
    assert json.loads((tmp_path / "p.json").read_text())["steps"] == 20
    with pytest.raises(ConfigError, match="--seeds"):
        bench.main(["--data", str(trajectories[0].parent), "--seeds", "a"])
    with pytest.raises(ConfigError, match="no .hdf5 files"):
        bench.main(["--data", str(tmp_path)])
