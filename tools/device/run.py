"""The prepared device run: one call on a lent GPU machine checks, measures and trains.

    python3 tools/device/run.py                 # on the device machine (tools/device/README.md)
    python tools/device/run.py --smoke --out D  # the same steps on this CPU, tiny sizes

In this order, each step under its own time budget (a step that runs over is stopped and the next
one starts), all of them inside ``--budget`` seconds:
  setup     the carried wheels installed into /tmp/site (the machine reaches no registry)
  checks    ``pytest -m gpu`` and ``gpu_checks.py`` (every method, eager vs CUDA graphs, float32
            and bfloat16, against the CPU's tokens that prepare.py computed)
  measure   ``bench --profile-ar-dtok`` (Tar-sized AR-DTok and the default family's target: step
            eager and graphed, verification pass, bandwidth floor) and ``bench --quick``
  train     ``train FAMILY --device cuda`` from the committed resume point (``tools/resume/FAMILY/``)
            for the time left, then the run folder packed into parts of at most 9 MB
What comes back under ``$OUT`` (at most 8 files): ``summary.json`` (every step's status, seconds
and JSON results), ``logs.txt`` and ``resume.tar.partNN``. Put the parts in ``tools/resume/FAMILY/``
and commit them: the next device call (or session) continues from there.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEVICE_DIR = ROOT / ".device"  # what prepare.py builds (git ignores it; the run tool carries it)
PART_BYTES = 9 * 2**20  # under 10 MB: the parts are committed, and Spaces refuses larger files without LFS
MAX_PARTS = 6  # 8 files come back at most, 64 MiB in all: 6 parts, the summary and the log
NOT_PACKED = ("tokens.npz",)  # rebuilt from the VQ and the data on the next call (~50-100 MB)
# finished AR stages' weights, packed in float16 (the VQ and mini-CLIP stay exact: tokens and
# metrics are computed from them)
HALVED = {f"{name}.pt" for name in ("target", "drafter_r2", "drafter_r4", "draft_model", "eagle")}
HALVED |= {"upsampler_r2.pt", "upsampler_r4.pt"}
# seconds per step on a GPU; the train step takes what is left of --budget after them. Measured
# on an H200 (2026-11-26): setup 1 s, checks 40 s of pytest and ~130 s of gpu_checks (150 s cut
# its last row), measure 90 s.
BUDGETS = {"setup": 20, "checks": 200, "measure": 120, "pack": 30}
# the rehearsal takes ~15 s of checks and ~25 s of measurements on 2 idle cores; its limits allow
# for a machine shared with other work (CI's)
SMOKE_BUDGETS = {"setup": 5, "checks": 300, "measure": 300, "pack": 30}


class Run:
    def __init__(self, out: Path, budget: float, smoke: bool):
        self.out, self.smoke = out, smoke
        self.start = time.monotonic()
        self.deadline = self.start + budget
        self.summary: dict = {"smoke": smoke, "budget_s": budget, "steps": {}}
        self.log = (out / "logs.txt").open("a")
        self.env = dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1")
        self.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), self.env.get("PYTHONPATH")]))

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def sh(self, name: str, cmd: list[str], limit: float) -> int | None:
        """Run ``cmd`` (its output into the log) for at most ``limit`` seconds; None if stopped.
        The whole process group goes: the data stage renders in worker processes."""
        limit = max(1.0, min(limit, self.left()))
        self.log.write(f"\n===== {name}: {' '.join(cmd)} (limit {limit:.0f} s)\n")
        self.log.flush()
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=self.env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            return proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            self.log.write(f"===== {name}: stopped at its limit\n")
            return None

    def step(self, name: str, fn, budget: float) -> None:
        started = time.monotonic()
        try:
            status = fn(started + min(budget, self.left()))
        except Exception as exc:  # noqa: BLE001 - a broken step must not cost the steps after it
            status = f"error: {type(exc).__name__}: {exc}"
        entry = self.summary["steps"].setdefault(name, {})
        entry.update(status=status, seconds=round(time.monotonic() - started, 1))
        self.save()
        print(f"[{time.monotonic() - self.start:6.0f} s] {name}: {status}", flush=True)

    def result(self, name: str, key: str, path: Path) -> None:
        if path.exists():
            self.summary["steps"].setdefault(name, {})[key] = json.loads(path.read_text())

    def save(self) -> None:
        self.summary["elapsed_s"] = round(time.monotonic() - self.start, 1)
        (self.out / "summary.json").write_text(json.dumps(self.summary, indent=1))


def status_of(codes: list[int | None]) -> str:
    if any(c is None for c in codes):
        return "stopped at its time limit"
    return "ok" if all(c == 0 for c in codes) else f"failed (exit codes {codes})"


def setup(run: Run, until: float) -> str:
    wheels = sorted((DEVICE_DIR / "wheels").glob("*.whl"))
    if run.smoke or not wheels:
        return "nothing to install" if not wheels else "smoke: installed here already"
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
    cmd += ["--target", "/tmp/site", *map(str, wheels)]
    code = run.sh("setup", cmd, until - time.monotonic())
    run.env["PYTHONPATH"] += os.pathsep + "/tmp/site"
    return status_of([code])


def checks(run: Run, until: float, family: str, device: str) -> str:
    codes = []
    if not run.smoke:  # the gpu tests skip on a CPU: the smoke run does not spend its time on them
        # the GPU tests' modules alone: the others import what the machine lacks (gradio, playwright)
        gpu_tests = sorted(
            str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py") if "mark.gpu" in p.read_text()
        )
        pytest = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", *gpu_tests]
        codes.append(run.sh("pytest -m gpu", pytest, min(60, until - time.monotonic())))
    out = run.out / "checks.json"
    cmd = [sys.executable, "tools/device/gpu_checks.py", "--family", family, "--device", device]
    cmd += ["--reference", str(DEVICE_DIR / "cpu_reference.json"), "--out", str(out)]
    codes.append(run.sh("gpu_checks", cmd, until - time.monotonic()))
    run.result("checks", "gpu_checks", out)
    out.unlink(missing_ok=True)  # kept in summary.json: the files that come back are few
    return status_of(codes)


def measure(run: Run, until: float, family: str, device: str) -> str:
    profile, bench = run.out / "profile.json", run.out / "bench.json"
    cmd = [sys.executable, "-m", "mulo", "bench", "--profile-ar-dtok", "--device", device, "--family", family]
    if run.smoke:
        cmd += ["--profile-preset", "test-tiny", "--profile-sides", "4,8"]
    codes = [run.sh("profile", cmd + ["--json", str(profile)], min(70, until - time.monotonic()))]
    cmd = [sys.executable, "-m", "mulo", "bench", "--quick", "--device", device, "--family", family]
    codes.append(run.sh("bench --quick", cmd + ["--json", str(bench)], until - time.monotonic()))
    for key, path in (("profile", profile), ("bench_quick", bench)):
        run.result("measure", key, path)
        path.unlink(missing_ok=True)
    return status_of(codes)


def train(run: Run, until: float, family: str, device: str, run_dir: Path, resume: Path) -> str:
    parts = sorted(resume.glob("resume.tar.part*"))
    if parts and not (run_dir / "report.json").exists():
        unpack(parts, run_dir)
    before = json.loads((run_dir / "report.json").read_text()) if (run_dir / "report.json").exists() else {}
    cmd = [sys.executable, "-m", "mulo", "train", family, "--device", device, "--run-dir", str(run_dir)]
    cmd += ["--assets", str(run_dir / "assets")]
    bundle = DEVICE_DIR / "styles" / "styles-bundle.json.xz"
    if bundle.exists():  # the data stage's renders go beside a copy, outside the carried folder
        cache = run_dir.parent / f"{run_dir.name}-cache"
        cache.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(bundle, cache / bundle.name)
        cmd += ["--cache", str(cache)]
    if run.smoke:
        cmd.append("--smoke")
    code = run.sh("train", cmd, until - time.monotonic())
    after = json.loads((run_dir / "report.json").read_text()) if (run_dir / "report.json").exists() else {}
    entry = run.summary["steps"].setdefault("train", {})
    entry.update(family=family, resumed_from=[p.name for p in parts], stages_done=list(after))
    entry["stages_this_call"] = [s for s in after if s not in before]
    entry["checkpoints"] = sorted(p.name for p in run_dir.glob("*.ckpt"))
    return "finished" if code == 0 else status_of([code])


def resume_files(run_dir: Path) -> tuple[list[Path], list[Path]]:
    """(what a compact resume point keeps, the running stages' training state): every finished
    stage's output and the report, and for a stage still running its checkpoint (weights and
    Adam state) and best weights so far. Left out: what the next call rebuilds (the token cache,
    the exported family) and a finished stage's training state."""
    report = json.loads((run_dir / "report.json").read_text()) if (run_dir / "report.json").exists() else {}
    keep, running = [], []
    for path in sorted(run_dir.iterdir()):
        if not path.is_file() or path.name in NOT_PACKED or path.name.endswith(".tmp"):
            continue
        stem = path.name.split(".")[0]
        stage = "vq" if stem.startswith("vq_") else stem  # the codebook study's candidates: the vq stage's
        if stem.startswith("vq_") and stage in report:
            continue  # a candidate, once the study chose one
        if path.suffix in (".ckpt", ".best"):
            # a stage is done once the report records it: a VQ candidate's weights are saved before
            # its evaluation, so its checkpoint stays until then
            if stage not in report and not (path.suffix == ".best" and best_is_latest(path.with_suffix(".ckpt"))):
                running.append(path)
            continue
        keep.append(path)
    return keep, running


