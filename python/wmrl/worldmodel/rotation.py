"""The end effector's orientation as the proprio writes it, and how to move it without jumps.

LIBERO's proprio gives the orientation as an axis-angle vector written the way robosuite does:
the rotation matrix -> a unit quaternion with w >= 0 -> axis x angle, the angle in [0, pi]. The
arm works with its fingers down, a rotation of nearly pi, where that vector is discontinuous: a
small turn past pi flips it from about +pi n to -pi n. In the policy's own episodes the flip
happens in 11 of 20 episodes (60 noisy-expert ones: 51 of 60), so a network that predicts the
next axis-angle from the current one regresses onto a target that jumps by 2 pi, and the
orientation it imagines is wrong exactly where the arm works. The world model therefore predicts
the *change* of orientation over a chunk (small and continuous, in the end effector's frame) and
composes it here (``WorldModelConfig.proprio_motion``). All in float32.
"""

from __future__ import annotations

import torch


def axis_angle_to_matrix(aa: torch.Tensor) -> torch.Tensor:
    """(..., 3) axis-angle -> (..., 3, 3) rotation (Rodrigues)."""
    angle = aa.norm(dim=-1, keepdim=True).clamp_min(1e-9)
    k = aa / angle
    zero = torch.zeros_like(k[..., 0])
    cross = torch.stack([zero, -k[..., 2], k[..., 1], k[..., 2], zero, -k[..., 0], -k[..., 1], k[..., 0], zero],
                        dim=-1).view(*k.shape[:-1], 3, 3)
    angle = angle[..., None]
    eye = torch.eye(3, dtype=aa.dtype, device=aa.device)
    return eye + torch.sin(angle) * cross + (1 - torch.cos(angle)) * cross @ cross


def matrix_to_quaternion(m: torch.Tensor) -> torch.Tensor:
    """(..., 3, 3) rotation -> (..., 4) unit quaternion (x, y, z, w) with w >= 0, robosuite's
    ``mat2quat`` convention. Each entry from the largest of the four diagonal combinations
    (Shepperd's method), so it is accurate at every angle, pi included."""
    m00, m11, m22 = m[..., 0, 0], m[..., 1, 1], m[..., 2, 2]
    # 4 w^2, 4 x^2, 4 y^2, 4 z^2
    squares = torch.stack([1 + m00 + m11 + m22, 1 + m00 - m11 - m22, 1 - m00 + m11 - m22, 1 - m00 - m11 + m22], dim=-1)
    d = (m[..., 2, 1] - m[..., 1, 2], m[..., 0, 2] - m[..., 2, 0], m[..., 1, 0] - m[..., 0, 1])  # 4 w (x, y, z)
    s = (m[..., 0, 1] + m[..., 1, 0], m[..., 0, 2] + m[..., 2, 0], m[..., 1, 2] + m[..., 2, 1])  # 4 (xy, xz, yz)
    # each row: the quaternion (x, y, z, w) times 4 times the component its case divides by
    cases = torch.stack([
        torch.stack([d[0], d[1], d[2], squares[..., 0]], -1),
        torch.stack([squares[..., 1], s[0], s[1], d[0]], -1),
        torch.stack([s[0], squares[..., 2], s[2], d[1]], -1),
        torch.stack([s[1], s[2], squares[..., 3], d[2]], -1),
    ], dim=-2)
    best = squares.argmax(-1)
    q = torch.gather(cases, -2, best[..., None, None].expand(*best.shape, 1, 4)).squeeze(-2)
    q = q / q.norm(dim=-1, keepdim=True)
    return torch.where(q[..., 3:] < 0, -q, q)


def quaternion_to_axis_angle(q: torch.Tensor) -> torch.Tensor:
    """(..., 4) (x, y, z, w) with w >= 0 -> (..., 3) axis-angle, angle in [0, pi] (robosuite's
    ``quat2axisangle``; the identity -> zeros)."""
    v, w = q[..., :3], q[..., 3:]
    norm = v.norm(dim=-1, keepdim=True)
    angle = 2 * torch.atan2(norm, w)
    return torch.where(norm > 1e-8, v / norm.clamp_min(1e-12) * angle, torch.zeros_like(v))


def matrix_to_axis_angle(m: torch.Tensor) -> torch.Tensor:
    """(..., 3, 3) -> (..., 3) axis-angle as LIBERO's proprio writes it."""
    return quaternion_to_axis_angle(matrix_to_quaternion(m))


def relative_rotation(aa_from: torch.Tensor, aa_to: torch.Tensor) -> torch.Tensor:
    """(..., 3) axis-angle of the turn from one orientation to the other in the first one's own
    frame (R_from^T R_to): small over a chunk, with no jump where the proprio flips."""
    m = axis_angle_to_matrix(aa_from.float()).transpose(-1, -2) @ axis_angle_to_matrix(aa_to.float())
    return matrix_to_axis_angle(m)


def turn(aa: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """The orientation ``aa`` turned by ``delta`` (axis-angle in its own frame), written as the
    proprio writes it: ``turn(a, relative_rotation(a, b))`` is ``b`` (up to the sign at exactly pi)."""
    return matrix_to_axis_angle(axis_angle_to_matrix(aa.float()) @ axis_angle_to_matrix(delta.float()))


def mean_orientation(aas: list[torch.Tensor]) -> torch.Tensor:
    """The mean of several (..., 3) orientations, written as the proprio writes it: their
    quaternions aligned to the first one's sign and averaged (two models' predictions on either
    side of the flip average to the orientation between them, not to zero)."""
    qs = [matrix_to_quaternion(axis_angle_to_matrix(a.float())) for a in aas]
    ref = qs[0]
    aligned = [torch.where((q * ref).sum(-1, keepdim=True) < 0, -q, q) for q in qs]
    q = torch.stack(aligned).mean(0)
    q = q / q.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    return quaternion_to_axis_angle(torch.where(q[..., 3:] < 0, -q, q))
