"""A trained family's evaluation, what its model card reports: the evaluation prompts, the scorer
built from their real images, every card method scored on them (quality, time, forward passes,
MuLo-SD's acceptance), the ceilings of the real images and of the VQ's reconstructions, and the
samples grids. ``data`` is a training data set (``mulo.train.data.EmojiData`` or one with its
fields: ``keys``, ``names``, ``images``, ``short_prompts``, ``eval_pairs``...)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw

from mulo.engine import Engine
from mulo.eval import harness
from mulo.eval.metrics import acceptance_by_detail
from mulo.eval.quality import Quality
from mulo.eval.scene_quality import as_uint8, verdict_parts
from mulo.scenes import parse_prompt

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


def eval_prompts(data, count: int = N_EVAL_PROMPTS, seed: int = 7) -> list[tuple[str, str]]:
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


def real_images(data, keys: list[str]) -> np.ndarray:
    """The real image of each emoji of ``keys``, uint8 ``[N, h, w, 3]``."""
    return data.images[[data.keys.index(key) for key in keys]]


def reference(data, clip, prompts: list[tuple[str, str]]) -> Quality:
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


def score_methods(engine: Engine, quality: Quality, labels, seed: int = 0, images: dict | None = None) -> dict:
    """Per label of ``labels`` (of ``harness.SPECS``): quality, time and forward passes over the
    quality's prompts (prompt i at seed ``seed + i``), and MuLo-SD's acceptance and re-opened share
    (overall, per round, on flat and detailed tokens); each label's images into ``images`` if given."""
    records = harness.run(engine, harness.runs_of(labels), quality.prompts, seed, extra=_mulo_rounds)
    results = {}
    for label, recs in records.items():
        if images is not None:
            images[label] = np.stack([r.image for r in recs])
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


def evaluate(engine: Engine, data, clip, out: Path, count: int = N_EVAL_PROMPTS, seed: int = 0) -> dict:
    prompts = eval_prompts(data, count)
    quality = reference(data, clip, prompts)
    # smoke runs know only a few words: fall back to the evaluation prompts
    sample_prompts = SAMPLE_PROMPTS if count >= len(SAMPLE_PROMPTS) else [n for _, n in prompts[:2]]
    metrics = evaluate_with(engine, quality, real_images(data, quality.keys), out, sample_prompts, seed)
    metrics["short_prompts"] = _short_prompt_adherence(engine, data, quality, seed)
    return metrics


def evaluate_scenes(engine: Engine, quality, real: np.ndarray, out: Path, seed: int = 0, held_out=()) -> dict:
    """The scenes family's evaluation (issue 63): ``quality`` a ``SceneQuality`` over the
    evaluation prompts, ``real`` their real scenes; adherence is the referee's prompt match, also
    given per method on the prompts with two or three objects and on those in ``held_out`` (the
    held-out combinations)."""
    prompts = [p for _, p in quality.prompts]
    images: dict[str, np.ndarray] = {}
    metrics = evaluate_with(engine, quality, real, out, prompts[: len(SAMPLE_PROMPTS)], seed, images)
    groups = {
        "multi_object": [i for i, p in enumerate(prompts) if len(parse_prompt(p).objects) >= 2],
        "held_out": [i for i, p in enumerate(prompts) if p in set(held_out)],
    }
    for label, generated in images.items():
        # each image judged once here for the parts and the groups' matches
        verdicts = [quality.judge(image, key) for image, key in zip(as_uint8(generated), quality.keys, strict=True)]
        metrics["methods"][label].update(verdict_parts(verdicts))
        for name, index in groups.items():
            if index:
                match = float(np.mean([verdicts[i].match for i in index]))
                metrics["methods"][label][f"adherence_{name}"] = round(match, 4)
    metrics["scenes"] = {f"{name}_prompts": len(index) for name, index in groups.items()}
    metrics["scenes"]["real_match"] = round(quality.real_adherence(), 4)
    return metrics


def evaluate_with(engine: Engine, quality, real: np.ndarray, out: Path, sample_prompts, seed: int, images=None) -> dict:
    """Every card method scored on ``quality``'s prompts, the ceilings of the ``real`` images and
    of the VQ's reconstructions, the samples grids and the metrics' files into ``out``; each
    method's images into ``images`` (label -> uint8 array) when given."""
    results = score_methods(engine, quality, CARD_METHODS, seed, images)
    results.update(ceilings(engine.family.vq, quality, real))
    grid_images, captions = [], []
    for i, prompt in enumerate(sample_prompts):
        grid_images.append(engine.generate(prompt, "ar", seed + i).image)
        captions.append(prompt)
    scale = max(1, 128 // grid_images[0].shape[0])  # 128 px cells
    samples_grid(grid_images, captions, scale=scale).save(out / "samples_ar.png")
    grid_images = [engine.generate(p, "mulo", seed + i).image for i, p in enumerate(sample_prompts)]
    samples_grid(grid_images, sample_prompts, scale=scale).save(out / "samples_mulo.png")
    quality.save(out)  # what the quality metrics need at inference, without the data set (benchmark, app)
    config = engine.make_config(None).to_dict()
    return {"prompts": len(quality.prompts), "seed": seed, "config": config, "methods": results}


def _short_prompt_adherence(engine, data, quality: Quality, seed: int) -> dict:
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
