"""A corpus of hostile trace files, and a server-side measurement of what each one costs.

``corpus(base)`` turns one real trace (its JSON dict) into files that each break one rule: sizes
beyond every bound, values outside their range, markup, bombs for the JSON parser. Each entry
names the message the app must answer with. ``python -m tests.hostile_traces DIR`` replays every
file of ``DIR`` through the app's handler in a fresh process that has loaded the toy family
(like a server) and prints, per file, the peak memory it added (resident set, from
``/proc/self/status`` after resetting the peak) and the seconds it took.
"""

from __future__ import annotations

import copy
import json
import sys
import time
from pathlib import Path

from mulo.tracefile import MAX_TRACE_BYTES


def _with(base: dict, **changes) -> dict:
    data = copy.deepcopy(base)
    data.update(changes)
    return data


def _round_with(base: dict, **changes) -> dict:
    """``base`` with fields of its first round changed."""
    data = copy.deepcopy(base)
    data["rounds"][0].update(changes)
    return data


def _grid(h: int, w: int, value=0) -> list:
    return [[value] * w for _ in range(h)]


def _sparse(shape, fill, at, values) -> dict:
    return {"shape": shape, "fill": fill, "at": at, "values": values}


def _tree(**changes) -> dict:
    """An EAGLE-2 draft tree (root at raster position 2, a path of two nodes and a sibling)."""
    tree = {"root": 2, "token": [1, 4, 2], "parent": [-1, 0, 0], "depth": [1, 2, 2], "q": [0.6, 0.3, 0.2]}
    tree.update(status=[1, 2, 0], next=3)
    tree.update(changes)
    return tree


def _max_valid(base: dict) -> str:
    """The heaviest trace the app accepts: a 64x64 grid (the largest), as many rounds as fit
    under the size limit, of a family this server has not loaded (pictures as code colours)."""
    h = w = 64
    rnd = copy.deepcopy(base["rounds"][0])
    rnd.update(
        draft=_grid(h, w, 5), accepted=_grid(h, w, 1), rejected=_grid(h, w), reopened=_grid(h, w),
        islands=_grid(h, w), score=_grid(h, w, 0.5), resampled=_grid(h, w), tokens=_grid(h, w, 7), t0=None,
        low_draft=None,
    )  # fmt: skip
    one = len(json.dumps(rnd, separators=(",", ":")))
    n = (MAX_TRACE_BYTES - 200_000) // one
    rounds = [dict(rnd, index=i, t0=i) for i in range(n)]
    data = _with(base, family="tar-7b-1024", grid=[h, w], tokens=_grid(h, w, 7), rounds=rounds)
    return json.dumps(data, separators=(",", ":"))


