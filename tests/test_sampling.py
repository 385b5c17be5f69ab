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


def _speculative_step(p, q, gen, n):
    """n independent draft-then-verify steps for one position; returns the output tokens."""
    drafts = torch.multinomial(q.expand(n, -1), 1, replacement=True, generator=gen)[:, 0]
    ok = speculative_accept(p[drafts], q[drafts], gen)
    fix = torch.multinomial(residual_distribution(p, q).expand(n, -1), 1, generator=gen)[:, 0]
    return torch.where(ok, drafts, fix)


def test_speculative_sampling_outputs_the_target_distribution():
    gen = torch.Generator().manual_seed(0)
    p = torch.tensor([0.05, 0.4, 0.25, 0.2, 0.1])
    q = torch.tensor([0.3, 0.1, 0.1, 0.2, 0.3])
    n = 200_000
    out = _speculative_step(p, q, gen, n)
    freq = torch.bincount(out, minlength=5).float() / n
    torch.testing.assert_close(freq, p, atol=0.005, rtol=0)
    # Power check: accepting every draft would give q, far from p.
    assert (q - p).abs().max() > 0.1
