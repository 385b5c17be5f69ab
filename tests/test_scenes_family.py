"""The emoji scenes family in the training pipeline (issue 63): fresh training scenes by index,
never a held-out combination; the fixed evaluation prompts; the referee as the family's judge
(the quality hook the bench, the card and the app use); bad prompts as clear errors through the
engine; and (slow) a smoke run of every stage whose family runs every method."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from diffusers import VQModel

from mulo import scenes as lang
from mulo.eval.referee import Sprites
from mulo.models.vq import PatchTokenizer, build_model
from mulo.train import recipes
from mulo.train import scenes as train_scenes

SPRITES = Path(__file__).parent / "data" / "scenes" / "sprites-32.npz"


@pytest.fixture
def cache(tmp_path):
    """A data cache holding the vocabulary's sprites (what the pipeline renders scenes with)."""
    folder = tmp_path / "cache"
    folder.mkdir()
    shutil.copy(SPRITES, folder / "scene-sprites-32-128.npz")
    return folder


def language() -> dict:
    config = recipes.RECIPES["scenes"].scenes
    return {
        "names": list(config.names),
        "palette": lang.PALETTE,
        "max_objects": config.max_objects,
        "styles": list(config.styles),
    }


def test_fresh_training_scenes_never_repeat_and_never_hold_out(tmp_path, cache):
    from mulo.train import pipeline
    from mulo.train.stages.scene_tokens import SceneTokens, planned

    recipe = recipes.RECIPES["scenes"]
    pipe = pipeline.Pipeline(tmp_path / "run", tmp_path / "assets", recipe, recipe.smoke, cache=cache)
    torch.manual_seed(0)
    vq = build_model(pipe.vq_config(32))  # any codebook of the recipe's kind encodes: random squares
    vq.squares = torch.rand(32, 48, generator=torch.Generator().manual_seed(0))
    torch.save(vq.state_dict(), pipe.run / "vq.pt")
    store = SceneTokens(pipe)
    pool = planned(pipe.budget)  # what the budget's stages read, encoded as their batches reach it
    assert pool == 12 and pipe.budget.scene_chunk == 8
    store.ensure(pool)
    assert sorted(p.name for p in (pipe.run / "scenes").iterdir()) == ["chunk-8-00000.npz", "chunk-8-00001.npz"]
    first, second = store.rows(0, pool), store.rows(pool, pool)  # a second pass reads further: encoded on demand
    assert len(list((pipe.run / "scenes").iterdir())) == 3
    prompts = [*first["name"].tolist(), *second["name"].tolist()]
    stream = pipe.scene_stream
    assert prompts == [stream.scene(i).prompt for i in range(2 * pool)]  # scene i of the training split
    assert first["name"].tolist() != second["name"].tolist()  # no two passes alike
    assert not np.array_equal(first["tokens128"], second["tokens128"])
    assert first["tokens128"].shape == (pool, 32, 32) and first["tokens32"].shape == (pool, 8, 8)
    # a batch that spans two chunks reads the same scenes as the chunks themselves
    assert np.array_equal(store.rows(5, 6)["tokens64"], first["tokens64"][5:11])
    for prompt in prompts:  # never a held-out combination in training
        parsed = lang.parse_prompt(prompt)
        assert not lang.held_out_pairs(parsed.objects, parsed.background)
    # the clip and VQ stages' scenes: training and held-out combinations apart
    d = pipe.data
    assert int(d.is_val.sum()) == pipe.budget.held_out_scenes and len(d.names) == 24 + 8
    for prompt, held in zip(d.names, d.is_val, strict=True):
        parsed = lang.parse_prompt(prompt)
        assert bool(lang.held_out_pairs(parsed.objects, parsed.background)) == bool(held)


def test_the_evaluation_prompts_are_fixed_and_cover_what_the_issue_asks():
    config, sheet = train_scenes.SceneConfig(), Sprites.load(SPRITES)
    shown = train_scenes.evaluation_scenes(config, sheet, 120)
    prompts = [s.prompt for s in shown]
    assert len(set(prompts)) == 120
    assert prompts == [s.prompt for s in train_scenes.evaluation_scenes(config, sheet, 120)]  # seed-fixed
    objects = [len(lang.parse_prompt(p).objects) for p in prompts]
    assert sum(n >= 2 for n in objects) >= 40 and set(objects) == {1, 2, 3}
    held = [s for s in shown if lang.held_out_pairs([o.name for o in s.objects], s.background)]
    assert len(held) >= 20 and all(s.split == train_scenes.HELD_OUT for s in held)


