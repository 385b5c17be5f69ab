"""Drawing functions (mulo.ui.viz), the figures built from them (mulo.ui.figures) and the pictures
of a run (mulo.ui.views)."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest

from mulo.engine import Engine
from mulo.families import toy
from mulo.streams import Returning
from mulo.trace import Round, Trace
from mulo.ui import figures, viz
from mulo.ui.views import replay_view, stream_view


@pytest.fixture(scope="module")
def engine():
    return Engine(toy.build())


@pytest.fixture(scope="module")
def mulo_view(engine):
    run = Returning(stream_view(engine, "red apple", "mulo", 3, {"tau": 0.3}, preview_every_s=0.0))
    sizes = [(view.rounds_done, view.fresh, view.preview.copy()) for view in run]
    return run.value, sizes


def test_stream_view_grows_one_round_at_a_time(mulo_view):
    view, streamed = mulo_view
    assert [n for n, _, _ in streamed] == list(range(1, len(view.trace.rounds) + 1))
    assert all(fresh for _, fresh, _ in streamed)  # preview_every_s=0: a canvas painted after every round
    assert np.array_equal(streamed[-1][2], view.image)  # the last round's preview is the final image
    assert len(view.drafts) == len(view.canvases) == len(view.trace.rounds)
    assert view.image.shape == view.canvases[-1].shape and np.array_equal(view.image, view.canvases[-1])
    # an undecided token is grey on the canvas: the first canvas has grey cells, the last none
    grey = viz.hex_rgb(viz.COLORS["pending"]).astype(np.uint8)
    assert np.all(view.canvases[0] == grey, axis=-1).any()
    assert all(d is not None for d in view.drafts)  # every MuLo-SD round proposes a draft


def test_replay_decodes_like_the_live_run_or_falls_back_to_code_colours(engine, mulo_view):
    view, _ = mulo_view
    again = replay_view(view.trace, engine.family)
    assert again.decoded and all(np.array_equal(a, b) for a, b in zip(again.canvases, view.canvases, strict=True))
    blind = replay_view(view.trace, None)
    assert not blind.decoded and blind.image.shape == (*view.trace.grid, 3)


def test_round_masks_are_disjoint_and_cover_the_tested_tokens(mulo_view):
    for rnd in mulo_view[0].trace.rounds:
        masks = viz.round_masks(rnd)
        total = sum(m.astype(int) for m in masks.values())
        assert total.max() <= 1
        tested = rnd.accepted.astype(bool) | rnd.rejected.astype(bool)
        assert np.all(total[tested] == 1)


def test_finalized_round_follows_the_last_change():
    grid = (2, 2)
    final = np.array([[1, 2], [3, 4]])
    r0 = Round.empty(0, "a", grid, np.array([[1, 9], [-1, -1]]))
    r1 = Round.empty(1, "b", grid, np.array([[1, 2], [3, -1]]))
    r2 = Round.empty(2, "c", grid, final)

    class T:
        rounds, tokens = [r0, r1, r2], final

    T.grid = grid
    assert viz.finalized_round(T).tolist() == [[0, 1], [1, 2]]


def test_latency_stages_add_up_to_the_wall_time(mulo_view):
    """The latency chart's bar of a run is as long as its wall time ("other": what no phase claimed)."""
    trace = mulo_view[0].trace
    seconds = viz.stage_seconds(trace)
    assert set(seconds) == set(viz.STAGES)
    assert sum(seconds.values()) == pytest.approx(trace.latency_s)
    assert all(s >= 0 for s in seconds.values())


def test_overlay_colours_only_the_requested_layers(mulo_view):
    rnd = next(r for r in mulo_view[0].trace.rounds if r.rejected.any())
    white = np.full((*rnd.draft.shape, 3), 255, np.uint8)
    only_rejected = viz.overlay(white, rnd, opacity=1.0, layers=("rejected",))
    red = np.all(only_rejected == viz.hex_rgb(viz.COLORS["rejected"]).astype(np.uint8), axis=-1)
    assert np.array_equal(red, rnd.rejected.astype(bool))


def test_time_spent_drawing_between_rounds_is_not_charged_to_the_method(engine):
    run = Returning(engine.stream("red apple", "ar", 0))
    pause, paused = 0.05, 0.0
    start = time.perf_counter()
    for _ in run:
        time.sleep(pause)
        paused += pause
    wall = time.perf_counter() - start
    trace = run.value.trace
    assert trace.latency_s < wall - 0.9 * paused


