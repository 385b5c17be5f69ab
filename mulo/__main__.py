"""Command line: ``python -m mulo generate --prompt "red apple" --method mulo --seed 0``.

The one entry point for everything a user runs: ``generate``, ``train``, ``bench``, ``download``
here, and the measurement verbs (``calibrate``, ``generalisation``, ``study``, ``peek``,
``oracle``, ``knobs``), each handed to its module's ``main`` with the rest of the command line.

Every knob of ``GenerationConfig`` is a flag named by its key (``rows_per_block`` ->
``--rows-per-block``; the guidance scale is ``--cfg``, also ``--guidance``), its help the field's
own. Methods come from the registry (``mulo.methods``). Bad input ends with one ``error:`` line
and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from mulo import families
from mulo.cli_checks import UsageError, check_device, check_output_dir, check_output_file, image_suffixes
from mulo.config import COMPILE_MODES, WIDE_MODES, flags, knob_table
from mulo.families import DEFAULT_FAMILY, DTYPES, resolve_dtype

log = logging.getLogger("mulo")


def _knob_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("method knobs (defaults: the family's recommended values)")
    for knob in knob_table():
        help_text = f"{knob.help} (default {knob.default}; {knob.described()})"
        if knob.kind == "bool":
            action = argparse.BooleanOptionalAction
            group.add_argument(*flags(knob), dest=knob.key, action=action, default=None, help=help_text)
        else:
            kind = {"integer": int, "number": float, "choice": str}[knob.kind]
            group.add_argument(
                *flags(knob), dest=knob.key, type=kind, default=None, metavar=knob.key.upper(), help=help_text
            )


def _method_help() -> str:
    from mulo import methods

    listed = "; ".join(f"{m.name}: {m.summary}" for m in methods.REGISTRY.values())
    return f"decoding method (default mulo). {listed}"


def _family_help() -> str:
    return families.described(families.names())


GENERATE_COMPILE_HELP = (
    "the narrow passes' compiled packages (mulo.compiled). cached (default): use those already built "
    "(python -m mulo compile), run the others eagerly: a one-off image never waits on a compiler; "
    "on/auto: build missing ones first (~20 s each, said as they start); off: eager"
)
COMPILE_HELP = (
    "compile the narrow passes ahead of time (mulo.compiled; auto: on a CPU with a C++ compiler, "
    "unless MULO_COMPILE=off)"
)

BENCH_COMPILE_HELP = (
    COMPILE_HELP + "; default auto, with --quick cached: the packages already built (python -m mulo "
    "compile), the other passes eager, so a cold cache never spends ~8 min compiling for a 1.5 min look"
)


WIDE_HELP = (
    "precision of the wide passes' layers (over 64 queries: verification, wide waves; mulo.wide): auto = "
    "whichever measured faster on this CPU, per model and width (bfloat16 needs bf16 matrix units), unless "
    "MULO_WIDE_PRECISION says otherwise"
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m mulo", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate one image and its trace")
    gen.add_argument("--prompt", required=True)
    gen.add_argument(
        "--family",
        default=DEFAULT_FAMILY,
        help=f"model family (default {DEFAULT_FAMILY}). {_family_help()}",
    )
    gen.add_argument("--method", default="mulo", help=_method_help())
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--device", default="cpu")
    gen.add_argument("--dtype", default="auto", choices=DTYPES, help="AR models' dtype (auto: bfloat16 on CUDA)")
    gen.add_argument("--compile", default="cached", choices=COMPILE_MODES, help=GENERATE_COMPILE_HELP)
    gen.add_argument("--wide-precision", default="auto", choices=WIDE_MODES, help=WIDE_HELP)
    gen.add_argument("--out", type=Path, help="write the image here (PNG)")
    gen.add_argument("--trace", type=Path, help="write the trace here (JSON)")
    _knob_flags(gen)
    tr = sub.add_parser("train", help="train a model family from its recipe (docs/training.md)")
    tr.add_argument(
        "family", metavar="RECIPE", help="a recipe of mulo/train/recipes.py, e.g. twemoji, emoji-16, scenes"
    )
    tr.add_argument("--smoke", action="store_true", help="a few steps of every stage on a few images")
    tr.add_argument("--device", default="cpu")
    tr.add_argument("--run-dir", type=Path, help="checkpoints and the report (default runs/FAMILY)")
    tr.add_argument("--assets", type=Path, help="where export writes the family (default assets/FAMILY)")
    tr.add_argument(
        "--cache",
        type=Path,
        help="data cache (default ~/.cache/mulo/twemoji; emoji and scenes: ~/.cache/mulo/styles)",
    )
    tr.add_argument("--stages", help="comma-separated subset of stages")
    tr.add_argument(
        "--vq",
        type=Path,
        metavar="FILE",
        help="the VQ stage takes these weights (a VQ state dict of the recipe's kind and architecture, e.g. "
        "another run's vq.pt) instead of training one: runs that differ only after the VQ share one this way",
    )
    tr.add_argument(
        "--adopt",
        type=Path,
        metavar="FOLDER",
        help="seed the run folder with an exported family's weights and report first (to add a stage, "
        "e.g. eagle, to a family trained before it existed)",
    )
    be = sub.add_parser("bench", help="speed and quality of every method, side by side (the paper's table)")
    be.add_argument("--family", default=DEFAULT_FAMILY)
    be.add_argument("--device", default="cpu")
    be.add_argument("--dtype", default="auto", choices=DTYPES, help="AR models' dtype (auto: bfloat16 on CUDA)")
    be.add_argument("--compile", choices=COMPILE_MODES, help=BENCH_COMPILE_HELP)
    be.add_argument("--wide-precision", default="auto", choices=WIDE_MODES, help=WIDE_HELP)
    be.add_argument("--quick", action="store_true", help="2 prompts, 9 methods: ~1.5 min on 2 CPU cores")
    be.add_argument(
        "--prompts",
        type=int,
        help="number of prompts (default: the family's evaluation list, twemoji's 120; --quick 2)",
    )
    table, others = _bench_labels()
    be.add_argument("--methods", help=f"comma-separated labels (default {', '.join(table)}; also {', '.join(others)})")
    be.add_argument("--json", type=Path, help="write the result here (JSON)")
    be.add_argument("--out", type=Path, help="write table.json / table.md / table.png (and sweep plots) here")
    be.add_argument("--sweeps", action="store_true", help="also run the sweeps and ablations (one plot each)")
    be.add_argument("--sweep-prompts", type=int, default=16, help="prompts per sweep point (default 16)")
    be.add_argument(
        "--profile-ar-dtok",
        action="store_true",
        help="only profile a Tar-sized AR-DTok (random weights) and --family's target (--family none: "
        "not): one step, eager and CUDA-graphed, vs one verification pass and vs the step's bandwidth floor",
    )
    be.add_argument(
        "--profile-preset",
        default="llama-abs-LP",
        help="with --profile-ar-dtok: the AR-DTok size (default Tar's llama-abs-LP; test-tiny: rehearsals)",
    )
    be.add_argument(
        "--profile-sides", default="32,64", help="with --profile-ar-dtok: grid sides, comma-separated (default 32,64)"
    )
    dl = sub.add_parser("download", help="fetch a family's weights into the Hugging Face cache (tar)")
    dl.add_argument("family", choices=["tar"])
    dl.add_argument("--llm", choices=["1.5b", "7b"], default="1.5b", help="Tar-1.5B or Tar-7B (default 1.5b)")
    dl.add_argument(
        "--res", type=int, choices=[512, 1024], default=512, help="AR-DTok target: 512 px (r=2) or 1024 px (r=4)"
    )
    co = sub.add_parser("compile", help="build a family's compiled passes ahead (what the Dockerfile runs)")
    co.add_argument("--family", default=DEFAULT_FAMILY, help=f"(default {DEFAULT_FAMILY})")
    co.add_argument("--dtype", default="auto", choices=DTYPES, help="AR models' dtype (compiled passes: float32)")
    for verb, (_, summary) in DELEGATED.items():  # listed here; parsed by their own modules
        sub.add_parser(verb, help=summary, add_help=False)
    return parser


# Verbs whose module parses its own arguments: verb -> (module with ``main(argv)``, one-line help).
DELEGATED = {
    "calibrate": ("mulo.eval.calibrate", "a family's MuLo-SD defaults by the paper's protocol"),
    "generalisation": ("mulo.eval.generalisation", "a target's held-out loss and its seeds' diversity"),
    "study": ("mulo.eval.probes.study", "a training run's geometry study (losses, ceilings, generalisation)"),
    "peek": ("mulo.eval.probes.peek", "a look at a target still training, scored as the model card scores"),
    "oracle": ("mulo.eval.probes.oracle", "the oracle MuLo-SD table of a VQ tokenizer"),
    "scenes-study": ("mulo.eval.probes.scenes_study", "the emoji scenes study's table, from its candidates' runs"),
    "locality": ("mulo.eval.locality", "a scenes family's locality bars: layouts over seeds, islands per object, tau"),
    "knobs": ("mulo.config", "print the knob table (docs/method.md's)"),
}


def _bench_labels() -> tuple[list[str], list[str]]:
    """The labels of the full table, and the other labels of SPECS (MuLo-SD at the family's knobs)."""
    from mulo.eval.bench import TABLE_LABELS
    from mulo.eval.harness import SPECS

    return TABLE_LABELS, [label for label in SPECS if label not in TABLE_LABELS]


def cmd_bench(args) -> int:
    if args.profile_ar_dtok:
        return cmd_profile(args)
    if args.family == "none":
        raise UsageError("--family none is for --profile-ar-dtok alone")
    from mulo.families import check_available

    check_available(args.family)
    if args.prompts is not None and args.prompts < 1:
        raise ValueError(f"--prompts must be at least 1 (got {args.prompts})")
    # A benchmark takes minutes to hours: every input is checked before the first model loads.
    check_device(args.device)
    if args.json:
        check_output_file("--json", args.json)
    if args.out:
        check_output_dir("--out", args.out)

    from mulo.engine import Engine
    from mulo.eval import bench
    from mulo.eval.harness import SPECS
    from mulo.families import load_family

    labels = args.methods.split(",") if args.methods else None
    unknown = sorted(set(labels or []) - set(SPECS))
    if unknown:
        raise ValueError(f"unknown method label(s) {', '.join(unknown)}; known: {', '.join(SPECS)}")
    # --quick on a cold cache compiled 26 packages (~8 min) for ~1.5 min of work (docs/cpu-engine.md);
    # MULO_COMPILE, when set, still rules as it does for auto
    compile_mode = args.compile or ("cached" if args.quick and "MULO_COMPILE" not in os.environ else "auto")
    engine = Engine(
        load_family(args.family, args.device, args.dtype), compile=compile_mode, wide_precision=args.wide_precision
    )
    result = bench.run(engine, quick=args.quick, n_prompts=args.prompts, labels=labels)
    bench.save(result, args.out, args.json)
    print(bench.markdown(result))
    sweep_results = None
    if args.sweeps:
        from mulo.eval import sweeps

        sweep_results = sweeps.run_all(engine, args.sweep_prompts, args.out)
    if args.out:
        bench.write_results(args.out, result, sweep_results, "python -m mulo " + " ".join(sys.argv[1:]))
    return 0


def cmd_profile(args) -> int:
    check_device(args.device)
    if args.out:
        check_output_dir("--out", args.out)
    if args.json:
        check_output_file("--json", args.json)

    import torch

    from mulo.eval import profile
    from mulo.families import check_available, load_family

    dtype = resolve_dtype(args.dtype, args.device)
    device = torch.device(args.device)
    bytes_per_s = profile.bandwidth(device, 1024 if device.type == "cuda" else 256)
    try:
        sides = tuple(int(side) for side in args.profile_sides.split(","))
    except ValueError:
        raise UsageError(f"--profile-sides must be grid sides such as 32,64 (got {args.profile_sides!r})") from None
    if not sides or min(sides) < 2 or max(sides) > 128:
        raise UsageError(f"--profile-sides must be between 2 and 128 (got {args.profile_sides!r})")
    rows = profile.profile(args.profile_preset, sides, device=device, dtype=dtype)
    rows = profile.add_floor(rows, bytes_per_s)
    result = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": str(dtype).replace("torch.", ""),
        "bandwidth_GBps": bytes_per_s / 1e9,
        "ar_dtok": rows,
    }
    for r in rows:
        print(f"AR-DTok {r['side']}x{r['side']}: {_profile_line(r)}")
    if args.family != "none":  # the family's own target at its own shapes (batch 1: its defaults use no CFG)
        check_available(args.family)
        family = load_family(args.family, args.device, args.dtype)
        cond = family.condition("grinning face", 0)[None]
        if family.defaults.get("cfg", 1.0) != 1.0:
            cond = torch.cat([cond, family.target.null_condition(cond)])
        (row,) = profile.add_floor([profile.profile_model(family.target, cond)], bytes_per_s)
        result["family"] = {"name": args.family, **row}
        print(f"{args.family} target: {_profile_line(row)}")
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "ar_dtok_profile.json").write_text(text)
    if args.json:
        args.json.write_text(text)
    return 0


