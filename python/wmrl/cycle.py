"""``make cycle``: seed 000's loop, one stage after the other, resumable and recorded.

One cycle n (its data and world models in ``RUN/cycles/cycle_n/``; the policy stays in RUN):

    collect    the current policy in the real simulator (seeded random placements, success and
               failure kept)                                         -> cycle_n/collect/
    manifest   this cycle's data + replay (demonstrations, earlier cycles), 0.2 validation,
               0.5 new ratio                                         -> cycle_n/manifest.json
    evaluate_start the real 10 x 50 evaluation of the policy GRPO starts from, in the background
               while the world models train on the GPU (the simulator needs the CPU cores they
               leave idle); skipped when that policy was evaluated before
    wm_update  both world models with the stop rule, starting from the previous cycle's pair
                                                                     -> cycle_n/worldmodels/{main,wrist}
    reward     the reward model on this manifest                     -> cycle_n/worldmodels/reward/
    package    the model pair (hashes, keyframes)                    -> cycle_n/model_pair/
    wm_eval    held-out real episodes replayed in the pair: agreement, fidelity, videos
    (``cycle.students``, STUDENTS=1: four stages more, and GRPO rolls out in the students' pair)
    distill, reward_students, package_students, wm_eval_students
               the pair's one-step students, their own reward, their pair and its wm_eval
                                                                     -> cycle_n/model_pair_students/
    (``cycle.own_starts``, OWN_STARTS=1: GRPO starts only from keyframes of this cycle's episodes
    that the policy it trains recorded at the collection's first temperature)
    (``cycle.closed_loop_threshold``, CLOSED_LOOP=1)
    calibrate  the reward's threshold closed loop in GRPO's pair, by the policy that collected
               (make wm-calibrate); GRPO decides success with it      -> PAIR/closed_loop.json
    grpo       GRPO inside the pair from the current policy, ``grpo_steps`` further (60 -> 80);
               waits for evaluate_start            -> RUN/weights/policy/global_step_T
    evaluate   the real 10 x 50 evaluation of step T (GRPO's last step writes it; run if missing)

A pair that wm_eval measured below ``cycle.min_agreement`` (its agreement, or the controls it
imagines succeeding: ``wmrl.release.pair.check_agreement``) skips grpo and evaluate: the cycle
finishes with the policy it began with (``grpo_skipped`` in its record says why), which collects
the next cycle's data.

Every stage runs as its own process with the interpreter of its side (``train``: Python 3.11,
``wm``: Python 3.10; with ``RUNTIME=docker`` the images), dies with this controller, and logs
to ``RUN/logs/cycle/``. ``RUN/cycle.json`` records each finished stage with the SHA-256 of its
outputs: a rerun of the same command skips finished stages (refusing outputs that changed since)
and reruns the interrupted one, which resumes itself. Each cycle's parameters (which policy
collects, GRPO from/to) are fixed when the cycle starts, and its lineage is recorded: which
policy collected which data, which data trained which pair, which pair trained which policy.
After every stage the report (``RUN/report.html`` and ``RUN/report.md``) is rebuilt.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from wmrl.config import ConfigError, CycleConfig, get_profile, policy_id
from wmrl.evaluation.evidence import evaluation_with, label_of, paired_change, sampler_label
from wmrl.fileio import hash_tree, read_json, sha256_file, write_json
from wmrl.layout import RunLayout
from wmrl.lineage import REPO
from wmrl.release.pair import CLOSED_LOOP_FILE, FIDELITY_FILE, ModelPair, PairError, check_agreement

FORMAT = "wmrl-cycle/1"
STAGES = ("collect", "manifest", "evaluate_start", "wm_update", "reward", "package", "wm_eval", "grpo", "evaluate")
STUDENT_STAGES = ("distill", "reward_students", "package_students", "wm_eval_students")  # after wm_eval (students)
# settings a cycle keeps from its start to its end: (record key and cycle.<name>, how a person names it)
KEPT_SETTINGS = (("students", "the world models' students (STUDENTS={})"),
                 ("closed_loop_threshold", "the reward's threshold calibrated closed loop (CLOSED_LOOP={})"),
                 ("own_starts", "GRPO's starts from the collecting policy's own episodes (OWN_STARTS={})"))


class CycleError(ConfigError):
    """A stage failed, or a finished stage's outputs changed."""


