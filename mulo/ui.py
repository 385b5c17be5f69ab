"""The app's handlers and knobs: plain functions over the engine, gradio only for errors and updates.

``app.py`` lays them out; tests call them directly. Generation runs through ``run_methods`` (the
one GPU function, ``spaces.GPU`` on ZeroGPU); everything else reads the server-side state only.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import time
from pathlib import Path

import gradio as gr
import numpy as np

from mulo import viz
from mulo.config import DRAFTING, RESAMPLING, UPSAMPLERS, ConfigError, GenerationConfig
from mulo.engine import Engine
from mulo.families import FAMILIES, TAR_VARIANTS, load_family
from mulo.inputs import RawRadio, RawSlider, parse_request
from mulo.markdown import plain
from mulo.session import RunView, replay_view, stream_view
from mulo.spaces_compat import gpu
from mulo.tempfiles import TempFiles
from mulo.trace import MAX_TRACE_BYTES, Trace, TraceError, parse, read_json_file

log = logging.getLogger("mulo.app")
ROOT = Path(__file__).resolve().parents[1]
EXAMPLES_DIR = ROOT / "assets" / "examples"
OUT_DIR = Path(tempfile.gettempdir()) / "mulo-app"
FILES = TempFiles(OUT_DIR, max_age_s=float(os.environ.get("MULO_FILE_MAX_AGE_S", "600")))
STATE_TTL_S = 3600  # a session's runs are dropped an hour after its last request (API sessions never close)
MAX_GIF_FRAMES = 48  # a GIF of a long run shows this many rounds, evenly spaced
DISPLAY = 256  # on-screen size of the generated images (nearest-neighbour, token cells stay sharp)
BASELINES = ("none", "zipar", "sjd", "sd", "lantern")
FAMILY_CHOICES = tuple(dict.fromkeys(FAMILIES + TAR_VARIANTS))
EXAMPLE_PROMPTS = ["red apple", "cat face", "rocket", "grinning face", "pizza", "ghost", "sun", "crown"]
DEFAULT_FAMILY = os.environ.get("MULO_FAMILY", "twemoji")

# Every knob of the Advanced accordion: (name, label, one-line explanation, choices or (min, max, step)).
# Names are GenerationConfig's; the values shown are the default family's recommended ones.
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
    ("cfg", "CFG scale", "classifier-free guidance u + s·(c − u); 1 = none", (1, 8, 0.5)),
    ("temperature", "temperature", "0 = greedy", (0, 2, 0.05)),
    ("top_k", "top-k", "keep the k most likely codes; 0 = off", (0, 512, 1)),
    ("top_p", "top-p", "nucleus mass; 1 = off", (0.05, 1, 0.05)),
]
def knob_limits(vocab_size: int) -> dict[str, int]:
    """Slider maxima that depend on the family's codebook: pooling needs k < V, top-k <= V."""
    return {"k": min(64, vocab_size - 1), "top_k": min(512, vocab_size)}


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
    engine = engine_for(family)
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
        return knob_limits(engine_for(DEFAULT_FAMILY).family.vocab_size)
    except gr.Error:
        return {}


METRICS_LEGEND = """
**wall time**: seconds from request to decoded image on this machine (drawing excluded) ·
**speed-up**: AR wall time / this method's wall time, same prompt, seed and settings ·
**NFE**: forward passes of the target and of the drafter (a CFG pair counts once) ·
**rounds**: draft → verify → resample blocks (AR and ZipAR: one per row of work) ·
**acceptance**: accepted draft tokens / proposed draft tokens ·
**re-opened**: positions re-opened and resampled by the target / all positions
"""

EXPLAINER = """
MuLo-SD drafts the image with a **low-resolution** AR model, **up-samples** the draft tokens ×r,
**verifies** all of them in one pass of the high-resolution target, **accepts** a token when the
target probability pooled over the draft token and its k nearest codebook neighbours reaches τ,
**re-opens** only the (2l+1)² neighbourhood of each rejection (never before the first one, t0) and
**resamples** those islands, in parallel. Colours: <span style="color:#16a34a">■ accepted</span>
<span style="color:#dc2626">■ rejected</span> <span style="color:#f59e0b">■ re-opened</span>
<span style="color:#2563eb">■ t0</span>.
"""

