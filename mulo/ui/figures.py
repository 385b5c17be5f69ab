"""The figures and GIF frames of a trace, built from ``mulo.ui.viz``'s pictures: the slide figure
of a round (``round_layout``), EAGLE-2's draft tree (``tree_figure``), when tokens became final
(``finalized_map``) and the frames of a run's GIF (``gif_frames``).

Titles and headers say in words what the pictures show (method, prompt, seed, round, counts,
settings), so a figure can go on a slide unchanged. Figures are plain ``Figure`` objects with an
Agg canvas (never pyplot: the app draws on worker threads); the canvas also measures text, so
titles, legends and labels are laid out where they do not overlap.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator, Sequence

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.transforms import Bbox
from PIL import Image, ImageDraw, ImageFont

from mulo.trace import Round, Trace
from mulo.ui.viz import (
    COLORS,
    acceptance_map,
    enlarge,
    finalized_round,
    grey_pending,
    island_colors,
    legend_counts,
    method_name,
    overlay,
)


# -- words for titles and headers ---------------------------------------------------------------
def plural(n: int, noun: str) -> str:
    """``1,024 tokens``, ``1 token``."""
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def newly_decided(trace: Trace, index: int) -> int:
    """Tokens final after round ``index`` that were undecided (-1) before it: what a round without
    drafts (plain AR, ZipAR) decoded."""
    now = trace.rounds[index].tokens >= 0
    if index == 0:
        return int(now.sum())
    return int((now & (trace.rounds[index - 1].tokens < 0)).sum())


def counts_sentence(trace: Trace, index: int) -> str:
    """The round's numbers in words, as the slide figure states them."""
    c = legend_counts(trace.rounds[index])
    if not c["proposed"]:
        return f"no draft: the target decoded {plural(newly_decided(trace, index), 'token')}"
    text = f"{plural(c['proposed'], 'draft token')} proposed: {c['accepted']:,} accepted, {c['rejected']:,} rejected"
    if c["reopened"]:
        text += f"; {c['reopened']:,} re-opened and resampled in {plural(c['islands'], 'island')}"
    coupled = trace.rounds[index].coupled
    if coupled is not None:
        text += f"; {plural(int(coupled.sum()), 'draft')} kept by the coupling for the next iteration"
    return text


def settings_sentence(config: dict) -> str:
    """MuLo-SD's knobs in words (those the config holds); the stale-K/V ablation named when on."""
    number = lambda v: f"{v:g}" if isinstance(v, float) else str(v)  # noqa: E731
    parts = []
    if "r" in config:
        parts.append("drafter at full resolution" if config["r"] == 1 else f"drafter at 1/{config['r']} resolution")
    if "tau" in config:
        parts.append(f"threshold τ = {number(config['tau'])}")
    if "k" in config:
        parts.append(f"pooled over k = {config['k']} codebook neighbour" + ("" if config["k"] == 1 else "s"))
    if "radius" in config:
        parts.append(f"re-open radius l = {config['radius']}")
    if config.get("refresh", True) is False:
        parts.append("stale K/V (ablation)")
    return " · ".join(parts)


def round_title(trace: Trace, index: int) -> list[str]:
    """The slide figure's title lines: method, prompt, seed and round; the counts; for MuLo-SD its
    settings. Rounds are numbered from 1, as the app shows them."""
    prompt = trace.prompt if len(trace.prompt) <= 60 else trace.prompt[:59] + "…"
    lines = [
        f'{method_name(trace.method)} · "{prompt}" · seed {trace.seed} · round {index + 1} of {len(trace.rounds)}',
        counts_sentence(trace, index),
    ]
    if trace.method == "mulo" and settings_sentence(trace.config):
        lines.append(settings_sentence(trace.config))
    return lines


# -- the slide figure of a round ----------------------------------------------------------------
TITLE_PT, SETTINGS_PT, LEGEND_PT, PANEL_PT = 13, 10, 11, 11  # readable once pasted on a slide


def figure_fraction(fig: Figure, artist) -> Bbox:
    """An artist's extent in figure coordinates (0..1), measured with the figure's Agg renderer."""
    return artist.get_window_extent(fig.canvas.get_renderer()).transformed(fig.transFigure.inverted())


