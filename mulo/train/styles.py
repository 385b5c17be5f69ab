"""The multi-style emoji data set: one emoji list (emoji.json, ``emoji-datasource``) drawn in
several openly licensed styles, each an Iconify JSON package on npm (SVG bodies plus a
``chars.json`` that names each icon's code points), matched by code point.

Why several styles: a model trained on one drawing per emoji memorises it (the ``twemoji``
family's target: training loss 0.003, held-out 4.06 nats/token, one image per prompt whatever the
seed). The same emoji in five styles is five answers to one prompt, so the target has to spread
its conditionals over them and generalise across the styles it has seen.

Training only: inference never needs npm or these packages. Each package is fetched with
``npm pack`` and checked against its sha512 integrity (``data.fetch_package``), and its
``info.json`` licence is checked against the one recorded here before anything is rendered.

The split (``split``): 0 train; 1 a held-out (emoji, style) pair whose emoji trains in its other
styles (held-out loss on these measures generalisation); 2 a held-out emoji, in every style.
Both are decided per key by a hash, so adding a style or an emoji moves no other image.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tarfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mulo.train import data as data_mod
from mulo.train.data import describe, short_names_of

log = logging.getLogger(__name__)

EMOJI_JSON = (
    "emoji-datasource@16.0.0",
    "emoji-datasource-16.0.0.tgz",
    "sha512-/qHKqK5Nr3+8zhgO6kHmF43Fm5C8HNn0AaFRIpgw8HF3+uF0Vfc8jgLI1ZQS5ba1vBzksS8NBCjHejwLb2D/Sg==",
)


@dataclass(frozen=True)
class Style:
    word: str  # the prompt word that asks for it ("red apple noto")
    title: str
    package: str  # npm spec, pinned
    tarball: str
    integrity: str
    licence: str  # SPDX id, checked against the package's info.json
    attribution: str
    chars_from: str | None = None  # the style whose chars.json names this set's icons (same names)


STYLES = (
    Style("twemoji", "Twemoji", "@iconify-json/twemoji@1.2.5", "iconify-json-twemoji-1.2.5.tgz",
          "sha512-uKpuIEV0v6K5BW3Mjdyl+XKFVAbbcPxAgifKvEMtZoUZB5+YiY5zaMm2uNNCxyXzAWU9yNLlj41WU6/mvgALsw==",
          "CC-BY-4.0", "Twemoji © Twitter, Inc. and other contributors (github.com/jdecked/twemoji)"),
    Style("noto", "Noto Emoji", "@iconify-json/noto@1.2.9", "iconify-json-noto-1.2.9.tgz",
          "sha512-DQiuXENbun41ch+XPSV55H9FaWKpHTyz46YIKtSaKYD4fIDDzL1tR6H4np/T38jfrTAeI3rcKF0mqHYeZVAuaw==",
          "Apache-2.0", "Noto Emoji © Google Inc. (github.com/googlefonts/noto-emoji)"),
    Style("openmoji", "OpenMoji", "@iconify-json/openmoji@1.2.29", "iconify-json-openmoji-1.2.29.tgz",
          "sha512-vXdhkqcXVSO6suy+m9LbcUM3OdVyuNOtpV8/als/WqfkQIRxevL5Geb/g+6GH/Qwnq1OqksEmaDGTCmZ5nFKJQ==",
          "CC-BY-SA-4.0", "OpenMoji, the open-source emoji and icon project (openmoji.org)"),
    Style("fluent", "Fluent Emoji Flat", "@iconify-json/fluent-emoji-flat@1.2.6",
          "iconify-json-fluent-emoji-flat-1.2.6.tgz",
          "sha512-RY47RgPb47fYUiyrA64sIOL0+UU02s29sXpNBbIQRBUlPlfNFTKUmZDERGuxDs/7yNGWqQYvuaSYM1M4fRXlUw==",
          "MIT", "Fluent Emoji © Microsoft Corporation (github.com/microsoft/fluentui-emoji)"),
    Style("fluentcolor", "Fluent Emoji Color", "@iconify-json/fluent-emoji@1.2.7",
          "iconify-json-fluent-emoji-1.2.7.tgz",
          "sha512-D8G6bKAyIsyxP1rzZtIWr/gg/fO4Rg1+DyCWlfqKK4h8W+4Em/Y0P6QYgJUQTlUcagzJvSyg+9OBv4hz4Hc/QA==",
          "MIT", "Fluent Emoji © Microsoft Corporation (github.com/microsoft/fluentui-emoji)", chars_from="fluent"),
)  # fmt: skip
STYLE_WORDS = tuple(s.word for s in STYLES)
HELD_EMOJI_FRACTION = 0.05  # emoji held out in every style
HELD_PAIR_FRACTION = 0.10  # (emoji, style) pairs held out while the emoji's other styles train
TRAIN, HELD_PAIR, HELD_EMOJI = 0, 1, 2


def code_key(code: str) -> str:
    """A code point sequence as both emoji.json ("1F44B-1F3FB", "2764-FE0F") and Iconify's
    chars.json ("1f44b-1f3fb", "2764") can name it: lower case, without variation selectors."""
    return "-".join(p for p in code.lower().split("-") if p != "fe0f")


def _fraction(*parts: str) -> float:
    """A stable number in [0, 1) of ``parts`` (a split that survives changes to the data set)."""
    digest = hashlib.sha256(":".join([str(data_mod.SPLIT_SEED), *parts]).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def split_of(key: str, style: str) -> int:
    """TRAIN, HELD_PAIR or HELD_EMOJI for the image of emoji ``key`` (its base code) in ``style``."""
    if _fraction("emoji", key) < HELD_EMOJI_FRACTION:
        return HELD_EMOJI
    return HELD_PAIR if _fraction("pair", key, style) < HELD_PAIR_FRACTION else TRAIN


def read_iconify(tarball: Path) -> tuple[dict, dict, dict]:
    """(icons.json, chars.json or {}, info.json) of an Iconify JSON package."""
    with tarfile.open(tarball) as tar:
        names = set(tar.getnames())

        def member(name: str) -> dict:
            path = f"package/{name}"
            return json.load(tar.extractfile(path)) if path in names else {}

        icons, chars, info = member("icons.json"), member("chars.json"), member("info.json")
    if "icons" not in icons:
        raise RuntimeError(f"{tarball.name} is not an Iconify JSON package (no package/icons.json)")
    return icons, chars, info


def check_licence(style: Style, info: dict) -> None:
    """The package's own licence must be the one this module records (and the model card states)."""
    found = (info.get("license") or {}).get("spdx")
    if found != style.licence:
        raise RuntimeError(f"{style.package} declares licence {found!r}, not {style.licence!r}: check it before use")


