"""Each knob is declared once, in ``mulo/config.py``: a knob added there reaches the CLI, the
validation, the app's Advanced panel and ``/generate``, and every one of them shows its one range."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import gradio as gr
import pytest

from mulo import config
from mulo.config import BASELINES, ConfigError, GenerationConfig, knob, knob_table, markdown_table, validate

DOCS = Path(__file__).resolve().parents[1] / "docs" / "method.md"


@dataclass
class WithWiggle(GenerationConfig):
    wiggle: int = knob(3, "a knob this test adds", label="wiggle room", group=BASELINES, low=1, high=9)


@pytest.fixture
def added(monkeypatch):
    """The knob table with one more knob, declared in one place (as a new field would be)."""
    monkeypatch.setattr(config, "GenerationConfig", WithWiggle)
    return next(k for k in knob_table() if k.key == "wiggle")


def _components(demo) -> dict:
    return {getattr(b, "label", None): b for b in demo.blocks.values()}


def test_an_added_knob_is_a_cli_flag_with_its_help_and_range(added, capsys):
    from mulo.__main__ import build_parser

    args = build_parser().parse_args(["generate", "--prompt", "red apple", "--wiggle", "5"])
    assert args.wiggle == 5
    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "--help"])
    assert "--wiggle WIGGLE" in capsys.readouterr().out


def test_an_added_knob_is_validated_by_its_range(added):
    with pytest.raises(ConfigError, match=r"wiggle must be an integer in \[1, 9\] \(got 12\)"):
        validate(WithWiggle(wiggle=12), vocab_size=32)
    validate(WithWiggle(wiggle=9), vocab_size=32)
    assert WithWiggle.from_dict({"wiggle": 4}).to_dict()["wiggle"] == 4


def test_an_added_knob_is_in_the_app_and_in_generate(added):
    import app
    from mulo.ui import handlers

    demo = app.build_demo()
    slider = _components(demo)["wiggle room"]
    assert (slider.minimum, slider.maximum, slider.value) == (1, 9, 3)
    params = demo.get_api_info()["named_endpoints"]["/generate"]["parameters"]
    wiggle = next(p for p in params if p["parameter_name"] == "wiggle")
    assert wiggle["type"] == {"type": "integer", "minimum": 1, "maximum": 9}
    assert [p["parameter_name"] for p in params][-1] == "wiggle"  # a new knob goes last
    with pytest.raises(gr.Error, match=r"wiggle must be an integer in \[1, 9\] \(got 12\)"):
        list(handlers.generate("red apple", 0, "toy", "none", wiggle=12))
    final = list(handlers.generate("red apple", 0, "toy", "none", wiggle=5, radius=0))[-1]
    assert final[-1]["views"]["MuLo-SD"].trace is not None  # no method reads it: the run goes on


def test_the_app_shows_each_knob_with_its_one_range():
    import app
    from mulo.ui.knobs import default_bounds

    vocab_size, ratios = default_bounds()
    shown = _components(app.build_demo())
    for k in knob_table():
        component = shown[k.label]
        if k.kind == "bool":
            assert isinstance(component, gr.Checkbox), k.key
        elif k.choices or k.ratios:
            assert [v for _, v in component.choices] == list(k.choices or ratios), k.key
        else:
            low = k.auto if k.auto is not None else k.low
            assert (component.minimum, component.maximum) == (low, k.maximum(vocab_size)), k.key


def test_the_docs_knob_table_is_the_one_made_from_the_declarations():
    text = DOCS.read_text()
    start = text.index("<!-- knob table: python -m mulo knobs -->\n") + len(
        "<!-- knob table: python -m mulo knobs -->\n"
    )
    end = text.index("<!-- end of knob table -->")
    assert text[start:end] == markdown_table(), "docs/method.md's knob table is stale: run python -m mulo knobs"
    assert len(re.findall(r"^\| `--", text[start:end], re.M)) == len(knob_table())
