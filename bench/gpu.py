"""The GPU measurements of bench/RESULTS.md: each phase runs the kit's own stage scripts with
the Make variables' names and meanings, on a lent GPU machine (``bash bench/prepare_gpu.sh``
readies it; this script calls it). Every phase writes its variables, the machine, the
versions and the physics it runs (bench/physics_fingerprint.py against the stored fingerprints:
"identical_to": ["h100_mujoco237"] where the pinned build runs) beside its figures
(``BENCH_OUT/<phase><TAG>_settings.json``), the wall time of every stage
(``BENCH_OUT/times.jsonl``), the stages' logs, and a tarball of the run's small artefacts
(``BENCH_OUT``: default runs/gpu_out; bring it back in one tarball, the lent machine's tool
returns only a few files).

    python3 bench/gpu.py learn RUN=runs/h200 EPISODES=50 STEPS=4000 [DEMO_ARGS="--action-noise 0.2"] [SFT_ARGS="--seed 1"]
                               [PACK_BACK=1 PACK_NAME=sft4000: the policy as BENCH_OUT/sft4000.tar.xz.part00, .part01, .sha256;
                               PACK_SFT=1: the same where PACK_BACK means grpo's, e.g. learn+eval+grpo PACK_SFT=1 PACK_BACK=state]
    python3 bench/gpu.py eval  RUN=runs/h200 CKPT=sft/4000 [SAMPLER=ode] [TEMPERATURE=1.6] [OVERWRITE=1] [TRIALS=10]
    python3 bench/gpu.py unpack+signal POLICY_PACK=.offline/policy/sft4000_run17.tar.xz RUN=runs/h200 [BATCHES=4 GROUPS=16
                               VARIANTS=0,3,1]   (the GRPO gradient's signal and noise: bench/grpo_signal.py)
    python3 bench/gpu.py unpack+grpo POLICY_PACK=.offline/policy/sft4000_run17.tar.xz RUN=runs/h200 ...
                               (a carried policy instead of learn: carry that one pack; bench/policy_pack.py)
    python3 bench/gpu.py grpo  RUN=runs/h200 SEEDS=0,1 GPUS=0,1 TARGET=25 MAX_MINUTES=10 [NPROC=2 ENV=sim|wm PAIR=... LR=...
                               PAIRS="RUN/model_pair RUN/model_pair_students": one run per pair and seed, at once
                               THRESHOLDS="pair closed-loop": one run per reward threshold too (after calibrate)
                               DESIRED_KL=... TRAINABLE=expert|all EPOCHS=1 ROLLOUT_TEMPERATURE=1 FINAL_TRIALS=20
                               ROLLOUT_PHYSICS=split (default lean) EVAL_FIRST=0 (seed 0's run evaluates step 0 first)
                               ROBOT_INIT_NOISE=0 (rollouts with the arm at rest, as before run 16; default 0.02)
                               MAX_SETTLE_SHIFT=0 (keep placements that throw an object while settling; default 0.1)
                               GRPO_ARGS="--noisy-transitions one --eval-sampler ode" (any grpo.py option)
                               BASELINE=bench/baselines/sft4000_run12_ode_10x50.json (ENV=wm: imagined vs real
                               change by task, bench/grpo_transfer.py, against the starting policy's evaluation)
                               PACK_BACK=1: each seed's newest weights into BENCH_OUT as a delta against POLICY_PACK;
                               unpack one later with POLICY_PACK=<delta> POLICY_BASE=<the full pack>;
                               PACK_BACK=state: the newest full state, portable (no Adam moments), in parts;
                               PACK_BACK=state+moments: with Adam's moments (bfloat16), no restart at the join;
                               the next call resumes it: unpack+grpo POLICY_PACK=<it> KIND=policy (into
                               GRPO_RUN/seedS; one seed) and the same grpo variables]
                               (one run per seed in GRPO_RUN/seedS, default RUN/grpo, each from FROM=RUN's
                               newest supervised checkpoint, at the same time on their GPU and share of the cores)
    python3 bench/gpu.py learn+eval+grpo ...     # phases one after the other (one set of variables)
    python3 bench/gpu.py wm    RUN=runs/h200 EPISODES=20 [STEPS=4000 (the profile's unless given)
                               MAX_MINUTES=6 MICRO=256 ACCUM=1 GPUS_MAIN=0 GPUS_WRIST=0
                               WM_BENCH=1 WM_ARGS="--compile" FRAME_INTERVAL=0 (chunk boundaries only)
                               REWARD_ARGS="--control-negatives hold,random" (any wm_reward.py option)
                               COLLECT="sft/4000@T=1 sft/4000@T=3" COLLECT_EPISODES=20 (RUN's policy's own episodes as new
                               data, after unpack: unpack+wm; EPISODES=0: no demonstrations) VAL_RATIO=0.2 (held out)
                               MORE=1: train RUN's finished pair further, then its reward, pair and wm_eval again;
                               MORE_ROUNDS=1 MORE_MINUTES=4 [MIN_AGREEMENT=0.6]: so, where GRPO's gate would refuse the pair]
    python3 bench/gpu.py unpack+cycle POLICY_PACK=.offline/policy/sft4000_run17.tar.xz RUN=runs/h200 EPISODES=24
                               MAX_MINUTES=6 GRPO_STEPS=20 [CYCLE_ARGS=...]   (make cycle from a carried policy: collect,
                               world models, reward, pair, GRPO in the pair, the 10 x 50 before and after)
    python3 bench/gpu.py probe PROBE_RUN=runs/probe PROBE_EPISODES=15 [ARCHS="32,64,128,256x1 p4:128,256,256x1" MINUTES=2
                               VIEW=main|wrist|main,wrist BATCH=64[,256] LR=2e-4[,4e-4] WM_DEMO_ARGS=...
                               SEEDS=0,1 EMA=0.999 FINAL_STEPS=8,16 PHASES=0,1 SELF_CONTEXT=0,0.25 SCHEDULE=cosine]
                               (world-model architectures at equal
                               training time, PSNR and SSIM, real | imagined strips;
                               pP: P x P pixel patches folded into channels, pP+R: and an R-channel
                               full-resolution head, @N: context noise, /rS: the change
                               from the current frame with sigma_data S, ~W: moving pixels weigh 1 + W in the loss,
                               a final ^: the end effector now and after the chunk drawn as input channels;
                               each ends with its action response; bench/wm_probe.py)
    python3 bench/gpu.py distill RUN=runs/h200 [DISTILL_STEPS=1000 SF_STEPS=600 BATCHES=64,256 DISTILL_BENCH=0] (one-step
                               students against their teachers: fidelity, imagined steps/s with the policy;
                               SF_STEPS: Stage 3, self-forcing DMD, after the sampler distillation;
                               after a cycle: unpack+cycle+distill ... DISTILL_RUN=runs/h200/cycles/cycle_1;
                               GRPO in the students: unpack+wm+distill+grpo ... ENV=wm
                               PAIR=runs/h200/model_pair_students GROUPS=256 (their rollouts take half the time))
    python3 bench/gpu.py wmspeed [MICROS=16,64 VARIANTS=eager,channels_last,compile,channels_last+compile]
                               (what each world-model training speed option buys, with profiler tables;
                               compile's own: compile+nhwc, compile+nhwc+graphs, compile+nhwc+autotune;
                               compile+nhwc+fast+refine2: the refine head on 2 x 2 pixel patches, another model)
    python3 bench/gpu.py rank  RUN=runs/h200 POLICIES="sft/1000 sft/2000 sft/4000 sft/4000@T=3 hold" [TRIALS=4 REAL_TRIALS=10
                               RANK_ARGS="--traces"]
    python3 bench/gpu.py gap   RUN=runs/h200 [POLICY=sft/4000@ode GAP_EPISODES=20 GUIDANCE=1,2 (a pair trained with
                               WM_ARGS="--compile --action-dropout 0.1")]   (the policy's actions on the pair's
                               imagined frames against the real ones, bench/action_gap.py; after wm: unpack+wm+gap+grpo)
    python3 bench/gpu.py calibrate RUN=runs/h200 [PAIR=runs/h200/model_pair_students CALIBRATE_POLICY=sft/4000@T=1
                               TRIALS=8]   (the reward's threshold closed loop, make wm-calibrate; then GRPO with
                               THRESHOLDS=closed-loop: unpack+wm+distill+calibrate+grpo ...)
    python3 bench/gpu.py reward RUN=runs/h200 [REWARD_VARIANTS="base: share:--generated-share+0.5+--generated-samples+2"
                               REWARD_SEEDS=0,1 STUDENTS=1 CONTROL_TRIALS=2 KEEP_FIRST=1]   (reward variants on RUN's finished
                               pair, each seed trained, packaged and evaluated; OUT/fidelity_<variant>_s<seed>.json
                               and bench/reward_ranking.py's table of them, OUT/reward_ab.md; after wm: unpack+wm+reward)
    python3 bench/gpu.py sim   [SIZES=128,256 EXPERT=1]   (simulator throughput; the expert over the 500 fixed states)
    python3 bench/gpu.py unpack+starts POLICY_PACK=... RUN=runs/h200 [CKPT=sft/4000 SAMPLER=sde TEMPERATURE=1
                               START_EPISODES=50]   (the policy from the fixed states, bare random placements and
                               ones with the arm jittered as the fixed states hold it: bench/start_gap.py)
    python3 bench/gpu.py speedrun RUN=runs/speedrun [PROFILE=speedrun MAX_MINUTES=... GPUS=0,1]   (make speedrun's stages;
                               carry .offline/wm312 too: bash bench/make_wm_wheels.sh)
    python3 bench/gpu.py bimanual BUNDLE=.offline/aloha_bundle ITERS0=2000 ITERS1=1000 [ITERS2=500 ITERS3=300]
                               [OVERRIDES="model.action_tokens=true model.width=512"]
                               (ITERS2: Stages 2-3, export, student vs teacher quality and frames/s)
    python3 bench/gpu.py grpo GRPO_RUN=runs/h200/grpo_b TAG=_b WORKERS_PER_RUN=8 ... BACKGROUND=1
                                                  # a second set of GRPO runs beside the first (A/B)
    python3 bench/gpu.py PHASE ... BACKGROUND=1   # start it in its own session and return (the lent
                                                  # machine's calls last at most 10 minutes)
    python3 bench/gpu.py wait SECONDS=540         # follow background phases; returns when they end or time is up
                                                  # (the lent machine goes back 30 s after a call: a
                                                  # late follow-up call loses the background work; prefer
                                                  # calls that finish their work and resume)
    SKIP_PREPARE=1 PYTHON=.venv/train/bin/python WM_PYTHON=.venv/wm/bin/python python3 bench/gpu.py learn PROFILE=tiny ...
                                                  # the same on a CPU

A phase that stops at a call's end is continued by running it again: every stage resumes.

What the calls carry (.offline/py312, .offline/wm312, .offline/mujoco237, .offline/policy, .gl) is
ignored by git and does not outlive a checkout: ``bash bench/prepare_carry.sh`` rebuilds all of it (a few minutes).

A chain over several calls of the lent machine (each call may carry 64 MiB with the tree, and
the tree is replaced at every call; .offline/py312 with one policy pack and the tree is ~66 MiB,
too much for one call; .offline/policy holds three packs, 58 MiB, so carry the one file you need,
e.g. .offline/policy/sft4000_run17.tar.xz): the first call carries .offline/py312 and .gl, prepares and copies the tree to
/root/tree (``runs`` linked to /root/runs); with .offline/mujoco237 carried too (~62 MiB with the tree) it
installs the pinned mujoco 2.3.7's wheel built for Python 3.12 on the CPU machine (kept in git history,
restored by prepare_carry.sh; where it does not load, it builds one there from the sources beside it,
292 s on an H100 host's 16 cores, and leaves a copy in BENCH_OUT to keep; carrying the wheel's file
alone, .offline/mujoco237/mujoco-2.3.7-cp312-cp312-linux_x86_64.whl, saves 9 MiB, and then a wheel
that does not load stops the preparation until the folder is carried) and
simulates with it instead of the bundle's 3.3.7 (a GRPO gain measured in one build did not carry to the
other: bench/RESULTS.md, "Runs 19 and 20"); the second, made at once, carries .offline/wm312 and
that one pack, runs ``bash bench/prepare_gpu.sh`` (DeepSpeed), copies the policy to /root/policy and
starts the whole chain in /root/tree with BACKGROUND=1 and POLICY_PACK=/root/policy/..., then
``python3 bench/gpu.py wait``; each later call waits and brings the files back. A measurement of
the world models' speed alone needs one call: carry .offline/wm312, ``pip install --no-index
--target /tmp/wm .offline/wm312/*.whl``, ``PYTHONPATH=/tmp/wm:python python3 bench/wm_throughput.py``.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
from wmrl.layout import RunLayout  # noqa: E402  (standard library only: fine before the environment is ready)
from wmrl.procs import torchrun  # noqa: E402  (likewise)
from wmrl.release.pair import CLOSED_LOOP_FILE, FIDELITY_FILE, ModelPair, PairError, check_agreement  # noqa: E402  (likewise)

PROFILE = "default"
OUT = Path(os.environ.get("BENCH_OUT", ROOT / "runs" / "gpu_out"))  # not $OUT: the lent machine's tool uses that name
PY = os.environ.get("PYTHON", sys.executable)  # the interpreter of the stages
WM_PY = os.environ.get("WM_PYTHON", PY)  # the world-model side's (one Python on the lent machine; two venvs on a CPU)


def variables(argv: list[str]) -> dict[str, str]:
    out = {}
    for a in argv:
        if "=" not in a:
            sys.exit(f"error: {a!r}: give variables as NAME=VALUE (see the docstring)")
        k, v = a.split("=", 1)
        out[k] = v
    return out


def prepare() -> dict:
    if os.environ.get("SKIP_PREPARE") == "1":  # a machine that has the kit's environment already (a CPU check)
        return {**os.environ, "PYTHONUNBUFFERED": "1", "TQDM_DISABLE": "1"}
    line = subprocess.run(["bash", str(ROOT / "bench" / "prepare_gpu.sh")], check=True, capture_output=True,
                          text=True, cwd=ROOT).stdout.strip().splitlines()[-1]
    env = dict(os.environ)
    env.update(dict(kv.split("=", 1) for kv in shlex.split(line)))
    return env


def machine(env: dict) -> dict:
    info = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "cores": os.cpu_count()}
    try:
        info["gpus"] = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.strip().splitlines()
    except OSError:
        info["gpus"] = []
    code = ("import json, torch, numpy\nout = {'torch': torch.__version__, 'numpy': numpy.__version__}\n"
            "for m in ('mujoco', 'robosuite', 'deepspeed'):\n    try:\n        out[m] = __import__(m).__version__\n"
            "    except Exception:\n        out[m] = 'absent'\nprint(json.dumps(out))")
    r = subprocess.run([PY, "-c", code], capture_output=True, text=True, env=env)
    # the JSON is the last line: importing DeepSpeed without a GPU prints a warning on stdout first
    last = (r.stdout.strip().splitlines() or [""])[-1]
    info["versions"] = json.loads(last) if r.returncode == 0 else {"error": r.stderr[-300:]}
    info["git_commit"] = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    info["physics"] = physics(env)
    return info


def physics(env: dict) -> dict:
    """Which physics this machine runs, as bench/physics_fingerprint.py reads it (once per machine,
    ~10 s): the stored fingerprint it equals bit for bit, if any. A GRPO gain belongs to the build it
    trained in (bench/RESULTS.md, "Run 19"), so every phase's settings name it, and a run that was
    meant for the pinned 2.3.7 but got the bundle's 3.3.7 (.offline/mujoco237 not carried) shows it."""
    cache = Path("/tmp/wmrl_physics_fingerprint.json")
    # read again once a mujoco on the stages' path changed (prepare_gpu.sh installs 2.3.7 over 3.3.7)
    installed = [Path(p) / "mujoco" for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    changed = max((m.stat().st_mtime for m in installed if m.is_dir()), default=0.0)
    if not cache.is_file() or cache.stat().st_mtime < changed:
        r = subprocess.run([PY, "bench/physics_fingerprint.py", "--out", str(cache)], cwd=ROOT, env=env,
                           capture_output=True, text=True)
        if r.returncode != 0:
            return {"error": (r.stderr or r.stdout)[-300:]}
    mine = json.loads(cache.read_text())
    known = {f.stem.removeprefix("physics_fingerprint_"): json.loads(f.read_text())["sha256"]
             for f in sorted((ROOT / "bench" / "baselines").glob("physics_fingerprint_*.json"))}
    same = [name for name, sha in known.items() if sha == mine["sha256"]]
    out = {"sha256": mine["sha256"], "versions": mine["versions"], "identical_to": same}
    print(f"[gpu] physics: mujoco {mine['versions'].get('mujoco')}, fingerprint {mine['sha256'][:16]}, "
          f"{'bit for bit ' + ', '.join(same) if same else 'like no stored fingerprint'}", flush=True)
    return out


def stage(name: str, script: str, args: list, env: dict, *, background: bool = False, extra_env: dict | None = None,
          nproc: int = 1):
    """``python3 python/<script> args`` (or a bench script), timed, its output in OUT/<name>.log;
    ``nproc`` > 1: one process per GPU through torchrun."""
    OUT.mkdir(parents=True, exist_ok=True)
    cmd = [PY, *torchrun(nproc), script if script.startswith("bench/") else f"python/{script}", *map(str, args)]
    if PROFILE != "default" and script not in ("bimanual.py", "make_manifest.py", "bench/sim_throughput.py",
                                                                  "bench/policy_pack.py", "bench/wm_probe.py", "wm_eval.py",
                                                                  "bench/closed_loop_gap.py", "wm_calibrate.py",
                                                                  "bench/start_gap.py"):
        cmd += ["--profile", PROFILE]
    log = open(OUT / f"{name}.log", "a")
    print(f"[gpu] {name}: {' '.join(cmd)}", flush=True)
    t0 = time.time()
    p = subprocess.Popen(cmd, cwd=ROOT, env={**env, **(extra_env or {})}, stdout=log, stderr=subprocess.STDOUT)
    if background:
        return p, t0, name, log
    return finish(p, t0, name, log)


def finish(p, t0, name, log) -> int:
    rc = p.wait()
    log.close()
    rec = {"stage": name, "seconds": round(time.time() - t0, 1), "exit": rc}
    with open(OUT / "times.jsonl", "a") as f:
        f.write(json.dumps(rec) + "\n")
    print(f"[gpu] {name}: exit {rc} after {rec['seconds']} s", flush=True)
    if rc != 0:
        print((OUT / f"{name}.log").read_text()[-3000:], flush=True)
    return rc


def pack(run: Path, name: str) -> None:
    """The run's small artefacts (JSON, JSONL, PNG, logs; no weights) as OUT/<name>.tar.gz."""
    OUT.mkdir(parents=True, exist_ok=True)
    with tarfile.open(OUT / f"{name}.tar.gz", "w:gz") as tar:
        for p in sorted(Path(run).rglob("*")):
            if p.is_file() and p.suffix in (".json", ".jsonl", ".png", ".log", ".txt", ".out", ".gif", ".mp4") \
                    and p.stat().st_size < 4 << 20 and "episodes" not in p.name:
                tar.add(p, arcname=str(p.relative_to(Path(run).parent)))


# ----------------------------------------------------------------------------------- phases
def demos_and_sft(run: str, workers: str, v: dict, env: dict, steps: str | None, gpus: str = "") -> int:
    """Scripted demonstrations into RUN/demos, then SFT on them (``steps``; None: the profile's;
    ``gpus`` "0,1": one process per GPU through torchrun, as make sft GPUS=0,1); the SFT stage's
    exit code (a failed collection stops the phase)."""
    demos = RunLayout(run).demos
    if stage("demos", "collect_demos.py", ["--workers", workers, "--out", demos, "--no-progress",
                                            *(["--episodes", v["EPISODES"]] if "EPISODES" in v else []),
                                            *shlex.split(v.get("DEMO_ARGS", ""))], env):
        sys.exit(1)
    return stage("sft", "sft.py", ["--run-dir", run, "--data", demos, *(["--steps", steps] if steps else []),
                                   "--no-progress", "--no-tensorboard", *shlex.split(v.get("SFT_ARGS", ""))], env,
                 extra_env={"CUDA_VISIBLE_DEVICES": gpus} if gpus else None, nproc=len(gpus.split(",")) if gpus else 1)


def phase_learn(v: dict, env: dict) -> None:
    run = v.get("RUN", "runs/h200")
    demos_and_sft(run, v.get("WORKERS", str(os.cpu_count())), v, env, v.get("STEPS", "4000"))
    pack(Path(run), "learn")
    # the supervised policy itself, to carry in later sessions (POLICY_PACK=...); PACK_SFT=1 asks for it
    # in a chain whose grpo phase brings back its state (learn+eval+grpo PACK_SFT=1 PACK_BACK=state+moments)
    if v.get("PACK_BACK") == "1" or v.get("PACK_SFT") == "1":
        layout, name = RunLayout(run), v.get("PACK_NAME", f"sft{v.get('STEPS', '4000')}")
        steps = layout.policy_steps("sft")
        if steps:
            pack_for_return("pack_sft", layout.checkpoint(steps[-1], "sft"), OUT / f"{name}.tar.xz", [], env)


def pack_for_return(name: str, ckpt: Path, out: Path, options: list[str], env: dict) -> None:
    """``bench/policy_pack.py pack ckpt out options`` as stage ``name``, split to come back."""
    if not stage(name, "bench/policy_pack.py", ["pack", ckpt, out, *options], env):
        split_for_return(out)


def split_for_return(path: Path, part: int = 15 << 20) -> None:
    """A file over the 16 MiB that comes back from the lent machine, as <name>.partNN files of at most
    ``part`` bytes and <name>.sha256 (here: ``cat <name>.part* > <name>; sha256sum -c <name>.sha256``)."""
    data = path.read_bytes()
    if len(data) <= part:
        return
    (path.parent / f"{path.name}.sha256").write_text(f"{hashlib.sha256(data).hexdigest()}  {path.name}\n")
    for i in range(0, len(data), part):
        (path.parent / f"{path.name}.part{i // part:02d}").write_bytes(data[i:i + part])
    path.unlink()


def phase_unpack(v: dict, env: dict) -> None:
    """A carried policy (POLICY_PACK=.offline/policy/x.tar.xz, bench/policy_pack.py) as RUN's supervised
    checkpoint, instead of demonstrations and SFT: ~400 s of the session saved, and every run starts
    from the same policy. Does nothing when it is already unpacked."""
    if "POLICY_PACK" not in v:
        sys.exit("error: unpack needs POLICY_PACK=<a .tar.xz from bench/policy_pack.py pack>")
    base = ["--base", v["POLICY_BASE"]] if "POLICY_BASE" in v else []  # a delta pack's full pack (PACK_BACK below)
    kind, dest = v.get("KIND", "sft"), v.get("RUN", "runs/h200")
    if kind == "policy":  # a portable GRPO state (PACK_BACK=state) into the run grpo resumes: GRPO_RUN/seedS
        dest = f"{v.get('GRPO_RUN', f'{dest}/grpo')}/seed{v.get('SEEDS', '0')}"
    if stage("unpack", "bench/policy_pack.py", ["unpack", v["POLICY_PACK"], dest, *base, "--kind", kind], env):
        sys.exit(1)


def phase_eval(v: dict, env: dict) -> None:
    run = v.get("RUN", "runs/h200")
    ckpt = v.get("CKPT", f"sft/{v.get('STEPS', '4000')}")
    args = ["--run", run, "--ckpt", ckpt, "--workers", v.get("WORKERS", str(os.cpu_count())), "--no-progress",
            *(["--sampler", v["SAMPLER"]] if "SAMPLER" in v else []),
            *(["--temperature", v["TEMPERATURE"]] if "TEMPERATURE" in v else []),
            *(["--trials", v["TRIALS"]] if "TRIALS" in v else []),  # fewer than 50 per task: a throughput figure
            *(["--out", v["OUT_DIR"]] if "OUT_DIR" in v else []),
            # OVERWRITE=1 (evaluate.py's own advice when an evaluation exists): e.g. the same checkpoint with
            # another sampler into the default folder; OUT_DIR alone keeps its old meaning (a fresh folder)
            *(["--overwrite"] if "OUT_DIR" in v or v.get("OVERWRITE") == "1" else [])]
    stage(f"eval_{ckpt.replace('/', '_')}", "evaluate.py", args, env)
    pack(Path(run), "eval")


def grpo_options(v: dict) -> list[str]:
    """grpo.py's options that the variables set (the same for every seed)."""
    args = []
    for flag, key in (("--max-minutes", "MAX_MINUTES"), ("--lr", "LR"), ("--groups", "GROUPS"),
                      ("--group-size", "GROUP_SIZE"), ("--eval-interval", "EVAL_INTERVAL"),
                      ("--eval-trials", "EVAL_TRIALS"), ("--final-trials", "FINAL_TRIALS"),
                      ("--envs-per-worker", "ENVS_PER_WORKER"), ("--minibatches", "MINIBATCHES"),
                      ("--desired-kl", "DESIRED_KL"), ("--target-kl", "TARGET_KL"),
                      ("--ratio-transitions", "RATIO_TRANSITIONS"), ("--trainable", "TRAINABLE"),
                      ("--epochs", "EPOCHS"), ("--temperature", "ROLLOUT_TEMPERATURE"),
                      ("--rollout-physics", "ROLLOUT_PHYSICS"), ("--start-recorded-by", "START_RECORDED_BY"),
                      ("--robot-init-noise", "ROBOT_INIT_NOISE"), ("--max-settle-shift", "MAX_SETTLE_SHIFT")):
        if key in v:
            args += [flag, v[key]]
    return args + shlex.split(v.get("GRPO_ARGS", ""))  # GRPO_ARGS="--noisy-transitions one --eval-sampler ode": any option


def check_grpo_options(v: dict) -> None:
    """GRPO's settings checked before a chain starts (in the background, a bad combination would
    surface only at its grpo phase, after the unpacking and any world-model work): this call
    fails at once, while the lent machine is still warm for the corrected one."""
    sys.path.insert(0, str(ROOT / "python"))
    import grpo as entry  # python/grpo.py

    from wmrl.config import ConfigError

    try:
        entry.parse(["--profile", PROFILE, "--target", v.get("TARGET", "20"), *grpo_options(v)])
    except ConfigError as e:
        sys.exit(f"error: GRPO settings: {e}")


def phase_grpo(v: dict, env: dict) -> None:
    """One GRPO run per seed, at the same time, each on its own GPU and its share of the cores;
    NPROC=2: each run on two GPUs (GPUS=0,1; one seed), its groups' rollouts split between them.
    PAIRS="runs/h200/model_pair runs/h200/model_pair_students": one run per pair and seed, all at
    once (GRPO_RUN/<pair's folder name>_seedS), e.g. teachers against their students on one GPU.
    THRESHOLDS="pair closed-loop": one run per reward threshold too (GRPO_RUN/seedS_<threshold>),
    the replay-calibrated one against make wm-calibrate's in the same pair, all at once."""
    seeds = v.get("SEEDS", "0").split(",")
    pairs = v["PAIRS"].split() if "PAIRS" in v else [v.get("PAIR")]
    thresholds = v["THRESHOLDS"].split() if "THRESHOLDS" in v else [None]
    if (len(pairs) > 1 or len(thresholds) > 1) and v.get("PACK_BACK"):
        sys.exit("error: PACK_BACK brings back one setting's runs: give PAIR=... (and no THRESHOLDS)")
    gpus = v.get("GPUS", "0").split(",")
    nproc = int(v.get("NPROC", "1"))
    runs = [(s, pair, th) for pair in pairs for th in thresholds for s in seeds]
    per = int(v.get("WORKERS_PER_RUN", max(1, (os.cpu_count() or 2) // len(runs))))
    root = Path(v.get("GRPO_RUN", f"{v.get('RUN', 'runs/h200')}/grpo"))
    names = [(f"seed{s}" if len(pairs) == 1 else f"{Path(pair).name}_seed{s}") + (f"_{th}" if th else "")
             for s, pair, th in runs]
    procs = []
    for i, ((s, pair, th), name) in enumerate(zip(runs, names)):
        args = ["--run-dir", root / name, "--from-run", v.get("FROM", v.get("RUN", "runs/h200")),
                "--target", v.get("TARGET", "20"), "--seed", s, "--workers", per, "--no-progress", "--env", v.get("ENV", "sim"),
                *(["--pair", pair] if pair else []), *(["--reward-threshold", th] if th else [])]
        if s not in v.get("EVAL_FIRST", "").split(","):  # EVAL_FIRST=0: seed 0's run evaluates step 0 first
            args.append("--no-eval-first")
        args += grpo_options(v)
        devices = ",".join(gpus) if nproc > 1 else gpus[i % len(gpus)]
        procs.append((args, devices, stage(f"grpo{v.get('TAG', '')}_{name}", "grpo.py", args, env, background=True,
                                           extra_env={"CUDA_VISIBLE_DEVICES": devices}, nproc=nproc)))
    failed = [(args, devices, p[2]) for args, devices, p in procs if finish(*p) != 0]
    # once more, the same command: it resumes from the saved state (one stopped in its final
    # evaluation gets only that evaluation), so a run that failed late keeps its steps
    again = [stage(name, "grpo.py", args, env, background=True, extra_env={"CUDA_VISIBLE_DEVICES": devices},
                   nproc=nproc) for args, devices, name in failed]
    for p in again:
        finish(*p)
    if v.get("ENV") == "wm":  # imagined beside recorded success by start keyframe (the rollouts log outgrows the pack)
        stage(f"closed_loop_gap{v.get('TAG', '')}", "bench/closed_loop_gap.py",
              [*(root / n for n in names), "--json", OUT / f"closed_loop_gap{v.get('TAG', '')}.json"], env)
        if "BASELINE" in v:  # BASELINE=bench/baselines/sft4000_run12_ode_10x50.json: imagined vs real change by task
            stage(f"grpo_transfer{v.get('TAG', '')}", "bench/grpo_transfer.py",
                  [*(root / n for n in names), "--baseline", v["BASELINE"], "--json",
                   OUT / f"grpo_transfer{v.get('TAG', '')}.json"], env)
    pack(root, "grpo" + v.get("TAG", ""))
    if v.get("PACK_BACK") in ("1", "state", "state+moments"):
        pack_back(root, seeds, v, env)


def pack_back(root: Path, seeds: list[str], v: dict, env: dict) -> None:
    """Each seed's newest GRPO weights into OUT, to evaluate or continue in a later session.
    PACK_BACK=1: a delta against the carried pack (~12 MiB, one file back); PACK_BACK=state: the
    newest full state as a portable state (weights, step, RNG, lr; split in parts under 16 MiB),
    which the next call, on any machine, resumes with ``unpack KIND=policy`` (the lent machine
    goes back 30 s after a call, and the run with it); PACK_BACK=state+moments: with Adam's moments
    in bfloat16 (~20 MB more), so the next session goes on as if the run had not stopped."""
    state = v["PACK_BACK"].startswith("state")
    base = v.get("POLICY_BASE", v.get("POLICY_PACK"))
    if base is None and not state:
        sys.exit("error: PACK_BACK=1 packs against the run's carried pack: give POLICY_PACK=... (or POLICY_BASE=...)")
    for s in seeds:
        run = RunLayout(root / f"seed{s}")
        steps = run.policy_steps("policy", full=state)
        if steps:
            out = OUT / f"grpo{v.get('TAG', '')}_seed{s}_step{steps[-1]}{'_state' if state else ''}.tar.xz"
            options = (["--state", *(["--moments"] if v["PACK_BACK"] == "state+moments" else [])] if state
                       else ["--base", base])
            pack_for_return(f"pack_seed{s}", run.checkpoint(steps[-1]), out, options, env)


def wm_data(run: str, v: dict, env: dict, episodes: str) -> RunLayout:
    """Demonstrations at chunk boundaries (``episodes`` per task) and RUN/manifest.json, unless there.
    WM_DEMO_ARGS: more options of collect_demos.py (``--action-noise 0.2 --keep-failures``: a noisy
    expert whose failures are kept, actions that vary more for the same scene)."""
    layout = RunLayout(run)
    workers = v.get("WORKERS", str(os.cpu_count()))
    # a frame every step where a probe trains on every phase (PHASES=0,1), else at chunk boundaries
    interval = v.get("FRAME_INTERVAL", "1" if "1" in v.get("PHASES", "0").split(",") else "0")
    if episodes != "0" and not list(layout.demos.glob("*.hdf5")):
        stage("wm_demos", "collect_demos.py", ["--workers", workers, "--out", layout.demos,
                                               "--episodes", episodes, "--frame-interval", interval,
                                               "--no-progress", *shlex.split(v.get("WM_DEMO_ARGS", ""))], env)
    # COLLECT="sft/4000@T=1 sft/4000@T=3": RUN's policy's own episodes (unpack a carried one first),
    # failures kept, COLLECT_EPISODES per task each, as the manifest's new data: the pair then
    # sees the mistakes of the policies it must tell apart (make collect; seeds 1, 2, ... in turn)
    new = [v["NEW"]] if "NEW" in v else []
    for i, spec in enumerate(v.get("COLLECT", "").split()):
        ckpt, _, how = spec.partition("@")
        if how == "ode":
            sampler = ["--sampler", "ode"]
        elif how.startswith("T=") or not how:  # the flow-SDE, at temperature 1 unless named
            sampler = ["--sampler", "sde", "--temperature", how[2:] or "1"]
        else:
            sys.exit(f"COLLECT: {spec!r}: write CKPT, CKPT@ode or CKPT@T=<temperature>")
        out = layout.root / ("collect_" + "".join(c if c.isalnum() else "_" for c in spec))
        new.append(str(out))
        if not layout.manifest.exists():  # collect.py continues each task's file where it stopped
            stage(f"collect_{i}", "collect.py", ["--run", run, "--ckpt", ckpt, *sampler, "--extra-temperatures", "",
                                                 "--out", out, "--seed", str(i + 1),
                                                 "--episodes", v.get("COLLECT_EPISODES", episodes), "--workers", workers,
                                                 "--frame-interval", interval, "--no-progress"], env)
    if not layout.manifest.exists():
        # VAL_RATIO=0.3: more held-out episodes (half calibrate the reward, half score the pair's
        # agreement: at 0.2 of 320 episodes, 32 each, an interval +-0.15 wide)
        stage("manifest", "make_manifest.py", ["--run", run, *(["--replay", layout.demos] if episodes != "0" else []),
                                               *(["--new", *new] if new else []),
                                               *(["--val-ratio", v["VAL_RATIO"]] if "VAL_RATIO" in v else [])], env)
    return layout


def phase_wm(v: dict, env: dict) -> None:
    run = v.get("RUN", "runs/h200")
    if v.get("WM_BENCH") == "1":  # the speed of training and imagination first, on an idle GPU
        stage("wm_throughput", "bench/wm_throughput.py", ["--json", OUT / "wm_throughput.json"], env)
    # demonstrations with a frame every step, as `make demos` records them (the update trains on every phase)
    layout = wm_data(run, {"FRAME_INTERVAL": "1", **v}, env, v.get("EPISODES", "20"))
    more = v.get("MORE") == "1" and layout.selection.exists()  # a finished pair trains further (wm_update --more)
    if more:  # to STEPS or MAX_MINUTES more, then a new reward, pair and evaluation
        shutil.rmtree(layout.reward, ignore_errors=True)
    # what every update of this phase shares (a round of training further keeps the batch and options);
    # WM_ARGS="--compile --self-context 0.25": any wm_update option
    common = ["--run", run, "--save-interval", "100", "--no-progress",
              *(["--micro-batch", v["MICRO"]] if "MICRO" in v else []), *(["--grad-accum", v["ACCUM"]] if "ACCUM" in v else [])]
    wm_args = shlex.split(v.get("WM_ARGS", ""))
    # without STEPS, the profile's target (default 4,000 updates), as make wm-update; WM_ARGS last (they win)
    args = [*common, *(["--steps", v["STEPS"]] if "STEPS" in v else []),
            *(["--max-minutes", v["MAX_MINUTES"]] if "MAX_MINUTES" in v else []), *(["--more"] if more else []), *wm_args]
    gpus = {"WM_GPUS_MAIN": v.get("GPUS_MAIN", "0"), "WM_GPUS_WRIST": v.get("GPUS_WRIST", "0")}
    if stage("wm_update", "wm_update.py", args, env, extra_env=gpus):
        sys.exit(1)  # every later stage reads its models (a reward on real frames alone would mislead)
    pair_and_eval(run, layout, v, env, "")
    # MORE_ROUNDS=1 [MORE_MINUTES=4 MIN_AGREEMENT=0.6]: while GRPO's gate would refuse the pair (its
    # agreement below the floor with its whole interval), train it further and evaluate it again
    for r in range(1, int(v.get("MORE_ROUNDS", "0")) + 1):
        try:
            check_agreement(ModelPair(layout.model_pair, {}), float(v.get("MIN_AGREEMENT", "0.6")))
            break
        except PairError as e:
            print(f"[gpu] round {r} of training further: {e}", flush=True)
        shutil.copy(layout.model_pair / FIDELITY_FILE, OUT / f"fidelity_before_round{r}.json")
        shutil.rmtree(layout.reward)
        reached = json.loads(layout.selection.read_text())["wrist"]["step"]
        if stage(f"wm_update_more{r}", "wm_update.py", [
                *common, *wm_args, "--more", "--steps", max(int(v.get("STEPS", "0")), 2 * reached),
                "--max-minutes", v.get("MORE_MINUTES", "4")], env, extra_env=gpus):  # a round's own limit wins
            sys.exit(1)
        pair_and_eval(run, layout, v, env, f"_more{r}")
    pack(Path(run), "wm")


def pair_and_eval(run: str, layout: RunLayout, v: dict, env: dict, suffix: str) -> None:
    """The reward on the updated models' frames, the pair, and its agreement and fidelity (wm_eval);
    a failed stage stops the chain (each reads the one before)."""
    if not (layout.reward / "config.json").exists():  # after the update: it trains on the frames they generate
        if stage("wm_reward" + suffix, "wm_reward.py", ["--run", run, "--no-progress",
                                                         *shlex.split(v.get("REWARD_ARGS", ""))], env):
            sys.exit(1)
    if stage("package" + suffix, "package_pair.py", ["--run", run, "--overwrite"], env) or \
            stage("wm_eval" + suffix, "wm_eval.py", ["--run", run, "--videos", "4"], env):
        sys.exit(1)


def phase_probe(v: dict, env: dict) -> None:
    """World-model architectures compared on the same data and the same training time
    (bench/wm_probe.py: one view, plain PyTorch, bf16): one-chunk and open-loop PSNR."""
    run = v.get("PROBE_RUN", "runs/probe")  # its own names: it chains before other phases (probe+speedrun)
    layout = wm_data(run, v, env, v.get("PROBE_EPISODES", "15"))
    archs = v.get("ARCHS", "64,128,256x2 32,64,128,256x1").split()
    # BATCH=64,256 LR=2e-4,4e-4: each batch size with its learning rate, at the same training time
    batches, lrs = v.get("BATCH", "64").split(","), v.get("LR", "2e-4").split(",")
    if len(lrs) != len(batches):
        sys.exit(f"BATCH has {len(batches)} sizes and LR {len(lrs)} rates: give one rate per batch size")
    for seed in v.get("SEEDS", "0").split(","):  # SEEDS=0,1: the spread of every figure, seed by seed
        for view in v.get("VIEW", "main").split(","):  # VIEW=main,wrist: each view in turn
            # PHASES=0,1: without and with every chunk-boundary phase of the demonstrations;
            # SELF_CONTEXT=0,0.25: without and with a quarter of each batch on the model's own context
            for (batch, lr), phases, own in itertools.product(zip(batches, lrs), v.get("PHASES", "0").split(","),
                                                              v.get("SELF_CONTEXT", "0").split(",")):
                name = ("wm_probe" if view == "main" else f"wm_probe_{view}") + (f"_s{seed}" if seed != "0" else "") \
                    + (f"_b{batch}" if len(batches) > 1 else "") + ("_ph" if phases == "1" else "") \
                    + (f"_sc{own}" if float(own) else "")
                stage(name, "bench/wm_probe.py", ["--manifest", layout.manifest, "--view", view, "--size", v.get("SIZE", "128"),
                                                  *[a for x in archs for a in ("--arch", x)], "--minutes", v.get("MINUTES", "2"),
                                                  "--steps", "100000", "--batch", batch, "--lr", lr,
                                                  "--eval-every", v.get("EVAL_EVERY", "250"), "--seed", seed,
                                                  *(["--ema", v["EMA"]] if "EMA" in v else []),
                                                  *(["--final-steps", v["FINAL_STEPS"]] if "FINAL_STEPS" in v else []),
                                                  *(["--all-phases"] if phases == "1" else []),
                                                  "--self-context", own, "--schedule", v.get("SCHEDULE", "constant"),
                                                  "--json", OUT / f"{name}.json", "--strips", OUT / f"{name}_strips"], env)


def phase_distill(v: dict, env: dict) -> None:
    """One-step students of RUN's updated world models (after the wm phase, or a cycle's
    RUN=runs/x/cycles/cycle_1): distil, pack them as a second pair beside the first, replay the
    held-out episodes in both (wm_eval), and time imagination with the policy in the loop at the
    teacher's and the student's number of sampling steps. DISTILL_RUN: the run whose pair to distil
    when it is not RUN (after a cycle in the same chain: DISTILL_RUN=RUN/cycles/cycle_1)."""
    run = v.get("DISTILL_RUN", v.get("RUN", "runs/h200"))
    stage("wm_distill", "wm_distill.py", ["--run", run, "--no-progress",  # its own name: it chains after wm (STEPS)
                                          *(["--steps", v["DISTILL_STEPS"]] if "DISTILL_STEPS" in v else []),
                                          *(["--self-forcing-steps", v["SF_STEPS"]] if "SF_STEPS" in v else [])], env)
    students = str(RunLayout(run).student_pair)
    stage("wm_reward_students", "wm_reward.py", ["--run", run, "--students", "--no-progress", "--overwrite"], env)
    stage("package_students", "package_pair.py", ["--run", run, "--students", "--out", students, "--overwrite"], env)
    # DISTILL_BENCH=0: the students' evaluation only (the wm phase evaluated the teachers; no timing)
    bench = v.get("DISTILL_BENCH", "1") == "1"
    for name, pair in (("teacher", f"{run}/model_pair"), ("student", students))[0 if bench else 1:]:
        stage(f"wm_eval_{name}", "wm_eval.py", ["--run", run, "--pair", pair, "--videos", "2"], env)
    batches = v.get("BATCHES", "64,256")
    for steps in ("3", "1") if bench else ():
        stage(f"imagine_{steps}step", "bench/wm_throughput.py", [
            "--skip-training", "--sample-steps", steps, "--batch", max(batches.split(","), key=int), "--closed-loop",
            batches, "--json", OUT / f"imagine_{steps}step.json"], env)
    pack(Path(run), "distill")


def phase_wmspeed(v: dict, env: dict) -> None:
    """What each world-model training speed option buys (bench/wm_throughput.py --variants)
    at each micro batch, with a torch.profiler table per variant (OUT/wm_ops_<micro>_<variant>.txt, '+'
    written '-': the lent machine returns only names of letters, digits, '.', '_' and '-') and its
    convolutions by input shape (OUT/wm_convs_<micro>_<variant>.txt); the Chrome traces stay in
    RUN/wm_trace_<micro>."""
    run = v.get("RUN", "runs/h200")
    for micro in v.get("MICROS", "16,64").split(","):
        trace = Path(run) / f"wm_trace_{micro}"
        stage(f"wm_speed_{micro}", "bench/wm_throughput.py",
              ["--variants", v.get("VARIANTS", "eager,channels_last,compile,channels_last+compile"), "--micro-batch",
               micro, "--skip-imagination", "--trace", trace, "--json", OUT / f"wm_speed_{micro}.json"], env)
        for table in sorted(trace.glob("*/top_ops.txt")):
            shutil.copy(table, OUT / f"wm_ops_{micro}_{table.parent.name.replace('+', '-')}.txt")
        for table in sorted(trace.glob("*/conv_shapes.txt")):  # the convolutions by input shape
            shutil.copy(table, OUT / f"wm_convs_{micro}_{table.parent.name.replace('+', '-')}.txt")


def phase_rank(v: dict, env: dict) -> None:
    """Imagined vs real success of several policies in RUN's pair (make wm-rank)."""
    run = v.get("RUN", "runs/h200")
    policies = v.get("POLICIES", "sft/1000 sft/2000 sft/4000 sft/4000@T=3 hold").split()
    stage("wm_rank", "wm_rank.py", ["--run", run, *[a for p in policies for a in ("--policy", p)],
                                    "--trials", v.get("TRIALS", "4"), "--real-trials", v.get("REAL_TRIALS", "10"),
                                    "--workers", v.get("WORKERS", str(os.cpu_count())), "--no-progress",
                                    *shlex.split(v.get("RANK_ARGS", ""))], env)  # RANK_ARGS="--traces": any wm_rank.py option
    pack(Path(run), "rank")


def phase_gap(v: dict, env: dict) -> None:
    """Does the policy act on RUN's pair's imagined frames as on the real ones (bench/action_gap.py)?
    A few seconds of imagination; the JSON comes back in OUT."""
    stage("action_gap", "bench/action_gap.py", ["--run", v.get("RUN", "runs/h200"), "--policy",
                                                v.get("POLICY", "sft/4000@ode"), "--episodes", v.get("GAP_EPISODES", "20"),
                                                *(["--guidance", v["GUIDANCE"]] if "GUIDANCE" in v else []),
                                                "--device", "cuda", "--json", OUT / "action_gap.json"], env)


def phase_starts(v: dict, env: dict) -> None:
    """RUN's policy from the fixed evaluation states, bare random placements and placements with the
    arm jittered as the fixed states hold it (bench/start_gap.py); the JSON comes back in OUT."""
    stage("start_gap", "bench/start_gap.py", ["--run", v.get("RUN", "runs/h200"), "--ckpt", v.get("CKPT", "sft/4000"),
                                              "--sampler", v.get("SAMPLER", "sde"), "--temperature", v.get("TEMPERATURE", "1"),
                                              "--episodes", v.get("START_EPISODES", "50"), "--no-progress",
                                              "--workers", v.get("WORKERS", str(os.cpu_count())),
                                              "--out", OUT / "start_gap.json"], env)


def phase_calibrate(v: dict, env: dict) -> None:
    """The reward's threshold calibrated closed loop (make wm-calibrate) for PAIR (default RUN's
    pair; after distill: PAIR=RUN/model_pair_students), by the policy that recorded the held-out
    episodes (CALIBRATE_POLICY, default sft/4000@T=1); GRPO then takes THRESHOLDS=closed-loop (or
    "pair closed-loop": both side by side). Its closed_loop.json comes back in OUT."""
    run = v.get("RUN", "runs/h200")
    pair = v.get("PAIR", f"{run}/model_pair")
    stage("wm_calibrate", "wm_calibrate.py", ["--run", run, "--pair", pair, "--policy",
                                              v.get("CALIBRATE_POLICY", "sft/4000@T=1"), "--trials", v.get("TRIALS", "8"),
                                              "--overwrite", "--device", v.get("DEVICE", "cuda")], env)
    if (Path(pair) / CLOSED_LOOP_FILE).exists():
        shutil.copy(Path(pair) / CLOSED_LOOP_FILE, OUT / f"closed_loop_{Path(pair).name}.json")


def phase_reward(v: dict, env: dict) -> None:
    """Reward variants on RUN's finished pair (after wm), each with REWARD_SEEDS: the reward
    trained again, the pair packaged and evaluated, its fidelity.json kept as
    OUT/fidelity_<variant>_s<seed>.json, then bench/reward_ranking.py over all of them, each
    variant's seeds also averaged (OUT/reward_ab.md).
    REWARD_VARIANTS="base: share:--generated-share 0.5 --generated-samples 2" (name:options, space
    between variants; options in one word each, "+" for a space: share:--generated-share+0.5).
    STUDENTS=1: the students' reward and pair (after distill). The last variant's reward stays in the pair.
    KEEP_FIRST=1: the pair's evaluation as the phase finds it (the wm or distill phase's: the default
    reward, seed 0) stands for a variant without options at seed 0, not trained again (~80 s an H100)."""
    run = v.get("RUN", "runs/h200")
    students = v.get("STUDENTS") == "1"
    pair = str(RunLayout(run).student_pair if students else RunLayout(run).model_pair)
    kept: dict[str, list[Path]] = {}  # variant -> the fidelity.json copies of its seeds
    first = OUT / "fidelity_as_found.json"  # taken before any variant overwrites it (never an older run's)
    first.unlink(missing_ok=True)
    if v.get("KEEP_FIRST") == "1" and (Path(pair) / FIDELITY_FILE).exists():
        if v.get("REWARD_ARGS"):
            sys.exit("KEEP_FIRST=1: the pair's evaluation was made with REWARD_ARGS, not the default reward; drop one")
        OUT.mkdir(parents=True, exist_ok=True)
        shutil.copy(Path(pair) / FIDELITY_FILE, first)
    for spec in v.get("REWARD_VARIANTS", "base: share:--generated-share+0.5+--generated-samples+2").split():
        name, _, options = spec.partition(":")
        for seed in v.get("REWARD_SEEDS", "0,1").split(","):
            tag = f"{name}_s{seed}"
            if v.get("KEEP_FIRST") == "1" and not options and seed == "0" and first.exists():
                first.rename(OUT / f"fidelity_{tag}.json")
                kept.setdefault(name, []).append(OUT / f"fidelity_{tag}.json")
                continue
            if stage(f"wm_reward_{tag}", "wm_reward.py", ["--run", run, "--no-progress", "--overwrite", "--seed", seed,
                                                          *(["--students"] if students else []),
                                                          *options.replace("+", " ").split()], env) or \
                    stage(f"package_{tag}", "package_pair.py", ["--run", run, "--overwrite",
                                                                *(["--students", "--out", pair] if students else [])], env) or \
                    stage(f"wm_eval_{tag}", "wm_eval.py", ["--run", run, "--pair", pair, "--videos", "0",
                                                           "--control-trials", v.get("CONTROL_TRIALS", "2")], env):
                continue
            shutil.copy(Path(pair) / FIDELITY_FILE, OUT / f"fidelity_{tag}.json")
            kept.setdefault(name, []).append(OUT / f"fidelity_{tag}.json")
    if kept:  # each variant's seeds also averaged (an ensemble of its rewards: same replays, same episodes)
        files = [str(f) for fs in kept.values() for f in fs]
        means = [a for fs in kept.values() for a in ("--mean-of", ",".join(map(str, fs)))]
        with open(OUT / "reward_ab.md", "w") as f:
            subprocess.run([PY, "bench/reward_ranking.py", *files, *means], cwd=ROOT, env=env, stdout=f, check=False)


def phase_sim(v: dict, env: dict) -> None:
    run, w = v.get("RUN", "runs/h200"), v.get("WORKERS", str(os.cpu_count()))
    stage("throughput", "bench/sim_throughput.py", ["--workers", w, "--sizes", v.get("SIZES", "128,256"),
                                                    "--steps", "480", "--json", OUT / "throughput.json"], env)
    if v.get("EXPERT", "1") == "1":
        stage("eval_expert", "evaluate.py", ["--policy", "expert", "--workers", w, "--out", f"{run}/eval_expert",
                                              "--no-progress"], env)
    pack(Path(run), "sim")


def phase_signal(v: dict, env: dict) -> None:
    """The GRPO gradient's signal and noise for RUN's policy (bench/grpo_signal.py): how many groups
    a step needs, measured on real rollouts; the JSON comes back in OUT."""
    run = v.get("RUN", "runs/h200")
    stage("signal", "bench/grpo_signal.py",
          ["--policy", f"{run}/weights/{v.get('CKPT', 'sft/4000').replace('/', '/global_step_')}",
           "--steps", v.get("BATCHES", "4"), "--groups", v.get("GROUPS", "16"), "--group-size", v.get("GROUP_SIZE", "8"),
           "--workers", v.get("WORKERS", str(os.cpu_count())), "--ratio-transitions", v.get("VARIANTS", "0,3,1"),
           "--device", "cuda", "--json", OUT / "signal.json"], env)


def phase_speedrun(v: dict, env: dict) -> None:
    """``make speedrun``'s stages with this machine's Python (PROFILE=speedrun unless given):
    demonstrations -> SFT -> one cycle (collect, both world models, reward, pair, GRPO in the
    pair between the 10 x 50 evaluations before and after). Stage times in times.jsonl, the
    cycle's own in RUN/cycle.json and RUN/report.html."""
    run, w = v.get("RUN", "runs/speedrun"), v.get("WORKERS", str(os.cpu_count()))
    if demos_and_sft(run, w, v, env, v.get("STEPS"), v.get("GPUS", "")):
        sys.exit(1)
    stage("cycle", "cycle.py", ["--run", run, "--cycles", "1", "--workers", w, "--train-py", PY, "--wm-py", WM_PY,
                                *(["--gpus", v["GPUS"]] if "GPUS" in v else []),
                                *(["--max-minutes", v["MAX_MINUTES"]] if "MAX_MINUTES" in v else [])], env)
    pack(Path(run), "speedrun")


def phase_cycle(v: dict, env: dict) -> None:
    """``make cycle`` from RUN's supervised policy (a carried one: unpack+cycle): the policy's own
    episodes (EPISODES per task, shared between temperatures 1 and 3) -> both world models
    (MAX_MINUTES) -> reward -> pair -> GRPO in the pair (GRPO_STEPS) between the 10 x 50
    evaluations before and after; CYCLE_ARGS: any other cycle.py option. The cycle's record in
    RUN/cycle.json, its report in RUN/report.html."""
    run, w = v.get("RUN", "runs/h200"), v.get("WORKERS", str(os.cpu_count()))
    stage("cycle", "cycle.py", ["--run", run, "--cycles", v.get("CYCLES", "1"), "--workers", w, "--train-py", PY,
                                "--wm-py", WM_PY, *(["--gpus", v["GPUS"]] if "GPUS" in v else []),
                                *(["--episodes", v["EPISODES"]] if "EPISODES" in v else []),
                                *(["--max-minutes", v["MAX_MINUTES"]] if "MAX_MINUTES" in v else []),
                                *(["--grpo-steps", v["GRPO_STEPS"]] if "GRPO_STEPS" in v else []),
                                *shlex.split(v.get("CYCLE_ARGS", ""))], env)
    pack(Path(run), "cycle")


def phase_bimanual(v: dict, env: dict) -> None:
    run, bundle = v.get("RUN", "runs/h200"), v.get("BUNDLE", ".offline/aloha_bundle")
    i0, i1 = v.get("ITERS0", "2000"), v.get("ITERS1", "1000")
    ov = shlex.split(v.get("OVERRIDES", ""))  # [model] etc. for every stage's training (roots record them)
    env = {**env, "BIMANUAL_BUNDLE": bundle, "BIMANUAL_OUTPUT_ROOT": f"{run}/bimanual"}
    stage("bimanual_validate", "bimanual.py", ["validate", bundle, "--no-preview"], env)
    stage("stage0", "bimanual.py", ["train", "--stage", "0", "--config", "data/configs/stage0_bidir.toml", "--no-progress",
                                    f"trainer.max_iter={i0}", "checkpoint.save_iter=500", *ov], env)
    root0 = f"{run}/bimanual/bimanual_stage0/checkpoints/iter_{int(i0):09d}"
    stage("stage1", "bimanual.py", ["train", "--stage", "1", "--config", "data/configs/stage1_tf.toml", "--no-progress",
                                    f"checkpoint.load_path={root0}", f"trainer.max_iter={i1}", "checkpoint.save_iter=500",
                                    *ov], env)
    root1 = f"{run}/bimanual/bimanual_stage1/checkpoints/iter_{int(i1):09d}"
    stage("stage1_eval", "bimanual.py", ["evaluate", "--config", "data/configs/stage1_tf.toml", "--checkpoint", root1,
                                         f"checkpoint.load_path={root0}", "--out", OUT / "stage1_eval.json"], env)
    if "ITERS2" in v:  # part 2: distil the Stage 1 teacher into the four-step student, export it, compare
        i2, i3 = v["ITERS2"], v.get("ITERS3", "300")
        stage("stage2", "bimanual.py", ["train", "--stage", "2", "--config", "data/configs/stage2_tfdcm.toml",
                                        "--no-progress", f"checkpoint.load_path={root1}", f"trainer.max_iter={i2}",
                                        f"checkpoint.save_iter={i2}", *ov], env)
        root2 = f"{run}/bimanual/bimanual_stage2/checkpoints/iter_{int(i2):09d}"
        stage("stage3", "bimanual.py", ["train", "--stage", "3", "--config", "data/configs/stage3_sfdmd.toml",
                                        "--no-progress", f"checkpoint.load_path={root2}", f"checkpoint.reference={root0}",
                                        f"trainer.max_iter={i3}", f"checkpoint.save_iter={i3}", *ov], env)
        root3 = f"{run}/bimanual/bimanual_stage3/checkpoints/iter_{int(i3):09d}"
        student = f"{run}/bimanual/student"
        stage("export", "bimanual.py", ["export", "--checkpoint", root3, "--config", "data/configs/stage3_sfdmd.toml",
                                        "--out", student], env)
        stage("generate", "bimanual.py", ["generate", "--student", student, "--teacher", root1, "--config",
                                          "data/configs/stage1_tf.toml", "--context", bundle, "--out",
                                          f"{run}/bimanual/generated", "--limit", v.get("CLIPS", "20")], env)
    pack(Path(run), "bimanual")


PHASES = {"learn": phase_learn, "unpack": phase_unpack, "eval": phase_eval, "grpo": phase_grpo, "wm": phase_wm,
          "rank": phase_rank, "gap": phase_gap, "sim": phase_sim, "speedrun": phase_speedrun, "wmspeed": phase_wmspeed,
          "probe": phase_probe, "distill": phase_distill, "signal": phase_signal, "cycle": phase_cycle,
          "bimanual": phase_bimanual, "calibrate": phase_calibrate, "reward": phase_reward, "starts": phase_starts}


def wait(v: dict) -> None:
    """Follow the background phases (their pid files) until they end or SECONDS pass."""
    deadline = time.time() + float(v.get("SECONDS", "540"))
    pids = [int(p.read_text()) for p in OUT.glob("*.pid")]
    while time.time() < deadline and any(_alive(p) for p in pids):
        time.sleep(5)
    running = [p for p in pids if _alive(p)]
    try:  # a reader that stops early (| head) must not turn the report into a traceback
        print(f"[gpu] background phases still running: {running}" if running else "[gpu] background phases finished")
        for f in sorted(OUT.glob("*.log")):
            print(f"---- {f.name}\n" + "\n".join(f.read_text().splitlines()[-6:]))
    except BrokenPipeError:
        sys.stdout = open(os.devnull, "w")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()
    except OSError:
        return False


def main(argv: list[str]) -> None:
    if not argv or not (argv[0] == "wait" or all(p in PHASES for p in argv[0].split("+"))):
        sys.exit(f"usage: python3 bench/gpu.py {{{'|'.join(PHASES)}|wait}}[+PHASE...] NAME=VALUE ...")
    global PROFILE
    phase, v = argv[0], variables(argv[1:])
    # a chain with speedrun in it (sim+speedrun) is a speedrun too: one profile for the whole chain
    PROFILE = v.get("PROFILE", "speedrun" if "speedrun" in phase.split("+") else "default")
    if phase == "wait":
        return wait(v)
    OUT.mkdir(parents=True, exist_ok=True)
    if "grpo" in phase.split("+"):
        check_grpo_options(v)
    if v.pop("BACKGROUND", "0") == "1":  # its own session: it outlives this call on the lent machine
        name = phase + v.get("TAG", "")  # TAG=_b: a second background job of the same phase beside the first
        p = subprocess.Popen([PY, __file__, phase, *[f"{k}={x}" for k, x in v.items()]], cwd=ROOT,
                             stdout=open(OUT / f"{name}.out", "a"), stderr=subprocess.STDOUT, start_new_session=True)
        (OUT / f"{name}.pid").write_text(str(p.pid))
        print(f"[gpu] {phase} started in the background (pid {p.pid}); follow with: python3 bench/gpu.py wait")
        return
    env = prepare()
    info = machine(env)
    for name in phase.split("+"):
        settings = OUT / f"{name}{v.get('TAG', '')}_settings.json"  # TAG: two phases at once keep a file each
        settings.write_text(json.dumps({"phase": name, "variables": v, "machine": info}, indent=2))
        PHASES[name](v, env)


if __name__ == "__main__":
    main(sys.argv[1:])
