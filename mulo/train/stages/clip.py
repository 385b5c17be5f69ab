"""The ``clip`` stage of the emoji families' training (``mulo.train.pipeline.Pipeline``): the
mini-CLIP whose text features condition every AR model and whose image features are the space
of the quality metrics, trained contrastively on the 64 px renders."""

from __future__ import annotations

import json

import numpy as np
import torch

from mulo.models.text import IMAGE_PX, MiniCLIP, WordTokenizer
from mulo.train.loop import train
from mulo.train.recipes import COND_LEN, NAME_TEXT_PROB


def stage_clip(pipe) -> None:
    d, hyper = pipe.data, pipe.recipe.hyper
    torch.manual_seed(pipe.seed)
    texts = d.texts
    if pipe.recipe.scenes:  # every word the grammar writes, whether or not the held scenes use it
        from mulo.train.scenes import language_words

        texts = [*texts, *language_words(pipe.recipe.scenes)]
    clip = MiniCLIP(WordTokenizer.build(texts, COND_LEN).vocab, max_len=COND_LEN).to(pipe.device)
    train_idx = np.flatnonzero(~d.is_val)
    images = pipe.images_at(IMAGE_PX)  # the 64 px renders, not a resize of 128
    keys = np.array(d.keys)
    rng = pipe.rng("clip")

    def loss_fn(step):
        idx = rng.choice(train_idx, size=min(pipe.budget.clip_batch, len(train_idx)), replace=False)
        texts = sample_texts(pipe, idx, rng)
        shift = rng.integers(-hyper.clip_shift, hyper.clip_shift + 1, size=2)  # light translation augmentation
        batch = torch.roll(images[idx], shifts=tuple(int(s) for s in shift), dims=(2, 3))
        same = torch.from_numpy(keys[idx][:, None] == keys[idx][None, :])
        return clip.loss(batch.to(pipe.device), clip.tokenizer.batch(texts).to(pipe.device), same.to(pipe.device))

    stats = train(
        "clip",
        clip,
        loss_fn,
        pipe.budget.clip_steps,
        pipe.run / "clip.ckpt",
        lr=hyper.clip_lr,
        every=pipe.budget.checkpoint_every,
    )
    val = np.flatnonzero(d.is_val)
    from mulo.eval.metrics import adherence

    score = adherence(clip, images[val], [d.keys[i] for i in val], d.names, d.keys)
    torch.save(clip.state_dict(), pipe.run / "clip.pt")
    (pipe.run / "clip_vocab.json").write_text(json.dumps(clip.tokenizer.vocab))
    pipe.record("clip", **stats, val_top5_retrieval=round(score, 4), vocab=len(clip.tokenizer.vocab))


def sample_texts(pipe, idx, rng) -> list[str]:
    """Mini-CLIP's texts: the name (on styled data, ``style_word_prob`` of the time with the style
    word), else the full description (which names the style)."""
    d, out = pipe.data, []
    for i in idx:  # one-style data draws exactly what it drew before styles existed
        if rng.random() >= NAME_TEXT_PROB:
            out.append(d.texts[i])
        else:
            with_style = d.styles and rng.random() < pipe.recipe.hyper.style_word_prob
            out.append(pipe.text_of(i, "name_style" if with_style else "name"))
    return out
