"""EAGLE-2: the draft tree, its attention masks, the lossless walk, and the method end to end."""

from functools import partial

import pytest
import torch

from mulo.families import toy
from mulo.methods import ar, draft_tree, eagle2
from mulo.methods.draft_tree import ACCEPTED, REJECTED, UNTRIED, DraftTree, TreeVerdict, verify_tree
from mulo.models.eagle import head_for
from mulo.models.gpt import init_random_
from mulo.runner import ModelRunner
from mulo.sampling import sample, uniform
from tests.helpers import (
    SPREAD_SAMPLING,
    assert_spread,
    bare_family,
    chi_square,
    chi_square_critical,
    exact_sequence_distribution,
    run_method,
    sequence_counts,
    spread_target,
    tiny_gpt,
)

VOCAB, SIDE = 3, 2  # 81 possible 2x2 images: small enough to enumerate


def _tree() -> DraftTree:
    """root -> a (token 5) -> c (7), d (8);  root -> b (6) -> e (9) -> f (4)."""
    tree = DraftTree(root=3)
    a = tree.add(-1, 5, 0.5, -0.69)
    b = tree.add(-1, 6, 0.3, -1.2)
    tree.add(a, 7, 0.6, -0.5)
    tree.add(a, 8, 0.2, -1.6)
    e = tree.add(b, 9, 0.9, -0.1)
    tree.add(e, 4, 0.9, -0.1)
    return tree


def test_visible_rows_are_ancestors_and_self_only():
    tree = _tree()
    rows = tree.visible()
    expected = {0: {0}, 1: {1}, 2: {0, 2}, 3: {0, 3}, 4: {1, 4}, 5: {1, 4, 5}}
    for node, seen in expected.items():
        assert set(rows[node].nonzero()[:, 0].tolist()) == seen
    # a subset (nodes the head was fed) keeps only the ancestors in it
    sub = tree.visible([1, 4])
    assert sub.tolist() == [[True, False], [True, True]]


def test_select_keeps_the_most_confident_nodes_parents_first():
    tree = _tree()
    kept = tree.select(4)
    # scores: a -0.69, b -1.2, c -1.19, d -2.29, e -1.3, f -1.4  ->  a, c, b, e
    assert kept.tokens == [5, 7, 6, 9]
    assert kept.parents == [-1, 0, -1, 2]
    assert kept.depths == [1, 2, 1, 2]
    assert all(p < i for i, p in enumerate(kept.parents))


def test_walk_is_greedy_at_temperature_zero():
    tree = _tree()
    one_hot = {j: torch.nn.functional.one_hot(torch.tensor(t), 10).float() for j, t in enumerate([7, 9, 0, 0, 4, 2])}
    root = torch.nn.functional.one_hot(torch.tensor(6), 10).float()
    verdict = verify_tree(tree, root, one_hot, n_total=20, generator=torch.Generator().manual_seed(0))
    assert verdict.path == [1, 4, 5]  # a (5) is not the target's 6: rejected; then b, e, f
    assert verdict.status[0] == REJECTED and verdict.status[1] == ACCEPTED
    assert verdict.bonus and verdict.next_token == 2  # f accepted: a leaf, bonus from its distribution
    assert verdict.status[2] == UNTRIED


def test_a_rejected_candidate_is_removed_from_the_residual():
    """Every child rejected: the next token is drawn from p without the rejected tokens."""
    tree = DraftTree(root=0)
    for token in (0, 1):
        tree.add(-1, token, 0.4, -0.9)
    p = torch.tensor([0.3, 0.3, 0.4])
    seen = torch.zeros(3)
    gen = torch.Generator().manual_seed(0)
    for _ in range(3000):
        verdict = verify_tree(tree, p, {}, n_total=2, generator=gen)
        if verdict.path:
            seen[tree.tokens[verdict.path[0]]] += 1
        else:
            seen[verdict.next_token] += 1
            assert not verdict.bonus
    assert torch.allclose(seen / seen.sum(), p, atol=0.03)


def _positions(tree) -> list[int]:
    return [tree.position(j) for j in range(len(tree))]


def _path_context(tree, node):
    path = []
    while node >= 0:
        path.append(tree.tokens[node])
        node = tree.parents[node]
    return path[::-1]


