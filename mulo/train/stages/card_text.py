"""The model card's generated parts (``mulo.train.stages.card.write_model_card`` fills the template
``templates/model_card.md`` with them): sentences that depend on the recipe or the report, the
data and licence paragraphs, the VQ study's tables and each family's fixed History section."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from mulo.train.recipes import PSNR_SLACK, STUDY_BOUND, STUDY_SETTING


def fmt(value) -> str:
    return "n/a" if value is None else (f"{value:.4g}" if isinstance(value, float) else str(value))


def text_mix(mix: dict) -> str:
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


def teacher_forcing(budget: dict) -> str:
    if not budget["input_noise"]:
        return (
            "plain teacher forcing (the first `twemoji-64` weights switched to noisy teacher forcing, 15 % "
            "random input codes, at 62 % of their steps: their target had reached a training loss of 0.34 "
            "nats per token, jumped to 1.85, and ended with a clean teacher-forced loss of 0.66 on the "
            "evaluation emoji)"
        )
    source = "tokens of the same scene" if budget.get("input_noise_kind") == "scene" else "random codes"
    return (
        f"noisy teacher forcing ({budget['input_noise']:.0%} of the input tokens replaced by {source} "
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
        lines.append(f"| {codes} | {psnr} | {entry[f'codes_used_{sizes[-1]}px']} | {fmt(entry.get('seconds'))} |")
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


def vq_text(vq: dict, hyper: dict, px: int, side: int) -> str:
    """The card's sentence on the VQ: a codebook of pixel squares or a ``diffusers.VQModel``."""
    sizes = f"{px} px ({side}x{side} tokens), {px // 2} px and {px // 4} px"
    if vq.get("kind") == "patches":
        p = vq["patch"]
        return (
            f"a codebook of {vq['codes']} RGB squares of {p}x{p} pixels (`mulo.models.patch_vq`), one for {sizes}: a "
            f"token is the nearest square and draws exactly that square, nothing around it. k-means++ seeds, then "
            f"{hyper['patch_iterations']} Lloyd iterations over {hyper['patch_squares']:,} squares of the training "
            f"images at the three sizes, {hyper['vq_busy']:.0%} of them not one flat colour."
        )
    tiles = f" Read and drawn as {hyper['vq_tile']} px tiles." if hyper.get("vq_tile") else ""
    return (
        f"`diffusers.VQModel`, channels {tuple(vq['block_out_channels'])}, {px // side}x downsampling, "
        f"{vq['num_vq_embeddings']} codes of dimension {vq['vq_embed_dim']}, one codebook for {sizes}; "
        f"MSE + {hyper['vq_l1_weight']} L1 + commitment loss, images larger than {hyper['vq_crop']} px seen as "
        f"random {hyper['vq_crop']} px crops, dead codes restarted from encoder outputs.{tiles}"
    )


def study_rule(px: int) -> str:
    """The VQ study's rule (``recipes.choose_codebook``) in words, for the study's section."""
    setting = ", ".join(f"{k} = {v}" for k, v in STUDY_SETTING.items())
    return (
        f"Rule (`recipes.choose_codebook`): among the codebooks whose {px} px validation PSNR is "
        f"within {PSNR_SLACK} dB of the best candidate's, the one with the highest oracle bound "
        f"`{STUDY_BOUND}` at {setting}."
    )


def parallel_decoding(budget: dict) -> str:
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
        + proxy_weight(budget)
    )


def proxy_weight(budget: dict) -> str:
    if budget["proxy_weight"] == 1.0:
        return ""
    return (
        "\n  In the target's masked steps each row's first token that ZipAR predicts from the proxy\n"
        f"  weighs {budget['proxy_weight']:g} in the loss (`Budget.proxy_weight`)."
    )


# How each family's recipe and defaults.json were chosen: fixed text at the end of every card
# (``history/FAMILY.md``), so a retrain keeps the story that the code's comments only point to. The
# 32x32-token family's VQ study above it is generated from the run's report.
HISTORY_DIR = Path(__file__).resolve().parents[1] / "history"


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


