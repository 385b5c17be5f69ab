"""Oracle MuLo-SD (``mulo.eval.ceilings``): a perfect drafter and a perfect target, so only the
geometry of rejections, re-opened squares and resampling waves is measured."""

from __future__ import annotations

import torch

from mulo.eval.ceilings import RESAMPLING_SCHEMES, count_waves, oracle_mulo, oracle_round

SCHEMES = {"raster": None, "islands": 0, "zipar": 2}


def grid(side: int = 8) -> torch.Tensor:
    return torch.arange(side * side).reshape(side, side) % 5


def test_agreeing_drafts_reopen_nothing():
    out = oracle_round(grid(), grid(), radius=2, neighbours=None, windows=SCHEMES)
    assert out == {"accepted": 1.0, "reopened": 0.0, "raster": 0, "islands": 0, "zipar": 0}


def test_one_rejection_reopens_its_square_from_t0_on():
    drafted = grid().clone()
    drafted[3, 3] += 1  # t0 = (3, 3): the square rows 2-4, cols 2-4, clipped to raster >= 27
    out = oracle_round(grid(), drafted, radius=1, neighbours=None, windows=SCHEMES)
    assert out["accepted"] == 63 / 64 and out["reopened"] == 5 / 64  # (3,3) (3,4) (4,2) (4,3) (4,4)
    # t0 comes from the verification pass, the other four take one pass each: one island, whose
    # second row waits for its input token (raster, islands) or starts on a proxy (ZipAR)
    assert (out["raster"], out["islands"], out["zipar"]) == (4, 4, 3)


def test_pooling_accepts_a_neighbouring_code():
    truth = int(grid()[3, 3])  # code 2
    drafted = grid().clone()
    drafted[3, 3] = 4
    neighbours = torch.tensor([[1], [0], [3], [2], [truth]])  # code 4's nearest neighbour is the true code
    out = oracle_round(grid(), drafted, radius=1, neighbours=neighbours, windows=SCHEMES)
    assert out["accepted"] == 1.0 and out["reopened"] == 0.0


def test_distant_islands_resample_in_parallel_and_zipar_overlaps_rows():
    drafted = grid(16).clone()
    drafted[2, 2] += 1
    drafted[2, 12] += 1  # islands of 5 (from t0 = (2, 2)) and 6 cells, rows 2-3
    out = oracle_round(grid(16), drafted, radius=1, neighbours=None, windows=SCHEMES)
    assert (out["raster"], out["islands"], out["zipar"]) == (10, 6, 5)  # 11 - t0; the larger island; overlap
    reopened = torch.zeros(64, dtype=torch.bool)
    reopened[:32] = True  # four full rows of an 8-wide grid, one island
    labels = reopened.long()
    assert count_waves(reopened, 0, labels, 8, None) == 31
    assert count_waves(reopened, 0, labels, 8, 0) == 31  # raster order inside the island
    # ZipAR: the first row's W - 1 after t0, the second row (it waits for the first, as in ZipAR) W,
    # then each further row its window more: whole-grid ZipAR's passes, less t0's
    assert count_waves(reopened, 0, labels, 8, 2) == 7 + 8 + 2 * 2


def test_the_bound_counts_drafter_verification_and_resampling_passes(toy):
    vq = toy.vq
    images = torch.rand(2, 3, *[8 * vq.downsample] * 2)  # toy target grid 8x8
    upsampler = toy.upsampler("pixel", 2)
    low = torch.nn.functional.interpolate(images, scale_factor=0.5, mode="area")
    out = oracle_mulo(vq, upsampler, images, low, 2, 1, None, RESAMPLING_SCHEMES)
    assert 0 <= out["accepted"] <= 1 and 0 <= out["reopened"] <= 1
    for scheme in RESAMPLING_SCHEMES:
        assert 64 / (16 + 1 + 63) <= out[f"speedup_{scheme}"] <= 64 / (16 + 1)
