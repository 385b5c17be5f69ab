"""The Twemoji data set: 3,786 emoji images at 64 px with their names, from the npm package
``emoji-datasource-twitter@16.0.0`` (graphics CC-BY 4.0, Twitter, Inc. and other contributors).

Training only: inference never needs npm or the data. ``load`` fetches the package with
``npm pack`` into a cache folder, checks its sha512 integrity, composites every RGBA image over
white and caches the result as one ``.npz``.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import logging
import subprocess
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from mulo.eval.quality import pack_prompts, unpack_prompts
from mulo.models.text import words

log = logging.getLogger(__name__)

PACKAGE = "emoji-datasource-twitter@16.0.0"
TARBALL = "emoji-datasource-twitter-16.0.0.tgz"
INTEGRITY = "sha512-7F+uCuHH+7Qnrc15P5tnbvKkg9E6tlzi4MnT2uW1RlN4pLYTza6cP/dstIfSDMtpjFLWuZewWg8jBbuL2eyELQ=="
SKIN_TONES = {
    "1F3FB": "light skin tone",
    "1F3FC": "medium-light skin tone",
    "1F3FD": "medium skin tone",
    "1F3FE": "medium-dark skin tone",
    "1F3FF": "dark skin tone",
}
VAL_FRACTION = 0.05
NAME_STOP_WORDS = frozenset(["a", "an", "and", "of", "on", "in", "with", "the", "for", "sign", "symbol"])
SPLIT_SEED = 1234


@dataclass
class EmojiData:
    images: np.ndarray  # [N, 64, 64, 3] uint8, composited over white
    names: list[str]  # "red apple", "waving hand sign medium skin tone"
    texts: list[str]  # every word that describes the image: name, short names, (sub)category, tone
    keys: list[str]  # unified code of the base emoji (skin-tone variants share it)
    is_val: np.ndarray  # [N] bool: held-out validation split (fixed seed)
    # One-phrase prompts other than the name, each with a variant's skin tones: every short name
    # alone ("pizza" for "slice of pizza") and every content word of the name alone ("sun" for "sun
    # with face"). What people type, and never the name or the whole description.
    short_prompts: list[list[str]] = field(default_factory=list)
    # emoji.json's short names (":pizza:" -> "pizza"), each with a variant's skin tones.
    short_names: list[list[str]] = field(default_factory=list)

    def subset(self, mask: np.ndarray) -> EmojiData:
        idx = np.flatnonzero(mask)
        pick = lambda xs: [xs[i] for i in idx]  # noqa: E731
        return EmojiData(
            self.images[idx],
            pick(self.names),
            pick(self.texts),
            pick(self.keys),
            self.is_val[idx],
            pick(self.short_prompts),
            pick(self.short_names),
        )

    @property
    def train(self) -> EmojiData:
        return self.subset(~self.is_val)

    @property
    def val(self) -> EmojiData:
        return self.subset(self.is_val)


def short_names_of(entry: dict, tones: list[str]) -> list[str]:
    """emoji.json's short names of an entry as words, with the skin tones of a variant appended."""
    tone_words = [SKIN_TONES[t] for t in tones]
    return [" ".join(words(" ".join([s, *tone_words]))) for s in entry["short_names"]]


def describe(entry: dict, tones: list[str]) -> tuple[str, str, list[str]]:
    """(name, full text, short prompts) of one emoji entry, with the skin tones of a variant appended."""
    tone_words = [SKIN_TONES[t] for t in tones]
    name = " ".join(words(" ".join([entry["name"], *tone_words])))
    short_names = short_names_of(entry, tones)
    parts = [name, *short_names, entry["subcategory"], entry["category"]]
    seen, out = set(), []
    for word in words(" ".join(parts)):
        if word not in seen:
            seen.add(word)
            out.append(word)
    name_words = words(entry["name"])
    singles = [w for w in name_words if w not in NAME_STOP_WORDS] if len(name_words) > 1 else []
    singles = [" ".join(words(" ".join([w, *tone_words]))) for w in singles]
    short_prompts = list(dict.fromkeys(s for s in [*short_names, *singles] if s and s != name))
    return name, " ".join(out), short_prompts


