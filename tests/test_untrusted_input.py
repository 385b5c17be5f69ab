"""Untrusted input to the app: hostile trace files, markup, disk and memory that stay bounded."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time

import gradio as gr
import numpy as np
import pytest

import app
from mulo.trace import grid_json
from mulo.tracefile import MAX_GRID_SIDE, MAX_TRACE_BYTES, MAX_VOCAB, load_trace, parse
from mulo.ui import files as ui_files
from mulo.ui import handlers, viz
from mulo.ui.markdown import plain
from mulo.ui.tempfiles import TempFiles
from mulo.ui.views import replay_view
from tests.helpers import REPO
from tests.hostile_traces import corpus


@pytest.fixture(scope="module")
def base_trace(engine) -> dict:
    return engine.generate("red apple", "mulo", 0, {"tau": 0.3}).trace.to_dict()


@pytest.mark.slow  # ~30 s, and its 2 s bar wants a quiet machine
def test_hostile_traces_cost_under_200_mb_and_2_s_and_say_what_is_wrong(base_trace, tmp_path):
    files = corpus(base_trace)
    for name, (content, _) in files.items():
        data = content if isinstance(content, bytes) else content.encode("utf-8", "surrogatepass")
        (tmp_path / f"{name}.json").write_bytes(data)
    env = {**os.environ, "PYTHONPATH": str(REPO), "MULO_FAMILY": "toy"}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.hostile_traces", str(tmp_path)],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {row["name"]: row for row in json.loads(proc.stdout.splitlines()[-1])}
    assert set(rows) == set(files)
    report = "\n".join(f"{r['name']}: {r['seconds']} s, {r['peak_mb']:.0f} MB, {r['message']}" for r in rows.values())
    print(report)  # the measured cost of every file (pytest -s shows it)
    for name, (_, pattern) in files.items():
        row = rows[name]
        if pattern:
            assert re.search(pattern, row["message"]), f"{name}: {row['message']}"
        else:
            assert row["message"] == "", f"{name} must load: {row['message']}"
        assert row["peak_mb"] < 200, f"{name} cost {row['peak_mb']:.0f} MB"
        assert max(row["seconds"]) < 2.0, f"{name} took {row['seconds']} s"


def test_trace_bounds_cover_every_family(toy):
    from mulo import families
    from mulo.families import ASSETS_ROOT, DEFAULT_FAMILY, tar

    assert max(toy.grid) <= MAX_GRID_SIDE and toy.vocab_size <= MAX_VOCAB
    # Tar's image tokenizer is LlamaGen's VQ-16 (vq_ds16_t2i.pt): 16x down-sampling, 16384 codes
    assert max(res // 16 for res in tar.RATIOS) <= MAX_GRID_SIDE and MAX_VOCAB >= 16384
    shipped = [name for name in families.trained() if (ASSETS_ROOT / name / "target.json").exists()]
    assert DEFAULT_FAMILY in shipped
    for name in shipped:
        config = json.loads((ASSETS_ROOT / name / "target.json").read_text())  # square, max_seq_len tokens
        assert config["max_seq_len"] <= MAX_GRID_SIDE**2 and config["vocab_size"] <= MAX_VOCAB
        side = math.isqrt(config["max_seq_len"])
        # The longest trace the family can write: a round per token. Up to 16x16 every grid of
        # every round may be random; at 32x32 a round's masks and scores cover the few tokens it
        # proposed (sparse form) and only its canvas is every token: scenes' 2,048 codes make that 6.7 MB
        longest = json.dumps(_sd_like(config["vocab_size"], side, side * side, every_grid_random=side <= 16))
        assert len(longest) < MAX_TRACE_BYTES * 0.7, name
        assert len(load_trace(longest).rounds) == side * side


@pytest.mark.slow  # generates real 32x32 traces: ~2 min
@pytest.mark.parametrize("method", ["sd", "sjd", "eagle2"])
def test_a_32x32_trace_of_the_methods_with_most_rounds_fits_the_limit(method):
    """At Tar-512 geometry (32x32 tokens) the token-level methods write a round per few tokens
    (the random toy models accept little: ~800 rounds); their sparse grids keep the file small,
    EAGLE-2's 59-node draft tree per round included."""
    from mulo.engine import Engine
    from mulo.families import toy

    trace = Engine(toy.build(grid=32)).generate("red apple", method, 0).trace
    assert len(trace.rounds) > 500
    text = trace.to_json()
    assert len(text) < MAX_TRACE_BYTES / 2 and load_trace(text).to_dict() == trace.to_dict()


