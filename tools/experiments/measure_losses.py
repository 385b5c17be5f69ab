"""An AR run's losses measured again on its kept weights, into its report; nothing is trained.

    python tools/experiments/measure_losses.py runs/scenes --stages target,drafter_r2,drafter_r4,draft_model

For a stage whose measurement changed after it trained (the scenes family's training sample now
holds as many scenes of each object count as the held-out one, ``mulo.train.stages.ar.held_out``):
each stage's ``RUN/STAGE.pt`` loaded into its ``RUN/STAGE.json`` config and measured by
``measured_losses``, the stage's own code; every other entry of the report (its steps, time,
hardware, curve) stays. Then ``python -m mulo train FAMILY --run-dir RUN --stages export,card``
writes the new numbers into the assets and the model card.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mulo.train.pipeline import Pipeline
from mulo.train.recipes import RECIPES
from mulo.train.stages.ar import ar_data, held_out, load_stage, measured_losses

AR_STAGES = ("target", "drafter_r2", "drafter_r4", "draft_model")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a run folder past its AR stages (and its tokens stage)")
    parser.add_argument("--recipe", default="scenes")
    parser.add_argument("--stages", default=",".join(AR_STAGES))
    args = parser.parse_args()
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    recipe = RECIPES.get(args.recipe)
    missing = [s for s in stages if s not in AR_STAGES or not (args.run / f"{s}.pt").exists()]
    if recipe is None or missing or not (args.run / "tokens.npz").exists():
        problem = f"unknown recipe {args.recipe!r}" if recipe is None else None
        problem = problem or (f"no AR stage {', '.join(missing)} in {args.run}" if missing else None)
        print(f"error: {problem or f'{args.run} has no tokens.npz: run its tokens stage'}", file=sys.stderr)
        return 2
    pipe = Pipeline(args.run, args.run / "assets", recipe, recipe.budget)
    for stage in stages:
        data = ar_data(pipe, recipe.grid(stage))
        model = load_stage(pipe, stage)
        cond = getattr(data, "cond_name_style", data.cond_name)
        losses = measured_losses(pipe, stage, model, data.tokens, cond, held_out(pipe, data))
        before = pipe.report.get(stage, {})
        changed = {k: (before.get(k), v) for k, v in losses.items() if before.get(k) != v}
        pipe.report[stage] = {**before, **losses}
        pipe.report_path.write_text(json.dumps(pipe.report, indent=1))
        print(f"{stage}: " + (", ".join(f"{k} {a} -> {b}" for k, (a, b) in changed.items()) or "unchanged"), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
