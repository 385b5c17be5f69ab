"""The VQ stage's windows and loop (``mulo.train.stages.vq``): what a tiled VQ trains on is what
it reads at inference, tiles on the token grid, mostly where there is something to draw."""

from dataclasses import replace

import numpy as np
import pytest
import torch
from diffusers import VQModel

from mulo.models.vq import VQTokenizer
from mulo.train.recipes import RECIPES, Hyper, vq_config
from mulo.train.stages.vq import Windows, fit_vq

SCALE = 4096


def scenes(count: int, side: int, busy_every: int = 0) -> torch.Tensor:
    """Flat grey images whose pixels at (y, x) also carry their coordinates (channels 1 and 2, in
    ``SCALE``ths: too faint to make a window busy), with a bright 8 px square at (8, 8) in every
    ``busy_every``-th image (0: none)."""
    ys, xs = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
    images = torch.zeros(count, 3, side, side)
    images[:, 1], images[:, 2] = ys / SCALE, xs / SCALE
    images[:, 0] = 0.5
    if busy_every:
        images[::busy_every, 0, 8:16, 8:16] = 1.0
    return images


def test_tiled_windows_sit_on_the_token_grid_and_spread_by_tiles():
    images = [scenes(8, 128), scenes(8, 64), scenes(8, 32)]
    windows = Windows(images, np.random.default_rng(0), crop=32, tile=32, grid=4)
    assert windows.share.tolist() == pytest.approx([16 / 21, 4 / 21, 1 / 21])
    counts = np.array([windows.counts(42) for _ in range(300)])
    assert (counts.sum(1) == 42).all()
    assert counts.mean(0) / 42 == pytest.approx(windows.share, abs=0.01)
    for size, side in enumerate((128, 64, 32)):
        drawn = windows.draw(size, 64)
        assert drawn.shape == (64, 3, 32, 32)
        tops, lefts = (drawn[:, 1, 0, 0] * SCALE).round(), (drawn[:, 2, 0, 0] * SCALE).round()
        assert (tops % 4 == 0).all() and (lefts % 4 == 0).all()  # the token phase inference sees
        assert tops.max() <= side - 32 and lefts.max() <= side - 32
        if side > 32:
            assert len(set(tops.tolist())) > 1 and len(set(lefts.tolist())) > 1


def test_busy_windows_are_the_asked_share():
    images = [scenes(16, 64, busy_every=1)]  # an 8 px square at (8, 8): 16 in 81 windows hold part of it
    holding = {}
    for busy in (0.0, 0.3):
        windows = Windows(images, np.random.default_rng(1), crop=32, tile=32, busy=busy, grid=4)
        drawn = torch.cat([windows.draw(0, 40) for _ in range(25)])
        holding[busy] = float((drawn[:, 0] == 1.0).flatten(1).any(1).float().mean())
    assert holding[0.0] == pytest.approx(16 / 81, abs=0.04)
    assert holding[0.3] == pytest.approx(0.3, abs=0.02)


def test_untiled_windows_are_whole_images_or_one_crop_a_batch():
    images = [scenes(6, 64), scenes(6, 32)]
    windows = Windows(images, np.random.default_rng(0), crop=32)
    assert windows.counts(12) == [6, 6]
    crops = windows.draw(0, 5)
    assert crops.shape == (5, 3, 32, 32)
    assert torch.equal(crops[:, 1:, 0, 0], crops[:1, 1:, 0, 0].expand(5, -1))  # one corner for the batch
    assert torch.equal(windows.draw(1, 4)[:, 1:], images[1][:4, 1:])  # at the crop size: whole


