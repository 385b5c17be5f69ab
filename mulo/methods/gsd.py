"""GSD, Grouped Speculative Decoding (So et al., ICCV 2025, arXiv 2508.07747): SJD that accepts a
draft when the *group* of tokens around it is likely enough. Lossy, training-free, no draft model.

Image tokens are redundant: many codes next to the draft would do as well, yet speculative
sampling tests the draft alone, ``min(1, p(x)/q(x))``, and rejects it when its own mass is small.
GSD tests a group instead, ``min(1, p(G)/q(G))``, where the group G of a draft x is formed anew at
every test from the target's current distribution p (the paper's dynamic grouping; a fixed
clustering of the codebook did not work for it):

1. the tokens ranked within ``gsd_group`` places of x in p's ranking (x included),
2. whose probability is within ``gsd_gap`` of p(x),
3. and whose token embedding in the target (what the model reads) is closer to x's than
   ``gsd_distance`` times the mean squared distance between two codes' embeddings (GSD thresholds
   the raw squared distance of its model's embeddings; relative to the codebook's own spread the
   threshold carries over from one model to another).

A rejection is replaced from SJD's residual ``norm(max(0, p - q))`` and the rest is SJD's loop.
With ``gsd_group`` 0 the group is the draft alone and GSD is SJD, token for token. At temperature
0, p is one-hot: a draft that is not the arg-max has p = 0 and its group (gap < 1) leaves out the
arg-max, so greedy GSD is greedy AR.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mulo.methods.chain import first_rejection
from mulo.methods.common import DecodeContext
from mulo.methods.sjd import Verdict, iterate
from mulo.sampling import residual_distribution, speculative_accept


def generate(ctx: DecodeContext):
    embeddings = ctx.family.target.tok_embeddings.weight.detach()
    scale = mean_pair_distance(embeddings)
    return (yield from iterate(ctx, lambda c, p, drafts, qs: verify(c, p, drafts, qs, embeddings, scale)))


def mean_pair_distance(embeddings: torch.Tensor) -> float:
    """The mean squared Euclidean distance between the embeddings of two different codes:
    ``2 V/(V-1) (mean |e|^2 - |mean e|^2)``, without the V x V matrix."""
    e = embeddings.float()
    v = e.shape[0]
    spread = e.pow(2).sum(-1).mean() - e.mean(0).pow(2).sum()
    return float(2 * v / max(v - 1, 1) * spread)


def rank_neighbours(p: torch.Tensor, drafts: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The codes ranked within ``width`` places of each draft in its row of ``p [m, V]`` (ranked by
    p descending, equal p: the lower code first), as ``(codes [m, 2 width + 1], exists [m, 2 width
    + 1])``, offset -width ... +width, the draft at the centre; a place past either end of the
    ranking does not exist.

    Without sorting the V codes (on a 2,048-code family the sort took ~1.9 ms of GSD's ~6.7 ms an
    iteration, nearly all it spent over SJD's, measured): a float32 probability's bits order like its value (p >= 0), so
    ``bits * V + (V - 1 - code)`` is a distinct key per code in ranking order, and the ``width``
    keys just above and just below the draft's are two top-k's."""
    m, v = p.shape
    key = p.float().contiguous().view(torch.int32).long() * v + (v - 1 - torch.arange(v, device=p.device))
    own = key[torch.arange(m, device=p.device), drafts][:, None]
    k = min(width, v - 1)
    lowest = torch.iinfo(torch.int64).min
    above = torch.where(key > own, -key, lowest).topk(k, dim=-1)  # nearest above first
    below = torch.where(key < own, key, lowest).topk(k, dim=-1)  # nearest below first
    pad = width - k  # a ranking shorter than the window: places that do not exist
    codes = torch.cat(
        [
            F.pad(above.indices.flip(-1), (pad, 0)),
            drafts[:, None],
            F.pad(below.indices, (0, pad)),
        ],
        dim=-1,
    )
    exists = torch.cat(
        [
            F.pad(above.values.flip(-1) != lowest, (pad, 0)),
            torch.ones(m, 1, dtype=torch.bool, device=p.device),
            F.pad(below.values != lowest, (0, pad)),
        ],
        dim=-1,
    )
    return codes, exists


def group_mass(
    p: torch.Tensor,
    qs: torch.Tensor,
    drafts: torch.Tensor,
    embeddings: torch.Tensor,
    scale: float,
    width: int,
    gap: float,
    distance: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(p(G) [m], q(G) [m], group size [m])`` of each draft's group (steps 1-3 above) under
    ``p [>=m, V]`` and ``qs [m, V]``."""
    m = len(drafts)
    rows = torch.arange(m)
    p = p[:m]
    own = p[rows, drafts]
    if width == 0:
        return own, qs[rows, drafts], torch.ones(m, dtype=torch.long)
    members, inside = rank_neighbours(p, drafts, width)
    p_members = p.gather(-1, members)
    near = (p_members - own[:, None]).abs() <= gap
    device = embeddings.device
    ex = embeddings[drafts.to(device)].float()
    ey = embeddings[members.to(device)].float()
    close = ((ey - ex[:, None]).pow(2).sum(-1) / max(scale, 1e-30)).cpu() < distance
    group = inside & near & close
    group[:, width] = True  # the draft itself (offset 0), whatever the thresholds
    p_group = (p_members * group).sum(-1)
    q_group = (qs.gather(-1, members) * group).sum(-1)
    return p_group, q_group, group.sum(-1)


def verify(ctx: DecodeContext, p, drafts, qs, embeddings, scale) -> Verdict:
    """SJD's verdict with the group test in place of the draft's own."""
    m = len(drafts)
    c = ctx.config
    fresh = ctx.sample(p)
    p_group, q_group, _ = group_mass(p, qs, drafts, embeddings, scale, c.gsd_group, c.gsd_gap, c.gsd_distance)
    n_ok = first_rejection(speculative_accept(p_group, q_group, ctx.generator))
    replacement = None
    if n_ok < m:
        replacement = int(ctx.sample(residual_distribution(p[n_ok], qs[n_ok])))
    done = n_ok + (replacement is not None)
    return Verdict(n_ok, p_group / q_group, replacement, fresh[done:], p[done:])
