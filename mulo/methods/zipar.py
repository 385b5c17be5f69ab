"""ZipAR parallel decoding (He et al. 2024): rows advance together, one token per active row
per forward pass.

Row ``i`` may produce its next token once row ``i-1`` is at least ``window`` tokens ahead (or
complete), so token (i, j) is produced in the same pass as (i-1, j+window) and sees the row
above up to column j+window-1. As in the reference code, row 1 waits for row 0 to finish. The
first token of a row needs the last token of the row above as input; while that one does not
exist yet, the row above's latest token is fed at its slot as a proxy, and the true token
overwrites the proxy's K/V in the pass after it is sampled. Slots are raster-indexed and each
query sees the written slots before its own. Forward passes for an H x W grid with
window < W: W + (H-2)*window + W.
"""

from __future__ import annotations

from functools import cache

import torch

from mulo.methods.common import DecodeContext


def ready_rows(done: list[int], rows: range, width: int, window: int) -> list[int]:
    """Rows (within ``rows``) that produce a token in the next pass."""
    ready = []
    for i in rows:
        if done[i] >= width:
            continue
        if i == 0 or done[i - 1] >= width or (i > 1 and done[i - 1] >= done[i] + window):
            ready.append(i)
    return ready


def passes(height: int, width: int, window: int) -> torch.Tensor:
    """``[height * width]``: the pass in which ZipAR with ``window`` samples each (raster-indexed)
    token of a whole grid, 0 for the first."""
    done, order, step = [0] * height, torch.empty(height * width, dtype=torch.long), 0
    while min(done) < width:
        for i in ready_rows(done, range(height), width, window):
            order[i * width + done[i]] = step
            done[i] += 1
        step += 1
    return order


def training_mask(cond_len: int, height: int, width: int, window: int) -> torch.Tensor:
    """The ``[S, S]`` attention mask of a teacher-forced pass (``GPT.forward``: ``cond_len``
    condition slots, then the grid's tokens but the last) under which the query predicting token
    ``u`` sees exactly the slots ZipAR with ``window`` has written when it samples ``u``: the
    condition, and each earlier token's slot from the pass after that token was sampled (the row
    above only up to ``window`` columns ahead), or, for a row's last token, from the pass that
    started the next row (its proxy). A target trained on a share of such passes keeps its
    quality when rows are decoded in parallel. What the slots hold comes from
    ``training_inputs``."""
    n = height * width
    order = passes(height, width, window)
    written_from = order[: n - 1] + 1
    row_ends = torch.arange(width - 1, n - 1, width)
    written_from[row_ends] = torch.minimum(written_from[row_ends], order[row_ends + 1])
    mask = torch.ones(cond_len + n - 1, cond_len + n - 1, dtype=torch.bool).tril()
    mask[cond_len - 1 :, cond_len:] = (written_from[None, :] <= order[:, None]).tril(-1)
    return mask