def icon_svg(icons: dict, name: str) -> str | None:
    """The standalone SVG of icon ``name`` (aliases resolved, with their flips and quarter turns)."""
    transforms, seen = [], set()
    while name not in icons["icons"]:
        alias = icons.get("aliases", {}).get(name)
        if alias is None or name in seen:
            return None
        seen.add(name)
        transforms.append(alias)
        name = alias["parent"]
    icon = icons["icons"][name]
    left, top = icon.get("left", icons.get("left", 0)), icon.get("top", icons.get("top", 0))
    width, height = icon.get("width", icons.get("width", 16)), icon.get("height", icons.get("height", 16))
    body = icon["body"]
    # An alias applies its own transformations on top of its parent's (the parent's first).
    for t in [icon, *reversed(transforms)]:
        cx, cy = left + width / 2, top + height / 2
        if t.get("rotate"):
            body = f'<g transform="rotate({90 * t["rotate"]} {cx} {cy})">{body}</g>'
        if t.get("hFlip"):
            body = f'<g transform="translate({2 * cx} 0) scale(-1 1)">{body}</g>'
        if t.get("vFlip"):
            body = f'<g transform="translate(0 {2 * cy}) scale(1 -1)">{body}</g>'
    # A few icons are not square (Fluent's 32x33, one Twemoji flag 36x25.22): a square view box
    # centred on the drawing, so every render is px x px.
    side = max(width, height)
    left, top = left - (side - width) / 2, top - (side - height) / 2
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink" '
        f'viewBox="{left:g} {top:g} {side:g} {side:g}">{body}</svg>'
    )


BUNDLE = "styles-bundle.json.xz"


def write_bundle(cache: Path, out: Path) -> Path:
    """What ``build`` reads of the npm packages (emoji.json's entries and every style's SVGs), from
    the integrity- and licence-checked packages in ``cache``, as one xz-compressed JSON file:
    ~10 MB instead of the packages' ~47 MB, for a machine that reaches no registry (the GPU's)."""
    import lzma

    entries, svgs = emoji_entries(cache), style_svgs(cache)
    used = {(item.style, item.code) for item in styled_emoji(entries, svgs)}  # icons no emoji names: left out
    svgs = {word: {code: svg for code, svg in icons.items() if (word, code) in used} for word, icons in svgs.items()}
    content = {"entries": entries, "svgs": svgs}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(lzma.compress(json.dumps(content, separators=(",", ":")).encode(), preset=6))
    return out


