"""A family's MuLo-SD defaults by the paper's protocol: its knobs tuned until its quality matches AR's.

``python -m mulo.eval.calibrate [--family NAME] [--prompts 24] [--json out.json]``

AR runs the prompts once. Then, from the family's defaults, each knob of ``SEARCH`` in turn takes
each of its values with the others fixed (a coordinate search); every point runs MuLo-SD v2 at
r = 2 and r = 4 on the same prompts and seeds. A point keeps AR's quality when, at both ratios,
adherence is within 0.03 of AR's and FD within 10 % (``bench.at_ar_quality``); among those, the
highest geometric mean of the two NFE speed-ups (``bench.nfe_speedup``: drafter passes weighted by
their measured cost) sets the knob. A knob no value of which keeps AR's quality keeps its default.
It prints every point and the settings found: what ``defaults.json`` should hold.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from mulo.engine import Engine
from mulo.eval import bench, harness
from mulo.eval.quality import Quality

LABELS = ("mulo-v2-r2", "mulo-v2-r4")
SEARCH: dict[str, tuple] = {
    "island_window": (0, 4, 8),
    "drafting": ("sequential", "zipar"),
    "radius": (0, 1, 2, 3),
    "tau": (0.3, 0.1, 0.03, 0.01),
    "k": (0, 1, 4),
}


def calibrate(engine: Engine, prompts: list[tuple[str, str]], quality: Quality | None, search=SEARCH, log=None):
    """The coordinate search over ``prompts`` [(key, prompt)]; returns {"ar", "points", "settings"}."""
    keys = [key for key, _ in prompts]
    ar = harness.aggregate(harness.run(engine, [("ar", "ar", {})], prompts)["ar"], quality=quality, keys=keys)
    costs = bench.step_costs(engine, prompts[0][1])
    defaults = engine.make_config(None).to_dict()
    settings = {knob: defaults[knob] for knob in search}
    seen: dict[str, dict] = {}

    def evaluate(candidate: dict) -> dict:
        name = json.dumps(candidate, sort_keys=True)
        if name not in seen:
            point = {"settings": dict(candidate)}
            records = harness.run(engine, [(label, label, candidate) for label in LABELS], prompts)
            for label in LABELS:
                row = harness.aggregate(records[label], quality=quality, keys=keys)
                row["nfe_speedup"] = bench.nfe_speedup(row, ar, costs[harness.drafter_of(engine, label, candidate)])
                point[label] = row
            point["keeps_quality"] = all(bench.at_ar_quality(point[label], ar) for label in LABELS)
            point["score"] = math.sqrt(point[LABELS[0]]["nfe_speedup"] * point[LABELS[1]]["nfe_speedup"])
            seen[name] = point
            if log:
                log(point)
        return seen[name]

    for knob, values in search.items():
        kept = [evaluate({**settings, knob: v}) for v in values]
        kept = [p for p in kept if p["keeps_quality"]]
        if kept:
            settings = max(kept, key=lambda p: p["score"])["settings"]
    return {"ar": ar, "points": list(seen.values()), "settings": settings, "step_cost": costs}


def describe(point: dict) -> str:
    parts = [", ".join(f"{k} {v}" for k, v in point["settings"].items())]
    for label in LABELS:
        row = point[label]
        quality = f"adherence {row['adherence']:.3f}, FD {row['fd']:.3f}" if row["adherence"] is not None else "-"
        accepted = "—" if row["acceptance"] is None else f"{row['acceptance']:.3f}"  # None: nothing drafted
        parts.append(f"{label}: {row['nfe_speedup']:.2f}x NFE, accepted {accepted}, {quality}")
    return " | ".join(parts) + (" | keeps AR's quality" if point["keeps_quality"] else " | loses quality")


def main(argv=None) -> int:
    from mulo.families import DEFAULT_FAMILY, load_family

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default=DEFAULT_FAMILY)
    parser.add_argument("--prompts", type=int, default=24, help="evaluation prompts (default 24)")
    parser.add_argument("--json", type=Path, help="write the points and the settings found here")
    args = parser.parse_args(argv)
    try:
        engine = Engine(load_family(args.family))
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    quality = Quality.for_family(engine.family)
    prompts = bench.prompt_pool(quality)[: args.prompts]
    result = calibrate(engine, prompts, quality, log=lambda p: print(describe(p), flush=True))
    print(json.dumps({"ar": result["ar"], "settings": result["settings"]}, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
