"""Everything the device run carries, built on this CPU beforehand (tools/device/README.md).

    python tools/device/prepare.py           # wheels, the styles bundle, the CPU's reference tokens
    python tools/device/prepare.py --train-only   # the same less the reference (a call that only trains)
    python tools/device/prepare.py --slim    # then: untrack what the device run does not need
    python tools/device/prepare.py --unslim  # after the call: track it again (before any commit)

Into ``.device/`` (git ignores it; the run tool's ``carry`` names it):
  wheels/                 packages the device machine lacks (it reaches no registry; its own torch,
                          transformers, safetensors and huggingface_hub serve): diffusers and its
                          importlib-metadata, jsonschema and its three, resvg-py (training's renders)
  styles/styles-bundle.json.xz   the emoji data's SVGs and names (~10 MB; the npm packages are ~47)
  cpu_reference.json      every method's tokens on this CPU (eager, float32) for the GPU checks
  room.json               the bytes a resume point may take for the *next* call to fit (what the
                          tree and .device leave of 64 MiB): the call's pack keeps under it

The working tree travels too, and the repository is over the run tool's 64 MiB by itself: ``--slim``
takes the paths the device run never reads out of git's index (``SLIM``; the files stay on disk and
.git/info/exclude hides them), so that the tree, ``.device`` and the resume point fit. ``--unslim``
puts them back; a commit made in between would delete them, so unslim first.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEVICE_DIR = ROOT / ".device"
LIMIT = 64 * 2**20
BUNDLE_MAX = 12 * 2**20  # the styles bundle measured 9.5 MB (2026-11); prepare fails above this
# Python 3.12 on x86-64 (the device machine's); versions pinned to what was tested there.
WHEELS = (
    "diffusers==0.42.1",
    "importlib-metadata==8.7.0",
    "jsonschema==4.26.0",
    "jsonschema-specifications==2025.9.1",
    "referencing==0.37.0",
    "rpds-py==2026.9.1",
    "resvg-py==0.5.0",
)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
# Tracked paths the device run never reads: the second family, Tar's golden test data (its
# tests are not GPU tests), the benchmark figures and the docs with their pictures.
SLIM = ("assets/scenes", "tests/data", "benchmarks", "docs")  # (a CPU run's)
# ... and for a call that only trains (``run.py --skip checks,measure``), the family it checks too:
# what leaves a growing resume point room (``--slim --train-only``).
TRAIN_ONLY = ("assets/twemoji",)
ROOM_MARGIN = 2**20  # what the tree may grow by between this count and the next call
EXCLUDE = ROOT / ".git" / "info" / "exclude"
MARK = "# device run: slimmed (tools/device/prepare.py --unslim)"


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout


def download_wheels(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(folder)]
    cmd += ["--python-version", "3.12", "--implementation", "cp"]
    for platform in PLATFORMS:
        cmd += ["--platform", platform]
    subprocess.run(cmd + list(WHEELS), check=True)


def write_bundle(out: Path, cache: Path | None) -> None:
    from mulo.train import styles

    styles.write_bundle(cache or Path.home() / ".cache" / "mulo" / "styles", out)
    size = out.stat().st_size
    if size > BUNDLE_MAX:
        raise SystemExit(f"error: {out} is {size / 2**20:.1f} MB, over the {BUNDLE_MAX / 2**20:.0f} planned")


def write_reference(family: str, out: Path) -> None:
    cmd = [sys.executable, str(ROOT / "tools/device/gpu_checks.py"), "--family", family, "--make-reference"]
    subprocess.run(cmd + ["--reference", str(out)], check=True, cwd=ROOT)


def size_of(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def travelling_bytes(carried=(".device",), without=()) -> dict[str, int]:
    """What a device call sends: tracked files (less the paths ``without``: what ``slim`` untracks),
    untracked files git does not ignore, and the carried paths (the run tool's rule), in bytes."""

    def counted(path: str) -> bool:
        inside = lambda top: path == top or path.startswith(top.rstrip("/") + "/")  # noqa: E731
        return bool(path) and not any(inside(top) for top in (*without, *carried))

    tracked = git("ls-files", "-z").split("\0")
    untracked = git("ls-files", "-z", "--others", "--exclude-standard").split("\0")
    sizes = {
        "tracked": sum(size_of(ROOT / p) for p in tracked if counted(p)),
        "untracked": sum(size_of(ROOT / p) for p in untracked if counted(p)),
    }
    for path in carried:
        sizes[path] = size_of(ROOT / path)
    sizes["total"] = sum(sizes.values())
    return sizes


def other_resume_points(train: str) -> tuple[str, ...]:
    """The committed resume points (``tools/resume/FAMILY``) of the families a call does not train:
    they never travel (the slimmed tree leaves them behind)."""
    folder = ROOT / "tools" / "resume"
    names = sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []
    return tuple(f"tools/resume/{name}" for name in names if name != train)


def slimmed_paths() -> tuple[str, ...]:
    """The paths ``slim`` took out of the index (none when the tree is whole)."""
    text = EXCLUDE.read_text() if EXCLUDE.exists() else ""
    if MARK not in text:
        return ()
    return tuple(line[1:] for line in text.partition(MARK + "\n")[2].partition(MARK)[0].splitlines())


def slim(paths: tuple[str, ...]) -> None:
    if slimmed_paths():
        print("already slimmed")
        return
    git("rm", "-r", "-q", "--cached", *paths)
    with EXCLUDE.open("a") as f:
        f.write("\n".join([MARK, *(f"/{p}" for p in paths), MARK]) + "\n")


def unslim() -> None:
    paths = slimmed_paths()
    if not paths:
        print("not slimmed")
        return
    before, _, rest = EXCLUDE.read_text().partition(MARK + "\n")
    _, _, after = rest.partition(MARK + "\n")
    EXCLUDE.write_text(before + after)
    git("reset", "-q", "--", *paths)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", default="twemoji", help="the family the GPU checks compare (default twemoji)")
    parser.add_argument("--train", default="scenes", help="the family the call trains (default scenes, issue 63's)")
    parser.add_argument("--cache", type=Path, help="the npm packages (default ~/.cache/mulo/styles)")
    parser.add_argument("--out", type=Path, default=DEVICE_DIR, help="default .device")
    parser.add_argument("--no-wheels", action="store_true", help="skip the wheels (a rehearsal: installed here)")
    parser.add_argument("--no-bundle", action="store_true", help="skip the styles bundle (a rehearsal)")
    parser.add_argument("--slim", action="store_true", help="only untrack what the device run does not read")
    parser.add_argument(
        "--train-only",
        action="store_true",
        help="a call that only trains: no CPU reference (~13 min here); with --slim, the checked family untracked too",
    )
    parser.add_argument("--unslim", action="store_true", help="only track it again")
    args = parser.parse_args(argv)
    left = (*SLIM, *other_resume_points(args.train))  # what a call leaves behind
    if args.slim or args.unslim:
        slim((*left, *TRAIN_ONLY) if args.train_only else left) if args.slim else unslim()
    else:
        if not args.no_wheels:
            download_wheels(args.out / "wheels")
        if not args.no_bundle:
            write_bundle(args.out / "styles" / "styles-bundle.json.xz", args.cache)
        if not args.train_only:  # only the checks read it (run.py --skip checks,measure does not)
            write_reference(args.family, args.out / "cpu_reference.json")
    carried = str(args.out.relative_to(ROOT)) if args.out.is_relative_to(ROOT) else str(args.out)
    slimmed = bool(slimmed_paths())
    sizes = travelling_bytes((carried,), () if slimmed else left)
    print("a device call sends (MiB):", json.dumps({k: round(v / 2**20, 1) for k, v in sizes.items()}))
    # the room a training call's resume point has in the call after it: the calls that only train
    # (a session's second, and every one once the checks and measurements are on record) slim most
    others = travelling_bytes((carried,), (*left, *TRAIN_ONLY, f"tools/resume/{args.train}"))
    room = LIMIT - others["total"] - ROOM_MARGIN
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "room.json").write_text(json.dumps({"train": args.train, "resume_bytes": room}) + "\n")
    print(f"room for tools/resume/{args.train} in a call that only trains: {room / 2**20:.1f} MiB")
    if sizes["total"] > LIMIT:
        # the resume point may have outgrown a call that checks too, not one that only trains
        if travelling_bytes((carried,), (*left, *TRAIN_ONLY))["total"] <= LIMIT:
            print("fits only a call that only trains: --slim --train-only, then run.py --skip checks,measure")
            return 0
        print(f"error: over the run tool's {LIMIT / 2**20:.0f} MiB even slimmed", file=sys.stderr)
        return 1
    if not slimmed:
        print("fits once slimmed: run --slim before the device call and --unslim after it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
