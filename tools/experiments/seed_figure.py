"""The README's contrast: the same emoji at seeds 0-4, AR at each family's defaults, one row per
(family, prompt). The lookup table (``twemoji``) draws one image whatever the seed; a family that
generalises draws a different one each time.

    python tools/experiments/seed_figure.py --out docs/seeds.png
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from PIL import Image

from mulo.engine import Engine
from mulo.eval.family_eval import samples_grid
from mulo.eval.generalisation import seed_diversity
from mulo.families import load_family

# The same emoji in both; the scenes family's app examples name a background (else each seed
# draws another colour, and every token differs for that reason alone)
PROMPTS = {
    "twemoji": ("red apple", "rocket", "cat"),
    "scenes": ("red apple on blue", "rocket and sun on purple", "cat, pizza and star on green"),
}
SEEDS = range(5)
SIZE = 128  # every image shown at twemoji's size, so the rows line up


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/seeds.png"))
    args = parser.parse_args()
    images, captions = [], []
    for name, prompts in PROMPTS.items():
        engine = Engine(load_family(name))
        for prompt in prompts:
            results = [engine.generate(prompt, "ar", seed) for seed in SEEDS]
            difference, distinct = seed_diversity([r.tokens for r in results])
            print(f"{name:9s} {prompt:30s} {distinct} distinct of {len(results)}, {difference:.0%} of tokens differ")
            for seed, result in zip(SEEDS, results, strict=True):
                image = Image.fromarray(result.image).resize((SIZE, SIZE), Image.NEAREST)
                images.append(np.asarray(image))
                captions.append(f"{prompt}, seed {seed}")
    samples_grid(images, captions, columns=len(SEEDS), scale=1).save(args.out)
    print(args.out)


if __name__ == "__main__":
    main()
