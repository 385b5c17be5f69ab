"""Same seed, same knobs, same tokens: runs pinned before the engine was restructured (issue 18).

The pins (``tests/data/pinned_runs.json``) were written by ``python -m tests.pinned_runs`` from the
code before the method registry, the runner's cache API and the MuLo-SD step functions; a
change that moves a single token, a forward pass or a round fails here. The bundled example
traces are regenerated from their own config (written with the trace key ``cfg``) as well.
"""

from __future__ import annotations

import json

import pytest

from mulo.engine import Engine
from mulo.families import load_family
from tests.pinned_runs import PINS, RUNS, example_runs, run

pytestmark = pytest.mark.slow  # twenty pinned runs, the shipped families among them (docs/testing.md)

PINNED = json.loads(PINS.read_text())


@pytest.fixture(scope="module")
def engines():
    return {name: Engine(load_family(name)) for name in ("toy", "scenes", "twemoji")}  # twemoji: the examples


def test_every_method_is_pinned_on_both_families():
    from mulo.methods import REGISTRY

    builtin = {m.name for m in REGISTRY.values() if m.builtin}
    for family in ("toy", "scenes"):
        assert {p["method"] for p in PINNED["runs"] if p["family"] == family} >= builtin
    assert [(p["family"], p["method"], p["seed"], p["knobs"]) for p in PINNED["runs"]] == [tuple(r) for r in RUNS]


@pytest.mark.parametrize("index", range(len(RUNS)), ids=[f"{f}-{m}-{s}-{i}" for i, (f, m, s, _) in enumerate(RUNS)])
def test_tokens_forward_passes_and_rounds_are_unchanged(engines, index):
    pin = PINNED["runs"][index]
    got = run(engines[pin["family"]], pin["method"], pin["seed"], pin["knobs"], PINNED["prompt"])
    assert got["nfe"] == pin["nfe"]
    assert got["rounds"] == pin["rounds"]
    assert got["tokens"] == pin["tokens"]


EXAMPLES = example_runs()


@pytest.mark.parametrize("example", EXAMPLES, ids=[e[0] for e in EXAMPLES])
def test_bundled_example_traces_regenerate_token_for_token(engines, example):
    name, family, method, seed, config, tokens, prompt = example
    result = engines[family].generate(prompt, method, seed, config)
    assert result.tokens.reshape(-1).tolist() == tokens, name
