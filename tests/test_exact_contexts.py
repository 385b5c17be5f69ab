"""MuLo-SD's resampling queries against a cache-free recomputation of what each should see.

With ``refresh`` on, a query that resamples position ``u`` sees the condition and the final
tokens before ``u`` (and, with an island window, ZipAR's row-end proxies), and every slot it
sees carries K/V computed over final tokens only, never over a rejected draft. The reference
below rebuilds that from the trace alone (t0, the re-opened set, the wave of each position, the
final tokens) and the rules the docstrings state, then runs the target *without a cache*:

* raster (v1): one causal pass over the final image; row ``u - 1`` predicts ``u``;
* islands (v2): every write is an event (position, token, pass). The accepted prefix before t0
  is written causally by the verification. In the pass of wave ``w`` (w >= 2; wave 1 is t0,
  sampled from the verification) the inputs ``u - 1`` of the positions sampled in that wave are
  written, plus every final slot before the last input that does not yet hold its final token
  seen over final tokens (an accepted draft last written by the verification, a slot never
  written, a slot holding a proxy). An event sees the condition, itself and, for each position
  before it that is final (or proxied) at that wave, the latest event there.
  All events go through the model in one forward pass, with that mask: no cache.

With ``refresh`` off (the stale-K/V ablation) the same comparison must fail: that is what
makes this test able to fail at all.

A target that reads the row above (``GPTConfig.neighbour_inputs``) is checked the same way: each
event reads its row above from the final tokens of its pass (the verification's from the accepted
prefix), and a final slot last written reading another row above than the final tokens now give
is written again, like a slot holding another token.
"""

from __future__ import annotations

import pytest
import torch

from mulo.runner import ModelRunner
from mulo.sampling import cfg_combine

CASES = {
    "raster": dict(resampling="raster"),
    "islands": dict(resampling="islands"),
    # one island over most of the grid: rows start early, on ZipAR's proxies (the row-above toy's
    # seed 3 leaves no stale K/V where a query looks, so its ablation could not fail: seed 4)
    "island-zipar": dict(resampling="islands", island_window=2, radius=1, tau=0.0003, seed=3, row_above_seed=4),
}
# One round over the whole 8x8 grid (4 low-res rows) with kept and re-opened drafts after t0.
ROUND = dict(rows_per_block=4, tau=0.001, radius=0, seed=1)


def record_queries(engine, monkeypatch, knobs):
    """Run MuLo-SD; returns the result and the target's resampling queries ``{u: logits}``."""
    queries, target = {}, engine.family.target
    over_final, next_logits = ModelRunner.feed_over_final, ModelRunner.next_logits

    def spy_over_final(self, inputs, tokens, seq, final, proxied):
        logits = over_final(self, inputs, tokens, seq, final, proxied)
        if self.model is target:
            queries.update({int(u) + 1: row for u, row in zip(inputs, logits, strict=True)})
            spy_over_final.runner = self
        return logits

    def spy_next(self, seq, u):
        logits = next_logits(self, seq, u)
        if self.model is target:
            queries[u] = logits
            spy_over_final.runner = self
        return logits

    monkeypatch.setattr(ModelRunner, "feed_over_final", spy_over_final)
    monkeypatch.setattr(ModelRunner, "next_logits", spy_next)
    knobs = {**ROUND, **knobs}
    seed, row_above_seed = knobs.pop("seed"), knobs.pop("row_above_seed", None)
    if row_above_seed is not None and target.neighbour_embeddings is not None:
        seed = row_above_seed
    result = engine.generate("red apple", "mulo", seed, knobs)
    return result, queries, spy_over_final.runner


def guided(model, runner, embeddings, positions, mask) -> torch.Tensor:
    """Guided logits of a cache-free pass over ``embeddings`` (condition first) at ``positions``."""
    x = torch.cat([runner.cond_embeddings, embeddings.expand(runner.cond_embeddings.shape[0], -1, -1)], dim=1)
    with torch.no_grad():
        logits = model.output(model.forward_hidden(x, positions, mask)).float()
    return logits[0] if logits.shape[0] == 1 else cfg_combine(logits[0], logits[1], runner.guidance)


@pytest.fixture(scope="module", params=[0, 3], ids=["plain", "row-above"])
def engine(request):
    from mulo.engine import Engine
    from mulo.families import toy

    return Engine(toy.build(neighbour_inputs=request.param))


def row_above(model, view: torch.Tensor, position: int):
    """The row-above ids the input at ``position`` reads in ``view`` (None: a plain model)."""
    ids = model.neighbours_of(view, torch.tensor([position + 1]))
    return None if ids is None else tuple(ids[0].tolist())


def raster_reference(model, runner, final_tokens) -> dict[int, torch.Tensor]:
    n_cond, n = runner.n_cond, len(final_tokens)
    emb = model.embed_tokens(final_tokens[: n - 1], model.neighbours_of(final_tokens, torch.arange(1, n)))[None]
    logits = guided(model, runner, emb, torch.arange(n_cond + n - 1), None)
    return {u: logits[n_cond - 1 + u] for u in range(1, n)}


