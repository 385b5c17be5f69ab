"""LlamaGen VQ-16 on a diffusers VQModel reproduces Tar's tokenizer on the tiny golden file (tests/data/golden_tar)."""

import os

import pytest
import torch
from diffusers import VQModel

from mulo.models.vq16 import convert_vq16_state_dict, load_vq16, vq16_config, vq16_hparams

ATOL = 1e-4


def close(actual, expected):
    torch.testing.assert_close(actual, expected, atol=ATOL, rtol=ATOL)


@pytest.fixture(scope="module")
def ref(golden_dir):
    return torch.load(os.path.join(golden_dir, "vq_tiny_ref.pt"), weights_only=True)


@pytest.fixture(scope="module")
def state(golden_dir):
    return torch.load(os.path.join(golden_dir, "vq_tiny.pt"), map_location="cpu", weights_only=True)["model"]


@pytest.fixture(scope="module")
def tok(golden_dir):
    return load_vq16(os.path.join(golden_dir, "vq_tiny.pt"))


def llamagen_shapes(ch, ch_mult, z, n_codes, code_dim, n_res=2):
    """Key -> shape of a LlamaGen VQ state dict, written from the README's description of the layout."""
    shapes = {}

    def conv(name, c_out, c_in, k=3):
        shapes[f"{name}.weight"] = (c_out, c_in, k, k)
        shapes[f"{name}.bias"] = (c_out,)

    def norm(name, c):
        shapes[f"{name}.weight"] = shapes[f"{name}.bias"] = (c,)

    def res(name, c_in, c_out):
        norm(f"{name}.norm1", c_in)
        conv(f"{name}.conv1", c_out, c_in)
        norm(f"{name}.norm2", c_out)
        conv(f"{name}.conv2", c_out, c_out)
        if c_in != c_out:
            conv(f"{name}.nin_shortcut", c_out, c_in, 1)

    def attn(name, c):
        norm(f"{name}.norm", c)
        for p in ("q", "k", "v", "proj_out"):
            conv(f"{name}.{p}", c, c, 1)

    def mid(name, c):
        res(f"{name}.mid.0", c, c)
        attn(f"{name}.mid.1", c)
        res(f"{name}.mid.2", c, c)

    widths = [ch * m for m in ch_mult]
    last = len(widths) - 1
    conv("encoder.conv_in", ch, 3)
    c = ch
    for i, w in enumerate(widths):
        for j in range(n_res):
            res(f"encoder.conv_blocks.{i}.res.{j}", c, w)
            c = w
        if i == last:
            for j in range(n_res):
                attn(f"encoder.conv_blocks.{i}.attn.{j}", w)
        else:
            conv(f"encoder.conv_blocks.{i}.downsample.conv", w, w)
    mid("encoder", c)
    norm("encoder.norm_out", c)
    conv("encoder.conv_out", z, c)
    conv("decoder.conv_in", c, z)
    mid("decoder", c)
    for k, w in enumerate(reversed(widths)):
        for j in range(n_res + 1):
            res(f"decoder.conv_blocks.{k}.res.{j}", c, w)
            c = w
        if k == 0:
            for j in range(n_res + 1):
                attn(f"decoder.conv_blocks.{k}.attn.{j}", w)
        if k != last:
            conv(f"decoder.conv_blocks.{k}.upsample.conv", w, w)
    norm("decoder.norm_out", c)
    conv("decoder.conv_out", 3, c)
    shapes["quantize.codebook_used"] = (65536,)
    shapes["quantize.embedding.weight"] = (n_codes, code_dim)
    conv("quant_conv", code_dim, z, 1)
    conv("post_quant_conv", z, code_dim, 1)
    return shapes


def meta_state(shapes):
    return {k: torch.empty(s, device="meta") for k, s in shapes.items()}


