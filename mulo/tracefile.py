"""Reading trace files, which are untrusted input: bounded JSON parsing, the schema, and ``parse``
that checks every field and builds the ``Trace`` (``mulo.trace``).

Trace files are shared, so a file is data from a stranger: every size is bounded before it
costs memory, every value is checked before anything is drawn, and every problem is one
``TraceError`` naming the field. The bounds are the largest any family produces (a test checks
every family against them).
"""

from __future__ import annotations

import gc
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mulo.config import MAX_TREE_NODES
from mulo.trace import PHASES, Round, Trace

MAX_GRID_SIDE = 64  # tokens per side: Tar at 1024 px (64x64) is the largest grid
MAX_VOCAB = 16384  # codes: LlamaGen's VQ-16 is the largest codebook (the family's own when loaded)
MAX_TEXT = 2048  # characters of any string
MAX_ITEMS = 64  # entries of warnings, versions, config
MAX_NFE = 10**9
PRECISIONS = ("float32", "bfloat16")  # what a pass's layers may run in (a trace's ``precision``)
MAX_SCORE = 1.001  # probabilities and min(1, p/q), with room for float rounding
MAX_TRACE_BYTES = 10 * 2**20  # a file; the app's upload limit too (a shipped family's longest trace: < 7 MB, tested)
# A JSON list costs ~64 bytes of memory for as little as 3 bytes of file ("[],"): a file may hold
# at most one list per this many bytes (a real trace: one per grid row of >= 8 cells, >= 16 bytes).
BYTES_PER_LIST = 12
REQUIRED_CONFIG = ("cfg", "temperature", "top_k", "top_p")  # shown with every trace
REQUIRED_MULO_CONFIG = ("r", "tau", "k", "radius")  # shown with MuLo-SD's rounds


class TraceError(ValueError):
    """A file is not a usable trace; the message names the first problem and where it is."""


@dataclass(frozen=True)
class Bounds:
    """What one trace's values may be: its grid shape and the codebook size."""

    shape: tuple[int, int]
    vocab: int = MAX_VOCAB

    @property
    def cells(self) -> int:
        return self.shape[0] * self.shape[1]


_ROWS = {"type": "array", "minItems": 1, "maxItems": MAX_GRID_SIDE}  # rows; cells are checked with numpy
_CELLS = {"type": "array", "maxItems": MAX_GRID_SIDE**2}  # checked with numpy too
_SPARSE = {  # grid_json's sparse form
    "type": "object",
    "required": ["shape", "fill", "at", "values"],
    "additionalProperties": False,
    "properties": {
        "shape": {
            "type": "array",
            "items": {"type": "integer", "minimum": 1, "maximum": MAX_GRID_SIDE},
            "minItems": 2,
            "maxItems": 2,
        },
        "fill": {"type": "number"},
        "at": _CELLS,
        "values": _CELLS,
    },
}
_GRID = {"anyOf": [_ROWS, _SPARSE]}
_TEXT = {"type": "string", "maxLength": MAX_TEXT}
_SECONDS = {"type": "number", "minimum": 0, "maximum": 1e7}
_TIMINGS = {
    "type": "object",
    "propertyNames": {"enum": list(PHASES)},
    "additionalProperties": _SECONDS,
}
_PRECISION_COUNTS = {  # passes per precision (mulo.wide)
    "type": "object",
    "additionalProperties": False,
    "properties": {name: {"type": "integer", "minimum": 0, "maximum": MAX_NFE} for name in PRECISIONS},
}
_NFE = {
    "type": "object",
    "required": ["target", "drafter"],
    "additionalProperties": False,
    "properties": {
        "target": {"type": "integer", "minimum": 0, "maximum": MAX_NFE},
        "drafter": {"type": "integer", "minimum": 0, "maximum": MAX_NFE},
    },
}
_NODES = {"type": "array", "maxItems": MAX_TREE_NODES, "items": {"type": "integer"}}
_TREE = {
    "type": "object",
    "required": ["root", "token", "parent", "depth", "q", "status", "next"],
    "additionalProperties": False,
    "properties": {
        "root": {"type": "integer", "minimum": 0, "maximum": MAX_GRID_SIDE**2},
        "token": _NODES,
        "parent": _NODES,
        "depth": _NODES,
        "q": {
            "type": "array",
            "maxItems": MAX_TREE_NODES,
            "items": {"type": "number", "minimum": 0, "maximum": MAX_SCORE},
        },
        "status": {"type": "array", "maxItems": MAX_TREE_NODES, "items": {"enum": [0, 1, 2]}},
        "next": {"type": ["integer", "null"]},
        "emptied": {"type": "integer", "minimum": 0, "maximum": MAX_TREE_NODES},
    },
}
_SCALAR = {"type": ["boolean", "integer", "number", "string", "null"], "maxLength": 64}

