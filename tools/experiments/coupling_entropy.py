"""Where MC-SJD's coupling pays (issue 66): SJD and MC-SJD at rising sampling temperature.

    python tools/experiments/coupling_entropy.py --family scenes --prompts 12 \
        --temperatures 1,1.5,2 --json benchmarks/coupling-entropy-scenes.json

MC-SJD keeps a draft whose position's distribution barely moved; SJD redraws it from p. The two
differ only where a redraw from p gives another token, i.e. where p has entropy. On our families
at their defaults p is nearly one-hot (the notebook measured a kept draft accepted at 0.947 next
iteration against a redrawn one's 0.929), so the paper's gain (Lumina-mGPT, large top-k) cannot
show there. Raising the temperature raises the entropy of the same model's distributions; both
methods stay lossless at every temperature (tests/test_lossless.py), so at each one they have the
quality of AR at that temperature and acceptance and target passes compare them.

Per (temperature, method): mean acceptance, target passes, accepted length, FD and prompt match
(the family's scorer; GSD is lossy, so its quality is measured, not assumed); for MC-SJD also how
often a kept draft and a redrawn draft pass their next test (``Round.coupled`` against the next
round's scores).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from family_bars import evaluation_setup  # tools/experiments/family_bars.py, beside this file

from mulo.eval import harness


def kept_vs_redrawn(trace) -> tuple[list[float], list[float]]:
    """The acceptance probabilities (the trace's scores, already min(1, p/q)) of the drafts each
    round kept (coupled) or redrew, read from the next round's scores at the same cells."""
    kept, redrawn = [], []
    rounds = trace.rounds
    for now, nxt in zip(rounds, rounds[1:], strict=False):
        if now.coupled is None:
            continue
        tested = np.flatnonzero(now.score.reshape(-1) >= 0)  # this round's window
        committed = int(now.accepted.sum() + now.rejected.sum())
        # the drafts carried over: the window after the commit, plus the fresh one just past it
        carried = np.arange(tested[0] + committed, min(tested[-1] + 2, now.score.size))
        coupled = now.coupled.reshape(-1)[carried]
        score = nxt.score.reshape(-1)[carried]
        for is_kept, value in zip(coupled, score, strict=True):
            (kept if is_kept else redrawn).append(float(value))
    return kept, redrawn


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="scenes")
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--temperatures", default="1,1.5,2")
    parser.add_argument("--top-p", type=float, default=1.0, help="1.0: no truncation (the paper samples wide)")
    parser.add_argument("--methods", default="ar,sjd,mc-sjd", help="comma-separated; sjd and mc-sjd always run")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    engine, quality, prompts = evaluation_setup(args.family, args.prompts)
    keys = [key for key, _ in prompts]
    methods = list(dict.fromkeys([m.strip() for m in args.methods.split(",") if m.strip()] + ["sjd", "mc-sjd"]))
    rows = []
    for temperature in [float(t) for t in args.temperatures.split(",")]:
        knobs = {"temperature": temperature, "top_p": args.top_p}
        by_method = {}
        for method in methods:
            start = time.perf_counter()
            results: list = []  # harness.run hands each request's result to ``extra``
            runs = [(method, method, knobs)]
            records = harness.run(engine, runs, prompts, seed=args.seed, extra=results.append)[method]
            row = harness.aggregate(records, quality=quality, keys=keys)
            out = {
                "temperature": temperature,
                "method": method,
                "acceptance": row["acceptance"],
                "nfe_target": row["nfe"]["target"],
                "accepted_length": row["accepted_length"],
                "fd": row["fd"],
                "prompt_match": row["adherence"],
                "seconds": time.perf_counter() - start,
            }
            if method == "mc-sjd":
                kept, redrawn = [], []
                for result in results:
                    k, r = kept_vs_redrawn(result.trace)
                    kept += k
                    redrawn += r
                for name, scores in (("kept", kept), ("redrawn", redrawn)):
                    out[name] = {"count": len(scores), "next_acceptance": statistics.fmean(scores) if scores else None}
            by_method[method] = out
            rows.append(out)
            print(json.dumps(out), flush=True)
        sjd, mc = by_method["sjd"], by_method["mc-sjd"]
        print(
            f"T={temperature}: acceptance SJD {sjd['acceptance']:.3f} MC-SJD {mc['acceptance']:.3f}; "
            f"target passes {sjd['nfe_target']:.1f} vs {mc['nfe_target']:.1f}",
            flush=True,
        )
        if args.json:
            args.json.write_text(json.dumps({"family": args.family, "prompts": len(prompts), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