@pytest.mark.parametrize("neighbour_inputs", [0, 3])
def test_tree_pass_equals_each_path_run_alone(neighbour_inputs):
    """The one verification pass gives every node the target's distribution given exactly the
    committed prefix, the root and its own ancestors: a sibling's branch never leaks in. A target
    that reads the row above reads it on the node's own path once the chain is a row deep (the
    4-wide grid's node at position 6 predicts 7, whose row above holds the node at 4)."""
    target = tiny_gpt(41, 16, 4, neighbour_inputs=neighbour_inputs)
    cond = torch.randn(2, 4, generator=torch.Generator().manual_seed(1))
    seq = torch.full((16,), -1, dtype=torch.long)
    seq[:4] = torch.tensor([3, 1, 4, 1])
    tree = DraftTree(root=3)
    a = tree.add(-1, 5, 0.5, -0.7)
    b = tree.add(-1, 9, 0.3, -1.2)
    c = tree.add(a, 2, 0.6, -0.5)
    tree.add(b, 6, 0.9, -0.1)
    tree.add(b, 5, 0.05, -3.0)
    deep = tree.add(tree.add(c, 7, 0.5, -0.7), 8, 0.5, -0.7)  # positions 6, 7
    tree.add(deep, 1, 0.5, -0.7)  # position 8: its whole row above is on its path
    runner = ModelRunner(target, cond, 2.0, 1.0, 0, 1.0, scratch=len(tree))
    runner.prefill()
    runner.span_probs(seq, 1, 4)  # positions 0..2 fed
    logits, hidden = runner.feed_tree(seq, 3, _positions(tree), tree.tokens, tree.visible())
    probs = runner.probs(logits).cpu()
    assert hidden.shape == (2, 1 + len(tree), target.config.dim)
    fresh = ModelRunner(target, cond, 2.0, 1.0, 0, 1.0)
    fresh.prefill()
    for node in range(-1, len(tree)):
        context = seq.clone()
        path = _path_context(tree, node) if node >= 0 else []
        context[4 : 4 + len(path)] = torch.tensor(path, dtype=torch.long)
        u = 4 + len(path)
        expected = fresh.probs(fresh.next_logits(context, u)).cpu()
        assert torch.allclose(probs[node + 1], expected, atol=1e-5), node


@pytest.mark.parametrize("neighbour_inputs", [0, 3])
def test_committed_nodes_continue_like_ar(neighbour_inputs):
    """After a tree pass, moving an accepted path's K/V into place leaves the cache as if the path
    had been fed in raster order."""
    target = tiny_gpt(42, 16, 4, neighbour_inputs=neighbour_inputs)
    cond = torch.randn(2, 4, generator=torch.Generator().manual_seed(2))
    seq = torch.full((16,), -1, dtype=torch.long)
    seq[:3] = torch.tensor([7, 7, 1])
    tree = DraftTree(root=2)
    a = tree.add(-1, 4, 0.5, -0.7)
    tree.add(-1, 8, 0.3, -1.2)
    tree.add(a, 11, 0.6, -0.5)
    runner = ModelRunner(target, cond, 1.0, 1.0, 0, 1.0, scratch=len(tree))
    runner.prefill()
    runner.span_probs(seq, 1, 3)  # positions 0..1 fed
    runner.feed_tree(seq, 2, _positions(tree), tree.tokens, tree.visible())
    runner.commit_tree([0, 2], [3, 4], [4, 11])
    seq[3:6] = torch.tensor([4, 11, 0])
    after = runner.probs(runner.next_logits(seq, 6)).cpu()
    fresh = ModelRunner(target, cond, 1.0, 1.0, 0, 1.0)
    fresh.prefill()
    assert torch.allclose(after, fresh.probs(fresh.next_logits(seq, 6)).cpu(), atol=1e-5)
    assert runner.nfe == 4  # prefill, prefix, tree, one step: nothing was re-fed


def _head_family(target, seed):
    family = bare_family(target)
    family.eagle_head = init_random_(head_for(target), seed, std=0.4).eval()
    return family


