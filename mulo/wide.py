"""Wide passes in bfloat16 where that is faster on this CPU, chosen by measurement.

Why: a pass over many tokens (a verification over the grid, MuLo-SD's wide resampling waves, a long
prefill) is made of matrix-matrix products. On a CPU with bf16 matrix units (AMX, AVX512-BF16) those
run several times faster in bfloat16 than in float32; on one without them (AVX2 only) bfloat16 is
emulated and far slower. Rather than guess from CPU flags, each model times one of its layers at each
width bucket in both precisions, once per machine, and keeps the faster.

What runs in bfloat16: the transformer layers of a pass wider than ``MIN_WIDTH`` queries, under
``torch.autocast`` (the products and attention in bf16). The residual stream, the norms, the K/V
cache and the output head stay float32: a bf16 pass adds one rounding per product, not a bf16 model.
Autocast rather than a bf16 copy of the weights: no second copy of a model in memory (Tar's target
is 632M parameters), and the per-pass cast of the weights is one read of them, small against a
pass's products (docs/cpu-engine.md, "Wide passes in bfloat16", measures both). A bf16 pass whose
mask is causal up to its last key (the grid after the condition, a prefill) runs attention's fused
causal kernel (``gpt.causal_offset``): on AMX, 2x faster than the masked one; float32 passes keep the
mask, bit for bit. Narrow passes (1 to ``MIN_WIDTH`` queries: steps, compiled by ``mulo.compiled``)
are untouched. On a CPU with bf16 matrix units a bf16 pass runs its layers compiled instead
(``mulo.fused_layers``): the same roundings, but the elementwise work between the products, which
autocast runs as separate loops, is fused, at the price of a bf16 copy of the layers' weights; the
bench's verification pass went from 2.2x to 3.2x float32's speed on an AMX Xeon.

The choice, per model shape, CFG batch size and width bucket (a power of two), is kept on disk
beside the compiled packages (``mulo.compiled.cache_dir``) in a file named by the machine: the CPU
model and its matrix flags, torch's CPU capability and version, the thread count. Another machine
(or torch) has another file and measures again. ``MULO_WIDE_PRECISION`` (``auto``, ``float32``,
``bfloat16``) sets the mode when the engine's is ``auto``; the tests run float32.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

from mulo import fused_layers
from mulo.compiled import MAX_QUERIES, cache_dir
from mulo.config import WIDE_MODES, resolve_mode
from mulo.models.gpt import KVCache, causal_offset
from mulo.runner import query_bucket

log = logging.getLogger(__name__)

MODES = WIDE_MODES
MIN_WIDTH = MAX_QUERIES + 1  # the narrow passes (compiled packages) stay float32
# bf16 is chosen only when its layer is this much faster: a tie measured on a busy machine keeps float32
MARGIN = 1.1
DECISIVE = 1.5  # after one timed round, a ratio beyond this decides without more rounds
ROUNDS = 3
# the CPU flags that decide how fast a matrix product runs, kept in the machine key
BF16_UNITS = {"avx512_bf16", "amx_bf16"}
MATRIX_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile", "amx_int8")


def machine() -> dict:
    """What a measured choice holds for: the CPU, its matrix flags, torch and its thread count."""
    name, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                name = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
                break
    except OSError:  # not Linux: the processor's name alone
        pass
    return {
        "cpu": name,
        "flags": sorted(flags & set(MATRIX_FLAGS)),
        "capability": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }


def choices_path(machine_key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(machine_key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / f"wide-precision-{digest}.json"


@torch.no_grad()
def time_layer(model, batch: int, width: int, layers=None) -> tuple[float, float]:
    """Seconds of one of ``model``'s layers over ``width`` queries (at most its slots) at the end of
    a full cache, causal, CFG batch ``batch``: ``(float32, bfloat16)``, the best of up to ``ROUNDS``
    interleaved rounds after a warm-up of each (one round when the first is decisive). bf16 as a
    pass runs it: ``layers`` (``mulo.fused_layers``) when given, else under autocast."""
    c = model.config
    n_slots = c.n_positions
    width = min(width, n_slots)
    cache = KVCache(c, batch, "cpu", torch.float32, n_slots)
    cache.written[:] = True
    slots = torch.arange(n_slots - width, n_slots)
    mask = torch.ones(width, n_slots, dtype=torch.bool).tril(n_slots - width)
    h = torch.randn(batch, width, c.dim, generator=torch.Generator().manual_seed(0))
    layer, causal_pad = model.layers[0], causal_offset(mask)  # as ``GPT.forward_hidden`` runs it

    def seconds(bf16: bool) -> float:
        start = time.perf_counter()
        if bf16 and layers is not None:
            layers.run(0, h, slots, mask, cache, model.rotary_at(slots), causal_pad)
        else:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                layer(h, 0, slots, mask, cache, model.rotary_at(slots), causal_pad if bf16 else None)
        return time.perf_counter() - start

    seconds(False), seconds(True)  # warm-up: allocator, oneDNN's kernels for these shapes
    fp32, bf16 = [], []
    for _ in range(ROUNDS):
        fp32.append(seconds(False))
        bf16.append(seconds(True))
        if max(fp32[0] / bf16[0], bf16[0] / fp32[0]) > DECISIVE:
            break
    return min(fp32), min(bf16)


def choose(float32_s: float, bfloat16_s: float) -> str:
    """The precision a bucket runs in: bfloat16 only when measured ``MARGIN`` times faster."""
    return "bfloat16" if bfloat16_s * MARGIN < float32_s else "float32"


_file_lock = threading.Lock()
_build_lock = threading.Lock()


class WidePasses:
    """A model's wide-pass precision: ``mode`` ``float32`` or ``bfloat16`` for every pass of at least
    ``min_width`` queries, or ``auto``: per (CFG batch, width bucket), measured by ``timer`` (a
    function of (model, batch, width) returning (float32 s, bfloat16 s)) once per machine and kept
    on disk. Attached to a GPT as ``model.wide``; ``GPT.forward_hidden`` asks ``autocast`` and
    ``compiled_layers``. ``fused``: whether bf16 passes run compiled layers (``mulo.fused_layers``;
    default: on a CPU with bf16 matrix units unless ``MULO_WIDE_FUSED=0``)."""

    def __init__(self, model, mode: str, min_width=MIN_WIDTH, timer: Callable = time_layer, on=None, fused=None):
        if mode not in MODES:
            raise ValueError(f"wide precision must be one of {MODES} (got {mode!r})")
        self.model, self.mode, self.min_width, self.timer = model, mode, min_width, timer
        self.shape_key = hashlib.sha256(repr(model.config).encode()).hexdigest()[:16]
        self.chosen: dict[tuple[int, int], dict] = {}  # (batch, bucket) -> its timings and precision
        self.machine = machine() if on is None else on  # ``on``: the machine key, read once by ``attach``
        self.path = choices_path(self.machine)
        self._fused = None  # ``fused_layers.FusedLayers`` once built
        # (a CPU without bf16 matrix units rarely picks bf16: no compile for it; False after a failed one)
        self.fused = (
            fused_layers.enabled() and bool(BF16_UNITS & set(self.machine.get("flags", ()))) if fused is None else fused
        )

    def __getstate__(self) -> dict:
        """A copy (``copy.deepcopy`` of its model) compiles its own layers when it needs them."""
        return {**self.__dict__, "_fused": None}

    @property
    def layers(self) -> str:
        """How a bf16 pass runs its layers: ``compiled`` (``mulo.fused_layers``), ``autocast``, or
        ``compiled at the first bf16 pass`` (none ran yet); ``float32`` when forced."""
        if self.mode == "float32":
            return "float32"
        if self._fused is not None:
            return "compiled"
        return "compiled at the first bf16 pass" if self.fused else "autocast"

    def compiled_layers(self):
        """The layers a bf16 pass runs (``FusedLayers``, built at the first call), or None: autocast."""
        if not self.fused:
            return None
        if self._fused is None or self._fused.stale:
            with _build_lock:  # (the app's concurrent requests: one compile, the others wait for it)
                if self._fused is None or self._fused.stale:
                    self._fused = fused_layers.build(self.model)
                    self.fused = self._fused is not None
        return self._fused

    def precision(self, batch: int, width: int) -> str:
        """``float32`` or ``bfloat16``: how a pass of ``width`` queries and CFG batch ``batch`` runs
        (measuring its bucket first, in ``auto``, when this machine has not)."""
        compiled = self.model.compiled
        if width < self.min_width or (compiled is not None and width <= compiled.max_queries):
            return "float32"  # a narrow pass (a compiled package's when there is one)
        if self.mode != "auto":
            return self.mode
        bucket = query_bucket(width)
        if (batch, bucket) not in self.chosen:
            self.chosen[(batch, bucket)] = self._stored(batch, bucket) or self._measure(batch, bucket)
        return self.chosen[(batch, bucket)]["precision"]

    def autocast(self, batch: int, width: int):
        """The context a pass runs its layers in: bf16 autocast, or None (float32 as it is)."""
        if self.precision(batch, width) == "bfloat16":
            return torch.autocast("cpu", dtype=torch.bfloat16)
        return None

    def _entry(self, batch: int, bucket: int) -> str:  # (bf16 timed as the passes will run it)
        return f"{self.shape_key}/b{batch}/q{bucket}" + ("/compiled" if self.fused else "")

    def _read(self) -> dict:
        try:
            stored = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return stored.get("passes", {}) if stored.get("machine") == self.machine else {}

    def _stored(self, batch: int, bucket: int) -> dict | None:
        return self._read().get(self._entry(batch, bucket))

    def _measure(self, batch: int, bucket: int) -> dict:
        layers = self.compiled_layers()
        float32_s, bfloat16_s = self.timer(self.model, batch, bucket, *([layers] if layers else []))
        choice = {"float32_s": float32_s, "bfloat16_s": bfloat16_s, "precision": choose(float32_s, bfloat16_s)}
        log.info("wide passes of %d queries, batch %d: %s (%s)", bucket, batch, choice["precision"], choice)
        with _file_lock:  # read, add, replace whole: a reader never sees half a file
            passes = {**self._read(), self._entry(batch, bucket): choice}
            self.path.parent.mkdir(parents=True, exist_ok=True)
            partial = self.path.with_name(f"{self.path.stem}.{os.getpid()}.{threading.get_ident()}.partial")
            partial.write_text(json.dumps({"machine": self.machine, "passes": passes}, indent=1))
            partial.replace(self.path)
        return choice

    def report(self) -> dict:
        """What this model chose so far: ``{"b<batch>/q<bucket>": timings and precision}``."""
        return {f"b{b}/q{q}": dict(choice) for (b, q), choice in sorted(self.chosen.items())}


def attach(models, mode: str = "auto", min_width: int = MIN_WIDTH, timer: Callable = time_layer, fused=None) -> str:
    """Give each GPT in ``models`` a ``WidePasses`` (``auto``: ``MULO_WIDE_PRECISION`` if set, else
    measured) when every one is a float32 model on a CPU; else none (float32, or the model's own
    dtype on an accelerator). ``fused``: ``WidePasses``'. Returns how the wide passes will run."""
    mode = resolve_mode(mode, MODES, "MULO_WIDE_PRECISION", "wide precision")
    models = [m for m in models if m is not None]
    params = [next(m.parameters()) for m in models]
    why = None
    if any(p.device.type != "cpu" for p in params):
        why = "the model's own dtype on an accelerator"
    elif any(p.dtype != torch.float32 for p in params):
        why = "the model's own dtype: not float32"
    on = None if why else machine()
    for model in models:
        model.wide = None if why else WidePasses(model, mode, min_width, timer, on, fused)
    if why:
        return why
    return "measured per width bucket" if mode == "auto" else f"{mode} (forced)"


def summary(models: dict) -> dict:
    """Per named model, its measured choices (bench's environment)."""
    return {name: m.wide.report() for name, m in models.items() if m is not None and m.wide is not None}
