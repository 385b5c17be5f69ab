"""What a forward pass cannot beat on this machine: its floor, measured in the same run.

A pass of ``w`` tokens through a model reads every weight once and, per layer and CFG branch,
the K/V of the slots its queries attend over, and does ``2 * w`` FLOPs per matrix weight plus
its attention's. Its floor is the larger of those bytes at the machine's streaming bandwidth and
those FLOPs at its matrix rate, both measured now (``profile.bandwidth``, ``matrix_rate``). A
single-token step is all bytes (memory-bound); a verification over the grid is all FLOPs. A wide
pass whose layers ran in bfloat16 (``mulo.wide``) is priced at the bfloat16 matrix rate, measured
in the same run: on a CPU with bf16 matrix units that rate is several times float32's.

The bench prices every pass it times (``mulo.eval.costs``: causal, centred on the grid's middle,
over a full cache) against its floor: ``over_floor = measured / floor``; 1 would be perfect.
"""

from __future__ import annotations

import time

import torch

from mulo.eval.profile import bandwidth


def matrix_rate(device="cpu", n: int = 1024, repeats: int = 5, dtype=torch.float32) -> float:
    """FLOP/s of an ``n x n`` matrix product in ``dtype``, measured now (the best of ``repeats``)."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    a @ b  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        if a.device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def _read_whole(name: str) -> bool:
    """Whether a pass reads all of a parameter: not the embedding tables nor the position table (a
    pass reads its rows only), nor the condition's projection (the prefill's alone)."""
    return not any(part in name for part in ("embedding", "abs_pe", "clip_proj"))


def _matrix_params(module) -> int:
    """Weights a pass multiplies by: every matrix it reads whole."""
    return sum(p.numel() for name, p in module.named_parameters() if p.dim() == 2 and _read_whole(name))


def pass_floor(module, config, batch: int, width: int, context: int, bytes_per_s: float, flops_per_s: float) -> dict:
    """The floor of one pass of ``width`` queries over ``context`` key slots through ``module``
    (a GPT, or the EAGLE head with its own ``config``), CFG ``batch`` branches."""
    element = next(module.parameters()).element_size()
    weights = sum(p.numel() * p.element_size() for name, p in module.named_parameters() if _read_whole(name))
    kv_per_slot = 2 * config.n_layer * batch * config.kv_heads * config.head_dim * element
    n_bytes = weights + kv_per_slot * context
    attention = 4 * config.n_layer * batch * config.n_head * config.head_dim * width * context
    flops = 2 * batch * width * _matrix_params(module) + attention
    floor = max(n_bytes / bytes_per_s, flops / flops_per_s)
    return {
        "bytes": n_bytes,
        "flops": flops,
        "floor_s": floor,
        "bound": "memory" if n_bytes / bytes_per_s >= flops / flops_per_s else "compute",
    }


def pass_precision(module, batch: int, width: int) -> str:
    """The precision the layers of a pass of ``width`` queries ran in: a model's ``mulo.wide``
    choice (its buckets were measured when the bench timed the pass), else float32."""
    wide = getattr(module, "wide", None)
    return "float32" if wide is None else wide.precision(batch, width)


def models_of(family) -> dict[str, tuple[object, object]]:
    models = {"target": (family.target, family.target.config)}
    models.update({f"drafter_r{r}": (m, m.config) for r, m in family.drafters.items()})
    if family.draft_model is not None:
        models["draft_model"] = (family.draft_model, family.draft_model.config)
    if family.eagle_head is not None:
        models["eagle_head"] = (family.eagle_head, family.eagle_head.config)
    return models


def floors(engine, costs: dict, device="cpu") -> dict:
    """Each pass the bench timed (``costs``: ``PassCosts.to_dict()``) against its floor, with the
    bandwidth and matrix rate measured now."""
    bytes_per_s, flops_per_s = bandwidth(device, 256), matrix_rate(device)
    batch = 1 if engine.make_config(None).guidance == 1 else 2
    models = models_of(engine.family)
    out = {"bandwidth_GBps": bytes_per_s / 1e9, "matrix_GFLOPs": flops_per_s / 1e9, "batch": batch, "models": {}}
    rates = {"float32": flops_per_s}  # the bf16 rate measured once, when some pass ran in bf16
    n_cond = engine.family.target.config.cond_len
    for name, widths in costs["widths"].items():
        if name not in models:
            continue
        module, config = models[name]
        n = config.max_seq_len
        rows = []
        for width, seconds in zip(widths, costs["seconds"][name], strict=True):
            precision = pass_precision(module, batch, width)
            if precision not in rates:
                rates[precision] = matrix_rate(device, dtype=getattr(torch, precision))
            lo = max(1, min(n // 2 - width // 2, n - width))  # where costs.measure centres the pass
            context = n_cond + lo + width - 1
            row = pass_floor(module, config, batch, width, context, bytes_per_s, rates[precision])
            over = seconds / row["floor_s"]
            rows.append({"width": width, "seconds": seconds, "precision": precision, **row, "over_floor": over})
        out["models"][name] = rows
    if "bfloat16" in rates:
        out["matrix_GFLOPs_bfloat16"] = rates["bfloat16"] / 1e9
    return out


def _cell(row: dict) -> str:
    bf16 = " bf16" if row.get("precision") == "bfloat16" else ""
    return f"{row['seconds'] * 1e3:.2f} / {row['floor_s'] * 1e3:.2f} ({row['over_floor']:.1f}x{bf16})"


def floor_lines(floor: dict | None) -> list[str]:
    """The bench's markdown section: each timed pass against its floor."""
    if not floor:
        return []
    bf16 = floor.get("matrix_GFLOPs_bfloat16")
    bf16_rate = (
        f", bfloat16 matrix rate {bf16:.0f} GFLOP/s (the passes marked bf16 ran their layers in bfloat16, "
        "`mulo/wide.py`, and are priced at that rate)"
        if bf16
        else ""
    )
    lines = [
        "## Against the floor",
        "",
        f"Measured in the same run: streaming bandwidth {floor['bandwidth_GBps']:.1f} GB/s, float32 matrix rate "
        f"{floor['matrix_GFLOPs']:.0f} GFLOP/s{bf16_rate}, CFG batch {floor['batch']}. A pass's floor is the larger "
        "of its bytes (weights, K/V read) at that bandwidth and its FLOPs at that rate (`mulo/eval/floor.py`); "
        "each cell: measured ms / floor ms (times the floor).",
        "",
    ]
    widths = sorted({r["width"] for rows in floor["models"].values() for r in rows})
    lines.append("| model | " + " | ".join(f"w={w}" for w in widths) + " |")
    lines.append("|---|" + "---|" * len(widths))
    for name, rows in floor["models"].items():
        by_width = {r["width"]: r for r in rows}
        cells = [_cell(by_width[w]) if w in by_width else "" for w in widths]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines + [""]