def _sd_like(vocab: int, side: int, rounds: int, every_grid_random: bool = True) -> dict:
    """A trace shaped like SD's on a side x side grid with ``rounds`` rounds (values plausible):
    every grid random, or (``every_grid_random`` False) masks, drafts and scores set only on the
    four tokens a round proposed, as SD writes them (``grid_json``'s sparse form)."""
    rng = np.random.default_rng(0)

    def grid(draw, fill=0):
        """``draw(shape)`` on every cell, or on four proposed cells of a ``fill`` grid."""
        if every_grid_random:
            return draw((side, side)).tolist()
        values = draw(4)
        cells = np.full(side * side, fill, dtype=values.dtype)
        cells[rng.choice(side * side, 4, replace=False)] = values
        return grid_json(cells.reshape(side, side))

    def ints(low, high):
        return lambda shape: rng.integers(low, high, shape)

    rnd = {
        "index": 0, "label": "verify", "t0": 3, "timings_s": {"verify": 0.01}, "nfe": {"target": 1, "drafter": 4},
        "draft": grid(ints(-1, vocab), -1), "accepted": grid(ints(0, 2)), "rejected": grid(ints(0, 2)),
        "reopened": grid(ints(0, 2)), "islands": grid(ints(0, 3)), "resampled": grid(ints(0, 2)),
        "tokens": rng.integers(-1, vocab, (side, side)).tolist(),
        "score": grid(lambda shape: rng.random(shape).round(6)), "low_draft": None,
    }  # fmt: skip
    config = {"cfg": 1.0, "temperature": 1.0, "top_k": 0, "top_p": 0.8}
    return {
        "method": "sd", "family": "twemoji", "prompt": "p", "seed": 0, "config": config, "device": "cpu",
        "dtype": "float32", "versions": {}, "grid": [side, side],
        "tokens": rng.integers(0, vocab, (side, side)).tolist(), "latency_s": 1.0, "timings_s": {},
        "nfe": {"target": rounds, "drafter": 4 * rounds},
        "rounds": [dict(rnd, index=i) for i in range(rounds)],
    }  # fmt: skip


MARKUP = '<img src="https://evil.example/beacon.png"> [CLICK HERE TO LOG IN](https://evil.example) # big *x*'


def test_plain_escapes_every_markup_character():
    text = plain(MARKUP + "\n<form action=x><input></form> www.evil.example `code` &amp;")
    assert "<" not in text and ">" not in text and "\n" not in text
    assert "](" not in text and "[" not in text.replace("\\[", "") and "`" not in text.replace("\\`", "")
    assert "&amp;amp\\;" in text  # an entity in the input stays the literal text "&amp;"
    assert plain("x" * 500, 40).endswith("…") and len(plain("x" * 500, 40)) == 40


def test_markup_in_a_trace_file_is_shown_as_text(base_trace, tmp_path):
    data = dict(base_trace, prompt=MARKUP, warnings=[f"<form>{MARKUP}</form>"], condition_text="<b>bold</b>")
    data["rounds"] = [dict(r, label="<script>x</script>") for r in data["rounds"]]
    path = tmp_path / "markup.json"
    path.write_text(json.dumps(data))
    _, summary, state = handlers.load_trace(str(path), None)
    label = next(iter(state["views"]))
    info = handlers.show_round(state, label, 0, 0.5, ["accepted"])[6]
    for text in (summary, info):
        assert not re.search(r"<(img|form|script|b|a)\b", text) and "](" not in text, text
    assert "&lt;img src\\=&quot;https\\:" in summary and "&lt;script&gt;" in info


