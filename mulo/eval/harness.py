"""The one evaluation loop: method labels x prompts -> one result per request -> one row per label.

The benchmark's table and sweeps, the defaults search, the model card and a look at a training
run all evaluate alike. A run is a label of ``SPECS`` (a method and its knobs) with knob overrides
on top; ``run`` takes runs x prompts, prompt i at seed ``seed + i``, and each prompt runs every run
in an order that rotates from prompt to prompt, so drift of the machine (clock, cache, other load)
hits every run alike. Each request gives a ``Measured``; ``aggregate`` turns one run's requests
into its row, its images scored by ``mulo.eval.quality.Quality``.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from mulo import methods
from mulo.config import ConfigError

if TYPE_CHECKING:  # the engine pulls in diffusers: the CLI's --help lists SPECS without it
    from mulo.engine import Engine, Result
    from mulo.eval.quality import Quality

# label -> (method, knobs on top of the family's defaults). v1 = raster resampling, sequential
# drafting; v2 = island resampling and ZipAR-parallel drafting (the paper's two versions).
SPECS: dict[str, tuple[str, dict]] = {
    "ar": ("ar", {}),
    "zipar": ("zipar", {}),  # window 4, the baseline's default
    "zipar-w8": ("zipar", {"zipar_window": 8}),
    "zipar-w16": ("zipar", {"zipar_window": 16}),
    "sjd": ("sjd", {}),
    "mc-sjd": ("mc-sjd", {}),  # SJD's window (16): the coupling is its only change
    "gsd": ("gsd", {}),  # group reach 7, gap 0.15: GSD's code's values
    "sd": ("sd", {}),
    "lantern": ("lantern", {}),
    "eagle2": ("eagle2", {}),
    "mulo-v1-r2": ("mulo", {"r": 2, "resampling": "raster", "drafting": "sequential"}),
    "mulo-v2-r2": ("mulo", {"r": 2, "resampling": "islands", "drafting": "zipar"}),
    "mulo-v1-r4": ("mulo", {"r": 4, "resampling": "raster", "drafting": "sequential"}),
    "mulo-v2-r4": ("mulo", {"r": 4, "resampling": "islands", "drafting": "zipar"}),
    # MuLo-SD at the family's own recommended knobs, as the app runs it (the model card's rows)
    "mulo-r2": ("mulo", {"r": 2}),
    "mulo-r4": ("mulo", {"r": 4}),
    "mulo": ("mulo", {}),  # every knob the family's (its default r too): the generalisation probe's
}
DRAFT_PHASES = ("drafter", "upsample", "downsample")  # the phases a method spends drafting

Run = tuple[str, str, dict]  # (row name, label of SPECS, knob overrides on top of the label's)


@dataclass
class Measured:
    """What one request measured (latency, passes, acceptance, its image): one row's raw material."""

    latency: float
    nfe_target: int
    nfe_drafter: int
    acceptance: float | None  # None: the method drafted nothing (AR, ZipAR)
    reopened: float
    rounds: int
    draft_s: float
    image: np.ndarray = field(repr=False)
    accepted_length: float | None = None  # chain and tree methods: tokens committed per round
    tree_size: float | None = None  # EAGLE-2: draft-tree nodes per round
    residuals_emptied: int | None = None  # tree methods: rejections that emptied the residual
    pass_widths: dict[str, list[int]] = field(default_factory=dict, repr=False)  # per role, tokens per pass
    extra: Any = field(default=None, repr=False)  # what the caller's ``extra(result)`` read off the request


def spec(label: str, overrides: dict | None = None) -> tuple[str, dict]:
    """(method, knobs) of ``label`` with ``overrides`` on top."""
    method, knobs = SPECS[label]
    return method, {**knobs, **(overrides or {})}


def runs_of(labels) -> list[Run]:
    """Each label as a run of its own name, with no overrides."""
    return [(label, label, {}) for label in labels]


def runnable(engine: Engine, label: str, overrides: dict | None = None) -> str | None:
    """None if the family can run ``label`` (with ``overrides``), else why not."""
    method, knobs = spec(label, overrides)
    try:
        engine.check("red apple", method, 0, knobs)
    except ValueError as exc:
        return str(exc)
    return None


def drafting_models(family) -> list[str]:
    """The family's drafting models, named as ``mulo.eval.costs.measure`` times them: a drafter per
    ratio, then the same-grid draft model and the EAGLE head where the registry's checks find them."""
    models = [f"drafter_r{r}" for r in family.drafters]
    for need in ("draft_model", "eagle_head"):
        try:  # these two checks read the family alone: no request config
            methods.NEEDS[need](family, None, need)
        except ConfigError:
            continue
        models.append(need)
    return models


