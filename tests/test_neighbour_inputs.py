"""A target that reads the row above (``GPTConfig.neighbour_inputs``): the slot predicting token
(r, c) adds embeddings of (r - 1, c - 1), (r - 1, c), (r - 1, c + 1). Every cached pass must add
exactly what the teacher-forced pass adds, whatever order a method decodes in, and a slot fed
while its row above was unknown (or a rejected draft) is re-fed once it is known."""

from __future__ import annotations

import pytest
import torch

from mulo.engine import Engine
from mulo.families import toy
from mulo.models.gpt import GPT, GPTConfig, upper_neighbours
from mulo.runner import ModelRunner
from tests.helpers import tiny_gpt

NONE = 99


def test_upper_neighbours_reads_the_row_above_and_says_none_off_the_grid_or_unknown():
    view = torch.arange(12)  # a 3 x 4 grid holding its own raster index
    view[2] = -1  # unknown
    got = upper_neighbours(view, torch.tensor([0, 3, 4, 5, 6, 7, 11]), 4, NONE)
    expected = [
        [NONE, NONE, NONE],  # row 0: nothing above
        [NONE, NONE, NONE],
        [NONE, 0, 1],  # (1, 0): nothing to the left above
        [0, 1, NONE],  # (1, 1): above-right is unknown
        [1, NONE, 3],
        [NONE, 3, NONE],  # (1, 3): nothing to the right above
        [6, 7, NONE],
    ]
    assert got.tolist() == expected
    batch = torch.stack([view, torch.arange(12) + 100])  # one list of positions for a batch of views
    assert upper_neighbours(batch, torch.tensor([5]), 4, NONE).tolist() == [[[0, 1, NONE]], [[100, 101, 102]]]
    rows = upper_neighbours(batch, torch.tensor([[5], [9]]), 4, NONE)  # one position per view
    assert rows.tolist() == [[[0, 1, NONE]], [[104, 105, 106]]]


def test_a_plain_model_has_no_neighbour_tables_and_a_neighbour_model_round_trips_its_config():
    plain = tiny_gpt(1, 16, 4)
    assert not any("neighbour" in name for name in plain.state_dict())  # Tar's state dicts load unchanged
    assert plain.neighbours_of(torch.zeros(16, dtype=torch.long), torch.arange(3)) is None
    model = tiny_gpt(1, 16, 4, neighbour_inputs=3)
    config = GPTConfig.from_json(json_form(model.config))
    assert config == model.config
    missing, unexpected = GPT(config).load_state_dict(model.state_dict())  # strict: raises on a mismatch
    assert not missing and not unexpected
    with pytest.raises(ValueError, match="neighbour_inputs"):
        GPTConfig(
            vocab_size=16,
            max_seq_len=16,
            cond_len=2,
            cond_dim=4,
            multiple_of=32,
            dim=32,
            n_layer=1,
            n_head=2,
            neighbour_inputs=2,
        )
    with pytest.raises(ValueError, match="row above"):
        model.embed_tokens(torch.tensor([1, 2]))


def json_form(config) -> dict:
    import dataclasses
    import json

    return json.loads(json.dumps(dataclasses.asdict(config)))


@pytest.fixture(scope="module")
def neighbour_toy():
    return toy.build(neighbour_inputs=3)


def test_greedy_ar_is_the_teacher_forced_argmax_and_the_row_above_matters(neighbour_toy):
    fam = neighbour_toy
    tokens = Engine(fam, compile="off").generate("red apple", "ar", 0, {"temperature": 0.0, "cfg": 1.0}).tokens
    tokens = torch.as_tensor(tokens).reshape(-1)
    cond = fam.condition("red apple")[None]
    with torch.no_grad():
        logits = fam.target(tokens[None, :-1], cond)[0]
        blind = fam.target(tokens[None, :-1], cond, view=torch.full_like(tokens[None, :-1], -1))[0]
    assert torch.equal(logits.argmax(-1), tokens)
    assert not torch.equal(blind.argmax(-1), tokens)  # so reading the row above changes what is drawn


GREEDY_LOSSLESS = ["sd", "sjd", "mc-sjd", "gsd", "eagle2"]


def test_greedy_lossless_methods_and_mulo_rejecting_everything_equal_greedy_ar(neighbour_toy):
    engine = Engine(neighbour_toy, compile="off")

    def tokens(method, **knobs):
        return torch.as_tensor(engine.generate("blue fish", method, 2, {"temperature": 0.0, **knobs}).tokens)

    expected = tokens("ar")
    for method in GREEDY_LOSSLESS:
        assert torch.equal(tokens(method), expected), method
    # tau > 1 rejects every draft: the target resamples all of it (island window 8: a full row, no
    # row starts early), each slot fed once its row above is final
    for resampling, window, rows in (("raster", 0, 1), ("islands", 0, 2), ("islands", 8, 0)):
        got = tokens("mulo", tau=1.01, radius=1, resampling=resampling, island_window=window, rows_per_block=rows)
        assert torch.equal(got, expected), (resampling, window)
    assert torch.equal(tokens("zipar", zipar_window=8), expected)  # a full-row window is AR


