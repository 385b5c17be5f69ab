"""Where a scenes target misses, teacher-forced, and how one miss spreads (issue 63).

    python tools/experiments/scenes_misses.py runs/scenes [--weights runs/scenes/target.best] [--scenes 96]

On held-out scenes (the run's validation split; the background = a scene's most common token):

- top-1 and nats of the target tokens by what surrounds them: object tokens under an object token,
  an object's first row (an object token to the left, none above), starts (neither), and
  background tokens beside an object;
- robustness: at one object token under an object token per scene, top-1 with the true inputs,
  then with the token above it, or the one to its left, replaced by another of the scene's object
  tokens (a miss a free-running sample makes). A target that only copies its neighbours falls to
  about half; one that reads the object as a whole stays near its clean accuracy;
- reach: at one object token per scene (row 6 or below, under an object token), top-1 when every
  row more than k rows above it is wiped to the background: a target that reads only the last
  rows keeps its accuracy at small k;
- strays: under classifier-free guidance g, the probability mass a sampler puts on anything but
  the true background at background tokens with no object beside them, summed over an image: the
  pieces a free-running sample starts where nothing belongs (guidance multiplies it).
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from mulo.models.gpt import GPT
from mulo.sampling import cfg_combine
from mulo.train.pipeline import Pipeline
from mulo.train.recipes import RECIPES
from mulo.train.stages.ar import ar_data, background_mask, held_out


def load_target(pipe: Pipeline, data, weights: Path) -> GPT:
    model = GPT(pipe.recipe.gpt_config("target", pipe.codes, data.cond_name.shape[-1]))
    state = torch.load(weights, map_location="cpu", weights_only=True)
    model.load_state_dict({k: v.float() for k, v in state.get("model", state).items()})
    return model.eval()


def by_surroundings(model: GPT, tokens: torch.Tensor, cond: torch.Tensor, side: int) -> dict:
    with torch.no_grad():
        logits = model(tokens[:, :-1], cond, view=tokens[:, :-1]).float()
    hits = (logits.argmax(-1) == tokens).reshape(-1, side, side)
    nats = F.cross_entropy(logits.transpose(1, 2), tokens, reduction="none").reshape(-1, side, side)
    grid = tokens.reshape(-1, side, side)
    obj = ~background_mask(tokens).reshape(grid.shape)
    above, left = torch.zeros_like(obj), torch.zeros_like(obj)
    above[:, 1:], left[:, :, 1:] = obj[:, :-1], obj[:, :, :-1]
    groups = {
        "object, under an object": obj & above,
        "object, first row (left only)": obj & left & ~above,
        "object, start (neither)": obj & ~above & ~left,
        "background beside an object": ~obj & (above | left),
    }
    return {name: (int(m.sum()), float(hits[m].float().mean()), float(nats[m].mean())) for name, m in groups.items()}


def robustness(model: GPT, tokens: torch.Tensor, cond: torch.Tensor, side: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    obj = ~background_mask(tokens)
    variants = {"true inputs": tokens.clone(), "token above wrong": tokens.clone(), "token left wrong": tokens.clone()}
    picked = []
    for i in range(len(tokens)):
        under = [p for p in range(2 * side, tokens.shape[1]) if obj[i, p] and obj[i, p - side]]
        if not under:
            continue
        p = int(rng.choice(under))
        picked.append((i, p))
        for name, q in (("token above wrong", p - side), ("token left wrong", p - 1)):
            others = tokens[i][obj[i] & (tokens[i] != tokens[i, q])]
            variants[name][i, q] = others[rng.integers(len(others))]
    return {"positions": len(picked), **{name: top1_at(model, x, cond, tokens, picked) for name, x in variants.items()}}


def top1_at(model: GPT, inputs: torch.Tensor, cond: torch.Tensor, tokens: torch.Tensor, picked) -> float:
    """Top-1 of the target at the ``picked`` (scene, position) pairs, fed ``inputs`` instead of ``tokens``."""
    with torch.no_grad():
        logits = model(inputs[:, :-1], cond, view=inputs[:, :-1])
    return float(np.mean([int(logits[i, p].argmax() == tokens[i, p]) for i, p in picked]))


def reach(model: GPT, tokens: torch.Tensor, cond: torch.Tensor, side: int, rows=(1, 2, 3, 5), seed: int = 0) -> dict:
    generator = torch.Generator().manual_seed(seed)
    obj = ~background_mask(tokens)
    above = torch.zeros_like(obj)
    above[:, side:] = obj[:, :-side]
    eligible = obj & above & (torch.arange(tokens.shape[1]) >= 6 * side)
    background = torch.mode(tokens, 1).values
    picked = []
    for i in range(len(tokens)):
        places = torch.nonzero(eligible[i]).flatten()
        if len(places):
            picked.append((i, int(places[torch.randint(len(places), (1,), generator=generator)])))
    out = {"positions": len(picked), "true inputs": top1_at(model, tokens, cond, tokens, picked)}
    for k in rows:
        wiped = tokens.clone()
        for i, p in picked:
            wiped[i, : (p // side - k) * side] = background[i]
        out[f"{k} rows kept"] = top1_at(model, wiped, cond, tokens, picked)
    return out


def strays(model: GPT, tokens: torch.Tensor, cond: torch.Tensor, side: int, guidance=(1.0, 2.0, 3.0)) -> dict:
    obj = ~background_mask(tokens).reshape(-1, side, side)
    near = obj.clone()
    near[:, 1:] |= obj[:, :-1]
    near[:, :-1] |= obj[:, 1:]
    near[:, :, 1:] |= obj[:, :, :-1]
    near[:, :, :-1] |= obj[:, :, 1:]
    far = (~near).reshape(len(tokens), -1)
    with torch.no_grad():
        conditional = model(tokens[:, :-1], cond, view=tokens[:, :-1]).float()
        null = model(tokens[:, :-1], model.null_condition(cond), view=tokens[:, :-1]).float()
    out = {}
    for g in guidance:
        p_true = cfg_combine(conditional, null, g).softmax(-1).gather(-1, tokens[..., None])[..., 0]
        out[f"guidance {g:g}"] = round(float(((1 - p_true) * far).sum(1).mean()), 2)
    return out


def held_out_scenes(run: Path, recipe: str, condition: str | None, count: int, weights: Path | None):
    """(pipeline, target, tokens ``[N, L]``, conditions) of the first ``count`` held-out scenes of a
    scenes ``run`` (read, nothing written), the target loaded from ``weights`` (default RUN/target.best)
    and read with ``condition`` (default: the recipe's)."""
    chosen = RECIPES[recipe]
    if condition:
        chosen = replace(chosen, scene_condition=condition)
    pipe = Pipeline(run, run / "assets", chosen, chosen.budget)
    data = ar_data(pipe, chosen.grid("target"))
    index = held_out(pipe, data)["val"][:count]
    tokens = torch.as_tensor(data.tokens[index]).long()
    cond = torch.as_tensor(getattr(data, "cond_name_style", data.cond_name)[index]).float()
    return pipe, load_target(pipe, data, weights or run / "target.best"), tokens, cond


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a scenes run folder past its tokens stage")
    parser.add_argument("--weights", type=Path, help="a state dict or checkpoint (default RUN/target.best)")
    parser.add_argument("--recipe", default="scenes")
    parser.add_argument("--scenes", type=int, default=96, help="held-out scenes read")
    parser.add_argument("--condition", choices=("clip", "symbols"), help="how the target reads a prompt")
    args = parser.parse_args()
    pipe, model, tokens, cond = held_out_scenes(args.run, args.recipe, args.condition, args.scenes, args.weights)
    side = pipe.recipe.grid("target")
    for name, (count, top1, nats) in by_surroundings(model, tokens, cond, side).items():
        print(f"{name:32s} {count:6d} tokens  top-1 {top1:.3f}  {nats:.3f} nats")
    print("robustness", robustness(model, tokens, cond, side))
    print("reach", reach(model, tokens, cond, side))
    print("strays a sample starts per image", strays(model, tokens, cond, side))


if __name__ == "__main__":
    main()
