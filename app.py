"""The mulo demo: plain AR and MuLo-SD side by side, every round of speculative decoding visible.

``python app.py [--host H] [--port P]`` serves it (127.0.0.1:7860 by default; ``MULO_FAMILY``
picks the default family); on Hugging Face Spaces the same file is the app. This file is the
layout; the handlers are in ``mulo.ui.handlers``, the pictures in ``mulo.ui.viz``, the runs in ``mulo.ui.views``.
"""

from __future__ import annotations

import argparse
import logging
import os
from types import SimpleNamespace

import gradio as gr
import numpy as np

from mulo.tracefile import MAX_TRACE_BYTES
from mulo.ui import engines
from mulo.ui.files import OUT_DIR, example_traces
from mulo.ui.handlers import (
    STATE_TTL_S,
    after_generate,
    export_figure,
    export_gif,
    generate_endpoint,
    load_trace,
    play_rounds,
    show_round,
    step_round,
    token_info,
)
from mulo.ui.inputs import RawDropdown, RawText, SeedBox
from mulo.ui.knobs import advanced_panel, baselines, default_bounds, default_config, family_knobs
from mulo.ui.text import EXPLAINER, METRICS_LEGEND

EXAMPLE_PROMPTS = ["red apple", "cat face", "rocket", "grinning face", "pizza", "ghost", "sun", "crown"]


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
        gr.Markdown("# mulo: plain AR vs MuLo-SD, every round visible")
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
    """Prompt, seed and buttons; the Advanced accordion: family, third column and every knob."""
    with gr.Row():
        prompt = RawText(
            "red apple",
            label="prompt",
            elem_id="prompt",
            scale=4,
            max_lines=1,
            info=engines.prompt_info(engines.DEFAULT_FAMILY),
        )
        seed = SeedBox("0", label="seed", elem_id="seed", max_lines=1, scale=1, info="integer in [0, 2^63)")
        randomize = gr.Button("🎲 randomize", scale=0)
        run = gr.Button("Generate", variant="primary", scale=0, elem_id="generate")
        stop = gr.Button("Stop", variant="stop", scale=0, elem_id="stop")
    gr.Examples([[p] for p in EXAMPLE_PROMPTS], [prompt], label="examples")
    with gr.Accordion("Advanced", open=False):
        with gr.Row():
            family = RawDropdown(
                list(engines.family_choices()), value=engines.DEFAULT_FAMILY, label="family", info=engines.family_info()
            )
            third = RawDropdown(
                list(baselines()), value="none", label="third column", info="also run a baseline on the same request"
            )
        knobs = advanced_panel(default_config(), *default_bounds())
    return SimpleNamespace(prompt=prompt, seed=seed, randomize=randomize, run=run, stop=stop, family=family,
                           third=third, knobs=knobs)  # fmt: skip


def result_columns() -> SimpleNamespace:
    """AR, MuLo-SD and the third column: image and numbers each; the traces as JSON and files."""
    images, stats = [], []
    with gr.Row(equal_height=True):
        for label, key, title in (("baseline AR", "ar", "AR"), ("MuLo-SD", "mulo", "MuLo-SD"),
                                  ("baseline (third column)", "third", "third")):  # fmt: skip
            with gr.Column():
                images.append(gr.Image(label=label, elem_id=key, format="png", interactive=False, height=280))
                stats.append(gr.Markdown(elem_id=f"stats-{key}", label=f"{title} stats"))
    gr.Markdown(METRICS_LEGEND, elem_id="legend")
    with gr.Accordion("Trace JSON", open=False):
        jsons = [gr.JSON(label="AR trace"), gr.JSON(label="MuLo-SD trace")]
        downloads = gr.File(label="download traces", file_count="multiple", elem_id="downloads")
    return SimpleNamespace(outputs=[*images, *stats, *jsons, downloads])


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
    """The chosen run's rounds: a slider over them, the round's six pictures, a token's history, the
    draft tree, latency plots and exports."""
    gr.Markdown("## Rounds")
    with gr.Row():
        run_pick = gr.Radio([], label="run", elem_id="run-pick")
        opacity = gr.Slider(0, 1, value=0.55, step=0.05, label="overlay opacity")
        every_layer = ["accepted", "rejected", "reopened", "t0"]
        layers = gr.CheckboxGroup(every_layer, value=every_layer, label="layers")
    with gr.Row():
        prev_btn = gr.Button("◀ previous", scale=0)
        slider = gr.Slider(0, 1, value=0, step=1, label="round", elem_id="round", interactive=False)
        next_btn = gr.Button("next ▶", scale=0)
        play_btn = gr.Button("▶ play", scale=0)
    info = gr.Markdown(elem_id="round-info")
    picture = dict(format="png", interactive=False, height=260)
    with gr.Row():
        draft = gr.Image(label="up-sampled draft", **picture)
        tokens = gr.Image(label="acceptance map (tokens): click a token", elem_id="token-map", **picture)
        overlay = gr.Image(label="acceptance over the draft image", **picture)
    with gr.Row():
        islands = gr.Image(label="islands (one colour each)", **picture)
        final = gr.Image(label="round each token became final (dark = early)", **picture)
        canvas = gr.Image(label="canvas after the round", **picture)
    token_md = gr.Markdown("Click a token of the acceptance map to see its history.", elem_id="token-info")
    tree_plot = gr.Plot(label="draft tree of the round (EAGLE-2)", visible=False, elem_id="tree")
    with gr.Row():
        latency = gr.Plot(label="latency by stage")
        timeline = gr.Plot(label="per-round timeline")
    with gr.Row():
        fig_btn = gr.Button("PNG figure of this round")
        gif_btn = gr.Button("GIF of the rounds")
        export = gr.File(label="export", elem_id="export")
    return SimpleNamespace(
        run_pick=run_pick, opacity=opacity, layers=layers, prev_btn=prev_btn, slider=slider, next_btn=next_btn,
        play_btn=play_btn, tokens=tokens, token_md=token_md, latency=latency, fig_btn=fig_btn, gif_btn=gif_btn,
        export=export, outputs=[draft, tokens, overlay, islands, final, canvas, info, timeline, tree_plot],
    )  # fmt: skip


