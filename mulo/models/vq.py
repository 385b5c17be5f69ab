"""Token-level interface to a VQ image tokenizer (a ``diffusers.VQModel``).

One tokenizer serves every resolution of a family: a 64 px image becomes a 16x16 grid at 4x
downsampling and a 32 px image an 8x8 grid, which is what makes token up/down-sampling and
codebook-neighbour pooling meaningful between drafter and target.
"""

from __future__ import annotations

import torch
from diffusers import VQModel


class VQTokenizer:
    """Images in [0, 1] ``[B, 3, h, w]`` <-> token grids ``[B, H, W]`` (int64)."""

    def __init__(self, model: VQModel):
        self.model = model.eval()
        self.downsample = 2 ** (len(model.config.block_out_channels) - 1)

    @property
    def codebook(self) -> torch.Tensor:
        return self.model.quantize.embedding.weight

    @property
    def vocab_size(self) -> int:
        return self.codebook.shape[0]

    @property
    def device(self) -> torch.device:
        return self.codebook.device

    @torch.no_grad()
    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        b, h, w = tokens.shape
        dim = self.codebook.shape[1]
        tokens = tokens.to(self.codebook.device)
        latents = self.model.quantize.get_codebook_entry(tokens.reshape(-1), (b, h, w, dim))
        pixels = self.model.decode(latents.to(self.codebook.dtype), force_not_quantize=True).sample
        return (pixels.float() * 0.5 + 0.5).clamp(0, 1)

    @torch.no_grad()
    def encode(self, images: torch.Tensor) -> torch.Tensor:
        b, _, h, w = images.shape
        if h % self.downsample or w % self.downsample:
            raise ValueError(f"image size {h}x{w} is not a multiple of the VQ downsampling {self.downsample}")
        latents = self.model.encode((images * 2 - 1).to(self.codebook.device, self.codebook.dtype)).latents
        _, _, (_, _, indices) = self.model.quantize(latents)
        return indices.reshape(b, h // self.downsample, w // self.downsample)


def to_uint8(images: torch.Tensor) -> torch.Tensor:
    """``[B, 3, h, w]`` floats in [0, 1] -> ``[B, h, w, 3]`` uint8 (rounded)."""
    return (images.clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu()