ROUND_SCHEMA = {
    "type": "object",
    "required": [
        "index",
        "label",
        "draft",
        "accepted",
        "rejected",
        "reopened",
        "islands",
        "t0",
        "score",
        "resampled",
        "tokens",
        "timings_s",
        "nfe",
    ],
    "properties": {
        "index": {"type": "integer", "minimum": 0, "maximum": MAX_GRID_SIDE**2},
        "label": {"type": "string", "maxLength": 64},
        "draft": _GRID,
        "accepted": _GRID,
        "rejected": _GRID,
        "reopened": _GRID,
        "islands": _GRID,
        "t0": {"type": ["integer", "null"], "minimum": 0, "maximum": MAX_GRID_SIDE**2},
        "score": _GRID,
        "resampled": _GRID,
        "tokens": _GRID,
        "low_draft": {"anyOf": [{"type": "null"}, _GRID]},
        "tree": {"anyOf": [{"type": "null"}, _TREE]},
        "coupled": {"anyOf": [{"type": "null"}, _GRID]},
        "timings_s": _TIMINGS,
        "nfe": _NFE,
    },
}

TRACE_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "mulo generation trace",
    "description": "Grid cells are checked by mulo.tracefile.parse (shape, integer or number, range).",
    "type": "object",
    "required": [
        "method",
        "family",
        "prompt",
        "seed",
        "config",
        "device",
        "dtype",
        "versions",
        "grid",
        "tokens",
        "latency_s",
        "timings_s",
        "nfe",
        "rounds",
    ],
    "properties": {
        "schema": {"const": "mulo.trace/1"},
        "method": {"type": "string", "maxLength": 64},  # where the caller names the known methods, one of them
        "family": {"type": "string", "maxLength": 64},
        "prompt": _TEXT,
        "seed": {"type": "integer", "minimum": 0, "maximum": 2**63 - 1},
        "config": {
            "type": "object",
            "maxProperties": MAX_ITEMS,
            "propertyNames": {"maxLength": 64},
            "additionalProperties": _SCALAR,
        },
        "device": {"type": "string", "maxLength": 64},
        "dtype": {"type": "string", "maxLength": 64},
        "versions": {
            "type": "object",
            "maxProperties": MAX_ITEMS,
            "propertyNames": {"maxLength": 64},
            "additionalProperties": {"type": "string", "maxLength": 128},
        },
        "grid": {
            "type": "array",
            "items": {"type": "integer", "minimum": 1, "maximum": MAX_GRID_SIDE},
            "minItems": 2,
            "maxItems": 2,
        },
        "tokens": _GRID,
        "latency_s": _SECONDS,
        "timings_s": _TIMINGS,
        "nfe": _NFE,
        "summary": {"type": "object"},  # recomputed on load, never read
        "rounds": {"type": "array", "minItems": 1, "maxItems": MAX_GRID_SIDE**2, "items": ROUND_SCHEMA},
        "warnings": {"type": "array", "maxItems": MAX_ITEMS, "items": _TEXT},
        "condition_text": {"type": ["string", "null"], "maxLength": MAX_TEXT},
        "chain": {"type": "boolean"},
        "execution": {"type": "string", "maxLength": MAX_TEXT},
        "precision": {
            "type": "object",
            "additionalProperties": False,
            "properties": {role: _PRECISION_COUNTS for role in ("target", "drafter")},
        },
    },
}


def _reject_constant(name: str):
    raise TraceError(f"not a trace: {name} is not a number a trace may hold")


def loads(text: str) -> dict:
    """Parse JSON text of at most ``MAX_TRACE_BYTES`` with bounded memory (no NaN/Infinity)."""
    if len(text) > MAX_TRACE_BYTES:
        raise TraceError(f"not a trace: {len(text) / 2**20:.1f} MB of text, the limit is {_limit_mb()}")
    if text.count("[") + text.count("{") > len(text) // BYTES_PER_LIST + 64:
        raise TraceError("not a trace: far more nested lists than its size allows (a trace's grids have rows)")
    collecting = gc.isenabled()
    gc.disable()  # a million fresh lists would set off the cyclic collector again and again (~2x slower)
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise TraceError(f"not a trace: invalid JSON ({exc.msg} at line {exc.lineno})") from None
    except RecursionError:
        raise TraceError("not a trace: JSON nested too deeply") from None
    finally:
        if collecting:
            gc.enable()
    if not isinstance(data, dict):
        raise TraceError("not a trace: the JSON is not an object")
    return data


