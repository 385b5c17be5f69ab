"""Drawing functions (mulo.ui.viz) and the pictures of a run (mulo.ui.views)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from mulo.engine import Engine
from mulo.families import toy
from mulo.streams import Returning
from mulo.trace import Round
from mulo.ui import viz
from mulo.ui.views import replay_view, stream_view


@pytest.fixture(scope="module")
def engine():
    return Engine(toy.build())


@pytest.fixture(scope="module")
def mulo_view(engine):
    run = Returning(stream_view(engine, "red apple", "mulo", 3, {"tau": 0.3}))
    sizes = [len(view.canvases) for view in run]
    return run.value, sizes


def test_stream_view_grows_one_round_at_a_time(mulo_view):
    view, sizes = mulo_view
    assert sizes == list(range(1, len(view.trace.rounds) + 1))
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
    rows = viz._tree_rows([-1, -1, 0, 0])
    assert rows[2] == 0 and rows[3] == 1 and rows[1] == 2  # leaves one row apart, depth first
    assert rows[0] == 0.5 and rows[-1] == (0.5 + 2) / 2  # parents centred on their children
    rnd = Round.empty(3, "round 3", (4, 4), np.full((4, 4), -1))
    rnd.tree = {"root": 5, "token": [1, 2, 3, 4], "parent": [-1, -1, 0, 0], "depth": [1, 1, 2, 2],
                "q": [0.5, 0.2, 0.4, 0.1], "status": [1, 2, 2, 0], "next": 9}  # fmt: skip
    fig = viz.tree_figure(rnd, grid_width=4)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert "9\nnext" in texts and "1\n0.50" in texts and "(1, 2)" in texts  # position 6 = row 1, col 2
    colours = {t.get_text(): t.get_bbox_patch().get_facecolor() for t in fig.axes[0].texts if t.get_bbox_patch()}
    assert colours["1\n0.50"] == to_rgba(viz.COLORS["accepted"])
    assert colours["3\n0.40"] == to_rgba(viz.COLORS["rejected"])
    assert colours["4\n0.10"] == to_rgba(viz.COLORS["pending"])
    assert "4 nodes, depth 2, 3 tried, 1 accepted" in fig.axes[0].get_title()
    rnd.tree = None
    assert "no draft tree" in viz.tree_figure(rnd, 4).axes[0].texts[0].get_text()


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
    fig = viz.round_layout(view.trace, index, view.drafts[index], view.canvases[index], size=96)
    title = fig._suptitle.get_text()
    assert f"{counts['proposed']} proposed, {counts['accepted']} accepted, {counts['rejected']} rejected" in title
    assert f"{counts['reopened']} re-opened in {counts['islands']} islands" in title and "tau=0.3" in title
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
