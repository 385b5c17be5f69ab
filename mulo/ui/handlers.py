"""The app's gradio handlers: plain functions over the engine, gradio only for errors and updates.

``app.py`` lays them out; tests call them directly. Generation runs through ``run_methods`` (the
one GPU function, ``spaces.GPU`` on ZeroGPU); every other handler reads the session's state only.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import threading
import time

import gradio as gr
import numpy as np

from mulo import methods
from mulo.config import ConfigError, knob_table
from mulo.streams import Returning
from mulo.trace import Trace
from mulo.tracefile import MAX_TRACE_BYTES, TraceError, parse, read_json_file
from mulo.ui import engines, figures, scoring, viz
from mulo.ui.files import DISPLAY, EXAMPLES_DIR, example_traces, save_bytes, save_png, shown
from mulo.ui.inputs import GenerateRequest, RawRadio, RawSlider, parse_request
from mulo.ui.knobs import baselines, family_bounds, method_knobs, method_plan
from mulo.ui.markdown import plain
from mulo.ui.spaces_compat import gpu
from mulo.ui.text import describe_token, replay_summary, round_info, stats_markdown
from mulo.ui.torch_thread import TORCH
from mulo.ui.views import RunView, replay_view, stream_view, with_frames

# Seconds between rounds when the Rounds panel plays a run: time for a visitor to read each map.
# A host may change it (the browser tests play at 0.1 s).
PLAY_SECONDS = float(os.environ.get("MULO_PLAY_SECONDS", "0.7"))

log = logging.getLogger(__name__)

STATE_TTL_S = 3600  # a session's runs are dropped an hour after its last request (API sessions never close)
MAX_GIF_FRAMES = 48  # a GIF shows at most this many rounds (or waves), evenly spaced


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
    runs), then the runs' rounds as they come, then the final update. A request made before in
    this process (an example clicked again) is answered from ``RESULTS`` at once."""
    prompt, seed, family, third, config = request.prompt, request.seed, request.family, request.third, request.knobs
    engine = engines.engine_for(family)  # loaded by parse_request (cached)
    plan = method_plan(third)
    try:
        for _, method in plan:
            engine.check(prompt, method, seed, method_knobs(config, method))
    except ConfigError as exc:
        raise gr.Error(str(exc)) from None
    key = RESULTS.key(family, prompt, seed, third, config)
    views = RESULTS.get(key)
    if views is None:
        views = yield from stream_runs(family, prompt, seed, config, plan, progress)
        RESULTS.put(key, views)
    yield final_outputs(engine, prompt, seed, config, plan, views)


def stream_runs(family, prompt, seed, config, plan, progress):
    """Yield the columns' updates while the runs stream (a canvas only when one was painted, the
    progress bar after every round: "MuLo-SD: round 3, 41 % of tokens"); return {label: RunView}."""
    slots = {label: i for i, (label, _) in enumerate(plan)}
    views: dict[str, RunView] = {}
    for label, view in run_methods(family, prompt, seed, config, plan):
        if view.trace is not None:
            view = with_frames(view, engines.engine_for(family).family)
        views[label] = view
        out = [gr.skip()] * 3
        if view.trace is None and view.fresh:
            out[slots[label]] = save_png(shown(view.preview), label)
        done = sum(v.trace is not None for v in views.values())
        share = 1.0 if view.trace is not None else view.decided
        progress(
            (done + (0 if view.trace is not None else share)) / len(plan),
            desc=f"{label} ({done + (view.trace is None)} of {len(plan)}): round {view.rounds_done}, "
            f"{share:.0%} of tokens",
        )
        yield *out, *([gr.skip()] * 6), running_line(label, view, done, len(plan)), gr.skip()
    return views


def running_line(label: str, view: RunView, done: int, runs: int) -> str:
    """The Rounds panel's line while a request runs: which run, its round, how much is decided."""
    if view.trace is not None:
        return f"**{label}** finished in {view.rounds_done} rounds · {done} of {runs} runs done"
    return (
        f"**{label}** running: round {view.rounds_done}, {view.decided:.0%} of the image's tokens decided "
        f"· {done} of {runs} runs done (the rounds are shown here once every run has finished)"
    )


