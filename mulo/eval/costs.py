"""What a forward pass costs on this machine, by model and width, timed until the timings agree.

Counting passes (NFE) treats a verification over a thousand tokens like a one-token step; on a
CPU the first costs tens of steps. Here each model that a method runs (the target, a drafter,
the same-grid draft model, the EAGLE head) is timed on passes of a few widths (powers of two,
the "buckets": 1, 2, 4, ... up to its grid), each pass causal over a full cache and centred on
the middle of the grid, so its keys are those of an average step. A pass of another width is
priced by linear interpolation between the buckets. Every timing repeats, in rounds of at least
``MIN_ROUND_S``, until the last ``WINDOW`` rounds agree within ``TOLERANCE`` ((max - min) /
median), and reports that spread. Only the buckets that price some pass of a run are timed
(``priced_buckets``): the ones at and just above each width it fed, and width 1, the unit.

All costs are relative to one single-token step of the target, so the cost of a request is in
"target steps" and AR's is about its number of tokens.
"""

from __future__ import annotations

import functools
import statistics
import time
from dataclasses import dataclass

import numpy as np
import torch

from mulo.runner import ModelRunner

TOLERANCE = 0.05
WINDOW = 5
MIN_ROUND_S = 0.05
MAX_ROUNDS = 60


def stable_seconds(fn, synchronize=None, max_rounds: int | None = None) -> tuple[float, float]:
    """Seconds per call of ``fn``: rounds of calls (each at least ``MIN_ROUND_S``) until the last
    ``WINDOW`` rounds' per-call times agree within ``TOLERANCE`` or ``MAX_ROUNDS`` (or fewer,
    ``max_rounds``) ran. Returns ``(median of those rounds, their spread)``; a spread above
    ``TOLERANCE`` says it never settled."""
    fn()  # warm-up: allocator, lazily built tables
    rounds: list[float] = []
    spread = float("inf")
    limit = min(MAX_ROUNDS, max_rounds or MAX_ROUNDS)
    while len(rounds) < limit:
        calls, start = 0, time.perf_counter()
        while True:
            fn()
            calls += 1
            if synchronize:
                synchronize()
            elapsed = time.perf_counter() - start
            if elapsed >= MIN_ROUND_S:
                break
        rounds.append(elapsed / calls)
        if len(rounds) >= WINDOW:
            last = rounds[-WINDOW:]
            spread = (max(last) - min(last)) / statistics.median(last)
            if spread < TOLERANCE:
                break
    return statistics.median(rounds[-WINDOW:]), spread


def buckets(n_tokens: int) -> list[int]:
    """Pass widths timed for a model whose passes feed at most ``n_tokens - 1`` tokens."""
    widest = max(1, n_tokens - 1)
    return sorted({min(2**i, widest) for i in range(widest.bit_length() + 1)})


def priced_buckets(all_buckets: list[int], fed) -> list[int]:
    """The buckets that price passes of widths ``fed`` by interpolation: for each width, the widest
    bucket at or below it and the narrowest at or above it (the widest bucket past the end); and
    width 1, the unit every cost is relative to."""
    keep = {all_buckets[0]}
    for width in set(fed):
        keep.add(max((b for b in all_buckets if b <= width), default=all_buckets[0]))
        keep.add(min((b for b in all_buckets if b >= width), default=all_buckets[-1]))
    return sorted(keep)


@dataclass
class PassCosts:
    """Per model: the bucket widths, seconds per pass at each, and each timing's spread."""

    widths: dict[str, list[int]]
    seconds: dict[str, list[float]]
    spread: dict[str, list[float]]

    @property
    def unit(self) -> float:
        """Seconds of one single-token target step."""
        return self.seconds["target"][0]

    def relative(self, model: str, widths) -> np.ndarray:
        """Cost of passes of ``widths`` through ``model``, in target steps."""
        return np.interp(np.asarray(widths, dtype=float), self.widths[model], self.seconds[model]) / self.unit

    def step(self, model: str) -> float:
        """One single-token step of ``model`` / one of the target."""
        return float(self.relative(model, [1])[0])

    def request(self, pass_widths: dict[str, list[int]], drafter: str | None) -> float:
        """A request's passes (per role, their widths) priced in target steps."""
        total = float(self.relative("target", pass_widths.get("target", [])).sum())
        if drafter and pass_widths.get("drafter"):
            total += float(self.relative(drafter, pass_widths["drafter"]).sum())
        return total

    def to_dict(self) -> dict:
        return {"widths": self.widths, "seconds": self.seconds, "spread": self.spread, "unit_s": self.unit}


