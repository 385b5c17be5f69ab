"""The app's handlers as plain Python (toy family: random weights, every code path, fast)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import gradio as gr
import numpy as np
import pytest
from PIL import Image

from mulo.config import knob_table
from mulo.trace import Trace
from mulo.tracefile import parse
from mulo.ui import figures, handlers, viz
from mulo.ui.files import DISPLAY, example_traces
from mulo.ui.knobs import family_knobs
from mulo.ui.text import describe_token


def run(prompt="red apple", seed=0, **knobs):
    handlers.RESULTS.entries.clear()  # every request here runs its models
    updates = list(handlers.generate(prompt, seed, "toy", knobs.pop("third", "none"), **knobs))
    return updates, updates[-1]


@pytest.fixture(scope="module")
def finished():
    return run(third="zipar", tau=0.3)


def test_generate_streams_rounds_then_the_results(finished):
    updates, final = finished
    img_ar, img_mulo, img_third, md_ar, md_mulo, md_third, json_ar, json_mulo, files, line, state = final
    assert len(updates) >= 6  # one update per round of each run, then the final one
    # while streaming, at most one image changes per update (a canvas when one was painted: the
    # first and last round of each run at least) and nothing else is re-sent
    skip = gr.skip()
    for update in updates[:-1]:
        assert sum(isinstance(x, str) for x in update[:3]) <= 1
        assert all(x == skip for x in (*update[3:9], update[10]))
    # the Rounds panel's line follows the runs while they stream
    lines = [update[9] for update in updates[:-1]]
    assert "**AR** running: round 1," in lines[0] and "0 of 3 runs done" in lines[0]
    assert any("**MuLo-SD** finished" in x and "2 of 3 runs done" in x for x in lines)
    assert line == skip
    for column in range(3):
        assert sum(isinstance(u[column], str) for u in updates[:-1]) >= 2
    for path in (img_ar, img_mulo, img_third):
        assert Image.open(path).size == (DISPLAY, DISPLAY)
    assert "wall-clock" in md_mulo and "cost" in md_mulo and "drafts" in md_mulo and "NFE target" in md_third
    assert "tokens differ from AR's" in md_mulo and "tokens differ" not in md_ar
    assert "prompt match: not scored" in md_ar  # the toy family has no scorer
    traces = [parse(json_ar), parse(json_mulo)]
    assert [t.method for t in traces] == ["ar", "mulo"]
    assert traces[1].config["tau"] == 0.3
    assert len(files) == 3 and all(json.loads(Path(f).read_text())["schema"] == "mulo.trace/1" for f in files)
    assert state["order"] == ["AR", "MuLo-SD", "ZipAR"]  # the paper's names


def test_same_request_same_images(finished):
    _, again = run(third="zipar", tau=0.3)
    for a, b in zip(finished[1][:3], again[:3], strict=True):
        assert np.array_equal(np.asarray(Image.open(a)), np.asarray(Image.open(b)))


def test_a_request_made_again_is_answered_at_once_and_priced_the_same(finished):
    """The examples show a result at once once clicked before; the cost speed-up of identical work
    is identical (the pass-cost table is kept), while the wall-clock one is the first run's."""
    _, first = run(third="zipar", tau=0.3)
    updates = list(handlers.generate("red apple", 0, "toy", "zipar", tau=0.3))
    assert len(updates) == 1  # straight to the final update: no model ran
    assert updates[0][3:6] == first[3:6]
    cost = re.search(r"\*\*([0-9.]+)×\*\* cost", first[4]).group(1)
    handlers.RESULTS.entries.clear()  # run it again for real: same passes, same prices
    again = list(handlers.generate("red apple", 0, "toy", "zipar", tau=0.3))[-1]
    assert re.search(r"\*\*([0-9.]+)×\*\* cost", again[4]).group(1) == cost


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"prompt": ""}, "prompt must not be empty"),
        ({"prompt": "x" * 400}, "at most 300 characters"),
        ({"tau": -1.0}, "tau must be"),
        ({"r": 3}, "does not divide|r must be one of"),
        ({"k": 2.5}, "k must be an integer"),
        ({"seed": "abc"}, "seed must be an integer"),
        ({"seed": -4}, "seed must be an integer"),
        ({"third": "eagle"}, "third method must be one of"),
        ({"tree_top_k": 0}, "tree_top_k must be"),
    ],
)
def test_bad_inputs_are_clear_errors_and_the_next_request_works(kwargs, message):
    prompt, seed = kwargs.pop("prompt", "red apple"), kwargs.pop("seed", 0)
    with pytest.raises(gr.Error, match=message):
        run(prompt, seed, **kwargs)
    _, final = run()
    assert final[-1]["views"]["MuLo-SD"].trace is not None


def test_unknown_family_is_an_error():
    with pytest.raises(gr.Error, match="family must be one of"):
        list(handlers.generate("red apple", 0, "nope"))


