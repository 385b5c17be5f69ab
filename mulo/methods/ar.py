"""Plain autoregressive decoding: one target forward pass per token, raster order, KV cache.

The baseline every speed-up is measured against. One round per image row, so a UI can show
the canvas filling up.
"""

from __future__ import annotations

import torch

from mulo.methods.common import DecodeContext


def generate(ctx: DecodeContext):
    height, width = ctx.grid
    n = height * width
    target = ctx.runner(ctx.family.target, "target")
    x = torch.full((n,), -1, dtype=torch.long)
    for row in range(height):
        rnd = ctx.new_round(f"row {row}", x)
        with ctx.phase("target"):
            if row == 0:
                target.prefill()
            for u in range(row * width, (row + 1) * width):
                x[u] = ctx.sample_next(target, x, u)
        yield ctx.close(rnd, x)
    return x.reshape(height, width)
