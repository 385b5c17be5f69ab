"""LANTERN as its paper runs it: relaxed acceptance over EAGLE-2's draft trees, LANTERN's own
residual and greedy rule (checked against values worked out by hand), and, with nothing pooled,
EAGLE-2's lossless walk (checked by a chi-square test over every image of a tiny model).

The hand-made example: six codes, the neighbour table below (nearest first, the code itself
left out, three columns: k = 2 may be pooled, k + 1 = 3 are dropped after a pooled rejection), and
p = (0.10, 0.30, 0.15, 0.25, 0.12, 0.08).
"""

import pytest
import torch

from mulo.families import toy
from mulo.methods import ar, lantern
from mulo.methods.draft_tree import ACCEPTED, REJECTED, UNTRIED, DraftTree, verify_tree
from mulo.methods.lantern import Pooling, greedy_verdict
from mulo.models.eagle import head_for
from mulo.models.gpt import init_random_
from mulo.sampling import NeighbourTable, lantern_drafter_residual, residual_without
from tests.helpers import (
    bare_family,
    chi_square,
    chi_square_critical,
    exact_sequence_distribution,
    run_method,
    sequence_counts,
    tiny_gpt,
)

NEAREST = torch.tensor([[1, 2, 3], [0, 2, 4], [1, 3, 0], [2, 4, 5], [3, 5, 1], [4, 3, 2]])
P = torch.tensor([0.10, 0.30, 0.15, 0.25, 0.12, 0.08])


def pooling(delta: float, k: int = 2) -> Pooling:
    return Pooling(NEAREST, k, delta)


def rejected(pool: Pooling, probs: torch.Tensor, draft: int) -> tuple[float, torch.Tensor]:
    """(acceptance probability, residual after a rejection) of one tried candidate."""
    mass, dropped = pool.test(probs, draft)
    return float(mass), residual_without(probs, dropped)


def test_a_pooled_rejection_drops_the_draft_and_its_k_plus_1_nearest():
    # draft 0: neighbours 1 (0.30), 2 (0.15): sums 0.30, 0.45; delta 0.4 takes the first only
    mass, residual = rejected(pooling(0.4), P, 0)
    assert mass == pytest.approx(0.10 + 0.30)
    # codes 0 and 1, 2, 3 (its k + 1 = 3 nearest) are gone: 0.12 and 0.08 are left
    torch.testing.assert_close(residual, torch.tensor([0, 0, 0, 0, 0.6, 0.4]))


def test_nothing_within_delta_pools_nothing_and_drops_the_draft_alone():
    mass, residual = rejected(pooling(0.2), P, 0)  # 0.30 > 0.2
    assert mass == pytest.approx(0.10)
    torch.testing.assert_close(residual, torch.tensor([0, 0.30, 0.15, 0.25, 0.12, 0.08]) / 0.90)


def test_lantern_plus_plus_bounds_the_pooled_mass_by_p_of_the_draft():
    # delta > 1: neighbour mass <= (delta - 1) * p(x) = 0.2 (delta 3) or 0.4 (delta 5)
    assert rejected(pooling(3.0), P, 0)[0] == pytest.approx(0.10)
    assert rejected(pooling(5.0), P, 0)[0] == pytest.approx(0.40)


def test_an_emptied_residual_falls_back_to_uniform():
    p = torch.tensor([0.2, 0.3, 0.1, 0.4, 0.0, 0.0])
    mass, residual = rejected(pooling(0.35), p, 0)  # pools code 1 (0.3); drops 0, 1, 2, 3
    assert mass == pytest.approx(0.5)
    torch.testing.assert_close(residual, torch.full((6,), 1 / 6))


def test_the_walk_counts_the_rejections_that_emptied_the_residual():
    """The same p in a one-child tree: a rejection of 0 empties it (the next token is uniform, and
    the verdict says so); an accepted 0 or a rejection that leaves mass counts nothing."""
    p = torch.tensor([0.2, 0.3, 0.1, 0.4, 0.0, 0.0])
    tree = DraftTree(root=0)
    tree.add(-1, 0, 0.5, -0.7)
    gen, counts = torch.Generator().manual_seed(1), {0: 0, 1: 0}
    for _ in range(200):
        verdict = verify_tree(tree, p, {}, n_total=2, generator=gen, test=pooling(0.35).test)
        counts[verdict.emptied] += 1
        assert verdict.emptied == (0 if verdict.path else 1)
    assert counts[0] > 50 and counts[1] > 50  # accepted with 0.5
    kept = verify_tree(tree, P, {}, n_total=2, generator=torch.Generator().manual_seed(0), test=pooling(0.2).test)
    assert kept.emptied == 0


def test_the_chain_residual_keeps_the_pooled_neighbours_target_mass():
    """Drafts sampled from q (``lantern_chain``): norm(max(0, p - q')), q' = q less the draft's
    k + 1 nearest codes when it pooled."""
    q = torch.tensor([0.40, 0.05, 0.05, 0.30, 0.10, 0.10])
    pooled = lantern_drafter_residual(P, q, NEAREST[0], pooled=True)
    # p - q' = (-0.30, 0.30, 0.15, 0.25, 0.02, -0.02): the positive part sums to 0.72
    torch.testing.assert_close(pooled, torch.tensor([0, 0.30, 0.15, 0.25, 0.02, 0]) / 0.72)
    plain = lantern_drafter_residual(P, q, NEAREST[0], pooled=False)
    # p - q = (-0.30, 0.25, 0.10, -0.05, 0.02, -0.02): the positive part sums to 0.37
    torch.testing.assert_close(plain, torch.tensor([0, 0.25, 0.10, 0, 0.02, 0]) / 0.37)