def island_events(model, rnd, final_tokens, width: int):
    """The writes of one round's island resampling, from the trace: ``[(pos, token, pass,
    visible positions, row-above ids)]`` in order, and ``{u: index of the event that predicts u}``."""
    n = len(final_tokens)
    waves = torch.from_numpy(rnd.resampled).reshape(-1)
    reopened = torch.from_numpy(rnd.reopened).reshape(-1).bool()
    t0 = rnd.t0
    above = [row_above(model, final_tokens, v) for v in range(t0)]  # the accepted prefix's
    events = [(v, int(final_tokens[v]), 0, list(range(v)), above[v]) for v in range(t0)]  # the verification
    holds = {v: (int(final_tokens[v]), "final", above[v]) for v in range(t0)}
    holds.update({v: (None, "stale", None) for v in range(t0, n - 1)})  # written while drafts were visible
    proxied: set[int] = set()
    predicts = {}
    for w in range(2, int(waves.max()) + 1):
        final = ~reopened | ((waves >= 1) & (waves < w))
        queries = (waves == w).nonzero()[:, 0].tolist()
        inputs = [u - 1 for u in queries]
        proxied = {v for v in proxied if not final[v]}
        view = torch.where(final, final_tokens, -1)  # the row above as this pass has it
        seen = final.clone()
        seen[list(proxied)] = True
        writes = {}
        for v in inputs:
            if final[v]:
                writes[v] = int(final_tokens[v])
            else:  # ZipAR's proxy: the latest final token of the same row
                row = range(v - v % width, v + 1)
                writes[v] = int(final_tokens[max(x for x in row if final[x])])
                proxied.add(v)
        for v in range(max(inputs)):
            if final[v] and v not in writes and holds[v] != (int(final_tokens[v]), "final", row_above(model, view, v)):
                writes[v] = int(final_tokens[v])
        for v in sorted(writes):
            events.append((v, writes[v], w, [x for x in range(v) if seen[x]], row_above(model, view, v)))
            holds[v] = (writes[v], "final" if final[v] else "proxy", row_above(model, view, v))
        start = len(events) - len(writes)
        for k in range(start, len(events)):
            if events[k][0] in inputs:
                predicts[events[k][0] + 1] = k
    return events, predicts


def island_reference(model, runner, rnd, final_tokens, width: int) -> dict[int, torch.Tensor]:
    events, predicts = island_events(model, rnd, final_tokens, width)
    n_cond, m = runner.n_cond, len(events)
    mask = torch.zeros(n_cond + m, n_cond + m, dtype=torch.bool)
    mask[:, :n_cond] = True
    mask[:n_cond, :n_cond] = torch.ones(n_cond, n_cond, dtype=torch.bool).tril()
    latest: dict[int, int] = {}  # position -> its latest event, as of the pass being built
    for wave in sorted({e[2] for e in events}):
        members = [k for k, e in enumerate(events) if e[2] == wave]
        latest.update({events[k][0]: k for k in members})  # a pass sees its own writes
        for k in members:
            mask[n_cond + k, n_cond + k] = True
            for x in events[k][3]:
                assert x in latest, f"position {x} is seen before anything was written there"
                mask[n_cond + k, n_cond + latest[x]] = True
    above = None if events[0][4] is None else torch.tensor([e[4] for e in events])
    emb = model.embed_tokens(torch.tensor([e[1] for e in events]), above)[None]
    positions = torch.cat([torch.arange(n_cond), n_cond + torch.tensor([e[0] for e in events])])
    logits = guided(model, runner, emb, positions, mask)
    return {u: logits[n_cond + k] for u, k in predicts.items()}


def compare(engine, monkeypatch, case: str, refresh: bool) -> float:
    """Largest absolute logit difference over every resampling query of the round."""
    knobs = dict(CASES[case], refresh=refresh)
    result, queries, runner = record_queries(engine, monkeypatch, knobs)
    (rnd,) = result.trace.rounds
    final_tokens = result.tokens.reshape(-1)
    kept_after_t0 = (rnd.accepted & ~rnd.reopened.astype(bool)).reshape(-1)[rnd.t0 + 1 :].sum()
    assert len(result.trace.rounds) == 1 and kept_after_t0 >= 5, "the round must keep drafts after t0"
    model, width = engine.family.target, result.trace.grid[1]
    if CASES[case]["resampling"] == "raster":
        expected = raster_reference(model, runner, final_tokens)
    else:
        expected = island_reference(model, runner, rnd, final_tokens, width)
        events, _ = island_events(model, rnd, final_tokens, width)
        proxies = sum(wave > 0 and token != int(final_tokens[pos]) for pos, token, wave, *_ in events)
        assert (proxies > 0) == ("island_window" in knobs)
    assert set(queries) <= set(expected)
    assert len(queries) == int((rnd.resampled > 1).sum())  # every query after t0 was recorded
    return max(float((queries[u] - expected[u]).abs().max()) for u in queries)


@pytest.mark.parametrize("case", list(CASES))
def test_every_resampling_query_equals_a_cache_free_pass_over_what_it_should_see(engine, monkeypatch, case):
    assert compare(engine, monkeypatch, case, refresh=True) < 1e-4


@pytest.mark.parametrize("case", list(CASES))
def test_without_refresh_the_queries_read_stale_k_v(engine, monkeypatch, case):
    """The ablation differs from the exact contexts, so the comparison above can fail."""
    assert compare(engine, monkeypatch, case, refresh=False) > 1e-3
