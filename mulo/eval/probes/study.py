"""Issue 46's study: how well a candidate recipe's target generalises per CPU-minute, read off its
run folder while it trains (the running stage may go on beside it).

    python -m mulo study --family emoji-16 [--run-dir DIR] [--prompts 24] [--seeds 5] [--json F]

From the target's latest weights (``peek.latest_target``) it reports, with the step and the
CPU-minutes its checkpoint records:
- the training, held-out-pair and unseen-emoji losses measured alike (eval mode, teacher-forced,
  conditioned on the name with its style word; at most 256 images each) and their ratio, which
  the issue bounds by 1.25;
- the generalisation probe (``mulo.eval.generalisation``) of the target alone on the card's first
  evaluation prompts: AR's samples' NLL under the plain distribution (issue: >= 0.3 nats/token),
  the share of tokens two seeds' images differ in (>= 30 %) and the distinct images per prompt.

With ``--ceiling`` (needs only the VQ and the mini-CLIP, so it runs before the target trains) it
reports instead what the run's VQ (or ``--vq FILE`` in the run folder) gives the card's evaluation
prompts: the FD and adherence of their real images' reconstructions, and their PSNR. AR draws at
best what its tokenizer reconstructs, so the issue's AR bars (adherence >= 0.75, FD <= 1.5x the
reconstructions') are in reach only where these clear them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from mulo.engine import Engine
from mulo.eval import family_eval, generalisation
from mulo.eval.probes import peek
from mulo.train.pipeline import Pipeline
from mulo.train.recipes import RECIPES
from mulo.train.stages.ar import ar_data, held_out, validation_loss

LOSS_IMAGES = 256  # per group: two decimals, seconds on a CPU


def cpu_minutes(pipe: Pipeline) -> float | None:
    """The target's training time so far: its report's once finished, else its checkpoint's."""
    if "target" in pipe.report and "seconds" in pipe.report["target"]:
        return pipe.report["target"]["seconds"] / 60
    checkpoint = pipe.run / "target.ckpt"
    if not checkpoint.exists():
        return None
    return float(torch.load(checkpoint, map_location="cpu", weights_only=True)["seconds"]) / 60


def losses(pipe: Pipeline, target) -> dict[str, float]:
    data = ar_data(pipe, pipe.recipe.grid("target"))
    cond = getattr(data, "cond_name_style", data.cond_name)
    out = {}
    for name, idx in held_out(pipe, data).items():
        idx = idx[:LOSS_IMAGES]
        if len(idx):
            out[f"{name}_loss"] = validation_loss(target, data.tokens[idx], cond[idx], pipe.device)
    out["val_over_train"] = round(out["val_loss"] / out["train_loss"], 3)
    return out


def study(pipe: Pipeline, n_prompts: int = 24, seeds: int = 5) -> dict:
    family, _, step = peek.target_family(pipe)
    family.to(pipe.device)
    prompts = [name for _, name in family_eval.eval_prompts(pipe.data, pipe.budget.eval_prompts)[:n_prompts]]
    with torch.no_grad():
        probed = generalisation.probe(Engine(family), prompts, seeds, runs=[("ar", "ar", {})])
        measured = losses(pipe, family.target)
    minutes = cpu_minutes(pipe)
    return {
        "family": pipe.recipe.family,
        "step": step,
        "cpu_minutes": None if minutes is None else round(minutes, 2),
        "target_params": sum(p.numel() for p in family.target.parameters()),
        **measured,
        **{k: v for k, v in probed.items() if k != "methods"},
    }


def vq_ceiling(pipe: Pipeline, vq_file: str = "vq.pt") -> dict:
    """The card's ceilings (``family_eval.ceilings``) for ``vq_file``'s tokenizer on the card's evaluation
    prompts, with the reconstructions' PSNR and the tokenizer's geometry."""
    tok = pipe.tokenizer(name=vq_file)
    prompts = family_eval.eval_prompts(pipe.data, pipe.budget.eval_prompts)
    quality = family_eval.reference(pipe.data, pipe.load_clip(), prompts)
    scores = family_eval.ceilings(tok, quality, family_eval.real_images(pipe.data, quality.keys))
    return {
        "family": pipe.recipe.family,
        "vq": vq_file,
        "codes": tok.vocab_size,
        "px": pipe.recipe.px,
        "patch": pipe.recipe.patch,
        "grid": pipe.recipe.grid("target"),
        "prompts": len(quality.keys),
        "psnr": scores["VQ reconstructions"]["psnr"],
        **{name: {k: row[k] for k in ("fd", "adherence")} for name, row in scores.items()},
    }


def main(argv=None, prog=None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=[f for f, r in RECIPES.items() if r.styles], default="emoji-16")
    parser.add_argument("--run-dir", type=Path, help="the run folder (default runs/FAMILY)")
    parser.add_argument("--cache", type=Path, help="the data cache the run used (default ~/.cache/mulo/styles)")
    parser.add_argument("--smoke", action="store_true", help="a run folder of `train --smoke`")
    parser.add_argument("--prompts", type=int, default=24, help="evaluation prompts (default 24)")
    parser.add_argument("--seeds", type=int, default=5, help="AR seeds per prompt (default 5)")
    parser.add_argument("--json", type=Path, help="also write the result here")
    parser.add_argument("--ceiling", action="store_true", help="the VQ's ceilings instead (no target needed)")
    parser.add_argument(
        "--vq", default="vq.pt", help="with --ceiling: the VQ weights in the run folder (default vq.pt)"
    )
    args = parser.parse_args(argv)
    if args.prompts < 1 or args.seeds < 2:
        parser.error("--prompts must be at least 1 and --seeds at least 2")
    recipe = RECIPES[args.family]
    run_dir = args.run_dir or Path("runs") / args.family
    if not (run_dir / "report.json").exists():
        parser.error(f"{run_dir} is no run folder (no report.json)")
    budget = recipe.smoke if args.smoke else recipe.budget
    pipe = Pipeline(run_dir, run_dir / "assets", recipe, budget, cache=args.cache)  # writes nothing
    try:
        result = vq_ceiling(pipe, args.vq) if args.ceiling else study(pipe, args.prompts, args.seeds)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    text = json.dumps(result, indent=1)
    if args.json:
        args.json.write_text(text)
    print(text)
    return 0