def _profile_line(r: dict) -> str:
    graphed = (
        f", graphed {r['step_graphed_s'] * 1e3:.3f} ms ({r['graph_speedup']:.1f}x)" if "step_graphed_s" in r else ""
    )
    return (
        f"step {r['step_s'] * 1e3:.3f} ms{graphed}, floor {r['floor_s'] * 1e3:.3f} ms "
        f"(best {r['over_floor']:.1f}x it), verification pass {r['verify_s'] * 1e3:.2f} ms, ratio {r['ratio']:.1f}"
    )


def cmd_download(args) -> int:
    from mulo.families import tar

    variant = tar.Variant(args.llm, args.res)
    # The only output is the Hugging Face cache; a read-only one should fail now, not after gigabytes.
    check_output_dir("the Hugging Face cache (HF_HUB_CACHE)", Path(tar._cache_dir()))
    try:
        paths = tar.download(variant)
    except Exception as exc:  # noqa: BLE001 - network, disk, authentication: one line, no traceback
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        reason = f"{type(exc).__name__}: {lines[0] if lines else 'no details'}"
        raise DownloadError(f"downloading {variant.name} from the Hugging Face Hub failed ({reason})") from None
    for field_name, path in vars(paths).items():
        print(f"{field_name}: {path}")
    print(f"ready: python -m mulo generate --family {variant.name} --device cuda --prompt ...")
    return 0


