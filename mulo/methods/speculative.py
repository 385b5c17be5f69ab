"""Standard speculative decoding with a same-grid draft model (``sd``, lossless) and LANTERN's
relaxed acceptance on top of it (``lantern``, Jang et al. 2024).

Each round the small draft model proposes ``draft_len`` tokens one by one (sampling from its
own distribution q), the target scores all of them in one causal pass, and drafts are accepted
left to right with probability ``min(1, p/q)``; the first rejection is resampled from
``norm(max(0, p - q))`` and, when every draft is accepted, a bonus token is sampled from the
target's next distribution. The output distribution is exactly the target's.

LANTERN replaces p(x) in the test by ``p~(x) = p(x) + mass of the nearest codebook neighbours``,
taking the largest nearest-first set whose mass stays within the TV budget ``delta``.
"""

from __future__ import annotations

import torch

from mulo.methods.common import DecodeContext
from mulo.sampling import lantern_relaxed, lantern_residual, residual_distribution


def _draft(ctx: DecodeContext, drafter, seq: torch.Tensor, n: int, count: int):
    """Sample ``count`` draft tokens at positions n.. into ``seq``; returns their q ``[count, V]``."""
    qs = []
    for u in range(n, n + count):
        if u == 0:
            logits = drafter.first_logits
        else:
            logits, _ = drafter.feed_through(seq, u - 1)
            logits = logits[-1]
        q = drafter.probs(logits).cpu()
        seq[u] = ctx.sample(q)
        qs.append(q)
    return torch.stack(qs)


def _verify(target, seq: torch.Tensor, n: int, count: int) -> torch.Tensor:
    """Target distributions of positions n .. n+count (the last only if it exists), one pass."""
    n_total = len(seq)
    rows = [target.first_logits[None]] if n == 0 else []
    last = min(n + count - 1, n_total - 2)
    if last >= max(n - 1, 0):
        logits, positions = target.feed_through(seq, last, include=torch.arange(max(n - 1, 0), last + 1))
        rows.append(logits[positions >= n - 1])
    return target.probs(torch.cat(rows)).cpu()


def generate(ctx: DecodeContext, relaxed: bool = False):
    fam, cfg = ctx.family, ctx.config
    if fam.draft_model is None:
        raise ValueError(f"family {fam.name!r} has no same-grid draft model for sd/lantern")
    height, width = ctx.grid
    n_total = height * width
    target = ctx.runner(fam.target, "target")
    drafter = ctx.runner(fam.draft_model, "drafter")
    neighbours = fam.neighbours(cfg.k).cpu() if relaxed else None
    with ctx.phase("verify"):
        target.prefill()
    with ctx.phase("drafter"):
        drafter.prefill()
    x = torch.full((n_total,), -1, dtype=torch.long)
    n = 0
    while n < n_total:
        rnd = ctx.new_round(f"round {ctx.round_count}", x)
        count = min(cfg.draft_len, n_total - n)
        seq = x.clone()
        with ctx.phase("drafter"):
            q = _draft(ctx, drafter, seq, n, count)
        with ctx.phase("verify"):
            p = _verify(target, seq, n, count)
            drafts = seq[n : n + count]
            idx = torch.arange(count)
            if relaxed:
                p_test, pooled = lantern_relaxed(p[:count], drafts, neighbours, cfg.delta)
            else:
                p_test = p[idx, drafts]
            q_test = q[idx, drafts]
            u = torch.rand(count, generator=ctx.generator)
            ok = u * q_test < p_test  # accept with probability min(1, p/q)
            n_ok = count if bool(ok.all()) else int((~ok).nonzero()[0])
            x[n : n + n_ok] = drafts[:n_ok]
            flat = {name: getattr(rnd, name).reshape(-1) for name in ("draft", "score", "accepted", "rejected", "reopened", "resampled")}
            flat["draft"][n : n + count] = drafts.numpy()
            flat["score"][n : n + count] = (p_test / q_test).clamp(max=1).numpy()
            flat["accepted"][n : n + n_ok] = 1
            i = n + n_ok
            if n_ok < count:
                if relaxed:
                    residual = lantern_residual(p[n_ok], q[n_ok], drafts[n_ok], neighbours, pooled[n_ok])
                else:
                    residual = residual_distribution(p[n_ok], q[n_ok])
                x[i] = ctx.sample(residual)
                for name in ("rejected", "reopened", "resampled"):
                    flat[name][i] = 1
                rnd.t0 = i
                n = i + 1
            elif i < n_total:  # every draft accepted: a bonus token from the target
                x[i] = ctx.sample(p[count])
                flat["resampled"][i] = 1
                n = i + 1
            else:
                n = i
        yield ctx.close(rnd, x)
    return x.reshape(height, width)


def generate_lantern(ctx: DecodeContext):
    return (yield from generate(ctx, relaxed=True))