def test_tiny_config(state):
    assert {k: tuple(v.shape) for k, v in state.items()} == llamagen_shapes(32, (1, 1, 2, 2, 1), 16, 512, 8)
    hp = vq16_hparams(state)
    sizes = (hp["ch"], hp["ch_mult"], hp["z_channels"], hp["codebook_size"], hp["codebook_embed_dim"])
    assert sizes == (32, (1, 1, 2, 2, 1), 16, 512, 8)
    cfg = vq16_config(state)
    assert cfg["block_out_channels"] == (32, 32, 64, 64, 32) and cfg["layers_per_block"] == 2
    assert cfg["down_block_types"][-1] == "AttnDownEncoderBlock2D"
    assert cfg["up_block_types"][0] == "AttnUpDecoderBlock2D"
    assert cfg["down_block_types"].count("DownEncoderBlock2D") == cfg["up_block_types"].count("UpDecoderBlock2D") == 4


def test_real_vq16_shapes_convert():
    """Shape-only (meta) dict of the released vq_ds16_t2i.pt: config inference and full conversion."""
    shapes = llamagen_shapes(128, (1, 1, 2, 2, 4), 256, 16384, 8)
    assert len(shapes) == 344
    sd = meta_state(shapes)
    hp = vq16_hparams(sd)
    assert hp["ch_mult"] == (1, 1, 2, 2, 4) and hp["z_channels"] == 256 and hp["num_res_blocks"] == 2
    cfg = vq16_config(sd)
    assert cfg["block_out_channels"] == (128, 128, 256, 256, 512)
    assert (cfg["num_vq_embeddings"], cfg["vq_embed_dim"], cfg["latent_channels"]) == (16384, 8, 256)
    converted = convert_vq16_state_dict(sd)  # checks every key and shape against a meta VQModel
    with torch.device("meta"):
        model = VQModel(**cfg)
    assert model.load_state_dict(converted, strict=True, assign=True) is not None
    assert len(converted) == 343  # all but the codebook_used buffer


@torch.no_grad()
def test_encode(tok, ref):
    model = tok.model
    pre_quant = model.encode(ref["image"]).latents
    close(pre_quant, ref["pre_quant"])
    quant, _, (_, _, indices) = model.quantize(pre_quant)
    close(quant, ref["quant"])
    assert torch.equal(indices, ref["encode_indices"])
    close(model(ref["image"]).sample, ref["reconstruction"])


@torch.no_grad()
def test_decode_code_and_bottleneck(tok, ref):
    grid = ref["code_grid"]
    latents = tok.model.quantize.get_codebook_entry(grid.reshape(-1), (*grid.shape, tok.codebook.shape[1]))
    pixels = tok.model.decode(latents, force_not_quantize=True).sample
    close(pixels, ref["decode_code"])
    close(pixels * 0.5 + 0.5, ref["decode_from_bottleneck"])  # Tar's wrapper, before its clamp


def test_tokenizer_round_trip(tok, ref):
    assert tok.vocab_size == 512 and tok.downsample == 16
    tokens = tok.encode(ref["image"] * 0.5 + 0.5)
    assert tokens.shape == (1, 4, 4)
    assert torch.equal(tokens.reshape(-1), ref["encode_indices"])
    close(tok.decode(tokens), (ref["reconstruction"] * 0.5 + 0.5).clamp(0, 1))
    close(tok.decode(ref["code_grid"]), ref["decode_from_bottleneck"].clamp(0, 1))
    close(tok.codebook.norm(dim=1), torch.ones(512))


def test_wrong_layouts_raise(state, tmp_path):
    path = tmp_path / "bare.pt"
    torch.save(dict(state), path)  # a bare state dict, no {"model": ...}
    with pytest.raises(ValueError, match="expected \\{'model': state_dict\\}"):
        load_vq16(path)
    with pytest.raises(ValueError, match="expected"):
        load_vq16({"model": {"name": "x", "sd": {}}})
    extra = {**state, "encoder.extra.weight": torch.zeros(1)}
    with pytest.raises(ValueError, match="encoder.extra.weight"):
        convert_vq16_state_dict(extra)
    short = {k: v for k, v in state.items() if not k.startswith("decoder.conv_blocks.0.attn.2.")}
    with pytest.raises(ValueError, match="decoder.up_blocks.0.attentions.2.to_q.weight"):
        convert_vq16_state_dict(short)