def read_json_file(path: str | Path, max_bytes: int = MAX_TRACE_BYTES) -> dict:
    """The JSON object in a file of at most ``max_bytes`` (checked before reading); ``TraceError``."""
    size = Path(path).stat().st_size
    if size > max_bytes:
        raise TraceError(f"the file is {size / 2**20:.1f} MB; trace files are limited to {_limit_mb(max_bytes)}")
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise TraceError("not a trace: the file is not UTF-8 text") from None
    return loads(text)


def read_trace_file(path: str | Path, vocab_size: int | None = None, max_bytes: int = MAX_TRACE_BYTES) -> Trace:
    """Read, bound and validate a trace file; raises ``TraceError`` (or ``OSError``)."""
    return parse(read_json_file(path, max_bytes), vocab_size)


def _limit_mb(limit: int = MAX_TRACE_BYTES) -> str:
    return f"{limit / 2**20:g} MB"


def _round(d: dict, b: Bounds, where: str) -> Round:
    """A round from its JSON form (already schema-checked by ``parse``); every grid is checked
    against the trace's ``Bounds``."""
    cells = b.cells
    return Round(
        index=int(d["index"]),
        label=str(d["label"]),
        t0=None if d["t0"] is None else int(d["t0"]),
        draft=_array(d["draft"], f"{where}/draft", b.shape, -1, b.vocab - 1),
        accepted=_array(d["accepted"], f"{where}/accepted", b.shape, 0, 1, np.int8),
        rejected=_array(d["rejected"], f"{where}/rejected", b.shape, 0, 1, np.int8),
        reopened=_array(d["reopened"], f"{where}/reopened", b.shape, 0, 1, np.int8),
        islands=_array(d["islands"], f"{where}/islands", b.shape, 0, cells),
        resampled=_array(d["resampled"], f"{where}/resampled", b.shape, 0, cells),
        tokens=_array(d["tokens"], f"{where}/tokens", b.shape, -1, b.vocab - 1),
        score=_array(d["score"], f"{where}/score", b.shape, -1.0, MAX_SCORE, np.float32, integer=False),
        timings_s={k: float(v) for k, v in d["timings_s"].items()},
        nfe={k: int(v) for k, v in d["nfe"].items()},
        low_draft=None
        if d.get("low_draft") is None
        else _array(d["low_draft"], f"{where}/low_draft", None, -1, b.vocab - 1, max_shape=b.shape),
        tree=None if d.get("tree") is None else _tree(d["tree"], b, f"{where}/tree"),
        coupled=None if d.get("coupled") is None else _array(d["coupled"], f"{where}/coupled", b.shape, 0, 1, np.int8),
    )


def _dense(value: dict, where: str) -> np.ndarray:
    """The rows of ``grid_json``'s sparse form (schema-checked: shape within bounds)."""
    h, w = value["shape"]
    try:
        at, values, fill = np.array(value["at"]), np.array(value["values"]), np.array(value["fill"])
    except (ValueError, TypeError, OverflowError):
        raise TraceError(f"not a trace: {where} is not a grid of numbers") from None
    if at.ndim != 1 or values.ndim != 1 or len(at) != len(values):
        raise TraceError(f"not a trace: {where}: 'at' and 'values' must be lists of the same length")
    if at.size and (at.dtype.kind not in "iu" or at.min() < 0 or at.max() >= h * w or len(np.unique(at)) != len(at)):
        raise TraceError(f"not a trace: {where}: 'at' must list distinct cells of the {h}x{w} grid")
    if values.size and values.dtype.kind not in "biuf":
        raise TraceError(f"not a trace: {where} is not a grid of numbers")
    kind = np.result_type(fill, values) if values.size else fill.dtype
    if kind.kind not in "biuf":
        raise TraceError(f"not a trace: {where} is not a grid of numbers")
    arr = np.full(h * w, fill, dtype=kind)
    arr[at.astype(np.int64)] = values
    return arr.reshape(h, w)


