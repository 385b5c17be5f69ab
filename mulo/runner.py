"""A model bound to one request: its condition, CFG batch, KV cache and forward-pass count.

Positions here are image positions ``v`` in raster order: feeding token ``v`` (at slot
``n_cond + v``) yields the logits of position ``v + 1``; the prefill's last slot yields the
logits of position 0. The runner mirrors what each slot holds (``fed``) so methods can re-feed
only what is out of date; ``stale_from`` marks slots whose tokens are right but whose K/V were
computed in a context that has since changed.
"""

from __future__ import annotations

import torch

from mulo.models.gpt import GPT, KVCache
from mulo.sampling import cfg_combine, logits_to_probs


class ModelRunner:
    def __init__(self, model: GPT, cond: torch.Tensor, cfg_scale: float, temperature: float, top_k: int, top_p: float):
        self.model = model
        self.cfg_scale = cfg_scale
        self.sampling = (temperature, top_k, top_p)
        param = next(model.parameters())
        cond = cond.to(param.device)[None]
        batch = torch.cat([cond, model.null_condition(cond)]) if cfg_scale != 1 else cond
        with torch.no_grad():
            self.cond_embeddings = model.embed_condition(batch)  # [B, T, dim]
        self.n_cond = self.cond_embeddings.shape[1]
        self.n_image = model.cfg.max_seq_len
        self.grid = model.cfg.grid_hw
        self.device = param.device
        self.cache = KVCache(model.cfg, batch.shape[0], param.device, param.dtype, self.n_cond + self.n_image - 1)
        self.fed = torch.full((self.n_image,), -1, dtype=torch.long)  # token at each image slot
        self.stale_from = self.n_image
        # exact: re-feeding a slot also re-feeds every known slot after it, so contexts stay
        # exact; False keeps stale K/V of unchanged slots (MuLo-SD's stale-KV ablation).
        self.exact = True
        self.nfe = 0
        self.first_logits: torch.Tensor | None = None

    # -- forward passes ----------------------------------------------------------------------
    def _guided(self, logits: torch.Tensor) -> torch.Tensor:
        if logits.shape[0] == 1:
            return logits[0]
        return cfg_combine(logits[0], logits[1], self.cfg_scale)

    @torch.no_grad()
    def prefill(self) -> torch.Tensor:
        """Write the condition slots; returns the guided logits of image position 0 ``[V]``."""
        slots = torch.arange(self.n_cond, device=self.device)
        mask = torch.ones(self.n_cond, self.n_cond, dtype=torch.bool, device=self.device).tril()
        logits = self.model.forward_embeddings(self.cond_embeddings, slots, mask, self.cache)
        self.nfe += 1
        self.first_logits = self._guided(logits[:, -1:])[0]
        return self.first_logits

    @torch.no_grad()
    def feed(self, positions: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Feed ``tokens [Q]`` at image ``positions [Q]`` under ``mask [Q, S']`` in one forward pass.

        Returns guided logits ``[Q, V]``; row q predicts position ``positions[q] + 1``.
        """
        positions = positions.to(torch.long).cpu()
        if int(positions.max()) >= self.n_image - 1 or int(positions.min()) < 0:
            raise ValueError(f"image positions must be in [0, {self.n_image - 2}] to be fed")
        tokens = tokens.to(torch.long).cpu()
        embeddings = self.model.embed_tokens(tokens.to(self.device))[None]
        embeddings = embeddings.expand(self.cache.k.shape[1], -1, -1)
        slots = (positions + self.n_cond).to(self.device)
        logits = self.model.forward_embeddings(embeddings, slots, mask.to(self.device), self.cache)
        self.nfe += 1
        self.fed[positions] = tokens
        return self._guided(logits)

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """The distribution this request samples from (temperature, top-k, top-p)."""
        return logits_to_probs(logits, *self.sampling)

    # -- masks over cache slots ----------------------------------------------------------------
    def _width(self, positions: torch.Tensor) -> int:
        return self.n_cond + int(positions.max()) + 1

    def causal_mask(self, positions: torch.Tensor) -> torch.Tensor:
        """Each query sees the condition and every written slot up to its own."""
        slots = torch.arange(self._width(positions))
        return slots[None, :] <= (positions[:, None] + self.n_cond)

    def final_mask(self, positions: torch.Tensor, final: torch.Tensor) -> torch.Tensor:
        """Each query sees the condition, its own slot and the *final* image positions before it."""
        width = self._width(positions)
        image = torch.arange(width - self.n_cond)
        visible = (image[None, :] <= positions[:, None]) & final[: width - self.n_cond][None, :]
        visible |= image[None, :] == positions[:, None]
        cond = torch.ones(len(positions), self.n_cond, dtype=torch.bool)
        return torch.cat([cond, visible], dim=1)

    # -- keeping the cache in step with a token sequence -----------------------------------
    def outdated(self, seq: torch.Tensor, limit: int, contiguous: bool | None = None) -> torch.Tensor:
        """Known positions ``< limit`` to re-feed so the cache agrees with ``seq``, in order.

        A slot is out of date when it holds another token or sits at or after ``stale_from``;
        when ``contiguous`` (default: ``self.exact``) every known slot after the first
        out-of-date one is included too, since its K/V saw the old token.
        """
        head = seq[:limit]
        pos = torch.arange(len(head))
        known = head >= 0
        bad = known & ((self.fed[:limit] != head) | (pos >= self.stale_from))
        if (self.exact if contiguous is None else contiguous) and bool(bad.any()):
            bad = known & (pos >= int(bad.nonzero()[0]))
        return pos[bad]

    def feed_through(self, seq: torch.Tensor, last: int, include: torch.Tensor | None = None) -> torch.Tensor:
        """Bring every slot before ``last`` in line with ``seq`` and feed ``last`` (or the
        positions ``include``) in one causal pass. Returns ``(logits [Q, V], positions [Q])``,
        sorted by position, for every position fed."""
        positions = self.outdated(seq, last)
        extra = torch.tensor([last]) if include is None else include
        positions = torch.unique(torch.cat([positions, extra]))
        logits = self.feed(positions, seq[positions], self.causal_mask(positions))
        if self.stale_from <= last:  # slots up to ``last`` were just re-encoded in order
            self.stale_from = last + 1
        return logits, positions
