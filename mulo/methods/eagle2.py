"""EAGLE-2 (Li et al. 2024): a feature-level draft head grows a dynamic draft tree, the target
verifies the whole tree in one pass with a tree attention mask, and a lossless walk accepts a
path of it (``mulo.methods.draft_tree``).

One round, with the committed prefix ending in the root token at position n:
1. the head catches up on the target's features of the tokens committed last round and guesses
   the feature after the root; the ``tree_top_k`` most likely tokens become depth-1 nodes;
2. for each further depth, the ``tree_top_k`` nodes of the highest cumulative drafter confidence
   are fed to the head together (one pass, each seeing only its own ancestors), and each one's
   ``tree_top_k`` best continuations join the tree;
3. the tree is re-ranked to its ``tree_budget - 1`` most confident nodes and verified in one
   target pass: the root at its own slot, the nodes in scratch slots at their positions;
4. the accepted nodes' K/V move to their own slots; the correction (or bonus) token becomes the
   next root. Every round commits at least one token and the output follows the target exactly.

Why it gains little on AR image models (MuLo-SD's paper compares with it on LlamaGen; LANTERN's
starts from the same observation): image tokens are ambiguous, so drafter confidence is low
everywhere, trees stay shallow, and the accepted length barely pays for the drafting passes and
the wider verification. A round pays off only when the tokens it commits are worth more target
steps than its head passes and its tree pass cost.
"""

from __future__ import annotations

import torch

from mulo.methods.common import DecodeContext
from mulo.methods.draft_tree import ACCEPTED, REJECTED, DraftTree, verify_tree
from mulo.runner import pad_mask, pad_rows, query_bucket
from mulo.sampling import cfg_combine


class HeadRunner:
    """The draft head bound to one request: its KV cache over the target's slot layout (plus
    scratch slots for tree nodes), the target's per-branch features by slot, a pass count."""

    graph_state = "eager"  # the head's passes are not graphed (their widths vary with each tree)

    def __init__(self, head, target_runner, scratch: int):
        self.head, self.target = head, target_runner
        model = target_runner.model
        batch, dim = target_runner.cache.k.shape[1], model.config.dim
        self.n_main = target_runner.n_main
        # fixed shapes as the target's: one more slot, the junk slot, takes the padding queries
        self.fixed_shapes = target_runner.fixed_shapes
        n_slots = self.n_main + scratch + int(self.fixed_shapes)
        self.cache = head.new_cache(batch, n_slots, target_runner.device, target_runner.cache.k.dtype)
        self.features = torch.zeros(batch, self.n_main, dim, device=target_runner.device, dtype=self.cache.k.dtype)
        self.done = 0  # main slots 0 .. done-1 hold the head's K/V from the target's real features
        self.used = 0  # scratch slots used by this round's tree
        self.nfe = 0
        self.widths: list[int] = []  # slots fed by each pass of the head
        self.precisions: dict[str, int] = {}  # passes per precision: the head's own dtype, always
        self._dtype = str(self.cache.k.dtype).removeprefix("torch.")

    def _run(self, features, inputs, slots, mask, pe_slots=None) -> torch.Tensor:
        """One head pass (``EagleHead.forward``'s arguments; ``slots`` on the host, ``mask`` on the
        device); with fixed shapes its queries are padded to a power of two and its keys to the
        whole cache."""
        device, n = self.target.device, len(slots)
        pe_slots = slots if pe_slots is None else torch.as_tensor(pe_slots)
        if self.fixed_shapes:
            pad, junk = query_bucket(n) - n, self.cache.n_slots - 1
            mask = pad_mask(mask, self.cache.n_slots, junk)
            features, inputs = pad_rows(features, pad, 0, dim=1), pad_rows(inputs, pad, 0, dim=1)
            slots, pe_slots = pad_rows(slots, pad, junk), pad_rows(pe_slots, pad, 0)
        out = self.head(self.target.model, features, inputs, slots.to(device), mask, self.cache, pe_slots.to(device))
        self.nfe += 1
        self.widths.append(len(slots))
        self.precisions[self._dtype] = self.precisions.get(self._dtype, 0) + 1
        return out[:, :n]

    def set_features(self, slots, hidden: torch.Tensor) -> None:
        self.features[:, torch.as_tensor(slots, dtype=torch.long)] = hidden.to(self.features.dtype)

    def _probs(self, predicted: torch.Tensor) -> torch.Tensor:
        """The drafter's confidence ``[F, V]`` from predicted features ``[B, F, dim]``: the guided
        distribution at temperature 1 (EAGLE-2 ranks by the draft model's own probabilities,
        whatever the request samples with)."""
        logits = self.target.model.output(predicted).float()
        guided = cfg_combine(logits[0], logits[1], self.target.guidance) if logits.shape[0] == 2 else logits[0]
        return torch.softmax(guided, dim=-1).cpu()

    def _inputs_after(self, slots: torch.Tensor, seq: torch.Tensor) -> torch.Tensor:
        """Embedded inputs at ``slots + 1`` (increasing): condition embeddings, then image tokens of
        ``seq`` (the target's inputs, a neighbour-input target's row above included)."""
        after, n_cond = slots + 1, self.target.n_cond
        cond = self.target.cond_embeddings[:, after[after < n_cond]]
        positions = after[after >= n_cond] - n_cond
        image = self.target.embed(seq[positions], self.target.neighbours(seq, positions))
        return torch.cat([cond, image], dim=1)

    @torch.no_grad()
    def catch_up(self, seq: torch.Tensor, root: int):
        """Feed main slots ``done .. n_cond + root - 1`` (real features, causal); return the
        predicted feature after the root ``[B, 1, dim]`` and the draft distribution of ``root + 1``."""
        last = self.target.n_cond + root - 1
        slots = torch.arange(self.done, last + 1)
        device = self.target.device
        mask = torch.arange(last + 1, device=device)[None, :] <= slots.to(device)[:, None]
        self.cache.written[self.n_main :] = False  # the last round's tree
        self.used = 0
        predicted = self._run(self.features[:, slots], self._inputs_after(slots, seq), slots, mask)
        self.done = last + 1
        return predicted[:, -1:], self._probs(predicted[:, -1:])[0]

    @torch.no_grad()
    def expand(
        self, parent_features: torch.Tensor, tokens, positions, ancestors: torch.Tensor, root: int, neighbours=None
    ):
        """Feed tree nodes (``tokens`` at image ``positions``, after their parents' predicted
        ``parent_features [B, F, dim]``) into the next scratch slots; ``ancestors [F, used + F]``
        marks which scratch slots each sees (its fed ancestors and itself); ``neighbours [F, 3]``: a
        neighbour-input target's row-above ids of each. Returns each node's predicted feature
        ``[B, F, dim]`` and draft distribution ``[F, V]``."""
        n_cond, count = self.target.n_cond, len(tokens)
        slots = self.n_main + self.used + torch.arange(count)
        mask = torch.zeros(count, self.n_main + self.used + count, dtype=torch.bool, device=self.target.device)
        mask[:, : n_cond + root] = True  # the condition and the head's committed slots up to the root step
        mask[:, self.n_main :] = ancestors.to(self.target.device)
        inputs = self.target.embed(torch.as_tensor(tokens, dtype=torch.long), neighbours)
        pe_slots = n_cond + torch.as_tensor(positions) - 1
        predicted = self._run(parent_features, inputs, slots, mask, pe_slots)
        self.used += count
        return predicted, self._probs(predicted)


