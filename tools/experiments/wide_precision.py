"""Wide passes in float32 and bfloat16 on this CPU, in one run (issue 68; ``mulo.wide``).

    python tools/experiments/wide_precision.py [--family twemoji] [--rounds 5] [--out benchmarks/wide-precision.json]

Measures, interleaved round by round so that drift hits every variant alike:

- a 2048x256 by 256x1024 matrix product in float32, in bfloat16 (``torch.mm``), and as
  ``F.linear`` under bf16 autocast (float32 weights cast per call, as ``mulo.wide`` runs them);
- one full verification pass of the family's target, as the cost table prices it (the runner's pass
  over the whole grid, the engine's CFG batch) and as the bench's ``verification_pass_s`` (teacher
  forced, CFG batch 2): float32 (today's path), bf16 under autocast (``mulo.wide``), and a bf16 copy
  of the model (the alternative: its cache in bf16 too), and bf16 with each layer's dense parts
  compiled (``mulo.fused_layers``: Inductor, frozen bf16 weights, elementwise work fused; attention
  eager), the engine's bf16 path where the CPU has bf16 matrix units;
- the target's single-token step, eager and compiled (``mulo.compiled``), the unit of the price of a
  wide pass in steps;
- what ``mulo.wide``'s ``auto`` mode measures and chooses for each width bucket here;
- where a wide pass's time goes (``--attention``): the profiler's split of the bench's pass into
  products, attention and the rest in each precision, and the attention kernel alone at that pass's
  shape against what might replace it (its masked form, queries in chunks that skip the keys no
  query of the chunk sees, the causal kernel over zero queries put on top (what a bf16 pass runs),
  attention written as bf16 products, ``flex_attention`` compiled);
- exactness on the trained target: one verification pass over AR's tokens in both precisions (total
  variation, draws moved under the same noise), and MuLo-SD (the family's defaults) end to end for
  a few seeds with the wide passes forced to bf16 (tokens differing, acceptance).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from mulo import compiled, wide
from mulo.engine import Engine
from mulo.eval.costs import _runner_pass
from mulo.families import load_family
from mulo.runner import ModelRunner
from mulo.sampling import sample

PROMPT = "red apple"
PRODUCTS = ("aten::mm", "aten::addmm", "aten::bmm")


def interleaved(variants: dict, rounds: int) -> dict:
    """Each callable once per round, in turn, after one warm-up call each: median and min seconds."""
    for fn in variants.values():
        fn()
    times = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: {"median_s": statistics.median(t), "min_s": min(t), "runs_s": t} for name, t in times.items()}


def cpu_flags() -> list[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return line.split(":", 1)[1].split()
    return []


@torch.no_grad()
def products(rounds: int) -> dict:
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(2048, 256, generator=gen), torch.randn(256, 1024, generator=gen)
    a16, b16, weight = a.bfloat16(), b.bfloat16(), b.t().contiguous()

    def autocast_linear():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            F.linear(a, weight)

    timed = interleaved(
        {"float32": lambda: a @ b, "bfloat16": lambda: a16 @ b16, "bf16_autocast": autocast_linear}, rounds
    )
    flops = 2 * 2048 * 256 * 1024
    for row in timed.values():
        row["GFLOPs"] = flops / row["min_s"] / 1e9
    return timed


def bench_pass_inputs(fam):
    """The bench's verification pass (``bench.verification_pass_seconds``): the prompt's condition,
    zero tokens over the grid for both CFG branches, and the two branches' conditions."""
    cond = fam.condition(PROMPT, 0)
    tokens = torch.zeros(2, fam.target.config.max_seq_len - 1, dtype=torch.long)
    return cond, tokens, torch.cat([cond[None], fam.target.null_condition(cond[None])])


