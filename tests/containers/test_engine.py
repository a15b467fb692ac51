"""Against a real Docker Engine (Debian's dockerd on a private socket): build the CPU variants of
both images from their wheelhouse with the real Dockerfiles, run the check stage and a data
stage in each, and the failure modes a user meets (exit codes, Ctrl-C, stale or missing images,
GPUs without the NVIDIA toolkit). First run on a fresh machine: about 4 minutes (debootstrap
and two builds); later runs reuse the cached base and layers."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from wmrl.containers import ContainerError
from wmrl.containers.images import LABEL_LOCK_SHA, LABEL_PYTHON, LABEL_REVISION, LABEL_VERSION, image_spec, kit_version
from wmrl.containers.run import RunConfig, run
from wmrl.fileio import sha256_file

from tests.containers import engine as E

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def run_captured(capfd, cfg: RunConfig) -> tuple[int, str, str]:
    code = run(cfg)
    out, err = capfd.readouterr()
    return code, out, err


def test_images_carry_their_labels(docker_engine, test_images):
    for name, spec in test_images.items():
        img = docker_engine.images.get(spec.tag)
        labels = img.labels
        assert labels[LABEL_LOCK_SHA] == spec.lock_sha256()
        assert labels["org.wmrl.build-lock.sha256"] == sha256_file(ROOT / "docker/build.lock")
        assert labels[LABEL_PYTHON] == {"train": "3.11", "wm": "3.10"}[name]
        assert labels[LABEL_VERSION] == kit_version() and labels[LABEL_REVISION] not in ("", "unknown")
        cfg = img.attrs["Config"]
        assert cfg["User"] == "1000:1000"
        env = dict(e.split("=", 1) for e in cfg["Env"])
        assert env["MUJOCO_GL"] == "egl" and "graphics" in env["NVIDIA_DRIVER_CAPABILITIES"]
        # no wheelhouse, apt lists or pip caches left in the image
        out = docker_engine.containers.run(spec.tag, ["sh", "-c", "ls /tmp/wheelhouse /var/lib/apt/lists/*.lz4 "
                                                      "/root/.cache/pip 2>/dev/null | wc -l"], remove=True)
        assert out.strip() == b"0"


@pytest.mark.parametrize("name", ["train", "wm"])
def test_check_stage_passes_in_each_image(capfd, test_images, name):
    code, out, err = run_captured(capfd, RunConfig(test_images[name], ("python/check.py", "--env", name)))
    assert code == 0, out + err
    report = json.loads(out)
    assert report["ok"] and report["python"]["version"].startswith({"train": "3.11.", "wm": "3.10."}[name])
    assert report["lock"]["built_from"] == "image label" and not report["lock"]["missing"] and not report["lock"]["differ"]
    system = report["system"]
    assert system["image"] == name and system["uid_gid"] == f"{os.getuid()}:{os.getgid()}"
    assert system["shm_gib"] == 16.0 and system["ffmpeg"] and system["cc"]
    # unlimited locked memory and a 64 MiB stack, or this host's hard limits where the daemon
    # may not raise them (said in one line before the stage's output)
    memlock_hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    if system["memlock_soft_hard"] == [None, None]:
        assert system["stack_soft_hard"] == [64 * 2**20, 64 * 2**20]
    else:
        assert system["memlock_soft_hard"] == [memlock_hard, memlock_hard] and memlock_hard != resource.RLIM_INFINITY
        assert "[docker] note: the daemon cannot raise the locked-memory/stack limits" in err
    if name == "train":  # torch CPU and MuJoCo rendering through OSMesa (no GPU requested)
        assert report["gpu"]["torch"].endswith("+cpu") and report["gpu"]["gpus"] == 0
        assert report["renderer"]["status"] == "ok" and report["renderer"]["backend"] in ("osmesa", "egl")  # both render in the image
    else:
        assert report["renderer"]["status"] == "skip"
    assert f"[docker] {test_images[name].tag}" in err and "no GPU (auto: no NVIDIA GPU)" in err


@pytest.mark.parametrize("name", ["train", "wm"])
def test_a_data_stage_reads_host_files_outside_the_repository(capfd, test_images, tmp_path, name):
    from wmrl.data.trajectory import TrajectoryWriter

    from tests.helpers import synthetic_trajectory

    data = tmp_path / "trajectories"
    w = TrajectoryWriter(data / "task_00.hdf5")
    w.append(synthetic_trajectory(frames=3))
    w.finalize()
    code, out, err = run_captured(capfd, RunConfig(test_images[name], ("python/validate_data.py", str(data), "--json")))
    assert code == 0, out + err
    (report,) = json.loads(out)
    assert report["episodes"] == 1 and report["problems"] == []
    # ... and writes there as the caller
    target = tmp_path / "written" / "x.txt"
    write = "import os, sys; os.makedirs(os.path.dirname(sys.argv[1])); open(sys.argv[1], 'w').write('ok')"
    code, _, err = run_captured(capfd, RunConfig(test_images[name], ("-c", write, str(target)), verbose=False))
    assert code == 0, err
    assert target.read_text() == "ok" and target.stat().st_uid == os.getuid()


def test_exit_codes_propagate(capfd, test_images):
    spec = test_images["wm"]
    assert run(RunConfig(spec, ("-c", "import sys; sys.exit(3)"), verbose=False)) == 3
    assert run(RunConfig(spec, ("sh", "-c", "exit 7"), python=False, verbose=False)) == 7
    assert run(RunConfig(spec, ("-c", "raise SystemExit(0)"), verbose=False)) == 0


def test_ctrl_c_stops_and_removes_the_container(docker_engine, test_images):
    spec = test_images["wm"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python"), "WMRL_IMAGE_WM": spec.tag, "WMRL_LOCK_WM": spec.lock}
    code = "import signal, sys, time; print('started', flush=True); time.sleep(120)"
    # SIGINT back to its default in the driver: a suite started in the background (`cmd &` in a
    # script, nohup) hands its children SIGINT ignored, and Python then keeps ignoring Ctrl-C
    proc = subprocess.Popen([sys.executable, "-m", "wmrl.containers", "run", "--image", "wm", "--", "-c", code],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert proc.stdout.readline().strip() == "started"
        time.sleep(0.5)
        start = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted: stopped and removed container" in err
    assert time.monotonic() - start < 15
    # this driver's containers only (wmrl-<image>-<driver pid>-...): the cached engine may hold
    # what an earlier, killed session left
    left = docker_engine.containers.list(all=True, filters={"label": "org.wmrl.stage", "name": f"wmrl-wm-{proc.pid}-"})
    assert left == [], [c.name for c in left]


def test_shell_runs_a_command_through_the_docker_cli(test_images):
    spec = test_images["wm"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python"), "WMRL_IMAGE_WM": spec.tag, "WMRL_LOCK_WM": spec.lock,
           "WMRL_DOCKER_HOST_LIMITS": "1"}
    r = subprocess.run([sys.executable, "-m", "wmrl.containers", "shell", "--image", "wm", "--", "sh", "-c",
                        "id -u; python --version"], cwd=ROOT, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    words = r.stdout.split()
    assert words[:2] == [str(os.getuid()), "Python"] and words[2].startswith("3.10."), r.stdout


def test_missing_image_and_image_from_other_locks_are_refused(test_images):
    with pytest.raises(ContainerError) as e:
        run(RunConfig(image_spec("wm", test_images["wm"].lock, "wmrl-wm:never-built"), ("-c", "pass")))
    assert str(e.value).startswith("image wmrl-wm:never-built not found: run `make build`") and "\n" not in str(e.value)
    # the train test image checked against the wm test lock: built from other lock files
    stale = image_spec("train", test_images["wm"].lock, test_images["train"].tag)
    with pytest.raises(ContainerError) as e:
        run(RunConfig(stale, ("-c", "pass")))
    msg = str(e.value)
    assert "was built from other lock files (docker/test-cpu-train.lock sha256" in msg and "run `make build`" in msg
    assert "\n" not in msg


def test_gpus_without_the_nvidia_toolkit_is_one_actionable_line(test_images):
    with pytest.raises(ContainerError) as e:
        run(RunConfig(test_images["wm"], ("-c", "pass"), gpus="0"))
    msg = str(e.value)
    assert "could not select device driver" in msg and "NVIDIA Container Toolkit" in msg and "GPUS=none" in msg
    assert msg.startswith("GPUs 0 (--gpus) requested") and "\n" not in msg


def test_make_check_with_runtime_docker(test_images):
    """The acceptance path: `RUNTIME=docker make check`, here with the CPU variants."""
    env = {**os.environ, "RUNTIME": "docker"}
    for name, spec in test_images.items():
        env[f"WMRL_IMAGE_{name.upper()}"] = spec.tag
        env[f"WMRL_LOCK_{name.upper()}"] = spec.lock
    proc = subprocess.run(["make", "--no-print-directory", "check"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count('"ok": true') == 2
    assert '"image": "train"' in proc.stdout and '"image": "wm"' in proc.stdout