def best_is_latest(checkpoint: Path) -> bool:
    """Whether a running stage's best weights are its checkpoint's own (then ``unpack`` rebuilds
    the ``.best`` file from the checkpoint instead of packing the same weights twice)."""
    import torch

    if not checkpoint.exists():
        return False
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    return state.get("best", {}).get("step") == state["step"]


def half_copy(path: Path, scratch: Path) -> Path:
    """A finished AR stage's weights in float16: half the bytes; its later stages (the EAGLE head
    on the target, the export, the card) read them as they would the float32 ones, and the export
    ships float16 anyway."""
    import torch

    state = torch.load(path, map_location="cpu", weights_only=True)
    state = {k: v.half() if v.is_floating_point() else v for k, v in state.items()}
    out = scratch / f"{path.name}.half"
    torch.save(state, out)
    return out


def compact_checkpoint(path: Path, scratch: Path) -> Path:
    """A running stage's checkpoint with Adam's moments in bfloat16 (the weights stay float32):
    ~2/3 of the bytes; loading casts the moments back to the parameters' dtype. A checkpoint at
    its last step (a stage stopped between its training and its evaluation) keeps no moments:
    nothing will step with them, and they are half of what has to travel to the next call."""
    import torch

    state = torch.load(path, map_location="cpu", weights_only=True)
    if finished_training(state):
        state["optimizer"]["state"] = {}
    for moments in state["optimizer"]["state"].values():
        for key in ("exp_avg", "exp_avg_sq"):
            if key in moments:
                moments[key] = moments[key].to(torch.bfloat16)
    out = scratch / f"{path.name}.half"
    torch.save(state, out)
    return out


