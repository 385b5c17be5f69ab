"""A GPT's narrow passes compiled ahead of time for the CPU (AOTInductor), eager as the fallback.

Why: on a CPU a single-token step is a chain of matrix-vector products over weights that do not
stay in cache, and the BLAS behind ``F.linear`` streams such a skinny product at a fraction of
the machine's bandwidth (``docs/cpu-engine.md``). Inductor's C++ micro-GEMM template, with the
weights frozen and pre-packed, streams them several times faster; it runs under ``max_autotune``,
which times it against the BLAS for each product shape and keeps the faster (so kernels are
picked by timing, as the BLAS picks its own by CPU; the tests hold the tokens to the eager ones).

What is compiled: the whole pass of all layers for a few queries (1 to ``MAX_QUERIES``: AR's and
every chain's steps, ZipAR's waves, MuLo-SD's islands), one package per CFG batch size and query
bucket, exported with the key count and the cache's size as dynamic dimensions, so a package
serves every pass of that width in every request. Attention reads the cache as it stands (the
slots a query may see, the pass's own excluded: the cache does not hold their new K/V yet) and
the pass's own K/V, which the package returns and the caller writes to the cache afterwards.
Wider passes (a verification over the whole grid) stay eager: their products are matrix-matrix,
where the BLAS is near its rate.

A single-token step that is sampled at once (AR's, a drafter's chain, MuLo-SD's target steps) has
a second package, the *sampled step*: the token's embedding, the layers, the output head, CFG, the
sampling distribution (temperature, top-k, top-p, as tensors: one package serves every request)
and the draw itself. ``torch.multinomial`` draws one token as the arg-max of ``p / e`` for ``e``
exponential noise from the request's generator; the caller draws that noise with the same
generator call, so the generator moves exactly as the eager path moves it. Around a step of a
small model, eager sampling cost as much as the model (~100 small operations): here it is one call.

Packages are cached on disk by a hash of the weights, shapes, torch version and options
(``MULO_COMPILE_CACHE``, default ``~/.cache/mulo/compiled``): a package compiles in ~20 s on two
cores and loads in a fraction of a second. Each compile says what it builds, about how long it
takes and where packages are kept (logger ``mulo.compiled``, INFO: the CLI and the app show it).
The time spent building and loading packages is kept per thread (``setup_seconds``): the engine
charges it to no method. ``cached`` mode (the CLI's one-off ``generate``) uses the packages on
disk and runs the passes that have none eagerly, never compiling: ``python -m mulo compile``
builds them ahead (``build_all``). The compiled pass's numbers differ from eager ones by float32
rounding (~1e-5); the tests check that every method's tokens for a seed are the same.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import math
import os
import shutil
import threading
import time
import warnings
from collections import deque
from pathlib import Path

import torch
from torch import nn

from mulo.config import COMPILE_MODES, resolve_mode
from mulo.models.gpt import embed_inputs, rotate
from mulo.runner import query_bucket
from mulo.sampling import graph_knobs, graph_probs

log = logging.getLogger(__name__)

# ``cached`` mode (a one-off generate) leaves a family whose grids all hold fewer tokens than this
# eager: loading the packages (torch's compiler runtime, then each package) costs more than they
# save over so few steps (measured: docs/cpu-engine.md's start-up section).
CACHED_MIN_TOKENS = 256
MAX_QUERIES = 64  # wider passes run eagerly: their products are matrix-matrix, where the BLAS is fast
INDUCTOR_OPTIONS = {"freezing": True, "max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN"}
# max_autotune writes each GEMM's timings to stderr (378 lines on a cold ``bench --quick``) and one
# of its kernels a deprecation warning: a first run would bury the compile lines under them. Only
# what is printed changes, so they stay out of the package's cache key (``_key``)
QUIET_AUTOTUNE = {"autotune_num_choices_displayed": 0, "max_autotune_report_choices_stats": False}
warnings.filterwarnings("ignore", message="TypedStorage is deprecated", category=UserWarning)
# A small model's kernels are too short to pay for waking an OpenMP team: compiled single-threaded,
# twemoji's draft model (1.3 MB) steps in 0.19 ms instead of 0.35; the 13 MB target is faster on two
# threads (1.04 ms against 1.17), measured in one run (docs/cpu-engine.md)
SINGLE_THREAD_BELOW_BYTES = 4 << 20


def inductor_options(model) -> dict:
    """The compile options for ``model``: ``INDUCTOR_OPTIONS``, single-threaded when it is small."""
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    return {**INDUCTOR_OPTIONS, **({"cpp.threads": 1} if size < SINGLE_THREAD_BELOW_BYTES else {})}


# About how long one package takes to build on two cores, until this process has timed one.
FIRST_ESTIMATE_S = 20.0
_built_seconds: list[float] = []
_setup = threading.local()


def setup_seconds() -> float:
    """Seconds this thread has spent building and loading packages (the engine subtracts them from
    a method's time: a request is never charged for a compiler)."""
    return getattr(_setup, "seconds", 0.0)


def _add_setup(seconds: float) -> None:
    _setup.seconds = setup_seconds() + seconds


def estimate_s() -> float:
    """About how long the next package takes: the mean of those built in this process, else 20 s."""
    return sum(_built_seconds) / len(_built_seconds) if _built_seconds else FIRST_ESTIMATE_S


def shapes_not_built(models) -> tuple[int, bool]:
    """Over ``models``' compilers (``cached`` mode): how many pass shapes ran eagerly because their
    packages were not built, and whether any pass ran compiled."""
    compilers = [m.compiled for m in models if m.compiled is not None]
    return sum(len(c.missing) for c in compilers), any(c.runs for c in compilers)


def cache_dir() -> Path:
    return Path(os.environ.get("MULO_COMPILE_CACHE", Path.home() / ".cache" / "mulo" / "compiled"))


def unavailable_reason() -> str | None:
    """Why this process cannot compile (None if it can): AOTInductor's CPU backend needs a C++
    compiler."""
    if shutil.which(os.environ.get("CXX", "c++")) is None and shutil.which("g++") is None:
        return "no C++ compiler on PATH"
    return None


class _Step(nn.Module):
    """All of a GPT's layers for a few queries; see the module docstring."""

    def __init__(self, model):
        super().__init__()
        self.layers, self.norm, self.config = model.layers, model.norm, model.config
        # a 2D-rotary model's turns by position slot (frozen into the package like the weights)
        self.register_buffer("rotary", model.rotary, persistent=False)

    def forward(self, h, cached_mask, new_mask, k_cache, v_cache, positions=None):
        """``h [B, Q, dim]`` (embedded inputs plus positions); ``cached_mask [Q, S]``: the cache
        slots each query sees, the pass's own slots excluded (the cache does not hold their new
        K/V yet); ``new_mask [Q, Q]``: the pass's queries each one sees (itself included);
        ``k_cache``/``v_cache [L, B, heads, n_slots, head_dim]``; ``positions [Q]``: a 2D-rotary
        model's position slots, by which queries and keys turn (cached keys are stored turned).
        Returns ``(normalised hidden [B, Q, dim], k [L, B, heads, Q, head_dim], v)``: the pass's
        K/V for the caller to write."""
        c = self.config
        turns = None if positions is None else self.rotary[:, positions]
        b, q_len, _ = h.shape
        width = cached_mask.shape[1]
        bias_cached = torch.where(cached_mask, 0.0, float("-inf"))
        bias_new = torch.where(new_mask, 0.0, float("-inf"))
        scale = 1.0 / math.sqrt(c.head_dim)
        new_k, new_v = [], []
        for i, layer in enumerate(self.layers):
            qkv = layer.attention.wqkv(layer.attention_norm(h)).view(b, q_len, 3, c.n_head, c.head_dim)
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each [B, heads, Q, head_dim]
            if turns is not None:
                q, k = rotate(q, turns[0]), rotate(k, turns[1])
            keys, values = k_cache[i, :, :, :width], v_cache[i, :, :, :width]
            cached = torch.matmul(q, keys.transpose(-1, -2)) * scale + bias_cached
            own = torch.matmul(q, k.transpose(-1, -2)) * scale + bias_new
            weights = torch.softmax(torch.cat([cached, own], dim=-1), dim=-1)
            out = torch.matmul(weights[..., :width], values) + torch.matmul(weights[..., width:], v)
            h = h + layer.attention.wo(out.transpose(1, 2).reshape(b, q_len, c.dim))
            h = h + layer.feed_forward(layer.ffn_norm(h))
            new_k.append(k)
            new_v.append(v)
        return self.norm(h), torch.stack(new_k), torch.stack(new_v)


class _SampledStep(nn.Module):
    """One token fed and the next one sampled, in one package; see the module docstring."""

    def __init__(self, model):
        super().__init__()
        self.step = _Step(model)
        self.tok_embeddings, self.abs_pe, self.output = model.tok_embeddings, model.abs_pe, model.output
        self.neighbour_embeddings = model.neighbour_embeddings

    def forward(self, token, pe_slot, cached_mask, k_cache, v_cache, noise, knobs, top_k, *extras):
        """``token``, ``pe_slot [1]`` int64; ``cached_mask [1, S]`` (the query's own slot excluded);
        the cache as ``_Step``'s; ``noise [1, V]`` exponential; ``knobs``, ``top_k`` from
        ``graph_knobs``; ``extras``: a neighbour-input model's row-above ids ``[1, 3]``, then a
        column-object model's position input at the slot ``[B, 1, dim]``. Returns
        ``(hidden [B, 1, dim], probs [1, V], token [1], k, v)``."""
        batch = k_cache.shape[1]
        extras = list(extras)
        neighbours = extras.pop(0) if self.neighbour_embeddings is not None else None
        embedded = embed_inputs(self.tok_embeddings, self.neighbour_embeddings, token, neighbours)
        h = embedded[None].expand(batch, -1, -1) + self.abs_pe[0, pe_slot]
        if extras:
            h = h + extras.pop(0)
        positions = pe_slot if self.step.config.rotary_2d else None
        hidden, k, v = self.step(h, cached_mask, cached_mask.new_ones(1, 1), k_cache, v_cache, positions)
        logits = self.output(hidden).float()[:, 0]
        if batch == 2:  # classifier-free guidance, as mulo.sampling.cfg_combine
            logits = logits[1:] + knobs[0] * (logits[:1] - logits[1:])
        probs = graph_probs(logits, knobs[1], top_k, knobs[2])
        return hidden, probs, (probs / noise).argmax(-1), k, v


def _key(model) -> str:
    """The disk cache's name for a model: its weights, shapes, torch and the compile options."""
    digest = hashlib.sha256()
    digest.update(repr((model.config, torch.__version__, inductor_options(model))).encode())
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().contiguous().cpu().numpy().tobytes())
    return digest.hexdigest()[:24]