@dataclass
class CycleJob:
    run: Path
    cfg: CycleConfig
    cycles: int = 1  # have this many cycles finished in RUN (a rerun with the same number does nothing)
    profile: str = "default"
    episodes: int | None = None  # per task (default: the profile's collect.episodes)
    tasks: str | None = None  # collection tasks (default: the profile's)
    wm_steps: int | None = None  # world-model updates per cycle (default: the profile's)
    max_minutes: float | None = None  # the world-model update's time limit
    seed: int = 0
    gpus: str | None = None  # "0,1": CUDA_VISIBLE_DEVICES of every stage, and what the pre-flight checks
    workers: int | None = None
    train_py: list[str] = field(default_factory=lambda: [str(REPO / ".venv/train/bin/python")])
    wm_py: list[str] = field(default_factory=lambda: [str(REPO / ".venv/wm/bin/python")])
    report: bool = True


@dataclass(frozen=True)
class Stage:
    name: str
    side: str  # "train" | "wm": which interpreter runs it
    args: tuple[str, ...]
    outputs: tuple[Path, ...]  # fingerprinted when the stage finishes
    gpu: bool = False
    skip_if: Path | None = None  # an atomic output: present = finished (a kill lost only the record)
    verify: bool = True  # refuse a rerun when these outputs changed since (the evaluation may be redone)
    background: bool = False  # started, then the next stages run while it does
    needs: tuple[str, ...] = ()  # background stages that must have finished before this one starts


# =========================================================================== records
def fingerprint(path: Path) -> str:
    """SHA-256 of a file, or of a folder's files (relative path + content hash, sorted)."""
    if path.is_file():
        return sha256_file(path)
    h = hashlib.sha256()
    for rel, sha in hash_tree(path, skip=lambda p: ".tmp" in p.name or p.name == ".lock").items():
        h.update(f"{rel}\0{sha}\n".encode())
    return h.hexdigest()


def state_path(run: Path) -> Path:
    return RunLayout(run).cycle_record


def load_state(run: Path) -> dict:
    if not state_path(run).exists():
        return {"format": FORMAT, "cycles": {}}
    st = read_json(state_path(run), CycleError, "")
    if st.get("format") != FORMAT:
        raise CycleError(f"{state_path(run)} is not a {FORMAT} record; use another RUN")
    return st


def cycle_dir(run: Path, n: int) -> Path:
    return RunLayout(run).cycle(n)


