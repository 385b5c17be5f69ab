"""The scenes target alone, trained on another run's data (issue 63's study, one knob at a time).

A full study candidate spends ~28 CPU-minutes, two thirds of them outside the target; this trains
only the target of a candidate recipe on the clip, VQ, held-out tokens and encoded training
scenes of a finished run (linked, not copied; with ``--encode``, its clip and VQ only, and the
recipe's own scenes encoded by them), so candidates that differ in the target alone
(its position start, width, learning rate) compare on the same scenes in ~13 minutes each. The
report (``RUN/report.json``'s ``target``) holds the held-out curve and, at the end, the held-out
and training losses with the object tokens apart (``stages.ar.object_losses``).

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
from mulo.train.pipeline import Pipeline
from mulo.train.recipes import RECIPES
from mulo.train.stages import ar as ar_stage
from mulo.train.stages.ar import stage_ar

SHARED = ("clip.pt", "clip_vocab.json", "vq.pt", "tokens.npz", "scenes")


class NeighbourGPT(GPT):
    """A trial of an input the engine does not feed (teacher-forced passes only, never exported):
    the slot that predicts token (r, c) also adds learned embeddings of tokens (r - 1, c - 1),
    (r - 1, c) and (r - 1, c + 1), one table each (a last row for "none": the first row, the
    edges). The token to its left is the slot's own input already. A lookup table over these four
    neighbours predicts 84.5 % of held-out object tokens from 6,144 scenes (the notebook), where the
    plain target, which must find them by attention, predicts 7 % after 6,400."""

    def __init__(self, config):
        super().__init__(config)
        self.neighbours = torch.nn.ModuleList(torch.nn.Embedding(config.vocab_size + 1, config.dim) for _ in range(3))

    def forward(self, tokens, cond, mask=None, hidden=False):
        height, width = self.config.grid_hw
        length = tokens.shape[1] + 1  # the tokens predicted: the inputs and the one after them
        index = torch.arange(length, device=tokens.device)
        row, col = index // width, index % width
        x = self.embed_condition(cond)
        n_cond = x.shape[1]
        x = torch.cat([x, self.embed_tokens(tokens)], dim=1)
        extra = torch.zeros(tokens.shape[0], length, self.config.dim, device=tokens.device)
        for shift, table in zip((-1, 0, 1), self.neighbours, strict=True):
            source = index - width + shift
            valid = (row > 0) & (col + shift >= 0) & (col + shift < width)
            found = tokens[:, source.clamp(0, tokens.shape[1] - 1)]
            found = torch.where(valid, found, torch.full_like(found, self.config.vocab_size))
            extra = extra + table(found)
        x = torch.cat([x[:, : n_cond - 1], x[:, n_cond - 1 :] + extra.to(x.dtype)], dim=1)
        slots = torch.arange(x.shape[1], device=x.device)
        out = self.forward_hidden(x, slots, mask)[:, n_cond - 1 :]
        return out if hidden else self.output(out).float()


@torch.no_grad()
def draw(model, cond: torch.Tensor, cfg: float, top_p: float, generator: torch.Generator) -> torch.Tensor:
    """AR samples ``[N, L]`` of a (neighbour-input) target for conditions ``cond [N, T, C]`` with
    classifier-free guidance: a plain cached loop (the trial's own, since the engine feeds no
    neighbour inputs), the next slot's input its token plus its three upper neighbours."""
    from mulo.models.gpt import KVCache
    from mulo.sampling import logits_to_probs, sample

    height, width = model.config.grid_hw
    length, n = height * width, len(cond)
    cond = torch.cat([cond, torch.zeros_like(cond)])  # conditional rows, then unconditional
    cache = KVCache(model.config, 2 * n, "cpu", torch.float32)
    tokens = torch.zeros(n, length, dtype=torch.long)

    def extra(position: int) -> torch.Tensor:  # the upper neighbours of the token at ``position``
        if not isinstance(model, NeighbourGPT):
            return 0
        row, col = divmod(position, width)
        out = 0
        for shift, table in zip((-1, 0, 1), model.neighbours, strict=True):
            ok = row > 0 and 0 <= col + shift < width
            ids = tokens[:, position - width + shift] if ok else torch.full((n,), model.config.vocab_size)
            out = out + table(ids)
        return torch.cat([out, out])[:, None]

    def next_token(hidden: torch.Tensor) -> torch.Tensor:
        logits = model.output(hidden[:, -1]).float()
        guided = logits[n:] + cfg * (logits[:n] - logits[n:])
        return sample(logits_to_probs(guided, 1.0, 0, top_p), generator)

    x = model.embed_condition(cond)
    n_cond = x.shape[1]
    x = torch.cat([x[:, :-1], x[:, -1:] + extra(0)], dim=1)
    mask = torch.ones(n_cond, n_cond, dtype=torch.bool).tril()
    tokens[:, 0] = next_token(model.forward_hidden(x, torch.arange(n_cond), mask, cache))
    for position in range(1, length):
        slot = n_cond + position - 1
        x = model.embed_tokens(torch.cat([tokens[:, position - 1]] * 2))[:, None] + extra(position)
        mask = torch.ones(1, slot + 1, dtype=torch.bool)
        tokens[:, position] = next_token(model.forward_hidden(x, torch.tensor([slot]), mask, cache))
    return tokens


