"""The training pipeline (``mulo.train.pipeline``): data handling, mini-CLIP, metrics, and a smoke run
of every stage."""

import json

import numpy as np
import pytest
import torch

from mulo.eval.metrics import acceptance_by_detail, frechet_distance, prompt_index
from mulo.models.text import MiniCLIP, WordTokenizer
from mulo.train import data as data_mod
from tests.helpers import check_oracle_table


def test_describe_adds_skin_tones_and_dedupes_words():
    entry = {
        "name": "WAVING HAND SIGN",
        "short_names": ["wave"],
        "subcategory": "hand-fingers-open",
        "category": "People & Body",
    }
    name, text, short_prompts = data_mod.describe(entry, ["1F3FC"])
    assert name == "waving hand sign medium light skin tone"
    assert text.split()[:8] == ["waving", "hand", "sign", "medium", "light", "skin", "tone", "wave"]
    assert len(text.split()) == len(set(text.split()))
    # The short name alone and each content word of the name ("sign" is a stop word), toned.
    tone = " medium light skin tone"
    assert short_prompts == ["wave" + tone, "waving" + tone, "hand" + tone]


def test_short_prompts_leave_out_the_name_itself():
    pizza = {"name": "SLICE OF PIZZA", "short_names": ["pizza"], "subcategory": "food-prepared", "category": "Food"}
    assert data_mod.describe(pizza, [])[2] == ["pizza", "slice"]
    rocket = {"name": "ROCKET", "short_names": ["rocket"], "subcategory": "transport-air", "category": "Travel"}
    assert data_mod.describe(rocket, [])[2] == []  # a one-word name is its own short prompt


def test_aliases_map_short_names_to_names_but_never_shadow_a_name():
    entries = [
        {"name": "SLICE OF PIZZA", "short_names": ["pizza"], "subcategory": "f", "category": "F"},
        {"name": "CAT FACE", "short_names": ["cat"], "subcategory": "a", "category": "A"},
        {"name": "CAT", "short_names": ["cat2"], "subcategory": "a", "category": "A"},
        {"name": "WAVING HAND SIGN", "short_names": ["wave"], "subcategory": "h", "category": "H"},
    ]
    variants = [(e, []) for e in entries] + [(entries[3], ["1F3FF"])]
    data = data_mod.EmojiData(
        np.zeros((len(variants), 1, 1, 3), np.uint8),
        [data_mod.describe(e, t)[0] for e, t in variants],
        ["" for _ in variants],
        ["k"] * len(variants),
        np.zeros(len(variants), bool),
        [data_mod.describe(e, t)[2] for e, t in variants],
        [data_mod.short_names_of(e, t) for e, t in variants],
    )
    assert data_mod.aliases(data) == {
        "pizza": "slice of pizza",
        "cat2": "cat",
        "wave": "waving hand sign",
        "wave dark skin tone": "waving hand sign dark skin tone",
    }  # "cat" is an emoji's name, so it is no alias of "cat face"


def test_prompt_index_maps_a_short_prompt_to_every_emoji_it_fits():
    names = ["sun with face", "black sun with rays", "slice of pizza"]
    shorts = [["sun", "face"], ["sunny", "black", "sun", "rays"], ["pizza", "slice"]]
    index = prompt_index(names, ["A", "B", "C"], shorts)
    assert index["sun"] == {"A", "B"} and index["pizza"] == {"C"} and index["slice of pizza"] == {"C"}
    assert "slice pizza" not in index


def test_a_corrupt_package_fails_its_integrity_check(tmp_path):
    (tmp_path / data_mod.TARBALL).write_bytes(b"not the package")
    with pytest.raises(RuntimeError, match="integrity"):
        data_mod.fetch_package(tmp_path)
    assert not (tmp_path / data_mod.TARBALL).exists()  # removed, so the next run fetches again