SAMPLED = "sampled"  # the width of the sampled single-token step's package


@torch.no_grad()
def _compile(model, batch: int, bucket: int | str, path: Path) -> None:
    """Export ``_Step`` for ``batch`` x ``bucket`` queries, or ``_SampledStep`` (``bucket`` is
    ``SAMPLED``), the key count and the cache's slot count dynamic, and compile it into the
    package at ``path``."""
    # Export a copy: tracing swaps the module's weights for fake tensors while it runs, and the
    # model itself keeps serving eager passes meanwhile (a background compile in the app); not its
    # wide passes' state (a lock, compiled bf16 layers), which a narrow step never uses
    model = copy.deepcopy(model, memo={id(model.compiled): None, id(getattr(model, "wide", None)): None})
    c = model.config
    n_slots = c.n_positions
    width = 1 if bucket == SAMPLED else bucket
    cached_mask = torch.ones(width, n_slots - 1, dtype=torch.bool)
    cache = torch.zeros(c.n_layer, batch, c.n_head, n_slots, c.head_dim)
    slots = torch.export.Dim("slots", min=4, max=1 << 20)
    keys = torch.export.Dim("keys", min=2, max=1 << 20)
    if bucket == SAMPLED:
        knobs, top_k = graph_knobs(2.0, 1.0, 0, 0.9, c.vocab_size)
        token, pe_slot = (
            torch.zeros(1, dtype=torch.long),
            torch.zeros(1, dtype=torch.long),
        )  # distinct: export ties aliases
        noise = torch.ones(1, c.vocab_size)
        extras = []  # ``_SampledStep.forward``'s: the row above's ids, the column input
        if c.neighbour_inputs:
            extras.append(torch.full((1, c.neighbour_inputs), c.vocab_size))
        if c.column_objects:
            extras.append(torch.zeros(batch, 1, c.dim))
        module = _SampledStep(model)
        inputs = (token, pe_slot, cached_mask, cache, cache.clone(), noise, knobs, top_k, *extras)
        dynamic = ({}, {}, {1: keys}, {3: slots}, {3: slots}, {}, {}, {})
        if extras:  # the variable arguments' shapes: one tuple, as export groups them
            dynamic = (*dynamic, tuple({} for _ in extras))
    else:
        new_mask = torch.ones(width, width, dtype=torch.bool).tril()
        module, inputs = _Step(model), (torch.zeros(batch, width, c.dim), cached_mask, new_mask, cache, cache.clone())
        dynamic = ({}, {1: keys}, {}, {3: slots}, {3: slots})
        if c.rotary_2d:
            inputs, dynamic = (*inputs, torch.zeros(width, dtype=torch.long)), (*dynamic, {})
    what = f"{type(model).__name__} {model.config.dim}x{model.config.n_layer}'s {bucket}-query pass (batch {batch})"
    log.info("compiling %s, ~%.0f s; packages kept in %s", what, estimate_s(), path.parent)
    began = time.perf_counter()
    program = torch.export.export(module.eval(), inputs, dynamic_shapes=dynamic)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.stem}.{threading.get_ident()}.partial.pt2")
    torch._inductor.aoti_compile_and_package(
        program, package_path=str(partial), inductor_configs={**inductor_options(model), **QUIET_AUTOTUNE}
    )
    partial.replace(path)  # a package is either whole or absent, whatever interrupts a compile
    _built_seconds.append(time.perf_counter() - began)
    log.info("compiled %s in %.0f s: %s", what, _built_seconds[-1], path.name)


