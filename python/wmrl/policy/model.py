"""``FlowPolicy``: a small pi0-style flow-matching vision-language-action policy.

    main image  --ConvEncoder--> grid x grid tokens --+
    wrist image --ConvEncoder--> grid x grid tokens --+--> prefix transformer --> prefix tokens
    instruction embedding (384) --Linear--> 1 token --+        (once per observation)
    normalised proprio (8)      --Linear--> 1 token --+

    noisy chunk x_t (chunk x 7) --Linear--> chunk tokens --> action expert (self-attention over
    the chunk, cross-attention to the prefix, adaLN-Zero conditioned on the flow time t)
    --> velocity v (chunk x 7)

Conventions (openpi): ``x_t = t * noise + (1 - t) * action``, t = 1 is pure noise; the target
velocity is ``u = noise - action``; training draws ``t ~ Beta(1.5, 1)`` (more weight on noisy
times, pi0) scaled into [0.001, 1]. Everything here works on normalised actions/proprio (see
``normalize``); images enter as uint8 and are mapped to [-1, 1].
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from wmrl.config import PolicyConfig
from wmrl.pretrained import Pretrained


def _groups(c: int) -> int:
    return min(8, c)


class ResBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.n1 = nn.GroupNorm(_groups(cout), cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.n2 = nn.GroupNorm(_groups(cout), cout)
        self.skip = None
        if stride != 1 or cin != cout:
            self.skip = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.GroupNorm(_groups(cout), cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.silu(self.n1(self.conv1(x)))
        h = self.n2(self.conv2(h))
        return F.silu(h + (x if self.skip is None else self.skip(x)))


class ConvEncoder(nn.Module):
    """ResNet-ish (GroupNorm) image encoder -> grid x grid tokens of ``width``."""

    def __init__(self, channels: tuple[int, ...], width: int, grid: int):
        super().__init__()
        c0 = channels[0]
        self.stem = nn.Sequential(nn.Conv2d(3, c0, 5, 2, 2, bias=False), nn.GroupNorm(_groups(c0), c0), nn.SiLU())
        blocks, cin = [], c0
        for i, c in enumerate(channels):
            blocks.append(ResBlock(cin, c, 1 if i == 0 else 2))
            cin = c
        self.blocks = nn.Sequential(*blocks)
        self.proj = nn.Conv2d(cin, width, 1)
        self.grid = grid
        self.pos = nn.Parameter(torch.randn(1, grid * grid, width) * 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(self.blocks(self.stem(x)))
        h = F.adaptive_avg_pool2d(h, self.grid)
        return h.flatten(2).transpose(1, 2) + self.pos


class Attention(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(width, width)
        self.kv = nn.Linear(width, 2 * width)
        self.out = nn.Linear(width, width)

    def forward(self, x: torch.Tensor, ctx: torch.Tensor | None = None) -> torch.Tensor:
        ctx = x if ctx is None else ctx
        b, n, w = x.shape
        h = self.heads
        q = self.q(x).view(b, n, h, w // h).transpose(1, 2)
        k, v = self.kv(ctx).view(b, ctx.shape[1], 2, h, w // h).permute(2, 0, 3, 1, 4)
        o = F.scaled_dot_product_attention(q, k, v)
        return self.out(o.transpose(1, 2).reshape(b, n, w))


def _mlp(width: int, ratio: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(width, width * ratio), nn.GELU(), nn.Linear(width * ratio, width))


class EncoderBlock(nn.Module):
    """Pre-LN transformer block over the prefix tokens."""

    def __init__(self, width: int, heads: int, ratio: int):
        super().__init__()
        self.n1, self.attn = nn.LayerNorm(width), Attention(width, heads)
        self.n2, self.mlp = nn.LayerNorm(width), _mlp(width, ratio)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.n1(x))
        return x + self.mlp(self.n2(x))


class ExpertBlock(nn.Module):
    """Self-attention over the action chunk, cross-attention to the prefix, MLP; each
    modulated by the flow time (adaLN-Zero: shift, scale, gate; gates start at zero)."""

    def __init__(self, width: int, heads: int, ratio: int):
        super().__init__()
        self.n1, self.self_attn = nn.LayerNorm(width, elementwise_affine=False), Attention(width, heads)
        self.n2, self.cross_attn = nn.LayerNorm(width, elementwise_affine=False), Attention(width, heads)
        self.n3, self.mlp = nn.LayerNorm(width, elementwise_affine=False), _mlp(width, ratio)
        self.mod = nn.Linear(width, 9 * width)
        nn.init.zeros_(self.mod.weight)
        nn.init.zeros_(self.mod.bias)

    def forward(self, x: torch.Tensor, ctx: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        s1, b1, g1, s2, b2, g2, s3, b3, g3 = self.mod(F.silu(cond)).unsqueeze(1).chunk(9, dim=-1)
        x = x + g1 * self.self_attn(self.n1(x) * (1 + s1) + b1)
        x = x + g2 * self.cross_attn(self.n2(x) * (1 + s2) + b2, ctx)
        return x + g3 * self.mlp(self.n3(x) * (1 + s3) + b3)


def time_embedding(t: torch.Tensor, dim: int, max_period: float = 10_000.0) -> torch.Tensor:
    """Sinusoidal embedding of t in [0, 1] (scaled by 1000, as diffusion timesteps)."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
    args = (t.float() * 1000.0)[:, None] * freqs[None]
    emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    return F.pad(emb, (0, dim % 2))


