"""The one image scorer (``mulo.eval.quality.Quality``): what the model card saves is what the
benchmark loads, byte for byte, so a card re-run changes no shipped metric input by itself."""

from __future__ import annotations

import numpy as np

from mulo.eval.quality import Quality
from mulo.families import load_family


def test_save_writes_back_what_load_read(tmp_path):
    evaluation = load_family("emoji-16").evaluation
    quality = Quality.load(evaluation.encoder, evaluation.folder)
    quality.save(tmp_path)
    shipped = evaluation.folder / "eval_prompts.json"
    assert (tmp_path / "eval_prompts.json").read_bytes() == shipped.read_bytes()
    before, after = np.load(evaluation.folder / "eval_reference.npz"), np.load(tmp_path / "eval_reference.npz")
    assert sorted(before.files) == sorted(after.files)
    assert all(np.array_equal(before[name], after[name]) for name in before.files)
    assert quality.keys == [key for key, _ in quality.prompts] and quality.keys_for("pizza")


def test_a_single_images_rank_agrees_with_the_benchmarks_adherence():
    """The app shows one image's prompt rank; it must call adherent exactly the images the
    benchmark's adherence counts (top 5), and the real images' reference is their own adherence."""
    from mulo.engine import Engine

    family = load_family("emoji-16")
    quality = Quality.for_family(family)
    engine = Engine(family)
    for prompt in ("pizza", "cat face", "rocket", "red apple"):
        keys = quality.keys_for(prompt)
        image = engine.generate(prompt, "ar", 0).image
        rank = quality.prompt_rank(image, keys)
        assert 1 <= rank <= len(quality.text_keys)
        assert quality.adherence(image[None], [keys]) == float(rank <= 5)
    assert 0.5 < quality.real_adherence() <= 1.0  # the mini-CLIP recognises most real images
