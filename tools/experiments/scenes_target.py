"""The scenes target alone, trained on another run's data (issue 63's study, one knob at a time).

A full study candidate spends ~28 CPU-minutes, two thirds of them outside the target; this trains
only the target of a candidate recipe on the clip, VQ, held-out tokens and encoded training
scenes of a finished run (linked, not copied; with ``--encode``, its clip and VQ only, and the
recipe's own scenes encoded by them), so candidates that differ in the target alone
(its position start, width, learning rate; ``--target neighbour_inputs=0``: the plain target that
does not read the row above; ``--target rotary_2d=true``: attention turned by 2D cells;
``--condition symbols``: the prompt read as symbols, not mini-CLIP features) compare
on the same scenes in ~13 minutes each. The report (``RUN/report.json``'s ``target``) holds the
held-out curve and, at the end, the held-out and training losses with the object tokens apart
(``stages.ar.object_losses``).

    python tools/experiments/scenes_target.py runs/curve/base runs/exp/grid-pe \\
        --recipe scenes-grid-pe --steps 400
"""

from __future__ import annotations

import argparse
import json
import logging
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from mulo.models.gpt import GPT, GPTConfig
from mulo.runner import ModelRunner
from mulo.train.pipeline import Pipeline
from mulo.train.recipes import RECIPES, SCENE_CONDITIONS
from mulo.train.stages.ar import scene_conditions, stage_ar

SHARED = ("clip.pt", "clip_vocab.json", "vq.pt", "tokens.npz", "scenes")


@torch.no_grad()
def draw(model, cond: torch.Tensor, cfg: float, top_p: float, generator: torch.Generator) -> torch.Tensor:
    """One AR sample ``[L]`` of ``model`` for the condition ``cond [T, C]`` with classifier-free
    guidance ``cfg`` and ``top_p``: the engine's runner, token by token (the row above included
    for a target that reads it)."""
    runner = ModelRunner(model, cond, cfg, 1.0, 0, top_p)
    runner.prefill()
    seq = torch.full((model.config.max_seq_len,), -1, dtype=torch.long)
    for u in range(len(seq)):
        seq[u] = runner.sample_next(seq, u, generator)[0]
    return seq


def judge_samples(pipe, model, count: int, cfg: float, top_p: float, sprites: Path) -> dict:
    """AR samples of the first ``count`` evaluation prompts (seed i for prompt i), judged by the
    referee: prompt match and its parts; the images to ``RUN/samples.png``."""
    from PIL import Image

    from mulo.eval.referee import Referee, Sprites
    from mulo.eval.scene_quality import verdict_parts
    from mulo.train import scenes

    stream = pipe.scene_stream
    shown = scenes.evaluation_scenes(pipe.recipe.scenes, stream.sheet, count)
    cond = scene_conditions(pipe, pipe.load_clip(), [s.prompt for s in shown]).float()
    model.eval()
    rows = [draw(model, cond[i], cfg, top_p, torch.Generator().manual_seed(i)) for i in range(count)]
    side = model.config.grid_hw[0]
    images = pipe.tokenizer().decode(torch.stack(rows).reshape(count, side, side))
    pixels = (images.permute(0, 2, 3, 1).numpy() * 255).round().astype("uint8")
    Image.fromarray(np.concatenate(list(pixels), axis=1)).save(pipe.run / "samples.png")
    referee = Referee(Sprites.load(sprites))
    verdicts = [referee.prompt_match(image, s.prompt) for image, s in zip(pixels, shown, strict=True)]
    return {
        "prompts": [s.prompt for s in shown],
        "match": float(np.mean([v.match for v in verdicts])),
        **verdict_parts(verdicts),
        "said": [v.sentence() for v in verdicts],
    }


