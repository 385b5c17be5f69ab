"""Adding a method is one ``register`` call: the engine runs it, the CLI offers it, the trace
schema accepts its traces, the app offers it as a third column and routes its knobs to it."""

from __future__ import annotations

import json

import pytest
import torch

from mulo import methods
from mulo.config import ConfigError
from mulo.tracefile import TraceError, parse


def stripes(ctx):
    """A test method: row i is code (i + zipar_window) mod V, one round per row."""
    height, width = ctx.grid
    vocab = ctx.family.vocab_size
    x = torch.full((height * width,), -1, dtype=torch.long)
    for row in range(height):
        rnd = ctx.new_round(f"stripe {row}", x)
        x[row * width : (row + 1) * width] = (row + ctx.config.zipar_window) % vocab
        yield ctx.close(rnd, x)
    return x.reshape(height, width)


@pytest.fixture
def stripes_method():
    method = methods.register(
        methods.Method("stripes", "Stripes", stripes, "test stripes", knobs=("zipar_window",), builtin=False)
    )
    yield method
    methods.unregister("stripes")


def expected_rows(engine, window: int) -> list[int]:
    height = engine.family.grid[0]
    return [(row + window) % engine.family.vocab_size for row in range(height)]


def test_the_engine_runs_a_registered_method_with_its_knob(engine, stripes_method):
    result = engine.generate("red apple", "stripes", 0, {"zipar_window": 3})
    assert result.tokens[:, 0].tolist() == expected_rows(engine, 3)
    assert result.trace.method == "stripes" and len(result.trace.rounds) == engine.family.grid[0]
    assert result.trace.summary()["mean_accepted_length"] is None  # not a chain method


def test_an_unregistered_method_is_a_config_error(engine, stripes_method):
    methods.unregister("stripes")
    with pytest.raises(ConfigError, match="method must be one of ar, zipar, sjd, sd, lantern, mulo"):
        engine.generate("red apple", "stripes", 0)
    methods.register(stripes_method)  # for the fixture's teardown


def test_the_cli_offers_and_runs_it_and_the_schema_accepts_its_trace(stripes_method, tmp_path, capsys):
    from mulo.__main__ import main

    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    assert "stripes: test stripes" in " ".join(capsys.readouterr().out.split())
    path = tmp_path / "stripes.json"
    args = ["generate", "--family", "toy", "--method", "stripes", "--prompt", "red apple", "--zipar-window", "2"]
    assert main([*args, "--trace", str(path)]) == 0
    assert "stripes on toy" in capsys.readouterr().out
    data = json.loads(path.read_text())
    trace = parse(data)
    assert trace.method == "stripes" and trace.config["zipar_window"] == 2
    assert parse(data, methods=methods.names()).method == "stripes"
    methods.unregister("stripes")
    with pytest.raises(TraceError, match="at method"):  # the schema follows the registry the caller names
        parse(data, methods=methods.names())
    assert parse(data).method == "stripes"  # the trace layer alone knows no registry
    methods.register(stripes_method)


def test_registering_checks_names_knobs_and_needs(stripes_method):
    with pytest.raises(ValueError, match="already registered"):
        methods.register(stripes_method)
    with pytest.raises(ValueError, match="unknown knobs or needs banana"):
        methods.register(methods.Method("other", "Other", stripes, "x", knobs=("banana",), builtin=False))
    with pytest.raises(ValueError, match="unknown knobs or needs wings"):
        methods.register(methods.Method("other", "Other", stripes, "x", needs=("wings",), builtin=False))
    with pytest.raises(ValueError, match="built in"):
        methods.unregister("ar")
    for name in ("two words", "a.b", "-"):  # a flag's value and part of a file name
        with pytest.raises(ValueError, match="letters, digits, _ and -"):
            methods.register(methods.Method(name, "Other", stripes, "x", builtin=False))
    assert "other" not in methods.names() and "mc-sjd" in methods.names()


