"""A private Docker Engine for the tests: Debian's ``dockerd`` on its own socket, a local base
image made with debootstrap (no registry is reachable), and the CPU test variants of both
images built from a wheelhouse.

Everything slow is cached under ``$WMRL_TEST_DOCKER_CACHE`` (default ``~/.cache/wmrl/docker-test``):
the debootstrap tarball, the daemon's data root (images and build cache) and the wheel downloads,
so a second run rebuilds only what changed. One test session at a time uses it (a file lock).
"""

from __future__ import annotations

import atexit
import fcntl
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

from wmrl.procs import die_with_parent

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("WMRL_TEST_DOCKER_CACHE", Path.home() / ".cache/wmrl/docker-test"))
SUITE = "bookworm"
MIRROR = os.environ.get("WMRL_TEST_DEBIAN_MIRROR", "http://deb.debian.org/debian")
# What Dockerfile.train/wm install with apt, plus the Python the train image needs, so that the
# Dockerfiles' apt step finds everything present and skips the mirror (same file, no network).
BASE_PACKAGES = ("python3.11 python3.11-dev python3.11-venv python3-distutils ca-certificates libegl1 libgl1 "
                 "libgles2 libglvnd0 libopengl0 libosmesa6 libglib2.0-0 ffmpeg gcc g++ make "
                 "libssl3 libffi8 libsqlite3-0 libbz2-1.0 liblzma5 zlib1g").split()
BASE_TAG = "wmrl-test-base:bookworm"
BASE_WM_TAG = "wmrl-test-base:bookworm-py310"
TEST_LOCKS = {"train": "docker/test-cpu-train.lock", "wm": "docker/test-cpu-wm.lock"}
TEST_TAGS = {"train": "wmrl-train:test-cpu", "wm": "wmrl-wm:test-cpu"}
TORCH_CPU_WHEELS = os.environ.get("TORCH_CPU_WHEELS", "/opt/wheels")


class Unavailable(Exception):
    """The engine cannot run here; the message is the skip reason."""


def log(msg: str) -> None:
    print(f"[docker-test] {msg}", file=sys.stderr, flush=True)


