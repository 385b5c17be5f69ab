"""Decode-only TA-Tok reproduces Tar's ``decode_from_bottleneck`` (golden tiny checkpoint)."""

import copy
import os

import pytest
import torch

from mulo.models.ta_tok import load_ta_tok

ATOL = 1e-4


@pytest.fixture(scope="module")
def ref(golden_dir):
    return torch.load(os.path.join(golden_dir, "ta_tok_tiny_ref.pt"), weights_only=True)


@pytest.fixture(scope="module")
def checkpoint(golden_dir):
    return torch.load(os.path.join(golden_dir, "ta_tok_tiny.pth"), map_location="cpu", weights_only=True)


@pytest.fixture(scope="module")
def model(golden_dir):
    return load_ta_tok(os.path.join(golden_dir, "ta_tok_tiny.pth"))


def close(actual, expected):
    torch.testing.assert_close(actual, expected, atol=ATOL, rtol=ATOL)


def test_loaded_sizes(model):
    assert (model.width, model.codebook_size, model.bottleneck_dim) == (48, 128, 8)
    assert len(model.decoder.encoder.layers) == 2  # decoder_depth from args
    assert not model.decoder.config.vision_use_head
    assert not any(name.startswith(("encoder", "teacher")) for name in model.state_dict())


@torch.no_grad()
def test_intermediates_3x3(model, ref):
    indices = ref["indices_3x3"]
    close(model.codebook(), ref["codebook"])
    z = model.bottleneck_decode(indices)
    close(z, ref["bottleneck_decode_3x3"])
    close(model.decoder_last_hidden(z), ref["decoder_last_hidden_3x3"])


@torch.no_grad()
@pytest.mark.parametrize("grid", ["3x3", "20x20"])  # 3x3 down-samples the 16x16 position grid, 20x20 up-samples
def test_decode_from_bottleneck(model, ref, grid):
    out = model.decode(ref[f"indices_{grid}"])
    close(out, ref[f"decode_from_bottleneck_{grid}"])


@torch.no_grad()
def test_transformers_5x_key_names_load_the_same(checkpoint, ref):
    """Files saved under transformers 5.x have no ``vision_model`` level in the decoder keys."""
    renamed = copy.copy(checkpoint["model"])
    renamed["sd"] = {k.replace("decoder.vision_model.", "decoder.", 1): v for k, v in renamed["sd"].items()}
    assert not any(k.startswith("decoder.vision_model.") for k in renamed["sd"])
    model = load_ta_tok({"model": renamed})
    close(model.decode(ref["indices_20x20"]), ref["decode_from_bottleneck_20x20"])


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"state_dict": {}}, "not a TA-Tok checkpoint"),
        ({"model": {"sd": {}}}, "not a TA-Tok checkpoint"),
        ({"model": {"args": {"decoder_depth": 2}, "sd": {}}}, "bottleneck_dim"),
    ],
)
def test_wrong_layout_is_rejected(tmp_path, bad, message):
    path = tmp_path / "bad.pth"
    torch.save(bad, path)
    with pytest.raises(ValueError, match=message):
        load_ta_tok(path)


def test_missing_and_foreign_keys_are_rejected(checkpoint):
    entry = checkpoint["model"]
    missing = dict(entry["sd"])
    del missing["decode_task_layer.2.bias"]
    with pytest.raises(ValueError, match="lacks 1 decode-path key.*decode_task_layer.2.bias"):
        load_ta_tok({"model": {**entry, "sd": missing}})
    foreign = {**entry["sd"], "something.else": torch.zeros(1)}
    with pytest.raises(ValueError, match="unexpected key.*something.else"):
        load_ta_tok({"model": {**entry, "sd": foreign}})


def test_non_square_token_count_is_rejected(model):
    with pytest.raises(ValueError, match="not a perfect square"):
        model.decode(torch.zeros(1, 10, dtype=torch.long))