class DownloadError(RuntimeError):
    pass


def cmd_compile(args) -> int:
    from mulo.families import check_available

    check_available(args.family)
    from mulo import compiled
    from mulo.families import load_family

    why = compiled.unavailable_reason()
    if why:
        raise UsageError(f"cannot compile here: {why}; the passes run eagerly")
    from mulo.engine import Engine

    family = load_family(args.family, "cpu", args.dtype)
    # CFG runs a batch of 2: build for the guidance a default request uses (the family's default
    # or the knob table's), batch 1 beside it for requests that turn guidance off
    cfg = Engine(family, compile="off").make_config(None).guidance != 1.0
    built, present = compiled.build_all(family.transformers(), batches=(1, 2) if cfg else (1,))
    print(f"{args.family}: {built} package(s) built, {present} already in {compiled.cache_dir()}")
    return 0


def cmd_generate(args) -> int:
    from mulo.families import check_available

    check_available(args.family)  # a missing-weights error in well under a second
    # Device and outputs before the model loads: a bad --out must not cost a whole generation.
    check_device(args.device)
    if args.out:
        check_output_file("--out", args.out, image_suffixes())
    if args.trace:
        check_output_file("--trace", args.trace)

    from PIL import Image

    from mulo import compiled
    from mulo.engine import Engine
    from mulo.families import load_family

    knobs = {k.key: getattr(args, k.key) for k in knob_table() if getattr(args, k.key) is not None}
    engine = Engine(
        load_family(args.family, args.device, args.dtype), compile=args.compile, wide_precision=args.wide_precision
    )
    result = engine.generate(args.prompt, args.method, args.seed, knobs)
    summary = result.trace.summary()
    if result.trace.condition_text:
        print(
            f"note: conditioned on {result.trace.condition_text!r}, the emoji whose short name is "
            f"{result.trace.prompt!r} (--no-aliases: the prompt as typed)",
            file=sys.stderr,
        )
    for warning in result.trace.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if compiled.shapes_not_built(engine.family.transformers())[0]:  # cached mode
        print(
            f"note: some passes ran eagerly, their compiled packages not built yet "
            f"(python -m mulo compile --family {args.family} builds them once)",
            file=sys.stderr,
        )
    if args.out:
        Image.fromarray(result.image).save(args.out)  # its folder was made by check_output_file
    if args.trace:
        result.trace.to_json(args.trace)
    rate = summary["acceptance_rate"]
    print(
        f"{args.method} on {args.family}: {summary['latency_s']:.3f} s, "
        f"NFE target {summary['nfe']['target']} drafter {summary['nfe']['drafter']}, "
        f"{summary['rounds']} rounds, acceptance {'n/a' if rate is None else f'{rate:.3f}'}, "
        f"re-opened {summary['reopened_fraction']:.3f}"
    )
    return 0