def test_the_referee_judges_through_the_family_s_quality_hook(tmp_path):
    """The family declares its referee (``Evaluation.referee``); ``Quality.for_family`` gives the
    scorer the bench, card and app use: prompt match by the referee, its verdict per image."""
    from types import SimpleNamespace

    from mulo.eval.quality import Quality
    from mulo.eval.scene_quality import SceneQuality
    from mulo.families.base import Evaluation
    from mulo.models.text import MiniCLIP, WordTokenizer
    from mulo.ui import text
    from mulo.ui.scoring import ColumnScore

    sheet = Sprites.load(SPRITES)
    stream = train_scenes.SceneStream(train_scenes.SceneConfig(), sheet)
    shown = [stream.scene(i) for i in range(6)]
    real = np.stack([stream.render(s)[128] for s in shown])
    clip = MiniCLIP(WordTokenizer.build(train_scenes.language_words(stream.config), 16).vocab, max_len=16).eval()
    prompts = [(s.prompt, s.prompt) for s in shown]
    SceneQuality.from_images(clip, sheet, prompts, real).save(tmp_path)
    shutil.copy(SPRITES, tmp_path / "referee_sprites.npz")
    family = SimpleNamespace(evaluation=Evaluation(tmp_path, clip, tmp_path / "referee_sprites.npz"))
    quality = Quality.for_family(family)
    assert isinstance(quality, SceneQuality) and quality.keys == [s.prompt for s in shown]
    assert quality.real_adherence() == 1.0  # the referee names every real scene
    assert quality.score(real, quality.keys)["adherence"] == 1.0
    blank = np.empty_like(real)
    blank[:] = lang.PALETTE[shown[0].background]
    scores = quality.score(blank, quality.keys)
    assert scores["adherence"] == 0.0 and scores["fd"] > 0
    # the parts of a match: every emoji and background on the real scenes; none found on a blank
    # canvas of the first scene's colour, whose background is right for the scenes asking for it
    assert quality.parts(real, quality.keys) == {"objects_found": 1.0, "background_right": 1.0}
    asked_colour = np.mean([s.background == shown[0].background for s in shown])
    assert quality.parts(blank, quality.keys) == {"objects_found": 0.0, "background_right": round(asked_colour, 4)}
    names = [o.name for o in shown[0].objects]
    absent = next(n for n in lang.NAMES if n not in names)
    verdict = quality.judge(real[0], lang.format_prompt([*names[:1], absent], shown[0].background))
    assert not verdict.match and verdict.missing == [absent]
    # the app's quality line says what was found and what is missing
    line = text.quality_line(ColumnScore(verdict=verdict.sentence(), match=verdict.match), 1.0, True)
    assert "does **not** match" in line and f"missing {absent}" in line and f"found {names[0]}" in line
    assert "100% match" in line
    ok = quality.judge(real[0], shown[0].prompt)
    assert "**matches**" in text.quality_line(ColumnScore(verdict=ok.sentence(), match=ok.match), None, True)
    # the other families keep their mini-CLIP retrieval: no verdict
    assert Quality.judge(None, real[0], "red apple") is None


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ("red aple on blue", "unknown emoji 'red aple'; nearest known: red apple"),
        ("cat, dog, pig and fox on red", "names 4 emoji; this family draws at most 3"),
        ("cat on teal", "unknown background colour 'teal'"),
    ],
)
def test_bad_prompts_are_clear_errors_through_the_engine(prompt, message):
    from mulo.config import ConfigError
    from mulo.engine import Engine
    from mulo.families import toy
    from mulo.families.emoji import ScenePromptConditioner
    from mulo.models.text import MiniCLIP, WordTokenizer

    family = toy.build()
    words = train_scenes.language_words(recipes.RECIPES["scenes"].scenes)
    family.conditioner = ScenePromptConditioner(MiniCLIP(WordTokenizer.build(words, 16).vocab, max_len=16), language())
    engine = Engine(family)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        engine.check(prompt, "ar", 0, None)
    # a good prompt, however typed, is conditioned as the grammar writes it
    assert family.conditioner.canonical("A Red Apple & the rocket on BLUE noto") == (
        "red apple and rocket on blue in noto style"
    )
    assert engine.check("cat and pizza on green", "ar", 0, None)[2] == []  # no word left unknown


