"""Pieces shared by the token-level verifiers (SD, LANTERN-chain, SJD): a chain of draft tokens after
the committed prefix, verified left to right until the first rejection."""

from __future__ import annotations

import torch

from mulo.trace import Round


def chain_probs(target, seq: torch.Tensor, n: int, count: int) -> torch.Tensor:
    """Target distributions of positions ``n .. n+count`` (the last only if it exists) in one
    causal pass over [token n-1, drafts]."""
    return target.span_probs(seq, n, n + count + 1)


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
