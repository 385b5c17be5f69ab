"""The K/V cache a GPT's passes read and write, and the check that lets a pass skip its mask.

Kept apart from ``mulo.models.gpt`` (which re-exports both): the cache is the runners' state, not the
model's, and the mask test is the one piece of a pass's attention that reads the mask on the host.
"""

from __future__ import annotations

import torch


class KVCache:
    """Static per-layer K/V buffers ``[n_layer, B, kv_heads, n_slots, head_dim]``.

    ``written[s]`` says whether slot ``s`` holds K/V; attention never looks at other slots.
    """

    def __init__(self, config, batch: int, device, dtype, n_slots: int | None = None):
        """``config``: the model's ``GPTConfig`` (not imported: ``mulo.models.gpt`` imports this)."""
        n_slots = n_slots or config.n_positions
        shape = (config.n_layer, batch, config.kv_heads, n_slots, config.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.written = torch.zeros(n_slots, dtype=torch.bool, device=device)
        self.position_inputs = None  # a column-object model's ``GPT.position_inputs``, set by its runner

    @property
    def n_slots(self) -> int:
        return self.written.numel()

    def admit(self, slots: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Mark ``slots`` written by the pass about to run and return its ``mask [Q, S']`` limited to
        written slots; ``ValueError`` without a mask or (on a CPU) unless every query sees its own
        slot. On an accelerator that check would stop the host every pass: the runner's masks are
        built to pass it, which the CPU tests check."""
        if mask is None:
            raise ValueError("a cached forward needs an explicit [Q, S] attention mask")
        self.written.index_fill_(0, slots, True)  # no host tensor: a CUDA graph can capture it
        mask = mask & self.written[: mask.shape[1]]
        if mask.device.type == "cpu":
            if len(slots) == 1:  # a single-token step: one look, no index tensors
                slot = int(slots[0])
                sees_own = slot < mask.shape[1] and bool(mask[0, slot])
            else:
                own = mask[torch.arange(len(slots)), slots.clamp(max=mask.shape[1] - 1)]
                sees_own = bool(own.all()) and int(slots.max()) < mask.shape[1]
            if not sees_own:
                raise ValueError("every query must see its own slot")
        return mask


def causal_offset(mask: torch.Tensor) -> int | None:
    """``P`` when ``mask [Q, S]`` (on the CPU) is causal up to its last key (query ``i`` sees keys
    ``0 .. P + i``, ``P = S - Q``) with ``P < Q``, else None.

    Why: such a pass (a verification over the grid after the condition, a prefill) can run the fused
    causal kernel over ``P`` zero queries put on top, which skips the blocks above the diagonal that
    the masked kernel computes and discards: attention 1.7-2x faster at a verification's shape
    (docs/cpu-engine.md). Past ``P >= Q`` the padding costs more than the mask saves. Not on an
    accelerator: the check reads the mask on the host, which a CUDA graph cannot capture."""
    q, s = mask.shape
    p = s - q
    if mask.device.type != "cpu" or not 0 <= p < q:
        return None
    if not (bool(mask[0, p]) and bool(mask[-1].all()) and (p + 1 == s or not bool(mask[0, p + 1]))):
        return None  # (the cheap looks first: most masks that are not causal fail one of them)
    return p if torch.equal(mask, torch.ones_like(mask).tril(p)) else None