def test_symbol_conditions_are_exact_one_hot_slots_at_the_clip_features_scale():
    from mulo.families.emoji import ScenePromptConditioner, SceneSymbolConditioner, scene_conditioner, scene_symbols
    from mulo.models.text import MiniCLIP, WordTokenizer

    table = language()
    names, colours = len(table["names"]), len(table["palette"])
    texts = ["cat and rocket on blue in noto style", "cat and rocket", "rocket noto, cat twemoji on blue"]
    features = scene_symbols(texts, table, 17, 128)
    assert features.shape == (3, 17, 128) and not features[:, 1 + table["max_objects"] :].any()
    cat, rocket, blue = (
        table["names"].index("cat"),
        table["names"].index("rocket"),
        names + list(table["palette"]).index("blue"),
    )
    noto = names + colours + table["styles"].index("noto")
    assert torch.nonzero(features[0]).tolist() == [[0, blue], [1, cat], [1, noto], [2, rocket], [2, noto]]
    assert not features[1, 0].any()  # no background named: the slot is left open, as the null condition's
    assert torch.allclose(features[0, :3].norm(dim=-1), torch.full((3,), 128**0.5))  # the mini-CLIP slots' norm
    assert torch.nonzero(features[2, 2]).flatten().tolist() == [cat, names + colours]  # its own style: twemoji
    with pytest.raises(ValueError, match="do not fit conditions 64 wide"):
        scene_symbols(texts, table, 17, 64)
    with pytest.raises(ValueError, match="do not fit 3 condition slots"):
        scene_symbols(texts, table, 3, 128)
    # the family's conditioner follows scenes.json: symbols, else the mini-CLIP's features
    words = train_scenes.language_words(recipes.RECIPES["scenes"].scenes)
    clip = MiniCLIP(WordTokenizer.build(words, 16).vocab, max_len=16).eval()
    symbols = scene_conditioner(clip, {**table, "condition": "symbols"}, 17)
    assert isinstance(symbols, SceneSymbolConditioner)
    assert type(scene_conditioner(clip, table, 17)) is ScenePromptConditioner
    assert torch.equal(symbols("A cat & the rocket on BLUE noto"), features[0])  # read by the grammar first
    with pytest.raises(lang.PromptError, match="unknown emoji 'red aple'"):
        symbols("red aple on blue")
    # placed: the k-th of n objects at its count's place (slot 1 + n(n - 1)/2 + k), the rest the same
    placed_table = {**table, "condition": "placed"}
    placed = scene_symbols(texts[:1] + ["rocket on red", "cat, rocket and dog"], placed_table, 17, 128)
    assert torch.nonzero(placed[0]).tolist() == [[0, blue], [2, cat], [2, noto], [3, rocket], [3, noto]]
    assert torch.nonzero(placed[1, 1:]).tolist() == [[0, rocket]]  # one object: slot 1
    dog = table["names"].index("dog")
    assert torch.nonzero(placed[2]).tolist() == [[4, cat], [5, rocket], [6, dog]]
    assert isinstance(scene_conditioner(clip, placed_table, 17), SceneSymbolConditioner)
    with pytest.raises(ValueError, match="do not fit 6 condition slots"):
        scene_symbols(texts, placed_table, 6, 128)


