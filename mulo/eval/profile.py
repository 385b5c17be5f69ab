"""Cost profile of one AR model: a sequential decoding step (eager, and replayed from a CUDA graph
on a GPU) against one verification pass, and the step's floor.

``profile`` builds a Tar-sized AR-DTok with random weights (the cost does not depend on their
values) and Tar's shapes (729 condition features of width 1152, vocabulary 16384, CFG batch 2) at
the 512 px (32x32) and 1024 px (64x64) sequence lengths; ``profile_model`` takes any model (the
default family's target). The ratio verify/step converts NFE counts into projected speed-ups: a
method that needs ``n_steps`` sequential steps and ``n_verify`` full passes costs about
``n_steps + n_verify * ratio`` steps, against ``H * W`` steps for AR.

The floor of a step is the bytes it must read (every weight once, and the K/V cache a late step
attends over) at the device's streaming bandwidth, measured in the same run by a large copy: a
single-token step is memory-bound, so no implementation beats it.
"""

from __future__ import annotations

import statistics
import time

import torch

from mulo.graphs import capture
from mulo.models.gpt import GPT, GPTConfig, KVCache

COND_LEN, COND_DIM, VOCAB = 729, 1152, 16384


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _timed(fn, device: torch.device, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bandwidth(device, megabytes: int = 1024, repeats: int = 10) -> float:
    """Streaming bandwidth in bytes/s (a copy's bytes read plus written), measured now."""
    device = torch.device(device)
    n = megabytes * 2**20 // 4
    src = torch.empty(n, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    seconds = _timed(lambda: dst.copy_(src), device, repeats)
    return 2 * src.numel() * 4 / seconds


def step_bytes(model: GPT, batch: int, context: int) -> int:
    """Bytes a single-token step reads at least: every weight once and ``context`` slots of K/V
    per layer and CFG branch."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    c = model.config
    element = next(model.parameters()).element_size()
    return weights + 2 * c.n_layer * batch * c.kv_heads * c.head_dim * context * element


@torch.no_grad()
def profile_model(model: GPT, cond: torch.Tensor, repeats: int = 5, graphs: bool | None = None) -> dict:
    """One model's step and verification pass. ``cond [B, T, cond_dim]``: its condition batch (2:
    CFG). A step = one new token at the last image slot against a full cache (every slot written
    by the verification pass); a verification pass = every image token at once. ``graphs``: also
    time the step replayed from a CUDA graph (default: on CUDA)."""
    param = next(model.parameters())
    device, dtype = param.device, param.dtype
    graphs = device.type == "cuda" if graphs is None else graphs
    config = model.config
    n, batch = config.max_seq_len, cond.shape[0]
    cache = KVCache(config, batch, device, dtype)
    embedded = model.embed_condition(cond.to(device))
    cond_len = embedded.shape[1]
    prefix_mask = torch.ones(cond_len, cond_len, dtype=torch.bool, device=device).tril()
    model.forward_embeddings(embedded, torch.arange(cond_len, device=device), prefix_mask, cache)
    tokens = torch.randint(config.vocab_size, (batch, n - 1), device=device)
    slots = torch.arange(cond_len, cond_len + n - 1, device=device)
    verify_mask = torch.arange(cond_len + n - 1, device=device)[None, :] <= slots[:, None]
    step_mask = torch.ones(1, cond_len + n - 1, dtype=torch.bool, device=device)

    neighbours = model.neighbours_of(tokens, torch.arange(1, n, device=device))  # (None: reads no row above)

    def verify():
        model.forward_embeddings(model.embed_tokens(tokens, neighbours), slots, verify_mask, cache)

    def step():
        last = None if neighbours is None else neighbours[:, -1:]
        model.forward_embeddings(model.embed_tokens(tokens[:, -1:], last), slots[-1:], step_mask, cache)

    row = {"tokens": n, "verify_s": _timed(verify, device, repeats), "step_s": _timed(step, device, repeats)}
    row["ratio"] = row["verify_s"] / row["step_s"]
    row["step_bytes"] = step_bytes(model, batch, cond_len + n - 1)
    if graphs:
        row["step_graphed_s"] = _timed(capture(step)[0].replay, device, repeats)
        row["graph_speedup"] = row["step_s"] / row["step_graphed_s"]
    return row


@torch.no_grad()
def profile(preset="llama-abs-LP", sides=(32, 64), device="cuda", dtype=torch.bfloat16, repeats=5, **shape) -> list:
    """[{side, tokens, step_s, verify_s, ratio, step_bytes[, step_graphed_s, graph_speedup]}] for each
    grid side of a Tar-sized AR-DTok (Tar shapes unless overridden)."""
    device = torch.device(device)
    shape = {"cond_len": COND_LEN, "cond_dim": COND_DIM, "vocab": VOCAB, **shape}
    rows = []
    for side in sides:
        config = GPTConfig.preset(
            preset,
            vocab_size=shape["vocab"],
            max_seq_len=side * side,
            cond_len=shape["cond_len"],
            cond_dim=shape["cond_dim"],
        )
        with torch.device(device):  # initialised where it runs: ~632M parameters take a while on a host
            model = GPT(config).to(dtype=dtype).eval()
        cond = torch.randn(2, shape["cond_len"], shape["cond_dim"], device=device, dtype=dtype)
        rows.append({"side": side, **profile_model(model, cond, repeats)})
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def add_floor(rows: list[dict], bytes_per_s: float) -> list[dict]:
    """Each row with its step's floor (``step_bytes`` at ``bytes_per_s``) and the best measured step
    over it."""
    for row in rows:
        best = min(row["step_s"], row.get("step_graphed_s", row["step_s"]))
        row["floor_s"] = row["step_bytes"] / bytes_per_s
        row["over_floor"] = best / row["floor_s"]
        # every AR step at the full cache (what fixed shapes run), sampling left out: AR per image
        row["ar_image_s"] = best * row["tokens"]
    return rows