def test_the_family_menu_lists_only_what_runs_here(tmp_path, monkeypatch):
    import huggingface_hub.constants as hf_constants

    from mulo.ui import engines

    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path))  # no Tar weights here
    listed = engines.menu_families()
    assert "toy" in listed and not any(name.startswith("tar") for name in listed)
    info = engines.family_info()
    assert "not listed, their weights are not on this machine: tar, tar-1.5b-1024" in info
    assert "python -m mulo download tar" in info


def test_tar_without_weights_names_the_download_command(tmp_path, monkeypatch):
    import huggingface_hub.constants as hf_constants

    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(gr.Error, match="python -m mulo download tar --llm 7b --res 1024"):
        list(handlers.generate("red apple", 0, "tar-7b-1024"))
    _, final = run()  # the toy engine still serves
    assert final[-1]["views"]["MuLo-SD"].trace is not None


def test_switching_family_shows_its_defaults_and_codebook_ranges():
    names = [k.key for k in knob_table()]
    toy = dict(zip(names, family_knobs("toy"), strict=True))
    scenes = dict(zip(names, family_knobs("scenes"), strict=True))
    recommended = json.loads((Path(__file__).parents[1] / "assets/scenes/defaults.json").read_text())["cfg"]
    assert recommended != 4.0  # else the switch below could not show it
    assert toy["cfg"]["value"] == 4.0 and scenes["cfg"]["value"] == recommended  # each family's recommendation
    assert scenes["k"]["maximum"] == 256 and scenes["top_k"]["maximum"] == 2048  # k: its own cap; top-k: 2,048 codes
    assert toy["k"]["maximum"] == 127 and toy["top_k"]["maximum"] == 128
    with pytest.raises(gr.Error, match="family must be one of"):
        family_knobs("nope")


def test_rounds_scrub_and_latency(finished):
    state = finished[1][-1]
    pick, slider, latency, clicked = handlers.after_generate(state)
    trace = state["views"]["MuLo-SD"].trace
    # the slider counts rounds from 1, as the round line does ("round 1 / N")
    assert pick.value == "MuLo-SD" and (slider.minimum, slider.value, slider.maximum) == (
        1,
        1,
        max(2, len(trace.rounds)),
    )
    assert latency is not None and clicked is None
    every_layer = ["accepted", "rejected", "reopened", "t0"]
    first = handlers.show_round(state, "MuLo-SD", 1, 0.55, every_layer)  # slider positions count from 1
    last = handlers.show_round(state, "MuLo-SD", len(trace.rounds), 0.55, every_layer)
    assert len(first) == 10 and "round 1 /" in first[6]
    assert first[8].visible is False  # MuLo-SD's rounds have no draft tree
    sizes = {Image.open(p).size for p in (*first[:4], first[5])}
    assert sizes == {(DISPLAY, DISPLAY)}
    # the round each token became final, with its colour bar, shown for a run of several rounds
    assert first[9].visible is True and Image.open(first[4]).size[1] >= DISPLAY
    # different rounds draw different acceptance maps
    assert not np.array_equal(np.asarray(Image.open(first[1])), np.asarray(Image.open(last[1])))
    # a layer switched off disappears: no green left when only 'rejected' is drawn
    only_rejected = np.asarray(Image.open(handlers.show_round(state, "MuLo-SD", 1, 0.55, ["rejected"])[1]))
    green = np.all(only_rejected == viz.hex_rgb(viz.COLORS["accepted"]).astype(np.uint8), axis=-1)
    assert not green.any()
    assert handlers.step_round(1, -1, state, "MuLo-SD") == 1
    assert handlers.step_round(1, 1, state, "MuLo-SD") == 2
    assert handlers.step_round(len(trace.rounds), 1, state, "MuLo-SD") == len(trace.rounds)
    assert list(handlers.play_rounds(state, "MuLo-SD")) == list(range(1, len(trace.rounds) + 1))
    with pytest.raises(gr.Error, match="generate or load a trace first"):
        handlers.show_round(None, "MuLo-SD", 0, 0.5, [])


@pytest.mark.parametrize("method", ["eagle2", "lantern"])
def test_a_tree_method_in_the_third_column_shows_each_rounds_draft_tree(method):
    _, final = run(third=method, tree_budget=12, tree_depth=3, tree_top_k=3)
    state = final[-1]
    label = viz.method_name(method)
    assert state["order"] == ["AR", "MuLo-SD", label]
    trace = state["views"][label].trace
    assert trace.config["tree_budget"] == 12 and all(len(r.tree["token"]) <= 11 for r in trace.rounds)
    assert "tree nodes per round" in final[5] and "tokens per round" in final[5]
    shown = handlers.show_round(state, label, 2, 0.55, ["accepted"])
    assert shown[8].visible is True and "draft tree" in shown[6]
    assert shown[8].value is not None
    exported = handlers.export_figure(state, label, 2)
    assert Path(exported).name.startswith(f"tree-round2-{method}") and Image.open(exported).size[0] > 600
    with pytest.raises(gr.Error, match="tree_depth must be an integer in \\[1, 16\\]"):
        run(third=method, tree_depth=40)