def aliases(data: EmojiData) -> dict[str, str]:
    """Short name -> emoji name, for every short name that is not itself some emoji's name
    ("pizza" -> "slice of pizza"; "cat" stays the cat, not "cat face", whose short name it is).
    What an emoji picker resolves ":pizza:" with; a short name naming two emoji is left out."""
    names = set(data.names)
    found: dict[str, set[str]] = {}
    for name, shorts in zip(data.names, data.short_names, strict=True):
        for short in shorts:
            if short and short not in names:
                found.setdefault(short, set()).add(name)
    return {short: next(iter(targets)) for short, targets in sorted(found.items()) if len(targets) == 1}


def fetch_package(cache: Path) -> Path:
    """``npm pack`` the package into ``cache`` (once) and verify its integrity."""
    cache.mkdir(parents=True, exist_ok=True)
    tarball = cache / TARBALL
    if not tarball.exists():
        log.info("fetching %s with npm pack", PACKAGE)
        try:
            subprocess.run(
                ["npm", "pack", PACKAGE, "--silent"], cwd=cache, check=True, capture_output=True, timeout=600
            )
        except (OSError, subprocess.SubprocessError) as exc:
            raise RuntimeError(f"could not fetch {PACKAGE} with npm pack: {exc}") from None
    digest = "sha512-" + base64.b64encode(hashlib.sha512(tarball.read_bytes()).digest()).decode()
    if digest != INTEGRITY:
        tarball.unlink()
        raise RuntimeError(f"{TARBALL} failed its integrity check (got {digest[:24]}..., want {INTEGRITY[:24]}...)")
    return tarball


def _over_white(png: bytes) -> np.ndarray:
    rgba = Image.open(io.BytesIO(png)).convert("RGBA")
    canvas = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    return np.asarray(Image.alpha_composite(canvas, rgba).convert("RGB"))


def build(tarball: Path) -> EmojiData:
    with tarfile.open(tarball) as tar:
        entries = json.load(tar.extractfile("package/emoji.json"))
        pngs = {
            Path(m.name).name: tar.extractfile(m).read()
            for m in tar.getmembers()
            if m.name.startswith("package/img/twitter/64/") and m.name.endswith(".png")
        }
    images, names, texts, keys, short_prompts, short_names = [], [], [], [], [], []
    for entry in sorted(entries, key=lambda e: e["sort_order"]):
        variants = [(entry["image"], [])]
        for tones, var in (entry.get("skin_variations") or {}).items():
            variants.append((var["image"], tones.split("-")))
        for image, tones in variants:
            if image not in pngs:
                continue
            name, text, short = describe(entry, tones)
            images.append(_over_white(pngs[image]))
            names.append(name)
            texts.append(text)
            keys.append(entry["unified"])
            short_prompts.append(short)
            short_names.append(short_names_of(entry, tones))
    rng = np.random.default_rng(SPLIT_SEED)
    is_val = rng.random(len(images)) < VAL_FRACTION
    return EmojiData(np.stack(images), names, texts, keys, is_val, short_prompts, short_names)


def load(cache: str | Path) -> EmojiData:
    """The data set, from ``cache/twemoji.npz`` if built before, else from the npm package."""
    cache = Path(cache)
    npz = cache / "twemoji.npz"
    if npz.exists():
        with np.load(npz) as z:
            stale = "short_names" not in z.files  # cached by an older version: rebuild from the package
        if stale:
            npz.unlink()
    if not npz.exists():
        data = build(fetch_package(cache))
        np.savez_compressed(
            npz,
            images=data.images,
            names=np.array(data.names),
            texts=np.array(data.texts),
            keys=np.array(data.keys),
            is_val=data.is_val,
            short_prompts=pack_prompts(data.short_prompts),
            short_names=pack_prompts(data.short_names),
        )
    with np.load(npz) as z:
        texts = (z["names"].tolist(), z["texts"].tolist(), z["keys"].tolist())
        packed = (unpack_prompts(z["short_prompts"]), unpack_prompts(z["short_names"]))
        return EmojiData(z["images"], *texts, z["is_val"], *packed)
