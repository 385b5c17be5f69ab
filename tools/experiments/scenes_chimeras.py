"""Where a scenes target's free-running objects turn into chimeras (issue 63).

    python tools/experiments/scenes_chimeras.py RUN [--weights W] [--scenes 48] [--prompts 24]
        [--inside-temperature 1,0.5,0]

Two measurements:

- **naming at the first token**, teacher-forced on held-out scenes: at each object's first token
  (raster order), the probability mass on the background, on the first codes of the named emoji's
  sprites (any style, this background) and on those of the other emoji. Renormalised off the
  background, it says how often an object that begins begins as the named one.
- **AR with a temperature inside objects**, on the first ``--prompts`` evaluation prompts (seed i
  for prompt i), judged by the referee: the target's own distribution at cells with nothing drawn
  around them (where an object may begin: a low temperature there cuts the starts), and the
  temperature ``--inside-temperature`` (0: greedy) at cells with a non-background token to the left
  (two cells) or in the row above (three cells). If lowering it makes whole objects, the chimeras
  come from sampling small per-token errors over an object's ~40 tokens; if not, from the model.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

import numpy as np
import torch

from mulo.eval.referee import Referee
from mulo.runner import ModelRunner
from mulo.train import scenes
from mulo.train.stages.ar import scene_conditions

sys.path.insert(0, str(Path(__file__).parent))  # a sibling script, not a package
from scenes_misses import held_out_scenes  # noqa: E402

NEAR = ((0, -1), (0, -2), (-1, -1), (-1, 0), (-1, 1))  # (row, column) steps to the cells an inside cell sees


class Encoder:
    """Single scenes as the run's VQ tokens, and the first object code of each emoji's sprites."""

    def __init__(self, pipe):
        self.config, self.sheet, self.vq = pipe.recipe.scenes, pipe.scene_stream.sheet, pipe.tokenizer()
        self._first: dict[tuple[str, str], set[int]] = {}

    def tokens(self, scene: scenes.Scene) -> torch.Tensor:
        image = torch.as_tensor(scenes.compose(scene, self.sheet, self.config.canvas)).permute(2, 0, 1)
        return self.vq.encode(image[None] / 255).reshape(-1)

    @functools.cache  # noqa: B019 (one encoder a run)
    def background(self, colour: str) -> int:
        return int(self.tokens(scenes.Scene(colour, (), None))[0])

    def first_codes(self, name: str, colour: str) -> set[int]:
        """The code of the first non-background token of ``name``'s sprite, in each style it is drawn in."""
        if (name, colour) not in self._first:
            found, ground = set(), self.background(colour)
            for style in self.config.styles:
                drawn = self.tokens(scenes.Scene(colour, (scenes.Placed(name, style, 32, 32),), None))
                where = torch.nonzero(drawn != ground).flatten()
                if len(where):  # an emoji not drawn on this background in this style has none
                    found.add(int(drawn[where[0]]))
            self._first[(name, colour)] = found
        return self._first[(name, colour)]


def naming_at_first_token(pipe, model, tokens: torch.Tensor, cond: torch.Tensor) -> dict:
    encoder, side = Encoder(pipe), pipe.recipe.grid("target")
    with torch.no_grad():
        probs = torch.cat(
            [
                model(tokens[i : i + 8, :-1], cond[i : i + 8], view=tokens[i : i + 8, :-1]).float().softmax(-1)
                for i in range(0, len(tokens), 8)
            ]
        )
    masses = []
    for j in range(len(tokens)):
        scene = pipe.scene_stream.scene(j, scenes.HELD_OUT)  # tokens.npz's held-out rows, in order
        ground = encoder.background(scene.background)
        for obj in scene.objects:
            box = torch.zeros(side, side, dtype=torch.bool)
            cell = encoder.vq.downsample
            box[
                obj.y // cell : (obj.y + encoder.config.object_px) // cell,
                obj.x // cell : (obj.x + encoder.config.object_px) // cell,
            ] = True
            first = int(torch.nonzero(box.reshape(-1) & (tokens[j] != ground))[0])
            named = encoder.first_codes(obj.name, scene.background)
            others = set().union(
                *(encoder.first_codes(n, scene.background) for n in encoder.config.names if n != obj.name)
            )
            p = probs[j, first]
            masses.append(
                (
                    float(p[ground]),
                    float(p[sorted(named)].sum()),
                    float(p[sorted(others - named)].sum()),
                    float(p[tokens[j, first]]),
                )
            )
    m = np.array(masses)
    began = 1 - m[:, 0]
    return {
        "objects": len(m),
        "background": round(float(m[:, 0].mean()), 4),
        "true code": round(float(m[:, 3].mean()), 4),
        "named, given it begins": round(float((m[:, 1] / began).mean()), 4),
        "another emoji, given it begins": round(float((m[:, 2] / began).mean()), 4),
    }