def _first_line(exc: Exception) -> str:
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]}"


class _BackgroundCompiles:
    """Compiles one at a time on a thread that ends once none is left. A thread that lived on
    (a thread pool's) would keep the OpenMP team that autotuning gave it, and with two teams in
    the process every later pass runs with throttled OpenMP workers (``mulo/ui/torch_thread.py``
    says why: a step several times slower)."""

    def __init__(self):
        self.jobs: deque = deque()
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None

    def submit(self, fn, *args) -> None:
        with self.lock:
            self.jobs.append((fn, args))
            if self.thread is None:
                self.thread = threading.Thread(target=self._drain, name="mulo-compile", daemon=True)
                self.thread.start()

    def _drain(self) -> None:
        while True:
            with self.lock:
                if not self.jobs:
                    self.thread = None
                    return
                fn, args = self.jobs.popleft()
            fn(*args)  # _compile_quietly: keeps its own failures


_background = _BackgroundCompiles()


class StepCompiler:
    """A model's compiled passes: one package per (CFG batch size, query bucket), compiled at its
    first use or loaded from the disk cache. A pass of ``Q <= MAX_QUERIES`` queries runs in the
    next power of two, padded with zero queries that see only themselves and that no real query
    sees (their outputs are dropped). ``background``: a missing package is compiled on a worker
    thread while passes run eagerly (the app: visitors never wait on a compiler); otherwise at
    once (the bench). ``build=False`` (``cached`` mode): a missing package is not built, its passes
    run eagerly (``missing`` says which). A failure leaves that package's passes eager, reason kept."""

    max_queries = MAX_QUERIES

    def __init__(self, model, background: bool = False, build: bool = True):
        self.model, self.background, self.build = model, background, build
        self.key = _key(model)
        self.runs: dict[tuple[int, int], object] = {}
        self.pending: set[tuple[int, int]] = set()
        self.failures: dict[tuple[int, int], str] = {}
        self.missing: set[tuple[int, int | str]] = set()  # not built, not to be built here (cached mode)
        self._lock = threading.Lock()

    def path(self, batch: int, bucket: int | str) -> Path:
        name = SAMPLED if bucket == SAMPLED else f"q{bucket}"
        return cache_dir() / f"step-{self.key}-b{batch}-{name}.pt2"

    def _package(self, batch: int, bucket: int | str):
        """The loaded package as a function of a list of tensors returning a list (the loader's
        boxed call: no pytree work per pass), or None (failed, or compiling in the background)."""
        shape = (batch, bucket)
        if shape in self.runs:
            return self.runs[shape]
        if shape in self.failures or shape in self.missing:
            return None
        path = self.path(batch, bucket)
        on_disk = path.exists()
        if not on_disk:
            if not self.build:
                self.missing.add(shape)
                return None
            if self.background:
                with self._lock:
                    if shape not in self.pending:
                        self.pending.add(shape)
                        _background.submit(self._compile_quietly, shape, path)
                return None
        began = time.perf_counter()
        try:
            if not on_disk:
                _compile(self.model, batch, bucket, path)
            self.runs[shape] = torch._inductor.aoti_load_package(str(path)).loader.boxed_run
        except Exception as exc:  # export, compiler or loader: eager for this shape
            self._fail(shape, exc)
            return None
        finally:
            _add_setup(time.perf_counter() - began)
        return self.runs[shape]

    def _compile_quietly(self, shape, path) -> None:
        try:
            _compile(self.model, *shape, path)
        except Exception as exc:
            self._fail(shape, exc)
        finally:
            with self._lock:
                self.pending.discard(shape)

    def _fail(self, shape, exc: Exception) -> None:
        self.failures[shape] = f"compile failed ({_first_line(exc)})"
        log.warning("passes of batch %d, %s queries stay eager: %s", *shape, self.failures[shape])

    def run(self, h, mask, cache, slots, positions=None):
        """The pass of queries ``h [B, Q, dim]`` at cache ``slots [Q]`` under ``mask [Q, S]`` (already
        limited to written slots, the pass's own included), a 2D-rotary model's queries turned by
        their ``positions [Q]`` (default ``slots``; a draft-tree node sits on a scratch slot):
        writes their K/V and returns the hidden state ``[B, Q, dim]``; None when it has no package
        (the caller runs it eagerly)."""
        q_len = h.shape[1]
        bucket = query_bucket(q_len)
        run = self._package(h.shape[0], bucket)
        if run is None:
            return None
        if q_len == 1:  # a step: the query sees itself and what the mask says, no index tensors
            slot = int(slots[0])
            cached_mask = mask.clone()
            cached_mask[0, slot] = False
            new_mask = cached_mask.new_ones(1, 1)
        else:
            new_mask = mask[:, slots]
            cached_mask = mask.clone()
            cached_mask[:, slots] = False
        if bucket > q_len:
            pad = bucket - q_len
            h = torch.cat([h, h.new_zeros(h.shape[0], pad, h.shape[2])], dim=1)
            cached_mask = torch.cat([cached_mask, cached_mask.new_zeros(pad, cached_mask.shape[1])])
            square = torch.eye(bucket, dtype=torch.bool)
            square[:q_len, :q_len] = new_mask
            new_mask = square
        inputs = [h, cached_mask, new_mask, cache.k, cache.v]
        if self.model.config.rotary_2d:  # padded queries turn by slot 0's angles: they see only themselves
            turned_at = torch.as_tensor(slots if positions is None else positions, dtype=torch.long).reshape(-1)
            inputs.append(torch.cat([turned_at, turned_at.new_zeros(bucket - q_len)]))
        hidden, k, v = run(inputs)
        if q_len == 1:
            cache.k[:, :, :, slot] = k[:, :, :, 0]
            cache.v[:, :, :, slot] = v[:, :, :, 0]
        else:
            cache.k[:, :, :, slots] = k[:, :, :, :q_len]
            cache.v[:, :, :, slots] = v[:, :, :, :q_len]
        return hidden[:, :q_len]

    def sampled(self, token: int, slot: int, cache, knobs, generator, neighbours=None):
        """The sampled step: ``token`` fed at cache ``slot`` (its position embedding's too; with its
        ``neighbours [1, 3]`` for a neighbour-input model), seeing every slot before it, its K/V
        written; returns ``(hidden [B, 1, dim], probs [1, V], next token [1])``, drawn with
        ``generator`` as ``torch.multinomial`` draws (noise ``[1, V]``), or None without a package
        (the caller samples eagerly; the generator has not moved)."""
        run = self._package(cache.k.shape[1], SAMPLED)
        if run is None:
            return None
        noise = torch.empty(1, self.model.config.vocab_size).exponential_(generator=generator)
        cache.written[slot] = True
        seen = torch.ones(1, slot, dtype=torch.bool)
        inputs = [torch.tensor([token]), torch.tensor([slot]), seen, cache.k, cache.v, noise, *knobs]
        if neighbours is not None:
            inputs.append(neighbours)
        if cache.position_inputs is not None:
            inputs.append(cache.position_inputs[:, slot : slot + 1].contiguous())  # the package assumes dense inputs
        hidden, probs, drawn, k, v = run(inputs)
        cache.k[:, :, :, slot] = k[:, :, :, 0]
        cache.v[:, :, :, slot] = v[:, :, :, 0]
        return hidden, probs, drawn

    def state(self, batch: int) -> str:
        """How this model's narrow passes of ``batch`` run (a trace's ``execution``)."""
        failed = [why for (b, _), why in self.failures.items() if b == batch]
        if failed:
            return f"eager (fallback: {failed[0]})"
        compiling = sum(1 for b, _ in self.pending if b == batch)
        if compiling:
            return f"compiled steps (eager while {compiling} pass width(s) compile)"
        missing = sorted(q for b, q in self.missing if b == batch and q != SAMPLED)
        missing = [f"{q}-query" for q in missing] + (["sampled"] if (batch, SAMPLED) in self.missing else [])
        ran = any(b == batch for b, _ in self.runs)
        if missing:
            eager = f"not built, run eagerly: {', '.join(missing)} step(s); python -m mulo compile builds them"
            return f"compiled steps ({eager})" if ran else f"eager ({eager})"
        return "compiled steps" if ran else "eager"


