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
- counting: the probability mass off the background at background tokens with no object beside
  them, per token, before the scene's last object begins (in raster order) and after it, in the rows
  where another object could still begin, and at each object's first token (with the nats of the
  true token there given that an object begins: which one, the prompt's part). A target that
  counts what it has drawn puts almost nothing there once every object has begun;
- blank: one-object prompts read on a canvas of their background alone (from the run's newest
  chunk of training scenes): the chance a sample draws nothing at all (the product over the cells of
  staying background) and the mass off the background by row. The data's object must begin by the
  last row where it fits, so a model that knows it has not begun puts ~1 there;
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
from mulo.scenes import parse_prompt
from mulo.train.pipeline import Pipeline
from mulo.train.recipes import RECIPES, SCENE_CONDITIONS
from mulo.train.stages.ar import ar_data, background_mask, background_token, held_out, scene_conditions


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
    background = background_token(tokens)
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


def near_objects(obj: torch.Tensor, diagonals: bool) -> torch.Tensor:
    """Cells of ``obj [N, H, W]`` (object tokens) that are an object token or touch one: by a side,
    or by a corner too with ``diagonals``; the grid does not wrap."""
    near = obj.clone()
    height, width = obj.shape[1:]
    steps = [(dy, dx) for dy in (-1, 0, 1) for dx in (-1, 0, 1) if (dy or dx) and (diagonals or not (dy and dx))]
    for dy, dx in steps:  # near[y, x] |= obj[y - dy, x - dx] where both are on the grid
        near[:, max(dy, 0) : height + min(dy, 0), max(dx, 0) : width + min(dx, 0)] |= obj[
            :, max(-dy, 0) : height + min(-dy, 0), max(-dx, 0) : width + min(-dx, 0)
        ]
    return near


def strays(model: GPT, tokens: torch.Tensor, cond: torch.Tensor, side: int, guidance=(1.0, 2.0, 3.0)) -> dict:
    obj = ~background_mask(tokens).reshape(-1, side, side)
    far = (~near_objects(obj, diagonals=False)).reshape(len(tokens), -1)
    with torch.no_grad():
        conditional = model(tokens[:, :-1], cond, view=tokens[:, :-1]).float()
        null = model(tokens[:, :-1], model.null_condition(cond), view=tokens[:, :-1]).float()
    out = {}
    for g in guidance:
        p_true = cfg_combine(conditional, null, g).softmax(-1).gather(-1, tokens[..., None])[..., 0]
        out[f"guidance {g:g}"] = round(float(((1 - p_true) * far).sum(1).mean()), 2)
    return out


def object_boxes(tokens: torch.Tensor, side: int) -> list[tuple[int, int, int, int]]:
    """(row0, row1, col0, col1) inclusive of each 8-connected piece of non-background tokens."""
    obj = (~background_mask(tokens[None]))[0].reshape(side, side).numpy()
    seen = np.zeros_like(obj)
    boxes = []
    for r, c in zip(*np.nonzero(obj), strict=True):
        if seen[r, c]:
            continue
        stack, cells = [(r, c)], []
        seen[r, c] = True
        while stack:
            y, x = stack.pop()
            cells.append((y, x))
            for dy in (-1, 0, 1):
                for dx in (-1, 0, 1):
                    v, u = y + dy, x + dx
                    if 0 <= v < side and 0 <= u < side and obj[v, u] and not seen[v, u]:
                        seen[v, u] = True
                        stack.append((v, u))
        ys, xs = zip(*cells, strict=True)
        if len(cells) >= 8:  # a piece of an object, not a stray
            boxes.append((min(ys), max(ys), min(xs), max(xs)))
    return boxes