def begin_cycle(job: CycleJob, state: dict, n: int, planning: bool = False) -> dict:
    """The cycle's fixed parameters: recorded when it starts, reused by every rerun
    (``planning``: a dry run before the supervised policy exists names the one to come)."""
    key = str(n)
    if key in state["cycles"]:
        rec = state["cycles"][key]
        for name, what in KEPT_SETTINGS:
            if not rec.get("finished") and rec.get(name, False) != getattr(job.cfg, name):
                raise CycleError(f"cycle {n} of {job.run} began {'with' if rec.get(name) else 'without'} "
                                 f"{what.format(int(bool(rec.get(name))))}: rerun with that setting to finish it; "
                                 "the next cycle may change it")
        return follow_grpo_steps(job, rec, n, planning)
    layout = RunLayout(job.run)
    if n == 1:
        full = layout.policy_steps("policy", full=True)
        sft = layout.policy_steps("sft")
        if full:
            start, policy = full[-1], str(full[-1])
        elif sft:
            start, policy = 0, f"sft/{sft[-1]}"
        elif planning:
            start, policy = 0, "sft/N"  # the newest supervised checkpoint once `make sft` ran
        else:
            raise CycleError(f"no policy in {job.run} to start the cycle from: train one first "
                             f"(make demos sft RUN={job.run})")
    else:
        prev = state["cycles"].get(str(n - 1))
        if not prev or not prev.get("finished"):
            raise CycleError(f"cycle {n - 1} of {job.run} is not finished")
        if prev.get("grpo_skipped"):  # its pair was refused: the same policy collects again, for a better pair
            start, policy = prev["grpo_from"], prev["policy_in"]
        else:
            start, policy = prev["grpo_to"], str(prev["grpo_to"])
    rec = {"dir": str(cycle_dir(job.run, n)), "policy_in": policy, "grpo_from": start,
           "grpo_to": start + job.cfg.grpo_steps, "collect_seed": get_profile(job.profile).collect.seed + n,
           "students": job.cfg.students, "closed_loop_threshold": job.cfg.closed_loop_threshold,
           "own_starts": job.cfg.own_starts,
           "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "stages": {}}
    state["cycles"][key] = rec
    return rec


# =========================================================================== the stages
def follow_grpo_steps(job: CycleJob, rec: dict, n: int, planning: bool) -> dict:
    """A rerun that asks for another number of GRPO steps gets it (the recorded target would
    otherwise win silently) unless the cycle's GRPO finished or already saved a step past it."""
    want = rec["grpo_from"] + job.cfg.grpo_steps
    if rec.get("finished") or want == rec["grpo_to"]:
        return rec
    past = [s for s in RunLayout(job.run).policy_steps("policy") if s > want]
    if rec["stages"].get("grpo", {}).get("done") or past:
        raise CycleError(f"cycle {n} of {job.run} trained GRPO towards step {rec['grpo_to']} "
                         f"(--grpo-steps {rec['grpo_to'] - rec['grpo_from']}){f', up to step {past[-1]}' if past else ''}: "
                         "rerun with that number to continue it, or start a new RUN")
    if not planning:
        print(f"[cycle {n}] GRPO to step {want}, not {rec['grpo_to']} as recorded: --grpo-steps "
              f"{job.cfg.grpo_steps} given on this rerun", flush=True)
    rec["grpo_to"] = want
    return rec


def grpo_pair(rec: dict) -> Path:
    """The pair GRPO rolls out in: the updated world models', or their students' (``cycle.students``)."""
    c = RunLayout(rec["dir"])
    return c.student_pair if rec.get("students") else c.model_pair


def pair_refused(job: CycleJob, rec: dict) -> str | None:
    """GRPO's own gate (``cycle.min_agreement``, as ``grpo.min_agreement``), asked before GRPO
    starts: the refusal when the cycle's wm-eval measured its pair below the floor, else None.
    Never once GRPO saved a step of this cycle (it began in this pair: a refusal would strand it)."""
    if any(s > rec["grpo_from"] for s in RunLayout(job.run).policy_steps("policy")):
        return None
    try:  # only the pair's folder is read (its fidelity.json and pair.json); GRPO verifies the rest
        check_agreement(ModelPair(grpo_pair(rec), {}), job.cfg.min_agreement)
        if rec.get("closed_loop_threshold"):  # and the controls at the threshold the calibrate stage chose
            from wmrl.evaluation.closed_loop import grpo_threshold

            grpo_threshold("closed-loop", grpo_pair(rec), job.cfg.success_chunks, job.cfg.min_agreement)
    except PairError as e:
        return str(e)
    return None


def start_evidence(run: Path, policy: str) -> Path:
    """Where the real evaluation of the policy a cycle starts from lives (``sft/N`` or a GRPO step)."""
    kind, _, step = policy.rpartition("/")
    return RunLayout(run).evidence(int(step), kind or "policy")


def start_evaluated(run: Path, policy: str, grpo) -> Path | None:
    """The start policy's evaluation with GRPO's sampler (its newest or one kept beside it), which
    evaluate_start then need not make; the newest of any sampler where the policy's own SDE
    temperature cannot be read yet (a dry run's plan, before the policy exists)."""
    start = start_evidence(run, policy)
    temperature = grpo.eval_temperature
    if grpo.eval_sampler == "sde" and not temperature:  # GRPO evaluates at the checkpoint's own temperature
        kind, _, step = policy.rpartition("/")
        try:
            config = RunLayout(run).checkpoint(int(step), kind or "policy") / "config.json"
            temperature = read_json(config, CycleError, "")["policy"]["temperature_eval"]
        except (CycleError, KeyError, TypeError, ValueError):
            return start if start.exists() else None
    return evaluation_with(start, sampler_label({"sampler": grpo.eval_sampler, "temperature": temperature}))


def workers_beside_training(workers: int | None) -> int | None:
    """Simulator workers for the start policy's evaluation, which runs in the background while
    both world models train: where there are cores to spare, one is left to each view's training
    process, whose Python thread feeds the GPU. (One H200, all 16 cores simulating beside them:
    ~310 samples/s per view, against 1,085 for one view alone; bench/RESULTS.md.)"""
    cores = workers or len(os.sched_getaffinity(0))
    return cores - 2 if cores >= 8 else workers


def plan_stages(job: CycleJob, n: int, rec: dict) -> list[Stage]:
    run, c = job.run, Path(rec["dir"])
    layout, cl = RunLayout(run), RunLayout(c)
    prof = ["--profile", job.profile]
    opt = lambda flag, v: [flag, str(v)] if v is not None else []  # noqa: E731
    replay = ([str(layout.demos)] if layout.demos.is_dir() else []) + \
        [str(RunLayout(cycle_dir(run, k)).collect) for k in range(1, n)]
    prev_pair = RunLayout(cycle_dir(run, n - 1)).model_pair if n > 1 else None
    target = rec["grpo_to"]
    evidence = layout.evidence(target)
    start = start_evidence(run, rec["policy_in"]) if rec["policy_in"] != "sft/N" else None  # None: a dry run's plan
    grpo = get_profile(job.profile).grpo  # GRPO's evaluations compare with this one: its sampler and episodes
    wm_minutes = job.max_minutes or job.cfg.wm_max_minutes or None  # the command line's, else the profile's
    pair = grpo_pair(rec)
    stages = [
        Stage("collect", "train", (
            "python/collect.py", *prof, "--run", str(run), "--ckpt", rec["policy_in"], "--out", str(cl.collect),
            "--seed", str(rec["collect_seed"]), "--no-progress", *opt("--episodes", job.episodes),
            *opt("--tasks", job.tasks), *opt("--workers", job.workers)), (cl.collect,), gpu=True),
        Stage("manifest", "wm", (
            "python/make_manifest.py", "--run", str(c), "--new", str(cl.collect), *(["--replay", *replay] if replay else []),
            "--val-ratio", str(job.cfg.val_ratio), "--new-ratio", str(job.cfg.new_ratio), "--seed", str(job.seed)),
            (cl.manifest,), skip_if=cl.manifest),
        # GRPO's step 0 reuses this evaluation (same weights, sampler and trials) instead of running its own
        Stage("evaluate_start", "train", (
            "python/evaluate.py", *prof, "--run", str(run), "--ckpt", rec["policy_in"], "--sampler", grpo.eval_sampler,
            *opt("--temperature", grpo.eval_temperature or None), "--trials", str(grpo.final_trials), "--no-progress",
            *opt("--workers", workers_beside_training(job.workers))),
            (start,) if start else (), gpu=True, skip_if=start_evaluated(run, rec["policy_in"], grpo) if start else None,
            verify=False, background=True),
        Stage("wm_update", "wm", (
            "python/wm_update.py", *prof, "--run", str(c), "--no-progress",
            *opt("--init-pair", prev_pair), *opt("--steps", job.wm_steps), *opt("--max-minutes", wm_minutes)),
            (cl.selection,), gpu=True),
        Stage("reward", "wm", ("python/wm_reward.py", *prof, "--run", str(c), "--no-progress"), (cl.reward,), gpu=True),
        Stage("package", "wm", ("python/package_pair.py", *prof, "--run", str(c)), (cl.model_pair / "pair.json",),
              skip_if=cl.model_pair / "pair.json"),
        Stage("wm_eval", "wm", (
            "python/wm_eval.py", "--run", str(c), "--episodes", str(job.cfg.wm_eval_episodes), "--videos",
            str(job.cfg.videos), "--seed", str(job.seed)), (cl.model_pair / FIDELITY_FILE,), gpu=True, verify=False),
        Stage("grpo", "train", (
            *per_gpu(job), "python/grpo.py", *prof, "--run-dir", str(run), "--env", "wm", "--pair", str(pair),
            "--target", str(target), "--seed", str(job.seed), "--no-progress", *opt("--workers", job.workers),
            *(("--success-chunks", str(job.cfg.success_chunks)) if job.cfg.success_chunks != 1 else ()),
            # as for success_chunks: a flag only where the cycle's floor is not the profile's GRPO floor
            *(("--min-agreement", str(job.cfg.min_agreement)) if job.cfg.min_agreement != grpo.min_agreement else ()),
            *(("--reward-threshold", "closed-loop") if rec.get("closed_loop_threshold") else ()),
            *(("--start-recorded-by", own_starts_pattern(job, rec)) if rec.get("own_starts") else ())),
            (layout.checkpoint(target),), gpu=True, needs=("evaluate_start",)),
        Stage("evaluate", "train", (
            "python/evaluate.py", *prof, "--run", str(run), "--ckpt", str(target), "--no-progress",
            *opt("--workers", job.workers)), (evidence,), gpu=True, skip_if=evidence, verify=False),
    ]
    if rec.get("students"):  # the students, their reward, pair and wm_eval, between wm_eval and grpo
        at = [st.name for st in stages].index("grpo")
        stages[at:at] = [
            Stage("distill", "wm", ("python/wm_distill.py", *prof, "--run", str(c), "--no-progress"),
                  (cl.student_selection,), gpu=True),
            Stage("reward_students", "wm", ("python/wm_reward.py", *prof, "--run", str(c), "--students", "--no-progress"),
                  (cl.student_reward,), gpu=True),
            Stage("package_students", "wm", ("python/package_pair.py", *prof, "--run", str(c), "--students", "--out",
                                             str(pair)), (pair / "pair.json",), skip_if=pair / "pair.json"),
            Stage("wm_eval_students", "wm", (
                "python/wm_eval.py", "--run", str(c), "--pair", str(pair), "--episodes", str(job.cfg.wm_eval_episodes),
                "--videos", str(job.cfg.videos), "--seed", str(job.seed)), (pair / FIDELITY_FILE,), gpu=True, verify=False),
        ]
    if rec.get("closed_loop_threshold"):  # by the policy that collected, at its collecting temperature
        calibrated = f"{rec['policy_in']}@T={get_profile(job.profile).collect.temperature:g}"
        stages.insert([st.name for st in stages].index("grpo"), Stage("calibrate", "train", (
            "python/wm_calibrate.py", "--run", str(run), "--pair", str(pair), "--manifest", str(cl.manifest),
            "--policy", calibrated, "--success-chunks", str(job.cfg.success_chunks), "--seed", str(job.seed),
            "--overwrite"), (pair / CLOSED_LOOP_FILE,), gpu=True, verify=False))
    return stages


def own_starts_pattern(job: CycleJob, rec: dict) -> str:
    """``grpo.start_recorded_by`` for the episodes this cycle's policy collected at the collection's
    first temperature (GRPO's rollouts sample at 1, as that collection does by default): the
    policy id it recorded (``wmrl.config.policy_id``), its step taken from the checkpoint's name
    (``sft/N`` or a GRPO step), any number of denoising steps, e.g. ``flow-policy@step4000-sde-K*-T1``."""
    collect = get_profile(job.profile).collect
    return policy_id(rec["policy_in"].rpartition("/")[2], collect.sampler, "*", collect.temperature)


def per_gpu(job: CycleJob) -> list[str]:
    """GRPO on several GPUs (GPUS=0,1): one process per GPU through torchrun, each rolling out
    its share of the groups (``wmrl.rl.ranks``); nothing with one GPU or none."""
    from wmrl.procs import torchrun

    return torchrun(len(job.gpus.split(",")) if job.gpus else 1)


def runner_command(runner: list[str], *args: str) -> list[str]:
    """A runner of Make's (``$(TRAIN_PY)``) with arguments; it may start with settings
    (RUNTIME=docker: ``PYTHONPATH=python .venv/driver/bin/python -m ...``), which ``env`` applies."""
    cmd = [*runner, *args]
    return ["env", *cmd] if "=" in cmd[0] else cmd


def command(job: CycleJob, stage: Stage) -> list[str]:
    return runner_command(job.train_py if stage.side == "train" else job.wm_py, *stage.args)


def stage_env(job: CycleJob) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "python"), env.get("PYTHONPATH")]))
    env.setdefault("PYTHONUNBUFFERED", "1")
    if job.gpus:
        env["CUDA_VISIBLE_DEVICES"] = job.gpus
    # RUNTIME=docker mounts the repository and the absolute paths among a stage's arguments. The
    # world-model stages name only RUN/cycles/cycle_N but read the files their manifest lists
    # elsewhere in RUN (demonstrations, earlier cycles' data): a RUN outside the repository is
    # mounted whole (the variable means nothing to RUNTIME=local).
    run = job.run.resolve()
    if REPO.resolve() not in (run, *run.parents):
        env["WMRL_DOCKER_MOUNTS"] = ",".join(filter(None, [env.get("WMRL_DOCKER_MOUNTS"), str(run)]))
    return env


