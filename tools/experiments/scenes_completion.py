"""How often a scenes target completes one object of a true scene, free-running inside its box (issue 63).

    python tools/experiments/scenes_completion.py runs/scenes [--weights W] [--scenes 32] [--temperature 1]

Teacher-forced top-1 says little about a free-running sample: one miss may be copied down the
object. Here every token of a held-out scene is the true one except one object's box (the bounding
box of a connected piece of non-background tokens), which the target samples in raster order,
seeing the true scene before each token and its own samples inside the box. Variants give it more
of the box first: nothing (it starts the object), the box's first row (the object's identity is
mostly decided there), half the box. Reported per variant: the share of boxes sampled exactly as
the truth, the share of box tokens right, the share whose decoded box lies within the referee's
RMSE of the truth's (``MAX_RMSE``: a miss by a near-identical square is no miss to the eye), and
the referee's reading of the completed scene: as many named emoji as the truth's and nothing it
cannot name ("whole": a different emoji than the truth's counts, as a free-running sample may draw
it), and the same emoji as the truth's; and where the first miss falls (row of the box). A
target whose misses sit in the first row chooses an object badly; one whose misses are spread
down the box copies its own misses.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

from mulo.eval.referee import MAX_RMSE, Referee
from mulo.sampling import logits_to_probs
from mulo.train import scenes
from mulo.train.recipes import SCENE_CONDITIONS

sys.path.insert(0, str(Path(__file__).parent))  # a sibling script, not a package
from scenes_misses import held_out_scenes, object_boxes  # noqa: E402


def complete(model, tokens, cond, sampled: torch.Tensor, temperature: float, top_p: float, generator) -> torch.Tensor:
    """``tokens [B, L]`` with the positions of ``sampled [B, L]`` drawn by ``model`` in raster order."""
    x = tokens.clone()
    for p in torch.nonzero(sampled.any(0)).flatten().tolist():
        rows = torch.nonzero(sampled[:, p]).flatten()
        with torch.no_grad():
            inputs = x[rows, :-1]
            logits = model(inputs, cond[rows], view=inputs)[:, p].float()
        if temperature == 0:
            x[rows, p] = logits.argmax(-1)
        else:
            probs = logits_to_probs(logits, temperature, top_p=top_p)
            x[rows, p] = torch.multinomial(probs, 1, generator=generator)[:, 0]
    return x


def as_uint8(pixels: torch.Tensor) -> np.ndarray:
    """``[B, 3, h, w]`` in [0, 255] as the referee's ``[B, h, w, 3]`` uint8."""
    return pixels.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).numpy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a scenes run folder past its tokens stage")
    parser.add_argument("--weights", type=Path, help="a state dict or checkpoint (default RUN/target.best)")
    parser.add_argument("--recipe", default="scenes")
    parser.add_argument("--scenes", type=int, default=32, help="held-out scenes, one object box each")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--condition", choices=SCENE_CONDITIONS, help="how the target reads a prompt")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--given", default="0,1,4", help="box rows given before sampling, per variant")
    args = parser.parse_args()
    pipe, model, tokens, cond = held_out_scenes(args.run, args.recipe, args.condition, args.scenes, args.weights)
    side = pipe.recipe.grid("target")
    vq = pipe.tokenizer()
    config = pipe.recipe.scenes
    referee = Referee(scenes.sprites(pipe.cache, config.object_px, config.canvas).subset(config.names))
    rng = np.random.default_rng(args.seed)
    boxes = []
    for i in range(len(tokens)):
        found = object_boxes(tokens[i], side)
        boxes.append(found[rng.integers(len(found))] if found else None)
    kept = [i for i, b in enumerate(boxes) if b is not None]
    tokens, cond, boxes = tokens[kept], cond[kept], [boxes[i] for i in kept]
    grid_rows = torch.arange(side * side) // side
    grid_cols = torch.arange(side * side) % side
    for label, condition in (("the prompt", cond), ("the null condition", model.null_condition(cond))):
        with torch.no_grad():  # teacher-forced top-1 by row of the box: how much the prompt says
            hits = model(tokens[:, :-1], condition, view=tokens[:, :-1]).argmax(-1) == tokens
        by_row = []
        for k in range(8):
            at = [hits[i, (r0 + k) * side + c0 : (r0 + k) * side + c1 + 1] for i, (r0, r1, c0, c1) in enumerate(boxes)]
            at = [row for row, (r0, r1, *_) in zip(at, boxes, strict=True) if r0 + k <= r1]
            by_row.append(round(float(torch.cat(at).float().mean()), 3) if at else None)
        print(f"teacher-forced top-1 of box tokens by box row, {label}: {by_row}", flush=True)
    for given in [int(g) for g in args.given.split(",") if g]:
        name = "start" if given == 0 else f"{given} row{'s' * (given > 1)} given"
        sampled = torch.zeros_like(tokens, dtype=torch.bool)
        for i, (r0, r1, c0, c1) in enumerate(boxes):
            in_box = (grid_rows >= r0 + given) & (grid_rows <= r1) & (grid_cols >= c0) & (grid_cols <= c1)
            sampled[i] = in_box
        generator = torch.Generator().manual_seed(args.seed)
        x = complete(model, tokens, cond, sampled, args.temperature, args.top_p, generator)
        wrong = (x != tokens) & sampled
        exact = float((~wrong.any(1)).float().mean())
        right = 1 - float(wrong.sum() / sampled.sum())
        with torch.no_grad():
            truth_px = vq.decode(tokens.reshape(-1, side, side)) * 255
            drawn_px = vq.decode(x.reshape(-1, side, side)) * 255
        patch = truth_px.shape[-1] // side
        close = []
        for i, (r0, r1, c0, c1) in enumerate(boxes):
            rows, cols = slice(r0 * patch, (r1 + 1) * patch), slice(c0 * patch, (c1 + 1) * patch)
            rmse = float(((truth_px[i, :, rows, cols] - drawn_px[i, :, rows, cols]) ** 2).mean().sqrt())
            close.append(rmse <= MAX_RMSE)
        whole, same = [], []
        for truth_image, drawn_image in zip(as_uint8(truth_px), as_uint8(drawn_px), strict=True):
            truth, drawn = referee.read(truth_image), referee.read(drawn_image)
            whole.append(len(drawn.objects) == len(truth.objects) and not drawn.unknown)
            same.append(whole[-1] and sorted(drawn.names()) == sorted(truth.names()))
        first_miss = []
        for i, (r0, *_) in enumerate(boxes):
            misses = torch.nonzero(wrong[i]).flatten()
            if len(misses):
                first_miss.append(int(misses[0]) // side - r0)
        histogram = np.bincount(first_miss, minlength=8).tolist() if first_miss else []
        print(
            f"{name:16s} boxes {len(boxes)}  exact {exact:.3f}  tokens right {right:.3f}  "
            f"within RMSE {MAX_RMSE:g} {np.mean(close):.3f}  referee: whole {np.mean(whole):.3f} "
            f"same {np.mean(same):.3f}  "
            f"first miss by box row {histogram}",
            flush=True,
        )


if __name__ == "__main__":
    main()
