"""Where the end effector appears in the main camera: LIBERO-Spatial's fixed agentview camera.

The main-view world model draws the end effector's position now and at the chunk's end (the
latter from its own proprio head, i.e. from the actions) as two Gaussian blobs and reads them
as extra input channels (``WorldModelConfig.pose_maps``). A U-Net conditioned only through a
global vector has to learn to turn "these 56 numbers" into "the arm moves 5 pixels to the
right"; the blobs say it in the image's own coordinates.

The projection below is robosuite's ``get_camera_transform_matrix(sim, "agentview", S, S)``
with its two pixel rows divided by S, so it maps world points to fractions of the image's
width and height, for any image size. The camera is the same in all ten LIBERO-Spatial tasks,
and it maps onto the *upright* images the kit stores (``tests/sim`` checks both against the
live simulator). Kept as a constant because the world-model side does not install LIBERO.
"""

from __future__ import annotations

import torch

# world (x, y, z, 1) -> (u * w, v * w, w); u = column / width, v = row / height of the upright image
AGENTVIEW_PROJECTION = (
    (-0.3889992096, 1.2071067051, -0.3141334088, 0.7620647468),
    (0.3693855708, -0.0000001638, -1.2532601810, 1.7749053591),
    (-0.7779982438, -0.0000001521, -0.6282664504, 1.5241287867),
)

# The blobs' std as a fraction of the image side: 4 px at 128 px, a bit more than the gripper's
# fingertips, so neighbouring positions overlap and the blob's motion is smooth to a convolution.
BLOB_STD = 0.03


def project(points: torch.Tensor) -> torch.Tensor:
    """World points (..., 3) -> (..., 2) image coordinates (u, v) in fractions of the upright
    main view's width and height (0, 0: top left corner)."""
    m = torch.tensor(AGENTVIEW_PROJECTION, dtype=torch.float32, device=points.device)
    homogeneous = torch.cat([points.float(), torch.ones_like(points[..., :1], dtype=torch.float32)], dim=-1)
    p = homogeneous @ m.T
    return p[..., :2] / p[..., 2:]


def blobs(uv: torch.Tensor, height: int, width: int, std: float = BLOB_STD) -> torch.Tensor:
    """(B, K, 2) image coordinates -> (B, K, height, width) Gaussian blobs in [-1, 1] (the
    frames' range: -1 far from the point, 1 on it)."""
    rows = (torch.arange(height, device=uv.device, dtype=torch.float32) + 0.5) / height
    cols = (torch.arange(width, device=uv.device, dtype=torch.float32) + 0.5) / width
    du = cols[None, None, None, :] - uv[..., 0, None, None]
    dv = rows[None, None, :, None] - uv[..., 1, None, None]
    return 2 * torch.exp(-(du**2 + dv**2) / (2 * std**2)) - 1
