"""The mulo demo: plain AR and MuLo-SD side by side, every round of speculative decoding visible.

``python app.py [--host H] [--port P]`` serves it (127.0.0.1:7860 by default; ``MULO_FAMILY``
picks the default family); on Hugging Face Spaces the same file is the app. This file is the
layout; the handlers are in ``mulo.ui.handlers``, the pictures in ``mulo.ui.viz``, the runs in ``mulo.ui.views``.
"""

from __future__ import annotations

import argparse
import logging
import os

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
                        list(engines.FAMILY_CHOICES),
                        value=engines.DEFAULT_FAMILY,
                        label="family",
                        info="twemoji (32x32 tokens), twemoji-64 (16x16): trained by us, run on a CPU; toy: random "
                        "weights (code paths only); tar: the real Tar models (GPU, weights from "
                        "`python -m mulo download tar`)",
                    )
                    third = RawDropdown(
                        list(baselines()),
                        value="none",
                        label="third column",
                        info="also run a baseline on the same request",
                    )
                knobs = advanced_panel(default_config(), *default_bounds())
            with gr.Row(equal_height=True):
                with gr.Column():
                    img_ar = gr.Image(label="baseline AR", elem_id="ar", format="png", interactive=False, height=280)
                    md_ar = gr.Markdown(elem_id="stats-ar", label="AR stats")
                with gr.Column():
                    img_mulo = gr.Image(label="MuLo-SD", elem_id="mulo", format="png", interactive=False, height=280)
                    md_mulo = gr.Markdown(elem_id="stats-mulo", label="MuLo-SD stats")
                with gr.Column():
                    img_third = gr.Image(
                        label="baseline (third column)", elem_id="third", format="png", interactive=False, height=280
                    )
                    md_third = gr.Markdown(elem_id="stats-third", label="third stats")
            gr.Markdown(METRICS_LEGEND, elem_id="legend")
            with gr.Accordion("Trace JSON", open=False):
                json_ar = gr.JSON(label="AR trace")
                json_mulo = gr.JSON(label="MuLo-SD trace")
                downloads = gr.File(label="download traces", file_count="multiple", elem_id="downloads")
        with gr.Tab("Replay a trace"):
            with gr.Row():
                upload = gr.File(label="trace JSON", file_types=[".json"], type="filepath", elem_id="trace-upload")
                example = gr.Dropdown(example_traces(), value=None, label="bundled example traces")
                load = gr.Button("Load", variant="primary", scale=0, elem_id="load")
            with gr.Row():
                img_replay = gr.Image(label="replayed image", format="png", interactive=False, height=280)
                md_replay = gr.Markdown(elem_id="replay-summary")
        gr.Markdown("## Rounds")
        with gr.Row():
            run_pick = gr.Radio([], label="run", elem_id="run-pick")
            opacity = gr.Slider(0, 1, value=0.55, step=0.05, label="overlay opacity")
            layers = gr.CheckboxGroup(
                ["accepted", "rejected", "reopened", "t0"],
                value=["accepted", "rejected", "reopened", "t0"],
                label="layers",
            )
        with gr.Row():
            prev_btn = gr.Button("◀ previous", scale=0)
            round_slider = gr.Slider(0, 1, value=0, step=1, label="round", elem_id="round", interactive=False)
            next_btn = gr.Button("next ▶", scale=0)
            play_btn = gr.Button("▶ play", scale=0)
        round_md = gr.Markdown(elem_id="round-info")
        with gr.Row():
            r_draft = gr.Image(label="up-sampled draft", format="png", interactive=False, height=260)
            r_tokens = gr.Image(label="acceptance map (tokens): click a token", format="png", interactive=False,
                                height=260, elem_id="token-map")  # fmt: skip
            r_overlay = gr.Image(label="acceptance over the draft image", format="png", interactive=False, height=260)
        with gr.Row():
            r_islands = gr.Image(label="islands (one colour each)", format="png", interactive=False, height=260)
            r_final = gr.Image(label="round each token became final (dark = early)", format="png",
                               interactive=False, height=260)  # fmt: skip
            r_canvas = gr.Image(label="canvas after the round", format="png", interactive=False, height=260)
        token_md = gr.Markdown("Click a token of the acceptance map to see its history.", elem_id="token-info")
        tree_plot = gr.Plot(label="draft tree of the round (EAGLE-2)", visible=False, elem_id="tree")
        with gr.Row():
            latency = gr.Plot(label="latency by stage")
            timeline = gr.Plot(label="per-round timeline")
        with gr.Row():
            fig_btn = gr.Button("PNG figure of this round")
            gif_btn = gr.Button("GIF of the rounds")
            export = gr.File(label="export", elem_id="export")

        round_outputs = [r_draft, r_tokens, r_overlay, r_islands, r_final, r_canvas, round_md, timeline, tree_plot]
        private = dict(api_visibility="private")
        # Replays and drawings read the session's own state only: they run beside generation (its
        # "gpu" lane) in lanes of their own, several at a time, so a slow one never queues the others.
        replay_lane = dict(concurrency_id="replay", concurrency_limit=2, **private)
        view_lane = dict(concurrency_id="view", concurrency_limit=4, **private)
        family.input(family_knobs, family, knobs, **private)  # its recommended values and ranges
        family.input(lambda f: gr.Textbox(info=engines.prompt_info(f)), family, prompt, **private)  # its styles
        randomize.click(lambda: str(np.random.default_rng().integers(0, 2**63)), None, seed, **private)
        gen = run.click(
            generate_endpoint(),
            [prompt, seed, family, third, *knobs],
            [img_ar, img_mulo, img_third, md_ar, md_mulo, md_third, json_ar, json_mulo, downloads, state],
            api_name="generate",
            concurrency_id="gpu",
            concurrency_limit=1,
        )
        shown_round = gen.success(after_generate, state, [run_pick, round_slider, latency], **view_lane)
        shown_round.then(show_round, [state, run_pick, round_slider, opacity, layers], round_outputs, **view_lane)
        stop.click(None, cancels=[gen], **private)
        replay = load.click(load_trace, [upload, example], [img_replay, md_replay, state], **replay_lane)
        replay.success(after_generate, state, [run_pick, round_slider, latency], **view_lane).then(
            show_round, [state, run_pick, round_slider, opacity, layers], round_outputs, **view_lane
        )
        redraw = dict(
            fn=show_round,
            inputs=[state, run_pick, round_slider, opacity, layers],
            outputs=round_outputs,
            show_progress="hidden",
            **view_lane,
        )
        round_slider.change(**redraw)
        opacity.release(**redraw)
        layers.change(**redraw)
        run_pick.input(**redraw)
        prev_btn.click(
            lambda i, s, lab: step_round(i, -1, s, lab), [round_slider, state, run_pick], round_slider, **private
        )
        next_btn.click(
            lambda i, s, lab: step_round(i, 1, s, lab), [round_slider, state, run_pick], round_slider, **private
        )
        play_btn.click(play_rounds, [state, run_pick], round_slider, **private)
        r_tokens.select(token_info, [state, run_pick, round_slider], token_md, **view_lane)
        fig_btn.click(export_figure, [state, run_pick, round_slider], export, **view_lane)
        gif_btn.click(export_gif, [state, run_pick], export, **view_lane)
    return demo


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
