"""Issue 63's locality probe (mulo/eval/locality.py) on crafted grids and traces: what counts as one
layout, which round's islands count, when acceptance falls with tau; and the CLI's clear refusal."""

from types import SimpleNamespace

import numpy as np
import torch

from mulo.eval import locality
from mulo.trace import Round


def scene(*boxes, background=7, size=32) -> np.ndarray:
    """A token grid of one background code with a block of object codes per (row, col, side) box."""
    grid = np.full((size, size), background)
    for k, (row, col, side) in enumerate(boxes):
        grid[row : row + side, col : col + side] = 100 + k
    return grid


def test_the_foreground_is_what_differs_from_the_most_common_token():
    grid = scene((2, 3, 8))
    mask = locality.foreground(grid)
    assert mask.sum() == 64 and mask[2, 3] and not mask[0, 0]
    # the background is the most common code, whichever code it is
    assert locality.foreground(scene((2, 3, 8), background=1500)).sum() == 64


def test_layouts_are_the_same_when_their_foregrounds_overlap_enough():
    a = locality.foreground(scene((0, 0, 8)))
    frayed = a.copy()
    frayed[7, 6:8] = False  # two tokens of the object drawn as background: the same place
    shifted_one = locality.foreground(scene((0, 1, 8)))  # moved by one token: IoU 56 / 72
    elsewhere = locality.foreground(scene((20, 20, 8)))
    empty = np.zeros((32, 32), bool)
    assert locality.same_layout(a, frayed) and not locality.same_layout(a, shifted_one)
    assert not locality.same_layout(a, elsewhere)
    assert locality.same_layout(empty, empty) and not locality.same_layout(a, empty)
    # five seeds: two near-identical layouts count once
    masks = [a, frayed, elsewhere, locality.foreground(scene((0, 20, 8))), locality.foreground(scene((20, 0, 8)))]
    assert locality.distinct_layouts(masks) == 4
    assert locality.distinct_layouts([a] * 5) == 1
    # two objects: moving one of them is a different layout
    two = locality.foreground(scene((0, 0, 8), (20, 20, 8)))
    assert locality.distinct_layouts([two, locality.foreground(scene((0, 0, 8), (20, 20, 8)))]) == 1
    assert locality.distinct_layouts([two, locality.foreground(scene((0, 0, 8), (20, 22, 8)))]) == 2


class FakeEngine:
    """An engine whose AR image for a seed is a scene chosen by ``layout_of(seed)``."""

    def __init__(self, layout_of):
        self.layout_of = layout_of

    def generate(self, prompt, method, seed, knobs=None):
        assert method == "ar"
        return SimpleNamespace(tokens=torch.from_numpy(scene(self.layout_of(seed))))


def test_measure_layouts_counts_distinct_layouts_per_prompt():
    moving = locality.measure_layouts(FakeEngine(lambda seed: (seed * 5, seed * 5, 8)), ["a", "b"])
    assert moving["distinct"] == [5, 5] and moving["share_all_distinct"] == 1.0
    fixed = locality.measure_layouts(FakeEngine(lambda seed: (4, 4, 8)), ["a"])
    assert fixed["distinct"] == [1] and fixed["share_all_distinct"] == 0.0


def round_with(islands: np.ndarray, proposed: bool, index=0) -> Round:
    r = Round.empty(index, "round", islands.shape, np.zeros(islands.shape, np.int64))
    if proposed:
        r.draft[:] = 3
    r.islands = islands
    r.reopened = (islands > 0).astype(np.int8)
    return r


def test_the_islands_counted_are_those_of_the_round_that_verified_the_draft():
    three = np.zeros((8, 8), np.int64)
    three[0, 0], three[4, 4], three[7, 0] = 1, 2, 3
    one = np.zeros((8, 8), np.int64)
    one[2, 2] = 1
    # a plain round (nothing proposed) first, then the draft's verification, then a later round
    trace = SimpleNamespace(rounds=[round_with(one, False), round_with(three, True, 1), round_with(one, True, 2)])
    assert locality.verified_islands(trace) == 3
    assert locality.verified_islands(SimpleNamespace(rounds=[round_with(one, False)])) == 0


def test_acceptance_must_fall_with_tau_by_the_bar():
    assert locality.falls_with_tau([0.9, 0.85, 0.7, 0.7, 0.5])
    assert not locality.falls_with_tau([0.9, 0.95, 0.5])  # rises once
    assert not locality.falls_with_tau([0.9, 0.88, 0.85])  # falls by less than 0.1


def test_the_verdicts_read_each_bar():
    report = {
        "layouts": {"share_all_distinct": 0.92},
        "locality": {"reopened_mean": 0.3, "share_islands_per_object": 0.7},
        "tau": {"falls": True},
    }
    assert all(locality.verdicts(report).values())
    report["locality"] = {"reopened_mean": 0.36, "share_islands_per_object": None}
    report["layouts"]["share_all_distinct"] = 0.875
    met = locality.verdicts(report)
    assert met == {"five_layouts": False, "reopened": False, "islands_per_object": False, "tau": True}


def test_the_cli_refuses_a_family_without_a_referee(capsys):
    assert locality.main(["--family", "toy"]) == 2
    assert "no scenes family" in capsys.readouterr().err
    assert locality.main(["--family", "nope"]) == 2
    assert "family must be one of" in capsys.readouterr().err
