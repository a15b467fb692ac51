"""Run one stage in its image: ``python ARGS`` (or a command) in a fresh container.

What a run gets, and why:

* the repository bind-mounted at its own path and used as the working folder, so relative paths
  (``runs/...``, ``data/...``) and absolute ones inside it mean the same as on the host, and the
  mounted ``python/`` is imported ahead of the copy baked into the image (edits need no rebuild);
  absolute paths given as arguments outside the repository (``DATA=/big/disk/x``) are mounted
  too, at their own paths;
* the caller's uid:gid, so files written to run folders belong to the caller;
* GPUs through a ``DeviceRequest`` for exactly the selected devices (``GPUS=0,1``), renumbered
  0..n-1 inside (``CUDA_VISIBLE_DEVICES``), none with ``GPUS=none``; without a selection, all GPUs
  when the host has NVIDIA GPUs, otherwise none (then MuJoCo renders with OSMesa);
* 16 GiB of ``/dev/shm`` (PyTorch data loaders and NCCL need more than Docker's 64 MiB) or the
  host's IPC namespace (``--ipc host``); unlimited locked memory and a 64 MiB stack (NCCL/RDMA
  pin memory); host networking (torchrun rendezvous, several hosts);
  (``WMRL_DOCKER_HOST_LIMITS=1``: no higher than this host's own limits, for daemons that may not
  raise them; ``run`` falls back to that by itself, ``shell`` cannot);
* the environment variables that change results or placement (seed, GPU selection, rendering,
  threads, NCCL/torch settings, ``WMRL_*``), nothing else from the host.

The stage's exit code is returned. Ctrl-C (or SIGTERM) sends SIGINT to the stage, which stops
cleanly (stages are resumable), waits a few seconds, kills it if needed and removes the container.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from wmrl.containers.engine import connect, get_image, is_missing_gpu_runtime
from wmrl.containers.errors import ContainerError, one_line
from wmrl.containers.images import ImageSpec

PASS_NAMES = frozenset({
    "SEED", "PYTHONHASHSEED", "MUJOCO_GL", "PYOPENGL_PLATFORM", "MUJOCO_EGL_DEVICE_ID", "EGL_DEVICE_ID",
    "LP_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "DS_ACCELERATOR", "TQDM_DISABLE", "MASTER_ADDR",
    "MASTER_PORT", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "CUDA_LAUNCH_BLOCKING", "TZ",
})
# Prefixes of variables that stages (or Make recipes, e.g. BIMANUAL_BUNDLE=...) hand to a stage.
# A stage reading another variable: name it WMRL_*, add its prefix here, or list it in
# WMRL_DOCKER_ENV=NAME,NAME at run time.
PASS_PREFIXES = ("WMRL_", "NCCL_", "TORCH_", "CUBLAS_", "WM_", "BIMANUAL_")
# Set by the image or meant for the driver itself: never copied from the host.
DRIVER_ONLY = re.compile(r"^WMRL_(DOCKER_.*|IMAGE(_.*)?|LOCK(_.*)?|SKIP_LOCK_CHECK|RUNTIME|HOST_GPUS)$")
SYSTEM_DIRS = ("/proc", "/sys", "/dev", "/etc", "/usr", "/bin", "/sbin", "/lib", "/lib64", "/boot", "/run")
STOP_GRACE_S = 10
STACK_BYTES = 64 * 2**20


@dataclass(frozen=True)
class GpuSelection:
    mode: str  # none | all | ids
    ids: tuple[str, ...] = ()
    source: str = "auto"  # what chose it: --gpus, GPUS, CUDA_VISIBLE_DEVICES or auto

    def describe(self) -> str:
        what = {"none": "no GPU", "all": "all GPUs"}.get(self.mode, "GPUs " + ",".join(self.ids))
        return f"{what} ({self.source})"


def host_has_nvidia_gpus() -> bool:
    try:
        proc = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0 and "GPU" in proc.stdout


def select_gpus(flag: str | None, env: dict[str, str], detect=host_has_nvidia_gpus) -> GpuSelection:
    for source, value in (("--gpus", flag), ("GPUS", env.get("GPUS")), ("CUDA_VISIBLE_DEVICES", env.get("CUDA_VISIBLE_DEVICES"))):
        if value is None or not value.strip():
            continue
        v = value.strip().lower()
        if v in ("none", "cpu", "no", "-1"):
            return GpuSelection("none", (), source)
        if v == "all":
            return GpuSelection("all", (), source)
        ids = tuple(x.strip() for x in value.split(",") if x.strip())
        bad = [x for x in ids if not (x.isdigit() or re.fullmatch(r"(GPU|MIG)-[0-9A-Za-z-]+", x))]
        if bad:
            raise ContainerError(f"{source}={value}: give GPU indices like 0,1 (or GPU UUIDs), `all`, or `none` for CPU")
        return GpuSelection("ids", ids, source)
    return GpuSelection("all", (), "auto: host has NVIDIA GPUs") if detect() else GpuSelection("none", (), "auto: no NVIDIA GPU")


def stage_environment(host_env: dict[str, str], gpus: GpuSelection, repo: Path) -> dict[str, str]:
    extra = {n.strip() for n in host_env.get("WMRL_DOCKER_ENV", "").split(",") if n.strip()}
    env = {k: v for k, v in host_env.items()
           if (k in PASS_NAMES or k in extra or k.startswith(PASS_PREFIXES)) and not DRIVER_ONLY.match(k)}
    env["PYTHONPATH"] = str(repo / "python")
    env["WMRL_RUNTIME"] = "docker"
    if gpus.mode == "ids":  # the container sees only these, numbered from 0
        inside = ",".join(str(i) for i in range(len(gpus.ids)))
        env["CUDA_VISIBLE_DEVICES"] = env["GPUS"] = inside
        env["WMRL_HOST_GPUS"] = ",".join(gpus.ids)
    elif gpus.mode == "all":
        env.pop("GPUS", None)
    else:
        env.pop("GPUS", None)
        env.setdefault("MUJOCO_GL", "osmesa")  # no NVIDIA EGL without a GPU
        env.setdefault("PYOPENGL_PLATFORM", env["MUJOCO_GL"] if env["MUJOCO_GL"] in ("osmesa", "egl") else "osmesa")
        env.setdefault("DS_ACCELERATOR", "cpu")
    return env


def _inside(path: Path, folder: Path) -> bool:
    try:
        path.relative_to(folder)
        return True
    except ValueError:
        return False


def path_mounts(args: list[str], repo: Path, cwd: Path | None = None) -> list[Path]:
    """Folders to mount so that what ``args`` name outside ``repo`` exists inside the container:
    absolute paths, paths relative to ``cwd`` when the caller works inside the repository (the
    container starts there too), and the data files that a manifest among them lists (a
    ``wmrl-manifest`` file, or a run folder holding ``manifest.json``), which may live anywhere."""
    cwd = (cwd or Path.cwd()).resolve()
    relative_ok = _inside(cwd, repo)
    named: list[Path] = []
    for a in args:
        for c in [a] + ([a.split("=", 1)[1]] if a.startswith("-") and "=" in a else []):
            if c.startswith("/"):
                named.append(Path(os.path.normpath(c)))
            elif relative_ok and not c.startswith("-") and ("/" in c or (cwd / c).exists()):
                named.append(Path(os.path.normpath(cwd / c)))
    named += [f for p in named for f in manifest_files(p)]
    found: list[Path] = []
    for p in named:
        q = p if p.is_dir() else p.parent
        while not q.exists():
            q = q.parent
        if q == Path("/") or any(_inside(q, Path(s)) for s in SYSTEM_DIRS) or _inside(q, repo):
            continue
        found.append(q)
    found = sorted(set(found), key=lambda x: (len(x.parts), str(x)))
    return [f for i, f in enumerate(found) if not any(_inside(f, g) for g in found[:i])]


def manifest_files(path: Path) -> list[Path]:
    """The data files a world-model manifest lists (paths relative to the manifest's folder),
    if ``path`` is one or a folder holding ``manifest.json``; else none. Read with ``json`` alone,
    not ``wmrl.data.manifest``: the driver's Python has no numpy or h5py, and only the paths
    matter here (the stage verifies the manifest itself)."""
    import json

    m = path / "manifest.json" if path.is_dir() else path
    if m.suffix != ".json" or not m.is_file():
        return []
    try:
        doc = json.loads(m.read_text())
        if not str(doc.get("format", "")).startswith("wmrl-manifest"):
            return []
        return [Path(os.path.normpath(m.parent / f["path"])) for f in doc.get("files", [])]
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        return []  # not ours to judge here: the stage itself reports a broken manifest


def parse_mount(text: str) -> tuple[str, str, bool]:
    """``HOST[:CONTAINER][:ro]`` -> (host, container, read_only)."""
    parts = text.split(":")
    ro = parts[-1] in ("ro", "rw") and parts.pop() == "ro"
    if not parts or not parts[0].startswith("/") or len(parts) > 2:
        raise ContainerError(f"--mount {text}: use /host/path[:/container/path][:ro]")
    return parts[0], parts[1] if len(parts) == 2 else parts[0], ro


@dataclass(frozen=True)
class RunConfig:
    spec: ImageSpec
    args: tuple[str, ...]
    python: bool = True  # run `python ARGS` (the Makefile's RUN_PY) instead of ARGS as a command
    gpus: str | None = None  # None: GPUS / CUDA_VISIBLE_DEVICES / auto
    shm_size: str = "16g"
    ipc: str | None = None  # "host": share the host's IPC namespace (then shm_size is moot)
    network: str = "host"
    mounts: tuple[str, ...] = ()  # extra HOST[:CONTAINER][:ro]
    workdir: str | None = None  # default: the caller's folder if inside the repository, else the repository
    env: dict[str, str] = field(default_factory=dict)  # extra variables (after the passed-through ones)
    verbose: bool = True


def container_options(cfg: RunConfig, host_env: dict[str, str] | None = None,
                      detect=host_has_nvidia_gpus) -> tuple[dict, GpuSelection]:
    """Everything ``containers.create`` gets (docker-py keyword arguments), without the engine,
    and the GPU selection it encodes (for messages)."""
    import docker.types as dt

    host_env = dict(os.environ if host_env is None else host_env)
    repo = cfg.spec.repo.resolve()
    gpus = select_gpus(cfg.gpus, host_env, detect)
    env = stage_environment(host_env, gpus, repo)
    env.update(cfg.env)
    extra = []
    for m in cfg.mounts + tuple(x for x in host_env.get("WMRL_DOCKER_MOUNTS", "").split(",") if x):
        src, dst, ro = parse_mount(m)
        if not os.path.exists(src):
            raise ContainerError(f"mount {m}: {src} does not exist on this host")
        extra.append((src, dst, ro))
    # A path among the arguments that an extra mount already shows at its own path needs no
    # mount of its own (the engine refuses two mounts at one point).
    covered = [Path(os.path.normpath(src)) for src, dst, ro in extra
               if os.path.normpath(src) == os.path.normpath(dst) and not ro]
    taken = {os.path.normpath(dst) for _, dst, _ in extra}
    mounts = [dt.Mount(str(repo), str(repo), type="bind")]
    for folder in path_mounts(list(cfg.args), repo):
        if str(folder) not in taken and not any(_inside(folder, c) for c in covered):
            mounts.append(dt.Mount(str(folder), str(folder), type="bind"))
    mounts += [dt.Mount(dst, src, type="bind", read_only=ro) for src, dst, ro in extra]
    cwd = Path.cwd().resolve()
    workdir = cfg.workdir or (str(cwd) if _inside(cwd, repo) else str(repo))
    command = (["python"] if cfg.python else []) + list(cfg.args)
    opts = dict(
        image=cfg.spec.tag, command=command, user=f"{os.getuid()}:{os.getgid()}", working_dir=workdir,
        environment=env, mounts=mounts, network_mode=cfg.network, init=False,
        ulimits=capped_ulimits() if host_env.get("WMRL_DOCKER_HOST_LIMITS") in ("1", "yes", "true")
        else [dt.Ulimit(name="memlock", soft=-1, hard=-1), dt.Ulimit(name="stack", soft=STACK_BYTES, hard=STACK_BYTES)],
        labels={"org.wmrl.stage": " ".join(command)[:200]},
        name=f"wmrl-{cfg.spec.name}-{os.getpid()}-{secrets.token_hex(3)}",
    )
    if cfg.ipc:
        opts["ipc_mode"] = cfg.ipc
    else:
        opts["shm_size"] = cfg.shm_size
    if gpus.mode != "none":
        req = dict(driver="nvidia", capabilities=[["gpu"]])
        req.update(count=-1) if gpus.mode == "all" else req.update(device_ids=list(gpus.ids))
        opts["device_requests"] = [dt.DeviceRequest(**req)]
    return opts, gpus


def _write(stream, data: bytes | None) -> None:
    if data:
        stream.buffer.write(data) if hasattr(stream, "buffer") else stream.write(data.decode(errors="replace"))
        stream.flush()


def run(cfg: RunConfig, client=None) -> int:
    """Run the stage; returns its exit code (130 after Ctrl-C)."""
    import docker

    opts, gpus = container_options(cfg)
    client = client or connect(timeout=None)
    image = get_image(client, cfg.spec)
    if cfg.verbose:
        print(f"[docker] {cfg.spec.tag} ({image.short_id}): {' '.join(opts['command'])}  [{gpus.describe()}]",
              file=sys.stderr, flush=True)
    try:
        container = client.containers.create(**opts)
    except docker.errors.APIError as e:
        raise ContainerError(f"docker could not create the container: {one_line(e.explanation or e)}") from None
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        try:
            stream = container.attach(stdout=True, stderr=True, stream=True, logs=True, demux=True)
            container.start()
        except docker.errors.APIError as e:
            if not is_rlimit_refused(e):
                raise
            # The daemon may not raise limits beyond its own (a daemon inside a container, a
            # locked-down host): run with the limits this host allows rather than not at all.
            container.remove(force=True)
            opts["ulimits"] = capped_ulimits()
            print(f"[docker] note: the daemon cannot raise the locked-memory/stack limits; running with "
                  f"{describe_ulimits(opts['ulimits'])} (NCCL over InfiniBand wants memlock unlimited)",
                  file=sys.stderr, flush=True)
            container = client.containers.create(**opts)
            stream = container.attach(stdout=True, stderr=True, stream=True, logs=True, demux=True)
            container.start()
    except (docker.errors.APIError, KeyboardInterrupt) as e:
        signal.signal(signal.SIGTERM, previous)
        _remove(container)
        if isinstance(e, KeyboardInterrupt):
            print("interrupted before the stage started", file=sys.stderr, flush=True)
            return 130
        if is_missing_gpu_runtime(e):
            raise ContainerError(
                f"{gpus.describe()} requested, but the Docker daemon cannot give containers GPUs (could not select "
                "device driver \"nvidia\"): install the NVIDIA Container Toolkit and restart Docker "
                "(`nvidia-ctk runtime configure --runtime=docker`), or run on CPU with GPUS=none") from None
        raise ContainerError(f"docker could not start the container: {one_line(e.explanation or e)}") from None
    try:
        try:
            for out, err in stream:
                _write(sys.stdout, out)
                _write(sys.stderr, err)
            return int(container.wait().get("StatusCode", 1))
        except KeyboardInterrupt:
            _stop(container)
            print(f"interrupted: stopped and removed container {container.name}", file=sys.stderr, flush=True)
            return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
        _remove(container)


def _remove(container) -> None:
    import docker

    try:
        container.remove(force=True)
    except docker.errors.APIError:
        pass


def is_rlimit_refused(err: Exception) -> bool:
    return "error setting rlimit" in str(err)


def capped_ulimits() -> list:
    """memlock and stack as asked, but no higher than this host's hard limits."""
    import resource

    import docker.types as dt

    out = []
    for name, res, want in (("memlock", resource.RLIMIT_MEMLOCK, -1), ("stack", resource.RLIMIT_STACK, STACK_BYTES)):
        hard = resource.getrlimit(res)[1]
        value = want if hard == resource.RLIM_INFINITY else (hard if want == -1 else min(want, hard))
        out.append(dt.Ulimit(name=name, soft=value, hard=value))
    return out


def describe_ulimits(ulimits: list) -> str:
    return ", ".join(f"{u['Name']} {'unlimited' if u['Soft'] == -1 else str(u['Soft'] // 2**20) + ' MiB'}" for u in ulimits)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def _stop(container) -> None:
    """SIGINT first (the stages stop cleanly and stay resumable), then SIGKILL after a grace period."""
    import docker
    import requests

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not leave the container behind
    try:
        container.kill(signal="SIGINT")
        container.wait(timeout=STOP_GRACE_S)
    except (docker.errors.APIError, requests.exceptions.RequestException):
        try:
            container.kill()
        except docker.errors.APIError:
            pass
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def cli_command(opts: dict, interactive: bool) -> list[str]:
    """The ``docker run`` command line with the same settings as ``container_options`` (for an
    interactive shell, which docker-py cannot attach a terminal to, and for ``--print``)."""
    cmd = ["docker", "run", "--rm", "--init", "--name", opts["name"], "--user", opts["user"], "--workdir", opts["working_dir"],
           "--network", opts["network_mode"]]
    if interactive:
        cmd += ["--interactive", "--tty"]
    cmd += ["--ipc", opts["ipc_mode"]] if "ipc_mode" in opts else ["--shm-size", opts["shm_size"]]
    for u in opts["ulimits"]:
        cmd += ["--ulimit", f"{u['Name']}={u['Soft']}:{u['Hard']}"]
    for m in opts["mounts"]:
        cmd += ["--mount", f"type=bind,source={m['Source']},target={m['Target']}" + (",readonly" if m.get("ReadOnly") else "")]
    for req in opts.get("device_requests", []):
        ids = req.get("DeviceIDs")
        cmd += ["--gpus", f'"device={",".join(ids)}"' if ids else "all"]
    for k, v in sorted(opts["environment"].items()):
        cmd += ["--env", f"{k}={v}"]
    return cmd + [opts["image"], *opts["command"]]


def shell(cfg: RunConfig, print_only: bool = False) -> int:
    """An interactive shell (or any command with a terminal) in the image, through the docker CLI."""
    import shlex

    opts, _ = container_options(cfg)
    get_image(connect(timeout=30), cfg.spec)
    interactive = sys.stdin.isatty() and sys.stdout.isatty()
    cmd = cli_command(opts, interactive)
    if print_only:
        print(shlex.join(cmd))
        return 0
    import shutil

    exe = shutil.which("docker")
    if exe is None:
        raise ContainerError("the docker command-line client is not installed: an interactive shell needs it "
                             "(`--print` shows the command; stages run without it through `run`)")
    os.execv(exe, cmd)
    return 0  # not reached
