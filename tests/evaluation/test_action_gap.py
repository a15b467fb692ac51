"""The policy's actions on imagined against real frames (wmrl.evaluation.action_gap) and its bench script."""

import json
from pathlib import Path

import pytest
from wmrl.config import ConfigError
from wmrl.evaluation.action_gap import action_gap, table

from tests.helpers import load_script
from tests.rl.conftest import pair_run, sft_run  # noqa: F401  (fixtures)


def _episodes_and_roll(run: Path):
    from wmrl.layout import RunLayout
    from wmrl.release.pair import load_pair
    from wmrl.worldmodel.data import load_split
    from wmrl.worldmodel.fidelity import open_loop
    from wmrl.worldmodel.model import FrameWorldModel

    pair = load_pair(RunLayout(run).model_pair)
    main, wrist = (FrameWorldModel.from_pretrained(pair.part(v)) for v in ("main", "wrist"))
    _, train, val = load_split(RunLayout(run).manifest, main.cfg.chunk_size)
    episodes = (train + val)[:3]
    return episodes, open_loop(main, wrist, episodes, horizon=2, seed=0)


def test_frames_that_copy_the_real_ones_leave_no_gap_and_the_held_start_does(pair_run):  # noqa: F811
    """Known answers: imagined frames and proprio equal to the real ones make the policy act
    exactly as on the real inputs (gap 0, gripper always agrees, same noise for both); the held
    start differs from the real boundary, so the policy acts otherwise there; an untrained pair's
    frames are not the real ones either."""
    from wmrl.evaluation.ranking import parse_policy
    from wmrl.policy.runner import PolicyRunner

    episodes, roll = _episodes_and_roll(pair_run)
    runner = PolicyRunner(parse_policy("sft/10@ode", pair_run).checkpoint, device="cpu", sampler="ode")
    assert roll["proprio"]["imagined"].shape == roll["proprio"]["real"].shape == (3, 3, 8)
    copy = {**roll, "imagined": {v: x.clone() for v, x in roll["real"].items()},
            "proprio": {"real": roll["proprio"]["real"], "imagined": roll["proprio"]["real"].clone()}}
    same = action_gap(copy, episodes, runner, chunk_size=8)
    assert list(same["horizons"]) == ["1"]  # 5, 10 and 20 lie past these short episodes
    h1 = same["horizons"]["1"]
    assert h1["episodes"] == 3 and h1["action_gap_imagined"] == 0.0 and h1["gripper_agrees_imagined"] == 1.0
    assert h1["action_gap_held"] > 0 and h1["ratio"] == 0.0
    assert h1["action_gap_imagined_main"] == h1["action_gap_imagined_wrist"] == h1["action_gap_imagined_proprio"] == 0.0
    assert h1["eef_error_mm_imagined"] == 0.0
    untrained = action_gap(roll, episodes, runner, chunk_size=8)["horizons"]["1"]
    assert untrained["action_gap_imagined"] > 0 and untrained["action_gap_imagined_main"] > 0
    assert untrained["action_gap_imagined_wrist"] > 0 and untrained["eef_error_mm_imagined"] > 0
    # only the wrist view imagined: the main-only and proprio-only inputs are the real ones, and
    # the whole imagined input is the wrist-only one
    wrist_only = {**copy, "imagined": {"main": roll["real"]["main"], "wrist": roll["imagined"]["wrist"]}}
    w = action_gap(wrist_only, episodes, runner, chunk_size=8)["horizons"]["1"]
    assert w["action_gap_imagined_main"] == w["action_gap_imagined_proprio"] == 0.0
    assert w["action_gap_imagined"] == w["action_gap_imagined_wrist"] == untrained["action_gap_imagined_wrist"] > 0
    assert "| 1 | 3 |" in table(same)


def test_the_bench_script_measures_a_pair_and_refuses_bad_input(pair_run, tmp_path):  # noqa: F811
    bench = load_script("bench/action_gap.py")
    out = bench.main(["--run", str(pair_run), "--policy", "sft/10@ode", "--episodes", "2", "--horizon", "2",
                      "--device", "cpu", "--json", str(tmp_path / "gap.json")])
    assert out["horizons"]["1"]["episodes"] >= 1 and json.loads((tmp_path / "gap.json").read_text())["policy"] == "sft/10@ode"
    with pytest.raises(ConfigError, match="a control reads no frames"):
        bench.main(["--run", str(pair_run), "--policy", "hold"])
    with pytest.raises(ConfigError, match="scales separated by commas"):
        bench.main(["--run", str(pair_run), "--policy", "sft/10@ode", "--guidance", "1;2"])
    with pytest.raises(ConfigError, match="--action-dropout 0.1"):  # guidance needs a pair trained for it
        bench.main(["--run", str(pair_run), "--policy", "sft/10@ode", "--guidance", "1,2", "--device", "cpu"])
    with pytest.raises(ConfigError, match="make package"):
        bench.main(["--run", str(tmp_path), "--policy", "sft/10"])