def test_tokenizer_reports_unknown_words_and_rejects_prompts_without_known_ones():
    tok = WordTokenizer.build(["red apple", "cat face"], max_len=4)
    ids, unknown = tok.encode("Red zebra apple!")
    assert unknown == ["zebra"]
    assert ids.tolist()[:2] == [tok.index["red"], tok.index["apple"]] and ids.tolist()[2:] == [0, 0]
    clip = MiniCLIP(tok.vocab, max_len=4)
    features, unknown = clip.condition("cat with hat")
    assert features.shape == (5, 128) and unknown == ["with", "hat"]  # text embedding + 4 word slots
    rms = features.pow(2).mean(-1).sqrt()
    # The embedding and the known word at unit RMS (far from the all-zero null condition);
    # padding slots exactly zero.
    assert torch.allclose(rms[:2], torch.ones(2), atol=1e-5) and features[2:].abs().sum() == 0
    with pytest.raises(ValueError, match="no known word"):
        clip.condition("zebra crossing")


def test_frechet_distance():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(4000, 3))
    assert frechet_distance(a, a) == pytest.approx(0, abs=1e-6)
    b = a + np.array([2.0, 0, 0])
    assert frechet_distance(a, b) == pytest.approx(4.0, rel=1e-6)  # a pure shift: ||mu||^2
    c = rng.normal(size=(4000, 3)) * 2
    assert frechet_distance(a, c) == pytest.approx(frechet_distance(c, a), rel=1e-6)
    assert frechet_distance(a, c) == pytest.approx(3 * (2 - 1) ** 2, rel=0.1)  # Tr((sqrt(S1)-sqrt(S2))^2)
    with pytest.raises(ValueError, match="at least two"):
        frechet_distance(a[:1], a)


def test_acceptance_by_detail_splits_flat_and_detailed_tokens():
    """A 2x2 token grid over an 8 px image: the left column flat white, the right column noisy."""
    from types import SimpleNamespace

    image = np.full((8, 8, 3), 255, np.uint8)
    image[:, 4:] = np.random.default_rng(0).integers(0, 256, (8, 4, 3))
    first = SimpleNamespace(draft=np.array([[5, 5], [5, -1]]), accepted=np.array([[1, 0], [1, 0]]))
    second = SimpleNamespace(draft=np.array([[-1, -1], [-1, 5]]), accepted=np.array([[0, 0], [0, 1]]))
    flat, detail = acceptance_by_detail(image, [first, second])
    assert (flat, detail) == (1.0, 0.5)  # flat: both drafts accepted; detail: 1 of 2 (over two rounds)
    nothing = SimpleNamespace(draft=np.full((2, 2), -1), accepted=np.zeros((2, 2)))
    assert acceptance_by_detail(image, [nothing]) == (None, None)


@pytest.mark.parametrize("family", ["twemoji", "scenes"])
def test_the_model_card_template_is_filled_from_the_report(tmp_path, family):
    """The shipped family's report and metrics through the card template: every field filled, the
    report's and the evaluation's numbers in the text, and the template shipped as package data."""
    import re
    from pathlib import Path

    from mulo.train import pipeline, recipes
    from mulo.train.stages import card, card_text

    shipped = Path(__file__).resolve().parents[1] / "assets" / family
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "report.json").write_text((shipped / "training_report.json").read_text())
    recipe = recipes.RECIPES[family]
    pipe = pipeline.Pipeline(tmp_path / "run", tmp_path / "assets", recipe, recipe.budget)
    (tmp_path / "assets").mkdir()
    metrics = json.loads((shipped / "metrics.json").read_text())
    pipe.write_card(metrics)
    text = (tmp_path / "assets" / "MODEL_CARD.md").read_text()
    fields = set(re.findall(r"\$\{(\w+)\}", card.TEMPLATE.read_text()))
    assert len(fields) > 30 and "$" not in text  # no field left, none misspelt
    fmt, report = card_text.fmt, pipe.report
    seconds = max(report["target"].get("stage_seconds", 0), report["target"]["seconds"])  # every session's
    assert f"| target | {fmt(seconds)} |" in text
    assert f"val_loss {fmt(report['target']['val_loss'])}" in text
    ar = metrics["methods"]["ar"]
    assert f"| ar | {fmt(ar['fd'])} | {fmt(ar['adherence'])} | {fmt(ar['nfe_target'])} |" in text
    assert f"Over {metrics['prompts']} fixed" in text and json.dumps(metrics["config"]) in text
    assert f"{recipe.px}x{recipe.px} emoji" in text and f"(width {recipe.hyper.upsampler_width}, " in text
    assert ("stored in int8" in text) == bool(recipe.int8_models)  # how the weights are stored
    if "vq_study" in report:  # the 32x32 family: its codebook study, the pick from the report
        assert f"Picked: **{report['vq']['codes']} codes**." in text
    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert '"mulo.train" = ["history/*.md", "templates/*.md"]' in pyproject  # an installed mulo has it
    assert card.TEMPLATE.parent.name == "templates" and card.TEMPLATE.suffix == ".md"


