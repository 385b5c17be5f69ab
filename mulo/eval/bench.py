"""``python -m mulo bench``: the paper's speed/quality table on our models, measured side by side.

Every method runs the same prompts with the same seeds in one process, interleaved by
``mulo.eval.harness``: after a warm-up pass, each prompt runs every method, the order rotating
from prompt to prompt, so drift of the machine (clock, cache, other load) hits all methods alike.
Speed-up is the median over requests of (AR latency / method latency) on the same request; NFE and
acceptance come from the traces; quality is the family's own metrics (twemoji: FD and adherence
in mini-CLIP space).

Ideal bound of a method: what it would cost if every draft were accepted, i.e. its drafting time
plus one verification pass of the target over the whole grid (CFG batch). The table reports the
speed-up that bound allows and the fraction of it the method reaches.

NFE speed-up: AR's sequential passes / the method's, a drafter pass weighted by the measured cost
of one drafter step relative to one target step (one cached token each, CFG batch). It is what
the speed-up would be if every pass cost what a single-token step costs, so it separates how many
passes a method needs from how much a pass over many tokens costs here.

Cost speed-up: every pass priced by its model and width (``costs.PassCosts``: passes timed per
width bucket until stable), AR's total / the method's, median over requests. Between the two:
what the passes cost on this machine, without the Python and sampling overhead around them.

Against the eager AR: where the engine runs compiled passes (``mulo.compiled``), AR also runs on an
eager copy of the family over the same prompts and seeds, after the table, and each method's
speed-up over that AR is reported beside the one over the compiled AR: what the faster AR did to
each method's CPU lead.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from mulo import compiled, wide
from mulo.eval import costs as pass_costs
from mulo.eval import floor as pass_floor
from mulo.eval import harness
from mulo.eval.harness import Measured
from mulo.eval.quality import Quality

if TYPE_CHECKING:  # the engine pulls in diffusers: the CLI's --help lists the labels without it
    from mulo.engine import Engine

# The full table, in order (the rest of SPECS, MuLo-SD at the family's own knobs, is the model card's)
TABLE_LABELS = [
    "ar", "zipar", "zipar-w8", "zipar-w16", "sjd", "mc-sjd", "gsd", "sd", "lantern", "eagle2",
    "mulo-v1-r2", "mulo-v2-r2", "mulo-v1-r4", "mulo-v2-r4",
]  # fmt: skip
QUICK_LABELS = ["ar", "zipar", "sjd", "sd", "lantern", "eagle2", "mulo-v1-r2", "mulo-v2-r2", "mulo-v2-r4"]
QUICK_MAX_ROUNDS = 20  # --quick: a pass timing that has not settled in 20 rounds (1 s) reports its spread
FALLBACK_PROMPTS = ["red apple", "cat face", "rocket", "grinning face", "pizza", "sun", "ghost", "banana"]


def step_costs(engine: Engine, prompt: str) -> dict[str, float]:
    """One single-token step of each of the family's drafting models / one of the target's."""
    models = harness.drafting_models(engine.family)
    costs = pass_costs.measure(engine, prompt, models, steps_only=True)
    return {name: costs.step(name) for name in models}


def nfe_speedup(row: dict, ar_row: dict, cost: float) -> float:
    """AR's sequential passes / the method's: target passes + drafter passes x ``cost``."""
    return ar_row["nfe"]["target"] / (row["nfe"]["target"] + row["nfe"]["drafter"] * cost)


@torch.no_grad()
def verification_pass_seconds(engine: Engine, prompt: str) -> float:
    """Time of one target pass over the whole grid with the CFG batch (every token accepted),
    repeated until stable (``costs.stable_seconds``)."""
    fam = engine.family
    cond = fam.condition(prompt, 0)[None]
    h, w = fam.grid
    tokens = torch.zeros(2, h * w - 1, dtype=torch.long, device=fam.device)
    both = torch.cat([cond, fam.target.null_condition(cond)])
    sync = torch.cuda.synchronize if fam.device.type == "cuda" else None
    return pass_costs.stable_seconds(lambda: fam.target(tokens, both), sync)[0]


def eager_ar(engine: Engine, prompts: list[tuple[str, str]], warmup=1) -> list[Measured] | None:
    """AR on an eager copy of ``engine``'s family, the table's prompts and seeds; None when the
    engine's passes are eager already."""
    if not engine.compilation.startswith("compiled"):
        return None
    from mulo.engine import Engine
    from mulo.families import load_family

    fam = engine.family
    dtype = str(next(fam.target.parameters()).dtype).removeprefix("torch.")
    eager = Engine(load_family(fam.name, str(fam.device), dtype), compile="off")
    return harness.run(eager, harness.runs_of(["ar"]), prompts, warmup=warmup)["ar"]


