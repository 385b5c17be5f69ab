"""A model bound to one request: its condition, CFG batch, KV cache and forward-pass count.

Positions here are image positions ``v`` in raster order: feeding token ``v`` (at slot
``n_cond + v``) yields the logits of position ``v + 1``; the prefill's last slot yields the
logits of position 0.

The runner alone keeps the cache's bookkeeping. Methods pass the token sequence they mean
(``seq``, flat, -1 = unknown) and ask for logits; the runner re-feeds whatever its slots hold out
of date on the way, in the same forward pass. It mirrors what each slot holds (``_fed``) and
where K/V went stale (``_stale_from``: slots whose tokens are right but whose K/V were computed
in a context that has since changed, set by ``mark_stale``). ``refresh`` (fixed per runner)
decides how far a change reaches: True re-feeds every known slot after the first out-of-date
one, so contexts stay exact; False re-feeds only slots that hold another token (MuLo-SD's
stale-KV ablation). Passes over final tokens only (MuLo-SD's islands) keep a second mark,
``_final_context``: stale slots already re-encoded seeing only final tokens, so each is re-fed
once there; causal passes still re-feed them all, since those K/V saw holes, not the prefix.

Masks are built on the model's device. Shapes are ``exact`` by default on a CPU (each pass's
queries, and keys up to the last slot one of them can see) and ``fixed`` on an accelerator
(``fixed_shapes``): every pass attends over the whole cache and its queries are padded to a power
of two with queries that write and see only a junk slot at the cache's end, so a method's passes
take a handful of shapes (what CUDA graphs replay) for the same tokens (tests/test_shapes.py).
"""

from __future__ import annotations

import torch

from mulo.graphs import PassGraphs
from mulo.models.gpt import GPT, KVCache
from mulo.sampling import cfg_combine, graph_knobs, logits_to_probs, sample


