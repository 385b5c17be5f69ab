"""AR's sampling knobs (CFG, temperature, top-k, top-p) against FD and adherence, at several seeds.

    python tools/experiments/ar_sampling.py --family emoji-16 --prompts 120 --seeds 0,1000 \
        --settings "cfg=3,top_p=0.95; cfg=5,top_p=0.95; cfg=3,top_k=8,top_p=1" \
        --json benchmarks/sampling-emoji-16.json

The calibration (``mulo.eval.calibrate``) tunes MuLo-SD's knobs against AR at the family's
sampling defaults; this sets those defaults. Each setting (knob=value pairs, settings separated by
";") runs AR over the prompts at every seed (prompt i at seed s + i); a row holds FD and adherence
per seed and their means. FD moves by ~0.05-0.1 with the seeds alone on 120 prompts, adherence by
~0.03: a setting is better when it is better at every seed, not in one mean.

``--methods`` measures other methods the same way (the engine's names, e.g. ``ar,mulo-v2-r2,
mulo-v2-r4``), each at every setting; an empty ``--settings ""`` is the family's defaults:

    python tools/experiments/ar_sampling.py --methods ar,mulo-v2-r2,mulo-v2-r4 --settings "" --seeds 0,1000,2000
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from family_bars import evaluation_setup  # tools/experiments/family_bars.py, beside this file

from mulo.config import validate
from mulo.eval import harness
from mulo.eval.calibrate import parse_start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="scenes")
    parser.add_argument("--prompts", type=int, default=120)
    parser.add_argument("--seeds", default="0,1000", help="first seeds, comma-separated (prompt i at seed s + i)")
    parser.add_argument("--settings", required=True, help='"knob=value,...; knob=value,..." ("": the defaults)')
    parser.add_argument("--methods", default="ar", help="comma-separated methods, each run at every setting")
    parser.add_argument("--json", type=Path, help="write the rows here, after every setting")
    args = parser.parse_args()
    engine, quality, prompts = evaluation_setup(args.family, args.prompts)
    fam = engine.family
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
        settings = [parse_start(text) for text in args.settings.split(";") if text.strip()] or [{}]
        methods = [m.strip() for m in args.methods.split(",") if m.strip()]
        unknown = [m for m in methods if m not in harness.SPECS]
        if unknown or not methods:
            raise ValueError(
                f"unknown method {', '.join(unknown) or '(none given)'}; known: {', '.join(harness.SPECS)}"
            )
        for setting in settings:  # a bad knob or value fails here, before any run
            validate(engine.make_config(setting), vocab_size=fam.vocab_size, ratios=fam.ratios, grid=fam.grid)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    keys = [key for key, _ in prompts]
    rows = []
    for method, setting in [(m, s) for s in settings for m in methods]:
        row = {"method": method, "settings": setting, "seeds": {}}
        for seed in seeds:
            start = time.perf_counter()
            records = harness.run(engine, [(method, method, setting)], prompts, seed=seed)[method]
            scored = harness.aggregate(records, quality=quality, keys=keys)
            seconds = time.perf_counter() - start
            row["seeds"][seed] = {"fd": scored["fd"], "adherence": scored["adherence"], "seconds": seconds}
        for measure in ("fd", "adherence"):
            row[measure] = statistics.fmean(r[measure] for r in row["seeds"].values())
        rows.append(row)
        per_seed = ", ".join(f"{r['fd']:.3f} / {r['adherence']:.3f}" for r in row["seeds"].values())
        print(
            f"{method} {setting}: FD / adherence {per_seed} (mean {row['fd']:.3f} / {row['adherence']:.3f})", flush=True
        )
        if args.json:
            args.json.write_text(json.dumps({"family": args.family, "prompts": len(prompts), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
