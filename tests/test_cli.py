"""``python -m mulo generate`` on the toy family: outputs, and one-line errors."""

import json

import pytest
from PIL import Image

from mulo.methods import names as method_names
from mulo.tracefile import validate
from tests.helpers import run_cli as run


@pytest.mark.slow
@pytest.mark.parametrize("method", method_names())
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


NO_CUDA = "no CUDA device is available"
NO_MPS = "no MPS device is available"


# {tmp} is an existing folder and {file} an existing regular file inside it. A case whose
# first word is a subcommand runs as given; any other runs as `generate --family toy ...`.
@pytest.mark.parametrize(
    "args,message",
    [
        (["--tau", "-1"], "error: tau must be a number in [0, 1.01]"),
        (["--radius", "-2"], "error: radius must be an integer in [0, 64]"),
        (["--r", "3"], "error: r=3 does not divide the target grid 8x8"),
        (["--method", "nope"], "error: method must be one of"),
        (["--method", "gsd", "--gsd-gap", "2"], "error: gsd_gap must be a number in [0, 1] (got 2.0)"),
        (["--method", "mc-sjd", "--sjd-window", "0"], "error: sjd_window must be an integer in [1, 128] (got 0)"),
        (["--prompt", " "], "error: prompt must not be empty"),
        (["--family", "nope"], "error: family must be one of"),
        # output paths of generate
        (["--trace", "{tmp}"], "error: --trace {tmp} is a directory, not a file"),
        (["--out", "{tmp}"], "error: --out {tmp} is a directory, not a file"),
        (["--out", "{file}/x.png"], "error: --out {file}/x.png: {file} is a file, not a directory"),
        (["--trace", "{file}/sub/t.json"], "error: --trace {file}/sub/t.json: {file} is a file, not a directory"),
        (["--out", "{tmp}/x.foo"], "error: --out {tmp}/x.foo has extension '.foo'; use .png, .jpg"),
        (["--out", "{tmp}/x.h5"], "error: --out {tmp}/x.h5 has extension '.h5'; use .png"),  # a PIL stub saver
        (["--out", "{tmp}/x"], "error: --out {tmp}/x has no extension; use .png"),
        # devices
        (["--device", "banana"], "error: --device must be cpu, cuda, cuda:N or mps (got 'banana')"),
        (["--device", "meta"], "error: --device must be cpu, cuda, cuda:N or mps (got 'meta')"),
        (["--device", "cuda"], f"error: --device cuda: {NO_CUDA}"),
        (["--device", "cuda:7"], f"error: --device cuda:7: {NO_CUDA}"),
        (["--device", "mps"], f"error: --device mps: {NO_MPS}"),
        # bench, bench --profile-ar-dtok
        (["bench", "--family", "toy", "--device", "banana"], "error: --device must be cpu, cuda, cuda:N or mps"),
        (["bench", "--family", "toy", "--device", "cuda:7"], f"error: --device cuda:7: {NO_CUDA}"),
        (["bench", "--family", "toy", "--out", "{file}"], "error: --out {file} is a file, not a directory"),
        (["bench", "--family", "toy", "--out", "{file}/o"], "error: --out {file}/o: {file} is a file, not a directory"),
        (["bench", "--family", "toy", "--json", "{tmp}"], "error: --json {tmp} is a directory, not a file"),
        (["bench", "--profile-ar-dtok", "--device", "banana"], "error: --device must be cpu, cuda, cuda:N or mps"),
        (["bench", "--profile-ar-dtok", "--device", "cuda"], f"error: --device cuda: {NO_CUDA}"),
        (["bench", "--profile-ar-dtok", "--out", "{file}"], "error: --out {file} is a file, not a directory"),
        # train
        (["train", "twemoji", "--device", "banana"], "error: --device must be cpu, cuda, cuda:N or mps"),
        (["train", "twemoji", "--device", "mps"], f"error: --device mps: {NO_MPS}"),
        (["train", "twemoji", "--run-dir", "{file}"], "error: --run-dir {file} is a file, not a directory"),
        (["train", "twemoji", "--assets", "{file}/a"], "error: --assets {file}/a: {file} is a file, not a directory"),
        (["train", "twemoji", "--cache", "{file}"], "error: --cache {file} is a file, not a directory"),
        (["train", "emoji-16", "--stages", "vq,targt"], "error: unknown stage targt: the stages are data, clip"),
        (["train", "twemoj"], "error: no recipe 'twemoj'; recipes: twemoji, "),
        (["train", "scenes", "--vq", "{tmp}/vq.pt"], "error: --vq {tmp}/vq.pt: no such file"),
        (["train", "scenes", "--vq", "{file}"], "error: --vq {file}: not the weights of a VQ (UnpicklingError)"),
    ],
)
def test_bad_input_is_one_line_and_nonzero(args, message, tmp_path, monkeypatch, capsys):
    import torch

    from mulo.__main__ import main

    if NO_CUDA in message and torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    if NO_MPS in message and torch.backends.mps.is_available():
        pytest.skip("this machine has an MPS device")
    monkeypatch.chdir(tmp_path)  # train's default --run-dir and --assets are relative: keep them out of the repo
    (tmp_path / "file").write_text("not a folder")

    def fill(text):
        return text.replace("{tmp}", str(tmp_path)).replace("{file}", str(tmp_path / "file"))

    args, message = [fill(a) for a in args], fill(message)
    if args[0] in ("bench", "train"):
        argv = args
    else:
        argv = ["generate"] + ([] if "--prompt" in args else ["--prompt", "red apple"])
        argv += ([] if "--family" in args else ["--family", "toy"]) + args
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(message), err


