"""A generation (or a replayed trace) with the pictures of every round, for the app and figures.

``RunView`` holds a trace plus, per round, the decoded up-sampled draft and the canvas after the
round. ``stream_view`` drives ``Engine.stream`` and yields a ``RunView`` after every round (the
engine excludes the time spent here from the method's latency); ``replay_view`` rebuilds the same
pictures from a trace file, decoding with the family's VQ when it is loaded and colouring token
codes otherwise (a ``tar`` trace on a machine without Tar).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from mulo import viz
from mulo.models.vq import to_uint8
from mulo.trace import Round, Trace


@dataclass
class RunView:
    trace: Trace | None
    method: str
    drafts: list[np.ndarray | None] = field(default_factory=list)  # [h, w, 3] per round (None: no draft)
    canvases: list[np.ndarray] = field(default_factory=list)  # [h, w, 3] per round, undecided greyed
    image: np.ndarray | None = None  # the final image
    decoded: bool = True  # False: pictures are token-code colours (family not loaded)

    @property
    def latest(self) -> np.ndarray | None:
        return self.image if self.image is not None else (self.canvases[-1] if self.canvases else None)


class Painter:
    """Token grids -> pictures with a family's VQ decoder, or code colours without one."""

    def __init__(self, family=None, grid: tuple[int, int] | None = None):
        self.family = family
        self.grid = grid

    @property
    def decodes(self) -> bool:
        return self.family is not None and tuple(self.family.grid) == tuple(self.grid or self.family.grid)

    @torch.no_grad()
    def __call__(self, tokens: np.ndarray) -> np.ndarray:
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


def stream_view(engine, prompt: str, method: str, seed: int, config=None):
    """Yield a growing ``RunView`` after each round; return the finished one."""
    painter = Painter(engine.family)
    view = RunView(None, method)
    stream = engine.stream(prompt, method, seed, config)
    before = np.full(engine.family.grid, -1, dtype=np.int64)
    while True:
        try:
            rnd = next(stream)
        except StopIteration as done:
            result = done.value
            view.trace, view.image = result.trace, result.image
            return view
        view.drafts.append(painter.draft(rnd, before))
        view.canvases.append(painter(rnd.tokens))
        before = rnd.tokens
        yield view


def replay_view(trace: Trace, family=None) -> RunView:
    """Pictures of a saved trace; decoded when ``family`` is the trace's family."""
    usable = family if family is not None and family.name == trace.family else None
    painter = Painter(usable, trace.grid)
    view = RunView(trace, trace.method, decoded=painter.decodes)
    before = np.full(trace.grid, -1, dtype=np.int64)
    for rnd in trace.rounds:
        view.drafts.append(painter.draft(rnd, before))
        view.canvases.append(painter(rnd.tokens))
        before = rnd.tokens
    view.image = painter(trace.tokens)
    return view
