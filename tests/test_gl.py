import pytest
from wmrl import gl as render


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("WMRL_GL_CACHE", str(tmp_path / "gl"))
    monkeypatch.delenv("MUJOCO_GL", raising=False)


def test_explicit_mujoco_gl_wins(monkeypatch):
    monkeypatch.setenv("MUJOCO_GL", "egl")
    assert render.choose_backend("osmesa") == "egl"


def test_auto_takes_the_first_backend_that_renders(monkeypatch):
    calls = []
    monkeypatch.setattr(render, "probe", lambda b: calls.append(b) or (None if b == "osmesa" else "no EGL display"))
    assert render.choose_backend("auto") == "osmesa"
    assert calls == ["egl", "osmesa"]
    monkeypatch.setattr(render, "library_present", lambda b: True)
    assert render.choose_backend("auto") == "osmesa" and calls == ["egl", "osmesa"]  # cached: no second probe


def test_auto_prefers_egl_when_it_renders(monkeypatch):
    monkeypatch.setattr(render, "probe", lambda b: None)
    assert render.choose_backend("auto") == "egl"


def test_no_backend_says_which_packages_to_install(monkeypatch):
    monkeypatch.setattr(render, "probe", lambda b: f"{b} failed")
    with pytest.raises(render.RendererError, match="apt-get install -y libegl1 .*libosmesa6") as e:
        render.choose_backend("auto")
    assert "egl: egl failed" in str(e.value) and "osmesa: osmesa failed" in str(e.value)


def test_the_probe_renders_on_this_machine():
    """The real probe: at least one backend renders a frame here (CI and a fresh Debian machine)."""
    assert render.choose_backend("auto") in render.AUTO_ORDER


def test_missing_backend_library_names_the_package(monkeypatch):
    monkeypatch.setattr(render.ctypes.util, "find_library", lambda name: None)
    with pytest.raises(render.RendererError, match="apt-get install -y libosmesa6"):
        render.configure_renderer("osmesa")
