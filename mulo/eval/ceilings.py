"""The acceptance ceiling of an up-sampler: how many of the target's codes a *perfect* drafter
would hand it.

A perfect drafter at ratio r produces exactly the low-res tokens of the real image (its r-times
smaller version, VQ-encoded). Up-sampling them and comparing with the real image's own high-res
codes bounds what verification can accept for that image, whatever the drafter's quality. The
same comparison without the low-res tokenizer (the small image itself, resized back up) splits
the loss between the low-res token grid and the resize.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mulo.grid import expand, islands
from mulo.methods.mulo import ready_in_islands
from mulo.models.upsample import PixelUpsampler
from mulo.models.vq import VQTokenizer
from mulo.sampling import NeighbourTable


@torch.no_grad()
def upsampling_agreement(vq: VQTokenizer, upsampler, images: torch.Tensor, r: int) -> dict:
    """``images [B, 3, h, w]`` in [0, 1] at the target's pixel size -> shares of high-res codes
    reproduced: ``from_tokens`` (the perfect drafter's tokens through ``upsampler``, the whole
    image as one block: what MuLo-SD can reach) and ``from_pixels`` (the un-tokenised small
    image, bicubic resize, no low-res VQ)."""
    images = images.to(vq.device)
    codes = vq.encode(images)
    small = F.interpolate(images, scale_factor=1 / r, mode="area")
    low = vq.encode(small)
    nothing_committed = torch.full_like(codes[0], -1)
    drafted = torch.stack([upsampler.upsample(grid, nothing_committed, (0, grid.shape[0])) for grid in low])
    resized = F.interpolate(small, scale_factor=r, mode="bicubic", align_corners=False).clamp(0, 1)
    return {
        "from_tokens": float((drafted.to(codes.device) == codes).float().mean()),
        "from_pixels": float((vq.encode(resized) == codes).float().mean()),
    }


# -- oracle MuLo-SD --------------------------------------------------------------------------------
# The perfect drafter again, now with a perfect target: it accepts a draft token exactly when the
# image's own code is the draft token (or, pooling, one of its k nearest codebook neighbours), so
# what is left to measure is the geometry: how much of the grid a radius-l square around each
# rejection re-opens, and how many sequential passes the re-opened set costs to resample.


def count_waves(reopened: torch.Tensor, t0: int, labels: torch.Tensor, width: int, window: int | None) -> int:
    """Sequential target passes that resample ``reopened`` (flat bool) after the verification pass,
    which itself yields the token at ``t0``: raster (``window`` None) one per remaining token;
    islands one per wave of ``ready_in_islands`` (window 0: raster order inside each island,
    w > 0: ZipAR inside islands)."""
    unresolved = reopened.clone()
    unresolved[t0] = False
    if window is None:
        return int(unresolved.sum())
    waves = 0
    while bool(unresolved.any()):
        unresolved[ready_in_islands(unresolved, labels, width, window)] = False
        waves += 1
    return waves


def oracle_round(codes: torch.Tensor, drafted: torch.Tensor, radius: int, neighbours: torch.Tensor | None,
                 windows: dict[str, int | None]) -> dict:  # fmt: skip
    """One image, the whole grid as one block: ``codes``/``drafted [H, W]`` -> the share of
    accepted drafts, the re-opened share and the resampling passes for each scheme of ``windows``
    (name -> window, None = raster)."""
    height, width = codes.shape
    flat_codes, flat_draft = codes.reshape(-1), drafted.reshape(-1)
    accepted = flat_codes == flat_draft
    if neighbours is not None and neighbours.shape[1]:
        accepted |= (neighbours[flat_draft] == flat_codes[:, None]).any(1)
    rejected = ~accepted
    out = {"accepted": float(accepted.float().mean()), "reopened": 0.0}
    if not bool(rejected.any()):
        return out | {name: 0 for name in windows}
    t0 = int(rejected.nonzero()[0])
    reopened = expand(rejected.view(height, width), radius, t0).reshape(-1)
    labels = islands(reopened.view(height, width)).reshape(-1)
    out["reopened"] = float(reopened.float().mean())
    return out | {name: count_waves(reopened, t0, labels, width, w) for name, w in windows.items()}


RESAMPLING_SCHEMES = {"raster": None, "islands": 0, "zipar_w4": 4, "zipar_w8": 8}


@torch.no_grad()
def oracle_mulo(vq: VQTokenizer, upsampler, images: torch.Tensor, low_images: torch.Tensor, r: int,
                radius: int, neighbours: torch.Tensor | None = None, schemes=RESAMPLING_SCHEMES) -> dict:  # fmt: skip
    """Oracle MuLo-SD over ``images [B, 3, h, w]`` (the target's pixels) with the perfect drafter's
    ``low_images [B, 3, h/r, w/r]``: mean accepted and re-opened shares, and per resampling scheme
    the sequential-pass speed-up bound = AR's passes / (drafter passes (one per low-res token,
    drafted sequentially) + 1 verification + resampling passes), summed over the images. Every
    pass counts as one target step: the bound before a drafter step's real cost."""
    codes = vq.encode(images.to(vq.device)).cpu()
    low = vq.encode(low_images.to(vq.device))
    height, width = codes.shape[1:]
    nothing_committed = torch.full((height, width), -1, dtype=torch.long, device=low.device)
    rounds = []
    for grid, target_codes in zip(low, codes, strict=True):
        drafted = upsampler.upsample(grid, nothing_committed, (0, grid.shape[0])).cpu()
        rounds.append(oracle_round(target_codes, drafted, radius, neighbours, schemes))
    n, drafter_passes = len(rounds), (height // r) * (width // r)
    fixed = drafter_passes + 1
    return {
        "accepted": sum(x["accepted"] for x in rounds) / n,
        "reopened": sum(x["reopened"] for x in rounds) / n,
        **{f"speedup_{s}": n * height * width / sum(fixed + x[s] for x in rounds) for s in schemes},
    }


def oracle_table(vq: VQTokenizer, scales: dict, n_images: int, px=128, radii=range(4), ks=(0, 4)) -> list[dict]:
    """The oracle table of ``vq``: one row per (r, k, l) over the first ``n_images`` of ``scales``
    (``{size: uint8 [N, size, size, 3]}`` renders at ``px``, ``px/2`` and ``px/4``): what the
    VQ study of a candidate codebook reads."""

    def pixels(size: int) -> torch.Tensor:
        return torch.from_numpy(scales[size][:n_images]).permute(0, 3, 1, 2).float() / 255

    neighbours = NeighbourTable(vq.codebook)
    rows = []
    for r in (2, 4):
        upsampler, low = PixelUpsampler(vq, r), pixels(px // r)
        for k in ks:
            for radius in radii:
                pooled = neighbours.table(k).cpu() if k else None
                result = oracle_mulo(vq, upsampler, pixels(px), low, r, radius, pooled, RESAMPLING_SCHEMES)
                rows.append({"r": r, "k": k, "l": radius, **result})
    return rows


def oracle_markdown(rows: list[dict]) -> str:
    schemes = list(RESAMPLING_SCHEMES)
    head = "| r | k | l | accepted | re-opened | " + " | ".join(f"bound {s}" for s in schemes) + " |"
    lines = [head, "|" + "---|" * (5 + len(schemes))]
    for row in rows:
        bounds = " | ".join(f"{row[f'speedup_{s}']:.2f}x" for s in schemes)
        lines.append(
            f"| {row['r']} | {row['k']} | {row['l']} | {row['accepted']:.3f} | {row['reopened']:.3f} | {bounds} |"
        )
    return "\n".join(lines)
