"""MuLo-SD: multi-scale local speculative decoding (Peruzzo et al., CVPR 2026).

One round per block of ``rows_per_block`` low-resolution rows:

1. draft the block's low-res rows with the drafter (sequentially, or ZipAR-parallel);
2. up-sample them to r x r high-res draft tokens (pixel or learned up-sampler);
3. verify the whole block with one causal target pass (re-encoding stale slots on the way);
4. accept token i iff its target probability pooled over the draft token and its k nearest
   codebook neighbours is >= tau (no drafter q, no coin: deterministic given p);
5. re-open the radius-l Chebyshev neighbourhood of every rejection, never before t0 (the first
   rejection), everything else is kept;
6. resample the re-opened set with the target: in raster order, one pass per token, each pass
   re-encoding the accepted run before it (v1), or as 8-connected islands in parallel, one
   token per island (or per island row with a ZipAR window) per pass, each query seeing only
   final tokens (v2);
7. commit, and down-sample the committed rows into the drafter's low-res prefix.

The token at t0 is sampled straight from the verification pass: its whole context is final.
"""

from __future__ import annotations

import numpy as np
import torch

from mulo import grid as G
from mulo.methods.common import DecodeContext
from mulo.methods.zipar import RowFill
from mulo.sampling import pooled_probability


def draft_rows(ctx: DecodeContext, drafter, y: torch.Tensor, rows: tuple[int, int]) -> None:
    """Fill low-res rows ``[a, b)`` of ``y`` with drafter samples."""
    cfg = ctx.config
    if cfg.drafting == "zipar":
        fill = RowFill(drafter, y, rows, cfg.draft_window, ctx.sample)
        while not fill.finished:
            fill.step()
        return
    width = drafter.grid[1]
    for u in range(rows[0] * width, rows[1] * width):
        if u == 0:
            logits = drafter.first_logits
        else:
            logits, _ = drafter.feed_through(y, u - 1)
            logits = logits[-1]
        y[u] = ctx.sample(drafter.probs(logits))


