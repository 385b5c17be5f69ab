"""The app's gradio handlers: plain functions over the engine, gradio only for errors and updates.

``app.py`` lays them out; tests call them directly. Generation runs through ``run_methods`` (the
one GPU function, ``spaces.GPU`` on ZeroGPU); every other handler reads the session's state only.
"""

from __future__ import annotations

import inspect
import json
import time

import gradio as gr
import numpy as np

from mulo import methods
from mulo.config import ConfigError, knob_table
from mulo.streams import Returning
from mulo.trace import Trace
from mulo.tracefile import MAX_TRACE_BYTES, TraceError, parse, read_json_file
from mulo.ui import engines, viz
from mulo.ui.files import DISPLAY, EXAMPLES_DIR, example_traces, save_bytes, save_png, shown
from mulo.ui.inputs import GenerateRequest, parse_request
from mulo.ui.knobs import baselines, family_bounds, method_knobs, method_plan
from mulo.ui.markdown import plain
from mulo.ui.spaces_compat import gpu
from mulo.ui.text import describe_token, replay_summary, round_info, stats_markdown
from mulo.ui.views import RunView, replay_view, stream_view

STATE_TTL_S = 3600  # a session's runs are dropped an hour after its last request (API sessions never close)
MAX_GIF_FRAMES = 48  # a GIF of a long run shows this many rounds, evenly spaced


# -- generation ---------------------------------------------------------------------------------
def generate(prompt, seed, family=engines.DEFAULT_FAMILY, third="none", progress=None, **knob_values):
    """Stream AR, MuLo-SD (and a baseline) one after the other on the same prompt, seed and
    settings; the final update adds the statistics, the traces (JSON) and the trace files.
    ``knob_values``: knob keys (``config.knob_table()``) -> values; None = the family's value."""
    try:  # every problem is reported before any model runs
        request = parse_request(
            prompt, seed, engines.DEFAULT_FAMILY if family is None else family, "none" if third is None else third,
            knob_values, knob_table(), family_bounds, engines.family_choices(), baselines(),
        )  # fmt: skip
    except ConfigError as exc:
        raise gr.Error(str(exc)) from None
    yield from run_request(request, progress or (lambda *a, **kw: None))


def generate_endpoint():
    """``generate`` as the app's ``/generate``: prompt, seed, family, third, then every knob of
    ``config.knob_table()`` as a parameter of its own (its key), read when the app is built."""
    keys = [k.key for k in knob_table()]

    def endpoint(*values):  # gradio passes the inputs positionally, its progress tracker last
        *inputs, progress = values
        prompt, seed, family, third, *knobs = inputs
        yield from generate(prompt, seed, family, third, progress, **dict(zip(keys, knobs, strict=True)))

    required = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD) for name in ("prompt", "seed")]
    optional = [("family", engines.DEFAULT_FAMILY), ("third", "none"), *((key, None) for key in keys)]
    optional.append(("progress", gr.Progress()))  # gradio finds its tracker by this default
    params = required + [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=d) for n, d in optional]
    endpoint.__signature__ = inspect.Signature(params)
    endpoint.__name__ = endpoint.__qualname__ = "generate"
    endpoint.__doc__ = """The public ``/generate`` endpoint: ``prompt`` and ``seed`` are required, every
    other parameter has the UI's default (None = the family's recommended value)."""
    return endpoint


