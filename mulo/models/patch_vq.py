"""A context-free VQ tokenizer: a codebook of ``patch`` x ``patch`` RGB squares, found by k-means.

A token is the codebook square nearest to its image square (Euclidean, in pixels), and it draws
exactly that square: no network, no neighbour's influence, so a changed token redraws its own
4 x 4 pixels and nothing else (the most local a VQ can be). The emoji scenes read their objects
through it because, at 4 px tokens, what names a 32 px emoji is the detail of its squares: k-means
of 4,096 squares keeps the referee's prompt match at 1.0 on held-out scenes where diffusers'
``VQModel`` (a conv autoencoder), trained for 65 CPU-minutes on this machine, reached 0.59 and was
flattening (benchmarks/scenes-vq-study.json).

``mulo.models.vq.PatchTokenizer`` reads and draws images with it. The codebook is
``PatchCodebook.squares``: ``[codes, 3 * patch * patch]`` pixels in [0, 1], each
row in ``pixel_unshuffle``'s order (channel, then row, then column within the square), which is
also the codebook MuLo-SD's neighbour pooling reads: nearby codes look alike.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

DISTANCE_ROWS = 16384  # squares a distance computation holds at once ([rows, codes] floats)
SEED_POOL = 60_000  # k-means++ draws its seeds from this many of the squares (each seed costs a pass)


class PatchCodebook(nn.Module):
    def __init__(self, codes: int, patch: int = 4):
        super().__init__()
        self.patch = patch
        self.register_buffer("squares", torch.zeros(codes, 3 * patch * patch))

    def nearest(self, squares: torch.Tensor) -> torch.Tensor:
        """``[N, 3 p^2]`` squares -> ``[N]`` codes of the nearest codebook squares."""
        return nearest_rows(self.squares, squares)


def nearest_rows(book: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """For each of ``rows`` ``[N, D]``, the index of the nearest row of ``book`` ``[V, D]``."""
    norms = (book**2).sum(1)
    # |x - c|^2 less |x|^2, which is the same for every c
    found = [(norms - 2 * chunk @ book.T).argmin(1) for chunk in rows.split(DISTANCE_ROWS)]
    return torch.cat(found) if found else torch.zeros(0, dtype=torch.long, device=book.device)


def image_squares(images: torch.Tensor, patch: int) -> torch.Tensor:
    """``[B, 3, h, w]`` -> ``[B * (h / p) * (w / p), 3 p^2]``, row-major per image."""
    folded = F.pixel_unshuffle(images, patch)  # [B, 3 p^2, h / p, w / p]
    return folded.permute(0, 2, 3, 1).reshape(-1, folded.shape[1])


def fit_codebook(squares: torch.Tensor, codes: int, iterations: int, generator: torch.Generator) -> torch.Tensor:
    """k-means (Lloyd) of ``squares`` ``[N, D]`` into ``codes`` centres, seeded by k-means++ over
    ``SEED_POOL`` of them (each seed drawn with probability by its squared distance to the seeds so
    far: a rare sprite's squares get codes too); a centre left without squares restarts at a square drawn at random.
    With fewer distinct squares than codes (a smoke run's few images) the extra codes repeat
    squares: the vocabulary keeps its size."""
    pool = squares[torch.randperm(len(squares), generator=generator)[:SEED_POOL]]
    centres = plus_plus_seeds(pool, codes, generator)
    for _ in range(iterations):
        assigned = nearest_rows(centres, squares)
        sums = torch.zeros_like(centres).index_add_(0, assigned, squares)
        counts = torch.bincount(assigned, minlength=codes)
        empty = counts == 0
        centres = sums / counts.clamp(min=1)[:, None]
        if empty.any():
            centres[empty] = squares[torch.randint(len(squares), (int(empty.sum()),), generator=generator)]
    return centres


def plus_plus_seeds(squares: torch.Tensor, codes: int, generator: torch.Generator) -> torch.Tensor:
    norms = (squares**2).sum(1)

    def to(pick: int) -> torch.Tensor:  # every square's squared distance to square ``pick``
        return (norms - 2 * (squares @ squares[pick]) + norms[pick]).clamp(min=0)

    picks = [int(torch.randint(len(squares), (1,), generator=generator))]
    distance = to(picks[0])
    for _ in range(codes - 1):
        total = float(distance.sum())
        if total > 0:  # (a search of the running sum: torch.multinomial is ~6x slower at this size)
            spot = torch.rand(1, generator=generator, dtype=distance.dtype) * total
            pick = min(int(torch.searchsorted(torch.cumsum(distance, 0), spot)), len(squares) - 1)
        else:  # every square is a seed already
            pick = int(torch.randint(len(squares), (1,), generator=generator))
        picks.append(pick)
        distance = torch.minimum(distance, to(pick))
    return squares[picks].clone()