def _bundle(cache: Path) -> dict | None:
    import lzma

    path = Path(cache) / BUNDLE
    return json.loads(lzma.decompress(path.read_bytes())) if path.exists() else None


def style_svgs(cache: Path, styles=STYLES) -> dict[str, dict[str, str]]:
    """style word -> {code key -> SVG}: every icon of each style that chars.json names (from the
    cache's bundle where there is one, written from these same packages)."""
    bundle = _bundle(cache)
    if bundle is not None:
        return {style.word: bundle["svgs"][style.word] for style in styles}
    read = {}
    for style in styles:
        tarball = data_mod.fetch_package(cache, style.package, style.tarball, style.integrity)
        icons, chars, info = read_iconify(tarball)
        check_licence(style, info)
        read[style.word] = (icons, chars)
    out = {}
    for style in styles:
        icons, chars = read[style.word]
        if style.chars_from:
            chars = read[style.chars_from][1] if style.chars_from in read else {}
        svgs = {code_key(code): icon_svg(icons, name) for code, name in chars.items()}
        out[style.word] = {code: svg for code, svg in svgs.items() if svg is not None}
    return out


@dataclass
class StyledEmoji:
    """One (emoji variant, style) image to draw: what ``build`` renders and the tokens stage augments."""

    key: str  # the base emoji's unified code (skin-tone variants share it)
    code: str  # this variant's code key
    style: str
    svg: str = field(repr=False)
    entry: dict = field(repr=False)
    tones: list[str] = field(default_factory=list)


def emoji_entries(cache: Path) -> list[dict]:
    bundle = _bundle(cache)
    if bundle is not None:
        return bundle["entries"]
    tarball = data_mod.fetch_package(cache, *EMOJI_JSON)
    with tarfile.open(tarball) as tar:
        return json.load(tar.extractfile("package/emoji.json"))


def styled_emoji(entries: list[dict], svgs: dict[str, dict[str, str]]) -> list[StyledEmoji]:
    """Every emoji.json variant (base and skin tones, in emoji.json's order) in every style that
    draws it."""
    out = []
    for entry in sorted(entries, key=lambda e: e["sort_order"]):
        variants = [(entry["unified"], [])]
        variants += [(v["unified"], tones.split("-")) for tones, v in (entry.get("skin_variations") or {}).items()]
        for unified, tones in variants:
            code = code_key(unified)
            for style in svgs:
                if code in svgs[style]:
                    out.append(StyledEmoji(entry["unified"], code, style, svgs[style][code], entry, tones))
    return out


def describe_styled(item: StyledEmoji) -> tuple[str, str, list[str]]:
    """(name, full description with the style word, short prompts) of one image: the name stays
    the emoji's (a prompt without a style word draws any style); the description names the style."""
    name, text, short = describe(item.entry, item.tones)
    return name, f"{text} {item.style}", short


def render_at(svg: str, px: int, inner: int | None = None, offset: tuple[int, int] = (0, 0)) -> np.ndarray:
    """``svg`` drawn ``inner`` px wide (default: the whole canvas) at ``offset`` (x, y) on a white
    ``px`` x ``px`` canvas -> ``[px, px, 3]`` uint8."""
    inner = px if inner is None else inner
    image = data_mod.render_svg(svg.encode(), inner)
    if inner == px:
        return image
    canvas = np.full((px, px, 3), 255, dtype=np.uint8)
    x, y = offset
    canvas[y : y + inner, x : x + inner] = image
    return canvas


@dataclass(frozen=True)
class Placement:
    """Where an augmented copy sits, in pixels of the smallest scale: ``inner`` wide at (x, y).
    Each larger scale multiplies all three, so the copies agree across the target's and the
    drafters' resolutions (what a low-res draft of the image must be)."""

    inner: int
    x: int
    y: int

    def at(self, px: int, smallest: int) -> tuple[int, tuple[int, int]]:
        m = px // smallest
        return self.inner * m, (self.x * m, self.y * m)


def random_placement(rng: np.random.Generator, smallest: int, min_scale: float = 0.75) -> Placement:
    """A meaning-preserving augmentation: the emoji shrunk to between ``min_scale`` and the whole
    canvas and moved anywhere inside it."""
    inner = int(rng.integers(int(np.ceil(min_scale * smallest)), smallest + 1))
    x, y = (int(v) for v in rng.integers(0, smallest - inner + 1, size=2))
    return Placement(inner, x, y)