def typed(instance, key: str, value: str):
    """``value`` as the type of ``instance``'s field ``key`` (a flag: true/false, 1/0)."""
    kind = type(getattr(instance, key))
    if kind is bool:
        if value.lower() not in ("true", "false", "1", "0"):
            raise ValueError(f"{key} is a flag: true or false (got {value!r})")
        return value.lower() in ("true", "1")
    return kind(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="a run folder past its tokens stage")
    parser.add_argument("run", type=Path, help="the experiment's folder (resumes if it exists)")
    parser.add_argument("--recipe", default="scenes-base")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--lr", type=float, default=None, help="the target's peak learning rate")
    field = {"action": "append", "default": [], "metavar": "KEY=VALUE"}
    parser.add_argument("--hyper", **field, help="a Hyper field, e.g. embed_init=pixels")
    parser.add_argument("--target", **field, help="a target size field, e.g. n_head=8")
    parser.add_argument("--scene", **field, help="a SceneConfig field (needs --encode), e.g. object_px=24")
    parser.add_argument("--zipar-share", type=float, default=None)
    parser.add_argument("--budget", **field, help="a Budget field, e.g. open_weight=8")
    parser.add_argument("--condition", choices=SCENE_CONDITIONS, help="how the target reads a prompt")
    parser.add_argument("--sample", type=int, default=0, help="then judge AR samples of this many evaluation prompts")
    parser.add_argument("--sprites", type=Path, help="the referee's sprites (a scenes export's referee_sprites.npz)")
    parser.add_argument("--cfg", type=float, default=3.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--encode", action="store_true", help="encode the recipe's own scenes with the source's VQ")
    args = parser.parse_args()
    if args.sample and not args.sprites:
        parser.error("--sample needs --sprites")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    recipe = RECIPES[args.recipe]
    hyper = dict(field.split("=", 1) for field in args.hyper)
    if args.lr is not None:
        hyper["ar_lr"] = args.lr
    recipe = replace(recipe, hyper=replace(recipe.hyper, **{k: typed(recipe.hyper, k, v) for k, v in hyper.items()}))
    target = {k: typed(GPTConfig(), k, v) for k, v in (field.split("=", 1) for field in args.target)}
    recipe = replace(recipe, target={**recipe.target, **target})
    scene = dict(field.split("=", 1) for field in args.scene)
    if scene and not args.encode:
        parser.error("--scene changes the scenes: add --encode")
    recipe = replace(recipe, scenes=replace(recipe.scenes, **{k: typed(recipe.scenes, k, v) for k, v in scene.items()}))
    if args.condition:
        recipe = replace(recipe, scene_condition=args.condition)
    budget = replace(recipe.budget, ar_steps=args.steps, validate_every=100)
    if args.zipar_share is not None:
        budget = replace(budget, zipar_share=args.zipar_share)
    changed = dict(field.split("=", 1) for field in args.budget)
    budget = replace(budget, **{k: typed(budget, k, v) for k, v in changed.items()})
    args.run.mkdir(parents=True, exist_ok=True)
    for name in SHARED[:3] if args.encode else SHARED:
        link = args.run / name
        if not link.exists():
            link.symlink_to((args.source / name).resolve())
    source_report = json.loads((args.source / "report.json").read_text())
    report_path = args.run / "report.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    for stage in ("data", "clip", "vq") if args.encode else ("data", "clip", "vq", "tokens"):
        report.setdefault(stage, source_report[stage])
    report["experiment"] = {
        "recipe": args.recipe,
        "steps": args.steps,
        "hyper": hyper,
        "scene": scene,
        "target": target,
        "zipar_share": budget.zipar_share,
        "budget": changed,
        "condition": recipe.scene_condition,
        "source": str(args.source),
    }
    report_path.write_text(json.dumps(report, indent=1))
    pipe = Pipeline(args.run, args.run / "assets", recipe, budget)
    if args.encode:
        pipe.run_all(["tokens"])
    if not ((args.run / "target.pt").exists() and "val_loss" in report.get("target", {})):
        stage_ar(pipe, "target")
    target = pipe.report["target"]
    print(json.dumps({k: v for k, v in target.items() if "loss" in k or "accuracy" in k or k == "val_curve"}))
    if args.sample:
        config = GPTConfig.from_json(json.loads((args.run / "target.json").read_text()))
        model = GPT(config)
        model.load_state_dict(torch.load(args.run / "target.pt", map_location="cpu", weights_only=True))
        judged = judge_samples(pipe, model, args.sample, args.cfg, args.top_p, args.sprites)
        report = json.loads(report_path.read_text())
        report["samples"] = {"cfg": args.cfg, "top_p": args.top_p, **judged}
        report_path.write_text(json.dumps(report, indent=1))
        print(json.dumps({k: v for k, v in judged.items() if k != "prompts"}, indent=1))


if __name__ == "__main__":
    main()
