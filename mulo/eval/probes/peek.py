"""A look at a target still training: ``python -m mulo peek [--family twemoji] [--run-dir DIR]
[--prompts 24]``.

AR and ZipAR (window 8) sample the first evaluation prompts from the target's latest checkpoint
and are scored as the model card scores them (adherence, FD in mini-CLIP space; a scenes run: the
referee's prompt match and its parts, on the sprites its export will ship), so a run of many
hours can be judged on its way rather than at its end: the first 32x32 run drew colour blobs at
step 4,000 and its prompts at step 12,000, where ZipAR still did not. It reads the run folder
only (the running stage may go on beside it, at the cost of both sharing the CPU).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import torch

from mulo.engine import Engine
from mulo.eval import family_eval
from mulo.families.base import Family
from mulo.families.emoji import PromptConditioner, scene_conditioner
from mulo.models.gpt import GPT
from mulo.train import scenes
from mulo.train.pipeline import Pipeline
from mulo.train.recipes import RECIPES
from mulo.train.stages.export import scene_language

METHODS = ("ar", "zipar-w8")  # the card's methods (labels of mulo.eval.harness.SPECS) that need no drafter


def latest_target(pipe: Pipeline) -> tuple[dict, int]:
    """The target's weights and step: the finished stage's, else its last checkpoint's."""
    if (pipe.run / "target.pt").exists():
        return torch.load(pipe.run / "target.pt", map_location="cpu", weights_only=True), pipe.budget.ar_steps
    checkpoint = pipe.run / "target.ckpt"
    if not checkpoint.exists():
        raise FileNotFoundError(f"{pipe.run} has no target checkpoint yet (the target stage has not begun)")
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    return state["model"], int(state["step"])


def target_family(pipe: Pipeline) -> tuple[Family, object, int]:
    """The run's target as it is now, in a family of its own (no drafters: AR and ZipAR need the
    target alone), its mini-CLIP and its step."""
    weights, step = latest_target(pipe)
    clip = pipe.load_clip()
    target = GPT(pipe.recipe.gpt_config("target", pipe.codes, pipe.recipe.condition_width(clip.cond_dim)))
    target.load_state_dict(weights)
    if pipe.recipe.scenes:  # prompts read by the scenes grammar, as the exported family reads them
        language = scene_language(pipe.recipe.scenes, pipe.recipe.scene_condition)
        conditioner = scene_conditioner(clip.eval(), language, target.config.cond_len)
    else:
        conditioner = PromptConditioner(clip)
    vq = pipe.tokenizer()
    family = Family(pipe.recipe.family, target, {}, vq, conditioner, defaults=pipe.recipe.defaults)
    return family, clip, step


def peek(pipe: Pipeline, n_prompts: int = 24, seed: int = 0) -> dict:
    """{"step", "prompts", "real_adherence", "methods": {label: card metrics}} of the run's target as
    it is now; ``real_adherence`` is the real images' own on the same prompts, the ceiling the
    mini-CLIP sets."""
    family, clip, step = target_family(pipe)
    # the first of the model card's own prompts, so a checkpoint's scores compare with the card's
    if pipe.recipe.scenes:  # judged by the referee, on the sprites the export will ship
        config = pipe.recipe.scenes
        sprites = scenes.sprites(pipe.cache, config.object_px, config.canvas).subset(config.names)
        quality, real_images, _ = pipe.scene_evaluation(n_prompts, sprites)
        images: dict | None = {}
    else:
        prompts = family_eval.eval_prompts(pipe.data, pipe.budget.eval_prompts)[:n_prompts]
        quality = family_eval.reference(pipe.data, clip, prompts)
        real_images, images = family_eval.real_images(pipe.data, quality.keys), None
    with torch.no_grad():
        methods = family_eval.score_methods(Engine(family.to(pipe.device)), quality, METHODS, seed, images)
    for label, generated in (images or {}).items():  # what a scenes match is made of
        methods[label].update(quality.parts(generated, quality.keys))
    real = round(quality.adherence(real_images, quality.keys), 4)
    return {"step": step, "prompts": len(quality.prompts), "real_adherence": real, "methods": methods}


def main(argv=None, prog=None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=list(RECIPES), default="twemoji")
    parser.add_argument("--run-dir", type=Path, help="the run folder (default runs/FAMILY)")
    parser.add_argument(
        "--cache", type=Path, help="data cache (default ~/.cache/mulo/styles for emoji, else ~/.cache/mulo/twemoji)"
    )
    parser.add_argument("--prompts", type=int, default=24, help="evaluation prompts (default 24)")
    args = parser.parse_args(argv)
    if args.prompts < 1:
        parser.error(f"--prompts must be at least 1 (got {args.prompts})")
    recipe = RECIPES[args.family]
    run_dir = args.run_dir or Path("runs") / args.family
    if not (run_dir / "report.json").exists():
        parser.error(f"{run_dir} is no run folder (no report.json)")
    logging.basicConfig(level=logging.WARNING)
    pipe = Pipeline(run_dir, Path("assets") / args.family, recipe, recipe.budget, cache=args.cache)  # writes nothing
    try:
        result = peek(pipe, args.prompts)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=1))
    print(f"step {result['step']}: real images adherence {result['real_adherence']:.3f}", file=sys.stderr)
    for label, row in result["methods"].items():
        fd = "—" if row["fd"] is None else f"{row['fd']:.3f}"  # None: one prompt has no FD
        print(f"step {result['step']}: {label} adherence {row['adherence']:.3f} FD {fd}", file=sys.stderr)
    return 0
