"""``FrameWorldModel``: an action-conditioned next-frame generator for one camera view.

Given the last ``context`` frames of a view (one chunk apart, the current one last), the 8
actions of the chunk and the proprio, it generates that view's frame at the end of the chunk
and predicts the proprio there::

    noisy next frame (3 ch) ++ context frames (3 x context ch) [++ main view's frame]
        [++ end effector now and after the chunk, drawn as blobs (2 ch, ``pose_maps``)]
        [++ the wrist frame warped by the camera's motion over the chunk (3 ch, ``wrist_warp``)]
        [--> p x p patches folded into channels (``patch``)]
        --> U-Net with adaptive GroupNorm, conditioned on (noise level, actions, proprio)
        [--> patches unfolded; a full-resolution head over them, the noisy input and the
             current frame (``refine``)]
        --> denoised next frame            (EDM preconditioning, DIAMOND's recipe)
    proprio, actions --> MLP --> next proprio (normalised delta; with ``proprio_motion``: the
                                  chunk's motion, composed with the pose, ``wmrl.worldmodel.rotation``)

Images live in [-1, 1] (uint8 / 127.5 - 1). EDM (Karras et al. 2022): the network F is
wrapped as ``D(x; sigma) = c_skip x + c_out F(c_in x; c_noise)``, trained on log-normal noise
levels with the loss weighted to unit variance, sampled with a few Euler steps on the
Karras schedule (DIAMOND shows 3 steps suffice for next-frame prediction, where the context
pins the answer down). Every sample in a batch is independent, so many imagined rollouts
run as one batch.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from wmrl.config import WorldModelConfig
from wmrl.pretrained import Pretrained
from wmrl.worldmodel import camera, rotation

# A pixel "moves" over a chunk when a channel changes by more than this (frames in [-1, 1]).
MOVING = 0.1
# ``proprio_motion``: the head's outputs in these units (a chunk moves the end effector ~5 cm and
# turns it ~0.1 rad in the policy's episodes), so its targets are of order one
MOTION_POSITION_M = 0.05
MOTION_TURN_RAD = 0.1


def moving_pixels(target: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
    """(B, 1, H, W) mask of the pixels that change from ``current`` to ``target`` (B, 3, H, W):
    the loss's motion weight and the action response (``fidelity``) read the same mask."""
    return (target.float() - current.float()).abs().amax(1, keepdim=True) > MOVING


def own_actions(cfg: WorldModelConfig, actions: torch.Tensor) -> torch.Tensor:
    """The last chunks of an action sequence (B, T, A) that a model of ``cfg`` reads: its
    ``action_history`` past chunks, then the current one (the oldest chunk comes first)."""
    return actions[:, -cfg.action_chunks * cfg.chunk_size:]


def images_to_unit(x: torch.Tensor) -> torch.Tensor:
    """uint8 (..., H, W, 3) -> float (..., 3, H, W) in [-1, 1]."""
    return x.movedim(-1, -3).float() / 127.5 - 1.0


