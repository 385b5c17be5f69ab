"""The defaults search (``mulo.eval.calibrate``): the fastest setting that keeps AR's quality, one
knob at a time, on crafted measurements (what each setting costs and how good its images are)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np

from mulo.engine import Engine
from mulo.eval import bench, calibrate, harness

SEARCH = {"radius": (0, 1, 2), "tau": (0.3, 0.1, 0.03), "k": (0, 4)}


def fake_measure(engine, label, prompt, seed, overrides=None, extra=None):
    """AR: 64 target passes, images of quality 1. MuLo-SD: fewer passes for a smaller radius and a
    larger tau; radius 0, tau 0.3 and any pooling draw images of quality 0."""
    s = {"radius": 1, "tau": 0.1, "k": 0, **(overrides or {})}
    if label == "ar":
        passes, good = 64.0, True
    else:
        passes = 10 + 8 * s["radius"] + (5 if s["tau"] < 0.1 else 0) + (3 if label.endswith("r2") else 0)
        good = s["radius"] > 0 and s["tau"] < 0.3 and s["k"] == 0
    image = np.full((2, 2, 3), 255 if good else 0, np.uint8)
    return harness.Measured(0.1, int(passes), 16, 0.5, 0.2, 3, 0.01, image)


class FakeQuality:
    def score(self, images, keys):
        good = float(images.mean() / 255)
        return {"fd": 1.0 + (1 - good), "adherence": 0.8 * good}


def test_the_search_keeps_the_fastest_setting_of_ar_quality(toy, monkeypatch):
    monkeypatch.setattr(harness, "measure", fake_measure)
    monkeypatch.setattr(bench, "step_costs", lambda engine, prompt: {"drafter_r2": 0.5, "drafter_r4": 0.25})
    engine = Engine(toy)
    logged = []
    result = calibrate.calibrate(engine, [("k1", "red apple"), ("k2", "cat")], FakeQuality(), SEARCH, logged.append)
    # radius 1 (0 loses quality), then tau 0.1 (0.3 loses it, 0.03 costs 5 passes), k 0 (pooling loses it)
    assert result["settings"] == {"radius": 1, "tau": 0.1, "k": 0}
    best = next(p for p in result["points"] if p["settings"] == result["settings"])
    r2 = best["mulo-v2-r2"]
    assert r2["nfe_speedup"] == 64 / (21 + 16 * 0.5) and best["keeps_quality"]
    assert not next(p for p in result["points"] if p["settings"]["radius"] == 0)["keeps_quality"]
    assert len(logged) == len(result["points"])  # every point once: a repeated setting is not re-run
    assert all("keeps AR's quality" in calibrate.describe(p) or "loses" in calibrate.describe(p) for p in logged)


def test_a_knob_that_always_loses_quality_keeps_the_familys_value(toy, monkeypatch):
    monkeypatch.setattr(harness, "measure", fake_measure)
    monkeypatch.setattr(bench, "step_costs", lambda engine, prompt: {"drafter_r2": 0.5, "drafter_r4": 0.25})
    engine = Engine(toy)
    default_k = engine.make_config(None).k
    result = calibrate.calibrate(engine, [("k1", "red apple")], FakeQuality(), {"k": (3, 4)})
    assert result["settings"] == {"k": default_k}


def test_a_missing_acceptance_is_shown_as_missing():
    row = {"nfe_speedup": 1.5, "acceptance": None, "adherence": None, "fd": None}
    point = {"settings": {"k": 0}, "keeps_quality": True, **dict.fromkeys(calibrate.LABELS, row)}
    assert "accepted —" in calibrate.describe(point) and "accepted 0.000" not in calibrate.describe(point)


def test_a_saved_search_resumes_without_rerunning_its_points(toy, monkeypatch):
    calls = []

    def counting_measure(engine, label, prompt, seed, overrides=None, extra=None):
        calls.append((label, json.dumps(overrides, sort_keys=True)))
        return fake_measure(engine, label, prompt, seed, overrides, extra)

    monkeypatch.setattr(harness, "measure", counting_measure)
    monkeypatch.setattr(bench, "step_costs", lambda engine, prompt: {"drafter_r2": 0.5, "drafter_r4": 0.25})
    engine, prompts = Engine(toy), [("k1", "red apple"), ("k2", "cat")]
    saves = []
    first = calibrate.calibrate(
        engine, prompts, FakeQuality(), {"radius": (0, 1, 2)}, start={"tau": 0.1, "k": 0}, save=saves.append
    )
    assert first["settings"] == {"radius": 1, "tau": 0.1, "k": 0}  # the start's knobs are kept
    assert len(saves) == 3 and [len(s["points"]) for s in saves] == [1, 2, 3]  # saved after every point
    partial = json.loads(json.dumps(saves[1]))  # as read back from disk, stopped after two points
    calls.clear()
    resumed = calibrate.calibrate(
        engine, prompts, FakeQuality(), {"radius": (0, 1, 2)}, start={"tau": 0.1, "k": 0}, saved=partial
    )
    assert resumed["settings"] == first["settings"] and resumed["ar"] == partial["ar"]
    assert {label for label, _ in calls} == set(calibrate.LABELS)  # no AR re-run
    assert len(calls) == len(prompts) * len(calibrate.LABELS)  # only the third point ran
    calls.clear()
    calibrate.calibrate(engine, prompts[:1], FakeQuality(), {"radius": (0, 1, 2)}, saved=partial)
    assert ("ar", "{}") in calls  # other prompts: nothing re-used
    # the family's default of a tuned knob neither searched nor started changed: the saved points
    # were measured under the old one and are run again (they are keyed by every tuned knob)
    calls.clear()
    window = engine.make_config(None).island_window
    monkeypatch.setitem(engine.family.defaults, "island_window", 0 if window else 4)
    calibrate.calibrate(
        engine, prompts, FakeQuality(), {"radius": (0, 1, 2)}, start={"tau": 0.1, "k": 0}, saved=partial
    )
    assert len(calls) == 3 * len(prompts) * len(calibrate.LABELS)


def test_the_cli_names_a_bad_start_or_knob_in_one_line(capsys):
    assert calibrate.main(["--family", "toy", "--start", "tau=x"]) == 2
    assert calibrate.main(["--family", "toy", "--knobs", "tau,depth"]) == 2
    assert calibrate.main(["--family", "toy", "--resume"]) == 2
    assert calibrate.main(["--family", "toy", "--seeds", "0,0"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 4 and "tau" in lines[0] and "depth" in lines[1] and "--json" in lines[2]
    assert "--seeds" in lines[3]
    assert calibrate.parse_start("tau=0.1, drafting=zipar,k=1") == {"tau": 0.1, "drafting": "zipar", "k": 1}


def test_ar_at_other_seeds_is_the_same_prompts_run_again(toy, monkeypatch):
    seeds = []

    def seeded(engine, label, prompt, seed, overrides=None, extra=None):
        seeds.append(seed)
        return fake_measure(engine, label, prompt, seed, overrides, extra)

    monkeypatch.setattr(harness, "measure", seeded)
    row = calibrate.ar_other_seeds(Engine(toy), [("k1", "red apple"), ("k2", "cat")], FakeQuality())
    assert seeds == [calibrate.OTHER_SEEDS, calibrate.OTHER_SEEDS + 1]  # not the search's seeds 0, 1
    assert row["fd"] == 1.0 and row["adherence"] == 0.8


def test_several_seeds_judge_a_point_by_its_means_over_them(toy, monkeypatch):
    """Radius 1 is good at the first seed only: one seed keeps it, two seeds' means reject it."""
    calls = []

    def lucky_at_seed_0(engine, label, prompt, seed, overrides=None, extra=None):
        calls.append(seed)
        s = {"radius": 1, **(overrides or {})}
        good = label == "ar" or s["radius"] == 2 or (s["radius"] == 1 and seed < 100)
        measured = fake_measure(engine, label, prompt, seed, overrides, extra)
        return dataclasses.replace(measured, image=np.full((2, 2, 3), 255 if good else 0, np.uint8))

    monkeypatch.setattr(harness, "measure", lucky_at_seed_0)
    monkeypatch.setattr(bench, "step_costs", lambda engine, prompt: {"drafter_r2": 0.5, "drafter_r4": 0.25})
    engine, prompts, search = Engine(toy), [("k1", "red apple"), ("k2", "cat")], {"radius": (1, 2)}
    one = calibrate.calibrate(engine, prompts, FakeQuality(), search, start={"tau": 0.1, "k": 0})
    assert one["settings"]["radius"] == 1 and one["seeds"] == [0]
    calls.clear()
    two = calibrate.calibrate(engine, prompts, FakeQuality(), search, start={"tau": 0.1, "k": 0}, seeds=(0, 1000))
    assert two["settings"]["radius"] == 2 and sorted(set(calls)) == [0, 1, 1000, 1001]
    point = next(p for p in two["points"] if p["settings"]["radius"] == 1)
    row = point["mulo-v2-r2"]
    assert row["per_seed"] == {"0": {"fd": 1.0, "adherence": 0.8}, "1000": {"fd": 2.0, "adherence": 0.0}}
    assert row["fd"] == 1.5 and row["adherence"] == 0.4 and row["nfe"]["drafter"] == 16
    # a search saved at other seeds is not re-used: its rows are other means
    calls.clear()
    calibrate.calibrate(engine, prompts, FakeQuality(), search, start={"tau": 0.1, "k": 0}, saved=one, seeds=(0, 1000))
    assert 1000 in calls
