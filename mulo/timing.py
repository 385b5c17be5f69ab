"""Wall-clock per phase (drafter, verify, resample, ...), synchronised on CUDA."""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch


class PhaseTimer:
    """Accumulates seconds per named phase. On CUDA every phase boundary synchronises the
    device, so a phase is charged for the kernels it launched and not the ones before it.
    ``excluded``: a clock of seconds no phase is charged for (building and loading compiled
    passes, ``mulo.compiled.setup_seconds``), read at each phase's start and end."""

    def __init__(self, device: torch.device | str, excluded=lambda: 0.0):
        self.cuda = torch.device(device).type == "cuda"
        self.totals: dict[str, float] = {}
        self.excluded = excluded

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    @contextmanager
    def phase(self, name: str):
        self._sync()
        start, skipped = time.perf_counter(), self.excluded()
        try:
            yield
        finally:
            self._sync()
            spent = time.perf_counter() - start - (self.excluded() - skipped)
            self.totals[name] = self.totals.get(name, 0.0) + spent

    def snapshot(self) -> dict[str, float]:
        return dict(self.totals)


def delta(after: dict, before: dict) -> dict:
    """Per-key difference of two snapshots (keys that did not move are dropped)."""
    out = {k: v - before.get(k, 0) for k, v in after.items()}
    return {k: v for k, v in out.items() if v}
