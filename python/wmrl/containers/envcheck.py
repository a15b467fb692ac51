"""``make check``: is this environment (local venv or image) fit to run the kit's stages?

Prints one JSON report; exit 1 when a check fails. Checks, each ``ok`` / ``fail`` / ``skip``:

* ``python``: the version this environment must have (train 3.11, wm 3.10);
* ``lock``: the lock it was built from (the image's ``WMRL_LOCK_SHA256``, or the venv's
  ``.lock.sha256`` stamp) equals the checkout's lock file, and every pinned package is installed
  at its pinned version;
* ``gpu``: what ``nvidia-smi`` and torch see (``fail`` only with ``--require-gpu``);
* ``renderer``: MuJoCo renders an offscreen frame with the configured backend (``MUJOCO_GL``);
* ``system``: shared memory, locked-memory and stack limits, compiler, ffmpeg, writable folders.

torch and MuJoCo are probed in child processes, with timeouts: a broken driver must give a
report, not a hang or a crash (and MuJoCo's software renderer and Triton must not share a process).
"""

from __future__ import annotations

import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from wmrl.config import ConfigError

REPO = Path(__file__).resolve().parents[3]
EXPECTED_PYTHON = {"train": "3.11", "wm": "3.10"}
PROBE_TIMEOUT_S = 120

TORCH_PROBE = r"""
import json, torch
d = {"torch": torch.__version__, "cuda_build": torch.version.cuda, "cuda_available": torch.cuda.is_available()}
d["devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if d["cuda_available"] else []
print(json.dumps(d))
"""
RENDER_PROBE = r"""
import json, os, mujoco
xml = '<mujoco><worldbody><light pos="0 0 2"/><geom type="box" size=".1 .1 .1" rgba="1 0 0 1"/>' \
      '<camera name="c" pos="0 -0.6 0.3" xyaxes="1 0 0 0 0.45 0.9"/></worldbody></mujoco>'
m = mujoco.MjModel.from_xml_string(xml); d = mujoco.MjData(m); mujoco.mj_forward(m, d)
r = mujoco.Renderer(m, 32, 32); r.update_scene(d, camera="c"); img = r.render()
print(json.dumps({"mujoco": mujoco.__version__, "backend": os.environ.get("MUJOCO_GL", "(default)"),
                  "shape": list(img.shape), "red_pixels": int((img[..., 0] > 128).sum())}))
"""


EXTENSION_C = r"""
#include <Python.h>
static PyObject *add(PyObject *self, PyObject *args) {
    long a, b;
    if (!PyArg_ParseTuple(args, "ll", &a, &b)) return NULL;
    return PyLong_FromLong(a + b);
}
static PyMethodDef methods[] = {{"add", add, METH_VARARGS, ""}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "wmrl_probe", NULL, -1, methods};
PyMODINIT_FUNC PyInit_wmrl_probe(void) { return PyModule_Create(&module); }
"""
# Each environment's stages (imported, not run): a broken install fails here, not hours into a cycle.
STAGE_MODULES = {
    "train": ["wmrl.sim.env", "wmrl.sim.demos", "wmrl.policy.train", "wmrl.policy.runner", "wmrl.rl.grpo", "wmrl.rl.envs",
              "wmrl.evaluation.harness", "wmrl.data.manifest", "wmrl.cycle", "wmrl.report", "wmrl.release.bundle",
              "wmrl.worldmodel.imagine"],
    "wm": ["deepspeed", "wmrl.worldmodel.train", "wmrl.worldmodel.update", "wmrl.worldmodel.reward",
           "wmrl.worldmodel.fidelity", "wmrl.release.pair", "wmrl.data.manifest", "wmrl.bimanual.train"],
}
NOT_PROVEN = ["that training converges or a model is good (the tests and bench/ measure that)",
              "the GPU's numerics or NCCL across GPUs (bench/gpu.py on a GPU machine)",
              "Triton/JIT kernels unless JIT_SMOKE=1 runs them on a GPU",
              "data or checkpoints of a run (make validate, the stages' own hash checks, make restore)"]


