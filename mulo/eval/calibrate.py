"""A family's MuLo-SD defaults by the paper's protocol: its knobs tuned until its quality matches AR's.

``python -m mulo calibrate [--family NAME] [--prompts 24] [--json out.json]``

AR runs the prompts once. Then, from the family's defaults, each knob of ``SEARCH`` in turn takes
each of its values with the others fixed (a coordinate search); every point runs MuLo-SD v2 at
r = 2 and r = 4 on the same prompts and seeds. A point keeps AR's quality when, at both ratios,
adherence is within 0.03 of AR's and FD within 10 % (``bench.at_ar_quality``); among those, the
highest geometric mean of the two NFE speed-ups (``bench.nfe_speedup``: drafter passes weighted by
their measured cost) sets the knob. A knob no value of which keeps AR's quality keeps its default.
It prints every point and the settings found: what ``defaults.json`` should hold.

On many prompts the search takes hours on a CPU, so it can start elsewhere than the family's
defaults (``--start tau=0.1,k=0``), search a subset of the knobs in a chosen order (``--knobs
tau,k,radius``) and, with ``--json``, it saves after every point; ``--resume`` re-uses the saved
AR row and points measured on the same prompts, so a stopped search goes on where it was.
``--ar-spread`` also runs AR at other seeds: how far FD moves with the seeds alone, the noise
the 10 % criterion stands against. ``--seeds 0,1000,2000`` runs AR and every point at each first
seed (prompt i at seed s + i) and judges the means over the seeds: on a small target one seed's
FD and adherence move by about the 10 % and 0.03 the criterion allows, so a one-seed verdict can
pick a setting that loses AR's quality at the next seeds.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from mulo.config import validate
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
    # The training picks the up-sampler by its token accuracy on perfect drafts; the protocol
    # decides by what MuLo-SD's images cost in quality, like any other knob
    "upsampler": ("pixel", "learned"),
}


def calibrate(
    engine: Engine,
    prompts: list[tuple[str, str]],
    quality: Quality | None,
    search=SEARCH,
    log=None,
    start: dict | None = None,
    saved: dict | None = None,
    save=None,
    seeds: tuple[int, ...] = (0,),
):
    """The coordinate search over ``prompts`` [(key, prompt)] from the family's defaults updated by
    ``start``, each row the mean over the first ``seeds``; returns {"prompts", "seeds", "ar",
    "points", "settings", "step_cost"}. ``saved``: an earlier such result whose AR row and points
    are re-used when its prompts and seeds are these; ``save(result)`` is called after every new
    point with the result so far."""
    keys, seeds = [key for key, _ in prompts], list(seeds)
    # a result saved before it recorded its seeds ran seed 0 only
    reuse = saved is not None and saved.get("prompts") == keys and saved.get("seeds", [0]) == seeds
    if reuse:
        ar, costs = saved["ar"], saved["step_cost"]
    else:
        ar = seeded_row(engine, [("ar", "ar", {})], prompts, quality, seeds)["ar"]
        costs = bench.step_costs(engine, prompts[0][1])
    defaults = engine.make_config(None).to_dict()
    settings = {**{knob: defaults[knob] for knob in search}, **(start or {})}
    # A point is known by every knob the protocol tunes, not only the searched ones: a search of
    # island_window resumed after radius changed in the defaults must not re-use radius 2's points
    fixed = {knob: defaults[knob] for knob in SEARCH if knob in defaults}
    seen: dict[str, dict] = {}
    if reuse:  # points saved before they carried their whole "config" are measured again
        seen.update((json.dumps(p["config"], sort_keys=True), p) for p in saved["points"] if "config" in p)

    def result() -> dict:
        points = list(seen.values())
        return {"prompts": keys, "seeds": seeds, "ar": ar, "points": points, "settings": settings, "step_cost": costs}

    def evaluate(candidate: dict) -> dict:
        config = {**fixed, **candidate}
        name = json.dumps(config, sort_keys=True)
        if name not in seen:
            point = {"settings": dict(candidate), "config": config}
            rows = seeded_row(engine, [(label, label, candidate) for label in LABELS], prompts, quality, seeds)
            for label, row in rows.items():
                row["nfe_speedup"] = bench.nfe_speedup(row, ar, costs[harness.drafter_of(engine, label, candidate)])
                point[label] = row
            point["keeps_quality"] = all(bench.at_ar_quality(point[label], ar) for label in LABELS)
            point["score"] = math.sqrt(point[LABELS[0]]["nfe_speedup"] * point[LABELS[1]]["nfe_speedup"])
            seen[name] = point
            if log:
                log(point)
            if save:
                save(result())
        return seen[name]

    for knob, values in search.items():
        kept = [evaluate({**settings, knob: v}) for v in values]
        kept = [p for p in kept if p["keeps_quality"]]
        if kept:
            settings = max(kept, key=lambda p: p["score"])["settings"]
    return result()


def seeded_row(
    engine: Engine, runs: list[harness.Run], prompts: list[tuple[str, str]], quality: Quality | None, seeds: list[int]
) -> dict[str, dict]:
    """{run name: its row}, each run over ``prompts`` at every first seed of ``seeds``: one seed's
    row as ``harness.aggregate`` makes it; several seeds' rows averaged (a number, or a dict of
    numbers, that some seed lacks stays None), with FD and adherence per seed under "per_seed"."""
    keys = [key for key, _ in prompts]
    per_seed: dict[str, list[dict]] = {name: [] for name, _, _ in runs}
    for seed in seeds:
        for name, records in harness.run(engine, runs, prompts, seed=seed).items():
            per_seed[name].append(harness.aggregate(records, quality=quality, keys=keys))
    if len(seeds) == 1:
        return {name: rows[0] for name, rows in per_seed.items()}
    out = {}
    for name, rows in per_seed.items():
        out[name] = _mean_rows(rows)
        scores = [{"fd": r["fd"], "adherence": r["adherence"]} for r in rows]
        out[name]["per_seed"] = dict(zip(map(str, seeds), scores, strict=True))
    return out


def _mean_rows(rows: list[dict]) -> dict:
    def mean(values):
        if any(isinstance(v, dict) for v in values):
            return {k: mean([v[k] for v in values]) for k in values[0]}
        return None if any(v is None for v in values) else sum(values) / len(values)

    return {key: mean([row[key] for row in rows]) for key in rows[0]}


def describe(point: dict) -> str:
    parts = [", ".join(f"{k} {v}" for k, v in point["settings"].items())]
    for label in LABELS:
        row = point[label]
        quality = f"adherence {row['adherence']:.3f}, FD {row['fd']:.3f}" if row["adherence"] is not None else "-"
        accepted = "—" if row["acceptance"] is None else f"{row['acceptance']:.3f}"  # None: nothing drafted
        parts.append(f"{label}: {row['nfe_speedup']:.2f}x NFE, accepted {accepted}, {quality}")
    return " | ".join(parts) + (" | keeps AR's quality" if point["keeps_quality"] else " | loses quality")


def main(argv=None, prog=None) -> int:
    from mulo.families import DEFAULT_FAMILY, load_family

    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--family", default=DEFAULT_FAMILY)
    parser.add_argument("--prompts", type=int, default=24, help="evaluation prompts (default 24)")
    parser.add_argument("--json", type=Path, help="write the points and the settings found here, after every point")
    parser.add_argument("--start", default="", help="knob=value,... to start from instead of the family's defaults")
    parser.add_argument("--knobs", default=",".join(SEARCH), help="the knobs to search, in order (default: all)")
    parser.add_argument("--resume", action="store_true", help="re-use the points already in --json")
    parser.add_argument("--ar-spread", action="store_true", help="also run AR at other seeds (FD's noise)")
    parser.add_argument("--seeds", default="0", help="first seeds, comma-separated: rows are their means (default 0)")
    args = parser.parse_args(argv)
    try:
        seeds = _seed_list(args.seeds)
        start, search = parse_start(args.start), {knob: SEARCH[knob] for knob in _knob_list(args.knobs)}
        if args.resume and not args.json:
            raise ValueError("--resume needs --json (the file to resume from)")
        saved = json.loads(args.json.read_text()) if args.resume and args.json.exists() else None
        engine = Engine(load_family(args.family))
        fam = engine.family  # a bad --start value fails here, before any run
        validate(engine.make_config(start), vocab_size=fam.vocab_size, ratios=fam.ratios, grid=fam.grid)
    except (ValueError, FileNotFoundError, json.JSONDecodeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    quality = Quality.for_family(engine.family)
    prompts = bench.prompt_pool(quality)[: args.prompts]
    save = (lambda r: args.json.write_text(json.dumps(r, indent=1))) if args.json else None
    log = lambda p: print(describe(p), flush=True)  # noqa: E731
    result = calibrate(engine, prompts, quality, search, log, start, saved, save, seeds)
    if args.ar_spread:
        same = saved is not None and saved.get("prompts") == result["prompts"] and "ar_other_seeds" in saved
        result["ar_other_seeds"] = saved["ar_other_seeds"] if same else ar_other_seeds(engine, prompts, quality)
        other, ar = result["ar_other_seeds"], result["ar"]
        spread = f"FD {other['fd']:.3f} ({other['fd'] / ar['fd']:.3f}x AR's), adherence {other['adherence']:.3f}"
        print(f"AR at seeds {OTHER_SEEDS}+: {spread}")
    print(json.dumps({"ar": result["ar"], "settings": result["settings"]}, indent=1))
    if save:
        save(result)
    return 0


OTHER_SEEDS = 1000  # AR again from this seed on: how far FD moves with the seeds alone


def ar_other_seeds(engine: Engine, prompts: list[tuple[str, str]], quality: Quality | None) -> dict:
    """AR's row on the same prompts at other seeds: the noise against which "FD within 10 % of
    AR's" is judged (a point's FD moves this much by its seeds alone)."""
    return seeded_row(engine, [("ar", "ar", {})], prompts, quality, [OTHER_SEEDS])["ar"]


def _seed_list(text: str) -> tuple[int, ...]:
    try:
        seeds = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        seeds = ()
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise ValueError(f"--seeds takes distinct non-negative integers separated by commas (got {text!r})")
    return seeds


def _knob_list(text: str) -> list[str]:
    knobs = [k.strip() for k in text.split(",") if k.strip()]
    unknown = [k for k in knobs if k not in SEARCH]
    if unknown or not knobs:
        raise ValueError(f"--knobs takes some of {', '.join(SEARCH)} (got {text!r})")
    return knobs


def parse_start(text: str) -> dict:
    """``"tau=0.1,drafting=zipar"`` -> {"tau": 0.1, "drafting": "zipar"} (numbers as numbers)."""
    start = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        knob, sep, value = item.partition("=")
        if not sep or not knob.strip():
            raise ValueError(f"--start takes knob=value pairs separated by commas (got {item!r})")
        try:
            start[knob.strip()] = json.loads(value)
        except json.JSONDecodeError:
            start[knob.strip()] = value.strip()
    return start