def test_the_app_offers_it_as_a_third_column_with_its_knobs(stripes_method):
    import app
    from mulo.ui import handlers, knobs

    assert "stripes" in knobs.baselines()
    routed = knobs.method_knobs({"zipar_window": 2, "tau": 0.5, "cfg": 2.0}, "stripes")
    assert routed == {"zipar_window": 2, "cfg": 2.0}  # MuLo-SD's tau is not its knob
    demo = app.build_demo()
    dropdowns = [c for c in demo.blocks.values() if getattr(c, "label", None) == "third column"]
    assert ["Stripes", "stripes"] in [list(choice) for choice in dropdowns[0].choices]  # its name, its id
    *_, final = handlers.generate("red apple", "0", "toy", "stripes", zipar_window=2)
    stats_third = final[5]
    assert stats_third.startswith("**") and "Stripes" in stats_third


def load(name: str, device: str = "cpu"):
    """The test family's loader (the registry imports this module by name): the toy family drawn
    from another seed, under its own name."""
    from mulo.families import toy

    family = toy.build(seed=5).to(device)
    family.name = name
    return family


@pytest.fixture
def toy_seed5_family():
    from mulo import families
    from mulo.ui import engines

    spec = families.register("toy-seed5", "the toy family from seed 5 (a test)", __name__)
    yield spec
    families.unregister("toy-seed5")
    engines._engines.pop("toy-seed5", None)


def test_a_family_is_one_register_call(toy_seed5_family, tmp_path, capsys):
    import app
    from mulo.__main__ import main
    from mulo.ui import engines, handlers

    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    # argparse wraps the help at spaces and hyphens: compare without the white space
    assert "toy-seed5:thetoyfamilyfromseed5(atest)" in "".join(capsys.readouterr().out.split())
    path = tmp_path / "t.json"
    assert main(["generate", "--family", "toy-seed5", "--method", "ar", "--prompt", "cat", "--trace", str(path)]) == 0
    assert json.loads(path.read_text())["family"] == "toy-seed5"
    assert "toy-seed5" in engines.family_choices() and "toy-seed5: the toy family" in engines.family_info()
    dropdowns = [c for c in app.build_demo().blocks.values() if getattr(c, "label", None) == "family"]
    assert ["toy-seed5", "toy-seed5"] in [list(choice) for choice in dropdowns[0].choices]
    *_, final = handlers.generate("red apple", "0", "toy-seed5", "none")
    assert {view.trace.family for view in final[-1]["views"].values()} == {"toy-seed5"}
    from mulo import families

    families.unregister("toy-seed5")
    assert main(["generate", "--family", "toy-seed5", "--prompt", "cat"]) == 2
    assert "family must be one of" in capsys.readouterr().err
    families.register(toy_seed5_family.name, toy_seed5_family.summary, toy_seed5_family.module)  # for the teardown


def test_a_chain_method_s_trace_records_it_for_its_summary(engine):
    """The trace's summary reads ``chain`` from the trace itself, not from the method registry."""
    sd = engine.generate("red apple", "sd", 0)
    assert sd.trace.chain and sd.trace.summary()["mean_accepted_length"] >= 1
    assert not engine.generate("red apple", "mulo", 0).trace.chain


def test_each_family_names_its_own_example_prompts_and_each_is_one_it_reads():
    """The app's examples come from the default family's registration (a scenes family's name
    objects and backgrounds), a generic list where it names none; every shipped family reads each
    of its examples without an error or an ignored word."""
    from mulo import families
    from mulo.engine import Engine

    spec = families.register("toy-examples", "a test", "mulo.families.toy", examples=("cat on blue",))
    try:
        assert families.examples("toy-examples") == ("cat on blue",)
    finally:
        families.unregister("toy-examples")
    assert families.examples("toy") == families.GENERIC_EXAMPLES and spec.examples == ("cat on blue",)
    for name in families.trained():
        if families.get(name).shipped():
            engine = Engine(families.load_family(name))
            for prompt in families.examples(name):
                assert engine.check(prompt, "ar", 0, None)[2] == [], (name, prompt)