def unit_to_images(x: torch.Tensor) -> torch.Tensor:
    """float (..., 3, H, W) in [-1, 1] -> uint8 (..., H, W, 3)."""
    return ((x.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).movedim(-3, -1)


class FourierFeatures(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.register_buffer("w", torch.randn(1, dim // 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = 2 * math.pi * x[:, None] * self.w
        return torch.cat([f.cos(), f.sin()], dim=-1)


def tensor_core_conv(x: torch.Tensor, conv: nn.Conv2d, multiple: int = 8) -> torch.Tensor:
    """``conv(x)`` with its input and output channels zero-padded to a multiple of ``multiple``
    and the padding cut off again: the same result (zero channels add nothing) on the channel
    counts cuDNN's tensor-core kernels want. For the refine head's 9 -> 32 -> 3 convolutions at
    full resolution cuDNN otherwise pads them itself, with copies of the activations at every
    update (2.2% of a compiled H100 step at micro batch 4,096; bench/RESULTS.md "The fast kernels
    on an H100")."""
    pad_in, pad_out = -conv.in_channels % multiple, -conv.out_channels % multiple
    w, b = conv.weight, conv.bias
    if pad_in:
        x, w = F.pad(x, (0, 0, 0, 0, 0, pad_in)), F.pad(w, (0, 0, 0, 0, 0, pad_in))
    if pad_out:
        w = F.pad(w, (0, 0, 0, 0, 0, 0, 0, pad_out))
        b = None if b is None else F.pad(b, (0, pad_out))
    y = F.conv2d(x, w, b, conv.stride, conv.padding, conv.dilation, conv.groups)
    return y[:, :conv.out_channels] if pad_out else y


class Upsample2x(nn.Module):
    """Nearest-neighbour upsampling by 2, written as a broadcast: the same values as
    ``nn.Upsample(scale_factor=2)``, but its gradient is a sum over each 2 x 2 block (a plain
    reduction) where the interpolation's backward is a scatter with atomic adds, ~3% of a
    compiled training step on an H100. Laid out NHWC, the layout the compiled U-Net runs in."""

    fold_backward = False  # a runtime kernel choice (``FrameWorldModel.use_fast_kernels``)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.fold_backward:
            return F.interpolate(x, scale_factor=2, mode="nearest")
        b, c, h, w = x.shape
        nhwc = x.permute(0, 2, 3, 1)[:, :, None, :, None, :].expand(b, h, 2, w, 2, c)
        return nhwc.reshape(b, 2 * h, 2 * w, c).permute(0, 3, 1, 2)


class AdaGroupNorm(nn.Module):
    """GroupNorm whose scale and shift come from the conditioning vector."""

    def __init__(self, channels: int, cond_dim: int):
        super().__init__()
        self.norm = nn.GroupNorm(min(8, channels), channels, affine=False)
        self.to_ss = nn.Linear(cond_dim, 2 * channels)

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        scale, shift = self.to_ss(cond)[:, :, None, None].chunk(2, dim=1)
        return self.norm(x) * (1 + scale) + shift


class ResBlock(nn.Module):
    def __init__(self, cin: int, cout: int, cond_dim: int):
        super().__init__()
        self.n1 = AdaGroupNorm(cin, cond_dim)
        self.c1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.n2 = AdaGroupNorm(cout, cond_dim)
        self.c2 = nn.Conv2d(cout, cout, 3, padding=1)
        nn.init.zeros_(self.c2.weight)
        nn.init.zeros_(self.c2.bias)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        h = self.c1(F.silu(self.n1(x, cond)))
        h = self.c2(F.silu(self.n2(h, cond)))
        return self.skip(x) + h


class UNet(nn.Module):
    def __init__(self, cin: int, cout: int, channels: tuple[int, ...], blocks: int, cond_dim: int):
        super().__init__()
        self.stem = nn.Conv2d(cin, channels[0], 3, padding=1)
        self.down, self.up = nn.ModuleList(), nn.ModuleList()
        widths = [channels[0]]
        c = channels[0]
        for i, w in enumerate(channels):
            level = nn.ModuleList()
            for _ in range(blocks):
                level.append(ResBlock(c, w, cond_dim))
                c = w
                widths.append(c)
            self.down.append(level)
            if i < len(channels) - 1:
                self.down.append(nn.ModuleList([nn.Conv2d(c, c, 3, stride=2, padding=1)]))
                widths.append(c)
        self.mid = nn.ModuleList([ResBlock(c, c, cond_dim), ResBlock(c, c, cond_dim)])
        for i, w in reversed(list(enumerate(channels))):
            level = nn.ModuleList()
            for _ in range(blocks + 1):
                level.append(ResBlock(c + widths.pop(), w, cond_dim))
                c = w
            self.up.append(level)
            if i > 0:
                self.up.append(nn.ModuleList([Upsample2x(), nn.Conv2d(c, c, 3, padding=1)]))
        self.out_norm = nn.GroupNorm(min(8, c), c)
        self.out = nn.Conv2d(c, cout, 3, padding=1)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        skips = [h]
        for level in self.down:
            for m in level:
                h = m(h, cond) if isinstance(m, ResBlock) else m(h)
                skips.append(h)
        for m in self.mid:
            h = m(h, cond)
        for level in self.up:
            if isinstance(level[0], ResBlock):
                for m in level:
                    h = m(torch.cat([h, skips.pop()], dim=1), cond)
            else:
                for m in level:
                    h = m(h)
        return self.out(F.silu(self.out_norm(h)))


class FrameWorldModel(Pretrained, nn.Module):
    """Saved and loaded with ``save_pretrained`` / ``from_pretrained`` (``wmrl.pretrained``);
    the proprio statistics it normalises with are buffers, so they travel with the weights."""

    FORMAT = "wmrl-worldmodel/1"
    CONFIG_CLASS = WorldModelConfig
    CONFIG_KEY = "model"

    def __init__(self, cfg: WorldModelConfig):
        super().__init__()
        self.cfg = cfg
        # raw proprio -> normalised: (p - mean) / std, set from the training data
        self.register_buffer("proprio_mean", torch.zeros(cfg.proprio_dim))
        self.register_buffer("proprio_std", torch.ones(cfg.proprio_dim))
        c = cfg.cond_dim
        act = cfg.action_chunks * cfg.chunk_size * cfg.action_dim  # past chunks, then the current one
        self.noise_emb = nn.Sequential(FourierFeatures(c), nn.Linear(c, c), nn.SiLU(), nn.Linear(c, c))
        self.act_emb = nn.Sequential(nn.Linear(act + cfg.proprio_dim, c), nn.SiLU(), nn.Linear(c, c))
        if cfg.action_dropout > 0:  # only then: models trained without it keep their parameter names
            self.null_actions = nn.Parameter(torch.zeros(act))  # "no actions given" (guidance's reference)
        self.guidance = cfg.action_guidance  # runtime: sampling may be asked for another scale (the probe)
        if cfg.context_noise > 0:  # only then: models trained without it keep their parameter names
            self.context_noise_emb = nn.Sequential(nn.Linear(1, c), nn.SiLU(), nn.Linear(c, c))
        pp = cfg.patch * cfg.patch  # space-to-depth: each p x p patch of 3 channels becomes 3 p^2 channels
        maps = (2 if cfg.pose_maps else 0) + (3 if cfg.wrist_warp else 0)
        self.unet = UNet((3 * (1 + cfg.input_frames) + maps) * pp, 3 * pp, cfg.channels, cfg.blocks_per_level, c)
        if cfg.refine > 0:  # only then: models trained without it keep their parameter names
            rp = cfg.refine_patch ** 2  # 1: full resolution; else r x r patches folded into channels
            self.refine_head = nn.Sequential(nn.Conv2d(9 * rp, cfg.refine, 3, padding=1), nn.SiLU(),
                                             nn.Conv2d(cfg.refine, 3 * rp, 3, padding=1))
            nn.init.zeros_(self.refine_head[-1].weight)
            nn.init.zeros_(self.refine_head[-1].bias)
        h = cfg.proprio_hidden
        pose = 3 + 9 + 2 if cfg.proprio_motion else cfg.proprio_dim  # position, rotation matrix, gripper
        self.proprio_head = nn.Sequential(nn.Linear(act + pose, h), nn.SiLU(), nn.Linear(h, h), nn.SiLU(),
                                          nn.Linear(h, cfg.proprio_dim))

    channels_last = False  # a runtime layout choice, not part of the saved config
    fast_kernels = False  # runtime kernel choices of the same function (``use_fast_kernels``)

    def use_fast_kernels(self, on: bool = True) -> "FrameWorldModel":
        """The refine head on tensor-core channel counts and the U-Net's upsampling with a
        reduction for its gradient (``WMTrainConfig.fast_kernels``; off: the plain modules).
        The parameters and results are the same up to rounding."""
        self.fast_kernels = on
        for m in self.modules():
            if isinstance(m, Upsample2x):
                m.fold_backward = on
        return self

    def use_channels_last(self) -> "FrameWorldModel":
        """NHWC activations for the U-Net: cuDNN's bf16 convolutions on tensor cores prefer
        them, and a convolution follows its input's layout. The parameters keep theirs:
        DeepSpeed views them as flat bytes (broadcast, bf16 optimizer), which NHWC strides
        break. Results are the same up to rounding; only speed changes."""
        self.channels_last = True
        return self

    def set_proprio_stats(self, stats: dict) -> None:
        """The raw proprio's mean and spread, kept in float32 whatever the module's dtype
        (DeepSpeed's bf16 mode casts buffers too, and bf16 rounds a position by millimetres)."""
        device = self.proprio_mean.device
        self.proprio_mean = stats["mean"].detach().float().to(device)
        self.proprio_std = stats["std"].detach().float().to(device)

    @property
    def proprio_stats(self) -> dict:
        return {"mean": self.proprio_mean, "std": self.proprio_std}

    def normalize_proprio(self, p: torch.Tensor) -> torch.Tensor:
        return (p - self.proprio_mean) / self.proprio_std

    def unnormalize_proprio(self, p: torch.Tensor) -> torch.Tensor:
        return p * self.proprio_std + self.proprio_mean

    # --------------------------------------------------------------------------- EDM pieces
    def denoise(self, noisy: torch.Tensor, sigma: torch.Tensor, frames: torch.Tensor, actions: torch.Tensor,
                proprio: torch.Tensor, context_level: torch.Tensor | None = None,
                no_actions: torch.Tensor | None = None, maps: torch.Tensor | None = None) -> torch.Tensor:
        """D(noisy; sigma | frames, actions, proprio): the clean next frame's estimate.
        noisy (B, 3, H, W); sigma (B,); frames (B, input_frames, 3, H, W) in [-1, 1];
        actions (B, action_chunks x chunk, A) in [-1, 1] (``action_history`` past chunks, oldest
        first, then the chunk to imagine); proprio (B, P) normalised; ``context_level`` (B,):
        the std of the noise already added to ``frames`` (training's augmentation; None: 0);
        ``no_actions`` (B,) bool: these samples see the learned null instead of their actions;
        ``maps``: ``input_maps`` already drawn for these inputs (a sampler draws them once per frame)."""
        dt = self.unet.stem.weight.dtype  # bf16 under DeepSpeed on a GPU: everything in one dtype
        noisy, sigma, frames, actions, proprio = (t.to(dt) for t in (noisy, sigma, frames, actions, proprio))
        sd = self.cfg.sigma_data
        s = sigma[:, None, None, None]
        c_in = 1 / torch.sqrt(s**2 + sd**2)
        c_skip = sd**2 / (s**2 + sd**2)
        c_out = s * sd / torch.sqrt(s**2 + sd**2)
        c_noise = torch.log(sigma) / 4
        acts = actions.flatten(1)
        if no_actions is not None:
            acts = torch.where(no_actions[:, None], self.null_actions.to(dt), acts)
        cond = self.noise_emb(c_noise) + self.act_emb(torch.cat([acts, proprio], dim=1))
        if self.cfg.context_noise > 0:
            level = sigma.new_zeros(sigma.shape) if context_level is None else context_level.to(dt)
            cond = cond + self.context_noise_emb(level[:, None] / self.cfg.context_noise)
        x = torch.cat([noisy * c_in, frames.flatten(1, 2)], dim=1)
        if maps is None:
            maps = self.input_maps(frames, actions, proprio, no_actions)
        if maps is not None:
            x = torch.cat([x, maps.to(dt)], dim=1)
        if self.cfg.patch > 1:
            x = F.pixel_unshuffle(x, self.cfg.patch)
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        out = self.unet(x, cond)
        if self.cfg.patch > 1:
            out = F.pixel_shuffle(out, self.cfg.patch)
        if self.cfg.refine > 0:  # full-resolution touch-up: sees each pixel's noise and the current frame
            h = torch.cat([out, noisy * c_in, self.current_frame(frames)], dim=1)
            r = self.cfg.refine_patch
            if r > 1:
                h = F.pixel_unshuffle(h, r)
            if self.fast_kernels:
                first, act, last = self.refine_head
                touch = tensor_core_conv(act(tensor_core_conv(h, first)), last)
            else:
                touch = self.refine_head(h)
            out = out + (F.pixel_shuffle(touch, r) if r > 1 else touch)
        return c_skip * noisy + c_out * out

    def guided_denoise(self, noisy: torch.Tensor, sigma: torch.Tensor, frames: torch.Tensor, actions: torch.Tensor,
                       proprio: torch.Tensor, maps: torch.Tensor | None = None) -> torch.Tensor:
        """``denoise`` under action guidance ``self.guidance`` = w (float32): D_null + w (D_actions -
        D_null), both in one batch of 2B; plain ``denoise`` at w = 1. What the sampler steps with;
        ``maps``: ``sampler_maps`` of these inputs, drawn once for all of a frame's steps."""
        w = self.guidance
        if w == 1:
            return self.denoise(noisy, sigma, frames, actions, proprio, maps=maps).float()
        b = noisy.shape[0]
        both = self.denoise(*(torch.cat([t, t]) for t in (noisy, sigma, frames, actions, proprio)),
                            no_actions=torch.arange(2 * b, device=noisy.device) >= b, maps=maps).float()
        return both[b:] + w * (both[:b] - both[b:])

    def input_maps(self, frames: torch.Tensor, actions: torch.Tensor, proprio: torch.Tensor,
                   no_actions: torch.Tensor | None = None) -> torch.Tensor | None:
        """The input channels drawn from the proprio head, (B, C, H, W): the pose maps (main view)
        and the warped wrist frame, or None without either. They read the conditioning alone, not
        the noisy frame: the same at every step of a frame's sampler, which draws them once."""
        dt = self.unet.stem.weight.dtype  # as ``denoise`` casts its inputs, so both draw the same maps
        frames, actions, proprio = (t.to(dt) for t in (frames, actions, proprio))
        maps = []
        if self.cfg.pose_maps:
            maps.append(self.pose_maps(actions, proprio, *frames.shape[-2:]))
        if self.cfg.wrist_warp:
            maps.append(self.warped_frame(frames, actions, proprio, no_actions))
        return torch.cat(maps, dim=1) if maps else None

    def sampler_maps(self, frames: torch.Tensor, actions: torch.Tensor, proprio: torch.Tensor) -> torch.Tensor | None:
        """``input_maps`` laid out as ``guided_denoise`` feeds the network: under guidance both
        branches, the null's without the actions' motion."""
        if self.guidance == 1:
            return self.input_maps(frames, actions, proprio)
        b = frames.shape[0]
        return self.input_maps(*(torch.cat([t, t]) for t in (frames, actions, proprio)),
                               no_actions=torch.arange(2 * b, device=frames.device) >= b)

    def pose_maps(self, actions: torch.Tensor, proprio: torch.Tensor, height: int, width: int) -> torch.Tensor:
        """(B, 2, H, W): the end effector now and at the chunk's end drawn in the main camera.
        The end comes from the proprio head, so at imagination time it follows the policy's
        actions; detached, so the frame loss does not bend the proprio head (trained on the
        real next proprio alone). Positions in float32: bf16 would round them by ~1 cm."""
        with torch.no_grad():
            end = self.next_proprio(actions, proprio)
        mean, std = self.proprio_mean.float(), self.proprio_std.float()
        points = torch.stack([proprio.float() * std + mean, end.float() * std + mean])[..., :3]  # (2, B, 3)
        return camera.blobs(camera.project(points).transpose(0, 1), height, width)

    def warped_frame(self, frames: torch.Tensor, actions: torch.Tensor, proprio: torch.Tensor,
                     no_actions: torch.Tensor | None = None) -> torch.Tensor:
        """(B, 3, H, W): the current wrist frame as the camera would see the table at the chunk's
        end (``camera.wrist_warp``), the end pose from the proprio head (detached, as ``pose_maps``),
        so at imagination time it follows the policy's actions. A sample without its actions
        (``no_actions``, guidance's null) gets the frame unwarped: the null must not see the motion."""
        with torch.no_grad():
            end = self.next_proprio(actions, proprio).float()
            if no_actions is not None:
                end = torch.where(no_actions[:, None], proprio.float(), end)
            return camera.wrist_warp(self.current_frame(frames).float(), self.unnormalize_proprio(proprio.float()),
                                     self.unnormalize_proprio(end))

    def next_proprio(self, actions: torch.Tensor, proprio: torch.Tensor) -> torch.Tensor:
        """Normalised proprio after the chunk: a residual on the current one, or with
        ``proprio_motion`` the current pose moved by the head's predicted motion."""
        dt = self.unet.stem.weight.dtype
        if not self.cfg.proprio_motion:
            actions, proprio = actions.to(dt), proprio.to(dt)
            return proprio + self.proprio_head(torch.cat([actions.flatten(1), proprio], dim=1))
        motion, raw = self.proprio_motion(actions, proprio)
        position = raw[:, :3] + MOTION_POSITION_M * motion[:, :3]
        orientation = rotation.turn(raw[:, 3:6], MOTION_TURN_RAD * motion[:, 3:6])
        gripper = raw[:, 6:] + motion[:, 6:] * self.proprio_std[6:].float()
        return self.normalize_proprio(torch.cat([position, orientation, gripper], dim=1).float())

    def proprio_motion(self, actions: torch.Tensor, proprio: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``proprio_motion``'s head: (B, 8) the chunk's motion in its units (position change /
        MOTION_POSITION_M, turn in the end effector's frame / MOTION_TURN_RAD, gripper change in
        the gripper's normalised units), float32; and the raw current proprio it moves. The head
        reads the pose without the axis-angle's jump: position, rotation matrix, gripper."""
        dt = self.unet.stem.weight.dtype
        raw = self.unnormalize_proprio(proprio.float())
        pose = torch.cat([proprio[:, :3].float(), rotation.axis_angle_to_matrix(raw[:, 3:6]).flatten(1),
                          proprio[:, 6:].float()], dim=1)
        return self.proprio_head(torch.cat([actions.flatten(1).to(dt), pose.to(dt)], dim=1)).float(), raw

    def proprio_loss(self, actions: torch.Tensor, proprio: torch.Tensor, next_proprio: torch.Tensor) -> torch.Tensor:
        """The proprio head's MSE: on the next normalised proprio, or with ``proprio_motion`` on the
        chunk's motion (a target with no jump where the axis-angle flips)."""
        if self.cfg.proprio_motion:
            return F.mse_loss(self.proprio_motion(actions, proprio)[0], self.motion_target(proprio, next_proprio))
        return F.mse_loss(self.next_proprio(actions, proprio).float(), next_proprio.float())

    def motion_target(self, proprio: torch.Tensor, next_proprio: torch.Tensor) -> torch.Tensor:
        """The real chunk's motion in ``proprio_motion``'s units, from normalised proprio before and after."""
        now, after = self.unnormalize_proprio(proprio.float()), self.unnormalize_proprio(next_proprio.float())
        return torch.cat([(after[:, :3] - now[:, :3]) / MOTION_POSITION_M,
                          rotation.relative_rotation(now[:, 3:6], after[:, 3:6]) / MOTION_TURN_RAD,
                          next_proprio[:, 6:].float() - proprio[:, 6:].float()], dim=1)

    def loss(self, target: torch.Tensor, frames: torch.Tensor, actions: torch.Tensor, proprio: torch.Tensor,
             next_proprio: torch.Tensor, proprio_weight: float = 1.0) -> tuple[torch.Tensor, dict]:
        """EDM denoising loss on the next frame + MSE on the next proprio (context frames
        noised first when ``context_noise`` is on)."""
        cfg = self.cfg
        b = target.shape[0]
        target = target.float()
        level = None
        pixel_weight = 1.0
        if cfg.motion_weight > 0:  # before the target becomes a residual or the context is noised
            pixel_weight = 1 + cfg.motion_weight * moving_pixels(target, self.current_frame(frames)).float()
        if cfg.residual:  # the denoiser's data: the change from the (clean) current frame, or its warp
            target = target - self.anchor(frames, actions, proprio)
        if cfg.context_noise > 0:
            level = cfg.context_noise * torch.rand(b, device=target.device)
            frames = frames.float() + level[:, None, None, None, None] * torch.randn(frames.shape, device=frames.device)
        sigma = torch.exp(cfg.p_mean + cfg.p_std * torch.randn(b, device=target.device))
        noisy = target + sigma[:, None, None, None] * torch.randn_like(target)
        drop = torch.rand(b, device=target.device) < cfg.action_dropout if cfg.action_dropout > 0 else None
        denoised = self.denoise(noisy, sigma, frames, actions, proprio, level, no_actions=drop).float()
        weight = (sigma**2 + cfg.sigma_data**2) / (sigma * cfg.sigma_data) ** 2  # unit-variance targets (EDM)
        frame_loss = (weight[:, None, None, None] * pixel_weight * (denoised - target) ** 2).mean()
        proprio_loss = self.proprio_loss(actions, proprio, next_proprio)
        total = frame_loss + proprio_weight * proprio_loss
        return total, {"frame_loss": frame_loss.detach(), "proprio_loss": proprio_loss.detach()}

    def current_frame(self, frames: torch.Tensor) -> torch.Tensor:
        """The view's own latest frame among the conditioning frames (B, 3, H, W): the anchor
        of ``residual`` without ``wrist_warp`` (frames are history oldest first, then the main view
        for the wrist model)."""
        return frames[:, self.cfg.context - 1]

    def sigmas(self, steps: int, device) -> torch.Tensor:
        """Karras schedule sigma_max .. sigma_min, then 0."""
        cfg = self.cfg
        i = torch.arange(steps, device=device, dtype=torch.float32) / max(steps - 1, 1)
        lo, hi = cfg.sigma_min ** (1 / cfg.rho), cfg.sigma_max ** (1 / cfg.rho)
        s = (hi + i * (lo - hi)) ** cfg.rho
        return torch.cat([s, s.new_zeros(1)])

    @torch.no_grad()
    def generate(self, frames: torch.Tensor, actions: torch.Tensor, proprio: torch.Tensor,
                 steps: int | None = None, generator: torch.Generator | None = None,
                 noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Next frame (B, 3, H, W) in [-1, 1] and next proprio (normalised), Euler sampling from
        ``noise`` (B, 3, H, W) standard normal (default: drawn from ``generator``)."""
        b, _, _, h, w = frames.shape
        if noise is None:
            noise = torch.randn((b, 3, h, w), generator=generator, device=generator.device if generator else frames.device)
        x = self.sample(noise, frames, actions, proprio, steps or self.cfg.sample_steps)
        return x.clamp(-1, 1), self.next_proprio(actions, proprio).float()

    def sample(self, noise: torch.Tensor, frames: torch.Tensor, actions: torch.Tensor, proprio: torch.Tensor,
               steps: int) -> torch.Tensor:
        """The Euler sampler itself, ``steps`` network calls from ``noise`` to a frame (not yet
        clamped; each call on twice the batch under action guidance, ``self.guidance`` != 1);
        differentiable, so a few-step student can learn it (``wmrl.worldmodel.distill``)."""
        b = frames.shape[0]
        sig = self.sigmas(steps, frames.device)
        x = noise.to(frames.device) * sig[0]
        # once per frame, not per step: drawn at every step the warp cost 14-24% of the frames/s (H100, 128 px)
        maps = self.sampler_maps(frames, actions, proprio)
        for i in range(steps):
            d = self.guided_denoise(x, sig[i].expand(b), frames, actions, proprio, maps)
            x = d if sig[i + 1] == 0 else x + (x - d) / sig[i] * (sig[i + 1] - sig[i])
        return x + self.anchor(frames, actions, proprio) if self.cfg.residual else x

    def anchor(self, frames: torch.Tensor, actions: torch.Tensor, proprio: torch.Tensor) -> torch.Tensor:
        """What ``residual`` generates the change from (B, 3, H, W), float32: the current frame, or
        with ``wrist_warp`` that frame warped to the chunk's end pose, so the model starts from
        the camera's motion and learns what the table plane misses (objects above it, the fingers).
        The same for guidance's two branches (their outputs must live in one space)."""
        if self.cfg.wrist_warp:
            return self.warped_frame(frames, actions, proprio)
        return self.current_frame(frames).float()
