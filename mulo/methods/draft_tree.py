"""EAGLE-2's dynamic draft tree: its nodes, the re-ranking to a token budget, the attention rows
that keep branches apart, and the lossless walk that accepts a path of it.

Node ``j`` proposes ``tokens[j]`` at image position ``root + depths[j]`` after its parent's token
(parent -1: the root, the last committed token). ``scores[j]`` is the sum of the drafter's log
probabilities along the path: the "global confidence" EAGLE-2 grows and re-ranks by.

Candidates are chosen deterministically (top-k by drafter confidence), so the proposal of each
tried candidate is a point mass and the multi-candidate rejection rule becomes: try the children
of the current node in turn, accept child ``x`` with probability ``p(x)`` under the current
residual, and on a rejection remove ``x`` from the residual (``norm(max(0, p - 1_x))``). If no
child is accepted the next token is drawn from the residual. Every emitted token then follows
the target's distribution exactly; at temperature 0 ``p`` is one-hot and the walk is greedy AR.

The test of a tried candidate is a parameter of the walk: LANTERN (``mulo.methods.lantern``)
accepts with a relaxed probability and removes more than the candidate from the residual.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from mulo.sampling import residual_without, sample, uniform

UNTRIED, ACCEPTED, REJECTED = 0, 1, 2


@dataclass
class DraftTree:
    root: int  # image position of the root token
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)  # index of the parent node, -1 = the root
    depths: list[int] = field(default_factory=list)  # 1 = a candidate for position root + 1
    q: list[float] = field(default_factory=list)  # drafter probability of the token given its parent
    scores: list[float] = field(default_factory=list)  # cumulative log drafter probability

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, parent: int, token: int, q: float, log_q: float) -> int:
        """Append a node (plain Python numbers: a tree grows by hundreds of nodes per round)."""
        root_child = parent < 0
        self.tokens.append(token)
        self.parents.append(parent)
        self.depths.append(1 if root_child else self.depths[parent] + 1)
        self.q.append(q)
        self.scores.append(log_q if root_child else self.scores[parent] + log_q)
        return len(self.tokens) - 1

    def position(self, node: int) -> int:
        return self.root + self.depths[node]

    def children(self, node: int) -> list[int]:
        """Children of ``node`` (-1: the root), most confident first."""
        kids = [j for j, p in enumerate(self.parents) if p == node]
        return sorted(kids, key=lambda j: (-self.scores[j], j))

    def select(self, n_nodes: int) -> DraftTree:
        """EAGLE-2's re-ranking: the ``n_nodes`` most confident nodes, re-indexed parents first.

        A child's score never exceeds its parent's (log q <= 0), so taking nodes in order of
        score (ties: the earlier, i.e. shallower or first-added, node) always meets a parent
        before its children; a node whose parent was not taken is skipped."""
        order = sorted(range(len(self)), key=lambda j: (-self.scores[j], j))
        kept: dict[int, int] = {}
        out = DraftTree(self.root)
        for j in order:
            if len(out) == n_nodes:
                break
            parent = self.parents[j]
            if parent >= 0 and parent not in kept:
                continue
            kept[j] = len(out)
            out.tokens.append(self.tokens[j])
            out.parents.append(-1 if parent < 0 else kept[parent])
            out.depths.append(self.depths[j])
            out.q.append(self.q[j])
            out.scores.append(self.scores[j])
        return out

    def visible(self, nodes: list[int] | None = None) -> torch.Tensor:
        """``[M, M]`` bool over ``nodes`` (default all, parents before children): row i marks
        node i itself and those of its ancestors that are among ``nodes``."""
        nodes = list(range(len(self))) if nodes is None else list(nodes)
        index = {j: i for i, j in enumerate(nodes)}
        out = torch.zeros(len(nodes), len(nodes), dtype=torch.bool)
        rows, cols = [], []
        for i, j in enumerate(nodes):
            while j >= 0:
                if j in index:
                    rows.append(i)
                    cols.append(index[j])
                j = self.parents[j]
        out[rows, cols] = True
        return out


@dataclass
class TreeVerdict:
    path: list[int]  # accepted nodes, root to leaf
    status: list[int]  # per node: UNTRIED / ACCEPTED / REJECTED
    accept_prob: list[float]  # per node: the probability it was accepted with (-1: untried)
    next_token: int | None  # drawn after the path (a correction or a bonus); None: the image is full
    bonus: bool  # True when the path ended at a leaf and ``next_token`` came from its distribution
    emptied: int = 0  # rejections that left the residual no mass (LANTERN: it falls back to uniform)


def exact_test(probs: torch.Tensor, token: int) -> tuple[torch.Tensor, torch.Tensor]:
    """EAGLE-2's test of a tried candidate under the current residual ``probs``: the probability
    to accept it with, p(x), and the codes a rejection removes from the residual, x alone."""
    return probs[token], torch.tensor([token])


def verify_tree(
    tree: DraftTree,
    root_probs: torch.Tensor,
    node_probs: dict[int, torch.Tensor],
    n_total: int,
    generator,
    test=exact_test,
) -> TreeVerdict:
    """Walk the tree from the root with multi-candidate rejection sampling (see the module doc).

    ``root_probs [V]``: the target's distribution of position ``root + 1``; ``node_probs[j]``: its
    distribution after node j (absent for nodes at the last position ``n_total - 1``).
    ``test(probs, token)`` gives a candidate's acceptance probability and the codes its rejection
    removes from the residual (``exact_test``: EAGLE-2's lossless rule)."""
    status = [UNTRIED] * len(tree)
    accept_prob = [-1.0] * len(tree)
    path: list[int] = []
    node, probs = -1, root_probs.float().clone()
    emptied = 0
    while True:
        accepted, children = None, tree.children(node)
        for child in children:
            mass, dropped = test(probs, tree.tokens[child])
            accept_prob[child] = float(mass)
            if bool(uniform((), generator, probs.device) < mass):  # strict: mass 0 never passes
                accepted = child
                break
            status[child] = REJECTED
            emptied += bool(probs.clone().index_fill_(0, dropped, 0).sum() == 0)
            probs = residual_without(probs, dropped)
        if accepted is None:
            token = int(sample(probs, generator))
            return TreeVerdict(path, status, accept_prob, token, bonus=not children, emptied=emptied)
        status[accepted] = ACCEPTED
        path.append(accepted)
        node = accepted
        if tree.root + tree.depths[node] >= n_total - 1:  # the image is complete
            return TreeVerdict(path, status, accept_prob, None, bonus=False, emptied=emptied)
        probs = node_probs[node].float().clone()