def test_the_card_states_the_ar_models_own_weight_decay():
    """emoji's AR stages train at weight decay 0.05, every other stage at the loop's 0.01: the card
    says both; a family trained at one decay (twemoji's) reads as before."""
    from mulo.train import loop, recipes
    from mulo.train.stages.card import weight_decay_text

    emoji = recipes.RECIPES["emoji"].budget.weight_decay
    assert emoji != loop.WEIGHT_DECAY
    assert weight_decay_text(loop.WEIGHT_DECAY, emoji) == f"{loop.WEIGHT_DECAY}; the AR models {emoji}"
    assert weight_decay_text(loop.WEIGHT_DECAY, recipes.RECIPES["twemoji"].budget.weight_decay) == "0.01"
    assert weight_decay_text(loop.WEIGHT_DECAY, None) == "0.01"  # a report from before the budget named it


def test_each_recipe_s_vq_encodes_its_three_sizes_to_its_grids():
    """A recipe's patch sets its VQ's depth: emoji-16-128's 8-px patches turn 128, 64 and 32 px into
    the 16x16, 8x8 and 4x4 grids that emoji-16's 4-px patches make of 64, 32 and 16 px."""
    import torch

    from mulo.models.vq import build_model, make_tokenizer
    from mulo.train import recipes

    for name, recipe in recipes.RECIPES.items():
        vq = build_model(recipes.vq_config(recipe.vq_codes[0], recipe.patch, **recipe.vq_model))
        tok = make_tokenizer(vq, recipe.hyper.vq_tile)
        grids = [tok.encode(torch.rand(1, 3, px, px)).shape[-1] for px in recipe.sizes]
        assert grids == [recipe.grid(stage) for stage in ("target", "drafter_r2", "drafter_r4")], name
    assert recipes.RECIPES["emoji-16-128"].grid("target") == recipes.RECIPES["emoji-16"].grid("target") == 16
    for patch in (2, 6, 12):
        with pytest.raises(ValueError, match="power of two of at least 4"):
            recipes.vq_config(64, patch)


