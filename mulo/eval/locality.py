"""Issue 63's locality bars for a scenes family: ``python -m mulo locality [--family scenes]
[--prompts 120] [--json FILE]``, on the family's evaluation prompts (prompt i at seed i).

- ``layouts``: AR at seeds 0-4 on each of the first 24 prompts; how many of the five images lay the
  scene out differently (bar: five for >= 90 % of the prompts). A layout is where the foreground
  sits: the tokens that differ from the grid's most common one (the background's); two images share
  a layout when their foregrounds overlap by an intersection over union of ``SAME_LAYOUT_IOU`` or
  more (two empty foregrounds: the same): the same places up to a few tokens, so a lookup table's
  one image per prompt counts once, and an 8x8-token object moved by one token (IoU 0.78) counts
  anew. It reads tokens, not the referee, so it counts layouts of images the referee cannot read too.
- ``locality``: MuLo-SD at the family's defaults on every prompt: the re-opened share of the grid
  (bar: mean <= 0.35) and, on the prompts with two or three objects, whether the round that verified
  the draft had at least as many islands as the prompt names objects (bar: >= 70 % of them); with
  AR's and MuLo-SD's prompt match beside (the referee's).
- ``tau``: MuLo-SD's acceptance at each of ``TAUS`` on the first 24 prompts (bar: it falls as tau
  rises, by 0.1 or more from the first to the last); beside it, the acceptance over the detailed
  tokens alone (``acceptance_by_detail``: the final image's tokens that are not one flat colour),
  where tau can act: the flat background, most of a scene, is accepted at any tau, which bounds
  how far the overall acceptance can fall.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from mulo.eval import harness
from mulo.eval.metrics import acceptance_by_detail
from mulo.scenes import parse_prompt

SAME_LAYOUT_IOU = 0.8
LAYOUT_SEEDS = 5
LAYOUT_PROMPTS = 24
TAUS = (0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 0.5)
BARS = {"five_layouts": 0.9, "reopened": 0.35, "islands_per_object": 0.7, "tau_span": 0.1}


def foreground(tokens: np.ndarray) -> np.ndarray:
    """Boolean ``[H, W]``: the tokens that differ from the grid's most common token."""
    values, counts = np.unique(tokens, return_counts=True)
    return tokens != values[np.argmax(counts)]


def same_layout(a: np.ndarray, b: np.ndarray, iou: float = SAME_LAYOUT_IOU) -> bool:
    """Whether two foreground masks overlap by an intersection over union of ``iou`` or more."""
    union = np.logical_or(a, b).sum()
    if union == 0:
        return True
    return np.logical_and(a, b).sum() / union >= iou


def distinct_layouts(masks: list[np.ndarray], iou: float = SAME_LAYOUT_IOU) -> int:
    """How many of ``masks`` lay the scene out differently: each mask counts unless it shares a
    layout with one counted before it."""
    kept: list[np.ndarray] = []
    for mask in masks:
        if not any(same_layout(mask, other, iou) for other in kept):
            kept.append(mask)
    return len(kept)


def verified_islands(trace) -> int:
    """The islands of the round that verified the draft (MuLo-SD's first round with a draft); 0
    when nothing was re-opened."""
    for round_ in trace.rounds:
        if round_.proposed:
            return round_.n_islands
    return 0


def falls_with_tau(acceptance: list[float], min_span: float = BARS["tau_span"]) -> bool:
    """Whether acceptance, listed at rising tau, never rises and falls by ``min_span`` or more."""
    steps = np.diff(acceptance)
    return bool(np.all(steps <= 1e-9) and acceptance[0] - acceptance[-1] >= min_span)


def measure_layouts(engine, prompts: list[str], seeds: int = LAYOUT_SEEDS) -> dict:
    counts = []
    for prompt in prompts:
        masks = [foreground(engine.generate(prompt, "ar", seed).tokens.numpy()) for seed in range(seeds)]
        counts.append(distinct_layouts(masks))
    return {
        "prompts": len(prompts),
        "seeds": seeds,
        "distinct": counts,
        "share_all_distinct": float(np.mean([c == seeds for c in counts])),
    }


