"""Pictures of a trace: acceptance maps, islands, finalisation heatmaps, latency charts, GIFs.

Pure numpy / PIL / matplotlib; no model and no gradio. Images are ``[h, w, 3]`` uint8 arrays,
token-grid masks are ``[H, W]`` arrays; ``upscale`` brings a grid to an image's pixel size.
The app, the CLI and the benchmark all draw with these functions, so a slide figure and the
browser show the same colours. The figures built from these pictures (a round's slide figure,
EAGLE-2's draft tree, the finalisation map, GIF frames) are in ``mulo.ui.figures``.
"""

from __future__ import annotations

import io
from collections.abc import Iterable

import matplotlib
import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from PIL import Image

from mulo import methods
from mulo.config import ConfigError
from mulo.trace import PHASES, Round, Trace

# Figures are built as plain ``Figure`` objects, never through pyplot: pyplot keeps global state,
# and the app draws for several users at once on worker threads.

COLORS = {
    "accepted": "#16a34a",  # green: the draft token passed the test
    "rejected": "#dc2626",  # red: the draft token failed it
    "reopened": "#f59e0b",  # amber: re-opened around a rejection and resampled by the target
    "t0": "#2563eb",  # blue: the round's first rejection
    "pending": "#d4d4d8",  # grey: not decided yet
}
# Latency stages shown to users, in stacking order; "other" is wall time no phase claimed.
STAGES = ("condition", "drafter", "upsample", "verify", "resample", "downsample", "target", "vq_decode", "other")
STAGE_COLORS = {
    "condition": "#a3a3a3",
    "drafter": "#8b5cf6",
    "upsample": "#06b6d4",
    "verify": "#2563eb",
    "resample": "#f59e0b",
    "downsample": "#14b8a6",
    "target": "#64748b",
    "vq_decode": "#ec4899",
    "other": "#d4d4d8",
}


def hex_rgb(color: str) -> np.ndarray:
    return np.array([int(color[i : i + 2], 16) for i in (1, 3, 5)], dtype=np.float32)


def upscale(grid: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Nearest-neighbour ``[H, W, ...]`` -> ``[h, w, ...]`` (h, w multiples of H, W)."""
    fy, fx = size[0] // grid.shape[0], size[1] // grid.shape[1]
    return np.repeat(np.repeat(grid, fy, axis=0), fx, axis=1)


def enlarge(image: np.ndarray, size: int) -> np.ndarray:
    """Nearest-neighbour enlargement so token cells stay sharp on screen and on slides; the
    longer side decides, so the result is never larger than ``size`` (or the image itself)."""
    factor = max(1, size // max(image.shape[:2]))
    return upscale(image, (image.shape[0] * factor, image.shape[1] * factor))


def token_colors(tokens: np.ndarray) -> np.ndarray:
    """A token grid as colours (a stable hash of each code); -1 (undecided) is grey.

    For traces whose family is not loaded (replay of a ``tar`` trace on a CPU machine)."""
    codes = tokens.astype(np.int64)
    hashed = (codes[..., None] * np.array([2654435761, 2246822519, 3266489917]) >> 13) % 200 + 40
    rgb = hashed.astype(np.uint8)
    rgb[codes < 0] = hex_rgb(COLORS["pending"]).astype(np.uint8)
    return rgb


def grey_pending(image: np.ndarray, decided: np.ndarray, strength: float = 0.75) -> np.ndarray:
    """Fade the pixels of undecided tokens towards grey, so a streaming canvas shows progress."""
    mask = upscale(~decided, image.shape[:2])[..., None]
    grey = hex_rgb(COLORS["pending"])
    faded = image.astype(np.float32) * (1 - strength) + grey * strength
    return np.where(mask, faded, image).astype(np.uint8)


def round_masks(rnd: Round) -> dict[str, np.ndarray]:
    """Disjoint boolean masks of one round, by verdict first: accepted and kept, accepted but
    re-opened (a neighbour was rejected), rejected, and re-opened without a verdict of its own."""
    accepted, rejected = rnd.accepted.astype(bool), rnd.rejected.astype(bool)
    reopened = rnd.reopened.astype(bool)
    return {
        "accepted": accepted & ~reopened,
        "accepted_reopened": accepted & reopened,
        "rejected": rejected,
        "reopened": reopened & ~accepted & ~rejected,
    }


def t0_mask(rnd: Round) -> np.ndarray:
    mask = np.zeros(rnd.draft.shape, dtype=bool)
    if rnd.t0 is not None:
        mask[divmod(rnd.t0, rnd.draft.shape[1])] = True
    return mask


def hatch(shape: tuple[int, int], period: int = 6, width: int = 2) -> np.ndarray:
    """``[h, w]`` bool: diagonal stripes, ``width`` of every ``period`` pixels."""
    y, x = np.indices(shape)
    return (x + y) % period < width


def overlay(image: np.ndarray, rnd: Round, opacity: float = 0.55, layers=("accepted", "rejected", "reopened", "t0")):
    """The round's acceptance map blended over ``image`` (a decoded image, a token mosaic or a
    white canvas, enlarged so a token spans several pixels). Every proposed token shows its
    verdict (green accepted, red rejected); re-opening is its own layer, amber diagonal stripes
    over the verdict, so a draft accepted and then re-opened around a rejected neighbour stays
    green underneath; t0 is solid blue."""
    out = image.astype(np.float32)
    size = image.shape[:2]
    verdicts = {"accepted": rnd.accepted.astype(bool), "rejected": rnd.rejected.astype(bool)}
    for name, mask in verdicts.items():
        if name in layers:
            m = upscale(mask, size)[..., None]
            out = np.where(m, out * (1 - opacity) + hex_rgb(COLORS[name]) * opacity, out)
    if "reopened" in layers:
        m = (upscale(rnd.reopened.astype(bool), size) & hatch(size))[..., None]
        out = np.where(m, hex_rgb(COLORS["reopened"]), out)
    if "t0" in layers:
        out = np.where(upscale(t0_mask(rnd), size)[..., None], hex_rgb(COLORS["t0"]), out)
    return out.astype(np.uint8)


def acceptance_map(rnd: Round, size: int, layers=("accepted", "rejected", "reopened", "t0")) -> np.ndarray:
    """The round's verdicts on a white token grid enlarged to about ``size`` px (so stripes fit)."""
    white = enlarge(np.full((*rnd.draft.shape, 3), 255, np.uint8), size)
    return overlay(white, rnd, opacity=1.0, layers=layers)