def round_layout(
    trace: Trace, index: int, draft_image: np.ndarray, canvas_image: np.ndarray, size: int = 384
) -> Figure:
    """The slide figure of one round, pasteable as it is: up-sampled draft, acceptance map on
    tokens and on the image, islands, canvas after the round; above them the title in words
    (``round_title``), below a legend with the colours and the round's numbers. The title and the
    legend are measured first and the panels laid out in what they leave, so nothing overlaps."""
    rnd = trace.rounds[index]
    counts = legend_counts(rnd)
    draft = enlarge(draft_image, size)
    panels = [
        ("up-sampled draft", draft),
        ("verdicts (tokens)", acceptance_map(rnd, size)),
        ("verdicts (image)", overlay(draft, rnd)),
        (f"islands ({rnd.n_islands}; one colour each)", island_colors(rnd.islands, draft)),
        ("canvas after round", enlarge(canvas_image, size)),
    ]
    fig = Figure(figsize=(3.2 * len(panels), 5.2), dpi=150)
    FigureCanvasAgg(fig)
    for ax, (title, img) in zip(fig.subplots(1, len(panels)), panels, strict=True):
        ax.imshow(img, interpolation="nearest")
        ax.set_title(title, fontsize=PANEL_PT)
        ax.axis("off")
    lines = round_title(trace, index)
    # the prompt comes from the request or a trace file: never read as mathtext
    title = fig.suptitle("\n".join(lines[:2]), y=0.985, va="top", fontsize=TITLE_PT, parse_math=False)
    top = figure_fraction(fig, title).y0
    if len(lines) > 2:
        settings = fig.text(
            0.5, top - 0.012, lines[2], ha="center", va="top", fontsize=SETTINGS_PT, color="#3f3f46", parse_math=False
        )
        top = figure_fraction(fig, settings).y0
    legend = fig.legend(
        *legend_handles(counts), loc="lower center", bbox_to_anchor=(0.5, 0.01), ncols=3, fontsize=LEGEND_PT,
        frameon=False,
    )  # fmt: skip
    fig.tight_layout(rect=(0, figure_fraction(fig, legend).y1 + 0.01, 1, top - 0.015))
    return fig


def legend_handles(counts: dict[str, int]) -> tuple[list, list[str]]:
    """Legend patches and labels with the round's counts; re-opening drawn as the stripes it is."""
    stripes = {"hatch": "////", "edgecolor": COLORS["reopened"], "linewidth": 0}
    entries = [
        (Rectangle((0, 0), 1, 1, facecolor=COLORS["accepted"]), f"accepted, kept ({counts['accepted_kept']})"),
        (
            Rectangle((0, 0), 1, 1, facecolor=COLORS["accepted"], **stripes),
            f"accepted, re-opened by a neighbour ({counts['accepted_reopened']})",
        ),
        (Rectangle((0, 0), 1, 1, facecolor=COLORS["rejected"], **stripes), f"rejected ({counts['rejected']})"),
        (Rectangle((0, 0), 1, 1, facecolor="white", **stripes), f"re-opened, resampled ({counts['reopened']})"),
        (Rectangle((0, 0), 1, 1, facecolor=COLORS["t0"]), "t0 (first rejection)"),
    ]
    return [h for h, _ in entries], [label for _, label in entries]


# -- EAGLE-2's draft tree -----------------------------------------------------------------------
def _tree_rows(parents: list[int]) -> dict[int, float]:
    """A row for each node (-1: the root): leaves one row apart in depth-first order, parents
    centred on their children."""
    children: dict[int, list[int]] = {}
    for j, p in enumerate(parents):
        children.setdefault(p, []).append(j)
    rows: dict[int, float] = {}

    def place(node: int, next_row: list[float]) -> float:
        kids = children.get(node, [])
        if not kids:
            rows[node] = next_row[0]
            next_row[0] += 1
        else:
            rows[node] = float(np.mean([place(k, next_row) for k in kids]))
        return rows[node]

    place(-1, [0.0])
    return rows


TREE_PT = 7  # node labels and grid positions, whatever the tree's size
TREE_MAX_IN = (16.0, 12.0)  # the largest tree figure; past it nodes lose labels, never overlap
TREE_COLUMN_IN, TREE_MARGIN_IN, TREE_POSITIONS_IN = 0.62, 0.3, 0.25  # a depth column; margins; the position row
# per label mode: the pitch of leaf rows and the room above the first row and below the last (inches)
TREE_ROW_IN = {"full": (0.32, 0.18), "code": (0.19, 0.11)}
TREE_TITLE_PT = 8
TREE_KEY = {
    "full": "code / drafter probability",
    "code": "code of each node (too many to show probabilities)",
    "marks": "too many nodes to label: codes of the root, the accepted path and the next token only",
}