def _add_best(tree: DraftTree, parents: list[int], probs: torch.Tensor, k: int) -> list[list[int]]:
    """Add each parent's ``k`` most likely continuations (``probs [P, V]``); their indices per parent."""
    values, tokens = probs.topk(min(k, probs.shape[-1]), dim=-1)
    logs = torch.log(values).tolist()
    return [
        [tree.add(parent, t, v, lv) for t, v, lv in zip(tok, val, lg, strict=True)]
        for parent, tok, val, lg in zip(parents, tokens.tolist(), values.tolist(), logs, strict=True)
    ]


def grow_tree(head: HeadRunner, seq: torch.Tensor, root: int, depth: int, top_k: int, n_nodes: int) -> DraftTree:
    """EAGLE-2's expansion: at each depth the ``top_k`` most confident new nodes are fed to the
    head and each adds its ``top_k`` best continuations; then the re-ranking to ``n_nodes``."""
    feature, probs = head.catch_up(seq, root)
    tree = DraftTree(root)
    frontier = _add_best(tree, [-1], probs[None], top_k)[0]
    parent_feature = {j: feature for j in frontier}
    fed: list[int] = []
    for _ in range(depth - 1):
        visible = tree.visible(fed + frontier)[len(fed) :]
        features = torch.cat([parent_feature[j] for j in frontier], dim=1)
        tokens = [tree.tokens[j] for j in frontier]
        positions = [tree.position(j) for j in frontier]
        path = fed + frontier  # a node deep below the root reads its row above on its own path
        neighbours = head.target.tree_neighbours(
            seq, root, [tree.position(j) for j in path], [tree.tokens[j] for j in path], visible
        )
        predicted, child_probs = head.expand(features, tokens, positions, visible, root, neighbours)
        fed += frontier
        born = []
        for i, children in enumerate(_add_best(tree, frontier, child_probs, top_k)):
            for child in children:
                parent_feature[child] = predicted[:, i : i + 1]
            born += children
        frontier = sorted(born, key=lambda c: (-tree.scores[c], c))[:top_k]
    return tree.select(n_nodes)