@pytest.mark.parametrize(
    "top_k,budget,depth,neighbour_inputs", [(3, 40, 3, 0), (2, 5, 2, 0), (1, 2, 1, 0), (3, 40, 3, 3), (2, 40, 10, 3)]
)
def test_greedy_eagle2_equals_greedy_ar(top_k, budget, depth, neighbour_inputs):
    """(Depth 10 on the 8-wide toy: nodes whose row above lies on their own path.)"""
    fam = toy.build(neighbour_inputs=neighbour_inputs)
    cond = fam.condition("red apple")
    for seed in range(3):
        expected, _, _ = run_method(ar.generate, fam, cond, seed, temperature=0.0)
        got, rounds, _ = run_method(
            eagle2.generate, fam, cond, seed, temperature=0.0, tree_top_k=top_k, tree_budget=budget, tree_depth=depth
        )
        assert torch.equal(got, expected)
        assert all(r.tree is not None and len(r.tree["token"]) <= budget - 1 for r in rounds)


def test_full_tree_greedy_commits_whole_chunks():
    """With every continuation in the tree (top-k = vocabulary), greedy acceptance never fails:
    each round commits depth + 1 tokens, so the rounds are few and AR's tokens unchanged."""
    target = tiny_gpt(43, VOCAB, SIDE)
    fam = _head_family(target, 3)
    cond = torch.randn(2, 4, generator=torch.Generator().manual_seed(3))
    expected, _, _ = run_method(ar.generate, fam, cond, 0, temperature=0.0)
    got, rounds, ctx = run_method(
        eagle2.generate, fam, cond, 0, temperature=0.0, tree_top_k=3, tree_budget=40, tree_depth=3
    )
    assert torch.equal(got, expected)
    assert len(rounds) == 1 and ctx.nfe()["target"] == 2  # the prefill, then one tree pass


def test_every_round_commits_at_least_one_token():
    fam = toy.build()
    cond = fam.condition("blue fish")
    _, rounds, ctx = run_method(eagle2.generate, fam, cond, 5, cfg=3.0)
    before = 0
    for rnd in rounds:
        now = int((rnd.tokens >= 0).sum())
        assert now - before >= 1
        first = 1 if rnd.index == 0 else 0  # round 0 also samples token 0 from the prefill
        assert now - before == first + 1 + rnd.tree["status"].count(ACCEPTED)
        before = now
    n_total = toy.GRID * toy.GRID
    assert before == n_total
    # per round one catch-up pass and depth - 1 expansions (depth 6, less near the end)
    assert ctx.nfe()["drafter"] == sum(min(6, n_total - 1 - r.tree["root"]) for r in rounds)


# -- the walk is lossless, and the check that says so notices when it is not -----------------------
# The check compares the sequences EAGLE-2 samples with the target's exact distribution (Pearson
# chi-square, critical value at p = 0.001) on a spread-out target, then runs again with a lossy
# walk swapped in. EAGLE-2 picks its candidates by top-k, so a tried candidate's proposal is a
# point mass and the exact rule min(1, p(x) / q(x)) is p(x): "ignore q" is the real rule here, in
# every setup. Its mirror image is the bug this walk can have: accepting with min(1, p(x) / q(x)),
# q the drafter's probability, as if the candidate had been sampled from the drafter.
# Chi-square values seen, critical value 46.9: real 15.2; drafter q 1096.9; over-accept 1.3x 246.0;
# correction from p 259.2.

EAGLE2_SAMPLES = 800
EAGLE2_KNOBS = dict(SPREAD_SAMPLING, tree_top_k=2, tree_budget=4, tree_depth=2)


def _walk(tree, root_probs, node_probs, n_total, generator, accept_probability):
    """``verify_tree`` with child x accepted with ``accept_probability(p(x), q(x))`` (p the current
    residual, q the drafter's probability): the real rule is p(x)."""
    status, path = [UNTRIED] * len(tree), []
    node, probs = -1, root_probs.float().clone()
    while True:
        accepted, children = None, tree.children(node)
        for child in children:
            x = tree.tokens[child]
            if bool(uniform((), generator, probs.device) < accept_probability(probs[x], tree.q[child])):
                accepted = child
                break
            status[child] = REJECTED
            probs[x] = 0
            probs = probs / probs.sum()
        if accepted is None:
            return TreeVerdict(path, status, [-1.0] * len(tree), int(sample(probs, generator)), bonus=not children)
        status[accepted] = ACCEPTED
        path.append(accepted)
        node = accepted
        if tree.root + tree.depths[node] >= n_total - 1:
            return TreeVerdict(path, status, [-1.0] * len(tree), None, bonus=False)
        probs = node_probs[node].float().clone()


