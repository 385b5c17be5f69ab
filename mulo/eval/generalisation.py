"""Does a family's target generalise, or has it memorised one image per prompt? ``python -m mulo
generalisation [--family twemoji] [--prompts 24] [--seeds 5]`` measures, on the first
evaluation prompts (issue 38's checks, before and after a long run):

- ``ar_nll``: AR's own samples (family defaults) scored under the target's plain distribution
  (the request's guidance, temperature 1, no top-k / top-p), nats per token, and ``ar_entropy``,
  that distribution's mean entropy along them. A lookup table scores ~0 on both: every
  conditional is one-hot. A generative model's samples carry information (issue 38: >= 0.3).
- ``seed_difference``: the share of tokens that differ between AR's images of one prompt for two
  seeds, averaged over every pair of ``seeds`` seeds; ``distinct_images``: how many of the
  ``seeds`` images differ, averaged over prompts. A memorised family draws one image per prompt.
- ``off_nucleus``: per method, the share of final tokens the target would never sample in their
  final context (probability zero under the request's guidance, temperature and top-p): a
  committed wrong draft that the target does not recover from. AR's own is 0 by construction
  (the probe's self-check).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys

import numpy as np
import torch

from mulo.config import GenerationConfig
from mulo.engine import Engine
from mulo.eval import harness
from mulo.sampling import cfg_combine, logits_to_probs

# runs of ``mulo.eval.harness``: (row name, label, knob overrides)
DEFAULT_RUNS = [("ar", "ar", {}), ("mulo l=0", "mulo", {"radius": 0}), ("mulo l=1", "mulo", {"radius": 1})]


@torch.no_grad()
def teacher_forced_logits(engine: Engine, prompt: str, seed: int, tokens: torch.Tensor, guidance: float):
    """The target's guided logits ``[L, V]`` of every token of ``tokens [H, W]`` given all the
    tokens before it (its final context), conditioned as the engine conditions ``prompt``."""
    family = engine.family
    target = family.target
    cond = family.condition(prompt, seed)[None]
    inputs = tokens.reshape(1, -1)[:, :-1].to(family.device)
    logits = target(inputs, cond).float()[0]
    if guidance != 1:
        logits = cfg_combine(logits, target(inputs, target.null_condition(cond)).float()[0], guidance)
    return logits


def token_scores(engine: Engine, prompt: str, seed: int, tokens: torch.Tensor, config: GenerationConfig) -> dict:
    """Plain-distribution NLL and entropy (nats per token) and the off-nucleus share of ``tokens``."""
    logits = teacher_forced_logits(engine, prompt, seed, tokens, config.guidance)
    flat = tokens.reshape(-1).to(logits.device)
    log_p = torch.log_softmax(logits, -1)
    nll = float(-log_p.gather(-1, flat[:, None]).mean())
    entropy = float(-(log_p.exp() * log_p).sum(-1).mean())
    sampling = logits_to_probs(logits, config.temperature or 1.0, config.top_k, config.top_p)
    off = float((sampling.gather(-1, flat[:, None]) == 0).float().mean())
    return {"nll": nll, "entropy": entropy, "off_nucleus": off}


def seed_diversity(images: list[torch.Tensor]) -> tuple[float, int]:
    """(mean share of differing tokens over every pair, number of distinct token grids)."""
    pairs = [float((a != b).float().mean()) for a, b in itertools.combinations(images, 2)]
    distinct = len({tuple(t.reshape(-1).tolist()) for t in images})
    return float(np.mean(pairs)) if pairs else 0.0, distinct


def probe(engine: Engine, prompts: list[str], seeds: int = 5, runs=None, overrides: dict | None = None) -> dict:
    """Every measure above over ``prompts``, through ``harness.run`` (seed i for prompt i for the
    ``runs``, default ``DEFAULT_RUNS``; seeds 0..seeds-1 for the diversity of AR). ``overrides``
    go on top of every run's knobs."""
    runs = [(name, label, {**knobs, **(overrides or {})}) for name, label, knobs in runs or DEFAULT_RUNS]

    def scored(result) -> tuple[torch.Tensor, dict]:
        trace = result.trace
        text = trace.condition_text or trace.prompt
        scores = token_scores(engine, text, trace.seed, result.tokens, GenerationConfig.from_dict(trace.config))
        return result.tokens, scores

    records = harness.run(engine, runs, [(p, p) for p in prompts], extra=scored)
    rows = {name: [rec.extra[1] for rec in recs] for name, recs in records.items()}
    # AR's tokens of prompt i at seed i, when a run is plain AR with the same knobs: not drawn twice
    plain = next((name for name, label, knobs in runs if label == "ar" and knobs == (overrides or {})), None)
    differences, distinct = [], []
    for i, prompt in enumerate(prompts):
        grids = [
            records[plain][i].extra[0] if plain and seed == i else engine.generate(prompt, "ar", seed, overrides).tokens
            for seed in range(seeds)
        ]
        difference, n_distinct = seed_diversity(grids)
        differences.append(difference)
        distinct.append(n_distinct)
    out = {name: {key: float(np.mean([r[key] for r in row])) for key in row[0]} for name, row in rows.items()}
    ar = out.get("ar", {})
    return {
        "prompts": len(prompts),
        "seeds": seeds,
        "ar_nll": ar.get("nll"),
        "ar_entropy": ar.get("entropy"),
        "seed_difference": float(np.mean(differences)),
        "distinct_images": float(np.mean(distinct)),
        "methods": out,
    }


def main(argv=None, prog=None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="twemoji")
    parser.add_argument("--prompts", type=int, default=24, help="first evaluation prompts (default 24)")
    parser.add_argument("--seeds", type=int, default=5, help="AR seeds per prompt for the diversity (default 5)")
    args = parser.parse_args(argv)
    if args.prompts < 1 or args.seeds < 2:
        parser.error("--prompts must be at least 1 and --seeds at least 2")
    from mulo.families import load_family

    try:
        engine = Engine(load_family(args.family))
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    listed = engine.family.evaluation and engine.family.evaluation.folder / "eval_prompts.json"
    if not listed or not listed.exists():
        print(f"error: family {args.family!r} ships no evaluation prompts (eval_prompts.json)", file=sys.stderr)
        return 2
    prompts = [entry["prompt"] for entry in json.loads(listed.read_text())][: args.prompts]
    print(json.dumps(probe(engine, prompts, args.seeds), indent=1))
    return 0