def _runner_pass(model, cond, guidance: float, width: int):
    """A callable running one causal pass of ``width`` tokens centred on the grid's middle, over a
    cache in which every slot is written (what a verification of that width costs)."""
    runner = ModelRunner(model, cond, guidance, 1.0, 0, 1.0)
    runner.prefill()
    n = model.config.max_seq_len
    seq = torch.zeros(n, dtype=torch.long)
    runner.span_probs(seq, 0, n)
    lo = max(1, min(n // 2 - width // 2, n - width))
    return lambda: runner.span_probs(seq, lo, lo + width)  # feeds tokens lo-1 .. lo+width-2


def _head_pass(fam, cond, guidance: float, width: int):
    """A callable running the EAGLE head over ``width`` of its main slots ending at the grid's middle."""
    from mulo.methods.eagle2 import HeadRunner  # the head's runner lives with its method

    runner = ModelRunner(fam.target, cond, guidance, 1.0, 0, 1.0)
    runner.prefill()
    head = HeadRunner(fam.eagle_head, runner, scratch=1)
    seq = torch.zeros(fam.target.config.max_seq_len, dtype=torch.long)
    root = fam.target.config.max_seq_len // 2
    last = runner.n_cond + root - 1
    head.catch_up(seq, root)  # every main slot up to the root written

    def run():
        head.done = last + 1 - width
        head.catch_up(seq, root)

    return run


def pass_timer(engine, prompt: str, name: str):
    """``(n, make)`` for one of the engine's models ("target", "drafter_r<r>", "draft_model",
    "eagle_head"): the tokens its passes can feed at most, and ``make(width)``, a callable that
    runs one pass of that width (``stable_seconds`` times it)."""
    fam = engine.family
    guidance = engine.make_config(None).guidance
    cond = functools.cache(lambda: fam.condition(prompt, 0))  # only once a pass is timed (Tar's runs its LLM)
    if name == "eagle_head":
        return fam.target.config.max_seq_len // 2, lambda w: _head_pass(fam, cond(), guidance, w)
    by_name = {
        "target": fam.target,
        "draft_model": fam.draft_model,
        **{f"drafter_r{r}": m for r, m in fam.drafters.items()},
    }
    model = by_name[name]
    return model.config.max_seq_len, lambda w: _runner_pass(model, cond(), guidance, w)


def _synchronize(engine):
    return torch.cuda.synchronize if engine.family.device.type == "cuda" else None


@torch.no_grad()
def measure(
    engine, prompt: str, models: list[str], steps_only: bool = False, fed: dict | None = None, max_rounds=None
) -> PassCosts:
    """Time ``models`` ("target", "drafter_r<r>", "draft_model", "eagle_head") of the engine's family
    (and the target) at every bucket, at width 1 only (``steps_only``), or at the buckets that
    price the widths each model was fed in a run (``fed``: {model: widths}). ``max_rounds`` caps
    each timing's rounds (``stable_seconds``)."""
    sync = _synchronize(engine)
    widths, seconds, spread = {}, {}, {}
    for name in ["target", *[m for m in models if m != "target"]]:
        n, make = pass_timer(engine, prompt, name)
        widths[name] = [1] if steps_only else buckets(n)
        if fed is not None:
            widths[name] = priced_buckets(widths[name], fed.get(name, []))
        timed = [stable_seconds(make(w), sync, max_rounds) for w in widths[name]]
        seconds[name] = [t for t, _ in timed]
        spread[name] = [s for _, s in timed]
    return PassCosts(widths, seconds, spread)


class CostTable:
    """Pass costs kept for the life of an engine: each (model, bucket) is timed the first time a
    request needs it and never again, so identical work is priced identically however busy the
    machine is when it runs (the app's cost speed-up). Timing holds the engine's lock: no
    generation shares the models meanwhile."""

    def __init__(self, engine, max_rounds: int = 12):
        self.engine, self.max_rounds = engine, max_rounds
        self.timed: dict[str, dict[int, tuple[float, float]]] = {}  # model -> width -> (seconds, spread)

    @torch.no_grad()
    def costs(self, prompt: str, fed: dict[str, set[int] | list[int]]) -> PassCosts:
        """Pass costs that price the widths ``fed`` ({model: widths}; the target always), timing
        only the buckets not timed before."""
        with self.engine.lock:
            for name in ["target", *[m for m in fed if m != "target"]]:
                n, make = pass_timer(self.engine, prompt, name)
                have = self.timed.setdefault(name, {})
                for width in priced_buckets(buckets(n), fed.get(name, [])):
                    if width not in have:
                        have[width] = stable_seconds(make(width), _synchronize(self.engine), self.max_rounds)
        kept = {name: sorted(by_width.items()) for name, by_width in self.timed.items()}
        return PassCosts(
            {name: [w for w, _ in rows] for name, rows in kept.items()},
            {name: [t for _, (t, _) in rows] for name, rows in kept.items()},
            {name: [s for _, (_, s) in rows] for name, rows in kept.items()},
        )
