"""The two cameras' geometry: where the end effector appears in the main camera (LIBERO-Spatial's
fixed agentview camera), and how the wrist camera's view of the table moves with the arm.

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

import math

import torch

from wmrl.worldmodel.rotation import axis_angle_to_matrix

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


# ---------------------------------------------------------------------------------------------
# The wrist camera (robot0_eye_in_hand) rides the end effector: its pose in the end effector's
# frame is fixed (read from the live simulator; ``tests/sim`` checks it), so the proprio (end
# effector position and axis-angle) says where it looks. Over a chunk it mostly sees the table
# and the objects on it move as the arm moves; warping the frame of the chunk's start onto the
# table plane as seen from the end pose draws that motion with no learning at all
# (``wrist_warp``). On the policy's own episodes it brings the frame one chunk late from 17.8 to
# 20.0 dB against the real one (bench/RESULTS.md, "The wrist camera's motion by geometry").

WRIST_IN_EEF_POSITION = (0.0, 0.05, -0.097)  # metres, in the end effector's frame
WRIST_IN_EEF_ROTATION = ((-1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, -1.0))
WRIST_FOVY_DEGREES = 75.0
TABLE_HEIGHT = 0.9  # world z of LIBERO-Spatial's table top (table_collision: 0.875 + 0.025)
# The fingers fill the bottom of the wrist frame and move with the camera: those rows are kept
# as they are, not warped onto the table (measured: the bottom 25% at 128 px).
WRIST_GRIPPER_ROWS = 0.25


def wrist_camera_pose(proprio: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, P) raw proprio -> the wrist camera's (B, 3, 3) rotation (camera to world; MuJoCo's
    camera axes: x right, y up, looking along -z) and (B, 3) position in the world."""
    p = proprio.float()
    eef = axis_angle_to_matrix(p[:, 3:6])
    rotation = torch.tensor(WRIST_IN_EEF_ROTATION, device=p.device)
    position = torch.tensor(WRIST_IN_EEF_POSITION, device=p.device)
    return eef @ rotation, p[:, :3] + eef @ position


def wrist_warp(frames: torch.Tensor, proprio_from: torch.Tensor, proprio_to: torch.Tensor,
               plane: float = TABLE_HEIGHT) -> torch.Tensor:
    """(B, C, H, W) wrist frames taken at ``proprio_from`` -> as the camera at ``proprio_to``
    would see them if everything lay on the table plane (raw proprio, (B, P)). Each pixel of the
    new view casts its ray onto the plane and reads the old frame where that point was; the
    gripper's rows are kept. Objects standing on the table come out a little displaced, what a
    network given this frame has left to correct. Frames keep their range and dtype."""
    b, _, h, w = frames.shape
    rot_from, pos_from = wrist_camera_pose(proprio_from)
    rot_to, pos_to = wrist_camera_pose(proprio_to)
    focal = 0.5 * h / math.tan(math.radians(WRIST_FOVY_DEGREES) / 2)  # pixels (square pixels)
    rows = torch.arange(h, device=frames.device, dtype=torch.float32) + 0.5
    cols = torch.arange(w, device=frames.device, dtype=torch.float32) + 0.5
    row, col = torch.meshgrid(rows, cols, indexing="ij")
    # the kit's upright frames are MuJoCo's buffer turned by 180 degrees: column grows to -x, row to -y
    ray = torch.stack([-(col - w / 2) / focal, -(row - h / 2) / focal, -torch.ones_like(row)], dim=-1)
    ray = torch.einsum("bij,hwj->bhwi", rot_to, ray)
    depth = (plane - pos_to[:, None, None, 2]) / ray[..., 2]
    point = pos_to[:, None, None] + depth[..., None] * ray  # where each ray meets the table
    seen = torch.einsum("bji,bhwj->bhwi", rot_from, point - pos_from[:, None, None])
    ahead = -seen[..., 2]
    u = w / 2 - focal * seen[..., 0] / ahead.clamp_min(1e-6)
    v = h / 2 - focal * seen[..., 1] / ahead.clamp_min(1e-6)
    grid = torch.stack([2 * u / w - 1, 2 * v / h - 1], dim=-1)
    grid = torch.where(((depth > 0) & (ahead > 0))[..., None], grid, torch.full_like(grid, 2.0))
    out = torch.nn.functional.grid_sample(frames.float(), grid, align_corners=False, padding_mode="border")
    keep = h - int(round(WRIST_GRIPPER_ROWS * h))
    out[..., keep:, :] = frames[..., keep:, :].float()
    return out.to(frames.dtype)
