"""Issue 65: where a CLI ``generate`` spends its seconds before the first token, cold and warm.

Each case runs in a fresh process (``--runs`` times, the median kept). The child stamps wall time
after each phase of what ``python -m mulo generate`` does: interpreter up, torch imported, the
engine and family modules imported (diffusers, the VQ), the family loaded, the engine built (its
compiled packages attached), the first token out of the stream (the packages loaded), the image.
The real CLI is timed beside it (whole process, and the method time it reports). Run alone:

    MULO_COMPILE_CACHE=/tmp/cc python -m mulo compile --family toy   # the warm case's packages
    MULO_COMPILE_CACHE=/tmp/cc python tools/experiments/startup.py --json benchmarks/startup.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import json, sys, time
stamps = {"interpreter": time.time()}
import torch
stamps["torch imported"] = time.time()
from mulo.engine import Engine
from mulo.families import load_family
stamps["engine and families imported"] = time.time()
family = load_family(sys.argv[1], "cpu", "auto")
stamps["family loaded"] = time.time()
engine = Engine(family, compile=sys.argv[2])
stamps["engine built"] = time.time()
stream = engine.stream("red apple", "ar", 0)
next(stream)
stamps["first round out"] = time.time()
for _ in stream:
    pass
stamps["image"] = time.time()
print(json.dumps(stamps))
"""


def child(family: str, compile_mode: str, env: dict) -> dict:
    began = time.time()
    out = subprocess.run(
        [sys.executable, "-c", CHILD, family, compile_mode], env=env, capture_output=True, text=True, check=True
    )
    stamps = json.loads(out.stdout.strip().splitlines()[-1])
    return {name: round(t - began, 3) for name, t in stamps.items()}


def cli(family: str, compile_mode: str, env: dict) -> dict:
    began = time.time()
    out = subprocess.run(
        [sys.executable, "-m", "mulo", "generate", "--family", family, "--method", "ar", "--prompt", "red apple",
         "--compile", compile_mode],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    wall = time.time() - began
    reported = float(out.stdout.split(": ", 1)[1].split(" s,", 1)[0])
    return {"wall_s": round(wall, 3), "method_s": reported}


def median_rows(rows: list[dict]) -> dict:
    return {k: round(statistics.median(r[k] for r in rows), 3) for k in rows[0]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="toy")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()
    warm_env = dict(os.environ)
    cold_env = dict(os.environ, MULO_COMPILE_CACHE=tempfile.mkdtemp(prefix="mulo-cold-"))
    cases = {
        "warm cached (the CLI's default, packages built)": ("cached", warm_env),
        "cold cached (no package built: runs eagerly)": ("cached", cold_env),
        "eager (--compile off)": ("off", warm_env),
    }
    result = {"family": args.family, "runs": args.runs, "phases_s_since_spawn": {}, "cli": {}}
    for name, (mode, env) in cases.items():
        result["phases_s_since_spawn"][name] = median_rows([child(args.family, mode, env) for _ in range(args.runs)])
        result["cli"][name] = median_rows([cli(args.family, mode, env) for _ in range(args.runs)])
        print(name, result["phases_s_since_spawn"][name], result["cli"][name], flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