def test_views_pickle_for_zerogpu(mulo_view):
    """ZeroGPU runs the GPU function in a worker process: whatever it yields must pickle."""
    import pickle

    view = mulo_view[0]
    again = pickle.loads(pickle.dumps(view))
    assert again.trace.to_dict() == view.trace.to_dict()
    assert all(np.array_equal(a, b) for a, b in zip(again.canvases, view.canvases, strict=True))


def test_draft_tree_figure_lays_out_nodes_and_colours_their_verdicts():
    from matplotlib.colors import to_rgba

    # root -> 0 (accepted) -> 2 (rejected), 3 (untried); root -> 1 (rejected); next token 9
    rows = figures._tree_rows([-1, -1, 0, 0])
    assert rows[2] == 0 and rows[3] == 1 and rows[1] == 2  # leaves one row apart, depth first
    assert rows[0] == 0.5 and rows[-1] == (0.5 + 2) / 2  # parents centred on their children
    rnd = Round.empty(3, "round 3", (4, 4), np.full((4, 4), -1))
    rnd.tree = {"root": 5, "token": [1, 2, 3, 4], "parent": [-1, -1, 0, 0], "depth": [1, 1, 2, 2],
                "q": [0.5, 0.2, 0.4, 0.1], "status": [1, 2, 2, 0], "next": 9}  # fmt: skip
    fig = figures.tree_figure(rnd, grid_width=4)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert "9\nnext" in texts and "1\n0.50" in texts and "(1, 2)" in texts  # position 6 = row 1, col 2
    colours = {t.get_text(): t.get_bbox_patch().get_facecolor() for t in fig.axes[0].texts if t.get_bbox_patch()}
    assert colours["1\n0.50"] == to_rgba(viz.COLORS["accepted"])
    assert colours["3\n0.40"] == to_rgba(viz.COLORS["rejected"])
    assert colours["4\n0.10"] == to_rgba(viz.COLORS["pending"])
    assert "round 4: 4 nodes, depth 2, 3 tried, 1 accepted" in fig._suptitle.get_text()  # rounds count from 1
    rnd.tree = None
    assert "no draft tree" in figures.tree_figure(rnd, 4).axes[0].texts[0].get_text()


def crafted_round() -> Round:
    """A 4x4 round: every token proposed; (1, 1) rejected, its 3x3 neighbourhood re-opened (one
    island), everything else accepted. Eight accepted drafts lie inside the re-opened square."""
    rnd = Round.empty(0, "draft", (4, 4), np.full((4, 4), -1))
    rnd.draft[:] = 7
    rnd.rejected[1, 1] = 1
    rnd.accepted[:] = 1
    rnd.accepted[1, 1] = 0
    rnd.reopened[0:3, 0:3] = 1
    rnd.islands[0:3, 0:3] = 1
    rnd.t0 = 5
    return rnd


def cell_shares(image: np.ndarray, grid: int, colour: str) -> np.ndarray:
    """``[grid, grid]``: the share of each token cell's pixels in ``colour``."""
    exact = np.all(image == viz.hex_rgb(viz.COLORS[colour]).astype(np.uint8), axis=-1)
    side = image.shape[0] // grid
    return exact.reshape(grid, side, grid, side).mean(axis=(1, 3))


def test_an_accepted_draft_inside_a_re_opened_region_stays_green_under_stripes():
    rnd = crafted_round()
    image = viz.acceptance_map(rnd, 96)  # 24 px per token
    green, red = cell_shares(image, 4, "accepted"), cell_shares(image, 4, "rejected")
    amber = cell_shares(image, 4, "reopened")
    accepted, reopened = rnd.accepted.astype(bool), rnd.reopened.astype(bool)
    assert (green[accepted] > 0.5).all() and (green[~accepted] == 0).all()  # every verdict shows
    assert red[1, 1] == 0  # t0 is drawn solid blue over it
    assert (amber[reopened & (np.arange(16).reshape(4, 4) != 5)] > 0.2).all() and (amber[~reopened] == 0).all()
    counts = viz.legend_counts(rnd)
    assert counts == {"proposed": 16, "accepted": 15, "accepted_kept": 7, "accepted_reopened": 8, "rejected": 1,
                      "reopened": 9, "islands": 1}  # fmt: skip
    rnd.t0 = None
    assert cell_shares(viz.acceptance_map(rnd, 96), 4, "rejected")[1, 1] > 0.5


