"""Up-samplers: row-causal (or reading their whole block), and they never disturb committed rows."""

import pytest
import torch

from tests.helpers import tiny_vq_model


def test_learned_upsampler_is_row_causal(toy):
    up = toy.upsampler("learned", 2)
    low = torch.randint(toy.vocab_size, (4, 4), generator=torch.Generator().manual_seed(0))
    changed = low.clone()
    changed[3] = (changed[3] + 1) % toy.vocab_size  # only the last low-res row differs
    with torch.no_grad():
        a, b = up(low[None]), up(changed[None])
    assert torch.equal(a[..., :6, :], b[..., :6, :])  # high rows 0..5 only see low rows 0..2
    assert not torch.equal(a[..., 6:, :], b[..., 6:, :])
    high = torch.full((8, 8), -1)
    assert up.upsample(low, high, (1, 3)).shape == (4, 8)


def test_a_block_upsampler_reads_the_rows_below_in_its_block_and_none_past_it():
    """``context="block"``: a sprite's top children see the rows under their parent, as far as the
    drafted block goes; ``upsample(low, high, (a, b))`` still never reads a row at or past ``b``."""
    from mulo.models.upsample import TokenUpsampler

    torch.manual_seed(0)
    up = TokenUpsampler(32, 2, width=8, depth=2, context="block").eval()
    low = torch.randint(32, (4, 4), generator=torch.Generator().manual_seed(0))
    changed = low.clone()
    changed[3] = (changed[3] + 1) % 32
    with torch.no_grad():
        a, b = up(low[None]), up(changed[None])
    assert not torch.equal(a[..., 2:6, :], b[..., 2:6, :])  # low rows 1, 2 read row 3 (two 3x3 layers)
    assert torch.equal(a[..., :2, :], b[..., :2, :])  # row 0 is three rows up: out of reach
    high = torch.full((8, 8), -1)
    assert torch.equal(up.upsample(low, high, (0, 3)), up.upsample(changed, high, (0, 3)))
    assert not torch.equal(up.upsample(low, high, (0, 4)), up.upsample(changed, high, (0, 4)))
    with pytest.raises(ValueError, match="context must be 'rows' or 'block'"):
        TokenUpsampler(32, 2, context="columns")


def test_pixel_upsampler_and_downsampler_shapes(toy):
    pixel = toy.upsampler("pixel", 2)
    low = torch.randint(toy.vocab_size, (4, 4), generator=torch.Generator().manual_seed(1))
    high = torch.full((8, 8), -1)
    first = pixel.upsample(low, high, (0, 2))
    assert first.shape == (4, 8) and (first >= 0).all() and (first < toy.vocab_size).all()
    high[:4] = first
    # The next block's tokens do not depend on rows below it.
    nxt = pixel.upsample(low, high, (2, 3))
    altered = low.clone()
    altered[3] = (altered[3] + 7) % toy.vocab_size
    assert torch.equal(nxt, pixel.upsample(altered, high, (2, 3)))
    assert pixel.downsample(high, (0, 2)).shape == (2, 4)


def test_vq_round_trip_shapes(toy):
    tokens = torch.randint(toy.vocab_size, (1, 8, 8))
    images = toy.vq.decode(tokens)
    assert images.shape == (1, 3, 32, 32) and images.min() >= 0 and images.max() <= 1
    assert toy.vq.encode(images).shape == (1, 8, 8)


def test_a_tiled_vq_reads_and_draws_each_tile_alone():
    """A ``VQModel`` tokenizer with a tile: the same tokens as the whole model on each tile cut
    out by hand, and a token changed in one tile redraws that tile only."""
    from mulo.models.vq import VQTokenizer

    whole = VQTokenizer(tiny_vq_model())
    tiled = VQTokenizer(whole.model, tile=16)  # 4 x 4 tokens a tile at 4 px a token
    images = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    tokens = tiled.encode(images)
    assert tokens.shape == (2, 8, 8)
    by_hand = whole.encode(images[:, :, 16:, :16])  # the bottom-left tile as an image of its own
    assert torch.equal(tokens[:, 4:, :4], by_hand)
    assert not torch.equal(tokens, whole.encode(images))  # the conv net's context crosses tiles
    changed = tokens.clone()
    changed[0, 5, 1] = (changed[0, 5, 1] + 1) % whole.vocab_size  # in the bottom-left tile
    before, after = tiled.decode(tokens), tiled.decode(changed)
    assert torch.allclose(before[:, :, :16], after[:, :, :16]) and torch.allclose(
        before[:, :, :, 16:], after[:, :, :, 16:]
    )
    assert not torch.allclose(before[0, :, 16:, :16], after[0, :, 16:, :16])
    assert torch.allclose(tiled.decode(tokens[:, :4, :4]), whole.decode(tokens[:, :4, :4]))  # one tile: as whole


def test_upsampling_agreement_of_a_perfect_drafter(toy):
    from mulo.eval.ceilings import upsampling_agreement

    side = toy.grid[0] * toy.vq.downsample
    flat = torch.ones(3, 3, side, side) * torch.tensor([0.1, 0.5, 0.9])[:, None, None, None]
    # a flat image survives area down-sizing and bicubic up-sizing unchanged: every code returns
    assert upsampling_agreement(toy.vq, toy.upsampler("pixel", 2), flat, 2)["from_pixels"] == 1.0
    noise = torch.rand(3, 3, side, side, generator=torch.Generator().manual_seed(0))
    for kind in ("pixel", "learned"):
        shares = upsampling_agreement(toy.vq, toy.upsampler(kind, 2), noise, 2)
        assert 0.0 <= shares["from_tokens"] <= 1.0 and shares["from_pixels"] < 1.0


def test_the_head_on_some_positions_is_the_head_on_all(toy):
    """The scenes' up-sampler loss runs the head on the positions it scores only (``head_rows``):
    the same logits as the 1x1 convolution over the whole grid."""
    up = toy.upsampler("learned", 2)
    low = torch.randint(toy.vocab_size, (2, 4, 4), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        whole = up(low)  # [B, V, 8, 8]
        features = up.features(low).permute(0, 2, 3, 1).reshape(-1, up.head.in_channels)
        rows = up.head_rows(features[::3])
    assert torch.allclose(rows, whole.permute(0, 2, 3, 1).reshape(-1, toy.vocab_size)[::3], atol=1e-5)
