"""The emoji scenes family's quality metrics (issue 63): prompt match by its exact referee
(``mulo.eval.referee``) as adherence, FD as for the other families.

The same interface as ``mulo.eval.quality.Quality`` (``prompts``, ``keys``, ``score``,
``adherence``, ``real_adherence``, ``save``), so the model card, the benchmark, the calibration and
the sweeps score scenes unchanged, plus ``judge``: the referee's verdict on one image (what it
found, what is missing), which the app's quality line shows. A key is the evaluation prompt itself.

The family declares its referee in ``Evaluation.referee`` (the sprite file its export ships in its
assets folder); ``Quality.for_family`` builds this scorer for it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from mulo.eval.metrics import frechet_distance, image_features
from mulo.eval.referee import Referee, Sprites, Verdict

PROMPTS_FILE = "eval_prompts.json"
REFERENCE_FILE = "eval_reference.npz"


def as_uint8(images) -> np.ndarray:
    """``[N, h, w, 3]`` uint8 from uint8 images or ``[N, 3, h, w]`` floats in [0, 1]."""
    x = torch.as_tensor(images)
    if x.dtype != torch.uint8:
        x = (x.detach().float().cpu().clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1)
    return x.cpu().numpy()


class SceneQuality:
    """FD in ``clip``'s image features against the real scenes of the same prompts, and the
    referee's prompt match. ``prompts`` [(key, prompt)] with key == prompt; ``real`` maps each
    key to its real scene's features; ``real_match`` is the referee's share on the real scenes."""

    def __init__(self, clip, prompts, real: dict, referee: Referee, real_match: float):
        self.clip, self.prompts, self.real, self.referee = clip, list(prompts), real, referee
        self.real_match = real_match

    @classmethod
    def from_images(cls, clip, sprites: Sprites, prompts, real_images: np.ndarray) -> SceneQuality:
        referee = Referee(sprites)
        keys = [key for key, _ in prompts]
        real = dict(zip(keys, image_features(clip, real_images), strict=True))
        quality = cls(clip, prompts, real, referee, 0.0)
        quality.real_match = quality.adherence(real_images, keys)
        return quality

    @classmethod
    def load(cls, clip, folder: Path, sprites_file: Path) -> SceneQuality:
        prompts = [(e["key"], e["prompt"]) for e in json.loads((folder / PROMPTS_FILE).read_text())]
        with np.load(folder / REFERENCE_FILE) as ref:
            real = dict(zip(ref["keys"].tolist(), ref["features"], strict=True))
            match = float(ref["real_match"])
        return cls(clip, prompts, real, Referee(Sprites.load(sprites_file)), match)

    def save(self, folder: Path) -> None:
        entries = [{"key": k, "prompt": p} for k, p in self.prompts]
        (folder / PROMPTS_FILE).write_text(json.dumps(entries, indent=0))
        np.savez_compressed(
            folder / REFERENCE_FILE,
            keys=np.array(list(self.real)),
            features=np.stack(list(self.real.values())).astype(np.float32),
            real_match=np.float64(self.real_match),
        )

    @property
    def keys(self) -> list[str]:
        return [key for key, _ in self.prompts]

    def judge(self, image: np.ndarray, prompt: str) -> Verdict:
        """The referee's verdict on one uint8 ``[h, w, 3]`` image for ``prompt`` (PromptError, a
        ValueError, when the prompt is not one the family's grammar reads)."""
        return self.referee.prompt_match(np.asarray(image), prompt)

    def adherence(self, images, keys: list[str]) -> float:
        """Share of ``images`` the referee finds to match their prompts (``keys``)."""
        images = as_uint8(images)
        return float(np.mean([self.judge(image, key).match for image, key in zip(images, keys, strict=True)]))

    def parts(self, images, keys: list[str]) -> dict[str, float]:
        """``verdict_parts`` of ``images`` judged against their prompts (``keys``)."""
        return verdict_parts([self.judge(image, key) for image, key in zip(as_uint8(images), keys, strict=True)])

    def score(self, images, keys: list[str]) -> dict:
        real = np.stack([self.real[k] for k in keys])
        fd = frechet_distance(image_features(self.clip, images), real) if len(keys) >= 2 else None
        return {"fd": fd, "adherence": self.adherence(images, keys)}

    def real_adherence(self) -> float:
        return self.real_match


def verdict_parts(verdicts) -> dict[str, float]:
    """What prompt matches are made of, over referee ``verdicts``: the share of named emoji found
    exactly once and the share of images on the asked background (they tell apart models that
    match few prompts whole, the short study's)."""
    named = sum(len(v.prompt.objects) for v in verdicts)
    return {
        "objects_found": round(sum(len(v.found) for v in verdicts) / max(named, 1), 4),
        "background_right": round(float(np.mean([v.background_ok for v in verdicts])), 4),
    }