def test_the_slide_figure_states_the_rounds_counts_and_the_knobs(mulo_view):
    view = mulo_view[0]
    index = next(i for i, r in enumerate(view.trace.rounds) if r.rejected.any())
    rnd, counts = view.trace.rounds[index], viz.legend_counts(view.trace.rounds[index])
    fig = figures.round_layout(view.trace, index, view.drafts[index], view.canvases[index], size=96)
    title = fig._suptitle.get_text()
    assert title.startswith(f'MuLo-SD · "red apple" · seed 3 · round {index + 1} of {len(view.trace.rounds)}\n')
    assert (
        f"{counts['proposed']} draft tokens proposed: {counts['accepted']} accepted, {counts['rejected']} rejected"
        in title
    )
    assert "threshold τ = 0.3" in [t.get_text() for t in fig.texts][-1]
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert f"accepted, re-opened by a neighbour ({counts['accepted_reopened']})" in labels
    assert counts["accepted_kept"] + counts["accepted_reopened"] == int(rnd.accepted.sum())


def test_the_run_line_says_how_acceptance_and_re_opening_are_both_large():
    from mulo.ui.text import verdict_sentence

    s = {"proposed": 1024, "accepted": 744, "acceptance_rate": 744 / 1024, "rejected": 280, "reopened": 1000,
         "reopened_fraction": 1000 / 1024}  # fmt: skip
    assert verdict_sentence(s) == (
        "accepted 744 of 1,024 drafts (72.7%); re-opened 1,000 tokens (97.7% of the image) around 280 rejections"
    )
    assert verdict_sentence({**s, "proposed": 0}) == "no drafts: the target decoded every token"
    assert verdict_sentence({**s, "reopened": 0, "rejected": 0}) == "accepted 744 of 1,024 drafts (72.7%)"


def test_a_real_rounds_map_shows_every_verdict_the_trace_holds(mulo_view):
    """Pixels of the figure's token panel against the trace's masks, on a run of the engine: every
    accepted draft is mostly green (re-opened or not), every rejected one mostly red, and stripes
    lie on re-opened cells only."""
    view = mulo_view[0]
    rounds = [r for r in view.trace.rounds if r.proposed]
    assert rounds
    for rnd in rounds:
        rnd_no_t0 = Round(**{**rnd.__dict__, "t0": None})
        side = rnd.draft.shape[0]
        image = viz.acceptance_map(rnd_no_t0, 24 * side)
        green, red = cell_shares(image, side, "accepted"), cell_shares(image, side, "rejected")
        amber = cell_shares(image, side, "reopened")
        accepted, rejected = rnd.accepted.astype(bool), rnd.rejected.astype(bool)
        assert (green[accepted] > 0.5).all() and (red[rejected] > 0.5).all()
        assert (green[~accepted] == 0).all() and (red[~rejected] == 0).all()
        assert (amber[rnd.reopened.astype(bool)] > 0.2).all() and (amber[~rnd.reopened.astype(bool)] == 0).all()


# -- figures: words, layout, GIF frames, the finalisation map -----------------------------------
def crafted_trace(rounds: list[Round], method: str = "mulo", config: dict | None = None) -> Trace:
    """A trace around hand-made rounds (no engine)."""
    grid = rounds[0].draft.shape
    return Trace(
        method=method, family="toy", prompt="red apple", seed=0, config=config or {}, device="cpu", dtype="float32",
        versions={}, grid=grid, tokens=rounds[-1].tokens.copy(), latency_s=0.0, timings_s={},
        nfe={"target": 0, "drafter": 0}, rounds=rounds,
    )  # fmt: skip


def counted_round(index: int, side: int, accepted: int, reopened: int, islands: int) -> Round:
    """A round on a ``side`` x ``side`` grid, every token proposed: the first ``accepted`` (raster
    order) accepted, the rest rejected; the first ``reopened`` re-opened in ``islands`` islands."""
    n = side * side
    rnd = Round.empty(index, "draft", (side, side), np.arange(n).reshape(side, side))
    rnd.draft[:] = 7
    rnd.accepted.reshape(-1)[:accepted] = 1
    rnd.rejected.reshape(-1)[accepted:] = 1
    rnd.reopened.reshape(-1)[:reopened] = 1
    rnd.islands.reshape(-1)[:reopened] = np.arange(reopened) % islands + 1
    return rnd


