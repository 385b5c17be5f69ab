"""Speculative Jacobi Decoding (Teng et al. 2024): no draft model, a window of guesses refined
by the target itself, with the probabilistic acceptance of speculative sampling.

Each iteration feeds [last committed token, window drafts] in one causal pass, giving the
target distribution p at every window position. Drafts are verified left to right with
``min(1, p(x)/q(x))`` where q is the distribution the draft was sampled from (one-hot for a
fresh random guess); the first rejection is replaced by a sample from ``norm(max(0, p - q))``
and verification stops. The fresh samples drawn from p after the committed tokens become the
next iteration's drafts (with q = that p), and new random guesses refill the window.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mulo.methods.chain import chain_probs, first_rejection, mark_chain, mark_replaced
from mulo.methods.common import DecodeContext
from mulo.sampling import residual_distribution, speculative_accept


def generate(ctx: DecodeContext):
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
            fresh = ctx.sample(p)
            p_draft = p[torch.arange(m), drafts]
            q_draft = qs[torch.arange(m), drafts]
            n_ok = first_rejection(speculative_accept(p_draft, q_draft, ctx.generator))
            x[n : n + n_ok] = drafts[:n_ok]
            mark_chain(rnd, n, drafts, p_draft / q_draft, n_ok)
            if n_ok < m:  # replace the first rejected draft from the residual
                x[n + n_ok] = ctx.sample(residual_distribution(p[n_ok], qs[n_ok]))
                mark_replaced(rnd, n + n_ok)
                n_ok += 1
            n += n_ok
            # Fresh samples after the committed tokens are the next drafts.
            keep = slice(n_ok, min(p.shape[0], n_ok + n_total - n))
            drafts, qs = fresh[keep], p[keep]
        yield ctx.close(rnd, x)
    return x.reshape(height, width)