def run_table(
    engine: Engine,
    prompts: list[tuple[str, str]],
    labels: list[str] | list[harness.Run],
    quality: Quality | None,
    warmup=1,
    max_rounds: int | None = None,
    against_eager: bool = True,
):
    """Interleaved runs of ``labels`` (labels of ``harness.SPECS``, or ``harness.Run``s: a row name,
    a label and knob overrides) over ``prompts`` [(key, prompt)] (``harness.run``); AR's row must be
    named "ar". Returns ``({row name: row}, one verification pass in seconds, the pass costs)``, each
    row ``harness.aggregate``'s with the ideal bound and the NFE and cost speed-ups. The pass costs
    are timed at the widths the runs fed each model, each timing capped at ``max_rounds`` rounds
    (``costs.stable_seconds``)."""
    runs = [run if isinstance(run, tuple) else (run, run, {}) for run in labels]
    records = harness.run(engine, runs, prompts, warmup=warmup)
    eager = eager_ar(engine, prompts, warmup) if against_eager else None
    one_pass = verification_pass_seconds(engine, prompts[0][1])
    drafters = {name: harness.drafter_of(engine, label, overrides) for name, label, overrides in runs}
    fed: dict[str, set[int]] = {}
    for label, recs in records.items():
        for rec in recs:
            fed.setdefault("target", set()).update(rec.pass_widths.get("target", []))
            if drafters[label]:
                fed.setdefault(drafters[label], set()).update(rec.pass_widths.get("drafter", []))
    models = sorted({d for d in drafters.values() if d})
    costs = pass_costs.measure(engine, prompts[0][1], models, fed=fed, max_rounds=max_rounds)
    ar = records.get("ar")
    keys = [key for key, _ in prompts]
    rows = {}
    for label, recs in records.items():
        row = rows[label] = harness.aggregate(recs, ar, quality, keys)
        if ar and label != "ar":
            row.update(ideal(recs, ar, one_pass, row["latency_s"]))
        drafter = drafters[label]
        row["nfe_speedup"] = nfe_speedup(row, rows["ar"], costs.step(drafter) if drafter else 0.0) if ar else None
        row["cost_speedup"] = cost_speedup(recs, ar, costs, drafter) if ar else None
        if eager:
            row["speedup_vs_eager_ar"] = statistics.median(
                e.latency / r.latency for e, r in zip(eager, recs, strict=True)
            )
    return rows, one_pass, costs


def ideal(recs: list[Measured], ar: list[Measured], one_pass: float, latency: float) -> dict:
    """Every draft accepted: the drafting time plus one verification pass. The speed-up that bound
    allows, and the fraction of it a method of median ``latency`` reaches."""
    bound = statistics.median(r.draft_s for r in recs) + one_pass
    return {"ideal_speedup": statistics.median(a.latency for a in ar) / bound, "fraction_of_ideal": bound / latency}


def cost_speedup(recs: list[Measured], ar: list[Measured], costs: pass_costs.PassCosts, drafter: str | None) -> float:
    """Median over requests of AR's passes / the method's, each pass priced by model and width."""
    return statistics.median(
        costs.request(a.pass_widths, None) / costs.request(r.pass_widths, drafter)
        for a, r in zip(ar, recs, strict=True)
    )


def environment(engine: Engine) -> dict:
    from mulo.engine import versions

    fam = engine.family
    return {
        "family": fam.name,
        "device": str(fam.device) if fam.device.type != "cuda" else torch.cuda.get_device_name(fam.device),
        "dtype": str(next(fam.target.parameters()).dtype).replace("torch.", ""),
        "threads": torch.get_num_threads(),
        "batch_size": 1,
        "cpu": platform.processor() or platform.machine(),
        "machine": wide.machine(),  # the CPU's name and matrix flags: what wide passes were measured on
        # how wide passes (over 64 queries) ran: float32, bfloat16, or per bucket as measured here
        "wide_precision": engine.wide_precision,
        "wide_passes": wide.summary(
            {
                "target": fam.target,
                "draft_model": fam.draft_model,
                **{f"drafter_r{r}": m for r, m in fam.drafters.items()},
            }
        ),
        # how a bf16 pass ran its layers: compiled (mulo.fused_layers) or under autocast
        "wide_bf16_layers": fam.target.wide.layers if fam.target.wide is not None else "float32",
        "versions": versions(),
        "defaults": engine.make_config(None).to_dict(),
    }