MULO_CONFIG = {"r": 2, "tau": 0.1, "k": 0, "radius": 3, "refresh": True}


def test_method_names_are_the_papers_or_the_id_when_unknown():
    assert viz.method_name("mulo") == "MuLo-SD"
    assert viz.method_name("zipar") == "ZipAR" and viz.method_name("eagle2") == "EAGLE-2"
    assert viz.method_name("from_a_newer_build") == "from_a_newer_build"  # a replayed trace's own id


def test_the_slide_title_says_the_round_and_the_settings_in_words():
    rounds = [counted_round(i, 32, 870, 300, 5) for i in range(5)]
    trace = crafted_trace(rounds, config=MULO_CONFIG)
    assert figures.round_title(trace, 1) == [
        'MuLo-SD · "red apple" · seed 0 · round 2 of 5',
        "1,024 draft tokens proposed: 870 accepted, 154 rejected; 300 re-opened and resampled in 5 islands",
        "drafter at 1/2 resolution · threshold τ = 0.1 · pooled over k = 0 codebook neighbours · re-open radius l = 3",
    ]
    rounds[0] = counted_round(0, 32, 870, 300, 1)
    stale = crafted_trace(rounds, config={**MULO_CONFIG, "refresh": False})
    title = figures.round_title(stale, 0)
    assert title[1].endswith("in 1 island") and title[2].endswith("re-open radius l = 3 · stale K/V (ablation)")
    # other methods: the method's name and the counts, no settings; a round without drafts says
    # how many tokens the target decoded in it
    before = np.full((32, 32), -1)
    before[0] = 5
    plain = [Round.empty(0, "row 1", (32, 32), before), Round.empty(1, "row 2", (32, 32), np.full((32, 32), 5))]
    plain[1].tokens[2:] = -1
    assert figures.round_title(crafted_trace(plain, "zipar", MULO_CONFIG), 1) == [
        'ZipAR · "red apple" · seed 0 · round 2 of 2',
        "no draft: the target decoded 32 tokens",
    ]
    assert figures.round_title(crafted_trace(plain, "zipar"), 0)[1] == "no draft: the target decoded 32 tokens"