@torch.no_grad()
def verification_passes(fam, guidance: float, rounds: int) -> dict:
    target = fam.target
    n = target.config.max_seq_len
    copy16 = copy.deepcopy(target, memo={id(target.wide): None, id(target.compiled): None}).to(torch.bfloat16)
    copy16.wide = copy16.compiled = None
    cond, tokens, both = bench_pass_inputs(fam)

    by_precision = {  # how the layers of a pass run: float32, bf16 under autocast, bf16 compiled
        "float32": wide.WidePasses(target, "float32"),
        "bf16_autocast": wide.WidePasses(target, "bfloat16", fused=False),
        "bf16_fused": wide.WidePasses(target, "bfloat16", fused=True),
    }
    by_precision["bf16_fused"].compiled_layers()  # compiled here, outside the timing

    def with_precision(fn, precision):
        def run():
            target.wide = by_precision[precision]  # (built beforehand: nothing but the pass is timed)
            fn()

        return run

    target.wide = by_precision["float32"]
    runner32 = _runner_pass(target, cond, guidance, n - 1)
    runner16 = _runner_pass(copy16, cond, guidance, n - 1)
    variants = {
        "runner_float32": with_precision(runner32, "float32"),
        "runner_bf16_autocast": with_precision(runner32, "bf16_autocast"),
        "runner_bf16_copy": runner16,
        "runner_bf16_fused": with_precision(runner32, "bf16_fused"),
        "bench_float32": with_precision(lambda: target(tokens, both), "float32"),
        "bench_bf16_autocast": with_precision(lambda: target(tokens, both), "bf16_autocast"),
        "bench_bf16_copy": lambda: copy16(tokens, both.bfloat16()),
        "bench_bf16_fused": with_precision(lambda: target(tokens, both), "bf16_fused"),
    }
    timed = interleaved(variants, rounds)
    logits = {}  # the bench pass's logits, as each variant runs it
    for name, passes in by_precision.items():
        target.wide = passes
        logits[name] = target(tokens, both)
    for name in ("bf16_autocast", "bf16_fused"):
        difference = (logits[name] - logits["float32"]).abs().max()
        timed[f"bench_{name}"]["max_abs_logit_difference_from_float32"] = float(difference)
    target.wide = by_precision["float32"]
    return timed


@torch.no_grad()
def pass_profile(fam) -> dict:
    """The bench's verification pass under the profiler, in each precision: milliseconds a pass in
    the attention kernel, in matrix products and in everything else (three passes after two)."""
    from torch.profiler import ProfilerActivity, profile

    target = fam.target
    _, tokens, both = bench_pass_inputs(fam)
    split = {}
    for precision, passes in (
        ("float32", wide.WidePasses(target, "float32")),
        ("bfloat16", wide.WidePasses(target, "bfloat16", fused=False)),  # under autocast
        ("bf16_fused", wide.WidePasses(target, "bfloat16", fused=True)),  # compiled layers
    ):
        target.wide = passes
        for _ in range(2):
            target(tokens, both)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(3):
                target(tokens, both)
        ms = {"attention": 0.0, "products": 0.0, "other": 0.0}
        for event in prof.key_averages():
            kind = "attention" if "attention" in event.key else "products" if event.key in PRODUCTS else "other"
            ms[kind] += event.self_cpu_time_total / 1e3 / 3
        split[precision] = {name: round(value, 2) for name, value in ms.items()}
    target.wide = wide.WidePasses(target, "float32")
    return split


@torch.no_grad()
def attention_kernels(fam, rounds: int) -> dict:
    """One layer's attention at the bench pass's shape (CFG batch 2, the grid's queries over the
    condition and the grid), median ms, and each variant's largest difference from float32 flash."""
    c = fam.target.config
    n_cond, width, keys = c.cond_len, c.max_seq_len - 1, c.n_positions  # the runner's full pass
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, c.n_head, width, c.head_dim, generator=gen)
    k, v = (torch.randn(2, c.n_head, keys, c.head_dim, generator=gen) for _ in range(2))
    mask = torch.ones(width, keys, dtype=torch.bool).tril(n_cond)
    reference = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    q16, k16, v16 = q.bfloat16(), k.bfloat16(), v.bfloat16()
    bias = torch.zeros(width, keys, dtype=torch.bfloat16).masked_fill_(~mask, float("-inf"))

    def key_trimmed(q, k, v, chunk=256):  # exact: a chunk's queries see no key past its last row's
        out = torch.empty_like(q)
        for lo in range(0, width, chunk):
            hi = min(lo + chunk, width)
            seen = n_cond + hi
            out[:, :, lo:hi] = F.scaled_dot_product_attention(
                q[:, :, lo:hi], k[:, :, :seen], v[:, :, :seen], attn_mask=mask[lo:hi, :seen]
            )
        return out

    def padded_causal(q, k, v):  # what a bf16 pass runs (``gpt.causal_offset``): zero queries on top
        out = F.scaled_dot_product_attention(F.pad(q, (0, 0, n_cond, 0)), k, v, is_causal=True)
        return out[:, :, n_cond:]

    def bf16_products(chunk=128):  # scores as bf16 products, softmax over bf16 scores
        out = torch.empty_like(q16)
        for lo in range(0, width, chunk):
            hi = min(lo + chunk, width)
            seen = n_cond + hi
            scores = torch.matmul(q16[:, :, lo:hi], k16[:, :, :seen].transpose(-1, -2)) * c.head_dim**-0.5
            out[:, :, lo:hi] = torch.softmax(scores + bias[lo:hi, :seen], -1) @ v16[:, :, :seen]
        return out

    variants = {
        "flash_float32_masked": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
        "flash_bf16_masked": lambda: F.scaled_dot_product_attention(q16, k16, v16, attn_mask=mask),
        "flash_float32_causal_grid_only": lambda: F.scaled_dot_product_attention(
            q, k[:, :, n_cond:], v[:, :, n_cond:], is_causal=True
        ),
        "flash_bf16_causal_grid_only": lambda: F.scaled_dot_product_attention(
            q16, k16[:, :, n_cond:], v16[:, :, n_cond:], is_causal=True
        ),
        "padded_causal_float32": lambda: padded_causal(q, k, v),
        "padded_causal_bf16": lambda: padded_causal(q16, k16, v16),
        "key_trimmed_float32": lambda: key_trimmed(q, k, v),
        "key_trimmed_bf16": lambda: key_trimmed(q16, k16, v16),
        "bf16_products": bf16_products,
    }
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    block_mask = create_block_mask(lambda b, h, i, j: j <= i + n_cond, None, None, width, keys, device="cpu")
    flex = torch.compile(flex_attention)
    variants["flex_compiled_bf16"] = lambda: flex(q16, k16, v16, block_mask=block_mask)
    timed = interleaved(variants, rounds)
    rows = {}
    for name, fn in variants.items():
        rows[name] = {
            "median_ms": timed[name]["median_s"] * 1e3,
            "max_abs_difference": float((fn().float() - reference).abs().max()),
        }
    return {"shape [batch, heads, queries, keys, head_dim]": [2, c.n_head, width, keys, c.head_dim], "variants": rows}


