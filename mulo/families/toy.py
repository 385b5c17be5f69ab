"""The ``toy`` family: tiny random models built in code, deterministic from a seed.

It exercises every code path of the engine (multi-scale drafters, same-grid draft model, an
EAGLE head, pixel and learned up-samplers, a codebook of random 4 px squares as its VQ) in well
under a second per generation, before any trained weights exist. Its images are noise: it is for
tests and debugging. Its VQ is the scenes family's kind (``mulo.models.patch_vq``), so a toy run
never imports diffusers (4-5 s of a cold start, issue 65); tests of a ``VQModel`` build their own.

Target 8x8 tokens (32 px), drafters 4x4 (r=2) and 2x2 (r=4), vocabulary 128.
"""

from __future__ import annotations

import zlib

import torch

from mulo.families.base import Family
from mulo.models.eagle import head_for
from mulo.models.gpt import GPT, GPTConfig, init_random_, placed_slot
from mulo.models.patch_vq import PatchCodebook
from mulo.models.upsample import TokenUpsampler
from mulo.models.vq import PatchTokenizer

GRID = 8
VOCAB = 128
COND_LEN = 4
COND_DIM = 16
PLACED_SYMBOLS = 8  # a column-object toy's symbol table (``PlacedWords``)


class HashedWords:
    """Each word maps to a fixed random vector (seeded by its CRC32): every word is "known"."""

    def __init__(self, cond_len: int, cond_dim: int, seed: int):
        self.cond_len, self.cond_dim, self.seed = cond_len, cond_dim, seed

    def ignored(self, prompt: str) -> list[str]:
        words = prompt.lower().split()  # every word hashes to a vector; only the first few are used
        if len(words) > self.cond_len:
            return [f"only the first {self.cond_len} words are used (dropped: {' '.join(words[self.cond_len :])})"]
        return []

    def alias(self, prompt: str) -> None:
        return None

    def check(self, prompt: str) -> None:
        if not prompt.split():
            raise ValueError("prompt must not be empty")

    def __call__(self, prompt: str, seed: int = 0) -> torch.Tensor:
        self.check(prompt)
        words = prompt.lower().split()
        vectors = []
        for word in words[: self.cond_len]:
            gen = torch.Generator().manual_seed(zlib.crc32(word.encode()) ^ self.seed)
            vectors.append(torch.randn(self.cond_dim, generator=gen))
        while len(vectors) < self.cond_len:  # short prompts: repeat the mean word
            vectors.append(torch.stack(vectors).mean(0))
        return torch.stack(vectors)


class PlacedWords(HashedWords):
    """``HashedWords`` and, after them, ``symbols`` channels of placed symbols (``mulo.models.gpt.
    placed_slot``), as a ``GPTConfig.column_objects`` scenes model reads them: the prompt's first
    words (up to ``objects``) are its objects, left to right, each one-hot by its CRC32; its last
    word, the background (slot 0)."""

    def __init__(self, cond_len: int, cond_dim: int, seed: int, objects: int, symbols: int):
        super().__init__(cond_len, cond_dim, seed)
        self.objects, self.symbols = objects, symbols

    def __call__(self, prompt: str, seed: int = 0) -> torch.Tensor:
        words = prompt.lower().split()
        placed = torch.zeros(self.cond_len, self.symbols)
        count = min(len(words), self.objects)
        for k, word in enumerate(words[:count]):
            placed[placed_slot(count, k), zlib.crc32(word.encode()) % self.symbols] = 1.0
        placed[0, zlib.crc32(words[-1].encode()) % self.symbols] += 1.0
        return torch.cat([super().__call__(prompt, seed), placed], dim=-1)


def _gpt(seed: int, side: int, preset: str = "test-tiny", **overrides) -> GPT:
    config = GPTConfig.preset(
        preset,
        vocab_size=VOCAB,
        max_seq_len=side * side,
        cond_len=COND_LEN,
        cond_dim=COND_DIM,
        multiple_of=32,
        **overrides,
    )
    # std 0.3 gives peaked but not degenerate next-token distributions at this width.
    return init_random_(GPT(config), seed, std=0.3)


def load(name: str = "toy", device: str = "cpu") -> Family:
    """The registry's entry point (``mulo.families``): the toy family, seed 0, on ``device``."""
    return build().to(device)


def build(
    seed: int = 0, grid: int = GRID, neighbour_inputs: int = 0, rotary_2d: bool = False, column_objects: int = 0
) -> Family:
    """The toy family on a ``grid`` x ``grid`` target (8 by default; larger for tests of scale);
    ``neighbour_inputs``, ``rotary_2d`` and ``column_objects`` (``GPTConfig``'s; the last with
    ``PlacedWords`` conditions over 8 symbols) for every model, as a scenes family may have them."""
    shape = dict(neighbour_inputs=neighbour_inputs, rotary_2d=rotary_2d)
    if column_objects:
        shape.update(column_objects=column_objects, column_symbols=PLACED_SYMBOLS)
    target = _gpt(seed, grid, **shape)
    drafters = {r: _gpt(seed + i, grid // r, **shape) for i, r in ((1, 2), (2, 4))}
    draft_model = init_random_(
        GPT(
            GPTConfig(
                dim=16,
                n_layer=1,
                n_head=2,
                vocab_size=VOCAB,
                max_seq_len=grid * grid,
                cond_len=COND_LEN,
                cond_dim=COND_DIM,
                multiple_of=16,
                **shape,
            )
        ),
        seed + 3,
        std=0.3,
    )
    vq_model = PatchCodebook(VOCAB, patch=4)
    vq_model.squares.copy_(torch.rand(vq_model.squares.shape, generator=torch.Generator().manual_seed(seed + 4)))
    upsamplers = {r: init_random_(TokenUpsampler(VOCAB, r, width=16), seed + 5 + r, std=0.3) for r in (2, 4)}
    return Family(
        "toy",
        target,
        drafters,
        PatchTokenizer(vq_model),
        PlacedWords(COND_LEN, COND_DIM, seed, column_objects, PLACED_SYMBOLS)
        if column_objects
        else HashedWords(COND_LEN, COND_DIM, seed),
        draft_model=draft_model,
        upsamplers=upsamplers,
        eagle_head=init_random_(head_for(target), seed + 8, std=0.3),
    )
