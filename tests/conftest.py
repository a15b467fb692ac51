import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
os.environ.setdefault("TQDM_DISABLE", "1")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: runs real simulator episodes for more than ~30 s")
    # Pick the GL backend once, before any test imports MuJoCo (it reads MUJOCO_GL at import).
    from wmrl.gl import RendererError, configure_renderer

    try:
        configure_renderer()
    except RendererError as e:  # reported by the simulator tests themselves
        print(f"note: {e}")


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT
