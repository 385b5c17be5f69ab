"""MuLo-SD: multi-scale local speculative decoding (Peruzzo et al., CVPR 2026).

One round per block of ``rows_per_block`` low-resolution rows, in the paper's steps (each a
function below, in this order):

1. ``draft``: the drafter samples the block's low-res rows (sequentially, or ZipAR-parallel);
2. ``upsample``: each low-res token becomes r x r high-res draft tokens (pixel or learned);
3. ``verify``: one causal target pass over the block (re-encoding stale slots on the way); a
   draft token is accepted iff its target probability pooled over it and its k nearest
   codebook neighbours is >= tau (no drafter q, no coin: deterministic given p);
4. ``reject_and_expand``: re-open the radius-l Chebyshev neighbourhood of every rejection, never
   before t0 (the first rejection); everything else is kept;
5. ``resample_reopened``: the target resamples the re-opened set: in raster order, one pass per
   token (v1), or as 8-connected islands in parallel, one token per island (or per island row
   with a ZipAR window) per pass, each query seeing only final tokens (v2). With ``refresh``
   (the default) the K/V of those tokens are exact too: accepted drafts after t0, whose K/V the
   verification computed while rejected drafts were visible, are re-encoded over final tokens
   in the first resampling pass that reaches them (same passes, wider); without it they keep
   their stale K/V (the ablation);
6. ``commit``: the block's tokens are final;
7. ``downsample``: the committed rows become the drafter's low-res prefix.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mulo import grid as G
from mulo.methods.common import DecodeContext
from mulo.methods.zipar import RowFill, proxy_inputs
from mulo.runner import ModelRunner
from mulo.sampling import pooled_probability
from mulo.trace import Round


@dataclass
class Block:
    """One round's rows: low-res rows ``[a, b)`` = high-res positions ``[lo, hi)``."""

    a: int
    b: int
    lo: int
    hi: int


@dataclass
class MuloRun:
    """What the steps of one MuLo-SD generation share."""

    ctx: DecodeContext
    target: ModelRunner
    drafter: ModelRunner
    upsampler: object  # the up-sampler the request picked (pixel or learned)
    downsampler: object  # always the pixel one: committed tokens -> the drafter's prefix
    neighbours: torch.Tensor  # [V, k] pooled with each draft token
    x: torch.Tensor  # committed high-res tokens, flat, -1 = not yet
    y: torch.Tensor  # the drafter's low-res sequence: committed rows down-sampled, then drafts

    @property
    def high(self) -> tuple[int, int]:
        return self.ctx.grid

    @property
    def low(self) -> tuple[int, int]:
        return self.drafter.grid

    def blocks(self):
        low_h, width, r = self.low[0], self.high[1], self.ctx.config.r
        step = self.ctx.config.resolved_rows_per_block(low_h)
        for a in range(0, low_h, step):
            b = min(a + step, low_h)
            yield Block(a, b, a * r * width, b * r * width)


def start(ctx: DecodeContext) -> MuloRun:
    """Check the drafter's geometry, bind the runners and prefill both."""
    fam, knobs = ctx.family, ctx.config
    height, width = ctx.grid
    r = knobs.r
    drafter_model = fam.drafters[r]
    low_h, low_w = drafter_model.config.grid_hw
    if (low_h * r, low_w * r) != (height, width):
        raise ValueError(f"the r={r} drafter grid {low_h}x{low_w} times {r} is not the target grid {height}x{width}")
    run = MuloRun(
        ctx,
        target=ctx.runner(fam.target, "target", refresh=knobs.refresh),
        drafter=ctx.runner(drafter_model, "drafter"),
        upsampler=fam.upsampler(knobs.upsampler, r),
        downsampler=fam.upsampler("pixel", r),
        neighbours=fam.neighbours(knobs.k).cpu(),
        x=torch.full((height * width,), -1, dtype=torch.long),
        y=torch.full((low_h * low_w,), -1, dtype=torch.long),
    )
    with ctx.phase("verify"):
        run.target.prefill()
    with ctx.phase("drafter"):
        run.drafter.prefill()
    return run


def generate(ctx: DecodeContext):
    run = start(ctx)
    for block in run.blocks():
        rnd = ctx.new_round(f"block {ctx.round_count}: low-res rows {block.a}-{block.b - 1}", run.x)
        draft(run, block, rnd)
        seq = upsample(run, block)
        probs, rejected = verify(run, block, seq, rnd)
        reopened, labels, t0 = reject_and_expand(run, block, rejected, rnd)
        if t0 is not None:
            resample_reopened(run, seq, probs[t0 - block.lo], t0, reopened, labels, rnd)
        commit(run, block, seq)
        yield ctx.close(rnd, run.x)
        if block.b < run.low[0]:
            downsample(run, block)
    return run.x.reshape(run.high)


# -- the steps of one round -------------------------------------------------------------------
def draft(run: MuloRun, block: Block, rnd: Round) -> None:
    """Step 1: fill the block's low-res rows of ``y`` with drafter samples."""
    ctx, drafter, y = run.ctx, run.drafter, run.y
    low_h, low_w = run.low
    with ctx.phase("drafter"):
        if ctx.config.drafting == "zipar":
            fill = RowFill(drafter, y, (block.a, block.b), ctx.config.draft_window, ctx.sample)
            while not fill.finished:
                fill.step()
        else:
            for u in range(block.a * low_w, block.b * low_w):
                y[u] = ctx.sample_next(drafter, y, u)
    low_draft = np.full(low_h * low_w, -1, dtype=np.int64)
    low_draft[block.a * low_w : block.b * low_w] = y[block.a * low_w : block.b * low_w].numpy()
    rnd.low_draft = low_draft.reshape(low_h, low_w)


def upsample(run: MuloRun, block: Block) -> torch.Tensor:
    """Step 2: the high-res sequence to verify: committed tokens, then the block's up-sampled
    drafts (r x r per low-res token)."""
    with run.ctx.phase("upsample"):
        drafts = run.upsampler.upsample(run.y.view(run.low), run.x.view(run.high), (block.a, block.b))
    seq = run.x.clone()
    seq[block.lo : block.hi] = drafts.reshape(-1).cpu()
    return seq


def verify(run: MuloRun, block: Block, seq: torch.Tensor, rnd: Round) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 3: one causal target pass over the block (re-encoding stale slots on the way); a
    draft token is rejected when its target probability pooled over its k nearest codebook
    neighbours is below tau. Returns the block's distributions and the rejected positions."""
    lo, hi = block.lo, block.hi
    drafts = seq[lo:hi]
    with run.ctx.phase("verify"):
        probs = run.target.span_probs(seq, lo, hi)  # [hi - lo, V]
        pooled = pooled_probability(probs, drafts, run.neighbours)
        rejected = torch.zeros(len(seq), dtype=torch.bool)
        rejected[lo:hi] = pooled < run.ctx.config.tau
    rnd.draft.reshape(-1)[lo:hi] = drafts.numpy()
    rnd.score.reshape(-1)[lo:hi] = pooled.numpy()
    rnd.accepted.reshape(-1)[lo:hi] = (~rejected[lo:hi]).numpy()
    rnd.rejected.reshape(-1)[:] = rejected.numpy()
    return probs, rejected


def reject_and_expand(run: MuloRun, block: Block, rejected: torch.Tensor, rnd: Round):
    """Step 4: re-open the radius-l square around every rejection, never before t0 (the first
    rejection) nor outside the block, and label its 8-connected islands. Returns
    ``(reopened, labels, t0)``; t0 is None when every draft token was accepted."""
    if not bool(rejected.any()):
        return None, None, None
    t0 = int(rejected.nonzero()[0])
    in_block = torch.zeros(len(rejected), dtype=torch.bool)
    in_block[block.lo : block.hi] = True
    reopened = G.expand(rejected.view(run.high), run.ctx.config.radius, t0).reshape(-1) & in_block
    labels = G.islands(reopened.view(run.high)).reshape(-1)
    rnd.t0 = t0
    rnd.reopened.reshape(-1)[:] = reopened.numpy()
    rnd.islands.reshape(-1)[:] = labels.numpy()
    return reopened, labels, t0


def resample_reopened(run: MuloRun, seq, probs_t0, t0: int, reopened, labels, rnd: Round) -> None:
    """Step 5: resample the re-opened positions of ``seq`` in place (raster order or islands, by
    ``resampling``), recording each one's wave."""
    with run.ctx.phase("resample"):
        waves = resample(run.ctx, run.target, seq, probs_t0, t0, reopened, labels)
    rnd.resampled.reshape(-1)[:] = waves.numpy()


