"""LANTERN (Jang et al., ICLR 2025) as its paper and its code run it: EAGLE-2's dynamic draft
trees (``mulo.methods.eagle2``: the same head, tree growth, tree pass and knobs) verified with
relaxed acceptance, following LANTERN's ``evaluate_posterior`` (``models/ea_model_llamagen.py``).

A tried candidate x of a node, under the current residual p (the target's distribution after the
node: CFG, then the request's temperature / top-k / top-p):
1. p over x's ``k`` nearest codebook neighbours (``lantern_k``), nearest first: sums c_1..c_k;
2. m is the largest index with c_m <= δ (δ > 1: c_m <= (δ - 1)·p(x), LANTERN++); if none, nothing
   is pooled;
3. p~(x) = p(x) + c_m;
4. accept with probability min(1, p~(x)): the candidate is the drafter's top-k, a point mass
   (q = 1), as in EAGLE-2's walk;
5. a rejection removes x and, if m >= 1 (even for neighbours of zero mass), x's first k + 1
   nearest codes from p (as LANTERN's code does), renormalised (uniform if nothing is left); the
   next sibling is tried under that residual, and if none is accepted the next token is drawn
   from it. The verdict counts the rejections that emptied it (``TreeVerdict.emptied``, the
   trace's ``residuals_emptied``): kept as the official code has it, and shown, because on a
   peaked target under top-p the dropped neighbours often hold all of p's mass.

Why q = 1 rather than the drafter's q(x): LANTERN's code tests ``px / 1.0`` on EAGLE-2's dynamic
trees; its test with the drafter's q(x) and the residual ``norm(max(0, p - q'))`` is for static
trees (LANTERN++), and with deterministic top-k candidates it would not be lossless at δ = 0.

Greedy (temperature 0), as LANTERN's greedy mode: p is the softmax of the guided logits (no
temperature, else p is one-hot and nothing could ever be pooled); a node qualifies iff it is p's
arg-max once raised to p~(x); the accepted path is the longest chain of qualifying nodes from the
root (ties: the more confident branch) and the next token is the target's arg-max after it.

δ = 0 pools nothing where p has no zeros (no top-k / top-p cut), and the walk is EAGLE-2's, which
is lossless. ``lantern_chain`` (``mulo.methods.speculative``) is the earlier variant over a
same-grid draft model's chains.
"""

from __future__ import annotations

import torch

from mulo.methods import eagle2
from mulo.methods.common import DecodeContext
from mulo.methods.draft_tree import ACCEPTED, REJECTED, UNTRIED, DraftTree, TreeVerdict, verify_tree
from mulo.sampling import lantern_greedy_accepts, lantern_relaxed


class Pooling:
    """LANTERN's neighbourhoods in one request. ``nearest [V, k + 1]``: each code's nearest other
    codes, nearest first; a draft may pool its first ``k``, and a rejection after pooling drops
    ``k + 1`` (LANTERN's table leaves the code itself out, and its code drops ``[:k + 1]``)."""

    def __init__(self, nearest: torch.Tensor, k: int, delta: float):
        self.nearest, self.k, self.delta = nearest, k, delta

    @classmethod
    def of_request(cls, family, config) -> Pooling:
        vocab = family.target.config.vocab_size
        k = config.resolved_lantern_k(vocab)
        return cls(family.neighbours(min(k + 1, vocab - 1)).cpu(), k, config.delta)

    def relaxed(self, probs: torch.Tensor, drafts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(p~ [N], pooled [N] bool)`` of ``drafts [N]`` under ``probs [N, V]`` (steps 1-3)."""
        p_tilde, pooled = lantern_relaxed(probs, drafts, self.nearest[:, : self.k], self.delta)
        return p_tilde, pooled.any(-1)

    def dropped(self, draft: int, pooled: bool) -> torch.Tensor:
        """The codes a rejection of ``draft`` removes from the residual (step 5)."""
        alone = torch.tensor([draft])
        return torch.cat([alone, self.nearest[draft]]) if pooled else alone

    def test(self, probs: torch.Tensor, draft: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The tree walk's test (``mulo.methods.draft_tree.verify_tree``): p~(x) and the codes dropped."""
        p_tilde, pooled = self.relaxed(probs[None], torch.tensor([draft]))
        return p_tilde[0], self.dropped(draft, bool(pooled[0]))

    def qualified(self, probs: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
        """The greedy rule per row: is ``drafts[i]`` the arg-max of ``probs[i]`` after pooling."""
        p_tilde, _ = self.relaxed(probs, drafts)
        return lantern_greedy_accepts(probs, drafts, p_tilde)


def longest_qualified_path(tree: DraftTree, qualified: list[bool]) -> list[int]:
    """The longest chain of qualified nodes from the root, the more confident child on ties (what
    LANTERN's greedy mode keeps: the candidate path with the most accepted tokens)."""
    reach = [0] * len(tree)  # length of the longest qualified chain that starts at each node
    best_below = [0] * len(tree)
    for j in reversed(range(len(tree))):  # children come after their parents
        reach[j] = 1 + best_below[j] if qualified[j] else 0
        parent = tree.parents[j]
        if parent >= 0:
            best_below[parent] = max(best_below[parent], reach[j])
    path, node = [], -1
    while True:
        best = max(tree.children(node), key=lambda c: reach[c], default=None)  # the first of equals
        if best is None or reach[best] == 0:
            return path
        path.append(best)
        node = best


def greedy_verdict(
    tree: DraftTree, logits: torch.Tensor, row: dict[int, int], pooling: Pooling, n_total: int
) -> TreeVerdict:
    """LANTERN's greedy verification of a tree from the tree pass's guided ``logits [1 + M, V]``
    (row 0 the root's, ``row[j]`` node j's)."""
    probs = torch.softmax(logits.float(), dim=-1)
    parent_rows = [0 if p < 0 else row[p] for p in tree.parents]  # a parent is never at the last position
    qualified = pooling.qualified(probs[parent_rows], torch.tensor(tree.tokens)).tolist()
    path = longest_qualified_path(tree, qualified)
    status, accept_prob = [UNTRIED] * len(tree), [-1.0] * len(tree)
    for node in [-1, *path]:
        for child in tree.children(node):
            status[child] = ACCEPTED if child in path else REJECTED
            accept_prob[child] = float(qualified[child])
    end = path[-1] if path else -1
    if path and tree.position(end) >= n_total - 1:  # the image is complete
        return TreeVerdict(path, status, accept_prob, None, bonus=False)
    next_token = int(logits[0 if end < 0 else row[end]].argmax())
    return TreeVerdict(path, status, accept_prob, next_token, bonus=not tree.children(end))


def relaxed_verifier(ctx: DecodeContext, target):
    """LANTERN's verification of EAGLE-2's trees (a verifier for ``eagle2.generate``)."""
    pooling = Pooling.of_request(ctx.family, ctx.config)
    greedy = ctx.config.temperature == 0

    def verify(tree: DraftTree, logits: torch.Tensor, row: dict[int, int], n_total: int) -> TreeVerdict:
        if greedy:
            return greedy_verdict(tree, logits.cpu(), row, pooling, n_total)
        probs = target.probs(logits).cpu()
        node_probs = {j: probs[i] for j, i in row.items()}
        return verify_tree(tree, probs[0], node_probs, n_total, ctx.generator, test=pooling.test)

    return verify


def generate(ctx: DecodeContext):
    return (yield from eagle2.generate(ctx, verifier=relaxed_verifier))
