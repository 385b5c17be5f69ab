"""Evaluate the exported twemoji family and write its model card, samples grid and metrics.

Run as the last stage of ``python -m mulo train twemoji`` (or alone with ``--stages card``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw

from mulo.engine import Engine
from mulo.eval import harness
from mulo.eval.metrics import acceptance_by_detail
from mulo.eval.quality import Quality
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
    results.update(_ceilings(engine, quality, real_images(data, quality.keys)))
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
def _ceilings(engine, quality: Quality, images: np.ndarray) -> dict:
    """What the metrics give the real ``images`` of the quality's prompts and their VQ
    reconstructions: the most an AR model of this tokenizer can reach (FD of the real images
    against themselves is 0 by definition)."""
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255
    vq = engine.family.vq
    recon = vq.decode(vq.encode(x.to(vq.codebook.device))).cpu()
    untimed = {"seconds_per_image": None, "nfe_target": None, "nfe_drafter": None}
    return {
        "real images": {"fd": 0.0, "adherence": round(quality.adherence(x, quality.keys), 4), **untimed},
        "VQ reconstructions": {**rounded(quality.score(recon, quality.keys)), **untimed},
    }


def _fmt(value) -> str:
    return "n/a" if value is None else (f"{value:.4g}" if isinstance(value, float) else str(value))


def _text_mix(mix: dict) -> str:
    if mix.get("name_style"):
        return (
            f"the emoji's name with probability {mix['name']}, its name followed by the image's style word "
            f"with probability {mix['name_style']}, else its full description (which names the style)"
        )
    if not mix.get("short"):
        return f"the emoji's name with probability {mix['name']}, else its full description"
    return (
        f"the emoji's name with probability {mix['name']}, a short prompt with probability {mix['short']}: one of "
        'its short names alone, "pizza" for "slice of pizza", or one content word of its name, "sun" for "sun '
        'with face"; else its full description'
    )


def _teacher_forcing(budget: dict) -> str:
    if not budget["input_noise"]:
        return (
            "plain teacher forcing (the first `twemoji-64` weights switched to noisy teacher forcing, 15 % "
            "random input codes, at 62 % of their steps: their target had reached a training loss of 0.34 "
            "nats per token, jumped to 1.85, and ended with a clean teacher-forced loss of 0.66 on the "
            "evaluation emoji)"
        )
    return (
        f"noisy teacher forcing ({budget['input_noise']:.0%} of the input tokens replaced by random codes "
        f"from {budget['input_noise_from']:.0%} of each stage's steps on; the loss still asks for the clean token)"
    )


def vq_study_section(study: dict, chosen: int, rule: str) -> str:
    """The VQ design study as Markdown: per candidate codebook, its reconstruction and its oracle
    MuLo-SD table (``mulo.eval.ceilings``), then the rule and the pick."""
    sizes = sorted({int(k.split("_")[-1][:-2]) for entry in study.values() for k in entry if k.startswith("val_psnr_")})
    head = "| codes | " + " | ".join(f"PSNR {px} px" for px in sizes) + " | codes used | train s |"
    lines = ["## VQ design study", "", rule, "", head, "|---" * (3 + len(sizes)) + "|"]
    for codes, entry in sorted(study.items(), key=lambda kv: int(kv[0])):
        psnr = " | ".join(f"{entry[f'val_psnr_{px}px']:.2f} dB" for px in sizes)
        lines.append(f"| {codes} | {psnr} | {entry[f'codes_used_{sizes[-1]}px']} | {_fmt(entry.get('seconds'))} |")
    schemes = [k[len("speedup_") :] for k in next(iter(study.values()))["oracle"][0] if k.startswith("speedup_")]
    lines += [
        "",
        "Oracle MuLo-SD per candidate (perfect drafter: the validation emoji's own renders at px / r, pixel",
        "up-sampler, exact-match acceptance; bound = sequential-pass speed-up counting every pass as a",
        "target step):",
        "",
        "| codes | r | k | l | accepted | re-opened | " + " | ".join(f"bound {s}" for s in schemes) + " |",
        "|---" * (6 + len(schemes)) + "|",
    ]
    for codes, entry in sorted(study.items(), key=lambda kv: int(kv[0])):
        for row in entry["oracle"]:
            bounds = " | ".join(f"{row[f'speedup_{s}']:.2f}x" for s in schemes)
            lines.append(
                f"| {codes} | {row['r']} | {row['k']} | {row['l']} | {row['accepted']:.3f} | {row['reopened']:.3f} "
                f"| {bounds} |"
            )
    lines += ["", f"Picked: **{chosen} codes**.", ""]
    return "\n".join(lines)


def _parallel_decoding(budget: dict) -> str:
    if not budget.get("zipar_share"):
        return ""
    windows = ", ".join(map(str, budget["zipar_windows"]))
    share = f"{budget['zipar_share']:.0%}"
    return (
        f"\n  The target and the drafters are trained for parallel decoding: in {share} of their steps the\n"
        f"  attention mask hides from each token what ZipAR (window {windows}, one per step) has not\n"
        "  produced when it samples that token (`mulo.methods.zipar.training_mask`), and a row's last slot\n"
        "  holds ZipAR's proxy for it where the next row starts early (`training_inputs`), so one target\n"
        "  serves raster AR, ZipAR and ZipAR inside MuLo-SD's islands, and a drafter drafts ZipAR-style."
        + _proxy_weight(budget)
    )


def _proxy_weight(budget: dict) -> str:
    if budget["proxy_weight"] == 1.0:
        return ""
    return (
        "\n  In the target's masked steps each row's first token that ZipAR predicts from the proxy\n"
        f"  weighs {budget['proxy_weight']:g} in the loss (`Budget.proxy_weight`)."
    )


# How each family's recipe and defaults.json were chosen: fixed text at the end of every card
# (``history/FAMILY.md``), so a retrain keeps the story that the code's comments only point to. The
# 32x32-token family's VQ study above it is generated from the run's report.
HISTORY_DIR = Path(__file__).resolve().parent / "history"


def history(family: str) -> str:
    """The family's fixed History section ("" for a family without one yet)."""
    path = HISTORY_DIR / f"{family}.md"
    return path.read_text() if path.exists() else ""


