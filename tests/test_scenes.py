"""The emoji scenes family's language (``mulo.scenes``), generator (``mulo.train.scenes``) and
exact referee (``mulo.eval.referee``), on the vocabulary's real sprites (tests/data/scenes): the
referee names every generated scene and refuses every mismatched prompt and wrong image; the
grammar round-trips and names what is wrong with bad input; the held-out combinations stay out of
the training stream; seeds change the layout."""

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageFilter

from mulo import scenes as lang
from mulo.eval.referee import Referee, Sprites, save_sprites
from mulo.scenes import PromptError, format_prompt, parse_prompt
from mulo.train import scenes
from mulo.train.styles import STYLE_WORDS

SPRITES = Path(__file__).parent / "data" / "scenes" / "sprites-32.npz"


@pytest.fixture(scope="module")
def sheet():
    return Sprites.load(SPRITES)


@pytest.fixture(scope="module")
def stream(sheet):
    return scenes.SceneStream(scenes.SceneConfig(), sheet, seed=0)


@pytest.fixture(scope="module")
def referee(sheet):
    return Referee(sheet)


def mixed_scenes(stream, count):
    half = count // 2
    return stream.scenes(0, count - half) + stream.scenes(0, half, scenes.HELD_OUT)


def test_the_vocabulary_is_drawn_in_every_style(sheet):
    assert lang.STYLE_WORDS == STYLE_WORDS  # the light module's copy of the styles' words
    assert sheet.names == lang.NAMES and sheet.styles == STYLE_WORDS and 48 <= len(lang.NAMES) <= 96
    assert sheet.rgba.shape == (len(lang.NAMES), 5, 32, 32, 4)
    assert ((sheet.rgba[..., 3] > 128).sum(axis=(2, 3)) >= 100).all()  # every sprite draws something


def test_the_referee_names_every_generated_scene(stream, referee):
    shown = mixed_scenes(stream, 120)
    assert {len(s.objects) for s in shown} == {1, 2, 3}
    assert {o.style for s in shown for o in s.objects} == set(STYLE_WORDS)
    assert {s.background for s in shown} == set(lang.PALETTE)
    for scene in shown:
        verdict = referee.prompt_match(stream.render(scene)[128], scene.prompt)
        assert verdict.match, (scene, verdict.sentence())
        assert verdict.sentence().startswith("matches the prompt")
        # where and in which style: each object at its place, in its style
        found = {(f.name, f.style, f.x, f.y) for f in verdict.reading.objects}
        assert found == {(o.name, o.style, o.x, o.y) for o in scene.objects}


def test_the_referee_refuses_mismatched_prompts(stream, referee):
    rng = np.random.default_rng(1)
    tried = 0
    for scene in stream.scenes(200, 30):
        image = stream.render(scene)[128]
        names = [o.name for o in scene.objects]
        others = [n for n in lang.NAMES if n not in names]
        wrong_object = [*names[:-1], str(rng.choice(others))]
        colours = [c for c in lang.PALETTE if c != scene.background]
        prompts = {
            "wrong object": format_prompt(wrong_object, scene.background),
            "wrong background": format_prompt(names, str(rng.choice(colours))),
        }
        if len(names) < 3:  # a named emoji the image lacks
            prompts["missing object"] = format_prompt([*names, str(rng.choice(others))], scene.background)
        if len(names) > 1:  # an emoji in the image the prompt does not name
            prompts["extra object"] = format_prompt(names[:-1], scene.background)
        for kind, prompt in prompts.items():
            verdict = referee.prompt_match(image, prompt)
            assert not verdict.match, (kind, prompt, verdict.sentence())
            tried += 1
    assert tried >= 90


def test_the_referee_fails_wrong_images(stream, referee, sheet):
    scene = next(s for s in stream.scenes(300, 50) if len(s.objects) == 3)
    rng = np.random.default_rng(2)
    noise = rng.integers(0, 256, size=(128, 128, 3), dtype=np.uint8)
    verdict = referee.prompt_match(noise, scene.prompt)
    assert not verdict.match and verdict.reading.background is None
    blank = np.empty((128, 128, 3), dtype=np.uint8)
    blank[:] = lang.PALETTE[scene.background]
    verdict = referee.prompt_match(blank, scene.prompt)
    assert not verdict.match and verdict.background_ok and verdict.missing == [o.name for o in scene.objects]
    # two of the three objects swapped for other emoji, in the same places and styles
    names = [o.name for o in scene.objects]
    visible = stream.visible[scene.background]
    others = [n for n in lang.NAMES if n not in names and set(visible[n]) >= {o.style for o in scene.objects}]
    swapped = replace(
        scene,
        objects=(
            replace(scene.objects[0], name=others[0]),
            replace(scene.objects[1], name=others[1]),
            scene.objects[2],
        ),
    )
    verdict = referee.prompt_match(stream.render(swapped)[128], scene.prompt)
    assert not verdict.match
    assert verdict.missing == names[:2] and sorted(verdict.extra) == sorted(others[:2])
    assert "missing" in verdict.sentence() and others[0] in verdict.sentence()
    with pytest.raises(ValueError, match="128 x 128"):
        referee.read(np.zeros((64, 64, 3), dtype=np.uint8))


