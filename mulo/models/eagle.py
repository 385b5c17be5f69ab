"""EAGLE's feature-level draft head (Li et al. 2024) for our AR image transformer.

One decoder layer that reads, at slot ``s``, the target's feature ``f_s`` (its normalised last
hidden state, the output head's input) together with the embedding of the input at slot
``s + 1``, and predicts ``f_{s+1}``; the target's output head turns the prediction into the
distribution of the token after that. Features carry the target's context, so one layer
suffices to guess one step ahead, and feeding its own predictions back lets it guess several.

The head owns only its fusion layer and decoder layer: the token embedding, the position
embedding and the output head are the target's (passed in, never copied), as in EAGLE.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from mulo.models.gpt import GPT, GPTConfig, KVCache, TransformerBlock


class EagleHead(nn.Module):
    def __init__(self, target_config: GPTConfig):
        super().__init__()
        self.config = replace(target_config, n_layer=1)  # the target's width, heads and slot layout
        self.fc = nn.Linear(2 * self.config.dim, self.config.dim)
        self.layer = TransformerBlock(self.config)

    def forward(
        self,
        target: GPT,
        features: torch.Tensor,
        next_inputs: torch.Tensor,
        slots: torch.Tensor,
        mask: torch.Tensor | None = None,
        cache: KVCache | None = None,
        pe_slots: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Predicted features ``[B, Q, dim]`` of slots ``slots + 1``.

        ``features [B, Q, dim]``: the target's features at ``slots`` (or the head's own
        predictions of them); ``next_inputs [B, Q, dim]``: the embedded inputs at ``slots + 1``.
        ``mask``/``cache``/``pe_slots`` as in ``GPT.forward_hidden`` (causal over the inputs
        without a cache).
        """
        if cache is not None:
            mask = cache.admit(slots, mask)
        x = self.fc(torch.cat([next_inputs, features.to(next_inputs.dtype)], dim=-1))
        positions = slots if pe_slots is None else pe_slots
        x = x + target.abs_pe[0, positions].to(x.dtype)
        return self.layer(x, 0, slots, mask, cache, target.rotary_at(positions))

    def new_cache(self, batch: int, n_slots: int, device, dtype) -> KVCache:
        return KVCache(self.config, batch, device, dtype, n_slots)


def head_for(target: GPT) -> EagleHead:
    """A head shaped for ``target``, on its device and in its dtype."""
    param = next(target.parameters())
    return EagleHead(target.config).to(device=param.device, dtype=param.dtype)