def test_training_conditions_follow_the_recipe(tmp_path, cache):
    from dataclasses import replace

    from mulo.families.emoji import SceneColumnConditioner, column_symbols, scene_conditioner, scene_symbols
    from mulo.models.text import MiniCLIP, WordTokenizer
    from mulo.train import pipeline
    from mulo.train.stages.ar import scene_conditions, stored_scene_prompts
    from mulo.train.stages.export import scene_language

    words = train_scenes.language_words(recipes.RECIPES["scenes"].scenes)
    clip = MiniCLIP(WordTokenizer.build(words, 16).vocab, max_len=16).eval()
    texts = ["cat and rocket on blue in noto style", "rocket noto, cat twemoji on blue"]
    wanted = {
        "clip": clip.condition_features(clip.tokenizer.batch(texts)),
        "symbols": scene_symbols(texts, scene_language(recipes.RECIPES["scenes"].scenes, "symbols"), 17, 128),
        "placed": scene_symbols(texts, scene_language(recipes.RECIPES["scenes"].scenes, "placed"), 17, 128),
    }
    # clip_placed: the features, then the placed symbols over exactly the 64 names, 8 colours, 5 styles
    placed_symbols = column_symbols(texts, scene_language(recipes.RECIPES["scenes"].scenes, "clip_placed"), 17)
    assert placed_symbols.shape == (2, 17, 77)
    assert torch.equal(
        placed_symbols[1].nonzero(),
        scene_symbols(texts, scene_language(recipes.RECIPES["scenes"].scenes, "placed"), 17, 128)[1].nonzero(),
    )
    wanted["clip_placed"] = torch.cat([wanted["clip"], placed_symbols], dim=-1)
    for condition, features in wanted.items():
        recipe = replace(recipes.RECIPES["scenes"], scene_condition=condition)
        pipe = pipeline.Pipeline(tmp_path / condition, tmp_path / "assets", recipe, recipe.smoke, cache=cache)
        assert torch.equal(scene_conditions(pipe, clip, texts), features)
        assert scene_language(recipe.scenes, condition)["condition"] == condition  # what the export writes
    # the stored rows (held-out scenes) by their own prompts: objects in column order, not the key's sorted one
    pipe = pipeline.Pipeline(tmp_path / "stored", tmp_path / "assets", recipe, recipe.smoke, cache=cache)
    data = pipe.data
    assert stored_scene_prompts(pipe, data.keys) == list(data.names)
    objects = [list(lang.parse_prompt(name).objects) for name in data.names]
    assert any(names != sorted(names) for names in objects)  # so the order matters to placed symbols
    with pytest.raises(RuntimeError, match="other scenes"):
        stored_scene_prompts(pipe, data.keys[::-1])
    with pytest.raises(ValueError, match="scene_condition must be one of 'clip', 'symbols', 'placed'"):
        replace(recipes.RECIPES["scenes"], scene_condition="words")
    # placed symbols: the rotary models turn their object keys to their columns; the draft model has no rotary
    placed = replace(recipes.RECIPES["scenes"], scene_condition="placed")
    assert placed.gpt_config("target", 64, 128).condition_columns == placed.scenes.max_objects
    assert placed.gpt_config("drafter_r4", 64, 128).condition_columns == placed.scenes.max_objects
    assert placed.gpt_config("draft_model", 64, 128).condition_columns == 0
    assert recipes.RECIPES["scenes"].gpt_config("target", 64, 128).condition_columns == 0
    with pytest.raises(ValueError, match="needs scenes in columns"):
        replace(placed, scenes=replace(placed.scenes, placement="free"))
    # clip_placed: every model adds its column's object; its features stay the mini-CLIP's width
    columns = replace(recipes.RECIPES["scenes"], scene_condition="clip_placed")
    for stage in ("target", "drafter_r2", "draft_model"):
        config = columns.gpt_config(stage, 64, 128 + 77)
        assert (config.cond_dim, config.column_objects, config.column_symbols) == (128, 3, 77)
    language = scene_language(columns.scenes, "clip_placed")
    conditioner = scene_conditioner(clip, language, 17)
    assert isinstance(conditioner, SceneColumnConditioner)
    torch.testing.assert_close(conditioner("Cat and rocket on BLUE in noto style"), wanted["clip_placed"][0])


