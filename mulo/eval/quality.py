"""A family's quality metrics at inference time, with no data set: FD and prompt adherence.

A family names its inputs in ``Family.evaluation`` (``mulo.families.base.Evaluation``): the
encoder whose feature space the metrics use and the folder of their files. ``twemoji`` ships them
next to its weights: ``eval_prompts.json`` (the fixed prompt list, one base emoji each) and
``eval_reference.npz`` (mini-CLIP features of the real image of every prompted emoji, and the
names, keys and short prompts of all 3,786 images for retrieval, the short prompts packed by
``pack_prompts``), written by the model card from the data set (``Quality.from_images``, then
``save``). Families without evaluation inputs (toy, tar) have no quality metrics; the benchmark
then reports speed only.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

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
    """FD and prompt adherence of generated images in ``clip``'s feature space: the one image
    scorer of the benchmark, the defaults search and the model card.

    ``prompts`` [(key, prompt)] are the evaluation list; ``real`` maps each of their keys to the
    features of its real image (what FD compares with); ``text_names`` / ``text_keys`` are the
    retrieval texts and the emoji each names, ``short_prompts`` each text's short prompts; a
    (text, key) pair given more than once (one per style) is kept once, with the union of its
    short prompts, so that top-5 means five different texts."""

    def __init__(self, clip, prompts, real: dict, text_names: list[str], text_keys: list[str], short_prompts):
        self.clip, self.prompts, self.real = clip, list(prompts), real
        shorts: dict[tuple[str, str], list[str]] = {}  # each pair once, in first-seen order
        for name, key, phrases in zip(text_names, text_keys, short_prompts, strict=True):
            merged = shorts.setdefault((name, key), [])
            merged.extend(p for p in phrases if p not in merged)
        self.text_names, self.text_keys = [name for name, _ in shorts], [key for _, key in shorts]
        self.short_prompts = list(shorts.values())
        self.text_embeddings = clip.embed_texts(self.text_names)  # once for every scored image
        self.fits = prompt_index(self.text_names, self.text_keys, self.short_prompts)

    @classmethod
    def from_images(cls, clip, prompts, real_images: np.ndarray, text_names, text_keys, short_prompts) -> Quality:
        """From the real images of ``prompts`` (one each, in order), as the model card builds it."""
        real = dict(zip([key for key, _ in prompts], image_features(clip, real_images), strict=True))
        return cls(clip, prompts, real, text_names, text_keys, short_prompts)

    @classmethod
    def load(cls, clip, folder: Path) -> Quality:
        """What ``save`` wrote into ``folder``."""
        prompts = [(e["key"], e["prompt"]) for e in json.loads((folder / "eval_prompts.json").read_text())]
        ref = np.load(folder / "eval_reference.npz")
        real = dict(zip(ref["keys"].tolist(), ref["features"], strict=True))
        names, keys = ref["text_names"].tolist(), ref["text_keys"].tolist()
        return cls(clip, prompts, real, names, keys, unpack_prompts(ref["text_short_prompts"]))

    def save(self, folder: Path) -> None:
        """The evaluation list and what the metrics need at inference, without the data set: the real
        images' features of the prompted emoji and the retrieval texts (benchmark, app)."""
        entries = [{"key": k, "prompt": p} for k, p in self.prompts]
        (folder / "eval_prompts.json").write_text(json.dumps(entries, indent=0))
        np.savez_compressed(
            folder / "eval_reference.npz",
            keys=np.array(list(self.real)),
            features=np.stack(list(self.real.values())).astype(np.float32),
            text_names=np.array(self.text_names),
            text_keys=np.array(self.text_keys),
            text_short_prompts=pack_prompts(self.short_prompts),
        )

    @classmethod
    def for_family(cls, family):
        """The metrics of ``family`` from its ``evaluation`` inputs; None when it has none, or its
        folder does not hold them (yet). A family with a referee (``Evaluation.referee``: emoji
        scenes) is scored by it (``mulo.eval.scene_quality.SceneQuality``)."""
        evaluation = family.evaluation
        if evaluation is None or not (evaluation.folder / "eval_reference.npz").exists():
            return None
        if evaluation.referee is not None:
            from mulo.eval.scene_quality import SceneQuality

            return SceneQuality.load(evaluation.encoder, evaluation.folder, evaluation.referee)
        return cls.load(evaluation.encoder, evaluation.folder)

    def judge(self, image, prompt: str) -> None:
        """No referee's verdict for this family: the mini-CLIP's retrieval (``prompt_rank``) scores it."""
        return None

    @property
    def keys(self) -> list[str]:
        """The emoji of the evaluation prompts, in order."""
        return [key for key, _ in self.prompts]

    def keys_for(self, prompt: str) -> set[str]:
        """The emoji a prompt names: its full name or one of its short prompts ("pizza", "sun");
        empty for a prompt that is neither."""
        return self.fits.get(" ".join(words(prompt)), set())

    def adherence(self, images, keys: list) -> float:
        """Share of ``images`` (uint8 ``[N, h, w, 3]`` or floats ``[N, 3, h, w]``) whose top-5 retrieved
        texts hold the emoji of ``keys`` (one key, or a set of keys any of which counts, per image)."""
        return adherence(self.clip, images, keys, self.text_names, self.text_keys, text_embeddings=self.text_embeddings)

    def score(self, images, keys: list[str]) -> dict:
        """``images`` generated for the emoji ``keys`` -> {"fd", "adherence"}.

        FD compares against the real images of the same emoji (needs N >= 2, else None; noisy for small N)."""
        real = np.stack([self.real[k] for k in keys])
        fd = frechet_distance(image_features(self.clip, images), real) if len(keys) >= 2 else None
        return {"fd": fd, "adherence": self.adherence(images, keys)}

    @torch.no_grad()
    def prompt_rank(self, image: np.ndarray, keys: set[str]) -> int:
        """Where the best text of ``keys``'s emoji ranks among every retrieval text for one image
        (uint8 ``[h, w, 3]``), 1 = nearest; ``adherence`` counts an image whose rank is at most 5."""
        x = torch.as_tensor(image)[None].permute(0, 3, 1, 2).float() / 255
        similarity = (self.clip.embed_images(x) @ self.text_embeddings.T)[0].cpu()
        ours = torch.tensor([key in keys for key in self.text_keys])
        return int((similarity > similarity[ours].max()).sum()) + 1

    @torch.no_grad()
    def real_adherence(self) -> float:
        """``adherence`` of the real images of the evaluation prompts (from their stored features):
        what a perfect generator scores, the reference beside a generated image's score."""
        features = torch.as_tensor(np.stack([self.real[key] for key in self.keys]))
        device = self.clip.logit_scale.device
        embedded = torch.nn.functional.normalize(self.clip.image.project(features.to(device)), dim=-1)
        best = (embedded @ self.text_embeddings.T).topk(5, dim=-1).indices.cpu().tolist()
        return float(
            np.mean([any(self.text_keys[j] == key for j in row) for row, key in zip(best, self.keys, strict=True)])
        )
