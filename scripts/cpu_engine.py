"""The CPU engine against its floor, eager against compiled, in one run (issue 48's measurement).

    python scripts/cpu_engine.py --family twemoji --json benchmarks/cpu-engine.json

In one process, nothing else running: the machine's streaming bandwidth and matrix rate; each of
the family's models' single-token pass (as the bench times it: causal, mid-grid, full cache) and
a 16-token pass, eager and compiled, against their floors (``mulo/eval/floor.py``); and whole
images (AR, ZipAR, MuLo-SD at the family's defaults), eager and compiled engines interleaved
seed by seed, with their tokens compared. Compiled packages come from the disk cache (a first run
compiles them, ~20 s each, before anything is timed).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from mulo.engine import Engine
from mulo.eval import costs, floor
from mulo.eval.profile import bandwidth
from mulo.families import load_family
from mulo.models.gpt import KVCache

METHODS = ("ar", "zipar", "mulo")


def pass_rows(engine: Engine, prompt: str, bytes_per_s: float, flops_per_s: float, widths=(1, 16)) -> dict:
    """Each model's pass of each width: seconds (``costs.stable_seconds``) against its floor."""
    models = floor.models_of(engine.family)
    batch = 1 if engine.make_config(None).guidance == 1 else 2
    n_cond = engine.family.target.config.cond_len
    rows = {}
    for name, (module, config) in models.items():
        if name == "eagle_head":
            continue  # its passes are not compiled (mulo/compiled.py): the bench prices it eagerly
        n, make = costs.pass_timer(engine, prompt, name)
        for width in widths:
            if width >= n:
                continue
            seconds, spread = costs.stable_seconds(make(width))
            lo = max(1, min(n // 2 - width // 2, n - width))
            context = n_cond + lo + width - 1
            row = floor.pass_floor(module, config, batch, width, context, bytes_per_s, flops_per_s)
            forward_s = costs.stable_seconds(forward_pass(module, batch, width, context))[0]
            rows[f"{name} w={width}"] = {
                **row,
                "seconds": seconds,
                "spread": spread,
                "over_floor": seconds / row["floor_s"],
                "forward_s": forward_s,
                "forward_over_floor": forward_s / row["floor_s"],
            }
    return rows


def forward_pass(model, batch: int, width: int, context: int):
    """The model's forward alone (no runner, no sampling): ``width`` queries ending at slot
    ``context - 1`` over a cache written up to it, causal."""
    c = model.config
    cache = KVCache(c, batch, "cpu", torch.float32)
    cache.k.normal_()
    cache.v.normal_()
    cache.written[:context] = True
    slots = torch.arange(context - width, context)
    mask = torch.arange(context)[None, :] <= slots[:, None]
    x = torch.randn(batch, width, c.dim)

    @torch.no_grad()
    def run():
        model.forward_hidden(x, slots, mask, cache)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="twemoji")
    parser.add_argument("--prompt", default="red apple")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    family = load_family(args.family)
    eager, fast = Engine(family, compile="off"), None
    out = {"family": args.family, "threads": torch.get_num_threads(), "torch": torch.__version__}
    out["bandwidth_GBps"] = bandwidth("cpu", 256) / 1e9
    out["matrix_GFLOPs"] = floor.matrix_rate("cpu") / 1e9
    bw, rate = out["bandwidth_GBps"] * 1e9, out["matrix_GFLOPs"] * 1e9
    out["passes_eager"] = pass_rows(eager, args.prompt, bw, rate)
    fast = Engine(family, compile="on")
    for method in METHODS:  # compile (or load) every package the timed runs use, before timing
        fast.generate(args.prompt, method, 0)
    out["execution"] = fast.compilation
    out["passes_compiled"] = pass_rows(fast, args.prompt, bw, rate)
    images = {}
    for method in METHODS:
        times = {"eager": [], "compiled": []}
        same = True
        for seed in range(args.seeds):
            results = {}
            for label, compile_mode in (("eager", "off"), ("compiled", "on")):
                engine = Engine(family, compile=compile_mode)  # re-attaches (or drops) the compiled passes
                start = time.perf_counter()
                results[label] = engine.generate(args.prompt, method, seed)
                times[label].append(time.perf_counter() - start)
            same &= torch.equal(results["eager"].tokens, results["compiled"].tokens)
        eager_s, compiled_s = statistics.median(times["eager"]), statistics.median(times["compiled"])
        images[method] = {
            "eager_s": eager_s,
            "compiled_s": compiled_s,
            "speedup": eager_s / compiled_s,
            "same_tokens": same,
        }
    out["images"] = images
    out["ar_compiled_vs_methods_eager"] = {m: images[m]["eager_s"] / images["ar"]["compiled_s"] for m in METHODS}
    text = json.dumps(out, indent=1)
    if args.json:
        args.json.write_text(text + "\n")
    print(
        f"bandwidth {out['bandwidth_GBps']:.1f} GB/s, matrix rate {out['matrix_GFLOPs']:.0f} GFLOP/s; "
        f"{out['execution']}"
    )
    print("| pass | floor ms | forward eager | forward compiled | bench pass eager | bench pass compiled |")
    print("|---|---|---|---|---|---|")
    for key, row in out["passes_eager"].items():
        c = out["passes_compiled"][key]
        cells = [
            f"{r[k] * 1e3:.3f} ({r[k] / r['floor_s']:.1f}x)"
            for r, k in ((row, "forward_s"), (c, "forward_s"), (row, "seconds"), (c, "seconds"))
        ]
        print(f"| {key} | {row['floor_s'] * 1e3:.3f} | " + " | ".join(cells) + " |")
    print("| image | eager s | compiled s | speed-up | same tokens |")
    print("|---|---|---|---|---|")
    for method, row in images.items():
        print(
            f"| {method} | {row['eager_s']:.3f} | {row['compiled_s']:.3f} | {row['speedup']:.2f}x "
            f"| {row['same_tokens']} |"
        )


if __name__ == "__main__":
    main()