def stage_table(report: dict) -> tuple[str, float]:
    """The Training table's rows, one per stage with its time, hardware and what it measured,
    and the total seconds."""

    def seconds(entry: dict):  # a resumed stage: its training loop counts every session's time
        return max(entry.get("stage_seconds", 0), entry.get("seconds", 0)) or None

    stages = {name: entry for name, entry in report.items() if name != "vq_study"}  # its own section
    rows = "\n".join(
        f"| {name} | {fmt(seconds(entry))} | {stage_hardware(entry)} | "
        + ", ".join(
            f"{k} {fmt(v)}" for k, v in entry.items() if k not in ("stage_seconds", "hardware", "seconds", "segments")
        )
        + " |"
        for name, entry in stages.items()
    )
    return rows, sum(seconds(entry) or 0 for entry in stages.values())


def metric_rows(methods: dict) -> str:
    """The Metrics table's rows, one per evaluated method (and the ceilings)."""
    return "\n".join(
        f"| {label} | {fmt(e['fd'])} | {fmt(e['adherence'])} | {fmt(e['nfe_target'])} | {fmt(e['nfe_drafter'])} | "
        f"{fmt(e.get('acceptance_rate'))} | {fmt(e.get('acceptance_flat'))} | {fmt(e.get('acceptance_detail'))} | "
        f"{fmt(e.get('reopened_fraction'))} | {fmt(e['seconds_per_image'])} |"
        for label, e in methods.items()
    )


def metrics_text(metrics: dict, report: dict, geometry: dict) -> str:
    """What the card's prompts, FD and adherence are: the emoji families' retrieval, or the scenes
    family's referee."""
    if geometry.get("scenes"):
        counts = metrics.get("scenes", {})
        return (
            f"Over {metrics['prompts']} fixed scene prompts (`eval_prompts.json`: "
            f"{counts.get('multi_object_prompts', 0)} with two or three emoji, {counts.get('held_out_prompts', 0)} "
            f"held-out combinations; seed i for prompt i), with the family's default settings "
            f"(`{json.dumps(metrics['config'])}`). FD: Frechet distance between mini-CLIP image features of the "
            "generated images and of the real scenes of the same prompts (lower is better). Adherence: the exact "
            "referee's prompt match (`mulo/eval/referee.py`: every named emoji present once, nothing else, the "
            f"named background; the real scenes score {fmt(counts.get('real_match'))}), also per method on the "
            "multi-object and the held-out prompts (`adherence_multi_object`, `adherence_held_out` in "
            "`metrics.json`)."
        )
    images = f"{report.get('data', {}).get('images', 0):,}"
    return (
        f"Over {metrics['prompts']} fixed prompts (`eval_prompts.json`: one per base emoji, flags and keycaps\n"
        f"excluded; seed i for prompt i), with the family's default settings (`{json.dumps(metrics['config'])}`).\n"
        "FD: Frechet distance between mini-CLIP image features of the generated images and of the real\n"
        "images of the same emoji (lower is better). Adherence: fraction of generated images whose top-5\n"
        f"retrieved texts (among the distinct names of all {images} images: a name drawn in several styles\n"
        "is one text) include the prompted emoji."
    )


def per_round_rows(methods: dict) -> str:
    """MuLo-SD's acceptance and re-opened share per round, one row per MuLo-SD setting."""
    return "\n".join(
        f"| {label} | {', '.join(fmt(x) for x in e['per_round_acceptance'])} | "
        f"{', '.join(fmt(x) for x in e['per_round_reopened'])} |"
        for label, e in methods.items()
        if "per_round_acceptance" in e
    )


def short_prompt_line(short: dict) -> str:
    """The one-word prompts' adherence in a sentence ("" when the evaluation had none)."""
    if "ar" not in short:
        return ""
    return (
        f"One-word prompts, what people type ({short['prompts']} prompts: each evaluation emoji's first short "
        f"prompt, e.g. {', '.join(repr(p) for p in short['examples'][:6])}; adherent when the top-5 texts "
        f"include any emoji the prompt fits, e.g. any of the six sun emoji for 'sun'): "
        f"AR {fmt(short['ar'])}, MuLo-SD r = 2 {fmt(short['mulo-r2'])} as shipped, where a short name "
        f"conditions on its emoji's name (`aliases.json`, from emoji.json: 'pizza' -> 'slice of pizza'); the "
        f"models alone (`--no-aliases`): AR {fmt(short.get('ar raw'))}, MuLo-SD {fmt(short.get('mulo-r2 raw'))}."
    )
