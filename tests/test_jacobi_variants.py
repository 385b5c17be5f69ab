"""SJD's variants on the toy family and crafted inputs: MC-SJD (coupled drafts, lossless; its χ² test
is in tests/test_lossless.py) and GSD (grouped acceptance, lossy)."""

import json

import numpy as np
import pytest
import torch

from mulo.methods import gsd
from mulo.tracefile import TraceError, parse

GREEDY = dict(temperature=0.0)


def tokens(engine, method, seed=0, **knobs):
    return engine.generate("red apple", method, seed, knobs)


@pytest.mark.parametrize("method", ["mc-sjd", "gsd"])
@pytest.mark.parametrize("window", [1, 4, 16])
def test_greedy_variants_equal_greedy_ar(engine, method, window):
    """Greedy MC-SJD is lossless; greedy GSD too, as its group never lends a non-arg-max draft the
    arg-max's mass (p is one-hot and the probability gap is below 1)."""
    ar = tokens(engine, "ar", **GREEDY).tokens
    assert torch.equal(tokens(engine, method, sjd_window=window, **GREEDY).tokens, ar)


def test_gsd_with_a_group_of_one_is_sjd_token_for_token(engine):
    """With ``gsd_group`` 0 the group is the draft alone, the test SJD's: the same seed draws the
    same tokens, rounds and scores (a sampled run, where the two could part)."""
    for seed in (0, 3):
        sjd, gsd_run = tokens(engine, "sjd", seed), tokens(engine, "gsd", seed, gsd_group=0)
        assert torch.equal(sjd.tokens, gsd_run.tokens)
        assert len(sjd.trace.rounds) == len(gsd_run.trace.rounds)
        for a, b in zip(sjd.trace.rounds, gsd_run.trace.rounds, strict=True):
            assert np.array_equal(a.draft, b.draft) and np.array_equal(a.accepted, b.accepted)
            np.testing.assert_allclose(a.score, b.score)


def test_gsd_group_mass_by_hand():
    """Five codes; the draft is code 2 (p 0.2), its neighbours in p's ranking codes 1 and 3 (reach 1),
    both within the gap; code 3's embedding is far from code 2's, so the group is {1, 2}."""
    p = torch.tensor([[0.3, 0.25, 0.2, 0.15, 0.1]])
    q = torch.tensor([[0.1, 0.1, 0.5, 0.2, 0.1]])
    embeddings = torch.tensor([[0.0, 0.0], [1.0, 0.0], [1.1, 0.0], [9.0, 0.0], [0.0, 5.0]])
    scale = gsd.mean_pair_distance(embeddings)
    brute = torch.cdist(embeddings, embeddings).pow(2)
    assert scale == pytest.approx(float(brute.sum() / (5 * 4)), rel=1e-5)
    drafts = torch.tensor([2])
    p_group, q_group, size = gsd.group_mass(p, q, drafts, embeddings, scale, 1, 0.15, 0.5)
    assert size.tolist() == [2]
    assert p_group.item() == pytest.approx(0.45) and q_group.item() == pytest.approx(0.6)
    # a narrower gap leaves the draft alone: SJD's p(x) and q(x)
    p_alone, q_alone, size = gsd.group_mass(p, q, drafts, embeddings, scale, 1, 0.01, 0.5)
    assert size.tolist() == [1] and p_alone.item() == pytest.approx(0.2) and q_alone.item() == pytest.approx(0.5)
    # no embedding threshold to speak of: codes 1 and 3 both join; reach 2 adds code 0 (gap 0.1) and 4
    _, _, size = gsd.group_mass(p, q, drafts, embeddings, scale, 1, 0.15, 4.0)
    assert size.tolist() == [3]
    _, _, size = gsd.group_mass(p, q, drafts, embeddings, scale, 2, 0.15, 4.0)
    assert size.tolist() == [5]


