"""Grid geometry: neighbourhood expansion, islands."""

import pytest
import torch

from mulo import grid as G


def brute_expand(rejected, radius, t0):
    h, w = rejected.shape
    out = torch.zeros(h, w, dtype=torch.bool)
    for i, j in rejected.nonzero().tolist():
        for a in range(max(0, i - radius), min(h, i + radius + 1)):
            for b in range(max(0, j - radius), min(w, j + radius + 1)):
                if a * w + b >= t0:
                    out[a, b] = True
    return out


@pytest.mark.parametrize("radius", [0, 1, 2, 3])
def test_expand_is_the_clipped_chebyshev_neighbourhood(radius):
    gen = torch.Generator().manual_seed(radius)
    for _ in range(20):
        rejected = torch.rand(7, 9, generator=gen) < 0.08
        if not rejected.any():
            continue
        t0 = int(rejected.reshape(-1).nonzero()[0])
        got = G.expand(rejected, radius)
        assert torch.equal(got, brute_expand(rejected, radius, t0))
        assert not got.reshape(-1)[:t0].any()  # never before the first rejection
        assert (got | ~rejected).all()  # rejected positions are re-opened


def test_expand_reaches_rows_above_but_not_before_t0():
    rejected = torch.zeros(4, 4, dtype=torch.bool)
    rejected[1, 2] = True
    rejected[2, 0] = True  # t0 = 6, the raster-first rejection
    got = G.expand(rejected, 1)
    assert got[0].sum() == 0  # row 0 is before t0
    assert got[1].tolist() == [False, False, True, True]  # (1,0) and (1,1) are < t0 = 6
    assert got[3].tolist() == [True, True, False, False]
    with pytest.raises(ValueError, match="radius"):
        G.expand(rejected, -1)


def brute_components(mask):
    """Union-find over 8-neighbours, as an independent reference."""
    h, w = mask.shape
    parent = list(range(h * w))

    def find(a):
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    cells = mask.tolist()
    for i in range(h):
        for j in range(w):
            if not cells[i][j]:
                continue
            for di in (-1, 0, 1):
                for dj in (-1, 0, 1):
                    a, b = i + di, j + dj
                    if 0 <= a < h and 0 <= b < w and cells[a][b]:
                        parent[find(i * w + j)] = find(a * w + b)
    return {
        frozenset(k for k in range(h * w) if cells[k // w][k % w] and find(k) == root)
        for root in {find(k) for k in range(h * w) if cells[k // w][k % w]}
    }


def test_islands_are_the_8_connected_components():
    gen = torch.Generator().manual_seed(3)
    for _ in range(30):
        mask = torch.rand(9, 11, generator=gen) < 0.3
        labels = G.islands(mask)
        assert torch.equal(labels > 0, mask)
        got = {frozenset((labels.reshape(-1) == k).nonzero()[:, 0].tolist()) for k in range(1, int(labels.max()) + 1)}
        assert got == brute_components(mask)
        # numbered in raster order of their first cell
        firsts = [int((labels.reshape(-1) == k).nonzero()[0]) for k in range(1, int(labels.max()) + 1)]
        assert firsts == sorted(firsts)


def test_diagonal_cells_form_one_island():
    mask = torch.eye(4, dtype=torch.bool)
    assert G.islands(mask).max() == 1
