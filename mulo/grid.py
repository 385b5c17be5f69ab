"""Token-grid geometry: raster order, neighbourhoods, islands.

Grids are ``[H, W]`` tensors in raster (row-major) order; raster index ``i = row * W + col``.
"""

from __future__ import annotations

from collections import deque

import torch
import torch.nn.functional as F


def raster_at_least(shape: tuple[int, int], t0: int) -> torch.Tensor:
    """Boolean grid of positions whose raster index is ``>= t0``."""
    h, w = shape
    return (torch.arange(h * w) >= t0).reshape(h, w)


def expand(rejected: torch.Tensor, radius: int, t0: int | None = None) -> torch.Tensor:
    """Chebyshev neighbourhood expansion: every position within ``radius`` rows and columns of a
    rejected position, clipped to the grid and to raster index ``>= t0`` (MuLo-SD's R_X).

    ``rejected`` is a boolean ``[H, W]`` grid; ``t0`` defaults to its first rejected index.
    """
    if radius < 0:
        raise ValueError(f"radius must be >= 0 (got {radius})")
    if not bool(rejected.any()):
        return torch.zeros_like(rejected, dtype=torch.bool)
    if t0 is None:
        t0 = int(rejected.reshape(-1).nonzero()[0])
    size = 2 * radius + 1
    grown = F.max_pool2d(rejected[None, None].float(), size, stride=1, padding=radius)[0, 0] > 0
    return grown & raster_at_least(tuple(rejected.shape), t0).to(rejected.device)


_NEIGHBOURS_8 = [(-1, -1), (-1, 0), (-1, 1), (0, -1), (0, 1), (1, -1), (1, 0), (1, 1)]


def islands(mask: torch.Tensor) -> torch.Tensor:
    """8-connected components of a boolean ``[H, W]`` grid.

    Returns an int64 grid: 0 outside the mask, components numbered 1..n in the raster order of
    their first position.
    """
    h, w = mask.shape
    cells = mask.detach().cpu().bool().tolist()
    labels = [[0] * w for _ in range(h)]
    count = 0
    for row in range(h):
        for col in range(w):
            if not cells[row][col] or labels[row][col]:
                continue
            count += 1
            labels[row][col] = count
            queue = deque([(row, col)])
            while queue:
                i, j = queue.popleft()
                for di, dj in _NEIGHBOURS_8:
                    a, b = i + di, j + dj
                    if 0 <= a < h and 0 <= b < w and cells[a][b] and not labels[a][b]:
                        labels[a][b] = count
                        queue.append((a, b))
    return torch.tensor(labels, dtype=torch.long, device=mask.device)