def final_outputs(engine, prompt, seed, config, plan, views: dict[str, RunView]) -> tuple:
    """The columns' final images and statistics (speed, cost, quality), the traces, the state, and
    the Rounds panel's line left as it is (``show_round`` draws it next)."""
    labels = [label for label, _ in plan]
    runs = {
        label: (views[label].trace, views[label].image, views[label].pass_widths or {}, method_knobs(config, method))
        for label, method in plan
    }
    try:
        scores = TORCH.call(scoring.score_columns, engine, prompt, runs)
    except RuntimeError as exc:  # a pass that cannot be timed here (ZeroGPU outside its GPU call): no scores
        log.warning("no quality or cost scores for this request: %s", exc)
        scores = {label: None for label in labels}
    reference = TORCH.call(scoring.reference_adherence, engine)
    traces = {label: views[label].trace for label in labels}
    columns = [*labels, None][:3]  # AR, MuLo-SD, the third column or nothing
    stats = [
        stats_markdown(traces[label], traces["AR"], scores[label], reference) if label else "" for label in columns
    ]
    jsons = [traces[label].to_dict() if label else None for label in columns[:2]]
    downloads = [
        save_bytes(json.dumps(t.to_dict()).encode(), f"trace-{t.method}-seed{seed}.json") for t in traces.values()
    ]
    state = {"views": views, "order": labels}
    # fresh files for the final images: re-sending a file the browser is still fetching can break it
    finals = [save_png(shown(views[label].image), label) if label else None for label in columns]
    return (*finals, *stats, *jsons, downloads, gr.skip(), state)  # the round line: drawn by show_round


class ResultCache:
    """The last few requests' finished runs, by everything that decides their tokens: a request
    made again (an example clicked twice, a replayed demo) shows its result at once. The runs are
    deterministic for a seed, so only the wall-clock times are those of the first run."""

    def __init__(self, size: int = 12):
        self.size, self.entries, self.lock = size, {}, threading.Lock()

    @staticmethod
    def key(family, prompt, seed, third, config) -> tuple:
        return family, prompt, seed, third, tuple(sorted(config.items()))

    def get(self, key):
        with self.lock:
            views = self.entries.pop(key, None)
            if views is not None:
                self.entries[key] = views  # most recent last
            return views

    def put(self, key, views) -> None:
        with self.lock:
            self.entries[key] = views
            while len(self.entries) > self.size:
                self.entries.pop(next(iter(self.entries)))


RESULTS = ResultCache()


@gpu(duration=120)
def run_methods(family: str, prompt: str, seed: int, config: dict, plan: list[tuple[str, str]]):
    """The GPU part: each method in turn on the one engine; yields (label, RunView) per round and
    once more when the run is finished (trace attached).

    Yields are numpy images and traces, so they pickle across ZeroGPU's worker boundary."""
    engine = engines.engine_for(family)
    for label, method in plan:
        rounds = stream_view(engine, prompt, method, seed, method_knobs(config, method), frames=False)
        run = Returning(TORCH.stream(rounds))  # every step on the app's torch thread
        for view in run:
            yield label, view
        yield label, run.value


# -- the session's state (no engine, no GPU lane) -----------------------------------------------
def _view(state, label, what: str | None = "show") -> RunView | None:
    """The run ``label`` of the session's state; the session's first run when ``label`` is not one
    of them (a redraw queued before the run menu changed: a replay swaps every run). When there is
    no run at all: a gr.Error saying there is nothing to ``what`` yet, or None when ``what`` is
    None (the caller then does nothing)."""
    views = state.get("views", {}) if isinstance(state, dict) else {}
    view = views.get(label) if isinstance(label, str) else None
    if view is None and views:
        view = views.get("MuLo-SD") or next(iter(views.values()))
    if view is None and what is not None:
        raise gr.Error(f"nothing to {what} yet: generate or load a trace first")
    return view


def _round_index(position, trace: Trace) -> int:
    """The 0-based index of the round at slider ``position`` (rounds count from 1 on the slider,
    as in the round line; any number, clipped to the trace's rounds)."""
    try:
        position = int(position or 1)
    except (TypeError, ValueError, OverflowError):
        position = 1
    return min(max(1, position), len(trace.rounds)) - 1


def round_slider(state, label) -> RawSlider:
    """The round slider for run ``label``: its range is that run's rounds, at round 1. Every run
    switch goes through here, so "next" and "play" never step past the shown run's last round."""
    view = _view(state, label, None)
    n = len(view.trace.rounds) if view is not None else 1
    return RawSlider(minimum=1, maximum=max(2, n), value=1, step=1, interactive=n > 1)


def after_generate(state):
    """Round controls for the inspected run (MuLo-SD by default), the latency charts, and no
    clicked token."""
    choices = (state or {}).get("order", [])
    label = "MuLo-SD" if "MuLo-SD" in choices else next(iter(choices), None)
    _view(state, label)
    traces = {k: v.trace for k, v in state["views"].items()}
    baseline = "AR" if "AR" in traces else None
    return (
        RawRadio(choices=choices, value=label),
        round_slider(state, label),
        viz.latency_figure(traces, baseline, title="Latency by stage"),
        None,
    )