def finished_training(state: dict) -> bool:
    """Whether a checkpoint's stage has taken all its steps (older checkpoints do not say)."""
    return "steps" in state and int(state["step"]) >= int(state["steps"])


def packed_copy(path: Path, scratch: Path) -> Path:
    """What goes into the resume point for ``path``: finished AR weights and a running stage's best
    weights in float16, a running stage's checkpoint compacted, anything else as it is."""
    if path.name in HALVED or path.suffix == ".best":
        return half_copy(path, scratch)
    if path.suffix == ".ckpt":
        return compact_checkpoint(path, scratch)
    return path


def packed_size(path: Path) -> int:
    """About the bytes ``packed_copy`` makes of ``path``: half for float16 weights and for a
    checkpoint packed without moments, two thirds for one with its moments in bfloat16."""
    size = path.stat().st_size
    if path.name in HALVED or path.suffix == ".best":
        return size // 2
    if path.suffix == ".ckpt":
        import torch

        state = torch.load(path, map_location="cpu", weights_only=True)
        return size // 2 if finished_training(state) else size - size // 3
    return size


def pack(run: Run, run_dir: Path, room: int | None = None) -> str:
    """The compact resume point (``resume_files``) as ``resume.tar.partNN`` under ``$OUT``; when
    the running stage's state does not fit the ``room`` (bytes) the next call has for it or the
    files that come back, without it (that stage then starts again)."""
    if not (run_dir / "report.json").exists():
        return "nothing to pack"
    keep, running = resume_files(run_dir)
    back = MAX_PARTS * PART_BYTES  # what can come back
    limit = back if room is None else min(back, room)
    if room is not None:
        run.summary["steps"].setdefault("pack", {})["room_megabytes"] = round(limit / 2**20, 1)
    dropped = []
    estimate = {p: packed_size(p) for p in keep + running}
    while running and sum(estimate[p] for p in keep + running) > limit:
        dropped.append(running.pop().name)
    if dropped:
        run.summary["steps"].setdefault("pack", {})["left_out"] = dropped
    tar_path = run.out / "resume.tar"
    with tarfile.open(tar_path, "w") as tar:
        for path in keep + running:
            tar.add(packed_copy(path, run.out), arcname=path.name)
    for path in run.out.glob("*.half"):
        path.unlink()
    size = tar_path.stat().st_size
    if size > back:
        tar_path.unlink()
        return f"too large to come back: {size / 2**20:.1f} MB (at most {back / 2**20:.0f})"
    if size > limit:  # finished stages alone: it comes back, and the next call must slim the tree more
        run.summary["steps"]["pack"]["over_room"] = True
    with tar_path.open("rb") as src:
        for i, chunk in enumerate(iter(lambda: src.read(PART_BYTES), b"")):
            (run.out / f"resume.tar.part{i:02d}").write_bytes(chunk)
    tar_path.unlink()
    run.summary["steps"].setdefault("pack", {})["megabytes"] = round(size / 2**20, 2)
    return "ok"


