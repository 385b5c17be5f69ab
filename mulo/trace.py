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
              (vs tau), SD/SJD/MC-SJD the acceptance probability min(1, p/q), LANTERN min(1, p~/q)
              with the pooled p~ (on a tree q = 1; greedy: 1 or 0), GSD min(1, p(G)/q(G)) over
              the draft's group; -1 elsewhere
    resampled wave (1-based) in which the position was resampled in this round, 0 = not
    tokens    the canvas after the round: final tokens, -1 where not final yet
    low_draft MuLo-SD's low-resolution draft on the drafter grid (-1 elsewhere), else None
    tree      EAGLE-2's draft tree, else None: ``root`` (raster position of the root token) and,
              per node, ``token``, ``parent`` (node index, -1 = the root; parents come first),
              ``depth`` (the node sits at ``root + depth``), ``q`` (drafter probability given
              its parent), ``status`` (0 untried, 1 accepted, 2 rejected); ``next``: the token
              drawn after the accepted path (None when the path completed the image)
    coupled   MC-SJD: 0/1, the window positions after the commit whose draft the coupling kept as
              the next iteration's draft (1) rather than redrawing it (0); None for other methods
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
    tree: dict | None = None
    coupled: np.ndarray | None = None

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
            "score": grid_json(np.round(self.score.astype(np.float64), 6)),
        }
        for name in ("draft", "accepted", "rejected", "reopened", "islands", "resampled", "tokens"):
            out[name] = grid_json(getattr(self, name).astype(np.int64))
        out["low_draft"] = None if self.low_draft is None else grid_json(self.low_draft.astype(np.int64))
        if self.tree is not None:
            out["tree"] = dict(self.tree)
        if self.coupled is not None:
            out["coupled"] = grid_json(self.coupled.astype(np.int64))
        return out


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
    # The method verifies a left-to-right chain of drafts (its registry entry's ``chain``), recorded
    # so a trace reads its own summary without the method registry, which sits above it.
    chain: bool = False
    # How the forward passes ran, per role: "eager", "graphs" (CUDA graphs), or "eager (fallback: why)"
    # when a capture failed ("target: graphs; drafter: eager" when roles differ).
    execution: str = "eager"
    # Per role, forward passes by the precision their layers ran in ({"target": {"float32": 1020,
    # "bfloat16": 4}}): wide passes may run in bfloat16 (mulo.wide). Empty: not recorded (older traces).
    precision: dict[str, dict[str, int]] = field(default_factory=dict)

    # -- summary metrics --------------------------------------------------------------------
    def summary(self) -> dict:
        """Headline numbers. Definitions:

        acceptance_rate        accepted draft tokens / proposed draft tokens (None: no drafts)
        mean_accepted_length   SD/SJD/EAGLE-2/LANTERN: tokens committed per verification round
        tokens_per_target_nfe  image tokens / target forward passes (plain AR: 1)
        reopened_fraction      positions re-opened for resampling / all positions
        rejected, reopened     counts over every round: drafts that failed the test, positions re-opened
        mean_tree_size         EAGLE-2: draft-tree nodes verified per round (None: no trees)
        residuals_emptied      tree methods: rejections that left the residual no mass, so the next
                               token was drawn uniformly (LANTERN's fallback; None: no trees)
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
        # a chain method's rounds each commit an accepted prefix plus one token (vLLM's acceptance length)
        chain = self.chain and committed
        trees = [len(r.tree["token"]) for r in self.rounds if r.tree is not None]
        return {
            "nfe": dict(self.nfe),
            "rounds": len(self.rounds),
            "proposed": proposed,
            "accepted": accepted,
            "acceptance_rate": accepted / proposed if proposed else None,
            "mean_accepted_length": float(np.mean(committed)) if chain else None,
            "tokens_per_target_nfe": n_tokens / self.nfe["target"] if self.nfe.get("target") else None,
            "reopened_fraction": reopened / n_tokens,
            "rejected": sum(int(r.rejected.sum()) for r in self.rounds),
            "reopened": reopened,
            "mean_tree_size": float(np.mean(trees)) if trees else None,
            "residuals_emptied": sum(r.tree.get("emptied", 0) for r in self.rounds if r.tree) if trees else None,
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
            "chain": self.chain,
            "execution": self.execution,
            "precision": {role: dict(counts) for role, counts in self.precision.items()},
        }

    def to_json(self, path: str | Path | None = None) -> str:
        text = json.dumps(self.to_dict(), separators=(",", ":"))
        if path is not None:
            Path(path).write_text(text)
        return text


def grid_json(grid: np.ndarray) -> list | dict:
    """A grid's JSON form: its rows, or, when most cells hold one value, the sparse form
    ``{"shape": [h, w], "fill": v, "at": [flat indices], "values": [...]}`` (cells not listed hold
    ``fill``). A round's masks, drafts and scores are mostly one value: at 32x32 tokens a
    speculative-decoding trace is a tenth of its size in rows."""
    values, counts = np.unique(grid, return_counts=True)
    fill = values[counts.argmax()]
    at = np.flatnonzero(grid.reshape(-1) != fill)
    if 2 * len(at) >= grid.size:
        return grid.tolist()
    return {"shape": list(grid.shape), "fill": fill.item(), "at": at.tolist(), "values": grid.reshape(-1)[at].tolist()}
