"""The acceptance ceiling of an up-sampler: how many of the target's codes a *perfect* drafter
would hand it.

A perfect drafter at ratio r produces exactly the low-res tokens of the real image (its r-times
smaller version, VQ-encoded). Up-sampling them and comparing with the real image's own high-res
codes bounds what verification can accept for that image, whatever the drafter's quality. The
same comparison without the low-res tokenizer (the small image itself, resized back up) splits
the loss between the low-res token grid and the resize.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mulo.models.vq import VQTokenizer


@torch.no_grad()
def upsampling_agreement(vq: VQTokenizer, upsampler, images: torch.Tensor, r: int) -> dict:
    """``images [B, 3, h, w]`` in [0, 1] at the target's pixel size -> shares of high-res codes
    reproduced: ``from_tokens`` (the perfect drafter's tokens through ``upsampler``, the whole
    image as one block: what MuLo-SD can reach) and ``from_pixels`` (the un-tokenised small
    image, bicubic resize, no low-res VQ)."""
    images = images.to(vq.device)
    codes = vq.encode(images)
    small = F.interpolate(images, scale_factor=1 / r, mode="area")
    low = vq.encode(small)
    nothing_committed = torch.full_like(codes[0], -1)
    drafted = torch.stack([upsampler.upsample(grid, nothing_committed, (0, grid.shape[0])) for grid in low])
    resized = F.interpolate(small, scale_factor=r, mode="bicubic", align_corners=False).clamp(0, 1)
    return {
        "from_tokens": float((drafted.to(codes.device) == codes).float().mean()),
        "from_pixels": float((vq.encode(resized) == codes).float().mean()),
    }
