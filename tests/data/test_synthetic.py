import numpy as np

from wmrl.data.synthetic import moving_square_episode, write_file
from wmrl.data.trajectory import iter_episodes


def _square_centre(frame):
    ys, xs = np.nonzero(frame[..., 0] > 100)  # the square is the only bright-red region
    return xs.mean(), ys.mean()


def test_the_square_moves_by_each_chunks_summed_actions():
    ep = moving_square_episode(np.random.default_rng(1), 4)
    assert ep.main.shape == (5, 64, 64, 3) and ep.actions.shape == (32, 7)
    moved = 0
    for i in range(4):
        (x0, y0), (x1, y1) = _square_centre(ep.main[i]), _square_centre(ep.main[i + 1])
        dx, dy = ep.actions[8 * i:8 * (i + 1), :2].sum(0) * 1.5
        inside = all(6 < c < 57 for c in (x0, x1, y0, y1))  # clipping at the border stops the square
        if inside:
            assert abs((x1 - x0) - dx) <= 1.5 and abs((y1 - y0) - dy) <= 1.5
            moved += 1
    assert moved > 0
    np.testing.assert_array_equal(ep.wrist, ep.main[:, :, ::-1])


def test_written_episodes_read_back(tmp_path):
    rng = np.random.default_rng(0)
    eps = [moving_square_episode(rng, 3, dense=True) for _ in range(2)]
    path = write_file(tmp_path / "toy.hdf5", eps)
    back = list(iter_episodes(path))
    assert len(back) == 2
    np.testing.assert_array_equal(back[1].main, eps[1].main)
    assert back[0].main.shape[0] == 25  # dense: every step has a frame
