import numpy as np
import pytest

from wmrl.bimanual import contract as C


def random_rotations(n, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(n, 4))
    return C.quat_to_matrix(q / np.linalg.norm(q, axis=1, keepdims=True))


def test_layout_is_59_values_padded_to_64():
    assert C.SEMANTIC_DIM == 59 and C.PADDED_DIM == 64
    assert len(C.slot_names()) == 59 and len(set(C.slot_names())) == 59
    assert len(C.slot_units()) == 59
    spans = sorted(C.LAYOUT.values())
    assert spans[0][0] == 0 and spans[-1][1] == 59
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))  # contiguous, no overlap


def test_rot6d_round_trip_and_convention():
    r = random_rotations(200)
    d = C.matrix_to_rot6d(r)
    assert d.shape == (200, 6)
    # the convention: first two columns of R, column-major
    np.testing.assert_allclose(d[:, :3], r[:, :, 0])
    np.testing.assert_allclose(d[:, 3:], r[:, :, 1])
    np.testing.assert_allclose(C.rot6d_to_matrix(d), r, atol=1e-10)
    # a perturbed 6D vector still decodes to a proper rotation (Gram-Schmidt)
    m = C.rot6d_to_matrix(d * 1.3 + 0.05)
    np.testing.assert_allclose(m @ np.swapaxes(m, 1, 2), np.broadcast_to(np.eye(3), m.shape), atol=1e-10)
    np.testing.assert_allclose(np.linalg.det(m), 1.0, atol=1e-10)


def test_rotvec_round_trip_including_edges():
    rng = np.random.default_rng(1)
    v = rng.normal(size=(100, 3))
    v = v / np.linalg.norm(v, axis=1, keepdims=True) * rng.uniform(0, np.pi - 1e-3, (100, 1))
    v = np.concatenate([v, [[0, 0, 0], [1e-9, 0, 0], [np.pi, 0, 0]]])
    r = C.rotvec_to_matrix(v)
    np.testing.assert_allclose(C.rotvec_to_matrix(C.matrix_to_rotvec(r)), r, atol=1e-7)


def test_asinh_round_trip_and_percentiles_near_one():
    rng = np.random.default_rng(2)
    x = np.zeros((5000, C.SEMANTIC_DIM))
    x[:, 0] = rng.normal(3.0, 0.2, 5000)  # a slot with an offset
    x[:, 1] = rng.standard_cauchy(5000)  # heavy tails are compressed, not clipped
    x[:, 2] = 7.0  # constant
    mask = np.ones_like(x, bool)
    mask[:, 5:] = False
    st = C.compute_statistics(x, mask)
    off, sc = np.array(st["offset"]), np.array(st["scale"])
    y = C.normalize(np.pad(x, ((0, 0), (0, 5))), off, sc)
    q01, q99 = np.quantile(y[:, 0], [0.01, 0.99])
    assert q01 == pytest.approx(-1, abs=0.02) and q99 == pytest.approx(1, abs=0.02)
    assert np.abs(y[:, 1]).max() < 12  # log compression of outliers
    assert np.all(y[:, 2] == 0) and sc[2] == 1.0
    assert sc[10] == 1.0 and off[10] == 0.0  # never-valid slot
    back = C.denormalize(y, off, sc)
    np.testing.assert_allclose(back[:, :3], x[:, :3], rtol=1e-9, atol=1e-9)
    # the formula, exactly
    assert C.normalize(off[0] + sc[0], off, sc)[0] == pytest.approx(1.0)


def test_pad_and_mask():
    v = np.arange(2 * 59, dtype=float).reshape(2, 59) + 1
    m = np.zeros((2, 59), bool)
    m[:, :10] = True
    p, pm = C.pad(v, m)
    assert p.shape == (2, 64) and pm.shape == (2, 64)
    assert not pm[:, 59:].any() and np.all(p[:, 59:] == 0)
    assert np.all(p[:, 10:] == 0)  # masked values are zeroed
    uv, um = C.unpad(p, pm)
    np.testing.assert_array_equal(um, m)
    np.testing.assert_array_equal(uv[m], v[m])
    pm[0, 60] = True
    with pytest.raises(ValueError, match="padding"):
        C.unpad(p, pm)


def test_arm_fields_deltas():
    rot = random_rotations(3, seed=3)
    row = C.ActionRow(3)
    C.arm_fields(row, "right", target_pos=np.ones((3, 3)), target_rot=rot, target_width=np.full(3, 0.05),
                 start_pos=np.zeros((3, 3)), start_rot=rot, start_width=np.full(3, 0.02), joint_pos=np.zeros((3, 6)))
    a, b, _ = C.LAYOUT["right.eef_delta_pos"]
    np.testing.assert_allclose(row.values[:, a:b], 1.0)
    a, b, _ = C.LAYOUT["right.eef_delta_rotvec"]
    np.testing.assert_allclose(row.values[:, a:b], 0.0, atol=1e-9)
    a, _, _ = C.LAYOUT["right.gripper_delta"]
    np.testing.assert_allclose(row.values[:, a], 0.03)
    a, b, _ = C.LAYOUT["right.joint_pos"]
    assert row.mask[:, a : a + 6].all() and not row.mask[:, a + 6].any()  # 6-DoF arm: slot 7 masked
    assert not row.mask[:, :24].any()  # left arm untouched