PNG_DATA = """Twemoji graphics from the npm package `emoji-datasource-twitter@16.0.0` (`img/twitter/64/*.png`,
{images:,} images including skin-tone variants, composited over white; names, short names and
(sub)categories from `emoji.json`)."""
SVG_DATA = """Twemoji graphics from the npm package `@twemoji/svg@15.0.0` (integrity-checked), rendered over
white at {sizes} px by resvg (`resvg-py`, a training-only extra), {images:,} images including
skin-tone variants (the emoji of Unicode 15.1 and 16 have no SVG there); names, short names,
(sub)categories and the validation split from `emoji-datasource-twitter@16.0.0`'s `emoji.json`."""


TWEMOJI_LICENCE = """The graphics are licensed **CC-BY 4.0** by Twitter, Inc. and
other contributors (https://github.com/twitter/twemoji); these weights are derived from them and
carry the same attribution. A fixed-seed 5 % validation split is held out."""


def styled_data_text(words, data_report: dict, sizes_text: str) -> tuple[str, str]:
    """(data paragraph, licence paragraph) of the multi-style family: each style's pinned package
    and the licence its own metadata declares (checked when the data set is built)."""
    from mulo.train import styles

    chosen = styles.chosen(words)
    rows = "\n".join(f"| `{s.word}` | {s.title} | `{s.package}` | {s.licence} | {s.attribution} |" for s in chosen)
    counts = data_report.get("per_style", {})
    data = (
        f"{data_report.get('images', 0):,} images: the emoji of `emoji-datasource@16.0.0`'s `emoji.json` "
        f"(names, short names, categories, skin-tone variants) in every style below that draws them, matched "
        f"by code point through each Iconify package's `chars.json` (integrity-checked npm packages), "
        f"rendered over white at {sizes_text} px by resvg (`resvg-py`, a training-only extra)"
        + (f" ({', '.join(f'{w} {n:,}' for w, n in counts.items())})" if counts else "")
        + ". A prompt may end with a style word (`red apple noto`); without one any style may be drawn. "
        f"Each training image also appears in {data_report.get('augment_copies', 0)} augmented copies, "
        "shrunk to 75-100 % and moved inside the canvas alike at every scale.\n\n"
        "| word | style | npm package | licence | attribution |\n|---|---|---|---|---|\n" + rows
    )
    share_alike = [s.title for s in chosen if s.licence == "CC-BY-SA-4.0"]
    licence = "\n\nThese weights are derived from all of the graphics above and carry every attribution" + (
        f"; because {' and '.join(share_alike)} is **CC-BY-SA 4.0**, they are shared under CC-BY-SA 4.0 too "
        "(compatible with the CC-BY 4.0, Apache-2.0 and MIT sets)."
        if share_alike
        else "."
    )
    licence += (
        f" Held out, decided per key by a hash: {styles.HELD_EMOJI_FRACTION:.0%} of the emoji in every style, and "
        f"{styles.HELD_PAIR_FRACTION:.0%} of the other (emoji, style) pairs while the emoji trains in its other "
        "styles: the held-out loss on those pairs measures generalisation, and every AR model keeps the weights "
        "of its best one."
    )
    return data, licence


