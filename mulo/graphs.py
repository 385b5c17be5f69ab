"""Forward passes replayed from captured CUDA graphs (fixed shapes only).

A fixed-shape runner (``mulo.runner``) feeds every pass at one of a few query counts (a power of
two) over the whole cache, so each count is one graph: captured at its first use, replayed after.
On a GPU a small model's single-token step is launch-bound (tens of kernels of microseconds
each); a replay launches them all at once. Each graph reads static input buffers, filled before
a replay (token ids and slots staged through pinned host memory, so the copy does not stop the
host; the mask is built on the device and copied there), and writes static outputs that the
caller copies out before the next replay.

``mode``: ``"cuda"`` captures real graphs; ``"emulate"`` keeps the same static buffers and copies
but runs the pass eagerly on them at each replay: how the CPU tests check the plumbing (same
tokens as the eager path) without a GPU. A capture that fails falls back to eager passes for the
rest of the request, and the reason is kept (``fallback``) for the trace.
"""

from __future__ import annotations

import torch

from mulo.models.gpt import GPT, KVCache


def capture(fn, pool=None):
    """``fn()`` recorded in a CUDA graph after one warm-up run on a side stream (CUDA's rule
    before a capture); returns ``(graph, fn's outputs)``, the outputs static (each replay
    rewrites them). Nothing runs during the capture itself."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        outputs = fn()
    return graph, outputs


class _Pass:
    """One query count's static buffers and, in ``cuda`` mode, its graph."""

    def __init__(self, model: GPT, cache: KVCache, width: int, n_slots: int, device, mode: str, pool):
        self.model, self.cache, self.mode = model, cache, mode
        long = dict(dtype=torch.long, device=device)
        # token ids, position-embedding slots, cache slots, then a neighbour-input model's row above
        rows = 3 + model.config.neighbour_inputs
        self.ids = torch.zeros(rows, width, **long)
        self.mask = torch.zeros(width, n_slots, dtype=torch.bool, device=device)
        pinned = device.type == "cuda"
        self.staging = torch.zeros(rows, width, dtype=torch.long, pin_memory=pinned)
        self.pool = pool
        self.graph = None
        self.hidden = self.logits = None

    def _run(self):
        tokens, pe_slots, slots = self.ids[:3]
        neighbours = self.ids[3:].T if len(self.ids) > 3 else None
        embeddings = self.model.embed_tokens(tokens, neighbours)[None].expand(self.cache.k.shape[1], -1, -1)
        hidden = self.model.forward_hidden(embeddings, slots, self.mask, self.cache, pe_slots)
        return hidden, self.model.output(hidden).float()

    def replay(self, tokens, pe_slots, slots, mask, neighbours=None) -> tuple[torch.Tensor, torch.Tensor]:
        self.staging[0].copy_(tokens)
        self.staging[1].copy_(pe_slots)
        self.staging[2].copy_(slots)
        if neighbours is not None:
            self.staging[3:].copy_(neighbours.T)
        self.ids.copy_(self.staging, non_blocking=True)
        self.mask.copy_(mask)
        if self.mode == "emulate":
            self.hidden, self.logits = self._run()
            return self.hidden, self.logits
        if self.graph is None:  # the warm-up runs on the real inputs: it writes the K/V the replay writes again
            self.graph, (self.hidden, self.logits) = capture(self._run, self.pool)
        self.graph.replay()
        return self.hidden, self.logits


class PassGraphs:
    """The graphed passes of one runner (one request's model, cache and condition)."""

    MODES = ("cuda", "emulate")

    def __init__(self, model: GPT, cache: KVCache, mode: str):
        if mode not in self.MODES:
            raise ValueError(f"graph mode must be one of {self.MODES} (got {mode!r})")
        self.model, self.cache, self.mode = model, cache, mode
        self.device = cache.k.device
        self.pool = torch.cuda.graph_pool_handle() if mode == "cuda" else None
        self.passes: dict[int, _Pass] = {}
        self.fallback: str | None = None  # why passes run eagerly instead (first failure)

    def __call__(self, tokens, pe_slots, slots, mask, neighbours=None):
        """``(hidden [B, Q, dim], logits [B, Q, V] float32)`` of one fixed-shape pass (``Q`` a query
        bucket; ``mask [Q, n_slots]`` on the device; ``neighbours [Q, 3]`` a neighbour-input model's
        row-above ids), copied out of the static outputs, or None once graphs have failed (the
        caller runs the pass eagerly)."""
        if self.fallback is not None:
            return None
        width = len(tokens)
        if width not in self.passes:
            self.passes[width] = _Pass(self.model, self.cache, width, mask.shape[1], self.device, self.mode, self.pool)
        try:
            hidden, logits = self.passes[width].replay(tokens, pe_slots, slots, mask, neighbours)
        except RuntimeError as exc:  # e.g. an op that cannot be captured: eager from here on
            self.fallback = f"CUDA graph capture failed ({type(exc).__name__}: {str(exc).splitlines()[0]})"
            return None
        return hidden.clone(), logits.clone()
