"""The Twemoji data set: 3,786 emoji images at 64 px with their names, from the npm package
``emoji-datasource-twitter@16.0.0`` (graphics CC-BY 4.0, Twitter, Inc. and other contributors).

Training only: inference never needs npm or the data. ``load`` fetches the package with
``npm pack`` into a cache folder, checks its sha512 integrity, composites every RGBA image over
white and caches the result as one ``.npz``.

``load_scales`` is the same set drawn from the vector originals, ``@twemoji/svg@15.0.0`` (same
licence), rendered over white at several sizes (128, 64 and 32 px: one image per scale of a
multi-scale family) by resvg (``resvg-py``, the ``train`` extra). Names, short names and the
validation split are emoji.json's, as for ``load``; the 126 images of Emoji 15.1/16 that
Twemoji 15.0.0 lacks are left out (3,660 images).
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
import torch
import torch.nn.functional as F
from PIL import Image

from mulo.eval.quality import pack_prompts, unpack_prompts
from mulo.models.text import words

log = logging.getLogger(__name__)

PACKAGE = "emoji-datasource-twitter@16.0.0"
TARBALL = "emoji-datasource-twitter-16.0.0.tgz"
INTEGRITY = "sha512-7F+uCuHH+7Qnrc15P5tnbvKkg9E6tlzi4MnT2uW1RlN4pLYTza6cP/dstIfSDMtpjFLWuZewWg8jBbuL2eyELQ=="
SVG_PACKAGE = "@twemoji/svg@15.0.0"
SVG_TARBALL = "twemoji-svg-15.0.0.tgz"
SVG_INTEGRITY = "sha512-ZSPef2B6nBaYnfgdTbAy4jgW95o7pi2xPGwGCU+WMTxo7J6B1lMPTWwSq/wTuiMq+N0khQ90CcvYp1wFoQpo/w=="
SCALES = (128, 64, 32)  # px: the target's images and its r = 2 and r = 4 drafters'
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
    # px -> [N, px, px, 3] uint8: the same images at other sizes (``load_scales``; empty otherwise)
    scales: dict[int, np.ndarray] = field(default_factory=dict)
    # Multi-style data (``mulo.train.styles``): each image's style word, and its split (0 train,
    # 1 held-out (emoji, style) pair, 2 held-out emoji); empty / None for one-style data.
    styles: list[str] = field(default_factory=list)
    split: np.ndarray | None = None

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
            {px: images[idx] for px, images in self.scales.items()},
            pick(self.styles) if self.styles else [],
            None if self.split is None else self.split[idx],
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


def fetch_package(cache: Path, package: str = PACKAGE, tarball_name: str = TARBALL, integrity: str = INTEGRITY) -> Path:
    """``npm pack`` the package into ``cache`` (once) and verify its integrity."""
    cache.mkdir(parents=True, exist_ok=True)
    tarball = cache / tarball_name
    if not tarball.exists():
        log.info("fetching %s with npm pack", package)
        try:
            subprocess.run(
                ["npm", "pack", package, "--silent"], cwd=cache, check=True, capture_output=True, timeout=600
            )
        except (OSError, subprocess.SubprocessError) as exc:
            raise RuntimeError(f"could not fetch {package} with npm pack: {exc}") from None
    check_integrity(tarball, integrity)
    return tarball


def check_integrity(tarball: Path, integrity: str) -> None:
    """npm's sha512 integrity string of ``tarball``, or the file is deleted and RuntimeError raised."""
    digest = "sha512-" + base64.b64encode(hashlib.sha512(tarball.read_bytes()).digest()).decode()
    if digest != integrity:
        tarball.unlink()
        raise RuntimeError(
            f"{tarball.name} failed its integrity check (got {digest[:24]}..., want {integrity[:24]}...)"
        )


def _over_white(png: bytes) -> np.ndarray:
    rgba = Image.open(io.BytesIO(png)).convert("RGBA")
    canvas = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    return np.asarray(Image.alpha_composite(canvas, rgba).convert("RGB"))


