"""A generation (or a replayed trace) with the pictures of every round, for the app and figures.

``RunView`` holds a trace plus, per round, the decoded up-sampled draft and the canvas after the
round, drawn only when shown (``RoundFrames``: a VQ decode costs tens of milliseconds on a CPU,
and AR has a round per row). ``stream_view`` drives ``Engine.stream`` and yields a ``RunView``
after every round with a preview of the canvas at most every ``PREVIEW_EVERY_S`` (the engine
excludes the time spent here from the method's latency); ``replay_view`` rebuilds the same
pictures from a trace file, decoding with the family's VQ when it is loaded and colouring token
codes otherwise (a ``tar`` trace on a machine without Tar).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from mulo.models.vq import to_uint8
from mulo.streams import Returning
from mulo.trace import Round, Trace
from mulo.ui import viz
from mulo.ui.torch_thread import TORCH

PREVIEW_EVERY_S = 0.4  # a streamed run repaints its canvas at most this often


@dataclass
class RunView:
    trace: Trace | None
    method: str
    drafts: Sequence[np.ndarray | None] = field(default_factory=list)  # [h, w, 3] per round (None: no draft)
    canvases: Sequence[np.ndarray] = field(default_factory=list)  # [h, w, 3] per round, undecided greyed
    image: np.ndarray | None = None  # the final image
    decoded: bool = True  # False: pictures are token-code colours (family not loaded)
    rounds_done: int = 0  # rounds streamed so far
    decided: float = 0.0  # share of the grid's tokens decided so far
    preview: np.ndarray | None = None  # the canvas painted after the latest round that was painted
    fresh: bool = False  # the preview was painted after the round just streamed
    pass_widths: dict | None = None  # per role, the tokens each forward pass fed (the cost speed-up)

    @property
    def latest(self) -> np.ndarray | None:
        return self.image if self.image is not None else self.preview


class Painter:
    """Token grids -> pictures with a family's VQ decoder, or code colours without one."""

    def __init__(self, family=None, grid: tuple[int, int] | None = None):
        self.family = family
        self.grid = grid

    @property
    def decodes(self) -> bool:
        return self.family is not None and tuple(self.family.grid) == tuple(self.grid or self.family.grid)

    def __call__(self, tokens: np.ndarray) -> np.ndarray:
        return TORCH.call(self._paint, tokens)  # a VQ decode: the app's torch thread

    @torch.no_grad()
    def _paint(self, tokens: np.ndarray) -> np.ndarray:
        decided = tokens >= 0
        if not self.decodes:
            return viz.token_colors(tokens)
        filled = torch.from_numpy(np.where(decided, tokens, 0).astype(np.int64))
        image = to_uint8(self.family.vq.decode(filled[None].to(self.family.device)))[0].numpy()
        return image if decided.all() else viz.grey_pending(image, decided, strength=1.0)

    def draft(self, rnd: Round, before: np.ndarray) -> np.ndarray | None:
        """The round's proposal over the canvas before it (None for rounds without a draft)."""
        if rnd.proposed == 0:
            return None
        return self(np.where(rnd.draft >= 0, rnd.draft, before))


def stream_view(
    engine, prompt: str, method: str, seed: int, config=None, preview_every_s: float = PREVIEW_EVERY_S, frames=True
):
    """Yield a ``RunView`` after each round (its canvas repainted at most every ``preview_every_s``,
    and after the last round); return the finished one, whose round pictures are drawn on demand
    (``frames``; without, ``with_frames`` adds them later: a view that crosses ZeroGPU's process
    boundary must hold arrays and traces only, not the family that draws them)."""
    painter = Painter(engine.family)
    view = RunView(None, method)
    run = Returning(engine.stream(prompt, method, seed, config))
    painted = -float("inf")
    for rnd in run:
        view.rounds_done += 1
        view.decided = float((rnd.tokens >= 0).mean())
        view.fresh = time.perf_counter() - painted >= preview_every_s or view.decided == 1.0
        if view.fresh:
            view.preview = painter(rnd.tokens)
            painted = time.perf_counter()
        yield view
    result = run.value
    view.trace, view.image, view.pass_widths = result.trace, result.image, result.pass_widths
    return with_frames(view, engine.family) if frames else view


def with_frames(view: RunView, family) -> RunView:
    """``view`` (finished) with its round pictures, drawn on demand with ``family``'s VQ."""
    painter = Painter(family)
    view.drafts = RoundFrames(view.trace, painter, "draft")
    view.canvases = RoundFrames(view.trace, painter, "canvas")
    return view


class RoundFrames(Sequence):
    """The pictures of a trace's rounds (``kind``: "draft" or "canvas"), drawn when asked for:
    a finished run or a loaded trace draws nothing until a round is shown, and only the last few
    pictures are kept."""

    KEEP = 8

    def __init__(self, trace: Trace, painter: Painter, kind: str):
        self.trace, self.painter, self.kind = trace, painter, kind
        self._kept: dict[int, np.ndarray | None] = {}

    def __len__(self) -> int:
        return len(self.trace.rounds)

    def __getitem__(self, index: int) -> np.ndarray | None:
        index = range(len(self))[index]  # IndexError outside, negative indices from the end
        if index not in self._kept:
            rnd = self.trace.rounds[index]
            if self.kind == "canvas":
                picture = self.painter(rnd.tokens)
            else:
                before = self.trace.rounds[index - 1].tokens if index else np.full(self.trace.grid, -1, np.int64)
                picture = self.painter.draft(rnd, before)
            if len(self._kept) >= self.KEEP:
                self._kept.pop(next(iter(self._kept)))
            self._kept[index] = picture
        return self._kept[index]


def replay_view(trace: Trace, family=None) -> RunView:
    """Pictures of a saved trace; decoded when ``family`` is the trace's family. Round pictures
    are drawn on demand (``ReplayFrames``); only the final image is drawn now."""
    usable = family if family is not None and family.name == trace.family else None
    painter = Painter(usable, trace.grid)
    view = RunView(trace, trace.method, decoded=painter.decodes)
    view.drafts = RoundFrames(trace, painter, "draft")
    view.canvases = RoundFrames(trace, painter, "canvas")
    view.image = painter(trace.tokens)
    return view