def inside(seq: torch.Tensor, u: int, side: int, ground: int) -> bool:
    r, c = divmod(u, side)
    return any(r + dr >= 0 and 0 <= c + dc < side and int(seq[(r + dr) * side + c + dc]) != ground for dr, dc in NEAR)


def sample(model, cond: torch.Tensor, ground: int, temperature: float, generator: torch.Generator) -> torch.Tensor:
    """One AR sample: the target's distribution outside objects, ``temperature`` inside them."""
    runner = ModelRunner(model, cond, 1.0, 1.0, 0, 1.0)
    runner.prefill()
    side = model.config.grid_hw[1]
    seq = torch.full((model.config.max_seq_len,), -1, dtype=torch.long)
    for u in range(len(seq)):
        logits = runner.next_logits(seq, u).float().reshape(-1)
        t = temperature if inside(seq, u, side, ground) else 1.0
        seq[u] = logits.argmax() if t == 0 else torch.multinomial((logits / t).softmax(-1), 1, generator=generator)[0]
    return seq


def judged_samples(pipe, model, count: int, temperature: float) -> dict:
    config, encoder = pipe.recipe.scenes, Encoder(pipe)
    shown = scenes.evaluation_scenes(config, pipe.scene_stream.sheet)[:count]
    cond = scene_conditions(pipe, pipe.load_clip(), [s.prompt for s in shown]).float()
    rows = [
        sample(model, cond[i], encoder.background(s.background), temperature, torch.Generator().manual_seed(i))
        for i, s in enumerate(shown)
    ]
    side = model.config.grid_hw[0]
    pixels = encoder.vq.decode(torch.stack(rows).reshape(-1, side, side))
    pixels = (pixels.permute(0, 2, 3, 1).numpy() * 255).round().astype("uint8")
    referee = Referee(scenes.sprites(pipe.cache, config.object_px, config.canvas).subset(config.names))
    verdicts = [referee.prompt_match(image, s.prompt) for image, s in zip(pixels, shown, strict=True)]
    return {
        "inside temperature": temperature,
        "prompt match": f"{sum(v.match for v in verdicts)}/{count}",
        "named found": f"{sum(len(v.found) for v in verdicts)}/{sum(len(v.prompt.objects) for v in verdicts)}",
        "unnamed emoji": sum(len(v.extra) for v in verdicts),
        "pieces it cannot name": sum(len(v.reading.unknown) for v in verdicts),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a scenes run folder past its tokens stage")
    parser.add_argument("--weights", type=Path, help="a state dict or checkpoint (default RUN/target.best)")
    parser.add_argument("--recipe", default="scenes")
    parser.add_argument("--scenes", type=int, default=48, help="held-out scenes for the naming measurement")
    parser.add_argument("--prompts", type=int, default=24, help="evaluation prompts sampled (0: none)")
    parser.add_argument("--inside-temperature", default="1,0.5,0", help="comma-separated, one AR pass each")
    args = parser.parse_args()
    pipe, model, tokens, cond = held_out_scenes(args.run, args.recipe, None, args.scenes, args.weights)
    print("naming at the first token:", naming_at_first_token(pipe, model, tokens, cond), flush=True)
    for t in [float(x) for x in args.inside_temperature.split(",") if x] if args.prompts else []:
        print(judged_samples(pipe, model, args.prompts, t), flush=True)


if __name__ == "__main__":
    main()
