"""Choose the OpenGL backend for MuJoCo before anything imports it.

MuJoCo reads ``MUJOCO_GL`` once, at import. ``egl`` renders on an NVIDIA GPU (nearly free next
to physics), ``osmesa`` renders in software on machines without one. An explicit
``MUJOCO_GL`` in the environment always wins over the automatic choice.
"""

from __future__ import annotations

import ctypes.util
import os
import shutil
import subprocess

# Library that each backend loads, and the Debian/Ubuntu package that provides it.
_BACKEND_LIBS = {
    "osmesa": ("OSMesa", "libosmesa6"),
    "egl": ("EGL", "libegl1 (and the NVIDIA driver's EGL vendor library)"),
    "glfw": ("glfw", "libglfw3 (and a display)"),
}


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


def choose_backend(requested: str = "auto") -> str:
    """Return the backend to use: ``MUJOCO_GL`` if set, else ``requested``, else by hardware."""
    env = os.environ.get("MUJOCO_GL", "").strip().lower()
    if env:
        return env
    if requested != "auto":
        return requested
    return "egl" if has_nvidia_gpu() else "osmesa"


def configure_renderer(requested: str = "auto") -> str:
    """Set ``MUJOCO_GL``/``PYOPENGL_PLATFORM`` for this process and its children.

    Raises ``RendererError`` with the package to install when the backend's library is
    missing, before MuJoCo is imported (a missing library otherwise fails deep inside it).
    """
    backend = choose_backend(requested)
    lib = _BACKEND_LIBS.get(backend)
    if lib is not None and ctypes.util.find_library(lib[0]) is None:
        raise RendererError(
            f"rendering backend {backend!r} needs lib{lib[0]}, which is not installed: "
            f"install {lib[1]} (e.g. `apt-get install -y {lib[1].split()[0]}`) or choose another with MUJOCO_GL=osmesa|egl"
        )
    os.environ["MUJOCO_GL"] = backend
    if backend in ("osmesa", "egl"):
        os.environ["PYOPENGL_PLATFORM"] = backend
    return backend
