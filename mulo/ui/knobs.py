"""The request's knobs in the app: the Advanced accordion's inputs (one row per group of
``config.knob_table()``), each family's values and ranges, and which knobs each method reads."""

from __future__ import annotations

import gradio as gr

from mulo import methods
from mulo.config import GROUPS, GenerationConfig, Knob, knob_table
from mulo.ui import engines
from mulo.ui.inputs import RawCheckbox, RawRadio, RawSlider


def family_bounds(family: str) -> tuple[int, tuple[int, ...]]:
    """``family``'s codebook size and drafter ratios, what knob ranges depend on (loads the
    family; a missing one is a gr.Error)."""
    loaded = engines.engine_for(family).family
    return loaded.vocab_size, tuple(loaded.ratios)


def knob_component(knob: Knob, value, vocab_size: int | None = None, ratios: tuple = ()) -> gr.components.Component:
    """The input of one knob: a checkbox, a radio over its choices (r: the family's ratios) or a
    slider over its range, with the family's codebook capping it."""
    info = " ".join(knob.help.split())
    if knob.kind == "bool":
        return RawCheckbox(value=value, label=knob.label, info=info)
    options = knob.choices or (ratios if knob.ratios else ())
    if options:
        return RawRadio(list(options), value=value, label=knob.label, info=info)
    high = knob.maximum(vocab_size)
    low = knob.auto if knob.auto is not None else knob.low
    return RawSlider(low, high, value=min(value, high), step=knob.step, label=knob.label, info=info)


def advanced_panel(defaults: dict, vocab_size: int | None, ratios: tuple) -> list[gr.components.Component]:
    """The Advanced accordion's knob inputs, laid out one row per group (inside a Blocks context);
    returned in ``knob_table()`` order, the order ``/generate`` takes them in."""
    table = knob_table()
    made = {}
    for group in GROUPS:
        members = [k for k in table if k.group == group]
        if members:
            gr.Markdown(f"**{group}**")
            with gr.Row():
                for k in members:
                    made[k.key] = knob_component(k, defaults.get(k.key, k.default), vocab_size, ratios)
    return [made[k.key] for k in table]


def family_knobs(family: str) -> list:
    """Updates of every knob input when the family changes: its recommended values, r's choices
    (its drafters) and slider ranges that fit its codebook (a missing family is a gr.Error)."""
    defaults = engines.engine_for(family).make_config(None).to_dict()
    vocab_size, ratios = family_bounds(family)
    updates = []
    for knob in knob_table():
        value = defaults.get(knob.key, knob.default)
        if knob.ratios:
            updates.append(gr.update(value=value, choices=list(ratios)))
        elif knob.vocab_cap is not None:
            high = knob.maximum(vocab_size)
            updates.append(gr.update(value=min(value, high), maximum=high))
        else:
            updates.append(gr.update(value=value))
    return updates


def default_bounds() -> tuple[int | None, tuple[int, ...]]:
    """The default family's codebook size and ratios (the widest ranges when it is not installed)."""
    try:
        return family_bounds(engines.DEFAULT_FAMILY)
    except gr.Error:
        return None, (2, 4)


def default_config() -> dict:
    """The knob values a request gets by default: the default family's recommendations."""
    try:
        return engines.engine_for(engines.DEFAULT_FAMILY).make_config(None).to_dict()
    except gr.Error:  # the family is not installed: the app still serves the others and replays
        return GenerationConfig().to_dict()


def baselines() -> tuple[str, ...]:
    """The third column's choices: none, or a baseline of the method registry (read when asked:
    methods may be registered at run time)."""
    return ("none", *methods.baselines())


def baseline_choices() -> list[tuple[str, str]]:
    """The third column's menu: (the paper's name, method id) of each choice."""
    return [("none", "none"), *((methods.get(name).label, name) for name in methods.baselines())]


def method_plan(third: str) -> list[tuple[str, str]]:
    """(label, method) of the runs of one request: AR, MuLo-SD and an optional baseline."""
    plan = [("AR", "ar"), ("MuLo-SD", "mulo")]
    return plan + ([(methods.get(third).label, third)] if third != "none" else [])


def method_knobs(config: dict, method: str) -> dict:
    """The knobs of ``config`` that ``method`` reads: the sampling knobs and its own (the others
    keep the family's values in its trace)."""
    return methods.get(method).knob_values(config)