class ModelRunner:
    def __init__(
        self,
        model: GPT,
        cond: torch.Tensor,
        guidance: float,
        temperature: float,
        top_k: int,
        top_p: float,
        refresh: bool = True,
        scratch: int = 0,
        fixed_shapes: bool | None = None,
        graphs: str = "auto",
    ):
        self.model = model
        self.guidance = guidance
        self.sampling = (temperature, top_k, top_p)
        self.refresh = refresh
        param = next(model.parameters())
        cond = cond.to(param.device)[None]
        if cond.is_floating_point():  # features (not token ids): in the model's dtype (bf16 on a GPU)
            cond = cond.to(param.dtype)
        batch = torch.cat([cond, model.null_condition(cond)]) if guidance != 1 else cond
        with torch.no_grad():
            self.cond_embeddings = model.embed_condition(batch)  # [B, T, dim]
        self.n_cond = self.cond_embeddings.shape[1]
        self.n_image = model.config.max_seq_len
        self.grid = model.config.grid_hw
        self.vocab_size = model.config.vocab_size
        self.device = param.device
        # Slots past the image's (``scratch``) hold draft-tree nodes: several candidates per position;
        # with fixed shapes, one more (the junk slot) takes the padding queries' K/V.
        self.n_main = self.n_cond + self.n_image - 1
        self.n_scratch = scratch
        self.fixed_shapes = param.device.type != "cpu" if fixed_shapes is None else fixed_shapes
        n_slots = self.n_main + scratch + int(self.fixed_shapes)
        self.cache = KVCache(model.config, batch.shape[0], param.device, param.dtype, n_slots)
        with torch.no_grad():  # a column-object model's per-request input, read by every pass
            self.cache.position_inputs = model.position_inputs(batch)
        self.junk = n_slots - 1 if self.fixed_shapes else None
        self.graphs = _graphs(graphs, self.fixed_shapes, model, self.cache)
        self._fed = torch.full((self.n_image,), -1, dtype=torch.long)  # token at each image slot
        # A neighbour-input model's slot also depends on the tokens above what it predicts: the ids
        # each slot was fed with (``GPT.neighbours_of``), so a slot whose row above has changed since
        # (an unknown token now known, a draft now resampled) counts as out of date. None otherwise.
        self._fed_neighbours = None
        if model.neighbour_embeddings is not None:
            self._fed_neighbours = torch.full((self.n_image, 3), -1, dtype=torch.long)
        self._tree_neighbours = None  # the last draft tree's nodes' (``feed_tree``, ``commit_tree``)
        # Slots before this one were checked to have read the row above that ``_fed`` gives them
        # (``_in_step``): a step then checks only the slots written since, not the whole prefix.
        self._neighbours_checked = 0
        self._stale_from = self.n_image
        self._final_context = torch.zeros(self.n_image, dtype=torch.bool)
        self.nfe = 0
        self.widths: list[int] = []  # tokens fed by each forward pass (the bench prices passes by width)
        self.precisions: dict[str, int] = {}  # passes per precision their layers ran in (mulo.wide)
        self._dtype = str(param.dtype).removeprefix("torch.")
        self.first_logits: torch.Tensor | None = None
        self._graph_knobs = None  # the sampling knobs as the sampled step's tensors, made at first use

    # -- forward passes ----------------------------------------------------------------------
    def _guided(self, logits: torch.Tensor) -> torch.Tensor:
        if logits.shape[0] == 1:
            return logits[0]
        return cfg_combine(logits[0], logits[1], self.guidance)

    @torch.no_grad()
    def prefill(self) -> torch.Tensor:
        """Write the condition slots; returns the guided logits of image position 0 ``[V]``."""
        slots = torch.arange(self.n_cond, device=self.device)
        mask = torch.ones(self.n_cond, self.n_cond, dtype=torch.bool, device=self.device).tril()
        hidden = self.model.forward_hidden(self.cond_embeddings, slots, mask, self.cache)
        self._count(self.n_cond)
        self.cond_hidden = hidden  # per CFG branch [B, T, dim]: what an EAGLE head reads
        self.first_logits = self._guided(self.model.output(hidden[:, -1:]).float())[0]
        return self.first_logits

    @torch.no_grad()
    def _feed(
        self, positions: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor, view: torch.Tensor
    ) -> torch.Tensor:
        """Feed ``tokens [Q]`` at image ``positions [Q]`` under ``mask [Q, S']`` in one forward pass,
        a neighbour-input model reading the row above from ``view`` (flat, -1 = unknown: the tokens
        its queries may see).

        Returns guided logits ``[Q, V]``; row q predicts position ``positions[q] + 1``.
        """
        logits, _ = self._feed_hidden(positions, tokens, mask, neighbours=self.neighbours(view, positions))
        return logits

    def neighbours(self, view: torch.Tensor, positions: torch.Tensor) -> torch.Tensor | None:
        """The row-above ids ``[Q, 3]`` of inputs at image ``positions`` (each predicting the next
        position) read from ``view``, or None for a model that reads none."""
        if self._fed_neighbours is None:
            return None
        return self.model.neighbours_of(view.cpu(), torch.as_tensor(positions, dtype=torch.long).cpu() + 1)

    def _step_neighbours(self, position: int) -> torch.Tensor | None:
        """``neighbours(_fed, [position])`` for a single-token step (in step, the slots before it
        hold the sequence), in plain integers: 7.8 us a step against 116 us through
        ``upper_neighbours``'s tensor operations (1,024-token grid, measured in one run)."""
        if self._fed_neighbours is None:
            return None
        none, width = self.vocab_size, self.grid[1]
        row, col = divmod(position + 1, width)
        ids = [none] * 3
        if row > 0:
            for i, shift in enumerate((-1, 0, 1)):
                if 0 <= col + shift < width:
                    token = int(self._fed[position + 1 - width + shift])
                    ids[i] = token if token >= 0 else none
        return torch.tensor([ids])

    def embed(self, tokens: torch.Tensor, neighbours: torch.Tensor | None) -> torch.Tensor:
        """Inputs ``[B, Q, dim]`` of ``tokens [Q]`` (and their ``neighbours``) for every CFG branch."""
        if neighbours is not None:
            neighbours = neighbours.to(self.device)
        embedded = self.model.embed_tokens(tokens.to(self.device), neighbours)
        return embedded[None].expand(self.cache.k.shape[1], -1, -1)

    @torch.no_grad()
    def _feed_hidden(self, positions, tokens, mask, slots=None, neighbours=None):
        """``_feed``, also returning the per-branch hidden state ``[B, Q, dim]``; ``slots`` (default:
        the positions' own) are where K/V go (scratch slots for tree nodes, which are not recorded
        as fed: their positions' own slots are untouched). ``mask`` is on the model's device;
        ``neighbours [Q, 3]``: a neighbour-input model's row-above ids of each input."""
        positions = positions.to(torch.long).cpu()
        if int(positions.max()) >= self.n_image - 1 or int(positions.min()) < 0:
            raise ValueError(f"image positions must be in [0, {self.n_image - 2}] to be fed")
        tokens = tokens.to(torch.long).cpu()
        n = len(positions)
        pe_slots = positions + self.n_cond
        cache_slots = pe_slots if slots is None else torch.as_tensor(slots, dtype=torch.long).cpu()
        fed_neighbours = neighbours
        if self.fixed_shapes:
            mask, pad = pad_mask(mask, self.cache.n_slots, self.junk), query_bucket(n) - n
            tokens, pe_slots = pad_rows(tokens, pad, 0), pad_rows(pe_slots, pad, self.n_cond)
            cache_slots = pad_rows(cache_slots, pad, self.junk)
            if neighbours is not None:
                neighbours = pad_rows(neighbours, pad, self.vocab_size)
        graphed = None if self.graphs is None else self.graphs(tokens, pe_slots, cache_slots, mask, neighbours)
        if graphed is not None:
            hidden, logits = graphed[0][:, :n], graphed[1][:, :n]
        else:
            embeddings = self.embed(tokens, neighbours)
            hidden = self.model.forward_hidden(
                embeddings, cache_slots.to(self.device), mask, self.cache, pe_slots.to(self.device)
            )[:, :n]
            logits = self.model.output(hidden).float()
        self._count(len(tokens))  # padding included: what the pass computed
        if slots is None:
            self._fed[positions] = tokens[:n]
            if self._fed_neighbours is not None:
                self._fed_neighbours[positions] = fed_neighbours
                self._neighbours_checked = min(self._neighbours_checked, int(positions.min()))
        return self._guided(logits), hidden

    def _count(self, width: int) -> None:
        """Record a pass of ``width`` tokens that just ran: NFE, its width and its precision."""
        self.nfe += 1
        self.widths.append(width)
        wide = self.model.wide
        precision = self._dtype if wide is None else wide.precision(self.cache.k.shape[1], width)
        self.precisions[precision] = self.precisions.get(precision, 0) + 1

    @property
    def graph_state(self) -> str:
        """How this runner's passes ran: ``eager``, ``compiled steps`` (single-token passes from
        ``mulo.compiled``), ``graphs`` (CUDA graphs), ``emulated graphs`` (the static-buffer path run
        eagerly: CPU tests), or ``eager (fallback: why)``."""
        if self.graphs is None:
            compiled = self.model.compiled
            return "eager" if compiled is None else compiled.state(self.cache.k.shape[1])
        if self.graphs.fallback:
            return f"eager (fallback: {self.graphs.fallback})"
        return "graphs" if self.graphs.mode == "cuda" else "emulated graphs"

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """The distribution this request samples from (temperature, top-k, top-p)."""
        return logits_to_probs(logits, *self.sampling)

    # -- what methods ask for ----------------------------------------------------------------
    def next_logits(self, seq: torch.Tensor, u: int) -> torch.Tensor:
        """Guided logits ``[V]`` of position ``u`` given ``seq[:u]`` (position 0: the prefill's)."""
        if u == 0:
            return self.first_logits
        last = u - 1
        if self._in_step(seq, last):
            return self._feed_one(last, int(seq[last]))[0]
        logits, _ = self._feed_through(seq, last)
        return logits[-1]

    def sample_next(self, seq: torch.Tensor, u: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """A token for position ``u`` given ``seq[:u]``, drawn with ``generator``, and the distribution
        ``[V]`` it was drawn from: ``sampling.sample(probs(next_logits(seq, u)))``, and the same
        draw from the generator. A step that feeds one token runs as the model's sampled step when it
        has one (``mulo.compiled``): noise drawn here as ``multinomial`` draws it, the rest compiled."""
        last = u - 1
        compiled = self.model.compiled
        if compiled is not None and self.graphs is None and self.sampling[0] > 0 and u > 0 and self._in_step(seq, last):
            if self._graph_knobs is None:
                self._graph_knobs = graph_knobs(self.guidance, *self.sampling, self.vocab_size)
            token = int(seq[last])
            neighbours = self._step_neighbours(last)
            with torch.no_grad():
                out = compiled.sampled(token, self.n_cond + last, self.cache, self._graph_knobs, generator, neighbours)
            if out is not None:  # (None: no package yet, compiling in the background)
                self._record_step(last, token, neighbours)
                return out[2][0], out[1][0]
        probs = self.probs(self.next_logits(seq, u))
        return sample(probs.float().cpu(), generator), probs

    def _record_step(self, position: int, token: int, neighbours: torch.Tensor | None) -> None:
        """The bookkeeping of one fed slot (``_feed_one``'s)."""
        self._count(1)
        self._fed[position] = token
        if neighbours is not None:
            self._fed_neighbours[position] = neighbours[0]
            # it read ``_fed`` itself, so it is checked if every slot before it was; the ones after it
            # may have read the token it replaced
            checked = self._neighbours_checked
            self._neighbours_checked = position + 1 if checked >= position else checked
        if self._stale_from <= position:
            self._stale_from = position + 1

    def _in_step(self, seq: torch.Tensor, last: int) -> bool:
        """Whether feeding ``last`` alone brings the cache in line with ``seq`` (AR's and every
        chain's step: every slot before it holds ``seq`` and none is stale), on exact shapes."""
        return (
            not self.fixed_shapes
            and self._stale_from >= last
            and 0 <= last < self.n_image - 1
            and torch.equal(self._fed[:last], seq[:last])
            and self._neighbours_in_step(last)
        )

    def _neighbours_in_step(self, last: int) -> bool:
        """Whether every slot before ``last`` read the row above ``_fed`` gives it (which, in step,
        holds ``seq``); only the slots written since the last such check are looked at."""
        if bool(self._neighbours_outdated(self._fed, last, first=self._neighbours_checked).any()):
            return False
        self._neighbours_checked = max(self._neighbours_checked, last)
        return True

    def _neighbours_outdated(self, view: torch.Tensor, limit: int, first: int = 0) -> torch.Tensor:
        """``[limit - first]``: the slots ``first .. limit - 1`` fed with other row-above ids than
        ``view`` gives them now (all False for a model that reads none)."""
        if self._fed_neighbours is None or limit <= first:
            return torch.zeros(max(limit - first, 0), dtype=torch.bool)
        now = self.neighbours(view[:limit], torch.arange(first, limit))
        return (self._fed_neighbours[first:limit] != now).any(-1)

    @torch.no_grad()
    def _feed_one(self, position: int, token: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``_feed_through(seq, position)`` when ``_in_step``: the one query sees every slot up to
        its own (the causal row), without the general path's scans. Returns the guided logits
        ``[V]`` of ``position + 1`` and the hidden state ``[B, 1, dim]``."""
        slot = self.n_cond + position
        neighbours = self._step_neighbours(position)
        embeddings = self.embed(torch.tensor([token]), neighbours)
        mask = torch.ones(1, slot + 1, dtype=torch.bool, device=self.device)
        hidden = self.model.forward_hidden(embeddings, torch.tensor([slot], device=self.device), mask, self.cache)
        logits = self.model.output(hidden).float()
        self._record_step(position, token, neighbours)
        return self._guided(logits)[0], hidden

    def span_probs(self, seq: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
        """Distributions ``[min(hi, n) - lo, V]`` (CPU) of positions ``lo .. hi-1`` given ``seq``, in
        one causal pass over tokens ``lo-1 .. hi-2`` (and any out-of-date slot before them)."""
        rows = [self.first_logits[None]] if lo == 0 else []
        last = min(hi - 2, self.n_image - 2)
        if last >= max(lo - 1, 0):
            logits, positions = self._feed_through(seq, last, include=torch.arange(max(lo - 1, 0), last + 1))
            rows.append(logits[positions >= lo - 1])
        return self.probs(torch.cat(rows)).cpu()

    def mark_stale(self, position: int) -> None:
        """Slots from ``position`` on hold the right tokens but K/V computed in a context that has
        changed since (a rejected draft, a re-committed prefix): re-feed them when next reached."""
        self._stale_from = min(self._stale_from, position)
        self._final_context[position:] = False

    def feed_refreshing(self, positions: torch.Tensor, tokens: torch.Tensor, seq: torch.Tensor) -> torch.Tensor:
        """Feed ``tokens`` at ``positions`` causally (ZipAR: one input per active row, some of them
        proxies), re-feeding in the same pass each slot before the last one that is out of date
        with ``seq`` (each on its own: a replaced proxy does not invalidate the slots after it).
        Returns the guided logits of ``positions``."""
        extra = self._outdated(seq, int(positions.max()), contiguous=False)
        extra = extra[~torch.isin(extra, positions)]
        order = torch.cat([extra, positions])
        logits = self._feed(order, torch.cat([seq[extra], tokens]), self._causal_mask(order), seq)
        self._stale_from = self.n_image  # every stale slot before the inputs was just re-fed
        return logits[len(extra) :]

    def feed_over_final(
        self, inputs: torch.Tensor, tokens: torch.Tensor, seq: torch.Tensor, final, proxied
    ) -> torch.Tensor:
        """Feed ``tokens`` at ``inputs``, each query seeing the condition, its own slot and only the
        ``final`` positions before it (MuLo-SD's island resampling), plus the ``proxied`` ones:
        row ends that hold ZipAR's proxy, seen as ZipAR's own queries see them (the target was
        trained so). A final token whose slot still holds something else (an island row's last
        token, never fed as an input; a proxy's true token) is written in the same pass, and so,
        with ``refresh``, is a final slot marked stale (an accepted draft whose K/V the
        verification computed while rejected drafts were visible): it is re-encoded seeing only
        final tokens, once. Every slot a query sees then carries K/V computed over final tokens
        (and ZipAR's proxies) only. Returns the guided logits of ``inputs``."""
        limit = int(inputs.max())
        view = torch.where(final, seq, -1)  # the row above as these queries may see it: final tokens
        outdated = (self._fed[:limit] != seq[:limit]) | self._neighbours_outdated(view, limit)
        if self.refresh:
            outdated |= (torch.arange(limit) >= self._stale_from) & ~self._final_context[:limit]
        rewrite_mask = outdated & final[:limit]
        rewrite_mask[inputs[inputs < limit]] = False
        rewrite = rewrite_mask.nonzero()[:, 0]
        positions = torch.cat([rewrite, inputs])
        mask = self._final_mask(positions, final | proxied)
        logits = self._feed(positions, torch.cat([seq[rewrite], tokens]), mask, view)
        self._final_context[positions] = True
        return logits[len(rewrite) :]

    def feed_tree(self, seq: torch.Tensor, root: int, positions, tokens, visible: torch.Tensor):
        """Verify a draft tree in one pass (EAGLE): the root token ``seq[root]`` at its own slot and
        node ``j`` (``tokens[j]`` at image ``positions[j]``) at scratch slot ``j``, seeing the
        committed prefix, the root and the nodes ``visible[j]`` marks (its ancestors and itself),
        never a sibling's branch. Slots before ``root`` must already hold ``seq``.

        Returns ``(logits [1 + M, V]`` (guided, on the model's device; row 0 the root's,
        predicting ``root + 1``), hidden ``[B, 1 + M, dim])``: a verifier picks the distribution
        it tests with (``probs``: the request's sampling; LANTERN's greedy rule: the softmax)."""
        if bool((self._fed[:root] != seq[:root]).any()) or root >= self.n_image - 1:
            raise RuntimeError("a draft tree must grow from a fed prefix and a root that can be fed")
        m = len(tokens)
        if m > self.n_scratch:
            raise ValueError(f"a tree of {m} nodes does not fit in {self.n_scratch} scratch slots")
        positions = torch.as_tensor(positions, dtype=torch.long)
        all_positions = torch.cat([torch.tensor([root]), positions])
        slots = torch.cat([torch.tensor([self.n_cond + root]), self.n_main + torch.arange(m)])
        mask = torch.zeros(1 + m, self.n_main + m, dtype=torch.bool, device=self.device)
        mask[:, : self.n_cond + root + 1] = True  # condition, committed prefix and the root
        mask[1:, self.n_main :] = visible.to(self.device)
        nodes = torch.as_tensor(tokens, dtype=torch.long)
        tokens = torch.cat([seq[root : root + 1], nodes])
        self.cache.written[self.n_main :] = False  # the last tree's nodes (and the junk slot) are gone
        neighbours = None
        if self._fed_neighbours is not None:
            self._tree_neighbours = self.tree_neighbours(seq, root, positions, nodes, visible)
            neighbours = torch.cat([self.neighbours(seq, [root]), self._tree_neighbours])
        logits, hidden = self._feed_hidden(all_positions, tokens, mask, slots, neighbours)
        self._fed[root] = seq[root]
        if neighbours is not None:
            self._fed_neighbours[root] = neighbours[0]
            self._neighbours_checked = min(self._neighbours_checked, root)
        return logits, hidden

    def tree_neighbours(self, seq, root: int, positions, tokens, visible: torch.Tensor) -> torch.Tensor | None:
        """Row-above ids ``[R, 3]`` of the last ``R`` of ``M`` draft-tree nodes (``tokens [M]`` at
        image ``positions [M]``, grown after ``seq``'s committed prefix up to ``root``); ``visible
        [R, M]`` marks each one's path (its ancestors and itself). A node deep enough below the
        root (a grid width) has its row above on its own path, not in ``seq``."""
        if self._fed_neighbours is None:
            return None
        positions = torch.as_tensor(positions, dtype=torch.long)
        tokens = torch.as_tensor(tokens, dtype=torch.long)
        visible = visible.cpu()
        prefix = seq.clone()
        prefix[root + 1 :] = -1
        views = prefix.expand(visible.shape[0], -1).clone()  # each node's path laid over the prefix
        row, node = visible.nonzero(as_tuple=True)
        views[row, positions[node]] = tokens[node]
        own = positions[positions.numel() - visible.shape[0] :]
        return self.model.neighbours_of(views, own[:, None] + 1)[:, 0]

    def commit_tree(self, nodes, positions, tokens) -> None:
        """The accepted path's nodes (scratch indices) become the prefix: their K/V, computed in
        exactly the committed context, move to their positions' own slots."""
        if not len(nodes):
            return
        src = (self.n_main + torch.as_tensor(nodes, dtype=torch.long)).to(self.device)
        dst = (self.n_cond + torch.as_tensor(positions, dtype=torch.long)).to(self.device)
        self.cache.k[:, :, :, dst] = self.cache.k[:, :, :, src]
        self.cache.v[:, :, :, dst] = self.cache.v[:, :, :, src]
        self.cache.written[dst] = True
        self._fed[torch.as_tensor(positions, dtype=torch.long)] = torch.as_tensor(tokens, dtype=torch.long)
        if self._fed_neighbours is not None:  # fed on their path, which is now the prefix
            nodes = torch.as_tensor(nodes, dtype=torch.long)
            self._fed_neighbours[torch.as_tensor(positions, dtype=torch.long)] = self._tree_neighbours[nodes]
            self._neighbours_checked = min(self._neighbours_checked, min(positions))

    # -- masks over cache slots (built on the model's device) ---------------------------------
    def _width(self, positions: torch.Tensor) -> int:
        """Key slots a pass over ``positions`` attends over: up to the last one a query can see
        (exact shapes), or the whole cache (fixed shapes)."""
        return self.cache.n_slots if self.fixed_shapes else self.n_cond + int(positions.max()) + 1

    def _causal_mask(self, positions: torch.Tensor) -> torch.Tensor:
        """Each query sees the condition and every written slot up to its own."""
        slots = torch.arange(self._width(positions), device=self.device)
        return slots[None, :] <= (positions.to(self.device)[:, None] + self.n_cond)

    def _final_mask(self, positions: torch.Tensor, final: torch.Tensor) -> torch.Tensor:
        """Each query sees the condition, its own slot and the *final* image positions before it."""
        width = self._width(positions)
        image = torch.arange(width - self.n_cond, device=self.device)
        queries = positions.to(self.device)[:, None]
        final = torch.nn.functional.pad(final.to(self.device), (0, max(0, width - self.n_cond - len(final))))
        visible = (image[None, :] <= queries) & final[: width - self.n_cond][None, :]
        visible |= image[None, :] == queries
        cond = torch.ones(len(positions), self.n_cond, dtype=torch.bool, device=self.device)
        return torch.cat([cond, visible], dim=1)

    # -- keeping the cache in step with a token sequence -----------------------------------
    def _outdated(self, seq: torch.Tensor, limit: int, contiguous: bool) -> torch.Tensor:
        """Known positions ``< limit`` to re-feed so the cache agrees with ``seq``, in order.

        A slot is out of date when it holds another token or sits at or after ``_stale_from``;
        when ``contiguous`` every known slot after the first out-of-date one is included too,
        since its K/V saw the old token.
        """
        head = seq[:limit]
        pos = torch.arange(len(head))
        known = head >= 0
        bad = known & ((self._fed[:limit] != head) | (pos >= self._stale_from) | self._neighbours_outdated(seq, limit))
        if contiguous and bool(bad.any()):
            bad = known & (pos >= int(bad.nonzero()[0]))
        return pos[bad]

    def _feed_through(self, seq: torch.Tensor, last: int, include: torch.Tensor | None = None):
        """Bring every slot before ``last`` in line with ``seq`` and feed ``last`` (or the
        positions ``include``) in one causal pass. Returns ``(logits [Q, V], positions [Q])``,
        sorted by position, for every position fed."""
        positions = self._outdated(seq, last, self.refresh)
        extra = torch.tensor([last]) if include is None else include
        positions = torch.unique(torch.cat([positions, extra]))
        logits = self._feed(positions, seq[positions], self._causal_mask(positions), seq)
        if self._stale_from <= last:  # slots up to ``last`` were just re-encoded in order
            self._stale_from = last + 1
        return logits, positions


GRAPH_MODES = ("auto", "off", "cuda", "emulate")


def _graphs(mode: str, fixed_shapes: bool, model: GPT, cache: KVCache) -> PassGraphs | None:
    """The runner's graphed passes: ``auto`` = CUDA graphs on a CUDA device with fixed shapes;
    ``off``; ``cuda``; ``emulate`` (their static-buffer path, run eagerly; CPU tests)."""
    if mode not in GRAPH_MODES:
        raise ValueError(f"graphs must be one of {GRAPH_MODES} (got {mode!r})")
    if mode == "auto":
        mode = "cuda" if cache.k.device.type == "cuda" and fixed_shapes else "off"
    if mode == "off":
        return None
    if not fixed_shapes:
        raise ValueError("graphed passes need fixed shapes (every pass at a query bucket over the whole cache)")
    return PassGraphs(model, cache, mode)


def query_bucket(n: int) -> int:
    """The query count a fixed-shape pass of ``n`` queries runs at: the next power of two."""
    return 1 << max(0, n - 1).bit_length()


def pad_mask(mask: torch.Tensor, n_slots: int, junk: int) -> torch.Tensor:
    """``mask [Q, S']`` as a fixed-shape pass's ``[query_bucket(Q), n_slots]``: the padding queries
    see only the ``junk`` slot, which no real query sees."""
    q = mask.shape[0]
    full = torch.zeros(query_bucket(q), n_slots, dtype=torch.bool, device=mask.device)
    full[:q, : mask.shape[1]] = mask
    full[:q, junk] = False
    full[q:, junk] = True
    return full


def pad_rows(x: torch.Tensor, n: int, value, dim: int = 0) -> torch.Tensor:
    """``x`` with ``n`` more rows along ``dim``, filled with ``value`` (a fixed-shape pass's padding)."""
    shape = list(x.shape)
    shape[dim] = n
    return torch.cat([x, x.new_full(shape, value)], dim=dim)
