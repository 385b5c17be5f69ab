"""A lossless method's images against AR's on a trained family, by the target's own likelihood.

    python tools/experiments/lossless_nll.py --family scenes --prompts 48 --seeds 0,1000 \
        --methods ar,sjd,mc-sjd --json benchmarks/lossless-nll-scenes.json
    python tools/experiments/lossless_nll.py --family scenes --prompts 48 --seeds 0 \
        --methods "ar; mulo-v2-r2; mulo-v2-r2@tau=0.1; mulo-v2-r2@tau=0.3; mulo-v2-r2@radius=1"

tests/test_lossless.py proves SD, SJD and MC-SJD lossless by a chi-square over every image of a
3-code toy; on a real family the images are too many to count. Prompt match and FD over a few
dozen images move by more than any method's loss (on scenes, 48 prompts, the lossless SJD's
prompt match ran 0.083-0.250 over three seeds). A sharper statistic: the mean per-token NLL of each
image under the target (teacher-forced, the engine's condition). A lossless method draws AR's
images, so its mean NLL is AR's in expectation; a method that skews toward likelier (or less
likely) tokens moves it. Differences are paired by (prompt, seed), which removes the prompts'
spread; the row gives the mean paired difference and its standard error.

Each method is also checked against the model itself, no AR needed: a token drawn exactly from
the target's distribution at its final context has an expected NLL equal to that distribution's
entropy, so an exact sampler's mean (NLL - entropy) over an image is 0 in expectation (at the
family's plain sampling: temperature 1, no top-k / top-p, no guidance; otherwise the entropy is of
the plain distribution and the check does not apply).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

from family_bars import evaluation_setup  # tools/experiments/family_bars.py, beside this file

from mulo.config import GenerationConfig
from mulo.eval import harness
from mulo.eval.calibrate import parse_start
from mulo.eval.generalisation import token_scores


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="scenes")
    parser.add_argument("--prompts", type=int, default=48)
    parser.add_argument("--seeds", default="0,1000", help="first seeds (prompt i at seed s + i)")
    parser.add_argument(
        "--methods",
        default="ar,sjd,mc-sjd",
        help='bench labels, ";"-separated when a label carries knobs ("mulo-v2-r2@tau=0.1,radius=1"); '
        "the first is the reference",
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    engine, _, prompts = evaluation_setup(args.family, args.prompts)
    separator = ";" if ";" in args.methods or "@" in args.methods else ","
    methods = [m.strip() for m in args.methods.split(separator) if m.strip()]
    specs = {}  # label[@knobs] -> (engine method, knobs): "mulo-v2-r2" is mulo with its knobs
    for method in methods:
        label, _, knobs = method.partition("@")
        specs[method] = harness.spec(label, parse_start(knobs))
    nll: dict[str, list[float]] = {m: [] for m in methods}
    excess: dict[str, list[float]] = {m: [] for m in methods}  # NLL - entropy, per image
    for seed in [int(s) for s in args.seeds.split(",")]:
        for i, (_, prompt) in enumerate(prompts):
            for method in methods:
                name, knobs = specs[method]
                result = engine.generate(prompt, name, seed + i, knobs)
                config = GenerationConfig.from_dict(result.trace.config)
                text = result.trace.condition_text or result.trace.prompt
                scores = token_scores(engine, text, seed + i, result.tokens, config)
                nll[method].append(scores["nll"])
                excess[method].append(scores["nll"] - scores["entropy"])
    reference = methods[0]
    rows = {}
    for method in methods:
        diffs = [a - b for a, b in zip(nll[method], nll[reference], strict=True)]
        se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if method != reference else 0.0
        rows[method] = {
            "images": len(diffs),
            "mean_nll": statistics.fmean(nll[method]),
            "paired_difference": statistics.fmean(diffs),
            "standard_error": se,
            "nll_minus_entropy": statistics.fmean(excess[method]),
            "nll_minus_entropy_se": statistics.stdev(excess[method]) / math.sqrt(len(diffs)),
        }
        print(
            f"{method}: mean NLL {rows[method]['mean_nll']:.4f} nats/token; minus {reference}'s "
            f"{rows[method]['paired_difference']:+.4f} +- {se:.4f} over {len(diffs)} images; NLL - entropy "
            f"{rows[method]['nll_minus_entropy']:+.4f} +- {rows[method]['nll_minus_entropy_se']:.4f}",
            flush=True,
        )
    if args.json:
        out = {"family": args.family, "seeds": args.seeds, "rows": rows, "nll": nll, "nll_minus_entropy": excess}
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
