"""The scenes family's AR loss (``stages.ar.background_sample`` and ``weighted_loss``): the output
head and the cross-entropy run on every object token and a weighted share of the background's,
and the weighted mean is an unbiased estimate of the full loss, gradients included; and the
position embedding's grid start (``init_positions``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mulo.train.recipes import Budget
from mulo.train.stages.ar import background_sample, before_first_object, open_cells, scene_weights, weighted_loss
from tests.helpers import tiny_gpt

VOCAB, SIDE = 11, 4


def scene_batch(rows: int = 6) -> torch.Tensor:
    """Token grids of a background code (3) with a few other codes scattered over it."""
    gen = torch.Generator().manual_seed(0)
    tokens = torch.full((rows, SIDE * SIDE), 3)
    objects = torch.rand(tokens.shape, generator=gen) < 0.3
    tokens[objects] = torch.randint(4, VOCAB, (int(objects.sum()),), generator=gen)
    return tokens


def test_every_object_token_kept_and_background_weighted_up():
    tokens = scene_batch(200)
    weights = background_sample(tokens, 0.25, np.random.default_rng(1))
    background = tokens == 3
    assert (weights[~background] == 1).all()
    assert set(weights[background].unique().tolist()) == {0.0, 4.0}
    assert abs(float((weights[background] > 0).float().mean()) - 0.25) < 0.03
    # a row's background is its most common token, whichever code it is
    shifted = torch.where(background, torch.full_like(tokens, 9), torch.where(tokens == 9, 3, tokens))
    assert torch.equal(background_sample(shifted, 0.25, np.random.default_rng(1)), weights)


def test_same_generator_same_sample():
    tokens = scene_batch()
    first = background_sample(tokens, 0.1, np.random.default_rng([0, 5]))
    assert torch.equal(first, background_sample(tokens, 0.1, np.random.default_rng([0, 5])))
    assert not torch.equal(first, background_sample(tokens, 0.1, np.random.default_rng([0, 6])))


def test_hidden_pass_feeds_the_same_logits():
    model = tiny_gpt(3, VOCAB, SIDE)
    tokens, cond = scene_batch(2), torch.randn(2, 2, 4)
    hidden = model(tokens[:, :-1], cond, hidden=True)
    assert torch.allclose(model.output(hidden).float(), model(tokens[:, :-1], cond), atol=1e-6)


def test_sampled_loss_and_gradient_are_unbiased():
    model = tiny_gpt(3, VOCAB, SIDE).train()
    tokens, cond = scene_batch(), torch.randn(6, 2, 4)
    full = F.cross_entropy(model(tokens[:, :-1], cond).reshape(-1, VOCAB), tokens.reshape(-1))
    (full_grad,) = torch.autograd.grad(full, model.output.weight)
    draws = [weighted_loss(model, tokens[:, :-1], cond, None, tokens, background_sample(tokens, 0.3, rng)) for rng in
             (np.random.default_rng(i) for i in range(400))]  # fmt: skip
    mean = torch.stack(draws).mean()
    (mean_grad,) = torch.autograd.grad(mean, model.output.weight)
    assert abs(float(mean.detach()) - float(full.detach())) < 0.02 * float(full.detach())
    assert float((mean_grad - full_grad).norm() / full_grad.norm()) < 0.05
    # share 1 keeps every position: the full loss exactly
    everything = background_sample(tokens, 1.0, np.random.default_rng(0))
    assert torch.allclose(weighted_loss(model, tokens[:, :-1], cond, None, tokens, everything), full, atol=1e-6)


def test_a_grid_start_of_the_position_embedding_is_a_row_part_plus_a_column_part():
    from mulo.train.stages.ar import init_positions

    model = tiny_gpt(3, VOCAB, SIDE)
    torch.manual_seed(0)
    init_positions(model, "grid")
    n_cond = model.config.cond_len
    image = torch.cat([model.abs_pe[0, n_cond:], torch.zeros(1, model.config.dim)])[: SIDE * SIDE]
    pe = image.detach().reshape(SIDE, SIDE, -1)[:-1]  # full rows only (the last token is never fed)
    # pe(r1, c1) + pe(r2, c2) == pe(r1, c2) + pe(r2, c1): slots one row apart differ alike everywhere
    assert torch.allclose(pe[0, 1] + pe[2, 3], pe[0, 3] + pe[2, 1], atol=1e-7)
    assert torch.allclose(pe[1, 0] - pe[0, 0], pe[1, 2] - pe[0, 2], atol=1e-7)
    assert len({tuple(v.tolist()) for v in pe.reshape(-1, pe.shape[-1])}) == pe.shape[0] * pe.shape[1]  # distinct
    assert 0.005 < float(pe.std()) < 0.05  # the scale of the random start
    init_positions(model, "normal")  # every slot its own random vector: no such structure
    pe = model.abs_pe[0, n_cond:].detach()[: (SIDE - 1) * SIDE].reshape(SIDE - 1, SIDE, -1)
    assert not torch.allclose(pe[0, 1] + pe[2, 3], pe[0, 3] + pe[2, 1], atol=1e-4)
    with pytest.raises(ValueError, match="'normal' or 'grid'"):
        init_positions(model, "rope")


def test_codes_that_look_alike_start_alike_under_the_pixel_start():
    from mulo.train.loop import init_weights
    from mulo.train.stages.ar import init_from_pixels

    model = tiny_gpt(3, VOCAB, SIDE, dim_preset="llama-abs-tiny")  # 64 wide
    torch.manual_seed(0)
    model.apply(init_weights)
    gen = torch.Generator().manual_seed(2)
    squares = torch.rand(VOCAB, 48, generator=gen)
    squares[1] = squares[0] + 0.01 * torch.randn(48, generator=gen)  # a look-alike of code 0
    init_from_pixels(model, squares, share=0.9)

    def cosine(weight, a, b):
        return float(F.cosine_similarity(weight[a], weight[b], dim=0))

    for weight in (model.tok_embeddings.weight.detach(), model.output.weight.detach()):
        alike, others = cosine(weight, 0, 1), [cosine(weight, 0, c) for c in range(2, VOCAB)]
        assert alike > 0.6 and alike > max(others) + 0.2, (alike, others)
        assert 0.01 < float(weight.std()) < 0.03  # the random start's scale
    with pytest.raises(ValueError, match="a codebook of 12 squares for a model of 11 codes"):
        init_from_pixels(model, torch.rand(12, 48))


def test_object_losses_score_the_tokens_off_the_background():
    from mulo.train.stages.ar import object_losses

    model = tiny_gpt(3, VOCAB, SIDE).requires_grad_(False)
    tokens, cond = scene_batch(5), torch.randn(5, 2, 4)
    losses = F.cross_entropy(model(tokens[:, :-1], cond).transpose(1, 2), tokens, reduction="none")
    hits = model(tokens[:, :-1], cond).argmax(-1) == tokens
    objects = tokens != 3
    got = object_losses(model, tokens, cond, "cpu", batch=2)
    assert got["object_loss"] == pytest.approx(float(losses[objects].mean()), abs=1e-4)
    assert got["background_loss"] == pytest.approx(float(losses[~objects].mean()), abs=1e-4)
    assert got["object_accuracy"] == pytest.approx(float(hits[objects].float().mean()), abs=1e-4)


def test_noisy_inputs_replace_a_share_with_codes_or_with_tokens_of_the_same_scene():
    from mulo.train.stages.ar import noisy_inputs

    tokens = scene_batch(400)
    codes = noisy_inputs(tokens, 0.1, "codes", VOCAB, np.random.default_rng(0))
    scene = noisy_inputs(tokens, 0.1, "scene", VOCAB, np.random.default_rng(0))
    # the same positions are drawn for both kinds; about a tenth of them change
    changed = float((codes != tokens).float().mean())
    assert 0.07 < changed < 0.1  # a replacement may draw the token already there
    for row, noisy in zip(tokens, scene, strict=True):
        assert set(noisy.tolist()) <= set(row.tolist())  # never a code the scene does not hold
    assert 0.03 < float((scene != tokens).float().mean()) < 0.1  # mostly its background: often unchanged
    assert torch.equal(noisy_inputs(tokens, 0.0, "scene", VOCAB, np.random.default_rng(0)), tokens)
    with pytest.raises(ValueError, match="input noise kind"):
        noisy_inputs(tokens, 0.1, "pixels", VOCAB, np.random.default_rng(0))


def test_open_cells_are_where_no_object_lies_within_reach_before_them():
    """``open_cells``: the cells where the next token begins an object or stays background. Crafted:
    one 2x2 object at rows 3-4, columns 3-4 of an 8x8 scene, reach 2 (the rows above reach one row
    back, the row itself one cell back)."""
    scene = torch.zeros(8, 8, dtype=torch.long)
    scene[3:5, 3:5] = 7
    opened = open_cells(scene.reshape(1, -1), 8, 2).reshape(8, 8)
    covered = {(3, 4), (3, 5), (4, 2), (4, 3), (4, 4), (4, 5), (5, 2), (5, 3), (5, 4), (5, 5)}
    assert {(r, c) for r in range(8) for c in range(8) if not opened[r, c]} == covered
    assert opened[3, 3]  # the object's first token: where it began, decided by the prompt
    # it reads the prefix only: whatever comes at and after a cell, its openness stays (a weight by
    # context, so the weighted loss is least at the data's conditionals)
    g = torch.Generator().manual_seed(0)
    scenes = torch.zeros(16, 16 * 16, dtype=torch.long)
    scenes[torch.rand(scenes.shape, generator=g) < 0.06] = 3
    before = open_cells(scenes, 16, 4)
    for cell in (0, 40, 77, 200, 255):
        changed = scenes.clone()
        changed[:, cell:] = torch.where(torch.rand(changed[:, cell:].shape, generator=g) < 0.1, 5, changed[:, cell:])
        assert torch.equal(open_cells(changed, 16, 4)[:, : cell + 1], before[:, : cell + 1]), cell


def test_before_the_first_object_is_every_cell_up_to_a_scenes_first_object_token():
    """``before_first_object``: the cells whose prefix is all background (the first object token
    included: where it began), a weight by context like ``open_cells``."""
    scenes = torch.tensor([[5, 5, 5, 1, 5, 2], [5, 5, 5, 5, 5, 5], [3, 5, 5, 5, 5, 5]])
    assert before_first_object(scenes).int().tolist() == [[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [1, 0, 0, 0, 0, 0]]
    g = torch.Generator().manual_seed(1)
    scenes = torch.zeros(16, 64, dtype=torch.long)
    scenes[torch.rand(scenes.shape, generator=g) < 0.03] = 3
    before = before_first_object(scenes)
    for cell in (0, 9, 30, 63):  # what comes at and after a cell never moves its weight
        changed = scenes.clone()
        changed[:, cell:] = torch.where(torch.rand(changed[:, cell:].shape, generator=g) < 0.2, 4, changed[:, cell:])
        assert torch.equal(before_first_object(changed)[:, : cell + 1], before[:, : cell + 1]), cell


def test_scene_weights_weigh_the_first_start_and_open_cells_whatever_the_background_share():
    scene = torch.zeros(8, 8, dtype=torch.long)
    scene[3:5, 3:5] = 7  # one 2x2 object, first token at (3, 3)
    tokens = scene.reshape(1, -1)
    first, opened = before_first_object(tokens), open_cells(tokens, 8, 2)
    rng = np.random.default_rng(0)
    assert scene_weights(tokens, Budget(), 8, 2, rng) is None  # every token alike: the plain loss
    weights = scene_weights(tokens, Budget(first_start_weight=5.0), 8, 2, rng)
    assert torch.equal(weights, torch.where(first, 5.0, 1.0))
    weights = scene_weights(tokens, Budget(first_start_weight=5.0, open_weight=3.0), 8, 2, rng)
    assert torch.equal(weights, torch.where(first, 5.0, 1.0) * torch.where(opened, 3.0, 1.0))
    sampled = scene_weights(
        tokens, Budget(background_loss_share=0.5, first_start_weight=5.0), 8, 2, np.random.default_rng(1)
    )
    drawn = background_sample(tokens, 0.5, np.random.default_rng(1))  # the same draw
    assert torch.equal(sampled, drawn * torch.where(first, 5.0, 1.0))
