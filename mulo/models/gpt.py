"""The AR image transformer shared by every family (Tar's AR-DTok / LlamaGen layout).

Sequence layout ("slots"): the condition prefix occupies slots 0..T-1 and image token ``v`` is
*fed* at slot ``T + v``. Because the logits of a slot predict the next token, the logits for
image position ``u`` come from slot ``T - 1 + u``: the last condition slot predicts token 0,
and feeding token ``u - 1`` predicts token ``u``. The learned absolute position embedding is
selected by slot, so decoding in any order only needs the right slots and attention mask.

The KV cache is static and slot-indexed: a forward pass writes K/V at arbitrary (possibly
non-contiguous) slots and every query attends to the cache through its own boolean row over
slots, intersected with the set of slots that have been written. A slot that was never
written is never attended to.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from mulo.models.kv_cache import KVCache, causal_offset

# (n_layer, n_head, dim) of the AR-DTok / LlamaGen size presets.
PRESETS: dict[str, tuple[int, int, int]] = {
    "llama-abs-S": (12, 6, 384),
    "llama-abs-B": (12, 12, 768),
    "llama-abs-L": (24, 16, 1024),
    "llama-abs-LP": (30, 20, 1280),  # Tar's released AR-DTok checkpoints (~632M parameters)
    "llama-abs-XL": (36, 20, 1280),
    "llama-abs-XXL": (48, 24, 1536),
    "llama-abs-XXXL": (48, 40, 2560),
    "llama-abs-tiny": (2, 4, 64),  # the golden reference files only
    "test-tiny": (2, 4, 32),  # unit tests and the toy family
}

COND_TYPES = ("features", "class", "indices")
NEIGHBOUR_INPUTS = (0, 3)  # none, or the row above's three (GPTConfig.neighbour_inputs)


def upper_neighbours(view: torch.Tensor, predicted: torch.Tensor, width: int, none: int) -> torch.Tensor:
    """The ids ``[..., Q, 3]`` a neighbour-input model adds at the slots predicting the raster
    positions ``predicted [..., Q]``: the tokens of ``view [..., n]`` (flat, -1 = unknown) above-left,
    above and above-right of each, and ``none`` where that cell is off the grid or unknown.
    ``predicted`` broadcasts against ``view``'s leading dimensions (one list for a batch of views,
    or one position per view)."""
    row, col = predicted // width, predicted % width
    lead = view.shape[:-1] + predicted.shape[-1:]
    ids = []
    for shift in (-1, 0, 1):
        inside = (row > 0) & (col + shift >= 0) & (col + shift < width)
        source = (predicted - width + shift).clamp(0, view.shape[-1] - 1)
        found = torch.gather(view, -1, torch.broadcast_to(source, lead))
        ids.append(torch.where(inside & (found >= 0), found, none))
    return torch.stack(ids, dim=-1)


def embed_inputs(tok_embeddings: nn.Embedding, neighbour_embeddings, tokens, neighbours) -> torch.Tensor:
    """Input embeddings of ``tokens [...]``, plus, for a neighbour-input model
    (``neighbour_embeddings``: its three tables), those of ``neighbours [..., 3]``."""
    x = tok_embeddings(tokens)
    if neighbour_embeddings is None:
        return x
    if neighbours is None:
        raise ValueError("this model reads the row above: its inputs need their neighbours (upper_neighbours)")
    for i, table in enumerate(neighbour_embeddings):
        x = x + table(neighbours[..., i])
    return x


# The 2D rotary's frequencies fall from 1 to ~1/100 radian a cell (wavelengths of 6 to ~470 cells):
# a 32-cell side spans them, where LlamaGen's base of 10,000 leaves most channels all but still.
ROPE_BASE = 100.0


def placed_slot(count: int, k: int) -> int:
    """The condition slot of the k-th (from the left) of ``count`` objects in placed symbols."""
    return 1 + count * (count - 1) // 2 + k


def placed_slots(max_objects: int) -> int:
    """Condition slots of placed symbols (``GPTConfig.condition_columns``): slot 0 (the background,
    the style) and one slot per object place of every count up to ``max_objects``; 0 for none."""
    return 1 + max_objects * (max_objects + 1) // 2 if max_objects else 0


def placed_column_centres(max_objects: int, width: int) -> dict[int, float]:
    """Condition slot -> the centre (in cells of a grid ``width`` wide) of the column its object lies
    in: the k-th of n equal columns for slot 1 + n(n - 1)/2 + k."""
    return {placed_slot(n, k): (k + 0.5) * width / n - 0.5 for n in range(1, max_objects + 1) for k in range(n)}


def rotary_2d_tables(
    cond_len: int, height: int, width: int, head_dim: int, still: float = 0.0, columns: int = 0
) -> torch.Tensor:
    """cos and sin ``[2, cond_len + height * width - 1, head_dim // 2, 2]`` of a 2D rotary position
    (``GPTConfig.rotary_2d``): row 0 rotates each slot's queries by the cell the slot predicts, row 1
    its keys by the cell of the token it is fed, so a score depends on (predicted cell) - (fed
    cell): the query predicting (r, c) meets the token above it, (r - 1, c), at offset (1, 0) on
    every row, with no wrap at a row's end. Half of each head's pairs turn with the row, half with
    the column; condition slots turn by nothing (a condition key has no cell; the last condition
    slot predicts cell (0, 0)). ``still``: the share of each axis's pairs left unturned, after the
    turning ones, whose frequencies still span 1 to 1/100 (``GPTConfig.rotary_still``). ``columns``:
    the object slots of placed symbols turn their keys' column pairs by their column's centre
    (``GPTConfig.condition_columns``)."""
    if head_dim % 4:
        raise ValueError(f"a 2D rotary needs a head dim divisible by 4 (got {head_dim})")
    quarter = head_dim // 4
    turning = quarter - round(quarter * still)
    freqs = torch.zeros(quarter, dtype=torch.float64)
    freqs[:turning] = ROPE_BASE ** (-torch.arange(turning, dtype=torch.float64) / max(turning, 1))
    cells = torch.arange(height * width)
    rows, cols = (cells // width).double(), (cells % width).double()
    angles = torch.cat([rows[:, None] * freqs, cols[:, None] * freqs], dim=1)  # [L, head_dim // 2]
    n_slots = cond_len + height * width - 1
    predicted = torch.zeros(n_slots, 2 * quarter, dtype=torch.float64)
    predicted[cond_len - 1 :] = angles  # slot T - 1 + u predicts cell u
    fed = torch.zeros(n_slots, 2 * quarter, dtype=torch.float64)
    fed[cond_len:] = angles[:-1]  # slot T + v is fed cell v
    for slot, centre in placed_column_centres(columns, width).items():
        fed[slot, quarter:] = centre * freqs
    both = torch.stack([predicted, fed])
    return torch.stack([both.cos(), both.sin()], dim=-1).float()


def rotate(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """``x [B, heads, Q, head_dim]`` with each pair of channels (2i, 2i + 1) turned by the angle whose
    cos and sin ``table [Q, head_dim // 2, 2]`` holds."""
    pairs = x.float().unflatten(-1, (-1, 2))
    a, b = pairs[..., 0], pairs[..., 1]
    cos, sin = table[..., 0].float(), table[..., 1].float()
    return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2).type_as(x)


@dataclass(frozen=True)
class GPTConfig:
    """Architecture of one AR image model.

    ``max_seq_len`` is the number of image tokens (H*W); ``cond_len`` the number of condition
    prefix tokens (Tar: 729 TA-Tok features; class conditioning: 1).
    """

    dim: int = 1280
    n_layer: int = 30
    n_head: int = 20
    n_kv_head: int | None = None  # grouped-query attention when smaller than n_head
    vocab_size: int = 16384
    max_seq_len: int = 256
    grid: tuple[int, int] | None = None  # (H, W); square sqrt(max_seq_len) when None
    cond_type: str = "features"  # features: linear projection; class/indices: embedding table
    cond_len: int = 729
    cond_dim: int = 1152  # feature width (features) or number of classes/indices (others)
    multiple_of: int = 256
    ffn_dim_multiplier: float | None = None
    norm_eps: float = 1e-5
    # Dropout on each residual branch while training (a regulariser; inference never drops).
    dropout: float = 0.0
    # 3: the slot that predicts token (r, c) also adds learned embeddings of the tokens above-left,
    # above and above-right of it, (r - 1, c - 1 .. c + 1) (``upper_neighbours``); 0: off (Tar, the
    # first families). Why: a grid's row above is 32 slots back, which a small target learns to find
    # by attention only slowly; fed directly, the scenes target learnt its objects 5x faster
    # (docs/notebook/session-2026-11-29-neighbours.md).
    neighbour_inputs: int = 0
    # Attention also turns queries and keys by their 2D cells (``rotary_2d_tables``; LlamaGen's images
    # use a 2D rotary), so "the token k rows up" is one relation on every slot, not one to learn per
    # slot through the absolute embedding. False: Tar and the first families.
    rotary_2d: bool = False
    # The share of each head's channel pairs the 2D rotary leaves unturned (0: all turn). A condition
    # key has no cell, so a turned query meets it with a score that changes from cell to cell: at
    # ROPE_BASE = 100 all but the slowest 4 of 16 pairs an axis turn by over a radian across a side of
    # 32, which leaves a small target few channels to find its prompt's words by content with.
    rotary_still: float = 0.0
    # A scenes model reading placed symbols (``placed_slot``, ``mulo.families.emoji.scene_symbols``): condition slot
    # 1 + n(n - 1)/2 + k holds the k-th of n objects, for up to this many, and its key turns by the
    # centre of the k-th of n equal columns (the column axis only), so "the object of my column" is
    # one rotary relation, not a count of names to learn. 0: condition keys turn by nothing.
    condition_columns: int = 0
    # A scenes model whose condition also carries the prompt's placed symbols (``placed_slot``'s
    # slots, one-hot over ``column_symbols`` names, colours and styles) as ``column_symbols`` channels
    # after its ``cond_dim`` features: the slot predicting (r, c) adds a learnt projection of the
    # background's symbols and of the symbols of the object whose column holds c (the k-th of n
    # objects for c in the k-th of n equal columns), as a class-conditional model adds its class to
    # every token. Why: read through the condition slots by attention, the prompt moved the first
    # row of an object the target began from 0.735 top-1 (null condition) to 0.813 only, and an object
    # the target began was never the named one (docs/notebook/session-2026-11-30-hazard.md). Zero-init,
    # so a trained model gains the input unchanged. 0: off.
    column_objects: int = 0
    column_symbols: int = 0

    @classmethod
    def preset(cls, name: str, **overrides) -> GPTConfig:
        if name not in PRESETS:
            raise ValueError(f"unknown GPT preset {name!r}; known: {', '.join(PRESETS)}")
        n_layer, n_head, dim = PRESETS[name]
        return cls(n_layer=n_layer, n_head=n_head, dim=dim, **overrides)

    @classmethod
    def from_json(cls, config: dict) -> GPTConfig:
        """From its JSON form (``dataclasses.asdict`` written as JSON: the grid as a list)."""
        grid = config.get("grid")
        return cls(**{**config, "grid": None if grid is None else tuple(grid)})

    def __post_init__(self):
        if self.cond_type not in COND_TYPES:
            raise ValueError(f"cond_type must be one of {COND_TYPES} (got {self.cond_type!r})")
        if self.dim % self.n_head:
            raise ValueError(f"dim {self.dim} is not divisible by n_head {self.n_head}")
        if self.n_head % self.kv_heads:
            raise ValueError(f"n_head {self.n_head} is not divisible by n_kv_head {self.kv_heads}")
        h, w = self.grid_hw
        if h * w != self.max_seq_len:
            raise ValueError(f"grid {h}x{w} does not hold max_seq_len={self.max_seq_len} tokens")
        if self.neighbour_inputs not in NEIGHBOUR_INPUTS:
            raise ValueError(f"neighbour_inputs must be one of {NEIGHBOUR_INPUTS} (got {self.neighbour_inputs!r})")
        if not 0.0 <= self.rotary_still < 1.0:
            raise ValueError(f"rotary_still must be in [0, 1) (got {self.rotary_still!r})")
        if self.rotary_2d and self.head_dim % 4:
            raise ValueError(f"rotary_2d needs a head dim divisible by 4 (dim {self.dim} / {self.n_head} heads)")
        if self.condition_columns and not self.rotary_2d:
            raise ValueError("condition_columns turns condition keys by their column: it needs rotary_2d")
        if self.condition_columns < 0 or placed_slots(self.condition_columns) > self.cond_len:
            raise ValueError(
                f"{self.condition_columns} objects by count and place need {placed_slots(self.condition_columns)} "
                f"condition slots; the model has {self.cond_len}"
            )

        if bool(self.column_objects) != bool(self.column_symbols) or min(self.column_objects, self.column_symbols) < 0:
            raise ValueError("column_objects and column_symbols go together: both positive or both 0")
        if self.column_objects and (self.cond_type != "features" or placed_slots(self.column_objects) > self.cond_len):
            raise ValueError(
                f"column_objects reads {placed_slots(self.column_objects)} placed slots of feature conditions; "
                f"the model has {self.cond_len} {self.cond_type} slots"
            )

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head or self.n_head

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_head

    @property
    def grid_hw(self) -> tuple[int, int]:
        if self.grid is not None:
            return tuple(self.grid)
        side = math.isqrt(self.max_seq_len)
        return (side, self.max_seq_len // max(side, 1))

    @property
    def ffn_hidden(self) -> int:
        hidden = int(2 * 4 * self.dim / 3)
        if self.ffn_dim_multiplier is not None:
            hidden = int(self.ffn_dim_multiplier * hidden)
        return self.multiple_of * ((hidden + self.multiple_of - 1) // self.multiple_of)

    @property
    def n_positions(self) -> int:
        # The last image token is never fed, so the slots are cond_len + max_seq_len - 1.
        return self.cond_len + self.max_seq_len - 1


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()  # the reference normalises in float32 whatever the model dtype
        out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return out.type_as(x) * self.weight


class FeedForward(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.w1 = nn.Linear(config.dim, config.ffn_hidden, bias=False)
        self.w3 = nn.Linear(config.dim, config.ffn_hidden, bias=False)
        self.w2 = nn.Linear(config.ffn_hidden, config.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Attention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        kv_dim = config.kv_heads * config.head_dim
        self.wqkv = nn.Linear(config.dim, config.dim + 2 * kv_dim, bias=False)
        self.wo = nn.Linear(config.dim, config.dim, bias=False)

    def forward(self, x, layer: int, slots, mask, cache: KVCache | None, rotary=None, causal_pad: int | None = None):
        """``rotary [2, Q, head_dim // 2, 2]``: a 2D-rotary model's query and key turns at the
        pass's positions (``GPT.rotary_at``); cached keys are stored turned. ``causal_pad``: the mask
        is causal up to its last key, offset by this many keys (``causal_offset``)."""
        return self.wo(self.attend(self.wqkv(x), layer, slots, mask, cache, rotary, causal_pad))

    def attend(self, qkv, layer: int, slots, mask, cache: KVCache | None, rotary=None, causal_pad=None):
        """Attention from the projected ``qkv [B, Q, dim + 2 kv_dim]`` to the heads' outputs
        ``[B, Q, dim]`` (before ``wo``): split, rotary, cache, the kernel. Separate from the products
        so that a compiled bf16 pass (``mulo.fused_layers``) can run them and keep this part eager.
        Keys and values read back from a float32 cache are attended in ``qkv``'s dtype."""
        config = self.config
        b, q_len, _ = qkv.shape
        kv_dim = config.kv_heads * config.head_dim
        q, k, v = qkv.split([config.dim, kv_dim, kv_dim], dim=-1)
        q = q.view(b, q_len, config.n_head, config.head_dim).transpose(1, 2)
        k = k.view(b, q_len, config.kv_heads, config.head_dim).transpose(1, 2)
        v = v.view(b, q_len, config.kv_heads, config.head_dim).transpose(1, 2)
        if rotary is not None:
            q, k = rotate(q, rotary[0]), rotate(k, rotary[1])
        if cache is not None:
            # (a bf16 pass, ``mulo.wide``, writes its K/V to the float32 cache)
            cache.k[layer][:, :, slots] = k.to(cache.k.dtype)
            cache.v[layer][:, :, slots] = v.to(cache.v.dtype)
            # Only look at the slot range some query can see: short prefixes stay cheap.
            k, v = (part[layer][:, :, : mask.shape[1]].to(qkv.dtype) for part in (cache.k, cache.v))
        gqa = config.kv_heads != config.n_head
        if mask is None:  # causal over the inputs: the fused kernel, faster than a boolean mask
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        elif causal_pad is not None:  # the same kernel over zero queries on top, dropped after
            q = F.pad(q, (0, 0, causal_pad, 0))
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)[:, :, causal_pad:]
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[None, None], enable_gqa=gqa)
        return out.transpose(1, 2).reshape(b, q_len, config.dim)


class TransformerBlock(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.attention = Attention(config)
        self.feed_forward = FeedForward(config)
        self.attention_norm = RMSNorm(config.dim, config.norm_eps)
        self.ffn_norm = RMSNorm(config.dim, config.norm_eps)
        self.drop = nn.Dropout(config.dropout)  # identity in eval mode and at p = 0

    def forward(self, h, layer, slots, mask, cache, rotary=None, causal_pad=None):
        h = h + self.drop(self.attention(self.attention_norm(h), layer, slots, mask, cache, rotary, causal_pad))
        return h + self.drop(self.feed_forward(self.ffn_norm(h)))


class GPT(nn.Module):
    """Decoder-only transformer over [condition prefix, image tokens].

    Parameter names follow Tar's AR-DTok checkpoints (``clip_proj`` is the feature projection),
    so the original state dicts load without renaming.
    """

    # A ``mulo.compiled.StepCompiler`` when single-token steps run compiled (``Engine(compile=)``).
    compiled = None
    # A ``mulo.wide.WidePasses`` when wide passes may run in bfloat16 (``Engine(wide_precision=)``).
    wide = None

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        if config.cond_type == "features":
            self.clip_proj = nn.Linear(config.cond_dim, config.dim)
        else:
            # One extra row: the classifier-free-guidance null condition.
            self.cond_embedding = nn.Embedding(config.cond_dim + 1, config.dim)
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.dim)
        # The row above's tables (``neighbour_inputs``), each with a last row for "none": off the grid
        # or unknown. Absent otherwise, so Tar's state dicts and the first families load unchanged.
        self.neighbour_embeddings = None
        if config.neighbour_inputs:
            tables = (nn.Embedding(config.vocab_size + 1, config.dim) for _ in range(config.neighbour_inputs))
            self.neighbour_embeddings = nn.ModuleList(tables)
        self.abs_pe = nn.Parameter(torch.zeros(1, config.n_positions, config.dim))
        # the 2D rotary's turns by slot: derived from the config, so in no state dict
        tables = None
        if config.rotary_2d:
            tables = rotary_2d_tables(
                config.cond_len, *config.grid_hw, config.head_dim, config.rotary_still, config.condition_columns
            )
        self.register_buffer("rotary", tables, persistent=False)
        self.column_input = None
        if config.column_objects:
            self.column_input = nn.Linear(config.column_symbols, config.dim, bias=False)
            nn.init.zeros_(self.column_input.weight)
        self.layers = nn.ModuleList(TransformerBlock(config) for _ in range(config.n_layer))
        self.norm = RMSNorm(config.dim, config.norm_eps)
        self.output = nn.Linear(config.dim, config.vocab_size, bias=False)

    # -- embeddings ---------------------------------------------------------------------
    def embed_condition(self, cond: torch.Tensor) -> torch.Tensor:
        """``cond``: features [B, T, cond_dim], class ids [B] or index sequences [B, T]."""
        if self.config.cond_type == "features":
            if self.config.column_symbols:  # the placed symbols' channels are read by position_inputs
                cond = cond[..., : self.config.cond_dim]
            return self.clip_proj(cond.to(self.clip_proj.weight.dtype))
        if self.config.cond_type == "class":
            cond = cond.reshape(-1, 1)
        return self.cond_embedding(cond)

    def null_condition(self, cond: torch.Tensor) -> torch.Tensor:
        """The unconditional input of classifier-free guidance, shaped like ``cond``."""
        if self.config.cond_type == "features":
            return torch.zeros_like(cond)  # Tar: all-zero features (they become clip_proj's bias)
        return torch.full_like(cond, self.config.cond_dim)

    def embed_tokens(self, tokens: torch.Tensor, neighbours: torch.Tensor | None = None) -> torch.Tensor:
        """Inputs of ``tokens [...]``; a neighbour-input model needs their ``neighbours [..., 3]``
        (``neighbours_of``)."""
        return embed_inputs(self.tok_embeddings, self.neighbour_embeddings, tokens, neighbours)

    def neighbours_of(self, view: torch.Tensor, predicted: torch.Tensor) -> torch.Tensor | None:
        """``upper_neighbours`` of the slots predicting ``predicted`` in ``view`` for this model's
        grid, or None when it reads no neighbours."""
        if self.neighbour_embeddings is None:
            return None
        return upper_neighbours(view, predicted, self.config.grid_hw[1], self.config.vocab_size)

    def embed_sequence(self, cond: torch.Tensor, tokens: torch.Tensor | None, view: torch.Tensor | None = None):
        """The teacher-forced inputs ``[B, T + L', dim]``: the condition, then ``tokens [B, L']``
        (token ``k`` at slot ``T + k``, predicting ``k + 1``), whose neighbours come from ``view``
        (default: ``tokens``; ZipAR's training view passes the tokens without its proxies). The last
        condition slot, which predicts token 0, has no row above and adds nothing."""
        x = self.embed_condition(cond)
        if tokens is None or not tokens.shape[1]:
            return x
        predicted = torch.arange(1, tokens.shape[1] + 1, device=tokens.device)
        neighbours = self.neighbours_of(tokens if view is None else view, predicted)
        return torch.cat([x, self.embed_tokens(tokens, neighbours)], dim=1)

    def position_inputs(self, cond: torch.Tensor) -> torch.Tensor | None:
        """What a ``column_objects`` model adds at each slot for the conditions ``cond [B, T, C]``:
        ``[B, n_positions, dim]``, zero on the condition slots that predict no cell; None for
        another model. The object count is the n whose first placed slot holds symbols (the null
        condition, all zero, adds nothing)."""
        c = self.config
        if not c.column_objects:
            return None
        symbols = cond[..., c.cond_dim :].to(self.column_input.weight.dtype)  # [B, T, S]
        filled = symbols.abs().sum(-1) > 0
        count = sum(n * filled[:, placed_slot(n, 0)].long() for n in range(1, c.column_objects + 1))
        count = count.clamp(max=c.column_objects)[:, None]  # [B, 1]
        height, width = c.grid_hw
        k = torch.arange(width, device=cond.device) * count // width  # each column's object [B, W]
        slot = placed_slot(count, k)  # count 0 reads slot 1, empty
        objects = torch.gather(symbols, 1, slot[..., None].expand(-1, -1, symbols.shape[-1]))
        by_column = self.column_input(objects + symbols[:, :1])  # with the background: [B, W, dim]
        table = by_column.new_zeros(cond.shape[0], c.n_positions, c.dim)
        table[:, c.cond_len - 1 :] = by_column.repeat(1, height, 1)  # slot T - 1 + u predicts cell u
        return table

    # -- forward ------------------------------------------------------------------------
    def rotary_at(self, positions: torch.Tensor) -> torch.Tensor | None:
        """The query and key turns ``[2, Q, head_dim // 2, 2]`` of inputs at position slots
        ``positions [Q]``; None for a model without a 2D rotary."""
        return None if self.rotary is None else self.rotary[:, positions]

    def forward_hidden(
        self,
        x: torch.Tensor,
        slots: torch.Tensor,
        mask: torch.Tensor | None = None,
        cache: KVCache | None = None,
        pe_slots: torch.Tensor | None = None,
        position_inputs: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Run embedded inputs ``x [B, Q, dim]`` placed at ``slots [Q]``; returns the normalised
        last hidden state ``[B, Q, dim]`` (the output head's input, EAGLE's "feature").

        With a cache, ``mask [Q, S']`` (S' <= n_slots) is each query's boolean row over cache
        slots; it is intersected with the written slots (including those written by this call).
        Without a cache, ``mask [Q, Q]`` is over the inputs themselves (causal when None).
        ``pe_slots`` (default ``slots``) picks each input's position embedding: a draft-tree node
        is written to a scratch slot past the image but sits at its image position.
        ``position_inputs``: ``position_inputs(cond)`` (default: the cache's, which a runner sets).
        """
        if cache is not None:  # (without one, a None mask reaches the attention as is_causal)
            mask = cache.admit(slots, mask)
        positions = slots if pe_slots is None else pe_slots
        h = x + self.abs_pe[0, positions].to(x.dtype)
        if position_inputs is None and cache is not None:
            position_inputs = cache.position_inputs
        if position_inputs is not None:
            h = h + position_inputs[:, positions].to(x.dtype)
        if self.compiled is not None and cache is not None and x.shape[1] <= self.compiled.max_queries:
            hidden = self.compiled.run(h, mask, cache, slots, positions)  # a narrow pass: compiled (mulo.compiled)
            if hidden is not None:
                return hidden
        rotary = self.rotary_at(positions)
        # a wide pass in bf16 where measured faster (mulo.wide); never while training (grad enabled)
        bf16 = self.wide is not None and not torch.is_grad_enabled() and self.wide.autocast(*x.shape[:2])
        # (float32 passes keep the masked kernel: the causal one's blocks round differently at some
        # shapes, ~2e-7, and the float32 path stays the reference, bit for bit)
        causal_pad = causal_offset(mask) if bf16 and mask is not None else None
        # bf16 with its elementwise work fused (not in training mode: the compiled layers drop dropout)
        compiled_layers = bf16 and not self.training and self.wide.compiled_layers()
        if compiled_layers:
            for i in range(len(self.layers)):
                h = compiled_layers.run(i, h, slots, mask, cache, rotary, causal_pad)
        else:
            with bf16 or contextlib.nullcontext():
                for i, layer in enumerate(self.layers):
                    h = layer(h, i, slots, mask, cache, rotary, causal_pad)
        return self.norm(h)

    def forward_embeddings(self, x, slots, mask=None, cache=None, pe_slots=None) -> torch.Tensor:
        """``forward_hidden``'s pass, returning float32 logits ``[B, Q, V]``."""
        return self.output(self.forward_hidden(x, slots, mask, cache, pe_slots)).float()

    def forward(
        self,
        tokens: torch.Tensor | None,
        cond: torch.Tensor,
        mask: torch.Tensor | None = None,
        hidden: bool = False,
        view: torch.Tensor | None = None,
    ):
        """Teacher-forced pass over [cond, tokens] (no cache), causal unless ``mask [S, S]`` (over
        the pass's slots) says otherwise.

        Returns the logits from the last condition slot on: row ``i`` predicts image token ``i``
        given the condition and ``tokens[:, :i]`` (``tokens.shape[1] + 1`` rows). ``hidden``: the
        output head's input instead, so a loss over some of the rows pays the head only for them.
        ``view``: where a neighbour-input model reads the row above (``embed_sequence``).
        """
        x = self.embed_sequence(cond, tokens, view)
        n_cond = x.shape[1] - (0 if tokens is None else tokens.shape[1])
        slots = torch.arange(x.shape[1], device=x.device)
        hidden_states = self.forward_hidden(x, slots, mask, position_inputs=self.position_inputs(cond))
        hidden_states = hidden_states[:, n_cond - 1 :]
        return hidden_states if hidden else self.output(hidden_states).float()


def init_random_(model: nn.Module, seed: int, std: float = 0.02) -> nn.Module:
    """Deterministic random weights that do not touch the global RNG (toy families, tests).

    Norm scales are drawn around 1 so they matter; everything else is N(0, std).
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=gen)
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.1 * noise)
            else:
                param.copy_(std * noise)
    return model
