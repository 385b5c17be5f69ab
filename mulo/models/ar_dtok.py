"""Reading Tar's original AR-DTok checkpoints (``ar_dtok_lp_{256,512,1024}px.pth``) into ``GPT``.

File layout: ``{"model": {"name": preset, "args": constructor fields, "sd": state dict}}``.
The preset fixes (n_layer, n_head, dim); ``args`` holds the rest. Our parameter names are the
original ones, so the state dict loads as is. Nothing pickled is executed (weights_only).
"""

from __future__ import annotations

from pathlib import Path

import torch

from mulo.models.gpt import GPT, PRESETS, GPTConfig

# Constructor defaults of the original argument dataclass that matter at inference.
_DEFAULTS = dict(
    n_kv_head=None,
    multiple_of=256,
    ffn_dim_multiplier=None,
    norm_eps=1e-5,
    model_type="class_cond",
    cond_dim=1152,
    vocab_size=8192,
    cls_token_num=1,
    max_seq_len=2048,
)


def config_from_checkpoint(name: str, args: dict) -> GPTConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown AR-DTok size preset {name!r}; known: {', '.join(PRESETS)}")
    merged = {**_DEFAULTS, **args}
    if merged["model_type"] != "clip_cond":
        raise ValueError(f"AR-DTok model_type {merged['model_type']!r} is not supported (Tar uses 'clip_cond')")
    if merged.get("use_fixed_pe"):
        raise ValueError("AR-DTok checkpoints with fixed sin-cos position embeddings are not supported")
    return GPTConfig.preset(
        name,
        n_kv_head=merged["n_kv_head"],
        vocab_size=merged["vocab_size"],
        max_seq_len=merged["max_seq_len"],
        cond_type="features",
        cond_len=merged["cls_token_num"],
        cond_dim=merged["cond_dim"],
        multiple_of=merged["multiple_of"],
        ffn_dim_multiplier=merged["ffn_dim_multiplier"],
        norm_eps=merged["norm_eps"],
    )


def load_ar_dtok(source: str | Path | dict, device="cpu", dtype=torch.float32) -> GPT:
    checkpoint = source if isinstance(source, dict) else torch.load(source, map_location="cpu", weights_only=True)
    try:
        entry = checkpoint["model"]
        name, args, state = entry["name"], entry["args"], entry["sd"]
    except (KeyError, TypeError):
        raise ValueError("not an AR-DTok checkpoint: expected {'model': {'name', 'args', 'sd'}}") from None
    model = GPT(config_from_checkpoint(name, args))
    expected = model.abs_pe.shape
    if tuple(state["abs_pe"].shape) != tuple(expected):
        raise ValueError(f"abs_pe has shape {tuple(state['abs_pe'].shape)}, the config implies {tuple(expected)}")
    model.load_state_dict(state, strict=True)
    return model.to(device=device, dtype=dtype).eval()
