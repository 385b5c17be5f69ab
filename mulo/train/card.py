"""Evaluate the exported twemoji family and write its model card, samples grid and metrics.

Run as the last stage of ``python -m mulo train twemoji`` (or alone with ``--stages card``).
"""

from __future__ import annotations

import json
from pathlib import Path
from string import Template

import numpy as np
import torch
from PIL import Image, ImageDraw

from mulo.engine import Engine
from mulo.eval import harness
from mulo.eval.metrics import acceptance_by_detail
from mulo.eval.quality import Quality
from mulo.families import int8
from mulo.train.card_sections import (
    PNG_DATA,
    SVG_DATA,
    TWEMOJI_LICENCE,
    fmt,
    intended_use,
    metric_rows,
    parallel_decoding,
    per_round_rows,
    short_prompt_line,
    stage_table,
    styled_data_text,
    teacher_forcing,
    text_mix,
    vq_study_section,
)
from mulo.train.data import EmojiData

SAMPLE_PROMPTS = [
    "red apple",
    "cat face",
    "rocket",
    "grinning face",
    "pizza",
    "pile of poo",
    "sun",
    "heavy black heart",
    "dog face",
    "banana",
    "christmas tree",
    "ghost",
    "hot beverage",
    "crown",
    "umbrella",
    "snowman",
]
N_EVAL_PROMPTS = 120


def eval_prompts(data: EmojiData, count: int = N_EVAL_PROMPTS, seed: int = 7) -> list[tuple[str, str]]:
    """A fixed list of (key, name): one entry per base emoji, no flags or keycaps."""
    seen, entries = set(), []
    for name, key, text in zip(data.names, data.keys, data.texts, strict=True):
        if key in seen or "flag" in text.split() or name.startswith("keycap"):
            continue
        seen.add(key)
        entries.append((key, name))
    rng = np.random.default_rng(seed)
    pick = sorted(rng.choice(len(entries), size=min(count, len(entries)), replace=False).tolist())
    return [entries[i] for i in pick]