def _record(rnd, tree: DraftTree, verdict, p_accept) -> None:
    """The round's grids: along the walked path (then the most confident continuation) the draft
    tokens, accepted ones, the first rejected position; the tree itself in ``rnd.tree``."""
    node, draft, score = -1, rnd.draft.reshape(-1), rnd.score.reshape(-1)
    while True:
        children = tree.children(node)
        if not children:
            break
        node = next((c for c in children if verdict.status[c] == ACCEPTED), children[0])
        pos = tree.position(node)
        draft[pos] = tree.tokens[node]
        if p_accept[node] >= 0:
            score[pos] = min(p_accept[node], 1.0)
        if verdict.status[node] == ACCEPTED:
            rnd.accepted.reshape(-1)[pos] = 1
        elif verdict.status[node] == REJECTED:
            for grid in (rnd.rejected, rnd.reopened):
                grid.reshape(-1)[pos] = 1
            rnd.t0 = pos if rnd.t0 is None else rnd.t0
    rnd.tree = {
        "root": tree.root,
        "token": list(tree.tokens),
        "parent": list(tree.parents),
        "depth": list(tree.depths),
        "q": [round(q, 6) for q in tree.q],
        "status": list(verdict.status),
        "next": verdict.next_token,
        "emptied": verdict.emptied,
    }


def exact_verifier(ctx: DecodeContext, target):
    """EAGLE-2's verification: the lossless walk over the request's sampling distributions.

    A verifier is made once per request; it takes the tree, the tree pass's guided logits and
    each fed node's row in them, and returns the ``TreeVerdict``."""

    def verify(tree: DraftTree, logits: torch.Tensor, row: dict[int, int], n_total: int):
        probs = target.probs(logits).cpu()
        return verify_tree(tree, probs[0], {j: probs[i] for j, i in row.items()}, n_total, ctx.generator)

    return verify


def generate(ctx: DecodeContext, verifier=exact_verifier):
    """EAGLE-2's rounds; ``verifier(ctx, target)`` makes the test of the trees (LANTERN's relaxed
    one is ``mulo.methods.lantern``)."""
    fam, knobs = ctx.family, ctx.config  # the registry checked that fam has a head
    height, width = ctx.grid
    n_total = height * width
    n_nodes = knobs.tree_budget - 1  # the budget counts the root, as EAGLE-2's does
    target = ctx.runner(fam.target, "target", scratch=n_nodes)
    verify = verifier(ctx, target)
    head = HeadRunner(fam.eagle_head, target, scratch=knobs.tree_top_k * max(knobs.tree_depth - 1, 1))
    ctx.runners["drafter"].append(head)
    x = torch.full((n_total,), -1, dtype=torch.long)
    rnd = ctx.new_round("round 0", x)
    with ctx.phase("verify"):
        x[0] = ctx.sample(target.probs(target.prefill()))
    head.set_features(range(target.n_cond), target.cond_hidden)
    rnd.resampled.reshape(-1)[0] = 1
    n = 0
    while n < n_total - 1:
        if rnd is None:
            rnd = ctx.new_round(f"round {ctx.round_count}", x)
        with ctx.phase("drafter"):
            depth = min(knobs.tree_depth, n_total - 1 - n)
            tree = grow_tree(head, x, n, depth, knobs.tree_top_k, n_nodes)
        with ctx.phase("verify"):
            fed = [j for j in range(len(tree)) if tree.position(j) <= n_total - 2]  # the last is never fed
            logits, hidden = target.feed_tree(
                x, n, [tree.position(j) for j in fed], [tree.tokens[j] for j in fed], tree.visible(fed)
            )
            row = {j: 1 + i for i, j in enumerate(fed)}
            verdict = verify(tree, logits, row, n_total)
            path = verdict.path
            for j in path:
                x[tree.position(j)] = tree.tokens[j]
            kept = [j for j in path if j in row]
            kept_positions = [tree.position(j) for j in kept]
            target.commit_tree([row[j] - 1 for j in kept], kept_positions, [tree.tokens[j] for j in kept])
            head.set_features(
                [target.n_cond + n] + [target.n_cond + pos for pos in kept_positions],
                hidden[:, [0] + [row[j] for j in kept]],
            )
            n += len(path)
            if verdict.next_token is not None:
                n += 1
                x[n] = verdict.next_token
                rnd.resampled.reshape(-1)[n] = 1
        _record(rnd, tree, verdict, verdict.accept_prob)
        yield ctx.close(rnd, x)
        rnd = None
    if rnd is not None:  # a one-token image: round 0 sampled it
        yield ctx.close(rnd, x)
    return x.reshape(height, width)
