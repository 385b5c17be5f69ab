"""Wide passes in bfloat16 (``mulo.wide``): what the rounding moves, and the measured choice.

The toy family's passes never exceed 64 queries, so its models get ``min_width`` 2 or 17 here: every
pass of at least that many queries runs in bf16 when forced. The toy's random weights give larger
logits than a trained model's, so its bf16 differences are an upper end (docs/cpu-engine.md
measures the default family's). Bounds, with what was measured on this repository's CPU:

    verification draws moved (same context, same noise)   21 of 512 (4.1 %)   bound 8 %
    mean total-variation distance per position             0.024               bound 0.05
    MuLo-SD round 0: decisions (p >= tau) changed          1 of 512 drafts     bound 2 %
    MuLo-SD round 0: mean |pooled p (bf16) - p (fp32)|     0.0022              bound 0.01

End to end the differences cascade: once one draw moves, every later token is drawn in another
context, so a seed's image either matches the float32 one or differs from the first moved draw on.
"""

from __future__ import annotations

import copy

import pytest
import torch

from mulo import wide
from mulo.engine import Engine
from mulo.families import toy
from mulo.models.gpt import GPT, KVCache, causal_offset
from mulo.runner import ModelRunner
from mulo.sampling import sample
from mulo.tracefile import load_trace, parse

SEEDS = range(8)


@pytest.fixture(scope="module")
def family():
    """A toy family of this module's own: its models get ``wide`` objects the other tests must not see."""
    fam = toy.build()
    yield fam
    wide.attach(models_of(fam), "float32")


@pytest.fixture(scope="module")
def engine(family):
    return Engine(family, compile="off", wide_precision="float32")


@pytest.fixture(autouse=True)
def package_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MULO_COMPILE_CACHE", str(tmp_path))  # where measured choices are kept


def models_of(fam) -> list[GPT]:
    return [fam.target, *fam.drafters.values(), fam.draft_model]


def verification_draws(fam, engine, seq, seed, precision, fused=False):
    """One causal target pass over ``seq`` (and the prefill) in ``precision``, every position
    drawn with the seed's noise: ``(probs [n, V], tokens [n], the runner's passes by precision)``.
    ``fused``: bf16 passes run compiled layers (``mulo.fused_layers``), else autocast."""
    wide.attach(models_of(fam), precision, min_width=2, fused=fused)
    c = engine.make_config(None)
    runner = ModelRunner(fam.target, fam.condition("red apple", seed), c.guidance, c.temperature, c.top_k, c.top_p)
    runner.prefill()
    probs = runner.span_probs(seq, 0, len(seq))
    return probs, sample(probs, torch.Generator().manual_seed(seed)), runner.precisions


def test_bf16_verification_moves_few_draws(family, engine):
    """The same verification over the float32 path's tokens, each position drawn with the same noise
    in both precisions: bf16 rounding moves a draw only where two codes nearly tie."""
    moved, distance = [], []
    for seed in SEEDS:
        wide.attach(models_of(family), "float32")
        seq = engine.generate("red apple", "ar", seed).tokens.reshape(-1)
        p32, draws32, passes32 = verification_draws(family, engine, seq, seed, "float32")
        p16, draws16, passes16 = verification_draws(family, engine, seq, seed, "bfloat16")
        assert passes32 == {"float32": 2} and passes16 == {"bfloat16": 2}  # the prefill and the pass
        moved.append((draws32 != draws16).float().mean())
        distance.append(0.5 * (p32 - p16).abs().sum(-1).mean())
    moved, distance = float(torch.stack(moved).mean()), float(torch.stack(distance).mean())
    assert 0 < distance < 0.05, distance  # > 0: the bf16 pass did run
    assert moved < 0.08, moved