def _outcome(verdict: TreeVerdict):
    return verdict.path, verdict.status, verdict.next_token, verdict.bonus


def test_the_walk_with_the_real_rule_is_verify_tree():
    """``_walk`` is ``verify_tree`` with one rule swapped: given the real rule, it takes the same
    paths and draws the same tokens, so its lossy versions below are the real walk's."""
    tree = _tree()
    probs = torch.softmax(3 * torch.randn(40, 1 + len(tree), 10, generator=torch.Generator().manual_seed(0)), -1)
    outcomes = set()
    for seed, p in enumerate(probs):
        node_probs = dict(enumerate(p[1:]))
        real = verify_tree(tree, p[0], node_probs, 20, torch.Generator().manual_seed(seed))
        walk = _walk(tree, p[0], node_probs, 20, torch.Generator().manual_seed(seed), lambda p_x, q_x: p_x)
        assert _outcome(walk) == _outcome(real)
        outcomes.add((len(real.path), real.bonus))
    # every candidate rejected; a node accepted, then its children rejected; a path and its bonus
    assert {(0, False), (1, False), (2, True)} <= outcomes


def _accept_as_if_sampled_from_the_drafter(monkeypatch):
    rule = partial(_walk, accept_probability=lambda p_x, q_x: (p_x / q_x).clamp(max=1))
    monkeypatch.setattr(eagle2, "verify_tree", rule)


def _accept_too_often(monkeypatch):
    """min(1, 1.3 p(x)): the walk accepts when a uniform draw is below p(x); a draw / 1.3 is."""
    monkeypatch.setattr(draft_tree, "uniform", lambda *args: uniform(*args) / 1.3)


def _verify_then_correct_from_p(tree, root_probs, node_probs, n_total, generator):
    """``verify_tree``, but the token after rejected candidates is drawn from p, not the residual."""
    verdict = verify_tree(tree, root_probs, node_probs, n_total, generator)
    if verdict.next_token is not None and not verdict.bonus:
        p = node_probs[verdict.path[-1]] if verdict.path else root_probs
        verdict.next_token = int(sample(p.float(), generator))
    return verdict


LOSSY_WALKS = {
    "drafter-q": _accept_as_if_sampled_from_the_drafter,
    "over-accept": _accept_too_often,
    "resample-from-p": lambda monkeypatch: monkeypatch.setattr(eagle2, "verify_tree", _verify_then_correct_from_p),
}


def _eagle2_counts():
    """A pruned tree (two of three tokens at depth 1, one continuation): rejections, residual
    draws, accepted paths and bonus tokens all occur."""
    target, cond = spread_target()
    return sequence_counts(eagle2.generate, _head_family(target, 16), cond, EAGLE2_SAMPLES, **EAGLE2_KNOBS)


@pytest.fixture(scope="module")
def p_target():
    target, cond = spread_target()
    _, p = exact_sequence_distribution(target, cond, SPREAD_SAMPLING["cfg"], SPREAD_SAMPLING["temperature"])
    return p


@pytest.mark.slow  # a chi-square over thousands of walks
def test_eagle2_matches_the_target_sequence_distribution(p_target):
    assert_spread(p_target, EAGLE2_SAMPLES)
    stat, dof = chi_square(_eagle2_counts(), p_target)
    assert stat < chi_square_critical(dof), (stat, dof)


@pytest.mark.slow  # a chi-square per injected bug
@pytest.mark.parametrize("bug", LOSSY_WALKS)
def test_eagle2_check_rejects_a_lossy_walk(bug, p_target, monkeypatch):
    LOSSY_WALKS[bug](monkeypatch)
    stat, dof = chi_square(_eagle2_counts(), p_target)
    assert stat > chi_square_critical(dof), (bug, stat, dof)