def _array(value, where, shape, low, high, dtype=np.int64, integer=True, max_shape=None) -> np.ndarray:
    """A JSON grid (rows or the sparse form) as a numpy array after checking shape, kind and range
    (memory: the input's, or the grid's)."""
    if isinstance(value, dict):
        arr = _dense(value, where)
    else:
        try:
            arr = np.array(value)
        except (ValueError, TypeError, OverflowError):
            arr = None
    if arr is None or arr.ndim != 2:
        raise TraceError(f"not a trace: {where} is not a grid of numbers")
    if shape is not None and arr.shape != tuple(shape):
        h, w = shape
        raise TraceError(f"not a trace: {where} is not a {h}x{w} grid (it is {arr.shape[0]}x{arr.shape[1]})")
    if max_shape is not None and (arr.shape[0] > max_shape[0] or arr.shape[1] > max_shape[1]):
        raise TraceError(f"not a trace: {where} is larger than the {max_shape[0]}x{max_shape[1]} grid")
    kinds = "biu" if integer else "biuf"
    if arr.dtype.kind not in kinds:
        raise TraceError(f"not a trace: {where} must hold {'integers' if integer else 'numbers'}")
    if arr.size and not (np.isfinite(arr).all() and arr.min() >= low and arr.max() <= high):
        raise TraceError(f"not a trace: {where} has values outside [{low}, {high}]")
    return arr.astype(dtype)


def _tree(tree: dict, b: Bounds, where: str) -> dict:
    """An EAGLE-2 tree (schema-checked) whose nodes form a tree on the grid: parents before
    children, depths one more than the parent's, tokens in the codebook, accepted nodes a path."""
    n = len(tree["token"])
    if any(len(tree[k]) != n for k in ("parent", "depth", "q", "status")):
        raise TraceError(f"not a trace: {where}: token, parent, depth, q and status must have one entry per node")
    for j in range(n):
        parent, depth = tree["parent"][j], tree["depth"][j]
        if not -1 <= parent < j:
            raise TraceError(f"not a trace: {where}/parent/{j} must be -1 or an earlier node")
        if depth != (1 if parent < 0 else tree["depth"][parent] + 1) or tree["root"] + depth >= b.cells:
            raise TraceError(f"not a trace: {where}/depth/{j} does not follow its parent on the grid")
        if not 0 <= tree["token"][j] < b.vocab:
            raise TraceError(f"not a trace: {where}/token/{j} is outside the codebook")
        if tree["status"][j] == 1 and parent >= 0 and tree["status"][parent] != 1:
            raise TraceError(f"not a trace: {where}/status/{j}: an accepted node under an unaccepted parent")
    accepted_depths = [d for d, st in zip(tree["depth"], tree["status"], strict=True) if st == 1]
    if sorted(accepted_depths) != list(range(1, len(accepted_depths) + 1)):
        raise TraceError(f"not a trace: {where}: the accepted nodes are not one path from the root")
    if tree["next"] is not None and not 0 <= tree["next"] < b.vocab:
        raise TraceError(f"not a trace: {where}/next is outside the codebook")
    return {k: list(v) if isinstance(v, list) else v for k, v in tree.items()}


