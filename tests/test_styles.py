"""The multi-style data set (``mulo.train.styles``) on crafted Iconify packages: code points
matched across emoji.json's and Iconify's spellings, aliases with their flips, the licence check,
a split that holds out (emoji, style) pairs while the emoji trains in its other styles, and
augmented copies placed alike at every scale."""

import io
import json
import tarfile

import numpy as np
import pytest

from mulo.train import styles
from mulo.train.styles import HELD_EMOJI, HELD_PAIR, TRAIN, Placement, Style

SQUARE = '<path fill="#ff0000" d="M0 0h8v16H0z"/>'  # the left half of a 16 x 16 icon, red


def iconify_tarball(path, icons: dict, chars: dict, licence: str = "MIT", aliases: dict | None = None):
    files = {
        "icons.json": {"prefix": "x", "icons": icons, "aliases": aliases or {}, "width": 16, "height": 16},
        "chars.json": chars,
        "info.json": {"license": {"spdx": licence}},
    }
    with tarfile.open(path, "w:gz") as tar:
        for name, content in files.items():
            raw = json.dumps(content).encode()
            info = tarfile.TarInfo(f"package/{name}")
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
    return path


def style(word: str, licence: str = "MIT") -> Style:
    return Style(word, word, f"{word}@1", f"{word}.tgz", "unused", licence, f"{word} authors")


def test_code_points_match_across_emoji_json_and_iconify_spellings():
    assert styles.code_key("2764-FE0F") == styles.code_key("2764") == "2764"
    assert styles.code_key("1F44B-1F3FB") == "1f44b-1f3fb"


def test_an_alias_renders_its_parent_flipped():
    aliases = {"right-half": {"parent": "left-half", "hFlip": True}}
    icons = {"icons": {"left-half": {"body": SQUARE}}, "aliases": aliases, "width": 16, "height": 16}
    left = styles.render_at(styles.icon_svg(icons, "left-half"), 16)
    right = styles.render_at(styles.icon_svg(icons, "right-half"), 16)
    red = (left[..., 0] > 200) & (left[..., 1] < 60)
    assert red[:, :6].all() and not red[:, 10:].any()
    np.testing.assert_array_equal(right, left[:, ::-1])
    assert styles.icon_svg(icons, "missing") is None


def test_a_tall_icon_renders_square_and_centred():
    """Fluent draws some emoji 32x33 and Twemoji one flag 36x25.22: every render must still be
    px x px (the data set stacks them), the drawing centred in it."""
    tall = {
        "icons": {"bar": {"body": '<rect x="0" y="0" width="16" height="32" fill="#f00"/>'}},
        "width": 16,
        "height": 32,
    }
    image = styles.render_at(styles.icon_svg(tall, "bar"), 32)
    assert image.shape == (32, 32, 3)
    red = (image[..., 0] > 200) & (image[..., 1] < 60)
    assert red[:, 9:23].all() and not red[:, :7].any() and not red[:, 25:].any()  # centred: 8 px each side


def test_a_package_whose_licence_differs_from_the_recorded_one_is_refused(tmp_path):
    tarball = iconify_tarball(tmp_path / "a.tgz", {"i": {"body": SQUARE}}, {"1f34e": "i"}, licence="CC-BY-NC-4.0")
    _, _, info = styles.read_iconify(tarball)
    with pytest.raises(RuntimeError, match="declares licence 'CC-BY-NC-4.0', not 'MIT'"):
        styles.check_licence(style("a"), info)
    styles.check_licence(style("a", "CC-BY-NC-4.0"), info)


def test_styled_emoji_lists_each_variant_in_every_style_that_draws_it():
    entries = [
        {"unified": "1F34E", "sort_order": 2, "name": "RED APPLE", "short_names": ["apple"], "category": "Food",
         "subcategory": "fruit"},
        {"unified": "1F44B", "sort_order": 1, "name": "WAVING HAND SIGN", "short_names": ["wave"], "category": "People",
         "subcategory": "hand", "skin_variations": {"1F3FB": {"unified": "1F44B-1F3FB"}}},
    ]  # fmt: skip
    svgs = {"a": {"1f34e": "<svg/>", "1f44b": "<svg/>", "1f44b-1f3fb": "<svg/>"}, "b": {"1f34e": "<svg/>"}}
    items = styles.styled_emoji(entries, svgs)
    assert [(i.key, i.code, i.style, i.tones) for i in items] == [
        ("1F44B", "1f44b", "a", []),
        ("1F44B", "1f44b-1f3fb", "a", ["1F3FB"]),
        ("1F34E", "1f34e", "a", []),
        ("1F34E", "1f34e", "b", []),
    ]
    name, text, _ = styles.describe_styled(items[3])
    assert name == "red apple" and text.split()[-1] == "b"  # the name draws any style, the text names it


