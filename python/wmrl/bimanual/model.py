"""A causal, block-autoregressive video generator conditioned on actions, domain and caption.

Pixel space at small sizes: each frame is cut into ``patch x patch`` patches, one token
each. A frame's tokens carry a spatial and a temporal position and are modulated (adaLN,
as in DiT) by one conditioning vector per frame::

    c_f = time(t_f) + caption + action_modulation(action_encoder(a_f, mask_f) + domain_embedding(d))

where ``a_f`` is the (normalised, padded) action of the transition that *leads to* frame f
(frame 0 has none). With ``model.action_tokens`` the frame also gets
``action_token(action_encoder(...) + domain_embedding(d))`` as one more token after its
patches, which they attend to (it is dropped from the output); with ``model.action_readout``
a linear map of the action features to pixels is added to the residual anchor.
``action_encoder``, ``domain_embedding``, ``action_modulation`` (and ``action_token``,
``action_readout``) are the action modules that a base checkpoint does not have (Stage 0
starts them fresh); ``action_modulation`` and ``action_readout`` start at zero so a loaded
base model is unchanged at step 0.

Objective: flow matching (rectified flow), ``x_t = (1 - t) x_0 + t eps`` with velocity
``v = eps - x_0``. The network predicts the clean frame ``x_0`` and the loss is taken on the
implied velocity ``(x_t - x_0_hat) / t`` (x-prediction, v-loss). In pixel space with large
patches a token is narrower than its patch (8x8x3 = 192 values): predicting noise or
velocity through that bottleneck leaves noise in every sample, predicting the smooth clean
frame does not. Generation integrates t from 1 to 0 with Euler steps on the implied velocity.
``model.time_shift`` moves the training times and the Euler steps towards t = 1 (SD3, Wan).
With ``model.residual`` the clean-frame prediction is an *anchor*, the last clean frame before
the frame's block (frame 0 in Stage 0's bidirectional mode), plus the network's output: the
output layer starts at zero, so training starts from copying the last frame.

Attention modes (frames grouped into blocks of ``block_frames``; frame 0 is block 0):

- bidirectional (Stage 0): frame 0 clean, frames 1..T noisy, every token sees every token.
- teacher forcing (Stage 1): the sequence is [clean frames 0..T-1 | noisy frames 1..T];
  a clean frame sees clean frames of its own and earlier blocks; a noisy frame sees the
  clean frames of earlier blocks and the noisy frames of its own block (CausVid-style).
- generation: the same causal rule with a KV cache. Clean frames are pushed through once
  and their keys/values kept; each new block is denoised attending to the cache, then
  pushed through clean and appended. ``test_kv_cache_matches_teacher_forcing`` checks that
  the cache reproduces the teacher-forcing outputs exactly.

Few-step sampling (the distilled students of Stages 2 and 3): a *schedule* of noise levels
``[1.0, 0.75, 0.5, 0.25]``; at each level the network predicts the clean block, which is
re-noised with fresh noise to the next level; the last prediction is the block
(``jump_block``). The same function generates Stage 3's self-forcing rollouts, so the student
is trained exactly the way it samples.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from wmrl.bimanual import contract
from wmrl.bimanual.config import NEW_ACTION_MODULES, ModelConfig  # noqa: F401 (NEW_ACTION_MODULES: the modules below)
NUM_DOMAINS = 8  # embedding rows; the bundle's domain IDs must be below this
T_MIN = 0.05  # the implied velocity divides by t; clamp it (x-prediction, as in JiT)


def timestep_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    half = dim // 2
    freqs = torch.exp(-math.log(10_000) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
    args = (t.float() * 1000)[..., None] * freqs
    return torch.cat([torch.cos(args), torch.sin(args)], -1)


def modulate(x, shift, scale):
    return x * (1 + scale) + shift


class Block(nn.Module):
    def __init__(self, width: int, heads: int, mlp_ratio: int):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width, elementwise_affine=False, eps=1e-6)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width, elementwise_affine=False, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(width, mlp_ratio * width), nn.GELU(approximate="tanh"), nn.Linear(mlp_ratio * width, width))
        self.ada = nn.Linear(width, 6 * width)
        nn.init.zeros_(self.ada.weight)
        nn.init.zeros_(self.ada.bias)

    def forward(self, x, c, mask=None, cache: dict | None = None, append: bool = False):
        b, n, w = x.shape
        s1, sc1, g1, s2, sc2, g2 = self.ada(F.silu(c)).chunk(6, -1)
        q, k, v = self.qkv(modulate(self.norm1(x), s1, sc1)).view(b, n, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        if cache is not None and "k" in cache:
            k, v = torch.cat([cache["k"], k], 2), torch.cat([cache["v"], v], 2)
        if cache is not None and append:
            cache["k"], cache["v"] = k, v
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + g1 * self.proj(a.transpose(1, 2).reshape(b, n, w))
        return x + g2 * self.mlp(modulate(self.norm2(x), s2, sc2))


class VideoWorldModel(nn.Module):
    def __init__(self, cfg: ModelConfig, *, image_size: int, vocab_size: int, action_dim: int = contract.PADDED_DIM):
        super().__init__()
        if image_size % cfg.patch:
            raise ValueError(f"image size {image_size} is not divisible by model.patch={cfg.patch}")
        self.cfg, self.image_size = cfg, image_size
        w, p = cfg.width, cfg.patch
        self.grid = image_size // p
        self.patches_per_frame = self.grid**2
        self.tokens_per_frame = self.patches_per_frame + int(cfg.action_tokens)  # the action's token last
        self.patch_embed = nn.Linear(3 * p * p, w)
        self.spatial_pos = nn.Parameter(torch.randn(1, self.patches_per_frame, w) * 0.02)
        self.temporal_pos = nn.Embedding(cfg.max_frames, w)
        nn.init.normal_(self.temporal_pos.weight, std=0.02)
        self.time_embed = nn.Sequential(nn.Linear(w, w), nn.SiLU(), nn.Linear(w, w))
        self.caption_embed = nn.Embedding(vocab_size, cfg.caption_dim)
        self.caption_proj = nn.Linear(cfg.caption_dim, w)
        # the new action modules (absent from a base checkpoint)
        per_frame = 2 * action_dim if cfg.action_step else action_dim  # the command (and its step)
        self.action_encoder = nn.Sequential(nn.Linear(2 * per_frame, w), nn.SiLU(), nn.Linear(w, w))
        self.domain_embedding = nn.Embedding(NUM_DOMAINS, w)
        self.action_modulation = nn.Linear(w, w)
        nn.init.zeros_(self.action_modulation.weight)
        nn.init.zeros_(self.action_modulation.bias)
        self.action_token = nn.Linear(w, w) if cfg.action_tokens else None
        self.action_readout = nn.Linear(2 * per_frame, 3 * image_size**2) if cfg.action_readout else None
        if self.action_readout is not None:
            nn.init.zeros_(self.action_readout.weight)
            nn.init.zeros_(self.action_readout.bias)
        self.blocks = nn.ModuleList(Block(w, cfg.heads, cfg.mlp_ratio) for _ in range(cfg.depth))
        self.final_norm = nn.LayerNorm(w, elementwise_affine=False, eps=1e-6)
        self.final_ada = nn.Linear(w, 2 * w)
        self.out = nn.Linear(w, 3 * p * p)
        for m in (self.final_ada, self.out):
            nn.init.zeros_(m.weight)
            nn.init.zeros_(m.bias)

    # ------------------------------------------------------------------ tokens and blocks
    def patchify(self, frames):  # (B, S, 3, H, W) -> (B, S*N, 3*p*p)
        b, s, c, h, w = frames.shape
        p, g = self.cfg.patch, self.grid
        x = frames.reshape(b, s, c, g, p, g, p).permute(0, 1, 3, 5, 2, 4, 6)
        return x.reshape(b, s * g * g, c * p * p)

    def unpatchify(self, x, s: int):
        b = x.shape[0]
        p, g = self.cfg.patch, self.grid
        x = x.reshape(b, s, g, g, 3, p, p).permute(0, 1, 4, 2, 5, 3, 6)
        return x.reshape(b, s, 3, g * p, g * p)

    def frame_block(self, idx: torch.Tensor) -> torch.Tensor:
        return torch.where(idx == 0, torch.zeros_like(idx), (idx - 1) // self.cfg.block_frames + 1)

    def caption_vector(self, ids, mask):
        e = self.caption_embed(ids) * mask[..., None]
        return self.caption_proj(e.sum(1) / mask.sum(1, keepdim=True).clamp(min=1))

    def _forward(self, frames, frame_idx, t, act, amask, domain, cap_vec, mask=None, cache=None, append=False,
                 anchor=None):
        """frames (B,S,3,H,W), frame_idx (S,), t (B,S), act/amask (B,S,A) -> x0 (B,S,3,H,W);
        ``anchor`` (B,S,3,H,W): with ``model.residual``, each frame's last clean frame before its
        block, to which the network's output is added."""
        b, s = frames.shape[:2]
        n = self.tokens_per_frame
        x = self.patch_embed(self.patchify(frames)).view(b, s, self.patches_per_frame, -1) + self.spatial_pos[:, None]
        feats = torch.cat([act * amask, amask.float()], -1)
        a = self.action_encoder(feats) + self.domain_embedding(domain)[:, None]
        if self.action_token is not None:
            x = torch.cat([x, self.action_token(a)[:, :, None]], 2)
        x = x + self.temporal_pos(frame_idx)[None, :, None]
        c = self.time_embed(timestep_embedding(t, self.cfg.width)) + cap_vec[:, None] + self.action_modulation(a)
        x = x.reshape(b, s * n, -1)
        c = c[:, :, None].expand(b, s, n, c.shape[-1]).reshape(b, s * n, -1)
        caches = cache if cache is not None else [None] * len(self.blocks)
        for blk, kv in zip(self.blocks, caches):
            x = blk(x, c, mask, kv, append)
        sh, sc = self.final_ada(F.silu(c)).chunk(2, -1)
        out = self.out(modulate(self.final_norm(x), sh, sc)).view(b, s, n, -1)[:, :, : self.patches_per_frame]
        out = self.unpatchify(out.reshape(b, s * self.patches_per_frame, -1), s)
        if anchor is None:
            return out
        if self.action_readout is not None:
            anchor = anchor + self.action_readout(feats).view_as(out)
        return anchor + out

    def block_anchor(self, last: torch.Tensor, s: int) -> torch.Tensor | None:
        """The anchor of a block of ``s`` frames generated after the clean frame ``last``
        (B,3,H,W), or None without ``model.residual``."""
        if not self.cfg.residual:
            return None
        if last is None:
            raise ValueError("model.residual: generating a block needs the last clean frame before it, its anchor (last=)")
        return last[:, None].expand(-1, s, *last.shape[1:])

    def frame_actions(self, actions, action_mask):
        """Per-frame conditioning: frame f gets transition f-1's action; frame 0 none. With
        ``model.action_step`` also that action minus transition f-2's (where both exist)."""
        z = torch.zeros_like(actions[:, :1])
        act, am = torch.cat([z, actions], 1), torch.cat([z.bool(), action_mask], 1)
        if not self.cfg.action_step:
            return act, am
        both = am & torch.cat([z.bool(), am[:, :-1]], 1)
        step = (act - torch.cat([z, act[:, :-1]], 1)) * both
        return torch.cat([act, step], -1), torch.cat([am, both], -1)

    def _token_mask(self, allowed: torch.Tensor, key_valid: torch.Tensor | None = None) -> torch.Tensor:
        """Frame-level (Sq, Sk) bool -> token-level (1 or B, 1, Sq*N, Sk*N) attention mask."""
        n = self.tokens_per_frame
        m = allowed.repeat_interleave(n, 0).repeat_interleave(n, 1)[None, None]
        if key_valid is not None:  # (B, Sk): padded frames are never attended to ...
            m = m & key_valid.repeat_interleave(n, 1)[:, None, None, :]
            if allowed.shape[0] == allowed.shape[1]:  # ... except by themselves (no empty rows)
                own = torch.eye(allowed.shape[0], dtype=torch.bool, device=allowed.device)
                m = m | own.repeat_interleave(n, 0).repeat_interleave(n, 1)[None, None]
        return m

    # ----------------------------------------------------------------------- training modes
    def forward_bidirectional(self, noisy, t, batch):
        """Stage 0: frame 0 clean (t=0), frames 1..T noisy; full attention."""
        f = noisy.shape[1]
        act, am = self.frame_actions(batch["actions"], batch["action_mask"])
        idx = torch.arange(f, device=noisy.device)
        mask = self._token_mask(torch.ones(f, f, dtype=torch.bool, device=noisy.device), batch["frame_mask"])
        cap = self.caption_vector(batch["caption_ids"], batch["caption_mask"])
        anchor = noisy[:, :1].expand_as(noisy) if self.cfg.residual else None  # frame 0 is the clean one
        return self._forward(noisy, idx, t, act, am, batch["domain_id"], cap, mask, anchor=anchor)

    def teacher_forcing_mask(self, f: int, device) -> torch.Tensor:
        """Frame-level mask for [clean 0..f-2 | noisy 1..f-1] (see the module doc)."""
        clean = self.frame_block(torch.arange(f - 1, device=device))
        noisy = self.frame_block(torch.arange(1, f, device=device))
        cc = clean[:, None] >= clean[None, :]
        nc = noisy[:, None] > clean[None, :]
        nn_ = noisy[:, None] == noisy[None, :]
        top = torch.cat([cc, torch.zeros(f - 1, f - 1, dtype=torch.bool, device=device)], 1)
        return torch.cat([top, torch.cat([nc, nn_], 1)], 0)

    def forward_teacher_forcing(self, clean, noisy, t, batch):
        """Stage 1: predict clean frames 1..T from noisy ones, given clean frames 0..T-1."""
        f = clean.shape[1]
        dev = clean.device
        act, am = self.frame_actions(batch["actions"], batch["action_mask"])
        idx = torch.cat([torch.arange(f - 1, device=dev), torch.arange(1, f, device=dev)])
        fm = batch["frame_mask"]
        key_valid = torch.cat([fm[:, : f - 1], fm[:, 1:]], 1)
        mask = self._token_mask(self.teacher_forcing_mask(f, dev), key_valid)
        frames = torch.cat([clean[:, : f - 1], noisy[:, 1:]], 1)
        tt = torch.cat([torch.zeros_like(t[:, : f - 1]), t[:, 1:]], 1)
        cap = self.caption_vector(batch["caption_ids"], batch["caption_mask"])
        anchor = None
        if self.cfg.residual:  # noisy frame j's block starts after clean frame ((j - 1) // k) * k
            k = self.cfg.block_frames
            last = (torch.arange(1, f, device=dev) - 1) // k * k
            anchor = torch.cat([clean[:, : f - 1], clean[:, last]], 1)  # the clean half's outputs are unused
        v = self._forward(frames, idx, tt, torch.cat([act[:, : f - 1], act[:, 1:]], 1),
                          torch.cat([am[:, : f - 1], am[:, 1:]], 1), batch["domain_id"], cap, mask, anchor=anchor)
        return v[:, f - 1 :]  # predictions for frames 1..T

    # ------------------------------------------------------------------ generation (cache)
    def new_cache(self) -> list[dict]:
        return [{} for _ in self.blocks]

    def push_clean(self, cache, frames, frame_idx, act, am, domain, cap_vec):
        """Append clean frames of one block (or the context) to the KV cache."""
        s = frames.shape[1]
        t = torch.zeros(frames.shape[0], s, device=frames.device)
        blocks = self.frame_block(frame_idx)
        mask = None
        if s > 1:  # several blocks at once (the context): causal among them
            cached = cache[0]["k"].shape[2] // self.tokens_per_frame if "k" in cache[0] else 0
            allowed = blocks[:, None] >= blocks[None, :]
            allowed = torch.cat([torch.ones(s, cached, dtype=torch.bool, device=frames.device), allowed], 1)
            mask = self._token_mask(allowed)
        self._forward(frames, frame_idx, t, act, am, domain, cap_vec, mask, cache, append=True)

    @torch.no_grad()
    def denoise_block(self, cache, frame_idx, act, am, domain, cap_vec, steps: int, generator=None, last=None):
        """Generate the frames of one block from noise, attending to the cache (``last``: the
        clean frame before the block, the anchor of ``model.residual``)."""
        b, s = act.shape[0], len(frame_idx)
        anchor = self.block_anchor(last, s)
        x = torch.randn(b, s, 3, self.image_size, self.image_size, device=act.device, generator=generator)
        ts = shift_t(torch.linspace(1.0, 0.0, steps + 1, device=act.device), self.cfg.time_shift)
        for i in range(steps):
            x0 = self._forward(x, frame_idx, ts[i].expand(b, s), act, am, domain, cap_vec, None, cache, append=False,
                               anchor=anchor)
            v = (x - x0) / ts[i].clamp(min=T_MIN)
            x = x + (ts[i + 1] - ts[i]) * v  # the last step lands on x0
        return x.clamp(-1, 1)

    def jump_block(self, cache, frame_idx, act, am, domain, cap_vec, schedule, generator=None, grad_level: int | None = None,
                   last=None):
        """Few-step generation of one block along ``schedule`` (see the module doc); ``last`` as
        in ``denoise_block``.

        ``grad_level``: stop at that level and return its prediction with gradients, unclamped
        (Stage 3 trains a random exit level per rollout, as self-forcing does); the levels before
        it run without gradients. Without it: every level, no gradients, clamped to [-1, 1]."""
        b, s = act.shape[0], len(frame_idx)
        shape = (b, s, 3, self.image_size, self.image_size)
        anchor = self.block_anchor(last, s)
        x = torch.randn(shape, device=act.device, generator=generator)
        end = len(schedule) - 1 if grad_level is None else grad_level
        for i in range(end + 1):
            t = torch.full((b, s), float(schedule[i]), device=act.device)
            with torch.set_grad_enabled(grad_level is not None and i == grad_level and torch.is_grad_enabled()):
                x0 = self._forward(x, frame_idx, t, act, am, domain, cap_vec, None, cache, append=False, anchor=anchor)
            if i < end:
                nxt = float(schedule[i + 1])
                x = (1 - nxt) * x0.detach() + nxt * torch.randn(shape, device=act.device, generator=generator)
        return x0 if grad_level is not None else x0.clamp(-1, 1)

    @torch.no_grad()
    def rollout(self, batch, *, context_frames: int = 1, teacher_forced: bool = True, steps: int | None = None, generator=None,
                schedule=None):
        """Generate frames ``context_frames..T`` block by block with the KV cache.

        ``teacher_forced``: after each block, the *real* frames are appended to the cache
        (next-chunk prediction from true history); otherwise the generated ones
        (autoregressive rollout). ``schedule``: few-step sampling along these noise levels
        (a distilled student) instead of ``steps`` Euler steps. Returns (B, T+1, 3, H, W) with
        the context copied."""
        video = batch["video"]
        f, dev = video.shape[1], video.device
        steps = steps or self.cfg.denoise_steps
        act, am = self.frame_actions(batch["actions"], batch["action_mask"])
        cap = self.caption_vector(batch["caption_ids"], batch["caption_mask"])
        dom = batch["domain_id"]
        cache = self.new_cache()
        ctx = torch.arange(context_frames, device=dev)
        self.push_clean(cache, video[:, :context_frames], ctx, act[:, ctx], am[:, ctx], dom, cap)
        out = [video[:, :context_frames]]
        blocks = self.frame_block(torch.arange(f, device=dev))
        b = int(blocks[context_frames - 1]) + 1 if context_frames < f else None
        last = video[:, context_frames - 1]  # the clean frame before the next block (model.residual's anchor)
        while b is not None and b <= int(blocks[-1]):
            idx = torch.nonzero(blocks == b).flatten()
            idx = idx[idx >= context_frames]
            if schedule is not None:
                gen = self.jump_block(cache, idx, act[:, idx], am[:, idx], dom, cap, schedule, generator, last=last)
            else:
                gen = self.denoise_block(cache, idx, act[:, idx], am[:, idx], dom, cap, steps, generator, last=last)
            out.append(gen)
            clean = video[:, idx] if teacher_forced else gen
            self.push_clean(cache, clean, idx, act[:, idx], am[:, idx], dom, cap)
            last = clean[:, -1]
            b += 1
        return torch.cat(out, 1)


