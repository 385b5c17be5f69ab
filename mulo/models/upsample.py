"""Up-samplers U_r (low-res draft tokens -> high-res draft tokens) and the down-sampler D_r.

Both up-samplers share one call: ``upsample(low, high, rows)`` returns the high-res tokens of
the low-res rows ``rows = (a, b)`` (i.e. high-res rows ``r*a .. r*b``), given the low-res grid
``low [Hq, Wq]`` (drafted and committed rows filled) and the committed high-res grid
``high [H, W]`` (-1 where nothing is committed yet). Rows below ``b`` are never read, so
drafting a block never needs future rows and never changes committed ones. Inside the block a
learned up-sampler reads the rows at or above each row (``context="rows"``, the paper's
row-causal design) or every row of the block (``context="block"``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mulo.models.vq import VQTokenizer


class PixelUpsampler:
    """Training-free pixel path: VQ-decode -> resize x r -> VQ-encode (MuLo-SD v2's default).

    The committed high-res rows just above the block are decoded onto the top of the canvas, so
    the VQ encoder sees the real image around the seam; ``context_rows`` low-res rows of context
    are used on both sides of that seam. ``downsample`` is D_r: decode -> area resize / r ->
    encode, used to turn committed high-res rows into the drafter's low-res prefix.
    """

    def __init__(self, vq: VQTokenizer, r: int, context_rows: int = 1, mode: str = "bicubic"):
        self.vq, self.r, self.context_rows, self.mode = vq, r, context_rows, mode

    def upsample(self, low: torch.Tensor, high: torch.Tensor, rows: tuple[int, int]) -> torch.Tensor:
        a, b = rows
        r = self.r
        top = max(0, a - self.context_rows)
        low_pixels = self.vq.decode(low[None, top:b])
        canvas = F.interpolate(low_pixels, scale_factor=r, mode=self.mode, align_corners=False).clamp(0, 1)
        if a > top:  # keep the committed high-res rows on the canvas
            committed = self.vq.decode(high[None, top * r : a * r])
            canvas[:, :, : committed.shape[2]] = committed
        tokens = self.vq.encode(canvas)[0]
        return tokens[(a - top) * r :]

    def downsample(self, high: torch.Tensor, rows: tuple[int, int]) -> torch.Tensor:
        a, b = rows
        r = self.r
        top = max(0, a - self.context_rows)
        pixels = self.vq.decode(high[None, top * r : b * r])
        small = F.interpolate(pixels, scale_factor=1 / r, mode="area")
        return self.vq.encode(small)[0][a - top :]


class RowCausalConv(nn.Conv2d):
    """A 2-D convolution whose output row i only sees input rows <= i (padding above only)."""

    def __init__(self, channels_in: int, channels_out: int, kernel: int = 3):
        super().__init__(channels_in, channels_out, kernel, padding=0)
        self.kernel = kernel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        half = self.kernel // 2
        return super().forward(F.pad(x, (half, half, self.kernel - 1, 0)))


class CentredConv(nn.Conv2d):
    """A 2-D convolution padded on every side: output row i sees input rows i - k//2 .. i + k//2."""

    def __init__(self, channels_in: int, channels_out: int, kernel: int = 3):
        super().__init__(channels_in, channels_out, kernel, padding=kernel // 2)


class TokenUpsampler(nn.Module):
    """Learned latent up-sampler (MuLo-SD v1): row-causal convolutions + pixel shuffle.

    Maps low-res tokens ``[B, Hq, Wq]`` to high-res token logits ``[B, V, r*Hq, r*Wq]``; with
    ``context="rows"`` the r x r children of a low-res token depend on it and on the low-res rows
    at or above it only. With ``context="block"`` the convolutions are centred: a child also reads
    the rows below its parent, as far as the block given goes (zero beyond it). A sprite's top
    rows are then drawn knowing the whole sprite: on the scenes family, where the default drafts
    the whole low-res image in one block, that is what renders a drafted object right
    (docs/notebook/session-2026-11-30-upsampler.md).
    """

    def __init__(
        self, vocab_size: int, r: int, width: int = 64, depth: int = 2, kernel: int = 3, context: str = "rows"
    ):
        super().__init__()
        if context not in ("rows", "block"):
            raise ValueError(f"context must be 'rows' or 'block' (got {context!r})")
        self.r = r
        self.config = dict(vocab_size=vocab_size, r=r, width=width, depth=depth, kernel=kernel, context=context)
        self.embed = nn.Embedding(vocab_size, width)
        conv = RowCausalConv if context == "rows" else CentredConv
        self.blocks = nn.ModuleList(conv(width, width, kernel) for _ in range(depth))
        self.expand = nn.Conv2d(width, width * r * r, 1)
        self.head = nn.Conv2d(width, vocab_size, 1)

    def features(self, low: torch.Tensor) -> torch.Tensor:
        """The head's input ``[B, width, r*Hq, r*Wq]``."""
        h = self.embed(low).permute(0, 3, 1, 2)
        for block in self.blocks:
            h = h + F.gelu(block(h))
        return F.gelu(F.pixel_shuffle(self.expand(h), self.r))

    def forward(self, low: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(low))

    def head_rows(self, features: torch.Tensor) -> torch.Tensor:
        """The head (a 1x1 convolution) on some positions' features ``[N, width]``: logits ``[N, V]``."""
        return F.linear(features, self.head.weight.flatten(1), self.head.bias)

    @torch.no_grad()
    def upsample(self, low: torch.Tensor, high: torch.Tensor, rows: tuple[int, int]) -> torch.Tensor:
        a, b = rows
        low = low.to(self.embed.weight.device)
        logits = self(low[None, :b].clamp_min(0))[0]  # rows >= b are not even given
        return logits.argmax(0)[a * self.r :]