def run_request(request: GenerateRequest, progress):
    """``generate`` on a checked request: each method's checks first (a gr.Error before any model
    runs), then the runs' rounds as they come, then the final update."""
    prompt, seed, family, third, config = request.prompt, request.seed, request.family, request.third, request.knobs
    engine = engines.engine_for(family)  # loaded by parse_request (cached)
    plan = method_plan(third)
    try:
        for _, method in plan:
            engine.check(prompt, method, seed, method_knobs(config, method))
    except ConfigError as exc:
        raise gr.Error(str(exc)) from None
    slots = {label: i for i, (label, _) in enumerate(plan)}
    views: dict[str, RunView] = {}
    for label, view in run_methods(family, prompt, seed, config, plan):
        views[label] = view
        out = [gr.skip()] * 3
        latest = view.latest
        if latest is not None:
            out[slots[label]] = save_png(shown(latest), label)
        done = sum(v.trace is not None for v in views.values())
        progress((done + 0.5) / len(plan), desc=f"{label}: round {len(view.canvases)}")
        yield *out, *([gr.skip()] * 7)
    traces = {label: v.trace for label, v in views.items()}
    base = traces["AR"]
    stats = [stats_markdown(traces[label], base) if label in traces else "" for label in ("AR", "MuLo-SD", third)]
    jsons = [traces[label].to_dict() if label in traces else None for label in ("AR", "MuLo-SD", third)]
    downloads = [
        save_bytes(json.dumps(t.to_dict()).encode(), f"trace-{t.method}-seed{seed}.json") for t in traces.values()
    ]
    state = {"views": views, "order": [label for label, _ in plan]}
    # fresh files for the final images: re-sending a file the browser is still fetching can break it
    finals = [
        save_png(shown(views[label].image), label) if label in views else None for label in ("AR", "MuLo-SD", third)
    ]
    yield (*finals, *stats, *jsons[:2], downloads, state)


@gpu(duration=120)
def run_methods(family: str, prompt: str, seed: int, config: dict, plan: list[tuple[str, str]]):
    """The GPU part: each method in turn on the one engine; yields (label, RunView) per round and
    once more when the run is finished (trace attached).

    Yields are numpy images and traces, so they pickle across ZeroGPU's worker boundary."""
    engine = engines.engine_for(family)
    for label, method in plan:
        run = Returning(stream_view(engine, prompt, method, seed, method_knobs(config, method)))
        for view in run:
            yield label, view
        yield label, run.value


# -- the session's state (no engine, no GPU lane) -----------------------------------------------
def _view(state, label, what: str | None = "show") -> RunView | None:
    """The run ``label`` of the session's state. When there is none: a gr.Error saying there is
    nothing to ``what`` yet, or None when ``what`` is None (the caller then does nothing)."""
    view = state.get("views", {}).get(label) if state else None
    if view is None and what is not None:
        raise gr.Error(f"nothing to {what} yet: generate or load a trace first")
    return view


def _round_index(index, trace: Trace) -> int:
    """A round index from the slider (any number; clipped to the trace's rounds)."""
    try:
        index = int(index or 0)
    except (TypeError, ValueError, OverflowError):
        index = 0
    return min(max(0, index), len(trace.rounds) - 1)


def after_generate(state):
    """Round controls for the inspected run (MuLo-SD by default) and the latency charts."""
    choices = (state or {}).get("order", [])
    label = "MuLo-SD" if "MuLo-SD" in choices else next(iter(choices), None)
    n = len(_view(state, label).trace.rounds)
    traces = {k: v.trace for k, v in state["views"].items()}
    baseline = "AR" if "AR" in traces else None
    return (
        gr.Radio(choices=choices, value=label),
        gr.Slider(minimum=0, maximum=max(1, n - 1), value=0, step=1, interactive=n > 1),
        viz.latency_figure(traces, baseline, title="Latency by stage"),
    )


def show_round(state, label, index, opacity, layers):
    view = _view(state, label)
    trace = view.trace
    index = _round_index(index, trace)
    rnd = trace.rounds[index]
    draft = view.drafts[index] if view.drafts[index] is not None else view.canvases[index]
    size = DISPLAY
    token_map = viz.acceptance_map(rnd, size, layers=layers or ())
    image_map = viz.overlay(viz.enlarge(draft, size), rnd, opacity=float(opacity), layers=layers or ())
    islands = viz.island_colors(rnd.islands, viz.enlarge(draft, size))
    finalized = viz.heatmap(viz.finalized_round(trace).astype(float), vmax=max(1, len(trace.rounds) - 1))
    return (
        save_png(viz.enlarge(draft, size), "draft"),
        save_png(token_map, "tokens"),
        save_png(image_map, "overlay"),
        save_png(islands, "islands"),
        save_png(viz.enlarge(finalized, size), "finalized"),
        save_png(viz.enlarge(view.canvases[index], size), "canvas"),
        round_info(trace, index),
        viz.timeline_figure(trace, current=index),
        gr.Plot(viz.tree_figure(rnd, trace.grid[1]) if rnd.tree else None, visible=rnd.tree is not None),
    )


