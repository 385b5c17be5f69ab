"""The emoji scenes data (issue 63): scenes composed on the fly, never exhausted.

A scene is a ``canvas`` px square of one palette colour (``mulo.scenes.PALETTE``) with 1 to
``max_objects`` different vocabulary emoji (``mulo.scenes.VOCABULARY``), each ``object_px`` wide
in any of the five licensed styles (``mulo.train.styles``), placed without overlap. Its prompt is
the grammar's (``mulo.scenes.format_prompt``): "red apple and rocket on blue", with the style
word when every object shares one style and the prompt says so.

``SceneStream`` maps (split, index) to a scene with a generator seeded by both, so the stream is
never exhausted and any scene can be drawn again alone; ``data`` materialises a range of it as
the ``EmojiData`` the training pipeline reads. What the study varies is a ``SceneConfig`` field:
object size, positional freedom (``placement`` "slots", a coarse grid, or "free", every ``step``
px), vocabulary size, the number of objects.

Held out: the (emoji pair, background) combinations ``mulo.scenes.held_out_combination`` picks
(a hash, so a change of vocabulary moves no other combination). A training scene holds none of
them; a held-out scene holds at least one.

The sprites (every emoji in every style at ``object_px``, RGBA) are rendered once from the
styles' SVGs, 4x larger and box-filtered down in premultiplied alpha, and cached; the same file
is what the family ships for its referee (``mulo.eval.referee``). The scene is composed at
``canvas`` px and area-reduced for the drafters' sizes, so the scales agree exactly.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mulo.eval.referee import Sprites, save_sprites, visible_share
from mulo.scenes import (
    HELD_OUT_FRACTION,
    MAX_OBJECTS,
    PALETTE,
    STYLE_WORDS,
    VOCABULARY,
    format_prompt,
    held_out_combination,
    held_out_pairs,
)

log = logging.getLogger(__name__)

TRAIN, HELD_OUT = "train", "held_out"
SUPERSAMPLE = 4  # sprites are rendered this many times larger, then box-filtered


PLACEMENTS = ("free", "slots", "tiles", "columns")


@dataclass(frozen=True)
class SceneConfig:
    canvas: int = 128
    object_px: int = 32  # <= 8 x 8 tokens of 4 px
    # "free": any multiple of ``step``; "slots": a coarse grid of cells ``gap`` apart; "tiles": the
    # grid of ``object_px`` squares, so an object never straddles two tiles of a VQ that reads
    # ``object_px`` tiles (``gap`` then keeps two objects a cell apart, diagonals included);
    # "columns": n objects split the canvas into n equal columns and the prompt's k-th object lies
    # in the k-th from the left, anywhere up or down it (``step`` px apart), so "red apple and
    # rocket" puts the apple on the left. Why: with "free" places a raster-order target must count
    # the objects it has drawn and tell which named ones are left; here each column holds exactly one,
    # the one its slot of the prompt names (docs/notebook/session-2026-11-30-columns.md).
    placement: str = "free"
    step: int = 8  # px between free positions (a multiple of canvas / smallest scale keeps the scales aligned)
    # "columns": px between an object's possible tops (0: ``step``). A few tops make the row where a
    # column's object must begin, if it has not yet, one a target meets often.
    vertical_step: int = 0
    gap: int = 8  # px at least between two objects' squares (and, for slots, from the edge)
    vocabulary: int = len(VOCABULARY)  # the first N of ``VOCABULARY``
    min_objects: int = 1
    max_objects: int = MAX_OBJECTS
    styles: tuple[str, ...] = STYLE_WORDS
    backgrounds: tuple[str, ...] = tuple(PALETTE)
    held_out_fraction: float = HELD_OUT_FRACTION
    style_word_prob: float = 0.25  # scenes whose objects share one style that the prompt names
    # An emoji is drawn on a background only in the styles where at least this share of its pixels
    # stands out from it (no yellow star on yellow: neither a model nor the referee could see it).
    min_visible: float = 0.5
    scales: tuple[int, ...] = (128, 64, 32)  # the target's canvas and the r = 2, r = 4 drafters'

    def __post_init__(self):
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {', '.join(map(repr, PLACEMENTS))}, not {self.placement!r}")
        if not 1 <= self.min_objects <= self.max_objects:
            raise ValueError(f"objects per scene: {self.min_objects} to {self.max_objects} is not a range")
        if not 2 <= self.vocabulary <= len(VOCABULARY):
            raise ValueError(f"vocabulary: 2 to {len(VOCABULARY)} emoji, not {self.vocabulary}")
        if self.canvas not in self.scales or any(self.canvas % px for px in self.scales):
            raise ValueError(f"scales {self.scales} must divide the canvas {self.canvas}")
        if len(self.positions()) < self.max_objects:
            raise ValueError(f"{self.max_objects} objects of {self.object_px} px do not fit this placement")
        if self.vertical_step % self.step or self.vertical_step < 0:
            raise ValueError(f"vertical_step {self.vertical_step} is not a multiple of step {self.step}")
        if self.placement == "columns" and not all(
            self.column_positions(self.max_objects, k) for k in range(self.max_objects)
        ):
            raise ValueError(f"{self.max_objects} columns are too narrow for objects of {self.object_px} px")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(e.name for e in VOCABULARY[: self.vocabulary])

    def positions(self) -> list[tuple[int, int]]:
        """Every top-left corner an object may take."""
        if self.placement in ("free", "columns"):
            axis = range(0, self.canvas - self.object_px + 1, self.step)
        elif self.placement == "tiles":
            axis = range(0, self.canvas - self.object_px + 1, self.object_px)
        else:  # as many cells as fit with ``gap`` between them and around them, centred
            pitch = self.object_px + self.gap
            count = (self.canvas - self.gap) // pitch
            margin = (self.canvas - count * pitch + self.gap) // 2
            axis = range(margin, margin + count * pitch, pitch)
        return [(x, y) for y in axis for x in axis]

    def column_positions(self, count: int, column: int) -> list[tuple[int, int]]:
        """The top-left corners of ``positions`` (the free grid) whose square lies inside column
        ``column`` of ``count`` equal columns ("columns" placement), at the tops ``vertical_step`` allows."""
        left, right = column * self.canvas / count, (column + 1) * self.canvas / count
        tops = self.vertical_step or self.step
        return [(x, y) for x, y in self.positions() if left <= x and x + self.object_px <= right and y % tops == 0]


@dataclass(frozen=True)
class Placed:
    name: str
    style: str
    x: int  # top-left corner of its object_px square, px
    y: int


@dataclass(frozen=True)
class Scene:
    background: str
    objects: tuple[Placed, ...]
    style: str | None  # the style every object shares and the prompt names; None: each its own
    split: str = TRAIN

    @property
    def prompt(self) -> str:
        return format_prompt([o.name for o in self.objects], self.background, self.style)

    @property
    def key(self) -> str:
        """What the scene shows, whatever the order, styles and places: "red apple+rocket@blue"."""
        return f"{'+'.join(sorted(o.name for o in self.objects))}@{self.background}"


# -- sprites -------------------------------------------------------------------------------------
def render_rgba(svg: str, px: int) -> np.ndarray:
    """``svg`` on a transparent ``px`` square: rendered ``SUPERSAMPLE`` times larger and
    box-filtered in premultiplied alpha (colour does not bleed from transparent pixels)."""
    import io

    import resvg_py
    from PIL import Image

    big = px * SUPERSAMPLE
    png = resvg_py.svg_to_bytes(svg_string=svg, width=big, height=big)
    rgba = np.asarray(Image.open(io.BytesIO(bytes(png))).convert("RGBA")).astype(np.float64)
    alpha = rgba[..., 3:] / 255
    premultiplied = np.concatenate([rgba[..., :3] * alpha, alpha], axis=-1)
    reduced = premultiplied.reshape(px, SUPERSAMPLE, px, SUPERSAMPLE, 4).mean(axis=(1, 3))
    a = reduced[..., 3:]
    colour = np.where(a > 0, reduced[..., :3] / np.maximum(a, 1e-9), 0)
    return np.concatenate([colour, a * 255], axis=-1).round().clip(0, 255).astype(np.uint8)


def render_sprites(cache: Path, px: int, names=None, styles=STYLE_WORDS, canvas: int = 128) -> Sprites:
    """Every emoji of ``names`` (default: the whole vocabulary) in every style, ``px`` wide."""
    from mulo.train import styles as styles_mod

    names = tuple(names or (e.name for e in VOCABULARY))
    codes = {e.name: styles_mod.code_key(e.code) for e in VOCABULARY}
    svgs = styles_mod.style_svgs(Path(cache), styles_mod.chosen(styles))
    missing = [f"{n} ({s})" for n in names for s in styles if codes[n] not in svgs[s]]
    if missing:
        raise RuntimeError(f"the styles do not draw {', '.join(missing)}")
    rgba = np.stack([np.stack([render_rgba(svgs[s][codes[n]], px) for s in styles]) for n in names])
    return Sprites(names, tuple(styles), rgba, canvas)


def sprites(cache: str | Path, px: int, canvas: int = 128) -> Sprites:
    """The whole vocabulary's sprites at ``px``, from ``cache/scene-sprites-PX.npz`` if rendered
    before (the file the family ships for its referee), else rendered and saved there."""
    path = Path(cache) / f"scene-sprites-{px}-{canvas}.npz"
    if not path.exists():
        save_sprites(path, render_sprites(Path(cache), px, canvas=canvas))
    return Sprites.load(path)


def write_sprite_file(path: str | Path, cache: str | Path, config: SceneConfig) -> Path:
    """The referee's sprite file for a family drawn with ``config`` (its vocabulary, at its size)."""
    return save_sprites(path, sprites(cache, config.object_px, config.canvas).subset(config.names))


