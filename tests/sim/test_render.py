import pytest

from wmrl.sim import render


def test_explicit_mujoco_gl_wins(monkeypatch):
    monkeypatch.setenv("MUJOCO_GL", "egl")
    assert render.choose_backend("osmesa") == "egl"


def test_auto_picks_by_hardware(monkeypatch):
    monkeypatch.delenv("MUJOCO_GL", raising=False)
    monkeypatch.setattr(render, "has_nvidia_gpu", lambda: False)
    assert render.choose_backend("auto") == "osmesa"
    monkeypatch.setattr(render, "has_nvidia_gpu", lambda: True)
    assert render.choose_backend("auto") == "egl"


def test_missing_backend_library_names_the_package(monkeypatch):
    monkeypatch.delenv("MUJOCO_GL", raising=False)
    monkeypatch.setattr(render.ctypes.util, "find_library", lambda name: None)
    with pytest.raises(render.RendererError, match="apt-get install -y libosmesa6"):
        render.configure_renderer("osmesa")