MEMORISES = 2.0  # held-out loss over training loss above which the card says the target memorises


def intended_use(report: dict, codes: int) -> str:
    """The card's opening section: what the family is for, and what its target learnt, judged by
    its held-out loss against its training loss (measured alike when the report has both)."""
    target = report.get("target", {})
    train = target.get("train_loss", target.get("final_loss"))
    held_out = target.get("val_loss")
    text = (
        "## Intended use and limitations\n\n"
        "For demonstrating, debugging and benchmarking speculative decoding of AR image models on any CPU: "
        "small, open models whose every round can be traced and drawn. Not an emoji generator to use in "
        "place of the graphics it was trained on, and not evidence about the image quality of large models. "
        "Prompts are emoji names and descriptions in the mini-CLIP's vocabulary; unknown words are reported "
        "and ignored."
    )
    if train is None or held_out is None:
        return text
    uniform = float(np.log(codes))
    ratio = held_out / max(train, 1e-9)
    if ratio > MEMORISES:
        return text + (
            f"\n\n**The target memorises its training images.** Training loss {train:.3g} nats per token, "
            f"held-out loss {held_out:.3g} ({ratio:,.0f}x; uniform over the {codes} codes is {uniform:.2f}): its "
            "conditionals are peaked on the images it saw, so seeds vary an image little, τ and codebook "
            "pooling have little to act on, and one wrong committed token can derail the image. It shows the "
            "engine's mechanics, not MuLo-SD's trade-offs, which need a target that generalises."
        )
    return text + (
        f"\n\nHeld-out loss {held_out:.3g} nats per token against a training loss of {train:.3g} "
        f"({ratio:.2f}x; uniform over the {codes} codes is {uniform:.2f})."
    )


def stage_hardware(entry: dict) -> str:
    """A report entry's hardware cell; for a stage resumed on other hardware, which ran which steps."""
    if "segments" not in entry:
        return entry.get("hardware", "n/a")
    return "; ".join(
        f"{seg['hardware']}: steps {seg['steps'][0]:,}-{seg['steps'][1]:,} in {seg['seconds']:,.0f} s"
        for seg in entry["segments"]
    )


