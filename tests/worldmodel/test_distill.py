"""Few-step students of the world models (``wmrl.worldmodel.distill``): they learn the teacher's
sampler, resume bit for bit, refuse what cannot be distilled, and pack into a pair GRPO can
imagine in. Tiny models on the CPU; the teachers are written directly (no DeepSpeed needed)."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from tests.helpers import child_env  # noqa: E402
from wmrl.config import VIEWS, get_config  # noqa: E402
from wmrl.data.manifest import build_manifest  # noqa: E402
from wmrl.fileio import sha256_file, write_json  # noqa: E402
from wmrl.layout import RunLayout  # noqa: E402
from wmrl.worldmodel.distill import DistillError, DistillJob, load_teachers, main  # noqa: E402
from wmrl.worldmodel.model import FrameWorldModel  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TINY = get_config("wm_tiny")
CFG = get_config("distill_tiny")


def teacher_run(root: Path, trajectories, sample_steps: int = 2) -> Path:
    """A run with a manifest, both views' models (random weights) selected, and a reward model."""
    from wmrl.worldmodel.reward import RewardModel

    layout = RunLayout(root)
    build_manifest(layout.manifest, [str(trajectories[0])], [str(trajectories[1])], seed=0)
    sel = {}
    for i, view in enumerate(VIEWS):
        torch.manual_seed(i)
        model = FrameWorldModel(dataclasses.replace(TINY.model(view), sample_steps=sample_steps))
        for p in model.parameters():  # zero-initialised output layers would make every sampler agree
            p.data.add_(0.05 * torch.randn_like(p))
        path = layout.wm_view(view) / "global_step_4"
        model.save_pretrained(path)
        sel[view] = {"weights": str(path), "step": 4, "reason": "target"}
    write_json(layout.selection, sel)
    RewardModel(get_config("reward_tiny")).save_pretrained(layout.reward, meta={"threshold": 0.5})
    return root


def weights(path: Path) -> dict:
    return FrameWorldModel.from_pretrained(path).state_dict()


def test_students_learn_the_teachers_sampler_in_one_step(trajectories, tmp_path):
    run = teacher_run(tmp_path / "run", trajectories)
    out = main(DistillJob(run, dataclasses.replace(CFG, steps=20, log_interval=5, save_interval=10), progress=False))
    sel = json.loads(RunLayout(run).student_selection.read_text())
    for view in VIEWS:
        student = FrameWorldModel.from_pretrained(sel[view]["weights"])
        assert student.cfg.sample_steps == 1 and sel[view]["step"] == 20
        assert student.saved_meta["distilled_from"]["sample_steps"] == 2
        log = [json.loads(line) for line in (RunLayout(run).logs / f"wm_distill_{view}.jsonl").read_text().splitlines()]
        assert [r["step"] for r in log] == [5, 10, 15, 20] and log[-1]["loss"] < log[0]["loss"]
        report = out["reports"][view]
        assert report["student"]["sample_steps"] == 1 and report["teacher"]["sample_steps"] == 2
        assert json.loads((RunLayout(run).wm_student(view) / "report.json").read_text()) == report
        # the proprio head is the teacher's, untouched
        teacher = FrameWorldModel.from_pretrained(RunLayout(run).wm_view(view) / "global_step_4")
        for k, v in teacher.state_dict().items():
            if k.startswith("proprio_head"):
                torch.testing.assert_close(student.state_dict()[k], v)


def test_a_killed_distillation_resumes_bit_for_bit(trajectories, tmp_path):
    straight = teacher_run(tmp_path / "straight", trajectories)
    main(DistillJob(straight, CFG, views=("wrist",), progress=False))
    split = teacher_run(tmp_path / "split", trajectories)
    main(DistillJob(split, dataclasses.replace(CFG, steps=2), views=("wrist",), progress=False))  # "killed" at 2
    main(DistillJob(split, CFG, views=("wrist",), progress=False))  # the same command again
    a, b = (weights(RunLayout(r).wm_student("wrist") / "global_step_4") for r in (straight, split))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not RunLayout(split).student_selection.exists()  # one view only: no pair of students yet