def wire(state, request: SimpleNamespace, results: SimpleNamespace, replay: SimpleNamespace, rounds: SimpleNamespace):
    """The events. Replays and drawings read the session's own state only: they run beside
    generation (its "gpu" lane) in lanes of their own, several at a time, so a slow one never
    queues the others."""
    private = dict(api_visibility="private")
    replay_lane = dict(concurrency_id="replay", concurrency_limit=2, **private)
    view_lane = dict(concurrency_id="view", concurrency_limit=4, **private)
    family, prompt = request.family, request.prompt
    family.input(family_knobs, family, request.knobs, **private)  # its recommended values and ranges
    family.input(lambda f: gr.Textbox(info=engines.prompt_info(f)), family, prompt, **private)  # its styles
    request.randomize.click(lambda: str(np.random.default_rng().integers(0, 2**63)), None, request.seed, **private)
    gen = request.run.click(
        generate_endpoint(),
        [prompt, request.seed, family, request.third, *request.knobs],
        [*results.outputs, state],
        api_name="generate",
        concurrency_id="gpu",
        concurrency_limit=1,
    )
    chosen = [state, rounds.run_pick, rounds.slider]
    show = dict(fn=show_round, inputs=[*chosen, rounds.opacity, rounds.layers], outputs=rounds.outputs)
    after = dict(fn=after_generate, inputs=state, outputs=[rounds.run_pick, rounds.slider, rounds.latency])
    gen.success(**after, **view_lane).then(**show, **view_lane)
    request.stop.click(None, cancels=[gen], **private)
    loaded = replay.load.click(load_trace, [replay.upload, replay.example], [replay.image, replay.summary, state],
                               **replay_lane)  # fmt: skip
    loaded.success(**after, **view_lane).then(**show, **view_lane)
    redraw = dict(show, show_progress="hidden", **view_lane)
    rounds.slider.change(**redraw)
    rounds.opacity.release(**redraw)
    rounds.layers.change(**redraw)
    rounds.run_pick.input(**redraw)
    step = [rounds.slider, state, rounds.run_pick]
    rounds.prev_btn.click(lambda i, s, lab: step_round(i, -1, s, lab), step, rounds.slider, **private)
    rounds.next_btn.click(lambda i, s, lab: step_round(i, 1, s, lab), step, rounds.slider, **private)
    rounds.play_btn.click(play_rounds, [state, rounds.run_pick], rounds.slider, **private)
    rounds.tokens.select(token_info, chosen, rounds.token_md, **view_lane)
    rounds.fig_btn.click(export_figure, chosen, rounds.export, **view_lane)
    rounds.gif_btn.click(export_gif, [state, rounds.run_pick], rounds.export, **view_lane)


LAUNCH_KW = dict(
    theme=gr.themes.Soft(),
    footer_links=["api", "settings"],
    max_file_size=MAX_TRACE_BYTES,  # uploads are trace files; larger ones are refused before they land
    enable_monitoring=False,  # /monitoring/* would show every request's timings to anyone
    state_session_capacity=200,  # sessions kept in memory at most (each holds its runs' pictures)
)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", "7860")))
    parser.add_argument("--queue-size", type=int, default=32, help="waiting requests beyond this are turned away")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    engines.engine_for(engines.DEFAULT_FAMILY)  # load at start (on ZeroGPU: on CUDA at import, as it asks)
    demo = build_demo().queue(max_size=args.queue_size)
    demo.launch(server_name=args.host, server_port=args.port, allowed_paths=[str(OUT_DIR)], **LAUNCH_KW)


if __name__ == "__main__":
    main()
