"""Standard speculative decoding with a same-grid draft model (``sd``, lossless) and LANTERN's
relaxed acceptance on its chains (``lantern_chain``, the variant this project ran before LANTERN
moved onto EAGLE-2's trees as its paper has it: ``mulo.methods.lantern``).

Each round the small draft model proposes ``draft_len`` tokens one by one (sampling from its
own distribution q), the target scores all of them in one causal pass, and drafts are accepted
left to right with probability ``min(1, p/q)``; the first rejection is resampled from
``norm(max(0, p - q))`` and, when every draft is accepted, a bonus token is sampled from the
target's next distribution. The output distribution is exactly the target's.

The chain variant tests ``min(1, p~(x)/q(x))`` with LANTERN's relaxed ``p~(x) = p(x) + c_m``
(``mulo.methods.lantern``, steps 1-3) and resamples a rejection from LANTERN's residual for drafts
with a drafter probability, ``norm(max(0, p - q'))`` with q' = q less the draft's first k + 1
nearest codes when it pooled (``lantern_drafter_residual``). At temperature 0 p is one-hot, so
nothing is pooled: greedy ``lantern_chain`` is greedy SD (the tree version has LANTERN's greedy rule).
"""

from __future__ import annotations

import torch

from mulo.methods.chain import chain_probs, first_rejection, mark_chain, mark_replaced
from mulo.methods.common import DecodeContext
from mulo.methods.lantern import Pooling
from mulo.sampling import lantern_drafter_residual, residual_distribution, speculative_accept


def _draft(ctx: DecodeContext, drafter, seq: torch.Tensor, n: int, count: int):
    """Sample ``count`` draft tokens at positions n.. into ``seq``; returns their q ``[count, V]``."""
    qs = []
    for u in range(n, n + count):
        seq[u], q = drafter.sample_next(seq, u, ctx.generator)
        qs.append(q.cpu())
    return torch.stack(qs)


def generate(ctx: DecodeContext, relaxed: bool = False):
    fam, knobs = ctx.family, ctx.config  # the registry checked that fam has a draft model
    height, width = ctx.grid
    n_total = height * width
    target = ctx.runner(fam.target, "target")
    drafter = ctx.runner(fam.draft_model, "drafter")
    pooling = Pooling.of_request(fam, knobs) if relaxed else None
    with ctx.phase("verify"):
        target.prefill()
    with ctx.phase("drafter"):
        drafter.prefill()
    x = torch.full((n_total,), -1, dtype=torch.long)
    n = 0
    while n < n_total:
        rnd = ctx.new_round(f"round {ctx.round_count}", x)
        count = min(knobs.draft_len, n_total - n)
        seq = x.clone()
        with ctx.phase("drafter"):
            q = _draft(ctx, drafter, seq, n, count)
        with ctx.phase("verify"):
            p = chain_probs(target, seq, n, count)
            drafts = seq[n : n + count]
            idx = torch.arange(count)
            if relaxed:
                p_test, pooled = pooling.relaxed(p[:count], drafts)
            else:
                p_test = p[idx, drafts]
            q_test = q[idx, drafts]
            n_ok = first_rejection(speculative_accept(p_test, q_test, ctx.generator))
            x[n : n + n_ok] = drafts[:n_ok]
            mark_chain(rnd, n, drafts, p_test / q_test, n_ok)
            i = n + n_ok
            if n_ok < count:
                if relaxed:
                    nearest = pooling.nearest[drafts[n_ok]]
                    residual = lantern_drafter_residual(p[n_ok], q[n_ok], nearest, bool(pooled[n_ok]))
                else:
                    residual = residual_distribution(p[n_ok], q[n_ok])
                x[i] = ctx.sample(residual)
                mark_replaced(rnd, i)
                n = i + 1
            elif i < n_total:  # every draft accepted: a bonus token from the target
                x[i] = ctx.sample(p[count])
                rnd.resampled.reshape(-1)[i] = 1
                n = i + 1
            else:
                n = i
        yield ctx.close(rnd, x)
    return x.reshape(height, width)


def generate_lantern_chain(ctx: DecodeContext):
    return (yield from generate(ctx, relaxed=True))
