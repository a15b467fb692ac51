"""Choose the OpenGL backend for MuJoCo before anything imports it (LIBERO and ALOHA alike).

MuJoCo reads ``MUJOCO_GL`` once, at import. An explicit ``MUJOCO_GL`` in the environment
always wins; a backend named in the config (``egl``, ``osmesa``, ``glfw``) comes next.
``auto`` *tries* the backends in a child process, in this order, and takes the first that
renders a frame:

* ``egl``: the NVIDIA driver's EGL on a GPU machine (rendering is then nearly free), or
  Mesa's software EGL (llvmpipe) on a machine without one;
* ``osmesa``: Mesa's off-screen software renderer.

A fresh Debian machine often has Mesa's EGL but not OSMesa, and some hosts have OSMesa while
their EGL fails: only trying tells. The answer is cached per machine and interpreter
(``~/.cache/wmrl/gl-*.json``; ``WMRL_GL_CACHE`` moves it), so the probe (about a second)
runs once. Results record the backend that ran (``choose_backend``).
"""

from __future__ import annotations

import ctypes.util
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

# Library that each backend loads, and the Debian/Ubuntu packages that provide it.
_BACKEND_LIBS = {
    "osmesa": ("OSMesa", "libosmesa6"),
    "egl": ("EGL", "libegl1 libegl-mesa0 libgl1-mesa-dri (or the NVIDIA driver's EGL vendor library)"),
    "glfw": ("glfw", "libglfw3 (and a display)"),
}
AUTO_ORDER = ("egl", "osmesa")
# What `make setup` installs (as root, with apt) when no backend renders.
SOFTWARE_GL_PACKAGES = ("libegl1", "libegl-mesa0", "libgl1-mesa-dri", "libosmesa6")

# Renders one frame of a tiny scene; exit code 0 only if pixels came back.
_PROBE = """
import sys, mujoco
m = mujoco.MjModel.from_xml_string('<mujoco><worldbody><light pos="0 0 3"/><geom type="box" size=".1 .1 .1" rgba="1 0 0 1"/></worldbody></mujoco>')
d = mujoco.MjData(m)
r = mujoco.Renderer(m, 32, 32)
mujoco.mj_forward(m, d)
r.update_scene(d)
img = r.render()
sys.exit(0 if img.shape == (32, 32, 3) and img.any() else 3)
"""


class RendererError(RuntimeError):
    pass


def has_nvidia_gpu() -> bool:
    if os.path.exists("/dev/nvidia0"):
        return True
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
            return out.returncode == 0 and "GPU" in out.stdout
        except (OSError, subprocess.TimeoutExpired):
            return False
    return False


def library_present(backend: str) -> bool:
    lib = _BACKEND_LIBS.get(backend)
    return lib is None or ctypes.util.find_library(lib[0]) is not None


def probe(backend: str, timeout: float = 60.0) -> str | None:
    """Render one frame with ``backend`` in a child process: None if it worked, else why not."""
    if not library_present(backend):
        return f"lib{_BACKEND_LIBS[backend][0]} is not installed"
    env = {**os.environ, "MUJOCO_GL": backend, "PYOPENGL_PLATFORM": backend}
    try:
        out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"rendering did not finish within {timeout:.0f} s"
    except OSError as e:
        return str(e)
    if out.returncode == 0:
        return None
    last = (out.stderr.strip().splitlines() or [f"exit code {out.returncode}"])[-1]
    return last[:200]


def _cache_file() -> Path:
    key = hashlib.sha256(f"{platform.node()}|{sys.executable}|{has_nvidia_gpu()}".encode()).hexdigest()[:16]
    root = Path(os.environ.get("WMRL_GL_CACHE") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "wmrl")
    return root / f"gl-{key}.json"


def _auto() -> str:
    cache = _cache_file()
    try:
        hit = json.loads(cache.read_text())
        if hit.get("backend") in AUTO_ORDER and library_present(hit["backend"]):
            return hit["backend"]
    except (OSError, ValueError):
        pass
    tried = {}
    for backend in AUTO_ORDER:
        why = probe(backend)
        if why is None:
            try:
                from wmrl.fileio import write_json

                write_json(cache, {"backend": backend, "tried": tried, "python": sys.executable})
            except OSError:
                pass  # a read-only home: probe again next time
            return backend
        tried[backend] = why
    raise RendererError(
        "no OpenGL backend renders on this machine (" + "; ".join(f"{b}: {w}" for b, w in tried.items()) + "): install "
        f"Mesa's software renderers (`apt-get install -y {' '.join(SOFTWARE_GL_PACKAGES)}`; `make setup` does this "
        "when run as root), or set MUJOCO_GL to a backend that works here")


def choose_backend(requested: str = "auto") -> str:
    """The backend to use: ``MUJOCO_GL`` if set, else ``requested``, else the first that renders."""
    env = os.environ.get("MUJOCO_GL", "").strip().lower()
    if env:
        return env
    if requested != "auto":
        return requested
    return _auto()


def configure_renderer(requested: str = "auto") -> str:
    """Set ``MUJOCO_GL``/``PYOPENGL_PLATFORM`` for this process and its children.

    Raises ``RendererError`` with the package to install when the backend's library is
    missing, before MuJoCo is imported (a missing library otherwise fails deep inside it).
    """
    backend = choose_backend(requested)
    lib = _BACKEND_LIBS.get(backend)
    if lib is not None and not library_present(backend):
        raise RendererError(
            f"rendering backend {backend!r} needs lib{lib[0]}, which is not installed: "
            f"install {lib[1]} (e.g. `apt-get install -y {lib[1].split()[0]}`) or choose another with MUJOCO_GL=osmesa|egl"
        )
    os.environ["MUJOCO_GL"] = backend
    if backend in ("osmesa", "egl"):
        os.environ["PYOPENGL_PLATFORM"] = backend
    return backend


def main(argv: list[str] | None = None) -> int:
    """``python -m wmrl.gl [--install]``: print the backend that renders here; with
    ``--install``, when none does and this runs as root with apt, install Mesa's renderers."""
    install = "--install" in (argv if argv is not None else sys.argv[1:])
    try:
        print(f"[gl] rendering backend: {choose_backend()}")
        return 0
    except RendererError as e:
        if not (install and os.geteuid() == 0 and shutil.which("apt-get")):
            print(f"error: {e}", file=sys.stderr)
            return 2
    print(f"[gl] no OpenGL backend renders; installing {' '.join(SOFTWARE_GL_PACKAGES)} with apt-get (running as root)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=False, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", *SOFTWARE_GL_PACKAGES], check=False, env=env)
    try:
        print(f"[gl] rendering backend: {choose_backend()}")
        return 0
    except RendererError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
