"""Speculative Jacobi Decoding (Teng et al. 2024): no draft model, a window of guesses refined
by the target itself, with the probabilistic acceptance of speculative sampling.

Each iteration feeds [last committed token, window drafts] in one causal pass, giving the
target distribution p at every window position. Drafts are verified left to right with
``min(1, p(x)/q(x))`` where q is the distribution the draft was sampled from (one-hot for a
fresh random guess); the first rejection is replaced by a sample from ``norm(max(0, p - q))``
and verification stops. The fresh samples drawn from p after the committed tokens become the
next iteration's drafts (with q = that p), and new random guesses refill the window.

The loop (``iterate``) is shared with SJD's variants, which differ only in one iteration's
verdict: MC-SJD (``mulo.methods.mc_sjd``) draws the next drafts coupled with the current ones, GSD
(``mulo.methods.gsd``) tests a group of tokens around each draft instead of the draft alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mulo.methods.chain import chain_probs, first_rejection, mark_chain, mark_replaced
from mulo.methods.common import DecodeContext
from mulo.sampling import residual_distribution, speculative_accept


@dataclass
class Verdict:
    """One iteration's outcome over a window of m drafts (``p``: m or m + 1 rows, the last one the
    position after the window when the image has it)."""

    n_ok: int  # drafts accepted before the first rejection
    scores: torch.Tensor  # [m] the acceptance probability each draft was tested with (before min(1, .))
    replacement: int | None  # the token drawn at the first rejection (None: every draft passed)
    next_drafts: torch.Tensor  # drafts for the positions after the committed ones, in order
    next_qs: torch.Tensor  # [len(next_drafts), V] the distribution each was drawn from
    kept: torch.Tensor | None = None  # MC-SJD: bool [len(next_drafts)], the draft there stays the same


def generate(ctx: DecodeContext):
    return (yield from iterate(ctx, verify))


def verify(ctx: DecodeContext, p: torch.Tensor, drafts: torch.Tensor, qs: torch.Tensor) -> Verdict:
    """SJD's verdict: exact speculative sampling, then fresh samples from p as the next drafts."""
    m = len(drafts)
    fresh = ctx.sample(p)
    p_draft = p[torch.arange(m), drafts]
    q_draft = qs[torch.arange(m), drafts]
    n_ok = first_rejection(speculative_accept(p_draft, q_draft, ctx.generator))
    replacement = None
    if n_ok < m:  # replace the first rejected draft from the residual
        replacement = int(ctx.sample(residual_distribution(p[n_ok], qs[n_ok])))
    done = n_ok + (replacement is not None)
    return Verdict(n_ok, p_draft / q_draft, replacement, fresh[done:], p[done:])


def iterate(ctx: DecodeContext, verdict: Callable[..., Verdict]):
    """The Jacobi loop: each iteration tops the window up with random guesses (one-hot q), runs one
    causal target pass over it, commits what ``verdict(ctx, p, drafts, qs)`` accepted (and its
    replacement) and carries its next drafts into the following iteration."""
    height, width = ctx.grid
    n_total = height * width
    vocab = ctx.family.target.config.vocab_size
    target = ctx.runner(ctx.family.target, "target")
    x = torch.full((n_total,), -1, dtype=torch.long)
    drafts = torch.empty(0, dtype=torch.long)
    qs = torch.empty(0, vocab)  # distribution each draft was sampled from
    with ctx.phase("verify"):
        target.prefill()
    n = 0
    while n < n_total:
        rnd = ctx.new_round(f"iteration {ctx.round_count}", x)
        with ctx.phase("verify"):
            missing = min(ctx.config.sjd_window, n_total - n) - len(drafts)
            if missing > 0:  # random guesses with a one-hot q
                guesses = torch.randint(vocab, (missing,), generator=ctx.generator)
                drafts = torch.cat([drafts, guesses])
                qs = torch.cat([qs, F.one_hot(guesses, vocab).float()])
            m = len(drafts)
            seq = x.clone()
            seq[n : n + m] = drafts
            p = chain_probs(target, seq, n, m)
            v = verdict(ctx, p, drafts, qs)
            x[n : n + v.n_ok] = drafts[: v.n_ok]
            mark_chain(rnd, n, drafts, v.scores, v.n_ok)
            n_ok = v.n_ok
            if v.replacement is not None:
                x[n + n_ok] = v.replacement
                mark_replaced(rnd, n + n_ok)
                n_ok += 1
            n += n_ok
            left = n_total - n  # the next drafts never run past the image
            drafts, qs = v.next_drafts[:left], v.next_qs[:left]
            if v.kept is not None:
                rnd.coupled = torch.zeros(n_total, dtype=torch.int8)
                rnd.coupled[n : n + len(drafts)] = v.kept[:left].to(torch.int8)
                rnd.coupled = rnd.coupled.reshape(height, width).numpy()
        yield ctx.close(rnd, x)
    return x.reshape(height, width)