def drafter_of(engine: Engine, label: str, overrides: dict | None = None) -> str | None:
    """Which of the family's drafting models ``label`` runs (the registry's needs): "draft_model",
    "eagle_head", "drafter_r<r>", or None."""
    return drafter_model_name(engine, *spec(label, overrides))


def drafter_model_name(engine: Engine, method: str, knobs: dict) -> str | None:
    """Which of the family's drafting models ``method`` runs with ``knobs``: "draft_model",
    "eagle_head", "drafter_r<r>" (the request's r), or None."""
    needs = methods.get(method).needs
    for model in ("draft_model", "eagle_head"):
        if model in needs:
            return model
    if "drafter" in needs:
        return f"drafter_r{engine.make_config(knobs).r}"
    return None


def measure(
    engine: Engine, label: str, prompt: str, seed: int, overrides: dict | None = None, extra: Callable | None = None
) -> Measured:
    """One request of ``label`` (with ``overrides``); ``extra(result)``, when given, is kept as ``.extra``."""
    method, knobs = spec(label, overrides)
    result: Result = engine.generate(prompt, method, seed, knobs)
    s = result.trace.summary()
    return Measured(
        latency=s["latency_s"],
        nfe_target=s["nfe"]["target"],
        nfe_drafter=s["nfe"]["drafter"],
        acceptance=s["acceptance_rate"],
        reopened=s["reopened_fraction"],
        rounds=s["rounds"],
        draft_s=sum(s["timings_s"].get(p, 0.0) for p in DRAFT_PHASES),
        image=result.image,
        accepted_length=s["mean_accepted_length"],
        tree_size=s["mean_tree_size"],
        residuals_emptied=s["residuals_emptied"],
        pass_widths=result.pass_widths,
        extra=extra(result) if extra else None,
    )


def run(
    engine: Engine,
    runs: list[Run],
    prompts: list[tuple[str, str]],
    seed: int = 0,
    warmup: int = 0,
    extra: Callable | None = None,
) -> dict[str, list[Measured]]:
    """{run name: one ``Measured`` per prompt} over ``prompts`` [(key, prompt)], prompt i at seed
    ``seed + i``, every prompt running every run, the order rotated per prompt. ``warmup`` requests
    of each run go first, unrecorded (allocator, caches, lazily built tables)."""
    for _, label, overrides in runs:
        for i in range(warmup):
            measure(engine, label, prompts[i % len(prompts)][1], 10_000 + i, overrides)
    records: dict[str, list[Measured]] = {name: [] for name, _, _ in runs}
    for i, (_, prompt) in enumerate(prompts):
        shift = i % len(runs)
        for name, label, overrides in runs[shift:] + runs[:shift]:
            records[name].append(measure(engine, label, prompt, seed + i, overrides, extra))
    return records


def aggregate(
    recs: list[Measured], ar: list[Measured] | None = None, quality: Quality | None = None, keys=None
) -> dict:
    """One run's requests -> its row: median latency, the median over requests of AR's latency /
    this run's on the same request (``ar`` given), means of the counts, FD and adherence of its
    images for the prompted ``keys`` (``quality`` given; else None). A number that no request has
    stays None: a method that drafted nothing has no acceptance, not an acceptance of 0."""
    row = {
        "latency_s": statistics.median(r.latency for r in recs),
        "speedup": statistics.median(a.latency / r.latency for a, r in zip(ar, recs, strict=True)) if ar else None,
        "nfe": {
            "target": mean_present(r.nfe_target for r in recs),
            "drafter": mean_present(r.nfe_drafter for r in recs),
        },
        "acceptance": mean_present(r.acceptance for r in recs),
        "reopened": mean_present(r.reopened for r in recs),
        "rounds": mean_present(r.rounds for r in recs),
        "accepted_length": mean_present(r.accepted_length for r in recs),
        "tree_size": mean_present(r.tree_size for r in recs),
        "residuals_emptied": mean_present(r.residuals_emptied for r in recs),
        "fd": None,
        "adherence": None,
    }
    if quality is not None:
        row.update(quality.score(np.stack([r.image for r in recs]), keys))
    return row


def mean_present(values) -> float | None:
    """The mean of the values that are there; None when none is."""
    present = [v for v in values if v is not None]
    return float(np.mean(present)) if present else None
