"""GPU pre-flight against a fake ``nvidia-smi`` (this machine has no GPU): it answers the
two queries the check makes, in nvidia-smi's CSV form."""

from pathlib import Path

import pytest
from wmrl.preflight import GPUBusy, check_gpus


def fake_nvidia_smi(bindir: Path, *, used_mib: int = 500, apps: list[str] | None = None, gpus: int = 2) -> None:
    bindir.mkdir(parents=True, exist_ok=True)
    rows = "\\n".join(f"{i}, GPU-{i}, NVIDIA H200, 143771, {used_mib if i == 0 else 500}" for i in range(gpus))
    app_rows = "\\n".join(apps or [])
    script = bindir / "nvidia-smi"
    script.write_text(f"""#!/bin/sh
case "$1" in
  --query-gpu=*) printf '{rows}\\n' ;;
  --query-compute-apps=*) printf '{app_rows}' ;;
  *) exit 1 ;;
esac
""")
    script.chmod(0o755)


@pytest.fixture
def gpu_path(tmp_path, monkeypatch):
    def make(**kw):
        fake_nvidia_smi(tmp_path / "bin", **kw)
        monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    return make


def test_idle_gpus_pass(gpu_path):
    gpu_path()
    assert check_gpus(None, 3.5) == [0, 1]
    assert check_gpus("1", 3.5) == [1]


def test_a_gpu_with_another_process_is_refused_by_name_and_pid(gpu_path):
    gpu_path(apps=["GPU-0, 4242, python3, 20480"])
    with pytest.raises(GPUBusy, match=r"GPU 0 \(NVIDIA H200\) runs other processes: pid 4242 python3 \(20480 MiB\)"):
        check_gpus("0,1", 3.5)
    assert check_gpus("1", 3.5) == [1]  # the other one is free


def test_memory_in_use_beyond_the_margin_is_refused(gpu_path):
    gpu_path(used_mib=8 * 1024)
    with pytest.raises(GPUBusy, match="8.0 GiB in use .*3.5 GiB margin"):
        check_gpus("0", 3.5)
    assert check_gpus("0", 10) == [0]


def test_unknown_gpu_and_no_driver(gpu_path, monkeypatch):
    gpu_path()
    with pytest.raises(GPUBusy, match="no GPU 5 here"):
        check_gpus("5", 3.5)
    monkeypatch.setenv("PATH", "/nonexistent")
    assert check_gpus(None, 3.5) == []  # a CPU machine: nothing to check
    with pytest.raises(GPUBusy, match="no nvidia-smi"):
        check_gpus("0", 3.5)
