"""Graphed passes and bf16 (issue 49), checked on the CPU as far as a CPU can: the static-buffer
path that CUDA graphs replay (``graphs="emulate"``) gives the same tokens as eager passes for every
method; the trace names how passes ran; a bf16 family runs every method. The CUDA graphs
themselves run in the device script's GPU checks (``tools/device/gpu_checks.py``)."""

from __future__ import annotations

import copy

import pytest
import torch

from mulo import methods
from mulo.engine import Engine
from mulo.runner import ModelRunner
from mulo.tracefile import parse

from .test_shapes import VARIANTS


@pytest.mark.parametrize(("method", "knobs"), VARIANTS, ids=[f"{m}{k or ''}" for m, k in VARIANTS])
def test_graph_static_buffers_give_the_same_tokens(toy, method, knobs):
    eager = Engine(toy, fixed_shapes=True, graphs="off")
    graphed = Engine(toy, fixed_shapes=True, graphs="emulate")
    for seed in range(2):
        a = eager.generate("red apple", method, seed, knobs)
        b = graphed.generate("red apple", method, seed, knobs)
        assert torch.equal(a.tokens, b.tokens), (method, knobs, seed)
        assert a.trace.nfe == b.trace.nfe and a.pass_widths == b.pass_widths
        assert a.trace.execution == "eager" and "emulated graphs" in b.trace.execution


def test_execution_survives_the_trace_file(toy):
    result = Engine(toy, fixed_shapes=True, graphs="emulate").generate("red apple", "mulo", 0)
    again = parse(result.trace.to_dict())
    assert again.execution == "emulated graphs"
    old = result.trace.to_dict()
    del old["execution"]  # a trace from before the field: its passes ran eagerly
    assert parse(old).execution == "eager"


def test_graphs_need_fixed_shapes_and_a_known_mode(toy):
    cond = toy.condition("red apple", 0)
    with pytest.raises(ValueError, match="fixed shapes"):
        ModelRunner(toy.target, cond, 1.0, 1.0, 0, 1.0, fixed_shapes=False, graphs="emulate")
    with pytest.raises(ValueError, match="graphs must be one of"):
        ModelRunner(toy.target, cond, 1.0, 1.0, 0, 1.0, fixed_shapes=True, graphs="always")
    # auto on a CPU: eager
    assert ModelRunner(toy.target, cond, 1.0, 1.0, 0, 1.0, fixed_shapes=True).graphs is None


def test_a_failed_capture_falls_back_to_eager_and_says_why(toy):
    runner = ModelRunner(
        toy.target, toy.condition("red apple", 0), 1.0, 1.0, 0, 1.0, fixed_shapes=True, graphs="emulate"
    )
    reference = copy.deepcopy(runner)
    reference.graphs = None

    def broken(*_):
        raise RuntimeError("operation not permitted when stream is capturing\nmore")

    runner.prefill(), reference.prefill()
    runner.graphs.passes.clear()
    runner.graphs.passes[1] = type("Broken", (), {"replay": broken})()
    seq = torch.zeros(toy.target.config.max_seq_len, dtype=torch.long)
    assert torch.equal(runner.next_logits(seq, 1), reference.next_logits(seq, 1))
    assert runner.graph_state.startswith("eager (fallback: CUDA graph capture failed (RuntimeError: operation")
    assert torch.equal(runner.next_logits(seq, 2), reference.next_logits(seq, 2))  # eager from then on


@pytest.mark.parametrize("method", sorted(methods.names()))
def test_a_bf16_family_runs_every_method(toy, method):
    """bf16 (what the GPU runs our families in) reaches every model a method uses: no dtype mismatch."""
    family = copy.deepcopy(toy).to(torch.device("cpu"), torch.bfloat16)
    result = Engine(family, fixed_shapes=True, graphs="emulate").generate("red apple", method, 0)
    assert result.trace.dtype == "bfloat16"
    assert result.tokens.shape == family.grid and int(result.tokens.min()) >= 0