def test_bad_input_is_refused_before_any_update(trajectories, tmp_path):
    with pytest.raises(DistillError, match="make wm-update"):
        load_teachers(DistillJob(tmp_path / "empty", CFG))
    run = teacher_run(tmp_path / "one_step", trajectories, sample_steps=1)
    with pytest.raises(DistillError, match="nothing to distil"):
        load_teachers(DistillJob(run, CFG))
    other = teacher_run(tmp_path / "other", trajectories)
    main(DistillJob(other, dataclasses.replace(CFG, steps=2), views=("main",), progress=False))
    FrameWorldModel(TINY.main).save_pretrained(RunLayout(other).wm_view("main") / "global_step_4")  # a new teacher
    with pytest.raises(DistillError, match="another main model"):
        main(DistillJob(other, CFG, views=("main",), progress=False))


def test_students_pack_into_a_pair_that_imagines_in_one_step(trajectories, tmp_path):
    from wmrl.release.pair import load_pair

    run = teacher_run(tmp_path / "run", trajectories)
    r = subprocess.run([sys.executable, "python/wm_distill.py", "--profile", "tiny", "--run", str(run), "--dry-run"],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "plan: world-model distillation" in r.stdout and not RunLayout(run).wm_student(
        "main").exists()
    r = subprocess.run([sys.executable, "python/wm_distill.py", "--profile", "tiny", "--run", str(run), "--no-progress"],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "1-step student vs 2-step teacher" in r.stdout
    package = [sys.executable, "python/package_pair.py", "--profile", "tiny", "--run", str(run), "--students"]
    r = subprocess.run(package, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "make wm-reward RUN=" in r.stderr and "STUDENTS=1" in r.stderr  # the teacher's reward won't do
    r = subprocess.run([sys.executable, "python/wm_reward.py", "--profile", "tiny", "--run", str(run), "--students",
                        "--no-progress"], cwd=REPO, capture_output=True, text=True, timeout=300, env=child_env())
    assert r.returncode == 0, r.stderr[-2000:]
    reward_cfg = json.loads((RunLayout(run).student_reward / "config.json").read_text())
    students = json.loads(RunLayout(run).student_selection.read_text())
    assert reward_cfg["generated_by"] == {v: students[v]["weights"] for v in VIEWS}  # it judged the students' frames
    r = subprocess.run(package, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    pair = load_pair(RunLayout(run).model_pair)
    assert pair.meta["files"]["reward"][0]["sha256"] == sha256_file(RunLayout(run).student_reward / "model.safetensors")
    assert {v: pair.meta["models"][v]["sample_steps"] for v in VIEWS} == {"main": 1, "wrist": 1}
    assert pair.meta["models"]["main"]["distilled_from"].endswith("main/global_step_4")
    assert FrameWorldModel.from_pretrained(pair.part("wrist")).cfg.sample_steps == 1
    # a reward that judged other models' frames is refused (here: the selection now names the teacher)
    students["main"]["weights"] = json.loads(RunLayout(run).selection.read_text())["main"]["weights"]
    write_json(RunLayout(run).student_selection, students)
    r = subprocess.run([*package, "--overwrite"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "frames of other world models" in r.stderr and "OVERWRITE=1 STUDENTS=1" in r.stderr


SF = dataclasses.replace(CFG, steps=2, self_forcing_steps=6, student_every=3, rollout_chunks=2, log_interval=1,
                         save_interval=1)


def test_stage3_alternates_student_and_critic_on_the_students_own_rollouts(trajectories, tmp_path):
    """Stage 3 after the sampler distillation: of every student_every iterations one updates
    the student (DMD), the rest the critic; losses finite; the report adds the open loop."""
    run = teacher_run(tmp_path / "run", trajectories)
    out = main(DistillJob(run, SF, views=("wrist",), progress=False))
    layout = RunLayout(run)
    log = [json.loads(line) for line in (layout.logs / "wm_distill_wrist.jsonl").read_text().splitlines()]
    sf = [r for r in log if r.get("phase") == "sf_dmd"]
    assert [r["step"] for r in sf] == [3, 4, 5, 6, 7, 8]
    assert [r["update"] for r in sf] == ["critic", "critic", "student"] * 2
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in sf)
    student = lambda s: weights(layout.wm_student("wrist") / f"global_step_{s}")  # noqa: E731
    moved = lambda a, b: any(not torch.equal(a[k], b[k]) for k in a if not k.startswith("proprio_head"))  # noqa: E731
    assert not moved(student(3), student(4)) and moved(student(4), student(5))  # the student moves at its turn only
    state = torch.load(layout.wm_student("wrist") / "state.pt", weights_only=True)
    teacher = weights(layout.wm_view("wrist") / "global_step_4")
    assert moved(teacher, state["critic"])  # the critic learned from the teacher's start
    assert state["optimizer"]["param_groups"][0]["lr"] == SF.self_forcing_lr  # Stage 3's own rate for the student
    assert state["critic_optimizer"]["param_groups"][0]["lr"] == SF.critic_lr
    assert out["selection"]["wrist"]["self_forcing_steps"] == 6
    ol = out["reports"]["wrist"]["open_loop"]
    assert ol["chunks"] == 2 and ol["rollouts"] > 0 and ol["student_psnr"] > 0 and ol["teacher_psnr"] > 0
    assert -1 <= ol["student_ssim"] <= 1 and -1 <= ol["teacher_ssim"] <= 1


def test_stage3_critic_warmup_updates_the_critic_alone_first(trajectories, tmp_path):
    run = teacher_run(tmp_path / "run", trajectories)
    main(DistillJob(run, dataclasses.replace(SF, critic_warmup=2), views=("main",), progress=False))
    log = [json.loads(line) for line in (RunLayout(run).logs / "wm_distill_main.jsonl").read_text().splitlines()]
    assert [r["update"] for r in log if r.get("phase") == "sf_dmd"] == ["critic"] * 4 + ["student", "critic"]


def test_stage3_resumes_bit_for_bit_with_its_critic(trajectories, tmp_path):
    straight = teacher_run(tmp_path / "straight", trajectories)
    main(DistillJob(straight, SF, views=("main",), progress=False))
    split = teacher_run(tmp_path / "split", trajectories)
    main(DistillJob(split, dataclasses.replace(SF, self_forcing_steps=4), views=("main",), progress=False))  # killed
    main(DistillJob(split, SF, views=("main",), progress=False))  # the same command again
    a, b = (weights(RunLayout(r).wm_student("main") / "global_step_8") for r in (straight, split))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_rollout_feeds_the_model_its_own_frames(trajectories, tmp_path):
    from wmrl.worldmodel.data import Transitions, load_split
    from wmrl.worldmodel.distill import rollout, rollout_starts

    run = teacher_run(tmp_path / "run", trajectories)
    _, train, _ = load_split(RunLayout(run).manifest, TINY.main.chunk_size)
    model = FrameWorldModel.from_pretrained(RunLayout(run).wm_view("wrist") / "global_step_4")
    data = Transitions(train, model.cfg.context, "cpu", model.cfg.action_history)
    starts = rollout_starts(data, 3)
    assert len(starts) and all(int(data.previous[s + j]) == int(s) + j - 1 for s in starts for j in (1, 2))
    idx, norm = starts[:3], model.proprio_stats
    noises = torch.randn((2, 3, 3, 64, 64), generator=torch.Generator().manual_seed(0))
    last, b = rollout(model, data, idx, "wrist", norm, noises, 2, torch.device("cpu"))
    first = data.batch(idx, "wrist", "start", norm)
    x0 = model.sample(noises[0], first["frames"], first["actions"], first["proprio"], 2).clamp(-1, 1)
    torch.testing.assert_close(model.current_frame(b["frames"]), x0)  # the second chunk starts on the first's frame
    second = data.batch(idx + 1, "wrist", "start", norm)
    torch.testing.assert_close(b["frames"][:, -1], second["frames"][:, -1])  # and on the real main frame
    torch.testing.assert_close(last, model.sample(noises[1], b["frames"], second["actions"], second["proprio"], 2))


def test_a_wrist_rollout_starts_its_chunks_on_the_imagined_main_frame(trajectories, tmp_path):
    """As in imagination: after the first chunk the wrist model sees the main model's frame,
    not the real one."""
    from wmrl.worldmodel.data import Transitions, load_split
    from wmrl.worldmodel.distill import rollout, rollout_starts

    run = teacher_run(tmp_path / "run", trajectories)
    _, train, _ = load_split(RunLayout(run).manifest, TINY.main.chunk_size)
    wrist = FrameWorldModel.from_pretrained(RunLayout(run).wm_view("wrist") / "global_step_4")
    main_model = FrameWorldModel.from_pretrained(RunLayout(run).wm_view("main") / "global_step_4")
    data = Transitions(train, wrist.cfg.context, "cpu", wrist.cfg.action_history)
    idx = rollout_starts(data, 3)[:3]
    noises, main_noises = torch.randn((2, 2, 3, 3, 64, 64), generator=torch.Generator().manual_seed(0))
    _, b = rollout(wrist, data, idx, "wrist", wrist.proprio_stats, noises, 2, torch.device("cpu"),
                   main_model=main_model, main_noises=main_noises[:1])
    first = data.batch(idx, "main", None, main_model.proprio_stats)
    m0 = main_model.sample(main_noises[0], first["frames"], first["actions"], first["proprio"],
                           main_model.cfg.sample_steps).clamp(-1, 1)
    torch.testing.assert_close(b["frames"][:, -1], m0)
    assert not torch.allclose(b["frames"][:, -1], data.batch(idx + 1, "wrist", "start", wrist.proprio_stats)["frames"][:, -1])


def test_a_wrist_model_that_sees_the_chunks_end_gets_the_main_frame_imagined_first(trajectories, tmp_path):
    """main_at_chunk_end: each chunk's wrist frame is made on the main frame of that chunk's end,
    which the main model imagines first (one main frame per chunk, the first one too)."""
    from wmrl.config import override
    from wmrl.worldmodel.data import Transitions, load_split
    from wmrl.worldmodel.distill import main_frames_imagined, rollout, rollout_starts

    run = teacher_run(tmp_path / "run", trajectories)
    _, train, _ = load_split(RunLayout(run).manifest, TINY.main.chunk_size)
    wrist = FrameWorldModel.from_pretrained(RunLayout(run).wm_view("wrist") / "global_step_4")
    main_model = FrameWorldModel.from_pretrained(RunLayout(run).wm_view("main") / "global_step_4")
    assert main_frames_imagined(wrist.cfg, 2) == 1
    wrist.cfg = override(wrist.cfg, main_at_chunk_end=True)  # same weights' shapes: one main frame either way
    assert main_frames_imagined(wrist.cfg, 2) == 2
    data = Transitions(train, wrist.cfg.context, "cpu", wrist.cfg.action_history)
    idx, stats, steps = rollout_starts(data, 3)[:3], main_model.proprio_stats, main_model.cfg.sample_steps
    noises, main_noises = torch.randn((2, 2, 3, 3, 64, 64), generator=torch.Generator().manual_seed(0))
    _, b = rollout(wrist, data, idx, "wrist", wrist.proprio_stats, noises, 2, torch.device("cpu"),
                   main_model=main_model, main_noises=main_noises)
    first, second = data.batch(idx, "main", None, stats), data.batch(idx + 1, "main", None, stats)
    m0 = main_model.sample(main_noises[0], first["frames"], first["actions"], first["proprio"], steps).clamp(-1, 1)
    history = torch.stack((list(first["frames"].unbind(1)) + [m0])[-main_model.cfg.context:], 1)
    m1 = main_model.sample(main_noises[1], history, second["actions"], second["proprio"], steps).clamp(-1, 1)
    torch.testing.assert_close(b["frames"][:, -1], m1)  # the second chunk's end, not its start (m0)
    assert not torch.allclose(m0, m1)


def test_stage3_bad_settings_are_refused(trajectories, tmp_path):
    from wmrl.config import ConfigError, DistillConfig

    with pytest.raises(ConfigError, match="student_every=1"):
        DistillConfig(student_every=1)
    with pytest.raises(ConfigError, match="critic_warmup=300 must be >= 0 and below self_forcing_steps=300"):
        DistillConfig(self_forcing_steps=300, critic_warmup=300)
    run = teacher_run(tmp_path / "run", trajectories)
    with pytest.raises(DistillError, match="lower --rollout-chunks"):
        main(DistillJob(run, dataclasses.replace(SF, rollout_chunks=50), progress=False))
    assert not RunLayout(run).wm_student("main").exists()