METHODS = (("ar", {}), ("mulo", {}), ("mulo", {"island_window": 2}), ("zipar", {}), ("eagle2", {}))


def same_tokens(family, engine_knobs: dict, methods) -> Engine:
    """Each method's tokens under ``engine_knobs`` are the eager engine's; returns that engine. (The
    eager engine is made first: an engine attaches its compile mode to the family's models.)"""
    eager = Engine(family, compile="off")
    want = {i: eager.generate("red apple", method, 4, dict(knobs)).tokens for i, (method, knobs) in enumerate(methods)}
    engine = Engine(family, **engine_knobs)
    for i, (method, knobs) in enumerate(methods):
        got = engine.generate("red apple", method, 4, dict(knobs)).tokens
        assert torch.equal(torch.as_tensor(got), torch.as_tensor(want[i])), (method, knobs)
    return engine


def test_graph_buffers_feed_the_row_above_as_the_eager_path(neighbour_toy):
    same_tokens(neighbour_toy, dict(compile="off", fixed_shapes=True, graphs="emulate"), METHODS)


@pytest.mark.slow  # compiles the sampled step's package (~20 s)
def test_the_compiled_sampled_step_feeds_the_row_above_as_the_eager_path(monkeypatch, tmp_path):
    """Only the sampled step embeds its own input (the other packages take embedded queries)."""
    monkeypatch.setenv("MULO_COMPILE_CACHE", str(tmp_path))
    family = toy.build(neighbour_inputs=3)  # its own models: the module's toy stays eager
    engine = same_tokens(family, dict(compile="on"), METHODS[:1])
    assert "compiled steps" in engine.generate("red apple", "ar", 4, {}).trace.execution
    assert any(path.name.endswith("-sampled.pt2") for path in tmp_path.iterdir())


def test_a_slot_fed_while_its_row_above_was_unknown_is_re_fed_once_it_is_known():
    """On a 4-wide grid, slots 3, 4 and 5 (predicting 4, 5, 6) read position 1 above. Fed while it
    is unknown they read "none"; once it is known, the next pass re-feeds them with it, though
    their own tokens have not changed (a runner without refresh, which re-feeds only what is out
    of date, shows exactly which slots that is)."""
    model = tiny_gpt(5, 16, 4, neighbour_inputs=3)
    cond = torch.randn(2, 4, generator=torch.Generator().manual_seed(6))
    seq = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3])
    holey = seq.clone()
    holey[1] = -1
    runner = ModelRunner(model, cond, 2.0, 1.0, 0, 1.0, refresh=False)
    runner.prefill()
    fed = torch.tensor([0, 2, 3, 4, 5])
    runner.feed_refreshing(fed, holey[fed], holey)
    none = model.config.vocab_size
    assert (runner._fed_neighbours[3:6] == none).any(-1).all()
    runner.next_logits(seq, 7)  # feeds slot 6, and whatever is out of date before it
    assert runner.widths[-1] == 5  # slot 1 (never fed), slots 3-5 (their row above), slot 6
    assert torch.equal(runner._fed_neighbours[:7], model.neighbours_of(seq, torch.arange(1, 8)))


def test_a_step_after_an_island_pass_re_feeds_the_slot_that_read_a_hidden_row_above():
    """An island pass feeds slot 5 (predicting 6, under positions 1-3) while position 1 is not
    final: it reads "none" there, though the slot's own token is right. A single-token step after
    it must not trust that slot: the runner goes the general way and gives a fresh runner's
    distribution."""
    model = tiny_gpt(8, 16, 4, neighbour_inputs=3)
    cond = torch.randn(2, 4, generator=torch.Generator().manual_seed(9))
    seq = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3])
    runner = ModelRunner(model, cond, 2.0, 1.0, 0, 1.0)
    runner.prefill()
    runner.span_probs(seq, 0, 8)  # the verification: slots 0-6, causal
    final = torch.ones(16, dtype=torch.bool)
    final[1] = False
    runner.feed_over_final(torch.tensor([5]), seq[[5]], seq, final, torch.zeros(16, dtype=torch.bool))
    assert int(runner._fed_neighbours[5, 0]) == model.config.vocab_size and torch.equal(runner._fed[:7], seq[:7])
    fresh = ModelRunner(model, cond, 2.0, 1.0, 0, 1.0)
    fresh.prefill()
    torch.testing.assert_close(runner.next_logits(seq, 7), fresh.next_logits(seq, 7))


def test_a_steps_row_above_in_plain_integers_is_upper_neighbours():
    model = tiny_gpt(2, 16, 4, neighbour_inputs=3)
    runner = ModelRunner(model, torch.randn(2, 4), 2.0, 1.0, 0, 1.0)
    runner._fed = torch.tensor([3, -1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, -1])
    for position in range(15):
        assert torch.equal(runner._step_neighbours(position), runner.neighbours(runner._fed, [position])), position