def cmd_train(args) -> int:
    # Training runs for hours: check where it writes (and reads its cache) before starting.
    check_device(args.device)
    args.run_dir = args.run_dir or Path("runs") / args.family
    args.assets = args.assets or Path("assets") / args.family
    check_output_dir("--run-dir", args.run_dir)
    check_output_dir("--assets", args.assets)
    if args.cache:
        check_output_dir("--cache", args.cache)
    if args.vq and not args.vq.is_file():
        raise UsageError(f"--vq {args.vq}: no such file")
    if args.adopt and not (args.adopt / "training_report.json").is_file():
        raise UsageError(f"--adopt {args.adopt}: not an exported family (no training_report.json there)")

    from mulo.train import pipeline
    from mulo.train.recipes import RECIPES

    if args.family not in RECIPES:
        raise UsageError(f"no recipe {args.family!r}; recipes: {', '.join(RECIPES)}")
    if args.vq:  # before the data stage's minutes: a file of another VQ fails now
        pipeline.check_vq(RECIPES[args.family], args.vq)
    logging.getLogger("mulo").setLevel(logging.INFO)
    only = args.stages.split(",") if args.stages else None
    report = pipeline.run(
        args.family, args.run_dir, args.assets, args.smoke, args.device, only, args.cache, adopt=args.adopt, vq=args.vq
    )
    print(json.dumps(report, indent=1))
    return 0


def main(argv=None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in DELEGATED:
        import importlib

        module = importlib.import_module(DELEGATED[argv[0]][0])
        return module.main(argv[1:], prog=f"python -m mulo {argv[0]}") or 0
    args = build_parser().parse_args(argv)
    # a compile says what it builds and for how long (one line each), never a silent stall
    compile_log = logging.getLogger("mulo.compiled")
    compile_log.setLevel(logging.INFO)
    if not compile_log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        compile_log.addHandler(handler)
        compile_log.propagate = False
    try:
        commands = {"generate": cmd_generate, "train": cmd_train, "download": cmd_download, "bench": cmd_bench}
        return {**commands, "compile": cmd_compile}[args.command](args)
    except (ValueError, DownloadError) as exc:  # ConfigError and cli_checks.UsageError are ValueErrors
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        # Outputs were checked up front, but the final writes can still fail (disk full, a
        # permission changed meanwhile): one line naming the file. Missing weights
        # (tar.MissingWeights, a FileNotFoundError) carry no filename, only their message.
        message = f"{exc.filename}: {exc.strerror or exc}" if exc.filename else str(exc)
        print(f"error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