def corpus(base: dict) -> dict[str, tuple[str | bytes, str]]:
    """name -> (file content, regex the app's error message must match; "" = it must load)."""
    dump = lambda d: json.dumps(d, separators=(",", ":"))  # noqa: E731
    limit = MAX_TRACE_BYTES
    out = {
        "valid_toy": (dump(base), ""),
        "wide_grid_1x1024": (dump(_with(base, grid=[1, 1024], tokens=_grid(1, 1024))), "maximum of 64.*at grid/1"),
        "wide_grid_1x4096": (dump(_with(base, grid=[1, 4096], tokens=_grid(1, 4096))), "maximum of 64.*at grid/1"),
        "800_rounds": (
            dump(_with(base, rounds=[dict(base["rounds"][0], index=i) for i in range(800)])),
            "800 rounds for 64 tokens",
        ),
        "token_beyond_codebook": (
            dump(_with(base, tokens=_grid(8, 8, 10**6))),
            r"tokens has values outside \[0, 127\]",
        ),
        "t0_1e6": (dump(_round_with(base, t0=10**6)), r"maximum of 4096 \(at rounds/0/t0\)"),
        "t0_outside_grid": (dump(_round_with(base, t0=64)), "t0 = 64 is outside the 8x8 grid"),
        "config_empty": (
            dump(_with(base, config={})),
            "config lacks cfg, temperature, top_k, top_p, r, tau, k, radius",
        ),
        "config_bad_value": (dump(_with(base, config=dict(base["config"], cfg="abc"))), "config: cfg must be a number"),
        "rounds_empty": (dump(_with(base, rounds=[])), r"should be non-empty.*at rounds"),
        "negative_islands": (dump(_round_with(base, islands=_grid(8, 8, -3))), r"islands has values outside \[0, 64\]"),
        "latency_nan": (dump(base).replace('"latency_s":', '"latency_s":NaN,"x":', 1), "NaN is not a number"),
        "latency_inf": (dump(base).replace('"latency_s":', '"latency_s":1e400,"x":', 1), "greater than the maximum"),
        "score_huge": (dump(_round_with(base, score=_grid(8, 8, 1e300))), "score has values outside"),
        "mask_float": (dump(_round_with(base, accepted=_grid(8, 8, 0.5))), "accepted must hold integers"),
        "grid_strings": (dump(_round_with(base, tokens=_grid(8, 8, "7"))), "tokens must hold integers"),
        "grid_bigint": (dump(_with(base, tokens=_grid(8, 8, 10**400))), "tokens must hold integers"),
        "grid_ragged": (dump(_round_with(base, draft=[[1] * 8] * 7 + [[1] * 5])), "draft is not a grid of numbers"),
        "grid_wrong_shape": (dump(_with(base, tokens=_grid(4, 4))), "tokens is not a 8x8 grid"),
        "low_draft_too_big": (dump(_round_with(base, low_draft=_grid(9, 9))), "low_draft is larger than the 8x8 grid"),
        "round_index": (dump(_round_with(base, index=5)), "rounds/0 has index 5"),
        "tree_valid": (dump(_round_with(base, tree=_tree())), ""),
        "tree_parent_later": (
            dump(_round_with(base, tree=_tree(parent=[-1, 2, 0]))),
            "tree/parent/1 must be -1 or an earlier node",
        ),
        "tree_depth_skips": (dump(_round_with(base, tree=_tree(depth=[1, 3, 2]))), "tree/depth/1 does not follow"),
        "tree_off_grid": (dump(_round_with(base, tree=_tree(root=62))), "tree/depth/1 does not follow its parent on"),
        "tree_token_beyond_codebook": (dump(_round_with(base, tree=_tree(token=[1, 500, 2]))), "token/1 is outside"),
        "tree_two_paths": (
            dump(_round_with(base, tree=_tree(parent=[-1, -1, 0], depth=[1, 1, 2], status=[1, 1, 0]))),
            "accepted nodes are not one path",
        ),
        "tree_ragged": (dump(_round_with(base, tree=_tree(q=[0.5]))), "one entry per node"),
        "tree_huge": (
            dump(_round_with(base, tree=_tree(token=[1] * 5000, parent=[-1] * 5000, depth=[1] * 5000))),
            r"too long \(at most 255\)",
        ),
        "tree_bad_status": (dump(_round_with(base, tree=_tree(status=[1, 7, 0]))), r"7 is not one of"),
        "lone_surrogate": (dump(_with(base, prompt="red \ud800 apple")), "prompt is not valid text"),
        "long_prompt": (dump(_with(base, prompt="x" * 100_000)), r"too long \(at most 2048\) \(at prompt\)"),
        "many_warnings": (dump(_with(base, warnings=["w"] * 5000)), r"too long \(at most 64\) \(at warnings\)"),
        "bad_method": (dump(_with(base, method="<b>x</b>")), "is not one of.*at method"),
        "not_an_object": ("[1, 2, 3]", "the JSON is not an object"),
        "not_json": ("{nope", "invalid JSON"),
        "not_utf8": (b"\xff\xfe{}" * 10, "not UTF-8"),
        "too_large": (b" " * (limit + 1), "limited to 10 MB"),
        "list_bomb": ('{"x":[' + "[]," * (limit // 3 - 10) + "[]]}", "far more nested lists"),
        "deep_nesting": ('{"x":' + "[" * 100_000 + "]" * 100_000 + "}", "nested lists|nested too deeply"),
        "dense_lists": ('{"x":[' + "[1,1,1,1,1]," * (limit // 12 - 10) + "[1]]}", "'method' is a required property"),
        "floats": ('{"x":[' + "0.5," * (limit // 4 - 10) + "1]}", "'method' is a required property"),
        "max_valid_64x64": (_max_valid(base), ""),
        "sparse_valid": (dump(_round_with(base, draft=_sparse([8, 8], -1, [3, 9], [5, 6]))), ""),
        "sparse_at_outside": (
            dump(_round_with(base, draft=_sparse([8, 8], -1, [64], [5]))),
            "'at' must list distinct cells of the 8x8 grid",
        ),
        "sparse_at_twice": (
            dump(_round_with(base, draft=_sparse([8, 8], -1, [3, 3], [5, 6]))),
            "'at' must list distinct cells",
        ),
        "sparse_lengths": (dump(_round_with(base, draft=_sparse([8, 8], -1, [3], []))), "the same length"),
        "sparse_value_range": (
            dump(_round_with(base, accepted=_sparse([8, 8], 0, [3], [7]))),
            r"accepted has values outside \[0, 1\]",
        ),
        "sparse_fill_range": (dump(_with(base, tokens=_sparse([8, 8], 10**6, [], []))), "tokens has values outside"),
        "sparse_wrong_shape": (dump(_round_with(base, score=_sparse([4, 4], -1.0, [], []))), "score is not a 8x8 grid"),
        "sparse_shape_huge": (
            dump(_round_with(base, draft=_sparse([10**6, 10**6], -1, [], []))),
            r"maximum of 64 \(at rounds/0/draft",
        ),
        "sparse_extra_key": (dump(_round_with(base, draft=dict(_sparse([8, 8], -1, [], []), x=1))), "rounds/0/draft"),
    }
    return out


def _rss_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # Linux: the peak (VmHWM) restarts at the current size


def measure(folder: Path) -> list[dict]:
    """Replay every file of ``folder`` through ``handlers.load_trace`` on a server-like process; for
    files that load, also draw the last round and export the GIF. Per file: the error message
    ("" when it loaded), the seconds of each request and the peak memory they added (MB)."""
    import gradio as gr

    from mulo.ui import engines, handlers

    engines.engine_for("toy")  # a server has its families loaded
    warm = folder / "valid_toy.json"
    for _ in range(2):  # the first calls import and allocate what every later call reuses
        try:
            state = handlers.load_trace(str(warm), None)[2]
            handlers.show_round(state, next(iter(state["views"])), 0, 0.5, ["accepted"])
        except gr.Error:
            pass
    rows = []
    for path in sorted(folder.glob("*.json")):
        base, message, seconds = _rss_mb("VmRSS"), "", []  # seconds of each request: load, draw, GIF
        _reset_peak()
        try:
            start = time.perf_counter()
            _, _, state = handlers.load_trace(str(path), None)
            seconds.append(time.perf_counter() - start)
            label = next(iter(state["views"]))
            rounds = len(state["views"][label].trace.rounds)
            start = time.perf_counter()
            handlers.show_round(state, label, rounds, 0.5, ["accepted", "rejected", "reopened", "t0"])  # the last
            seconds.append(time.perf_counter() - start)
            start = time.perf_counter()
            handlers.export_gif(state, label)
        except gr.Error as exc:
            message = str(exc)
        seconds.append(time.perf_counter() - start)
        rows.append({"name": path.stem, "message": message, "seconds": seconds, "peak_mb": _rss_mb("VmHWM") - base})
    return rows


if __name__ == "__main__":
    print(json.dumps(measure(Path(sys.argv[1]))))