@pytest.mark.slow
def test_smoke_run_trains_every_stage_and_the_family_runs_every_method(tmp_path, cache):
    from mulo import methods
    from mulo.engine import Engine
    from mulo.eval import locality
    from mulo.eval.probes import peek
    from mulo.eval.quality import Quality
    from mulo.families import emoji as family_mod
    from mulo.train import pipeline

    assets = tmp_path / "assets"
    report = pipeline.run("scenes", tmp_path / "run", assets, smoke=True, cache=cache)
    vq_file = tmp_path / "run" / "vq.pt"
    assert set(recipes.STAGES) <= set(report)
    recipe = recipes.RECIPES["scenes"]
    assert report["vq"]["codes"] == recipe.vq_codes[0] and 0 <= report["vq"]["val_referee_match"] <= 1
    assert json.loads((assets / "target.json").read_text())["neighbour_inputs"] == 3
    up_config = json.loads((assets / "upsampler_r2.json").read_text())
    assert up_config["context"] == recipe.hyper.upsampler_context and up_config["width"] == recipe.hyper.upsampler_width
    assert all(0 <= report[f"upsampler_r{r}"]["val_object_accuracy"] <= 1 for r in (2, 4))
    assert 0 <= report["target"]["val_object_accuracy"] <= 1 and report["target"]["val_object_loss"] > 0
    assert report["data"]["held_out_combinations"] > 0 and report["data"]["val"] == recipe.smoke.held_out_scenes
    metrics = json.loads((assets / "metrics.json").read_text())
    assert metrics["scenes"]["held_out_prompts"] == 1 and metrics["scenes"]["multi_object_prompts"] >= 1
    assert metrics["scenes"]["real_match"] == 1.0  # the referee names the real scenes
    for label in ("ar", "zipar-w8", "mulo-r2", "mulo-r4"):
        entry = metrics["methods"][label]
        assert 0 <= entry["adherence"] <= 1 and 0 <= entry["adherence_held_out"] <= 1
        assert 0 <= entry["objects_found"] <= 1 and 0 <= entry["background_right"] <= 1
    assert metrics["methods"]["real images"]["adherence"] == 1.0
    card = (assets / "MODEL_CARD.md").read_text()
    assert "the exact referee's prompt match" in card and "held-out combinations" in card and "$" not in card
    assert "n objects in n equal columns" in card and f"every {recipe.scenes.step} px" in card  # the recipe's placement
    assert json.loads((assets / "scenes.json").read_text())["names"] == list(recipe.scenes.names)
    # the family from the smoke run's assets: every method runs, the referee judges its images
    family = family_mod.build("scenes", assets)
    assert family.grid == (32, 32) and set(family.drafters) == {2, 4} and family.eagle_head is not None
    assert isinstance(family.vq, PatchTokenizer) and family.vq.tile == 4  # squares of pixels, each its own
    engine = Engine(family)
    prompt = "red apple and rocket on blue"
    for method in methods.REGISTRY:
        result = engine.generate(prompt, method, 0)
        assert result.image.shape == (128, 128, 3), method
    quality = Quality.for_family(family)
    verdict = quality.judge(result.image, prompt)
    assert verdict.sentence().startswith(("matches the prompt", "does not match the prompt"))
    # the locality probe's three measurements run on the family (issue 63's bars; tiny counts here)
    prompts = quality.prompts[:2]
    assert locality.measure_layouts(engine, [p for _, p in prompts], seeds=2)["distinct"][0] in (1, 2)
    near = locality.measure_locality(engine, quality, prompts)
    assert 0 <= near["reopened_mean"] <= 1 and 0 <= near["mulo_match"] <= 1 and len(near["islands"]) == 2
    assert len(locality.measure_tau(engine, prompts[:1], taus=(0.001, 0.5))["acceptance"]) == 2
    # a look at the target while it trains judges like the card: the referee, its parts, real scenes at 1.0
    pipe = pipeline.Pipeline(tmp_path / "run", assets, recipe, recipe.smoke, cache=cache)
    looked = peek.peek(pipe, n_prompts=1)
    assert looked["real_adherence"] == 1.0 and looked["prompts"] == 1
    assert all(0 <= row["objects_found"] <= 1 and 0 <= row["adherence"] <= 1 for row in looked["methods"].values())
    with pytest.raises(ValueError, match="nearest known: rocket"):
        engine.generate("rockit on blue", "ar", 0)
    # a second run takes the first's VQ (``train --vq``, how the study's candidates share one) and
    # judges it on the same held-out scenes; a file of another architecture is refused
    again = pipeline.run(
        "scenes", tmp_path / "again", tmp_path / "a2", True, only=["data", "vq"], cache=cache, vq=vq_file
    )
    assert again["vq"]["adopted_from"] == str(vq_file) and again["vq"]["codes"] == report["vq"]["codes"]
    assert again["vq"]["val_referee_match"] == report["vq"]["val_referee_match"]
    assert again["vq"]["val_psnr_128px"] == report["vq"]["val_psnr_128px"]
    other = tmp_path / "other.pt"
    torch.save(VQModel(**recipes.vq_config(8)).state_dict(), other)  # a conv VQ, not squares of pixels
    with pytest.raises(ValueError, match="not a VQ of the scenes recipe's architecture"):
        pipeline.run("scenes", tmp_path / "third", tmp_path / "a3", True, only=["data", "vq"], cache=cache, vq=other)


