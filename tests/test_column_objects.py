"""A column-object model (``GPTConfig.column_objects``): the slot predicting (r, c) adds the
projection of the background's and its column's object's placed symbols, through every engine path."""

import dataclasses

import pytest
import torch

from mulo.engine import Engine
from mulo.families import toy
from mulo.models.gpt import GPT, GPTConfig, placed_slot

CONFIG = GPTConfig(
    dim=32, n_layer=2, n_head=2, vocab_size=16, max_seq_len=24, grid=(4, 6), cond_len=7, cond_dim=5, multiple_of=16
)
SYMBOLS = 4


def placed(objects: list[int], background: int | None = None) -> torch.Tensor:
    """Conditions ``[1, 7, 5 + 4]``: random features, then one-hot symbols at the placed slots."""
    cond = torch.cat([torch.randn(1, 7, 5, generator=torch.Generator().manual_seed(1)), torch.zeros(1, 7, SYMBOLS)], -1)
    for k, symbol in enumerate(objects):
        cond[0, placed_slot(len(objects), k), 5 + symbol] = 1.0
    if background is not None:
        cond[0, 0, 5 + background] = 1.0
    return cond


def column_model(seed: int = 0) -> GPT:
    model = GPT(dataclasses.replace(CONFIG, column_objects=3, column_symbols=SYMBOLS))
    with torch.no_grad():
        model.column_input.weight.copy_(torch.randn(32, SYMBOLS, generator=torch.Generator().manual_seed(seed)))
    return model


