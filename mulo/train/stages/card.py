"""The card stage: evaluate an exported family (``mulo.eval.family_eval``) and write its model card,
samples grids and metrics. The last stage of ``python -m mulo train FAMILY`` (alone: ``--stages card``).
"""

from __future__ import annotations

import json
from pathlib import Path
from string import Template

from mulo.families import int8
from mulo.train.stages.card_text import (
    PNG_DATA,
    SVG_DATA,
    TWEMOJI_LICENCE,
    fmt,
    intended_use,
    metric_rows,
    metrics_text,
    parallel_decoding,
    per_round_rows,
    short_prompt_line,
    stage_table,
    styled_data_text,
    teacher_forcing,
    text_mix,
    vq_study_section,
    vq_text,
)

# The card's prose with ``${name}`` fields (``string.Template``), package data beside this module.
# The card ends where the History section does: the file's final newline is the editor's.
TEMPLATE = Path(__file__).resolve().parents[1] / "templates" / "model_card.md"


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
        "intended_use": intended_use(report, report["vq"]["codes"]),
        "size_rows": "\n".join(f"| {name} | {fmt(mb)} |" for name, mb in sizes.items()),
        "storage_text": storage_text(geometry.get("int8_models", ()), geometry["family"]),
        "budget_json": json.dumps(budget),
        "stage_rows": stage_rows,
        "total_minutes": f"{seconds / 60:.1f}",
        "prompts": metrics["prompts"],
        "config_json": json.dumps(metrics["config"]),
        "metric_rows": metric_rows(metrics["methods"]),
        "metrics_text": metrics_text(metrics, report, geometry),
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
        "vq_text": vq_text(vq, hyper, px, side),
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
        "upsampler_convs": {"rows": "row-causal convolutions", "block": "centred convolutions over the drafted block"}[
            hyper.get("upsampler_context", "rows")
        ],
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
    if geometry.get("scenes"):
        return scenes_data_fields(report, geometry, sizes_text)
    if geometry.get("styles"):
        data_text, licence_text = styled_data_text(geometry["styles"], report.get("data", {}), sizes_text)
    return {"data_text": data_text, "licence_text": licence_text, "images": f"{n_images:,}"}


# How the card says where a scenes family puts its objects (``SceneConfig.placement``).
PLACED = {
    "free": "anywhere, every {step} px",
    "columns": "n objects in n equal columns, the prompt's first on the left, each anywhere up or down its own, "
    "every {vertical} px",
}


def scenes_data_fields(report: dict, geometry: dict, sizes_text: str) -> dict:
    """The data and licence paragraphs of a scenes family: the composed scenes and the five styles
    their sprites are drawn from."""
    scenes, data = geometry["scenes"], report.get("data", {})
    styled, licence = styled_data_text(scenes["styles"], {}, sizes_text)
    table = styled[styled.index("| word |") :]
    placed = PLACED.get(scenes["placement"], f"{scenes['placement']} placement").format(
        step=scenes["step"], vertical=scenes.get("vertical_step") or scenes["step"]
    )
    text = (
        f"Scenes composed on the fly (`mulo/train/scenes.py`): a {geometry['px']} px canvas of one of "
        f"{len(scenes['backgrounds'])} background colours with {scenes['min_objects']} to {scenes['max_objects']} "
        f"different emoji of {scenes['object_px']} px from a vocabulary of {scenes['vocabulary']} "
        f"(`mulo/scenes.py`), each in any of the styles below, placed without overlap "
        f"({placed}), rendered by resvg at 4x and reduced; the prompt names them and "
        f'the background ("red apple and rocket on blue"). The clip and VQ stages hold {data.get("images", 0):,} '
        f"training scenes; the AR, up-sampler and EAGLE stages read fresh ones, "
        f"{data.get('fresh_training_scenes', 0):,} at the budget, each once; "
        f"{data.get('held_out_combinations', 0):,} (emoji pair, background) combinations never train "
        f"(the validation split, {data.get('val', 0):,} scenes).\n\n" + table
    )
    return {"data_text": text, "licence_text": licence, "images": f"{data.get('images', 0):,}"}


def history_section(report: dict, geometry: dict) -> str:
    """The family's fixed History, after the run's VQ study when it had several candidates."""
    if "vq_study" not in report:
        return geometry["history"]
    study = vq_study_section(report["vq_study"]["candidates"], report["vq"]["codes"], geometry["study_rule"])
    return study + "\n" + geometry["history"]