def test_emoji_outside_the_vocabulary_are_something_else(stream, sheet):
    # a referee that knows only the first 32 emoji, on scenes of the other 32
    small = Referee(sheet.subset(lang.NAMES[:32]))
    objects, unknown, named = 0, 0, 0
    for scene in stream.scenes(0, 200):
        if all(o.name in lang.NAMES[32:] for o in scene.objects):
            reading = small.read(stream.render(scene)[128])
            objects, unknown, named = (
                objects + len(scene.objects),
                unknown + len(reading.unknown),
                named + len(reading.objects),
            )
            assert not small.prompt_match(
                stream.render(scene)[128], format_prompt(["red apple"], scene.background)
            ).match
    # measured: 2 of 121 such objects on 300 scenes look enough like a known emoji to be named
    assert objects >= 60 and unknown >= 0.95 * objects and named <= 0.05 * objects


def test_the_referee_survives_blur(stream, referee):
    """A VQ's reconstruction blurs: a Gaussian of sigma 1 px keeps the scenes' prompt match."""
    shown = mixed_scenes(stream, 50)
    matched = 0
    for scene in shown:
        blurred = Image.fromarray(stream.render(scene)[128]).filter(ImageFilter.GaussianBlur(1.0))
        matched += referee.prompt_match(np.asarray(blurred), scene.prompt).match
    assert matched / len(shown) >= 0.94


def test_the_grammar_round_trips(stream):
    for scene in mixed_scenes(stream, 200):
        parsed = parse_prompt(scene.prompt)
        assert parsed == lang.ScenePrompt(tuple(o.name for o in scene.objects), scene.background, scene.style)
        assert parsed.text() == scene.prompt
    assert (
        format_prompt(["red apple", "rocket", "cat"], "blue", "noto")
        == "red apple, rocket and cat on blue in noto style"
    )
    # what people type: articles, "&", a bare style word, no background (any), any case
    assert parse_prompt("A Red Apple & the rocket on BLUE noto") == lang.ScenePrompt(
        ("red apple", "rocket"), "blue", "noto"
    )
    assert parse_prompt("cat and pizza") == lang.ScenePrompt(("cat", "pizza"), None)
    assert parse_prompt("sun in openmoji style") == lang.ScenePrompt(("sun",), None, "openmoji")


def test_symbols_say_exactly_what_a_prompt_or_description_names(stream):
    names, colours = len(lang.NAMES), len(lang.PALETTE)
    style = {word: names + colours + i for i, word in enumerate(lang.STYLE_WORDS)}
    for scene in mixed_scenes(stream, 100):
        prompt, description, (short,) = scenes.describe(scene)
        background = (names + list(lang.PALETTE).index(scene.background),)
        objects = [lang.NAMES.index(o.name) for o in scene.objects]
        own = [(k, style[o.style]) for k, o in zip(objects, scene.objects, strict=True)]
        shared = [(k,) if scene.style is None else (k, style[scene.style]) for k in objects]
        assert lang.symbol_slots(prompt) == [background, *shared]
        assert lang.symbol_slots(description) == [background, *own]  # a style after each name: its own
        assert lang.symbol_slots(short) == [(), *[(k,) for k in objects]]  # no background: left open
    assert lang.symbol_slots("A Red Apple & the rocket on BLUE noto") == [
        (names + 6,),
        (0, style["noto"]),
        (1, style["noto"]),
    ]  # a bare style word after the colour is the prompt's one style
    assert lang.symbol_slots("cat on red noto") != lang.symbol_slots("cat on red")
    with pytest.raises(PromptError, match="unknown emoji 'red aple'"):
        lang.symbol_slots("red aple noto on blue")


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ("red aple on blue", "unknown emoji 'red aple'; nearest known: red apple"),
        ("red apple rocket on blue", "did you mean 'red apple and rocket'"),
        ("helicopter on blue", "unknown emoji 'helicopter'; this family draws: red apple, rocket"),
        ("cat on teal", "unknown background colour 'teal'; the colours are white, yellow"),
        ("cat on bleu", "(nearest: blue)"),
        ("cat on", "nothing after 'on'"),
        ("cat, dog, pig and fox on red", "names 4 emoji; this family draws at most 3"),
        ("cat and cat on red", "names cat twice"),
        ("on red", "names no emoji"),
        ("", "names no emoji"),
        ("cat on red comic style", "'style' must follow a style word"),
    ],
)
def test_bad_prompts_name_the_problem(prompt, message):
    with pytest.raises(PromptError) as error:
        parse_prompt(prompt)
    assert message in str(error.value)


def test_held_out_combinations_never_train(stream):
    held = stream.held_out_combinations
    assert 0.02 < len(held) / (len(lang.NAMES) * (len(lang.NAMES) - 1) / 2 * len(lang.PALETTE)) < 0.08
    for scene in stream.scenes(0, 2000):
        assert not lang.held_out_pairs([o.name for o in scene.objects], scene.background), scene
    for scene in stream.scenes(0, 200, scenes.HELD_OUT):
        assert len(scene.objects) >= 2 and lang.held_out_pairs([o.name for o in scene.objects], scene.background)


