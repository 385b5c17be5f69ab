"""Sweeps and ablations of the benchmark, each one plot: ``python -m mulo bench --sweeps``.

Each sweep is a list of points (a method label of ``bench.SPECS`` plus knob overrides); every
point runs the same prompts and seeds as an AR run interleaved with it, so its speed-up is the
median of per-request ratios like the main table's.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np

from mulo.engine import Engine
from mulo.eval.bench import measure, prompt_pool, runnable
from mulo.eval.quality import Quality

TAUS = (0.3, 0.1, 0.03, 0.01, 0.003, 0.001)
DELTAS = (0.05, 0.1, 0.2, 0.4, 0.8)


def sweep_points() -> dict[str, list[tuple[str, str, dict]]]:
    """{sweep: [(point name, bench label, overrides)]}; names double as plot labels."""
    raster_rejection = 64  # a radius past the grid re-opens everything after t0: raster rejection
    return {
        "tau": [(f"{label} τ={t}", label, {"tau": t}) for label in ("mulo-v2-r2", "mulo-v2-r4") for t in TAUS]
        + [(f"lantern δ={d}", "lantern", {"delta": d}) for d in DELTAS],
        "pooling": [(f"k={k}", "mulo-v2-r2", {"k": k}) for k in (0, 8, 32, 128)],
        "rejection": [("raster", "mulo-v2-r2", {"radius": raster_rejection})]
        + [(f"local l={r}", "mulo-v2-r2", {"radius": r}) for r in (0, 1, 2, 3)],
        "resampling": [("sequential (v1)", "mulo-v2-r2", {"resampling": "raster"}), ("islands (v2)", "mulo-v2-r2", {})],
        "upsampler": [
            ("pixel", "mulo-v2-r2", {"upsampler": "pixel"}),
            ("learned", "mulo-v2-r2", {"upsampler": "learned"}),
        ],
        "rows_per_block": [(f"rows={n}", "mulo-v1-r2", {"rows_per_block": n}) for n in (1, 2, 4, 8)],
    }


def run_sweep(engine: Engine, points, prompts: list[tuple[str, str]], quality) -> list[dict]:
    ar = [measure(engine, "ar", prompt, seed=i) for i, (_, prompt) in enumerate(prompts)]
    keys = [key for key, _ in prompts]
    rows = []
    for name, label, overrides in points:
        recs = [measure(engine, label, prompt, seed=i, overrides=overrides) for i, (_, prompt) in enumerate(prompts)]
        row = {
            "point": name,
            "label": label,
            "overrides": overrides,
            "speedup": statistics.median(a.latency / r.latency for a, r in zip(ar, recs, strict=True)),
            "nfe_target": float(np.mean([r.nfe_target for r in recs])),
            "acceptance": float(np.mean([r.acceptance or 0 for r in recs])),
            "reopened": float(np.mean([r.reopened for r in recs])),
        }
        if quality is not None:
            row.update(quality.score(np.stack([r.image for r in recs]), keys))
        rows.append(row)
    if quality is not None:  # the AR reference point of every plot
        rows.append(
            {
                "point": "ar",
                "label": "ar",
                "overrides": {},
                "speedup": 1.0,
                "nfe_target": ar[0].nfe_target,
                "acceptance": 0.0,
                "reopened": 0.0,
                **quality.score(np.stack([r.image for r in ar]), keys),
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
    for row in rows:
        groups.setdefault(row["label"], []).append(row)
    for label, group in groups.items():
        xs, ys = [g["speedup"] for g in group], [g[metric] for g in group]
        ax.plot(xs, ys, "o-" if name == "tau" and len(group) > 1 else "o", label=label, ms=5)
        for g in group:
            ax.annotate(g["point"].replace(f"{label} ", ""), (g["speedup"], g[metric]), fontsize=7)
    ax.set_xlabel("speed-up over AR (median of per-request ratios)")
    ax.set_ylabel({"fd": "FD (lower is better)", "nfe_target": "target NFE"}[metric])
    ax.set_title(f"{name}: speed vs quality")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def run_all(engine: Engine, n_prompts: int = 16, out_dir: Path | None = None, names: list[str] | None = None) -> dict:
    """Every sweep (or ``names``) on the first ``n_prompts`` prompts; plots and JSON into ``out_dir``."""
    quality = Quality.for_family(engine.family)
    prompts = prompt_pool(quality)[:n_prompts]
    results = {}
    for name, points in sweep_points().items():
        if names and name not in names:
            continue
        points = [p for p in points if runnable(engine, p[1], p[2]) is None]
        results[name] = run_sweep(engine, points, prompts, quality)
        if out_dir:
            out_dir.mkdir(parents=True, exist_ok=True)
            sweep_figure(name, results[name]).savefig(out_dir / f"sweep_{name}.png", bbox_inches="tight")
            (out_dir / "sweeps.json").write_text(json.dumps(results, indent=1))
    return results