def tree_title(rnd: Round, width_in: float, mode: str) -> str:
    """The tree figure's title, wrapped to the figure's width so none of it is cut off."""
    tree, depths = rnd.tree, rnd.tree["depth"]
    tried = sum(s != 0 for s in tree["status"])
    accepted = sum(s == 1 for s in tree["status"])
    head = (
        f"round {rnd.index + 1}: {len(depths)} nodes, depth {max(depths, default=0)}, {tried} tried, "
        f"{accepted} accepted"
    )
    key = f"{TREE_KEY[mode]}; green accepted, red rejected, grey untried, amber the token drawn next"
    chars = int(width_in * 72 / (TREE_TITLE_PT * 0.62))  # generous average glyph width
    return "\n".join(textwrap.wrap(head, chars) + textwrap.wrap(key, chars))


def tree_mode(columns: float, last_row: float, free_in: float) -> tuple[str, float, float]:
    """How much each node's label says, the row pitch and the room around the rows (inches): two
    lines (code, probability) while the rows fit in ``free_in``, then the code alone, then only
    coloured marks (``columns`` too narrow for a label's width also means marks)."""
    if (TREE_MAX_IN[0] - 2 * TREE_MARGIN_IN) / columns >= 0.5:
        for mode, (pitch, room) in TREE_ROW_IN.items():
            if last_row * pitch + 2 * room <= free_in:
                return mode, pitch, room
    room = TREE_ROW_IN["code"][1]
    return "marks", (free_in - 2 * room) / max(last_row, 1.0), room


def tree_figure(rnd: Round, grid_width: int) -> Figure:
    """EAGLE-2's draft tree of one round: a column per position after the root, one box per
    proposed token (its code and drafter probability), green where accepted, red where tried and
    rejected, grey where never tried; the token drawn after the accepted path in amber, on a row of
    its own. The figure grows with the tree (rows with leaves, width with depth) at a fixed font
    size up to ``TREE_MAX_IN``; a larger tree shows fewer labels (``tree_mode``) instead of
    overlapping ones. The title (round counted from 1) is wrapped to the figure's width."""
    tree = rnd.tree
    if not tree:
        fig = Figure(figsize=(8, 2), dpi=150)
        ax = fig.subplots()
        ax.axis("off")
        ax.text(0.5, 0.5, "no draft tree in this round (EAGLE-2 rounds have one)", ha="center", va="center")
        return fig
    parents, depths, n = list(tree["parent"]), list(tree["depth"]), len(tree["parent"])
    path = {j for j, s in enumerate(tree["status"]) if s == 1}
    last = max(path, key=lambda j: depths[j]) if path else -1
    if tree["next"] is not None:  # the next token as one more child of the path's end: its own row
        parents.append(last)
        depths.append(depths[last] + 1 if last >= 0 else 1)
    rows = _tree_rows(parents)
    top, last_row = max(depths, default=0), max(rows.values())
    columns = top + 1.2  # x from -0.6 to top + 0.6
    width = min(TREE_MAX_IN[0], max(6.0, 2 * TREE_MARGIN_IN + TREE_COLUMN_IN * columns))
    lines = max(tree_title(rnd, width, mode).count("\n") + 1 for mode in TREE_KEY)
    above = 0.15 + lines * TREE_TITLE_PT * 1.3 / 72 + TREE_POSITIONS_IN  # title and grid positions
    mode, pitch, room = tree_mode(columns, last_row, TREE_MAX_IN[1] - above - TREE_MARGIN_IN)
    height = max(2.8, last_row * pitch + 2 * room + above + TREE_MARGIN_IN)
    fig = Figure(figsize=(width, height), dpi=150)
    FigureCanvasAgg(fig)
    fig.suptitle(tree_title(rnd, width, mode), y=1 - 0.08 / height, va="top", fontsize=TREE_TITLE_PT)
    margin_x, margin_y = TREE_MARGIN_IN / width, TREE_MARGIN_IN / height
    ax = fig.add_axes((margin_x, margin_y, 1 - 2 * margin_x, 1 - margin_y - above / height))
    ax.axis("off")
    for j, parent in enumerate(parents):
        colour, lw = (COLORS["reopened"], 1.2) if j == n else ("#a1a1aa", 0.6)
        ax.plot([depths[j] - 1, depths[j]], [rows[parent], rows[j]], color=colour, linewidth=lw, zorder=1)
    status_color = {0: COLORS["pending"], 1: COLORS["accepted"], 2: COLORS["rejected"]}
    nodes = [(j, tree["token"][j], status_color[tree["status"][j]], f"\n{tree['q'][j]:.2f}") for j in range(n)]
    if tree["next"] is not None:
        nodes.append((n, tree["next"], COLORS["reopened"], "\nnext"))
    if mode == "marks":  # every node a coloured square, labels on the path and the next token only
        side = min(6.0, 0.7 * pitch * 72)
        ax.scatter([depths[j] for j, *_ in nodes], [rows[j] for j, *_ in nodes], s=side**2, marker="s",
                   c=[colour for _, _, colour, _ in nodes], linewidths=0, zorder=2)  # fmt: skip
        nodes = [node for node in nodes if node[0] in path or node[0] == n]
    boxes = [(0, rows[-1], "root", "#e4e4e7")]
    boxes += [
        (depths[j], rows[j], f"{code}{more if mode == 'full' else ''}", colour) for j, code, colour, more in nodes
    ]
    for x, y, text, colour in boxes:
        ax.text(x, y, text, ha="center", va="center", fontsize=TREE_PT, zorder=3,
                bbox=dict(boxstyle="round,pad=0.25", facecolor=colour, edgecolor="white", linewidth=0.5))  # fmt: skip
    for d in range(1, top + 1):  # the grid position of each column, above the axes
        row, col = divmod(tree["root"] + d, grid_width)
        ax.annotate(
            f"({row}, {col})", (d, 1), xycoords=("data", "axes fraction"), xytext=(0, 4), textcoords="offset points",
            ha="center", va="bottom", fontsize=TREE_PT, color="#52525b",
        )  # fmt: skip
    spare = height - above - TREE_MARGIN_IN - 2 * room  # inches for the rows (more than asked: a short tree)
    scale = spare / last_row if last_row else pitch  # inches per row
    ax.set_xlim(-0.6, top + 0.6)
    ax.set_ylim(last_row + room / scale, -room / scale)
    return fig