def test_the_split_holds_out_pairs_whose_emoji_trains_in_other_styles():
    keys = [f"1F{i:03X}" for i in range(2000)]
    words = styles.STYLE_WORDS
    split = {(k, s): styles.split_of(k, s) for k in keys for s in words}
    held_emoji = {k for k in keys if split[k, words[0]] == HELD_EMOJI}
    assert all(split[k, s] == HELD_EMOJI for k in held_emoji for s in words)  # in every style
    assert 0.03 < len(held_emoji) / len(keys) < 0.07
    pairs = [(k, s) for (k, s), v in split.items() if v == HELD_PAIR]
    assert 0.08 < len(pairs) / (len(split) - len(held_emoji) * len(words)) < 0.12
    # most held-out pairs' emoji train in at least one other style (all do unless every style was drawn)
    trains_elsewhere = [any(split[k, o] == TRAIN for o in words if o != s) for k, s in pairs]
    assert np.mean(trains_elsewhere) > 0.99
    assert styles.split_of("1F34E", "noto") == styles.split_of("1F34E", "noto")  # stable


def test_a_placement_agrees_across_the_scales():
    rng = np.random.default_rng(0)
    for _ in range(50):
        p = styles.random_placement(rng, 32)
        assert 24 <= p.inner <= 32 and 0 <= p.x <= 32 - p.inner and 0 <= p.y <= 32 - p.inner
    svg = f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16">{SQUARE}</svg>'
    item = styles.StyledEmoji("1F34E", "1f34e", "a", svg, {})
    rendered = styles.render_scales(item, (128, 64, 32), Placement(inner=24, x=4, y=8))
    for px, image in rendered.items():
        m = px // 32
        red = (image[..., 0] > 200) & (image[..., 1] < 60)
        rows, cols = np.flatnonzero(red.any(1)), np.flatnonzero(red.any(0))
        # the red left half of the icon: x from 4 to 4 + 12, y from 8 to 8 + 24, in 32 px units
        assert abs(rows[0] - 8 * m) <= 1 and abs(rows[-1] + 1 - 32 * m) <= 1
        assert abs(cols[0] - 4 * m) <= 1 and abs(cols[-1] + 1 - 16 * m) <= 1
        assert (image[: 8 * m - 1] == 255).all()  # white above the placed emoji


def test_the_recorded_styles_are_pinned_and_openly_licensed():
    allowed = {"CC-BY-4.0", "CC-BY-SA-4.0", "Apache-2.0", "MIT"}
    assert {s.licence for s in styles.STYLES} <= allowed
    assert all("@" in s.package[1:] and s.integrity.startswith("sha512-") for s in styles.STYLES)
    assert len(set(styles.STYLE_WORDS)) == len(styles.STYLES) and all(w.isalnum() for w in styles.STYLE_WORDS)


def test_a_render_that_panics_at_a_small_size_is_drawn_larger_and_reduced(monkeypatch):
    """resvg 0.48 panics (pyo3's PanicException, a BaseException) on one Fluent filter at 16 px."""
    import resvg_py

    from mulo.train import data as data_mod

    real = resvg_py.svg_to_bytes

    class Panic(BaseException):
        pass

    def panicky(**kwargs):
        if kwargs["width"] < 32:
            raise Panic("index out of bounds")
        return real(**kwargs)

    monkeypatch.setattr(resvg_py, "svg_to_bytes", panicky)
    svg = f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16">{SQUARE}</svg>'.encode()
    image = data_mod.render_svg(svg, 16)
    assert image.shape == (16, 16, 3)
    red = (image[..., 0] > 200) & (image[..., 1] < 60)
    assert red[:, :7].all() and not red[:, 9:].any()