def render_scales(item: StyledEmoji, sizes, placement: Placement | None = None) -> dict[int, np.ndarray]:
    """The image at every size in ``sizes`` (each a multiple of the smallest), placed alike."""
    smallest = min(sizes)
    out = {}
    for px in sizes:
        inner, offset = placement.at(px, smallest) if placement else (px, (0, 0))
        out[px] = render_at(item.svg, px, inner, offset)
    return out


def _render_job(job) -> dict[int, np.ndarray]:
    item, placement, sizes = job
    return render_scales(item, sizes, placement)


def render_many(jobs: list[tuple[StyledEmoji, Placement | None]], sizes) -> dict[int, np.ndarray]:
    """px -> ``[N, px, px, 3]``: each (item, placement) rendered at every size, on every core when
    there are many (resvg renders one SVG on one core)."""
    work = [(item, placement, tuple(sizes)) for item, placement in jobs]
    if len(work) > 256 and (os.cpu_count() or 1) > 1:
        with ProcessPoolExecutor() as pool:
            rendered = list(pool.map(_render_job, work, chunksize=64))
    else:
        rendered = [_render_job(job) for job in work]
    return {px: np.stack([r[px] for r in rendered]) for px in sizes}


def limited(every: list[StyledEmoji], limit: int | None) -> list[StyledEmoji]:
    """All the items, or (smoke runs) the first ``limit`` and the first 8 held-out ones."""
    if not limit:
        return every
    held = [i for i, item in enumerate(every) if split_of(item.key, item.style) != TRAIN][:8]
    keep = sorted(set(range(min(limit, len(every)))) | set(held))
    return [every[i] for i in keep]


def build(cache: Path, sizes, styles=STYLES, limit: int | None = None) -> data_mod.EmojiData:
    """Every styled emoji (``limited`` to ``limit``) rendered, unaugmented, at ``sizes``;
    ``is_val`` marks both held-out kinds and ``split`` tells them apart."""
    items = limited(styled_emoji(emoji_entries(cache), style_svgs(cache, styles)), limit)
    names, texts, keys, short_prompts, short_names, split = [], [], [], [], [], []
    for item in items:
        name, text, short = describe_styled(item)
        names.append(name)
        texts.append(text)
        keys.append(item.key)
        short_prompts.append(short)
        short_names.append(short_names_of(item.entry, item.tones))
        split.append(split_of(item.key, item.style))
    split = np.array(split, dtype=np.int8)
    stacked = render_many([(item, None) for item in items], sizes)
    styles_of = [item.style for item in items]
    data = data_mod.EmojiData(
        stacked[max(sizes)], names, texts, keys, split != TRAIN, short_prompts, short_names, stacked, styles_of, split
    )
    counts = {s: int((np.array(data.styles) == s).sum()) for s in svgs_order(items)}
    log.info("styled emoji: %d images %s; held out: %d pairs, %d of unseen emoji", len(items), counts,
             int((split == HELD_PAIR).sum()), int((split == HELD_EMOJI).sum()))  # fmt: skip
    return data


def svgs_order(items: list[StyledEmoji]) -> list[str]:
    return list(dict.fromkeys(item.style for item in items))


def chosen(words) -> tuple[Style, ...]:
    known = {s.word: s for s in STYLES}
    unknown = [w for w in words if w not in known]
    if unknown:
        raise ValueError(f"unknown style {', '.join(unknown)}; known: {', '.join(known)}")
    return tuple(known[w] for w in words)


def items(cache: str | Path, words=STYLE_WORDS, limit: int | None = None) -> list[StyledEmoji]:
    """The styled emoji of ``load``'s data set, in its order (the tokens stage's augmented copies
    are drawn from their SVGs)."""
    cache = Path(cache)
    return limited(styled_emoji(emoji_entries(cache), style_svgs(cache, chosen(words))), limit)


def load(cache: str | Path, sizes, words=STYLE_WORDS, limit: int | None = None) -> data_mod.EmojiData:
    """The multi-style data set at every size in ``sizes``, from ``cache/emoji-STYLES[-LIMIT].npz``
    if built before, else from the npm packages (about 17,000 images: minutes of rendering)."""
    cache = Path(cache)
    names = [f"images_{px}" for px in sizes]
    images, data = data_mod.cached_data_set(
        cache / f"emoji-{'-'.join(words)}{f'-{limit}' if limit else ''}.npz",
        names,
        lambda: build(cache, sizes, chosen(words), limit),
        lambda built: {f"images_{px}": built.scales[px] for px in sizes},
    )
    data.scales = {px: images[f"images_{px}"] for px in sizes}
    data.images = data.scales[max(sizes)]
    return data
