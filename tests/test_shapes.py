"""Fixed-shape passes (issue 41): what an accelerator runs, checked on the CPU.

With ``fixed_shapes`` every pass attends over the whole cache and pads its queries to a power of
two with queries that see only a junk slot; that must change nothing a method computes.
"""

from __future__ import annotations

import pytest
import torch

from mulo import methods
from mulo.engine import Engine
from mulo.models.gpt import KVCache
from mulo.runner import ModelRunner, pad_mask, query_bucket

VARIANTS = [
    ("ar", {}),
    ("zipar", {}),
    ("sjd", {}),
    ("sd", {}),
    ("lantern", {}),
    ("lantern_chain", {}),
    ("eagle2", {}),
    ("mulo", {}),
    ("mulo", {"resampling": "raster"}),
    ("mulo", {"refresh": False}),
    ("mulo", {"radius": 0, "tau": 0.5}),
]


@pytest.mark.parametrize(("method", "knobs"), VARIANTS, ids=[f"{m}{k or ''}" for m, k in VARIANTS])
def test_fixed_shapes_give_the_same_tokens(toy, method, knobs):
    if method not in methods.names():
        pytest.fail(f"{method} is no longer a method: update VARIANTS")
    exact, fixed = Engine(toy, fixed_shapes=False), Engine(toy, fixed_shapes=True)
    for seed in range(2):
        a = exact.generate("red apple", method, seed, knobs)
        b = fixed.generate("red apple", method, seed, knobs)
        assert torch.equal(a.tokens, b.tokens), (method, knobs, seed)
        assert a.trace.nfe == b.trace.nfe
        # every pass but the prefill (the condition's width) runs at a power-of-two width, the
        # EAGLE head's (LANTERN's and EAGLE-2's drafter) included
        widths = b.pass_widths["target"] + b.pass_widths["drafter"]
        prefill = toy.target.config.cond_len
        assert all(w == query_bucket(w) for w in widths if w != prefill), sorted(set(widths))


def test_query_buckets_are_powers_of_two():
    assert [query_bucket(n) for n in (1, 2, 3, 4, 5, 63, 64, 65, 1023)] == [1, 2, 4, 4, 8, 64, 64, 128, 1024]


def runner_pair(toy, **kw):
    cond = toy.condition("red apple", 0)
    return [ModelRunner(toy.target, cond, 3.0, 1.0, 0, 1.0, fixed_shapes=f, **kw) for f in (False, True)]


def test_a_fixed_shape_pass_attends_over_the_whole_cache_and_pads_with_the_junk_slot(toy):
    exact, fixed = runner_pair(toy, scratch=3)
    assert fixed.cache.n_slots == exact.cache.n_slots + 1 and fixed.junk == fixed.cache.n_slots - 1
    positions = torch.tensor([2, 3, 5])
    small, full = exact._causal_mask(positions), fixed._causal_mask(positions)
    assert full.shape == (3, fixed.cache.n_slots)
    assert torch.equal(full[:, : small.shape[1]], small) and not full[:, small.shape[1] :].any()
    padded = pad_mask(full, fixed.cache.n_slots, fixed.junk)
    assert padded.shape == (4, fixed.cache.n_slots)  # 3 queries -> a bucket of 4
    assert not padded[:3, fixed.junk].any()  # no real query sees the junk slot
    assert padded[3].nonzero().flatten().tolist() == [fixed.junk]  # the padding sees nothing else
    final = torch.zeros(toy.target.config.max_seq_len, dtype=torch.bool)
    final[[0, 1, 4]] = True
    small, full = exact._final_mask(positions, final), fixed._final_mask(positions, final)
    assert torch.equal(full[:, : small.shape[1]], small) and not full[:, small.shape[1] :].any()


def test_fixed_shape_passes_give_the_same_distributions(toy):
    n = toy.target.config.max_seq_len
    seq = torch.randint(0, toy.vocab_size, (n,), generator=torch.Generator().manual_seed(0))
    out = []
    for runner in runner_pair(toy):
        runner.prefill()
        spans = [runner.span_probs(seq, 0, 5), runner.span_probs(seq, 5, 12)]
        seq2 = seq.clone()
        seq2[3] = (seq[3] + 1) % toy.vocab_size  # a changed token: the re-feed path
        spans.append(runner.span_probs(seq2, 12, 20))
        final = torch.zeros(n, dtype=torch.bool)
        final[:8] = True
        inputs = torch.tensor([8, 13, 21])
        logits = runner.feed_over_final(inputs, seq2[inputs], seq2, final, torch.zeros_like(final))
        out.append([*spans, runner.probs(logits)])
    for a, b in zip(*out, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_admit_reads_nothing_back_from_an_accelerator():
    """On a device other than the CPU the own-slot check would be a host round trip per pass: a
    meta tensor (no data at all) shows the mask goes through without one."""
    from mulo.models.gpt import GPTConfig

    config = GPTConfig.preset("test-tiny", vocab_size=16, max_seq_len=4, cond_type="class", cond_len=1, cond_dim=2)
    cache = KVCache(config, 1, "meta", torch.float32)
    mask = torch.zeros(1, 3, dtype=torch.bool, device="meta")
    assert cache.admit(torch.tensor([2], device="meta"), mask).shape == (1, 3)