def ready_in_islands(unresolved: torch.Tensor, labels: torch.Tensor, width: int, window: int) -> list[int]:
    """Positions resampled in the next wave (flat raster indices).

    Window 0: each island advances in raster order, one position per wave, and a position waits
    for its input token u-1 to be final (the first token of an island row waits for the last
    token of the row above). Window s > 0 (ZipAR inside islands): u = (i, j) is ready once every
    unresolved position of its island before it lies in a row above at column >= j + s; a row's
    first token then starts before the row above is finished, on a proxy input (see
    ``proxy_inputs``), so an island of R rows takes about W + (R-1)s waves instead of R*W.
    """
    open_ = unresolved.numpy()
    cells = np.flatnonzero(open_)  # raster order
    island_of = labels.numpy()[cells]
    ready = []
    for island in np.unique(island_of):
        todo = cells[island_of == island]
        if window == 0:
            u = int(todo[0])
            if u == 0 or not open_[u - 1]:
                ready.append(u)
            continue
        above = np.inf  # smallest unresolved column in the island's rows above
        row_starts = todo[np.r_[True, np.diff(todo // width) > 0]]  # first unresolved per row
        for u in row_starts.tolist():
            col = u % width
            input_final = u == 0 or col == 0 or not open_[u - 1]  # col 0: proxy input
            if input_final and above >= col + window:
                ready.append(u)
            above = min(above, col)
    return sorted(ready)


def proxy_inputs(seq: torch.Tensor, inputs: torch.Tensor, unresolved: torch.Tensor, width: int) -> torch.Tensor:
    """The tokens fed at ``inputs``: the final token there, or, where it is still unresolved
    (the last slot of a row whose next row starts early), ZipAR's proxy: the latest final token
    of that row. The true token overwrites the proxy's K/V once it is resampled. The row always
    has a final token: its column 0 touches the next row's column 0, so it is in the same island,
    and ``ready_in_islands`` starts that next row only once the island's columns < window are final."""
    tokens = seq[inputs].clone()
    for q, v in enumerate(inputs.tolist()):
        if bool(unresolved[v]):
            start = v - v % width
            final_in_row = (~unresolved[start : v + 1]).nonzero()[:, 0]
            tokens[q] = seq[start + int(final_in_row[-1])]
    return tokens


def generate(ctx: DecodeContext):
    fam, cfg = ctx.family, ctx.config
    height, width = ctx.grid
    n_total = height * width
    r = cfg.r
    drafter_model = fam.drafters[r]
    low_h, low_w = drafter_model.cfg.grid_hw
    if (low_h * r, low_w * r) != (height, width):
        raise ValueError(f"the r={r} drafter grid {low_h}x{low_w} times {r} is not the target grid {height}x{width}")
    block_rows = cfg.resolved_rows_per_block(low_h)
    upsampler = fam.upsampler(cfg.upsampler, r)
    downsampler = fam.upsampler("pixel", r)
    neighbours = fam.neighbours(cfg.k).cpu()

    target = ctx.runner(fam.target, "target")
    target.exact = cfg.refresh
    drafter = ctx.runner(drafter_model, "drafter")
    with ctx.phase("verify"):
        target.prefill()
    with ctx.phase("drafter"):
        drafter.prefill()

    x = torch.full((n_total,), -1, dtype=torch.long)  # committed high-res tokens
    y = torch.full((low_h * low_w,), -1, dtype=torch.long)  # low-res prefix + drafts
    for a in range(0, low_h, block_rows):
        b = min(a + block_rows, low_h)
        lo, hi = a * r * width, b * r * width  # the block's high-res positions
        rnd = ctx.new_round(f"block {ctx.round_count}: low-res rows {a}-{b - 1}", x)

        with ctx.phase("drafter"):
            draft_rows(ctx, drafter, y, (a, b))
        low_draft = np.full(low_h * low_w, -1, dtype=np.int64)
        low_draft[a * low_w : b * low_w] = y[a * low_w : b * low_w].numpy()
        rnd.low_draft = low_draft.reshape(low_h, low_w)

        with ctx.phase("upsample"):
            draft = upsampler.upsample(y.view(low_h, low_w), x.view(height, width), (a, b)).reshape(-1).cpu()
        seq = x.clone()
        seq[lo:hi] = draft

        with ctx.phase("verify"):
            rows = [target.first_logits[None]] if lo == 0 else []
            if hi - 2 >= max(lo - 1, 0):
                logits, positions = target.feed_through(seq, hi - 2, include=torch.arange(max(lo - 1, 0), hi - 1))
                rows.append(logits[positions >= lo - 1])
            probs = target.probs(torch.cat(rows)).cpu()  # [hi - lo, V]
            target.stale_from = n_total
            pooled = pooled_probability(probs, draft, neighbours)
            rejected = torch.zeros(n_total, dtype=torch.bool)
            rejected[lo:hi] = pooled < cfg.tau

        rnd.draft.reshape(-1)[lo:hi] = draft.numpy()
        rnd.score.reshape(-1)[lo:hi] = pooled.numpy()
        rnd.accepted.reshape(-1)[lo:hi] = (~rejected[lo:hi]).numpy()
        rnd.rejected.reshape(-1)[:] = rejected.numpy()

        if bool(rejected.any()):
            t0 = int(rejected.nonzero()[0])
            in_block = torch.zeros(n_total, dtype=torch.bool)
            in_block[lo:hi] = True
            reopened = G.expand(rejected.view(height, width), cfg.radius, t0).reshape(-1) & in_block
            labels = G.islands(reopened.view(height, width)).reshape(-1)
            rnd.t0 = t0
            rnd.reopened.reshape(-1)[:] = reopened.numpy()
            rnd.islands.reshape(-1)[:] = labels.numpy()
            with ctx.phase("resample"):
                waves = resample(ctx, target, seq, probs[t0 - lo], t0, reopened, labels)
            rnd.resampled.reshape(-1)[:] = waves.numpy()
        x[lo:hi] = seq[lo:hi]
        yield ctx.close(rnd, x)

        if b < low_h:  # the drafter's next prefix: committed rows, down-sampled
            with ctx.phase("downsample"):
                committed = downsampler.downsample(x.view(height, width), (a, b)).reshape(-1).cpu()
            changed = (committed != y[a * low_w : b * low_w]).nonzero()
            if len(changed):
                drafter.stale_from = min(drafter.stale_from, a * low_w + int(changed[0]))
            y[a * low_w : b * low_w] = committed
    return x.reshape(height, width)


def resample(ctx: DecodeContext, target, seq, probs_t0, t0: int, reopened, labels) -> torch.Tensor:
    """Resample the re-opened positions of ``seq`` in place; returns the wave of each position
    (1 = sampled from the verification pass itself, 0 = not resampled)."""
    cfg = ctx.config
    n_total = len(seq)
    width = ctx.grid[1]
    waves = torch.zeros(n_total, dtype=torch.long)
    seq[t0] = ctx.sample(probs_t0)
    waves[t0] = 1
    unresolved = reopened.clone()
    unresolved[t0] = False
    if cfg.refresh:
        target.stale_from = t0 + 1  # every slot after t0 saw a rejected draft
    if cfg.resampling == "raster":
        for u in unresolved.nonzero()[:, 0].tolist():
            logits, _ = target.feed_through(seq, u - 1)
            seq[u] = ctx.sample(target.probs(logits[-1]))
            waves[u] = waves.max() + 1
        return waves
    wave = 1
    while bool(unresolved.any()):
        wave += 1
        ready = torch.tensor(ready_in_islands(unresolved, labels, width, cfg.island_window))
        final = ~unresolved
        inputs = ready - 1
        # A token resampled in an earlier wave is written into the cache when it is fed as the
        # next position's input; where that position is kept (an island row's last token), its
        # slot still holds the rejected draft's K/V, so write it now, in the same pass.
        limit = int(inputs.max())
        unwritten = (target.fed[:limit] != seq[:limit]) & final[:limit]
        unwritten[inputs[inputs < limit]] = False
        rewrite = unwritten.nonzero()[:, 0]
        positions = torch.cat([rewrite, inputs])
        fed = torch.cat([seq[rewrite], proxy_inputs(seq, inputs, unresolved, width)])
        logits = target.feed(positions, fed, target.final_mask(positions, final))[-len(inputs) :]
        seq[ready] = ctx.sample(target.probs(logits))
        unresolved[ready] = False
        waves[ready] = wave
    return waves
