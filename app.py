"""The mulo demo: plain AR and MuLo-SD side by side, every round of speculative decoding visible.

``python app.py [--host H] [--port P]`` serves it (127.0.0.1:7860 by default; ``MULO_FAMILY``
picks the default family); on Hugging Face Spaces the same file is the app. This file is the
layout; the handlers are in ``mulo.ui.handlers``, the pictures in ``mulo.ui.viz``, the runs in ``mulo.ui.views``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from types import SimpleNamespace

import gradio as gr
import numpy as np

from mulo import families
from mulo.tracefile import MAX_TRACE_BYTES
from mulo.ui import engines
from mulo.ui.files import OUT_DIR, example_traces
from mulo.ui.handlers import (
    STATE_TTL_S,
    after_generate,
    export_figure,
    export_gif,
    generate,
    generate_endpoint,
    load_trace,
    pick_run,
    play_rounds,
    show_round,
    step_round,
    token_info,
)
from mulo.ui.inputs import RawDropdown, RawRadio, RawSlider, RawText, SeedBox
from mulo.ui.knobs import advanced_panel, baseline_choices, default_bounds, default_config, family_knobs
from mulo.ui.shutdown import exit_on_ctrl_c
from mulo.ui.text import EXPLAINER, METRICS_LEGEND, TOKEN_HINT, header
from mulo.ui.torch_thread import TORCH

EXAMPLE_PROMPTS = list(families.examples(engines.DEFAULT_FAMILY))  # the default family's own
HEADER = header(os.environ.get("MULO_CODE_URL") or (
    f"https://huggingface.co/spaces/{os.environ['SPACE_ID']}/tree/main" if os.environ.get("SPACE_ID") else None
))  # fmt: skip
IMAGE = dict(format="png", interactive=False, show_label=False, buttons=[])  # nothing drawn over the picture


class Demo(gr.Blocks):
    """The app's Blocks. Over raw HTTP, gradio wants a value for every input and answers a short
    list with an error it hides from the caller (``{"error": null}``); ``/generate`` documents
    every input after prompt and seed as optional, so those are filled with None (the family's
    value) and a call without prompt and seed is told so."""

    def validate_inputs(self, block_fn, inputs: list) -> None:
        wanted = len(block_fn.inputs)
        if block_fn.api_name == "generate" and len(inputs) < wanted:
            if len(inputs) < 2:
                raise gr.Error(f"/generate needs at least prompt and seed (got {len(inputs)} of {wanted} inputs)")
            inputs.extend([None] * (wanted - len(inputs)))
        super().validate_inputs(block_fn, inputs)


# -- layout -------------------------------------------------------------------------------------
def build_demo() -> gr.Blocks:
    # gradio's copies of the files we send are deleted after an hour, checked every ten minutes
    with Demo(title="mulo: AR vs MuLo-SD", fill_width=True, delete_cache=(600, 3600)) as demo:
        gr.Markdown(HEADER, elem_id="header")
        with gr.Accordion("How MuLo-SD works", open=False):
            gr.Markdown(EXPLAINER)
        state = gr.State(time_to_live=STATE_TTL_S)
        with gr.Tab("Generate"):
            request, results = request_inputs(), result_columns()
        with gr.Tab("Replay a trace"):
            replay = replay_inputs()
        rounds = rounds_panel()
        wire(state, request, results, replay, rounds)
    return demo


def request_inputs() -> SimpleNamespace:
    """Prompt, seed and buttons; examples that run at once; the Advanced accordion: family, third
    column and every knob."""
    with gr.Row():
        prompt = RawText(
            "red apple",
            label="prompt",
            elem_id="prompt",
            scale=4,
            min_width=200,
            max_lines=1,
            info=engines.prompt_info(engines.DEFAULT_FAMILY),
        )
        seed = SeedBox("0", label="seed", elem_id="seed", max_lines=1, scale=1, min_width=120,
                       info="integer in [0, 2^63)")  # fmt: skip
        randomize = gr.Button("random seed", scale=0, elem_id="randomize")
        run = gr.Button("Generate", variant="primary", scale=0, elem_id="generate")
        stop = gr.Button("Stop", variant="stop", scale=0, elem_id="stop")
    examples = gr.Examples([[p, "0"] for p in EXAMPLE_PROMPTS], [prompt, seed], visible_columns=[0],
                           label="examples: a click generates (seed 0)")  # fmt: skip
    with gr.Accordion("Advanced", open=False):
        with gr.Row():
            family = RawDropdown(
                list(engines.menu_families()), value=engines.DEFAULT_FAMILY, label="family", info=engines.family_info()
            )
            third = RawDropdown(
                baseline_choices(), value="none", label="third column", info="also run a baseline on the same request"
            )
        knobs = advanced_panel(default_config(), *default_bounds())
    return SimpleNamespace(prompt=prompt, seed=seed, randomize=randomize, run=run, stop=stop, family=family,
                           third=third, knobs=knobs, examples=examples)  # fmt: skip


def result_columns() -> SimpleNamespace:
    """AR, MuLo-SD and the third column (shown when one is chosen): image and numbers each; side
    by side down to a phone's width. The traces as JSON and files."""
    images, stats, columns, titles = [], [], [], []
    with gr.Row(equal_height=False):
        for title, key in (("AR", "ar"), ("MuLo-SD", "mulo"), ("third column", "third")):
            with gr.Column(min_width=150, visible=key != "third", elem_id=f"column-{key}") as column:
                titles.append(gr.Markdown(f"**{title}**", elem_id=f"title-{key}"))
                images.append(gr.Image(elem_id=key, height=256, **IMAGE))
                stats.append(gr.Markdown(elem_id=f"stats-{key}"))
            columns.append(column)
    gr.Markdown(METRICS_LEGEND, elem_id="legend")
    with gr.Accordion("Trace JSON", open=False):
        jsons = [gr.JSON(label="AR trace"), gr.JSON(label="MuLo-SD trace")]
        downloads = gr.File(label="download traces", file_count="multiple", elem_id="downloads")
    return SimpleNamespace(outputs=[*images, *stats, *jsons, downloads], third_column=columns[2],
                           third_title=titles[2])  # fmt: skip


