"""The CPU engine against its floor, eager against compiled, in one run (issue 48's measurement).

    python tools/experiments/cpu_engine.py --family twemoji --json benchmarks/cpu-engine.json

In one process, nothing else running: the machine's streaming bandwidth and matrix rate; each of
the family's models' single-token pass (as the bench times it: causal, mid-grid, full cache) and
a 16-token pass, eager and compiled (EAGLE's head runs eagerly in both), against their floors
(``mulo/eval/floor.py``); and whole images (AR, ZipAR, MuLo-SD at the family's defaults, SD,
EAGLE-2), eager and compiled engines interleaved seed by seed, with their tokens compared.
Compiled packages come from the disk cache (a first run compiles them, ~20 s each, before
anything is timed).

``--baseline DIR`` also times AR in the engine of another checkout (``git worktree add DIR
<commit>``; issue 48 measures against the eager engine of the day it was filed, 5680cf4), in a
subprocess fed one seed at a time between the other engines' images: the same machine, the same
minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from mulo.engine import Engine
from mulo.eval import costs, floor
from mulo.eval.profile import bandwidth
from mulo.families import load_family
from mulo.models.eagle import EagleHead
from mulo.models.gpt import KVCache
from mulo.runner import ModelRunner

METHODS = ("ar", "zipar", "mulo", "sd", "eagle2")

# Run inside another checkout: its eager engine's AR, one image per seed read from stdin. Only the
# API every version of the engine has (Engine(family), generate(prompt, method, seed)).
BASELINE_AR = """
import json, sys, time
from mulo.engine import Engine
from mulo.families import load_family
engine = Engine(load_family(sys.argv[1]))
engine.generate(sys.argv[2], "ar", 10_000)
print("ready", flush=True)
for line in sys.stdin:
    start = time.perf_counter()
    tokens = engine.generate(sys.argv[2], "ar", int(line)).tokens
    print(json.dumps([time.perf_counter() - start, tokens.flatten().tolist()]), flush=True)
