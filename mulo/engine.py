"""The engine: one loaded family on one device, behind one lock, running any method.

``Engine.stream`` is a generator: it yields every ``Round`` as it happens and returns a
``Result`` (tokens, image, trace). The CLI and the app both drive it; bad requests raise
``ConfigError`` before anything runs, and the lock is released however a run ends.
"""

from __future__ import annotations

import platform
import threading
import time
from dataclasses import dataclass

import numpy as np
import torch

import mulo
from mulo import compiled, methods, wide
from mulo.config import ConfigError, GenerationConfig, knob_keys, validate, validate_prompt, validate_seed
from mulo.methods.common import DecodeContext
from mulo.models.vq import to_uint8
from mulo.streams import Returning, drain
from mulo.timing import PhaseTimer
from mulo.trace import Round, Trace


@dataclass
class Result:
    tokens: torch.Tensor  # [H, W]
    image: np.ndarray  # [h, w, 3] uint8
    trace: Trace
    pass_widths: dict[str, list[int]]  # per role, the tokens fed by each forward pass (bench costs)


def versions() -> dict[str, str]:
    from importlib.metadata import version  # diffusers' own import takes seconds; its version does not

    return {
        "mulo": mulo.__version__,
        "torch": torch.__version__,
        "diffusers": version("diffusers"),
        "python": platform.python_version(),
    }


class Engine:
    def __init__(
        self,
        family,
        fixed_shapes: bool | None = None,
        graphs: str = "auto",
        compile: str = "auto",
        background_compile: bool = False,
        wide_precision: str = "auto",
    ):
        """``fixed_shapes``: every forward pass in a few fixed shapes (``mulo.runner``); None picks
        them on an accelerator and exact shapes on a CPU, where padding only costs. ``graphs``:
        fixed-shape passes replayed from CUDA graphs (``mulo.graphs``; ``auto``: on CUDA).
        ``compile``: the narrow passes of the family's transformers compiled ahead of time
        (``mulo.compiled``; ``auto``: on a CPU with a C++ compiler unless ``MULO_COMPILE=off``),
        at first use or, with ``background_compile`` (the app), on a worker thread while those
        passes run eagerly. ``wide_precision``: the wide passes' layers (verification, wide waves,
        long prefills) in ``float32``, ``bfloat16``, or ``auto``: per model and width bucket, whichever
        measured faster on this machine (``mulo.wide``; ``MULO_WIDE_PRECISION`` when ``auto``). The
        models are the family's: the last engine built on one decides."""
        self.family = family
        self.fixed_shapes = fixed_shapes
        self.graphs = graphs
        # EAGLE's head stays eager: compiled as a one-layer GPT it measured no faster at the widths
        # EAGLE-2 feeds it (7 and 10 queries; docs/cpu-engine.md)
        models = family.transformers()
        self.compilation = compiled.attach(models, compile, background_compile)  # "compiled steps" / "eager (why)"
        self.wide_precision = wide.attach(models, wide_precision)  # "measured per width bucket", "float32 (forced)"...
        self.lock = threading.Lock()

    def make_config(self, config: GenerationConfig | dict | None = None) -> GenerationConfig:
        """Dataclass defaults <- the family's recommended values <- the request's values."""
        if isinstance(config, GenerationConfig):
            return config
        known = set(knob_keys())
        values = {k: v for k, v in self.family.defaults.items() if k in known}
        values.update(config or {})
        return GenerationConfig.from_dict(values)

    def check(self, prompt, method: str, seed, config) -> tuple[str, GenerationConfig, list[str]]:
        """Validate a request (cheaply: no model runs); returns the normalised prompt, the full
        config and warnings (prompt words the family does not know are reported, never dropped)."""
        spec = methods.get(method)
        prompt = validate_prompt(prompt)
        validate_seed(seed)
        knobs = self.make_config(config)
        fam = self.family
        validate(knobs, vocab_size=fam.vocab_size, ratios=fam.ratios, grid=fam.grid)
        spec.check(fam, knobs)
        try:
            fam.check_prompt(prompt)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        return prompt, knobs, fam.prompt_notes(prompt)

    def stream(self, prompt: str, method: str = "mulo", seed: int = 0, config=None):
        """Yield each Round of one generation; return its Result."""
        prompt, knobs, warnings = self.check(prompt, method, seed, config)
        fam = self.family
        with self.lock:
            timer = PhaseTimer(fam.device, compiled.setup_seconds)
            start, setup_before = time.perf_counter(), compiled.setup_seconds()
            alias = fam.alias(prompt) if knobs.aliases else None
            with timer.phase("condition"):  # Tar: the LLM's semantic tokens + TA-Tok decoding
                cond = fam.condition(alias or prompt, seed)
            generator = torch.Generator().manual_seed(seed)
            ctx = DecodeContext(fam, cond, knobs, generator, timer, self.fixed_shapes, self.graphs)
            rounds: list[Round] = []
            paused = [0.0]  # seconds the consumer held the generator between rounds
            tokens = yield from _collect(methods.get(method).generate(ctx), rounds, paused)
            with timer.phase("vq_decode"):
                image = to_uint8(fam.vq.decode(tokens[None].to(fam.device)))[0].numpy()
            setup = compiled.setup_seconds() - setup_before  # building/loading compiled passes: not the method's
            latency = time.perf_counter() - start - paused[0] - setup
            execution = ctx.execution()
            if setup >= 0.001:  # a package loads in a few milliseconds
                execution += f"; {setup:.3f} s building/loading compiled passes, not counted"
            trace = Trace(
                method=method,
                family=fam.name,
                prompt=prompt,
                seed=seed,
                config=knobs.to_dict(),
                device=str(fam.device),
                dtype=str(next(fam.target.parameters()).dtype).replace("torch.", ""),
                versions=versions(),
                grid=fam.grid,
                tokens=tokens.numpy(),
                latency_s=latency,
                timings_s=timer.snapshot(),
                nfe=ctx.nfe(),
                rounds=rounds,
                warnings=warnings,
                condition_text=alias,
                chain=methods.get(method).chain,
                execution=execution,
                precision=ctx.precisions(),
            )
            return Result(tokens, image, trace, ctx.pass_widths())

    def generate(self, prompt: str, method: str = "mulo", seed: int = 0, config=None) -> Result:
        return drain(self.stream(prompt, method, seed, config))


def _collect(method_run, rounds: list[Round], paused: list[float]):
    """Forward a method's rounds to the caller, keeping them; return its token grid.

    ``latency_s`` is wall time from start to decoded image minus the time the caller held the
    generator between rounds (``paused``), so a UI that draws every round does not slow the
    method it measures.
    """
    run = Returning(method_run)
    for rnd in run:
        rounds.append(rnd)
        held = time.perf_counter()
        yield rnd
        paused[0] += time.perf_counter() - held
    return run.value