def pick_run(state, label):
    """Another run chosen in the Rounds panel: its round range, and no clicked token."""
    return round_slider(state, label), None


def show_round(state, label, position, opacity, layers, clicked=None):
    """The pictures, line and plots of round ``position`` (1-based, the slider's) of run ``label``."""
    view = _view(state, label)
    trace = view.trace
    index = _round_index(position, trace)
    rnd = trace.rounds[index]
    draft = view.drafts[index] if view.drafts[index] is not None else view.canvases[index]
    size = DISPLAY
    finalized = figures.finalized_map(trace, size)
    return (
        save_png(viz.enlarge(draft, size), "draft"),
        save_png(token_map(rnd, layers, clicked, trace.grid), "tokens"),
        save_png(viz.overlay(viz.enlarge(draft, size), rnd, opacity=float(opacity), layers=layers or ()), "overlay"),
        save_png(viz.island_colors(rnd.islands, viz.enlarge(draft, size)), "islands"),
        save_png(finalized, "finalized") if finalized is not None else None,
        save_png(viz.enlarge(view.canvases[index], size), "canvas"),
        round_info(trace, index),
        viz.timeline_figure(trace, current=index),
        gr.Plot(figures.tree_figure(rnd, trace.grid[1]) if rnd.tree else None, visible=rnd.tree is not None),
        gr.Column(visible=finalized is not None),
    )


def token_map(rnd, layers, clicked, grid) -> np.ndarray:
    """The round's acceptance map on tokens, the clicked token (row, col) outlined when it is on the grid."""
    image = viz.acceptance_map(rnd, DISPLAY, layers=layers or ())
    if clicked is not None and 0 <= clicked[0] < grid[0] and 0 <= clicked[1] < grid[1]:
        image = viz.outline_cell(image, clicked, grid)
    return image


def step_round(position, delta, state, label):
    """The slider position ``delta`` rounds from ``position``, kept within the run's rounds."""
    view = _view(state, label, None)
    if view is None:
        return gr.skip()
    return _round_index(_round_index(position, view.trace) + 1 + delta, view.trace) + 1


def play_rounds(state, label):
    """Walk the slider through every round of the shown run (the slider's change event redraws)."""
    for position in range(1, len(_view(state, label, "play").trace.rounds) + 1):
        yield position
        time.sleep(PLAY_SECONDS)


def token_info(state, label, position, layers, evt: gr.SelectData):
    """What happened to the clicked token in the whole run; the map with the token outlined, and
    the token kept (later rounds outline it too)."""
    trace = _view(state, label, "inspect").trace
    h, w = trace.grid
    cell = max(1, DISPLAY // max(h, w))  # the token map is enlarged by this factor (viz.enlarge)
    try:
        x, y = (int(v) for v in evt.index)
    except (TypeError, ValueError, OverflowError):
        raise gr.Error("click a token of the acceptance map") from None
    row, col = min(max(0, y // cell), h - 1), min(max(0, x // cell), w - 1)
    rnd = trace.rounds[_round_index(position, trace)]
    image = save_png(token_map(rnd, layers, (row, col), trace.grid), "tokens")
    return describe_token(trace, row, col, float(trace.config.get("tau", 0))), image, (row, col)


def export_figure(state, label, position):
    view = _view(state, label, "export")
    index = _round_index(position, view.trace)
    rnd = view.trace.rounds[index]
    if rnd.tree is not None:  # EAGLE-2: its round is the tree it verified
        fig = figures.tree_figure(rnd, view.trace.grid[1])
        return save_bytes(viz.figure_png(fig), f"tree-round{index + 1}-{view.trace.method}.png")
    draft = view.drafts[index] if view.drafts[index] is not None else view.canvases[index]
    fig = figures.round_layout(view.trace, index, draft, view.canvases[index])
    return save_bytes(viz.figure_png(fig), f"round{index + 1}-{view.trace.method}.png")


def gif_rounds(n_rounds: int, limit: int = MAX_GIF_FRAMES) -> list[int]:
    """The rounds a GIF shows: all of them, or ``limit`` evenly spaced ones with the first and last."""
    if n_rounds <= limit:
        return list(range(n_rounds))
    return sorted({round(i * (n_rounds - 1) / (limit - 1)) for i in range(limit)})


def export_gif(state, label):
    """The run's rounds as a GIF: a labelled frame per round, per resampling wave where a round has several."""
    view = _view(state, label, "export")
    rounds = gif_rounds(len(view.trace.rounds))
    frames = figures.gif_frames(view.trace, view.drafts, view.canvases, rounds, DISPLAY, MAX_GIF_FRAMES)
    return save_bytes(viz.gif(frames), f"rounds-{view.trace.method}.gif")


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
