"""Quality metrics on the twemoji family, in the mini-CLIP's feature space.

FD         Frechet distance between Gaussian fits of image features of generated and real
           images (FID's formula, with the family's own image encoder instead of Inception).
adherence  fraction of generated images whose top-5 retrieved texts (among every distinct emoji
           text) include a text of the prompted emoji.
"""

from __future__ import annotations

import numpy as np
import torch


def _sqrt_psd(matrix: np.ndarray) -> np.ndarray:
    values, vectors = np.linalg.eigh((matrix + matrix.T) / 2)
    return (vectors * np.sqrt(np.clip(values, 0, None))) @ vectors.T


def frechet_distance(a: np.ndarray, b: np.ndarray) -> float:
    """``||mu_a - mu_b||^2 + Tr(S_a) + Tr(S_b) - 2 Tr((S_a^1/2 S_b S_a^1/2)^1/2)`` for ``[N, D]`` features."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape[0] < 2 or b.shape[0] < 2:
        raise ValueError("the Frechet distance needs at least two samples on each side")
    mu_a, mu_b = a.mean(0), b.mean(0)
    cov_a, cov_b = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    root_a = _sqrt_psd(cov_a)
    cross = _sqrt_psd(root_a @ cov_b @ root_a)
    return float(((mu_a - mu_b) ** 2).sum() + np.trace(cov_a) + np.trace(cov_b) - 2 * np.trace(cross))


@torch.no_grad()
def image_features(clip, images: np.ndarray | torch.Tensor, batch: int = 256) -> np.ndarray:
    """``[N, h, w, 3]`` uint8 (or ``[N, 3, h, w]`` floats in [0, 1]) -> pooled image features."""
    x = torch.as_tensor(images)
    if x.dtype == torch.uint8:
        x = x.permute(0, 3, 1, 2).float() / 255
    device = clip.logit_scale.device
    return torch.cat([clip.image.features(x[i : i + batch].to(device)).cpu() for i in range(0, len(x), batch)]).numpy()


def prompt_index(names: list[str], keys: list[str], short_prompts: list[list[str]]) -> dict[str, set[str]]:
    """Every name and short prompt -> the keys of the emoji it fits ("sun" -> the six sun emoji):
    which retrievals count as adherent for a prompt that is not an emoji's full name."""
    index: dict[str, set[str]] = {}
    for name, key, shorts in zip(names, keys, short_prompts, strict=True):
        for phrase in (name, *shorts):
            index.setdefault(phrase, set()).add(key)
    return index


def distinct_texts(texts: list[str], text_keys: list[str]) -> list[int]:
    """Indices of the first occurrence of each (text, key) pair, in order.

    Why: a multi-style data set names an emoji once per style ("grinning face" five times, one
    embedding); counted as five texts, one wrong name fills all five retrieval slots and top-5
    silently becomes top-1 (emoji-16's real images: 0.61 instead of 0.83)."""
    seen: set[tuple[str, str]] = set()
    keep = []
    for i, pair in enumerate(zip(texts, text_keys, strict=True)):
        if pair not in seen:
            seen.add(pair)
            keep.append(i)
    return keep


@torch.no_grad()
def adherence(
    clip,
    images,
    prompt_keys: list[str | set[str]],
    texts: list[str],
    text_keys: list[str],
    top: int = 5,
    text_embeddings=None,
) -> float:
    """Fraction of images whose ``top`` nearest texts contain one with the prompted emoji's key.

    A prompt that fits several emoji ("sun") gives the set of their keys, any of which counts.
    ``texts`` must be distinct (text, key) pairs when ``text_embeddings`` (``clip.embed_texts(texts)``,
    to avoid recomputing them) is passed; without it repeated pairs are dropped here."""
    if text_embeddings is None:
        keep = distinct_texts(texts, text_keys)
        texts, text_keys = [texts[i] for i in keep], [text_keys[i] for i in keep]
    x = torch.as_tensor(images)
    if x.dtype == torch.uint8:
        x = x.permute(0, 3, 1, 2).float() / 255
    img = clip.embed_images(x)
    txt = clip.embed_texts(texts) if text_embeddings is None else text_embeddings
    best = (img @ txt.T).topk(top, dim=-1).indices.cpu().tolist()
    wanted = [{key} if isinstance(key, str) else set(key) for key in prompt_keys]
    hits = [any(text_keys[j] in keys for j in row) for row, keys in zip(best, wanted, strict=True)]
    return float(np.mean(hits))


def acceptance_by_detail(image: np.ndarray, rounds, flat_std: float = 0.02) -> tuple[float | None, float | None]:
    """Acceptance rate of the draft tokens over flat and over detailed tokens of the final image.

    A token is flat when the pixels it covers in ``image`` (``[h, w, 3]`` uint8) have a standard
    deviation under ``flat_std`` (mean over channels). ``rounds`` are a trace's rounds; a side
    with no draft token gives None. What MuLo-SD should show: flat regions accepted more often.
    """
    accepted = sum(np.asarray(r.accepted, float) for r in rounds)
    proposed = sum((np.asarray(r.draft) >= 0).astype(float) for r in rounds)
    grid_h, grid_w = proposed.shape
    h, w = image.shape[:2]
    patches = (image.astype(float) / 255).reshape(grid_h, h // grid_h, grid_w, w // grid_w, -1)
    flat = patches.std(axis=(1, 3)).mean(-1) < flat_std
    rates = []
    for region in (flat, ~flat):
        drafted = proposed[region].sum()
        rates.append(float(accepted[region].sum() / drafted) if drafted else None)
    return rates[0], rates[1]
