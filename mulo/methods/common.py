"""What every decoding method gets: the family's models, the request and its random generator.

A method is a generator function ``generate(ctx)`` that yields ``Round`` events and returns the
final token grid ``[H, W]``. It creates its model runners through the context, so forward passes
are counted per role (target / drafter) and phases are timed in one place.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from mulo.config import GenerationConfig
from mulo.runner import ModelRunner
from mulo.sampling import sample
from mulo.timing import PhaseTimer, delta
from mulo.trace import Round


@dataclass
class DecodeContext:
    family: object  # mulo.families.base.Family
    cond: torch.Tensor
    config: GenerationConfig
    generator: torch.Generator
    timer: PhaseTimer
    fixed_shapes: bool | None = None  # runners' pass shapes (``mulo.runner``): None = by device
    graphs: str = "auto"  # runners' graphed passes (``mulo.runner.GRAPH_MODES``)
    runners: dict[str, list[ModelRunner]] = field(default_factory=lambda: {"target": [], "drafter": []})
    _last: tuple[dict, dict] = field(default_factory=lambda: ({}, {"target": 0, "drafter": 0}))
    _rounds: int = 0

    @property
    def grid(self) -> tuple[int, int]:
        return self.family.grid

    @property
    def round_count(self) -> int:
        return self._rounds

    def runner(self, model, role: str, refresh: bool = True, scratch: int = 0) -> ModelRunner:
        """A runner of ``model`` for this request, counted under ``role`` ("target" / "drafter");
        ``scratch`` extra cache slots hold draft-tree nodes (EAGLE-2)."""
        c = self.config
        sampling = (c.guidance, c.temperature, c.top_k, c.top_p)
        runner = ModelRunner(model, self.cond, *sampling, refresh, scratch, self.fixed_shapes, self.graphs)
        self.runners[role].append(runner)
        return runner

    def sample(self, probs: torch.Tensor) -> torch.Tensor:
        """Sample with the request's (CPU) generator; returns int64 tokens shaped ``probs[..., 0]``.

        Sampling on the CPU keeps a seed's tokens independent of the model's device."""
        return sample(probs.float().cpu(), self.generator)

    def sample_next(self, runner: ModelRunner, seq: torch.Tensor, u: int) -> torch.Tensor:
        """The token of position ``u`` given ``seq[:u]``: ``sample(runner.probs(runner.next_logits(seq,
        u)))``, in one compiled call where the runner has one (``ModelRunner.sample_next``)."""
        return runner.sample_next(seq, u, self.generator)[0]

    def phase(self, name: str):
        return self.timer.phase(name)

    def nfe(self) -> dict[str, int]:
        return {role: sum(r.nfe for r in runners) for role, runners in self.runners.items()}

    def execution(self) -> str:
        """How the runners' passes ran (``ModelRunner.graph_state``), per role where roles differ."""
        states = {role: sorted({r.graph_state for r in runners}) for role, runners in self.runners.items() if runners}
        distinct = {s for values in states.values() for s in values}
        if len(distinct) == 1:
            return distinct.pop()
        return "; ".join(f"{role}: {', '.join(values)}" for role, values in states.items())

    def pass_widths(self) -> dict[str, list[int]]:
        """Per role, the number of tokens each forward pass fed (the prefill's: the condition)."""
        return {role: [w for r in runners for w in r.widths] for role, runners in self.runners.items()}

    def precisions(self) -> dict[str, dict[str, int]]:
        """Per role, how many forward passes ran their layers in each precision (``mulo.wide``)."""
        out: dict[str, dict[str, int]] = {}
        for role, runners in self.runners.items():
            counts = out[role] = {}
            for runner in runners:
                for precision, n in runner.precisions.items():
                    counts[precision] = counts.get(precision, 0) + n
        return out

    def new_round(self, label: str, tokens: torch.Tensor) -> Round:
        """A blank round numbered in order; the method fills its masks, then calls ``close``."""
        rnd = Round.empty(self._rounds, label, self.grid, tokens.reshape(self.grid).numpy())
        self._rounds += 1
        return rnd

    def close(self, rnd: Round, tokens: torch.Tensor) -> Round:
        """Stamp the round with the canvas after it and the time and NFE spent since the last."""
        rnd.tokens = tokens.reshape(self.grid).numpy().astype(np.int64).copy()
        timings, nfe = self.timer.snapshot(), self.nfe()
        rnd.timings_s = delta(timings, self._last[0])
        rnd.nfe = {k: nfe[k] - self._last[1].get(k, 0) for k in nfe}
        self._last = (timings, nfe)
        return rnd