def images_to_input(images: torch.Tensor) -> torch.Tensor:
    """uint8 (B, H, W, 3) -> float (B, 3, H, W) in [-1, 1]."""
    return images.permute(0, 3, 1, 2).float().div(127.5).sub(1.0)


class FlowPolicy(Pretrained, nn.Module):
    """``save_pretrained`` / ``from_pretrained`` come from ``wmrl.pretrained``; a policy
    checkpoint (``wmrl.policy.checkpoint``) adds its statistics and language cache."""

    FORMAT = "wmrl-policy-checkpoint/1"
    CONFIG_CLASS = PolicyConfig
    CONFIG_KEY = "policy"

    def __init__(self, cfg: PolicyConfig):
        super().__init__()
        self.cfg = cfg
        w = cfg.width
        self.main_enc = ConvEncoder(cfg.channels, w, cfg.grid)
        self.wrist_enc = ConvEncoder(cfg.channels, w, cfg.grid)
        self.lang_proj = nn.Sequential(nn.Linear(cfg.lang_dim, w), nn.SiLU(), nn.Linear(w, w))
        self.proprio_proj = nn.Sequential(nn.Linear(cfg.proprio_dim, w), nn.SiLU(), nn.Linear(w, w))
        self.type_emb = nn.Parameter(torch.randn(1, 4, w) * 0.02)  # main, wrist, language, proprio
        self.encoder = nn.ModuleList(EncoderBlock(w, cfg.heads, cfg.mlp_ratio) for _ in range(cfg.encoder_layers))
        self.prefix_norm = nn.LayerNorm(w)
        self.action_in = nn.Linear(cfg.action_dim, w)
        self.action_pos = nn.Parameter(torch.randn(1, cfg.chunk_size, w) * 0.02)
        self.time_mlp = nn.Sequential(nn.Linear(w, w), nn.SiLU(), nn.Linear(w, w))
        self.expert = nn.ModuleList(ExpertBlock(w, cfg.heads, cfg.mlp_ratio) for _ in range(cfg.expert_layers))
        self.out_norm = nn.LayerNorm(w, elementwise_affine=False)
        self.out_mod = nn.Linear(w, 2 * w)
        nn.init.zeros_(self.out_mod.weight)
        nn.init.zeros_(self.out_mod.bias)
        self.action_out = nn.Linear(w, cfg.action_dim)

    # The modules that make the prefix tokens (run once per observation); the rest is the action expert.
    ENCODER_PARTS = ("main_enc", "wrist_enc", "lang_proj", "proprio_proj", "type_emb", "encoder", "prefix_norm")

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def expert_parameters(self) -> list[nn.Parameter]:
        """The action expert's parameters: everything outside ``ENCODER_PARTS``."""
        return [p for n, p in self.named_parameters() if n.split(".")[0] not in self.ENCODER_PARTS]

    def encode(self, main: torch.Tensor, wrist: torch.Tensor, lang: torch.Tensor, proprio: torch.Tensor) -> torch.Tensor:
        """Prefix tokens (B, 2 grid^2 + 2, width). Images float (B, 3, H, W) in [-1, 1];
        ``lang`` (B, 384); ``proprio`` normalised (B, 8)."""
        te = self.type_emb
        tokens = torch.cat([
            self.main_enc(main) + te[:, 0:1],
            self.wrist_enc(wrist) + te[:, 1:2],
            self.lang_proj(lang).unsqueeze(1) + te[:, 2:3],
            self.proprio_proj(proprio).unsqueeze(1) + te[:, 3:4],
        ], dim=1)
        for blk in self.encoder:
            tokens = blk(tokens)
        return self.prefix_norm(tokens)

    def velocity(self, prefix: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """v(x_t, t | prefix): (B, chunk, action_dim). ``t`` is (B,) or a scalar."""
        if t.dim() == 0:
            t = t.expand(x_t.shape[0])
        cond = self.time_mlp(time_embedding(t, self.cfg.width).to(x_t.dtype))
        h = self.action_in(x_t) + self.action_pos
        for blk in self.expert:
            h = blk(h, prefix, cond)
        shift, scale = self.out_mod(F.silu(cond)).unsqueeze(1).chunk(2, dim=-1)
        return self.action_out(self.out_norm(h) * (1 + scale) + shift)


def sample_time(batch: int, cfg: PolicyConfig, device=None) -> torch.Tensor:
    """pi0's flow time: Beta(a, b) (1.5, 1 by default) scaled into [0.001, 1]."""
    a, b = cfg.time_beta
    if b == 1.0:  # inverse CDF of Beta(a, 1): u^(1/a)
        t = torch.rand(batch, device=device).pow(1.0 / a)
    else:
        t = torch.distributions.Beta(torch.tensor(float(a)), torch.tensor(float(b))).sample((batch,)).to(device)
    return t * 0.999 + 0.001


def flow_matching_loss(model: FlowPolicy, prefix: torch.Tensor, actions: torch.Tensor,
                       mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean squared error between predicted and target velocity; ``actions`` normalised
    (B, chunk, A); ``mask`` (B, chunk) is 0 where the chunk was padded past the episode end."""
    b = actions.shape[0]
    t = sample_time(b, model.cfg, actions.device)
    noise = torch.randn_like(actions)
    tt = t[:, None, None]
    x_t = tt * noise + (1 - tt) * actions
    v = model.velocity(prefix, x_t, t)
    err = (v.float() - (noise - actions).float()).pow(2).mean(-1)
    if mask is None:
        return err.mean()
    return (err * mask).sum() / mask.sum().clamp_min(1.0)