def _datasource(tarball: Path, read_pngs: bool) -> tuple[list[dict], dict[str, bytes | None]]:
    """emoji.json's entries and the 64 px PNGs (file name -> bytes, or None when ``read_pngs`` is
    off), in one pass over the 60 MB package."""
    entries, pngs = None, {}
    with tarfile.open(tarball) as tar:
        for member in tar:
            if member.name == "package/emoji.json":
                entries = json.load(tar.extractfile(member))
            elif member.name.startswith("package/img/twitter/64/") and member.name.endswith(".png"):
                pngs[Path(member.name).name] = tar.extractfile(member).read() if read_pngs else None
    if entries is None:
        raise RuntimeError(f"{tarball.name} has no package/emoji.json")
    return entries, pngs


def _variants(entries: list[dict]):
    """(image file name, entry, skin tones) of every emoji and skin-tone variant, in emoji.json's order."""
    for entry in sorted(entries, key=lambda e: e["sort_order"]):
        yield entry["image"], entry, []
        for tones, var in (entry.get("skin_variations") or {}).items():
            yield var["image"], entry, tones.split("-")


def validation_split(n: int) -> np.ndarray:
    """``[n]`` bool: the held-out images among the data set's ``n`` (fixed seed)."""
    return np.random.default_rng(SPLIT_SEED).random(n) < VAL_FRACTION


def _assemble(found: list[tuple[np.ndarray, dict, list[str]]], is_val: np.ndarray) -> EmojiData:
    """EmojiData of (image, entry, tones) triples and their validation flags."""
    names, texts, keys, short_prompts, short_names = [], [], [], [], []
    for _, entry, tones in found:
        name, text, short = describe(entry, tones)
        names.append(name)
        texts.append(text)
        keys.append(entry["unified"])
        short_prompts.append(short)
        short_names.append(short_names_of(entry, tones))
    images = np.stack([image for image, _, _ in found])
    return EmojiData(images, names, texts, keys, is_val, short_prompts, short_names)


def build(tarball: Path) -> EmojiData:
    entries, pngs = _datasource(tarball, read_pngs=True)
    found = [(_over_white(pngs[image]), entry, tones) for image, entry, tones in _variants(entries) if image in pngs]
    return _assemble(found, validation_split(len(found)))


def svg_stem(image: str) -> str:
    """emoji.json's image file name -> Twemoji's SVG file stem: code points without leading zeros
    ("0023-fe0f-20e3.png" -> "23-fe0f-20e3"). Twemoji writes some stems without the variation
    selector FE0F ("23-20e3"): ``build_scales`` tries both."""
    return "-".join(part.lstrip("0") for part in Path(image).stem.split("-"))


def render_svg(svg: bytes, size: int) -> np.ndarray:
    """An SVG rendered over white at ``size`` x ``size`` px -> ``[size, size, 3]`` uint8."""
    try:
        import resvg_py
    except ImportError:
        raise RuntimeError('rendering the Twemoji SVGs needs resvg-py: pip install -e ".[train]"') from None
    try:
        png = resvg_py.svg_to_bytes(svg_string=svg.decode("utf-8"), width=size, height=size, background="#ffffff")
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException:  # noqa: BLE001 - resvg's Rust panics arrive as pyo3's PanicException (a BaseException)
        # resvg 0.48 panics on one Fluent filter at 16 px: drawn 4x larger, then box-filtered down
        if size > 256:
            raise
        return np.asarray(Image.fromarray(render_svg(svg, size * 4)).reduce(4))
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))


