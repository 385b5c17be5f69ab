"""Issue 46's behavioural bars for a family, measured on its evaluation prompts.

    python tools/experiments/family_bars.py --family emoji-16 --prompts 24 --json benchmarks/bars-emoji-16.json \
        --figure docs/emoji16-red-apple.png

- tau: MuLo-SD v2 (r = 2) at each tau with the family's other defaults: acceptance, target NFE and
  the re-opened share, averaged over the prompts (the bar: both move monotonically over
  [0.01, 0.5], acceptance at 0.01 at least 0.05 above 0.5);
- pooling: k = 0, 1, 4 at the defaults: NFE speed-up over AR, adherence and FD beside AR's;
- locality: the re-opened share at the defaults (bar: <= 60 %), and the islands of "grinning
  face", seed 0, round by round;
- "red apple", seeds 0-4: whether the mini-CLIP ranks the prompt's emoji in its top 5 for AR's
  image and MuLo-SD's, seed by seed (bar: MuLo-SD depicts it as well as AR for the same seed);
  ``--figure`` draws those ten images with their ranks.

Wall-clock columns (``speedup``) are timings only when nothing else ran beside the script.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from mulo.engine import Engine
from mulo.eval import bench, harness
from mulo.eval.quality import Quality
from mulo.families import load_family

TAUS = (0.01, 0.03, 0.1, 0.3, 0.5)
POOLING = (0, 1, 4)


def mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def evaluation_setup(family: str, n_prompts: int) -> tuple[Engine, Quality, list[tuple[str, str]]]:
    """The family's engine, its scorer and its first ``n_prompts`` evaluation prompts [(key, prompt)]."""
    engine = Engine(load_family(family))
    quality = Quality.for_family(engine.family)
    if quality is None:
        raise SystemExit(f"error: {family} has no evaluation set yet (its card stage writes it)")
    return engine, quality, bench.prompt_pool(quality)[:n_prompts]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="scenes")
    parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--figure", type=Path, help="the red apple's AR and MuLo-SD images, seeds 0-4, as a PNG")
    args = parser.parse_args()
    engine, quality, prompts = evaluation_setup(args.family, args.prompts)
    keys = [key for key, _ in prompts]
    out = {"family": args.family, "prompts": len(prompts), "defaults": engine.make_config(None).to_dict()}
    runs = [("ar", "ar", {})]
    runs += [(f"tau={t}", "mulo-v2-r2", {"tau": t}) for t in TAUS]
    runs += [(f"k={k}", "mulo-v2-r2", {"k": k}) for k in POOLING]
    records = harness.run(engine, runs, prompts, seed=0)
    ar = records["ar"]
    rows = {}
    for name, recs in records.items():
        row = harness.aggregate(recs, ar, quality, keys)
        rows[name] = {
            "acceptance": mean(r.acceptance for r in recs),
            "nfe_target": mean(r.nfe_target for r in recs),
            "reopened": mean(r.reopened for r in recs),
            "nfe_speedup": mean(a.nfe_target / r.nfe_target for a, r in zip(ar, recs, strict=True)),
            "speedup": row.get("speedup"),
            "adherence": row.get("adherence"),
            "fd": row.get("fd"),
        }
    out["rows"] = rows
    default = engine.generate("grinning face", "mulo", 0)
    out["grinning_face_islands"] = [r.n_islands for r in default.trace.rounds]
    out["grinning_face_reopened"] = default.trace.summary()["reopened_fraction"]
    apple, images = [], {}
    fits = quality.keys_for("red apple")
    for seed in range(5):
        for method in ("ar", "mulo"):
            images[method, seed] = engine.generate("red apple", method, seed).image
        ranks = {m: quality.prompt_rank(images[m, seed], fits) for m in ("ar", "mulo")}
        apple.append({"seed": seed, **ranks})
    out["red_apple_rank"] = apple  # the rank of the prompt's emoji among the family's texts (1 = first)
    if args.figure:
        red_apple_figure(images, apple, args.family, args.figure)
    text = json.dumps(out, indent=1, default=float)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)


def red_apple_figure(images: dict, ranks: list[dict], family: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 5, figsize=(7.5, 3.6))
    for row, (method, label) in enumerate((("ar", "AR"), ("mulo", "MuLo-SD"))):
        for seed in range(5):
            ax = axes[row, seed]
            ax.imshow(images[method, seed], interpolation="nearest")
            ax.set_title(f"{label}, seed {seed}: rank {ranks[seed][method]}", fontsize=7)
            ax.axis("off")
    fig.suptitle(f'"red apple" on {family} at its defaults (rank of the prompt by the mini-CLIP, 1 = best)', fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
