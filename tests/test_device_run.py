"""The prepared device run (issue 49), rehearsed on this CPU: ``tools/device/run.py --smoke`` runs
every step a GPU call runs (checks, measurements, training stopped at its time limit, the resume
point packed into parts that fit the files that come back) and a second call continues the
training from those parts; ``prepare.py`` builds what the call carries within the run tool's
64 MiB."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools" / "device"))

import prepare  # noqa: E402
import run as device_run  # noqa: E402


def call(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc


def test_the_step_budgets_fit_one_call_and_a_session():
    # One call: at most 10 minutes, the tool's timeout above the run's own budget; a session: 12.
    parser_default = 540
    assert sum(device_run.BUDGETS.values()) < parser_default < 600
    assert device_run.MAX_PARTS * device_run.PART_BYTES + 1 * 2**20 <= 64 * 2**20  # parts + summary + log
    assert device_run.MAX_PARTS + 2 <= 8  # files that come back


@pytest.mark.slow
def test_smoke_run_checks_measures_trains_and_resumes(tmp_path):
    first, second = tmp_path / "out1", tmp_path / "out2"
    run_dir = tmp_path / "run"
    common = ["tools/device/run.py", "--smoke", "--run-dir", str(run_dir), "--resume", str(tmp_path / "none")]
    call(*common, "--out", str(first), "--budget", "1000", "--train-budget", "20", timeout=1200)
    summary = json.loads((first / "summary.json").read_text())
    steps = summary["steps"]
    assert steps["setup"]["status"] in ("nothing to install", "smoke: installed here already")
    assert [steps[s]["status"] for s in ("checks", "measure")] == ["ok", "ok"]
    checks = steps["checks"]["gpu_checks"]
    from mulo.methods import names as method_names

    assert checks["all_graphed_equal_eager"]
    assert len(checks["rows"]) == 2 * len(method_names())  # every method, 2 dtypes
    assert all(r["execution"].count("emulated graphs") for r in checks["rows"])
    profile = steps["measure"]["profile"]
    assert profile["device"] == "cpu" and profile["family"]["name"] == "toy"
    assert all(r["floor_s"] > 0 and r["over_floor"] > 0 for r in profile["ar_dtok"])
    assert steps["measure"]["bench_quick"]["environment"]["device"] == "cpu"
    assert steps["train"]["status"] == "stopped at its time limit"
    assert steps["pack"]["status"] == "ok"
    parts = sorted(first.glob("resume.tar.part*"))
    assert parts and all(p.stat().st_size <= device_run.PART_BYTES for p in parts)
    assert len(list(first.iterdir())) <= 8
    done_first = [s for s in steps["train"]["stages_done"]]

    # the next call, on a bare machine: only the parts survive
    import shutil

    shutil.rmtree(run_dir)
    args = ["--resume", str(first), "--out", str(second), "--budget", "1000", "--skip", "checks,measure"]
    call(*common[:-2], *args, "--train-budget", "30")
    train = json.loads((second / "summary.json").read_text())["steps"]["train"]
    assert train["resumed_from"] == [p.name for p in parts]
    assert set(done_first) - {"tokens", "export"} <= set(train["stages_done"])  # rebuilt: not packed
    assert not (set(done_first) - {"tokens", "export", "card"}) & set(train["stages_this_call"])
    log = (second / "logs.txt").read_text()
    # a stage cut short goes on from its checkpoint, unless the pack left that out for room (the
    # scenes up-samplers' ~60 MB when the first call stops inside one: it then starts again)
    left_out = steps["pack"].get("left_out", [])
    for checkpoint in steps["train"]["checkpoints"]:
        stage = checkpoint.removesuffix(".ckpt")
        if stage not in done_first and not stage.startswith("vq_") and checkpoint not in left_out:
            assert f"{stage}: resuming at step" in log


def test_resume_files_keep_outputs_and_the_running_stage_only(tmp_path):
    def report(*stages):
        (tmp_path / "report.json").write_text(json.dumps({s: {} for s in stages}))

    import torch

    for name in ("clip.pt", "clip.ckpt", "vq_32.pt", "vq_32.ckpt", "tokens.npz", "target.best"):
        (tmp_path / name).write_bytes(b"x")
    torch.save({"model": {}, "step": 200, "best": {"step": 100}}, tmp_path / "target.ckpt")
    # mid-study: a candidate's weights are saved before its evaluation, so its checkpoint stays
    report("data", "clip")
    keep, running = device_run.resume_files(tmp_path)
    assert [p.name for p in keep] == ["clip.pt", "report.json", "vq_32.pt"]
    assert [p.name for p in running] == ["target.best", "target.ckpt", "vq_32.ckpt"]
    # the study chose: candidates go, the target (no report entry yet) is still running
    (tmp_path / "vq.pt").write_bytes(b"x")
    report("data", "clip", "vq", "tokens")
    keep, running = device_run.resume_files(tmp_path)
    assert [p.name for p in keep] == ["clip.pt", "report.json", "vq.pt"]
    assert [p.name for p in running] == ["target.best", "target.ckpt"]
    # best weights that are the checkpoint's own are not packed twice: unpack rebuilds them
    weights = {"w": torch.arange(3.0)}
    torch.save({"model": weights, "step": 300, "best": {"step": 300}}, tmp_path / "target.ckpt")
    keep, running = device_run.resume_files(tmp_path)
    assert [p.name for p in running] == ["target.ckpt"]
    parts = tmp_path / "parts"
    parts.mkdir()
    import tarfile

    with tarfile.open(parts / "resume.tar.part00", "w") as tar:
        tar.add(tmp_path / "target.ckpt", arcname="target.ckpt")
    device_run.unpack([parts / "resume.tar.part00"], tmp_path / "again")
    assert torch.equal(torch.load(tmp_path / "again" / "target.best", weights_only=True)["w"], weights["w"])


def test_pack_keeps_the_resume_point_within_the_next_calls_room(tmp_path, monkeypatch):
    import torch

    run_dir, device_dir = tmp_path / "run", tmp_path / "device"
    run_dir.mkdir()
    device_dir.mkdir()
    (run_dir / "report.json").write_text(json.dumps({"data": {}, "clip": {}}))
    torch.save({"w": torch.zeros(1000)}, run_dir / "clip.pt")
    model = torch.nn.Linear(200, 200)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 200)).sum().backward()
    opt.step()

    def checkpoint(step, steps):
        state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step, "steps": steps}
        torch.save({**state, "seconds": 1.0, "best": {"step": None}}, run_dir / "target.ckpt")

    def packed(room=None):
        out = tmp_path / f"out{len(list(tmp_path.glob('out*')))}"
        out.mkdir()
        run = device_run.Run(out, 60, smoke=True)
        assert device_run.pack(run, run_dir, room) == "ok"
        device_run.unpack(sorted(out.glob("resume.tar.part*")), out / "back")
        return run.summary["steps"]["pack"], out / "back"

    # mid-training: Adam's moments travel (in bfloat16), so the next call steps on from them
    checkpoint(400, 1000)
    summary, back = packed()
    state = torch.load(back / "target.ckpt", weights_only=True)
    assert len(state["optimizer"]["state"]) == 2 and "left_out" not in summary
    # trained to its last step (stopped in its evaluation): the moments stay behind
    checkpoint(1000, 1000)
    summary, back = packed()
    state = torch.load(back / "target.ckpt", weights_only=True)
    assert state["optimizer"]["state"] == {} and torch.equal(state["model"]["weight"], model.weight.detach())
    fresh = torch.optim.AdamW(torch.nn.Linear(200, 200).parameters())
    fresh.load_state_dict(state["optimizer"])  # what the loop's resume does with it
    # a room too small for the running stage: finished outputs alone come back, and it says so
    checkpoint(400, 1000)
    summary, back = packed(room=(run_dir / "clip.pt").stat().st_size + 10_000)
    assert summary["left_out"] == ["target.ckpt"] and summary["room_megabytes"] < 0.1
    assert (back / "clip.pt").exists() and not (back / "target.ckpt").exists()
    # the room prepare.py measured applies to the family it was measured for
    monkeypatch.setattr(device_run, "DEVICE_DIR", device_dir)
    (device_dir / "room.json").write_text(json.dumps({"train": "emoji", "resume_bytes": 123}))
    assert device_run.next_call_room("emoji") == 123 and device_run.next_call_room("emoji-16") is None


@pytest.mark.slow
def test_prepare_builds_what_the_call_carries_within_64_mib(tmp_path):
    out = ROOT / ".device-test"  # inside the repository, as .device is (git ignores neither: removed after)
    try:
        call("tools/device/prepare.py", "--out", str(out), "--family", "toy", "--no-bundle")
        wheels = sorted(p.name.split("-")[0].lower() for p in (out / "wheels").glob("*.whl"))
        assert wheels == sorted(w.split("==")[0].replace("-", "_") for w in prepare.WHEELS)
        reference = json.loads((out / "cpu_reference.json").read_text())
        assert reference["family"] == "toy" and set(reference["tokens"]) >= {"ar", "mulo"}
        # a call that checks fits beside the tree without a resume point; one that only trains
        # (the checked family left behind too) with the committed one
        resume_points = prepare.other_resume_points("")  # every family's (none is trained here)
        sizes = prepare.travelling_bytes((".device-test",), without=(*prepare.SLIM, *resume_points))
        assert sizes["total"] + prepare.BUNDLE_MAX <= prepare.LIMIT, sizes
        left = (*prepare.SLIM, *prepare.other_resume_points("scenes"), *prepare.TRAIN_ONLY)
        sizes = prepare.travelling_bytes((".device-test",), without=left)
        assert sizes["total"] + prepare.BUNDLE_MAX <= prepare.LIMIT, sizes
        # the room a call that only trains leaves its resume point: each committed one fits it
        room = json.loads((out / "room.json").read_text())["resume_bytes"]
        for folder in resume_points:
            committed = prepare.size_of(ROOT / folder)
            assert committed + prepare.BUNDLE_MAX <= room, (folder, committed, room)
        # a call that only trains never reads the CPU's tokens: --train-only does not compute them
        (out / "cpu_reference.json").unlink()
        only_trains = ("--train-only", "--no-wheels", "--no-bundle")
        call("tools/device/prepare.py", "--out", str(out), "--family", "toy", *only_trains)
        assert not (out / "cpu_reference.json").exists() and (out / "room.json").exists()
    finally:
        import shutil

        shutil.rmtree(out, ignore_errors=True)


@pytest.mark.parametrize("args", [["--skip", "train,bogus"], ["--budget", "100"]])
def test_run_refuses_bad_arguments_in_one_line(tmp_path, args):
    proc = subprocess.run(
        [sys.executable, "tools/device/run.py", "--smoke", "--out", str(tmp_path), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "error:" in proc.stderr.strip().splitlines()[-1]
