"""How long the emoji scenes family's full training takes on this CPU (issue 63's 6 CPU-hours),
from a few steps of every training stage at the full budget's batch sizes and model sizes.

    PYTHONPATH=. python tools/experiments/scenes_timing.py --out benchmarks/scenes-timing.json

Each stage runs ``--steps`` steps through the real pipeline (its own data, loss and checkpoint
code) in a scratch run folder; its seconds per step times the full budget's steps is its share.
On a CPU shared with other jobs every time is inflated alike: the script also times a reference
step, twemoji's 32x32 target (width 256, 4 layers, batch 32), before and after, and scales every
time by ``--reference-seconds`` (2.7 s: that step on an idle 2-core Xeon in fp32, ``loop.py``)
over the measured one. The card's evaluation and the VQ study's oracle tables are not timed here
(their untrained models cost what trained ones do: the smoke run's card measures them).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F

from mulo.models.gpt import GPT
from mulo.train import pipeline, recipes
from mulo.train.stages.scene_tokens import planned

TRAINING_STAGES = ("clip", "vq", "target", "drafter_r2", "drafter_r4", "draft_model", "upsampler_r2", "upsampler_r4")
STEPS = {
    "clip": "clip_steps",
    "vq": "vq_steps",
    "target": "ar_steps",
    "drafter_r2": "drafter_steps",
    "drafter_r4": "drafter_steps",
    "draft_model": "draft_model_steps",
    "upsampler_r2": "upsampler_steps",
    "upsampler_r4": "upsampler_steps",
    "eagle": "eagle_steps",
}


def reference_step(steps: int = 3) -> float:
    """Seconds of one training step of twemoji's target (the loop's documented reference)."""
    recipe = recipes.RECIPES["twemoji"]
    model = GPT(recipe.gpt_config("target", 32, 128))
    opt = torch.optim.AdamW(model.parameters())
    x, cond = torch.randint(0, 32, (32, 1024)), torch.randn(32, 17, 128)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        loss = F.cross_entropy(model(x[:, :-1], cond).reshape(-1, 32), x.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="scenes")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--reference-seconds", type=float, default=2.7)
    parser.add_argument("--cache", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    recipe = recipes.RECIPES[args.recipe]
    full = recipe.budget
    n = args.steps
    budget = replace(
        full,
        images=160,  # the clip's batch of 128 training scenes
        held_out_scenes=16,
        oracle_images=2,
        checkpoint_every=n,
        validate_every=0,
        **{field: n for field in set(STEPS.values())},
    )
    before = reference_step()
    with tempfile.TemporaryDirectory() as scratch:
        run = Path(scratch)
        pipe = pipeline.Pipeline(run / "run", run / "assets", replace(recipe, vq_codes=recipe.vq_codes[:1]), budget,
                                 cache=args.cache)  # fmt: skip
        report = pipe.run_all([s for s in recipes.STAGES if s not in ("export", "card")])
    after = reference_step()
    measured = (before + after) / 2
    scale = args.reference_seconds / measured
    per_step = {stage: report[stage]["seconds"] / n for stage in (*TRAINING_STAGES, "eagle")}
    # the tokens stage encodes the data stage's scenes and the fresh ones
    tokens_per_scene = report["tokens"]["stage_seconds"] / (planned(budget) + budget.images + budget.held_out_scenes)
    full_seconds = {stage: per_step[stage] * getattr(full, STEPS[stage]) for stage in per_step}
    full_seconds["vq"] *= len(recipe.vq_codes)  # one VQ per candidate codebook
    full_seconds["tokens"] = tokens_per_scene * (planned(full) + full.images + full.held_out_scenes)
    result = {
        "recipe": args.recipe,
        "steps_timed": n,
        "reference_step_s": {"before": round(before, 2), "after": round(after, 2), "unloaded": args.reference_seconds},
        "scale": round(scale, 4),
        "measured_s_per_step": {k: round(v, 3) for k, v in per_step.items()},
        "tokens_s_per_scene": round(tokens_per_scene, 4),
        "fresh_scenes": planned(full),
        "full_budget_measured_hours": round(sum(full_seconds.values()) / 3600, 2),
        "full_budget_unloaded_hours": round(sum(full_seconds.values()) * scale / 3600, 2),
        "unloaded_seconds_by_stage": {k: round(v * scale) for k, v in full_seconds.items()},
    }
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