def test_mulo_acceptance_is_compared_between_precisions(family, engine):
    """MuLo-SD over the whole toy grid in one block: the drafter's passes (at most 16 queries) stay
    float32, so round 0 verifies the same drafts in both precisions; its decisions p >= tau agree
    but for drafts whose pooled p is within bf16 rounding of tau."""
    knobs = {"rows_per_block": 4}
    changed, drafts, scores = 0, 0, []
    for seed in SEEDS:
        wide.attach(models_of(family), "float32")
        a = engine.generate("red apple", "mulo", seed, knobs).trace
        wide.attach(models_of(family), "bfloat16", min_width=17)
        b = engine.generate("red apple", "mulo", seed, knobs).trace
        assert b.precision["target"]["bfloat16"] >= 1 and "bfloat16" not in b.precision["drafter"]
        r32, r16 = a.rounds[0], b.rounds[0]
        assert (r32.draft == r16.draft).all()
        proposed = r32.draft >= 0
        changed += int((r32.accepted[proposed] != r16.accepted[proposed]).sum())
        drafts += int(proposed.sum())
        scores.append(abs(r32.score[proposed] - r16.score[proposed]).mean())
    assert drafts == 64 * len(SEEDS)  # every position is a draft
    assert changed / drafts < 0.02, (changed, drafts)
    assert 0 < sum(scores) / len(scores) < 0.01  # the pooled probabilities did move, a little


def test_the_trace_says_which_passes_ran_in_bf16(family, engine, tmp_path):
    wide.attach(models_of(family), "bfloat16", min_width=17)
    got = engine.generate("red apple", "mulo", 0, {"rows_per_block": 4}).trace
    counts = got.precision
    assert counts["target"]["bfloat16"] >= 1 and counts["target"]["float32"] >= 1
    assert sum(counts["target"].values()) == got.nfe["target"]
    assert sum(counts["drafter"].values()) == got.nfe["drafter"]
    again = load_trace(got.to_json(tmp_path / "t.json"))
    assert again.precision == counts
    old = got.to_dict()
    del old["precision"]  # a trace from before the field
    assert parse(old).precision == {}


def test_float32_forced_is_todays_path(family, engine):
    wide.attach(models_of(family), "float32", min_width=2)
    forced = engine.generate("red apple", "mulo", 3)
    for model in models_of(family):
        model.wide = None
    plain = engine.generate("red apple", "mulo", 3)
    assert torch.equal(forced.tokens, plain.tokens)
    assert set(forced.trace.precision["target"]) == {"float32"}


class Timings:
    """An injected timer: fixed (float32 s, bfloat16 s), counting its calls."""

    def __init__(self, float32_s: float, bfloat16_s: float):
        self.seconds, self.calls = (float32_s, bfloat16_s), []

    def __call__(self, model, batch, width):
        self.calls.append((batch, width))
        return self.seconds


@pytest.mark.parametrize(
    "timings, chosen",
    [((1.0, 2.5), "float32"), ((1.0, 0.2), "bfloat16"), ((1.0, 0.95), "float32")],  # the last: within MARGIN
)
def test_auto_picks_the_precision_measured_faster(family, engine, timings, chosen, monkeypatch):
    monkeypatch.delenv("MULO_WIDE_PRECISION")  # the suite's float32 (conftest) would override auto
    timer = Timings(*timings)
    assert wide.attach(models_of(family), "auto", min_width=17, timer=timer) == "measured per width bucket"
    got = engine.generate("red apple", "mulo", 0, {"rows_per_block": 4}).trace
    assert family.target.wide.precision(2, 63) == chosen
    assert chosen in got.precision["target"]
    assert (2, 64) in timer.calls  # the target's 63-query verification, in its 64-query bucket, CFG batch 2
    assert all(width >= 17 for _, width in timer.calls)  # narrow passes are never measured


