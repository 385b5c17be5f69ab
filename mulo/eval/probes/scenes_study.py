"""The emoji scenes family's short study (issue 63): a table of its candidates, each a recipe of
``mulo.train.recipes.STUDY_CANDIDATES`` trained end to end at the study budget, from their run
folders. Run the candidates first (each <= 30 CPU-minutes on 2 cores), then the table::

    for c in scenes-base scenes-s24 scenes-slots scenes-v32 scenes-grid-pe scenes-t192; do
        python -m mulo train $c --run-dir runs/study/$c --assets runs/study/$c/assets
    done
    python -m mulo scenes-study runs/study/scenes-* --json benchmarks/scenes-study.json

Each candidate fits its own codebook of pixel squares (a minute); ``train --vq FILE`` makes them
share one instead, and the "VQ" column names that file ("own" otherwise).

Per candidate: its training time (every stage but the card, CPU-minutes), AR's prompt match by
the referee (all prompts, the multi-object ones, the held-out combinations) and that match per
CPU-minute, with its parts (the share of named emoji found once, of images on the asked
background); how much of the drafters' layout the target accepts (MuLo-SD's acceptance and the
share of the grid it re-opens, r = 2 and r = 4); the target's held-out over training loss; the
VQ's referee ceiling.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mulo.train.recipes import STUDY_CANDIDATES


def row(run: Path) -> dict:
    """One candidate's row from its run folder (``report.json``) and assets (``assets/metrics.json``)."""
    report = json.loads((run / "report.json").read_text())
    metrics_path = run / "assets" / "metrics.json"
    if not metrics_path.exists():
        raise FileNotFoundError(f"{metrics_path}: the candidate has not finished its card stage")
    methods = json.loads(metrics_path.read_text())["methods"]
    trained = {k: v for k, v in report.items() if k not in ("card", "vq_study")}
    seconds = sum(max(e.get("stage_seconds", 0), e.get("seconds", 0)) for e in trained.values())
    minutes = seconds / 60
    ar, target = methods["ar"], report.get("target", {})
    out = {
        "candidate": run.name,
        "differs": STUDY_CANDIDATES.get(run.name, ("?",))[0],
        "cpu_minutes": round(minutes, 1),
        "ar_match": ar["adherence"],
        "ar_match_multi_object": ar.get("adherence_multi_object"),
        "ar_match_held_out": ar.get("adherence_held_out"),
        "ar_match_per_cpu_minute": round(ar["adherence"] / max(minutes, 1e-9), 5),
        "ar_objects_found": ar.get("objects_found"),  # the parts of a match (a card from before: None)
        "ar_background_right": ar.get("background_right"),
        "ar_fd": ar["fd"],
        "vq_referee_match": report.get("vq", {}).get("val_referee_match"),
        "vq": report.get("vq", {}).get("adopted_from", "own"),
        "held_out_over_train_loss": round(target["val_loss"] / target["train_loss"], 3)
        if target.get("train_loss")
        else None,
        # teacher-forced on held-out scenes: the objects' tokens alone (a report from before: None)
        "target_object_loss": target.get("val_object_loss"),
        "target_object_accuracy": target.get("val_object_accuracy"),
    }
    for r in (2, 4):
        mulo = methods.get(f"mulo-r{r}", {})
        out[f"mulo_r{r}_acceptance"] = mulo.get("acceptance_rate")
        out[f"mulo_r{r}_reopened"] = mulo.get("reopened_fraction")
        out[f"mulo_r{r}_match"] = mulo.get("adherence")
    return out


COLUMNS = (
    ("candidate", "candidate"),
    ("differs", "differs from the base"),
    ("cpu_minutes", "CPU-min"),
    ("ar_match", "AR match"),
    ("ar_match_multi_object", "multi-object"),
    ("ar_match_held_out", "held-out"),
    ("ar_match_per_cpu_minute", "match / CPU-min"),
    ("ar_objects_found", "emoji found"),
    ("ar_background_right", "background right"),
    ("mulo_r2_acceptance", "r2 accepted"),
    ("mulo_r2_reopened", "r2 re-opened"),
    ("mulo_r4_acceptance", "r4 accepted"),
    ("mulo_r4_reopened", "r4 re-opened"),
    ("held_out_over_train_loss", "held-out / train loss"),
    ("target_object_loss", "object-token loss"),
    ("target_object_accuracy", "object-token accuracy"),
    ("vq_referee_match", "VQ referee"),
    ("vq", "VQ"),
)


def markdown(rows: list[dict]) -> str:
    head = "| " + " | ".join(title for _, title in COLUMNS) + " |"
    rule = "|" + "---|" * len(COLUMNS)
    body = ["| " + " | ".join("n/a" if r[key] is None else str(r[key]) for key, _ in COLUMNS) + " |" for r in rows]
    return "\n".join([head, rule, *body])


def main(argv=None, prog: str = "python -m mulo scenes-study") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="the candidates' run folders (runs/study/scenes-*)")
    parser.add_argument("--json", type=Path, help="write the rows here (benchmarks/scenes-study.json)")
    args = parser.parse_args(argv)
    missing = [str(run) for run in args.runs if not (run / "report.json").is_file()]
    if missing:
        parser.error(f"not a training run folder (no report.json): {', '.join(missing)}")
    try:
        rows = [row(run) for run in args.runs]
    except (FileNotFoundError, KeyError) as exc:
        parser.error(f"incomplete run: {exc}")
    table = markdown(rows)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"rows": rows, "markdown": table}, indent=1))
    print(table)
    return 0