def test_corruptions_do_what_they_say():
    import torch
    from wmrl.evaluation.action_gap import perturb, psnr

    g = torch.Generator().manual_seed(0)
    frames = torch.rand(2, 3, 3, 16, 16, generator=g) * 2 - 1  # (E, T, 3, H, W)
    assert torch.equal(perturb(frames, "none"), frames)
    flat = torch.full((1, 2, 3, 16, 16), 0.3)
    torch.testing.assert_close(perturb(flat, "blur:2"), flat)  # a blur keeps a flat image, edges included
    assert perturb(frames, "blur:2").var() < frames.var() / 2
    shifted = perturb(frames, "shift:3")
    assert torch.equal(shifted[..., 3:, 3:], frames[..., :-3, :-3])
    late = perturb(frames, "late:1")
    assert torch.equal(late[:, 0], frames[:, 0]) and torch.equal(late[:, 1:], frames[:, :-1])
    assert torch.equal(perturb(frames, "noise:0.1", seed=1), perturb(frames, "noise:0.1", seed=1))
    torch.testing.assert_close(perturb(frames, "blend:1"), late)
    torch.testing.assert_close(perturb(frames, "blend:0.5")[:, 1:], (frames[:, 1:] + frames[:, :-1]) / 2)
    torch.testing.assert_close(perturb(frames, "late:1+shift:3"), perturb(late, "shift:3"))
    assert perturb(frames, "noise:0.1").abs().max() <= 1
    with pytest.raises(ValueError, match="blur:S, noise:S"):
        perturb(frames, "jpeg:50")
    with pytest.raises(ValueError, match="blur and shift are for camera views"):
        perturb(torch.zeros(2, 3, 8), "blur:1", images=False)
    still = torch.zeros(2, 3, 8)  # the arm never moved: the warped late frame is the late frame
    torch.testing.assert_close(perturb(frames, "warp:1", proprio=still), late, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="warp is for the wrist view"):
        perturb(frames, "warp:1")
    proprio = torch.randn(2, 3, 8, generator=g) * 5
    assert perturb(proprio, "noise:1", images=False).abs().max() > 1  # no [-1, 1] clamp off the images
    assert torch.equal(perturb(proprio, "late:1", images=False)[:, 1:], proprio[:, :-1])
    valid = torch.ones(2, 3, dtype=torch.bool)
    half = frames.clone()
    half[:, 1:] = frames[:, 1:] + 0.2  # [-1, 1] units: 0.1 in [0, 1], 20 dB
    assert abs(psnr(half, frames, valid) - 20.0) < 1e-3


def test_view_sensitivity_reads_recorded_episodes_and_refuses_bad_input(pair_run, tmp_path):  # noqa: F811
    bench = load_script("bench/view_sensitivity.py")
    data = sorted(Path(pair_run).rglob("*.hdf5"))[0].parent
    out = bench.main(["--run", str(pair_run), "--policy", "sft/10@ode", "--data", str(data), "--episodes", "2",
                      "--corruptions", "none,late:1,warp:1", "--device", "cpu", "--json", str(tmp_path / "s.json"),
                      "--plot", str(tmp_path / "s.png"), "--mark", "a pair=15.7,0.34"])
    none, late, warp = out["rows"]
    assert warp["psnr_db"] < none["psnr_db"] and warp["horizons"]["1"]["action_gap"] >= 0
    assert none["horizons"]["1"]["action_gap"] == 0.0 and none["horizons"]["1"]["gripper_agrees"] == 1.0
    assert late["horizons"]["1"]["action_gap"] > 0 and late["psnr_db"] < none["psnr_db"]
    assert json.loads((tmp_path / "s.json").read_text())["view"] == "wrist" and (tmp_path / "s.png").is_file()
    prop = bench.main(["--run", str(pair_run), "--policy", "sft/10@ode", "--data", str(data), "--episodes", "2",
                       "--view", "proprio", "--corruptions", "none,late:1", "--device", "cpu"])
    assert prop["rows"][0]["eef_error_mm"] == 0 and prop["rows"][0]["horizons"]["1"]["action_gap"] == 0.0
    with pytest.raises(ConfigError, match="blur and shift are for camera views"):
        bench.main(["--run", str(pair_run), "--policy", "sft/10@ode", "--data", str(data), "--view", "proprio",
                    "--corruptions", "turn:10,blur:1"])
    with pytest.raises(ConfigError, match="LABEL=PSNR,GAP"):
        bench.main(["--run", str(pair_run), "--policy", "sft/10@ode", "--data", str(data), "--mark", "pair=15.7"])
    with pytest.raises(ConfigError, match="--corruptions"):
        bench.main(["--run", str(pair_run), "--policy", "sft/10@ode", "--data", str(data), "--corruptions", "jpeg:50"])
    with pytest.raises(ConfigError, match="no .hdf5 files"):
        bench.main(["--run", str(pair_run), "--policy", "sft/10@ode", "--data", str(tmp_path)])


