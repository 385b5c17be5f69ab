"""The default family ``twemoji`` (32x32 tokens, 128 px; a lookup table: one image per prompt): size
limits of every shipped family, offline loading, behaviour; the bars below were measured on it.
(``twemoji-64``, the first family, was measured here too until ``emoji-16`` took its place in
assets/; ``scenes`` took ``emoji-16``'s in issue 63: tests/test_scenes_shipped.py.)"""

import os
import subprocess
import sys

import numpy as np
import pytest

from mulo.families import ASSETS_ROOT, DEFAULT_FAMILY, emoji

pytestmark = pytest.mark.slow  # the shipped 32x32 family, many images (docs/testing.md)

FAMILIES = ("twemoji",)


@pytest.fixture(scope="module", params=FAMILIES)
def family(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def engine(family):
    from mulo.engine import Engine

    return Engine(emoji.build(family))


def test_assets_fit_spaces_limits(family):
    assets = ASSETS_ROOT / family
    sizes = {p.name: p.stat().st_size for p in assets.glob("*.safetensors")}
    assert set(sizes) == {f"{name}.safetensors" for name in (*emoji.FILES, "eagle_head")}
    card = (assets / "MODEL_CARD.md").read_text()
    assert "CC-BY 4.0" in card and "Twitter, Inc." in card
    # Hugging Face Spaces takes no file of 10 MB or more without LFS; the app ships every family
    files = [p for p in ASSETS_ROOT.rglob("*") if p.is_file()]
    assert max(p.stat().st_size for p in files) < 10 * 2**20
    assert sum(p.stat().st_size for p in files) <= 60 * 2**20


def test_default_cli_generates_offline(tmp_path):
    out = tmp_path / "apple.png"
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    proc = subprocess.run(
        [sys.executable, "-m", "mulo", "generate", "--prompt", "red apple", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    from PIL import Image

    from mulo.train.recipes import RECIPES

    assert Image.open(out).size == (RECIPES[DEFAULT_FAMILY].px,) * 2
    proc = subprocess.run(
        [sys.executable, "-m", "mulo", "generate", "--prompt", "qwertyuiop zxcv"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 2 and proc.stderr.startswith("error: no known word in the prompt")


def test_images_are_emoji_not_noise(engine):
    """Generated images look like emoji: mostly white background, a coloured object in the middle."""
    for prompt in ("red apple", "rocket", "grinning face"):
        image = engine.generate(prompt, "ar", 0).image.astype(float) / 255
        px, edge = image.shape[0], image.shape[0] // 16
        border = np.concatenate([image[:edge].reshape(-1, 3), image[-edge:].reshape(-1, 3)])
        centre = image[px * 5 // 16 : px * 11 // 16, px * 5 // 16 : px * 11 // 16].reshape(-1, 3)
        assert border.mean() > 0.85, prompt  # white margin
        assert centre.std() > 0.1, prompt  # something drawn in the middle


COMMON_PROMPTS = ("red apple", "cat face", "rocket", "grinning face", "ghost", "banana", "dog face", "christmas tree")
# Emoji short names, what people type in an emoji picker (":pizza:"): the family conditions on the
# emoji's name (assets/twemoji/aliases.json, from emoji.json). Measured on twelve (these eight and
# thumbsup, star, moon, frog): 11 of 12 for AR and for MuLo-SD with aliases, 2 and 1 without.
SHORT_NAME_PROMPTS = ("pizza", "apple", "heart", "car", "coffee", "gift", "joy", "soccer")
# One word that is no short name of its emoji, or several emoji share ("sun": any of the six sun
# emoji counts), prompted as typed.
ONE_WORD_PROMPTS = ("pizza", "sun", "apple", "cat", "dog", "tree", "moon", "star")


@pytest.fixture(scope="module")
def quality(engine):
    from mulo.eval.quality import Quality

    return Quality.for_family(engine.family)


def prompt_adherence(engine, q, method: str, prompts, config=None) -> float:
    """mini-CLIP retrieval over all 3,786 emoji texts: the share of images whose top-5 texts hold
    an emoji the prompt names (real images: 94 %)."""
    from mulo.eval.metrics import adherence

    keys = [q.keys_for(p) for p in prompts]
    assert all(keys), [p for p, k in zip(prompts, keys, strict=True) if not k]
    images = np.stack([engine.generate(p, method, i, config).image for i, p in enumerate(prompts)])
    return adherence(q.clip, images, keys, q.text_names, q.text_keys, text_embeddings=q.text_embeddings)


# Bars measured over these eight: AR 6 of 8, MuLo-SD 4 of 8 at the calibrated l = 3 (its card's
# 120 prompts: AR 0.850, MuLo-SD r = 2 0.825; these eight are harder for MuLo-SD than the average).
ADHERENCE_BARS = {"twemoji": {"ar": 0.75, "mulo": 0.5}}


@pytest.mark.parametrize("method", ["ar", "mulo"])
def test_images_depict_the_prompt(engine, family, quality, method):
    """Common emoji, prompted by name, are recognisable for AR and for MuLo-SD."""
    score = prompt_adherence(engine, quality, method, COMMON_PROMPTS)
    assert score >= ADHERENCE_BARS[family][method], score


@pytest.mark.parametrize("method", ["ar", "mulo"])
def test_short_names_depict_their_emoji(engine, quality, method):
    """ "pizza" draws the slice of pizza: a short name conditions on its emoji's name (twemoji: AR 8,
    MuLo-SD 7 of these 8)."""
    assert prompt_adherence(engine, quality, method, SHORT_NAME_PROMPTS) >= 0.75


def test_aliases_are_recorded_and_can_be_turned_off(engine):
    trace = engine.generate("Pizza", "ar", 0).trace
    assert trace.condition_text == "slice of pizza"
    assert trace.to_dict()["condition_text"] == "slice of pizza"
    assert engine.generate("pizza", "ar", 0, {"aliases": False}).trace.condition_text is None
    # a prompt that names an emoji is never re-routed: "cat" is the cat, not "cat face" (short name cat)
    assert engine.generate("cat", "ar", 0).trace.condition_text is None
    assert engine.generate("slice of pizza", "ar", 0).trace.condition_text is None
    from mulo.ui.text import stats_markdown

    assert "conditioned on *slice of pizza*" in stats_markdown(trace, None)  # the app says so


# The models alone (aliases off) do not generalise to one word: on twemoji 0.375 and 0.375 here, 0.18
# and 0.13 over its card's 90. Training on short prompts (run twemoji-v9, 512 codes) reached 0.5 here
# and 0.28 on the card but cost name adherence (0.74 -> 0.67): see the model card.
# AR alone: MuLo-SD verifies with the same target, so the limit is the models', shown once.
@pytest.mark.xfail(strict=True, reason="one-word prompts are out of the AR models' training distribution")
def test_one_word_prompts_depict_their_emoji_without_aliases(engine, quality):
    assert prompt_adherence(engine, quality, "ar", ONE_WORD_PROMPTS, {"aliases": False}) >= 0.625


def test_acceptance_is_spatially_structured(engine):
    """MuLo-SD accepts flat regions more often than detailed ones (the card's 120 prompts: 0.75 vs 0.39;
    on these six 0.77 vs 0.47)."""
    from mulo.eval.metrics import acceptance_by_detail

    flat_acc, detail_acc = [], []
    for i, prompt in enumerate(("red apple", "cat face", "rocket", "pizza", "sun", "ghost")):
        result = engine.generate(prompt, "mulo", i, {"r": 2})
        flat, detail = acceptance_by_detail(result.image, result.trace.rounds)
        flat_acc.append(flat or 0.0)
        detail_acc.append(detail or 0.0)
    assert np.mean(flat_acc) > np.mean(detail_acc) + 0.1, (flat_acc, detail_acc)


def test_app_reports_prompts_with_no_known_word(family):
    import gradio as gr

    from mulo.ui import handlers

    with pytest.raises(gr.Error, match="no known word"):
        list(handlers.generate("qwertyuiop zxcv", 0, family))
    *_, state = list(handlers.generate("red apple zxcv", 0, family))[-1]
    assert "unknown words ignored: zxcv" in state["views"]["MuLo-SD"].trace.warnings[0]


def test_what_a_prompt_loses_is_reported(engine):
    from mulo.config import ConfigError

    with pytest.raises(ConfigError, match="no known word in the prompt '🍕': this family reads words of letters a-z"):
        engine.check("🍕", "ar", 0, None)
    _, _, notes = engine.check("red 🍕 apple café", "ar", 0, None)
    assert notes == ["unknown words ignored: caf", "characters ignored: é 🍕"]
    _, _, notes = engine.check(" ".join(["red apple"] * 9), "ar", 0, None)
    assert notes == ["only the first 16 known words are used (dropped: red apple)"]
