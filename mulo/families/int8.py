"""Weights stored as int8 with one scale per output row: how ``emoji-16``'s AR models fit beside
``twemoji`` in the 60 MB that a Space's ``assets/`` may hold (issue 46).

A matrix ``W [out, in]`` is stored as ``round(W / s)`` in int8 with ``s = max|W[row]| / 127`` per row
(symmetric, no zero point), under its own key; a convolution's ``[out, in, kh, kw]`` the same with a
row per output channel, and ``s`` (float16) under ``KEY.int8_scale``. Loading
multiplies back in float32: the models then run exactly as float ones, only their weights differ
from the float16 export by at most half a step of their row. Small tensors (norms, biases, any
matrix under ``MIN_NUMEL``, a 3-D position table) stay as they were: they weigh little and carry the scales' own range.
The measured effect on ``emoji-16``: benchmarks/int8-emoji-16.json (docs/notebook/emoji-family.md, session 4).
"""

from __future__ import annotations

import torch

SCALE_SUFFIX = ".int8_scale"
MIN_NUMEL = 4096  # smaller matrices (the up-samplers' code embeddings) are left in float16


def quantize(state: dict[str, torch.Tensor], min_numel: int = MIN_NUMEL) -> dict[str, torch.Tensor]:
    """The state dict with every float matrix (or convolution kernel) of at least ``min_numel``
    entries as int8 + one scale per output row."""
    out = {}
    for key, value in state.items():
        if not (value.is_floating_point() and value.dim() in (2, 4) and value.numel() >= min_numel):
            out[key] = value
            continue
        weight = value.float().flatten(1)
        scale = (weight.abs().amax(dim=1) / 127).half().float()  # as stored: rounding uses what loading will
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero row: any scale, not 0/0
        out[key] = (weight / scale[:, None]).round().clamp(-127, 127).to(torch.int8).reshape(value.shape)
        out[key + SCALE_SUFFIX] = scale.half()
    return out


def dequantize(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Float32 weights from a state dict that ``quantize`` may have written (others pass through)."""
    out = {}
    for key, value in state.items():
        if key.endswith(SCALE_SUFFIX):
            continue
        scale = state.get(key + SCALE_SUFFIX)
        if scale is not None:
            out[key] = value.float() * scale.float().reshape(-1, *[1] * (value.dim() - 1))
        else:
            out[key] = value.float() if value.is_floating_point() else value
    return out
