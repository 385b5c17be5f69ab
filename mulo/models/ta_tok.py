"""Decode-only TA-Tok: Tar's text-aligned tokenizer, ``decode_from_bottleneck`` path only.

Tar's LLM emits TA-Tok code indices; ``decode_from_bottleneck`` turns them into SigLIP-width features
that condition AR-DTok. The computation, for indices [B, N] with N = p * p:

1. SimVQ codebook ``C = l2norm(embedding @ Wp^T + bp)`` (normalised only when ``l2_normalized``);
   ``z = out_linear(l2norm(C[indices]))`` -> [B, N, D_b].
2. A SigLIP2 (NaFlex) vision transformer with patch size 1 reads ``z`` as B images of p x p one-pixel
   patches with D_b channels (all-ones attention mask), adds its learned 16x16 position grid resized to
   p x p, runs ``decoder_depth`` pre-LN blocks and ``post_layernorm``.
3. ``decode_task_layer``: Linear(H, H) -> tanh -> Linear(H, H). Output [B, N, H].

The decoder is ``transformers.Siglip2VisionModel`` built without its attention-pooling head (the
original evaluates that head and throws the result away).

Checkpoint layout (``ta_tok.pth``): ``{"model": {"args": constructor kwargs, "sd": state dict}}``.
The state dict also holds the SigLIP teacher (``encoder.*``), encode-only layers
(``encode_task_layer.*``, ``bottleneck.in_linear.*``, ``scale_layer.*``) and the decoder's pooling
head; the loader drops all of those. Decoder keys come as ``decoder.vision_model.*`` (saved with
transformers 4.x, as Tar pins) or ``decoder.*`` (5.x); both are accepted and mapped to whatever the
installed transformers uses. Nothing pickled is executed (``weights_only=True``).

Footprint of the released file (H = 1152, 3 decoder layers with MLP 3072, K = 65536, and D_b = 1536,
the believed value: it is read from the file's args, not assumed), counted from the shapes:

* decode path kept here: 147,308,544 parameters: the codebook ``embedding`` 100,663,296 (K x D_b),
  ``embedding_proj`` + ``out_linear`` 4,721,664, the SigLIP2 decoder 39,267,072, ``decode_task_layer``
  2,656,512;
* the whole state dict (527 keys): 591,032,000 parameters + 6 buffer values, adding the so400m teacher
  vision tower with its head (428,225,600), the decoder's discarded pooling head (12,398,592) and the
  encode-only layers (3,099,264). The decode path is about 25% of the file (0.59 GB of 2.36 GB in fp32).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers import Siglip2VisionConfig, Siglip2VisionModel

DEFAULT_DECODER_DEPTH = 3  # the original constructor's default when args has no "decoder_depth"

# State-dict prefixes the decode path never reads: the SigLIP teacher, encode-only layers.
_DROPPED_PREFIXES = ("encoder.", "teacher", "encode_task_layer.", "bottleneck.in_linear.", "scale_layer.")
# Original names -> ours, for everything outside the SigLIP2 decoder.
_RENAMED_PREFIXES = (
    ("bottleneck.regularizer.embedding_proj.", "embedding_proj."),
    ("bottleneck.regularizer.embedding.", "embedding."),
    ("bottleneck.out_linear.", "out_linear."),
    ("decode_task_layer.", "decode_task_layer."),
)
# Decoder key prefixes, transformers 4.x style first (it is the longer one).
_DECODER_PREFIXES = ("decoder.vision_model.", "decoder.")
_PATCH_EMBEDDING = "embeddings.patch_embedding.weight"


def decoder_config(width: int, bottleneck_dim: int, depth: int) -> Siglip2VisionConfig:
    """The original decoder config: library defaults with four overrides. The defaults are spelled
    out so that a transformers release changing them cannot silently change the architecture."""
    return Siglip2VisionConfig(
        patch_size=1,
        num_hidden_layers=depth,
        num_channels=bottleneck_dim,
        hidden_size=width,
        num_attention_heads=12,
        intermediate_size=3072,
        num_patches=256,
        layer_norm_eps=1e-6,
        hidden_act="gelu_pytorch_tanh",
        attention_dropout=0.0,
        vision_use_head=False,  # the pooled output is discarded by decode_from_bottleneck
    )


def square_side(n: int) -> int:
    """Side p of the p x p token grid holding n tokens."""
    p = math.isqrt(n) if n > 0 else 0
    if p * p != n or p == 0:
        raise ValueError(f"TA-Tok decodes a square token grid; got N={n} tokens, which is not a perfect square")
    return p


class TATokDecoder(nn.Module):
    """TA-Tok code indices [B, N] -> features [B, N, H] (``decode_from_bottleneck``)."""

    def __init__(
        self,
        codebook_size: int,
        bottleneck_dim: int,
        width: int,
        decoder_depth: int = DEFAULT_DECODER_DEPTH,
        l2_normalized: bool = True,
    ):
        super().__init__()
        self.l2_normalized = bool(l2_normalized)
        self.embedding = nn.Embedding(codebook_size, bottleneck_dim)
        self.embedding_proj = nn.Linear(bottleneck_dim, bottleneck_dim)
        self.out_linear = nn.Linear(bottleneck_dim, bottleneck_dim)
        self.decoder = Siglip2VisionModel(decoder_config(width, bottleneck_dim, decoder_depth))
        self.decode_task_layer = nn.Sequential(nn.Linear(width, width), nn.Tanh(), nn.Linear(width, width))

    @property
    def width(self) -> int:
        return self.decoder.config.hidden_size

    @property
    def codebook_size(self) -> int:
        return self.embedding.num_embeddings

    @property
    def bottleneck_dim(self) -> int:
        return self.embedding.embedding_dim

    @property
    def decoder_key_prefix(self) -> str:
        """Where the SigLIP2 modules sit inside ``self.decoder`` (transformers 4.x nests them)."""
        return "vision_model." if hasattr(self.decoder, "vision_model") else ""

    def codebook(self) -> torch.Tensor:
        """Projected (and, when l2_normalized, row-normalised) codebook [K, D_b]."""
        table = self.embedding_proj(self.embedding.weight)
        return F.normalize(table, dim=-1) if self.l2_normalized else table

    def bottleneck_decode(self, indices: torch.Tensor) -> torch.Tensor:
        """Indices [B, N] -> bottleneck output [B, N, D_b], the decoder's input 'patches'."""
        if indices.dtype.is_floating_point or indices.dtype == torch.bool:
            raise ValueError(f"TA-Tok indices must be an integer tensor, got {indices.dtype}")
        if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= self.codebook_size):
            raise ValueError(
                f"TA-Tok indices must lie in [0, {self.codebook_size}); "
                f"got range [{int(indices.min())}, {int(indices.max())}]"
            )
        z = F.embedding(indices, self.codebook())
        if self.l2_normalized:
            z = F.normalize(z, dim=-1)  # a no-op up to rounding, kept as the original does it
        return self.out_linear(z)

    def decoder_last_hidden(self, z: torch.Tensor) -> torch.Tensor:
        """Bottleneck output [B, N, D_b] -> decoder last_hidden_state [B, N, H] (after post_layernorm)."""
        if z.dim() != 3:
            raise ValueError(f"expected bottleneck output [B, N, D_b], got shape {tuple(z.shape)}")
        b, n, _ = z.shape
        p = square_side(n)
        out = self.decoder(
            pixel_values=z,
            pixel_attention_mask=torch.ones(b, n, dtype=torch.long, device=z.device),
            spatial_shapes=torch.tensor([[p, p]] * b, dtype=torch.long, device=z.device),
        )
        return out.last_hidden_state

    def decode(self, indices: torch.Tensor) -> torch.Tensor:
        """Tar's ``decode_from_bottleneck``: indices [B, N] (N a perfect square) -> features [B, N, H]."""
        if indices.dim() != 2:
            raise ValueError(f"expected TA-Tok indices [B, N], got shape {tuple(indices.shape)}")
        square_side(indices.shape[1])  # fail before any work on a non-square N
        return self.decode_task_layer(self.decoder_last_hidden(self.bottleneck_decode(indices)))

    forward = decode


