"""The device run's checks: every method's tokens for one prompt and seed, eager and graphed, in
float32 and bfloat16, against the CPU's eager float32 tokens (computed beforehand by prepare.py).

Expected: on one device and dtype, graphed passes give exactly the eager passes' tokens (the same
kernels, replayed); float32 on the GPU gives the CPU's tokens except where a near-tie between two
codes falls the other way (different summation order); bfloat16 differs more, which is the
documented difference (the seed stays meaningful, the image is another sample). On a CPU
(``--smoke``) the graphs are the static-buffer path run eagerly (``graphs="emulate"``).

    python tools/device/gpu_checks.py --family twemoji --device cuda --reference R.json --out checks.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mulo import methods  # noqa: E402
from mulo.engine import Engine  # noqa: E402
from mulo.families import load_family  # noqa: E402

PROMPT, SEED = "grinning face", 0


def tokens_of(engine: Engine, method: str) -> tuple[list[int], dict]:
    result = engine.generate(PROMPT, method, SEED)
    return result.tokens.flatten().tolist(), {"latency_s": result.trace.latency_s, "execution": result.trace.execution}


def reference(family: str, names: list[str]) -> dict[str, list[int]]:
    """The CPU's eager float32 tokens of every method (exact shapes: the CPU's default)."""
    engine = Engine(load_family(family, "cpu", "float32"))
    return {m: tokens_of(engine, m)[0] for m in names}


def agreement(a: list[int], b: list[int]) -> float:
    return sum(x == y for x, y in zip(a, b, strict=True)) / len(a)


def check(family: str, device: str, names: list[str], cpu: dict | None) -> dict:
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 means float32 here (the CPU comparison)
    torch.backends.cudnn.allow_tf32 = False
    graphs = "cuda" if device.startswith("cuda") else "emulate"
    out = {"family": family, "device": device, "prompt": PROMPT, "seed": SEED, "rows": []}
    if device.startswith("cuda"):
        out["device_name"] = torch.cuda.get_device_name(device)
    for dtype in ("float32", "bfloat16"):
        fam = load_family(family, device, dtype)
        eager, graphed = Engine(fam, fixed_shapes=True, graphs="off"), Engine(fam, fixed_shapes=True, graphs=graphs)
        tokens_of(eager, "ar"), tokens_of(graphed, "ar")  # warm-up: kernels loaded, first captures
        for method in names:
            try:
                a, meta_a = tokens_of(eager, method)
                b, meta_b = tokens_of(graphed, method)
            except Exception as exc:  # noqa: BLE001 - one method's failure must not hide the others'
                row = {"dtype": dtype, "method": method, "error": f"{type(exc).__name__}: {exc}"[:500]}
                out["rows"].append(row)
                print(json.dumps(row), flush=True)
                continue
            row = {
                "dtype": dtype,
                "method": method,
                "eager_s": meta_a["latency_s"],
                "graphed_s": meta_b["latency_s"],
                "execution": meta_b["execution"],
                "graphed_equals_eager": a == b,
            }
            if cpu and method in cpu:
                row["agreement_with_cpu"] = agreement(cpu[method], a)
            out["rows"].append(row)
            print(json.dumps(row), flush=True)
    float32 = [r for r in out["rows"] if r["dtype"] == "float32"]
    out["all_graphed_equal_eager"] = all(r.get("graphed_equals_eager") for r in out["rows"])
    out["errors"] = [f"{r['method']} {r['dtype']}" for r in out["rows"] if "error" in r]
    out["float32_same_as_cpu"] = [r["method"] for r in float32 if r.get("agreement_with_cpu") == 1.0]
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", default="twemoji")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--methods", default=",".join(methods.names()))
    parser.add_argument(
        "--reference", type=Path, help="the CPU's tokens (prepare.py); written here with --make-reference"
    )
    parser.add_argument("--make-reference", action="store_true", help="compute the CPU's tokens and write --reference")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    names = args.methods.split(",")
    if args.make_reference:
        start = time.perf_counter()
        tokens = reference(args.family, names)
        args.reference.write_text(json.dumps({"family": args.family, "prompt": PROMPT, "seed": SEED, "tokens": tokens}))
        print(f"CPU reference of {len(names)} methods in {time.perf_counter() - start:.0f} s: {args.reference}")
        return 0
    cpu = None
    if args.reference and args.reference.exists():
        ref = json.loads(args.reference.read_text())
        cpu = ref["tokens"] if ref["family"] == args.family else None
    result = check(args.family, args.device, names, cpu)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return 0 if result["all_graphed_equal_eager"] else 1


if __name__ == "__main__":
    sys.exit(main())