def build_scales(datasource: Path, svg_tarball: Path, sizes=SCALES) -> EmojiData:
    """The images of emoji.json that Twemoji's SVG package holds, rendered at every size in
    ``sizes`` (the largest first is ``images``; all in ``scales``)."""
    with tarfile.open(svg_tarball) as tar:
        svgs = {Path(m.name).stem: tar.extractfile(m).read() for m in tar.getmembers() if m.name.endswith(".svg")}
    # the split of ``load``'s images (every emoji.json image with a 64 px PNG), so an emoji held
    # out there is held out here too
    entries, pngs = _datasource(datasource, read_pngs=False)
    variants = [v for v in _variants(entries) if v[0] in pngs]
    found, held_out = [], []
    for (image, entry, tones), is_val in zip(variants, validation_split(len(variants)), strict=True):
        stem = svg_stem(image)
        svg = svgs.get(stem) or svgs.get("-".join(p for p in stem.split("-") if p != "fe0f"))
        if svg is not None:
            found.append(({px: render_svg(svg, px) for px in sizes}, entry, tones))
            held_out.append(is_val)
    log.info("rendered %d Twemoji SVGs at %s px (%d images have no SVG)", len(found), sizes, len(variants) - len(found))
    data = _assemble([(rendered[max(sizes)], entry, tones) for rendered, entry, tones in found], np.array(held_out))
    data.scales = {px: np.stack([rendered[px] for rendered, _, _ in found]) for px in sizes}
    return data


def cached_data_set(npz: Path, image_names: list[str], make, images_of) -> tuple[dict[str, np.ndarray], EmojiData]:
    """The data set cached in ``npz``: built by ``make()`` and saved first when the file is missing
    or lacks a field (an older version wrote it). ``images_of(data)`` gives its image arrays by
    name (``image_names``); they are returned beside the data, whose ``images`` the caller sets."""
    if npz.exists():
        with np.load(npz) as z:
            stale = not {"short_names", *image_names} <= set(z.files)
        if stale:
            npz.unlink()
    if not npz.exists():
        data = make()
        np.savez_compressed(
            npz,
            **images_of(data),
            names=np.array(data.names),
            texts=np.array(data.texts),
            keys=np.array(data.keys),
            is_val=data.is_val,
            short_prompts=pack_prompts(data.short_prompts),
            short_names=pack_prompts(data.short_names),
            **({"styles": np.array(data.styles), "split": data.split} if data.styles else {}),
        )
    with np.load(npz) as z:
        images = {name: z[name] for name in image_names}
        texts = (z["names"].tolist(), z["texts"].tolist(), z["keys"].tolist())
        packed = (unpack_prompts(z["short_prompts"]), unpack_prompts(z["short_names"]))
        styled = (z["styles"].tolist(), z["split"]) if "styles" in z.files else ([], None)
        return images, EmojiData(None, *texts, z["is_val"], *packed, {}, *styled)


def load(cache: str | Path) -> EmojiData:
    """The data set, from ``cache/twemoji.npz`` if built before, else from the npm package."""
    cache = Path(cache)
    images, data = cached_data_set(
        cache / "twemoji.npz", ["images"], lambda: build(fetch_package(cache)), lambda built: {"images": built.images}
    )
    data.images = images["images"]
    return data


def load_scales(cache: str | Path, sizes=SCALES) -> EmojiData:
    """The SVG-rendered data set at every size in ``sizes``, from ``cache/twemoji-svg.npz`` if
    built before with these sizes, else from the two npm packages."""
    cache = Path(cache)

    def make() -> EmojiData:
        svg_tarball = fetch_package(cache, SVG_PACKAGE, SVG_TARBALL, SVG_INTEGRITY)
        return build_scales(fetch_package(cache), svg_tarball, sizes)

    names = [f"images_{px}" for px in sizes]
    images, data = cached_data_set(
        cache / "twemoji-svg.npz", names, make, lambda built: {f"images_{px}": built.scales[px] for px in sizes}
    )
    data.scales = {px: images[f"images_{px}"] for px in sizes}
    data.images = data.scales[max(sizes)]
    return data


def to_float(images: np.ndarray) -> torch.Tensor:
    """uint8 images ``[N, h, w, 3]`` as the models' floats ``[N, 3, h, w]`` in [0, 1]."""
    return torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255


def resize(images: torch.Tensor, size: int) -> torch.Tensor:
    """``images`` area-resized to ``size`` px (as they are when already that size)."""
    return images if images.shape[-1] == size else F.interpolate(images, size=(size, size), mode="area")