def stage_finished(stage: Stage, run: Path, target: int) -> bool:
    """Did the stage produce everything it promises (GRPO: the full state of its target)?"""
    if not all(p.exists() for p in stage.outputs):
        return False
    if stage.name == "grpo":
        return target in RunLayout(run).policy_steps("policy", full=True)
    return True


def check_unchanged(stage: Stage, srec: dict, n: int) -> None:
    if not stage.verify:
        return
    for path, sha in srec["outputs"].items():
        p = Path(path)
        if not p.exists() or fingerprint(p) != sha:
            raise CycleError(f"{p} ({stage.name} of cycle {n}) changed or vanished since the stage finished; later "
                             "stages were built from the recorded version: restore it, or start a new RUN")


# =========================================================================== the loop
def plan(job: CycleJob) -> list[dict]:
    """Every stage still to run, with inputs, outputs and command; writes nothing."""
    state = load_state(job.run)
    out = []
    for n in range(1, job.cycles + 1):
        rec = begin_cycle(job, state, n, planning=True)
        if rec.get("finished"):
            continue
        for st in plan_stages(job, n, rec):
            done = rec["stages"].get(st.name, {}).get("done")
            out.append({"cycle": n, "stage": st.name, "status": "done (skipped)" if done else "to run",
                        "side": st.side, "gpu": st.gpu, "outputs": [str(p) for p in st.outputs],
                        "command": shlex.join(command(job, st))})
        # the next cycle's plan reads this one's parameters: mark it as if finished
        rec["finished"] = "planned"
    return out


