"""Turning logits into tokens, and the acceptance rules of speculative decoding.

Every function takes an explicit ``torch.Generator`` when it draws random numbers: one
generator per request, never the global RNG, so a request is reproducible from its seed.
"""

from __future__ import annotations

import torch


def cfg_combine(cond_logits: torch.Tensor, uncond_logits: torch.Tensor, scale: float) -> torch.Tensor:
    """Classifier-free guidance: ``u + scale * (c - u)``."""
    return uncond_logits + scale * (cond_logits - uncond_logits)


def logits_to_probs(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """The distribution a model samples from: temperature, then top-k, then top-p, in float32.

    ``temperature == 0`` is greedy decoding: a one-hot distribution on the arg-max, so every
    rule below (exact or pooled acceptance, residuals) treats greedy runs without special cases.
    Filtering follows Tar/LlamaGen: top-k keeps logits >= the k-th largest; top-p keeps the
    smallest prefix of the sorted distribution whose mass exceeds p (the top token always stays).
    """
    logits = logits.float()
    if temperature == 0:
        return torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    logits = logits / max(temperature, 1e-5)
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        drop_sorted = cumulative > top_p
        drop_sorted[..., 1:] = drop_sorted[..., :-1].clone()  # keep the first token over p
        drop_sorted[..., 0] = False
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return torch.softmax(logits, dim=-1)


def graph_probs(logits, temperature, top_k, top_p):
    """``logits_to_probs`` with its knobs as tensors and no branches, for a compiled
    graph: ``temperature > 0``; ``top_k`` in [1, V] (V: no cut); ``top_p`` above 1: no nucleus.
    The same operations on the same values: eagerly the two agree bit for bit (tests)."""
    logits = logits.float() / temperature
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    kth = sorted_logits.gather(-1, (top_k - 1).expand(*logits.shape[:-1], 1))
    logits = logits.masked_fill(logits < kth, float("-inf"))
    # The masked logits sort as the unmasked ones (only the tail became -inf): one sort serves both.
    sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, float("-inf"))
    over = sorted_logits.softmax(-1).cumsum(-1) > top_p
    drop_sorted = torch.cat([torch.zeros_like(over[..., :1]), over[..., :-1]], dim=-1)  # keep the first over p
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return torch.softmax(logits.masked_fill(drop, float("-inf")), dim=-1)