def step_round(index, delta, state, label):
    view = _view(state, label, None)
    if view is None:
        return gr.skip()
    return _round_index(_round_index(index, view.trace) + delta, view.trace)


def play_rounds(state, label):
    """Walk the slider through every round (the slider's change event redraws)."""
    for i in range(len(_view(state, label, "play").trace.rounds)):
        yield i
        time.sleep(0.7)


def token_info(state, label, index, evt: gr.SelectData):
    """What happened to the clicked token in the whole run."""
    trace = _view(state, label, "inspect").trace
    h, w = trace.grid
    cell = max(1, DISPLAY // max(h, w))  # the token map is enlarged by this factor (viz.enlarge)
    try:
        x, y = (int(v) for v in evt.index)
    except (TypeError, ValueError, OverflowError):
        raise gr.Error("click a token of the acceptance map") from None
    row, col = min(max(0, y // cell), h - 1), min(max(0, x // cell), w - 1)
    return describe_token(trace, row, col, float(trace.config.get("tau", 0)))


def export_figure(state, label, index):
    view = _view(state, label, "export")
    index = _round_index(index, view.trace)
    rnd = view.trace.rounds[index]
    if rnd.tree is not None:  # EAGLE-2: its round is the tree it verified
        fig = viz.tree_figure(rnd, view.trace.grid[1])
        return save_bytes(viz.figure_png(fig), f"tree-round{index + 1}-{view.trace.method}.png")
    draft = view.drafts[index] if view.drafts[index] is not None else view.canvases[index]
    fig = viz.round_layout(view.trace, index, draft, view.canvases[index])
    return save_bytes(viz.figure_png(fig), f"round{index + 1}-{view.trace.method}.png")


def gif_rounds(n_rounds: int, limit: int = MAX_GIF_FRAMES) -> list[int]:
    """The rounds a GIF shows: all of them, or ``limit`` evenly spaced ones with the first and last."""
    if n_rounds <= limit:
        return list(range(n_rounds))
    return sorted({round(i * (n_rounds - 1) / (limit - 1)) for i in range(limit)})


def export_gif(state, label):
    view = _view(state, label, "export")

    def frames():  # drawn one at a time while the GIF is encoded
        for i in gif_rounds(len(view.trace.rounds)):
            rnd, draft, canvas = view.trace.rounds[i], view.drafts[i], view.canvases[i]
            left = viz.overlay(viz.enlarge(draft if draft is not None else canvas, DISPLAY), rnd)
            right = viz.enlarge(canvas, DISPLAY)
            yield np.concatenate([left, np.full((left.shape[0], 8, 3), 255, np.uint8), right], 1)

    return save_bytes(viz.gif(frames()), f"rounds-{view.trace.method}.gif")


# -- replay ---------------------------------------------------------------------------------------
def load_trace(upload, example):
    """Replay a trace file (uploaded or bundled) without running a model.

    The file is untrusted: its size is capped, every field is checked before anything is drawn
    (``mulo.tracefile.parse``), round pictures are drawn only when shown, strings shown as text."""
    if upload:
        path = upload
    elif example:
        if example not in example_traces():  # a name from the list, never a path from the request
            raise gr.Error(f"no bundled example named {plain(str(example), 80)}")
        path = str(EXAMPLES_DIR / example)
    else:
        raise gr.Error("choose a trace file or a bundled example")
    try:
        data = read_json_file(path, MAX_TRACE_BYTES)
        engine = engines.loaded(data.get("family"))
        trace = parse(data, engine.family.vocab_size if engine else None, methods.names())
        view = replay_view(trace, engine.family if engine else None)
    except TraceError as exc:
        raise gr.Error(str(exc)) from None
    except OSError as exc:
        raise gr.Error(f"could not read the trace file ({exc.strerror or type(exc).__name__})") from None
    label = f"replay: {trace.method}"
    state = {"views": {label: view}, "order": [label]}
    return save_png(shown(view.image), "replay"), replay_summary(trace, view.decoded), state