def check_compiler(log_dir: Path, include: str | None = None) -> dict:
    """Build and import a small C extension with this interpreter: proves a C compiler and
    Python's headers (what Triton, DeepSpeed ops and torch.compile need at run time)."""
    import importlib.util
    import sysconfig
    import tempfile

    include = include or sysconfig.get_paths()["include"]
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        return {"status": "fail", "error": f"no C compiler ({cc}) on PATH: install one (Debian: apt install gcc)"}
    if not (Path(include) / "Python.h").is_file():
        return {"status": "fail", "error": f"Python.h is missing in {include}: install this Python's headers "
                                           f"(Debian: python{sys.version_info[0]}.{sys.version_info[1]}-dev; pyenv builds "
                                           "include them)"}
    log_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "wmrl_probe.c"
        src.write_text(EXTENSION_C)
        lib = Path(tmp) / f"wmrl_probe{sysconfig.get_config_var('EXT_SUFFIX')}"
        cmd = [cc, "-shared", "-fPIC", f"-I{include}", str(src), "-o", str(lib)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        (log_dir / "compile.log").write_text(" ".join(cmd) + "\n" + r.stdout + r.stderr)
        if r.returncode != 0:
            last = (r.stderr.strip().splitlines() or [""])[-1][:200]
            return {"status": "fail", "error": f"compiling a C extension failed (exit {r.returncode}): {last}; "
                                               f"log {log_dir / 'compile.log'}"}
        spec = importlib.util.spec_from_file_location("wmrl_probe", lib)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        ok = mod.add(2, 3) == 5
    return {"status": "ok" if ok else "fail", "compiler": cc, "include": include, "log": str(log_dir / "compile.log")}


JIT_PROBE = r"""
import json, torch, triton, triton.language as tl
@triton.jit
def add(x, y, out, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(out + i, tl.load(x + i, mask=m) + tl.load(y + i, mask=m), mask=m)
x = torch.arange(1000, device="cuda", dtype=torch.float32)
o = torch.empty_like(x)
add[(4,)](x, x, o, 1000, BLOCK=256)
print(json.dumps({"ok": bool(torch.equal(o, 2 * x)), "triton": triton.__version__}))
"""


def check_jit(enabled: bool, log_dir: Path) -> dict:
    """JIT_SMOKE=1: compile and run a small Triton kernel on the GPU with a fresh cache."""
    import tempfile

    if not enabled:
        return {"status": "skipped", "why": "JIT_SMOKE=1 runs it (needs a GPU)"}
    with tempfile.TemporaryDirectory() as cache:
        script = Path(cache) / "jit_probe.py"  # Triton reads a kernel's source from its file
        script.write_text(JIT_PROBE)
        out = _probe(f"exec(compile(open({str(script)!r}).read(), {str(script)!r}, 'exec'))",
                     {**os.environ, "TRITON_CACHE_DIR": str(Path(cache) / "triton")})
    if "error" in out or not out.get("ok"):
        return {"status": "fail", "error": out.get("error", "the kernel's result is wrong")}
    return {"status": "ok", **out}


def check_modules(env: str) -> dict:
    """Import every stage's modules of ``env`` in a child process; validate every named config."""
    # a package this environment does not install is the lock check's business (a locked one
    # missing fails there); here an import fails the check when the kit's own code is broken
    code = ("import importlib, json, sys\nbad, absent = {}, {}\n"
            f"for m in {STAGE_MODULES[env]!r}:\n"
            "    try:\n        importlib.import_module(m)\n"
            "    except ModuleNotFoundError as e:\n"
            "        if e.name and not e.name.startswith('wmrl'):\n            absent[m] = e.name\n"
            "        else:\n            bad[m] = f'{type(e).__name__}: {e}'[:300]\n"
            "    except Exception as e:\n        bad[m] = f'{type(e).__name__}: {e}'[:300]\n"
            "from wmrl.config import config_names, get_config\n"
            "for n in config_names():\n"
            "    try:\n        get_config(n)\n"
            "    except Exception as e:\n        bad['config ' + n] = str(e)[:300]\n"
            "print(json.dumps({'failed': bad, 'not_installed': absent}))")
    out = _probe(code)
    if "error" in out:
        return {"status": "fail", "error": out["error"]}
    return {"status": "fail" if out["failed"] else "ok", "modules": len(STAGE_MODULES[env]), **out}


@dataclass(frozen=True)
class CheckConfig:
    env: str = "auto"  # train | wm | auto (the image's WMRL_IMAGE, else by Python version)
    lock: str | None = None  # default: the image's lock file, else docker/<env>.lock
    render: bool = True
    require_gpu: bool = False
    out: str | None = None  # also write the JSON here
    logs: str = "runs/compile_checks"  # the compile log of each environment goes to LOGS/<env>/

    def __post_init__(self) -> None:
        if self.env not in ("auto", "train", "wm"):
            raise ConfigError(f"env={self.env!r}: choose train, wm or auto")


def resolve_env(cfg: CheckConfig) -> str:
    if cfg.env != "auto":
        return cfg.env
    if os.environ.get("WMRL_IMAGE") in EXPECTED_PYTHON:
        return os.environ["WMRL_IMAGE"]
    return "wm" if sys.version_info[:2] == (3, 10) else "train"


def _probe(code: str, env: dict[str, str] | None = None) -> dict:
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S,
                              env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {PROBE_TIMEOUT_S} s"}
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
        return {"error": last[:300]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def check_python(env: str) -> dict:
    have = f"{sys.version_info.major}.{sys.version_info.minor}"
    want = EXPECTED_PYTHON[env]
    return {"status": "ok" if have == want else "fail", "version": platform.python_version(), "expected": want,
            "executable": sys.executable}


def installed_vs_lock(lock_text: str, python_version: str) -> dict:
    from wmrl.containers.wheelhouse import applies
    from wmrl.offline.requirements import normalize, parse_lock

    installed = {normalize(d.metadata["Name"]): d.version for d in metadata.distributions() if d.metadata["Name"]}
    missing, differ, pins = [], [], 0
    for name, pin in parse_lock(lock_text).items():
        if not applies(pin, python_version):
            continue
        pins += 1
        have = installed.get(name)
        if have is None:
            missing.append(f"{name}=={pin.version}")
        elif have != pin.version:
            differ.append(f"{name}: {have} (lock {pin.version})")
    return {"pinned": pins, "missing": missing, "differ": differ}


def check_lock(env: str, lock: str | None) -> dict:
    lock_rel = lock or os.environ.get("WMRL_LOCK_FILE") or f"docker/{env}.lock"
    path = Path(lock_rel) if Path(lock_rel).is_absolute() else REPO / lock_rel
    if not path.is_file():
        return {"status": "fail", "lock": lock_rel, "error": f"{path} not found"}
    from wmrl.fileio import sha256_file

    checkout = sha256_file(path)
    if os.environ.get("WMRL_LOCK_SHA256"):
        built, source = os.environ["WMRL_LOCK_SHA256"], "image label"
    else:
        stamp = Path(sys.prefix) / ".lock.sha256"
        built, source = (stamp.read_text().strip(), str(stamp)) if stamp.is_file() else (None, "no record")
    pkgs = installed_vs_lock(path.read_text(), f"{sys.version_info.major}.{sys.version_info.minor}")
    ok = built == checkout and not pkgs["missing"] and not pkgs["differ"]
    out = {"status": "ok" if ok else "fail", "lock": lock_rel, "checkout_sha256": checkout, "built_from_sha256": built,
           "built_from": source, **pkgs}
    if built != checkout:
        out["hint"] = "rebuild: `make build` (RUNTIME=docker) or `make setup` (local)"
    return out


def check_gpu(require: bool) -> dict:
    out: dict = {"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
                 "NVIDIA_DRIVER_CAPABILITIES": os.environ.get("NVIDIA_DRIVER_CAPABILITIES")}
    if shutil.which("nvidia-smi"):
        proc = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
        out["nvidia_smi"] = proc.stdout.strip().splitlines() if proc.returncode == 0 else f"error: {proc.stderr.strip()[:200]}"
    try:
        metadata.version("torch")
        out.update(_probe(TORCH_PROBE))
    except metadata.PackageNotFoundError:
        out["torch"] = None
    n = len(out.get("devices") or [])
    out["gpus"] = n
    out["status"] = "fail" if (require and n == 0) or "error" in out else "ok"
    return out


def check_renderer(enabled: bool) -> dict:
    if not enabled:
        return {"status": "skip", "reason": "--no-render"}
    try:
        metadata.version("mujoco")
    except metadata.PackageNotFoundError:
        return {"status": "skip", "reason": "mujoco is not installed in this environment"}
    env = {}
    if "MUJOCO_GL" not in os.environ:  # same choice as the simulator: EGL with an NVIDIA GPU, else OSMesa
        env["MUJOCO_GL"] = "egl" if shutil.which("nvidia-smi") else "osmesa"
        env["PYOPENGL_PLATFORM"] = env["MUJOCO_GL"]
    res = _probe(RENDER_PROBE, env)
    res["status"] = "ok" if "error" not in res and res.get("red_pixels", 0) > 0 else "fail"
    if res["status"] == "fail":
        res["hint"] = ("EGL needs an NVIDIA GPU with the graphics capability (NVIDIA_DRIVER_CAPABILITIES); "
                       "without one set MUJOCO_GL=osmesa (libosmesa6)")
    return res


def check_system() -> dict:
    shm = os.statvfs("/dev/shm") if os.path.isdir("/dev/shm") else None
    lim = lambda r: [None if v == resource.RLIM_INFINITY else v for v in resource.getrlimit(r)]  # noqa: E731
    home = os.environ.get("HOME", "")
    out = {
        "in_container": os.path.exists("/.dockerenv") or os.environ.get("WMRL_RUNTIME") == "docker",
        "image": os.environ.get("WMRL_IMAGE"),
        "uid_gid": f"{os.getuid()}:{os.getgid()}",
        "cpus": len(os.sched_getaffinity(0)),
        "shm_gib": round(shm.f_blocks * shm.f_frsize / 2**30, 2) if shm else None,
        "memlock_soft_hard": lim(resource.RLIMIT_MEMLOCK),
        "stack_soft_hard": lim(resource.RLIMIT_STACK),
        "cc": shutil.which("gcc") or shutil.which("cc"),
        "ffmpeg": shutil.which("ffmpeg"),
        "cwd_writable": os.access(os.getcwd(), os.W_OK),
        "home_writable": bool(home) and os.access(home, os.W_OK),
        "MUJOCO_GL": os.environ.get("MUJOCO_GL"),
    }
    problems = [k for k in ("cwd_writable", "home_writable") if not out[k]]
    out["status"] = "fail" if problems else "ok"
    if problems:
        out["problems"] = problems
    return out


def main(cfg: CheckConfig) -> int:
    start = time.monotonic()
    env = resolve_env(cfg)
    report = {"env": env, "python": check_python(env), "lock": check_lock(env, cfg.lock),
              "gpu": check_gpu(cfg.require_gpu), "renderer": check_renderer(cfg.render), "system": check_system(),
              "compiler": check_compiler(Path(cfg.logs) / env), "modules": check_modules(env),
              "jit": check_jit(os.environ.get("JIT_SMOKE") == "1", Path(cfg.logs) / env)}
    failed = [k for k, v in report.items() if isinstance(v, dict) and v.get("status") == "fail"]
    report["ok"] = not failed
    report["failed"] = failed
    report["not_proven"] = NOT_PROVEN
    report["seconds"] = round(time.monotonic() - start, 1)
    text = json.dumps(report, indent=2)
    print(text)
    if cfg.out:
        Path(cfg.out).parent.mkdir(parents=True, exist_ok=True)
        Path(cfg.out).write_text(text + "\n")
    return 0 if not failed else 1
