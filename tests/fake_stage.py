"""A stand-in for the cycle's stage scripts in the controller's tests: it writes what each
stage promises (small files) instead of training, so the controller's records, skips,
refusals and resumption are tested in seconds. The real stages have their own tests; the
whole tiny cycle runs in ``make demo``.

    python tests/fake_stage.py python/collect.py --run R --out DIR ...

FAKE_FAIL=<script stem> exits 1 in that stage; FAKE_HANG=<stem> sleeps there (to be killed);
FAKE_SLOW=<stem>[:seconds],... takes that long (3 s) and appends "<stem>-end" when done;
FAKE_AGREEMENT=<x> makes wm_eval measure the pair's agreement with the simulator at x (0.75),
FAKE_AGREEMENT_STUDENTS=<x> the students' pair's (default: FAKE_AGREEMENT's);
FAKE_CONTROL_HOLD=<x> makes wm_calibrate imagine the control hold succeeding at x of 40 rollouts (0);
every call is appended to FAKE_CALLS (one line: the script's stem)."""

import hashlib
import json
import os
import runpy
import sys
import time
from pathlib import Path


def episodes(n, successes):
    """An evaluation's episodes, task 0, trials 0..n-1, those in ``successes`` succeeding."""
    return [{"task": 0, "trial": i, "success": i in successes} for i in range(n)]


def flag(args, name, default=None):
    return args[args.index(name) + 1] if name in args else default


def name(path):  # contents must not depend on where the run lives (the tests compare hashes across runs)
    return None if path is None else Path(path).name


def main(argv):
    if argv[:2] == ["-m", "wmrl.report"]:  # the real report
        sys.argv = ["wmrl.report", *argv[2:]]
        runpy.run_module("wmrl.report", run_name="__main__")
        return 0
    script, args = Path(argv[0]).stem, argv[1:]
    with open(os.environ["FAKE_CALLS"], "a") as f:
        f.write(script + "\n")
    if os.environ.get("FAKE_FAIL") == script:
        print(f"{script}: failing as asked")
        return 1
    if os.environ.get("FAKE_HANG") == script:
        time.sleep(600)
    run = Path(flag(args, "--run") or flag(args, "--run-dir"))  # grpo.py: --run-dir (torchrun claims --run)
    if script == "collect":
        out = Path(flag(args, "--out"))
        out.mkdir(parents=True, exist_ok=True)
        (out / "task_00.hdf5").write_text(f"episodes of policy {flag(args, '--ckpt')} seed {flag(args, '--seed')}")
    elif script == "make_manifest":
        (run / "manifest.json").write_text(json.dumps({"new": name(flag(args, "--new"))}))
    elif script == "wm_update":
        (run / "train").mkdir(parents=True, exist_ok=True)
        (run / "train" / "selected_world_models.json").write_text(json.dumps({"init": flag(args, "--init-pair")}))
    elif script == "wm_distill":
        (run / "train").mkdir(parents=True, exist_ok=True)
        (run / "train" / "selected_students.json").write_text(json.dumps({"students": run.name}))
    elif script == "wm_reward":
        reward = run / "worldmodels" / ("reward_students" if "--students" in args else "reward")
        reward.mkdir(parents=True, exist_ok=True)
        (reward / "config.json").write_text("{}")
    elif script == "package_pair":
        pair = Path(flag(args, "--out", run / "model_pair"))
        pair.mkdir(parents=True, exist_ok=True)
        (pair / "pair.json").write_text(json.dumps({"run": run.name, "students": "--students" in args}))
    elif script == "wm_eval":  # FAKE_AGREEMENT=x: the pair measured at x (interval x-x), bound to its pair.json
        pair = Path(flag(args, "--pair", run / "model_pair"))
        students = pair.name == "model_pair_students" and os.environ.get("FAKE_AGREEMENT_STUDENTS")
        agreement = float(students or os.environ.get("FAKE_AGREEMENT", "0.75"))
        pair_sha = hashlib.sha256((pair / "pair.json").read_bytes()).hexdigest()
        (pair / "fidelity.json").write_text(json.dumps({"episodes": 2, "pair_json_sha256": pair_sha,
            "agreement": {"balanced_accuracy": agreement, "balanced_accuracy_95": [agreement, agreement], "episodes": 2},
            "agreement_on_real_frames": {"balanced_accuracy": 0.875},
            "reward_ranking": {"imagined": {"auc": 0.8125, "best_balanced_accuracy": 0.8, "best_threshold": 0.41},
                               "real": None}}))
    elif script == "wm_calibrate":  # bound to the pair.json it calibrated, as the real one
        pair = Path(flag(args, "--pair"))
        pair_sha = hashlib.sha256((pair / "pair.json").read_bytes()).hexdigest()
        hold = float(os.environ.get("FAKE_CONTROL_HOLD", "0"))
        (pair / "closed_loop.json").write_text(json.dumps({
            "pair_json_sha256": pair_sha, "threshold": 0.3, "policy": flag(args, "--policy"),
            "success_chunks": int(flag(args, "--success-chunks", "1")),
            "controls": {"hold": {"rollouts": 40, "at_threshold": hold, "at_calibrated": 0.0}}}))
    elif script == "evaluate" and flag(args, "--ckpt").startswith("sft/"):  # the supervised policy a cycle starts from
        ev = run / "evidence" / "evaluations" / "sft" / f"global_step_{flag(args, '--ckpt')[4:]}.json"
        ev.parent.mkdir(parents=True, exist_ok=True)
        ev.write_text(json.dumps({"summary": {"successes": 1, "trials": 50, "success_rate": 1 / 50,
                                              "per_task": {"0": {"success_rate": 1 / 50}}},
                                  "episodes": episodes(50, {0}), "settings": {"sampler": "sde", "temperature": 1.6}}))
    elif script in ("grpo", "evaluate"):
        target = int(flag(args, "--target", flag(args, "--ckpt")))
        if script == "grpo":
            ck = run / "weights" / "policy" / f"global_step_{target}"
            ck.mkdir(parents=True, exist_ok=True)
            (ck / "model.safetensors").write_text(f"policy {target} from {name(flag(args, '--pair'))}")
            (ck / "train_state.pt").write_text("state")
        ev = run / "evidence" / "evaluations" / f"global_step_{target}.json"
        ev.parent.mkdir(parents=True, exist_ok=True)
        ev.write_text(json.dumps({"summary": {"successes": target, "trials": 50, "success_rate": target / 50,
                                              "per_task": {"0": {"success_rate": target / 50}}},
                                  # states 1..target succeed; the supervised policy's one success is state 0
                                  "episodes": episodes(50, set(range(1, target + 1))),
                                  "settings": {"sampler": "sde", "temperature": 1.6}}))
    slow = dict((item.split(":") + ["3"])[:2] for item in os.environ.get("FAKE_SLOW", "").split(",") if item)
    if script in slow:
        time.sleep(float(slow[script]))
        with open(os.environ["FAKE_CALLS"], "a") as f:
            f.write(script + "-end\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