def _apt_install(*packages: str) -> None:
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise Unavailable(f"{', '.join(packages)} missing and cannot be installed here (needs root and apt-get): "
                          f"apt-get install {' '.join(packages)}")
    log(f"apt-get install {' '.join(packages)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *packages]):
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise Unavailable(f"`{' '.join(cmd)}` failed: {proc.stderr.strip()[-200:]}")


TOOLS = (("dockerd", "docker.io"), ("debootstrap", "debootstrap"))


def ensure_tools() -> None:
    """dockerd and debootstrap on PATH, installed with apt where missing; Unavailable (the tests
    skip with the reason) where they still cannot be found, e.g. installed outside this PATH."""
    missing = [pkg for tool, pkg in TOOLS if not shutil.which(tool)]
    if missing:
        _apt_install(*missing)
    absent = [tool for tool, _ in TOOLS if not shutil.which(tool)]
    if absent:
        raise Unavailable(f"{', '.join(absent)} not on PATH after installing {', '.join(missing)} "
                          f"(PATH={os.environ.get('PATH', '')}): add its folder, e.g. /usr/sbin, to PATH")


@dataclass
class Daemon:
    host: str
    proc: subprocess.Popen
    storage: str
    lock_fd: int
    run_dir: Path

    def stop(self) -> None:
        if self.lock_fd < 0:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        _cleanup(self.run_dir)
        os.close(self.lock_fd)
        self.lock_fd = -1


def _cleanup(run_dir: Path) -> None:
    """Unmount what dockerd left under its exec root (the default network namespace), then remove it."""
    with open("/proc/self/mounts") as f:
        mounts = [line.split()[1] for line in f if line.split()[1].startswith(str(run_dir) + "/")]
    for m in sorted(mounts, key=len, reverse=True):
        subprocess.run(["umount", m], capture_output=True)
    shutil.rmtree(run_dir, ignore_errors=True)


def start_daemon() -> Daemon:
    """dockerd on a private socket (no iptables, no bridge: nothing outside the test changes)."""
    if os.geteuid() != 0:
        raise Unavailable("dockerd needs root here (no rootless setup): run the tests as root or skip tests/containers")
    ensure_tools()
    CACHE.mkdir(parents=True, exist_ok=True)
    fd = os.open(CACHE / ".lock", os.O_CREAT | os.O_RDWR)
    log(f"waiting for the engine cache lock {CACHE}/.lock" if _locked(fd) else f"engine cache {CACHE}")
    fcntl.flock(fd, fcntl.LOCK_EX)
    run_dir = Path(f"/tmp/wmrl-dt-{os.getpid()}")  # short: unix socket paths are limited to 108 bytes
    run_dir.mkdir(exist_ok=True)
    errors = []
    for storage in ("overlay2", "vfs"):  # overlay2 where the kernel allows it: far less copying than vfs
        sock = run_dir / "docker.sock"
        logf = open(run_dir / f"dockerd-{storage}.log", "w")
        proc = subprocess.Popen(
            ["dockerd", "--iptables=false", "--ip6tables=false", "--bridge=none", f"--storage-driver={storage}",
             "--data-root", str(CACHE / f"data-{storage}"), "--exec-root", str(run_dir / "exec"),
             "--pidfile", str(run_dir / "dockerd.pid"), "--host", f"unix://{sock}"],
            # its own session (no terminal signal reaches it) but dead with this process: a test
            # process that crashes (no teardown, no atexit) must not leave a daemon holding the cache
            stdout=logf, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=die_with_parent)
        host = f"unix://{sock}"
        if _wait_ping(host, proc, 60):
            log(f"dockerd ({storage}) on {host}")
            daemon = Daemon(host, proc, storage, fd, run_dir)
            atexit.register(daemon.stop)  # also when the session dies without teardown
            return daemon
        proc.terminate()
        proc.wait(timeout=30)
        tail = (run_dir / f"dockerd-{storage}.log").read_text().strip().splitlines()[-1:] or ["no output"]
        errors.append(f"{storage}: {tail[0][-200:]}")
    _cleanup(run_dir)
    os.close(fd)
    raise Unavailable("dockerd did not start: " + "; ".join(errors))


def _locked(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    except BlockingIOError:
        return True


def _wait_ping(host: str, proc: subprocess.Popen, timeout: float) -> bool:
    import docker

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            docker.DockerClient(base_url=host, timeout=5).ping()
            return True
        except Exception:
            time.sleep(0.5)
    return False


# ---------------------------------------------------------------------------------------------
def _base_key() -> str:
    return hashlib.sha256(" ".join([SUITE, MIRROR, *BASE_PACKAGES]).encode()).hexdigest()[:12]


def debootstrap_tarball() -> Path:
    """A minimal Debian root file system with BASE_PACKAGES, as a tar (cached)."""
    out = CACHE / f"rootfs-{SUITE}-{_base_key()}.tar"
    if out.is_file():
        return out
    tmp = CACHE / f"rootfs-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    start = time.monotonic()
    log(f"debootstrap {SUITE} with {len(BASE_PACKAGES)} packages (once; cached in {out.name})")
    proc = subprocess.run(["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", SUITE, str(tmp), MIRROR],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise Unavailable(f"debootstrap {SUITE} failed (is {MIRROR} reachable?): {proc.stderr.strip()[-200:]}")
    for junk in ("var/cache/apt/archives", "var/lib/apt/lists", "debootstrap"):
        for p in (tmp / junk).glob("*"):
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    subprocess.run(["tar", "-C", str(tmp), "--numeric-owner", "-cf", str(out) + ".part", "."], check=True)
    os.replace(str(out) + ".part", out)
    shutil.rmtree(tmp, ignore_errors=True)
    log(f"debootstrap done in {time.monotonic() - start:.0f} s ({out.stat().st_size / 2**20:.0f} MiB)")
    return out


def _has(client, tag: str, label: str | None = None) -> bool:
    import docker

    try:
        img = client.images.get(tag)
    except docker.errors.ImageNotFound:
        return False
    return label is None or (img.labels or {}).get("org.wmrl.test.key") == label


def base_images(client) -> tuple[str, str]:
    """(train base, wm base): Debian with the image packages; the wm one adds this host's Python
    3.10 at its own prefix (Debian has no 3.10; the real image gets it from Ubuntu 22.04)."""
    key = _base_key()
    if not _has(client, BASE_TAG, key):
        tar = debootstrap_tarball()
        start = time.monotonic()
        # From the file (sized upload): the engine refuses chunked uploads of this size.
        client.api.import_image_from_file(str(tar), repository=BASE_TAG.split(":")[0], tag=BASE_TAG.split(":")[1],
                                          changes=[f'LABEL org.wmrl.test.key="{key}"', 'CMD ["/bin/bash"]'])
        log(f"imported {BASE_TAG} in {time.monotonic() - start:.0f} s")
    py310 = subprocess.run([str(ROOT / "scripts/find_python.sh"), "3.10"], capture_output=True, text=True).stdout.strip()
    if not py310:
        raise Unavailable("no Python 3.10 on this host to carry into the wm test base (pyenv install 3.10)")
    prefix = Path(subprocess.run([py310, "-c", "import sys; print(sys.base_prefix)"], capture_output=True, text=True,
                                 check=True).stdout.strip())
    wm_key = hashlib.sha256(f"{key} {prefix} {os.path.getmtime(prefix)}".encode()).hexdigest()[:12]
    if not _has(client, BASE_WM_TAG, wm_key):
        _build_wm_base(client, prefix, py310, wm_key)
    return BASE_TAG, BASE_WM_TAG


def _build_wm_base(client, prefix: Path, py310: str, key: str) -> None:
    start = time.monotonic()
    dockerfile = (f"FROM {BASE_TAG}\nCOPY prefix/ {prefix}/\n"
                  f"RUN chmod 755 /root 2>/dev/null; ln -sf {prefix}/bin/python3.10 /usr/local/bin/python3.10 "
                  f"&& python3.10 -c 'import ssl, ctypes, sqlite3, venv, ensurepip'\n"
                  f'LABEL org.wmrl.test.key="{key}"\n')
    buf = io.BytesIO()

    def skip(info: tarfile.TarInfo):
        parts = info.name.split("/")
        if "__pycache__" in parts or "test" in parts[3:5] or info.name.endswith(".a"):
            return None  # the standard library's tests and static libraries: 100+ MB nothing uses
        info.uid = info.gid = 0
        return info

    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = dockerfile.encode()
        ti = tarfile.TarInfo("Dockerfile")
        ti.size = len(data)
        tar.addfile(ti, io.BytesIO(data))
        tar.add(str(prefix), arcname="prefix", filter=skip)
    buf.seek(0)
    for chunk in client.api.build(fileobj=buf, custom_context=True, tag=BASE_WM_TAG, rm=True, forcerm=True, decode=True):
        if "error" in chunk:
            raise RuntimeError(f"building {BASE_WM_TAG} failed: {chunk['error']}")
    log(f"built {BASE_WM_TAG} (Python 3.10 from {prefix}) in {time.monotonic() - start:.0f} s")
