"""The action contract: 59 semantic values per transition, padded to 64, with masks.

One *transition* is what happens between two consecutive RGB observations, so an episode
of T transitions has T+1 frames. Its action row holds what was commanded over that
transition and where the robot ended up, in declared units and frames. Every source fills
the slots it has and masks the rest (a single-arm robot masks the whole right arm).

Layout (index: name, unit)::

    per arm, left at 0..23 and right at 24..47 (offset a = 0 or 24):
      a+0..2    eef_pos             m     commanded end-effector position at the end of the
                                          transition, in the domain's world frame
      a+3..8    eef_rot6d           -     commanded end-effector orientation (see ROT6D)
      a+9       gripper_width       m     commanded finger opening (calibrated distance
                                          between the two fingers; 0 = closed)
      a+10..12  eef_delta_pos       m     commanded position minus measured position at the
                                          start of the transition (world frame)
      a+13..15  eef_delta_rotvec    rad   rotation from measured start orientation to the
                                          commanded one, as a world-frame rotation vector
      a+16      gripper_delta       m     commanded minus measured width at the start
      a+17..23  joint_pos           rad   measured joint positions at the end of the
                                          transition (7 slots; a 6-DoF arm masks the 7th)
    shared:
      48..50    rel_pos             m     right eef position in the left eef frame (end)
      51..56    rel_rot6d           -     right eef orientation in the left eef frame
      57        duration            s     wall time covered by the transition
      58        eef_distance        m     distance between the two end effectors (end)
    59..63      padding                   always masked

ROT6D: the first two *columns* of the rotation matrix R (body-to-world), stacked as
``[R[0,0], R[1,0], R[2,0], R[0,1], R[1,1], R[2,1]]`` (Zhou et al., 2019). Decoding
normalises the first column, removes its component from the second (Gram-Schmidt) and
takes the cross product for the third. Quaternions are MuJoCo's ``(w, x, y, z)``.

Normalisation: fixed global statistics per slot, computed once over the valid train
values of every source and stored in the bundle's manifest:
``y = asinh((x - offset) / scale) / asinh(1)`` with ``offset = (q01 + q99) / 2`` and
``scale = (q99 - q01) / 2``, so the 1st and 99th percentiles land at about -1 and +1 and
outliers are compressed logarithmically instead of clipped. The bundle stores raw values;
the loader applies the transform (an already-normalised file is refused).
"""

from __future__ import annotations

import numpy as np

SEMANTIC_DIM = 59
PADDED_DIM = 64
ARM_DIM = 24
ASINH_1 = float(np.arcsinh(1.0))
MIN_SCALE = 1e-6  # a constant slot gets scale 1 (see compute_statistics)

ROT6D_CONVENTION = "first two columns of R (body-to-world), column-major: [R00,R10,R20,R01,R11,R21]; Gram-Schmidt decode (Zhou et al. 2019)"
QUAT_CONVENTION = "wxyz (MuJoCo)"

_ARM_FIELDS = [
    ("eef_pos", 3, "m"),
    ("eef_rot6d", 6, "1"),
    ("gripper_width", 1, "m"),
    ("eef_delta_pos", 3, "m"),
    ("eef_delta_rotvec", 3, "rad"),
    ("gripper_delta", 1, "m"),
    ("joint_pos", 7, "rad"),
]
_SHARED_FIELDS = [
    ("rel_pos", 3, "m"),
    ("rel_rot6d", 6, "1"),
    ("duration", 1, "s"),
    ("eef_distance", 1, "m"),
]


def _build_layout() -> dict[str, tuple[int, int, str]]:
    layout: dict[str, tuple[int, int, str]] = {}
    i = 0
    for arm in ("left", "right"):
        for name, n, unit in _ARM_FIELDS:
            layout[f"{arm}.{name}"] = (i, i + n, unit)
            i += n
    for name, n, unit in _SHARED_FIELDS:
        layout[name] = (i, i + n, unit)
        i += n
    assert i == SEMANTIC_DIM, i
    return layout


LAYOUT = _build_layout()  # field -> (start, stop, unit)


def slot_names() -> list[str]:
    """One name per semantic slot, e.g. ``left.eef_pos[0]``."""
    names = []
    for field, (a, b, _) in LAYOUT.items():
        names += [f"{field}[{k}]" for k in range(b - a)] if b - a > 1 else [field]
    return names


def slot_units() -> list[str]:
    units = []
    for a, b, unit in LAYOUT.values():
        units += [unit] * (b - a)
    return units