@pytest.mark.parametrize("width", [1, 3, 7, 12])
def test_gsd_rank_neighbours_match_a_full_stable_sort(width):
    """GSD finds each draft's neighbours in p's ranking with two top-k's instead of sorting the
    vocabulary; they must be the codes a stable descending sort puts within ``width`` places,
    ties (the zeros of a truncated distribution, repeated values) broken by the lower code first,
    and places past either end of the ranking must not exist (a window wider than V)."""
    gen = torch.Generator().manual_seed(width)
    v = 9
    p = torch.rand(40, v, generator=gen)
    p[p < 0.3] = 0.0  # ties at zero, as top-p leaves them
    p[:, 4] = p[:, 6]  # ties elsewhere
    p = p / p.sum(-1, keepdim=True).clamp(min=1e-9)
    drafts = torch.randint(v, (40,), generator=gen)
    codes, exists = gsd.rank_neighbours(p, drafts, width)
    order = torch.sort(p, dim=-1, descending=True, stable=True).indices
    for row in range(40):
        rank = order[row].tolist().index(int(drafts[row]))
        for offset in range(-width, width + 1):
            place = rank + offset
            assert bool(exists[row, offset + width]) == (0 <= place < v), (row, offset)
            if 0 <= place < v:
                assert int(codes[row, offset + width]) == int(order[row, place]), (row, offset)


def test_a_wider_gsd_group_accepts_more(engine):
    """The group only adds p and q mass of tokens near the draft, so on the toy target (spread out,
    nothing near one-hot) a wide group passes drafts SJD's test does not: acceptance rises with the
    reach, summed over a few seeds."""
    wide = dict(gsd_group=16, gsd_gap=0.5, gsd_distance=4.0, cfg=1.0)

    def accepted(**knobs):
        return sum(tokens(engine, "gsd", seed, **knobs).trace.summary()["accepted"] for seed in range(4))

    assert accepted(**wide) > accepted(**dict(wide, gsd_group=0))


def test_mc_sjd_trace_records_what_stayed_coupled(engine, tmp_path):
    """Each MC-SJD round marks the drafts after its commit that the coupling kept; the next
    iteration proposes exactly those tokens there. The trace round-trips the mask, the schema
    refuses a mask that is not 0/1, and SJD's rounds carry none."""
    trace = tokens(engine, "mc-sjd", 2, cfg=1.0, temperature=2.0).trace
    kept_any = 0
    for now, after in zip(trace.rounds[:-1], trace.rounds[1:], strict=True):
        assert now.coupled is not None
        kept = now.coupled.astype(bool)
        assert not (kept & (now.tokens >= 0)).any()  # only drafts still open
        assert np.array_equal(after.draft[kept], now.draft[kept])
        kept_any += int(kept.sum())
    assert kept_any > 0, "the configuration should keep some drafts"
    data = json.loads(trace.to_json())
    assert parse(data).to_dict() == data
    bad = json.loads(trace.to_json())
    bad["rounds"][0]["coupled"] = [[2] * 8] * 8
    with pytest.raises(TraceError, match="coupled has values outside"):
        parse(bad)
    assert "coupled" not in tokens(engine, "sjd", 2).trace.to_dict()["rounds"][0]


def test_the_coupling_experiment_reads_every_carried_draft_once(engine):
    """``tools/experiments/coupling_entropy.py`` splits the drafts each MC-SJD round carried into
    the next (the window after its commit, plus the fresh one past it) into kept and redrawn, and
    reads their next test from the next round: every kept draft of the trace is counted as kept,
    each with the score the next round gave it, and the carried ones add up to the next rounds'
    drafts that were not fresh guesses of the window's refill."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "experiments"))
    from coupling_entropy import kept_vs_redrawn

    trace = tokens(engine, "mc-sjd", 2, cfg=1.0, temperature=2.0, sjd_window=6).trace
    kept, redrawn = kept_vs_redrawn(trace)
    rounds = trace.rounds
    assert len(kept) == sum(int(r.coupled.sum()) for r in rounds[:-1]) > 0
    expected = [float(s) for c, n in zip(rounds, rounds[1:], strict=False) for s in n.score[c.coupled.astype(bool)]]
    assert sorted(kept) == sorted(expected)
    assert all(0.0 <= s <= 1.0 for s in kept + redrawn)
    # every round after the first proposes its window: what was carried plus random refills
    proposed_later = sum(int((r.score >= 0).sum()) for r in rounds[1:])
    assert len(kept) + len(redrawn) <= proposed_later