def _wide(env: dict) -> str:
    """How the wide passes ran, for the table's head: the mode and each measured bucket's choice."""
    mode = env.get("wide_precision", "float32")
    buckets = [
        f"{name} {bucket.split('/')[1]} {c['precision']} (bf16 {c['float32_s'] / c['bfloat16_s']:.2f}x fp32's speed)"
        for name, report in env.get("wide_passes", {}).items()
        for bucket, c in report.items()
    ]
    layers = env.get("wide_bf16_layers")
    how = f"{mode}: {', '.join(buckets)}" if buckets else mode
    return f"{how}; bf16 layers {layers}" if layers and layers != "float32" else how


def execution(engine) -> str:
    """How the run's narrow passes ran: ``engine.compilation``, and how many pass shapes ran eagerly
    because their packages were not built (``cached`` mode: a cold cache runs, nothing compiles)."""
    eager, ran = compiled.shapes_not_built(engine.family.transformers())
    if not eager:
        return engine.compilation
    built = f"python -m mulo compile --family {engine.family.name} builds them"
    if not ran:
        return f"eager: no package built for its {eager} pass shape(s) ({built})"
    return f"{engine.compilation} where built; {eager} pass shape(s) not built ran eagerly ({built})"


def markdown(result: dict) -> str:
    env = result["environment"]
    head = (
        f"Family `{env['family']}` on {env['device']} ({env['dtype']}, {env['threads']} threads, batch 1, "
        f"passes: {result.get('execution', 'eager')}; wide passes: {_wide(env)}), "
        f"{result['prompts']} prompts x 1 seed each, methods interleaved after warm-up; "
        f"one full verification pass = {result['verification_pass_s'] * 1000:.1f} ms; one drafter step "
        f"costs {_costs(result.get('step_cost', {}), result.get('step_cost_spread', {}))} of a target step "
        f"(spread of its timings in brackets).\n\n"
    )
    vs_eager = any(row.get("speedup_vs_eager_ar") for row in result["methods"].values())
    cols = "| method | latency s (median) | speed-up | " + ("vs eager AR | " if vs_eager else "")
    cols += "cost speed-up | NFE speed-up | NFE target | NFE drafter "
    cols += "| acceptance | re-opened | rounds | tokens / round | tree nodes | FD | adherence | ideal speed-up "
    cols += "| of ideal |\n|" + "---|" * (16 + vs_eager) + "\n"
    lines = []
    for label, row in result["methods"].items():
        cells = [
            f"{row['latency_s']:.3f}",
            _fmt(row["speedup"], "{:.2f}x"),
            *([_fmt(row.get("speedup_vs_eager_ar"), "{:.2f}x")] if vs_eager else []),
            _fmt(row.get("cost_speedup"), "{:.2f}x"),
            _fmt(row.get("nfe_speedup"), "{:.2f}x"),
            f"{row['nfe']['target']:.1f}",
            f"{row['nfe']['drafter']:.1f}",
            _fmt(row["acceptance"], "{:.3f}"),
            f"{row['reopened']:.3f}",
            f"{row['rounds']:.1f}",
            _fmt(row.get("accepted_length"), "{:.2f}"),
            _fmt(row.get("tree_size"), "{:.1f}"),
            _fmt(row["fd"], "{:.3f}"),
            _fmt(row["adherence"], "{:.3f}"),
            _fmt(row.get("ideal_speedup"), "{:.2f}x"),
            _fmt(row.get("fraction_of_ideal"), "{:.0%}"),
        ]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    skipped = "".join(f"\n- `{k}` not run: {v}" for k, v in result.get("skipped", {}).items())
    if vs_eager:
        head += (
            '"vs eager AR": the method\'s speed-up over AR run on an eager copy of the family (same prompts '
            'and seeds, after the table); "speed-up" is over AR in the table, its passes run as said above.\n\n'
        )
    return head + cols + "\n".join(lines) + "\n" + _emptied_note(result["methods"]) + skipped


def _emptied_note(methods: dict) -> str:
    """A line for each tree method whose rejections emptied the residual (LANTERN's uniform fallback)."""
    notes = [
        f"\n- `{label}`: {row['residuals_emptied']:.1f} rejections per image left the residual no mass, so "
        "the next token was drawn uniformly over the codebook (LANTERN's fallback)"
        for label, row in methods.items()
        if row.get("residuals_emptied")
    ]
    return "".join(notes)


