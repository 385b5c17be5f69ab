"""Quality and cost beside each column's speed: how well the image matches the prompt (the family's
referee's verdict where it has one, emoji scenes: which emoji were found and which are missing;
else its mini-CLIP, with the real images' score as the reference), how many tokens differ from AR's image
for the same seed, and a cost speed-up that prices every pass by a table of timed pass costs kept
for the life of the engine, so identical work shows the same number however busy the CPU was.

Wall-clock speed-ups of one request on a shared CPU are noisy (identical work measured 1.78x and
2.35x); the cost speed-up counts the same passes at fixed prices (``mulo.eval.costs``).
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass

import numpy as np

from mulo.eval.costs import CostTable
from mulo.eval.harness import drafter_model_name
from mulo.eval.quality import Quality

ADHERENT_RANK = 5  # the benchmark's adherence: the prompt's emoji among the 5 nearest texts

_lock = threading.Lock()
_quality: dict[str, Quality | None] = {}
_reference: dict[str, float] = {}
_tables: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # engine -> its CostTable


@dataclass
class ColumnScore:
    rank: int | None = None  # the prompt's best text among the scorer's texts, 1 = nearest; None: not scored
    texts: int = 0  # how many texts it ranks among
    differs_from_ar: float | None = None  # share of tokens that differ from AR's (same seed)
    cost_speedup: float | None = None  # AR's passes / this run's, each priced by model and width
    warning: str | None = None  # a plain sentence when the image matches the prompt clearly worse than AR's
    verdict: str | None = None  # the family's referee, in one sentence (what it found, what is missing)
    match: bool | None = None  # the referee's prompt match

    @property
    def adherent(self) -> bool | None:
        if self.match is not None:
            return self.match
        return None if self.rank is None else self.rank <= ADHERENT_RANK


def quality_of(engine) -> Quality | None:
    """The family's scorer (loaded once per engine), None for families without one (toy, tar)."""
    name = engine.family.name
    with _lock:
        if name not in _quality:
            _quality[name] = Quality.for_family(engine.family)
            if _quality[name] is not None:
                _reference[name] = _quality[name].real_adherence()
        return _quality[name]


def reference_adherence(engine) -> float | None:
    """Share of the family's evaluation prompts whose real image the scorer calls adherent."""
    return _reference.get(engine.family.name) if quality_of(engine) is not None else None


def cost_table(engine) -> CostTable:
    with _lock:
        if engine not in _tables:
            _tables[engine] = CostTable(engine)
        return _tables[engine]


def score_columns(engine, prompt: str, runs: dict[str, tuple]) -> dict[str, ColumnScore]:
    """``runs``: {label: (trace, image, pass_widths, method knobs)}, AR's under "AR"; a score per label."""
    quality = quality_of(engine)
    scores = {label: ColumnScore() for label in runs}
    judged = False
    for label, (_, image, _, _) in runs.items():  # a referee's verdict, where the family has one
        verdict = quality.judge(image, prompt) if quality is not None else None
        if verdict is not None:
            scores[label].match, scores[label].verdict, judged = verdict.match, verdict.sentence(), True
    keys = quality.keys_for(prompt) if quality is not None and not judged else set()
    if keys:
        for label, (_, image, _, _) in runs.items():
            scores[label].rank, scores[label].texts = quality.prompt_rank(image, keys), len(quality.text_keys)
    ar = runs.get("AR")
    if ar is None:
        return scores
    fed: dict[str, set[int]] = {"target": set(ar[2].get("target", []))}
    drafters = {}
    for label, (trace, _, widths, knobs) in runs.items():
        drafters[label] = drafter_model_name(engine, trace.method, knobs)
        fed["target"].update(widths.get("target", []))
        if drafters[label]:
            fed.setdefault(drafters[label], set()).update(widths.get("drafter", []))
    costs = cost_table(engine).costs(prompt, fed)
    ar_cost = costs.request(ar[2], None)
    ar_score = scores["AR"]
    for label, (trace, _, widths, _) in runs.items():
        score = scores[label]
        score.differs_from_ar = float(np.mean(np.asarray(trace.tokens) != np.asarray(ar[0].tokens)))
        cost = costs.request(widths, drafters[label])
        score.cost_speedup = ar_cost / cost if cost > 0 else None  # a method with no passes has no price
        if label != "AR" and ar_score.adherent and score.adherent is False and score.verdict is not None:
            score.warning = f"this image matches the prompt worse than AR's for the same seed ({score.verdict})"
        elif label != "AR" and ar_score.adherent and score.adherent is False:
            score.warning = (
                f"this image matches the prompt clearly worse than AR's for the same seed "
                f"(the prompt ranks {score.rank:,} among the scorer's texts here, {ar_score.rank} for AR's)"
            )
    return scores
