"""The one image scorer (``mulo.eval.quality.Quality``): what the model card saves is what the
benchmark loads, byte for byte, so a card re-run changes no shipped metric input by itself."""

from __future__ import annotations

import numpy as np
import torch

from mulo.eval.quality import Quality
from mulo.families import load_family


def test_save_writes_back_what_load_read(tmp_path):
    evaluation = load_family("twemoji").evaluation
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

    family = load_family("twemoji")
    quality = Quality.for_family(family)
    engine = Engine(family)
    for prompt in ("pizza", "cat face", "rocket", "red apple"):
        keys = quality.keys_for(prompt)
        image = engine.generate(prompt, "ar", 0).image
        rank = quality.prompt_rank(image, keys)
        assert 1 <= rank <= len(quality.text_keys)
        assert quality.adherence(image[None], [keys]) == float(rank <= 5)
    # the mini-CLIP recognises most real images: 0.83 over five distinct texts (0.61 when a name
    # drawn in five styles filled all five slots)
    assert 0.75 < quality.real_adherence() <= 1.0


class _CraftedClip:
    """Text and image embeddings chosen by hand: texts are one-hot by name, an image's embedding
    is its row of ``scores`` (its similarity to each name)."""

    def __init__(self, names: list[str], image_scores: list[list[float]]):
        self.names, self.scores = names, torch.tensor(image_scores)
        self.logit_scale = torch.zeros(())

    def embed_texts(self, texts):
        return torch.stack(
            [torch.nn.functional.one_hot(torch.tensor(self.names.index(t)), len(self.names)) for t in texts]
        ).float()

    def embed_images(self, images):
        return self.scores[: len(images)]


def test_top5_counts_five_different_texts_when_the_data_names_an_emoji_once_per_style():
    """Five styles name an emoji five times with one embedding; counted five times, a single wrong
    name filled every slot and top-5 became top-1 (emoji-16's real images scored 0.61, not 0.83)."""
    from mulo.eval.metrics import adherence

    names = ["grinning face", "red apple", "cat face", "rocket", "sun", "ghost"]
    # the image looks most like "grinning face", then like a red apple (its prompt)
    clip = _CraftedClip(names, [[0.9, 0.8, 0.1, 0.1, 0.1, 0.1]])
    styles = 5
    texts = [n for n in names for _ in range(styles)]
    keys = [f"K{names.index(n)}" for n in texts]
    shorts = [
        ["grin"] if n == "grinning face" and i % styles == 0 else ["apple"] if n == "red apple" else []
        for i, n in enumerate(texts)
    ]
    image = np.zeros((1, 8, 8, 3), np.uint8)
    # the apple is the second text: within the top 5, once each text counts once
    assert adherence(clip, image, ["K1"], texts, keys) == 1.0
    quality = Quality(clip, [("K1", "red apple")], {}, texts, keys, shorts)
    assert quality.text_names == names and quality.text_keys == [f"K{i}" for i in range(len(names))]
    assert quality.short_prompts[0] == ["grin"] and quality.short_prompts[1] == ["apple"]
    assert quality.adherence(image, ["K1"]) == 1.0
    assert quality.prompt_rank(image[0], {"K1"}) == 2
    # two emoji that share a name are two texts: both kept ("sun" names several emoji)
    assert len(Quality(clip, [], {}, ["sun", "sun"], ["K4", "K9"], [[], []]).text_keys) == 2