def _costs(costs: dict, spread: dict) -> str:
    cells = [
        f"{name} {ratio:.2f}" + (f" ({spread[name]:.0%})" if name in spread else "") for name, ratio in costs.items()
    ]
    return ", ".join(cells) or "(not measured)"


def _fmt(value, pattern: str) -> str:
    return "" if value is None else pattern.format(value)


def table_figure(result: dict):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["methods"]
    labels = list(rows)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), dpi=150)
    speed = [rows[k]["speedup"] or 0 for k in labels]
    left.barh(labels, speed, color=["#64748b" if k == "ar" else "#2563eb" for k in labels])
    left.axvline(1, color="black", lw=0.8)
    left.set_xlabel("speed-up over AR (median of per-request ratios)")
    left.invert_yaxis()
    for label in labels:
        if rows[label]["adherence"] is not None:
            right.scatter(rows[label]["speedup"] or 0, rows[label]["adherence"], s=30)
            right.annotate(label, (rows[label]["speedup"] or 0, rows[label]["adherence"]), fontsize=7)
    right.set_xlabel("speed-up")
    right.set_ylabel("adherence (higher is better)")
    fig.suptitle(f"{result['environment']['family']} on {result['environment']['device']}")
    fig.tight_layout()
    return fig


def run(engine: Engine, quick: bool = False, n_prompts: int | None = None, labels: list[str] | None = None) -> dict:
    quality = Quality.for_family(engine.family)
    # the whole evaluation list by default (twemoji: the model card's 120 prompts), where the goals'
    # quality comparison is made
    prompts = prompt_pool(quality)[: n_prompts or (2 if quick else None)]
    wanted = labels or (QUICK_LABELS if quick else TABLE_LABELS)
    skipped = {label: why for label in wanted if (why := harness.runnable(engine, label))}
    labels = [label for label in wanted if label not in skipped]
    if "ar" not in labels:
        raise ValueError("the benchmark needs the ar baseline")
    start = time.perf_counter()
    max_rounds = QUICK_MAX_ROUNDS if quick else None
    rows, one_pass, costs = run_table(engine, prompts, labels, quality, warmup=1, max_rounds=max_rounds)
    env = environment(engine)
    return {
        "methods": rows,
        "skipped": skipped,
        "prompts": len(prompts),
        "prompt_list": [p for _, p in prompts],
        "verification_pass_s": one_pass,
        # one drafting-model step / one target step (single cached token), and the spread of
        # those timings (the target's included)
        "step_cost": {name: costs.step(name) for name in costs.widths if name != "target"},
        "step_cost_spread": {name: spreads[0] for name, spreads in costs.spread.items()},
        "pass_costs": costs.to_dict(),  # seconds per pass by model and width bucket
        "floor": pass_floor.floors(engine, costs.to_dict(), engine.family.device),  # each against its floor
        "execution": execution(engine),  # compiled narrow passes or eager (mulo.compiled)
        "wall_s": time.perf_counter() - start,
        "environment": env,
        **{k: env[k] for k in ("device", "dtype", "threads", "versions")},
    }


def prompt_pool(quality: Quality | None) -> list[tuple[str, str]]:
    """(key, prompt) pairs: the family's fixed evaluation list, or a few generic prompts."""
    return quality.prompts if quality else [(p, p) for p in FALLBACK_PROMPTS]


def save(result: dict, out_dir: Path | None, json_path: Path | None) -> None:
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(result, indent=1))
    if out_dir:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "table.json").write_text(json.dumps(result, indent=1))
        (out_dir / "table.md").write_text(markdown(result))
        table_figure(result).savefig(out_dir / "table.png", bbox_inches="tight")


# The goals on twemoji (CPU, issue 19): speed-up by sequential passes and by wall clock, at AR's
# quality, and ahead of the baselines that also keep it (the paper's ordering).
GOALS = {"mulo-v2-r2": {"nfe_speedup": 2.0, "speedup": 1.6}, "mulo-v2-r4": {"nfe_speedup": 3.5, "speedup": 2.5}}
QUALITY_TOLERANCE = {"fd": 0.10, "adherence": 0.03}  # FD within 10 % of AR's, adherence within 3 points
ORDERING_BASELINES = ("zipar", "zipar-w8", "zipar-w16", "sjd", "mc-sjd", "gsd", "sd", "lantern", "eagle2")
NAMES = {"nfe_speedup": "by NFE", "speedup": "wall-clock"}


