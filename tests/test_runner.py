"""The runner's cache contract: callers pass the sequence they mean, the runner re-feeds what its
slots hold out of date, in the same pass, and nothing else."""

from __future__ import annotations

import pytest
import torch

from mulo.runner import ModelRunner
from tests.helpers import tiny_gpt


@pytest.fixture
def fed_positions(monkeypatch):
    """The positions of every forward pass after the prefill, in order (the general path's and
    the single-token step's)."""
    calls = []
    feed, feed_one = ModelRunner._feed, ModelRunner._feed_one

    def spy(self, positions, tokens, mask, view):
        calls.append(positions.tolist())
        return feed(self, positions, tokens, mask, view)

    def spy_one(self, position, token):
        calls.append([position])
        return feed_one(self, position, token)

    monkeypatch.setattr(ModelRunner, "_feed", spy)
    monkeypatch.setattr(ModelRunner, "_feed_one", spy_one)
    return calls


def runner(refresh: bool = True) -> ModelRunner:
    model = tiny_gpt(seed=0, vocab=16, side=4)
    cond = torch.randn(2, 4, generator=torch.Generator().manual_seed(1))
    r = ModelRunner(model, cond, guidance=2.0, temperature=1.0, top_k=0, top_p=1.0, refresh=refresh)
    r.prefill()
    return r


def sequence(length: int = 10) -> torch.Tensor:
    seq = torch.full((16,), -1, dtype=torch.long)
    seq[:length] = torch.arange(length) % 16
    return seq


def test_walking_forward_feeds_one_slot_per_position(fed_positions):
    r, seq = runner(), sequence()
    assert torch.equal(r.next_logits(seq, 0), r.first_logits)
    for u in range(1, 8):
        r.next_logits(seq, u)
    assert fed_positions == [[u - 1] for u in range(1, 8)]
    assert r.nfe == 1 + 7


def test_the_single_token_step_gives_the_general_paths_logits():
    """``_feed_one`` (AR's and every chain's step) is ``_feed_through`` without the scans."""
    fast, general, seq = runner(), runner(), sequence()
    for u in range(1, 8):
        want, _ = general._feed_through(seq, u - 1)
        assert torch.equal(fast.next_logits(seq, u), want[-1]), u
    assert torch.equal(fast._fed, general._fed) and fast.widths == general.widths[:1] + [1] * 7
    assert torch.equal(fast.cache.k, general.cache.k) and torch.equal(fast.cache.written, general.cache.written)


@pytest.mark.parametrize("refresh,expected", [(True, [3, 4, 5, 6, 7]), (False, [3, 7])])
def test_a_changed_token_is_re_fed_with_what_saw_it_only_when_refreshing(fed_positions, refresh, expected):
    r, seq = runner(refresh), sequence()
    for u in range(1, 8):
        r.next_logits(seq, u)
    seq[3] = 15  # a different token where one was already fed
    fed_positions.clear()
    r.next_logits(seq, 8)
    assert fed_positions == [expected]


def test_marked_stale_slots_are_re_fed_once(fed_positions):
    r, seq = runner(), sequence()
    for u in range(1, 8):
        r.next_logits(seq, u)
    r.mark_stale(5)
    r.mark_stale(6)  # the earliest mark wins
    fed_positions.clear()
    r.next_logits(seq, 8)
    r.next_logits(seq, 9)
    assert fed_positions == [[5, 6, 7], [8]]


def test_cached_logits_equal_a_fresh_runner_after_any_history():
    r, seq = runner(), sequence()
    for u in range(1, 8):
        r.next_logits(seq, u)
    seq[2] = 9
    r.mark_stale(4)
    changed = r.span_probs(seq, 5, 9)
    fresh = runner().span_probs(seq, 5, 9)
    assert changed.shape == (4, 16)
    torch.testing.assert_close(changed, fresh)


def test_span_probs_covers_the_prefill_and_stops_at_the_grid():
    r, seq = runner(), sequence(16)
    first = r.span_probs(seq, 0, 3)
    assert first.shape == (3, 16)
    torch.testing.assert_close(first[0], r.probs(r.first_logits).cpu())
    assert r.span_probs(seq, 14, 20).shape == (2, 16)  # positions 14 and 15 exist, no more
