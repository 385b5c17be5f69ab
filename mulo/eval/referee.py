"""The emoji scenes family's exact referee (issue 63): which vocabulary emoji an image shows (in
any style), where, and on which background colour; and whether that is what a prompt asked for.

It reads an image the way the generator (``mulo.train.scenes``) composes one, with the family's
sprites (every vocabulary emoji in every style at the family's object size, RGBA, from the
``sprites.npz`` the family ships; ``save_sprites`` writes it):
  background   the palette colour nearest to most pixels (at least half of them), and the colour
               those pixels really have (a VQ shifts flat colours a little)
  objects      pixels far from that colour, grouped into connected blobs on the 4-px token grid;
               each blob explained by the sprite window (any emoji, any style, any position that
               covers the blob) whose drawing over the observed background is nearest to the image
               (root-mean-square over the window), searched at half resolution, refined at full
               resolution; a blob that two objects touch is explained window after window
  unknown      a blob no sprite explains (RMSE above ``max_rmse``, or too little of its contrast
               explained): "something else"
Blobs under ``min_pixels`` pixels are specks (a VQ's seams), not objects.

Numpy only: the app and the benchmark score images with it without any training dependency.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from mulo.grid import islands
from mulo.scenes import PALETTE, ScenePrompt, parse_prompt

CELL = 4  # px: the target's token (the blobs are found on this grid)
BACKGROUND_SHARE = 0.5  # the background colour covers at least this share of the pixels
BACKGROUND_DISTANCE = 80.0  # RGB distance within which a pixel counts for a palette colour
FOREGROUND_DISTANCE = 48.0  # RGB distance from the observed background that makes a pixel foreground
CELL_PIXELS = 2  # foreground pixels that make a 4 x 4 cell foreground (one pixel is a seam)
MIN_PIXELS = 40  # a smaller blob is a speck, not an object
# A match is judged at half resolution (2 x 2 means), where blur costs little: a 32 px scene
# blurred by a Gaussian of sigma 1 px, or reduced to 64 px and scaled back, keeps its sprites
# within RMSE 21 and explains >= 0.70 of their contrast there, while emoji outside the vocabulary
# (30 others, in the five styles) lie at RMSE >= 29 for 95 % of them and explain <= 0.81
# (tools/experiments/scenes_referee.py measured both; docs in benchmarks/scenes-referee.json).
MAX_RMSE = 24.0  # per-channel RMSE over the half-resolution window: above it the blob is something else
MIN_EXPLAINED = 0.65  # and the sprite must explain this share of the window's contrast to the background
SEARCH_PAD = 8  # px beyond a blob's box that a window may reach on each side (blur and pale edges shrink it)
REFINE = 2  # px around the half-resolution match searched at full resolution
CANDIDATES = 6  # templates refined at full resolution


@dataclass(frozen=True)
class Sprites:
    """Every vocabulary emoji in every style: ``rgba[emoji, style]`` is ``[px, px, 4]`` uint8."""

    names: tuple[str, ...]
    styles: tuple[str, ...]
    rgba: np.ndarray  # [V, S, px, px, 4] uint8, straight (not premultiplied) alpha
    canvas: int  # the scene's side in px

    @property
    def px(self) -> int:
        return self.rgba.shape[2]

    def subset(self, names) -> Sprites:
        index = [self.names.index(n) for n in names]
        return Sprites(tuple(names), self.styles, self.rgba[index], self.canvas)

    @classmethod
    def load(cls, path: str | Path) -> Sprites:
        with np.load(path) as z:
            return cls(tuple(z["names"].tolist()), tuple(z["styles"].tolist()), z["rgba"], int(z["canvas"]))


def save_sprites(path: str | Path, sprites: Sprites) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        path, names=np.array(sprites.names), styles=np.array(sprites.styles), rgba=sprites.rgba, canvas=sprites.canvas
    )
    return path


def visible_share(sprites: Sprites, colour) -> np.ndarray:
    """``[V, S]``: the share of each sprite's opaque pixels that stand out from a ``colour``
    background as the referee sees foreground (a yellow star on yellow has almost none)."""
    rgba = sprites.rgba.astype(np.float32)
    alpha = rgba[..., 3:] / 255
    colour = np.asarray(colour, dtype=np.float32)
    drawn = rgba[..., :3] * alpha + (1 - alpha) * colour
    far = np.linalg.norm(drawn - colour, axis=-1) > FOREGROUND_DISTANCE
    return far.sum(axis=(2, 3)) / np.maximum((alpha[..., 0] > 0.5).sum(axis=(2, 3)), 1)


@dataclass(frozen=True)
class Found:
    name: str
    style: str
    x: int  # the sprite window's top-left corner, px
    y: int
    rmse: float  # of the window against the sprite drawn over the observed background, at half resolution
    explained: float  # share of the window's contrast to the background that the sprite explains


@dataclass(frozen=True)
class Blob:
    """Something the referee cannot name: its box (x0, y0, x1, y1), px, end exclusive."""

    box: tuple[int, int, int, int]
    pixels: int


@dataclass
class Reading:
    background: str | None  # the palette colour, None when no colour covers half the image
    objects: list[Found] = field(default_factory=list)
    unknown: list[Blob] = field(default_factory=list)

    def names(self) -> list[str]:
        return [f.name for f in self.objects]


@dataclass
class Verdict:
    match: bool
    prompt: ScenePrompt
    reading: Reading
    found: list[str]  # named emoji present exactly once
    missing: list[str]  # named emoji absent
    repeated: list[str]  # named emoji present more than once
    extra: list[str]  # vocabulary emoji not named
    background_ok: bool
    style_ok: bool  # every object in the prompt's style (True when it names none): reported, not matched

    def sentence(self) -> str:
        """What the referee saw, in one plain sentence (the app's quality line)."""
        parts = []
        if self.found:
            parts.append(f"found {', '.join(self.found)}")
        if self.missing:
            parts.append(f"missing {', '.join(self.missing)}")
        if self.repeated:
            parts.append(f"more than one {', '.join(self.repeated)}")
        others = self.extra + ["something else"] * len(self.reading.unknown)
        if others:
            parts.append(f"also {', '.join(others)}")
        if not self.background_ok:
            parts.append(f"background {self.reading.background or 'not one colour'}, asked {self.prompt.background}")
        verdict = "matches the prompt" if self.match else "does not match the prompt"
        return f"{verdict}: {'; '.join(parts) or 'nothing found'}"


def _pool(image: np.ndarray) -> np.ndarray:
    """2 x 2 mean over the last-but-one two axes (``[..., h, w, c]``)."""
    h, w = image.shape[-3] // 2, image.shape[-2] // 2
    return image.reshape(*image.shape[:-3], h, 2, w, 2, image.shape[-1]).mean(axis=(-4, -2))


def _components(mask: np.ndarray) -> list[np.ndarray]:
    """8-connected components of a small boolean grid, each as a boolean grid, in the raster order
    of their first cell (MuLo-SD's islands, ``mulo.grid.islands``)."""
    labels = islands(torch.from_numpy(mask)).numpy()
    return [labels == n for n in range(1, int(labels.max()) + 1)]


class Referee:
    def __init__(self, sprites: Sprites, palette: dict = PALETTE, max_rmse: float = MAX_RMSE):
        if sprites.px % 2 or sprites.canvas % CELL:
            raise ValueError(f"sprites of {sprites.px} px on a {sprites.canvas} px canvas: both must be even")
        self.sprites, self.palette, self.max_rmse = sprites, dict(palette), max_rmse
        v, s, px = sprites.rgba.shape[:3]
        rgba = sprites.rgba.reshape(v * s, px, px, 4).astype(np.float32)
        self.alpha = rgba[..., 3:] / 255  # [T, px, px, 1]
        self.premultiplied = rgba[..., :3] * self.alpha
        # at half resolution, flattened: a template over colour c is premultiplied + (1 - alpha) c
        self.pooled_premultiplied = _pool(self.premultiplied).reshape(len(rgba), -1)
        self.pooled_transparency = np.repeat(1 - _pool(self.alpha), 3, axis=-1).reshape(len(rgba), -1)
        self.labels = [(name, style) for name in sprites.names for style in sprites.styles]
        self.colours = np.array(list(self.palette.values()), dtype=np.float32)

    @classmethod
    def load(cls, path: str | Path) -> Referee:
        return cls(Sprites.load(path))

    # -- reading an image --------------------------------------------------------------------
    def background(self, image: np.ndarray) -> tuple[str | None, np.ndarray]:
        """(palette colour or None, the observed background colour)."""
        pixels = _pool(image).reshape(-1, 3)  # a quarter of the pixels tell the same
        distance = np.linalg.norm(pixels[:, None, :] - self.colours[None], axis=-1)
        nearest = distance.argmin(1)
        close = distance[np.arange(len(pixels)), nearest] < BACKGROUND_DISTANCE
        counts = np.bincount(nearest[close], minlength=len(self.colours))
        best = int(counts.argmax())
        if counts[best] < BACKGROUND_SHARE * len(pixels):
            return None, np.median(pixels[:, :], axis=0)  # no colour dominates: segment from the median
        return list(self.palette)[best], np.median(pixels[close & (nearest == best)], axis=0)

    def read(self, image: np.ndarray) -> Reading:
        image = np.asarray(image)
        side = self.sprites.canvas
        if image.shape != (side, side, 3):
            raise ValueError(f"the referee reads {side} x {side} RGB images, not {image.shape}")
        image = image.astype(np.float32)
        name, colour = self.background(image)
        reading = Reading(name)
        foreground = np.linalg.norm(image - colour, axis=-1) > FOREGROUND_DISTANCE
        cells = foreground.reshape(side // CELL, CELL, side // CELL, CELL).sum(axis=(1, 3)) >= CELL_PIXELS
        # fragments one cell apart are one blob (an object partly the background's colour breaks up)
        padded, n = np.pad(cells, 1), side // CELL
        grown = np.zeros_like(cells)
        for dy in range(3):
            for dx in range(3):
                grown |= padded[dy : dy + n, dx : dx + n]
        pooled = self.pooled_premultiplied + self.pooled_transparency * np.tile(colour, self.sprites.px**2 // 4)
        context = (image, _pool(image), colour, pooled)
        for part in _components(grown):
            blob = foreground & np.kron(part & cells, np.ones((CELL, CELL), dtype=bool))
            self._explain(blob, context, reading)
        return reading

    def _explain(self, blob: np.ndarray, context, reading: Reading) -> None:
        """Name what ``blob`` (a pixel mask) shows, window after window, into ``reading``."""
        for _ in range(4):  # at most four objects touch in one blob
            if blob.sum() < MIN_PIXELS:
                return
            ys, xs = np.nonzero(blob)
            box = (int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1)
            found = self._best_window(box, context, reading.objects)
            if found is None:
                reading.unknown.append(Blob(box, int(blob.sum())))
                return
            reading.objects.append(found)
            blob[found.y : found.y + self.sprites.px, found.x : found.x + self.sprites.px] = False

    def _window_range(self, low: int, high: int) -> range:
        """Top-left coordinates (even) of the windows over a blob spanning [low, high) on one axis."""
        px, side = self.sprites.px, self.sprites.canvas
        if high - low <= px:  # the window covers the blob
            first, last = high - px - SEARCH_PAD, low + SEARCH_PAD
        else:  # more than one object: any window inside the blob's span
            first, last = low - SEARCH_PAD, high - px + SEARCH_PAD
        first, last = max(0, first), min(side - px, last)
        return range(first - first % 2, last + 1, 2)

    def _best_window(self, box, context, taken: list[Found]) -> Found | None:
        image, pooled_image, colour, pooled = context
        px, half = self.sprites.px, self.sprites.px // 2
        xs, ys = self._window_range(box[0], box[2]), self._window_range(box[1], box[3])

        def overlap(x, y, f):  # objects never overlap: a window over a found one is not another object
            return max(0, px - abs(x - f.x)) * max(0, px - abs(y - f.y))

        windows = [(x, y) for y in ys for x in xs if all(overlap(x, y, f) <= px * px // 4 for f in taken)]
        if not windows:
            return None
        # half resolution: every window x every template, one matrix product
        patches = np.stack([pooled_image[y // 2 : y // 2 + half, x // 2 : x // 2 + half] for x, y in windows])
        patches = patches.reshape(len(windows), -1)
        squared = (patches**2).sum(1)[:, None] - 2 * patches @ pooled.T + (pooled**2).sum(1)[None]
        # minus what the background alone leaves: a window that cuts the blob, with a sprite that is
        # almost the background colour, would otherwise win by leaving the blob's contrast outside it
        background = np.tile(colour, half * half)
        squared -= ((patches - background) ** 2).sum(1)[:, None]
        best_window = squared.argmin(0)  # per template
        order = np.argsort(squared[best_window, np.arange(len(pooled))])
        picked, seen = [], set()
        for t in order:  # the best few emoji (one style each: the best)
            if self.labels[t][0] not in seen:
                seen.add(self.labels[t][0])
                picked.append(int(t))
            if len(picked) == CANDIDATES:
                break
        # full resolution around each candidate's window
        side, best = self.sprites.canvas, None
        for t in picked:
            x0, y0 = windows[best_window[t]]
            left, top = max(0, x0 - REFINE), max(0, y0 - REFINE)
            right, bottom = min(side - px, x0 + REFINE), min(side - px, y0 + REFINE)
            region = image[top : bottom + px, left : right + px]
            views = np.lib.stride_tricks.sliding_window_view(region, (px, px, 3))[:, :, 0]
            views = _pool(views).reshape(*views.shape[:2], -1)  # every 1 px shift, judged at half resolution
            errors = ((views - pooled[t]) ** 2).mean(axis=-1) - ((views - background) ** 2).mean(axis=-1)
            for dy, dx in zip(*np.unravel_index(np.argsort(errors, axis=None), errors.shape), strict=True):
                x, y = left + int(dx), top + int(dy)
                if all(overlap(x, y, f) <= px * px // 4 for f in taken):
                    if best is None or errors[dy, dx] < best[0]:
                        best = (float(errors[dy, dx]), t, x, y)
                    break
        if best is None:
            return None
        _, t, x, y = best
        window = _pool(image[y : y + px, x : x + px]).reshape(-1)
        error = float(((window - pooled[t]) ** 2).mean())
        contrast = float(((window - background) ** 2).mean())
        explained = 1 - error / max(contrast, 1e-6)
        rmse = error**0.5
        if rmse > self.max_rmse or explained < MIN_EXPLAINED:
            return None
        name, style = self.labels[t]
        return Found(name, style, x, y, round(rmse, 2), round(explained, 4))

    # -- against a prompt ----------------------------------------------------------------------
    def prompt_match(self, image: np.ndarray, prompt: str | ScenePrompt) -> Verdict:
        """Every emoji the prompt names present exactly once, nothing else, the background it names."""
        if isinstance(prompt, str):
            prompt = parse_prompt(prompt, names=self.sprites.names)
        reading = self.read(image)
        seen = reading.names()
        found = [n for n in prompt.objects if seen.count(n) == 1]
        missing = [n for n in prompt.objects if n not in seen]
        repeated = [n for n in prompt.objects if seen.count(n) > 1]
        extra = [n for n in seen if n not in prompt.objects]
        background_ok = prompt.background is None or reading.background == prompt.background
        style_ok = prompt.style is None or all(f.style == prompt.style for f in reading.objects)
        match = not missing and not repeated and not extra and not reading.unknown and background_ok
        return Verdict(match, prompt, reading, found, missing, repeated, extra, background_ok, style_ok)


def prompt_match(image: np.ndarray, prompt: str | ScenePrompt, sprites: Sprites | str | Path) -> Verdict:
    """``Referee(sprites).prompt_match(image, prompt)``, with ``sprites`` or the path of their file."""
    referee = Referee(sprites if isinstance(sprites, Sprites) else Sprites.load(sprites))
    return referee.prompt_match(image, prompt)