_engines: dict[str, Engine] = {}
_engines_lock = threading.Lock()


# -- engines ------------------------------------------------------------------------------------
def engine_for(family: str) -> Engine:
    """The shared engine of ``family`` (loaded once; a load failure is a gr.Error)."""
    with _engines_lock:
        if family not in _engines:
            try:
                _engines[family] = Engine(load_family(family, "cuda" if _cuda() else "cpu"))
            except (ValueError, FileNotFoundError) as exc:
                raise gr.Error(str(exc)) from None
        return _engines[family]


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def default_config() -> dict:
    """The knob values a request gets by default: the default family's recommendations."""
    try:
        return engine_for(DEFAULT_FAMILY).make_config(None).to_dict()
    except gr.Error:  # the family is not installed: the app still serves the others and replays
        return GenerationConfig().to_dict()


def method_plan(third: str) -> list[tuple[str, str]]:
    """(label, method) of the runs of one request: AR, MuLo-SD and an optional baseline."""
    plan = [("AR", "ar"), ("MuLo-SD", "mulo")]
    return plan + ([(third, third)] if third != "none" else [])


MULO_ONLY = {
    "r",
    "tau",
    "radius",
    "rows_per_block",
    "drafting",
    "resampling",
    "upsampler",
    "draft_window",
    "island_window",
}


def method_knobs(config: dict, method: str) -> dict:
    """MuLo-SD's knobs go to MuLo-SD only; AR and the baselines share the sampling knobs."""
    return {k: v for k, v in config.items() if method == "mulo" or k not in MULO_ONLY}


@gpu(duration=120)
def run_methods(family: str, prompt: str, seed: int, config: dict, plan: list[tuple[str, str]]):
    """The GPU part: each method in turn on the one engine; yields (label, RunView) per round and
    once more when the run is finished (trace attached).

    Yields are numpy images and traces, so they pickle across ZeroGPU's worker boundary."""
    engine = engine_for(family)
    for label, method in plan:
        stream = stream_view(engine, prompt, method, seed, method_knobs(config, method))
        while True:
            try:
                view = next(stream)
            except StopIteration as done:
                yield label, done.value
                break
            yield label, view


# -- files --------------------------------------------------------------------------------------
def save_png(image: np.ndarray, stem: str) -> str:
    return FILES.png(image, stem)


def save_bytes(data: bytes, name: str) -> str:
    return FILES.write(data, name)


def shown(image: np.ndarray) -> np.ndarray:
    return viz.enlarge(image, DISPLAY)


# -- headline numbers ---------------------------------------------------------------------------
def stats_markdown(trace: Trace, baseline: Trace | None) -> str:
    s = trace.summary()
    speedup = f"{baseline.latency_s / trace.latency_s:.2f}×" if baseline is not None and trace is not baseline else "1×"
    acc = "n/a" if s["acceptance_rate"] is None else f"{s['acceptance_rate']:.1%}"
    c = trace.config
    lines = [
        f"**{trace.latency_s:.2f} s** · speed-up **{speedup}** · NFE target {s['nfe']['target']}, "
        f"drafter {s['nfe']['drafter']} · {s['rounds']} rounds",
        f"acceptance {acc} · re-opened {s['reopened_fraction']:.1%}",
        f"<small>{trace.method} · cfg {c['cfg']} · temperature {c['temperature']} · top-k {c['top_k']} · "
        f"top-p {c['top_p']} · seed {trace.seed} · {plain(trace.device, 64)}</small>",
    ]
    # every string below may come from a shared trace file: shown as text, never as markup
    if trace.condition_text:
        lines.append(
            f"conditioned on *{plain(trace.condition_text)}* (the emoji whose short name is *{plain(trace.prompt)}*)"
        )
    if trace.warnings:
        lines.append(f"⚠️ {plain('; '.join(trace.warnings), 600)}")
    return "  \n".join(lines)


