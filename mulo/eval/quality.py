"""A family's quality metrics at inference time, with no data set: FD and prompt adherence.

A family names its inputs in ``Family.evaluation`` (``mulo.families.base.Evaluation``): the
encoder whose feature space the metrics use and the folder of their files. ``twemoji`` ships them
next to its weights: ``eval_prompts.json`` (the fixed prompt list, one base emoji each) and
``eval_reference.npz`` (mini-CLIP features of the real image of every prompted emoji, and the
names, keys and short prompts of all 3,786 images for retrieval, the short prompts packed by
``pack_prompts``). Families without evaluation inputs (toy, tar) have no quality metrics; the
benchmark then reports speed only.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from mulo.eval.metrics import adherence, frechet_distance, image_features, prompt_index
from mulo.models.text import words

PROMPT_SEP = "|"  # prompts are words (mulo.models.text.words) joined by spaces, so this never occurs in one


def pack_prompts(prompts: list[list[str]]) -> np.ndarray:
    """Per-image prompt lists as one string array (what ``np.savez`` stores without pickling)."""
    return np.array([PROMPT_SEP.join(p) for p in prompts])


def unpack_prompts(packed: np.ndarray) -> list[list[str]]:
    """The inverse of ``pack_prompts``."""
    return [p.split(PROMPT_SEP) if p else [] for p in packed.tolist()]


class Quality:
    def __init__(self, clip, folder: Path):
        self.clip = clip
        self.prompts: list[tuple[str, str]] = [
            (e["key"], e["prompt"]) for e in json.loads((folder / "eval_prompts.json").read_text())
        ]
        ref = np.load(folder / "eval_reference.npz")
        self.real = dict(zip(ref["keys"].tolist(), ref["features"], strict=True))
        self.text_names, self.text_keys = ref["text_names"].tolist(), ref["text_keys"].tolist()
        self.text_embeddings = clip.embed_texts(self.text_names)
        self.fits = prompt_index(self.text_names, self.text_keys, unpack_prompts(ref["text_short_prompts"]))

    def keys_for(self, prompt: str) -> set[str]:
        """The emoji a prompt names: its full name or one of its short prompts ("pizza", "sun");
        empty for a prompt that is neither."""
        return self.fits.get(" ".join(words(prompt)), set())

    @classmethod
    def for_family(cls, family) -> Quality | None:
        """The metrics of ``family`` from its ``evaluation`` inputs; None when it has none, or its
        folder does not hold them (yet)."""
        evaluation = family.evaluation
        if evaluation is None or not (evaluation.folder / "eval_reference.npz").exists():
            return None
        return cls(evaluation.encoder, evaluation.folder)

    def score(self, images: np.ndarray, keys: list[str]) -> dict:
        """``images [N, h, w, 3]`` uint8 generated for the emoji ``keys`` -> {"fd", "adherence"}.

        FD compares against the real images of the same emoji (needs N >= 2; noisy for small N)."""
        real = np.stack([self.real[k] for k in keys])
        return {
            "fd": frechet_distance(image_features(self.clip, images), real) if len(keys) >= 2 else None,
            "adherence": adherence(
                self.clip, images, keys, self.text_names, self.text_keys, text_embeddings=self.text_embeddings
            ),
        }
