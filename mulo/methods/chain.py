"""Pieces shared by the token-level verifiers (SD, LANTERN, SJD): a chain of draft tokens after
the committed prefix, verified left to right until the first rejection."""

from __future__ import annotations

import torch

from mulo.trace import Round


def chain_probs(target, seq: torch.Tensor, n: int, count: int) -> torch.Tensor:
    """Target distributions of positions ``n .. n+count`` (the last only if it exists) in one
    causal pass over [token n-1, drafts], re-feeding any out-of-date slot before them."""
    n_total = len(seq)
    rows = [target.first_logits[None]] if n == 0 else []
    last = min(n + count - 1, n_total - 2)
    if last >= max(n - 1, 0):
        logits, positions = target.feed_through(seq, last, include=torch.arange(max(n - 1, 0), last + 1))
        rows.append(logits[positions >= n - 1])
    return target.probs(torch.cat(rows)).cpu()


def first_rejection(accepted: torch.Tensor) -> int:
    """Number of drafts accepted before the first rejection."""
    return len(accepted) if bool(accepted.all()) else int((~accepted).nonzero()[0])


def mark_chain(rnd: Round, n: int, drafts: torch.Tensor, scores: torch.Tensor, n_ok: int) -> None:
    """Record drafts at positions n.. with their acceptance probabilities; the first n_ok kept."""
    count = len(drafts)
    rnd.draft.reshape(-1)[n : n + count] = drafts.numpy()
    rnd.score.reshape(-1)[n : n + count] = scores.clamp(max=1).numpy()
    rnd.accepted.reshape(-1)[n : n + n_ok] = 1


def mark_replaced(rnd: Round, i: int) -> None:
    """Position i was rejected and resampled by the target."""
    for grid in (rnd.rejected, rnd.reopened, rnd.resampled):
        grid.reshape(-1)[i] = 1
    rnd.t0 = i