def judge_samples(pipe, model, count: int, cfg: float, top_p: float, sprites: Path) -> dict:
    """AR samples of the first ``count`` evaluation prompts (seed i for prompt i), judged by the
    referee: prompt match and its parts; the images to ``RUN/samples.png``."""
    from PIL import Image

    from mulo.eval.referee import Referee, Sprites
    from mulo.eval.scene_quality import verdict_parts
    from mulo.train import scenes

    stream = pipe.scene_stream
    shown = scenes.evaluation_scenes(pipe.recipe.scenes, stream.sheet, count)
    clip = pipe.load_clip()
    cond = clip.condition_features(clip.tokenizer.batch([s.prompt for s in shown])).float()
    model.eval()
    rows = [draw(model, cond[i : i + 1], cfg, top_p, torch.Generator().manual_seed(i)) for i in range(count)]
    side = model.config.grid_hw[0]
    images = pipe.tokenizer().decode(torch.cat(rows).reshape(count, side, side))
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
    """``value`` as the type of ``instance``'s field ``key``."""
    return type(getattr(instance, key))(value)


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
    parser.add_argument(
        "--neighbours", action="store_true", help="a trial target that also reads the row above's three tokens"
    )
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
    target = {k: int(v) for k, v in (field.split("=", 1) for field in args.target)}
    recipe = replace(recipe, target={**recipe.target, **target})
    scene = dict(field.split("=", 1) for field in args.scene)
    if scene and not args.encode:
        parser.error("--scene changes the scenes: add --encode")
    recipe = replace(recipe, scenes=replace(recipe.scenes, **{k: typed(recipe.scenes, k, v) for k, v in scene.items()}))
    budget = replace(recipe.budget, ar_steps=args.steps, validate_every=100)
    if args.zipar_share is not None:
        budget = replace(budget, zipar_share=args.zipar_share)
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
        "source": str(args.source),
    }
    report_path.write_text(json.dumps(report, indent=1))
    if args.neighbours:
        ar_stage.GPT = NeighbourGPT
        report["experiment"]["neighbours"] = True
        report_path.write_text(json.dumps(report, indent=1))
    pipe = Pipeline(args.run, args.run / "assets", recipe, budget)
    if args.encode:
        pipe.run_all(["tokens"])
    if not ((args.run / "target.pt").exists() and "val_loss" in report.get("target", {})):
        stage_ar(pipe, "target")
    target = pipe.report["target"]
    print(json.dumps({k: v for k, v in target.items() if "loss" in k or "accuracy" in k or k == "val_curve"}))
    if args.sample:
        config = GPTConfig(**json.loads((args.run / "target.json").read_text()))
        model = (NeighbourGPT if args.neighbours else GPT)(config)
        model.load_state_dict(torch.load(args.run / "target.pt", map_location="cpu", weights_only=True))
        judged = judge_samples(pipe, model, args.sample, args.cfg, args.top_p, args.sprites)
        report = json.loads(report_path.read_text())
        report["samples"] = {"cfg": args.cfg, "top_p": args.top_p, **judged}
        report_path.write_text(json.dumps(report, indent=1))
        print(json.dumps({k: v for k, v in judged.items() if k != "prompts"}, indent=1))


if __name__ == "__main__":
    main()