@torch.no_grad()
def steps(fam, guidance: float, rounds: int) -> dict:
    """The target's single-token step as the cost table prices it (runner pass of width 1), eager and
    compiled (its package compiled now if the cache lacks it)."""
    target = fam.target
    cond = fam.condition(PROMPT, 0)
    wide.attach([target], "float32")
    # both runners made (their prefill and first pass run) before the target compiles: only the step's
    # package (one query) is compiled, not the prefill's
    eager, compiled_step = _runner_pass(target, cond, guidance, 1), _runner_pass(target, cond, guidance, 1)
    state = compiled.attach([target], "on")
    compiled_step()  # compile or load the package outside the timing

    def eager_run():
        saved, target.compiled = target.compiled, None
        eager()
        target.compiled = saved

    eager_timed = interleaved({"eager": eager_run, "compiled": compiled_step}, rounds * 20)
    target.compiled = None
    for row in eager_timed.values():
        del row["runs_s"]
    return {"compilation": state, **eager_timed}


def auto_choices(fam, batch: int) -> dict:
    """What ``mulo.wide``'s auto mode measures and picks for the target's buckets, in a fresh cache."""
    target = fam.target
    saved = os.environ.get("MULO_COMPILE_CACHE")
    with tempfile.TemporaryDirectory() as folder:
        os.environ["MULO_COMPILE_CACHE"] = folder
        passes = wide.WidePasses(target, "auto")
        for width in (128, 256, 512, 1023):
            passes.precision(batch, width)
        stored = json.loads(passes.path.read_text())
    if saved is None:
        del os.environ["MULO_COMPILE_CACHE"]
    else:
        os.environ["MULO_COMPILE_CACHE"] = saved
    return {"file": passes.path.name, **stored}