def test_the_walk_tries_siblings_under_lanterns_residual():
    """Root children 0 then 5 (the image ends after them). By hand: 0 passes with p~ = 0.4; else
    the residual is (0, 0, 0, 0, 0.6, 0.4), where 5 pools nothing (its nearest, 4, has 0.6 > 0.4)
    and passes with 0.4; else the residual is code 4 alone. So 0: 0.4, 5: 0.6 * 0.4, 4: 0.6 * 0.6."""
    tree = DraftTree(root=0)
    tree.add(-1, 0, 0.5, -0.7)
    tree.add(-1, 5, 0.3, -1.2)
    pool, gen, n = pooling(0.4), torch.Generator().manual_seed(0), 4000
    seen = torch.zeros(6)
    for _ in range(n):
        verdict = verify_tree(tree, P, {}, n_total=2, generator=gen, test=pool.test)
        seen[tree.tokens[verdict.path[0]] if verdict.path else verdict.next_token] += 1
        if not verdict.path:
            assert verdict.accept_prob == pytest.approx([0.4, 0.4])
    torch.testing.assert_close(seen / n, torch.tensor([0.4, 0, 0, 0, 0.36, 0.24]), atol=0.03, rtol=0)


def test_greedy_accepts_a_draft_that_pooling_makes_the_arg_max():
    # p's arg-max is code 1 (0.30)
    drafts = torch.tensor([0, 0, 4, 5])
    deltas = [0.4, 0.2, 0.3, 0.2]
    # 0 + 1 = 0.40 > 0.30: yes; 0 alone: no; 4 + 3 = 0.37: yes; 5 + 4 = 0.20 < 0.30: no
    got = [bool(pooling(d).qualified(P[None], drafts[i : i + 1])) for i, d in enumerate(deltas)]
    assert got == [True, False, True, False]


def test_greedy_verdict_takes_a_pooled_draft_and_continues_after_it():
    """Root -> a (code 0) -> c (code 2); root -> b (code 5). The root's p has its arg-max at code 1
    (0.30); a (0.26) pools code 1 within delta 0.4 (0.56) and becomes the arg-max, b (0.02) pools
    codes 4 and 3 (0.15) and does not. After a, c is the arg-max; after c, code 5 is."""
    tree = DraftTree(root=0)
    a = tree.add(-1, 0, 0.5, -0.7)
    tree.add(-1, 5, 0.3, -1.2)
    c = tree.add(a, 2, 0.6, -1.3)
    root = torch.tensor([0.26, 0.30, 0.29, 0.08, 0.05, 0.02])
    after_a = torch.tensor([0.1, 0.1, 0.5, 0.1, 0.1, 0.1])
    after_c = torch.tensor([0.1, 0.1, 0.1, 0.1, 0.1, 0.5])
    logits = torch.log(torch.stack([root, after_a, after_c]))
    row = {a: 1, c: 2}  # b has no children: its row is never read
    verdict = greedy_verdict(tree, logits, row, pooling(0.4), n_total=10)
    assert verdict.path == [a, c]
    assert verdict.status == [ACCEPTED, REJECTED, ACCEPTED]
    assert verdict.next_token == 5 and verdict.bonus
    # delta 0 pools nothing: neither root child is the arg-max, the target's arg-max follows the root
    verdict = greedy_verdict(tree, logits, row, pooling(0.0), n_total=10)
    assert verdict.path == [] and verdict.next_token == 1 and not verdict.bonus
    assert verdict.status == [REJECTED, REJECTED, UNTRIED]


def test_greedy_lantern_without_neighbours_is_greedy_ar_and_pools_with_them():
    fam = toy.build()
    cond = fam.condition("red apple")
    greedy = dict(temperature=0.0, tree_top_k=3, tree_budget=10, tree_depth=3)
    expected, _, _ = run_method(ar.generate, fam, cond, 0, temperature=0.0)
    got, _, _ = run_method(lantern.generate, fam, cond, 0, lantern_k=0, **greedy)
    assert torch.equal(got, expected)
    pooled, _, _ = run_method(lantern.generate, fam, cond, 0, lantern_k=32, delta=0.4, **greedy)
    assert not torch.equal(pooled, expected)  # greedy LANTERN accepts drafts that are not the arg-max


@pytest.mark.slow  # a chi-square over thousands of sequences
def test_lantern_with_no_pooling_matches_the_target_sequence_distribution():
    """delta = 0 pools nothing (p has no zeros without top-k / top-p): the tree walk must be
    lossless. The same pruned tree as EAGLE-2's test: rejections, residuals and bonuses occur."""
    vocab, side = 3, 2
    target = tiny_gpt(11, vocab, side)
    fam = bare_family(target)
    fam.eagle_head = init_random_(head_for(target), 13, std=0.4).eval()
    fam.neighbours = NeighbourTable(torch.randn(vocab, 4, generator=torch.Generator().manual_seed(2))).table
    cond = torch.randn(2, 4, generator=torch.Generator().manual_seed(5))
    _, p_target = exact_sequence_distribution(target, cond, cfg_scale=2.0)
    knobs = dict(cfg=2.0, tree_top_k=2, tree_budget=4, tree_depth=2, delta=0.0, lantern_k=1)
    counts = sequence_counts(lantern.generate, fam, cond, 1500, **knobs)
    stat, dof = chi_square(counts, p_target)
    assert stat < chi_square_critical(dof), (stat, dof)
    # The test has power: the same model's unguided distribution is rejected by a wide margin.
    _, p_unguided = exact_sequence_distribution(target, cond, cfg_scale=1.0)
    stat_u, dof_u = chi_square(counts, p_unguided)
    assert stat_u > 3 * chi_square_critical(dof_u), (stat_u, dof_u)