def _boom(*args, **kwargs):
    raise AssertionError("a model was loaded or run before the command line was checked")


@pytest.mark.parametrize(
    "argv,message",
    [
        (["generate", "--out", "{tmp}/x.foo"], "error: --out {tmp}/x.foo has extension '.foo'"),
        (["generate", "--out", "{file}/x.png"], "error: --out {file}/x.png: {file} is a file, not a directory"),
        (["generate", "--trace", "{tmp}"], "error: --trace {tmp} is a directory, not a file"),
        (["generate", "--device", "banana"], "error: --device must be cpu, cuda, cuda:N or mps"),
        (["bench", "--json", "{tmp}"], "error: --json {tmp} is a directory, not a file"),
        (["train", "twemoji", "--run-dir", "{file}/run"], "error: --run-dir {file}/run: {file} is a file"),
        (["download", "tar"], "error: the Hugging Face cache (HF_HUB_CACHE) {file}/hub: {file} is a file"),
    ],
)
def test_paths_and_device_are_checked_before_any_model_loads(argv, message, tmp_path, monkeypatch, capsys):
    """A bad path fails in a second, not after a generation, a benchmark, a training or a download."""
    import mulo.engine
    import mulo.families
    import mulo.families.tar
    import mulo.train.pipeline
    from mulo.__main__ import main

    file = tmp_path / "file"
    file.write_text("not a folder")
    for target in (mulo.engine.Engine, "__init__"), (mulo.engine.Engine, "generate"), (mulo.families, "load_family"):
        monkeypatch.setattr(*target, _boom)
    monkeypatch.setattr(mulo.train.pipeline, "run", _boom)
    monkeypatch.setattr(mulo.families.tar, "download", _boom)
    monkeypatch.setattr(mulo.families.tar, "_cache_dir", lambda: str(file / "hub"))

    def fill(text):
        return text.replace("{tmp}", str(tmp_path)).replace("{file}", str(file))

    argv = [fill(a) for a in argv]
    if argv[0] in ("generate", "bench"):
        argv += ["--family", "toy"] + (["--prompt", "red apple"] if argv[0] == "generate" else [])
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(fill(message)), err


def test_cuda_index_beyond_the_devices_present(monkeypatch, capsys):
    import torch

    from mulo.__main__ import main

    # Pretend one GPU: the check must answer before anything touches it.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert main(["generate", "--family", "toy", "--prompt", "red apple", "--device", "cuda:7"]) == 2
    err = capsys.readouterr().err
    assert err == "error: --device cuda:7: only 1 CUDA device(s) here, cuda:0 to cuda:0\n", err


def test_a_twemoji_family_without_weights_says_how_to_get_them(tmp_path, monkeypatch, capsys):
    import mulo.families.emoji
    from mulo.__main__ import main

    monkeypatch.setattr(mulo.families.emoji, "ASSETS_ROOT", tmp_path)
    (tmp_path / "scenes").mkdir()
    (tmp_path / "scenes" / "target.safetensors").touch()  # the other family is shipped
    assert main(["generate", "--family", "twemoji", "--prompt", "red apple"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"error: twemoji weights missing in {tmp_path / 'twemoji'} (clip.json, clip.safetensors, vq.json...): "
        "train them with python -m mulo train twemoji, or use --family scenes or toy\n"
    ), err


def test_unwritable_output_folder(tmp_path, monkeypatch, capsys):
    import mulo.cli_checks
    from mulo.__main__ import main

    # os.access says yes to root for every folder, so the answer is faked rather than chmod-ed.
    monkeypatch.setattr(mulo.cli_checks, "_writable", lambda path: path != tmp_path)
    out = tmp_path / "sub" / "x.png"
    assert main(["generate", "--family", "toy", "--prompt", "red apple", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == f"error: --out {out}: {tmp_path} is not writable\n", err
    assert not (tmp_path / "sub").exists()


def test_failed_final_write_is_one_line(tmp_path, monkeypatch, capsys):
    """Disk full (or a permission changed) after the checks passed: one line naming the file."""
    import errno

    import mulo.trace
    from mulo.__main__ import main

    trace = tmp_path / "x.json"

    def disk_full(self, path=None):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(mulo.trace.Trace, "to_json", disk_full)
    argv = ["generate", "--family", "toy", "--prompt", "red apple", "--method", "ar", "--trace", str(trace)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == f"error: {trace}: No space left on device\n", err


def test_every_verb_is_one_command_line(capsys):
    """The measurement verbs are ``python -m mulo VERB``, parsed by their own modules, named in
    their usage and listed in the top-level help."""
    from mulo.__main__ import DELEGATED, build_parser, main
    from mulo.config import markdown_table

    listed = build_parser().format_help()
    assert all(verb in listed for verb in DELEGATED)
    assert main(["knobs"]) == 0 and capsys.readouterr().out == markdown_table()
    for verb in DELEGATED:
        with pytest.raises(SystemExit) as stop:
            main([verb, "--help"])
        assert stop.value.code == 0 and capsys.readouterr().out.startswith(f"usage: python -m mulo {verb}")
    with pytest.raises(SystemExit) as stop:
        main(["calibrate", "--prompts", "many"])
    assert stop.value.code == 2 and "argument --prompts: invalid int value" in capsys.readouterr().err