# -- when tokens became final -------------------------------------------------------------------
def finalized_ticks(n_rounds: int, most: int = 8) -> list[int]:
    """Round indices the colour bar labels: every round, or a handful evenly spaced with the
    first and the last."""
    if n_rounds <= most:
        return list(range(n_rounds))
    return sorted({round(i * (n_rounds - 1) / (most - 3)) for i in range(most - 2)})


def finalized_figure(trace: Trace, size: int) -> Figure:
    """The round after which each token was final (``finalized_round``), one colour per round,
    with a colour bar labelled "round 1" ... "round N"; about ``size`` px tall."""
    n = len(trace.rounds)
    dpi, height = 100, max(size, 240)
    fig = Figure(figsize=(1.45 * height / dpi, height / dpi), dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    cmap = matplotlib.colormaps["viridis"].resampled(min(n, 256))
    image = ax.imshow(finalized_round(trace), cmap=cmap, vmin=-0.5, vmax=n - 0.5, interpolation="nearest")
    ax.set_title("round after which each token was final", fontsize=9)
    ax.axis("off")
    ticks = finalized_ticks(n)
    bar = fig.colorbar(image, ax=ax, ticks=ticks, fraction=0.08, pad=0.03)
    bar.ax.set_yticklabels([f"round {t + 1}" for t in ticks])
    bar.ax.tick_params(labelsize=8)
    return fig


def finalized_map(trace: Trace, size: int) -> np.ndarray | None:
    """``finalized_figure`` as an RGB array; None for a single-round trace (every token was final
    after its only round: the picture would say nothing)."""
    if len(trace.rounds) <= 1:
        return None
    fig = finalized_figure(trace, size)
    fig.canvas.draw()
    return np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()


# -- GIF frames ---------------------------------------------------------------------------------
GIF_GAP, GIF_PAD = 8, 8  # px between the two pictures; around the header's text


def resample_waves(rnd: Round) -> list[int]:
    """The round's resampling waves (sorted distinct positive ``rnd.resampled``)."""
    return sorted(int(w) for w in np.unique(rnd.resampled) if w > 0)


def frame_header(trace: Trace, index: int, wave: int | None = None, n_waves: int = 0) -> list[str]:
    """A GIF frame's header: method and round (and wave: its 1-based position of ``n_waves``), then
    the round's numbers."""
    head = f"{method_name(trace.method)} · round {index + 1} of {len(trace.rounds)}"
    if wave is not None:
        head += f" · wave {wave} of {n_waves}"
    c = legend_counts(trace.rounds[index])
    if not c["proposed"]:
        return [head, counts_sentence(trace, index)]  # "no draft: the target decoded N tokens"
    counts = f"{c['proposed']:,} proposed · {c['accepted']:,} accepted · {c['rejected']:,} rejected"
    if c["reopened"]:
        counts += f" · {c['reopened']:,} re-opened in {plural(c['islands'], 'island')}"
    return [head, counts]


def fit(image: np.ndarray, size: int) -> np.ndarray:
    """``image`` centred on a white ``size`` x ``size`` square: enlarged by a whole factor (token
    cells stay sharp), shrunk when larger than the square, so every frame of a GIF has one size."""
    image = enlarge(image, size)
    h, w = image.shape[:2]
    if max(h, w) > size:
        h, w = max(1, round(h * size / max(h, w))), max(1, round(w * size / max(h, w)))
        image = np.asarray(Image.fromarray(image).resize((w, h), Image.Resampling.LANCZOS))
    out = np.full((size, size, 3), 255, np.uint8)
    out[(size - h) // 2 : (size - h) // 2 + h, (size - w) // 2 : (size - w) // 2 + w] = image
    return out


def wrap_px(text: str, font: ImageFont.FreeTypeFont, width: int) -> list[str]:
    """``text`` broken at spaces into lines at most ``width`` px wide (a longer word stays whole)."""
    lines = [""]
    for word in text.split(" "):
        trial = f"{lines[-1]} {word}" if lines[-1] else word
        if lines[-1] and font.getlength(trial) > width:
            lines.append(word)
        else:
            lines[-1] = trial
    return lines


def header_strip(lines: list[tuple[str, str]], font, width: int, height: int) -> np.ndarray:
    """A white ``[height, width, 3]`` strip with (text, colour) lines drawn by PIL."""
    strip = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(strip)
    for j, (text, colour) in enumerate(lines):
        draw.text((GIF_PAD, GIF_PAD + j * round(font.size * 1.3)), text, fill=colour, font=font)
    return np.asarray(strip)


def frame_plan(trace: Trace, rounds: list[int]) -> list[tuple[int, int | None, list[str]]]:
    """``gif_frames``'s frames, before drawing: (round index, wave or None, header) each. A
    MuLo-SD round advances its islands one token per wave, so a round may make dozens of frames:
    a caller with a frame budget counts them here."""
    plan = []
    for i in rounds:
        waves = resample_waves(trace.rounds[i])
        if len(waves) > 1:
            plan += [(i, wave, frame_header(trace, i, k + 1, len(waves))) for k, wave in enumerate(waves)]
        else:
            plan.append((i, None, frame_header(trace, i)))
    return plan


def gif_frames(
    trace: Trace,
    drafts: Sequence[np.ndarray | None],
    canvases: Sequence[np.ndarray],
    rounds: list[int],
    size: int,
    max_frames: int | None = None,
) -> Iterator[np.ndarray]:
    """Equally sized RGB frames for ``gif``: per round of ``rounds``, one frame, or one per
    resampling wave when the round has several. Left the acceptance overlay on the round's draft
    (its canvas for rounds without one), right the canvas after the round; a wave's frame greys
    the tokens later waves resampled. Each picture fills a ``size`` x ``size`` square; above them
    a white header (``frame_header``) in text at least 14 px high, as tall as the longest header
    of the GIF needs. Frames are drawn one at a time as the encoder asks for them. Past
    ``max_frames``, evenly spaced frames are kept, the first and last among them (each header
    still says which wave of how many it shows)."""
    plan = frame_plan(trace, rounds)
    if max_frames is not None and len(plan) > max_frames:
        plan = [plan[k] for k in sorted({round(j * (len(plan) - 1) / (max_frames - 1)) for j in range(max_frames)})]
    if not plan:
        return
    width = 2 * size + GIF_GAP
    font = ImageFont.load_default(size=max(14, width // 36))
    wrapped = [
        [(line, "#000000" if j == 0 else "#3f3f46") for j, text in enumerate(header) for line in
         wrap_px(text, font, width - 2 * GIF_PAD)]
        for *_, header in plan
    ]  # fmt: skip
    header_h = 2 * GIF_PAD + max(len(lines) for lines in wrapped) * round(font.size * 1.3)
    gap = np.full((size, GIF_GAP, 3), 255, np.uint8)
    left_of = None
    for (i, wave, _), lines in zip(plan, wrapped, strict=True):
        rnd, canvas = trace.rounds[i], canvases[i]
        if left_of != i:  # the same overlay for every wave of a round
            base = drafts[i] if drafts[i] is not None else canvas
            left, left_of = fit(overlay(enlarge(base, size), rnd), size), i
        h, w = rnd.resampled.shape
        if wave is not None and canvas.shape[0] % h == 0 and canvas.shape[1] % w == 0:  # whole token cells
            canvas = grey_pending(canvas, (rnd.resampled == 0) | (rnd.resampled <= wave))
        pictures = np.concatenate([left, gap, fit(canvas, size)], axis=1)
        yield np.concatenate([header_strip(lines, font, width, header_h), pictures], axis=0)