def test_each_cell_reads_the_background_and_the_object_of_its_column():
    model = column_model()
    weight = model.column_input.weight  # [dim, symbols]
    table = model.position_inputs(placed([2, 0, 3], background=1))[0]  # three objects: columns of 2 cells
    first = CONFIG.cond_len - 1  # the slot predicting cell 0
    assert torch.equal(table[:first], torch.zeros(first, 32))  # condition slots predict no cell
    for cell in range(CONFIG.max_seq_len):
        column_object = [2, 0, 3][(cell % 6) // 2]
        torch.testing.assert_close(table[first + cell], weight[:, column_object] + weight[:, 1])
    two = model.position_inputs(placed([3, 1]))[0]  # two objects: columns of 3 cells, no background
    torch.testing.assert_close(two[first + 6 + 2], weight[:, 3])  # (1, 2): the left column
    torch.testing.assert_close(two[first + 6 + 3], weight[:, 1])  # (1, 3): the right one
    null = model.position_inputs(model.null_condition(placed([3, 1], background=0)))
    assert torch.equal(null, torch.zeros_like(null))  # classifier-free guidance's null adds nothing


def test_a_new_column_input_starts_at_zero_and_the_features_alone_reach_the_projection():
    plain = GPT(CONFIG)
    model = GPT(dataclasses.replace(CONFIG, column_objects=3, column_symbols=SYMBOLS))
    assert torch.equal(model.column_input.weight, torch.zeros_like(model.column_input.weight))
    missing, unexpected = model.load_state_dict(plain.state_dict(), strict=False)
    assert missing == ["column_input.weight"] and not unexpected  # a trained target gains it unchanged
    tokens = torch.randint(0, 16, (1, 23), generator=torch.Generator().manual_seed(2))
    cond = placed([1, 2], background=3)
    torch.testing.assert_close(model(tokens, cond), plain(tokens, cond[..., :5]))


def test_the_objects_move_only_through_their_columns_first_cells():
    """Before any token is fed, the slot predicting cell (0, c) differs between two prompts that
    differ in one object only where c lies in that object's column (the first row's slots see
    no other cell of the image)."""
    model = column_model()
    tokens = torch.zeros(1, 5, dtype=torch.long)
    with torch.no_grad():
        a = model(tokens, placed([1, 2, 3]))[0]
        b = model(tokens, placed([1, 0, 3]))[0]  # the middle object changed: cells 2 and 3
    differs = [not torch.allclose(a[c], b[c]) for c in range(6)]
    # cells 0 and 1 attend to no slot that changed (the condition slots' own inputs are unchanged
    # features); 2 and 3 read the new object; 4 and 5 see cells 2-3's keys, which changed
    assert differs[:4] == [False, False, True, True]


def test_with_the_column_objects_off_a_wider_condition_is_not_read_silently():
    with pytest.raises(ValueError, match="go together"):
        dataclasses.replace(CONFIG, column_objects=3)
    with pytest.raises(ValueError, match="placed slots"):
        dataclasses.replace(CONFIG, column_objects=3, column_symbols=4, cond_len=6)


@pytest.fixture(scope="module")
def column_toy():
    return toy.build(neighbour_inputs=3, rotary_2d=True, column_objects=2)


def test_greedy_ar_is_the_teacher_forced_argmax_with_the_column_input(column_toy):
    fam = column_toy
    tokens = Engine(fam, compile="off").generate("red apple", "ar", 0, {"temperature": 0.0, "cfg": 1.0}).tokens
    tokens = torch.as_tensor(tokens).reshape(-1)
    cond = fam.condition("red apple")[None]
    with torch.no_grad():
        logits = fam.target(tokens[None, :-1], cond)[0]
        unplaced = cond.clone()
        unplaced[..., toy.COND_DIM :] = 0
        blind = fam.target(tokens[None, :-1], unplaced)[0]
    assert torch.equal(logits.argmax(-1), tokens)
    assert not torch.equal(blind.argmax(-1), tokens)  # so the column input changes what is drawn


def test_greedy_lossless_methods_and_mulo_rejecting_everything_equal_greedy_ar(column_toy):
    engine = Engine(column_toy, compile="off")

    def tokens(method, **knobs):
        return torch.as_tensor(engine.generate("blue fish", method, 2, {"temperature": 0.0, **knobs}).tokens)

    expected = tokens("ar")
    for method in ("sd", "sjd", "mc-sjd", "gsd", "eagle2"):
        assert torch.equal(tokens(method), expected), method
    for resampling, window in (("raster", 0), ("islands", 0), ("islands", 8)):
        got = tokens("mulo", tau=1.01, radius=1, resampling=resampling, island_window=window)
        assert torch.equal(got, expected), (resampling, window)
    assert torch.equal(tokens("zipar", zipar_window=8), expected)
    sampled = tokens("ar", temperature=1.0, cfg=2.0)  # guidance's null branch: its own (zero) input
    graphs = Engine(column_toy, compile="off", fixed_shapes=True, graphs="emulate")
    again = graphs.generate("blue fish", "ar", 2, {"temperature": 1.0, "cfg": 2.0}).tokens
    assert torch.equal(torch.as_tensor(again), sampled)


@pytest.mark.slow  # compiles the sampled step's package (~20 s)
def test_the_compiled_sampled_step_adds_the_column_input_as_the_eager_path(monkeypatch, tmp_path):
    monkeypatch.setenv("MULO_COMPILE_CACHE", str(tmp_path))
    family = toy.build(neighbour_inputs=3, rotary_2d=True, column_objects=2)
    want = Engine(family, compile="off").generate("red apple", "ar", 4, {}).tokens
    engine = Engine(family, compile="on")
    result = engine.generate("red apple", "ar", 4, {})
    assert "compiled steps" in result.trace.execution
    assert torch.equal(torch.as_tensor(result.tokens), torch.as_tensor(want))


def test_a_clip_target_restarts_as_a_column_object_trial_with_its_moments():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "experiments"))
    from restart_target import restart

    from mulo.train.recipes import RECIPES

    clip_recipe = dataclasses.replace(RECIPES["scenes"], scene_condition="clip")
    trained = GPT(clip_recipe.gpt_config("target", 64, 16))
    opt = torch.optim.AdamW(trained.parameters(), weight_decay=0.05)
    trained(torch.zeros(1, 8, dtype=torch.long), torch.randn(1, 17, 16)).sum().backward()
    opt.step()
    source = {"model": trained.state_dict(), "optimizer": opt.state_dict(), "step": 8800, "seconds": 5.0}
    columns = dataclasses.replace(clip_recipe, scene_condition="clip_placed")
    state = restart(source, columns, 16, 64, 6500)
    model = GPT(columns.gpt_config("target", 64, columns.condition_width(16)))
    model.load_state_dict(state["model"])
    assert torch.equal(model.column_input.weight, torch.zeros_like(model.column_input.weight))
    assert torch.equal(model.output.weight, trained.output.weight)
    names = [n for n, _ in model.named_parameters()]
    moved = state["optimizer"]["state"][names.index("output.weight")]["exp_avg"]
    assert torch.equal(
        moved, opt.state_dict()["state"][[n for n, _ in trained.named_parameters()].index("output.weight")]["exp_avg"]
    )
    assert names.index("column_input.weight") not in state["optimizer"]["state"]  # new: no moments
    assert state["optimizer"]["param_groups"][0]["weight_decay"] == 0.05
    assert (state["step"], state["warm_from"], state["curve"]) == (6500, 6500, [])
    with pytest.raises(ValueError, match="do not fit"):
        restart(source, clip_recipe, 16, 32, 6500)  # another codebook
    # a longer cosine than the recipe's: a step past the recipe's end is a step of it
    planned = columns.budget.ar_steps
    assert restart(source, columns, 16, 64, planned + 1000, steps=planned + 9000)["steps"] == planned + 9000
    with pytest.raises(ValueError, match=f"not within target's {planned} steps"):
        restart(source, columns, 16, 64, planned + 1000)


def test_a_drafter_restarts_on_its_own_grid_and_schedule():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "experiments"))
    from restart_target import restart

    from mulo.train.recipes import RECIPES

    clip_recipe = dataclasses.replace(RECIPES["scenes"], scene_condition="clip")
    trained = GPT(clip_recipe.gpt_config("drafter_r4", 64, 16))
    columns = dataclasses.replace(clip_recipe, scene_condition="clip_placed")
    state = restart(trained.state_dict(), columns, 16, 64, 2000, "drafter_r4")
    model = GPT(columns.gpt_config("drafter_r4", 64, columns.condition_width(16)))
    model.load_state_dict(state["model"])
    assert model.config.grid_hw == (8, 8) and model.config.column_objects == 3
    assert state["steps"] == clip_recipe.budget.drafter_steps
    with pytest.raises(ValueError, match="not within drafter_r4's"):
        restart(trained.state_dict(), columns, 16, 64, clip_recipe.budget.drafter_steps, "drafter_r4")
    with pytest.raises(ValueError, match="do not fit the target model"):
        restart(trained.state_dict(), columns, 16, 64, 2000)  # an 8 x 8 model is no 32 x 32 target
