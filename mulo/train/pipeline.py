"""The training pipeline of every recipe: ``python -m mulo train RECIPE [--smoke] [--device cuda]``.

One recipe per family (``recipes.RECIPES``; docs/training.md). ``Pipeline`` runs the stages in
order, each resumable and skipped once its output exists in the run folder; each stage lives in
its own module of ``mulo/train/stages/``:
  data       npm package(s) -> images (at the three sizes) + texts (train / val split)   here
             (scenes: a few thousand composed scenes + the held-out-combination scenes)
  clip       mini-CLIP (text transformer + image CNN on 64 px), contrastive          stages/clip.py
  vq         diffusers VQModel (scenes: pixel squares), 4x downsampling, one codebook  stages/vq.py
             for the three sizes; with several candidate codebook sizes, each is trained
             and the oracle MuLo-SD picks one
  tokens     every image encoded at the three sizes; text conditions precomputed      stages/tokens.py
             (scenes: also the fresh training scenes, in chunks)               stages/scene_tokens.py
  target, drafter_r2, drafter_r4, draft_model   AR models on the target grid, /2, /4,  stages/ar.py
             target grid (small)
  upsampler_r2, upsampler_r4   learned token up-samplers                              stages/upsampler.py
  eagle      EAGLE-2's feature-level draft head, on the frozen target's features      stages/eagle.py
  export     fp16 safetensors + JSON configs into the assets folder                   stages/export.py
  card       evaluation (mulo/eval/family_eval.py), metrics.json and MODEL_CARD.md   stages/card.py
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch
from diffusers import VQModel

from mulo.engine import Engine
from mulo.models.text import MiniCLIP
from mulo.models.vq import VQTokenizer, build_model, codes_in, make_tokenizer
from mulo.scenes import parse_prompt
from mulo.train import data as data_mod
from mulo.train import styles
from mulo.train.loop import CLIP_NORM, WARMUP, WEIGHT_DECAY, hardware
from mulo.train.recipes import (
    CFG_DROPOUT,
    COND_LEN,
    NAME_TEXT_PROB,
    RECIPES,
    STAGES,
    Budget,
    Recipe,
    vq_config,
)
from mulo.train.stages import scene_tokens
from mulo.train.stages import vq as vq_stage
from mulo.train.stages.ar import stage_ar
from mulo.train.stages.clip import stage_clip
from mulo.train.stages.eagle import train_eagle_head
from mulo.train.stages.export import adopt_assets, export
from mulo.train.stages.tokens import stage_tokens
from mulo.train.stages.upsampler import stage_upsampler

log = logging.getLogger(__name__)


class Pipeline:
    """One family's run: its folder, recipe, budget and report, the data and models the stages
    share, and the stages in order (each in its own module), every one skipped once done."""

    def __init__(self, run_dir, assets, recipe: Recipe, budget: Budget, device="cpu", seed=0, cache=None, vq_from=None):
        self.run, self.assets, self.recipe, self.budget = Path(run_dir), Path(assets), recipe, budget
        self.vq_from = Path(vq_from) if vq_from else None  # a VQ trained elsewhere (``stages.vq.adopt_vq``)
        self.device = device
        default_cache = "styles" if recipe.styles or recipe.scenes else "twemoji"
        self.cache = Path(cache) if cache else Path.home() / ".cache" / "mulo" / default_cache
        self.run.mkdir(parents=True, exist_ok=True)
        self.seed = seed
        self.report_path = self.run / "report.json"
        self.report = json.loads(self.report_path.read_text()) if self.report_path.exists() else {}
        self._data = None
        self._stream = None

    # -- bookkeeping ---------------------------------------------------------------------------
    def record(self, stage: str, **values) -> None:
        self.report[stage] = {**self.report.get(stage, {}), **values, "hardware": hardware(self.device)}
        self.report_path.write_text(json.dumps(self.report, indent=1))

    def rng(self, stage: str) -> np.random.Generator:
        return np.random.default_rng([self.seed, sum(map(ord, stage))])

    @property
    def codes(self) -> int:
        """The codebook size of the run's VQ (the study's pick when there were candidates)."""
        return int(self.report["vq"]["codes"]) if "codes" in self.report.get("vq", {}) else self.recipe.vq_codes[0]

    @property
    def scene_stream(self):
        """The scenes family's stream (``mulo.train.scenes.SceneStream``), its sprites from the cache."""
        if self._stream is None:
            from mulo.train import scenes

            config = self.recipe.scenes
            sheet = scenes.sprites(self.cache, config.object_px, config.canvas)
            self._stream = scenes.SceneStream(config, sheet, seed=self.seed)
        return self._stream

    @property
    def data(self) -> data_mod.EmojiData:
        if self._data is None:
            if self.recipe.scenes:  # what the clip and VQ stages train on; the AR stages draw fresh scenes
                self._data = self.scene_stream.data(self.budget.images, self.budget.held_out_scenes)
                return self._data
            if self.recipe.styles:  # limited to a smoke budget's images before anything is rendered
                self._data = styles.load(self.cache, self.recipe.sizes, self.recipe.styles, self.budget.images)
                return self._data
            full = data_mod.load_scales(self.cache, self.recipe.sizes) if self.recipe.svg else data_mod.load(self.cache)
            if self.budget.images:
                keep = np.zeros(len(full.names), dtype=bool)
                keep[: self.budget.images] = True
                keep[np.flatnonzero(full.is_val)[:8]] = True
                full = full.subset(keep)
            self._data = full
        return self._data

    def text_of(self, i: int, kind: str) -> str:
        """Image ``i``'s text of one kind: its name, its name with its style word, its description."""
        d = self.data
        if kind == "name_style" and d.styles:
            return f"{d.names[i]} {d.styles[i]}"
        return d.texts[i] if kind == "description" else d.names[i]

    def images_at(self, px: int, index=slice(None)) -> torch.Tensor:
        """``[N, 3, px, px]`` floats in [0, 1]: the renders at that size, else area-resized."""
        d = self.data
        if px in d.scales:
            return data_mod.to_float(d.scales[px][index])
        return data_mod.resize(data_mod.to_float(d.images[index]), px)

    # -- stages --------------------------------------------------------------------------------
    def stage_data(self) -> None:
        d = self.data
        counts = {}
        if d.styles:
            split = d.split
            counts = dict(
                per_style={w: d.styles.count(w) for w in self.recipe.styles},
                held_out_pairs=int((split == styles.HELD_PAIR).sum()),
                held_out_emoji_images=int((split == styles.HELD_EMOJI).sum()),
                augment_copies=self.budget.augment_copies,
            )
        if self.recipe.scenes:
            stream = self.scene_stream
            counts = dict(
                held_out_combinations=len(stream.held_out_combinations),
                objects_per_scene=dict(sorted(Counter(str(len(parse_prompt(n).objects)) for n in d.names).items())),
                fresh_training_scenes=scene_tokens.planned(self.budget),
            )
        self.record("data", images=len(d.names), val=int(d.is_val.sum()), **counts)

    def load_clip(self) -> MiniCLIP:
        vocab = json.loads((self.run / "clip_vocab.json").read_text())
        clip = MiniCLIP(vocab, max_len=COND_LEN)
        clip.load_state_dict(torch.load(self.run / "clip.pt", map_location="cpu", weights_only=True))
        return clip.to(self.device).eval()

    def vq_config(self, codes: int) -> dict:
        """The config of this recipe's VQ with ``codes`` codes (``mulo.models.vq.build_model``)."""
        return vq_config(codes, self.recipe.patch, **self.recipe.vq_model)

    def load_vq(self, name: str = "vq.pt") -> VQModel:
        """The VQ weights ``name`` in the run folder (a study candidate's too: its codebook size is
        read off the weights)."""
        state = torch.load(self.run / name, map_location="cpu", weights_only=True)
        vq = build_model(self.vq_config(codes_in(state)))
        vq.load_state_dict(state)
        return vq.to(self.device).eval()

    def tokenizer(self, name: str = "vq.pt", vq: VQModel | None = None) -> VQTokenizer:
        """``vq`` (default: ``load_vq(name)``) as the family reads images with it (tiled when the
        recipe's VQ is)."""
        return make_tokenizer(vq if vq is not None else self.load_vq(name), self.recipe.hyper.vq_tile)

    # -- driver ----------------------------------------------------------------------------------
    def stages(self) -> dict:
        return {
            "data": (self.stage_data, "report.json"),
            "clip": (lambda: stage_clip(self), "clip.pt"),
            "vq": (lambda: vq_stage.stage_vq(self), "vq.pt"),
            "tokens": (lambda: stage_tokens(self), "tokens.npz"),
            "target": (lambda: stage_ar(self, "target"), "target.pt"),
            "drafter_r2": (lambda: stage_ar(self, "drafter_r2"), "drafter_r2.pt"),
            "drafter_r4": (lambda: stage_ar(self, "drafter_r4"), "drafter_r4.pt"),
            "draft_model": (lambda: stage_ar(self, "draft_model"), "draft_model.pt"),
            "upsampler_r2": (lambda: stage_upsampler(self, 2), "upsampler_r2.pt"),
            "upsampler_r4": (lambda: stage_upsampler(self, 4), "upsampler_r4.pt"),
            "eagle": (lambda: train_eagle_head(self), "eagle.pt"),
            "export": (lambda: export(self), None),
            "card": (self.card, None),
        }

    def run_all(self, only: list[str] | None = None) -> dict:
        assert tuple(self.stages()) == STAGES
        for name, (fn, output) in self.stages().items():
            if only and name not in only:
                continue
            if output and (self.run / output).exists() and name in self.report:
                log.info("stage %s: done already", name)
                continue
            log.info("stage %s", name)
            self.report.pop(name, None)  # an adopted or earlier entry: the stage records its own
            start = time.perf_counter()
            fn()
            self.record(name, stage_seconds=round(time.perf_counter() - start, 1))
        return self.report

    def defaults(self) -> dict:
        """The recipe's knob values, and the up-sampler that reproduces more of the target's codes
        from a perfect r = 2 draft on the validation split: learned (its token accuracy) or pixel
        (the VQ stage's agreement), when the recipe leaves it open."""
        defaults = dict(self.recipe.defaults)
        if "upsampler" not in defaults:
            learned = self.report["upsampler_r2"]["val_token_accuracy"]
            defaults["upsampler"] = "learned" if learned > self.report["vq"]["val_draft_agreement_r2"] else "pixel"
        return defaults

    def card(self) -> None:
        from mulo.eval import family_eval
        from mulo.families import emoji as family_mod

        # a smoke run's throwaway weights are not worth compiling for (each package ~20 s, more than the
        # whole smoke evaluation); a real family's 120-prompt evaluation is
        compile = "off" if self.budget == self.recipe.smoke else "auto"
        engine = Engine(family_mod.build(self.recipe.family, self.assets).to(self.device), compile=compile)
        if self.recipe.scenes:
            metrics = self.evaluate_scenes(engine)
        else:
            metrics = family_eval.evaluate(engine, self.data, self.load_clip(), self.assets, self.budget.eval_prompts)
        (self.assets / "metrics.json").write_text(json.dumps(metrics, indent=1))
        self.write_card(metrics)

    def evaluate_scenes(self, engine: Engine) -> dict:
        """The card's evaluation of a scenes family: its fixed evaluation scenes (``evaluation_scenes``)
        judged by the referee the export shipped, FD against their renders."""
        from mulo.eval import family_eval
        from mulo.eval.referee import Sprites

        sprites = Sprites.load(self.assets / "referee_sprites.npz")
        quality, real, held_out = self.scene_evaluation(self.budget.eval_prompts, sprites)
        return family_eval.evaluate_scenes(engine, quality, real, self.assets, held_out=held_out)

    def scene_evaluation(self, count: int, sprites) -> tuple:
        """The first ``count`` fixed evaluation scenes of a scenes run as (``SceneQuality`` judging
        with ``sprites``, their renders ``[N, px, px, 3]``, the prompts of held-out combinations)."""
        from mulo.eval.scene_quality import SceneQuality
        from mulo.train import scenes

        shown = scenes.evaluation_scenes(self.recipe.scenes, self.scene_stream.sheet, self.budget.eval_prompts)[:count]
        real = np.stack([self.scene_stream.render(s)[self.recipe.px] for s in shown])
        prompts = [(s.prompt, s.prompt) for s in shown]
        quality = SceneQuality.from_images(self.load_clip(), sprites, prompts, real)
        return quality, real, [s.prompt for s in shown if s.split == scenes.HELD_OUT]

    def write_card(self, metrics: dict) -> None:
        """MODEL_CARD.md from the report and ``metrics`` (rewritable without re-evaluating)."""
        from mulo.train.stages import card, card_text

        sizes = {p.name: round(p.stat().st_size / 2**20, 2) for p in sorted(self.assets.glob("*.safetensors"))}
        sizes["total"] = round(sum(sizes.values()), 2)
        recipe = dict(
            vq=self.vq_config(self.codes),
            target=self.recipe.target,
            draft_model=self.recipe.draft_model,
            cfg_dropout=CFG_DROPOUT,
            name_text_prob=NAME_TEXT_PROB,
            hyper=asdict(self.recipe.hyper),
            optimizer=dict(weight_decay=WEIGHT_DECAY, warmup=WARMUP, clip_norm=CLIP_NORM),
        )
        geometry = dict(
            family=self.recipe.family,
            px=self.recipe.px,
            patch=self.recipe.patch,
            svg=self.recipe.svg,
            styles=self.recipe.styles,
            scenes=asdict(self.recipe.scenes) if self.recipe.scenes else None,
            int8_models=self.recipe.int8_models,
            history=card_text.history(self.recipe.family),
            study_rule=card_text.study_rule(self.recipe.px),
        )
        card.write_model_card(self.assets, self.report, metrics, asdict(self.budget), sizes, recipe, geometry)


def check_vq(recipe: Recipe, path) -> None:
    """A ValueError unless ``path`` holds a VQ of ``recipe``'s kind and architecture (``train --vq``)."""
    vq_stage.load_foreign_vq(recipe, path)


def run(
    family="twemoji", run_dir=None, assets=None, smoke=False, device="cpu", only=None, cache=None, adopt=None, vq=None
) -> dict:
    unknown = [stage for stage in only or () if stage not in STAGES]
    if unknown:
        raise ValueError(f"unknown stage {', '.join(unknown)}: the stages are {', '.join(STAGES)}")
    recipe = RECIPES[family]
    run_dir = run_dir or Path("runs") / family
    assets = assets or Path("assets") / family
    budget = replace(recipe.smoke if smoke else recipe.budget)
    pipeline = Pipeline(Path(run_dir), Path(assets), recipe, budget, device, cache=cache, vq_from=vq)
    if adopt is not None:
        adopt_assets(pipeline, Path(adopt))
    return pipeline.run_all(only)
