"""The cycle's controller (``wmrl.cycle``): plan, records, skips, refusals, resumption, lineage,
report. The stages are ``tests/fake_stage.py`` (it writes what each stage promises), so these
tests take seconds; the real stages are tested in their own folders and run together in
``make demo``."""

import base64
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest
from wmrl.config import get_config
from wmrl.cycle import STAGES, STUDENT_STAGES, CycleError, CycleJob, load_state, main, plan, stage_env
from wmrl.preflight import GPUBusy
from wmrl.procs import LockError, exclusive

from tests.test_preflight import fake_nvidia_smi

REPO = Path(__file__).resolve().parents[1]
FAKE = [sys.executable, str(REPO / "tests" / "fake_stage.py")]


@pytest.fixture(autouse=True)
def calls(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "calls.txt"
    monkeypatch.setenv("FAKE_CALLS", str(path))
    monkeypatch.delenv("FAKE_FAIL", raising=False)
    monkeypatch.delenv("FAKE_HANG", raising=False)
    monkeypatch.delenv("FAKE_SLOW", raising=False)
    monkeypatch.delenv("FAKE_AGREEMENT", raising=False)
    monkeypatch.delenv("FAKE_AGREEMENT_STUDENTS", raising=False)
    monkeypatch.delenv("FAKE_CONTROL_HOLD", raising=False)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no nvidia-smi unless a test puts one there
    return path


def called(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def new_run(tmp_path: Path, name: str = "run") -> Path:
    run = tmp_path / name
    (run / "weights" / "sft" / "global_step_10").mkdir(parents=True)  # a supervised policy to start from
    (run / "demos").mkdir()
    return run


def job(run: Path, **kw) -> CycleJob:
    kw = {"report": False, "cfg": get_config("cycle_tiny"), "profile": "tiny", **kw}
    return CycleJob(run=run, train_py=FAKE, wm_py=FAKE, **kw)


def test_dry_run_plans_every_stage_and_writes_nothing(tmp_path, calls):
    run = new_run(tmp_path)
    steps = plan(job(run, cycles=2))
    assert [s["stage"] for s in steps] == list(STAGES) * 2
    c2 = {s["stage"]: s["command"] for s in steps if s["cycle"] == 2}
    assert "--ckpt 2" in c2["collect"]  # cycle 2 collects with cycle 1's GRPO step (0 -> 2)
    assert f"--init-pair {run / 'cycles/cycle_1/model_pair'}" in c2["wm_update"]
    assert f"--replay {run / 'demos'} {run / 'cycles/cycle_1/collect'}" in c2["manifest"]
    assert "--target 4" in c2["grpo"]
    assert sorted(p.name for p in run.iterdir()) == ["demos", "weights"] and not calls.exists()


def test_cycles_record_lineage_and_a_rerun_skips_everything(tmp_path, calls):
    run = new_run(tmp_path)
    main(job(run, cycles=2))
    runs = called(calls)
    # cycle 1 evaluates the supervised policy it starts from; cycle 2 starts from cycle 1's last
    # GRPO step, whose evaluation GRPO wrote (as it writes step 4's: the evaluate stages have nothing to do)
    per_cycle = ["collect", "make_manifest", "wm_update", "wm_reward", "package_pair", "wm_eval", "grpo"]
    # the start's evaluation runs in the background beside the world-model stages: where it lands
    # among them depends on the machine's load, but it runs once, after the manifest, before GRPO
    assert [r for r in runs if r != "evaluate"] == per_cycle + per_cycle
    assert runs.count("evaluate") == 1 and runs.index("make_manifest") < runs.index("evaluate") < runs.index("grpo")
    st = load_state(run)
    c1, c2 = st["cycles"]["1"], st["cycles"]["2"]
    assert (c1["policy_in"], c1["grpo_from"], c1["grpo_to"]) == ("sft/10", 0, 2)
    assert (c2["policy_in"], c2["grpo_from"], c2["grpo_to"]) == ("2", 2, 4)
    assert c2["lineage"]["policy_in"] == "2" and c2["lineage"]["policy_out"] == "4"
    assert c1["lineage"]["success_before"] == pytest.approx(1 / 50)  # evaluate_start's evaluation of sft/10
    assert c2["lineage"]["success_before"] == pytest.approx(2 / 50) and c2["lineage"]["success_after"] == pytest.approx(4 / 50)
    # state by state: cycle 1 lost the supervised policy's one success (state 0) and gained states 1 and 2
    ch1, ch2 = c1["lineage"]["success_change"], c2["lineage"]["success_change"]
    assert (ch1["up"], ch1["down"], ch1["states"]) == (2, 1, 50) and ch1["change"] == pytest.approx(1 / 50)
    assert (ch2["up"], ch2["down"]) == (2, 0) and ch2["mcnemar_chi2"] == pytest.approx(2.0)
    assert c1["collect_seed"] != c2["collect_seed"]  # each cycle collects new placements
    sel = json.loads((run / "cycles/cycle_2/train/selected_world_models.json").read_text())
    assert sel["init"] == str(run / "cycles/cycle_1/model_pair")  # the update continues the previous pair
    main(job(run, cycles=2))
    assert called(calls) == runs  # nothing ran again


def test_a_failed_stage_says_where_its_log_is_and_the_rerun_resumes_there(tmp_path, calls, monkeypatch):
    run = new_run(tmp_path)
    monkeypatch.setenv("FAKE_FAIL", "grpo")
    with pytest.raises(CycleError, match=r"grpo of cycle 1 failed \(exit 1\): grpo: failing as asked; its log: "
                                         r".*cycle_1_grpo.log"):
        main(job(run))
    assert "failing as asked" in (run / "logs/cycle/cycle_1_grpo.log").read_text()
    monkeypatch.delenv("FAKE_FAIL")
    n = len(called(calls))
    main(job(run))
    assert called(calls)[n:] == ["grpo"]  # only the failed stage ran again
    assert load_state(run)["cycles"]["1"]["stages"]["grpo"]["attempts"] == 2


def test_the_start_policy_is_evaluated_while_the_world_models_train_and_grpo_waits_for_it(tmp_path, calls,
                                                                                           monkeypatch):
    """evaluate_start needs the CPU cores, the world-model stages the GPU: it runs in the
    background from the manifest on, and GRPO starts only once it finished."""
    run = new_run(tmp_path)
    monkeypatch.setenv("FAKE_SLOW", "evaluate")
    main(job(run))
    runs = called(calls)
    # evaluate and wm_update start side by side (which one writes first depends on the load); the
    # evaluation ends after the world model started, and GRPO after that
    assert runs.index("make_manifest") < runs.index("evaluate") < runs.index("evaluate-end")
    assert runs.index("wm_update") < runs.index("evaluate-end") < runs.index("grpo")
    st = load_state(run)["cycles"]["1"]["stages"]["evaluate_start"]
    assert st["done"] and st["seconds"] >= 3


def test_a_background_stage_records_its_own_time_not_when_the_cycle_looked(tmp_path, calls, monkeypatch):
    """The cycle joins the background evaluation only before GRPO; its recorded seconds are
    still its own (on the H200 the record said 369 s for a 201 s evaluation)."""
    run = new_run(tmp_path)
    monkeypatch.setenv("FAKE_SLOW", "evaluate:0.5,wm_update:6")
    main(job(run))
    st = load_state(run)["cycles"]["1"]["stages"]
    assert 0.5 <= st["evaluate_start"]["seconds"] < 4 <= st["wm_update"]["seconds"]


def test_a_failed_background_stage_stops_the_cycle_before_grpo(tmp_path, calls, monkeypatch):
    run = new_run(tmp_path)
    monkeypatch.setenv("FAKE_FAIL", "evaluate")
    with pytest.raises(CycleError, match=r"evaluate_start of cycle 1 failed \(exit 1\): evaluate: failing as asked; "
                                         r"its log: .*cycle_1_evaluate_start.log"):
        main(job(run))
    assert "grpo" not in called(calls)
    monkeypatch.delenv("FAKE_FAIL")
    main(job(run))  # the rerun runs it again and goes on
    assert called(calls).count("evaluate") == 2 and "grpo" in called(calls)


def test_an_output_changed_after_its_stage_finished_is_refused(tmp_path, monkeypatch):
    run = new_run(tmp_path)
    monkeypatch.setenv("FAKE_FAIL", "grpo")
    with pytest.raises(CycleError):
        main(job(run))
    monkeypatch.delenv("FAKE_FAIL")
    manifest = run / "cycles/cycle_1/manifest.json"
    good = manifest.read_text()
    manifest.write_text(good.replace("collect", "other"))
    with pytest.raises(CycleError, match="manifest.json .*changed or vanished"):
        main(job(run))
    manifest.write_text(good)
    main(job(run))
    assert load_state(run)["cycles"]["1"]["finished"]


def test_killing_the_controller_kills_its_stage_and_the_rerun_gives_the_same_artefacts(tmp_path, calls):
    ref = new_run(tmp_path, "reference")
    main(job(ref))
    run = new_run(tmp_path)
    cmd = [sys.executable, str(REPO / "python/cycle.py"), "--profile", "tiny", "--run", str(run), "--no-report",
           "--train-py", " ".join(FAKE), "--wm-py", " ".join(FAKE)]
    p = subprocess.Popen(cmd, env={**os.environ, "FAKE_HANG": "wm_update"}, stdout=subprocess.DEVNULL)
    deadline = time.time() + 60
    while called(calls).count("wm_update") < 2 and time.time() < deadline:  # the reference ran it once
        time.sleep(0.1)
    p.send_signal(signal.SIGKILL)
    p.wait()
    time.sleep(1)
    hanging = [c for c in Path("/proc").glob("[0-9]*/cmdline") if _cmdline(c).count("wm_update.py")
               and str(run) in _cmdline(c)]
    assert not hanging, "the stage outlived its controller"
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    outs = lambda r: {st: {Path(k).relative_to(r).as_posix(): v for k, v in rec["outputs"].items()}  # noqa: E731
                      for st, rec in load_state(r)["cycles"]["1"]["stages"].items() if st not in ("wm_eval", "evaluate")}
    got, want = outs(run), outs(ref)
    assert got == want  # every output's SHA-256, stage by stage


def _cmdline(path: Path) -> str:
    try:
        return path.read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_one_controller_per_run(tmp_path):
    run = new_run(tmp_path)
    with exclusive(run, "another make cycle", name=".cycle.lock"):
        with pytest.raises(LockError, match="another make cycle"):
            main(job(run))


def test_no_policy_no_cycle(tmp_path):
    with pytest.raises(CycleError, match="train one first"):
        main(job(tmp_path / "empty"))
    assert not (tmp_path / "empty").exists()  # nothing written
    assert "--ckpt sft/N" in plan(job(tmp_path / "empty"))[0]["command"]  # a plan names the policy to come


def test_busy_gpu_stops_the_cycle_before_its_first_gpu_stage(tmp_path, calls, monkeypatch):
    fake_nvidia_smi(tmp_path / "bin", used_mib=30000, apps=["GPU-0, 4242, python, 30000 MiB"])
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    with pytest.raises(GPUBusy, match="GPU 0 .*pid 4242"):
        main(job(new_run(tmp_path)))
    assert not calls.exists()  # collect (a GPU stage) never started


class _Media(HTMLParser):
    def __init__(self):
        super().__init__()
        self.srcs = []

    def handle_starttag(self, tag, attrs):
        if tag in ("img", "video"):
            self.srcs.append(dict(attrs).get("src", ""))


def test_report_is_self_contained_and_its_twin_links_existing_files(tmp_path):
    run = new_run(tmp_path)
    main(job(run, report=True))
    page = (run / "report.html").read_text()
    media = _Media()
    media.feed(page)
    assert media.srcs, "the report shows the success curve"
    for src in media.srcs:
        head, _, data = src.partition(",")
        assert head.startswith("data:") and head.endswith(";base64"), "no external reference"
        raw = base64.b64decode(data)
        assert raw[:8] == b"\x89PNG\r\n\x1a\n" or raw[4:8] == b"ftyp" or raw[:3] == b"GIF"
    assert "Cycle 1: policy sft/10 -&gt; GRPO step 2" in page and "0.75" in page  # stages and the pair's agreement
    assert "reading the real frames (its ceiling)" in page and "0.875" in page  # ... and the reward's own ceiling
    assert "0.8125 (0.8 at 0.41)" in page  # ... and its ranking of the imagined episodes, whatever the threshold
    assert "+2.0 points +- 3.5 (paired standard error; 2 of 50 states up, 1 down; sde T=1.6)" in page
    md = (run / "report.md").read_text()
    for link in [part.split(")")[0] for part in md.split("](")[1:]]:
        assert (run / link).exists(), link


CHROMIUM = next((b for b in ("chromium-headless-shell", "chromium", "chromium-browser") if shutil.which(b)), None)


@pytest.mark.skipif(CHROMIUM is None, reason="no headless Chromium here (CI installs chromium-headless-shell)")
def test_report_renders_in_a_browser_with_every_image_loaded(tmp_path):
    from PIL import Image

    run = new_run(tmp_path)
    main(job(run, report=True))
    page = tmp_path / "probe.html"  # the report plus a line of script that reports broken images in the title
    page.write_text((run / "report.html").read_text().replace("</body>", (
        "<script>window.onload = () => { document.title = [...document.images].every("
        "i => i.complete && i.naturalWidth > 0) ? 'IMAGES_OK' : 'IMAGES_BROKEN'; };</script></body>")))
    args = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--virtual-time-budget=5000"]
    dom = subprocess.run([*args, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120).stdout
    assert "<title>IMAGES_OK</title>" in dom
    shot = tmp_path / "shot.png"
    subprocess.run([*args, f"--screenshot={shot}", "--window-size=1000,1400", (run / "report.html").as_uri()],
                   capture_output=True, timeout=120, check=True)
    pixels = Image.open(shot).convert("L")
    lo, hi = pixels.getextrema()
    assert hi - lo > 100, "the page rendered blank"


def test_the_controller_needs_only_the_standard_library_and_takes_makes_runners(tmp_path, calls):
    code = ("import sys; sys.path.insert(0, 'python'); import cycle, wmrl.cycle, wmrl.preflight, wmrl.procs\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'numpy', 'h5py', 'matplotlib', 'tqdm'}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr  # the host's python3 runs it in both runtimes
    run = new_run(tmp_path)
    runner = [f"PYTHONPATH={REPO / 'python'}", *FAKE]  # how Make's RUNTIME=docker runners begin
    main(CycleJob(run=run, cfg=get_config("cycle_tiny"), profile="tiny", train_py=runner, wm_py=runner, report=False))
    assert "grpo" in called(calls)



def test_a_run_outside_the_repository_is_mounted_whole_for_the_images(tmp_path, monkeypatch):
    """RUNTIME=docker mounts the absolute paths among a stage's arguments; the world-model stages
    name only RUN/cycles/cycle_N but read the demonstrations their manifest lists in RUN."""
    monkeypatch.setenv("WMRL_DOCKER_MOUNTS", "/data:ro")
    assert stage_env(job(tmp_path / "run"))["WMRL_DOCKER_MOUNTS"] == f"/data:ro,{tmp_path / 'run'}"
    monkeypatch.delenv("WMRL_DOCKER_MOUNTS")
    assert "WMRL_DOCKER_MOUNTS" not in stage_env(job(REPO / "runs" / "x"))  # the repository is mounted anyway

def test_two_gpus_run_grpo_as_one_process_per_gpu(tmp_path):
    run = new_run(tmp_path)
    one = {s["stage"]: s["command"] for s in plan(job(run))}
    two = {s["stage"]: s["command"] for s in plan(job(run, gpus="0,1"))}
    assert "torch.distributed.run" not in one["grpo"] and "--run-dir" in one["grpo"]
    assert "-m torch.distributed.run --standalone --nproc_per_node=2 python/grpo.py" in two["grpo"]
    assert "torch.distributed.run" not in two["evaluate"]  # the rest stay one process


def test_speedrun_dry_run_plans_every_stage_from_nothing_and_writes_nothing(tmp_path):
    run = tmp_path / "speedrun"
    r = subprocess.run(["make", "--no-print-directory", "speedrun", "PROFILE=tiny", f"RUN={run}", "DRY_RUN=1"], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    for line in ("plan: collect demonstrations", "plan: sft", "not there yet (make demos writes it)",
                 "[cycle 1] collect", "--ckpt sft/N", "[cycle 1] grpo", "[cycle 1] evaluate"):
        assert line in r.stdout, line
    assert not run.exists()


def test_speedrun_takes_its_own_profile_unless_told():
    """`make speedrun` plans every stage with the speedrun profile (the default models, shorter
    stages); PROFILE=... on the command line still wins (the test above uses tiny)."""
    from wmrl.config import get_profile

    r = subprocess.run(["make", "--no-print-directory", "-n", "speedrun", "RUN=/nonexistent/speedrun"], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.count("PROFILE=speedrun") == 3 and "PROFILE=default" not in r.stdout
    fast, full = get_profile("speedrun"), get_profile("default")
    assert fast.policy == full.policy and fast.wm.main == full.wm.main  # the same models
    # and the same GRPO, which only evaluates at its last step there, keeps the small steps its
    # timing was measured with and trains in its three-minute pair whatever its agreement
    assert dataclasses.replace(fast.grpo, eval_interval=full.grpo.eval_interval, groups=full.grpo.groups,
                               minibatches=full.grpo.minibatches, min_agreement=full.grpo.min_agreement) == full.grpo
    assert fast.grpo.groups < full.grpo.groups
    assert fast.sft.steps < full.sft.steps and fast.wm.train.steps < full.wm.train.steps


def test_the_profile_caps_the_world_model_update_and_max_minutes_wins(tmp_path):
    """The speedrun profile's world models stop after cycle.wm_max_minutes (the 20-minute budget);
    the default profile has no limit; --max-minutes (MAX_MINUTES) overrides either."""
    run = new_run(tmp_path)
    wm = lambda **kw: next(s["command"] for s in plan(job(run, **kw)) if s["stage"] == "wm_update")  # noqa: E731
    assert "--max-minutes" not in wm()
    speedrun = get_config("cycle_speedrun")
    assert f"--max-minutes {speedrun.wm_max_minutes}" in wm(cfg=speedrun, profile="speedrun")
    assert "--max-minutes 2.0" in wm(cfg=speedrun, profile="speedrun", max_minutes=2.0)


def test_the_background_evaluation_leaves_a_core_to_each_world_model_where_cores_are_many(tmp_path):
    from wmrl.cycle import workers_beside_training

    assert workers_beside_training(16) == 14 and workers_beside_training(4) == 4 and workers_beside_training(None) in (
        None, len(os.sched_getaffinity(0)) - 2)
    run = new_run(tmp_path)
    cmd = next(s["command"] for s in plan(job(run, workers=16)) if s["stage"] == "evaluate_start")
    assert "--workers 14" in cmd


def test_the_imagined_success_rule_reaches_grpo_only_when_asked(tmp_path):
    """cycle.success_chunks (SUCCESS_CHUNKS) is GRPO's --success-chunks; the default 1 adds no
    flag, so the commands of runs begun before it existed stay the same."""
    from wmrl.config import CycleConfig

    run = new_run(tmp_path)
    grpo = lambda **kw: next(s["command"] for s in plan(job(run, **kw)) if s["stage"] == "grpo")  # noqa: E731
    assert "--success-chunks" not in grpo()
    assert "--success-chunks 2" in grpo(cfg=CycleConfig(success_chunks=2))
    # likewise the floor on the pair's agreement: tiny's cycle and GRPO share theirs (0), the default's is 0.6
    assert "--min-agreement" not in grpo()
    assert "--min-agreement 0.6" in grpo(cfg=CycleConfig())


def test_a_pair_below_the_agreement_floor_skips_grpo_and_the_next_cycle_collects_with_the_same_policy(
        tmp_path, calls, monkeypatch):
    """cycle.min_agreement: where the cycle's wm-eval measured its pair below the floor (its whole
    interval), GRPO and the evaluation after it do not run; the cycle finishes with the policy it
    began with, which collects the next cycle's data (a new placement seed) for a better pair."""
    run = new_run(tmp_path)
    floor = dataclasses.replace(get_config("cycle_tiny"), min_agreement=0.6)
    monkeypatch.setenv("FAKE_AGREEMENT", "0.5")
    main(job(run, cfg=floor, report=True))
    c1 = load_state(run)["cycles"]["1"]
    assert "grpo" not in called(calls) and called(calls).count("evaluate") == 1  # evaluate_start only
    assert "tells the simulator's successes from failures at 0.50" in c1["grpo_skipped"]
    assert c1["finished"] and c1["lineage"]["policy_out"] == c1["policy_in"] == "sft/10"
    assert c1["lineage"]["policy_out_sha256"] is None and c1["lineage"]["success_after"] is None
    assert "GRPO skipped" in (run / "report.md").read_text()
    monkeypatch.setenv("FAKE_AGREEMENT", "0.75")  # the next cycle's pair passes
    main(job(run, cfg=floor, cycles=2))
    c2 = load_state(run)["cycles"]["2"]
    assert c2["policy_in"] == "sft/10" and c2["grpo_from"] == c1["grpo_from"] and c2["collect_seed"] != c1["collect_seed"]
    assert "grpo_skipped" not in c2 and called(calls).count("grpo") == 1
    assert c2["lineage"]["policy_out"] == str(c2["grpo_to"])


def test_students_put_grpo_in_the_distilled_pair_which_the_gate_measures(tmp_path, calls, monkeypatch):
    """cycle.students (STUDENTS=1): after wm_eval the cycle distils the students, trains their
    reward, packs and measures their pair, and GRPO rolls out there; the gate reads that pair's
    agreement, the lineage names it, the next cycle's update continues from the teachers' pair,
    and an unfinished cycle keeps the setting it began with."""
    students = dataclasses.replace(get_config("cycle_tiny"), students=True, min_agreement=0.6)
    run = new_run(tmp_path)
    steps = plan(job(run, cfg=students, cycles=2))
    names = list(STAGES)
    names[names.index("grpo"):names.index("grpo")] = STUDENT_STAGES
    assert [s["stage"] for s in steps] == names * 2
    c = {(s["cycle"], s["stage"]): s["command"] for s in steps}
    assert f"--pair {run / 'cycles/cycle_1/model_pair_students'}" in c[1, "grpo"]
    assert f"--pair {run / 'cycles/cycle_1/model_pair_students'}" in c[1, "wm_eval_students"]
    assert f"--init-pair {run / 'cycles/cycle_1/model_pair'}" in c[2, "wm_update"]
    assert "--students" in c[1, "reward_students"] and "--students" in c[1, "package_students"]

    monkeypatch.setenv("FAKE_AGREEMENT", "0.5")  # the teachers' pair would be refused; the students' passes
    monkeypatch.setenv("FAKE_AGREEMENT_STUDENTS", "0.8")
    main(job(run, cfg=students))
    c1 = load_state(run)["cycles"]["1"]
    assert "grpo_skipped" not in c1 and c1["students"] is True
    assert called(calls)[-1] == "grpo" and called(calls).count("wm_distill") == 1
    assert c1["lineage"]["pair"] == str(run / "cycles/cycle_1/model_pair_students")
    ck = run / "weights/policy/global_step_2/model.safetensors"
    assert ck.read_text() == "policy 2 from model_pair_students"

    run2 = new_run(tmp_path, "run2")  # the students' pair below the floor: refused, whatever the teachers'
    monkeypatch.setenv("FAKE_AGREEMENT", "0.8")
    monkeypatch.setenv("FAKE_AGREEMENT_STUDENTS", "0.5")
    main(job(run2, cfg=students))
    assert "0.50" in load_state(run2)["cycles"]["1"]["grpo_skipped"]

    run3 = new_run(tmp_path, "run3")  # killed in distill, rerun without STUDENTS=1: refused, nothing runs
    monkeypatch.setenv("FAKE_FAIL", "wm_distill")
    with pytest.raises(CycleError):
        main(job(run3, cfg=students))
    monkeypatch.delenv("FAKE_FAIL")
    before = called(calls)
    with pytest.raises(CycleError, match="began with the world models' students"):
        main(job(run3))
    assert called(calls) == before


def test_a_closed_loop_threshold_is_calibrated_in_grpos_pair_before_grpo(tmp_path, calls):
    """cycle.closed_loop_threshold (CLOSED_LOOP=1): a calibrate stage just before grpo, by the
    policy that collected at its collecting temperature, in the pair GRPO rolls out in (the
    students' with STUDENTS=1); GRPO decides success with it; an unfinished cycle keeps the setting."""
    closed = dataclasses.replace(get_config("cycle_tiny"), closed_loop_threshold=True)
    run = new_run(tmp_path)
    steps = plan(job(run, cfg=closed, cycles=2))
    names = list(STAGES)
    names.insert(names.index("grpo"), "calibrate")
    assert [s["stage"] for s in steps] == names * 2
    c = {(s["cycle"], s["stage"]): s["command"] for s in steps}
    assert "--policy sft/10@T=1 " in c[1, "calibrate"] and f"--pair {run / 'cycles/cycle_1/model_pair'} " in c[1, "calibrate"]
    assert f"--manifest {run / 'cycles/cycle_1/manifest.json'}" in c[1, "calibrate"]
    assert "--policy 2@T=1 " in c[2, "calibrate"]  # cycle 2 collects with GRPO's step 2
    assert "--reward-threshold closed-loop" in c[1, "grpo"]
    both = plan(job(new_run(tmp_path, "both"), cfg=dataclasses.replace(closed, students=True)))
    at = {s["stage"]: s["command"] for s in both}
    assert [s["stage"] for s in both].index("calibrate") == [s["stage"] for s in both].index("grpo") - 1
    assert "model_pair_students " in at["calibrate"]

    main(job(run, cfg=closed))
    c1 = load_state(run)["cycles"]["1"]
    assert c1["closed_loop_threshold"] is True and called(calls).index("wm_calibrate") < called(calls).index("grpo")
    cal = run / "cycles/cycle_1/model_pair/closed_loop.json"
    assert json.loads(cal.read_text())["threshold"] == 0.3
    from wmrl.report import write_report  # the report sets the chosen threshold beside the replays'

    row = {"imagined_success": 0.4, "recorded_success": 0.6, "balanced_accuracy": 0.74}
    cal.write_text(json.dumps({**json.loads(cal.read_text()), "calibrated_threshold": 0.74, "at_threshold": row,
                               "at_calibrated": {**row, "imagined_success": 0.28, "balanced_accuracy": 0.7},
                               "by_task": [{"task": 4, "imagined_success": 0.03, "recorded_success": 0.68}],
                               "controls": {"hold": {"rollouts": 8, "at_threshold": 0.125, "at_calibrated": 0.0}}}))
    md = write_report(run)[1].read_text()
    assert "| 0.3 (chosen) | 40.0% | 60.0% | 0.74 |" in md and "| 0.74 (replays) | 28.0% | 60.0% | 0.7 |" in md
    assert "| task 4 at the chosen one | 3.0% | 68.0% |" in md
    assert "| control hold at the chosen one (replays' 0.0%) | 12.5% | 0% (simulator) |" in md

    held = new_run(tmp_path, "held")  # at the chosen threshold a still arm succeeds: GRPO's gate skips GRPO
    os.environ["FAKE_CONTROL_HOLD"] = "1.0"
    try:
        main(job(held, cfg=dataclasses.replace(closed, min_agreement=0.6)))  # the tiny cycle's gate is off
    finally:
        del os.environ["FAKE_CONTROL_HOLD"]
    skipped = load_state(held)["cycles"]["1"]["grpo_skipped"]
    assert "40 of 40 rollouts of the control 'hold'" in skipped and "closed_loop.json, at its threshold 0.3" in skipped

    run2 = new_run(tmp_path, "run2")  # killed in calibrate, rerun without CLOSED_LOOP=1: refused
    os.environ["FAKE_FAIL"] = "wm_calibrate"
    try:
        with pytest.raises(CycleError):
            main(job(run2, cfg=closed))
    finally:
        del os.environ["FAKE_FAIL"]
    with pytest.raises(CycleError, match="began with the reward's threshold calibrated closed loop"):
        main(job(run2))


def test_own_starts_give_grpo_the_collecting_policys_episodes_at_its_temperature(tmp_path, calls, monkeypatch):
    """cycle.own_starts (OWN_STARTS=1): GRPO's starts are the keyframes of episodes that the policy
    it trains recorded at the collection's first temperature (its policy id as a pattern, the
    extra temperature's episodes left out); kept by an unfinished cycle like the other settings."""
    from fnmatch import fnmatchcase

    own = dataclasses.replace(get_config("cycle_tiny"), own_starts=True)
    run = new_run(tmp_path)
    c = {(s["cycle"], s["stage"]): s["command"] for s in plan(job(run, cfg=own, cycles=2))}
    assert "--start-recorded-by 'flow-policy@step10-sde-K*-T1'" in c[1, "grpo"]  # cycle 1 collects with sft/10
    assert "--start-recorded-by 'flow-policy@step2-sde-K*-T1'" in c[2, "grpo"]  # cycle 2 with GRPO's step 2
    pattern = "flow-policy@step10-sde-K*-T1"
    assert fnmatchcase("flow-policy@step10-sde-K10-T1", pattern)
    assert not any(fnmatchcase(other, pattern) for other in (
        "flow-policy@step10-sde-K10-T3", "flow-policy@step100-sde-K10-T1", "flow-policy@step10-sde-K10-T1.6", "expert"))
    assert "--start-recorded-by" not in {s["stage"]: s["command"] for s in plan(job(new_run(tmp_path, "plain")))}["grpo"]

    run2 = new_run(tmp_path, "run2")  # killed in grpo, rerun without OWN_STARTS=1: refused
    monkeypatch.setenv("FAKE_FAIL", "grpo")
    with pytest.raises(CycleError):
        main(job(run2, cfg=own))
    monkeypatch.delenv("FAKE_FAIL")
    assert load_state(run2)["cycles"]["1"]["own_starts"] is True
    with pytest.raises(CycleError, match="began with GRPO's starts from the collecting policy's own episodes"):
        main(job(run2))


def test_the_orchestrator_asks_the_agreement_gate_without_torch(tmp_path):
    """make cycle runs under the system's python3, which has no torch: the cycle and GRPO's
    agreement gate it asks (refusal text included) must not import it."""
    pair = tmp_path / "model_pair"
    pair.mkdir()
    (pair / "pair.json").write_text("{}")
    from wmrl.fileio import sha256_file

    (pair / "fidelity.json").write_text(json.dumps({"pair_json_sha256": sha256_file(pair / "pair.json"), "agreement": {
        "balanced_accuracy": 0.5, "balanced_accuracy_95": [0.5, 0.5], "episodes": 16}}))
    (pair / "closed_loop.json").write_text(json.dumps({"pair_json_sha256": sha256_file(pair / "pair.json"),
                                                       "threshold": 0.1, "success_chunks": 1}))
    code = ("import sys; from pathlib import Path; import wmrl.cycle\n"
            "from wmrl.release.pair import ModelPair, PairError, check_agreement\n"
            "from wmrl.evaluation.closed_loop import grpo_threshold\n"
            f"print('closed loop:', grpo_threshold('closed-loop', Path({str(pair)!r}), 1, 0.6))\n"
            f"try: check_agreement(ModelPair(Path({str(pair)!r}), {{}}), 0.6)\n"
            "except PairError as e: print('refused:', e)\n"
            "print('torch imported:', 'torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "python")})
    assert r.returncode == 0, r.stderr
    assert "refused:" in r.stdout and "0.00 of the simulator's signal" in r.stdout and "closed loop: 0.1" in r.stdout
    assert "torch imported: False" in r.stdout


def test_a_rerun_with_other_grpo_steps_takes_them_unless_grpo_is_past_them(tmp_path, calls, monkeypatch):
    """The cycle's record keeps its GRPO target across reruns; a rerun that asks for another
    number of steps gets it (not the recorded one) unless GRPO already saved a step past it."""
    run = new_run(tmp_path)
    three = dataclasses.replace(get_config("cycle_tiny"), grpo_steps=3)
    monkeypatch.setenv("FAKE_FAIL", "wm_reward")
    with pytest.raises(CycleError, match="reward of cycle 1 failed"):
        main(job(run))  # cycle_tiny: 2 steps, recorded before the failure
    assert load_state(run)["cycles"]["1"]["grpo_to"] == 2
    assert "--target 3" in next(s["command"] for s in plan(job(run, cfg=three)) if s["stage"] == "grpo")
    assert load_state(run)["cycles"]["1"]["grpo_to"] == 2  # the plan wrote nothing
    monkeypatch.setenv("FAKE_FAIL", "grpo")
    with pytest.raises(CycleError, match="grpo of cycle 1 failed"):
        main(job(run, cfg=three))
    assert load_state(run)["cycles"]["1"]["grpo_to"] == 3
    (run / "weights" / "policy" / "global_step_3").mkdir(parents=True)  # GRPO saved step 3 before it failed
    monkeypatch.delenv("FAKE_FAIL")
    with pytest.raises(CycleError, match=r"towards step 3 \(--grpo-steps 3\), up to step 3: rerun with that number"):
        main(job(run))
    main(job(run, cfg=three))
    assert load_state(run)["cycles"]["1"]["lineage"]["policy_out"] == "3"


def test_the_report_tables_grpo_steps_at_most_forty_rows_the_last_kept(tmp_path):
    from wmrl.report import grpo_steps

    log = tmp_path / "grpo.jsonl"
    log.write_text("".join(json.dumps({"step": s, "rollout_success": s / 100, "groups": 64, "skipped_groups": 20,
                                       "approx_kl_final": 0.004, "lr": 1e-5, "rollout_s": 16.2, "update_s": 11.0,
                                       "env_steps_per_s": 5000.0}) + "\n" for s in range(1, 51))
                   + json.dumps({"step": 50, "eval": "a line without rollout figures"}) + "\n")
    (kind, headers, rows), = grpo_steps(log)
    assert kind == "table" and headers[:3] == ["step", "rollout success", "groups skipped"]
    assert len(rows) == 40 and rows[0][0] == 1 and rows[-1][0] == 50
    assert rows[-1][1:] == ["50.0%", "20 / 64", "0.0040", "1.00e-05", "16.2", "11.0", "5000"]
    assert grpo_steps(tmp_path / "none.jsonl") == []
    check = {"policy-a": {"rollouts": 168, "imagined_success": 0.25, "recorded_success": 0.63}}  # imagination's first step
    log.write_text(json.dumps({"step": 1, "rollout_success": 0.26, "from_episode_starts": check}) + "\n")
    (_, _, [row]), (kind, text) = grpo_steps(log)
    assert kind == "p" and "at step 1" in text and "policy-a: imagined 25% vs real 63% (168 rollouts)" in text


def test_an_agreement_reads_with_its_interval_where_one_was_drawn():
    from wmrl.report import agreement_text, ranking_text

    assert agreement_text({"balanced_accuracy": 0.875, "balanced_accuracy_95": [0.75, 1.0]}) == "0.875 (95%: 0.75-1.0)"
    assert agreement_text({"balanced_accuracy": 0.5, "balanced_accuracy_95": None}) == "0.5"
    assert ranking_text({"imagined": None, "real": None}) == ranking_text({}) == "-"  # one outcome: nothing ranked


def test_the_start_is_evaluated_again_only_where_none_of_its_evaluations_has_grpos_sampler(tmp_path, calls):
    """make eval SAMPLER=ode after the start's T = 1.6 evaluation makes the ODE one its newest and
    keeps the other: that one still serves the cycle (GRPO evaluates at T = 1.6 in this profile),
    and the lineage compares it with GRPO's, sampler with sampler."""
    from wmrl.evaluation.evidence import kept_path

    def start(name, kept):
        run = new_run(tmp_path, name)
        (run / "weights/sft/global_step_10/config.json").write_text(json.dumps({"policy": {"temperature_eval": 1.6}}))
        ev = run / "evidence/evaluations/sft/global_step_10.json"
        for path, sampler, wins in [(ev, "ode", {0, 1, 2})] + ([(kept_path(ev, "sde T=1.6"), "sde", {5})] if kept else []):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({
                "summary": {"successes": len(wins), "trials": 50, "success_rate": len(wins) / 50, "per_task": {}},
                "episodes": [{"task": 0, "trial": i, "success": i in wins} for i in range(50)],
                "settings": {"sampler": sampler, "temperature": 1.6}}))
        return run

    run = start("kept", kept=True)
    main(job(run, cycles=1))
    assert "evaluate" not in called(calls)  # the kept T = 1.6 evaluation serves
    lin = load_state(run)["cycles"]["1"]["lineage"]
    assert lin["success_before"] == pytest.approx(1 / 50) and lin["success_change"]["samplers"] == ["sde T=1.6"] * 2
    assert (lin["success_change"]["up"], lin["success_change"]["down"]) == (2, 1)  # states 1, 2 up; state 5 down
    calls.unlink()
    main(job(start("ode_only", kept=False), cycles=1))
    assert called(calls).count("evaluate") == 1  # only an ODE evaluation: the start is evaluated with GRPO's sampler