def describe() -> dict:
    """The contract as recorded in every manifest (validate compares it field by field)."""
    return {
        "semantic_dim": SEMANTIC_DIM,
        "padded_dim": PADDED_DIM,
        "fields": {k: {"start": a, "stop": b, "unit": u} for k, (a, b, u) in LAYOUT.items()},
        "rot6d": ROT6D_CONVENTION,
        "quaternion": QUAT_CONVENTION,
        "gripper_width": "calibrated distance between the finger pads in metres (0 = closed)",
        "timing": "T+1 RGB observations for T transitions; action row t spans frames t -> t+1",
        "normalization": "y = asinh((x - offset) / scale) / asinh(1); offset=(q01+q99)/2, scale=(q99-q01)/2 over valid train values",
    }


class ActionRow:
    """Builds one or many semantic action rows with their validity mask, by field name."""

    def __init__(self, steps: int):
        self.values = np.zeros((steps, SEMANTIC_DIM), np.float64)
        self.mask = np.zeros((steps, SEMANTIC_DIM), bool)

    def set(self, field: str, value) -> None:
        a, b, _ = LAYOUT[field]
        value = np.asarray(value, np.float64).reshape(self.values.shape[0], -1)
        if value.shape[1] > b - a:
            raise ValueError(f"{field}: {value.shape[1]} values for {b - a} slots")
        self.values[:, a : a + value.shape[1]] = value
        self.mask[:, a : a + value.shape[1]] = True


# ----------------------------------------------------------------------------- rotations
def quat_to_matrix(q) -> np.ndarray:
    """(..., 4) wxyz -> (..., 3, 3)."""
    q = np.asarray(q, np.float64)
    q = q / np.linalg.norm(q, axis=-1, keepdims=True)
    w, x, y, z = np.moveaxis(q, -1, 0)
    return np.stack(
        [
            np.stack([1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)], -1),
            np.stack([2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)], -1),
            np.stack([2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)], -1),
        ],
        -2,
    )


def rotvec_to_matrix(v) -> np.ndarray:
    """Rodrigues: (..., 3) axis-angle -> (..., 3, 3)."""
    v = np.asarray(v, np.float64)
    theta = np.linalg.norm(v, axis=-1, keepdims=True)
    axis = v / np.maximum(theta, 1e-12)
    x, y, z = np.moveaxis(axis, -1, 0)
    zero = np.zeros_like(x)
    k = np.stack([np.stack([zero, -z, y], -1), np.stack([z, zero, -x], -1), np.stack([-y, x, zero], -1)], -2)
    th = theta[..., None]
    eye = np.broadcast_to(np.eye(3), k.shape)
    return eye + np.sin(th) * k + (1 - np.cos(th)) * (k @ k)


def matrix_to_rotvec(r) -> np.ndarray:
    """(..., 3, 3) -> (..., 3) rotation vector (angle in [0, pi])."""
    r = np.asarray(r, np.float64)
    cos = np.clip((np.trace(r, axis1=-2, axis2=-1) - 1) / 2, -1.0, 1.0)
    theta = np.arccos(cos)
    w = np.stack([r[..., 2, 1] - r[..., 1, 2], r[..., 0, 2] - r[..., 2, 0], r[..., 1, 0] - r[..., 0, 1]], -1)
    sin = np.sin(theta)
    small = sin < 1e-6
    out = w * (theta / np.where(small, 1.0, 2 * sin))[..., None]
    out = np.where(small[..., None] & (theta < 1.0)[..., None], w / 2, out)  # near identity
    # near pi: axis from the largest diagonal of (R + I) / 2
    near_pi = small & (theta >= 1.0)
    if np.any(near_pi):
        b = (r[near_pi] + np.eye(3)) / 2
        idx = np.argmax(np.diagonal(b, axis1=-2, axis2=-1), -1)
        axis = b[np.arange(len(idx)), :, idx]
        axis /= np.linalg.norm(axis, axis=-1, keepdims=True)
        out[near_pi] = axis * np.pi
    return out


def matrix_to_rot6d(r) -> np.ndarray:
    r = np.asarray(r, np.float64)
    return np.concatenate([r[..., :, 0], r[..., :, 1]], -1)


