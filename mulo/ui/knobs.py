"""The request's knobs: the Advanced accordion's inputs, each family's values and ranges, and
which knobs each method of a request reads."""

from __future__ import annotations

import gradio as gr

from mulo import methods
from mulo.config import DRAFTING, RESAMPLING, UPSAMPLERS, GenerationConfig
from mulo.ui import engines
from mulo.ui.inputs import RawRadio, RawSlider

# Every knob of the Advanced accordion: (name, label, one-line explanation, choices or (min, max, step)).
# Names are GenerationConfig's keys; the values shown are the default family's recommended ones.
KNOBS = [
    ("r", "r", "resolution ratio target / drafter", [2, 4]),
    ("tau", "τ (tau)", "accept a draft token iff its pooled target probability ≥ τ; > 1 rejects all", (0, 1.01, 0.01)),
    ("k", "k", "codebook neighbours pooled with the draft token (0 = the token alone)", (0, 64, 1)),
    ("radius", "l (radius)", "re-open the (2l+1)² square around each rejection, never before t0", (0, 4, 1)),
    ("rows_per_block", "rows per block", "low-res rows drafted per round; 0 = auto", (0, 16, 1)),
    ("drafting", "drafting", "drafter decodes row by row, or ZipAR-parallel", list(DRAFTING)),
    (
        "resampling",
        "resampling",
        "raster: one target pass per re-opened token (v1); islands: all in parallel (v2)",
        list(RESAMPLING),
    ),  # fmt: skip
    (
        "upsampler",
        "up-sampler",
        "pixel: decode, resize, re-encode; learned: the family's token up-sampler",
        list(UPSAMPLERS),
    ),  # fmt: skip
    (
        "draft_window",
        "drafter ZipAR window",
        "drafting=zipar: a row starts once the row above has this many tokens",
        (1, 16, 1),
    ),  # fmt: skip
    (
        "island_window",
        "island ZipAR window",
        "0 = raster order inside each island; w > 0 = ZipAR inside islands",
        (0, 16, 1),
    ),  # fmt: skip
    (
        "zipar_window",
        "ZipAR window (baseline)",
        "ZipAR baseline: row i+1 starts once row i has this many tokens",
        (1, 16, 1),
    ),  # fmt: skip
    ("tree_budget", "EAGLE-2 tree budget", "EAGLE-2: tokens verified per round (root + tree nodes)", (2, 128, 1)),
    ("tree_depth", "EAGLE-2 tree depth", "EAGLE-2: tree depth = drafter passes per round", (1, 12, 1)),
    ("tree_top_k", "EAGLE-2 top-k", "EAGLE-2: continuations per expanded node, nodes expanded per depth", (1, 32, 1)),
    ("cfg", "CFG scale", "classifier-free guidance u + s·(c − u); 1 = none", (1, 8, 0.5)),
    ("temperature", "temperature", "0 = greedy", (0, 2, 0.05)),
    ("top_k", "top-k", "keep the k most likely codes; 0 = off", (0, 512, 1)),
    ("top_p", "top-p", "nucleus mass; 1 = off", (0.05, 1, 0.05)),
]


def knob_limits(vocab_size: int) -> dict[str, int]:
    """Slider maxima that depend on the family's codebook: pooling needs k < V, top-k <= V."""
    return {"k": min(64, vocab_size - 1), "top_k": min(512, vocab_size), "tree_top_k": min(32, vocab_size)}


def family_limits(family: str) -> dict[str, int]:
    """``knob_limits`` of ``family``'s codebook (loads the family; a missing one is a gr.Error)."""
    return knob_limits(engines.engine_for(family).family.vocab_size)


def knob_component(knob: tuple, value, limits: dict | None = None) -> gr.components.Component:
    """The input of one ``KNOBS`` entry: a radio over its choices or a slider over its range."""
    name, label, info, spec = knob
    if isinstance(spec, list):
        return RawRadio(spec, value=value, label=label, info=info)
    low, high, step = spec
    high = (limits or {}).get(name, high)
    return RawSlider(low, high, value=min(value, high), step=step, label=label, info=info)


def family_knobs(family: str) -> list:
    """Updates of every ``KNOBS`` input when the family changes: its recommended values, and
    slider ranges that fit its codebook (a missing family is a gr.Error from ``engine_for``)."""
    engine = engines.engine_for(family)
    defaults = engine.make_config(None).to_dict()
    limits = knob_limits(engine.family.vocab_size)
    updates = []
    for name, *_ in KNOBS:
        if name in limits:
            updates.append(gr.update(value=min(defaults[name], limits[name]), maximum=limits[name]))
        else:
            updates.append(gr.update(value=defaults[name]))
    return updates


def default_limits() -> dict:
    """Slider maxima for the default family (the widest ranges when it is not installed)."""
    try:
        return family_limits(engines.DEFAULT_FAMILY)
    except gr.Error:
        return {}


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


def method_plan(third: str) -> list[tuple[str, str]]:
    """(label, method) of the runs of one request: AR, MuLo-SD and an optional baseline."""
    plan = [("AR", "ar"), ("MuLo-SD", "mulo")]
    return plan + ([(third, third)] if third != "none" else [])


def method_knobs(config: dict, method: str) -> dict:
    """The knobs of ``config`` that ``method`` reads: the sampling knobs and its own (the others
    keep the family's values in its trace)."""
    return methods.get(method).knob_values(config)