@cache  # training asks every step; the schedule is a Python loop over the grid
def proxy_slots(height: int, width: int, window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(slots, sources)`` (shared: read only): the raster positions of the row ends that ZipAR
    with ``window`` first feeds with a proxy, and the position of the token each proxy copies
    (the latest token of that row sampled before the pass that starts the next row). Empty when
    rows never start early (``window >= width``)."""
    order = passes(height, width, window).view(height, width)
    rows = [i for i in range(1, height - 1) if order[i, -1] >= order[i + 1, 0]]
    slots = [i * width + width - 1 for i in rows]
    sources = [i * width + int((order[i] < order[i + 1, 0]).nonzero()[-1]) for i in rows]
    return torch.tensor(slots, dtype=torch.long), torch.tensor(sources, dtype=torch.long)


def proxied_targets(height: int, width: int, window: int) -> torch.Tensor:
    """Raster positions of the tokens ZipAR with ``window`` predicts from a proxy input: the first
    token of each row that starts before the row above is finished."""
    return proxy_slots(height, width, window)[0] + 1


def training_inputs(inputs: torch.Tensor, height: int, width: int, window: int) -> torch.Tensor:
    """Teacher-forced inputs ``[B, height*width - 1]`` (token ``k`` at slot ``k``) with ZipAR's
    proxies in place of the true row ends, for a pass under ``training_mask`` with ``window``.

    In decoding, the first token of each row is predicted from the proxy (measured on the
    32x32 target trained on true row ends: its cross-entropy rose from 0.11 to 1.66 nats, and
    ZipAR's images left their prompts). One teacher-forced slot holds one content, so queries
    that run while a proxy is in place get exactly what decoding gives them; queries after the
    true row end is re-fed see the proxy here and the truth in decoding, where the slots fed
    meanwhile still carry K/V computed from the proxy."""
    slots, sources = proxy_slots(height, width, window)
    fed = inputs.clone()
    fed[:, slots] = inputs[:, sources]
    return fed


def proxy_inputs(seq: torch.Tensor, inputs: torch.Tensor, final: torch.Tensor, width: int) -> torch.Tensor:
    """The tokens fed at ``inputs`` (flat positions): ``seq`` there where it is ``final``, else
    ZipAR's proxy, the latest final token of the same row. This happens at the last slot of a row
    whose next row started early; the true token overwrites the proxy's K/V once it exists.
    Callers start a row early only once the row above has a final token (ZipAR's window)."""
    tokens = seq[inputs].clone()
    for q, v in enumerate(inputs.tolist()):
        if not bool(final[v]):
            start = v - v % width
            final_in_row = final[start : v + 1].nonzero()[:, 0]
            tokens[q] = seq[start + int(final_in_row[-1])]
    return tokens


class RowFill:
    """Generates grid rows ``[a, b)`` of ``seq`` (flat, -1 = unknown) in ZipAR order, one pass
    per ``step()``. Rows above ``a`` must be complete. Each pass also re-feeds slots that are out
    of date (replaced proxies, or a prefix marked stale), so one pass refreshes and advances."""

    def __init__(self, runner, seq: torch.Tensor, rows: tuple[int, int], window: int, draw):
        self.runner, self.seq, self.window, self.draw = runner, seq, window, draw
        self.height, self.width = runner.grid
        self.rows = range(*rows)
        self.done = [self.width if i < rows[0] else 0 for i in range(self.height)]

    @property
    def finished(self) -> bool:
        return all(self.done[i] >= self.width for i in self.rows)

    def step(self) -> torch.Tensor:
        """One pass; returns the positions it produced (position 0 comes free from the prefill)."""
        runner, seq, width = self.runner, self.seq, self.width
        rows = ready_rows(self.done, self.rows, width, self.window)
        targets = torch.tensor([i * width + self.done[i] for i in rows])
        logits = torch.empty(len(targets), runner.vocab_size)
        first = targets == 0
        if bool(first.any()):
            logits[first] = runner.first_logits.cpu()
        inputs = targets[~first] - 1
        if len(inputs):
            tokens = proxy_inputs(seq, inputs, seq >= 0, width)
            logits[~first] = runner.feed_refreshing(inputs, tokens, seq).cpu()
        seq[targets] = self.draw(runner.probs(logits))
        for i in rows:
            self.done[i] += 1
        return targets


def generate(ctx: DecodeContext):
    height, width = ctx.grid
    target = ctx.runner(ctx.family.target, "target")
    x = torch.full((height * width,), -1, dtype=torch.long)
    with ctx.phase("target"):
        target.prefill()
    fill = RowFill(target, x, (0, height), ctx.config.zipar_window, ctx.sample)
    while not fill.finished:
        rnd = ctx.new_round(f"pass {target.nfe}", x)
        with ctx.phase("target"):
            fill.step()
        yield ctx.close(rnd, x)
    return x.reshape(height, width)