def _text(value: str, where: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise TraceError(f"not a trace: {where} is not valid text (unpaired surrogate)") from None
    return value


def _check_config(config: dict, method: str, bounds: Bounds) -> None:
    """The knobs a trace shows must be present, and every known knob must be a valid value."""
    from mulo.config import ConfigError, GenerationConfig, knob_keys, validate

    required = REQUIRED_CONFIG + (REQUIRED_MULO_CONFIG if method == "mulo" else ())
    missing = [k for k in required if k not in config]
    if missing:
        raise TraceError(f"not a trace: config lacks {', '.join(missing)}")
    keys = knob_keys()  # "cfg", as every trace writes it
    known = {k: v for k, v in config.items() if k in keys}
    try:  # knobs a later version added are filled in with today's defaults
        knobs = GenerationConfig.from_dict(known)
        validate(knobs, vocab_size=bounds.vocab, grid=bounds.shape if method == "mulo" else None)
    except (ConfigError, TypeError) as exc:
        raise TraceError(f"not a trace: config: {exc}") from None
    for key, value in config.items():
        if isinstance(value, str):
            _text(value, f"config/{key}")


# Traces written before a trace recorded ``chain`` (the field is optional): the chain methods then,
# and the built-in ones since (a trace written by hand may leave the field out too).
CHAIN_METHODS_BEFORE_THE_FIELD = ("sjd", "sd", "lantern", "eagle2", "lantern_chain", "mc-sjd", "gsd")


def trace_schema(methods: Iterable[str] | None = None) -> dict:
    """The JSON schema of a trace file; with ``methods`` (e.g. ``mulo.methods.names()``, the
    registered ones) the method must be one of them. This module sits below the method registry,
    so the caller that knows the methods names them."""
    if methods is None:
        return TRACE_SCHEMA
    properties = dict(TRACE_SCHEMA["properties"], method={"enum": list(methods)})
    return dict(TRACE_SCHEMA, properties=properties)


def validate(data: dict, vocab_size: int | None = None, methods: Iterable[str] | None = None) -> None:
    """Raise ``TraceError`` (a ``ValueError``) naming the first problem if ``data`` is not a trace."""
    parse(data, vocab_size, methods)


def parse(data: dict, vocab_size: int | None = None, methods: Iterable[str] | None = None) -> Trace:
    """Validate parsed JSON field by field (sizes first, then values) and build the ``Trace``.

    ``vocab_size``: the codebook of the trace's family when it is loaded (else ``MAX_VOCAB``);
    ``methods``: the method names a caller can show (else any name)."""
    import jsonschema

    if not isinstance(data, dict):
        raise TraceError("not a trace: the JSON is not an object")
    grid = data.get("grid")
    rounds = data.get("rounds")
    shape_ok = isinstance(grid, list) and len(grid) == 2 and all(type(x) is int and x >= 1 for x in grid)
    if shape_ok and isinstance(rounds, list) and len(rounds) > grid[0] * grid[1]:  # before validating them
        raise TraceError(f"not a trace: {len(rounds)} rounds for {grid[0] * grid[1]} tokens (each round commits one)")
    try:
        jsonschema.validate(data, trace_schema(methods))
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "top level"
        if exc.validator in ("maxLength", "maxItems", "maxProperties"):  # the message would quote it all
            message = f"too long (at most {exc.validator_value})"
        else:
            message = exc.message if len(exc.message) < 200 else exc.message[:200] + "..."
        raise TraceError(f"not a trace: {message} (at {where})") from None
    bounds = Bounds(tuple(grid), min(vocab_size or MAX_VOCAB, MAX_VOCAB))
    for name in ("prompt", "family", "device", "dtype", "condition_text", "execution"):
        if isinstance(data.get(name), str):
            _text(data[name], name)
    for i, warning in enumerate(data.get("warnings", [])):
        _text(warning, f"warnings/{i}")
    _check_config(data["config"], data["method"], bounds)
    parsed_rounds = []
    for i, r in enumerate(rounds):
        if r["index"] != i:
            raise TraceError(f"not a trace: rounds/{i} has index {r['index']}")
        if r["t0"] is not None and r["t0"] >= bounds.cells:
            raise TraceError(f"not a trace: rounds/{i}/t0 = {r['t0']} is outside the {grid[0]}x{grid[1]} grid")
        parsed_rounds.append(_round(r, bounds, f"rounds/{i}"))
    return Trace(
        method=data["method"],
        family=data["family"],
        prompt=data["prompt"],
        seed=data["seed"],
        config=dict(data["config"]),
        device=data["device"],
        dtype=data["dtype"],
        versions=dict(data["versions"]),
        grid=tuple(grid),
        tokens=_array(data["tokens"], "tokens", bounds.shape, 0, bounds.vocab - 1),
        latency_s=float(data["latency_s"]),
        timings_s={k: float(v) for k, v in data["timings_s"].items()},
        nfe={k: int(v) for k, v in data["nfe"].items()},
        rounds=parsed_rounds,
        warnings=list(data.get("warnings", [])),
        condition_text=data.get("condition_text"),
        chain=data.get("chain", data["method"] in CHAIN_METHODS_BEFORE_THE_FIELD),
        execution=data.get("execution", "eager"),  # traces from before graphed passes: all eager
        precision={role: dict(counts) for role, counts in data.get("precision", {}).items()},
    )


def load_trace(text_or_path: str | Path, vocab_size: int | None = None) -> Trace:
    """A trace from JSON text or a file (at most ``MAX_TRACE_BYTES``), validated; raises ``TraceError``.
    The one way back from a trace's JSON (``Trace`` is a plain record: it writes, this reads)."""
    text = str(text_or_path)
    if not text.lstrip().startswith("{"):
        return read_trace_file(text_or_path, vocab_size=vocab_size)
    return parse(loads(text), vocab_size)