def test_the_study_table_reads_each_candidate_s_run(tmp_path, capsys):
    from mulo.__main__ import main

    run = tmp_path / "scenes-s24"
    (run / "assets").mkdir(parents=True)
    report = {
        "clip": {"seconds": 50, "stage_seconds": 60},
        "vq": {"stage_seconds": 120, "val_referee_match": 0.99, "adopted_from": "runs/scenes-vq/a/vq.pt"},
        "target": {"seconds": 600, "stage_seconds": 600, "val_loss": 1.1, "train_loss": 1.0},
        "card": {"stage_seconds": 900},  # the evaluation is not training time
    }
    (run / "report.json").write_text(json.dumps(report))
    mulo_r2 = {"adherence": 0.5, "fd": 1.0, "acceptance_rate": 0.8, "reopened_fraction": 0.3}
    ar = {"adherence": 0.6, "fd": 1.0, "adherence_held_out": 0.5, "objects_found": 0.7, "background_right": 0.9}
    methods = {"ar": ar, "mulo-r2": mulo_r2}
    (run / "assets" / "metrics.json").write_text(json.dumps({"methods": methods}))
    assert main(["scenes-study", str(run), "--json", str(tmp_path / "study.json")]) == 0
    row = json.loads((tmp_path / "study.json").read_text())["rows"][0]
    assert row["cpu_minutes"] == 13.0 and row["ar_match_per_cpu_minute"] == round(0.6 / 13, 5)
    assert row["differs"] == "objects 24 px (6x6 tokens)" and row["held_out_over_train_loss"] == 1.1
    assert row["vq"] == "runs/scenes-vq/a/vq.pt"  # the shared VQ's file (``train --vq``)
    assert (row["ar_objects_found"], row["ar_background_right"]) == (0.7, 0.9)
    assert (row["mulo_r2_acceptance"], row["mulo_r2_reopened"], row["mulo_r4_acceptance"]) == (0.8, 0.3, None)
    assert "| scenes-s24 | objects 24 px (6x6 tokens) | 13.0 | 0.6 |" in capsys.readouterr().out
    with pytest.raises(SystemExit):  # not a run folder: one error line, exit 2
        main(["scenes-study", str(tmp_path / "nothing")])
    assert "not a training run folder" in capsys.readouterr().err


def test_a_scenes_training_sample_holds_as_many_scenes_of_each_object_count_as_the_held_out_one():
    from mulo.train.stages.ar import matched_by_objects

    # rows 0-59 train (1, 2, 3 objects in turn), 60-79 held out (2 or 3 objects, 3 more often)
    counts = np.array([1, 2, 3] * 20 + [2] * 7 + [3] * 13)
    train, val = np.arange(60), np.arange(60, 80)
    picked = matched_by_objects(np.random.default_rng(0), counts, val, train)
    assert set(picked) <= set(train) and len(set(picked)) == len(picked) == 20
    assert np.bincount(counts[picked], minlength=4).tolist() == [0, 0, 7, 13]
    # a count with too few training scenes takes them all, not a scene of another count
    few = matched_by_objects(np.random.default_rng(0), counts, val, np.arange(30))
    assert np.bincount(counts[few], minlength=4).tolist() == [0, 0, 7, 10]
