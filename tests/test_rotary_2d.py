"""A target whose attention turns queries and keys by their 2D cells (``GPTConfig.rotary_2d``): a
score depends on (the cell a query predicts) - (the cell its key was fed), the same relation on
every row; every cached pass of every method gives the teacher-forced pass's tokens; compiled steps
decline it (eager) rather than drop the turn."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from mulo.engine import Engine
from mulo.families import toy
from mulo.models.gpt import GPT, GPTConfig, placed_column_centres, placed_slot, rotary_2d_tables, rotate
from tests.helpers import tiny_gpt

T, H, W, D = 2, 4, 5, 8  # condition slots, grid, head dim


def score(tables, q, k, predicted: tuple[int, int], fed: tuple[int, int]) -> float:
    """The dot product of ``q`` at the slot predicting cell ``predicted`` and ``k`` at the slot fed ``fed``."""
    query_slot = T - 1 + predicted[0] * W + predicted[1]
    key_slot = T + fed[0] * W + fed[1]
    turned_q = rotate(q, tables[0, [query_slot]])
    turned_k = rotate(k, tables[1, [key_slot]])
    return float((turned_q * turned_k).sum())


def test_a_score_depends_on_the_offset_between_the_predicted_and_the_fed_cell():
    tables = rotary_2d_tables(T, H, W, D)
    assert tables.shape == (2, T + H * W - 1, D // 2, 2)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 1, D, generator=g), torch.randn(1, 1, 1, D, generator=g)
    above = [score(tables, q, k, (r, c), (r - 1, c)) for r in range(1, H) for c in range(W)]
    assert max(above) - min(above) < 1e-5  # "the token above" is one relation, no wrap at a row's end
    for dr, dc in ((0, -1), (-1, 1), (-2, -3)):
        cells = [(r, c) for r in range(H) for c in range(W)]
        fed = [(r + dr, c + dc) for r, c in cells]
        pairs = [
            (u, v) for u, v in zip(cells, fed, strict=True) if 0 <= v[0] < H and 0 <= v[1] < W and v < (H - 1, W - 1)
        ]
        scores = [score(tables, q, k, u, v) for u, v in pairs]
        assert max(scores) - min(scores) < 1e-5, (dr, dc)
    assert abs(score(tables, q, k, (2, 2), (1, 2)) - score(tables, q, k, (2, 2), (2, 1))) > 1e-3  # up != left


def test_condition_slots_turn_by_nothing():
    tables = rotary_2d_tables(T, H, W, D)
    cos, sin = tables[..., 0], tables[..., 1]
    assert torch.equal(cos[:, : T - 1], torch.ones_like(cos[:, : T - 1])) and not sin[:, : T - 1].any()
    assert torch.equal(cos[1, T - 1], torch.ones(D // 2)) and not sin[1, T - 1].any()  # no cell fed there
    assert torch.equal(cos[0, T - 1], torch.ones(D // 2))  # it predicts cell (0, 0)


def test_still_pairs_meet_a_condition_key_alike_from_every_cell():
    """``rotary_still``: the unturned share of each axis's pairs scores a condition key by content
    alone, the same from every cell, while the turning pairs still keep offsets."""
    D8 = 16  # 4 pairs an axis: half turn, half stay
    tables = rotary_2d_tables(T, H, W, D8, still=0.5)
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(1, 1, 1, D8, generator=g), torch.randn(1, 1, 1, D8, generator=g)
    still = torch.zeros(D8, dtype=torch.bool).unflatten(0, (2, 4, 2))
    still[:, 2:] = True  # pairs 2, 3 of the row half and of the column half
    still = still.flatten()
    qs, ks = q * still, k * still

    def condition_score(q, k, cell):
        query_slot = T - 1 + cell[0] * W + cell[1]
        return float((rotate(q, tables[0, [query_slot]]) * rotate(k, tables[1, [0]])).sum())

    cells = [(r, c) for r in range(H) for c in range(W)]
    alike = [condition_score(qs, ks, cell) for cell in cells]
    assert max(alike) - min(alike) < 1e-5 and abs(alike[0]) > 1e-3
    turned = [condition_score(q * ~still, k * ~still, cell) for cell in cells]
    assert max(turned) - min(turned) > 1e-2
    assert torch.equal(rotary_2d_tables(T, H, W, D8, still=0.0), rotary_2d_tables(T, H, W, D8))
    with pytest.raises(ValueError, match="rotary_still"):
        GPTConfig(rotary_still=1.0)


def test_placed_object_keys_meet_their_own_column_s_queries_at_no_column_offset():
    """``condition_columns``: the k-th of n objects' key turns (column pairs only) by the centre of
    the k-th of n equal columns, so a query's column score peaks at the object of its column."""
    cond_len, side, dim = 8, 12, 16
    tables = rotary_2d_tables(cond_len, side, side, dim, columns=3)
    assert placed_column_centres(3, side) == {1: 5.5, 2: 2.5, 3: 8.5, 4: 1.5, 5: 5.5, 6: 9.5}
    assert [placed_slot(n, k) for n in (1, 2, 3) for k in range(n)] == [1, 2, 3, 4, 5, 6]
    plain = rotary_2d_tables(cond_len, side, side, dim)
    assert torch.equal(tables[0], plain[0]) and torch.equal(tables[1, cond_len:], plain[1, cond_len:])
    assert torch.equal(tables[1, [0, 7]], plain[1, [0, 7]])  # the background's slot and a spare: unturned
    assert torch.equal(tables[1, 1:7, : dim // 4], plain[1, 1:7, : dim // 4])  # no row turn
    # one content vector as query and key: from the cells of a row, the score with an object's key
    # is highest at its column's centre and falls off symmetrically (cos of the column offset)
    g = torch.Generator().manual_seed(2)
    vector = torch.randn(1, 1, side, dim, generator=g)[:, :, :1].expand(1, 1, side, dim)
    row_cells = cond_len - 1 + 5 * side + torch.arange(side)
    queries = rotate(vector, tables[0, row_cells])
    for slot, centre in placed_column_centres(3, side).items():
        scores = (queries * rotate(vector, tables[1, [slot]].expand(side, -1, -1))).sum(-1).flatten().tolist()
        left, right = int(centre - 0.5), int(centre + 0.5)  # the two cells either side of the centre
        top = max(scores)
        assert top == pytest.approx(scores[left], rel=1e-4) and top == pytest.approx(scores[right], rel=1e-4)
        assert scores[left - 1] == pytest.approx(scores[right + 1], rel=1e-4)
    config = GPTConfig(dim=64, n_head=4, n_layer=1, vocab_size=8, max_seq_len=side * side, cond_len=cond_len)
    model = GPT(dataclasses.replace(config, cond_dim=8, rotary_2d=True, condition_columns=3))
    assert torch.equal(model.rotary, rotary_2d_tables(cond_len, side, side, 16, columns=3))  # the model's own turns
    with pytest.raises(ValueError, match="needs rotary_2d"):
        GPTConfig(condition_columns=3, cond_len=8)
    with pytest.raises(ValueError, match="need 7 condition slots; the model has 4"):
        GPTConfig(condition_columns=3, cond_len=4, rotary_2d=True, dim=64, n_head=4)


def test_the_config_round_trips_and_the_turns_are_in_no_state_dict():
    model = tiny_gpt(1, 16, 4, rotary_2d=True)
    assert not any("rotary" in name for name in model.state_dict())  # derived from the config
    config = GPTConfig.from_json(json.loads(json.dumps(dataclasses.asdict(model.config))))
    assert config == model.config and GPT(config).load_state_dict(model.state_dict())
    assert tiny_gpt(1, 16, 4).rotary_at(torch.arange(3)) is None
    with pytest.raises(ValueError, match="divisible by 4"):
        dataclasses.replace(model.config, dim=24, n_head=4)  # head dim 6


@pytest.fixture(scope="module")
def rotary_toy():
    return toy.build(neighbour_inputs=3, rotary_2d=True)  # as a scenes target would have both


def test_greedy_ar_is_the_teacher_forced_argmax_and_the_turn_matters(rotary_toy):
    fam = rotary_toy
    tokens = Engine(fam, compile="off").generate("red apple", "ar", 0, {"temperature": 0.0, "cfg": 1.0}).tokens
    tokens = torch.as_tensor(tokens).reshape(-1)
    cond = fam.condition("red apple")[None]
    unturned = GPT(dataclasses.replace(fam.target.config, rotary_2d=False))
    unturned.load_state_dict(fam.target.state_dict())
    with torch.no_grad():
        logits = fam.target(tokens[None, :-1], cond)[0]
        plain = unturned.eval()(tokens[None, :-1], cond)[0]
    assert torch.equal(logits.argmax(-1), tokens)
    assert not torch.allclose(logits, plain, atol=1e-3)


def test_every_method_decodes_as_the_teacher_forced_pass(rotary_toy):
    """Greedy lossless methods and MuLo-SD rejecting everything equal greedy AR; tree nodes on scratch
    slots turn by their image cells (EAGLE-2)."""
    engine = Engine(rotary_toy, compile="off")

    def tokens(method, **knobs):
        return torch.as_tensor(engine.generate("blue fish", method, 2, {"temperature": 0.0, **knobs}).tokens)

    expected = tokens("ar")
    for method in ("sd", "sjd", "mc-sjd", "gsd", "eagle2"):
        assert torch.equal(tokens(method), expected), method
    for resampling, window in (("raster", 0), ("islands", 8)):
        got = tokens("mulo", tau=1.01, radius=1, resampling=resampling, island_window=window, rows_per_block=0)
        assert torch.equal(got, expected), resampling
    assert torch.equal(tokens("zipar", zipar_window=8), expected)


def test_graph_buffers_turn_as_the_eager_path(rotary_toy):
    eager = Engine(rotary_toy, compile="off")
    want = [eager.generate("red apple", m, 4, dict(k)).tokens for m, k in (("ar", {}), ("mulo", {}), ("eagle2", {}))]
    graphs = Engine(rotary_toy, compile="off", fixed_shapes=True, graphs="emulate")
    for (method, knobs), expected in zip((("ar", {}), ("mulo", {}), ("eagle2", {})), want, strict=True):
        got = graphs.generate("red apple", method, 4, dict(knobs)).tokens
        assert torch.equal(torch.as_tensor(got), torch.as_tensor(expected)), method
    # (compiled CPU steps turn as the eager path: tests/test_compiled.py, slow)
