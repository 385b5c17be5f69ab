"""Reading LlamaGen's VQ-16 tokenizer (Tar's ``vq_ds16_t2i.pt``) into a ``diffusers.VQModel``.

File layout: ``{"model": state dict}`` and nothing else, so the architecture is inferred from tensor
shapes. Nothing pickled is executed (weights_only).

The two networks are the same computation under different names:

* ResnetBlock ``conv2(swish(norm2(conv1(swish(norm1(x)))))) + shortcut(x)`` with a 1x1 ``nin_shortcut``
  where the width changes = diffusers ``ResnetBlock2D`` (1x1 ``conv_shortcut``, output scale 1, no temb).
* AttnBlock (GroupNorm, 1x1-conv q/k/v/proj_out, one head, ``softmax(q.k * c^-0.5)``, residual) =
  diffusers ``Attention`` built by the VAE blocks with ``attention_head_dim = width`` (one head, default
  scale ``c^-0.5``), linear ``to_q/to_k/to_v/to_out.0`` (the 1x1 conv kernels squeezed), residual on.
* Downsample (zero-pad right/bottom by one, 3x3 stride-2 conv, no padding) = ``Downsample2D`` with
  ``padding=0``, which the diffusers ``Encoder`` always uses. Upsample (nearest x2, 3x3 conv) =
  ``Upsample2D``.
* Every GroupNorm: 32 groups, eps 1e-6, affine -- the diffusers ``Encoder``/``Decoder`` hard-code eps
  1e-6 and take the group count from ``norm_num_groups``.
* Decoder level ``k`` of LlamaGen is encoder level ``L-1-k``, exactly the order of diffusers ``up_blocks``;
  LlamaGen's decoder has ``num_res_blocks + 1`` ResnetBlocks per level, as diffusers' ``layers_per_block + 1``.

Quantiser. LlamaGen (``codebook_l2_norm=True``) normalises both the latent and every codebook row, takes
the nearest code and outputs the normalised row. The diffusers quantiser normalises nothing, so the
codebook rows are normalised once here. With unit rows ``|z - e|^2 = |z|^2 + 1 - 2 z.e``, whose argmin
over ``e`` is the argmax of ``z.e`` -- the same index as for ``z / |z|`` -- and the output is the normalised
row either way (up to the rounding of the straight-through ``z + (e - z)``). What differs: the diffusers
quantiser's input is the *unnormalised* latent, so ``model.quantize(...)[0]`` is the same, but its commitment
loss is not LlamaGen's (training only).

What a diffusers ``VQModel`` cannot express, so the loader rejects it: ``ch_mult[0] != 1`` (LlamaGen's
``conv_in`` outputs ``ch`` and its first block widens; diffusers' ``conv_in`` outputs the first level width
directly), a 3x3 ``conv_shortcut`` (LlamaGen option, unused by VQ-16), attention in the encoder's middle
block but not the decoder's (or vice versa), and LlamaGen's ``norm_type="batch"`` variant (its norm layers
would carry running-statistics buffers, which are reported as unused keys). Codebooks trained without L2
normalisation (``codebook_l2_norm=False``) cannot be told apart from the file; VQ-16 uses it, and
``convert_vq16_state_dict(..., l2_norm_codebook=False)`` keeps the rows as stored for such a model.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import torch
import torch.nn.functional as F
from diffusers import VQModel

from mulo.models.vq import VQTokenizer

GROUPNORM_GROUPS = 32
_TRAINING_ONLY = ("quantize.codebook_used",)


def _shape(sd: Mapping, key: str) -> tuple[int, ...]:
    if key not in sd:
        raise ValueError(f"not a LlamaGen VQ state dict: missing {key!r}")
    return tuple(sd[key].shape)


def _indices(sd: Mapping, prefix: str) -> list[int]:
    """Sorted integers ``n`` such that some key starts with ``prefix + f"{n}."``."""
    pattern = re.compile(re.escape(prefix) + r"(\d+)\.")
    found = sorted({int(m.group(1)) for k in sd if (m := pattern.match(k))})
    if found != list(range(len(found))):
        raise ValueError(f"LlamaGen VQ state dict: indices under {prefix!r} are not 0..n-1: {found}")
    return found


def vq16_hparams(sd: Mapping) -> dict:
    """LlamaGen constructor values (``ch``, ``ch_mult``, ...) read from tensor shapes."""
    ch = _shape(sd, "encoder.conv_in.weight")[0]
    levels = _indices(sd, "encoder.conv_blocks.")
    if not levels:
        raise ValueError("not a LlamaGen VQ state dict: no encoder.conv_blocks")
    widths = [_shape(sd, f"encoder.conv_blocks.{i}.res.0.conv1.weight")[0] for i in levels]
    if any(w % ch for w in widths):
        raise ValueError(f"level widths {widths} are not multiples of the base width {ch}")
    n_res = len(_indices(sd, "encoder.conv_blocks.0.res."))
    n_codes, code_dim = _shape(sd, "quantize.embedding.weight")
    return {
        "in_channels": _shape(sd, "encoder.conv_in.weight")[1],
        "out_channels": _shape(sd, "decoder.conv_out.weight")[0],
        "ch": ch,
        "ch_mult": tuple(w // ch for w in widths),
        "z_channels": _shape(sd, "encoder.conv_out.weight")[0],
        "codebook_size": n_codes,
        "codebook_embed_dim": code_dim,
        "num_res_blocks": n_res,
        "encoder_attn_levels": tuple(i for i in levels if f"encoder.conv_blocks.{i}.attn.0.q.weight" in sd),
        "decoder_attn_blocks": tuple(
            k for k in _indices(sd, "decoder.conv_blocks.") if f"decoder.conv_blocks.{k}.attn.0.q.weight" in sd
        ),
        "encoder_mid_attn": "encoder.mid.1.q.weight" in sd,
        "decoder_mid_attn": "decoder.mid.1.q.weight" in sd,
    }


def vq16_config(sd: Mapping) -> dict:
    """``diffusers.VQModel`` constructor kwargs for a LlamaGen VQ state dict (shapes only are read)."""
    hp = vq16_hparams(sd)
    ch, ch_mult = hp["ch"], hp["ch_mult"]
    if ch_mult[0] != 1:
        raise ValueError(
            f"ch_mult[0] = {ch_mult[0]} != 1: LlamaGen's conv_in outputs ch={ch} channels, diffusers' outputs "
            "the first level width; a diffusers VQModel cannot express this"
        )
    if hp["encoder_mid_attn"] != hp["decoder_mid_attn"]:
        raise ValueError("mid-block attention in only one of encoder/decoder; diffusers VQModel shares the flag")
    n_levels = len(ch_mult)
    n_dec = len(_indices(sd, "decoder.conv_blocks."))
    if n_dec != n_levels:
        raise ValueError(f"encoder has {n_levels} levels, decoder {n_dec}")
    n_dec_res = len(_indices(sd, "decoder.conv_blocks.0.res."))
    if n_dec_res != hp["num_res_blocks"] + 1:
        raise ValueError(
            f"decoder has {n_dec_res} ResnetBlocks per level, expected num_res_blocks + 1 = {hp['num_res_blocks'] + 1}"
        )
    widths = tuple(ch * m for m in ch_mult)
    bad = [w for w in widths if w % GROUPNORM_GROUPS]
    if bad:
        raise ValueError(f"widths {bad} are not multiples of {GROUPNORM_GROUPS} GroupNorm groups")
    enc_attn, dec_attn = set(hp["encoder_attn_levels"]), set(hp["decoder_attn_blocks"])
    return {
        "in_channels": hp["in_channels"],
        "out_channels": hp["out_channels"],
        "down_block_types": tuple(
            "AttnDownEncoderBlock2D" if i in enc_attn else "DownEncoderBlock2D" for i in range(n_levels)
        ),
        "up_block_types": tuple(
            "AttnUpDecoderBlock2D" if k in dec_attn else "UpDecoderBlock2D" for k in range(n_levels)
        ),
        "block_out_channels": widths,
        "layers_per_block": hp["num_res_blocks"],
        "act_fn": "silu",
        "latent_channels": hp["z_channels"],
        "num_vq_embeddings": hp["codebook_size"],
        "vq_embed_dim": hp["codebook_embed_dim"],
        "norm_num_groups": GROUPNORM_GROUPS,
        "norm_type": "group",
        "mid_block_add_attention": hp["encoder_mid_attn"],
        "lookup_from_codebook": False,
    }


# (LlamaGen pattern, diffusers replacement); the first full match wins. Layer names inside a block are
# renamed afterwards by _LAYER (nin_shortcut -> conv_shortcut, attention norm/q/k/v/proj_out).
_RES = r"\.res\.(\d+)\.(norm1|conv1|norm2|conv2|nin_shortcut)\.(weight|bias)"
_MID_RES = r"\.(norm1|conv1|norm2|conv2|nin_shortcut)\.(weight|bias)"
_ATT = r"\.attn\.(\d+)\.(norm|q|k|v|proj_out)\.(weight|bias)"
_RULES = [
    (r"(encoder|decoder)\.(conv_in|conv_out)\.(weight|bias)", r"\1.\2.\3"),
    (r"(encoder|decoder)\.norm_out\.(weight|bias)", r"\1.conv_norm_out.\2"),
    (r"encoder\.conv_blocks\.(\d+)" + _RES, r"encoder.down_blocks.\1.resnets.\2.\3.\4"),
    (r"encoder\.conv_blocks\.(\d+)" + _ATT, r"encoder.down_blocks.\1.attentions.\2.\3.\4"),
    (r"encoder\.conv_blocks\.(\d+)\.downsample\.conv\.(weight|bias)", r"encoder.down_blocks.\1.downsamplers.0.conv.\2"),
    (r"decoder\.conv_blocks\.(\d+)" + _RES, r"decoder.up_blocks.\1.resnets.\2.\3.\4"),
    (r"decoder\.conv_blocks\.(\d+)" + _ATT, r"decoder.up_blocks.\1.attentions.\2.\3.\4"),
    (r"decoder\.conv_blocks\.(\d+)\.upsample\.conv\.(weight|bias)", r"decoder.up_blocks.\1.upsamplers.0.conv.\2"),
    (r"(encoder|decoder)\.mid\.0" + _MID_RES, r"\1.mid_block.resnets.0.\2.\3"),
    (r"(encoder|decoder)\.mid\.1\.(norm|q|k|v|proj_out)\.(weight|bias)", r"\1.mid_block.attentions.0.\2.\3"),
    (r"(encoder|decoder)\.mid\.2" + _MID_RES, r"\1.mid_block.resnets.1.\2.\3"),
    (r"(quant_conv|post_quant_conv)\.(weight|bias)", r"\1.\2"),
    (r"quantize\.embedding\.weight", "quantize.embedding.weight"),
]
_RULES = [(re.compile(p), r) for p, r in _RULES]
_LAYER = {
    "resnets": {"nin_shortcut": "conv_shortcut"},
    "attentions": {"norm": "group_norm", "q": "to_q", "k": "to_k", "v": "to_v", "proj_out": "to_out.0"},
}


def _rename(key: str) -> str | None:
    for pattern, replacement in _RULES:
        if pattern.fullmatch(key):
            new = pattern.sub(replacement, key)
            parts = new.split(".")
            if len(parts) >= 4 and parts[-4] in _LAYER:  # <block>.<resnets|attentions>.<j>.<layer>.<param>
                parts[-2] = _LAYER[parts[-4]].get(parts[-2], parts[-2])
            return ".".join(parts)
    return None


def _expected_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    with torch.device("meta"):
        model = VQModel(**config)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def convert_vq16_state_dict(sd: Mapping, l2_norm_codebook: bool = True) -> dict[str, torch.Tensor]:
    """LlamaGen VQ state dict -> ``diffusers.VQModel`` state dict (keys, 1x1 attention kernels, codebook).

    Raises ``ValueError`` naming every source key that has no place in the model and every model key
    left unfilled (or filled with the wrong shape).
    """
    expected = _expected_shapes(vq16_config(sd))
    out: dict[str, torch.Tensor] = {}
    unused = []
    for key, value in sd.items():
        if key in _TRAINING_ONLY:
            continue
        new = _rename(key)
        if new is None or new not in expected:
            unused.append(key)
            continue
        if ".attentions." in new and new.endswith(".weight") and value.dim() == 4:
            if tuple(value.shape[2:]) != (1, 1):
                raise ValueError(f"{key}: attention projection kernel {tuple(value.shape)} is not 1x1")
            value = value.reshape(value.shape[0], value.shape[1])
        if new == "quantize.embedding.weight" and l2_norm_codebook:
            value = F.normalize(value.float(), p=2, dim=-1).to(value.dtype)
        out[new] = value
    missing = sorted(set(expected) - set(out))
    wrong = sorted(f"{k} {tuple(v.shape)} != {expected[k]}" for k, v in out.items() if tuple(v.shape) != expected[k])
    problems = []
    if unused:
        problems.append(f"{len(unused)} source key(s) with no place in the diffusers VQModel: {', '.join(unused)}")
    if missing:
        problems.append(f"{len(missing)} diffusers key(s) left unfilled: {', '.join(missing)}")
    if wrong:
        problems.append(f"{len(wrong)} shape mismatch(es): {'; '.join(wrong)}")
    if problems:
        raise ValueError("cannot convert the LlamaGen VQ state dict: " + " | ".join(problems))
    return out


def load_vq16(source: str | Path | dict, device="cpu", dtype=torch.float32) -> VQTokenizer:
    """A LlamaGen VQ checkpoint (path, or the loaded ``{"model": state_dict}`` dict) as a ``VQTokenizer``."""
    checkpoint = source if isinstance(source, dict) else torch.load(source, map_location="cpu", weights_only=True)
    state = checkpoint.get("model") if isinstance(checkpoint, Mapping) else None
    if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        found = list(checkpoint)[:5] if isinstance(checkpoint, Mapping) else type(checkpoint).__name__
        raise ValueError(f"not a LlamaGen VQ checkpoint: expected {{'model': state_dict}}, found {found}")
    converted = convert_vq16_state_dict(state)
    model = VQModel(**vq16_config(state))
    model.load_state_dict(converted, strict=True)
    model = model.to(device=device)
    if dtype != torch.float32:  # diffusers warns on any dtype cast, even a no-op one
        model = model.to(dtype=dtype)
    return VQTokenizer(model.eval())
