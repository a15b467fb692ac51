"""wmrl.worldmodel.rotation: LIBERO's axis-angle (robosuite's convention; the live check against
robosuite is in tests/sim) and motions that do not jump where it flips."""

import math

import pytest

torch = pytest.importorskip("torch")

from wmrl.worldmodel import rotation  # noqa: E402


def _random_axis_angles(n: int, seed: int = 0, low: float = 0.0, high: float = math.pi) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    axis = torch.randn(n, 3, generator=g)
    axis = axis / axis.norm(dim=-1, keepdim=True)
    return axis * (low + (high - low) * torch.rand(n, 1, generator=g))


def test_axis_angle_round_trips_through_matrix_and_quaternion_with_the_angle_in_0_pi():
    aa = _random_axis_angles(500, high=math.pi - 1e-3)
    m = rotation.axis_angle_to_matrix(aa)
    torch.testing.assert_close(m @ m.transpose(-1, -2), torch.eye(3).expand(500, 3, 3), atol=1e-5, rtol=0)
    torch.testing.assert_close(rotation.matrix_to_axis_angle(m), aa, atol=1e-4, rtol=0)
    q = rotation.matrix_to_quaternion(m)
    assert (q[:, 3] >= 0).all() and torch.allclose(q.norm(dim=-1), torch.ones(500))
    # past pi the same rotation is written the other way round: angle 2 pi - a about -n
    beyond = _random_axis_angles(200, seed=1, low=math.pi + 0.01, high=2 * math.pi - 0.01)
    written = rotation.matrix_to_axis_angle(rotation.axis_angle_to_matrix(beyond))
    angle = beyond.norm(dim=-1, keepdim=True)
    torch.testing.assert_close(written, -beyond / angle * (2 * math.pi - angle), atol=1e-4, rtol=0)


def test_a_small_turn_across_the_flip_is_small_and_composes_back():
    """Fingers down, about pi about x: turning by 0.02 rad crosses pi, the axis-angle jumps by
    nearly 2 pi, the relative rotation is the 0.02 rad turn."""
    before = torch.tensor([[math.pi - 0.01, 0.0, 0.0]])
    delta = torch.tensor([[0.02, 0.0, 0.0]])
    after = rotation.turn(before, delta)
    assert (after - before).abs().max() > 6  # the proprio's jump
    torch.testing.assert_close(rotation.relative_rotation(before, after), delta, atol=1e-5, rtol=0)
    a, b = _random_axis_angles(300, seed=2), _random_axis_angles(300, seed=3)
    torch.testing.assert_close(rotation.turn(a, rotation.relative_rotation(a, b)), b, atol=1e-4, rtol=0)


def test_the_mean_of_two_orientations_across_the_flip_lies_between_them():
    left, right = torch.tensor([[math.pi - 0.01, 0.0, 0.0]]), torch.tensor([[-(math.pi - 0.01), 0.0, 0.0]])
    assert (left + right).norm() < 1e-6  # the naive mean: no rotation at all, a half turn off
    mean = rotation.mean_orientation([left, right])
    turn = rotation.relative_rotation(mean, left).norm()
    assert turn == pytest.approx(0.01, abs=1e-4)  # halfway: pi about x, 0.01 rad from each
    a = _random_axis_angles(50, seed=4)
    torch.testing.assert_close(rotation.mean_orientation([a, a]), a, atol=1e-4, rtol=0)


def test_imagination_averages_the_two_models_proprio_with_orientations_as_rotations():
    from wmrl.worldmodel.imagine import mean_proprio

    a = torch.tensor([[0.1, 0.0, 1.0, math.pi - 0.01, 0.0, 0.0, 0.02, -0.02]])
    b = torch.tensor([[0.3, 0.0, 1.2, -(math.pi - 0.01), 0.0, 0.0, 0.04, -0.04]])  # across the flip from a
    m = mean_proprio([a, b])
    torch.testing.assert_close(m[:, :3], torch.tensor([[0.2, 0.0, 1.1]]))
    torch.testing.assert_close(m[:, 6:], torch.tensor([[0.03, -0.03]]))
    assert abs(m[0, 3:6].norm().item() - math.pi) < 1e-4  # a half turn, not the naive mean's zero
    assert mean_proprio([a[:, :7], b[:, :7]]).shape == (1, 7)  # another layout: element by element