def replay_inputs() -> SimpleNamespace:
    with gr.Row():
        upload = gr.File(label="trace JSON", file_types=[".json"], type="filepath", elem_id="trace-upload")
        example = gr.Dropdown(example_traces(), value=None, label="bundled example traces")
        load = gr.Button("Load", variant="primary", scale=0, elem_id="load")
    with gr.Row():
        image = gr.Image(label="replayed image", format="png", interactive=False, height=280)
        summary = gr.Markdown(elem_id="replay-summary")
    return SimpleNamespace(upload=upload, example=example, load=load, image=image, summary=summary)


def rounds_panel() -> SimpleNamespace:
    """The chosen run's rounds: a slider over them, the round's six pictures (captioned above, so
    nothing covers a map's top rows), a token's history, the draft tree, latency plots and exports."""
    gr.Markdown("## Rounds")
    with gr.Row():
        # raw: a redraw queued before a replay changed the runs must not fail on the old run's name
        run_pick = RawRadio([], label="run", elem_id="run-pick")
        opacity = gr.Slider(0, 1, value=0.55, step=0.05, label="overlay opacity", elem_id="opacity")
        every_layer = ["accepted", "rejected", "reopened", "t0"]
        layers = gr.CheckboxGroup(every_layer, value=every_layer, label="layers", elem_id="layers")
    with gr.Row():
        prev_btn = gr.Button("previous", scale=0, elem_id="previous")
        # raw: an index past a new run's last round is clipped by the handlers, never an error toast
        slider = RawSlider(1, 2, value=1, step=1, label="round", elem_id="round", interactive=False)
        next_btn = gr.Button("next", scale=0, elem_id="next")
        play_btn = gr.Button("play", scale=0, elem_id="play")
    info = gr.Markdown(elem_id="round-info")
    captions = (
        ("draft", "up-sampled draft"),
        ("token-map", "verdicts on the tokens (click a token)"),
        ("overlay", "verdicts over the draft image"),
        ("islands", "islands: one colour per island"),
        ("final", "round in which each token became final"),
        ("canvas", "canvas after the round"),
    )
    pictures, columns = {}, {}
    for row in (captions[:3], captions[3:]):
        with gr.Row():
            for key, caption in row:
                with gr.Column(min_width=150) as columns[key]:
                    gr.Markdown(f"<small>{caption}</small>", elem_id=f"caption-{key}")
                    pictures[key] = gr.Image(elem_id=key, height=256, **IMAGE)
    clicked = gr.State(None, time_to_live=STATE_TTL_S)  # the token last clicked on the map: (row, col)
    token_md = gr.Markdown(TOKEN_HINT, elem_id="token-info")
    tree_plot = gr.Plot(label="draft tree of the round (EAGLE-2)", visible=False, elem_id="tree")
    with gr.Row():
        latency = gr.Plot(label="latency by stage")
        timeline = gr.Plot(label="per-round timeline")
    with gr.Row():
        fig_btn = gr.Button("PNG figure of this round")
        gif_btn = gr.Button("GIF of the rounds")
        export = gr.File(label="export", elem_id="export")
    # the "final" map says nothing for a run of one round: its column is hidden then
    outputs = [*(pictures[key] for key, _ in captions), info, timeline, tree_plot, columns["final"]]
    return SimpleNamespace(
        run_pick=run_pick, opacity=opacity, layers=layers, prev_btn=prev_btn, slider=slider, next_btn=next_btn,
        play_btn=play_btn, tokens=pictures["token-map"], token_md=token_md, latency=latency, fig_btn=fig_btn, info=info,
        gif_btn=gif_btn, export=export, clicked=clicked, outputs=outputs,
    )  # fmt: skip


