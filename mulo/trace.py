"""What a generation did, round by round: the record the app, the benchmark and tests read.

A ``Round`` is one step of a method that is worth looking at: one draft/verify/resample block of
MuLo-SD, one verification of SD/LANTERN/SJD, one row of plain AR or ZipAR. Grids are ``[H, W]``
numpy arrays on the target's token grid. A ``Trace`` is one generation: its request, every round,
the final tokens, wall time per phase and forward-pass counts (NFE) per model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

PHASES = ("condition", "drafter", "upsample", "verify", "resample", "downsample", "target", "vq_decode")
# Methods whose rounds each commit an accepted prefix plus one token (vLLM's acceptance length).
CHAIN_METHODS = ("sd", "lantern", "sjd")


def _grid(value, dtype) -> np.ndarray:
    return np.asarray(value, dtype=dtype)


@dataclass
class Round:
    """One round. Masks are 0/1 ``[H, W]`` grids over the target grid.

    draft     proposed draft tokens (-1 where the round proposed nothing)
    accepted  draft tokens that passed the acceptance test
    rejected  draft tokens that failed it (R_T)
    reopened  positions re-opened and resampled by the target (MuLo-SD: R_X, which contains R_T)
    islands   8-connected components of ``reopened``: 0 = none, 1..n
    t0        raster index of the first rejection of the round, or None
    score     per-position number the test compared: MuLo-SD the pooled target probability
              (vs tau), SD/SJD/LANTERN the acceptance probability min(1, p/q); -1 elsewhere
    resampled wave (1-based) in which the position was resampled in this round, 0 = not
    tokens    the canvas after the round: final tokens, -1 where not final yet
    low_draft MuLo-SD's low-resolution draft on the drafter grid (-1 elsewhere), else None
    """

    index: int
    label: str
    draft: np.ndarray
    accepted: np.ndarray
    rejected: np.ndarray
    reopened: np.ndarray
    islands: np.ndarray
    t0: int | None
    score: np.ndarray
    resampled: np.ndarray
    tokens: np.ndarray
    timings_s: dict[str, float] = field(default_factory=dict)
    nfe: dict[str, int] = field(default_factory=lambda: {"target": 0, "drafter": 0})
    low_draft: np.ndarray | None = None

    @classmethod
    def empty(cls, index: int, label: str, shape: tuple[int, int], tokens: np.ndarray) -> Round:
        """A round with no proposals (plain decoding); fill in what applies."""
        zeros = np.zeros(shape, dtype=np.int8)
        return cls(
            index=index,
            label=label,
            draft=np.full(shape, -1, dtype=np.int64),
            accepted=zeros.copy(),
            rejected=zeros.copy(),
            reopened=zeros.copy(),
            islands=np.zeros(shape, dtype=np.int64),
            t0=None,
            score=np.full(shape, -1.0, dtype=np.float32),
            resampled=np.zeros(shape, dtype=np.int64),
            tokens=np.array(tokens, dtype=np.int64, copy=True),
        )

    @property
    def proposed(self) -> int:
        return int((self.draft >= 0).sum())

    @property
    def n_islands(self) -> int:
        return int(self.islands.max()) if self.islands.size else 0

    def to_dict(self) -> dict:
        out = {
            "index": self.index,
            "label": self.label,
            "t0": self.t0,
            "timings_s": dict(self.timings_s),
            "nfe": dict(self.nfe),
            "score": np.round(self.score.astype(np.float64), 6).tolist(),
        }
        for name in ("draft", "accepted", "rejected", "reopened", "islands", "resampled", "tokens"):
            out[name] = getattr(self, name).astype(np.int64).tolist()
        out["low_draft"] = None if self.low_draft is None else self.low_draft.astype(np.int64).tolist()
        return out

    @classmethod
    def from_dict(cls, d: dict) -> Round:
        ints = {n: _grid(d[n], np.int64) for n in ("draft", "islands", "resampled", "tokens")}
        masks = {n: _grid(d[n], np.int8) for n in ("accepted", "rejected", "reopened")}
        low = None if d.get("low_draft") is None else _grid(d["low_draft"], np.int64)
        return cls(
            index=int(d["index"]),
            label=str(d["label"]),
            t0=None if d["t0"] is None else int(d["t0"]),
            score=_grid(d["score"], np.float32),
            timings_s={k: float(v) for k, v in d["timings_s"].items()},
            nfe={k: int(v) for k, v in d["nfe"].items()},
            low_draft=low,
            **ints,
            **masks,
        )


@dataclass
class Trace:
    method: str
    family: str
    prompt: str
    seed: int
    config: dict
    device: str
    dtype: str
    versions: dict[str, str]
    grid: tuple[int, int]
    tokens: np.ndarray
    latency_s: float
    timings_s: dict[str, float]
    nfe: dict[str, int]
    rounds: list[Round]
    warnings: list[str] = field(default_factory=list)  # e.g. prompt words the family does not know
    condition_text: str | None = None  # what was conditioned on instead of the prompt (an alias)

    # -- summary metrics --------------------------------------------------------------------
    def summary(self) -> dict:
        """Headline numbers. Definitions:

        acceptance_rate        accepted draft tokens / proposed draft tokens (None: no drafts)
        mean_accepted_length   SD/LANTERN/SJD: tokens committed per verification round
        tokens_per_target_nfe  image tokens / target forward passes (plain AR: 1)
        reopened_fraction      positions re-opened for resampling / all positions
        """
        n_tokens = int(np.prod(self.grid))
        proposed = sum(r.proposed for r in self.rounds)
        accepted = sum(int(r.accepted.sum()) for r in self.rounds)
        reopened = sum(int(r.reopened.sum()) for r in self.rounds)
        committed, before = [], np.zeros(self.grid, dtype=bool)
        for r in self.rounds:
            final = r.tokens >= 0
            committed.append(int((final & ~before).sum()))
            before = final
        chain = self.method in CHAIN_METHODS and committed
        return {
            "nfe": dict(self.nfe),
            "rounds": len(self.rounds),
            "proposed": proposed,
            "accepted": accepted,
            "acceptance_rate": accepted / proposed if proposed else None,
            "mean_accepted_length": float(np.mean(committed)) if chain else None,
            "tokens_per_target_nfe": n_tokens / self.nfe["target"] if self.nfe.get("target") else None,
            "reopened_fraction": reopened / n_tokens,
            "latency_s": self.latency_s,
            "timings_s": dict(self.timings_s),
        }

    # -- JSON ---------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "schema": "mulo.trace/1",
            "method": self.method,
            "family": self.family,
            "prompt": self.prompt,
            "seed": self.seed,
            "config": dict(self.config),
            "device": self.device,
            "dtype": self.dtype,
            "versions": dict(self.versions),
            "grid": list(self.grid),
            "tokens": self.tokens.astype(np.int64).tolist(),
            "latency_s": self.latency_s,
            "timings_s": dict(self.timings_s),
            "nfe": dict(self.nfe),
            "summary": self.summary(),
            "rounds": [r.to_dict() for r in self.rounds],
            "warnings": list(self.warnings),
            "condition_text": self.condition_text,
        }

    @classmethod
    def from_dict(cls, d: dict) -> Trace:
        validate(d)
        return cls(
            method=d["method"],
            family=d["family"],
            prompt=d["prompt"],
            seed=int(d["seed"]),
            config=dict(d["config"]),
            device=d["device"],
            dtype=d["dtype"],
            versions=dict(d["versions"]),
            grid=tuple(d["grid"]),
            tokens=_grid(d["tokens"], np.int64),
            latency_s=float(d["latency_s"]),
            timings_s={k: float(v) for k, v in d["timings_s"].items()},
            nfe={k: int(v) for k, v in d["nfe"].items()},
            rounds=[Round.from_dict(r) for r in d["rounds"]],
            warnings=list(d.get("warnings", [])),
            condition_text=d.get("condition_text"),
        )

    def to_json(self, path: str | Path | None = None) -> str:
        text = json.dumps(self.to_dict(), separators=(",", ":"))
        if path is not None:
            Path(path).write_text(text)
        return text

    @classmethod
    def from_json(cls, text_or_path: str | Path) -> Trace:
        text = str(text_or_path)
        if not text.lstrip().startswith("{"):
            text = Path(text_or_path).read_text()
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not a trace: invalid JSON ({exc.msg} at line {exc.lineno})") from None
        return cls.from_dict(data)


# -- schema ----------------------------------------------------------------------------------

_INT_GRID = {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}}
_NUM_GRID = {"type": "array", "items": {"type": "array", "items": {"type": "number"}}}
_MASK = {"type": "array", "items": {"type": "array", "items": {"enum": [0, 1]}}}
_TIMINGS = {"type": "object", "additionalProperties": {"type": "number", "minimum": 0}}
_NFE = {
    "type": "object",
    "required": ["target", "drafter"],
    "properties": {"target": {"type": "integer", "minimum": 0}, "drafter": {"type": "integer", "minimum": 0}},
}

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
        "index": {"type": "integer", "minimum": 0},
        "label": {"type": "string"},
        "draft": _INT_GRID,
        "accepted": _MASK,
        "rejected": _MASK,
        "reopened": _MASK,
        "islands": _INT_GRID,
        "t0": {"type": ["integer", "null"], "minimum": 0},
        "score": _NUM_GRID,
        "resampled": _INT_GRID,
        "tokens": _INT_GRID,
        "low_draft": {"anyOf": [{"type": "null"}, _INT_GRID]},
        "timings_s": _TIMINGS,
        "nfe": _NFE,
    },
}

TRACE_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "mulo generation trace",
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
        "method": {"enum": ["ar", "zipar", "sjd", "sd", "lantern", "mulo"]},
        "family": {"type": "string"},
        "prompt": {"type": "string"},
        "seed": {"type": "integer"},
        "config": {"type": "object"},
        "device": {"type": "string"},
        "dtype": {"type": "string"},
        "versions": {"type": "object", "additionalProperties": {"type": "string"}},
        "grid": {"type": "array", "items": {"type": "integer", "minimum": 1}, "minItems": 2, "maxItems": 2},
        "tokens": _INT_GRID,
        "latency_s": {"type": "number", "minimum": 0},
        "timings_s": _TIMINGS,
        "nfe": _NFE,
        "summary": {"type": "object"},
        "rounds": {"type": "array", "items": ROUND_SCHEMA},
        "warnings": {"type": "array", "items": {"type": "string"}},
        "condition_text": {"type": ["string", "null"]},
    },
}


def validate(data: dict) -> None:
    """Raise ``ValueError`` naming the first problem if ``data`` is not a trace."""
    import jsonschema

    try:
        jsonschema.validate(data, TRACE_SCHEMA)
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "top level"
        raise ValueError(f"not a trace: {exc.message} (at {where})") from None
    h, w = data["grid"]
    grids = [("tokens", data["tokens"])] + [
        (f"rounds/{i}/{name}", r[name])
        for i, r in enumerate(data["rounds"])
        for name in ("draft", "accepted", "rejected", "reopened", "islands", "score", "resampled", "tokens")
    ]
    for name, grid in grids:
        if len(grid) != h or any(len(row) != w for row in grid):
            raise ValueError(f"not a trace: {name} is not a {h}x{w} grid")