def test_the_action_gap_at_each_guidance_scale_of_a_dropout_pair(sft_run, tmp_path):  # noqa: F811
    """``--guidance 1,2``: the same episodes and policy noise imagined at each scale; the first is the
    headline, each under ``by_guidance``. (These untrained models' zero-initialised output layers
    ignore the actions, so the two scales' frames agree here; what guidance does to trained ones is
    bench/RESULTS.md's.)"""
    import shutil

    from tests.rl.conftest import add_pair

    run = tmp_path / "dropout"
    shutil.copytree(sft_run, run)
    add_pair(run, episodes=8, action_dropout=0.1)
    bench = load_script("bench/action_gap.py")
    out = bench.main(["--run", str(run), "--policy", "sft/10@ode", "--episodes", "2", "--horizon", "2",
                      "--device", "cpu", "--guidance", "1,2"])
    one, two = (out["by_guidance"][w]["horizons"]["1"] for w in ("1.0", "2.0"))
    assert out["guidance"] == 1.0 and out["horizons"]["1"] == one
    assert one["action_gap_held"] == two["action_gap_held"] > 0  # the real inputs and the noise are the same
    assert one["episodes"] == two["episodes"] >= 1


def test_the_proprio_corrupted_alone_in_its_own_spread():
    """``perturbed(roll, "proprio", ...)``: the frames stay real; the proprio's noise is scaled by
    each dimension's spread; the end-effector error is read in millimetres."""
    import torch
    from wmrl.evaluation.action_gap import eef_error_mm, perturbed

    g = torch.Generator().manual_seed(0)
    frames = {v: torch.rand(4, 3, 3, 8, 8, generator=g) * 2 - 1 for v in ("main", "wrist")}
    scale = torch.tensor([0.01, 0.01, 0.01, 1, 1, 1, 0.02, 0.02])  # metres, radians, finger positions
    proprio = torch.randn(4, 3, 8, generator=g) * scale
    roll = {"real": frames, "imagined": dict(frames), "proprio": {"real": proprio, "imagined": proprio},
            "valid": torch.ones(4, 3, dtype=torch.bool), "steps": 2}
    out = perturbed(roll, "proprio", "noise:0.5")
    assert all(torch.equal(out["imagined"][v], frames[v]) for v in frames)
    change = (out["proprio"]["imagined"] - proprio).std(dim=(0, 1)) / proprio.std(dim=(0, 1))
    assert ((change > 0.2) & (change < 1.0)).all()  # half of each dimension's own spread, give or take
    shifted = proprio.clone()
    shifted[..., 0] += 0.003
    assert abs(eef_error_mm(shifted, proprio, roll["valid"]) - 3.0) < 1e-3
    # turn:DEG turns each orientation by DEG (the angle between them), position and gripper kept
    from wmrl.worldmodel.rotation import relative_rotation

    turned = perturbed(roll, "proprio", "turn:15")["proprio"]["imagined"]
    angle = torch.rad2deg(relative_rotation(proprio[..., 3:6], turned[..., 3:6]).norm(dim=-1))
    torch.testing.assert_close(angle, torch.full_like(angle, 15.0), atol=1e-2, rtol=0)
    assert torch.equal(turned[..., :3], proprio[..., :3]) and torch.equal(turned[..., 6:], proprio[..., 6:])
    with pytest.raises(ValueError, match="turn:DEG turns the proprio"):
        perturbed(roll, "wrist", "turn:15")
