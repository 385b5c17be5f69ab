"""The oracle MuLo-SD table of a VQ on the SVG-rendered Twemoji (``mulo.eval.ceilings.oracle_mulo``):
``python -m mulo oracle [--vq assets/FAMILY] [--images 96] [--cache DIR]``.

The target's images are the 128 px renders (a 32x32-token grid with a 4x-down VQ), the perfect
drafter's the 64 px (r = 2) and 32 px (r = 4) renders of the same validation emoji; pixel
up-sampler; l = 0..3; pooling off and with k = 4 codebook neighbours. It prints one Markdown row
per setting: what the design study of a VQ candidate reads.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mulo.eval.ceilings import oracle_markdown, oracle_table
from mulo.families import ASSETS_ROOT, DEFAULT_FAMILY
from mulo.families.emoji import load_vq
from mulo.train import data as data_mod

DEFAULT_CACHE = Path.home() / ".cache" / "mulo" / "twemoji"


def main(argv=None, prog=None) -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument(
        "--vq", type=Path, default=ASSETS_ROOT / DEFAULT_FAMILY, help="folder with vq.json/.safetensors"
    )
    parser.add_argument("--images", type=int, default=96, help="validation emoji (default 96)")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    args = parser.parse_args(argv)
    val = data_mod.load_scales(args.cache).val
    print(f"{min(args.images, len(val.names))} validation emoji, VQ from {args.vq}")
    print(oracle_markdown(oracle_table(load_vq(args.vq), val.scales, args.images)))