def legend_counts(rnd: Round) -> dict[str, int]:
    """The round's numbers as the figures' legends and titles state them."""
    masks = round_masks(rnd)
    return {
        "proposed": int(rnd.proposed),
        "accepted": int(rnd.accepted.sum()),
        "accepted_kept": int(masks["accepted"].sum()),
        "accepted_reopened": int(masks["accepted_reopened"].sum()),
        "rejected": int(rnd.rejected.sum()),
        "reopened": int(rnd.reopened.sum()),
        "islands": int(rnd.n_islands),
    }


def island_colors(islands: np.ndarray, background: np.ndarray | None = None) -> np.ndarray:
    """Each island in its own colour (tab20, cycling); elsewhere the faded background or white."""
    h, w = islands.shape
    base = np.full((h, w, 3), 255, np.float32) if background is None else background.astype(np.float32)
    if background is not None:
        islands = upscale(islands, background.shape[:2])
        base = base * 0.35 + 255 * 0.65
    palette = (np.array(matplotlib.colormaps["tab20"].colors) * 255).astype(np.float32)
    colored = palette[(islands - 1) % len(palette)]
    return np.where((islands > 0)[..., None], colored, base).astype(np.uint8)


def finalized_round(trace: Trace) -> np.ndarray:
    """``[H, W]``: index of the round after which each token was final (its value never changed)."""
    out = np.zeros(trace.grid, dtype=np.int64)
    for rnd in trace.rounds:  # a later change (resampling) moves the mark forward
        out[rnd.tokens != trace.tokens] = rnd.index + 1
    return np.minimum(out, max(0, len(trace.rounds) - 1))


def heatmap(values: np.ndarray, vmax: float | None = None, cmap: str = "viridis") -> np.ndarray:
    """A grid of numbers as an RGB image (negative values white)."""
    vmax = float(values.max()) if vmax is None else vmax
    scaled = np.clip(values / max(vmax, 1e-9), 0, 1)
    rgb = (matplotlib.colormaps[cmap](scaled)[..., :3] * 255).astype(np.uint8)
    rgb[values < 0] = 255
    return rgb


def stage_seconds(trace: Trace) -> dict[str, float]:
    """Seconds per displayed stage; "other" = wall time no phase claimed."""
    timings = {s: float(trace.timings_s.get(s, 0.0)) for s in STAGES if s in PHASES}
    timings["other"] = max(0.0, trace.latency_s - sum(timings.values()))
    return timings


