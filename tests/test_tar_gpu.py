"""The real Tar models on a GPU (``pytest -m gpu``); skips cleanly without CUDA or weights.

Fetch the weights first: ``python -m mulo download tar`` (Tar-1.5B, 512 px target).
"""

from __future__ import annotations

import pytest
import torch

from mulo.engine import Engine
from mulo.families import tar

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def engine():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    try:
        paths = tar.locate(tar.Variant("1.5b", 512))
    except tar.MissingWeights as exc:
        pytest.skip(str(exc))
    torch.cuda.reset_peak_memory_stats()
    return Engine(tar.build_from_paths(paths, ratio=2, device="cuda"))


@pytest.mark.parametrize("method", ["ar", "mulo"])
def test_real_tar_generates_a_512px_image(engine, method):
    result = engine.generate("a red apple on a wooden table", method=method, seed=0)
    assert result.tokens.shape == (32, 32)
    assert result.image.shape == (512, 512, 3)
    assert result.image.std() > 10  # not a flat or blank image
    trace = result.trace
    assert trace.dtype == "bfloat16" and trace.timings_s["condition"] > 0
    peak = torch.cuda.max_memory_allocated() / 2**30
    print(f"{method}: {trace.latency_s:.1f} s, condition {trace.timings_s['condition']:.1f} s, peak {peak:.1f} GiB")
    assert peak < 20  # decode-only TA-Tok, bf16: far below a 24 GB card