def test_choices_are_kept_on_disk_and_measured_again_on_another_machine(family, tmp_path, monkeypatch):
    model = family.target
    timer = Timings(1.0, 0.2)
    assert wide.WidePasses(model, "auto", timer=timer).precision(2, 300) == "bfloat16"
    assert timer.calls == [(2, 512)]
    stored = list(tmp_path.glob("wide-precision-*.json"))  # beside the compiled packages
    assert len(stored) == 1
    # another engine on this machine reads the choice: nothing is timed
    assert wide.WidePasses(model, "auto", timer=Timings(1.0, 9.0)).precision(2, 500) == "bfloat16"
    assert wide.WidePasses(model, "auto", timer=timer).precision(1, 500) == "bfloat16"  # CFG batch 1: timed
    assert timer.calls == [(2, 512), (1, 512)]
    # another machine (here: another CPU name) has no choices yet: it measures, and keeps its own file
    machine = wide.machine()
    monkeypatch.setattr(wide, "machine", lambda: {**machine, "cpu": "Intel Xeon with AMX"})
    slower = Timings(1.0, 3.0)
    assert wide.WidePasses(model, "auto", timer=slower).precision(2, 300) == "float32"
    assert slower.calls == [(2, 512)] and len(list(tmp_path.glob("wide-precision-*.json"))) == 2
    # a narrow pass is never bf16, nor measured
    assert wide.WidePasses(model, "bfloat16").precision(2, 64) == "float32"


def test_the_layer_timer_measures_both_precisions(family):
    float32_s, bfloat16_s = wide.time_layer(family.target, 2, 128)
    assert float32_s > 0 and bfloat16_s > 0


def test_wide_precision_needs_a_float32_cpu_model_and_a_known_mode(family, monkeypatch):
    with pytest.raises(ValueError, match="wide precision must be one of"):
        wide.attach(models_of(family), "fp16")
    monkeypatch.setenv("MULO_WIDE_PRECISION", "half")
    with pytest.raises(ValueError, match="MULO_WIDE_PRECISION must be one of"):
        wide.attach(models_of(family), "auto")
    bf16_model = toy.build().target.to(torch.bfloat16)
    assert wide.attach([bf16_model], "bfloat16") == "the model's own dtype: not float32"
    assert bf16_model.wide is None


def test_causal_offset_finds_only_masks_causal_up_to_their_last_key():
    for q, p in [(1, 0), (5, 0), (5, 3), (64, 17)]:
        assert causal_offset(torch.ones(q, q + p, dtype=torch.bool).tril(p)) == p
    causal = torch.ones(8, 12, dtype=torch.bool).tril(4)
    holed = causal.clone()
    holed[5, 6] = False  # a final-position mask's hole: an undecided token before the query
    assert causal_offset(holed) is None
    assert causal_offset(torch.ones(8, 12, dtype=torch.bool).tril(3)) is None  # one key fewer a query
    assert causal_offset(torch.ones(8, 12, dtype=torch.bool).tril(5)) is None  # one more
    assert causal_offset(torch.ones(4, 9, dtype=torch.bool).tril(5)) is None  # P >= Q: padding costs more


def test_the_causal_kernel_over_padded_queries_is_the_masked_attention(family):
    """The padding's direction and slicing: zero queries on top, dropped after, give what the mask
    gives (float32, where the kernels differ only in rounding; put them at the bottom and it fails)."""
    model = family.target
    c = model.config
    attention = model.layers[0].attention
    for width, prefix in [(40, 17), (63, 2), (20, 0)]:
        n_slots = prefix + width
        cache = KVCache(c, 2, "cpu", torch.float32, n_slots)
        slots = torch.arange(prefix, n_slots)
        cache.written[:] = True  # the condition's slots, as after a prefill
        mask = cache.admit(slots, torch.ones(width, n_slots, dtype=torch.bool).tril(prefix))
        cache.k.normal_(generator=torch.Generator().manual_seed(1))
        cache.v.normal_(generator=torch.Generator().manual_seed(2))
        x = torch.randn(2, width, c.dim, generator=torch.Generator().manual_seed(width))
        masked = attention(x, 0, slots, mask, cache)
        padded = attention(x, 0, slots, mask, cache, causal_pad=causal_offset(mask))
        assert causal_offset(mask) == prefix
        torch.testing.assert_close(padded, masked, rtol=0, atol=1e-5)