def graph_knobs(guidance: float, temperature: float, top_k: int, top_p: float, vocab_size: int):
    """A request's sampling knobs as ``graph_probs``'s and ``_SampledStep``'s tensors:
    ``(float32 [guidance, temperature, top_p], int64 [top_k])``."""
    k = top_k if 0 < top_k < vocab_size else vocab_size
    p = top_p if top_p < 1.0 else 2.0
    return torch.tensor([guidance, max(temperature, 1e-5), p]), torch.tensor([k])


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of ``probs [..., V]``; returns ``[...]`` int64."""
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])


def uniform(shape, generator: torch.Generator | None, device) -> torch.Tensor:
    return torch.rand(shape, generator=generator, device=device)


# -- codebook neighbours ----------------------------------------------------------------------


def codebook_neighbours(codebook: torch.Tensor, k: int, metric: str = "euclidean") -> torch.Tensor:
    """``[V, k]`` indices of each code's k nearest other codes, nearest first (self excluded).

    Euclidean distance on the raw codebook vectors, like LANTERN's table; ``cosine`` ranks by
    the angle instead (for L2-normalised codebooks the two orders agree). Computed in chunks so
    a 16384-entry codebook never needs the full V x V matrix at once.
    """
    if metric not in ("euclidean", "cosine"):
        raise ValueError(f"metric must be 'euclidean' or 'cosine' (got {metric!r})")
    vectors = codebook.detach().float()
    n = vectors.shape[0]
    if not 0 <= k < n:
        raise ValueError(f"k must be in [0, {n - 1}] for a codebook of {n} entries (got {k})")
    if metric == "cosine":
        vectors = torch.nn.functional.normalize(vectors, dim=-1)
    out = torch.empty(n, k, dtype=torch.long, device=vectors.device)
    if k == 0:
        return out
    sq = vectors.pow(2).sum(-1)
    for start in range(0, n, 1024):
        block = vectors[start : start + 1024]
        dist = sq[start : start + 1024, None] + sq[None] - 2 * block @ vectors.T
        rows = torch.arange(block.shape[0], device=vectors.device)
        dist[rows, rows + start] = float("inf")  # a code is not its own neighbour
        # A stable sort keeps ties in index order, so the table is deterministic.
        out[start : start + 1024] = torch.sort(dist, dim=-1, stable=True).indices[:, :k]
    return out


class NeighbourTable:
    """Nearest-codebook-neighbour table of one VQ codebook, computed once and kept.

    ``table(k)`` returns the first k columns; a larger k than any asked before recomputes once.
    """

    def __init__(self, codebook: torch.Tensor, metric: str = "euclidean"):
        self.codebook = codebook
        self.metric = metric
        self._table = torch.empty(codebook.shape[0], 0, dtype=torch.long)

    def table(self, k: int) -> torch.Tensor:
        if k > self._table.shape[1]:
            self._table = codebook_neighbours(self.codebook, k, self.metric)
        return self._table[:, :k]


# -- acceptance rules ---------------------------------------------------------------------------


def pooled_probability(probs: torch.Tensor, draft: torch.Tensor, neighbours: torch.Tensor) -> torch.Tensor:
    """MuLo-SD's pooled target probability: ``p(x) + sum of p over x's k nearest codes``.

    ``probs [N, V]``, ``draft [N]``, ``neighbours [V, k]`` (k may be 0: draft token only).
    """
    own = probs.gather(-1, draft[:, None])[:, 0]
    if neighbours.shape[1] == 0:
        return own
    return own + probs.gather(-1, neighbours[draft]).sum(-1)


def lantern_relaxed(
    probs: torch.Tensor, draft: torch.Tensor, neighbours: torch.Tensor, delta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """LANTERN's relaxed target probability ``p~(x) = p(x) + c_m``.

    ``c_m`` is the mass of the largest nearest-first neighbour set whose total stays within the
    total-variation budget: ``c_m <= delta`` (``delta > 1``: LANTERN++'s relative bound
    ``c_m <= (delta - 1) * p(x)``). Returns ``(p_tilde [N], pooled [N, k] bool)``, the second
    marking which neighbours were moved onto the draft token.
    """
    own = probs.gather(-1, draft[:, None])[:, 0]
    if neighbours.shape[1] == 0:
        return own, torch.zeros(draft.shape[0], 0, dtype=torch.bool, device=probs.device)
    cumulative = probs.gather(-1, neighbours[draft]).cumsum(-1)
    bound = torch.full_like(own, delta) if delta <= 1 else (delta - 1) * own
    pooled = cumulative <= bound[:, None]
    moved = (cumulative * pooled).amax(-1)  # cumulative sums are non-decreasing
    return own + moved, pooled


def speculative_accept(p_draft: torch.Tensor, q_draft: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Exact speculative sampling test: accept with probability ``min(1, p(x) / q(x))``."""
    u = uniform(p_draft.shape, generator, p_draft.device)
    return u * q_draft < p_draft  # strict: a token the target gives probability 0 never passes


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``norm(max(0, p - q))``: what to sample after a rejection so the output follows p.

    When p and q coincide the residual is empty (a rejection then has probability zero); fall
    back to p so callers always get a valid distribution.
    """
    residual = (p - q).clamp_min(0)
    total = residual.sum(-1, keepdim=True)
    return torch.where(total > 0, residual / total.clamp_min(1e-30), p)


def renormalised_or_uniform(weights: torch.Tensor) -> torch.Tensor:
    """``weights [V]`` scaled to sum to 1; uniform when nothing is left (LANTERN's fallback when a
    rejection has removed every code with mass)."""
    total = weights.sum()
    if total > 0:
        return weights / total
    return torch.full_like(weights, 1.0 / weights.numel())


def residual_without(p: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """The residual after rejecting a point-mass candidate: ``p [V]`` with ``codes`` set to zero,
    renormalised; uniform if nothing is left.

    EAGLE-2's candidates are the drafter's top-k, so each tried token is a point mass (q = 1 at
    it) and ``norm(max(0, p - 1_x))`` is p without x. LANTERN's code also drops the draft's first
    ``k + 1`` nearest codes when its test pooled neighbours, which can empty the residual: its
    fallback is the uniform distribution (EAGLE-2 never gets there: p(x) = 1 always passes).
    """
    out = p.clone()
    out[codes] = 0
    return renormalised_or_uniform(out)


def lantern_drafter_residual(p: torch.Tensor, q: torch.Tensor, nearest: torch.Tensor, pooled: bool) -> torch.Tensor:
    """LANTERN's residual after rejecting a draft sampled from ``q [V]``: ``norm(max(0, p - q'))``.

    ``q'`` is q with the draft's first ``k + 1`` nearest codes set to zero when the test pooled
    neighbours (their target mass was lent to the draft, so it is not taken off p again); the
    draft keeps its own q. Uniform if nothing is left. This is LANTERN's code for drafts that
    carry a drafter probability (its static trees); the chain variant uses it.
    """
    q_kept = q.clone()
    if pooled:
        q_kept[nearest] = 0
    return renormalised_or_uniform((p - q_kept).clamp_min(0))


def lantern_greedy_accepts(probs: torch.Tensor, draft: torch.Tensor, p_tilde: torch.Tensor) -> torch.Tensor:
    """LANTERN's greedy rule, per row of ``probs [N, V]``: the draft is accepted iff it is the
    arg-max once its own entry is raised to ``p_tilde [N]`` (its neighbours keep their mass; ties
    go to the lower code, as ``argmax`` breaks them). Returns ``[N]`` bool."""
    adjusted = probs.clone()
    adjusted[torch.arange(len(draft)), draft] = p_tilde
    return adjusted.argmax(-1) == draft
