"""Evaluate the exported twemoji family and write its model card, samples grid and metrics.

Run as the last stage of ``python -m mulo train twemoji`` (or alone with ``--stages card``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from string import Template

import numpy as np
import torch
from PIL import Image, ImageDraw

from mulo.engine import Engine
from mulo.eval.metrics import acceptance_by_detail, adherence, frechet_distance, image_features, prompt_index
from mulo.eval.quality import pack_prompts
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


# What the card evaluates: AR, ZipAR with window 8 (the parallel-decoding gate: AR's quality?) and
# MuLo-SD at r = 2 and 4, each at the family's recommended knobs with these on top.
CARD_METHODS = {
    "ar": ("ar", {}),
    "zipar-w8": ("zipar", {"zipar_window": 8}),
    "mulo-r2": ("mulo", {"r": 2}),
    "mulo-r4": ("mulo", {"r": 4}),
}


class Reference:
    """The real images of ``prompts`` [(key, name)] and the retrieval texts, in ``clip``'s space."""

    def __init__(self, data: EmojiData, clip, prompts: list[tuple[str, str]]):
        self.clip, self.prompts = clip, prompts
        self.texts, self.text_keys = data.names, data.keys
        self.text_embeddings = clip.embed_texts(self.texts)  # once for every method
        self.keys = [key for key, _ in prompts]
        self.real_images = data.images[[data.keys.index(key) for key in self.keys]]
        self.real_feats = image_features(clip, self.real_images)

    @property
    def retrieval(self) -> tuple:
        return self.texts, self.text_keys, self.text_embeddings

    def adherence(self, images) -> float:
        """Share of ``images`` (one per prompt, uint8 ``[N, h, w, 3]`` or floats ``[N, 3, h, w]``)
        whose top-5 retrieved texts hold the prompted emoji."""
        hits = adherence(self.clip, images, self.keys, self.texts, self.text_keys, text_embeddings=self.text_embeddings)
        return round(hits, 4)

    def score(self, images) -> dict:
        """FD of ``images`` against the real images, and their adherence."""
        fd = frechet_distance(image_features(self.clip, images), self.real_feats)
        return {"fd": round(fd, 3), "adherence": self.adherence(images)}


def score_methods(engine: Engine, reference: Reference, methods: dict, seed: int = 0) -> dict:
    """Per label of ``methods`` ({label: (method, knobs)}): quality, time and forward passes over
    the reference's prompts, and MuLo-SD's acceptance and re-opened share (overall, per round, on
    flat and detailed tokens)."""
    results = {}
    for label, (method, knobs) in methods.items():
        images, rounds, summaries, by_detail = [], [], [], []
        start = time.perf_counter()
        for i, (_, name) in enumerate(reference.prompts):
            res = engine.generate(name, method, seed + i, knobs)
            images.append(res.image)
            summaries.append(res.trace.summary())
            if method == "mulo":
                by_detail.append(acceptance_by_detail(res.image, res.trace.rounds))
                rounds.append(
                    [
                        (float(r.accepted.sum() / max(1, r.proposed)), float(r.reopened.sum() / max(1, r.proposed)))
                        for r in res.trace.rounds
                    ]
                )
        seconds = time.perf_counter() - start
        entry = {
            **reference.score(np.stack(images)),
            "seconds_per_image": round(seconds / len(reference.prompts), 3),
            "nfe_target": float(np.mean([s["nfe"]["target"] for s in summaries])),
            "nfe_drafter": float(np.mean([s["nfe"]["drafter"] for s in summaries])),
        }
        if rounds:
            per_round = np.array(rounds)  # [prompts, rounds, 2]
            entry["acceptance_rate"] = round(float(np.mean([s["acceptance_rate"] for s in summaries])), 4)
            entry["reopened_fraction"] = round(float(np.mean([s["reopened_fraction"] for s in summaries])), 4)
            for side, rates in zip(("flat", "detail"), zip(*by_detail, strict=True), strict=True):
                known = [x for x in rates if x is not None]
                entry[f"acceptance_{side}"] = round(float(np.mean(known)), 4) if known else None
            entry["per_round_acceptance"] = np.round(per_round[..., 0].mean(0), 3).tolist()
            entry["per_round_reopened"] = np.round(per_round[..., 1].mean(0), 3).tolist()
        results[label] = entry
    return results