# -- handlers -----------------------------------------------------------------------------------
def generate(
    prompt,
    seed,
    family=DEFAULT_FAMILY,
    third="none",
    r=None,
    tau=None,
    k=None,
    radius=None,
    rows_per_block=None,
    drafting=None,
    resampling=None,
    upsampler=None,
    draft_window=None,
    island_window=None,
    zipar_window=None,
    cfg=None,
    temperature=None,
    top_k=None,
    top_p=None,
    progress=gr.Progress(),  # noqa: B008 (gradio injects the tracker through this default)
):
    """Stream AR, MuLo-SD (and a baseline) one after the other on the same prompt, seed and
    settings; the final update adds the statistics, the traces (JSON) and the trace files.

    The public ``/generate`` endpoint: ``prompt`` and ``seed`` are required, every other
    parameter has the UI's default (None = the family's recommended value)."""
    knob_values = {
        "r": r, "tau": tau, "k": k, "radius": radius, "rows_per_block": rows_per_block, "drafting": drafting,
        "resampling": resampling, "upsampler": upsampler, "draft_window": draft_window,
        "island_window": island_window, "zipar_window": zipar_window, "cfg": cfg, "temperature": temperature,
        "top_k": top_k, "top_p": top_p,
    }  # fmt: skip
    try:  # every problem is reported before any model runs
        request = parse_request(
            prompt, seed, DEFAULT_FAMILY if family is None else family, "none" if third is None else third,
            knob_values, KNOBS, lambda name: knob_limits(engine_for(name).family.vocab_size),
            FAMILY_CHOICES, BASELINES,
        )  # fmt: skip
        prompt, seed, family, third, config = (
            request.prompt, request.seed, request.family, request.third, request.knobs
        )  # fmt: skip
        engine = engine_for(family)  # loaded above (cached)
        plan = method_plan(third)
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


# (The rest of the handlers below read the server-side state only: no engine, no GPU lane.)
def _view(state, label, what: str = "show") -> RunView:
    """The run ``label`` of the session's state, or a gr.Error saying there is none yet."""
    if not state or label not in state.get("views", {}):
        raise gr.Error(f"nothing to {what} yet: generate or load a trace first")
    return state["views"][label]


def after_generate(state):
    """Round controls for the inspected run (MuLo-SD by default) and the latency charts."""
    if not state:
        raise gr.Error("nothing to show yet: generate or load a trace first")
    choices = state["order"]
    label = "MuLo-SD" if "MuLo-SD" in choices else choices[0]
    n = len(state["views"][label].trace.rounds)
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
    token_map = viz.overlay(np.full((*rnd.draft.shape, 3), 255, np.uint8), rnd, opacity=1.0, layers=layers or ())
    image_map = viz.overlay(viz.enlarge(draft, size), rnd, opacity=float(opacity), layers=layers or ())
    islands = viz.island_colors(rnd.islands, viz.enlarge(draft, size))
    finalized = viz.heatmap(viz.finalized_round(trace).astype(float), vmax=max(1, len(trace.rounds) - 1))
    score = rnd.score[rnd.draft >= 0]
    info = (
        f"**round {index + 1} / {len(trace.rounds)}** ({plain(rnd.label, 64)}) · proposed {rnd.proposed} · accepted "
        f"{int(rnd.accepted.sum())} · rejected {int(rnd.rejected.sum())} · re-opened {int(rnd.reopened.sum())} "
        f"in {rnd.n_islands} island(s) · t0 = {_rc(rnd.t0, trace.grid)}"
        + (f" · score min/median {score.min():.3f}/{np.median(score):.3f}" if score.size and score.max() >= 0 else "")
        + f" · NFE target {rnd.nfe.get('target', 0)}, drafter {rnd.nfe.get('drafter', 0)}"
        + f" · {sum(rnd.timings_s.values()) * 1000:.1f} ms"
    )
    return (
        save_png(viz.enlarge(draft, size), "draft"),
        save_png(viz.enlarge(token_map, size), "tokens"),
        save_png(image_map, "overlay"),
        save_png(islands, "islands"),
        save_png(viz.enlarge(finalized, size), "finalized"),
        save_png(viz.enlarge(view.canvases[index], size), "canvas"),
        info,
        viz.timeline_figure(trace, current=index),
    )


