"""Image augmentation shared by the policy's SFT and the reward model."""

from __future__ import annotations


def random_shift(images, pad: int, generator=None):
    """DrQ-style augmentation: replicate-pad by ``pad`` pixels, crop back at a random offset
    per sample. float (B, C, H, W) -> same shape; offsets from ``generator`` when given."""
    import torch
    import torch.nn.functional as F

    if pad <= 0:
        return images
    b, c, h, w = images.shape
    x = F.pad(images, (pad, pad, pad, pad), mode="replicate")
    device = images.device if generator is None else generator.device
    ox = torch.randint(0, 2 * pad + 1, (b,), generator=generator, device=device).to(images.device)
    oy = torch.randint(0, 2 * pad + 1, (b,), generator=generator, device=device).to(images.device)
    rows = (oy[:, None] + torch.arange(h, device=images.device))[:, None, :, None]
    cols = (ox[:, None] + torch.arange(w, device=images.device))[:, None, None, :]
    bi = torch.arange(b, device=images.device)[:, None, None, None]
    ci = torch.arange(c, device=images.device)[None, :, None, None]
    return x[bi, ci, rows, cols]