def test_a_bf16_verification_runs_the_causal_kernel_and_a_float32_one_the_mask(family, engine, monkeypatch):
    real, kinds = torch.nn.functional.scaled_dot_product_attention, []

    def spy(q, k, v, attn_mask=None, is_causal=False, **kwargs):
        kinds.append("causal" if is_causal else "masked")
        return real(q, k, v, attn_mask=attn_mask, is_causal=is_causal, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    seq = engine.generate("red apple", "ar", 0).tokens.reshape(-1)
    layers = family.target.config.n_layer
    for precision, kind in [("float32", "masked"), ("bfloat16", "causal")]:
        kinds.clear()
        verification_draws(family, engine, seq, 0, precision)  # the prefill, then the grid after it
        assert kinds == [kind] * (2 * layers), (precision, kinds)


def test_compiled_bf16_layers_draw_as_autocast_does(family, engine):
    """bf16 passes with their dense parts compiled (``mulo.fused_layers``) round as autocast's do,
    not as float32: the same products in bf16, the elementwise work fused. Measured on the toy (mean
    total variation per position): compiled to autocast 0.012, compiled to float32 0.021, autocast to
    float32 0.019; with the Q/K/V product run in float32 by mistake, compiled to autocast is 0.020."""
    seq = engine.generate("red apple", "ar", 0).tokens.reshape(-1)
    p32, _, _ = verification_draws(family, engine, seq, 0, "float32")
    p16, _, _ = verification_draws(family, engine, seq, 0, "bfloat16")
    fused, _, passes = verification_draws(family, engine, seq, 0, "bfloat16", fused=True)
    assert family.target.wide.layers == "compiled" and passes == {"bfloat16": 2}
    to_autocast = 0.5 * (fused - p16).abs().sum(-1).mean()
    to_float32, autocast_to_float32 = (0.5 * (p - p32).abs().sum(-1).mean() for p in (fused, p16))
    assert 0 < to_float32 < 2 * autocast_to_float32 and to_autocast < 0.8 * autocast_to_float32, (
        to_autocast,
        to_float32,
        autocast_to_float32,
    )


def test_compiled_layers_follow_a_weight_change_and_fall_back_to_autocast(family, engine, monkeypatch, caplog):
    """A training step changes the weights in place: the next bf16 pass copies and compiles them
    again; a copy of the model compiles its own. Where Inductor cannot compile, the passes run under
    autocast, with one warning."""
    seq = engine.generate("red apple", "ar", 0).tokens.reshape(-1)
    verification_draws(family, engine, seq, 0, "bfloat16", fused=True)
    wide_passes = family.target.wide
    first = wide_passes.compiled_layers()
    twin = copy.deepcopy(family.target)  # as a test, or a package's export, copies a model
    assert twin.wide.layers == "compiled at the first bf16 pass" and twin.wide.model is twin
    weight = family.target.layers[0].feed_forward.w2.weight
    with torch.no_grad():
        weight.mul_(2.0)
    try:
        again = wide_passes.compiled_layers()
        assert again is not first and not again.stale and first.stale
        torch.testing.assert_close(again.parts[0][1].feed_forward.w2.weight, weight.bfloat16())
    finally:
        with torch.no_grad():
            weight.mul_(0.5)

    def no_compiler(*args, **kwargs):
        raise RuntimeError("no C++ compiler")

    monkeypatch.setattr(torch, "compile", no_compiler)
    with caplog.at_level("WARNING", logger="mulo.fused_layers"):
        probs, _, passes = verification_draws(family, engine, seq, 0, "bfloat16", fused=True)
    p16, _, _ = verification_draws(family, engine, seq, 0, "bfloat16")
    assert family.target.wide.layers == "autocast" and passes == {"bfloat16": 2}
    assert torch.equal(probs, p16)  # autocast's pass, as if never asked for compiled layers
    assert "no C++ compiler" in caplog.text and caplog.text.count("stay under autocast") == 1