def test_a_tiled_vq_trains_on_its_windows_and_resumes(tmp_path):
    """A few steps of a tiny spatially normalised VQ: the loss falls, the recipe's tile travels
    to the tokenizer, and a stopped run continues from its checkpoint to the same weights."""
    images = [scenes(6, 64, busy_every=2), scenes(6, 32, busy_every=2)]
    # (diffusers' spatial norm groups the features by 32)
    widths = dict(block_out_channels=(32, 32, 32), norm_num_groups=8, latent_channels=8)
    config = vq_config(16, 4, **widths, norm_type="spatial")
    assert config["vq_embed_dim"] == 8  # diffusers' spatial norm takes the latents at latent_channels
    hyper = replace(Hyper(), vq_tile=32, vq_busy=0.5, vq_restart_every=3, vq_lr=3e-3)

    def run(steps: int, folder) -> tuple[VQModel, dict, list]:
        torch.manual_seed(0)
        folder.mkdir(exist_ok=True)
        vq, seen = VQModel(**config), []
        windows = Windows(images, np.random.default_rng(0), crop=32, tile=32, busy=0.5)
        stats = fit_vq("vq", vq, windows, 4, steps, folder / "vq.ckpt", hyper, every=4, on_step=seen.append)
        return vq, stats, seen

    vq, stats, seen = run(12, tmp_path / "a")
    assert seen == list(range(12)) and np.isfinite(stats["final_loss"])
    tok = VQTokenizer(vq.eval(), hyper.vq_tile)
    assert tok.encode(images[0][:2]).shape == (2, 16, 16)
    error = float(((tok.decode(tok.encode(images[0])) - images[0]) ** 2).mean())
    untrained = VQTokenizer(VQModel(**config).eval(), hyper.vq_tile)
    assert error < float(((untrained.decode(untrained.encode(images[0])) - images[0]) ** 2).mean())
    # a run stopped at step 4 goes on from its checkpoint: the model, the optimizer and the step
    run(4, tmp_path / "b")
    _, _, seen = run(12, tmp_path / "b")
    assert seen == list(range(4, 12))


def test_the_scenes_recipe_reads_squares_of_pixels_and_the_others_whole_images():
    scenes_recipe = RECIPES["scenes"]
    assert scenes_recipe.vq_model == {"kind": "patches"} and not scenes_recipe.hyper.vq_tile
    assert vq_config(1024, 4, **scenes_recipe.vq_model) == {"kind": "patches", "patch": 4, "codes": 1024}
    assert all(not r.hyper.vq_tile for r in RECIPES.values())  # no VQModel recipe reads tiles now


def test_a_folded_vq_reads_each_token_s_pixels_as_channels_and_learns(tmp_path):
    """``fold=4``: one block at the token grid, 48 channels in and out; the tokenizer still maps
    a 4 px patch to a token, tiles stay independent, and a few steps of ``fit_vq`` lower its error."""
    from mulo.models.vq import folded

    config = vq_config(16, 4, fold=4, block_out_channels=(32,), norm_num_groups=8, latent_channels=8)
    assert (config["in_channels"], config["block_out_channels"], len(config["up_block_types"])) == (48, (32,), 1)
    with pytest.raises(ValueError, match="block widths"):
        vq_config(16, 4, fold=4)  # three widths for one block
    with pytest.raises(ValueError, match="folds 1, 2 or 4"):
        vq_config(16, 4, fold=8)
    assert vq_config(16, 8, fold=4, block_out_channels=(32,))["block_out_channels"] == (32, 32)  # one halving left
    torch.manual_seed(0)
    vq = VQModel(**config)
    tok = VQTokenizer(vq.eval(), 32)
    assert folded(vq) == 4 and tok.downsample == 4
    images = scenes(6, 64, busy_every=2)
    codes = tok.encode(images)
    assert codes.shape == (6, 16, 16)
    # a change inside one 32 px tile changes no token of the other tiles
    moved = images.clone()
    moved[:, :, 40:44, 40:44] = 1.0
    changed = (tok.encode(moved) != codes).any(0)
    assert not changed[:8].any() and not changed[:, :8].any()  # other tiles: untouched
    before = float(((tok.decode(codes) - images) ** 2).mean())
    hyper = replace(Hyper(), vq_tile=32, vq_busy=0.5, vq_lr=3e-3)
    windows = Windows([images], np.random.default_rng(0), crop=32, tile=32, busy=0.5)
    fit_vq("vq", vq, windows, 4, 10, tmp_path / "vq.ckpt", hyper, every=100)
    tok = VQTokenizer(vq.eval(), 32)
    assert float(((tok.decode(tok.encode(images)) - images) ** 2).mean()) < before
