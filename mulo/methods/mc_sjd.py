"""MC-SJD, Speculative Coupled Decoding (So et al., ICML 2026, arXiv 2510.24211): SJD whose drafts
are coupled across iterations. Lossless, training-free, no draft model.

SJD draws each next draft independently from the target's latest distribution p at its position,
so a position whose context barely moved still gets a new random token, which the next
verification must accept afresh: drafts rarely settle. MC-SJD draws the next draft from the
*maximal coupling* of the draft's own distribution q and p instead: the current draft x stays with
probability ``min(1, p(x)/q(x))``, otherwise a token is drawn from ``norm(max(0, p - q))``. The
result follows p exactly (so the next verification, with q = p, stays lossless) while keeping the
same token as often as any draw from p can, ``1 - TV(p, q)`` of the time.

That test and that residual are the verification's own, so one coin per draft serves both: before
the first rejection a passing draft is committed, at it the residual sample is committed (SJD's
step), and after it the same verdicts decide which drafts stay for the next iteration. SJD stops
looking at the first rejection; MC-SJD carries on through the window (its paper's "single-line
change"). The round records which drafts stayed (``Round.coupled``).
"""

from __future__ import annotations

import torch

from mulo.methods.chain import first_rejection
from mulo.methods.common import DecodeContext
from mulo.methods.sjd import Verdict, iterate
from mulo.sampling import residual_distribution, sample, speculative_accept


def generate(ctx: DecodeContext):
    return (yield from iterate(ctx, verify))


def couple(
    drafts: torch.Tensor, qs: torch.Tensor, p: torch.Tensor, passed: torch.Tensor, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """The next drafts by maximal coupling: a draft that ``passed`` its test (``u q(x) < p(x)``)
    stays, any other is redrawn from ``norm(max(0, p - q))``. Each result follows p, so p becomes
    its q. Returns ``(next drafts [N], their q [N, V])``."""
    out = drafts.clone()
    redraw = ~passed
    if bool(redraw.any()):
        out[redraw] = sample(residual_distribution(p[redraw], qs[redraw]), generator)
    return out, p


def verify(ctx: DecodeContext, p: torch.Tensor, drafts: torch.Tensor, qs: torch.Tensor) -> Verdict:
    m = len(drafts)
    p_draft = p[torch.arange(m), drafts]
    q_draft = qs[torch.arange(m), drafts]
    passed = speculative_accept(p_draft, q_draft, ctx.generator)  # one coin per draft, every draft
    n_ok = first_rejection(passed)
    replacement = None
    if n_ok < m:
        replacement = int(ctx.sample(residual_distribution(p[n_ok], qs[n_ok])))
    later = slice(n_ok + 1, m)  # drafts after the first rejection: coupled into the next iteration
    coupled, coupled_q = couple(drafts[later], qs[later], p[later], passed[later], ctx.generator)
    bonus = p[m:]  # the position after the window (when the image has one): no draft yet, a fresh sample
    fresh = ctx.sample(bonus).reshape(-1) if len(bonus) else torch.empty(0, dtype=torch.long)
    next_drafts = torch.cat([coupled, fresh])
    kept = torch.cat([passed[later], torch.zeros(len(bonus), dtype=torch.bool)])
    return Verdict(n_ok, p_draft / q_draft, replacement, next_drafts, torch.cat([coupled_q, bonus]), kept)