def test_round_pictures_of_a_replay_are_drawn_on_demand(base_trace, toy, monkeypatch):
    from mulo.ui import views

    calls = []
    original = views.Painter.__call__
    monkeypatch.setattr(views.Painter, "__call__", lambda self, tokens: calls.append(1) or original(self, tokens))
    view = replay_view(parse(base_trace), toy)
    assert len(calls) == 1  # the final image only
    first = view.canvases[0]
    assert first is view.canvases[0] and len(calls) == 2  # drawn once, then kept
    assert len(view.drafts) == len(view.canvases) == len(base_trace["rounds"])
    with pytest.raises(IndexError):
        view.canvases[len(base_trace["rounds"])]


def test_drawings_are_bounded_by_their_output_size():
    wide = np.zeros((1, 1024, 3), np.uint8)  # a 1x1024 grid: enlarging by its height was 256x
    assert viz.enlarge(wide, 256).shape == (1, 1024, 3)
    assert viz.enlarge(np.zeros((16, 32, 3), np.uint8), 256).shape == (128, 256, 3)
    assert handlers.gif_rounds(1000) == sorted(set(handlers.gif_rounds(1000)))
    assert len(handlers.gif_rounds(1000)) == handlers.MAX_GIF_FRAMES and handlers.gif_rounds(1000)[-1] == 999
    assert handlers.gif_rounds(5) == [0, 1, 2, 3, 4]


def test_temp_files_are_deleted_on_a_schedule(tmp_path):
    files = TempFiles(tmp_path, max_age_s=60, every_s=0)
    old = files.write(b"x", "old.json")
    past = time.time() - 120
    os.utime(os.path.dirname(old), (past, past))
    files.png(np.zeros((4, 4, 3), np.uint8), "new")  # writing sweeps what is older than max_age_s
    assert not os.path.exists(old) and len(list(tmp_path.iterdir())) == 1


def test_a_long_running_app_keeps_its_temp_folder_bounded(tmp_path, monkeypatch):
    files = TempFiles(tmp_path, max_age_s=0, every_s=0)  # every write sweeps whatever came before
    monkeypatch.setattr(ui_files, "FILES", files)
    for seed in range(4):
        final = list(handlers.generate("red apple", seed, "toy"))[-1]
        handlers.export_gif(final[-1], "MuLo-SD")
        assert len(list(tmp_path.iterdir())) <= 1  # only the file just written survives the next write


def test_sessions_files_and_uploads_are_bounded_in_the_app():
    demo = app.build_demo()
    assert demo.delete_cache == (600, 3600)  # gradio's copies of our files
    states = [b for b in demo.blocks.values() if isinstance(b, gr.State)]
    assert states and all(s.time_to_live == handlers.STATE_TTL_S for s in states)
    assert app.LAUNCH_KW["max_file_size"] == MAX_TRACE_BYTES and app.LAUNCH_KW["enable_monitoring"] is False
    assert app.LAUNCH_KW["state_session_capacity"] <= 1000
    lanes = {fn.name: fn.concurrency_id for fn in demo.fns.values()}
    assert lanes["generate"] == "gpu" and lanes["load_trace"] not in ("gpu", lanes["show_round"])


def test_prompts_are_checked_before_any_model_runs(monkeypatch):
    from mulo.engine import Engine

    monkeypatch.setattr(Engine, "stream", lambda *a, **k: pytest.fail("a model ran"))
    for prompt, message in [
        ("red \ud800 apple", "prompt is not valid text"),
        ("red\x00apple", r"control characters \(found U\+0000\)"),
        (None, "prompt is required"),
        (5, "prompt must be a string"),
    ]:
        with pytest.raises(gr.Error, match=message):
            list(handlers.generate(prompt, 0, "toy"))


def test_prompt_truncation_is_reported(engine):
    trace = engine.generate("one two three four five six", "ar", 0).trace
    assert trace.warnings == ["only the first 4 words are used (dropped: five six)"]