"""


class BaselineAR:
    """AR in another checkout's engine, in a subprocess: ``image(seed) -> (seconds, tokens)``."""

    def __init__(self, checkout: Path, family: str, prompt: str):
        env = {**os.environ, "PYTHONPATH": str(checkout), "MULO_COMPILE": "off"}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", BASELINE_AR, family, prompt],
            cwd=checkout,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the engine in {checkout} did not start")

    def image(self, seed: int) -> tuple[float, torch.Tensor]:
        self.proc.stdin.write(f"{seed}\n")
        self.proc.stdin.flush()
        seconds, tokens = json.loads(self.proc.stdout.readline())
        return seconds, torch.tensor(tokens)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def pass_rows(engine: Engine, prompt: str, bytes_per_s: float, flops_per_s: float, widths=(1, 16)) -> dict:
    """Each model's pass of each width: seconds (``costs.stable_seconds``) against its floor."""
    models = floor.models_of(engine.family)
    batch = 1 if engine.make_config(None).guidance == 1 else 2
    n_cond = engine.family.target.config.cond_len
    rows = {}
    for name, (module, config) in models.items():
        n, make = costs.pass_timer(engine, prompt, name)
        for width in widths:
            if width >= n:
                continue
            seconds, spread = costs.stable_seconds(make(width))
            lo = max(1, min(n // 2 - width // 2, n - width))
            context = n_cond + lo + width - 1
            row = floor.pass_floor(module, config, batch, width, context, bytes_per_s, flops_per_s)
            forward = forward_pass(module, batch, width, context, engine.family.target)
            forward_s = costs.stable_seconds(forward)[0]
            rows[f"{name} w={width}"] = {
                **row,
                "seconds": seconds,
                "spread": spread,
                "over_floor": seconds / row["floor_s"],
                "forward_s": forward_s,
                "forward_over_floor": forward_s / row["floor_s"],
            }
    return rows


def step_rows(family, prompt: str, bw: float, rate: float) -> dict:
    """What a sampled single-token step costs (``ModelRunner.sample_next``: the token fed, the
    distribution, the draw) mid-grid, eager and compiled, beside the forward's floor at the
    bandwidth ``bw`` and matrix rate ``rate`` the run measured once."""
    rows = {}
    for label, mode in (("eager", "off"), ("compiled", "on")):
        engine = Engine(family, compile=mode)
        knobs = engine.make_config(None)
        sampling = (knobs.guidance, knobs.temperature, knobs.top_k, knobs.top_p)
        cond = family.condition(prompt, 0)
        for name, (module, config) in floor.models_of(family).items():
            if name == "eagle_head":
                continue  # it drafts from features: never a sampled step
            runner = ModelRunner(module, cond, *sampling)
            runner.prefill()
            n = config.max_seq_len
            seq = torch.zeros(n, dtype=torch.long)
            generator = torch.Generator().manual_seed(0)
            for u in range(1, n // 2):  # fill the first half: the timed steps attend over it
                runner.sample_next(seq, u, generator)
            u = n // 2

            def step(runner=runner, seq=seq, u=u, generator=generator):
                runner._fed[u - 1] = -1  # re-feed the same slot: the same work every round
                runner.sample_next(seq, u, generator)

            seconds = costs.stable_seconds(step)[0]
            batch = 1 if knobs.guidance == 1 else 2
            row = rows.setdefault(name, floor.pass_floor(module, config, batch, 1, config.cond_len + u, bw, rate))
            row[f"{label}_s"] = seconds
    return rows


def forward_pass(model, batch: int, width: int, context: int, target):
    """The model's forward alone (no runner, no sampling): ``width`` queries ending at slot
    ``context - 1`` over a cache written up to it, causal. EAGLE's head (``target``'s) is fed the
    features as well as the inputs."""
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
        if isinstance(model, EagleHead):
            model(target, x, x, slots, mask, cache)
        else:
            model.forward_hidden(x, slots, mask, cache)

    return run


def pass_widths(text: str) -> tuple[int, ...]:
    """``--widths``: comma-separated positive integers (argparse turns a ValueError into a usage error)."""
    widths = tuple(int(w) for w in text.split(","))
    if min(widths) < 1:
        raise ValueError(text)
    return widths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="twemoji")
    parser.add_argument("--prompt", default="red apple")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--baseline", type=Path, help="another checkout whose eager AR is timed alongside")
    parser.add_argument(
        "--widths",
        type=pass_widths,
        default=(1, 16),
        help="pass widths timed against their floors, e.g. 1,2,4,8,16,32,64",
    )
    args = parser.parse_args()
    family = load_family(args.family)
    eager, fast = Engine(family, compile="off"), None
    out = {"family": args.family, "threads": torch.get_num_threads(), "torch": torch.__version__}
    out["bandwidth_GBps"] = bandwidth("cpu", 256) / 1e9
    out["matrix_GFLOPs"] = floor.matrix_rate("cpu") / 1e9
    bw, rate = out["bandwidth_GBps"] * 1e9, out["matrix_GFLOPs"] * 1e9
    out["passes_eager"] = pass_rows(eager, args.prompt, bw, rate, args.widths)
    fast = Engine(family, compile="on")
    for method in METHODS:  # compile (or load) every package the timed runs use, before timing
        fast.generate(args.prompt, method, 0)
    out["execution"] = fast.compilation
    out["passes_compiled"] = pass_rows(fast, args.prompt, bw, rate, args.widths)
    out["steps"] = step_rows(family, args.prompt, bw, rate)
    images = {}
    baseline = BaselineAR(args.baseline.resolve(), args.family, args.prompt) if args.baseline else None
    # Each engine keeps its own copy of the family (attaching compiled passes is per model), loaded
    # packages included, as the app's engine does.
    engines = {
        "eager": Engine(load_family(args.family), compile="off"),
        "compiled": Engine(load_family(args.family), compile="on"),
    }
    for method in METHODS:
        engines["compiled"].generate(args.prompt, method, 10_000)  # loads its packages
        times = {"eager": [], "compiled": []}
        same = True
        for seed in range(args.seeds):
            results = {}
            for label, engine in engines.items():
                start = time.perf_counter()
                results[label] = engine.generate(args.prompt, method, seed)
                times[label].append(time.perf_counter() - start)
            same &= torch.equal(results["eager"].tokens, results["compiled"].tokens)
            if baseline is not None and method == "ar":
                seconds, tokens = baseline.image(seed)
                times.setdefault("baseline", []).append(seconds)
                same &= torch.equal(tokens, results["eager"].tokens.flatten())
        eager_s, compiled_s = statistics.median(times["eager"]), statistics.median(times["compiled"])
        images[method] = {
            "eager_s": eager_s,
            "compiled_s": compiled_s,
            "speedup": eager_s / compiled_s,
            "same_tokens": same,
        }
        if "baseline" in times:
            images[method]["baseline_s"] = statistics.median(times["baseline"])
            images[method]["speedup_over_baseline"] = images[method]["baseline_s"] / compiled_s
    if baseline is not None:
        baseline.close()
        out["baseline"] = subprocess.run(
            ["git", "-C", str(args.baseline), "log", "-1", "--format=%h %ad", "--date=short"],
            capture_output=True,
            text=True,
        ).stdout.strip()
    for row in images.values():  # each method against AR in the same mode: its CPU lead
        row["over_ar_eager"] = images["ar"]["eager_s"] / row["eager_s"]
        row["over_ar_compiled"] = images["ar"]["compiled_s"] / row["compiled_s"]
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
    print("| step (fed, then sampled) | eager ms | compiled ms | floor ms | compiled x floor |")
    print("|---|---|---|---|---|")
    for key, row in out["steps"].items():
        print(
            f"| {key} | {row['eager_s'] * 1e3:.3f} | {row['compiled_s'] * 1e3:.3f} | "
            f"{row['floor_s'] * 1e3:.3f} | {row['compiled_s'] / row['floor_s']:.1f}x |"
        )
    print("| image | eager s | compiled s | speed-up | same tokens | over AR eager | over AR compiled |")
    print("|---|---|---|---|---|---|---|")
    for method, row in images.items():
        print(
            f"| {method} | {row['eager_s']:.3f} | {row['compiled_s']:.3f} | {row['speedup']:.2f}x "
            f"| {row['same_tokens']} | {row['over_ar_eager']:.2f}x | {row['over_ar_compiled']:.2f}x |"
        )
    if "baseline_s" in images["ar"]:
        ar = images["ar"]
        print(
            f"AR in {out['baseline']}'s engine: {ar['baseline_s']:.3f} s, "
            f"{ar['speedup_over_baseline']:.2f}x slower than compiled"
        )


if __name__ == "__main__":
    main()
