"""Compiled narrow passes (``mulo.compiled``): the eager pass's numbers under any mask, every
method's tokens unchanged, and an eager fallback that the trace names.

A package takes ~20 s to compile on two cores, so the tests share one package cache and the
smallest models that cover each case: the toy family for the crafted masks and the methods (the
same packages), the default family's target for AR alone, a one-layer GPT where nothing compiles.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest
import torch

from mulo import compiled, methods
from mulo.engine import Engine
from mulo.families import load_family, toy
from mulo.models.gpt import GPT, GPTConfig, KVCache, init_random_
from mulo.sampling import graph_knobs, graph_probs, logits_to_probs

pytestmark = pytest.mark.slow  # each package compiles in ~20 s (docs/testing.md)


@pytest.fixture(scope="module", autouse=True)
def package_cache(tmp_path_factory):
    patch = pytest.MonkeyPatch()
    patch.setenv("MULO_COMPILE_CACHE", str(tmp_path_factory.mktemp("compiled")))
    yield
    patch.undo()


def tiny_gpt() -> GPT:
    config = GPTConfig(
        dim=32, n_layer=1, n_head=4, vocab_size=16, max_seq_len=16, cond_len=2, cond_dim=8, multiple_of=32
    )
    return init_random_(GPT(config), seed=7, std=0.3).eval()


def prefilled(model: GPT) -> KVCache:
    """A CFG-batch cache whose condition slots and first six image slots are written."""
    c = model.config
    cache = KVCache(c, 2, "cpu", torch.float32)
    n = c.cond_len + 6
    x = torch.randn(2, n, c.dim, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        model.forward_hidden(x, torch.arange(n), torch.ones(n, n, dtype=torch.bool).tril(), cache)
    return cache


@pytest.mark.parametrize(
    "slots, visible",
    [
        # one query at slot 13 seeing the condition (0-3), slots 5 and 7 (not 4, 6, 8, 9: holes)
        # and itself
        ([13], [[0, 1, 2, 3, 5, 7, 13]]),
        # three queries (run at four, one padding query) at slots 12, 15, 13: the second sees the
        # first's new K/V, the third sees neither new slot but 11 (never written) and 9's old K/V
        ([12, 15, 13], [[0, 1, 2, 3, 6, 12], [0, 1, 2, 3, 8, 12, 15], [0, 1, 2, 3, 9, 11, 13]]),
    ],
)
def test_compiled_pass_matches_eager_under_any_mask(slots, visible):
    # The toy target, whose packages (CFG batch 2; 1 and 4 queries) the method test uses too.
    model = toy.build().target
    mask = torch.zeros(len(slots), 16, dtype=torch.bool)
    for row, seen in enumerate(visible):
        mask[row, seen] = True
    x = torch.randn(2, len(slots), model.config.dim, generator=torch.Generator().manual_seed(2))
    slots = torch.tensor(slots)
    with torch.no_grad():
        eager_cache = prefilled(model)
        want = model.forward_hidden(x, slots, mask, eager_cache)
        assert compiled.attach([model], "on") == "compiled steps"
        cache = prefilled(model)
        got = model.forward_hidden(x, slots, mask, cache)
    assert model.compiled.state(2) == "compiled steps"  # it ran compiled, not eagerly
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(cache.k, eager_cache.k, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(cache.v, eager_cache.v, atol=1e-5, rtol=1e-4)
    assert torch.equal(cache.written, eager_cache.written)


def test_every_method_keeps_its_tokens_when_compiled(caplog):
    """One test over every method: they share the toy models' packages, compiled once. Each
    compile says what it builds, about how long it takes and where packages are kept."""
    family = toy.build()  # its own models: the session's toy family stays eager
    eager = Engine(family, compile="off")
    want = {name: eager.generate("a", name, 3) for name in methods.names()}
    engine = Engine(family, compile="on")
    assert engine.compilation == "compiled steps"
    with caplog.at_level(logging.INFO, logger="mulo.compiled"):
        for name, expected in want.items():
            got = engine.generate("a", name, 3)
            assert "compiled steps" in got.trace.execution, name
            assert torch.equal(got.tokens, expected.tokens), name
            assert got.trace.nfe == expected.trace.nfe, name
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("compiling GPT")]
    assert said and all(f"packages kept in {compiled.cache_dir()}" in line for line in said), said
    assert all(" ~" in line and " s;" in line for line in said)  # about how long


def test_a_rotary_targets_compiled_steps_turn_as_the_eager_ones():
    """A 2D-rotary family (the scenes target's shape: the row above fed, attention turned by cell)
    keeps its tokens compiled: AR's sampled steps, MuLo-SD's island waves and EAGLE-2's tree nodes,
    which sit on scratch slots and turn by their image cells."""
    family = toy.build(neighbour_inputs=3, rotary_2d=True)
    runs = (("ar", {}), ("mulo", {"resampling": "islands", "island_window": 8}), ("eagle2", {}))
    want = [Engine(family, compile="off").generate("red apple", m, 4, dict(k)) for m, k in runs]
    engine = Engine(family, compile="on")
    assert engine.compilation == "compiled steps"
    for (method, knobs), expected in zip(runs, want, strict=True):
        got = engine.generate("red apple", method, 4, dict(knobs))
        assert "compiled steps" in got.trace.execution, method
        assert torch.equal(got.tokens, expected.tokens), method
    # the turn is in the package: the same weights unturned would draw other tokens
    assert not torch.equal(
        want[0].tokens, Engine(toy.build(neighbour_inputs=3), compile="off").generate("red apple", "ar", 4).tokens
    )


def test_cached_mode_runs_what_is_built_and_never_compiles(monkeypatch, tmp_path):
    """The CLI's one-off ``generate``: packages on disk run (their loading not charged to the
    method), missing ones run eagerly with the trace saying so, and nothing is ever compiled."""

    def no_compile(*args):
        raise AssertionError("cached mode compiled a package")

    monkeypatch.setattr(compiled, "_compile", no_compile)
    monkeypatch.setattr(compiled, "CACHED_MIN_TOKENS", 0)  # the toy's grids are below it (test below)
    family = toy.build()
    want = Engine(family, compile="off").generate("a", "ar", 3)
    engine = Engine(family, compile="cached")  # the packages the test above built
    before, started = compiled.setup_seconds(), time.perf_counter()
    got = engine.generate("a", "ar", 3)
    wall, setup = time.perf_counter() - started, compiled.setup_seconds() - before
    assert torch.equal(got.tokens, want.tokens) and got.trace.execution.startswith("compiled steps")
    assert setup > 0 and "loading compiled passes, not counted" in got.trace.execution
    assert got.trace.latency_s <= wall - setup + 1e-3
    assert sum(got.trace.timings_s.values()) <= wall - setup + 1e-3  # no phase charged for it either
    monkeypatch.setenv("MULO_COMPILE_CACHE", str(tmp_path / "empty"))
    cold = Engine(toy.build(), compile="cached").generate("a", "ar", 3)
    assert torch.equal(cold.tokens, want.tokens) and not (tmp_path / "empty").exists()
    assert cold.trace.execution.startswith("eager (not built, run eagerly: ")
    assert "sampled step(s); python -m mulo compile builds them" in cold.trace.execution


def test_cached_mode_leaves_small_grids_eager(monkeypatch):
    """A one-off generate on grids shorter than ``CACHED_MIN_TOKENS`` (the toy's 64 tokens) never
    loads a package, built or not: loading costs more than it saves there; ``on`` still compiles."""
    monkeypatch.setattr(compiled, "unavailable_reason", lambda: None)
    family = toy.build()
    assert max(m.config.max_seq_len for m in family.transformers()) < compiled.CACHED_MIN_TOKENS
    assert (
        compiled.attach(family.transformers(), "cached")
        == "eager (64-token grids decode faster than their packages load)"
    )
    assert all(m.compiled is None for m in family.transformers())
    assert compiled.attach(family.transformers(), "on") == "compiled steps"
    monkeypatch.setattr(compiled, "CACHED_MIN_TOKENS", 64)
    assert compiled.attach(family.transformers(), "cached") == "compiled steps"


def test_build_all_builds_each_missing_package_once(monkeypatch, tmp_path):
    """``python -m mulo compile``: every query bucket and the sampled step per CFG batch, skipping
    what is on disk; a failure leaves that width eager and the rest are built."""
    monkeypatch.setenv("MULO_COMPILE_CACHE", str(tmp_path))
    built = []

    def fake_compile(model, batch, bucket, path):
        if bucket == 64:
            raise RuntimeError("out of memory")
        built.append((batch, bucket))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"package")

    monkeypatch.setattr(compiled, "_compile", fake_compile)
    target = toy.build().target
    assert compiled.build_all([target, None], batches=(1, 2)) == (14, 0)
    assert sorted(built, key=str) == sorted(
        [(b, q) for b in (1, 2) for q in (1, 2, 4, 8, 16, 32, compiled.SAMPLED)], key=str
    )
    assert compiled.build_all([target], batches=(1,)) == (0, 7)  # the 64-query one failed again


def test_the_compile_verb_builds_what_a_default_generate_looks_for(monkeypatch, tmp_path):
    """``python -m mulo compile --family toy`` then ``generate`` (``cached``): no package the
    default request uses is missing (the toy family's guidance comes from the knob table, not its
    defaults, so a verb that read only the family's defaults built batch 1 and generate ran eagerly)."""
    from mulo.__main__ import main

    monkeypatch.setenv("MULO_COMPILE_CACHE", str(tmp_path))

    def fake_compile(model, batch, bucket, path):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"package")  # loading it fails: those passes run eagerly, but none is missing

    monkeypatch.setattr(compiled, "_compile", fake_compile)
    monkeypatch.setattr(compiled, "unavailable_reason", lambda: None)
    monkeypatch.setattr(compiled, "CACHED_MIN_TOKENS", 0)
    assert main(["compile", "--family", "toy"]) == 0
    engine = Engine(toy.build(), compile="cached")
    engine.generate("a", "ar", 3)
    assert all(not m.compiled.missing for m in engine.family.transformers())


def test_a_compile_prints_nothing_but_its_own_lines(tmp_path, capfd, monkeypatch):
    """max_autotune times each product's kernels and writes every timing to stderr (378 lines on a
    cold ``bench --quick``), unless inductor's own cache already holds those shapes' verdicts: so
    its cache is a fresh folder here, and the model a 192-wide one's 2-query pass, whose products
    are tuned (the toy's are too small to be)."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    config = GPTConfig(dim=192, n_layer=1, n_head=4, vocab_size=16, max_seq_len=16, cond_len=2, cond_dim=8)
    model = init_random_(GPT(config), seed=3).eval()
    compiled._compile(model, 1, 2, tmp_path / "step.pt2")
    printed = capfd.readouterr().err
    assert (tmp_path / "step.pt2").exists()
    assert "AUTOTUNE" not in printed and "Autotune" not in printed and "TypedStorage" not in printed, printed[:500]


def test_default_family_ar_keeps_its_tokens_with_every_step_compiled(monkeypatch):
    family = load_family("twemoji")
    want = Engine(family, compile="off").generate("red apple", "ar", 1)
    engine = Engine(family, compile="on")
    engine.generate("red apple", "ar", 0)  # compiles (or loads) the step
    passes = {"compiled": 0, "sampled": 0, "eager": 0}
    run, sampled = compiled.StepCompiler.run, compiled.StepCompiler.sampled

    def counting_run(self, *args):
        hidden = run(self, *args)
        passes["eager" if hidden is None else "compiled"] += 1
        return hidden

    def counting_sampled(self, *args):
        out = sampled(self, *args)
        passes["eager" if out is None else "sampled"] += 1
        return out

    monkeypatch.setattr(compiled.StepCompiler, "run", counting_run)
    monkeypatch.setattr(compiled.StepCompiler, "sampled", counting_sampled)
    got = engine.generate("red apple", "ar", 1)
    assert got.trace.execution == "compiled steps"
    assert torch.equal(got.tokens, want.tokens)
    # Every narrow pass of the image went through a compiled package, none fell back to eager
    # (a speed claim is the bench's: a timed test flaked under CI load): the prompt's pass, then
    # one sampled step per fed token (every token but the first, which the prompt's pass gives).
    assert passes == {"compiled": 1, "sampled": got.tokens.numel() - 1, "eager": 0}, passes


def test_graph_probs_is_the_eager_sampling_distribution_bit_for_bit():
    """The sampled step's distribution (knobs as tensors, no branches) against ``logits_to_probs``
    on crafted logits: ties at the top-k and top-p cuts, -inf entries, every knob's edge values."""
    generator = torch.Generator().manual_seed(0)
    rows = torch.randn(40, 32, generator=generator) * 3
    rows[1, :4] = rows[1, 4]  # a tie across the top-k cut
    rows[2] = 0.0  # all equal: top-p keeps the first of the ties
    rows[3, 10:] = float("-inf")
    for logits in rows[:, None]:
        for temperature in (1.0, 0.5, 1.7):
            for top_k in (0, 1, 5, 32, 40):
                for top_p in (1.0, 0.95, 0.5, 0.0):
                    knobs, k = graph_knobs(1.0, temperature, top_k, top_p, 32)
                    want = logits_to_probs(logits, temperature, top_k, top_p)
                    got = graph_probs(logits, knobs[1], k, knobs[2])
                    assert torch.equal(got, want), (temperature, top_k, top_p)


def test_a_sampled_step_draws_as_multinomial_and_falls_back_without_moving_the_generator(monkeypatch):
    """Every package replaced by its module run eagerly (no compiler): the plumbing alone. The
    methods whose steps are sampled in one call keep their tokens and the generator its stream; a
    sampled step without its package leaves the generator where multinomial would find it."""
    family = toy.build()
    want = {name: Engine(family, compile="off").generate("a", name, 5) for name in ("ar", "sd", "mulo")}

    sampled_steps = []

    def eager_module(self, batch, bucket):
        module = (compiled._SampledStep if bucket == compiled.SAMPLED else compiled._Step)(self.model).eval()
        sampled_steps.extend([self.model] if bucket == compiled.SAMPLED else [])
        return lambda inputs: list(module(*inputs))

    monkeypatch.setattr(compiled.StepCompiler, "_package", eager_module)
    engine = Engine(family, compile="on")
    config = {"drafting": "sequential"}  # MuLo-SD's drafter then steps one token at a time, sampled
    for name, expected in want.items():
        got = engine.generate("a", name, 5, config if name == "mulo" else None)
        if name == "mulo":
            expected = Engine(family, compile="off").generate("a", name, 5, config)
        assert torch.equal(got.tokens, expected.tokens), name
        assert got.trace.nfe == expected.trace.nfe, name
    # AR's and MuLo-SD's targets, SD's draft model and MuLo-SD's drafter took sampled steps
    assert {id(m) for m in sampled_steps} == {id(m) for m in (family.target, family.draft_model, family.drafters[2])}
    monkeypatch.setattr(compiled.StepCompiler, "_package", lambda self, batch, bucket: None)
    assert torch.equal(Engine(family, compile="on").generate("a", "ar", 5).tokens, want["ar"].tokens)


def test_a_failed_compile_falls_back_to_eager_and_says_why(monkeypatch, tmp_path):
    monkeypatch.setenv("MULO_COMPILE_CACHE", str(tmp_path))  # no package from the other tests

    def no_compiler(*args):
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(compiled, "_compile", no_compiler)
    family = toy.build()
    want = Engine(family, compile="off").generate("a", "ar", 0)
    got = Engine(family, compile="on").generate("a", "ar", 0)
    # the failed attempt's few milliseconds may be named after it, as setup time not counted
    fallback, *setup = got.trace.execution.split("; ")
    assert fallback == "eager (fallback: compile failed (RuntimeError: no compiler here))"
    assert all(part.endswith("building/loading compiled passes, not counted") for part in setup)
    assert torch.equal(got.tokens, want.tokens)


def test_background_compiles_run_eagerly_meanwhile_and_report_failures(monkeypatch):
    started = []

    def slow_failure(*args):
        started.append(args[1:3])
        time.sleep(0.2)
        raise RuntimeError("compiler crashed")

    monkeypatch.setattr(compiled, "_compile", slow_failure)
    model = tiny_gpt()
    compiled.attach([model], "on", background=True)
    x = torch.randn(1, 1, model.config.dim)
    with torch.no_grad():
        hidden = model.forward_hidden(
            x, torch.tensor([2]), torch.ones(1, 3, dtype=torch.bool), KVCache(model.config, 1, "cpu", torch.float32)
        )
    assert hidden.shape == (1, 1, model.config.dim)  # the eager pass answered at once
    assert model.compiled.state(1).startswith("compiled steps (eager while 1 pass width(s) compile)")
    deadline = time.monotonic() + 10
    while model.compiled.pending and time.monotonic() < deadline:
        time.sleep(0.05)
    assert started == [(1, 1)]
    assert model.compiled.state(1) == "eager (fallback: compile failed (RuntimeError: compiler crashed))"
    # the compiling thread ends with its last job (a thread kept alive keeps its OpenMP team, and
    # two teams throttle every later pass: mulo/ui/torch_thread.py)
    while any(t.name == "mulo-compile" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(t.name == "mulo-compile" for t in threading.enumerate())


def test_a_background_compile_leaves_the_models_eager_passes_alone(monkeypatch, tmp_path):
    """The app compiles in the background while the same model serves eager passes: tracing must
    not reach the model those passes run on (export swaps a module's weights for fake tensors)."""
    monkeypatch.setenv("MULO_COMPILE_CACHE", str(tmp_path))  # nothing cached: a real compile runs
    model = tiny_gpt()
    x = torch.randn(2, 1, model.config.dim, generator=torch.Generator().manual_seed(3))
    mask = torch.zeros(1, 16, dtype=torch.bool)
    mask[0, [0, 1, 2, 3, 9]] = True

    def one_pass():
        with torch.no_grad():
            return model.forward_hidden(x, torch.tensor([9]), mask, prefilled(model))

    want = one_pass()
    compiled.attach([model], "on", background=True)
    first = one_pass()  # eager: starts the compile of the one-query package
    assert model.compiled.pending
    passes, deadline = 0, time.monotonic() + 300
    while model.compiled.pending and time.monotonic() < deadline:
        torch.testing.assert_close(one_pass(), want)  # eager passes all along the compile
        passes += 1
    assert passes > 0 and not model.compiled.pending and not model.compiled.failures
    torch.testing.assert_close(first, want)
    torch.testing.assert_close(one_pass(), want, atol=1e-5, rtol=1e-4)  # now compiled
    assert model.compiled.state(2) == "compiled steps"


def test_small_models_compile_single_threaded_under_their_own_cache_key(monkeypatch):
    model = tiny_gpt()
    small_key = compiled._key(model)
    assert compiled.inductor_options(model)["cpp.threads"] == 1  # a few KB: no OpenMP team to wake
    monkeypatch.setattr(compiled, "SINGLE_THREAD_BELOW_BYTES", 0)  # as if it were large
    assert "cpp.threads" not in compiled.inductor_options(model)
    assert compiled._key(model) != small_key  # a package never serves the other threading


def test_attach_says_why_passes_stay_eager(monkeypatch):
    model = tiny_gpt()
    assert compiled.attach([model], "off") == "eager (compiling switched off)"
    assert model.compiled is None
    monkeypatch.setenv("MULO_COMPILE", "off")
    assert compiled.attach([model], "auto") == "eager (compiling switched off)"
    monkeypatch.setenv("MULO_COMPILE", "sometimes")
    with pytest.raises(ValueError, match="MULO_COMPILE must be one of"):
        compiled.attach([model], "auto")
    with pytest.raises(ValueError, match="compile must be one of"):
        compiled.attach([model], "always")
    assert compiled.attach([model.to(torch.bfloat16)], "on") == "eager (compiled steps are float32 only)"
