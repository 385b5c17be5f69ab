"""The ``tokens`` stage of the emoji families' training (``mulo.train.pipeline.Pipeline``): every
image encoded by the run's VQ at the three sizes and every text's mini-CLIP condition computed
once, into ``tokens.npz``, so the AR, up-sampler and EAGLE stages need neither the renders nor
the encoders."""

from __future__ import annotations

import logging

import numpy as np
import torch

from mulo.train import styles
from mulo.train.data import to_float

log = logging.getLogger(__name__)

ENCODE_CHUNK = 256  # images per VQ encoding call
CONDITION_CHUNK = 512  # texts per mini-CLIP call
RENDER_CHUNK = 2048  # augmented copies rendered at once: 60,000 copies do not fit in memory together


@torch.no_grad()
def stage_tokens(pipe) -> None:
    d = pipe.data
    tok = pipe.tokenizer()
    clip = pipe.load_clip()
    grids = {f"tokens{size}": encode(pipe, tok, pipe.images_at(size)) for size in pipe.recipe.sizes}
    # Augmented copies of the training images (styled data): rows after the originals, each
    # with the original it copies in ``source`` (its texts and split are the original's).
    source = np.arange(len(d.names))
    if pipe.budget.augment_copies and d.styles:
        copies = augmented_tokens(pipe, tok)
        source = np.concatenate([source, copies.pop("source")])
        grids = {k: np.concatenate([grids[k], copies[k]]) for k in grids}
    # (The scenes' fresh training scenes are encoded by the stages that read them, chunk by chunk as
    # their batches reach them: a run resumed on another machine then encodes only what its stages
    # still read, not the ~80,000 scenes of the whole plan first, ~35 CPU-minutes.)
    np.savez(
        pipe.run / "tokens.npz",
        **grids,
        **text_conditions(pipe, clip),
        is_val=d.is_val,
        keys=np.array(d.keys, dtype=str),
        source=source,
        **({"split": d.split} if d.split is not None else {}),
    )


def text_conditions(pipe, clip) -> dict[str, np.ndarray]:
    """fp16 mini-CLIP conditions of every image's name, description (and, on styled data, name
    with its style word), and of every short prompt once with each image's slice of them."""
    d = pipe.data
    # Short prompts are shared between images ("face" for 170 of them): features once per
    # phrase, and per image a slice short_ids[short_ptr[i] : short_ptr[i + 1]] into them.
    phrases = list(dict.fromkeys(p for ps in d.short_prompts for p in ps))
    index = {p: j for j, p in enumerate(phrases)}
    short_ids = np.array([index[p] for ps in d.short_prompts for p in ps], dtype=np.int32)
    short_ptr = np.cumsum([0, *map(len, d.short_prompts)])
    texts = {"cond_name": d.names, "cond_text": d.texts, "cond_short": phrases}
    if d.styles:
        texts["cond_name_style"] = [pipe.text_of(i, "name_style") for i in range(len(d.names))]
    conds = {}
    for name, batch_texts in texts.items():
        ids = clip.tokenizer.batch(batch_texts)
        chunks = range(0, len(ids), CONDITION_CHUNK)
        features = [clip.condition_features(ids[i : i + CONDITION_CHUNK].to(pipe.device)).cpu() for i in chunks]
        conds[name] = torch.cat(features).numpy().astype(np.float16)
    return {**conds, "short_ids": short_ids, "short_ptr": short_ptr}


def encode(pipe, tok, images: torch.Tensor) -> np.ndarray:
    """int16 token grids of ``images`` (floats in [0, 1])."""
    chunks = range(0, len(images), ENCODE_CHUNK)
    parts = [tok.encode(images[i : i + ENCODE_CHUNK].to(pipe.device)).cpu() for i in chunks]
    return torch.cat(parts).numpy().astype(np.int16)


def augmented_tokens(pipe, tok) -> dict[str, np.ndarray]:
    """``budget.augment_copies`` copies of every training image, each shrunk and moved alike at
    the three sizes (``styles.random_placement``), rendered from its SVG and encoded."""
    d = pipe.data
    items = styles.items(pipe.cache, pipe.recipe.styles, pipe.budget.images)
    if [item.key for item in items] != list(d.keys):
        raise RuntimeError("the styled emoji no longer match the cached data set: delete the cache's emoji-*.npz")
    sizes = pipe.recipe.sizes
    train_idx = np.flatnonzero(~d.is_val)
    rng = pipe.rng("augment")
    copies = pipe.budget.augment_copies
    jobs = [(i, styles.random_placement(rng, min(sizes))) for i in train_idx for _ in range(copies)]
    parts = {px: [] for px in sizes}
    for start in range(0, len(jobs), RENDER_CHUNK):
        rendered = styles.render_many([(items[i], place) for i, place in jobs[start : start + RENDER_CHUNK]], sizes)
        for px in sizes:
            parts[px].append(encode(pipe, tok, to_float(rendered[px])))
    out = {f"tokens{px}": np.concatenate(parts[px]) for px in sizes}
    out["source"] = np.array([i for i, _ in jobs], dtype=np.int64)
    log.info("tokens: %d augmented copies of %d training images", len(jobs), len(train_idx))
    return out