def evaluate(engine: Engine, data: EmojiData, clip, out: Path, count: int = N_EVAL_PROMPTS, seed: int = 0) -> dict:
    prompts = eval_prompts(data, count)
    reference = Reference(data, clip, prompts)
    results = score_methods(engine, reference, CARD_METHODS, seed)
    short = _short_prompt_adherence(engine, data, reference, seed)
    results.update(_ceilings(engine, reference))
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
    (out / "eval_prompts.json").write_text(json.dumps([{"key": k, "prompt": n} for k, n in prompts], indent=0))
    # What the quality metrics need at inference, without the data set: the real images' features
    # of the prompted emoji and the retrieval texts (benchmark, app).
    np.savez_compressed(
        out / "eval_reference.npz",
        keys=np.array(reference.keys),
        features=reference.real_feats.astype(np.float32),
        text_names=np.array(reference.texts),
        text_keys=np.array(reference.text_keys),
        text_short_prompts=pack_prompts(data.short_prompts),
    )
    config = engine.make_config(None).to_dict()
    return {"prompts": len(prompts), "seed": seed, "config": config, "methods": results, "short_prompts": short}


def _short_prompt_adherence(engine, data: EmojiData, reference: Reference, seed: int) -> dict:
    """Adherence to one-word prompts, what people type: each evaluation emoji's first short prompt
    ("apple" for "red apple"), counted adherent when the top-5 texts hold any emoji it fits; with
    short names resolved to their emoji's name (the default) and without (``raw``)."""
    clip, (texts, text_keys, text_embeddings) = reference.clip, reference.retrieval
    fits = prompt_index(data.names, data.keys, data.short_prompts)
    first = {}
    for key, shorts in zip(data.keys, data.short_prompts, strict=True):
        first.setdefault(key, shorts[0] if shorts else None)
    asked = [first[key] for key in reference.keys if first[key]]
    out = {"prompts": len(asked), "examples": asked[:12]}
    if not asked:  # smoke runs: a handful of emoji, possibly none with a short prompt
        return out
    runs = [
        (label + raw, method, {**knobs, "aliases": not raw})
        for label, method, knobs in (("ar", "ar", {}), ("mulo-r2", "mulo", {"r": 2}))
        for raw in ("", " raw")
    ]
    for label, method, knobs in runs:  # raw: the models alone, short names not resolved
        images = np.stack([engine.generate(p, method, seed + i, knobs).image for i, p in enumerate(asked)])
        wanted = [fits[p] for p in asked]
        out[label] = round(adherence(clip, images, wanted, texts, text_keys, text_embeddings=text_embeddings), 4)
    return out


@torch.no_grad()
def _ceilings(engine, reference: Reference) -> dict:
    """What the metrics give the real images and their VQ reconstructions: the most an AR model
    of this tokenizer can reach (FD of the real images against themselves is 0 by definition)."""
    x = torch.from_numpy(reference.real_images).permute(0, 3, 1, 2).float() / 255
    vq = engine.family.vq
    recon = vq.decode(vq.encode(x.to(vq.codebook.device))).cpu()
    untimed = {"seconds_per_image": None, "nfe_target": None, "nfe_drafter": None}
    return {
        "real images": {"fd": 0.0, "adherence": reference.adherence(x), **untimed},
        "VQ reconstructions": {**reference.score(recon), **untimed},
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


def model_fields(recipe: dict, budget: dict, geometry: dict) -> dict:
    """The template's fields on the family's geometry, its models and how they were trained."""
    vq, target, small, hyper, optimizer = (recipe[k] for k in ("vq", "target", "draft_model", "hyper", "optimizer"))
    px = geometry["px"]
    side = px // 4  # the VQ downsamples 4x
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
        "weight_decay": optimizer["weight_decay"],
        "warmup": optimizer["warmup"],
        "clip_norm": optimizer["clip_norm"],
    }


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
