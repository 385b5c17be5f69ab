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

from mulo.methods.common import DecodeContext
from mulo.sampling import residual_distribution, speculative_accept


def window_probs(ctx: DecodeContext, target, seq: torch.Tensor, n: int, m: int) -> torch.Tensor:
    """Target distributions of positions n .. n+m (n+m only if it exists), one forward pass."""
    n_total = len(seq)
    rows = [target.first_logits[None]] if n == 0 else []
    first, last = max(n - 1, 0), min(n + m - 1, n_total - 2)
    if last >= first:
        positions = torch.arange(first, last + 1)
        rows.append(target.feed(positions, seq[positions], target.causal_mask(positions)))
    return target.probs(torch.cat(rows))


def generate(ctx: DecodeContext):
    height, width = ctx.grid
    n_total = height * width
    vocab = ctx.family.target.cfg.vocab_size
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
            p = window_probs(ctx, target, seq, n, m).cpu()
            fresh = ctx.sample(p)
            p_draft = p[torch.arange(m), drafts]
            q_draft = qs[torch.arange(m), drafts]
            ok = speculative_accept(p_draft, q_draft, ctx.generator)
            n_ok = m if bool(ok.all()) else int((~ok).nonzero()[0])
            x[n : n + n_ok] = drafts[:n_ok]
            flat = {name: getattr(rnd, name).reshape(-1) for name in ("draft", "score", "accepted", "rejected", "reopened", "resampled")}
            flat["draft"][n : n + m] = drafts.numpy()
            flat["score"][n : n + m] = (p_draft / q_draft).clamp(max=1).numpy()
            flat["accepted"][n : n + n_ok] = 1
            if n_ok < m:  # replace the first rejected draft from the residual
                i = n + n_ok
                x[i] = ctx.sample(residual_distribution(p[n_ok], qs[n_ok]))
                for name in ("rejected", "reopened", "resampled"):
                    flat[name][i] = 1
                rnd.t0 = i
                n_ok += 1
            n += n_ok
            # Fresh samples after the committed tokens are the next drafts.
            keep = slice(n_ok, min(p.shape[0], n_ok + n_total - n))
            drafts, qs = fresh[keep], p[keep]
        yield ctx.close(rnd, x)
    return x.reshape(height, width)
