"""CUDA graphs on a GPU (``pytest -m gpu``; the device run's first step): every method's tokens
replayed from captured graphs equal the eager passes' on the same device and dtype."""

from __future__ import annotations

import copy

import pytest
import torch

from mulo import methods
from mulo.engine import Engine

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.fixture(scope="module")
def toy_cuda(toy):
    return copy.deepcopy(toy).to(torch.device("cuda"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("method", sorted(methods.names()))
def test_cuda_graphs_give_the_eager_tokens(toy_cuda, method, dtype):
    family = copy.deepcopy(toy_cuda).to(torch.device("cuda"), dtype)
    eager = Engine(family, fixed_shapes=True, graphs="off")
    graphed = Engine(family, graphs="auto")  # auto on CUDA: fixed shapes and graphs
    for seed in range(2):
        a = eager.generate("red apple", method, seed)
        b = graphed.generate("red apple", method, seed)
        assert torch.equal(a.tokens, b.tokens), (method, seed)
        assert a.trace.nfe == b.trace.nfe
        assert "graphs" in b.trace.execution and "fallback" not in b.trace.execution, b.trace.execution


def test_a_graphed_step_replays_one_captured_graph(toy_cuda):
    from mulo.runner import ModelRunner

    runner = ModelRunner(toy_cuda.target, toy_cuda.condition("red apple", 0), 1.0, 1.0, 0, 1.0)
    assert runner.fixed_shapes and runner.graphs is not None and runner.graphs.mode == "cuda"
    runner.prefill()
    seq = torch.zeros(toy_cuda.target.config.max_seq_len, dtype=torch.long)
    for u in range(1, 6):
        runner.next_logits(seq, u)
    assert list(runner.graphs.passes) == [1] and runner.graphs.passes[1].graph is not None
    assert runner.graph_state == "graphs"
