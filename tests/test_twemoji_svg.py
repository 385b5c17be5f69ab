"""The multi-scale data set drawn from Twemoji's SVGs (``mulo.train.data.load_scales``), on crafted
packages: no network, no real emoji."""

from __future__ import annotations

import io
import json
import tarfile

import numpy as np
import pytest

from mulo.train import data as data_mod

# A red square over the left half, nothing (transparent) on the right.
HALF_RED = b"""<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 36 36">
<rect x="0" y="0" width="18" height="36" fill="#ff0000"/></svg>"""
BLUE = b"""<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 36 36">
<rect x="0" y="0" width="36" height="36" fill="#0000ff"/></svg>"""


def _tarball(path, files: dict[str, bytes]):
    with tarfile.open(path, "w:gz") as tar:
        for name, payload in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return path


def _entry(name: str, image: str, order: int, **extra) -> dict:
    short = name.lower().split()[-1]
    return {"name": name, "unified": image.split(".")[0].upper(), "image": image, "sort_order": order,
            "short_names": [short], "subcategory": "s", "category": "c", **extra}  # fmt: skip


@pytest.mark.parametrize("size", data_mod.SCALES)
def test_an_svg_renders_over_white_at_each_scale(size):
    image = data_mod.render_svg(HALF_RED, size)
    assert image.shape == (size, size, 3) and image.dtype == np.uint8
    assert (image[:, : size // 2 - 1] == [255, 0, 0]).all()  # drawn
    assert (image[:, size // 2 + 1 :] == 255).all()  # transparent -> white


def test_emoji_json_image_names_map_to_twemoji_svg_stems():
    assert data_mod.svg_stem("1f34e.png") == "1f34e"
    assert data_mod.svg_stem("0023-fe0f-20e3.png") == "23-fe0f-20e3"  # the caller also tries "23-20e3"
    assert data_mod.svg_stem("1f469-200d-1f467.png") == "1f469-200d-1f467"


def test_scales_keep_names_tones_and_the_png_data_sets_split(tmp_path):
    entries = [
        _entry("RED APPLE", "1f34e.png", 0),
        _entry("HASH KEY", "0023-fe0f-20e3.png", 1),
        _entry("NEW THING", "1fae9.png", 2),  # newer than Twemoji 15.0.0: no SVG
        _entry("WAVING HAND SIGN", "1f44b.png", 3, skin_variations={"1F3FF": {"image": "1f44b-1f3ff.png"}}),
    ]
    pngs = ["1f34e.png", "0023-fe0f-20e3.png", "1fae9.png", "1f44b.png", "1f44b-1f3ff.png"]
    datasource = _tarball(
        tmp_path / "ds.tgz",
        {"package/emoji.json": json.dumps(entries).encode()}
        | {f"package/img/twitter/64/{p}": b"" for p in pngs},  # names only: build_scales reads no PNG
    )
    svgs = _tarball(
        tmp_path / "svg.tgz",
        {"package/1f34e.svg": HALF_RED, "package/23-20e3.svg": BLUE, "package/1f44b.svg": BLUE,
         "package/1f44b-1f3ff.svg": HALF_RED},
    )  # fmt: skip
    data = data_mod.build_scales(datasource, svgs, sizes=(16, 8))
    assert data.names == ["red apple", "hash key", "waving hand sign", "waving hand sign dark skin tone"]
    assert data.images.shape == (4, 16, 16, 3) and data.scales[8].shape == (4, 8, 8, 3)
    assert (data.scales[16][1] == [0, 0, 255]).all() and (data.scales[8][3][:, :3] == [255, 0, 0]).all()
    # the split is drawn over the PNG data set's five images, then the one without an SVG is dropped
    assert data.is_val.tolist() == np.delete(data_mod.validation_split(5), 2).tolist()
    val = data.val
    assert set(val.scales) == {16, 8} and len(val.scales[8]) == int(data.is_val.sum())


def test_a_tampered_svg_package_fails_its_integrity_check(tmp_path):
    tarball = _tarball(tmp_path / data_mod.SVG_TARBALL, {"package/1f34e.svg": HALF_RED})
    with pytest.raises(RuntimeError, match="failed its integrity check"):
        data_mod.fetch_package(tmp_path, data_mod.SVG_PACKAGE, data_mod.SVG_TARBALL, data_mod.SVG_INTEGRITY)
    assert not tarball.exists()  # deleted, so the next run fetches it again