# -- scenes --------------------------------------------------------------------------------------
def compose(scene: Scene, sheet: Sprites, canvas: int) -> np.ndarray:
    """The scene at ``canvas`` px, float32 ``[canvas, canvas, 3]`` in 0-255."""
    image = np.empty((canvas, canvas, 3), dtype=np.float32)
    image[:] = PALETTE[scene.background]
    px = sheet.px
    for obj in scene.objects:
        rgba = sheet.rgba[sheet.names.index(obj.name), sheet.styles.index(obj.style)].astype(np.float32)
        alpha = rgba[..., 3:] / 255
        window = image[obj.y : obj.y + px, obj.x : obj.x + px]
        window[:] = rgba[..., :3] * alpha + (1 - alpha) * window
    return image


def area_reduce(image: np.ndarray, px: int) -> np.ndarray:
    f = image.shape[0] // px
    return image.reshape(px, f, px, f, 3).mean(axis=(1, 3))


@dataclass
class SceneStream:
    """Scenes as a function of (split, index): seeded, never exhausted."""

    config: SceneConfig
    sheet: Sprites  # at least the config's vocabulary and styles, ``config.object_px`` wide
    seed: int = 0
    _held: list = field(default_factory=list, repr=False)

    def __post_init__(self):
        cfg = self.config
        if self.sheet.px != cfg.object_px:
            raise ValueError(f"sprites of {self.sheet.px} px for objects of {cfg.object_px} px")
        lacking = [n for n in cfg.names if n not in self.sheet.names] + [
            s for s in cfg.styles if s not in self.sheet.styles
        ]
        if lacking:
            raise ValueError(f"the sprites lack {', '.join(lacking)}")
        names = cfg.names
        sheet = self.sheet.subset(names)
        keep = [sheet.styles.index(s) for s in cfg.styles]
        # background -> emoji name -> the styles it is drawn in there
        self.visible = {
            bg: {
                name: tuple(s for s, share in zip(cfg.styles, row[keep], strict=True) if share >= cfg.min_visible)
                for name, row in zip(names, visible_share(sheet, PALETTE[bg]), strict=True)
            }
            for bg in cfg.backgrounds
        }
        self._held = [
            (a, b, bg)
            for i, a in enumerate(names)
            for b in names[i + 1 :]
            for bg in cfg.backgrounds
            if held_out_combination(a, b, bg, cfg.held_out_fraction) and self.visible[bg][a] and self.visible[bg][b]
        ]
        if not self._held and cfg.max_objects >= 2:
            raise ValueError("no (emoji pair, background) combination is held out: raise held_out_fraction")

    @property
    def held_out_combinations(self) -> list[tuple[str, str, str]]:
        """Every held-out (emoji, emoji, background), the pair in vocabulary order."""
        return list(self._held)

    def rng(self, split: str, index: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, 0 if split == TRAIN else 1, index])

    def scene(self, index: int, split: str = TRAIN) -> Scene:
        """Scene ``index`` of ``split`` (``TRAIN``: no held-out combination; ``HELD_OUT``: at
        least two objects, at least one held-out combination among them)."""
        if split not in (TRAIN, HELD_OUT):
            raise ValueError(f"split must be {TRAIN!r} or {HELD_OUT!r}, not {split!r}")
        cfg, rng = self.config, self.rng(split, index)
        names = list(cfg.names)
        if split == HELD_OUT:
            a, b, background = self._held[int(rng.integers(len(self._held)))]
            count = int(rng.integers(max(2, cfg.min_objects), cfg.max_objects + 1))
            others = [n for n in names if n not in (a, b) and self.visible[background][n]]
            chosen = [a, b, *rng.choice(others, size=count - 2, replace=False).tolist()]
            chosen = [chosen[i] for i in rng.permutation(count)]
        else:
            count = int(rng.integers(cfg.min_objects, cfg.max_objects + 1))
            for _ in range(1000):
                background = cfg.backgrounds[int(rng.integers(len(cfg.backgrounds)))]
                seen = [n for n in names if self.visible[background][n]]
                chosen = rng.choice(seen, size=count, replace=False).tolist()
                if not held_out_pairs(chosen, background, cfg.held_out_fraction):
                    break
            else:  # pragma: no cover - at 5 % held out a draw succeeds with probability ~0.86
                raise RuntimeError("no training scene drawn in 1000 tries: lower held_out_fraction")
        drawn = [self.visible[background][name] for name in chosen]
        common = [s for s in cfg.styles if all(s in d for d in drawn)]
        shared = rng.random() < cfg.style_word_prob and common  # (a style none of them hides)
        style = common[int(rng.integers(len(common)))] if shared else None
        places = self.place(rng, count)
        objects = tuple(
            Placed(name, style or d[int(rng.integers(len(d)))], x, y)
            for name, d, (x, y) in zip(chosen, drawn, places, strict=True)
        )
        return Scene(background, objects, style, split)

    def place(self, rng: np.random.Generator, count: int) -> list[tuple[int, int]]:
        """``count`` top-left corners whose squares keep ``gap`` px apart, drawn at random (for
        "columns", the k-th in the k-th column from the left)."""
        cfg = self.config
        reach = cfg.object_px + cfg.gap

        def clear(x: int, y: int, picked: list[tuple[int, int]]) -> bool:
            return all(abs(x - u) >= reach or abs(y - v) >= reach for u, v in picked)

        # The draws' order is fixed: a run's stored chunks are these scenes, re-made by index.
        columns = [cfg.column_positions(count, k) for k in range(count)] if cfg.placement == "columns" else None
        positions = cfg.positions()
        for _ in range(1000):
            picked = []
            if columns is not None:  # one draw per column, among its places clear of those picked
                for column in columns:
                    free = [(x, y) for x, y in column if clear(x, y, picked)]
                    if not free:
                        break
                    picked.append(free[int(rng.integers(len(free)))])
            else:  # the places in a random order, each taken when clear
                for i in rng.permutation(len(positions)):
                    if clear(*positions[i], picked):
                        picked.append(positions[i])
                        if len(picked) == count:
                            break
            if len(picked) == count:
                return picked
        raise RuntimeError(f"{count} objects do not fit: fewer objects or a smaller object_px")  # pragma: no cover

    def render(self, scene: Scene) -> dict[int, np.ndarray]:
        """px -> uint8 ``[px, px, 3]`` at every scale of the config."""
        image = compose(scene, self.sheet, self.config.canvas)
        return {px: area_reduce(image, px).round().astype(np.uint8) for px in self.config.scales}

    def scenes(self, start: int, count: int, split: str = TRAIN) -> list[Scene]:
        return [self.scene(i, split) for i in range(start, start + count)]

    def data(self, train: int, held_out: int, start: int = 0):
        """``train`` training scenes from index ``start`` and ``held_out`` held-out scenes, as the
        ``EmojiData`` the training pipeline reads (``describe`` says what each field holds)."""
        from mulo.train.data import EmojiData

        scenes = self.scenes(start, train, TRAIN) + self.scenes(start, held_out, HELD_OUT)
        rendered = [self.render(s) for s in scenes]
        scales = {px: np.stack([r[px] for r in rendered]) for px in self.config.scales}
        names, texts, short_prompts = [], [], []
        for s in scenes:
            name, text, short = describe(s)
            names.append(name)
            texts.append(text)
            short_prompts.append(short)
        is_val = np.array([s.split == HELD_OUT for s in scenes])
        keys = [s.key for s in scenes]
        return EmojiData(
            scales[self.config.canvas], names, texts, keys, is_val, short_prompts, [[] for _ in scenes], scales
        )


