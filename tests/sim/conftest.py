import pytest

from wmrl.config import SimConfig


@pytest.fixture(scope="session")
def sim_cfg() -> SimConfig:
    return SimConfig(image_size=64)


@pytest.fixture(scope="session")
def env0(sim_cfg):
    """One real LIBERO-Spatial env (task 0, 64 px) shared by the simulator tests: ~10 s to build."""
    from wmrl.sim.env import SpatialEnv

    env = SpatialEnv(0, sim_cfg)
    yield env
    env.close()
