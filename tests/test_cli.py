"""``python -m mulo generate`` on the toy family: outputs, and one-line errors."""

import json

import pytest
from PIL import Image

from mulo.config import METHODS
from mulo.trace import validate
from tests.helpers import run_cli as run


@pytest.mark.parametrize("method", METHODS)
def test_generate_writes_image_and_valid_trace(method, tmp_path):
    out, trace = tmp_path / "x.png", tmp_path / "x.json"
    proc = run(
        "generate",
        "--family",
        "toy",
        "--prompt",
        "red apple",
        "--method",
        method,
        "--seed",
        "0",
        "--out",
        str(out),
        "--trace",
        str(trace),
        "--rows-per-block",
        "2",
        "--no-refresh",
    )
    assert proc.returncode == 0, proc.stderr
    assert Image.open(out).size == (32, 32)
    data = json.loads(trace.read_text())
    validate(data)
    assert data["config"]["rows_per_block"] == 2 and data["config"]["refresh"] is False
    assert method in proc.stdout


@pytest.mark.parametrize(
    "args,message",
    [
        (["--tau", "-1"], "error: tau must be a number >= 0"),
        (["--radius", "-2"], "error: radius must be an integer in [0, 64]"),
        (["--r", "3"], "error: r=3 does not divide the target grid 8x8"),
        (["--method", "nope"], "error: method must be one of"),
        (["--prompt", " "], "error: prompt must not be empty"),
        (["--family", "nope"], "error: family must be one of"),
    ],
)
def test_bad_input_is_one_line_and_nonzero(args, message, capsys):
    from mulo.__main__ import main

    argv = ["generate"] + ([] if "--prompt" in args else ["--prompt", "red apple"])
    argv += ([] if "--family" in args else ["--family", "toy"]) + args
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(message), err