def commit(run: MuloRun, block: Block, seq: torch.Tensor) -> None:
    """Step 6: the block's tokens are final."""
    run.x[block.lo : block.hi] = seq[block.lo : block.hi]


def downsample(run: MuloRun, block: Block) -> None:
    """Step 7: the committed rows, down-sampled, become the drafter's prefix; where they differ
    from its drafts, the drafter's K/V after the first difference are stale."""
    low_w = run.low[1]
    span = slice(block.a * low_w, block.b * low_w)
    with run.ctx.phase("downsample"):
        committed = run.downsampler.downsample(run.x.view(run.high), (block.a, block.b)).reshape(-1).cpu()
    changed = (committed != run.y[span]).nonzero()
    if len(changed):
        run.drafter.mark_stale(span.start + int(changed[0]))
    run.y[span] = committed


# -- resampling the re-opened set -------------------------------------------------------------
def ready_in_islands(unresolved: torch.Tensor, labels: torch.Tensor, width: int, window: int) -> list[int]:
    """Positions resampled in the next wave (flat raster indices).

    Window 0: each island advances in raster order, one position per wave, and a position waits
    for its input token u-1 to be final (the first token of an island row waits for the last
    token of the row above). Window s > 0 (ZipAR inside islands): u = (i, j) is ready once every
    unresolved position of its island before it lies in a row above at column >= j + s; a row's
    first token then starts before the row above is finished, on a proxy input (see
    ``proxy_inputs``), so an island of R rows takes about W + (R-1)s waves instead of R*W. As in
    ZipAR, whose schedule the targets train under, the grid's second row waits for the first.
    """
    open_ = unresolved.numpy()
    cells = np.flatnonzero(open_)  # raster order
    island_of = labels.numpy()[cells]
    first_row_open = bool(open_[:width].any())  # ZipAR's second row waits for the first to finish
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
            waits_for_first_row = u // width == 1 and first_row_open
            if input_final and not waits_for_first_row and above >= col + window:
                ready.append(u)
            above = min(above, col)
    return sorted(ready)


def resample(ctx: DecodeContext, target, seq, probs_t0, t0: int, reopened, labels) -> torch.Tensor:
    """Resample the re-opened positions of ``seq`` in place; returns the wave of each position
    (1 = sampled from the verification pass itself, 0 = not resampled).

    The token at t0 comes from the verification pass: its whole context is final. Raster (v1):
    one causal pass per token, each re-encoding the accepted run before it. Islands (v2): one
    pass per wave, each island advancing one token (or one per island row with a ZipAR window),
    every query seeing only final tokens. Either way, with ``refresh`` no query reads K/V
    computed over a rejected draft (``ModelRunner.feed_over_final``)."""
    knobs = ctx.config
    width = ctx.grid[1]
    waves = torch.zeros(len(seq), dtype=torch.long)
    seq[t0] = ctx.sample(probs_t0)
    waves[t0] = 1
    unresolved = reopened.clone()
    unresolved[t0] = False
    if knobs.refresh:
        target.mark_stale(t0 + 1)  # every slot after t0 saw a rejected draft
    if knobs.resampling == "raster":
        for u in unresolved.nonzero()[:, 0].tolist():
            seq[u] = ctx.sample_next(target, seq, u)
            waves[u] = waves.max() + 1
        return waves
    wave = 1
    proxied = torch.zeros(len(seq), dtype=torch.bool)  # slots holding ZipAR's proxy for their token
    while bool(unresolved.any()):
        wave += 1
        ready = torch.tensor(ready_in_islands(unresolved, labels, width, knobs.island_window))
        final = ~unresolved
        inputs = ready - 1
        logits = target.feed_over_final(inputs, proxy_inputs(seq, inputs, final, width), seq, final, proxied)
        proxied[inputs[~final[inputs]]] = True
        seq[ready] = ctx.sample(target.probs(logits))
        unresolved[ready] = False
        proxied &= unresolved  # a sampled token replaces its proxy before any query sees the slot
        waves[ready] = wave
    return waves
