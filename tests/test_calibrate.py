"""The defaults search (``mulo.eval.calibrate``): the fastest setting that keeps AR's quality, one
knob at a time, on crafted measurements (what each setting costs and how good its images are)."""

from __future__ import annotations

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
