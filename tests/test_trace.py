"""Traces: JSON round trip, schema, summary metrics."""

import json

import numpy as np
import pytest

from mulo import methods
from mulo.methods import names as method_names
from mulo.trace import Round, Trace
from mulo.tracefile import load_trace, parse, validate


@pytest.mark.parametrize("method", method_names())
def test_json_round_trip_and_schema(engine, method, tmp_path):
    trace = engine.generate("rocket", method, 4, {"tau": 0.01}).trace
    path = tmp_path / "t.json"
    trace.to_json(path)
    data = json.loads(path.read_text())
    validate(data)
    again = load_trace(path)
    assert again.to_dict() == trace.to_dict()
    config = data["config"]
    for knob in (
        "r",
        "tau",
        "k",
        "radius",
        "rows_per_block",
        "drafting",
        "resampling",
        "zipar_window",
        "sjd_window",
        "delta",
        "cfg",
        "temperature",
        "top_k",
        "top_p",
    ):
        assert knob in config
    assert data["grid"] == [8, 8] and data["method"] == method and data["seed"] == 4
    assert set(data["nfe"]) == {"target", "drafter"}
    assert data["latency_s"] >= sum(v for k, v in data["timings_s"].items()) * 0.99
    # a trace written before traces recorded ``chain`` reads it from its method's name, the same
    assert data.pop("chain") is methods.get(method).chain
    assert parse(data).summary() == trace.summary()


def test_mostly_constant_grids_are_written_sparse_and_read_back_exactly(engine):
    trace = engine.generate("rocket", "sd", 4).trace
    data = trace.to_dict()
    first = data["rounds"][0]
    assert isinstance(first["accepted"], dict) and isinstance(first["score"], dict)  # mostly 0 / -1
    assert isinstance(data["rounds"][-1]["tokens"], list)  # the finished canvas: dense rows
    names = ("draft", "accepted", "rejected", "reopened", "islands", "resampled", "tokens", "score")
    for before, after in zip(trace.rounds, parse(data).rounds, strict=True):
        for name in names[:-1]:
            np.testing.assert_array_equal(getattr(before, name), getattr(after, name))
        np.testing.assert_allclose(before.score, after.score, atol=1e-6)  # scores are written to 6 decimals
    rows = sum(len(json.dumps(getattr(r, name).tolist())) for r in trace.rounds for name in names)
    assert len(json.dumps(data["rounds"])) < rows / 2


def test_bad_traces_are_rejected_with_a_reason(engine):
    data = engine.generate("rocket", "ar", 0).trace.to_dict()
    broken = dict(data, rounds=[dict(data["rounds"][0], accepted=[[2]])])
    with pytest.raises(ValueError, match="not a trace"):
        validate(broken)
    with pytest.raises(ValueError, match="not a trace: 'method' is a required property"):
        validate({k: v for k, v in data.items() if k != "method"})
    with pytest.raises(ValueError, match="8x8 grid"):
        validate(dict(data, tokens=[[0]]))
    with pytest.raises(ValueError, match="invalid JSON"):
        load_trace("{not json")


def test_summary_definitions():
    shape = (2, 2)
    base = np.full(shape, -1)

    def rnd(i, draft, accepted, tokens, reopened=None):
        r = Round.empty(i, f"r{i}", shape, base)
        r.draft = np.array(draft)
        r.accepted = np.array(accepted, dtype=np.int8)
        r.rejected = ((r.draft >= 0) & (r.accepted == 0)).astype(np.int8)
        r.reopened = np.array(reopened if reopened is not None else r.rejected, dtype=np.int8)
        r.tokens = np.array(tokens)
        return r

    rounds = [
        rnd(0, [[5, 6], [-1, -1]], [[1, 0], [0, 0]], [[5, 9], [-1, -1]]),
        rnd(1, [[-1, -1], [7, 8]], [[0, 0], [1, 1]], [[5, 9], [7, 8]]),
    ]
    trace = Trace(
        "sd",
        "toy",
        "p",
        0,
        {},
        "cpu",
        "float32",
        {},
        shape,
        np.array([[5, 9], [7, 8]]),
        1.0,
        {"verify": 0.5},
        {"target": 2, "drafter": 4},
        rounds,
        chain=True,  # SD verifies chains: the trace records it (the engine copies the registry's flag)
    )
    s = trace.summary()
    assert s["proposed"] == 4 and s["accepted"] == 3
    assert s["acceptance_rate"] == 0.75
    assert s["mean_accepted_length"] == 2.0  # each round committed 2 tokens
    assert s["tokens_per_target_nfe"] == 2.0
    assert s["reopened_fraction"] == 0.25
    trace.method, trace.chain = "mulo", False
    assert trace.summary()["mean_accepted_length"] is None