def main(job: CycleJob) -> dict:
    from wmrl.procs import exclusive

    begin_cycle(job, load_state(job.run), 1)  # no policy to start from: said before anything is written
    job.run.mkdir(parents=True, exist_ok=True)
    with exclusive(job.run, "make cycle", name=".cycle.lock"):
        state = load_state(job.run)
        for n in range(1, job.cycles + 1):
            rec = begin_cycle(job, state, n)
            write_json(state_path(job.run), state)
            if rec.get("finished"):
                print(f"[cycle {n}] finished earlier: skipped")
                continue
            run_stages(job, state, n, rec)
            rec["lineage"] = lineage(job.run, rec)
            rec["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            write_json(state_path(job.run), state)
            if job.report:
                build_report(job)
            print(f"[cycle {n}/{job.cycles}] finished: policy {rec['policy_in']} -> " + (
                "unchanged (GRPO skipped: the pair is measured below cycle.min_agreement; the next cycle collects "
                "with the same policy)" if rec.get("grpo_skipped") else f"GRPO step {rec['grpo_to']}"))
    return state


def run_stages(job: CycleJob, state: dict, n: int, rec: dict) -> None:
    """Cycle n's stages in order; a background stage runs alongside the next ones until a stage
    that needs it (or the cycle's end) waits for it. Any failure stops what still runs."""
    from wmrl.preflight import check_gpus
    from wmrl.procs import run_child, start_child, stop_child

    logs = RunLayout(job.run).logs / "cycle"
    logs.mkdir(parents=True, exist_ok=True)
    log = lambda st: logs / f"cycle_{n}_{st.name}.log"  # noqa: E731
    pending: dict = {}  # name -> (stage, process, start time, end) of running background stages

    def ended(st: Stage, rc: int, t0: float, t1: float | None = None) -> None:
        srec = rec["stages"][st.name]
        srec["seconds"] = round(srec["seconds"] + (t1 or time.time()) - t0, 1)
        write_json(state_path(job.run), state)
        if rc != 0:
            raise CycleError(f"{st.name} of cycle {n} failed (exit {rc}){last_line(log(st))}; its log: {log(st)}. Fix the "
                             "cause and rerun the same command: finished stages are skipped, this one resumes")

    def finished(st: Stage) -> None:
        if not stage_finished(st, job.run, rec["grpo_to"]):
            raise CycleError(f"{st.name} of cycle {n} ended without its outputs "
                             f"({', '.join(str(p) for p in st.outputs)}); rerun the same command to continue it")
        rec["stages"][st.name].update(done=True, command=shlex.join(command(job, st)),
                                      finished=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                      outputs={str(p): fingerprint(p) for p in st.outputs})
        write_json(state_path(job.run), state)
        if job.report:
            build_report(job)

    def join(name: str) -> None:
        st, proc, t0, end = pending.pop(name)
        print(f"[cycle {n}/{job.cycles}] waiting for {name} (background; its log: {log(st)})", flush=True)
        end["thread"].join()  # it returns once the child has ended
        ended(st, proc.returncode, t0, end["time"])
        print(f"[cycle {n}/{job.cycles}] {name}: finished in {end['time'] - t0:.0f} s", flush=True)
        finished(st)

    def watch(proc) -> dict:
        """When the background child really ended: the cycle only looks at it between stages."""
        end: dict = {}

        def wait() -> None:
            proc.wait()
            end["time"] = time.time()

        end["thread"] = threading.Thread(target=wait, daemon=True)
        end["thread"].start()
        return end

    try:
        for st in plan_stages(job, n, rec):
            srec = rec["stages"].get(st.name)
            if srec and srec.get("done"):
                check_unchanged(st, srec, n)
                print(f"[cycle {n}/{job.cycles}] {st.name}: done earlier, skipped")
                continue
            # a pair at chance teaches the policy the reward model's errors (bench/RESULTS.md): no GRPO
            # in it; the policy goes on unchanged, and the next cycle's data and updates improve the pair
            if st.name == "grpo" and not rec.get("grpo_skipped") and (refusal := pair_refused(job, rec)):
                rec["grpo_skipped"] = refusal
                write_json(state_path(job.run), state)
            if st.name in ("grpo", "evaluate") and rec.get("grpo_skipped"):
                print(f"[cycle {n}/{job.cycles}] {st.name}: skipped, {rec['grpo_skipped']}", flush=True)
                continue
            for name in st.needs:
                if name in pending:
                    join(name)
            srec = rec["stages"].setdefault(st.name, {"attempts": 0, "seconds": 0.0})
            cmd = command(job, st)
            t0 = time.time()
            if st.skip_if is not None and st.skip_if.exists():
                print(f"[cycle {n}/{job.cycles}] {st.name}: {st.skip_if} is already written (by an earlier stage or run)")
            else:
                if st.gpu and pending:  # checked when the background stage started; now our own work is on it
                    print(f"[cycle {n}/{job.cycles}] {st.name}: GPU pre-flight skipped ({', '.join(pending)} uses it)")
                elif st.gpu:
                    check_gpus(job.gpus, job.cfg.gpu_margin_gib)
                srec["attempts"] += 1
                if st.background:
                    print(f"[cycle {n}/{job.cycles}] {st.name} (background, log {log(st)}): {shlex.join(cmd)}", flush=True)
                    proc = start_child(cmd, log=log(st), env=stage_env(job), cwd=REPO)
                    pending[st.name] = (st, proc, t0, watch(proc))
                    continue
                print(f"[cycle {n}/{job.cycles}] {st.name}: {shlex.join(cmd)}", flush=True)
                ended(st, run_child(cmd, log=log(st), env=stage_env(job), cwd=REPO), t0)
            finished(st)
        for name in list(pending):
            join(name)
    finally:
        for _, proc, _, _ in pending.values():
            stop_child(proc)


def last_line(log: Path, limit: int = 400) -> str:
    """': <the log's last non-empty line>' (a stage's own error says what to do: e.g. GRPO's
    refusal of a pair below grpo.min_agreement), or '' when there is none."""
    try:
        lines = [x.strip() for x in log.read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        return ""
    return f": {lines[-1][:limit]}" if lines else ""


def lineage(run: Path, rec: dict) -> dict:
    """Which policy collected which data, which data trained which pair, which pair trained
    which policy (with the hashes the records hold)."""
    st = rec["stages"]
    c = RunLayout(rec["dir"])
    sha = lambda stage, path: st[stage]["outputs"][str(path)]  # noqa: E731
    before = RunLayout(run).evidence(rec["grpo_from"])  # GRPO's own evaluation of its start, if it made one
    if not before.exists():
        before = start_evidence(run, rec["policy_in"])  # evaluate_start's
    skipped = bool(rec.get("grpo_skipped"))  # the policy left the cycle as it came in
    after = None if skipped else RunLayout(run).evidence(rec["grpo_to"])
    if after is not None and label_of(after):  # before with the sampler of after, where the start kept one
        before = evaluation_with(before, label_of(after)) or before
    found = lambda p: read_json(p, CycleError, "") if p and p.exists() else None  # noqa: E731
    ev_before, ev_after = found(before), found(after)
    rate = lambda ev: ev["summary"]["success_rate"] if ev else None  # noqa: E731
    pair, packed = grpo_pair(rec), "package_students" if rec.get("students") else "package"
    return {"policy_in": rec["policy_in"], "data": str(c.collect), "data_sha256": sha("collect", c.collect),
            "manifest_sha256": sha("manifest", c.manifest), "pair": str(pair),
            "pair_sha256": sha(packed, pair / "pair.json"),
            "policy_out": rec["policy_in"] if skipped else f"{rec['grpo_to']}",
            "policy_out_sha256": None if skipped else sha("grpo", RunLayout(run).checkpoint(rec["grpo_to"])),
            "success_before": rate(ev_before), "success_after": rate(ev_after),
            # the same fixed states before and after: the change read state by state, with its spread
            "success_change": paired_change(ev_before, ev_after) if ev_before and ev_after else None}


def build_report(job: CycleJob) -> None:
    """The report is drawn by the policy side (matplotlib), like any stage."""
    from wmrl.procs import run_child

    cmd = runner_command(job.train_py, "-m", "wmrl.report", "--run", str(job.run))
    rc = run_child(cmd, log=RunLayout(job.run).logs / "cycle" / "report.log", env=stage_env(job), cwd=REPO)
    if rc != 0:
        raise CycleError(f"the report failed (exit {rc}); see {RunLayout(job.run).logs / 'cycle' / 'report.log'}")