def language_words(config: SceneConfig) -> list[str]:
    """Every word a prompt of ``config``'s scenes may use (the mini-CLIP's vocabulary)."""
    return [*config.names, *config.backgrounds, *config.styles, "and", "on", "in", "style"]


def describe(scene: Scene) -> tuple[str, str, list[str]]:
    """(prompt, description, short prompts) of a scene: the prompt as the grammar writes it; the
    description adds every object's style ("red apple noto, rocket twemoji on blue"); the short
    prompt leaves the background and style out ("red apple and rocket": any background)."""
    names = [o.name for o in scene.objects]
    described = format_prompt([f"{o.name} {o.style}" for o in scene.objects], scene.background)
    return scene.prompt, described, [format_prompt(names)]


EVAL_SEED = 7  # the evaluation scenes' stream: a seed no training run uses by default (0)


def evaluation_scenes(config: SceneConfig, sheet: Sprites, count: int = 120, seed: int = EVAL_SEED) -> list[Scene]:
    """The family's fixed evaluation scenes (their prompts are the card's and the bench's): a sixth
    (at least one) held-out-combination scenes, the rest from the training split, each prompt once,
    the training ones first. Their renders are the real images FD compares with."""
    stream = SceneStream(config, sheet, seed=seed)
    held = max(1, count // 6) if config.max_objects >= 2 else 0
    picked, seen = [], set()
    for split, wanted in ((TRAIN, count - held), (HELD_OUT, held)):
        index, start = 0, len(picked)
        while len(picked) - start < wanted:
            scene = stream.scene(index, split)
            index += 1
            if scene.prompt not in seen:
                seen.add(scene.prompt)
                picked.append(scene)
    return picked