def write_model_card(
    assets: Path, report: dict, metrics: dict, budget: dict, sizes: dict, recipe: dict, geometry: dict
) -> str:
    """MODEL_CARD.md from the training report and the evaluation; every number is measured, but
    those of the fixed history section (``geometry["history"]``: the design study behind the
    recipe) come from earlier runs.

    ``recipe`` holds the architecture settings the text describes (codebook size, model widths...);
    ``geometry`` the family's name, image size ``px``, ``svg`` (data source) and ``history``.
    """
    vq, target, small, mix = recipe["vq"], recipe["target"], recipe["draft_model"], budget["ar_text_mix"]
    family, px = geometry["family"], geometry["px"]
    side = px // 4
    grid = {f: f"{side // f}x{side // f}" for f in (1, 2, 4)}  # target, r = 2, r = 4 token grids
    n_images = report.get("data", {}).get("images", 0)
    sizes_text = ", ".join(str(px // f) for f in (1, 2, 4))
    data_text = (SVG_DATA if geometry["svg"] else PNG_DATA).format(images=n_images, sizes=sizes_text)
    licence_text = TWEMOJI_LICENCE
    if geometry.get("styles"):  # the multi-style family: every style's package and licence
        data_text, licence_text = styled_data_text(geometry["styles"], report.get("data", {}), sizes_text)
    history = geometry["history"]
    if "vq_study" in report:
        study = report["vq_study"]["candidates"]
        history = vq_study_section(study, report["vq"]["codes"], geometry["study_rule"]) + "\n" + history

    def seconds(entry: dict):  # a resumed stage: its training loop counts every session's time
        return max(entry.get("stage_seconds", 0), entry.get("seconds", 0)) or None

    stage_rows = "\n".join(
        f"| {name} | {_fmt(seconds(entry))} | {stage_hardware(entry)} | "
        + ", ".join(
            f"{k} {_fmt(v)}" for k, v in entry.items() if k not in ("stage_seconds", "hardware", "seconds", "segments")
        )
        + " |"
        for name, entry in report.items()
        if name != "vq_study"  # its own section; its time is the vq stage's
    )
    total = sum(seconds(entry) or 0 for name, entry in report.items() if name != "vq_study")
    m = metrics["methods"]
    metric_rows = "\n".join(
        f"| {label} | {_fmt(e['fd'])} | {_fmt(e['adherence'])} | {_fmt(e['nfe_target'])} | {_fmt(e['nfe_drafter'])} | "
        f"{_fmt(e.get('acceptance_rate'))} | {_fmt(e.get('acceptance_flat'))} | {_fmt(e.get('acceptance_detail'))} | "
        f"{_fmt(e.get('reopened_fraction'))} | {_fmt(e['seconds_per_image'])} |"
        for label, e in m.items()
    )
    per_round = "\n".join(
        f"| {label} | {', '.join(_fmt(x) for x in e['per_round_acceptance'])} | "
        f"{', '.join(_fmt(x) for x in e['per_round_reopened'])} |"
        for label, e in m.items()
        if "per_round_acceptance" in e
    )
    size_rows = "\n".join(f"| {name} | {_fmt(mb)} |" for name, mb in sizes.items())
    short = metrics.get("short_prompts") or {}
    short_line = (
        f"One-word prompts, what people type ({short['prompts']} prompts: each evaluation emoji's first short "
        f"prompt, e.g. {', '.join(repr(p) for p in short['examples'][:6])}; adherent when the top-5 texts "
        f"include any emoji the prompt fits, e.g. any of the six sun emoji for 'sun'): "
        f"AR {_fmt(short['ar'])}, MuLo-SD r = 2 {_fmt(short['mulo-r2'])} as shipped, where a short name "
        f"conditions on its emoji's name (`aliases.json`, from emoji.json: 'pizza' -> 'slice of pizza'); the "
        f"models alone (`--no-aliases`): AR {_fmt(short.get('ar raw'))}, MuLo-SD {_fmt(short.get('mulo-r2 raw'))}."
        if "ar" in short
        else ""
    )
    card = f"""# {family}: a multi-scale AR image model family for MuLo-SD

Trained by `python -m mulo train {family}` (hardware per stage below). Its images are {px}x{px} emoji,
{side}x{side} target tokens; every model runs on a CPU and loads with no network access.

{intended_use(report, vq["num_vq_embeddings"])}

## Data and license

{data_text} {licence_text}

## Models

| file | size (MB) |
|---|---|
{size_rows}

- **mini-CLIP** (`clip`): word-level text transformer (2 layers, width 128, up to 16 words) and a
  4-stage image CNN, trained contrastively (symmetric InfoNCE, same-emoji pairs all positive). Its
  contrastive text embedding followed by its per-word features, each scaled to unit RMS (17 x 128,
  padding slots zero like the null condition), condition every AR model; its image features are
  the space of the FD and adherence metrics. Text augmentation: the emoji's name with probability
  {recipe["name_text_prob"]}, else its full description. Unknown prompt words are reported; a prompt with no
  known word is an error.
- **VQ tokenizer** (`vq`): `diffusers.VQModel`, channels {tuple(vq["block_out_channels"])}, 4x downsampling,
  {vq["num_vq_embeddings"]} codes of dimension {vq["vq_embed_dim"]}, one codebook for {px} px ({grid[1]} tokens),
  {px // 2} px ({grid[2]}) and {px // 4} px ({grid[4]}); MSE + 0.5 L1 + commitment loss, images larger
  than 32 px seen as random 32 px crops, dead codes restarted from encoder outputs.
- **AR models** (`target` {grid[1]}, `drafter_r2` {grid[2]}, `drafter_r4` {grid[4]}): the engine's GPT (width
  {target["dim"]}, {target["n_layer"]} layers, {target["n_head"]} heads; drafters of the same size as the target),
  conditioned on the text features, {recipe["cfg_dropout"]:.0%} condition dropout for classifier-free
  guidance, text augmentation ({_text_mix(mix)}), {_teacher_forcing(budget)}.
  Batches draw every emoji equally often, its skin-tone variants sharing its weight; bf16 autocast
  on a GPU, and on a CPU where it measures faster than fp32 (`loop.cpu_bf16_pays`).{_parallel_decoding(budget)}
- **Same-grid draft model** (`draft_model`, {grid[1]}, width {small["dim"]}, {small["n_layer"]} layers) for
  the token-level baselines `sd` and `lantern_chain`.
- **Learned up-samplers** (`upsampler_r2`, `upsampler_r4`): row-causal convolutions + pixel shuffle
  (width 128, 3 blocks), token cross-entropy on images encoded at both resolutions.
- **EAGLE-2 draft head** (`eagle_head`, baselines `eagle2` and `lantern`): one decoder layer of the target's width fed
  with the target's last hidden state and the next input's embedding (through a linear fusion), reusing
  the target's embeddings and output head; trained on the frozen target's features of the training
  sequences (same text mix and condition dropout) to predict the next feature (smooth L1, features
  perturbed by uniform noise of {budget.get("eagle_noise", 0)}) and the target's next-token
  distribution (weight {budget.get("eagle_cls_weight", 0)}).

Weights are stored as fp16 safetensors with JSON configs and loaded as float32.

## Training settings and time

Budget (steps, batch sizes): `{json.dumps(budget)}`. AdamW (weight decay 0.01), linear warm-up over
100 steps then cosine decay, gradient clipping at 1.0, fixed seeds.

| stage | seconds | hardware | measured |
|---|---|---|---|
{stage_rows}

Total: {total / 60:.1f} minutes.

## Metrics

Over {metrics["prompts"]} fixed prompts (`eval_prompts.json`: one per base emoji, flags and keycaps
excluded; seed i for prompt i), with the family's default settings (`{json.dumps(metrics["config"])}`).
FD: Frechet distance between mini-CLIP image features of the generated images and of the real
images of the same emoji (lower is better). Adherence: fraction of generated images whose top-5
retrieved texts (among the names of all {n_images:,} images) include the prompted emoji. NFE: forward
passes per image. Acceptance: share of draft tokens accepted, overall and over flat / detailed
tokens of the final image (pixel standard deviation under / over 0.02, `acceptance_by_detail`).
Time: wall seconds per image on the hardware of the card stage.

| method | FD | adherence | NFE target | NFE drafter | acceptance | flat | detailed | re-opened | s / image |
|---|---|---|---|---|---|---|---|---|---|
{metric_rows}

{short_line}

MuLo-SD per round (mean over prompts; round = one block of low-res rows):

| method | acceptance rate per round | re-opened fraction per round |
|---|---|---|
{per_round}

## Samples

AR (prompt under each image):

![AR samples](samples_ar.png)

MuLo-SD (r = 2, same prompts and seeds):

![MuLo-SD samples](samples_mulo.png)

{history}"""
    (assets / "MODEL_CARD.md").write_text(card)
    return card
