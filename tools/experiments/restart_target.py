"""A scenes AR model's weights as a checkpoint, restarted at step S of its stage's cosine.

A trial warm from a trained target (``scenes_target.py`` resumes from RUN/target.ckpt), or a run's
stage carried over to another condition (``python -m mulo train`` resumes from RUN/STAGE.ckpt): its
weights (a state dict, fp16 or not, or a checkpoint), loaded into the recipe's model for the stage
under the condition; an input the weights lack (``column_input`` when ``--condition clip_placed``
meets a ``clip`` model) starts at its zero initialisation, so the model computes what it did.
Adam's moments are kept, by parameter name, when the source is a checkpoint that has them; the
learning rate warms up again from step S either way (``mulo.train.loop.resume``).

    python tools/experiments/restart_target.py tools/resume/scenes-cols/target-best9900-fp16.pt \\
        runs/exp/cols --step 6500 --condition clip_placed
    python tools/experiments/restart_target.py runs/scenes/drafter_r2.pt runs/scenes --stage drafter_r2 --step 2000
    python tools/experiments/restart_target.py runs/scenes/target.ckpt runs/exp/target20k --step 11000 \\
        --steps 20000 --condition clip_placed   # then scenes_target.py runs/scenes runs/exp/target20k --steps 20000
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import replace
from pathlib import Path

import torch

from mulo.models.gpt import GPT
from mulo.train.recipes import RECIPES, SCENE_CONDITIONS
from mulo.train.stages.ar import stage_steps

ZERO_INIT = ("column_input.weight",)  # inputs a trained target may lack and gain unchanged


def restart(
    source: dict, recipe, clip_width: int, codes: int, step: int, stage: str = "target", steps: int | None = None
) -> dict:
    """The checkpoint (``mulo.train.loop.save``'s keys) of ``source`` (weights or a checkpoint)
    restarted at ``step`` of a cosine over ``steps`` (default: the stage's in the recipe) as
    ``stage``'s model."""
    weights = {k: v.float() for k, v in source.get("model", source).items()}
    model = GPT(recipe.gpt_config(stage, codes, recipe.condition_width(clip_width)))
    steps = steps or stage_steps(recipe.budget, stage)
    if not 0 <= step < steps:
        raise ValueError(f"step {step} is not within {stage}'s {steps} steps")
    try:
        missing, unexpected = model.load_state_dict(weights, strict=False)
    except RuntimeError as exc:  # a shape that differs
        raise ValueError(f"the weights do not fit the {stage} model: {str(exc).splitlines()[1].strip()}") from None
    if unexpected or set(missing) - set(ZERO_INIT):
        raise ValueError(f"the weights do not fit the {stage} model: missing {missing}, unexpected {unexpected}")
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad]).state_dict()
    if "optimizer" in source:  # the source's moments, by parameter name
        names = [n for n, p in model.named_parameters() if p.requires_grad]
        old = [n for n in names if n not in missing]
        moments = source["optimizer"]["state"]
        optimizer["state"] = {names.index(n): moments[i] for i, n in enumerate(old) if i in moments}
        kept = {k: v for k, v in source["optimizer"]["param_groups"][0].items() if k != "params"}
        optimizer["param_groups"][0].update(kept)  # its weight decay, betas
    return {
        "model": model.state_dict(),
        "optimizer": optimizer,
        "step": step,
        "steps": steps,
        "warm_from": step,
        "seconds": float(source.get("seconds", 0.0)),
        "segments": source.get("segments", []),
        "curve": [],
        "best": {"step": step, "val": math.inf},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("weights", type=Path, help="a model's state dict or checkpoint")
    parser.add_argument("run", type=Path, help="the folder RUN/STAGE.ckpt is written to")
    parser.add_argument("--stage", default="target", choices=("target", "drafter_r2", "drafter_r4", "draft_model"))
    parser.add_argument("--step", type=int, required=True, help="the step of the cosine to restart at")
    parser.add_argument("--steps", type=int, help="the cosine's length (default: the recipe's for the stage)")
    parser.add_argument("--recipe", default="scenes")
    parser.add_argument("--condition", choices=SCENE_CONDITIONS, help="how the trial's target reads a prompt")
    args = parser.parse_args()
    recipe = RECIPES[args.recipe]
    if args.condition:
        recipe = replace(recipe, scene_condition=args.condition)
    source = torch.load(args.weights, map_location="cpu", weights_only=True)
    weights = source.get("model", source)
    clip_width, codes = weights["clip_proj.weight"].shape[1], weights["output.weight"].shape[0]
    try:
        state = restart(source, recipe, clip_width, codes, args.step, args.stage, args.steps)
    except ValueError as exc:
        parser.error(str(exc))
    written = args.run / f"{args.stage}.ckpt"
    args.run.mkdir(parents=True, exist_ok=True)
    if written.exists():
        parser.error(f"{written} exists: a restart does not overwrite a checkpoint")
    torch.save(state, written)
    print(json.dumps({"written": str(written), "step": args.step, "moments": bool(state["optimizer"]["state"])}))


if __name__ == "__main__":
    main()