def test_seeds_and_indices_give_different_layouts(sheet, stream):
    other = scenes.SceneStream(stream.config, sheet, seed=1)
    layout = lambda s: tuple((o.x, o.y) for o in s.objects)  # noqa: E731
    first = stream.scenes(0, 50)
    assert sum(layout(a) != layout(b) for a, b in zip(first, other.scenes(0, 50), strict=True)) >= 45
    assert len({layout(s) for s in first}) >= 45
    assert stream.scene(7) == scenes.SceneStream(stream.config, sheet, seed=0).scene(7)  # a scene is its index


@pytest.mark.parametrize("placement", ["free", "slots", "tiles", "columns"])
def test_objects_never_overlap_and_scales_agree(sheet, placement):
    config = scenes.SceneConfig(placement=placement, vocabulary=48)
    stream = scenes.SceneStream(config, sheet, seed=3)
    corners = set()
    for scene in stream.scenes(0, 300):
        assert len({o.name for o in scene.objects}) == len(scene.objects)
        assert {o.name for o in scene.objects} <= set(lang.NAMES[:48])
        for i, a in enumerate(scene.objects):
            corners.add((a.x, a.y))
            assert 0 <= a.x <= 96 and 0 <= a.y <= 96
            for b in scene.objects[i + 1 :]:
                assert abs(a.x - b.x) >= 40 or abs(a.y - b.y) >= 40  # 32 px squares, 8 px apart
    assert corners <= set(config.positions())  # slots: 3 x 3 cells; tiles: 4 x 4; free: every 8 px, 13 x 13
    assert len(corners) == {"slots": 9, "tiles": 16}.get(placement, len(corners)) and len(corners) >= 9
    if placement == "tiles":  # each object inside one 32 px tile, never next to another (diagonals too)
        assert all(x % 32 == 0 and y % 32 == 0 for x, y in corners)
    if placement in ("free", "columns"):  # columns: every 8 px up and down, fewer across at 2 or 3 objects
        assert len(corners) >= (150 if placement == "free" else 120)
    images = stream.render(stream.scene(0))
    big = images[128].astype(float)
    for px in (64, 32):
        f = 128 // px
        assert np.abs(big.reshape(px, f, px, f, 3).mean((1, 3)) - images[px]).max() <= 1


def test_columns_put_the_prompts_objects_left_to_right(sheet):
    """ "columns": the prompt's k-th object lies in the k-th of n equal columns, anywhere up or down,
    so the prompt reads left to right and the layouts still vary."""
    stream = scenes.SceneStream(scenes.SceneConfig(placement="columns"), sheet, seed=5)
    heights = {1: set(), 2: set(), 3: set()}
    for scene in stream.scenes(0, 300) + stream.scenes(0, 60, scenes.HELD_OUT):
        n = len(scene.objects)
        assert scene.prompt.startswith(scene.objects[0].name)  # the grammar names them in this order
        for k, o in enumerate(scene.objects):
            assert k * 128 / n <= o.x and o.x + 32 <= (k + 1) * 128 / n, (scene, k)
            heights[n].add(o.y)
    assert all(len(ys) == 13 for ys in heights.values())  # every 8 px row, at every count
    seeds = [scenes.SceneStream(stream.config, sheet, seed=s).scene(0) for s in range(5)]
    assert len({tuple((o.x, o.y) for o in s.objects) for s in seeds}) == 5
    with pytest.raises(ValueError, match="too narrow"):
        scenes.SceneConfig(placement="columns", object_px=48, max_objects=3)
    # a few tops: every object's top at 0, 48 or 96 px, its column as before
    banded = scenes.SceneStream(scenes.SceneConfig(placement="columns", vertical_step=48), sheet, seed=5)
    tops = {o.y for scene in banded.scenes(0, 100) for o in scene.objects}
    assert tops == {0, 48, 96}
    with pytest.raises(ValueError, match="not a multiple of step 8"):
        scenes.SceneConfig(placement="columns", vertical_step=12)


def test_the_data_object_is_what_the_pipeline_reads(stream):
    data = stream.data(train=12, held_out=4)
    assert data.images.shape == (16, 128, 128, 3) and data.images is data.scales[128]
    assert {px: a.shape[1] for px, a in data.scales.items()} == {128: 128, 64: 64, 32: 32}
    assert data.is_val.tolist() == [False] * 12 + [True] * 4
    assert [parse_prompt(n).text() for n in data.names] == data.names
    assert all(data.keys[i].endswith("@" + parse_prompt(n).background) for i, n in enumerate(data.names))
    assert [parse_prompt(s[0]).background for s in data.short_prompts] == [None] * 16
    assert data.val.names == data.names[12:]


def test_the_sprite_file_round_trips(tmp_path, sheet):
    path = save_sprites(tmp_path / "sprites.npz", sheet.subset(lang.NAMES[:5]))
    loaded = Sprites.load(path)
    assert loaded.names == lang.NAMES[:5] and loaded.canvas == 128
    assert np.array_equal(loaded.rgba, sheet.rgba[:5])
