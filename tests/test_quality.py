"""The one image scorer (``mulo.eval.quality.Quality``): what the model card saves is what the
benchmark loads, byte for byte, so a card re-run changes no shipped metric input by itself."""

from __future__ import annotations

import numpy as np

from mulo.eval.quality import Quality
from mulo.families import load_family


def test_save_writes_back_what_load_read(tmp_path):
    evaluation = load_family("twemoji-64").evaluation
    quality = Quality.load(evaluation.encoder, evaluation.folder)
    quality.save(tmp_path)
    shipped = evaluation.folder / "eval_prompts.json"
    assert (tmp_path / "eval_prompts.json").read_bytes() == shipped.read_bytes()
    before, after = np.load(evaluation.folder / "eval_reference.npz"), np.load(tmp_path / "eval_reference.npz")
    assert sorted(before.files) == sorted(after.files)
    assert all(np.array_equal(before[name], after[name]) for name in before.files)
    assert quality.keys == [key for key, _ in quality.prompts] and quality.keys_for("pizza")