def at_ar_quality(row: dict, ar: dict) -> bool:
    """Whether a method's row keeps AR's quality (no metrics for the family: it does)."""
    fd_ok = row.get("fd") is None or row["fd"] <= ar["fd"] * (1 + QUALITY_TOLERANCE["fd"])
    adh_ok = row.get("adherence") is None or row["adherence"] >= ar["adherence"] - QUALITY_TOLERANCE["adherence"]
    return fd_ok and adh_ok


def goal_lines(result: dict) -> list[str]:
    """One Markdown line per goal label in ``result``: its speed-ups against the goals, its
    quality against AR's, and the baselines at AR's quality it is (not) ahead of."""
    rows, ar = result["methods"], result["methods"].get("ar", {})
    out = []
    for label, targets in GOALS.items():
        row = rows.get(label)
        if row is None or row.get("speedup") is None:
            continue
        fast = all(row.get(k) is not None and row[k] >= goal for k, goal in targets.items())
        speed = ", ".join(
            f"{_fmt(row.get(k), '{:.2f}')}x by {k.replace('_', ' ')} (goal {g}x)" for k, g in targets.items()
        )
        same = [
            f"{m} {row[m]:.3f} vs AR {ar[m]:.3f}"
            for m in ("fd", "adherence")
            if row.get(m) is not None and ar.get(m) is not None
        ]
        rivals = [b for b in ORDERING_BASELINES if b in rows and at_ar_quality(rows[b], ar)]
        behind = [b for b in rivals if rows[b]["speedup"] >= row["speedup"]]
        verdict = "met" if fast and at_ar_quality(row, ar) and not behind else "NOT met"
        quality = f", {', '.join(same)}" if same else " (no quality metrics for this family)"
        order = (
            f"; not ahead of {', '.join(behind)}" if behind else (f"; ahead of {', '.join(rivals)}" if rivals else "")
        )
        out.append(f"- `{label}`: {speed}{quality}{order}: **{verdict}**")
    return out


def cost_lines(costs: dict | None) -> list[str]:
    """The pass-cost table behind the cost speed-up: per model, a pass's cost by width (blank where
    that model's passes needed no timing at that width)."""
    if not costs:
        return []
    unit = costs["unit_s"]
    columns = sorted({w for widths in costs["widths"].values() for w in widths})
    lines = [
        "## Pass costs\n",
        f"One single-token target step = {unit * 1000:.2f} ms. A pass of each width (tokens fed), in target "
        "steps, with the spread of its timings ((max - min) / median of the last rounds):\n",
        "| model | " + " | ".join(f"w={w}" for w in columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    for model, seconds in costs["seconds"].items():
        timed = zip(costs["widths"][model], seconds, costs["spread"][model], strict=True)
        by_width = {w: f"{t / unit:.2f} ({d:.0%})" for w, t, d in timed}
        lines.append(f"| {model} | " + " | ".join(by_width.get(w, "") for w in columns) + " |")
    return [*lines, ""]


def write_results(out_dir: Path, result: dict, sweep_results: dict | None, command: str) -> None:
    """benchmarks/RESULTS.md: the table, the goals, the sweeps and their plots."""
    parts = [
        "# Benchmark results\n",
        f"Reproduce with `{command}` (wall time of this run: {result['wall_s'] / 60:.1f} min for the table).\n",
        "## Table\n",
        markdown(result),
        "\n![table](table.png)\n",
        "## Goals\n",
        "\n".join(goal_lines(result)) or "(no goal labels in this run)",
        "",
        *cost_lines(result.get("pass_costs")),
        *pass_floor.floor_lines(result.get("floor")),
    ]
    for name, rows in (sweep_results or {}).items():
        parts.append(f"\n## Sweep: {name}\n")
        parts.append(
            "| point | speed-up | target NFE | acceptance | re-opened | FD | adherence |\n|---|---|---|---|---|---|---|"
        )
        for r in rows:
            parts.append(
                f"| {r['point']} | {r['speedup']:.2f}x | {r['nfe_target']:.1f} | {_fmt(r['acceptance'], '{:.3f}')} | "
                f"{r['reopened']:.3f} | {_fmt(r.get('fd'), '{:.3f}')} | {_fmt(r.get('adherence'), '{:.3f}')} |"
            )
        parts.append(f"\n![{name}](sweep_{name}.png)\n")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "RESULTS.md").write_text("\n".join(parts))