def fig_boxes(fig, artists) -> list:
    """Display-space extents of ``artists`` after drawing ``fig`` with its Agg canvas."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    return [a.get_window_extent(renderer) for a in artists]


def inside(box, fig) -> bool:
    return fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1 and fig.bbox.y0 <= box.y0 and box.y1 <= fig.bbox.y1


def test_the_slide_figure_is_readable_at_slide_size_and_nothing_overlaps():
    rounds = [counted_round(i, 32, 870, 300, 5) for i in range(5)]
    trace = crafted_trace(rounds, config=MULO_CONFIG)
    image = viz.token_colors(rounds[1].tokens)
    fig = figures.round_layout(trace, 1, image, image, size=128)
    legend, (settings,) = fig.legends[0], [t for t in fig.texts if t is not fig._suptitle]
    assert settings.get_text().startswith("drafter at 1/2 resolution") and settings.get_fontsize() < 13
    assert all(t.get_fontsize() >= 11 for t in legend.get_texts()) and legend._ncols < 5  # two rows
    labels = [t.get_text() for t in legend.get_texts()]
    assert labels == ["accepted, kept (570)", "accepted, re-opened by a neighbour (300)", "rejected (154)",
                      "re-opened, resampled (300)", "t0 (first rejection)"]  # fmt: skip
    titles = [ax.title for ax in fig.axes]
    assert all(t.get_fontsize() >= 11 for t in titles) and titles[3].get_text() == "islands (5; one colour each)"
    renderer_boxes = fig_boxes(fig, [fig._suptitle, settings, legend])
    boxes = renderer_boxes + [ax.get_tightbbox(fig.canvas.get_renderer()) for ax in fig.axes]
    assert all(inside(box, fig) for box in boxes)
    overlapping = [(i, j) for (i, a), (j, b) in itertools.combinations(enumerate(boxes), 2) if a.overlaps(b)]
    assert overlapping == []  # title, settings, legend and the five panels (with their titles)
    other = figures.round_layout(crafted_trace(rounds, "zipar", MULO_CONFIG), 1, image, image, size=128)
    assert other.texts == [other._suptitle] and other._suptitle.get_text().startswith('ZipAR · "red apple"')


def waves_trace() -> tuple[Trace, list, list]:
    """Three rounds on 4x4 tokens: round 1 resamples its 9 re-opened tokens in three waves, round 2
    in one, round 3 has no draft (it decodes the last row); pictures as code colours."""
    first = crafted_round()
    first.tokens[:3] = 11  # the first three rows are final after round 1
    first.resampled[0:3, 0:3] = np.array([[1, 1, 1], [2, 2, 2], [3, 3, 3]])
    second = crafted_round()
    second.index, second.tokens[:3] = 1, 11
    second.resampled[0:3, 0:3] = 1
    third = Round.empty(2, "row 4", (4, 4), np.full((4, 4), 11))
    trace = crafted_trace([first, second, third])
    drafts = [viz.token_colors(first.draft), viz.token_colors(second.draft), None]
    return trace, drafts, [viz.token_colors(r.tokens) for r in trace.rounds]


def test_gif_frames_show_each_wave_of_a_round_under_a_header_in_words():
    trace, drafts, canvases = waves_trace()
    size = 96
    frames = list(figures.gif_frames(trace, drafts, canvases, [0, 1, 2], size))
    assert len(frames) == 3 + 1 + 1  # three waves, one wave, no draft
    assert len({f.shape for f in frames}) == 1 and frames[0].shape[1] == 2 * size + figures.GIF_GAP
    header = frames[0].shape[0] - size  # the pictures are size x size squares under the header
    assert header > 2 * 14
    heads = [f[:header] for f in frames]
    assert all(not np.array_equal(a, b) for a, b in itertools.pairwise(heads))  # the header follows the frame
    ink_rows = np.flatnonzero((heads[0][: header // 2] < 128).any(axis=(1, 2)))
    assert ink_rows.max() - ink_rows.min() + 1 >= 10  # the first line's letters are >= 14 px type
    left, right = [f[header:, :size] for f in frames], [f[header:, size + figures.GIF_GAP :] for f in frames]
    assert np.array_equal(left[0], left[1]) and np.array_equal(left[1], left[2])  # one overlay per round
    full, cell = figures.fit(canvases[0], size), size // 4
    assert np.array_equal(right[2], full)  # the last wave's frame: the canvas after the round

    def greyed(picture):  # per token row: does it differ from the canvas after the round?
        return [
            not np.array_equal(picture[r * cell : (r + 1) * cell], full[r * cell : (r + 1) * cell]) for r in range(4)
        ]

    assert greyed(right[0]) == [False, True, True, False]  # rows resampled in waves 2 and 3 wait in grey
    assert greyed(right[1]) == [False, False, True, False]
    grey, pixel = viz.hex_rgb(viz.COLORS["pending"]), (2 * cell + 1, 1)
    assert np.abs(right[0][pixel] - grey).sum() < np.abs(full[pixel] - grey).sum()
    assert figures.frame_header(trace, 0, 1, 3) == [
        "MuLo-SD · round 1 of 3 · wave 1 of 3",
        "16 proposed · 15 accepted · 1 rejected · 9 re-opened in 1 island",
    ]
    assert figures.frame_header(trace, 2) == ["MuLo-SD · round 3 of 3", "no draft: the target decoded 4 tokens"]
    from PIL import Image

    assert Image.open(__import__("io").BytesIO(viz.gif(iter(frames)))).n_frames == 5  # frames encode


def tree(fan: tuple[int, ...]) -> dict:
    """A full draft tree: ``fan[d]`` children per node at depth d + 1; the first child of each
    accepted node accepted, its siblings rejected, the rest untried; 5-digit codes."""
    parent, depth, level = [], [], [-1]
    for d, f in enumerate(fan, 1):
        nxt = []
        for p in level:
            for _ in range(f):
                parent.append(p)
                depth.append(d)
                nxt.append(len(parent) - 1)
        level = nxt
    status, node = [0] * len(parent), 0
    while True:
        status[node] = 1
        kids = [k for k, p in enumerate(parent) if p == node]
        if not kids:
            break
        for k in kids[1:]:
            status[k] = 2
        node = kids[0]
    n = len(parent)
    return {"root": 3, "token": list(range(16000, 16000 + n)), "parent": parent, "depth": depth,
            "q": [0.5] * n, "status": status, "next": 12345}  # fmt: skip


@pytest.mark.parametrize(
    ("fan", "lines"),
    [((3, 3, 2), 2), ((3, 4, 4), 1), ((5, 5, 8), 0)],  # 32 nodes: code and probability; 63: codes; 230: marks
)
def test_the_draft_tree_figure_never_overlaps_its_labels_and_shows_its_whole_title(fan, lines):
    rnd = Round.empty(4, "tree", (16, 16), np.full((16, 16), -1))
    rnd.tree = tree(fan)
    fig = figures.tree_figure(rnd, grid_width=16)
    width, height = fig.get_size_inches()
    assert width <= 16 and height <= 12
    texts = fig.axes[0].texts
    assert all(t.get_fontsize() >= 7 for t in texts)
    nodes = [t for t in texts if t.get_bbox_patch() is not None and t.get_text() != "root"]
    if lines:
        assert len(nodes) == len(rnd.tree["token"]) + 1 and {t.get_text().count("\n") + 1 for t in nodes} == {lines}
    else:
        assert len(nodes) == len(fan) + 1  # the accepted path and the next token
    boxes = fig_boxes(fig, [fig._suptitle, *(t for t in texts if t.get_bbox_patch() is None)])
    boxes += [t.get_bbox_patch().get_window_extent() for t in texts if t.get_bbox_patch() is not None]
    assert inside(boxes[0], fig)  # the title, whole
    assert all(inside(box, fig) for box in boxes)
    assert [(i, j) for (i, a), (j, b) in itertools.combinations(enumerate(boxes), 2) if a.overlaps(b)] == []
    assert fig._suptitle.get_text().startswith(f"round 5: {len(rnd.tree['token'])} nodes")


def finalizing_trace(n_rounds: int) -> Trace:
    """Rounds that each finalise one more row of an ``n_rounds`` x 4 grid."""
    final = np.arange(4 * n_rounds).reshape(n_rounds, 4)
    rounds = []
    for i in range(n_rounds):
        tokens = np.where(np.arange(n_rounds)[:, None] <= i, final, -1)
        rounds.append(Round.empty(i, f"row {i + 1}", (n_rounds, 4), tokens))
    return crafted_trace(rounds, "ar")


def test_the_finalisation_map_labels_its_rounds_and_is_none_for_one_round():
    trace = finalizing_trace(3)
    fig = figures.finalized_figure(trace, 200)
    bar = fig.axes[1]
    assert [t.get_text() for t in bar.get_yticklabels()] == ["round 1", "round 2", "round 3"]
    picture = figures.finalized_map(trace, 200)
    assert picture.dtype == np.uint8 and picture.ndim == 3 and picture.shape[2] == 3
    assert picture.shape[1] > picture.shape[0] >= 200  # the grid and the colour bar beside it
    cmap = fig.axes[0].images[0].get_cmap()
    for k in range(3):  # each round's colour is on the picture (its row of tokens)
        colour = np.array(cmap(k)[:3]) * 255
        assert (np.abs(picture.astype(float) - colour).sum(axis=-1) < 6).sum() > 100
    long = figures.finalized_figure(finalizing_trace(40), 200).axes[1].get_yticklabels()
    labels = [t.get_text() for t in long]
    assert 3 <= len(labels) <= 8 and labels[0] == "round 1" and labels[-1] == "round 40"
    assert figures.finalized_map(finalizing_trace(1), 200) is None


def test_a_streamed_run_paints_its_canvas_at_most_every_preview_interval(engine):
    """AR has a round per row: painting each (a VQ decode) would double a CPU request's time."""
    run = Returning(stream_view(engine, "red apple", "ar", 0, preview_every_s=3600))
    fresh = [view.fresh for view in run]
    assert len(fresh) == engine.family.grid[0] and fresh[0] and fresh[-1]  # the first and the finished canvas
    assert not any(fresh[1:-1])
    assert np.array_equal(run.value.preview, run.value.image)


def test_the_clicked_token_is_outlined_and_nothing_else_changes():
    grid = (4, 4)
    image = viz.upscale(np.full((*grid, 3), 200, np.uint8), (64, 64))
    out = viz.outline_cell(image, (1, 2), grid)
    changed = np.any(out != image, axis=-1)
    rows, cols = np.nonzero(changed)
    assert rows.min() == 16 - 2 and rows.max() == 31 + 2 and cols.min() == 32 - 2 and cols.max() == 47 + 2
    assert not changed[20:28, 36:44].any()  # the cell's inside stays visible
    assert (out[16, 40] == viz.hex_rgb("#111827")).all() and (out[15, 40] == 255).all()