def _read_args(args) -> dict:
    """The decode-relevant constructor arguments; training-only and unknown keys are ignored."""
    if not isinstance(args, dict):
        raise ValueError(f"TA-Tok 'args' must be a dict, got {type(args).__name__}")
    try:
        spec = args["bottleneck"]
        bargs = spec["args"]
        reg = bargs["regularizer"]
        rargs = reg["args"]
        dim, size = int(bargs["bottleneck_dim"]), int(rargs["codebook_size"])
    except (KeyError, TypeError, ValueError):
        raise ValueError(
            "TA-Tok args must hold bottleneck.args.bottleneck_dim and bottleneck.args.regularizer.args.codebook_size"
        ) from None
    if spec.get("name", "bottleneck") != "bottleneck":
        raise ValueError(f"TA-Tok bottleneck {spec['name']!r} is not supported (expected 'bottleneck')")
    if reg.get("name", "simvq") != "simvq":
        raise ValueError(f"TA-Tok regularizer {reg['name']!r} is not supported (expected 'simvq')")
    return dict(
        bottleneck_dim=dim,
        codebook_size=size,
        l2_normalized=bool(rargs.get("l2_normalized", False)),  # the original constructor's default
        decoder_depth=int(args.get("decoder_depth", DEFAULT_DECODER_DEPTH)),
    )


