"""Sweeps and ablations of the benchmark, each one plot: ``python -m mulo bench --sweeps``.

Each sweep is a list of points (a method label of ``harness.SPECS`` plus knob overrides); every
point runs the same prompts and seeds as an AR run interleaved with it (``harness.run``), so its
speed-up is the median of per-request ratios like the main table's.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from mulo.engine import Engine
from mulo.eval import harness
from mulo.eval.bench import prompt_pool
from mulo.eval.quality import Quality

# tau 1.01 (above any probability, the knob's maximum) rejects everything (AR through MuLo-SD's code
# path; the knob once allowed 2, which the knob table now refuses), tau 0 accepts every draft token (the
# drafter and up-sampler alone: the target verifies but its verdict is ignored): the two ends.
TAUS = (1.01, 0.9, 0.3, 0.1, 0.01, 0.001, 0.0)
DELTAS = (0.05, 0.1, 0.2, 0.4, 0.8)
GSD_REACH = (0, 3, 7, 15)  # GSD's group reach: 0 is SJD's test, 7 GSD's code's


def pooling_ks(vocab_size: int) -> list[int]:
    """Pooling off, then about 1/64, 1/16 and 1/4 of the codebook (512 codes: 0, 8, 32, 128)."""
    return sorted({0} | {min(vocab_size - 1, max(1, round(vocab_size / d))) for d in (64, 16, 4)})


def sweep_points(vocab_size: int) -> dict[str, list[tuple[str, str, dict]]]:
    """{sweep: [(point name, bench label, overrides)]} for a codebook of ``vocab_size`` codes;
    names double as plot labels."""
    raster_rejection = 64  # a radius past the grid re-opens everything after t0: raster rejection
    return {
        "tau": [(f"{label} τ={t:g}", label, {"tau": t}) for label in ("mulo-v2-r2", "mulo-v2-r4") for t in TAUS]
        + [(f"mulo-v2-r4 learned τ={t:g}", "mulo-v2-r4", {"tau": t, "upsampler": "learned"}) for t in TAUS]
        + [(f"lantern δ={d}", "lantern", {"delta": d}) for d in DELTAS],
        "pooling": [(f"k={k}", "mulo-v2-r2", {"k": k}) for k in pooling_ks(vocab_size)],
        "rejection": [("raster", "mulo-v2-r2", {"radius": raster_rejection})]
        + [(f"local l={r}", "mulo-v2-r2", {"radius": r}) for r in (0, 1, 2, 3)],
        "resampling": [("sequential (v1)", "mulo-v2-r2", {"resampling": "raster"}), ("islands (v2)", "mulo-v2-r2", {})]
        + [(f"islands, ZipAR s={s}", "mulo-v2-r2", {"island_window": s}) for s in (8, 4)],
        "upsampler": [
            ("pixel", "mulo-v2-r2", {"upsampler": "pixel"}),
            ("learned", "mulo-v2-r2", {"upsampler": "learned"}),
        ],
        "rows_per_block": [(f"rows={n}", "mulo-v1-r2", {"rows_per_block": n}) for n in (1, 2, 4, 8)],
        # GSD's speed-quality knob: a wider group accepts more drafts and strays further from the target
        "gsd_group": [(f"gsd G={g}", "gsd", {"gsd_group": g}) for g in GSD_REACH],
    }


def run_sweep(
    engine: Engine, points, prompts: list[tuple[str, str]], quality, images: dict | None = None
) -> list[dict]:
    """One row per point (and AR's, where there are quality metrics: every plot's reference point);
    ``images``, when given, receives each point's images. Like the table, each prompt runs AR and
    every point, the order rotating from prompt to prompt."""
    records = harness.run(engine, [("ar", "ar", {}), *points], prompts)
    if images is not None:
        images.update({name: [r.image for r in recs] for name, recs in records.items()})
    keys = [key for key, _ in prompts]
    ar = records["ar"]
    runs = [*points, ("ar", "ar", {})] if quality is not None else points
    rows = []
    for name, label, overrides in runs:
        row = harness.aggregate(records[name], ar, quality, keys)
        rows.append(
            {
                "point": name,
                "label": label,
                "overrides": overrides,
                "speedup": row["speedup"],
                "nfe_target": row["nfe"]["target"],
                "acceptance": row["acceptance"],  # None where the point drafted nothing (AR)
                "reopened": row["reopened"],
                "fd": row["fd"],
                "adherence": row["adherence"],
            }
        )
    return rows


def sweep_figure(name: str, rows: list[dict]):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metric = "fd" if rows and rows[0].get("fd") is not None else "nfe_target"
    fig, ax = plt.subplots(figsize=(6.5, 4.2), dpi=150)
    groups: dict[str, list[dict]] = {}
    for row in rows:  # a tau curve per method and up-sampler: the point name less its last word
        group = row["point"].rsplit(" ", 1)[0] if name == "tau" and " " in row["point"] else row["label"]
        groups.setdefault(group, []).append(row)
    for group_name, group in groups.items():
        xs, ys = [g["speedup"] for g in group], [g[metric] for g in group]
        ax.plot(xs, ys, "o-" if name == "tau" and len(group) > 1 else "o", label=group_name, ms=5)
        for g in group:
            ax.annotate(g["point"].replace(f"{group_name} ", ""), (g["speedup"], g[metric]), fontsize=7)
    speedups = [row["speedup"] for row in rows]
    if speedups and max(speedups) > 4 * min(speedups):  # tau 0 sits far right of the rest
        from matplotlib.ticker import NullFormatter

        ax.set_xscale("log")
        ticks = [t for t in (0.25, 0.5, 1, 2, 4, 8, 16) if min(speedups) / 1.5 <= t <= max(speedups) * 1.5]
        ax.set_xticks(ticks, [f"{t:g}×" for t in ticks])
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("speed-up over AR (median of per-request ratios)")
    ax.set_ylabel({"fd": "FD (lower is better)", "nfe_target": "target NFE"}[metric])
    ax.set_title(f"{name}: speed vs quality")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def images_figure(name: str, images: dict[str, list[np.ndarray]], prompts: list[str], columns: int = 8):
    """What each point draws: a row per point (AR first), the same prompts and seeds per column."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    order = ["ar", *[p for p in images if p != "ar"]]
    gap = 2
    rows = []
    for point in order:
        tiles = [np.pad(im, ((gap, gap), (gap, gap), (0, 0)), constant_values=255) for im in images[point][:columns]]
        rows.append(np.concatenate(tiles, axis=1))
    sheet = np.concatenate(rows, axis=0)
    size = sheet.shape[0] // len(order)
    fig, ax = plt.subplots(figsize=(0.75 * sheet.shape[1] / size + 2.2, 0.75 * len(order) + 0.6), dpi=110)
    ax.imshow(sheet)
    ax.set_yticks([size * (i + 0.5) for i in range(len(order))], order, fontsize=8)
    ax.set_xticks(
        [size * (i + 0.5) for i in range(min(columns, len(prompts)))], prompts[:columns], fontsize=7, rotation=30
    )
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    ax.set_title(f"{name}: the images of each point (seed = column)", fontsize=9)
    fig.tight_layout()
    return fig


def run_all(engine: Engine, n_prompts: int = 16, out_dir: Path | None = None, names: list[str] | None = None) -> dict:
    """Every sweep (or ``names``) on the first ``n_prompts`` prompts; plots and JSON into ``out_dir``."""
    quality = Quality.for_family(engine.family)
    prompts = prompt_pool(quality)[:n_prompts]
    results = {}
    for name, points in sweep_points(engine.family.vocab_size).items():
        if names and name not in names:
            continue
        points = [p for p in points if harness.runnable(engine, p[1], p[2]) is None]
        images: dict[str, list[np.ndarray]] = {}
        results[name] = run_sweep(engine, points, prompts, quality, images)
        if out_dir:
            import matplotlib.pyplot as plt

            out_dir.mkdir(parents=True, exist_ok=True)
            for suffix, fig in (
                ("", sweep_figure(name, results[name])),
                ("_images", images_figure(name, images, [p for _, p in prompts])),
            ):
                fig.savefig(out_dir / f"sweep_{name}{suffix}.png", bbox_inches="tight")
                plt.close(fig)
            (out_dir / "sweeps.json").write_text(json.dumps(results, indent=1))
    return results