def counting(model: GPT, tokens: torch.Tensor, cond: torch.Tensor, side: int, object_rows: int = 8) -> dict:
    obj = ~background_mask(tokens).reshape(-1, side, side)
    far = (~near_objects(obj, diagonals=True)).reshape(len(tokens), -1)
    with torch.no_grad():
        logits = model(tokens[:, :-1], cond, view=tokens[:, :-1]).float()
    background = background_token(tokens)
    index = background[:, None, None].expand(-1, logits.shape[1], 1)
    off = 1 - logits.softmax(-1).gather(-1, index)[..., 0]  # mass off the scene's background token
    cells = torch.arange(side * side)
    before, after, firsts, which = [], [], [], []
    for i in range(len(tokens)):
        starts = []
        for r0, _, c0, c1 in object_boxes(tokens[i], side):
            first = int(obj[i, r0, c0 : c1 + 1].nonzero()[0])
            starts.append(r0 * side + c0 + first)
        last = max(starts, default=0)
        firsts += [float(off[i, s]) for s in starts]
        # which object token, given that one begins: -log p(true token) / p(off the background)
        which += [float(logits[i, s].log_softmax(-1)[tokens[i, s]] - off[i, s].log()) for s in starts]
        before.append(off[i][far[i] & (cells < last)])
        after.append(off[i][far[i] & (cells > last) & (cells < (side - object_rows + 1) * side)])
    before, after = torch.cat(before), torch.cat(after)
    return {
        "before the last object begins": round(float(before.mean()), 4),
        "after it, where one could still begin": round(float(after.mean()), 4),
        "at each object's first token": round(float(np.mean(firsts)), 4),
        "nats of its token, given one begins": round(-float(np.mean(which)), 3),
    }


def blank_canvas(model: GPT, backgrounds: torch.Tensor, cond: torch.Tensor, side: int) -> dict:
    """``backgrounds [N]`` (each scene's background token) filling the canvas, read with ``cond``:
    the mean chance of a sample that never leaves the background, and the mass off it by row."""
    canvas = backgrounds[:, None].expand(-1, side * side)
    with torch.no_grad():
        logits = model(canvas[:, :-1], cond, view=canvas[:, :-1]).float()
    stay = logits.softmax(-1).gather(-1, canvas[..., None])[..., 0]
    by_row = (1 - stay).reshape(len(canvas), side, side).sum(-1).mean(0)
    return {
        "chance of a blank sample": round(float(stay.log().sum(1).exp().mean()), 3),
        "mass off the background by row": [round(float(x), 3) for x in by_row],
    }


def one_object_scenes(pipe: Pipeline, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(background tokens ``[N]``, conditions) of up to ``count`` one-object scenes of the run's
    newest chunk of encoded training scenes, conditioned as the recipe reads their prompts."""
    chunk = max((pipe.run / "scenes").glob("chunk-*.npz"))
    stored = np.load(chunk)
    one = [i for i, name in enumerate(stored["name"]) if len(parse_prompt(str(name)).objects) == 1][:count]
    side = pipe.recipe.grid("target")
    tokens = torch.from_numpy(stored[f"tokens{pipe.recipe.px}"][one].astype(np.int64)).reshape(len(one), side * side)
    cond = scene_conditions(pipe, pipe.load_clip(), [str(stored["name"][i]) for i in one]).float()
    return background_token(tokens), cond


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
    parser.add_argument("--condition", choices=SCENE_CONDITIONS, help="how the target reads a prompt")
    args = parser.parse_args()
    pipe, model, tokens, cond = held_out_scenes(args.run, args.recipe, args.condition, args.scenes, args.weights)
    side = pipe.recipe.grid("target")
    for name, (count, top1, nats) in by_surroundings(model, tokens, cond, side).items():
        print(f"{name:32s} {count:6d} tokens  top-1 {top1:.3f}  {nats:.3f} nats")
    print("robustness", robustness(model, tokens, cond, side))
    print("reach", reach(model, tokens, cond, side))
    print("counting: mass off the background a token", counting(model, tokens, cond, side))
    print("counting, null condition", counting(model, tokens, model.null_condition(cond), side))
    print("strays a sample starts per image", strays(model, tokens, cond, side))
    backgrounds, one_object = one_object_scenes(pipe, args.scenes)
    print("blank canvas, one-object prompts", blank_canvas(model, backgrounds, one_object, side))


if __name__ == "__main__":
    main()