def _our_name(key: str, decoder_prefix: str) -> str | None:
    """Our name for an original key: "" when the decode path drops it, None when it is unknown."""
    if key.startswith(_DROPPED_PREFIXES):
        return ""
    for old, ours in _RENAMED_PREFIXES:
        if key.startswith(old):
            return ours + key[len(old) :]
    for old in _DECODER_PREFIXES:
        if key.startswith(old):
            inner = key[len(old) :]
            # The attention-pooling head is evaluated by the original and its result discarded.
            return "" if inner.startswith("head.") else "decoder." + decoder_prefix + inner
    return None


def decode_state_dict(state: dict, decoder_prefix: str = "") -> dict:
    """Keep the decode-path keys of an original TA-Tok state dict, renamed to ``TATokDecoder``'s names.

    ``decoder_prefix`` is what the installed transformers puts between ``decoder.`` and the SigLIP2
    module names (``"vision_model."`` on 4.x, ``""`` on 5.x). Keys of no known kind raise.
    """
    out, unknown = {}, []
    for key, value in state.items():
        new = _our_name(key, decoder_prefix)
        if new is None:
            unknown.append(key)
        elif new:
            if new in out:
                raise ValueError(f"TA-Tok state dict holds {new!r} twice (mixed transformers 4.x and 5.x key names?)")
            out[new] = value
    if unknown:
        shown = ", ".join(sorted(unknown)[:5])
        raise ValueError(f"TA-Tok state dict has {len(unknown)} unexpected key(s): {shown}")
    return out


def _patch_embedding(state: dict) -> torch.Tensor:
    for prefix in _DECODER_PREFIXES:
        if prefix + _PATCH_EMBEDDING in state:
            return state[prefix + _PATCH_EMBEDDING]
    raise ValueError(
        f"TA-Tok state dict has no decoder patch embedding "
        f"('decoder.vision_model.{_PATCH_EMBEDDING}' or 'decoder.{_PATCH_EMBEDDING}')"
    )


def _load_file(path) -> dict:
    # mmap keeps the teacher (most of the released file) from ever being read into memory; files in
    # torch's legacy (non-zip) format cannot be mapped and are read whole.
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError as err:
        if "mmap" not in str(err):
            raise
        return torch.load(path, map_location="cpu", weights_only=True)


def load_ta_tok(source: str | Path | dict, device="cpu", dtype=torch.float32) -> TATokDecoder:
    """Build the decode-only TA-Tok from an original ``ta_tok.pth`` (path or already-loaded dict).

    With a dict source, CPU float32 parameters may share storage with the dict's tensors.
    """
    checkpoint = source if isinstance(source, dict) else _load_file(source)
    try:
        entry = checkpoint["model"]
        args, state = entry["args"], entry["sd"]
    except (KeyError, TypeError):
        raise ValueError("not a TA-Tok checkpoint: expected {'model': {'args', 'sd'}}") from None
    if not isinstance(state, dict):
        raise ValueError(f"TA-Tok 'sd' must be a state dict, got {type(state).__name__}")
    arch = _read_args(args)
    patch = _patch_embedding(state)
    if patch.dim() != 2 or patch.shape[1] != arch["bottleneck_dim"]:
        raise ValueError(
            f"decoder patch embedding has shape {tuple(patch.shape)}; expected [H, bottleneck_dim="
            f"{arch['bottleneck_dim']}] (a patch-size-1 linear embedding)"
        )
    width = int(patch.shape[0])
    if width % 12:
        raise ValueError(f"decoder width {width} is not divisible by the decoder's 12 attention heads")

    with torch.device("meta"):  # no throw-away random init; load_state_dict(assign=True) fills it
        model = TATokDecoder(
            arch["codebook_size"], arch["bottleneck_dim"], width, arch["decoder_depth"], arch["l2_normalized"]
        )
    mapped = decode_state_dict(state, model.decoder_key_prefix)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(mapped))
    if missing:
        shown = ", ".join(missing[:5])
        raise ValueError(f"TA-Tok checkpoint lacks {len(missing)} decode-path key(s): {shown}")
    extra = sorted(set(mapped) - set(expected))
    if extra:  # e.g. more decoder layers than args' decoder_depth
        raise ValueError(f"TA-Tok checkpoint has {len(extra)} key(s) the config does not imply: {', '.join(extra[:5])}")
    for key, ref in expected.items():
        if tuple(mapped[key].shape) != tuple(ref.shape):
            raise ValueError(f"{key} has shape {tuple(mapped[key].shape)}, the config implies {tuple(ref.shape)}")
    model.load_state_dict(mapped, strict=True, assign=True)
    left = [name for name, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:  # a tensor outside the state dict would otherwise stay uninitialised
        raise ValueError(f"TA-Tok decoder tensors not filled by the checkpoint: {', '.join(left[:5])}")
    return model.to(device=device, dtype=dtype).eval()
