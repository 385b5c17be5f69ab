"""The codebook of pixel squares (``mulo.models.patch_vq``): exact on what it holds, local, and
k-means finds the squares a data set is made of."""

import json

import pytest
import torch
from safetensors.torch import save_file

from mulo.models.patch_vq import PatchCodebook, fit_codebook, image_squares
from mulo.models.vq import PatchTokenizer, VQTokenizer, build_model, codes_in, make_tokenizer

PATCH = 4


def tiled(codes: torch.Tensor, book: torch.Tensor) -> torch.Tensor:
    """``[B, H, W]`` codes drawn with ``book`` ``[V, 48]``: ``[B, 3, 4H, 4W]``, each square a code's."""
    squares = book[codes].permute(0, 3, 1, 2)  # [B, 48, H, W] in pixel_unshuffle's order
    return torch.nn.functional.pixel_shuffle(squares, PATCH)


def random_book(codes: int, seed: int = 0) -> torch.Tensor:
    return torch.rand(codes, 3 * PATCH * PATCH, generator=torch.Generator().manual_seed(seed))


def test_images_made_of_codebook_squares_encode_and_decode_exactly():
    model = PatchCodebook(64, PATCH)
    model.squares = random_book(64)
    tok = PatchTokenizer(model)
    assert (tok.vocab_size, tok.downsample, tok.tile) == (64, 4, 4)
    codes = torch.randint(64, (3, 8, 6), generator=torch.Generator().manual_seed(1))
    images = tiled(codes, model.squares)
    assert images.shape == (3, 3, 32, 24)
    assert torch.equal(tok.encode(images), codes)
    assert torch.equal(tok.decode(codes), images)
    # a square near a code (slight noise) still reads as that code
    noisy = (images + 0.01 * torch.randn(images.shape, generator=torch.Generator().manual_seed(2))).clamp(0, 1)
    assert torch.equal(tok.encode(noisy), codes)
    with pytest.raises(ValueError, match="not a multiple of the VQ downsampling 4"):
        tok.encode(images[..., :22])


def test_a_changed_token_redraws_its_own_square_and_nothing_else():
    model = PatchCodebook(16, PATCH)
    model.squares = random_book(16, seed=3)
    tok = PatchTokenizer(model)
    codes = torch.randint(16, (1, 8, 8), generator=torch.Generator().manual_seed(4))
    changed = codes.clone()
    changed[0, 2, 5] = (codes[0, 2, 5] + 1) % 16
    differ = (tok.decode(changed) != tok.decode(codes)).any(1)[0]  # [32, 32] pixels
    expected = torch.zeros(32, 32, dtype=torch.bool)
    expected[8:12, 20:24] = True
    assert torch.equal(differ, expected)


def test_squares_read_in_the_order_the_tokenizer_draws_them():
    images = torch.rand(2, 3, 8, 12, generator=torch.Generator().manual_seed(5))
    squares = image_squares(images, PATCH)
    assert squares.shape == (2 * 2 * 3, 48)
    # the square of image 1, token row 1, column 2: pixels [4:8, 8:12], channel first
    assert torch.equal(squares[1 * 6 + 1 * 3 + 2], images[1, :, 4:8, 8:12].reshape(-1))


def test_k_means_recovers_the_squares_a_data_set_is_made_of():
    truth = random_book(12, seed=6)
    g = torch.Generator().manual_seed(7)
    data = truth[torch.randint(12, (3000,), generator=g)] + 0.02 * torch.randn(3000, 48, generator=g)
    centres = fit_codebook(data, 12, iterations=20, generator=torch.Generator().manual_seed(8))
    assert centres.shape == (12, 48)
    nearest = torch.cdist(truth, centres)
    assert nearest.argmin(1).unique().numel() == 12  # every true square has its own centre
    assert float(nearest.min(1).values.max()) < 0.05  # within the noise's mean (0.02 x sqrt(48) / sqrt(250))
    # the same seed gives the same codebook
    again = fit_codebook(data, 12, iterations=20, generator=torch.Generator().manual_seed(8))
    assert torch.equal(centres, again)


def test_fewer_distinct_squares_than_codes_repeat_squares():
    truth = random_book(5, seed=9)
    centres = fit_codebook(truth.repeat(40, 1), 8, iterations=3, generator=torch.Generator().manual_seed(0))
    assert centres.shape == (8, 48)
    on = torch.cdist(centres, truth).min(1)
    assert float(on.values.max()) < 1e-5 and on.indices.unique().numel() == 5  # every square, nothing else
    model = PatchCodebook(8, PATCH)
    model.squares = centres
    assert torch.allclose(model.squares[model.nearest(truth)], truth, atol=1e-5)


def test_the_exported_config_builds_the_codebook_and_its_tokenizer(tmp_path):
    from mulo.families.emoji import load_vq

    config = {"kind": "patches", "patch": PATCH, "codes": 32}
    model = build_model(config)
    assert isinstance(model, PatchCodebook) and model.squares.shape == (32, 48)
    model.squares = random_book(32, seed=10)
    assert codes_in(model.state_dict()) == 32
    assert isinstance(make_tokenizer(model, tile=32), PatchTokenizer)  # a VQModel's tile means nothing here
    # as the export writes it (fp16) and the family loads it
    save_file({"squares": model.squares.half()}, tmp_path / "vq.safetensors")
    (tmp_path / "vq.json").write_text(json.dumps(config))
    tok = load_vq(tmp_path)
    assert isinstance(tok, PatchTokenizer) and tok.vocab_size == 32
    assert torch.allclose(tok.codebook, model.squares, atol=1e-3)
    # and a VQModel config still builds a VQModel
    from mulo.train.recipes import vq_config

    assert isinstance(make_tokenizer(build_model(vq_config(8))), VQTokenizer)
