"""Bad knobs raise one clear error naming the knob and the allowed range."""

from dataclasses import fields

import pytest

from mulo.config import ConfigError, GenerationConfig


@pytest.mark.parametrize(
    "method,knobs,message",
    [
        ("mulo", {"tau": -0.1}, r"tau must be a number in \[0, 1.01\] \(got -0.1\)"),
        ("mulo", {"radius": -1}, r"radius must be an integer in \[0, 64\] \(got -1\)"),
        ("mulo", {"r": 3}, r"r=3 does not divide the target grid 8x8"),
        ("mulo", {"r": 8}, r"r must be one of 2, 4 \(the family's drafter ratios\) \(got 8\)"),
        ("mulo", {"k": 500}, r"k must be an integer in \[0, 127\]"),
        ("mulo", {"top_p": 0}, r"top_p must be a number in \[0.01, 1\]"),
        ("mulo", {"drafting": "tree"}, r"drafting must be one of sequential, zipar"),
        ("mulo", {"resampling": "all"}, r"resampling must be one of raster, islands"),
        ("mulo", {"rows_per_block": 1.5}, r"rows_per_block must be an integer"),
        ("sjd", {"sjd_window": 0}, r"sjd_window must be an integer in \[1, 128\]"),
        ("zipar", {"zipar_window": 0}, r"zipar_window must be"),
        ("lantern", {"delta": -1}, r"delta must be a number in \[0, 10\]"),
        ("lantern", {"lantern_k": 128}, r"lantern_k must be -1 \(auto\) or an integer in \[0, 127\] \(got 128\)"),
        ("lantern_chain", {"lantern_k": -2}, r"lantern_k must be -1 \(auto\) or an integer in \[0, 127\]"),
        ("lantern", {"lantern_k": 2.5}, r"lantern_k must be -1 \(auto\) or an integer in \[0, 127\] \(got 2.5\)"),
        ("lantern", {"lantern_k": True}, r"lantern_k must be -1 \(auto\) or an integer"),
        ("ar", {"temperature": float("nan")}, r"temperature must be a number"),
        ("ar", {"bogus": 1}, r"unknown knob\(s\): bogus"),
        (
            "beam",
            {},
            r"method must be one of ar, zipar, sjd, sd, lantern, mulo, eagle2, lantern_chain, mc-sjd, gsd "
            r"\(got 'beam'\)",
        ),
    ],
)
def test_invalid_knobs(engine, method, knobs, message):
    with pytest.raises(ConfigError, match=message):
        engine.generate("red apple", method, 0, knobs)


@pytest.mark.parametrize(
    "prompt,message",
    [
        ("", "prompt must not be empty"),
        ("   ", "prompt must not be empty"),
        ("x" * 301, "at most 300 characters"),
        (None, "prompt must be a string"),
    ],
)
def test_invalid_prompts(engine, prompt, message):
    with pytest.raises(ConfigError, match=message):
        engine.generate(prompt, "ar", 0)


@pytest.mark.parametrize("seed", [-1, 1.5, "3", True])
def test_invalid_seed(engine, seed):
    with pytest.raises(ConfigError, match="seed must be an integer"):
        engine.generate("red apple", "ar", seed)


def test_family_defaults_apply_under_request_values(engine):
    engine.family.defaults = {"tau": 0.3, "k": 5}
    try:
        cfg = engine.make_config({"k": 2})
    finally:
        engine.family.defaults = {}
    assert (cfg.tau, cfg.k) == (0.3, 2)
    assert engine.make_config(None) == GenerationConfig()


def test_rows_per_block_auto():
    assert GenerationConfig(drafting="sequential").resolved_rows_per_block(16) == 1
    assert GenerationConfig(drafting="zipar").resolved_rows_per_block(16) == 16
    assert GenerationConfig(rows_per_block=40).resolved_rows_per_block(16) == 16


def test_lantern_k_auto_is_lanterns_share_of_the_codebook():
    """-1 pools what LANTERN pools on LlamaGen, k = 1000 of 16384 codes, on any codebook."""
    auto = GenerationConfig()
    assert auto.lantern_k == -1
    assert [auto.resolved_lantern_k(v) for v in (16384, 128, 32, 8, 2)] == [1000, 8, 2, 1, 1]
    assert GenerationConfig(lantern_k=0).resolved_lantern_k(32) == 0  # no pooling: EAGLE-2's walk
    assert GenerationConfig(lantern_k=5).resolved_lantern_k(32) == 5


def test_the_guidance_scale_is_guidance_in_code_and_cfg_outside():
    from mulo.config import knob_table

    config = GenerationConfig.from_dict({"cfg": 2.5})
    assert config.guidance == 2.5 and config.to_dict()["cfg"] == 2.5 and "guidance" not in config.to_dict()
    assert GenerationConfig.from_dict({"guidance": 3.0}).guidance == 3.0
    with pytest.raises(ConfigError, match="given twice"):
        GenerationConfig.from_dict({"cfg": 2.0, "guidance": 3.0})
    assert GenerationConfig.from_dict(GenerationConfig().to_dict()) == GenerationConfig()
    assert [k.key for k in knob_table()].count("cfg") == 1 and len(knob_table()) == len(fields(GenerationConfig))


def test_every_knob_has_a_help_line_shown_by_the_cli(capsys):
    from mulo.__main__ import main
    from mulo.config import knob_table

    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    for key, text in ((k.key, k.help) for k in knob_table()):
        assert text and f"{' '.join(text.split())} (default" in shown, key
        assert "--" + key.replace("_", "-") in shown
    assert "--cfg CFG, --guidance CFG" in shown


def test_the_cli_takes_guidance_under_either_flag(tmp_path):
    from mulo.__main__ import main
    from mulo.tracefile import read_trace_file

    for flag in ("--cfg", "--guidance"):
        path = tmp_path / f"{flag[2:]}.json"
        args = ["generate", "--family", "toy", "--method", "ar", "--prompt", "red apple", flag, "2.5"]
        assert main([*args, "--trace", str(path)]) == 0
        assert read_trace_file(path).config["cfg"] == 2.5