def _round_index(index, trace: Trace) -> int:
    """A round index from the slider (any number; clipped to the trace's rounds)."""
    try:
        index = int(index or 0)
    except (TypeError, ValueError, OverflowError):
        index = 0
    return min(max(0, index), len(trace.rounds) - 1)


def _rc(t0, grid) -> str:
    return "none" if t0 is None else f"row {t0 // grid[1]}, col {t0 % grid[1]}"


def step_round(index, delta, state, label):
    if not state or label not in state.get("views", {}):
        return gr.skip()
    trace = state["views"][label].trace
    return _round_index(_round_index(index, trace) + delta, trace)


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


def describe_token(trace: Trace, row: int, col: int, tau: float) -> str:
    lines = [
        f"**token (row {row}, col {col})**: final code {int(trace.tokens[row, col])}, final after round "
        f"{int(viz.finalized_round(trace)[row, col]) + 1}"
    ]
    for rnd in trace.rounds:
        if rnd.draft[row, col] < 0 and not rnd.reopened[row, col] and not rnd.resampled[row, col]:
            continue
        parts = [f"round {rnd.index + 1}"]
        if rnd.draft[row, col] >= 0:
            score = float(rnd.score[row, col])
            verdict = "accepted" if rnd.accepted[row, col] else ("rejected" if rnd.rejected[row, col] else "not tested")
            test = f", score {score:.3f} vs τ {tau}" if score >= 0 else ""
            parts.append(f"draft code {int(rnd.draft[row, col])}{test} → {verdict}")
        if rnd.reopened[row, col]:
            parts.append(f"re-opened (island {int(rnd.islands[row, col])})")
        if rnd.resampled[row, col]:
            parts.append(f"resampled in wave {int(rnd.resampled[row, col])} → code {int(rnd.tokens[row, col])}")
        lines.append("- " + "; ".join(parts))
    if len(lines) == 1:
        lines.append("- decoded directly by the target (no draft for this position)")
    return "\n".join(lines)


def export_figure(state, label, index):
    view = _view(state, label, "export")
    index = _round_index(index, view.trace)
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


def load_trace(upload, example):
    """Replay a trace file (uploaded or bundled) without running a model.

    The file is untrusted: its size is capped, every field is checked before anything is drawn
    (``mulo.trace.parse``), round pictures are drawn only when shown, strings shown as text."""
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
        loaded = _engines.get(data.get("family")) if isinstance(data.get("family"), str) else None
        trace = parse(data, loaded.family.vocab_size if loaded else None)
        view = replay_view(trace, loaded.family if loaded else None)
    except TraceError as exc:
        raise gr.Error(str(exc)) from None
    except OSError as exc:
        raise gr.Error(f"could not read the trace file ({exc.strerror or type(exc).__name__})") from None
    label = f"replay: {trace.method}"
    note = "" if view.decoded else " (family not loaded here: token codes shown as colours)"
    summary = (
        f"**{plain(trace.prompt)}** · {trace.method} · seed {trace.seed} · {plain(trace.family, 64)}{note}  \n"
        + stats_markdown(trace, None)
    )
    return save_png(shown(view.image), "replay"), summary, {"views": {label: view}, "order": [label]}


def example_traces() -> list[str]:
    return sorted(p.name for p in EXAMPLES_DIR.glob("*.json")) if EXAMPLES_DIR.exists() else []