def wire(state, request: SimpleNamespace, results: SimpleNamespace, replay: SimpleNamespace, rounds: SimpleNamespace):
    """The events. Replays and drawings read the session's own state only: they run beside
    generation (its "gpu" lane) in lanes of their own, several at a time, so a slow one never
    queues the others."""
    private = dict(api_visibility="private")
    replay_lane = dict(concurrency_id="replay", concurrency_limit=2, **private)
    view_lane = dict(concurrency_id="view", concurrency_limit=4, **private)
    family, prompt, third = request.family, request.prompt, request.third
    family.input(family_knobs, family, request.knobs, **private)  # its recommended values and ranges
    family.input(lambda f: gr.Textbox(info=engines.prompt_info(f)), family, prompt, **private)  # its styles
    third.change(third_column, third, [results.third_column, results.third_title], **private)
    request.randomize.click(lambda: str(np.random.default_rng().integers(0, 2**63)), None, request.seed, **private)
    generation = dict(
        fn=generate_endpoint(),
        inputs=[prompt, request.seed, family, third, *request.knobs],
        outputs=[*results.outputs, rounds.info, state],  # the round line follows the runs as they stream
        concurrency_id="gpu",
        concurrency_limit=1,
    )
    chosen = [state, rounds.run_pick, rounds.slider]
    show = dict(fn=show_round, inputs=[*chosen, rounds.opacity, rounds.layers, rounds.clicked], outputs=rounds.outputs)
    after = dict(fn=after_generate, inputs=state, outputs=[rounds.run_pick, rounds.slider, rounds.latency,
                                                           rounds.clicked])  # fmt: skip
    gen = request.run.click(**generation, api_name="generate")
    gen.success(**after, **view_lane).then(**show, **view_lane)
    example = request.examples.load_input_event.then(**generation, **private)
    example.success(**after, **view_lane).then(**show, **view_lane)
    request.stop.click(None, cancels=[gen, example], **private)
    loaded = replay.load.click(load_trace, [replay.upload, replay.example], [replay.image, replay.summary, state],
                               **replay_lane)  # fmt: skip
    loaded.success(**after, **view_lane).then(**show, **view_lane)
    redraw = dict(show, show_progress="hidden", **view_lane)
    rounds.slider.change(**redraw)
    rounds.opacity.release(**redraw)
    rounds.layers.change(**redraw)
    picked = rounds.run_pick.input(pick_run, [state, rounds.run_pick], [rounds.slider, rounds.clicked], **view_lane)
    picked.then(**redraw)
    step = [rounds.slider, state, rounds.run_pick]
    rounds.prev_btn.click(lambda i, s, lab: step_round(i, -1, s, lab), step, rounds.slider, **private)
    rounds.next_btn.click(lambda i, s, lab: step_round(i, 1, s, lab), step, rounds.slider, **private)
    rounds.play_btn.click(play_rounds, [state, rounds.run_pick], rounds.slider, **private)
    rounds.tokens.select(token_info, [*chosen, rounds.layers], [rounds.token_md, rounds.tokens, rounds.clicked],
                         **view_lane)  # fmt: skip
    rounds.fig_btn.click(export_figure, chosen, rounds.export, **view_lane)
    rounds.gif_btn.click(export_gif, [state, rounds.run_pick], rounds.export, **view_lane)


