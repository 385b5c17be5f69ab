"""Wall-clock per phase (drafter, verify, resample, ...), synchronised on CUDA."""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch


class PhaseTimer:
    """Accumulates seconds per named phase. On CUDA every phase boundary synchronises the
    device, so a phase is charged for the kernels it launched and not the ones before it."""

    def __init__(self, device: torch.device | str):
        self.cuda = torch.device(device).type == "cuda"
        self.totals: dict[str, float] = {}

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    @contextmanager
    def phase(self, name: str):
        self._sync()
        start = time.perf_counter()
        try:
            yield
        finally:
            self._sync()
            self.totals[name] = self.totals.get(name, 0.0) + time.perf_counter() - start

    def snapshot(self) -> dict[str, float]:
        return dict(self.totals)


def delta(after: dict, before: dict) -> dict:
    """Per-key difference of two snapshots (keys that did not move are dropped)."""
    out = {k: v - before.get(k, 0) for k, v in after.items()}
    return {k: v for k, v in out.items() if v}