def next_call_room(family: str) -> int | None:
    """The bytes the next call can carry of ``family``'s resume point beside the tree, as
    ``prepare.py`` measured them (``room.json``); None where it did not (a rehearsal)."""
    path = DEVICE_DIR / "room.json"
    room = json.loads(path.read_text()) if path.exists() else {}
    return int(room["resume_bytes"]) if room.get("train") == family else None


def unpack(parts: list[Path], run_dir: Path) -> None:
    """A run folder from the parts ``pack`` wrote."""
    run_dir.mkdir(parents=True, exist_ok=True)
    joined = run_dir / "resume.tar.tmp"
    with joined.open("wb") as out:
        for part in parts:
            out.write(part.read_bytes())
    with tarfile.open(joined) as tar:
        tar.extractall(run_dir, filter="data")
    joined.unlink()
    import torch

    for checkpoint in run_dir.glob("*.ckpt"):  # best weights left out as the checkpoint's own
        best = checkpoint.with_suffix(".best")
        if not best.exists() and best_is_latest(checkpoint):
            torch.save(torch.load(checkpoint, map_location="cpu", weights_only=True)["model"], best)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="this CPU, tiny sizes: a rehearsal (tests)")
    parser.add_argument("--out", type=Path, default=os.environ.get("OUT"), help="where results go (default $OUT)")
    parser.add_argument("--budget", type=float, default=540, help="seconds for the whole run (default 540)")
    parser.add_argument("--family", default="twemoji", help="the family checked and measured (default twemoji)")
    parser.add_argument("--train", default="scenes", help="the family trained (default scenes, the one in training)")
    parser.add_argument(
        "--train-budget", type=float, help="at most this many seconds of training (default: what is left)"
    )
    parser.add_argument("--skip", default="", help="comma-separated steps to skip (e.g. checks,measure)")
    parser.add_argument("--run-dir", type=Path, help="the training run folder (default runs/device-TRAIN)")
    parser.add_argument("--resume", type=Path, help="the resume point's parts (default tools/resume/TRAIN, committed)")
    parser.add_argument("--pack-only", type=Path, metavar="RUN_DIR", help="only pack RUN_DIR's resume point into --out")
    parser.add_argument("--unpack-only", type=Path, metavar="RUN_DIR", help="only unpack --resume's parts into RUN_DIR")
    args = parser.parse_args(argv)
    if args.out is None and not args.unpack_only:
        parser.error("--out is needed where $OUT is not set")
    if args.unpack_only:  # a committed resume point back into a run folder (``--resume``'s parts)
        unpack(
            sorted((args.resume or ROOT / "tools" / "resume" / args.train).glob("resume.tar.part*")), args.unpack_only
        )
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    if args.pack_only:  # a CPU run's resume point, to commit (tools/resume/FAMILY/), as a device call packs one
        run = Run(args.out, 60, smoke=True)
        print(pack(run, args.pack_only), json.dumps(run.summary["steps"].get("pack", {})))
        (args.out / "summary.json").unlink(missing_ok=True)
        (args.out / "logs.txt").unlink(missing_ok=True)
        return 0
    device = "cpu" if args.smoke else "cuda"
    family = "toy" if args.smoke else args.family
    run_dir = args.run_dir or ROOT / "runs" / f"device-{args.train}"
    budgets = SMOKE_BUDGETS if args.smoke else BUDGETS
    skip = set(filter(None, args.skip.split(",")))
    unknown = skip - {"checks", "measure", "train"}
    if unknown:
        parser.error(f"--skip: unknown step(s) {', '.join(sorted(unknown))} (checks, measure, train)")
    others = sum(seconds for step, seconds in budgets.items() if step not in skip)
    if "train" not in skip and others >= args.budget:
        parser.error(f"--budget {args.budget:.0f} s leaves no time to train (the other steps take {others})")
    run = Run(args.out, args.budget, args.smoke)
    run.summary.update(family=family, device=device, python=sys.version.split()[0])
    run.step("setup", lambda until: setup(run, until), budgets["setup"])
    import torch  # after setup: the carried packages sit beside the machine's own

    if device == "cuda" and torch.cuda.is_available():
        run.summary["device_name"] = torch.cuda.get_device_name()
    run.summary["torch"] = torch.__version__
    if "checks" not in skip:
        run.step("checks", lambda until: checks(run, until, family, device), budgets["checks"])
    if "measure" not in skip:
        run.step("measure", lambda until: measure(run, until, family, device), budgets["measure"])
    if "train" not in skip:
        train_budget = run.left() - budgets["pack"]
        if args.train_budget is not None:
            train_budget = min(train_budget, args.train_budget)
        resume = args.resume or ROOT / "tools" / "resume" / args.train
        run.step("train", lambda until: train(run, until, args.train, device, run_dir, resume), train_budget)
        run.step("pack", lambda until: pack(run, run_dir, next_call_room(args.train)), budgets["pack"])
    run.save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