def rot6d_to_matrix(d) -> np.ndarray:
    d = np.asarray(d, np.float64)
    a1, a2 = d[..., :3], d[..., 3:6]
    b1 = a1 / np.linalg.norm(a1, axis=-1, keepdims=True)
    a2 = a2 - np.sum(b1 * a2, -1, keepdims=True) * b1
    b2 = a2 / np.linalg.norm(a2, axis=-1, keepdims=True)
    b3 = np.cross(b1, b2)
    return np.stack([b1, b2, b3], -1)


# ------------------------------------------------------------------------- normalisation
def compute_statistics(values: np.ndarray, mask: np.ndarray) -> dict[str, list[float]]:
    """Fixed global asinh statistics per padded slot from raw (N, 59) values and masks.

    Slots that are never valid, or constant, get offset = their value (or 0), scale 1:
    they then normalise to 0 and never blow up.
    """
    offset = np.zeros(PADDED_DIM)
    scale = np.ones(PADDED_DIM)
    q01 = np.zeros(PADDED_DIM)
    q99 = np.zeros(PADDED_DIM)
    for k in range(SEMANTIC_DIM):
        v = values[mask[:, k], k]
        if v.size == 0:
            continue
        lo, hi = np.quantile(v, [0.01, 0.99])
        q01[k], q99[k] = lo, hi
        offset[k] = (lo + hi) / 2
        half = (hi - lo) / 2
        scale[k] = half if half > MIN_SCALE else 1.0
    return {"offset": offset.tolist(), "scale": scale.tolist(), "q01": q01.tolist(), "q99": q99.tolist()}


def normalize(x, offset, scale):
    """Raw -> normalised: asinh((x - offset) / scale) / asinh(1). Works on numpy or torch."""
    if hasattr(x, "asinh"):  # torch tensor
        return ((x - offset) / scale).asinh() / ASINH_1
    return np.arcsinh((np.asarray(x) - offset) / scale) / ASINH_1


def denormalize(y, offset, scale):
    if hasattr(y, "sinh"):
        return (y * ASINH_1).sinh() * scale + offset
    return np.sinh(np.asarray(y) * ASINH_1) * scale + offset


def pad(values: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(T, 59) values and mask -> (T, 64); padding slots are 0 and masked; masked values are 0."""
    t = values.shape[0]
    out = np.zeros((t, PADDED_DIM), np.float32)
    m = np.zeros((t, PADDED_DIM), bool)
    out[:, :SEMANTIC_DIM] = np.where(mask, values, 0.0)
    m[:, :SEMANTIC_DIM] = mask
    return out, m


def unpad(values: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if mask[..., SEMANTIC_DIM:].any():
        raise ValueError("padding slots 59..63 are marked valid; the contract has 59 semantic values")
    return values[..., :SEMANTIC_DIM], mask[..., :SEMANTIC_DIM]


# ---------------------------------------------------------------------- filling one arm
def arm_fields(
    row: ActionRow,
    arm: str,
    *,
    target_pos,
    target_rot,
    target_width,
    start_pos,
    start_rot,
    start_width,
    joint_pos=None,
) -> None:
    """Fill one arm's slots from commanded targets and measured start states.

    Shapes: positions (T, 3), rotations (T, 3, 3), widths (T,), joints (T, J<=7).
    """
    row.set(f"{arm}.eef_pos", target_pos)
    row.set(f"{arm}.eef_rot6d", matrix_to_rot6d(target_rot))
    row.set(f"{arm}.gripper_width", target_width)
    row.set(f"{arm}.eef_delta_pos", np.asarray(target_pos) - np.asarray(start_pos))
    rel = np.asarray(target_rot) @ np.swapaxes(np.asarray(start_rot), -1, -2)  # world-frame delta
    row.set(f"{arm}.eef_delta_rotvec", matrix_to_rotvec(rel))
    row.set(f"{arm}.gripper_delta", np.asarray(target_width) - np.asarray(start_width))
    if joint_pos is not None:
        row.set(f"{arm}.joint_pos", joint_pos)


def shared_fields(row: ActionRow, *, left_pos, left_rot, right_pos, right_rot) -> None:
    """Relative pose of the right end effector in the left one's frame, and their distance."""
    lt = np.swapaxes(np.asarray(left_rot), -1, -2)
    rel_pos = np.einsum("tij,tj->ti", lt, np.asarray(right_pos) - np.asarray(left_pos))
    row.set("rel_pos", rel_pos)
    row.set("rel_rot6d", matrix_to_rot6d(lt @ np.asarray(right_rot)))
    row.set("eef_distance", np.linalg.norm(np.asarray(right_pos) - np.asarray(left_pos), axis=-1))