def latency_figure(traces: dict[str, Trace], baseline: str | None = None, title: str = "Latency") -> Figure:
    """Stacked horizontal bars per method with total and speed-up over ``baseline``."""
    labels = list(traces)
    per_method = [stage_seconds(traces[label]) for label in labels]
    fig = Figure(figsize=(8, 0.7 * len(labels) + 1.4), dpi=150)
    ax = fig.subplots()
    left = np.zeros(len(labels))
    for stage in STAGES:
        values = np.array([seconds[stage] for seconds in per_method])
        if values.any():
            ax.barh(labels, values, left=left, color=STAGE_COLORS[stage], label=stage)
            left += values
    base = traces[baseline].latency_s if baseline in traces else None
    for i, label in enumerate(labels):
        total = traces[label].latency_s
        text = f" {total:.2f} s" + (f"  ({base / total:.2f}x)" if base and label != baseline else "")
        ax.text(left[i], i, text, va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, left.max() * 1.35 if left.max() > 0 else 1)
    ax.set_xlabel("seconds")
    ax.set_title(title)
    ax.legend(loc="lower right", fontsize=7, ncols=4, frameon=False)
    fig.tight_layout()
    return fig


def timeline_figure(trace: Trace, current: int | None = None) -> Figure:
    """Per-round wall time by phase on one time axis; ``current`` round outlined."""
    fig = Figure(figsize=(8, 2.2), dpi=150)
    ax = fig.subplots()
    start = 0.0
    for rnd in trace.rounds:
        for stage in STAGES[:-1]:
            seconds = rnd.timings_s.get(stage, 0.0)
            if seconds > 0:
                ax.barh(0, seconds, left=start, color=STAGE_COLORS[stage], edgecolor="none")
                start += seconds
        if rnd.index == current:
            spent = sum(rnd.timings_s.values())
            ax.barh(0, spent, left=start - spent, fill=False, edgecolor="black", linewidth=1.5)
    handles = [Rectangle((0, 0), 1, 1, color=STAGE_COLORS[s]) for s in STAGES[:-1]]
    ax.legend(handles, STAGES[:-1], loc="upper center", bbox_to_anchor=(0.5, -0.35), ncols=7, fontsize=7)
    ax.set_yticks([])
    ax.set_xlabel("seconds since start (rounds back to back)")
    ax.set_title(f"{trace.method}: {len(trace.rounds)} rounds", fontsize=9)
    fig.tight_layout()
    return fig


def figure_png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def method_name(method_id: str) -> str:
    """The paper's name of a method ("mulo" -> "MuLo-SD"); a replayed trace may name a method this
    build does not register, which keeps its id."""
    try:
        return methods.get(method_id).label
    except ConfigError:
        return str(method_id)


def gif(frames: Iterable[np.ndarray], seconds_per_frame: float = 0.6) -> bytes:
    """An animated GIF (looping) of equally sized RGB frames, encoded as they come (a generator
    of frames keeps one in memory at a time). Each frame gets its own 256-colour palette by the
    fast octree (PIL's default median cut took ~15 ms a frame, most of a 48-frame GIF's time)."""
    frames = iter(frames)

    def paletted(frame: np.ndarray) -> Image.Image:
        return Image.fromarray(frame).quantize(256, method=Image.Quantize.FASTOCTREE)

    first = paletted(next(frames))
    buf = io.BytesIO()
    rest = (paletted(f) for f in frames)
    first.save(buf, format="GIF", save_all=True, append_images=rest, duration=int(seconds_per_frame * 1000), loop=0)
    return buf.getvalue()


def outline_cell(image: np.ndarray, cell: tuple[int, int], grid: tuple[int, int], color: str = "#111827") -> np.ndarray:
    """``image`` (a token grid enlarged) with token ``cell`` (row, col) outlined: a dark frame two
    pixels wide inside the cell and a white one around it, visible on every verdict colour."""
    out = image.copy()
    fy, fx = image.shape[0] // grid[0], image.shape[1] // grid[1]
    top, left = cell[0] * fy, cell[1] * fx
    w = 2  # each frame's width in pixels
    for grow, rgb in ((0, hex_rgb(color)), (-w, np.full(3, 255.0))):  # the white frame just outside the dark one
        y0, x0 = max(0, top + grow), max(0, left + grow)
        y1, x1 = min(image.shape[0], top + fy - grow), min(image.shape[1], left + fx - grow)
        ring = np.zeros(image.shape[:2], bool)
        ring[y0:y1, x0:x1] = True
        ring[y0 + w : y1 - w, x0 + w : x1 - w] = False
        out[ring] = rgb.astype(np.uint8)
    return out
