import h5py
import numpy as np
import pytest

from tests.helpers import synthetic_trajectory
from wmrl.data.trajectory import (
    TrajectoryError,
    TrajectoryWriter,
    count_episodes,
    iter_episodes,
    open_trajectories,
)


def test_round_trip_keeps_every_array_and_attribute(tmp_path):
    path = tmp_path / "t.hdf5"
    trajs = [synthetic_trajectory(frames=3 + i, seed=i, success=bool(i % 2)) for i in range(3)]
    w = TrajectoryWriter(path)
    for t in trajs:
        w.append(t)
    w.finalize()
    back = list(iter_episodes(path))
    assert len(back) == 3
    for a, b in zip(trajs, back):
        for key in ("main", "wrist", "proprio", "states", "frame_step", "rewards", "actions"):
            np.testing.assert_array_equal(getattr(a, key), getattr(b, key))
        assert b.dones[-1] == 1 and b.dones[:-1].sum() == 0
        assert b.attrs["success"] == a.attrs["success"]
        assert b.attrs["instruction"] == a.attrs["instruction"]
        assert b.attrs["init_mode"] == "train"
    # chunk k's actions are the steps between frame k and k+1
    np.testing.assert_array_equal(back[0].chunk_actions(1), trajs[0].actions[8:16])


def test_images_are_compressed_and_chunked_per_frame(tmp_path):
    path = tmp_path / "t.hdf5"
    w = TrajectoryWriter(path)
    w.append(synthetic_trajectory(frames=5, size=32))
    w.finalize()
    with h5py.File(path) as f:
        ds = f["data/demo_0/obs/agentview_rgb"]
        assert ds.dtype == np.uint8 and ds.shape == (5, 32, 32, 3)
        assert ds.chunks == (1, 32, 32, 3)
        assert ds.compression == "gzip"


def test_nothing_appears_under_the_final_name_until_finalize(tmp_path):
    path = tmp_path / "t.hdf5"
    w = TrajectoryWriter(path)
    w.append(synthetic_trajectory())
    assert not path.exists() and w.partial.exists()
    w.close()  # a killed run: only the partial file remains
    w2 = TrajectoryWriter(path)  # rerun resumes
    assert w2.num_episodes == 1
    w2.append(synthetic_trajectory(seed=1))
    w2.finalize()
    assert count_episodes(path) == 2 and not w2.partial.exists()


def test_an_unreadable_partial_file_is_moved_aside_not_trusted(tmp_path):
    path = tmp_path / "t.hdf5"
    partial = path.with_name(path.name + ".partial")
    partial.write_bytes(b"\x89HDF\r\n garbage")
    w = TrajectoryWriter(path)
    assert w.num_episodes == 0
    assert partial.with_name(partial.name + ".broken").exists()
    w.close()


def test_existing_output_is_refused_without_overwrite(tmp_path):
    path = tmp_path / "t.hdf5"
    w = TrajectoryWriter(path)
    w.append(synthetic_trajectory())
    w.finalize()
    before = path.read_bytes()
    with pytest.raises(FileExistsError, match="--overwrite"):
        TrajectoryWriter(path)
    assert path.read_bytes() == before


def test_missing_episode_attribute_is_refused(tmp_path):
    t = synthetic_trajectory()
    del t.attrs["seed"]
    w = TrajectoryWriter(tmp_path / "t.hdf5")
    with pytest.raises(TrajectoryError, match="seed"):
        w.append(t)
    w.close()


def test_opening_a_non_hdf5_file_says_what_to_do(tmp_path):
    bad = tmp_path / "x.hdf5"
    bad.write_text("not hdf5")
    with pytest.raises(TrajectoryError, match="regenerate"):
        open_trajectories(bad)
    with pytest.raises(TrajectoryError, match="no such file"):
        open_trajectories(tmp_path / "missing.hdf5")
