"""The oracle MuLo-SD table of a VQ on the SVG-rendered Twemoji (``mulo.eval.ceilings.oracle_mulo``):
``python -m mulo.train.oracle [--vq assets/FAMILY] [--images 96] [--cache DIR]``.

The target's images are the 128 px renders (a 32x32-token grid with a 4x-down VQ), the perfect
drafter's the 64 px (r = 2) and 32 px (r = 4) renders of the same validation emoji; pixel
up-sampler; l = 0..3; pooling off and with k = 4 codebook neighbours. It prints one Markdown row
per setting: what the design study of a VQ candidate reads.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from mulo.eval.ceilings import RESAMPLING_SCHEMES, oracle_mulo
from mulo.families import ASSETS_ROOT, DEFAULT_FAMILY
from mulo.families.twemoji import load_vq
from mulo.models.upsample import PixelUpsampler
from mulo.models.vq import VQTokenizer
from mulo.sampling import NeighbourTable
from mulo.train import data as data_mod

DEFAULT_CACHE = Path.home() / ".cache" / "mulo" / "twemoji"


def table(vq: VQTokenizer, data: data_mod.EmojiData, n_images: int, px=128, radii=range(4), ks=(0, 4)) -> list[dict]:
    """The rows for the first ``n_images`` of ``data`` (rendered at ``px``, ``px/2`` and ``px/4``)."""

    def pixels(size: int) -> torch.Tensor:
        return torch.from_numpy(data.scales[size][:n_images]).permute(0, 3, 1, 2).float() / 255

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


def markdown(rows: list[dict]) -> str:
    schemes = list(RESAMPLING_SCHEMES)
    head = "| r | k | l | accepted | re-opened | " + " | ".join(f"bound {s}" for s in schemes) + " |"
    lines = [head, "|" + "---|" * (5 + len(schemes))]
    for row in rows:
        bounds = " | ".join(f"{row[f'speedup_{s}']:.2f}x" for s in schemes)
        lines.append(
            f"| {row['r']} | {row['k']} | {row['l']} | {row['accepted']:.3f} | {row['reopened']:.3f} | {bounds} |"
        )
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--vq", type=Path, default=ASSETS_ROOT / DEFAULT_FAMILY, help="folder with vq.json/.safetensors"
    )
    parser.add_argument("--images", type=int, default=96, help="validation emoji (default 96)")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    args = parser.parse_args(argv)
    val = data_mod.load_scales(args.cache).val
    print(f"{min(args.images, len(val.names))} validation emoji, VQ from {args.vq}")
    print(markdown(table(load_vq(args.vq), val, args.images)))


if __name__ == "__main__":
    main()
