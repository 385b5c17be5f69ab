"""What a twemoji run writes to, and may start from, an assets folder: ``export`` (the ``export``
stage) and ``adopt_assets`` (``python -m mulo train ... --adopt FOLDER``)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from mulo.families import int8
from mulo.families.emoji import FILES, load_weights
from mulo.train import data as data_mod
from mulo.train.recipes import COND_LEN

AR_MODELS = ("target", "drafter_r2", "drafter_r4", "draft_model")  # each with its GPTConfig in name.json


def export(pipe) -> None:
    """fp16 (or int8: the recipe's ``int8_models``) safetensors + JSON configs of every stage's
    model, the report, the recommended knob values and the short-name aliases, into the
    pipeline's assets folder."""
    pipe.assets.mkdir(parents=True, exist_ok=True)

    def save(name: str, state: dict, config: dict) -> None:
        # int8 from the float32 weights: re-exporting adopted (dequantised) weights gives the same bytes
        packed = int8.quantize(state) if name in pipe.recipe.int8_models else state
        half = {k: (v.half() if v.is_floating_point() else v).contiguous() for k, v in packed.items()}
        save_file(half, pipe.assets / f"{name}.safetensors")
        (pipe.assets / f"{name}.json").write_text(json.dumps(config, indent=1))

    load = lambda name: torch.load(pipe.run / f"{name}.pt", map_location="cpu", weights_only=True)  # noqa: E731
    clip_vocab = json.loads((pipe.run / "clip_vocab.json").read_text())
    save("clip", load("clip"), {"vocab": clip_vocab, "max_len": COND_LEN})
    # (JSON writes its tuples as lists); a tiled VQ's ``tile`` beside its VQModel arguments
    tile = {"tile": pipe.recipe.hyper.vq_tile} if pipe.recipe.hyper.vq_tile else {}
    save("vq", load("vq"), {**pipe.vq_config(pipe.codes), **tile})
    for stage in AR_MODELS:
        save(stage, load(stage), json.loads((pipe.run / f"{stage}.json").read_text()))
    save("eagle_head", load("eagle"), {"of": "target", "n_layer": 1})
    hyper = pipe.recipe.hyper  # the up-samplers' size, as the stage built them
    for r in (2, 4):
        save(
            f"upsampler_r{r}",
            load(f"upsampler_r{r}"),
            {
                "vocab_size": pipe.codes,
                "r": r,
                "width": hyper.upsampler_width,
                "depth": hyper.upsampler_depth,
                "context": hyper.upsampler_context,
            },
        )
    (pipe.assets / "training_report.json").write_text(json.dumps(pipe.report, indent=1))
    (pipe.assets / "defaults.json").write_text(json.dumps(pipe.defaults(), indent=1))
    (pipe.assets / "aliases.json").write_text(json.dumps(data_mod.aliases(pipe.data), indent=0))
    if pipe.recipe.styles:  # the prompt words that ask for a style, and what each one is
        from mulo.train import styles

        listed = [{"word": s.word, "title": s.title, "licence": s.licence} for s in styles.chosen(pipe.recipe.styles)]
        (pipe.assets / "styles.json").write_text(json.dumps(listed, indent=1))
    if pipe.recipe.scenes:  # the family's language (its prompt check) and its referee's sprites
        export_scenes(pipe)


def export_scenes(pipe) -> None:
    """``scenes.json`` (the vocabulary, palette, object count and styles the family draws, which
    its loader checks prompts against) and ``referee_sprites.npz`` (``mulo.eval.referee``)."""
    from mulo.train import scenes

    config = pipe.recipe.scenes
    language = scene_language(config, pipe.recipe.scene_condition)
    (pipe.assets / "scenes.json").write_text(json.dumps(language, indent=1))
    scenes.write_sprite_file(pipe.assets / "referee_sprites.npz", pipe.cache, config)


def scene_language(config, condition: str = "clip") -> dict:
    """What a scenes family's loader reads prompts with (``scenes.json``): the vocabulary, palette,
    object count and styles of ``config`` (a ``SceneConfig``), its geometry, and how its models
    read a prompt (``condition``: the recipe's ``scene_condition``)."""
    from mulo.scenes import PALETTE

    return {
        "names": list(config.names),
        "palette": {colour: PALETTE[colour] for colour in config.backgrounds},
        "max_objects": config.max_objects,
        "styles": list(config.styles),
        "object_px": config.object_px,
        "canvas": config.canvas,
        "placement": config.placement,
        "condition": condition,
    }


def adopt_assets(pipe, folder: Path) -> None:
    """Seed the run folder from an exported family: its weights (fp16, as float32) and its
    training report, so a stage added later (the EAGLE head) trains on exactly the shipped
    models and the next export rewrites them unchanged. What the run has already is kept."""
    for name in FILES:  # each file is its stage's output (name.pt)
        if (pipe.run / f"{name}.pt").exists():
            continue
        config, state = load_weights(folder, name)
        torch.save(state, pipe.run / f"{name}.pt")
        if name == "clip":
            (pipe.run / "clip_vocab.json").write_text(json.dumps(config["vocab"]))
        elif name in AR_MODELS:
            (pipe.run / f"{name}.json").write_text(json.dumps(config))
    adopted = json.loads((folder / "training_report.json").read_text())
    # The family's own assets give back its own report (a new machine rebuilding the run folder):
    # nothing to stamp. Another family's keep where they came from, an entry's own origin first.
    own = folder.resolve() == Path(pipe.assets).resolve()
    for stage, entry in adopted.items():
        pipe.report.setdefault(stage, entry if own else {"adopted_from": str(folder), **entry})
    pipe.report_path.write_text(json.dumps(pipe.report, indent=1))