# emoji-16: five styles, held-out pairs, adoption. The 128 px path with a VQ study of several
# codebooks and their oracle tables is the scenes family's smoke run (tests/test_scenes_family.py);
# twemoji's recipe (one style) runs the same stages and is not run a third time (~5 min).
@pytest.mark.slow
@pytest.mark.parametrize("family, px", [("emoji-16", 64)])
def test_smoke_run_trains_every_stage_and_the_family_loads(tmp_path, family, px):
    from mulo.engine import Engine
    from mulo.eval.probes import peek
    from mulo.families import emoji as family_mod
    from mulo.train import pipeline, recipes

    report = pipeline.run(family, tmp_path / "run", tmp_path / "assets", smoke=True)
    assert 0 <= report["eagle"]["val_top1_agreement"] <= 1 and 0 < report["eagle"]["val_top1_target_prob"] < 1
    for stage in recipes.STAGES[1:-2]:  # every training stage (not data, export, card)
        assert report[stage]["stage_seconds"] >= 0
    recipe = recipes.RECIPES[family]
    assert report["vq"]["codes"] in recipe.vq_codes
    if len(recipe.vq_codes) > 1:  # the VQ study: every candidate with its oracle MuLo-SD table
        study = report["vq_study"]["candidates"]
        assert sorted(map(int, study)) == sorted(recipe.vq_codes)
        check_oracle_table(study[str(report["vq"]["codes"])]["oracle"])
        assert report["vq"]["codes"] == recipes.choose_codebook(study)
    assert report["target"]["val_loss_zipar_w8"] > 0
    assert report["target"]["train_loss"] > 0  # the generalisation gap's other side, measured alike
    assets = tmp_path / "assets"
    if recipe.styles:  # five styles, held-out pairs, augmented copies, model selection by held-out loss
        assert set(report["data"]["per_style"]) == set(recipe.styles) and all(report["data"]["per_style"].values())
        tokens = np.load(tmp_path / "run" / "tokens.npz")
        assert len(tokens["source"]) == len(tokens["is_val"]) + (~tokens["is_val"]).sum() * recipe.smoke.augment_copies
        assert report["target"]["best_step"] in [step for step, _ in report["target"]["val_curve"]]
        assert report["target"]["val_loss"] > 0 and set(tokens["split"]) <= {0, 1, 2}
        listed = json.loads((assets / "styles.json").read_text())
        assert [s["word"] for s in listed] == list(recipe.styles)
        assert family_mod.build(family, assets).styles == recipe.styles
        card_text = (assets / "MODEL_CARD.md").read_text()
        assert "CC-BY-SA 4.0" in card_text and "`@iconify-json/noto@1.2.9`" in card_text
    sizes = {p.name: p.stat().st_size for p in assets.glob("*.safetensors")}
    assert len(sizes) == 9 and max(sizes.values()) < 10 * 2**20 and sum(sizes.values()) < 40 * 2**20
    card = (assets / "MODEL_CARD.md").read_text()
    assert "CC-BY 4.0" in card and "samples_ar.png" in card
    metrics = json.loads((assets / "metrics.json").read_text())
    assert set(metrics["methods"]) == {"ar", "zipar-w8", "mulo-r2", "mulo-r4", "real images", "VQ reconstructions"}
    assert metrics["methods"]["zipar-w8"]["nfe_target"] < metrics["methods"]["ar"]["nfe_target"]
    assert metrics["methods"]["real images"]["fd"] == 0 and metrics["methods"]["VQ reconstructions"]["fd"] > 0
    assert {"acceptance_flat", "acceptance_detail"} <= set(metrics["methods"]["mulo-r2"])
    assert all(0 <= report["vq"][f"val_draft_agreement_r{r}"] <= 1 for r in (2, 4))
    assert all(0 <= report["vq"][f"val_resize_agreement_r{r}"] <= 1 for r in (2, 4))
    reference = np.load(assets / "eval_reference.npz")  # the metrics' inputs, shipped: no data set needed
    assert reference["features"].shape[0] == len(reference["keys"]) == metrics["prompts"]
    assert set(reference["keys"]) <= set(reference["text_keys"])
    assert len(reference["text_short_prompts"]) == len(reference["text_names"])
    short = metrics["short_prompts"]  # the smoke emoji are smileys: every one has a short name
    assert short["prompts"] >= 1 and 0 <= short["ar"] <= 1 and 0 <= short["mulo-r2"] <= 1
    assert "One-word prompts" in card
    # Resuming a finished run does nothing and keeps the report.
    again = pipeline.run(family, tmp_path / "run", assets, smoke=True, only=["target"])
    assert again["target"] == report["target"]
    # A look at the target while it trains: its last checkpoint, scored like the card
    pipe = pipeline.Pipeline(tmp_path / "run", assets, recipes.RECIPES[family], recipes.RECIPES[family].smoke)
    (tmp_path / "run" / "target.pt").rename(tmp_path / "target.pt")  # as if the stage were still running
    looked = peek.peek(pipe, n_prompts=2)
    assert looked["step"] == pipe.budget.ar_steps and looked["prompts"] == 2
    assert set(looked["methods"]) == {"ar", "zipar-w8"}
    assert looked["methods"]["zipar-w8"]["nfe_target"] < looked["methods"]["ar"]["nfe_target"] == (px // 4) ** 2
    assert all(0 <= row["adherence"] <= 1 and row["fd"] >= 0 for row in looked["methods"].values())
    # the ceiling beside them: the real images of the same prompts, the card's first two
    assert looked["real_adherence"] == metrics["methods"]["real images"]["adherence"]
    if recipe.styles:  # issue 46's study reads the same checkpoint: losses alike and the generalisation probe
        from mulo.eval.probes import study

        studied = study.study(pipe, n_prompts=2, seeds=2)
        assert studied["step"] == looked["step"]
        assert studied["cpu_minutes"] == round(report["target"]["seconds"] / 60, 2)  # the finished stage's
        assert studied["val_loss"] > 0 and studied["train_loss"] > 0 and studied["val_unseen_emoji_loss"] > 0
        # the study's VQ ceiling is the card's, from the run folder alone (its float32 VQ, the card's float16)
        ceiling = study.vq_ceiling(pipe)
        assert ceiling["codes"] == report["vq"]["codes"] and ceiling["prompts"] == metrics["prompts"]
        for row in ("real images", "VQ reconstructions"):
            card_row = metrics["methods"][row]
            assert ceiling[row]["adherence"] == card_row["adherence"]
            assert ceiling[row]["fd"] == pytest.approx(card_row["fd"], rel=0.02, abs=0.002)
        assert ceiling["psnr"] > 0 and ceiling["grid"] == px // 4
        assert studied["val_over_train"] == round(studied["val_loss"] / studied["train_loss"], 3)
        assert studied["prompts"] == 2 and studied["ar_nll"] > 0 and 1 <= studied["distinct_images"] <= 2
    (tmp_path / "target.pt").rename(tmp_path / "run" / "target.pt")
    fam = family_mod.build(family, assets)
    assert fam.grid == (px // 4, px // 4)
    prompt = json.loads((assets / "eval_prompts.json").read_text())[0]["prompt"]
    engine = Engine(fam)
    result = engine.generate(prompt + " zebraish", "mulo", 0, {"r": 4, "upsampler": "learned"})
    assert result.image.shape == (px, px, 3)
    assert result.trace.warnings == ["unknown words ignored: zebraish"]
    assert torch.equal(engine.generate(prompt, "ar", 1).tokens, engine.generate(prompt, "ar", 1).tokens)
    assert fam.eagle_head is not None  # EAGLE-2 runs on the trained head, greedy exactly AR
    greedy = {"temperature": 0.0}
    eagle = engine.generate(prompt, "eagle2", 1, greedy)
    assert torch.equal(eagle.tokens, engine.generate(prompt, "ar", 1, greedy).tokens)
    if family == "emoji-16":  # a family trained before a stage existed gets it on shipped weights
        adopted = pipeline.run(family, tmp_path / "adopted", tmp_path / "assets2", smoke=True, adopt=assets,
                              only=["data", "clip", "vq", "tokens", "target", "eagle"])  # fmt: skip
        assert adopted["target"]["adopted_from"] == str(assets) and "adopted_from" not in adopted["eagle"]
        assert adopted["target"]["stage_seconds"] == report["target"]["stage_seconds"]  # not retrained
        shipped = family_mod.load_weights(assets, "target")[1]
        again = torch.load(tmp_path / "adopted" / "target.pt", weights_only=True)
        assert all(torch.equal(shipped[k], again[k]) for k in shipped)