def third_column(choice):
    """The third column shows only when a baseline is chosen, titled with its name."""
    label = next((name for name, value in baseline_choices() if value == choice), str(choice))
    return gr.Column(visible=choice not in (None, "none")), f"**{label}**"


LAUNCH_KW = dict(
    theme=gr.themes.Soft(),
    footer_links=["api", "settings"],
    max_file_size=MAX_TRACE_BYTES,  # uploads are trace files; larger ones are refused before they land
    enable_monitoring=False,  # /monitoring/* would show every request's timings to anyone
    state_session_capacity=200,  # sessions kept in memory at most (each holds its runs' pictures)
)


def warm_up() -> None:
    """Run the first example once at start, in the background: its result is then cached (the
    first visitor's click shows it at once) and the pass costs that price a request's cost
    speed-up are timed before anyone waits for them (~9 s of timing on a 2-core CPU, once)."""
    try:
        for _ in generate(EXAMPLE_PROMPTS[0], 0):
            pass
    except gr.Error as exc:  # the default family cannot run the example: nothing to warm
        logging.getLogger(__name__).warning("warm-up skipped: %s", exc)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", "7860")))
    parser.add_argument("--queue-size", type=int, default=32, help="waiting requests beyond this are turned away")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    exit_on_ctrl_c()  # whatever the main thread is doing then (mulo.ui.shutdown)
    TORCH.claim()  # this thread runs all of the app's torch work (mulo.ui.torch_thread says why)
    engines.engine_for(engines.DEFAULT_FAMILY)  # load at start (on ZeroGPU: on CUDA at import, as it asks)
    threading.Thread(target=warm_up, daemon=True, name="warm-up").start()
    demo = build_demo().queue(max_size=args.queue_size)
    demo.launch(server_name=args.host, server_port=args.port, allowed_paths=[str(OUT_DIR)], prevent_thread_lock=True,
                **LAUNCH_KW)  # fmt: skip
    try:
        TORCH.serve(threading.Event())  # until Ctrl-C
    except KeyboardInterrupt:
        demo.close()  # if closing hangs, the watchdog ends the process
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        # Skip the interpreter's exit: a library's thread that it would join, or a native
        # destructor, could hang it, and once it runs no daemon thread (the watchdog) runs either
        os._exit(0)


if __name__ == "__main__":
    main()