@torch.no_grad()
def exactness(fam, engine, seeds: list[int]) -> dict:
    models = [fam.target, *fam.drafters.values(), fam.draft_model]
    c = engine.make_config(None)
    n = fam.target.config.max_seq_len
    wide.attach(models, "float32")
    seq = engine.generate(PROMPT, "ar", 0).tokens.reshape(-1)
    verification = {}
    for precision in ("float32", "bfloat16"):
        wide.attach(models, precision)
        runner = ModelRunner(fam.target, fam.condition(PROMPT, 0), c.guidance, c.temperature, c.top_k, c.top_p)
        runner.prefill()
        probs = runner.span_probs(seq, 0, n)
        passes = dict(runner.precisions)
        # the same pass again for its raw logits (no top-p): the rounding itself
        logits = runner._feed_through(seq, n - 2, include=torch.arange(n - 1))[0]
        draws = sample(probs, torch.Generator().manual_seed(0))
        verification[precision] = (probs, draws, passes, logits)
    (p32, d32, _, l32), (p16, d16, passes16, l16) = verification["float32"], verification["bfloat16"]
    raw32, raw16 = torch.softmax(l32, -1), torch.softmax(l16, -1)
    one_pass = {
        "positions": n,
        "passes_bf16_runner": passes16,
        "mean_total_variation": float(0.5 * (p32 - p16).abs().sum(-1).mean()),
        "max_total_variation": float(0.5 * (p32 - p16).abs().sum(-1).max()),
        "draws_moved": int((d32 != d16).sum()),
        "max_abs_logit_difference": float((l32 - l16).abs().max()),
        "mean_total_variation_before_top_p": float(0.5 * (raw32 - raw16).abs().sum(-1).mean()),
        "positions_one_hot_after_top_p": int((p32.max(-1).values == 1).sum()),
    }
    runs = []
    for seed in seeds:
        row = {"seed": seed}
        for precision in ("float32", "bfloat16"):
            wide.attach(models, precision)
            result = engine.generate(PROMPT, "mulo", seed)
            summary = result.trace.summary()
            row[precision] = {
                "tokens": result.tokens,
                "latency_s": summary["latency_s"],
                "acceptance_rate": summary["acceptance_rate"],
                "nfe": summary["nfe"],
                "precision": result.trace.precision,
            }
        differ = row["float32"]["tokens"] != row["bfloat16"]["tokens"]
        row["tokens_differing"] = int(differ.sum())
        row["first_differing"] = int(differ.reshape(-1).nonzero()[0]) if differ.any() else None
        for precision in ("float32", "bfloat16"):
            del row[precision]["tokens"]
        runs.append(row)
    wide.attach(models, "float32")
    return {"verification_over_ar_tokens": one_pass, "mulo_defaults": runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="twemoji")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/wide-precision.json"))
    parser.add_argument("--threads", type=int, help="torch threads (default torch's)")
    parser.add_argument("--attention", action="store_true", help="also profile the pass and time attention kernels")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    start = time.perf_counter()
    load_before = os.getloadavg()
    fam = load_family(args.family)
    engine = Engine(fam, compile="off", wide_precision="float32")
    guidance = engine.make_config(None).guidance
    batch = 2 if guidance != 1 else 1
    result = {
        "command": f"python tools/experiments/wide_precision.py --family {args.family} --rounds {args.rounds} "
        f"--seeds {args.seeds}"
        + (f" --threads {args.threads}" if args.threads else "")
        + (" --attention" if args.attention else ""),
        "date": time.strftime("%Y-%m-%d"),
        "machine": wide.machine(),
        "cpu_flags": cpu_flags(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "family": args.family,
        "cfg_batch": batch,
        "load_average_before": load_before,
    }
    print("products", flush=True)
    result["product_2048x256x1024"] = products(args.rounds * 4)
    print("steps", flush=True)
    result["single_token_step"] = steps(fam, guidance, args.rounds)
    print("verification passes", flush=True)
    result["verification_pass"] = verification_passes(fam, guidance, args.rounds)
    if args.attention:
        print("attention", flush=True)
        result["pass_profile_ms"] = pass_profile(fam)
        result["attention_kernels"] = attention_kernels(fam, args.rounds * 2)
    print("auto choices", flush=True)
    result["auto"] = auto_choices(fam, batch)
    print("exactness", flush=True)
    result["exactness"] = exactness(fam, engine, list(range(args.seeds)))
    step = result["single_token_step"]["compiled"]["median_s"]
    passes = result["verification_pass"]
    product = result["product_2048x256x1024"]
    result["ratios"] = {
        "product_bf16_speed_over_fp32": product["float32"]["min_s"] / product["bfloat16"]["min_s"],
        "product_autocast_speed_over_fp32": product["float32"]["min_s"] / product["bf16_autocast"]["min_s"],
        "compiled_step_speed_over_eager": result["single_token_step"]["eager"]["median_s"] / step,
    }
    for kind in ("runner", "bench"):
        fp32 = passes[f"{kind}_float32"]["median_s"]
        for variant in ("bf16_autocast", "bf16_copy", "bf16_fused"):
            result["ratios"][f"{kind}_pass_{variant}_speed_over_fp32"] = fp32 / passes[f"{kind}_{variant}"]["median_s"]
    for name, row in passes.items():
        result["ratios"][f"{name}_in_compiled_steps"] = row["median_s"] / step
    result["load_average_after"] = os.getloadavg()
    result["wall_s"] = time.perf_counter() - start
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result["ratios"], indent=1))


if __name__ == "__main__":
    main()
