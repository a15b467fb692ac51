import numpy as np
import pytest

from wmrl.data.synthetic import moving_square_episode, write_file  # noqa: F401  (used by the tests)


@pytest.fixture(scope="session")
def trajectories(tmp_path_factory):
    """Two files: 'new' (sparse frames, like rollouts) and 'replay' (dense, like demos)."""
    d = tmp_path_factory.mktemp("traj")
    rng = np.random.default_rng(0)
    new = write_file(d / "new" / "rollouts.hdf5", [moving_square_episode(rng, 5) for _ in range(5)])
    replay = write_file(d / "replay" / "demos.hdf5", [moving_square_episode(rng, 4, dense=True) for _ in range(5)])
    return new, replay
