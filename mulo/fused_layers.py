"""A wide pass's layers in bfloat16 with their dense parts compiled: the CPU's third speed-up.

Why: on a CPU with bf16 matrix units a wide pass's products run ~4x faster in bf16 (``mulo.wide``),
but under ``torch.autocast`` the rest of a layer does not: the norms, SiLU, the gate's product, the
residual adds and autocast's casts are memory-bound elementwise loops, as slow in bf16 as in
float32, and at a verification's shape they become the largest share of a bf16 pass (~21 of ~46 ms
on twemoji's, docs/cpu-engine.md). Inductor fuses each run of them into one loop around the
products. Measured on an AMX Xeon (2 threads), twemoji's bench verification pass (medians of 15
interleaved): float32 111 ms, autocast 56 ms, compiled layers 31 ms (3.5x).

What is compiled, per layer: before attention, the norm and the Q/K/V product; after it, the output
product, the residual, the norm, the feed-forward and its residual. Products in bf16 (weights copied
once to bf16: half a float32 model's size more memory), the residual stream float32 as in an autocast
pass. Attention stays eager (``Attention.attend``: rotary, the float32 K/V cache, the causal or masked
kernel): its kernel is already fused and its cache writes are in place. Two graphs per layer, with
the layer's weights frozen in, dynamic in the number of queries: Inductor compiles them once per CFG
batch size at the first bf16 pass (5-10 s for twemoji's 4 layers on two cores; a model's weights that
change, a training step, are copied and compiled again).
"""

from __future__ import annotations

import copy
import logging
import os

import torch
from torch import nn

log = logging.getLogger(__name__)

ENV = "MULO_WIDE_FUSED"  # "0": bf16 wide passes under autocast only (the tests' default)


def enabled() -> bool:
    return os.environ.get(ENV, "1") != "0"


def _bf16(module: nn.Module) -> nn.Module:
    """A bf16 copy of ``module``'s weights, for the products (the norms stay the model's own)."""
    return copy.deepcopy(module).to(torch.bfloat16).requires_grad_(False)


class _BeforeAttention(nn.Module):
    """The layer's norm, then its Q/K/V product: float32 residual in, bf16 ``qkv`` out."""

    def __init__(self, layer):
        super().__init__()
        self.norm, self.wqkv = layer.attention_norm, _bf16(layer.attention.wqkv)

    def forward(self, h):
        return self.wqkv(self.norm(h).bfloat16())


class _AfterAttention(nn.Module):
    """The output product and residual, the norm, the feed-forward and its residual."""

    def __init__(self, layer):
        super().__init__()
        self.wo, self.norm, self.feed_forward = _bf16(layer.attention.wo), layer.ffn_norm, _bf16(layer.feed_forward)

    def forward(self, h, attended):
        h = h + self.wo(attended).float()
        return h + self.feed_forward(self.norm(h).bfloat16()).float()


def _versions(model) -> tuple[int, ...]:
    return tuple(p._version for p in model.parameters())


class FusedLayers:
    """``model``'s layers for bf16 wide passes: ``run(i, h, ...)`` is ``model.layers[i](h, ...)``
    with the dense parts compiled (``__init__`` compiles and checks them; it raises if Inductor
    cannot, and ``mulo.wide`` then keeps autocast). ``stale``: the model's weights changed since
    (a training step): the copies no longer hold them."""

    def __init__(self, model):
        self.model, self.versions = model, _versions(model)
        # Frozen: Inductor folds each layer's weights in as constants, prepacked for oneDNN's bf16
        # products (~10 % faster than passing them in: one graph per layer rather than one shared).
        self.parts = [
            tuple(
                torch.compile(part(layer), dynamic=True, options={"freezing": True})
                for part in (_BeforeAttention, _AfterAttention)
            )
            for layer in model.layers
        ]
        with torch.no_grad():  # (frozen graphs are inference graphs)
            for batch in (1, 2):  # a sample pass and a CFG pair: compiled here, not in a user's pass
                h = torch.zeros(batch, 3, model.config.dim)
                for before, after in self.parts:
                    after(h, before(h)[..., : model.config.dim])

    @property
    def stale(self) -> bool:
        return _versions(self.model) != self.versions

    def run(self, i: int, h, slots, mask, cache, rotary=None, causal_pad=None) -> torch.Tensor:
        before, after = self.parts[i]
        attended = self.model.layers[i].attention.attend(before(h), i, slots, mask, cache, rotary, causal_pad)
        return after(h, attended)


def build(model) -> FusedLayers | None:
    """``model``'s compiled bf16 layers, or None where Inductor failed (logged)."""
    try:
        return FusedLayers(model)
    except Exception as error:  # noqa: BLE001 (no compiler, an Inductor bug: autocast still works)
        log.warning("bf16 wide passes stay under autocast: compiling their layers failed (%s)", error)
        return None
