"""Sampling and acceptance rules, with crafted logits and distribution checks (vLLM style)."""

import pytest
import torch

from mulo.sampling import (
    NeighbourTable,
    cfg_combine,
    codebook_neighbours,
    lantern_relaxed,
    logits_to_probs,
    pooled_probability,
    residual_distribution,
    sample,
    speculative_accept,
)
from tests.helpers import accept_ignoring_q, accept_too_often, resample_from_p


def test_cfg_combine():
    c, u = torch.tensor([2.0, 0.0]), torch.tensor([1.0, 1.0])
    assert cfg_combine(c, u, 4.0).tolist() == [5.0, -3.0]
    assert cfg_combine(c, u, 1.0).tolist() == c.tolist()


def test_top_k_and_top_p_filtering():
    logits = torch.log(torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05]))
    assert (logits_to_probs(logits, top_k=2) > 0).tolist() == [True, True, False, False, False]
    # top-p keeps the smallest prefix whose mass exceeds p: 0.5 + 0.2 = 0.7 > 0.6.
    assert (logits_to_probs(logits, top_p=0.6) > 0).tolist() == [True, True, False, False, False]
    assert (logits_to_probs(logits, top_p=0.7001) > 0).sum() == 3
    assert (logits_to_probs(logits, top_p=0.1) > 0).tolist() == [True, False, False, False, False]
    torch.testing.assert_close(logits_to_probs(logits, top_k=2).sum(), torch.tensor(1.0))


def test_temperature_zero_is_greedy_and_temperature_sharpens():
    logits = torch.tensor([[0.1, 2.0, 1.9], [3.0, 0.0, 0.0]])
    assert logits_to_probs(logits, temperature=0).tolist() == [[0, 1, 0], [1, 0, 0]]
    hot, cold = logits_to_probs(logits[0], 2.0), logits_to_probs(logits[0], 0.5)
    assert cold.max() > hot.max()


def test_seeded_sampling_is_reproducible_per_generator():
    probs = torch.full((100, 50), 1 / 50)
    a = sample(probs, torch.Generator().manual_seed(7))
    b = sample(probs, torch.Generator().manual_seed(7))
    c = sample(probs, torch.Generator().manual_seed(8))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_neighbour_table_matches_brute_force_and_is_cached():
    codebook = torch.randn(40, 3, generator=torch.Generator().manual_seed(0))
    table = codebook_neighbours(codebook, 5)
    dist = torch.cdist(codebook, codebook)
    dist.fill_diagonal_(float("inf"))
    assert torch.equal(table, dist.argsort(dim=-1, stable=True)[:, :5])
    assert not (table == torch.arange(40)[:, None]).any()  # self excluded
    cached = NeighbourTable(codebook)
    first = cached.table(3)
    assert torch.equal(first, table[:, :3])
    assert cached.table(2).data_ptr() == cached.table(3).data_ptr()  # sliced, not recomputed
    with pytest.raises(ValueError, match="k must be in"):
        codebook_neighbours(codebook, 40)


def test_pooled_probability_sums_the_draft_and_its_neighbours():
    probs = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1]])
    neighbours = torch.tensor([[1, 2], [0, 2], [3, 1], [2, 0]])
    draft = torch.tensor([0, 3])
    torch.testing.assert_close(
        pooled_probability(probs, draft, neighbours), torch.tensor([0.1 + 0.2 + 0.3, 0.1 + 0.2 + 0.4])
    )
    torch.testing.assert_close(pooled_probability(probs, draft, neighbours[:, :0]), torch.tensor([0.1, 0.1]))


def test_lantern_takes_the_largest_nearest_first_set_within_delta():
    probs = torch.tensor([[0.05, 0.1, 0.2, 0.3, 0.35]])
    neighbours = torch.tensor([[1, 2, 3, 4], [0, 2, 3, 4], [0, 1, 3, 4], [0, 1, 2, 4], [0, 1, 2, 3]])
    draft = torch.tensor([0])
    # cumulative neighbour mass: 0.1, 0.3, 0.6, 0.95
    p_tilde, pooled = lantern_relaxed(probs, draft, neighbours, delta=0.35)
    torch.testing.assert_close(p_tilde, torch.tensor([0.05 + 0.3]))
    assert pooled.tolist() == [[True, True, False, False]]
    p_tilde, _ = lantern_relaxed(probs, draft, neighbours, delta=0.05)  # nothing fits
    torch.testing.assert_close(p_tilde, torch.tensor([0.05]))
    # delta > 1: LANTERN++'s relative bound, neighbour mass <= (delta - 1) * p(x) = 0.15
    p_tilde, _ = lantern_relaxed(probs, draft, neighbours, delta=4.0)
    torch.testing.assert_close(p_tilde, torch.tensor([0.05 + 0.1]))


def test_residual_distribution():
    p, q = torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.2, 0.5, 0.3])
    torch.testing.assert_close(residual_distribution(p, q), torch.tensor([1.0, 0.0, 0.0]))
    torch.testing.assert_close(residual_distribution(p, p), p)  # empty residual falls back to p


def _speculative_step(p, q, gen, n, accept=speculative_accept, residual=residual_distribution):
    """n independent draft-then-verify steps for one position; returns the output tokens."""
    drafts = torch.multinomial(q.expand(n, -1), 1, replacement=True, generator=gen)[:, 0]
    ok = accept(p[drafts], q[drafts], gen)
    fix = torch.multinomial(residual(p, q).expand(n, -1), 1, generator=gen)[:, 0]
    return torch.where(ok, drafts, fix)


SPEC_P = torch.tensor([0.05, 0.4, 0.25, 0.2, 0.1])
SPEC_Q = torch.tensor([0.3, 0.1, 0.1, 0.2, 0.3])
SPEC_ATOL = 0.005  # 200k samples: a frequency's standard error is at most 0.0011


def _speculative_frequencies(**rules) -> torch.Tensor:
    n = 200_000
    out = _speculative_step(SPEC_P, SPEC_Q, torch.Generator().manual_seed(0), n, **rules)
    return torch.bincount(out, minlength=5).float() / n


def test_speculative_sampling_outputs_the_target_distribution():
    torch.testing.assert_close(_speculative_frequencies(), SPEC_P, atol=SPEC_ATOL, rtol=0)


@pytest.mark.parametrize(
    "rules",
    [dict(accept=accept_ignoring_q), dict(accept=accept_too_often), dict(residual=resample_from_p)],
    ids=["ignore-q", "over-accept", "resample-from-p"],
)
def test_lossy_speculative_sampling_misses_the_target_distribution(rules):
    """Power check: the tolerance above fails every lossy rule. Their exact output distributions
    are off by up to 0.21 (ignore q), 0.03 (over-accept 1.3x) and 0.12 (resample from p)."""
    assert (_speculative_frequencies(**rules) - SPEC_P).abs().max() > SPEC_ATOL
