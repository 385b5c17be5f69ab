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
from dataclasses import dataclass, field
from pathlib import Path

import torch

log = logging.getLogger(__name__)


WEIGHT_DECAY = 0.01  # AdamW's, unless a stage asks for more
WARMUP = 100  # steps of linear learning-rate warm-up
CLIP_NORM = 1.0  # gradient clipping
LOSS_WINDOW = 50  # the logged and returned loss is the mean over this many recent steps
MIN_LR_SCALE = 0.02


def lr_scale(step: int, steps: int, warmup: int = WARMUP, warm_from: int = 0) -> float:
    """The learning rate at ``step`` over the peak: linear warm-up (from ``warm_from``), then a
    cosine that reaches zero at ``steps``, never below MIN_LR_SCALE."""
    warm = min(1.0, (step - warm_from + 1) / max(1, warmup))
    return max(warm * 0.5 * (1 + math.cos(math.pi * min(step, steps) / max(1, steps))), MIN_LR_SCALE)


@dataclass
class Progress:
    """Where a stage stands: what its checkpoint keeps besides the model and the optimizer."""

    step: int = 0
    seconds: float = 0.0  # training time over every session
    segments: list = field(default_factory=list)  # [{"hardware", "steps": [first, end], "seconds"}]
    curve: list = field(default_factory=list)  # [step, held-out loss] at each validation
    best: dict = field(default_factory=lambda: {"step": None, "val": math.inf})
    before: float = 0.0  # seconds of the earlier segments; this session's segment counts the rest
    # where the rate's warm-up starts: a run resumed without Adam's moments (a compact resume point,
    # or a stage continued to more steps from its weights) warms up again, since Adam's first
    # updates, with no second moment yet, move every weight by the full rate
    warm_from: int = 0


def train(
    name: str,
    model: torch.nn.Module,
    loss_fn,
    steps: int,
    checkpoint: Path,
    lr: float = 1e-3,
    weight_decay: float = WEIGHT_DECAY,
    warmup: int = WARMUP,
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
    progress = resume(name, model, opt, checkpoint)
    best_path = checkpoint.with_suffix(".best")
    recent = []
    model.train()
    tick = time.perf_counter()
    for step in range(progress.step, steps):
        for group in opt.param_groups:
            group["lr"] = lr * lr_scale(step, steps, warmup, progress.warm_from)
        loss = loss_fn(step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP_NORM)
        opt.step()
        if on_step is not None:
            on_step(step)
        recent = (recent + [float(loss.detach())])[-LOSS_WINDOW:]
        if (step + 1) % every == 0 or step + 1 == steps:
            # on checkpoint steps only, so the best weights never run ahead of a resumable state
            if validate is not None and ((step + 1) % validate_every == 0 or step + 1 == steps):
                check(name, model, validate, progress, step + 1, best_path)
            progress.seconds += time.perf_counter() - tick
            tick = time.perf_counter()
            save(checkpoint, model, opt, progress, step + 1, steps)
            mean = sum(recent) / len(recent)
            log.info("%s: step %d/%d loss %.4f (%.0f s)", name, step + 1, steps, mean, progress.seconds)
    model.eval()
    return finish(model, progress, recent, validate is not None, best_path)


def resume(name: str, model: torch.nn.Module, opt, checkpoint: Path) -> Progress:
    """The stage's progress, with the model and the optimizer as its checkpoint left them (a
    fresh start without one), and a new segment when other hardware than the last runs on."""
    progress = Progress()
    if checkpoint.exists():
        state = torch.load(checkpoint, map_location="cpu", weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        progress.step, progress.seconds = int(state["step"]), float(state["seconds"])
        # a checkpoint from before segments were kept: one segment on unknown hardware
        unrecorded = [{"hardware": "unrecorded", "steps": [0, progress.step], "seconds": progress.seconds}]
        progress.segments = state.get("segments") or unrecorded
        progress.curve, progress.best = state.get("curve", []), state.get("best", progress.best)
        progress.warm_from = int(state.get("warm_from", 0))
        if progress.step and not state["optimizer"]["state"]:
            progress.warm_from = progress.step
            log.info("%s: no optimizer moments in the checkpoint: the rate warms up again", name)
        log.info("%s: resuming at step %d", name, progress.step)
    here = hardware(str(next(model.parameters()).device))
    if not progress.segments or progress.segments[-1]["hardware"] != here:
        progress.segments.append({"hardware": here, "steps": [progress.step, progress.step], "seconds": 0.0})
    progress.before = progress.seconds - progress.segments[-1]["seconds"]
    return progress


def save(checkpoint: Path, model: torch.nn.Module, opt, progress: Progress, step: int, steps: int) -> None:
    """The checkpoint at ``step`` of ``steps``, written beside and then moved over the last one, so
    a kill mid-write leaves the previous checkpoint whole."""
    last = progress.segments[-1]
    last.update(steps=[last["steps"][0], step], seconds=round(progress.seconds - progress.before, 1))
    state = {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "step": step,
        "steps": steps,  # a compact resume point drops Adam's state once ``step`` reaches it
        "warm_from": progress.warm_from,
        "seconds": progress.seconds,
        "segments": progress.segments,
        "curve": progress.curve,
        "best": progress.best,
    }
    tmp = checkpoint.with_suffix(".tmp")
    torch.save(state, tmp)
    tmp.replace(checkpoint)


def check(name: str, model: torch.nn.Module, validate, progress: Progress, step: int, best_path: Path) -> None:
    """The held-out loss at ``step`` onto the curve; the weights kept when it is the best so far."""
    model.eval()
    with torch.no_grad():
        val = float(validate())
    model.train()
    progress.curve.append([step, round(val, 4)])
    best = progress.best
    if val < best["val"]:
        best.update(step=step, val=val)
        torch.save(model.state_dict(), best_path)
    log.info("%s: step %d held-out loss %.4f (best %.4f at step %d)", name, step, val, best["val"], best["step"])


def finish(model: torch.nn.Module, progress: Progress, recent: list, validated: bool, best_path: Path) -> dict:
    """The stage's stats; a validated stage's model ends with its best weights."""
    stats = {"seconds": round(progress.seconds, 1), "final_loss": sum(recent) / max(1, len(recent)) if recent else None}
    if validated and progress.best["step"] is not None:
        model.load_state_dict(torch.load(best_path, map_location="cpu", weights_only=True))
        stats.update(best_step=progress.best["step"], best_val_loss=round(progress.best["val"], 4))
        stats.update(val_curve=progress.curve)
    ran = [segment for segment in progress.segments if segment["steps"][1] > segment["steps"][0]]
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
