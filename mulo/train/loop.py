"""A resumable training loop: AdamW, warm-up + cosine learning rate, periodic checkpoints and,
when given a held-out loss, model selection by it (the weights of the best held-out loss seen
at a validation step are what the stage keeps, never those of the lowest training loss).

A stage that is stopped (or killed) resumes from its last checkpoint with the same model,
optimizer and step, so a long CPU run can be split across sessions, or finished on a GPU: the
checkpoint keeps which hardware ran which steps (``segments``), for the model card.
"""

from __future__ import annotations

import functools
import logging
import math
import platform
import time
from pathlib import Path

import torch

log = logging.getLogger(__name__)


MIN_LR_SCALE = 0.02


def lr_scale(step: int, steps: int, warmup: int = 100) -> float:
    """The learning rate at ``step`` over the peak: linear warm-up, then a cosine that reaches zero
    at ``steps``, never below MIN_LR_SCALE."""
    warm = min(1.0, (step + 1) / max(1, warmup))
    return max(warm * 0.5 * (1 + math.cos(math.pi * min(step, steps) / max(1, steps))), MIN_LR_SCALE)


def train(
    name: str,
    model: torch.nn.Module,
    loss_fn,
    steps: int,
    checkpoint: Path,
    lr: float = 1e-3,
    weight_decay: float = 0.01,
    warmup: int = 100,
    every: int = 200,
    on_step=None,
    validate=None,
    validate_every: int = 0,
) -> dict:
    """Run ``loss_fn(step) -> loss`` for ``steps`` steps; returns {"seconds", "final_loss"}, and
    "segments" ([{"hardware", "steps": [first, end], "seconds"}]) when more than one kind of
    hardware ran them. ``on_step(step)`` runs after each optimizer step (codebook restarts and the like).

    ``validate() -> float`` (a held-out loss, run in eval mode without gradients) every
    ``validate_every`` steps and at the end: the best weights so far are kept beside the
    checkpoint (``.best``), the model ends with them, and the stats add "best_step",
    "best_val_loss" and the "val_curve" ([step, loss] pairs)."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=weight_decay)
    validate_every = every * max(1, -(-validate_every // every))  # a multiple of the checkpoint interval
    start, elapsed, recent, segments = 0, 0.0, [], []
    curve, best = [], {"step": None, "val": math.inf}
    best_path = checkpoint.with_suffix(".best")
    if checkpoint.exists():
        state = torch.load(checkpoint, map_location="cpu", weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start, elapsed = int(state["step"]), float(state["seconds"])
        segments = state.get("segments") or [{"hardware": "unrecorded", "steps": [0, start], "seconds": elapsed}]
        curve, best = state.get("curve", []), state.get("best", best)
        log.info("%s: resuming at step %d", name, start)
    here = hardware(str(next(model.parameters()).device))
    if not segments or segments[-1]["hardware"] != here:
        segments.append({"hardware": here, "steps": [start, start], "seconds": 0.0})
    done_before = elapsed - segments[-1]["seconds"]

    def save(step: int) -> None:
        segments[-1].update(steps=[segments[-1]["steps"][0], step], seconds=round(elapsed - done_before, 1))
        tmp = checkpoint.with_suffix(".tmp")
        torch.save(
            {
                "model": model.state_dict(),
                "optimizer": opt.state_dict(),
                "step": step,
                "seconds": elapsed,
                "segments": segments,
                "curve": curve,
                "best": best,
            },
            tmp,
        )
        tmp.replace(checkpoint)

    def check(step: int) -> None:
        model.eval()
        with torch.no_grad():
            val = float(validate())
        model.train()
        curve.append([step, round(val, 4)])
        if val < best["val"]:
            best.update(step=step, val=val)
            torch.save(model.state_dict(), best_path)
        log.info("%s: step %d held-out loss %.4f (best %.4f at step %d)", name, step, val, best["val"], best["step"])

    model.train()
    tick = time.perf_counter()
    for step in range(start, steps):
        for group in opt.param_groups:
            group["lr"] = lr * lr_scale(step, steps, warmup)
        loss = loss_fn(step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if on_step is not None:
            on_step(step)
        recent = (recent + [float(loss.detach())])[-50:]
        if (step + 1) % every == 0 or step + 1 == steps:
            # on checkpoint steps only, so the best weights never run ahead of a resumable state
            if validate is not None and ((step + 1) % validate_every == 0 or step + 1 == steps):
                check(step + 1)
            elapsed += time.perf_counter() - tick
            tick = time.perf_counter()
            save(step + 1)
            log.info("%s: step %d/%d loss %.4f (%.0f s)", name, step + 1, steps, sum(recent) / len(recent), elapsed)
    model.eval()
    stats = {"seconds": round(elapsed, 1), "final_loss": sum(recent) / max(1, len(recent)) if recent else None}
    if validate is not None and best["step"] is not None:
        model.load_state_dict(torch.load(best_path, map_location="cpu", weights_only=True))
        stats.update(best_step=best["step"], best_val_loss=round(best["val"], 4), val_curve=curve)
    ran = [segment for segment in segments if segment["steps"][1] > segment["steps"][0]]
    if len({segment["hardware"] for segment in ran}) > 1:
        stats["segments"] = ran
    return stats


def hardware(device: str) -> str:
    """What trains on ``device``, in words: the GPU's name, or the CPU, its threads and precision."""
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    precision = "bf16" if cpu_bf16_pays() else "fp32"  # what the AR models and the EAGLE head train in
    return f"{platform.processor() or platform.machine()} CPU, {torch.get_num_threads()} threads, {precision}"


def init_weights(module) -> None:
    """GPT-style initialisation of a freshly built model (normal 0.02, zero biases)."""
    if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
        torch.nn.init.normal_(module.weight, std=0.02)
        if getattr(module, "bias", None) is not None:
            torch.nn.init.zeros_(module.bias)


def autocast(device: str):
    """bf16 autocast where it is faster: on CUDA, and on a CPU whose bf16 matrix products
    measure faster than fp32 ones (``cpu_bf16_pays``); plain fp32 elsewhere."""
    kind = "cuda" if device.startswith("cuda") else "cpu"
    return torch.autocast(kind, dtype=torch.bfloat16, enabled=kind == "cuda" or cpu_bf16_pays())


@functools.cache
def cpu_bf16_pays() -> bool:
    """Whether this CPU multiplies bf16 matrices faster than fp32 ones, timed once per process
    on an AR model's shapes. The instruction set does not say: with AVX512-BF16, a 2-core Zen 4
    EPYC ran an AR training step 1.6x faster in bf16, a 2-core Xeon 1.5x slower (2.7 s vs 4.1 s
    for the 32x32 target's batch)."""
    native = (
        getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)()
        or getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()
    )
    if not native:  # emulated bf16 is always slower
        return False
    a, b = torch.randn(2048, 256), torch.randn(256, 704)

    def best_of(x, y) -> float:
        times = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(4):
                x @ y
            times.append(time.perf_counter() - start)
        return min(times)

    fp32 = best_of(a, b)
    bf16 = best_of(a.bfloat16(), b.bfloat16())
    log.info(
        "bf16 matmul %.1f ms vs fp32 %.1f ms: training in %s", bf16 * 250, fp32 * 250, "bf16" if bf16 < fp32 else "fp32"
    )
    return bf16 < fp32