def attach(models, mode: str = "auto", background: bool = False) -> str:
    """Give each GPT in ``models`` a ``StepCompiler`` (``on``; ``auto``: when every one is a float32
    model on a CPU, a C++ compiler is present and ``MULO_COMPILE`` is not ``off``; ``cached``: the
    same, using only packages already on disk), or take it away (``off``). Returns how the steps
    will run: ``compiled steps`` or ``eager (why)``."""
    mode = resolve_mode(mode, COMPILE_MODES, "MULO_COMPILE", "compile")
    models = [m for m in models if m is not None]
    why = None
    if mode == "off":
        why = "compiling switched off"
    else:
        params = [next(m.parameters()) for m in models]
        if any(p.device.type != "cpu" for p in params):
            why = "compiled steps are for the CPU (an accelerator replays CUDA graphs)"
        elif any(p.dtype != torch.float32 for p in params):
            why = "compiled steps are float32 only"
        elif any(m.config.kv_heads != m.config.n_head for m in models):
            why = "compiled steps do not group query heads"
        else:
            why = unavailable_reason()
    longest = max((m.config.max_seq_len for m in models), default=0)
    if why is None and mode == "cached" and longest < CACHED_MIN_TOKENS:
        why = f"{longest}-token grids decode faster than their packages load"
    for model in models:
        model.compiled = None if why else StepCompiler(model, background, build=mode != "cached")
    return f"eager ({why})" if why else "compiled steps"


def build_all(models, batches=(1, 2)) -> tuple[int, int]:
    """Build every package the ``models`` may use (each query bucket and the sampled step, for each
    CFG batch size in ``batches``) that is not on disk yet, one at a time, each said as it starts
    (``python -m mulo compile``; the Dockerfile runs it at build time). Returns (built, already
    there); a failure is logged and that package's passes stay eager, as at run time."""
    buckets = [1 << i for i in range(MAX_QUERIES.bit_length())] + [SAMPLED]
    built = present = 0
    for model in (m for m in models if m is not None):
        compiler = StepCompiler(model)
        for batch in batches:
            for bucket in buckets:
                if compiler.path(batch, bucket).exists():
                    present += 1
                    continue
                try:
                    _compile(model, batch, bucket, compiler.path(batch, bucket))
                    built += 1
                except Exception as exc:  # as at run time: that width stays eager
                    compiler._fail((batch, bucket), exc)
    return built, present