def samples_grid(images: list[np.ndarray], captions: list[str], columns: int = 4, scale: int = 2) -> Image.Image:
    size = images[0].shape[0] * scale
    cell_w, cell_h = size + 24, size + 30
    rows = (len(images) + columns - 1) // columns
    sheet = Image.new("RGB", (columns * cell_w, rows * cell_h), "white")
    draw = ImageDraw.Draw(sheet)
    for i, (img, caption) in enumerate(zip(images, captions, strict=True)):
        x, y = (i % columns) * cell_w + 12, (i // columns) * cell_h + 4
        sheet.paste(Image.fromarray(img).resize((size, size), Image.NEAREST), (x, y))
        text = caption if len(caption) <= 22 else caption[:21] + "…"
        width = draw.textlength(text)
        draw.text((x + (size - width) / 2, y + size + 6), text, fill="black")
    return sheet


# What the card evaluates (labels of ``harness.SPECS``): AR, ZipAR with window 8 (the
# parallel-decoding gate: AR's quality?) and MuLo-SD at r = 2 and 4 at the family's recommended knobs.
CARD_METHODS = ("ar", "zipar-w8", "mulo-r2", "mulo-r4")


def real_images(data: EmojiData, keys: list[str]) -> np.ndarray:
    """The real image of each emoji of ``keys``, uint8 ``[N, h, w, 3]``."""
    return data.images[[data.keys.index(key) for key in keys]]


def reference(data: EmojiData, clip, prompts: list[tuple[str, str]]) -> Quality:
    """The scorer of ``prompts`` [(key, name)]: their real images and every text of the data set for
    retrieval, in ``clip``'s space."""
    keys = [key for key, _ in prompts]
    return Quality.from_images(clip, prompts, real_images(data, keys), data.names, data.keys, data.short_prompts)


def rounded(scores: dict) -> dict:
    """FD and adherence as the card reports them (3 and 4 decimals)."""
    fd = scores["fd"]
    return {"fd": None if fd is None else round(fd, 3), "adherence": round(scores["adherence"], 4)}


def _mulo_rounds(result) -> tuple | None:
    """A MuLo-SD request's acceptance on flat and detailed tokens, and per round (accepted share,
    re-opened share) of its proposals; None for the other methods."""
    if result.trace.method != "mulo":
        return None
    per_round = [
        (float(r.accepted.sum() / max(1, r.proposed)), float(r.reopened.sum() / max(1, r.proposed)))
        for r in result.trace.rounds
    ]
    return acceptance_by_detail(result.image, result.trace.rounds), per_round


def score_methods(engine: Engine, quality: Quality, labels, seed: int = 0) -> dict:
    """Per label of ``labels`` (of ``harness.SPECS``): quality, time and forward passes over the
    quality's prompts (prompt i at seed ``seed + i``), and MuLo-SD's acceptance and re-opened share
    (overall, per round, on flat and detailed tokens)."""
    records = harness.run(engine, harness.runs_of(labels), quality.prompts, seed, extra=_mulo_rounds)
    results = {}
    for label, recs in records.items():
        row = harness.aggregate(recs, quality=quality, keys=quality.keys)
        entry = {
            **rounded(row),
            "seconds_per_image": round(float(np.mean([r.latency for r in recs])), 3),
            "nfe_target": row["nfe"]["target"],
            "nfe_drafter": row["nfe"]["drafter"],
        }
        if harness.SPECS[label][0] == "mulo":
            entry.update(_mulo_entry(row, [r.extra for r in recs]))
        results[label] = entry
    return results


def _mulo_entry(row: dict, extras: list[tuple]) -> dict:
    """MuLo-SD's acceptance and re-opened share: overall, on flat and detailed tokens, per round."""
    entry = {
        "acceptance_rate": None if row["acceptance"] is None else round(row["acceptance"], 4),
        "reopened_fraction": round(row["reopened"], 4),
    }
    by_detail = [detail for detail, _ in extras]
    for side, rates in zip(("flat", "detail"), zip(*by_detail, strict=True), strict=True):
        known = [x for x in rates if x is not None]
        entry[f"acceptance_{side}"] = round(float(np.mean(known)), 4) if known else None
    per_round = np.array([rounds for _, rounds in extras])  # [prompts, rounds, 2]
    entry["per_round_acceptance"] = np.round(per_round[..., 0].mean(0), 3).tolist()
    entry["per_round_reopened"] = np.round(per_round[..., 1].mean(0), 3).tolist()
    return entry


def evaluate(engine: Engine, data: EmojiData, clip, out: Path, count: int = N_EVAL_PROMPTS, seed: int = 0) -> dict:
    prompts = eval_prompts(data, count)
    quality = reference(data, clip, prompts)
    results = score_methods(engine, quality, CARD_METHODS, seed)
    short = _short_prompt_adherence(engine, data, quality, seed)
    results.update(ceilings(engine.family.vq, quality, real_images(data, quality.keys)))
    grid_images, captions = [], []
    # smoke runs know only a few words: fall back to the evaluation prompts
    sample_prompts = SAMPLE_PROMPTS if count >= len(SAMPLE_PROMPTS) else [n for _, n in prompts[:2]]
    for i, prompt in enumerate(sample_prompts):
        grid_images.append(engine.generate(prompt, "ar", seed + i).image)
        captions.append(prompt)
    scale = max(1, 128 // grid_images[0].shape[0])  # 128 px cells
    samples_grid(grid_images, captions, scale=scale).save(out / "samples_ar.png")
    grid_images = [engine.generate(p, "mulo", seed + i).image for i, p in enumerate(sample_prompts)]
    samples_grid(grid_images, sample_prompts, scale=scale).save(out / "samples_mulo.png")
    quality.save(out)  # what the quality metrics need at inference, without the data set (benchmark, app)
    config = engine.make_config(None).to_dict()
    return {"prompts": len(prompts), "seed": seed, "config": config, "methods": results, "short_prompts": short}


def _short_prompt_adherence(engine, data: EmojiData, quality: Quality, seed: int) -> dict:
    """Adherence to one-word prompts, what people type: each evaluation emoji's first short prompt
    ("apple" for "red apple"), counted adherent when the top-5 texts hold any emoji it fits; with
    short names resolved to their emoji's name (the default) and without (``raw``)."""
    first = {}
    for key, shorts in zip(data.keys, data.short_prompts, strict=True):
        first.setdefault(key, shorts[0] if shorts else None)
    asked = [first[key] for key in quality.keys if first[key]]
    out = {"prompts": len(asked), "examples": asked[:12]}
    if not asked:  # smoke runs: a handful of emoji, possibly none with a short prompt
        return out
    # raw: the models alone, short names not resolved
    runs = [(label + raw, label, {"aliases": not raw}) for label in ("ar", "mulo-r2") for raw in ("", " raw")]
    records = harness.run(engine, runs, [(p, p) for p in asked], seed)
    wanted = [quality.fits[p] for p in asked]
    for name, recs in records.items():
        out[name] = round(quality.adherence(np.stack([r.image for r in recs]), wanted), 4)
    return out


@torch.no_grad()
def ceilings(vq, quality: Quality, images: np.ndarray) -> dict:
    """What the metrics give the real ``images`` of the quality's prompts and their reconstructions
    by the ``vq`` tokenizer (with their PSNR): the most an AR model of this tokenizer can reach (FD
    of the real images against themselves is 0 by definition)."""
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255
    recon = vq.decode(vq.encode(x.to(vq.codebook.device))).cpu()
    psnr = round(10 * float(np.log10(1 / max(float(((recon - x) ** 2).mean()), 1e-10))), 2)
    untimed = {"seconds_per_image": None, "nfe_target": None, "nfe_drafter": None}
    return {
        "real images": {"fd": 0.0, "adherence": round(quality.adherence(x, quality.keys), 4), **untimed},
        "VQ reconstructions": {**rounded(quality.score(recon, quality.keys)), "psnr": psnr, **untimed},
    }


# The card's prose with ``${name}`` fields (``string.Template``), package data beside this module.
# The card ends where the History section does: the file's final newline is the editor's.
TEMPLATE = Path(__file__).resolve().parent / "templates" / "model_card.md"


def write_model_card(
    assets: Path, report: dict, metrics: dict, budget: dict, sizes: dict, recipe: dict, geometry: dict
) -> str:
    """MODEL_CARD.md from the training report and the evaluation; every number is measured, but
    those of the fixed history section (``geometry["history"]``: the design study behind the
    recipe) come from earlier runs.

    ``recipe`` holds the architecture settings the text describes (codebook size, model widths,
    ``hyper``: ``recipes.Hyper`` as a dict, ``optimizer``: the loop's weight decay, warm-up and
    clipping); ``geometry`` the family's name, image size ``px``, ``svg`` (data source),
    ``styles``, ``history`` and the VQ study's ``study_rule``.
    """
    stage_rows, seconds = stage_table(report)
    fields = {
        **model_fields(recipe, budget, geometry),
        **data_fields(report, geometry),
        "intended_use": intended_use(report, recipe["vq"]["num_vq_embeddings"]),
        "size_rows": "\n".join(f"| {name} | {fmt(mb)} |" for name, mb in sizes.items()),
        "storage_text": storage_text(geometry.get("int8_models", ()), geometry["family"]),
        "budget_json": json.dumps(budget),
        "stage_rows": stage_rows,
        "total_minutes": f"{seconds / 60:.1f}",
        "prompts": metrics["prompts"],
        "config_json": json.dumps(metrics["config"]),
        "metric_rows": metric_rows(metrics["methods"]),
        "short_line": short_prompt_line(metrics.get("short_prompts") or {}),
        "per_round": per_round_rows(metrics["methods"]),
        "history": history_section(report, geometry),
    }
    card = Template(TEMPLATE.read_text().removesuffix("\n")).substitute(fields)
    (assets / "MODEL_CARD.md").write_text(card)
    return card


def storage_text(int8_models, family: str) -> str:
    if not int8_models:
        return "Every tensor is stored in float16 and loaded as float32."
    names = ", ".join(f"`{name}`" for name in int8_models)
    return (
        f"{names}: every matrix of {int8.MIN_NUMEL:,} entries or more stored in int8 with one float16 scale per "
        "row (`mulo/families/int8.py`), to fit `assets/`; everything else in float16; all loaded as "
        f"float32. What it changes, measured against the float16 export: `benchmarks/int8-{family}.json`."
    )


def model_fields(recipe: dict, budget: dict, geometry: dict) -> dict:
    """The template's fields on the family's geometry, its models and how they were trained."""
    vq, target, small, hyper, optimizer = (recipe[k] for k in ("vq", "target", "draft_model", "hyper", "optimizer"))
    px = geometry["px"]
    side = px // geometry.get("patch", 4)  # the VQ's patch side in pixels
    return {
        "family": geometry["family"],
        "px": px,
        "px_r2": px // 2,
        "px_r4": px // 4,
        "side": side,
        **{name: f"{side // f}x{side // f}" for name, f in (("grid_target", 1), ("grid_r2", 2), ("grid_r4", 4))},
        "name_text_prob": recipe["name_text_prob"],
        "cfg_dropout": f"{recipe['cfg_dropout']:.0%}",
        "vq_channels": tuple(vq["block_out_channels"]),
        "codes": vq["num_vq_embeddings"],
        "code_dim": vq["vq_embed_dim"],
        "vq_l1_weight": hyper["vq_l1_weight"],
        "vq_crop": hyper["vq_crop"],
        "target_dim": target["dim"],
        "target_layers": target["n_layer"],
        "target_heads": target["n_head"],
        "text_mix": text_mix(budget["ar_text_mix"]),
        "teacher_forcing": teacher_forcing(budget),
        "parallel_decoding": parallel_decoding(budget),
        "draft_model_dim": small["dim"],
        "draft_model_layers": small["n_layer"],
        "upsampler_width": hyper["upsampler_width"],
        "upsampler_depth": hyper["upsampler_depth"],
        "eagle_noise": budget.get("eagle_noise", 0),
        "eagle_cls_weight": budget.get("eagle_cls_weight", 0),
        # the AR stages train at the budget's weight decay (emoji's 0.05), every other stage at the loop's
        "weight_decay": weight_decay_text(optimizer["weight_decay"], budget.get("weight_decay")),
        "warmup": optimizer["warmup"],
        "clip_norm": optimizer["clip_norm"],
    }


def weight_decay_text(default: float, ar: float | None) -> str:
    """AdamW's weight decay as the card states it: one number, or the AR models' own beside it."""
    return f"{default}" if ar is None or ar == default else f"{default}; the AR models {ar}"


def data_fields(report: dict, geometry: dict) -> dict:
    """The data and licence paragraphs (every style's package and licence on styled data) and
    the image count."""
    px, n_images = geometry["px"], report.get("data", {}).get("images", 0)
    sizes_text = ", ".join(str(px // f) for f in (1, 2, 4))
    data_text = (SVG_DATA if geometry["svg"] else PNG_DATA).format(images=n_images, sizes=sizes_text)
    licence_text = TWEMOJI_LICENCE
    if geometry.get("styles"):
        data_text, licence_text = styled_data_text(geometry["styles"], report.get("data", {}), sizes_text)
    return {"data_text": data_text, "licence_text": licence_text, "images": f"{n_images:,}"}


def history_section(report: dict, geometry: dict) -> str:
    """The family's fixed History, after the run's VQ study when it had several candidates."""
    if "vq_study" not in report:
        return geometry["history"]
    study = vq_study_section(report["vq_study"]["candidates"], report["vq"]["codes"], geometry["study_rule"])
    return study + "\n" + geometry["history"]