def shift_t(t, shift: float):
    """Move noise levels (a tensor or a float) towards 1 (``model.time_shift``); 0 and 1 stay."""
    return t if shift == 1 else shift * t / (1 + (shift - 1) * t)


def sample_t(shape, generator=None, device=None, shift: float = 1.0) -> torch.Tensor:
    """Logit-normal times (SD3): more weight on the middle of the path, then shifted."""
    return shift_t(torch.sigmoid(torch.randn(shape, generator=generator, device=device)), shift)


def flow_loss(model: VideoWorldModel, batch, mode: str, generator=None) -> tuple[torch.Tensor, dict]:
    """Flow-matching loss of one packed batch in the stage's attention mode."""
    x0 = batch["video"]
    b, f = x0.shape[:2]
    dev = x0.device
    eps = torch.randn(x0.shape, generator=generator, device=dev)
    if mode == "bidirectional":  # one time per sample for all target frames; frame 0 clean
        t = sample_t((b, 1), generator, dev, model.cfg.time_shift).expand(b, f).clone()
        t[:, 0] = 0
    elif mode == "teacher_forcing":  # independent time per block
        blocks = model.frame_block(torch.arange(f, device=dev))
        tb = sample_t((b, int(blocks.max()) + 1), generator, dev, model.cfg.time_shift)
        t = tb[:, blocks]
        t[:, 0] = 0
    else:
        raise ValueError(f"mode {mode!r} is not a Stage 0/1 mode")
    tt = t[:, :, None, None, None]
    xt = (1 - tt) * x0 + tt * eps
    target = eps - x0
    if mode == "bidirectional":
        x0_hat = model.forward_bidirectional(xt, t, batch)[:, 1:]
    else:
        x0_hat = model.forward_teacher_forcing(x0, xt, t, batch)
    v = (xt[:, 1:] - x0_hat) / tt[:, 1:].clamp(min=T_MIN)
    w = batch["frame_mask"][:, 1:].float()
    per_frame = ((v - target[:, 1:]) ** 2).mean((2, 3, 4))
    loss = (per_frame * w).sum() / w.sum().clamp(min=1)
    return loss, {"loss": float(loss.detach())}


def psnr(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-frame PSNR in dB of images in [-1, 1] (peak 1 on the [0, 1] scale)."""
    mse = (((a - b) / 2) ** 2).flatten(2).mean(-1)
    return 10 * torch.log10(1.0 / mse.clamp(min=1e-10))