def test_token_history_names_its_rounds(finished):
    trace = finished[1][-1]["views"]["MuLo-SD"].trace
    rejected = [(r, tuple(np.argwhere(r.rejected)[0])) for r in trace.rounds if r.rejected.any()]
    assert rejected, "tau=0.3 on random weights rejects some tokens"
    rnd, (row, col) = rejected[0]
    text = describe_token(trace, int(row), int(col), 0.3)
    assert f"round {rnd.index + 1}" in text and "rejected" in text and "resampled in wave" in text
    assert "pooled target probability" in text and "vs τ 0.3" in text
    sd_trace = Trace(**{**trace.__dict__, "method": "sd"})  # other methods' scores are acceptance probabilities
    sd_text = describe_token(sd_trace, int(row), int(col), 0.3)
    assert "acceptance probability" in sd_text and "τ" not in sd_text


def test_exports_figure_and_gif(finished):
    state = finished[1][-1]
    png = handlers.export_figure(state, "MuLo-SD", 1)
    figure = Image.open(png)
    assert figure.size[0] >= 1600  # slide resolution
    gif = Image.open(handlers.export_gif(state, "MuLo-SD"))
    trace = state["views"]["MuLo-SD"].trace
    # a frame per round, and per resampling wave where a round has several
    planned = len(figures.frame_plan(trace, list(range(len(trace.rounds)))))
    assert gif.n_frames == min(planned, handlers.MAX_GIF_FRAMES) and planned > len(trace.rounds)


def test_replay_a_trace_file_and_reject_other_files(finished, tmp_path):
    trace_file = finished[1][8][1]
    image, summary, state = handlers.load_trace(trace_file, None)
    assert Image.open(image).size == (DISPLAY, DISPLAY) and "mulo" in summary
    view = state["views"]["replay: mulo"]
    original = finished[1][-1]["views"]["MuLo-SD"]
    assert np.array_equal(view.image, original.image)  # same family loaded: decoded identically
    assert len(view.canvases) == len(original.canvases)
    not_json = tmp_path / "x.json"
    not_json.write_text("{nope")
    with pytest.raises(gr.Error, match="not a trace: invalid JSON"):
        handlers.load_trace(str(not_json), None)
    not_trace = tmp_path / "y.json"
    not_trace.write_text(json.dumps({"hello": 1}))
    with pytest.raises(gr.Error, match="not a trace: .method. is a required property"):
        handlers.load_trace(str(not_trace), None)
    with pytest.raises(gr.Error, match="choose a trace file"):
        handlers.load_trace(None, None)


def test_bundled_example_traces_replay():
    names = example_traces()
    assert names, "assets/examples ships example traces"
    for name in names:
        image, summary, state = handlers.load_trace(None, name)
        assert Image.open(image).size[0] >= 64


def test_the_prompt_hint_lists_a_familys_styles(tmp_path, monkeypatch):
    from mulo.ui import engines

    assert engines.prompt_info("toy") == engines.PROMPT_INFO  # one style: the plain hint
    (tmp_path / "emoji-16").mkdir()
    styles = [{"word": "noto", "title": "Noto Emoji", "licence": "Apache-2.0"},
              {"word": "openmoji", "title": "OpenMoji", "licence": "CC-BY-SA-4.0"}]  # fmt: skip
    (tmp_path / "emoji-16" / "styles.json").write_text(json.dumps(styles))
    monkeypatch.setattr(engines, "ASSETS_ROOT", tmp_path)
    assert engines.prompt_info("emoji-16").endswith("(else any style): noto (Noto Emoji), openmoji (OpenMoji)")
    (tmp_path / "emoji-16" / "styles.json").write_text("{not json")
    assert engines.prompt_info("emoji-16") == engines.PROMPT_INFO  # a broken file never breaks the app
    (tmp_path / "scenes").mkdir()  # a scenes family: its grammar, backgrounds and styles
    language = {"names": ["red apple"], "palette": {"blue": [0, 0, 255]}, "max_objects": 3, "styles": ["noto"]}
    (tmp_path / "scenes" / "scenes.json").write_text(json.dumps(language))
    assert engines.prompt_info("scenes") == (
        "1 to 3 emoji and a background, e.g. 'red apple and rocket on blue'; backgrounds: blue; "
        "optionally 'in noto style' (noto)"
    )
    (tmp_path / "scenes" / "scenes.json").write_text("[]")
    assert engines.prompt_info("scenes") == engines.PROMPT_INFO
