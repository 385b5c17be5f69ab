"""Every method's speed-quality front on one family, in one run against the same engine's AR.

    python tools/experiments/front.py --family emoji-16 --prompts 120 --json benchmarks/front-emoji-16.json \
        --figure docs/front-emoji16.png

Each method runs at a few settings (its points: ZipAR's window, SJD's and MC-SJD's window, GSD's
group reach, SD's draft length, LANTERN's delta, EAGLE-2's tree budget, MuLo-SD's neighbourhood
and tau at r = 2 and 4), every point over the same prompts and seeds, interleaved with AR
(``bench.run_table``). A point keeps AR's quality when its FD is within 10 % of AR's and its
adherence within 0.03 (``bench.at_ar_quality``, the paper's protocol). Per method and per measure (NFE, cost and
wall-clock speed-up) the fastest point that keeps AR's quality is its best; issue 46 asks MuLo-SD's
best to beat every baseline's on all three. The figure puts every point on one plot per measure:
speed-up across, FD over AR's up, a line through each method's points.

Wall-clock columns are timings only when nothing else ran beside the script.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from family_bars import evaluation_setup  # tools/experiments/family_bars.py, beside this file

from mulo.eval import bench, harness

MEASURES = {"nfe_speedup": "NFE", "cost_speedup": "cost", "speedup": "wall-clock"}
MULO = ("MuLo-SD v2 r=2", "MuLo-SD v2 r=4")


def points() -> dict[str, list[tuple[str, str, dict]]]:
    """Method -> its runs (row name, label of ``harness.SPECS``, knob overrides)."""
    mulo = {"defaults": {}, "l=2 tau=0.1": {"radius": 2, "tau": 0.1}, "l=0 tau=0.1": {"radius": 0, "tau": 0.1}}
    return {
        "ZipAR": [(f"zipar w={w}", "zipar", {"zipar_window": w}) for w in (4, 8, 16)],
        "SJD": [(f"sjd w={w}", "sjd", {"sjd_window": w}) for w in (8, 16, 32)],
        "MC-SJD": [(f"mc-sjd w={w}", "mc-sjd", {"sjd_window": w}) for w in (8, 16, 32)],
        "GSD": [(f"gsd G={g}", "gsd", {"gsd_group": g}) for g in (3, 7, 15)],
        "SD": [(f"sd len={n}", "sd", {"draft_len": n}) for n in (2, 4, 8)],
        "LANTERN": [(f"lantern delta={d}", "lantern", {"delta": d}) for d in (0.1, 0.4, 1.0)],
        "EAGLE-2": [(f"eagle2 budget={b}", "eagle2", {"tree_budget": b}) for b in (20, 60)],
        MULO[0]: [(f"mulo-v2-r2 {name}", "mulo-v2-r2", knobs) for name, knobs in mulo.items()],
        MULO[1]: [(f"mulo-v2-r4 {name}", "mulo-v2-r4", knobs) for name, knobs in mulo.items()],
    }


def best_at_quality(rows: dict, names: list[str], measure: str) -> tuple[str, float] | None:
    """The fastest of ``names`` by ``measure`` among those that keep AR's quality."""
    kept = [(rows[n][measure], n) for n in names if rows[n].get("keeps_ar_quality") and rows[n][measure] is not None]
    return (max(kept)[1], max(kept)[0]) if kept else None


def verdicts(rows: dict, groups: dict[str, list[str]]) -> dict[str, dict]:
    """Per measure: each method's best point at AR's quality, and whether MuLo-SD's best beats
    every baseline's (a baseline with no point at AR's quality is beaten by any)."""
    out = {}
    for measure in MEASURES:
        best = {method: best_at_quality(rows, names, measure) for method, names in groups.items()}
        mulo = max((best[m] for m in MULO if best[m]), key=lambda b: b[1], default=None)
        baselines = {m: b for m, b in best.items() if m not in MULO}
        ahead = mulo is not None and all(b is None or mulo[1] > b[1] for b in baselines.values())
        out[measure] = {"best": best, "mulo_best": mulo, "mulo_ahead_of_every_baseline": ahead}
    return out


def figure(rows: dict, groups: dict[str, list[str]], family: str, path: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(15, 4.6))
    axes = fig.subplots(1, len(MEASURES), sharey=True)
    for ax, (measure, title) in zip(axes, MEASURES.items(), strict=True):
        for method, names in groups.items():
            xs = [rows[n][measure] for n in names]
            ys = [rows[n]["fd_over_ar"] for n in names]
            style = dict(lw=2.4, marker="o", ms=7) if method in MULO else dict(lw=1.2, marker="s", ms=5, alpha=0.85)
            ax.plot(xs, ys, label=method, **style)
        ax.plot([1.0], [1.0], "k*", ms=12, label="AR")
        ax.axhline(1 + bench.QUALITY_TOLERANCE["fd"], color="grey", ls="--", lw=1)
        ax.set_xlabel(f"{title} speed-up over AR")
        ax.set_title(f"{title} speed-up")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("FD / AR's FD (dashed: AR's quality, +10 %)")
    axes[-1].legend(fontsize=8, loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.suptitle(f"{family}: every method's speed-quality front (same prompts, seeds and engine)")
    fig.savefig(path, dpi=110, bbox_inches="tight")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="scenes")
    parser.add_argument("--prompts", type=int, default=120)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--figure", type=Path)
    args = parser.parse_args()
    engine, quality, prompts = evaluation_setup(args.family, args.prompts)
    groups = points()
    runs = [("ar", "ar", {})] + [run for method in groups.values() for run in method]
    refused = [f"{name}: {why}" for name, label, over in runs if (why := harness.runnable(engine, label, over))]
    if refused:  # before an hour of runs, not in the middle of them
        raise SystemExit("error: " + "; ".join(refused))
    rows, _, costs = bench.run_table(engine, prompts, runs, quality, warmup=1, against_eager=False)
    ar = rows["ar"]
    for row in rows.values():
        row["fd_over_ar"] = row["fd"] / ar["fd"]
        row["keeps_ar_quality"] = bench.at_ar_quality(row, ar)
    names = {method: [name for name, _, _ in runs_] for method, runs_ in groups.items()}
    result = {
        "family": args.family,
        "prompts": len(prompts),
        "execution": engine.compilation,
        "points": {name: {"label": label, "overrides": over} for name, label, over in runs},
        "rows": rows,
        "step_cost": {name: costs.step(name) for name in costs.widths if name != "target"},
        "verdicts": verdicts(rows, names),
    }
    print("| point | NFE x | cost x | wall x | FD / AR's | adherence | keeps AR's quality |")
    print("|---|---|---|---|---|---|---|")
    for name, row in rows.items():
        print(
            f"| {name} | {row['nfe_speedup']:.2f} | {row['cost_speedup']:.2f} | {row['speedup']:.2f} | "
            f"{row['fd_over_ar']:.3f} | {row['adherence']:.3f} | {row['keeps_ar_quality']} |"
        )
    for measure, verdict in result["verdicts"].items():
        ahead = verdict["mulo_ahead_of_every_baseline"]
        print(f"{MEASURES[measure]}: MuLo-SD's best at AR's quality {verdict['mulo_best']}; ahead of all: {ahead}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str))
    if args.figure:
        figure(rows, names, args.family, args.figure)


if __name__ == "__main__":
    main()