def measure_locality(engine, quality, prompts: list[tuple[str, str]]) -> dict:
    """MuLo-SD at the family's defaults beside AR on every prompt: re-opened share, islands per object."""
    records = harness.run(
        engine, [("ar", "ar", {}), ("mulo", "mulo", {})], prompts, extra=lambda r: verified_islands(r.trace)
    )
    keys = [key for key, _ in prompts]
    objects = [len(parse_prompt(p).objects) for _, p in prompts]
    multi = [i for i, n in enumerate(objects) if n >= 2]
    islands = [records["mulo"][i].extra for i in range(len(prompts))]
    enough = [islands[i] >= objects[i] for i in multi]
    out = {
        "prompts": len(prompts),
        "multi_object_prompts": len(multi),
        "reopened_mean": float(np.mean([r.reopened for r in records["mulo"]])),
        "islands": islands,
        "share_islands_per_object": float(np.mean(enough)) if enough else None,
    }
    for name, recs in records.items():
        out[f"{name}_match"] = quality.adherence(np.stack([r.image for r in recs]), keys)
    return out


def measure_tau(engine, prompts: list[tuple[str, str]], taus=TAUS) -> dict:
    runs = [(f"tau={t:g}", "mulo", {"tau": t}) for t in taus]
    records = harness.run(
        engine, runs, prompts, extra=lambda result: acceptance_by_detail(result.image, result.trace.rounds)
    )
    acceptance = [harness.aggregate(records[name])["acceptance"] or 0.0 for name, _, _ in runs]
    detailed = [harness.mean_present(r.extra[1] for r in records[name]) for name, _, _ in runs]
    return {
        "taus": list(taus),
        "acceptance": acceptance,
        "falls": falls_with_tau(acceptance),
        "acceptance_detailed": detailed,
        "detailed_falls": None not in detailed and falls_with_tau(detailed),
    }


def verdicts(report: dict) -> dict[str, bool]:
    """Each bar of the issue this probe measures, met or not."""
    loc = report["locality"]
    share = loc["share_islands_per_object"]
    return {
        "five_layouts": report["layouts"]["share_all_distinct"] >= BARS["five_layouts"],
        "reopened": loc["reopened_mean"] <= BARS["reopened"],
        "islands_per_object": share is not None and share >= BARS["islands_per_object"],
        "tau": report["tau"]["falls"],
    }


def main(argv=None, prog=None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="scenes")
    parser.add_argument("--prompts", type=int, default=120, help="evaluation prompts for the locality runs")
    parser.add_argument("--json", type=Path, help="write the report here")
    args = parser.parse_args(argv)
    if args.prompts < 1:
        parser.error(f"--prompts must be at least 1 (got {args.prompts})")
    from mulo.engine import Engine
    from mulo.eval.quality import Quality
    from mulo.families import check_available, load_family

    try:
        check_available(args.family)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    engine = Engine(load_family(args.family))
    quality = Quality.for_family(engine.family)
    if quality is None or not hasattr(quality, "referee"):
        why = "is no scenes family with an evaluation set (its card stage writes one)"
        print(f"error: {args.family} {why}", file=sys.stderr)
        return 2
    prompts = quality.prompts[: args.prompts]
    report = {
        "family": args.family,
        "defaults": engine.make_config(None).to_dict(),
        "layouts": measure_layouts(engine, [p for _, p in prompts[:LAYOUT_PROMPTS]]),
        "locality": measure_locality(engine, quality, prompts),
        "tau": measure_tau(engine, prompts[:LAYOUT_PROMPTS]),
    }
    report["bars"] = verdicts(report)
    text = json.dumps(report, indent=1)
    if args.json:
        args.json.write_text(text)
    print(text)
    return 0
